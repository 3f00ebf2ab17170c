"""policy_controller over real rclpy/DDS, in one process on an isolated ROS_DOMAIN_ID.

A test node plays the robot (publishes /joint_states or /odom, listens to the
commands); each command is compared with an independent PolicyRunner on the
same checkpoint, each prediction with Simulator.step. Fault behaviour: NaN
state, stale state, missing and reordered joints, emergency stop, refusal of a
checkpoint for another robot (the console script exits non-zero with the reason).
"""
from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

rclpy = pytest.importorskip("rclpy", reason="rclpy not installed (ROS 2 client library)")
pytestmark = pytest.mark.ros

from builders import make_checkpoint  # noqa: E402
from conftest import REPO_ROOT, drawn_seed, ros_context, ros_domain  # noqa: E402

from diffsim_ros import physics  # noqa: E402
from diffsim_ros.control import px4_rates_setpoint  # noqa: E402
from diffsim_ros.learning.deploy import PolicyRunner  # noqa: E402
from diffsim_ros.nodes import policy_controller as pc  # noqa: E402

DOMAIN = ros_domain(2)


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    d = tmp_path_factory.mktemp("ckpt")
    make_checkpoint("hover", d / "hover")
    make_checkpoint("reach_arm", d / "reach")
    return d


@pytest.fixture(scope="module")
def ros():
    yield from ros_context(DOMAIN)


class Harness:
    """The controller node plus a 'robot' node in one executor."""

    def __init__(self, ctx, params):
        from rclpy.executors import SingleThreadedExecutor
        from rclpy.parameter import Parameter

        cls = pc.make_node_class()
        # The fake robots here publish a few states and listen where a test needs it: the start-up
        # preflight, which would judge them as a robot, is off unless a test turns it on.
        params = {"preflight": False, **params}
        overrides = [Parameter(k, value=v) for k, v in params.items()]
        self.ctrl = cls(context=ctx, parameter_overrides=overrides)
        self.robot = rclpy.create_node(f"fake_robot_{random.randint(0, 1 << 30)}", context=ctx)
        self.ex = SingleThreadedExecutor(context=ctx)
        self.ex.add_node(self.ctrl)
        self.ex.add_node(self.robot)
        self.got = {}

    def listen(self, msg_type, topic, qos=10):
        self.got[topic] = []
        self.robot.create_subscription(msg_type, topic, lambda m: self.got[topic].append(m), qos)

    def spin_until(self, cond, timeout=5.0):
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            self.ex.spin_once(timeout_sec=0.01)
            if cond():
                return True
        return False

    def wait_matched(self, pub, timeout=5.0):
        assert self.spin_until(lambda: pub.get_subscription_count() > 0, timeout), "no subscriber matched"

    def close(self):
        self.ex.shutdown()
        self.ctrl.destroy_node()
        self.robot.destroy_node()


def joint_state(names, q, v, stamp_ns=None):
    """Build a JointState stamped ``stamp_ns`` (default: now on the wall clock, as a robot's driver does)."""
    from sensor_msgs.msg import JointState

    if stamp_ns is None:
        stamp_ns = time.time_ns()
    m = JointState()
    m.header.stamp.sec, m.header.stamp.nanosec = divmod(stamp_ns, 1_000_000_000)
    m.name, m.position, m.velocity = list(names), [float(x) for x in q], [float(x) for x in v]
    return m


def test_every_parameter_has_default_and_description(ros, ckpts):
    h = Harness(ros, {"checkpoint": str(ckpts / "hover")})
    try:
        names = set(pc.PARAMETERS)
        declared = {n for n in h.ctrl._parameters if n not in ("use_sim_time", "start_type_description_service")}
        assert declared == names
        for n in names:
            d = h.ctrl.describe_parameter(n)
            assert d.description.strip(), n
    finally:
        h.close()


def test_a_whole_number_is_accepted_wherever_a_number_is_and_a_string_is_refused_by_name(ros, ckpts):
    """Check that every number parameter takes an integer, as mujoco_plant's do, and refuses a string by name.

    ``-p rate_hz:=50`` parses as an integer; rclpy refused it against the double default (a whole
    number where the schema allows a number must be accepted everywhere). Drawn per run (seed
    printed): three of the double parameters get a whole number, one of the double lists
    (``target``, ``workspace_min``, ...; empty by default) whole numbers, and each reads back as
    the same number; then a string in a drawn number parameter stops the node at start with an
    error naming the parameter and what it must be.
    """
    import numbers

    from rclpy.parameter import Parameter

    from diffsim_ros.nodes.common import StartupError

    rng = random.Random(drawn_seed("policy_controller number parameters", "DIFFSIM_PARAM_SEED"))
    doubles = sorted(n for n, (d, _) in pc.PARAMETERS.items() if isinstance(d, float))
    lists = sorted(n for n, t in pc.ARRAY_TYPES.items() if t == "double")
    picked = rng.sample(doubles, 3)
    given = {n: rng.randint(1, 3) for n in picked}
    given[rng.choice(lists)] = [rng.randint(-2, 2) for _ in range(3)]
    print(given)
    # A value some parameters refuse on their own terms (a rate, a time-out) is not the point here:
    # read the declared values straight after declaration.
    cls = pc.make_node_class()
    node = rclpy.create_node(f"declared_{random.randint(0, 1 << 30)}", context=ros,
                             parameter_overrides=[Parameter(k, value=v) for k, v in given.items()])
    try:
        cls._declare(node)
        for name, v in given.items():
            got = node.get_parameter(name).value
            got = list(got) if not isinstance(got, numbers.Real) else got
            assert got == v and all(isinstance(x, float) for x in (got if isinstance(got, list) else [got])), \
                (name, got)
    finally:
        node.destroy_node()
    bad = rng.choice(doubles)
    with pytest.raises(StartupError, match=rf"parameter '{bad}' must be a number \(default .*\), got 'fast'"):
        cls(context=ros, parameter_overrides=[Parameter("checkpoint", value=str(ckpts / "hover")),
                                              Parameter(bad, value="fast")])


def test_arm_lockstep_command_prediction_and_reordering(ros, ckpts):
    from sensor_msgs.msg import JointState
    from std_msgs.msg import Float64MultiArray, String
    from rclpy.qos import DurabilityPolicy, QoSProfile

    target = [0.2, 0.1, 0.35]
    # A long state timeout: the watchdog (tested below) stays out of this test's way.
    h = Harness(ros, {"checkpoint": str(ckpts / "reach"), "lockstep": True, "target": target,
                      "state_timeout_s": 60.0})
    try:
        ref = PolicyRunner(ckpts / "reach")
        h.listen(Float64MultiArray, "/position_controller/commands")
        h.listen(Float64MultiArray, "/diffsim/command")
        h.listen(JointState, "/diffsim/predicted_state")
        h.listen(String, "/diffsim/metadata", QoSProfile(depth=1, durability=DurabilityPolicy.TRANSIENT_LOCAL))
        pub = h.robot.create_publisher(JointState, "/joint_states", 10)
        h.wait_matched(pub)
        names = ref.joint_names
        q, v = np.array([0.3, -0.4, 0.5, 0.1]), np.array([0.1, 0.0, -0.2, 0.05])
        t0 = time.time_ns()
        pub.publish(joint_state(names, q, v, t0))
        assert h.spin_until(lambda: len(h.got["/diffsim/predicted_state"]) == 1)
        want = ref.arm(names, q, v, target=target)
        sent = np.array(h.got["/position_controller/commands"][0].data)
        np.testing.assert_allclose(sent, want.command, rtol=0, atol=1e-12)
        cmd = h.got["/diffsim/command"][0]
        assert cmd.layout.dim[0].label == str(t0)
        np.testing.assert_allclose(cmd.data, want.command, rtol=0, atol=1e-12)
        pred = h.got["/diffsim/predicted_state"][0]
        assert pred.header.stamp.sec * 1_000_000_000 + pred.header.stamp.nanosec == t0 + 20_000_000   # + dt 0.02 s
        sim = physics.Simulator(ref.model, ref.task.sim_config)
        s1 = sim.step(sim.initial_state(torch.tensor(q[None]), torch.tensor(v[None])), torch.tensor(want.command[None]))
        np.testing.assert_allclose(pred.velocity, s1.v[0].numpy(), rtol=0, atol=1e-12)
        np.testing.assert_allclose(pred.position, s1.q[0].numpy(), rtol=0, atol=1e-12)
        assert h.spin_until(lambda: len(h.got["/diffsim/metadata"]) >= 1)
        meta = json.loads(h.got["/diffsim/metadata"][0].data)
        assert meta["checkpoint"]["robot"]["name"] == "diffsim_arm" and meta["interface"] == "forward_command"
        # Reordered names plus an extra joint: the same command (the controller's runner carries no
        # arm actuator state, so the second call is comparable).
        perm = [2, 0, 3, 1]
        pub.publish(joint_state([names[i] for i in perm] + ["finger"], list(q[perm]) + [0.0],
                                list(v[perm]) + [0.0], t0 + 20_000_000))
        assert h.spin_until(lambda: len(h.got["/position_controller/commands"]) == 2)
        np.testing.assert_array_equal(h.got["/position_controller/commands"][1].data, sent)
        # The same stamp again (a lockstep plant republishing its state): taken, not answered.
        pub.publish(joint_state(names, q, v, t0 + 20_000_000))
        assert h.spin_until(lambda: h.ctrl.counts["states_repeated"] == 1)
        h.spin_until(lambda: False, 0.1)
        assert len(h.got["/position_controller/commands"]) == 2
        # Missing joint: ignored (another publisher's partial state), no command.
        pub.publish(joint_state(names[:3], q[:3], v[:3]))
        assert h.spin_until(lambda: h.ctrl.counts["states_ignored"] == 1)
        h.spin_until(lambda: False, 0.2)
        assert len(h.got["/position_controller/commands"]) == 2
        assert "missing" in h.ctrl.last_reject and names[3] in h.ctrl.last_reject
        # NaN: rejected and the safe command (hold the last valid measured position) goes out at once.
        pub.publish(joint_state(names, [0.0, float("nan"), 0.0, 0.0], v))
        assert h.spin_until(lambda: len(h.got["/position_controller/commands"]) == 3)
        np.testing.assert_allclose(h.got["/position_controller/commands"][2].data, q[perm][np.argsort(perm)])
        assert h.ctrl.counts["safe_commands"] >= 1 and h.ctrl.counts["states_rejected"] == 1
    finally:
        h.close()


def test_stale_state_and_estop_latch(ros, ckpts):
    from sensor_msgs.msg import JointState
    from std_msgs.msg import Float64MultiArray
    from std_srvs.srv import SetBool
    from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus

    target = [0.2, 0.1, 0.35]
    h = Harness(ros, {"checkpoint": str(ckpts / "reach"), "rate_hz": 50.0, "state_timeout_s": 0.15,
                      "target": target, "diagnostics_period_s": 0.2, "predict_every": 0})
    try:
        ref = PolicyRunner(ckpts / "reach")
        h.listen(Float64MultiArray, "/position_controller/commands")
        h.listen(DiagnosticArray, "/diagnostics")
        pub = h.robot.create_publisher(JointState, "/joint_states", 10)
        h.wait_matched(pub)
        names, q, v = ref.joint_names, np.array([0.3, -0.4, 0.5, 0.1]), np.zeros(4)
        want = ref.arm(names, q, v, target=target, predict=False).command
        pub.publish(joint_state(names, q, v))
        assert h.spin_until(lambda: len(h.got["/position_controller/commands"]) >= 3)
        np.testing.assert_allclose(h.got["/position_controller/commands"][0].data, want, atol=1e-12)
        # No more states: after state_timeout_s the timer sends the hold command.
        assert h.spin_until(lambda: h.ctrl.counts["safe_commands"] >= 2, 2.0)
        n_policy = h.ctrl.counts["policy_commands"]
        got = h.got["/position_controller/commands"]
        assert h.spin_until(lambda: len(got) >= n_policy + 2, 2.0)
        np.testing.assert_allclose(got[n_policy].data, q)
        np.testing.assert_allclose(got[-1].data, q)
        assert h.spin_until(lambda: any(s.level == DiagnosticStatus.WARN and "old" in s.message
                                        for a in h.got["/diagnostics"] for s in a.status), 2.0)
        # Emergency stop: fresh states keep producing the safe command until released.
        cli = h.robot.create_client(SetBool, "/policy_controller/emergency_stop")
        assert h.spin_until(cli.service_is_ready, 5.0)
        fut = cli.call_async(SetBool.Request(data=True))
        assert h.spin_until(fut.done) and fut.result().success
        n0 = h.ctrl.counts["policy_commands"]
        for _ in range(5):
            pub.publish(joint_state(names, q + 0.1, v))
            h.spin_until(lambda: False, 0.05)
        h.spin_until(lambda: False, 0.1)
        assert h.ctrl.counts["policy_commands"] == n0
        last = np.array(h.got["/position_controller/commands"][-1].data)
        np.testing.assert_allclose(last, q + 0.1)           # hold the latest valid measurement
        assert "emergency stop" in h.ctrl.diagnostics_values()["watchdog"]
        # Fresh states at 50 Hz from before the release on, as a robot sends them: the release (a
        # service round trip, 0.4 s on a loaded machine) must not leave the latest state stale, which
        # would latch the watchdog instead and test another rule.
        keep = h.robot.create_timer(0.02, lambda: pub.publish(joint_state(names, q, v)))
        h.spin_until(lambda: False, 0.1)
        fut = cli.call_async(SetBool.Request(data=False))
        assert h.spin_until(fut.done) and fut.result().success
        assert h.spin_until(lambda: h.ctrl.counts["policy_commands"] > n0, 2.0)
        h.robot.destroy_timer(keep)
    finally:
        h.close()


def test_arm_joint_trajectory_interface(ros, ckpts):
    from sensor_msgs.msg import JointState
    from trajectory_msgs.msg import JointTrajectory

    target = [0.2, 0.1, 0.35]
    h = Harness(ros, {"checkpoint": str(ckpts / "reach"), "lockstep": True, "target": target,
                      "interface": "joint_trajectory", "state_timeout_s": 60.0, "predict_every": 0})
    try:
        ref = PolicyRunner(ckpts / "reach")
        h.listen(JointTrajectory, "/joint_trajectory_controller/joint_trajectory")
        pub = h.robot.create_publisher(JointState, "/joint_states", 10)
        h.wait_matched(pub)
        q, v = np.array([0.3, -0.4, 0.5, 0.1]), np.zeros(4)
        pub.publish(joint_state(ref.joint_names, q, v))
        assert h.spin_until(lambda: len(h.got["/joint_trajectory_controller/joint_trajectory"]) == 1)
        m = h.got["/joint_trajectory_controller/joint_trajectory"][0]
        assert list(m.joint_names) == ref.actuated_joints and len(m.points) == 1
        want = ref.arm(ref.joint_names, q, v, target=target, predict=False).command
        np.testing.assert_allclose(m.points[0].positions, want, atol=1e-12)
        tfs = m.points[0].time_from_start
        assert tfs.sec + tfs.nanosec * 1e-9 == pytest.approx(ref.dt)
    finally:
        h.close()


@pytest.mark.parametrize("interface", ["ctbr", "rotor_thrust", "cmd_vel_legacy"])
def test_quadrotor_interfaces(ros, ckpts, interface):
    from geometry_msgs.msg import Twist, TwistStamped
    from nav_msgs.msg import Odometry
    from std_msgs.msg import Float64MultiArray

    h = Harness(ros, {"checkpoint": str(ckpts / "hover"), "lockstep": True, "interface": interface,
                      "safe_thrust": 2.0, "state_timeout_s": 60.0})
    try:
        ref = PolicyRunner(ckpts / "hover")
        topic, kind = {"ctbr": ("/cmd_ctbr", TwistStamped), "rotor_thrust": ("/cmd_rotor_thrust", Float64MultiArray),
                       "cmd_vel_legacy": ("/cmd_vel_legacy", Twist)}[interface]
        h.listen(kind, topic)
        h.listen(Float64MultiArray, "/diffsim/command")
        h.listen(Odometry, "/diffsim/predicted_state")
        pub = h.robot.create_publisher(Odometry, "/odom", 10)
        h.wait_matched(pub)
        m = Odometry()
        m.header.stamp.sec, m.header.stamp.nanosec = divmod(time.time_ns(), 1_000_000_000)
        m.header.frame_id, m.child_frame_id = "world", "base_link"
        p, quat, vl, w = [0.1, -0.2, 0.9], [0.0, 0.0, 0.0, 1.0], [0.2, 0.0, -0.1], [0.1, 0.3, 0.0]
        m.pose.pose.position.x, m.pose.pose.position.y, m.pose.pose.position.z = p
        m.pose.pose.orientation.w = 1.0
        m.twist.twist.linear.x, m.twist.twist.linear.z = 0.2, -0.1
        m.twist.twist.angular.x, m.twist.twist.angular.y = 0.1, 0.3
        pub.publish(m)
        assert h.spin_until(lambda: len(h.got["/diffsim/predicted_state"]) == 1)
        want = ref.quadrotor(p, quat, vl, w)
        np.testing.assert_allclose(h.got["/diffsim/command"][0].data, want.command, atol=1e-12)
        out = h.got[topic][0]
        if interface == "ctbr":
            np.testing.assert_allclose([out.twist.linear.z, out.twist.angular.x, out.twist.angular.y,
                                        out.twist.angular.z], want.command, atol=1e-12)
            assert out.twist.linear.x == 0.0 and out.twist.linear.y == 0.0
        elif interface == "rotor_thrust":
            rot = ref.sim.rotors
            t = rot.ctbr_thrusts(torch.tensor(want.command[None]), torch.tensor([w], dtype=torch.float64))[0].numpy()
            np.testing.assert_allclose(out.data, np.clip(t, 0, rot.cfg.max_thrust), atol=1e-12)
        else:
            assert 0 <= out.linear.z <= 65535 and abs(out.angular.z - np.degrees(want.command[3])) < 1e-9
        pred = h.got["/diffsim/predicted_state"][0]
        np.testing.assert_allclose([pred.twist.twist.linear.x, pred.twist.twist.linear.y, pred.twist.twist.linear.z],
                                   want.predicted.v[0, 0:3].numpy(), atol=1e-12)
        # NaN odometry: safe command (safe_thrust collective, zero rates) at once.
        m.twist.twist.angular.z = float("inf")
        m.header.stamp.sec, m.header.stamp.nanosec = divmod(time.time_ns(), 1_000_000_000)
        pub.publish(m)
        assert h.spin_until(lambda: len(h.got["/diffsim/command"]) == 2)
        expect = [2.0, 0, 0, 0] if interface != "rotor_thrust" else [2.0, 0, 0, 0]
        np.testing.assert_allclose(h.got["/diffsim/command"][1].data, expect)
    finally:
        h.close()


@pytest.mark.slow
def test_compiled_prediction_is_built_at_start_and_predicts_as_the_eager_step(ros, ckpts):
    """compile_prediction: the node predicts through the compiled step as the eager step does.

    The node builds the step compiled ahead of time before its first state;
    over five consecutive lockstep states drawn at random (seed printed), each command equals an
    eager PolicyRunner's and each prediction its eager Simulator.step to round-off, the rotor speeds
    carried on from one prediction to the next in both.
    """
    from nav_msgs.msg import Odometry
    from std_msgs.msg import Float64MultiArray

    seed = random.randrange(1 << 16)
    print(f"states drawn with seed {seed}")
    rng = np.random.default_rng(seed)
    h = Harness(ros, {"checkpoint": str(ckpts / "hover"), "lockstep": True, "compile_prediction": True,
                      "state_timeout_s": 60.0})
    try:
        assert h.ctrl.runner._predictor is not h.ctrl.runner.sim      # the compiled step, already built
        ref = PolicyRunner(ckpts / "hover")
        h.listen(Float64MultiArray, "/diffsim/command")
        h.listen(Odometry, "/diffsim/predicted_state")
        pub = h.robot.create_publisher(Odometry, "/odom", 10)
        h.wait_matched(pub)
        for k in range(5):
            p, vl, w = rng.uniform(-0.3, 0.3, 3) + [0, 0, 1], rng.uniform(-0.5, 0.5, 3), rng.uniform(-0.5, 0.5, 3)
            quat = np.r_[rng.uniform(-0.1, 0.1, 3), 1.0]
            quat /= np.linalg.norm(quat)
            m = Odometry()
            m.header.stamp.sec, m.header.stamp.nanosec = divmod(time.time_ns(), 1_000_000_000)
            m.header.frame_id, m.child_frame_id = "world", "base_link"
            pp, o, tw = m.pose.pose.position, m.pose.pose.orientation, m.twist.twist
            pp.x, pp.y, pp.z = (float(x) for x in p)
            o.x, o.y, o.z, o.w = (float(x) for x in quat)
            tw.linear.x, tw.linear.y, tw.linear.z = (float(x) for x in vl)
            tw.angular.x, tw.angular.y, tw.angular.z = (float(x) for x in w)
            pub.publish(m)
            assert h.spin_until(lambda: len(h.got["/diffsim/predicted_state"]) == k + 1, timeout=30)
            want = ref.quadrotor(p, quat, vl, w)
            np.testing.assert_allclose(h.got["/diffsim/command"][k].data, want.command, rtol=0, atol=1e-12)
            got = h.got["/diffsim/predicted_state"][k]
            gp, gt = got.pose.pose.position, got.twist.twist
            np.testing.assert_allclose([gp.x, gp.y, gp.z], want.predicted.q[0, 0:3].numpy(), rtol=0, atol=1e-12)
            np.testing.assert_allclose([gt.linear.x, gt.linear.y, gt.linear.z, gt.angular.x, gt.angular.y,
                                        gt.angular.z], want.predicted.v[0, 0:6].numpy(), rtol=0, atol=1e-10)
    finally:
        h.close()


def test_an_unknown_executor_is_refused_by_name(ckpts):
    res = _run_script(["-p", f"checkpoint:={ckpts / 'hover'}", "-p", "executor:=multi"])
    assert res.returncode == 2 and ("parameter 'executor' must be one of ('events', 'single_threaded'), got "
                                    "'multi'") in res.stderr, res.stderr


def _run_script(args, timeout=60):
    env = dict(os.environ, ROS_DOMAIN_ID=str(DOMAIN + 1))
    exe = Path(sys.executable).with_name("policy_controller")
    return subprocess.run([str(exe), "--ros-args", *args], capture_output=True, text=True, timeout=timeout, env=env)


def test_refuses_checkpoint_for_another_robot(ckpts):
    res = _run_script(["-p", f"checkpoint:={ckpts / 'hover'}", "-p",
                       f"urdf:={REPO_ROOT / 'urdf' / 'diffsim_arm.urdf'}"])
    assert res.returncode == 2, res.stderr
    assert "refusing checkpoint" in res.stderr and "made for robot 'diffsim_quadrotor' with other joints" in res.stderr
    res = _run_script(["-p", f"checkpoint:={ckpts / 'reach'}"])      # no target for a reach policy
    assert res.returncode == 2 and "parameter 'target' is required" in res.stderr


def test_px4_rates_setpoint_is_the_ctbr_command_in_frd():
    # FLU (REP-103) to PX4's FRD body frame is a rotation by pi about x: diag(1, -1, -1).
    R = np.diag([1.0, -1.0, -1.0])
    rng = np.random.default_rng(0)
    for _ in range(20):
        cmd = np.concatenate(([rng.uniform(0, 40)], rng.uniform(-3, 3, 3)))
        roll, pitch, yaw, thrust_body = px4_rates_setpoint(cmd, 32.0)
        np.testing.assert_allclose([roll, pitch, yaw], R @ cmd[1:4], atol=1e-12)
        # Thrust pushes along body +z (FLU), i.e. -z in FRD, as a fraction of the maximum.
        np.testing.assert_allclose(thrust_body, R @ [0.0, 0.0, min(cmd[0] / 32.0, 1.0)], atol=1e-12)


def test_px4_interface_needs_px4_msgs(ckpts):
    try:
        import px4_msgs  # noqa: F401
    except ImportError:
        res = _run_script(["-p", f"checkpoint:={ckpts / 'hover'}", "-p", "interface:=px4_rates"])
        assert res.returncode == 2 and "px4_msgs package is not importable" in res.stderr, res.stderr
    else:
        pytest.skip("px4_msgs is installed: the refusal does not apply")


def test_lockstep_answers_a_republished_state_once_the_gates_open(ros, ckpts):
    """In lockstep, a republished state is answered once the gates open.

    A lockstep plant republishes its initial state until its first command. A copy that arrived
    while wait_for_subscribers kept the controller silent must be answered by the next copy once
    the gate opens (regression: the copies were taken for already-answered repeats and the loop
    deadlocked).
    """
    from sensor_msgs.msg import JointState
    from std_msgs.msg import Float64MultiArray

    target = [0.2, 0.1, 0.35]
    h = Harness(ros, {"checkpoint": str(ckpts / "reach"), "lockstep": True, "target": target,
                      "state_timeout_s": 60.0, "wait_for_subscribers": 1, "predict_every": 0})
    try:
        ref = PolicyRunner(ckpts / "reach")
        pub = h.robot.create_publisher(JointState, "/joint_states", 10)
        h.wait_matched(pub)
        q, v = np.array([0.3, -0.4, 0.5, 0.1]), np.zeros(4)
        stamp = time.time_ns()
        pub.publish(joint_state(ref.joint_names, q, v, stamp))
        assert h.spin_until(lambda: h.ctrl.counts["states_accepted"] == 1)
        assert h.ctrl.counts["commands_sent"] == 0                    # the gate is closed: no subscriber yet
        h.listen(Float64MultiArray, "/position_controller/commands")
        assert h.spin_until(lambda: h.ctrl.pub_out.get_subscription_count() >= 1)
        pub.publish(joint_state(ref.joint_names, q, v, stamp))         # the plant's next copy
        assert h.spin_until(lambda: len(h.got["/position_controller/commands"]) == 1), h.ctrl.counts
        want = ref.arm(ref.joint_names, q, v, target=target, predict=False).command
        np.testing.assert_allclose(h.got["/position_controller/commands"][0].data, want, atol=1e-12)
        pub.publish(joint_state(ref.joint_names, q, v, stamp))         # answered once only
        h.spin_until(lambda: False, 0.2)
        assert len(h.got["/position_controller/commands"]) == 1
    finally:
        h.close()


def test_excite_mode_sends_the_excitation_through_the_same_path(ros):
    """Mode excite sends the excitation through the same path as a policy.

    mode excite: no checkpoint; the commands on the controller's output topic and on
    /diffsim/command are the excitation's own sequence (a separate ArmExcitation of the same
    settings: the node and the supervisor pass it on unchanged), the metadata says so and carries
    the config for sysid, and the e-stop and a NaN state still give the safe hold.
    """
    from sensor_msgs.msg import JointState
    from std_msgs.msg import Float64MultiArray, String
    from std_srvs.srv import SetBool
    from rclpy.qos import DurabilityPolicy, QoSProfile

    from diffsim_ros import config as cfgmod
    from diffsim_ros.control.excitation import ExcitationConfig, ExcitationRunner

    config = str(REPO_ROOT / "config/reach_arm.yaml")
    h = Harness(ros, {"mode": "excite", "config": config, "lockstep": True, "state_timeout_s": 60.0,
                      "excitation.seed": 4, "excitation.amplitude": 0.3, "excitation.duration": 2.0})
    try:
        params = cfgmod.load_yaml(config)
        ref = ExcitationRunner(params, ExcitationConfig(seed=4, amplitude=0.3, duration=2.0)).signal
        h.listen(Float64MultiArray, "/position_controller/commands")
        h.listen(Float64MultiArray, "/diffsim/command")
        h.listen(String, "/diffsim/metadata", QoSProfile(depth=1, durability=DurabilityPolicy.TRANSIENT_LOCAL))
        pub = h.robot.create_publisher(JointState, "/joint_states", 10)
        h.wait_matched(pub)
        names = h.ctrl.runner.joint_names
        q0 = np.array([0.2, -0.1, 0.3, 0.0])
        ref.start(q0)
        t0 = time.time_ns()
        q = q0.copy()
        for k in range(30):
            pub.publish(joint_state(names, q, np.zeros(4), t0 + k * 20_000_000))
            assert h.spin_until(lambda: len(h.got["/position_controller/commands"]) == k + 1)
            q = np.array(h.got["/position_controller/commands"][k].data)      # a robot that follows exactly
        sent = np.array([m.data for m in h.got["/position_controller/commands"]])
        np.testing.assert_allclose(sent, np.array([ref.command(k) for k in range(30)]), rtol=0, atol=1e-12)
        assert h.spin_until(lambda: len(h.got["/diffsim/command"]) >= 30)
        np.testing.assert_allclose(np.array([m.data for m in h.got["/diffsim/command"][:30]]), sent, atol=1e-12)
        assert h.spin_until(lambda: len(h.got["/diffsim/metadata"]) >= 1)
        meta = json.loads(h.got["/diffsim/metadata"][0].data)
        assert meta["mode"] == "excite" and meta["checkpoint"] is None
        assert meta["config"]["urdf"].endswith("diffsim_arm.urdf") and meta["excitation"]["seed"] == 4
        assert h.ctrl.diagnostics_values()["controller_mode"] == "excite"
        # The supervisor as for a policy: e-stop -> hold the latest measured position.
        cli = h.robot.create_client(SetBool, "/policy_controller/emergency_stop")
        assert h.spin_until(cli.service_is_ready, 5.0)
        fut = cli.call_async(SetBool.Request(data=True))
        assert h.spin_until(fut.done) and fut.result().success
        pub.publish(joint_state(names, q, np.zeros(4), t0 + 30 * 20_000_000))
        assert h.spin_until(lambda: len(h.got["/position_controller/commands"]) == 31)
        np.testing.assert_allclose(h.got["/position_controller/commands"][30].data, q, atol=1e-12)
        assert h.ctrl.runner.k == 30                        # the excitation did not advance
    finally:
        h.close()


def _ros2_or_skip() -> str:
    from diffsim_ros.workflows.loop import ros2_executable

    exe = ros2_executable()
    if exe is None:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail("CI must have the ros2 CLI (scripts/bootstrap.sh installs it)")
        pytest.skip("the ros2 CLI is not installed (scripts/bootstrap.sh)")
    return exe


def test_cmd_vel_from_ros2_topic_pub_drives_a_walker_and_its_timeout_stands_it(ros, tmp_path):
    """/cmd_vel from `ros2 topic pub` drives a walker, and its timeout stands it.

    `ros2 topic pub /cmd_vel geometry_msgs/msg/Twist` (the ros2 CLI, another process) as a teleop
    node streams it: a walker trained at 0.2-0.8 m/s asked for 2.0 m/s (and a turn) walks at 0.8, the
    policy's command on each state equal to an independent runner's for 0.8, the diagnostics naming the
    clamp and the ignored turn; when the publisher stops, the controller stands it on its stance
    (cmd_vel_timeout_s); `--once` with a stop request stands it at once.
    """
    from sensor_msgs.msg import Imu, JointState
    from std_msgs.msg import Float64MultiArray

    exe = _ros2_or_skip()
    make_checkpoint("locomotion_velocity_solo12", tmp_path / "walker", gain=2.0)
    # A timeout longer than a loaded machine's gaps between the CLI's messages (20 Hz).
    h = Harness(ros, {"checkpoint": str(tmp_path / "walker"), "lockstep": True, "state_timeout_s": 60.0,
                      "cmd_vel_timeout_s": 1.0})
    env = dict(os.environ, ROS_DOMAIN_ID=str(DOMAIN), ROS_LOG_DIR=str(tmp_path / "ros_log"))
    env.pop("ROS_LOCALHOST_ONLY", None)
    streaming = None
    try:
        ref = PolicyRunner(tmp_path / "walker")
        names = ref.joint_names
        qj = np.zeros(len(names))
        # Off the stance, so that standing (the stance) and the safe command (hold the measured
        # joints) differ.
        qj[ref.sim.act_index.numpy()] = ref.task.stance.double().numpy() + 0.05
        stance = np.clip(ref.task.stance.double().numpy(), ref.command_low, ref.command_high)
        h.listen(Float64MultiArray, "/position_controller/commands")
        pub_js = h.robot.create_publisher(JointState, "/joint_states", 10)
        pub_imu = h.robot.create_publisher(Imu, "/imu", 10)
        h.wait_matched(pub_js)
        h.wait_matched(pub_imu)

        def answer(k):
            """Publish a state (joints and IMU, one stamp: now); the controller's command for it."""
            stamp = time.time_ns()
            pub_js.publish(joint_state(names, qj, np.zeros(len(names)), stamp))
            m = Imu()
            m.header.stamp.sec, m.header.stamp.nanosec = divmod(stamp, 1_000_000_000)
            m.header.frame_id = "base_link"
            m.orientation.w, m.angular_velocity.z, m.linear_acceleration.z = 1.0, 0.1, 9.81
            n = len(h.got["/position_controller/commands"])
            pub_imu.publish(m)
            assert h.spin_until(lambda: len(h.got["/position_controller/commands"]) == n + 1)
            return np.array(h.got["/position_controller/commands"][-1].data)

        streaming = subprocess.Popen([exe, "topic", "pub", "-r", "20", "/cmd_vel", "geometry_msgs/msg/Twist",
                                      "{linear: {x: 2.0}, angular: {z: 0.5}}"], env=env, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, text=True)
        assert h.spin_until(lambda: h.ctrl.velocity.last is not None, 30.0), "no /cmd_vel from `ros2 topic pub`"
        for k in range(5):
            want = ref.legged(names, qj, np.zeros(len(names)), [0, 0, 0], [0, 0, 0, 1], [0, 0, 0], [0, 0, 0.1],
                              target=[0.8], predict=False).command
            np.testing.assert_allclose(answer(k), want, rtol=0, atol=1e-12)
        diag = h.ctrl.diagnostics_values()
        assert diag["cmd_vel_command"] == "[0.8]", diag
        assert diag["cmd_vel_last_clamped"] == "linear.x" and diag["cmd_vel_last_ignored"] == "angular.z", diag
        streaming.terminate()
        streaming.wait(10)
        h.spin_until(lambda: False, 1.3)                     # past cmd_vel_timeout_s
        np.testing.assert_array_equal(answer(5), stance)
        assert "timed out" in h.ctrl.diagnostics_values()["cmd_vel_command"]
        # A new request walks again from a fresh episode; a stop from the CLI stands at once.
        res = subprocess.run([exe, "topic", "pub", "--once", "-w", "1", "/cmd_vel", "geometry_msgs/msg/Twist",
                              "{linear: {x: 0.0}}"], env=env, capture_output=True, text=True, timeout=60,
                             stdin=subprocess.DEVNULL)
        assert res.returncode == 0, res.stdout + res.stderr
        assert h.spin_until(lambda: h.ctrl.velocity.counts["cmd_vel_received"] >= 2, 10.0)
        np.testing.assert_array_equal(answer(6), stance)
        assert h.ctrl.diagnostics_values()["cmd_vel_command"] == "stand"
        assert h.ctrl.counts["states_rejected"] == 0 and h.ctrl.counts["safe_commands"] == 0
    finally:
        if streaming is not None and streaming.poll() is None:
            streaming.kill()
        h.close()


def test_cmd_vel_stamped_commands_a_quadrotor_velocity_policy(ros, tmp_path):
    """Stamped /cmd_vel commands a quadrotor velocity policy.

    `ros2 topic pub --once /cmd_vel geometry_msgs/msg/TwistStamped` (cmd_vel_stamped) to the
    quadrotor velocity task (trained within +-1.5 m/s per axis): 3.0 m/s forward and 0.5 down is
    the policy's command for (1.5, 0, -0.5), an independent runner says; a hover at zero after the
    timeout; the clamp named in the diagnostics.
    """
    from nav_msgs.msg import Odometry
    from std_msgs.msg import Float64MultiArray

    exe = _ros2_or_skip()
    make_checkpoint("velocity", tmp_path / "velocity")
    h = Harness(ros, {"checkpoint": str(tmp_path / "velocity"), "lockstep": True, "state_timeout_s": 60.0,
                      "cmd_vel_stamped": True, "cmd_vel_timeout_s": 0.3})
    env = dict(os.environ, ROS_DOMAIN_ID=str(DOMAIN), ROS_LOG_DIR=str(tmp_path / "ros_log"))
    env.pop("ROS_LOCALHOST_ONLY", None)
    try:
        ref = PolicyRunner(tmp_path / "velocity")
        assert ref.task.max_speed_command == 1.5
        h.listen(Float64MultiArray, "/diffsim/command")
        pub = h.robot.create_publisher(Odometry, "/odom", 10)
        h.wait_matched(pub)
        p, quat, vl, w = [0.1, -0.2, 0.9], [0.0, 0.0, 0.0, 1.0], [0.2, 0.0, -0.1], [0.1, 0.3, 0.0]

        def answer():
            m = Odometry()
            m.header.stamp.sec, m.header.stamp.nanosec = divmod(time.time_ns(), 1_000_000_000)
            m.header.frame_id, m.child_frame_id = "world", "base_link"
            m.pose.pose.position.x, m.pose.pose.position.y, m.pose.pose.position.z = p
            m.pose.pose.orientation.w = 1.0
            m.twist.twist.linear.x, m.twist.twist.linear.z = vl[0], vl[2]
            m.twist.twist.angular.x, m.twist.twist.angular.y = w[0], w[1]
            n = len(h.got["/diffsim/command"])
            pub.publish(m)
            assert h.spin_until(lambda: len(h.got["/diffsim/command"]) == n + 1)
            return np.array(h.got["/diffsim/command"][-1].data)

        res = subprocess.run([exe, "topic", "pub", "--once", "-w", "1", "/cmd_vel", "geometry_msgs/msg/TwistStamped",
                              "{twist: {linear: {x: 3.0, z: -0.5}}}"], env=env, capture_output=True, text=True,
                             timeout=60, stdin=subprocess.DEVNULL)
        assert res.returncode == 0, res.stdout + res.stderr
        assert h.spin_until(lambda: h.ctrl.velocity.last is not None, 10.0)
        np.testing.assert_allclose(answer(), ref.quadrotor(p, quat, vl, w, target=[1.5, 0.0, -0.5]).command, atol=1e-12)
        assert h.ctrl.diagnostics_values()["cmd_vel_last_clamped"] == "linear.x"
        h.spin_until(lambda: False, 0.5)                     # past cmd_vel_timeout_s: hover (zero velocity)
        np.testing.assert_allclose(answer(), ref.quadrotor(p, quat, vl, w, target=[0.0, 0.0, 0.0]).command, atol=1e-12)
    finally:
        h.close()


def test_policy_format_onnx_runs_the_exported_policy(ros, tmp_path):
    """policy_format onnx runs the exported policy.

    The controller runs policy.onnx (diffsim-ros export --onnx) through
    onnxruntime, its commands TorchScript's to float32 precision, the metadata saying which.
    """
    pytest.importorskip("onnxruntime")
    import shutil

    from sensor_msgs.msg import JointState
    from std_msgs.msg import Float64MultiArray, String
    from rclpy.qos import DurabilityPolicy, QoSProfile

    from diffsim_ros.learning.onnx_export import export_onnx

    folder = tmp_path / "reach_arm"
    shutil.copytree(REPO_ROOT / "policies" / "reach_arm", folder, ignore=shutil.ignore_patterns("checkpoints"))
    export_onnx(folder, episodes=0)
    target = [0.2, 0.1, 0.35]
    h = Harness(ros, {"checkpoint": str(folder), "lockstep": True, "target": target, "state_timeout_s": 60.0,
                      "policy_format": "onnx", "predict_every": 0})
    try:
        ref = PolicyRunner(folder)
        h.listen(Float64MultiArray, "/position_controller/commands")
        h.listen(String, "/diffsim/metadata", QoSProfile(depth=1, durability=DurabilityPolicy.TRANSIENT_LOCAL))
        pub = h.robot.create_publisher(JointState, "/joint_states", 10)
        h.wait_matched(pub)
        rng = np.random.default_rng(7)
        for k in range(5):
            q, v = rng.uniform(-1.5, 1.5, 4), rng.uniform(-0.5, 0.5, 4)
            pub.publish(joint_state(ref.joint_names, q, v))
            assert h.spin_until(lambda: len(h.got["/position_controller/commands"]) == k + 1)
            want = ref.arm(ref.joint_names, q, v, target=target, predict=False).command
            np.testing.assert_allclose(h.got["/position_controller/commands"][k].data, want, rtol=0, atol=1e-5)
        assert h.spin_until(lambda: len(h.got["/diffsim/metadata"]) >= 1)
        assert json.loads(h.got["/diffsim/metadata"][0].data)["policy_format"] == "onnx"
    finally:
        h.close()


def test_startup_preflight_go_then_policy_and_no_go_holds_the_safe_command(ros, ckpts):
    """Startup preflight: GO then the policy, and NO-GO holds the safe command.

    preflight on (the default), timer mode: a robot publishing its joint states at twice the
    policy's rate with a listener on the command topic gets no command during the preflight
    window, then the policy's (diagnostics: GO). The same robot at a third of the policy's rate is
    NO-GO: the safe command (hold the measured joints) until ~/reset, then the policy's.
    """
    from sensor_msgs.msg import JointState
    from std_msgs.msg import Float64MultiArray
    from std_srvs.srv import Trigger

    target = [0.2, 0.1, 0.35]
    ref = PolicyRunner(ckpts / "reach")
    names = ref.joint_names
    q, v = np.array([0.3, -0.4, 0.5, 0.1]), np.zeros(4)
    policy_cmd = ref.arm(names, q, v, target=target, predict=False).command
    for hz, go in ((100.0, True), (50.0 / 3.0, False)):
        h = Harness(ros, {"checkpoint": str(ckpts / "reach"), "target": target, "state_timeout_s": 60.0,
                          "preflight": True, "preflight_s": 0.6, "predict_every": 0})
        try:
            h.listen(Float64MultiArray, "/position_controller/commands")
            pub = h.robot.create_publisher(JointState, "/joint_states", 10)
            h.wait_matched(pub)
            t_first, next_pub = time.monotonic(), 0.0
            first_cmd = None
            end = time.monotonic() + 4.0
            while time.monotonic() < end:
                now = time.monotonic()
                if now >= next_pub:
                    pub.publish(joint_state(names, q, v))
                    next_pub = now + 1.0 / hz
                h.ex.spin_once(timeout_sec=0.002)
                if first_cmd is None and h.got["/position_controller/commands"]:
                    first_cmd = time.monotonic() - t_first
            sent = [np.array(m.data) for m in h.got["/position_controller/commands"]]
            diag = h.ctrl.diagnostics_values()
            print(hz, "first command after", first_cmd, "s;", diag["preflight"])
            assert first_cmd is not None and first_cmd >= 0.6, first_cmd     # nothing during the window
            if go:
                assert diag["preflight"] == "GO", diag
                np.testing.assert_allclose(sent[-1], policy_cmd, rtol=0, atol=1e-12)
                continue
            assert diag["preflight"].startswith("NO-GO") and "joint state rate" in diag["preflight"], diag
            assert all(np.allclose(c, q, atol=1e-12) for c in sent), sent[-1]            # hold, every one
            assert h.ctrl.sup.counts["policy_commands"] == 0
            cli = h.robot.create_client(Trigger, "/policy_controller/reset")
            assert h.spin_until(cli.service_is_ready, 5.0)
            fut = cli.call_async(Trigger.Request())
            assert h.spin_until(fut.done) and "preflight NO-GO" in fut.result().message
            n = len(h.got["/position_controller/commands"])
            pub.publish(joint_state(names, q, v))
            assert h.spin_until(lambda: len(h.got["/position_controller/commands"]) > n + 2)
            np.testing.assert_allclose(h.got["/position_controller/commands"][-1].data, policy_cmd, rtol=0,
                                       atol=1e-12)
        finally:
            h.close()
