"""`diffsim-ros preflight` live over DDS against the MuJoCo stand-in (mujoco_plant, realtime).

GO on the arm it was trained for; NO-GO naming the fault when nothing subscribes the command
topic, when the checkpoint is another robot's (the quadrotor's: no odometry; the Panda's: its
joints missing), when the state comes slower than the policy's rate and its stamps follow a
simulator's clock that is not published.
"""
from __future__ import annotations

import os
import subprocess
import time

import pytest

rclpy = pytest.importorskip("rclpy", reason="rclpy not installed (ROS 2 client library)")
pytestmark = pytest.mark.ros

from conftest import REPO_ROOT, console_script, interrupt, ros_context, ros_domain  # noqa: E402

DOMAIN = ros_domain()


@pytest.fixture(scope="module")
def ros():
    yield from ros_context(DOMAIN)


def _plant(env, log, *extra):
    return subprocess.Popen([console_script("mujoco_plant"), "--ros-args", "-p",
                             f"config:={REPO_ROOT / 'config/reach_arm.yaml'}", "-p", "mode:=realtime", *extra],
                            env=env, stdout=log, stderr=subprocess.STDOUT)


def _wait_for_state(ros, log_path, timeout=60.0):
    from rclpy.executors import SingleThreadedExecutor
    from sensor_msgs.msg import JointState

    node = rclpy.create_node(f"preflight_waiter_{os.getpid()}", context=ros)
    ex = SingleThreadedExecutor(context=ros)
    ex.add_node(node)
    got = []
    node.create_subscription(JointState, "/joint_states", got.append, 10)
    end = time.monotonic() + timeout
    while time.monotonic() < end and len(got) < 5:
        ex.spin_once(timeout_sec=0.05)
    ex.shutdown()
    node.destroy_node()
    assert len(got) >= 5, open(log_path).read()


def _preflights(env, runs):
    """Run `diffsim-ros preflight` for each (checkpoint, extra args) at once; their results."""
    procs = [subprocess.Popen([console_script("diffsim-ros"), "preflight", str(REPO_ROOT / "policies" / ck),
                               "--seconds", "2", *extra], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for ck, extra in runs]
    out = []
    for p in procs:
        so, se = p.communicate(timeout=180)
        out.append((p.returncode, so, se))
    return out


def test_preflight_against_the_standin_is_go_and_names_each_fault(ros, tmp_path):
    env = dict(os.environ, ROS_DOMAIN_ID=str(DOMAIN), PYTHONUNBUFFERED="1", ROS_LOG_DIR=str(tmp_path / "ros_log"))
    env.pop("ROS_LOCALHOST_ONLY", None)
    log_path = tmp_path / "plant.log"
    plant = _plant(env, open(log_path, "w"))
    try:
        _wait_for_state(ros, log_path)
        go, nobody, quad, panda = _preflights(env, [("reach_arm", []), ("reach_arm", ["--command-topic", "/nobody"]),
                                                    ("hover", []), ("reach_panda", [])])
    finally:
        interrupt(plant)
    print(go[1], nobody[1], quad[1], panda[1], sep="\n")
    assert go[0] == 0 and go[1].splitlines()[-1] == "GO", go
    assert "[ok  ] command: 1 subscriber(s) on /position_controller/commands" in go[1]
    assert "against /clock" in go[1]                          # the stand-in's stamps follow its /clock
    assert nobody[0] == 1 and "NO-GO" in nobody[1] and "command: 0 subscriber(s) on /nobody" in nobody[1], nobody
    assert quad[0] == 1 and "odometry: none received" in quad[1], quad
    assert panda[0] == 1 and "joints: missing ['panda_joint1'" in panda[1], panda
    # A state slower than the policy's 50 Hz, stamped in simulated time with no /clock published.
    log_path = tmp_path / "plant_slow.log"
    plant = _plant(env, open(log_path, "w"), "-p", "publish_rate_hz:=20.0", "-p", "clock_topic:=''")
    try:
        _wait_for_state(ros, log_path)
        (rc, out, err), = _preflights(env, [("reach_arm", [])])
    finally:
        interrupt(plant)
    print(out)
    assert rc == 1, (out, err)
    assert "[FAIL] joint state rate: " in out and "needs at least 45.0 Hz" in out, out
    assert "[FAIL] joint state stamp age" in out, out
