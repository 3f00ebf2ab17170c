"""A sample of the supervisor's hostile sequences over DDS, against the real policy_controller process.

The console script runs in lockstep (one answer per new state) on an isolated ROS_DOMAIN_ID;
this test plays the robot and draws events with a seeded generator (the seed is printed):
valid states in any joint order, hostile ones (NaN, inf, 1e30, out of limits, wrong lengths,
repeated names, bad frames and quaternions, stamps backwards / in 1970 / in the future,
broken IMU readings), repeats, partial joint states, e-stops and resets through the node's
services. Every command that comes back on /diffsim/command is checked against the URDF
limits and against the reference model of test_supervisor.py: the safe command right after a
bad state, latched until ``recover_states`` good states, and the policy's command (equal to an
independent PolicyRunner's) otherwise.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

rclpy = pytest.importorskip("rclpy", reason="rclpy not installed (ROS 2 client library)")
pytestmark = pytest.mark.ros

from builders import make_checkpoint  # noqa: E402
from conftest import ros_context, ros_domain  # noqa: E402
from test_supervisor import ARM_BAD, QUAD_BAD, SKEW_S, TARGET, Harness  # noqa: E402

from diffsim_ros.learning.deploy import PolicyRunner  # noqa: E402
from diffsim_ros.workflows.loop import die_with_parent  # noqa: E402

DOMAIN = ros_domain(1)
RECOVER = 3
EVENTS = 45


@pytest.fixture(scope="module")
def ros():
    yield from ros_context(DOMAIN)


def to_joint_state(js):
    from sensor_msgs.msg import JointState

    m = JointState()
    m.header.stamp.sec, m.header.stamp.nanosec = divmod(int(js.stamp_ns), 1_000_000_000)
    m.name = list(js.names)
    m.position, m.velocity, m.effort = ([float(x) for x in a] for a in (js.position, js.velocity, js.effort))
    return m


def to_odometry(od):
    from nav_msgs.msg import Odometry

    m = Odometry()
    m.header.stamp.sec, m.header.stamp.nanosec = divmod(int(od.stamp_ns), 1_000_000_000)
    m.header.frame_id, m.child_frame_id = od.frame_id, od.child_frame_id
    p, o = m.pose.pose.position, m.pose.pose.orientation
    tw = m.twist.twist
    p.x, p.y, p.z = (float(x) for x in od.position)
    o.x, o.y, o.z, o.w = (float(x) for x in od.orientation)
    tw.linear.x, tw.linear.y, tw.linear.z = (float(x) for x in od.linear)
    tw.angular.x, tw.angular.y, tw.angular.z = (float(x) for x in od.angular)
    return m


class Robot:
    """This test's node: publishes states, calls the controller's services, collects commands."""

    def __init__(self, ctx, kind):
        from rclpy.executors import SingleThreadedExecutor
        from sensor_msgs.msg import Imu, JointState
        from nav_msgs.msg import Odometry
        from std_msgs.msg import Float64MultiArray
        from std_srvs.srv import SetBool, Trigger

        self.node = rclpy.create_node(f"hostile_robot_{kind}", context=ctx)
        self.ex = SingleThreadedExecutor(context=ctx)
        self.ex.add_node(self.node)
        self.cmds = []
        self.node.create_subscription(Float64MultiArray, "/diffsim/command", self.cmds.append, 100)
        self.pub = self.node.create_publisher(JointState if kind == "arm" else Odometry,
                                              "/joint_states" if kind == "arm" else "/odom", 100)
        self.imu = self.node.create_publisher(Imu, "/imu", 100)
        self.estop = self.node.create_client(SetBool, "/policy_controller/emergency_stop")
        self.reset = self.node.create_client(Trigger, "/policy_controller/reset")

    def spin_until(self, cond, timeout):
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            self.ex.spin_once(timeout_sec=0.005)
            if cond():
                return True
        return False

    def call(self, client, req):
        assert self.spin_until(client.service_is_ready, 20.0), "controller service not available"
        fut = client.call_async(req)
        assert self.spin_until(fut.done, 10.0) and fut.result().success

    def close(self):
        self.ex.shutdown()
        self.node.destroy_node()


def start_controller(ckpt, kind, tmp):
    params = {"checkpoint": str(ckpt), "lockstep": "true", "state_timeout_s": "30.0",
              "recover_states": str(RECOVER), "safe_thrust": "3.0", "predict_every": "1",
              # The first state of a hostile sequence may itself be hostile: the start-up preflight
              # (tested in test/nodes/test_policy_controller.py) would hold the safe command for good.
              "preflight": "false"}
    if kind == "arm":
        params["target"] = json.dumps(TARGET)
    args = [str(Path(sys.executable).with_name("policy_controller")), "--ros-args"]
    for k, v in params.items():
        args += ["-p", f"{k}:={v}"]
    log = open(tmp / f"controller_{kind}.log", "w")
    env = dict(os.environ, ROS_DOMAIN_ID=str(DOMAIN), PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
    proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env=env, preexec_fn=die_with_parent)
    return proc, tmp / f"controller_{kind}.log"


@pytest.mark.parametrize("kind", ["arm", "quadrotor"])
def test_hostile_states_over_dds(ros, tmp_path, kind):
    from sensor_msgs.msg import Imu
    from std_srvs.srv import SetBool, Trigger

    ckpt = tmp_path / "ckpt"
    make_checkpoint("reach_arm" if kind == "arm" else "hover", ckpt)
    h = Harness((PolicyRunner(ckpt), PolicyRunner(ckpt)), kind, timeout_s=30.0, recover=RECOVER)
    seed = int(os.environ.get("DIFFSIM_TEST_SEED") or int.from_bytes(os.urandom(4), "little"))
    print(f"hostile DDS sequence for the {kind}: seed {seed} (DIFFSIM_TEST_SEED={seed} replays it)")
    rng = np.random.default_rng(seed)
    # A wrong-length position cannot be put in an Odometry message (fixed-size fields).
    bad = ARM_BAD if kind == "arm" else [b for b in QUAD_BAD if b != "len_pos"]
    kinds = ["repeat"] + list(bad) + ["estop_on", "estop_off", "reset"]
    kinds += ["partial"] if kind == "arm" else ["imu_bad"]
    proc, log = start_controller(ckpt, kind, tmp_path)
    robot = Robot(ros, kind)
    m = h.model
    done = []
    answers = {"policy": 0, "safe": 0}
    try:
        assert robot.spin_until(lambda: robot.pub.get_subscription_count() >= 1 and (
            kind == "arm" or robot.imu.get_subscription_count() >= 1), 60), log.read_text()
        for i in range(EVENTS):
            # Half the events valid states, so that the policy recovers and is checked too.
            ev = "valid" if (i == 0 or rng.random() < 0.5) else str(rng.choice(kinds))
            u = rng.random(16).tolist()
            h.now = time.monotonic_ns()
            h.clock = time.time_ns()
            stamp = h.clock if m.last_stamp is None else max(h.clock, m.last_stamp + 1)
            answer, values = True, None
            if ev == "valid":
                msg, *vals = h.valid_arm(u, stamp) if kind == "arm" else h.valid_quad(u, stamp)
                values = vals[0]
                m.accepted(stamp, h.now, values if kind == "arm" else None, True)
            elif ev == "repeat":
                if m.last_stamp is None:
                    continue
                stamp = m.last_stamp
                msg, *vals = h.valid_arm(u, stamp) if kind == "arm" else h.valid_quad(u, stamp)
                if h.clock - stamp > 0.4 * SKEW_S * 1e9:
                    # Too close to the skew limit to say on which side of it the node's clock is.
                    continue
                m.accepted(stamp, h.now, vals[0] if kind == "arm" else None, False)
                answer = False
            elif ev == "partial":
                full, *_ = h.valid_arm(u, stamp)
                keep = list(range(1, len(full.names)))
                msg = type(full)([full.names[k] for k in keep], [full.position[k] for k in keep],
                                 [full.velocity[k] for k in keep], [], stamp)
                if full.names[0] not in h.runner.joint_names:
                    continue
                answer = False
            elif ev in ("estop_on", "estop_off"):
                robot.call(robot.estop, SetBool.Request(data=ev == "estop_on"))
                if ev == "estop_on":
                    m.estop = True
                else:
                    m.estop, m.latched, m.good = False, False, 0
                done.append(ev)
                continue
            elif ev == "reset":
                robot.call(robot.reset, Trigger.Request())
                m.latched, m.good, m.last_stamp = False, 0, None
                done.append(ev)
                continue
            elif ev == "imu_bad":
                imu = Imu()
                imu.angular_velocity.x = float("nan") if u[0] < 0.5 else 1e30
                robot.imu.publish(imu)
                m.bad()
                # The IMU is not answered in lockstep: wait until the controller has taken it.
                robot.spin_until(lambda: False, 0.15)
                done.append(ev)
                continue
            else:
                st = stamp
                if ev == "stamp_back":
                    st = m.last_stamp - 1_000_000 if m.last_stamp is not None else h.clock - 2 * 10 ** 9
                elif ev == "stamp_future":
                    st = h.clock + 10 * 10 ** 9
                elif ev == "stamp_1970":
                    st = 10 ** 9
                msg = h.hostile(ev if not ev.startswith("stamp") else "none", u, st)
                m.bad()
            n0 = len(robot.cmds)
            robot.pub.publish(to_joint_state(msg) if kind == "arm" else to_odometry(msg))
            if not answer:
                robot.spin_until(lambda: False, 0.15)
                assert len(robot.cmds) == n0, f"event {i} ({ev}) was answered after {done}; seed {seed}"
                done.append(ev)
                continue
            assert robot.spin_until(lambda: len(robot.cmds) > n0, 15.0), \
                f"event {i} ({ev}): no command; seed {seed}\n{log.read_text()[-3000:]}"
            robot.spin_until(lambda: False, 0.02)
            assert len(robot.cmds) == n0 + 1, f"event {i} ({ev}): {len(robot.cmds) - n0} commands; seed {seed}"
            exp = m.expect(h.now)

            t = SimpleNamespace(command=np.array(robot.cmds[-1].data), policy=exp == "policy")
            # Which one was sent is told by the values: the policy's command for this state, or the safe one.
            answers[exp] += 1
            if exp == "policy":
                if kind == "arm":
                    want = h.ref.arm(h.ref.joint_names, values, h.valid_arm(u, 0)[2], target=TARGET,
                                     predict=False).command
                else:
                    _, (p, quat, vl, w) = h.valid_quad(u, 0)
                    want = h.ref.quadrotor(p, quat, vl, w, predict=False).command
                np.testing.assert_allclose(t.command, want, rtol=0, atol=1e-12,
                                           err_msg=f"event {i} ({ev}) after {done[-6:]}; seed {seed}")
                assert np.isfinite(t.command).all()
                assert (t.command >= h.cmd_lo).all() and (t.command <= h.cmd_hi).all()
            else:
                try:
                    h.check(t, exp)         # finite, within the URDF limits, the hold position / safe thrust
                except AssertionError as e:
                    raise AssertionError(f"event {i} ({ev}) after {done}; seed {seed}: {e}") from None
            done.append(ev)
        print(f"{kind}: {len(done)} events over DDS ({answers['policy']} policy and {answers['safe']} safe answers "
              "checked): " + ", ".join(sorted(set(done))))
        assert answers["policy"] >= 1 and answers["safe"] >= 1, answers
    finally:
        robot.close()
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, log.read_text()[-3000:]
