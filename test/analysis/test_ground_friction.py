"""The ground's friction coefficient of a legged robot from its bag.

The estimate (analysis/ground_friction.py, ``diffsim-ros sysid --params ground_friction
--method contact-free``) is tested against floors drawn on the MuJoCo stand-in, whose ground
(soft constraints, an elliptic friction cone) is not the simulator's penalty law with its
regularised friction: the shipped walkers of the project's quadruped (point feet) and of
example-robot-data's solo12 (box feet), drawn per run, walk fast on a drawn floor with a drawn
mass; a slippery floor must come back within 5 %, and a grippy one, where a walking gait never
reaches the cone, must not be called identified, its lower bound staying below the truth
(Coulomb's law bounds every foot's ratio of tangential to normal impulse).

Seeds print with the line that replays them (DIFFSIM_SYSID_SEED=<seed>).
"""
from __future__ import annotations

import json

import numpy as np
import pytest

from conftest import REPO_ROOT, drawn_seed

from diffsim_ros import cli, config
from diffsim_ros.analysis import AnalysisError, read_bag, sim_setup
from diffsim_ros.analysis.ground_friction import ground_friction
from diffsim_ros.learning.deploy import PolicyRunner
from diffsim_ros.testing.recordings import record_walker

pytest.importorskip("mujoco")

#: checkpoint folder, training file, the floors (factor on its coefficient) on which its fast
#: walk slides at the cone in both halves of a 10 s bag
WALKERS = {"quadruped": ("locomotion_velocity", (0.375, 0.55)),
           "solo12": ("locomotion_velocity_solo12", (0.4, 0.65))}


def _walk(path, robot, perturbation, speed=0.8, steps=1000):
    """Record the robot's shipped walker on the stand-in as a bag.

    The walk is at ``speed`` m/s for ``steps`` control steps, recorded as a bag; returns also the
    training file's parameters.
    """
    name = WALKERS[robot][0]
    params = config.load_yaml(REPO_ROOT / "config" / f"{name}.yaml")
    record_walker(path, PolicyRunner(REPO_ROOT / "policies" / name), params, perturbation, speed, steps)
    return params


def test_a_slippery_floor_comes_back_within_5_percent_and_recentres_the_training(tmp_path, capsys):
    """A slippery floor comes back within 5 % and recentres the training's friction draw.

    Through the command line: exit 0, the estimate within 5 % of the drawn floor's coefficient
    (measured: quadruped -0.2 to +0.4 %, solo12 +0.4 to +2.7 %; the test draws the robot), calibrated.yaml with that
    friction and training's per-episode draw moved to it (10 % either side).
    """
    seed = drawn_seed("ground friction, slippery", "DIFFSIM_SYSID_SEED")
    rng = np.random.default_rng(seed)
    robot = str(rng.choice(sorted(WALKERS)))
    pert = {"ground_friction_scale": float(rng.uniform(*WALKERS[robot][1])),
            "mass_scale": float(rng.uniform(0.9, 1.15))}
    params = _walk(tmp_path / "bag", robot, pert)
    truth = float(params["simulator"]["friction"]) * pert["ground_friction_scale"]
    out = tmp_path / "out"
    rc = cli.main(["sysid", str(tmp_path / "bag"), "--params", "ground_friction", "--method", "contact-free",
                   "--out", str(out)])
    printed = capsys.readouterr()
    print(robot, pert, truth, printed.out, printed.err)
    assert rc == 0, (seed, printed.err)
    r = json.loads((out / "sysid.json").read_text())
    assert r["friction"] == pytest.approx(truth, rel=0.05), (seed, robot, r["friction"], truth)
    assert r["sliding"] >= 10, r
    trained = config.load_yaml(out / "calibrated.yaml")
    assert trained["simulator"]["friction"] == pytest.approx(r["friction"], rel=1e-9)
    np.testing.assert_allclose(trained["training"]["randomize_ground_friction"],
                               [0.9 * r["friction"], 1.1 * r["friction"]], rtol=1e-9)
    assert config.build_task(trained, str(out / "calibrated.yaml")) is not None


def test_a_grippy_floor_is_not_identified_and_bounded_below(tmp_path):
    """A grippy floor is not called identified, and its lower bound stays below the truth.

    On a floor as grippy as the simulator's or more (x1.0-1.3) the walk stays inside the cone:
    the verdict is "not identified" (exit 3 from the command line) and the lower bound, the
    largest ratio any loaded foot used, is below the truth within the estimate's own error (5 %:
    solo12's box feet, each taken as one point, come out up to 3 % high).
    """
    seed = drawn_seed("ground friction, grippy", "DIFFSIM_SYSID_SEED")
    rng = np.random.default_rng(seed)
    robot = str(rng.choice(sorted(WALKERS)))
    pert = {"ground_friction_scale": float(rng.uniform(1.0, 1.3))}
    params = _walk(tmp_path / "bag", robot, pert, speed=float(rng.uniform(0.3, 0.8)), steps=500)
    truth = float(params["simulator"]["friction"]) * pert["ground_friction_scale"]
    data = read_bag(tmp_path / "bag")
    r = ground_friction(data, sim_setup(data))
    print(robot, pert, truth, r.verdict, r.lower_bound, r.reasons)
    assert r.verdict == "not identified", (seed, r.friction)
    assert 0 < r.lower_bound < 1.05 * truth, (seed, r.lower_bound, truth)
    assert f"at least {r.lower_bound:.3g}" in r.reasons[0]
    assert cli.main(["sysid", str(tmp_path / "bag"), "--params", "ground_friction", "--method", "contact-free",
                     "--out", str(tmp_path / "out")]) == 3
    assert not (tmp_path / "out" / "calibrated.yaml").exists()


def test_an_arm_bag_is_refused_by_name(tmp_path):
    """The estimate needs a floating base with feet: an arm's bag is an analysis error naming it."""
    from diffsim_ros.testing.recordings import record_standard

    record_standard("arm", tmp_path / "arm", steps=30)
    data = read_bag(tmp_path / "arm")
    with pytest.raises(AnalysisError, match="legged robot's bag"):
        ground_friction(data, sim_setup(data))
