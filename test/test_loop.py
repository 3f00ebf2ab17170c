"""The main job, `diffsim-ros loop`, on the pretrained hover policy (training is covered by
test_training.py / test_cli_train.py): the nodes as separate processes over DDS, the bag, and
the sim-vs-real summary checked against an analytic value of the gap."""
from __future__ import annotations

import json

import pytest

pytest.importorskip("rclpy", reason="rclpy not installed (ROS 2 client library)")
pytest.importorskip("mujoco", reason="the stand-in runs on MuJoCo (pip package 'mujoco')")
pytest.importorskip("rosbags", reason="bags are written and read with rosbags")

from conftest import REPO_ROOT, ros_domain  # noqa: E402

from diffsim_ros import cli  # noqa: E402
from diffsim_ros.loop import LoopError, run_loop  # noqa: E402


def test_loop_on_the_perturbed_stand_in(tmp_path):
    out = tmp_path / "loop"
    summary = run_loop(str(REPO_ROOT / "config" / "hover.yaml"), str(out), checkpoint=str(REPO_ROOT / "policies" / "hover"),
                       duration=2.5, perturbation={"mass_scale": 1.1}, log=lambda *_: None, domain=ros_domain())
    # The hover holds on a 10 % heavier quadrotor, and nothing the controller published is missing.
    assert summary["task"]["success"], summary["task"]
    assert summary["lost"] == {}
    assert summary["controller"]["published"]["/cmd_ctbr"] == summary["bag_counts"]["/cmd_ctbr"] > 100
    # Lockstep: one state per command, from t = 0 on (distinct stamps; none lost to discovery).
    assert summary["states_recorded"] >= summary["controller"]["published"]["/cmd_ctbr"]
    # The simulator believes the nominal mass: in one 20 ms step at hover thrust m g, the heavier
    # robot falls behind the prediction by g (1 - 1/1.1) dt in vertical speed (body z ~ world z at hover).
    dt, g = 0.02, 9.81
    expected = g * (1 - 1 / 1.1) * dt
    vz = summary["velocity_error"]["1"]["per_dof_rmse"]["vz"]
    assert 0.7 * expected < vz < 1.3 * expected, (vz, expected)
    # Lateral axes barely differ: the gap is the mass, not noise in the pipeline.
    assert summary["velocity_error"]["1"]["per_dof_rmse"]["vx"] < 0.1 * expected
    for name in ("summary.json", "analysis/report.md", "analysis/metrics.json", "analysis/velocity.png"):
        assert (out / name).is_file(), name
    assert json.loads((out / "summary.json").read_text())["bag"] == summary["bag"]
    # A recorded bag is never overwritten.
    with pytest.raises(LoopError, match="already exists"):
        run_loop(str(REPO_ROOT / "config" / "hover.yaml"), str(out), checkpoint=str(REPO_ROOT / "policies" / "hover"),
                 duration=0.5, log=lambda *_: None)


def test_loop_cli_rejects_bad_perturbation(capsys):
    assert cli.main(["loop", "--perturb", "mass_scale:1.2"]) == 2
    assert "KEY=NUMBER" in capsys.readouterr().err
