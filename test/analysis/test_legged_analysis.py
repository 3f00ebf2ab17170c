"""The sim-vs-real comparison and the calibration on a legged robot's bag.

The bag holds /odom and /joint_states of equal stamp. The tests are against independent
references: the simulator replaying a bag of itself (exact), MuJoCo with the ground off (the
free-floating multibody: the two engines agree to round-off), and perturbations drawn at
random that the calibration must find.

Seeds print with the line that replays them (DIFFSIM_SYSID_SEED=<seed>).
"""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from conftest import REPO_ROOT, drawn_away, drawn_seed

from diffsim_ros import cli, config, physics
from diffsim_ros.analysis import AnalysisError, analyze, calibrate, read_bag, sim_setup
from diffsim_ros.analysis.bag import BagWriter
from diffsim_ros.analysis.legged import legged_report
from diffsim_ros.learning.deploy import PolicyRunner
from diffsim_ros.physics.registry import from_perturbation
from diffsim_ros.testing.recordings import make_plant, record_bag, record_walker

CONFIG = REPO_ROOT / "config" / "locomotion_velocity.yaml"
POLICY = REPO_ROOT / "policies" / "locomotion_velocity"


@pytest.fixture(scope="module")
def runner():
    return PolicyRunner(POLICY)


def _record(path, runner, backend, perturbation, steps, params=None, speed=0.5):
    """Record the shipped walking policy on ``backend`` as a bag.

    The backend is the simulator or the MuJoCo stand-in; the walk starts from its task's standing
    start and is recorded as a bag with the predictions (diffsim_ros.testing).
    """
    return record_walker(path, runner, params or config.load_yaml(CONFIG), perturbation, speed, steps, backend,
                         predictions=True)


def test_a_legged_bag_is_the_pair_of_base_and_joints_and_replays_exactly(tmp_path, runner):
    """A legged bag is the pair of base and joints, and replays exactly.

    The simulator's own legged recording, its /joint_states written in a shuffled joint order:
    read back as base-then-joints states, replayed through the same simulator it predicts every
    velocity exactly, 1 and 10 steps ahead; `diffsim-ros analyze` writes the comparison beside
    the gait.
    """
    rec = _record(tmp_path / "sim", runner, "simulator", {}, 120)
    data = read_bag(tmp_path / "sim")
    assert data.kind == "legged" and data.q.shape == (121, 19) and data.v.shape == (121, 18)
    np.testing.assert_allclose(data.q, rec["q"], atol=1e-12)
    assert data.dof_names[:6] == ["vx", "vy", "vz", "wx", "wy", "wz"]
    m = analyze(tmp_path / "sim", horizons=(1, 10), plots=False)
    for k in ("1", "10"):
        assert m["prediction"]["by_horizon"][k]["rmse"] < 1e-9, m["prediction"]["by_horizon"][k]
    assert float(np.abs(rec["v"][1:] - rec["v"][:-1]).max()) > 1.0, "the policy should move the robot"

    # The same states as a robot's drivers would stamp them: the joints in another order on
    # /joint_states, stamped up to 2 ms apart from /odom (10 ms steps), the commands labelled with
    # the later of the two (as the controller's supervisor pairs them), and a lone /odom message.
    rng = np.random.default_rng(3)
    names = list(runner.model.joint_names)
    perm = rng.permutation(len(names))
    t_ns = np.round((rec["t"] + 100.0) * 1e9).astype(np.int64)
    t_joint = t_ns + rng.integers(-2_000_000, 2_000_000, len(t_ns))
    with BagWriter(tmp_path / "shuffled") as w:
        w.metadata({"config": config.load_yaml(CONFIG), "checkpoint": runner.meta}, receive_ns=int(t_ns[0]))
        for k in range(len(t_ns)):
            q, v = rec["q"][k], rec["v"][k]
            w.odometry(t_ns[k], q, v, receive_ns=t_ns[k])
            if k != 40:
                w.joint_state(t_joint[k], [names[i] for i in perm], q[7:][perm], v[6:][perm], receive_ns=t_ns[k])
            if k < len(rec["cmd"]):
                w.command(t_ns[k] + 3_000_000, rec["cmd"][k], max(t_ns[k], t_joint[k]))
    shuffled = read_bag(tmp_path / "shuffled")
    assert len(shuffled.t_state) == 120 and any("1 message(s) without a partner" in x for x in shuffled.warnings)
    keep = np.arange(121) != 40
    np.testing.assert_array_equal(shuffled.t_state, np.maximum(t_ns, t_joint)[keep])
    np.testing.assert_allclose(shuffled.v[:, 6:], rec["v"][keep][:, 6:][:, perm], atol=1e-12)
    m2 = analyze(tmp_path / "shuffled", horizons=(1,), plots=False)
    assert m2["prediction"]["by_horizon"]["1"]["rmse"] < 1e-9
    assert m2["model"]["dofs"][6:] == names
    # The gait report pairs them the same way (it required equal stamps, and found none here).
    rep = legged_report(tmp_path / "shuffled")
    assert rep["steps"] == 120 and rep["min_base_height_m"] == pytest.approx(rec["q"][keep][:, 2].min(), abs=1e-12)
    assert rep["duration_s"] == pytest.approx((np.maximum(t_ns, t_joint)[keep][-1] - t_ns[0]) * 1e-9 -
                                              (np.maximum(t_ns, t_joint)[keep][0] - t_ns[0]) * 1e-9, abs=1e-9)

    rc = cli.main(["analyze", str(tmp_path / "sim"), "--out", str(tmp_path / "out"), "--horizons", "1,5"])
    assert rc == 0
    for f in ("footfall.png", "legged.json", "legged.md", "velocity.png", "report.md", "metrics.json"):
        assert (tmp_path / "out" / f).stat().st_size > 0, f
    assert json.loads((tmp_path / "out" / "metrics.json").read_text())["kind"] == "legged"


def test_a_legged_bag_needs_states_on_both_topics(tmp_path):
    with BagWriter(tmp_path / "b") as w:
        w.metadata({"config": config.load_yaml(CONFIG)})
        for k in range(5):
            q = np.r_[0.0, 0.0, 0.3, 0.0, 0.0, 0.0, 1.0, np.zeros(12)]
            w.odometry(1_000_000 * k, q, np.zeros(18))
            w.joint_state(10_000_000_000 + 1_000_000 * k, [f"j{i}" for i in range(12)], np.zeros(12), np.zeros(12))
            w.command(1_000_000 * k + 9, np.zeros(12), 1_000_000 * k)
    with pytest.raises(AnalysisError, match="0 pair\\(s\\) within"):
        read_bag(tmp_path / "b")


def test_in_the_air_the_legged_comparison_finds_mujoco_and_the_simulator_agree(tmp_path, runner):
    """In the air, the legged comparison finds MuJoCo and the simulator equal.

    Ground off: the quadruped falls with its legs driven by the policy. MuJoCo (the stand-in)
    and the simulator share everything but the engine; the analysis of the stand-in's bag finds
    them equal to round-off. With a drawn mass perturbation on the stand-in, it does not.
    """
    params = config.load_yaml(CONFIG)
    params["simulator"] = dict(params["simulator"], ground=False)
    _record(tmp_path / "air", runner, "mujoco", {}, 60, params)
    m = analyze(tmp_path / "air", horizons=(1, 5), plots=False)
    assert m["prediction"]["by_horizon"]["5"]["rmse"] < 1e-6, m["prediction"]["by_horizon"]["5"]
    _record(tmp_path / "heavy", runner, "mujoco", {"mass_scale": 1.3}, 60, params)
    m = analyze(tmp_path / "heavy", horizons=(1,), plots=False)
    assert m["prediction"]["by_horizon"]["1"]["rmse"] > 1e-3


LEGGED_NAMES = ["mass_scale", "ground_friction"]


def fit_drawn_floor(path, runner, backend, seed):
    """Fit mass and ground friction to a walker's bag on a drawn floor.

    Returns (result, truth, perturbation, setup): the walker's 5 s bag on ``backend`` with a mass
    (x0.8-1.3) and floor friction (x0.4-1.2) drawn from ``seed``, mass and ground friction fitted
    (also bench/sysid_draws.py --kind legged).
    """
    rng = np.random.default_rng(seed)
    pert = {"mass_scale": drawn_away(rng, 0.8, 1.3, 1.0, 0.08),
            "ground_friction_scale": drawn_away(rng, 0.4, 1.2, 1.0, 0.15)}
    _record(path, runner, backend, pert, 250)
    data = read_bag(path)
    setup = sim_setup(data)
    r = calibrate(data, setup, LEGGED_NAMES, window=3, max_starts=48, max_iter=15)
    truth = from_perturbation(physics.build_system(setup.model, setup.sim_config), pert)
    return r, truth, pert, setup


def test_sysid_recovers_drawn_mass_and_ground_friction_from_a_legged_bag(tmp_path, runner):
    """Sysid recovers a drawn mass and ground friction from a legged bag.

    The simulator as the robot, heavier and on a drawn floor: the walking policy's bag gives
    both back (the model is exact here, so the fit must be too), and the calibrated training
    file builds a system with the fitted floor.
    """
    seed = drawn_seed("legged sysid", "DIFFSIM_SYSID_SEED")
    r, truth, pert, setup = fit_drawn_floor(tmp_path / "bag", runner, "simulator", seed)
    names = LEGGED_NAMES
    print(f"perturbation {pert}: fitted {r.fitted}, truth { {n: truth[n].tolist() for n in names} }, {r.reasons}")
    assert r.accepted, r.reasons
    for n in names:
        assert r.fitted[n][0] == pytest.approx(float(truth[n][0]), rel=0.02), n
    from diffsim_ros.analysis.sysid import calibrated_params
    from diffsim_ros.physics.registry import PARAMETERS
    calibrated = physics.build_system(setup.model, config.simulator_config(calibrated_params(setup, r, None)))
    assert PARAMETERS["ground_friction"].nominal(calibrated).item() == pytest.approx(r.fitted["ground_friction"][0])


@pytest.fixture(scope="module")
def solo12():
    """Example-robot-data's solo12 and its standing configuration.

    The robot as `diffsim-ros init` set it up (config/jump_solo12.yaml) and its standing
    configuration.
    """
    params = config.load_yaml(REPO_ROOT / "config" / "jump_solo12.yaml")
    task, _ = config.build_task(params, "solo12")
    with torch.no_grad():
        q0 = task.reset(1, torch.Generator().manual_seed(0)).sim.q[0].double().numpy()
    return params, q0


def test_a_solo12_bag_replays_exactly_and_matches_mujoco_in_the_air(tmp_path, solo12):
    """A solo12 bag replays exactly and matches MuJoCo in the air.

    A robot the project does not ship: solo12 stamping and sliding on the floor under drawn
    sine targets (testing.recordings.legged_exciter), recorded from the simulator, replays
    exactly (1 and 5 steps ahead); with the ground off, the MuJoCo stand-in's bag of the same
    motion is the simulator's to round-off, and a drawn mass on the stand-in is seen.
    """
    from diffsim_ros.testing.recordings import legged_exciter

    params, q0 = solo12
    seed = drawn_seed("solo12 bag", "DIFFSIM_SYSID_SEED")
    rng = np.random.default_rng(seed)
    drive = legged_exciter(params, seed=seed % 1000, amplitude=0.3)
    record_bag(tmp_path / "floor", make_plant(params, {}, "simulator", q0), drive, 80, params)
    data = read_bag(tmp_path / "floor")
    assert data.kind == "legged" and data.q.shape == (81, 19), (data.kind, data.q.shape)
    m = analyze(tmp_path / "floor", horizons=(1, 5), plots=False)
    for k in ("1", "5"):
        assert m["prediction"]["by_horizon"][k]["rmse"] < 1e-9, (seed, m["prediction"]["by_horizon"][k])
    assert float(np.abs(np.diff(data.v[:, 6:], axis=0)).max()) > 0.1, "the sines should move the legs"

    air = dict(params, simulator=dict(params["simulator"], ground=False))
    record_bag(tmp_path / "air", make_plant(air, {}, "mujoco", q0), drive, 40, air)
    m = analyze(tmp_path / "air", horizons=(1, 5), plots=False)
    assert m["prediction"]["by_horizon"]["5"]["rmse"] < 1e-6, (seed, m["prediction"]["by_horizon"]["5"])
    heavy = drawn_away(rng, 0.7, 1.3, 1.0, 0.1)
    record_bag(tmp_path / "heavy", make_plant(air, {"mass_scale": heavy}, "mujoco", q0), drive, 40, air)
    m = analyze(tmp_path / "heavy", horizons=(1,), plots=False)
    assert m["prediction"]["by_horizon"]["1"]["rmse"] > 1e-4, (seed, heavy, m["prediction"]["by_horizon"]["1"])


def test_sysid_recovers_a_drawn_solo12_mass_from_its_bag(tmp_path, solo12):
    """Sysid recovers a drawn solo12 mass from its bag within 1 %.

    solo12 (example-robot-data) as the robot, its mass drawn: the exciter's bag on the floor
    gives it back within 1 % (the model is exact).
    """
    from diffsim_ros.testing.recordings import legged_exciter

    params, q0 = solo12
    seed = drawn_seed("solo12 sysid", "DIFFSIM_SYSID_SEED")
    pert = {"mass_scale": drawn_away(np.random.default_rng(seed), 0.75, 1.3, 1.0, 0.08)}
    record_bag(tmp_path / "bag", make_plant(params, pert, "simulator", q0),
               legged_exciter(params, seed=seed % 1000, amplitude=0.3), 150, params, predictions=False)
    data = read_bag(tmp_path / "bag")
    setup = sim_setup(data)
    r = calibrate(data, setup, ["mass_scale"], window=3, max_starts=32, max_iter=15)
    truth = float(from_perturbation(physics.build_system(setup.model, setup.sim_config), pert)["mass_scale"][0])
    print(f"seed {seed}: mass_scale {truth:.4f}, fitted {r.fitted}, {r.verdict} {r.reasons}")
    assert r.accepted, (seed, r.reasons)
    assert r.fitted["mass_scale"][0] == pytest.approx(truth, rel=0.01), seed
