"""The replay node (``ros2 run diffsim_ros replay``).

Real rclpy/DDS on an isolated ROS_DOMAIN_ID, in-process for the message contents and as the
installed console script for start-up and exit.
"""
from __future__ import annotations

import os
import random
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("rosbags")
pytest.importorskip("mujoco")
rclpy = pytest.importorskip("rclpy")
pytestmark = pytest.mark.ros

from conftest import ros_domain  # noqa: E402
from diffsim_ros.analysis import Replay, read_bag, sim_setup  # noqa: E402
from diffsim_ros.testing.recordings import PERTURBATIONS, record_standard  # noqa: E402
from diffsim_ros.nodes import replay  # noqa: E402

DOMAIN = ros_domain(3)
EXE = Path(sys.executable).with_name("replay")


@pytest.fixture(scope="module")
def bags(tmp_path_factory):
    root = tmp_path_factory.mktemp("replay")
    record_standard("arm", root / "arm", PERTURBATIONS["arm"], steps=120)
    record_standard("quadrotor", root / "quad", PERTURBATIONS["quadrotor"], steps=60, predictions=False)
    return root


def test_every_parameter_is_declared_with_a_description():
    names = [p[0] for p in replay.PARAMETERS]
    assert len(names) == len(set(names))
    for name, default, text in replay.PARAMETERS:
        assert text and default is not None, name


def test_replay_publishes_recorded_and_predicted_velocities(bags):
    from rclpy.executors import SingleThreadedExecutor
    from rclpy.parameter import Parameter
    from sensor_msgs.msg import JointState

    bag = bags / "arm"
    ctx = rclpy.context.Context()
    rclpy.init(context=ctx, domain_id=DOMAIN)
    try:
        params = {"bag": str(bag), "rate": 10.0, "horizon": 2, "start_delay": 0.5, "exit_at_end": False}
        node = replay.make_node_class()(context=ctx, parameter_overrides=[Parameter(k, value=v)
                                                                          for k, v in params.items()])
        sub = rclpy.create_node(f"listener_{random.randint(0, 1 << 30)}", context=ctx)
        got = {"actual": [], "predicted": [], "error": []}
        for k in got:
            sub.create_subscription(JointState, f"/replay/{'velocity_error' if k == 'error' else k + '_velocity'}",
                                    lambda m, k=k: got[k].append(m), 1000)
        ex = SingleThreadedExecutor(context=ctx)
        ex.add_node(node)
        ex.add_node(sub)
        end = time.monotonic() + 20
        while time.monotonic() < end and not (node.done and len(got["actual"]) == node.play.count):
            ex.spin_once(timeout_sec=0.01)
        for _ in range(50):
            ex.spin_once(timeout_sec=0.01)
        node.destroy_node()
        sub.destroy_node()
    finally:
        rclpy.shutdown(context=ctx)

    data = read_bag(bag)
    assert len(got["actual"]) == len(data.t_state) == 121
    # Recorded velocities by joint name, with the bag's stamps.
    names = list(got["actual"][0].name)
    m = got["actual"][37]
    t = m.header.stamp.sec * 1_000_000_000 + m.header.stamp.nanosec
    assert t == data.t_state[37]
    np.testing.assert_allclose(m.velocity, [data.v[37, data.joint_names.index(n)] for n in names])
    # Predictions are the analysis' 2-step predictions for the same instants.
    rp = Replay(data, sim_setup(data))
    pred = rp.predict([2])[2]
    assert len(got["predicted"]) == len(got["error"]) == len(pred.start)
    by_t = {int(tt): v for tt, v in zip(pred.t, pred.v_pred.numpy())}
    for pm, em in zip(got["predicted"], got["error"]):
        tt = pm.header.stamp.sec * 1_000_000_000 + pm.header.stamp.nanosec
        want = by_t[tt][[rp.dof_names.index(n) for n in pm.name]]
        np.testing.assert_allclose(pm.velocity, want, rtol=1e-12)
        actual = data.v[np.searchsorted(data.t_state, tt)][[data.joint_names.index(n) for n in pm.name]]
        np.testing.assert_allclose(em.velocity, want - actual, atol=1e-12)
    assert node.published == 121


def _script(args, domain, timeout=60):
    env = dict(os.environ, ROS_DOMAIN_ID=str(domain))
    return subprocess.run([str(EXE), "--ros-args", *args], capture_output=True, text=True, timeout=timeout, env=env)


@pytest.mark.skipif(not EXE.exists(), reason="the 'replay' console script is not installed (pip install -e .)")
def test_console_script_plays_to_the_end_and_refuses_bad_bags(bags, tmp_path):
    res = _script(["-p", f"bag:={bags / 'quad'}", "-p", "rate:=20.0", "-p", "start_delay:=0.0"], DOMAIN + 1)
    assert res.returncode == 0, res.stderr
    assert "end of the bag: 61 samples published" in res.stderr + res.stdout
    res = _script(["-p", f"bag:={tmp_path / 'missing'}"], DOMAIN + 1)
    assert res.returncode == 2 and "replay: error:" in res.stderr and "no such bag" in res.stderr


def test_bad_parameters_stop_the_node_at_start(bags):
    from rclpy.parameter import Parameter

    from diffsim_ros.nodes.common import StartupError

    ctx = rclpy.context.Context()
    rclpy.init(context=ctx, domain_id=DOMAIN + 2)
    cls = replay.make_node_class()
    try:
        for params, text in (({}, "parameter 'bag' is required"),
                             ({"bag": str(bags / "quad"), "source": "bag"}, "/diffsim/predicted_state"),
                             ({"bag": str(bags / "quad"), "rate": 0.0}, "'rate' must be > 0"),
                             ({"bag": str(bags / "quad"), "horizon": 0}, "'horizon' must be >= 1")):
            with pytest.raises(StartupError, match=text):
                cls(context=ctx, parameter_overrides=[Parameter(k, value=v) for k, v in params.items()])
    finally:
        rclpy.shutdown(context=ctx)
