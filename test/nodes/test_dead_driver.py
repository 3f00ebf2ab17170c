"""A dead robot driver is noticed in every mode.

policy_controller over DDS against the MuJoCo stand-in process, killed and restarted several
times.

The controller runs in timer mode under use_sim_time, as deploy.launch.py starts it against the
stand-in: its control timer runs on the stand-in's /clock. Killed (SIGKILL) mid-run, the clock
stops; the steady-clock watchdog still sends the safe command (the arm's hold of its last measured
position) and the diagnostics, which say the state is stale and the control timer stalled.
Restarted, the stand-in's clock starts again at 0: the controller says the clock jumped back,
holds the safe command (the new states, stamped before the last accepted one, are refused), and
after ~/reset runs the policy on the new states.
"""
from __future__ import annotations

import os
import random
import signal
import subprocess
import time

import numpy as np
import pytest

rclpy = pytest.importorskip("rclpy", reason="rclpy not installed (ROS 2 client library)")
pytestmark = pytest.mark.ros

from conftest import REPO_ROOT, console_script, interrupt, ros_context, ros_domain, spin_until  # noqa: E402

from diffsim_ros.nodes import policy_controller as pc  # noqa: E402

DOMAIN = ros_domain()
CYCLES = 3


@pytest.fixture(scope="module")
def ros():
    yield from ros_context(DOMAIN)


def test_killed_and_restarted_standin_is_noticed_and_recovered_by_reset(ros, tmp_path):
    from diagnostic_msgs.msg import DiagnosticArray
    from rclpy.executors import SingleThreadedExecutor
    from rclpy.parameter import Parameter
    from sensor_msgs.msg import JointState
    from std_msgs.msg import Float64MultiArray
    from std_srvs.srv import Trigger

    env = dict(os.environ, ROS_DOMAIN_ID=str(DOMAIN), PYTHONUNBUFFERED="1", ROS_LOG_DIR=str(tmp_path / "log"))
    env.pop("ROS_LOCALHOST_ONLY", None)

    def start_plant(k):
        log = open(tmp_path / f"plant{k}.log", "w")
        return subprocess.Popen([console_script("mujoco_plant"), "--ros-args", "-p",
                                 f"config:={REPO_ROOT / 'config/reach_arm.yaml'}", "-p", "mode:=realtime",
                                 "-p", "initial_positions:=[0.3, -0.4, 0.5, 0.1]"],
                                env=env, stdout=log, stderr=subprocess.STDOUT)

    cls = pc.make_node_class()
    params = {"checkpoint": str(REPO_ROOT / "policies" / "reach_arm"), "target": [0.2, 0.1, 0.35],
              "use_sim_time": True, "predict_every": 0, "preflight_s": 0.5}
    ctrl = cls(context=ros, parameter_overrides=[Parameter(k, value=v) for k, v in params.items()])
    probe = rclpy.create_node(f"dead_driver_probe_{random.randint(0, 1 << 30)}", context=ros)
    ex = SingleThreadedExecutor(context=ros)
    ex.add_node(ctrl)
    ex.add_node(probe)
    got = {"cmd": [], "diag": [], "js": []}
    probe.create_subscription(Float64MultiArray, "/position_controller/commands", got["cmd"].append, 100)
    probe.create_subscription(DiagnosticArray, "/diagnostics", got["diag"].append, 100)
    probe.create_subscription(JointState, "/joint_states", got["js"].append, 100)
    reset = probe.create_client(Trigger, "/policy_controller/reset")

    def spin(cond, timeout):
        return spin_until(ex, cond, timeout)

    def values():
        return {kv.key: kv.value for kv in got["diag"][-1].status[0].values}

    plant = start_plant(0)
    try:
        # 3 s of the policy: more simulated time than the restarted stand-in's clock runs before the
        # controller discovers it (about 1.3 s here), so that its clock is seen to jump back.
        assert spin(lambda: ctrl.sup.counts["policy_commands"] > 150, 90), open(tmp_path / "plant0.log").read()
        for k in range(1, CYCLES + 1):
            plant.send_signal(signal.SIGKILL)
            plant.wait(10)
            time.sleep(0.05)
            spin(lambda: False, 0.3)                # what was in flight
            last_q = list(got["js"][-1].position)
            n_cmd, n_diag = len(got["cmd"]), len(got["diag"])
            policy_before = ctrl.sup.counts["policy_commands"]
            spin(lambda: False, 2.5)
            # Still speaking with the driver dead: safe commands (the hold of the last measured
            # position) and diagnostics that say why.
            assert len(got["cmd"]) - n_cmd >= 10 and len(got["diag"]) - n_diag >= 2, (k, len(got["cmd"]) - n_cmd)
            assert ctrl.sup.counts["policy_commands"] == policy_before
            np.testing.assert_allclose(got["cmd"][-1].data, last_q, atol=1e-9)
            v = values()
            print(k, "dead:", got["diag"][-1].status[0].message, "|", v["control_timer"])
            assert v["control_timer"].startswith("stalled") and "watchdog" in got["diag"][-1].status[0].message
            plant = start_plant(k)
            assert spin(lambda: ctrl.clock_jumps_back == k, 60), open(tmp_path / f"plant{k}.log").read()
            spin(lambda: False, 1.0)
            assert ctrl.sup.counts["policy_commands"] == policy_before     # refused until ~/reset
            assert "backwards" in ctrl.sup.last_rejection or "jumped back" in (ctrl.sup.fault_reason or ""), \
                (ctrl.sup.last_rejection, ctrl.sup.fault_reason)
            assert reset.wait_for_service(timeout_sec=5.0)
            fut = reset.call_async(Trigger.Request())
            assert spin(fut.done, 10)
            assert spin(lambda: ctrl.sup.counts["policy_commands"] > policy_before + 150, 30), \
                (ctrl.sup.last_rejection, ctrl.sup.fault_reason)
            assert values()["control_timer"] == "running" or spin(lambda: values()["control_timer"] == "running", 3)
            print(k, "after ~/reset:", ctrl.sup.counts["policy_commands"] - policy_before, "policy commands")
    finally:
        if plant.poll() is None:
            interrupt(plant)
        ex.shutdown()
        ctrl.destroy_node()
        probe.destroy_node()
