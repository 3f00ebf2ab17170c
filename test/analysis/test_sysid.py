"""Tests of ``diffsim-ros sysid``.

Gradient-based calibration through the simulator recovers the perturbations of the MuJoCo
stand-in from bags recorded here, cuts the held-out velocity error, and writes a training
file that ``diffsim-ros train`` reads.
"""
from __future__ import annotations

import json
import re

import pytest
import torch

pytest.importorskip("rosbags")
pytest.importorskip("mujoco")

from diffsim_ros import cli, config  # noqa: E402
from diffsim_ros.analysis import AnalysisError, analyze, calibrate, read_bag, sim_setup  # noqa: E402
from diffsim_ros.testing.recordings import PERTURBATIONS, record_standard  # noqa: E402

STEPS = 300
FAST = dict(window=3, max_starts=64)      # small fits: a few seconds each


@pytest.fixture(scope="module")
def perturbed(tmp_path_factory):
    root = tmp_path_factory.mktemp("sysid")
    bags = {}
    for kind in ("arm", "quadrotor"):
        record_standard(kind, root / kind, PERTURBATIONS[kind], steps=STEPS, seed=1, predictions=False)
        bags[kind] = root / kind
    return bags


def test_sysid_recovers_arm_mass_and_joint_damping(perturbed):
    data = read_bag(perturbed["arm"])
    setup = sim_setup(data)
    r = calibrate(data, setup, ["mass_scale", "joint_damping"], **FAST)
    assert r.fitted["mass_scale"][0] == pytest.approx(1.2, rel=0.05)
    truth = (3.0 * setup.model.damping).tolist()            # joint_damping_scale 3 on the URDF's
    for fitted, true in zip(r.fitted["joint_damping"], truth):
        assert fitted == pytest.approx(true, rel=0.05)
    assert r.nominal["mass_scale"] == [1.0]
    assert r.heldout["before"]["rmse"] > 5 * r.heldout["after"]["rmse"], r.heldout


def test_sysid_cli_recovers_quadrotor_mass_and_drag_and_closes_the_loop(perturbed, tmp_path, capsys):
    out = tmp_path / "cal"
    rc = cli.main(["sysid", str(perturbed["quadrotor"]), "--params", "mass_scale,drag_scale", "--out", str(out),
                   "--window", "3", "--max-starts", "64"])
    text = capsys.readouterr()
    assert rc == 0, text.err
    report = json.loads((out / "sysid.json").read_text())
    assert report["fitted"]["mass_scale"][0] == pytest.approx(1.2, rel=0.05)
    assert report["fitted"]["drag_scale"][0] == pytest.approx(2.0, rel=0.05)
    assert report["heldout"]["before"]["rmse"] > 5 * report["heldout"]["after"]["rmse"]
    assert "held-out velocity RMSE" in text.out
    # Each progress line names the windows it fits: a start's one-step stage before its requested windows.
    stages = [m.group(1) for m in re.finditer(r"^  eval +\d+  (.*?)  loss ", text.out, re.M)]
    assert stages and set(stages) <= {"1-step windows", "3-step windows"}, stages
    assert stages[0] == "1-step windows" and "3-step windows" in stages, stages
    assert "| mass_scale (-) |" in (out / "sysid.md").read_text()

    # calibrated.yaml is a training file: `diffsim-ros train --config` builds its task from it,
    # with the calibrated masses (in calibrated.urdf) and drag.
    params, task, model = config.load_training_file(out / "calibrated.yaml")
    nominal = config.load_model(config.load_yaml(config.package_share() / "config" / "hover.yaml"))
    assert float(model.mass.sum()) == pytest.approx(1.2 * float(nominal.mass.sum()), rel=0.05)
    drag = params["simulator"]["rotors"]["drag_linear"]
    assert drag == pytest.approx([0.2, 0.2, 0.3], rel=0.05)
    # ... and the simulator it describes predicts the perturbed robot far better than the nominal one.
    before = analyze(perturbed["quadrotor"], horizons=(5,), plots=False)
    after = analyze(perturbed["quadrotor"], config_path=str(out / "calibrated.yaml"), horizons=(5,), plots=False)
    assert before["prediction"]["by_horizon"]["5"]["rmse"] > 5 * after["prediction"]["by_horizon"]["5"]["rmse"]


def test_sysid_refuses_unknown_or_inapplicable_parameters(perturbed, tmp_path, capsys):
    rc = cli.main(["sysid", str(perturbed["arm"]), "--params", "mass_scale,wheel_radius", "--out",
                   str(tmp_path / "x"), "--quiet"])
    assert rc == 2 and "unknown parameter 'wheel_radius'" in capsys.readouterr().err
    rc = cli.main(["sysid", str(perturbed["arm"]), "--params", "drag_scale", "--out", str(tmp_path / "x"), "--quiet"])
    assert rc == 2 and "'drag_scale' needs a robot with rotors" in capsys.readouterr().err
    data = read_bag(perturbed["arm"])
    with pytest.raises(AnalysisError, match="too few usable 50-step windows"):
        calibrate(data, sim_setup(data), ["mass_scale"], window=50, fit_fraction=0.9)


def test_sysid_gradient_flows_to_every_parameter(perturbed):
    """The calibration is by gradient: every differentiable parameter gets a gradient.

    Every differentiable parameter of the arm and the quadrotor gets a finite, non-zero gradient
    of the windowed velocity loss.
    """
    from diffsim_ros.analysis.params import SPECS, build_simulator, nominal_values
    from diffsim_ros.analysis.predict import Replay

    for kind, names in (("arm", ["mass_scale", "inertia_scale", "joint_damping", "joint_friction"]),
                        ("quadrotor", ["link_mass_scale", "drag_linear", "drag_quadratic", "thrust_scale"])):
        data = read_bag(perturbed[kind])
        rp = Replay(data, sim_setup(data))
        vals = {n: nominal_values(n, rp.model, rp.setup.sim_config).requires_grad_(True) for n in names}
        assert all(SPECS[n].differentiable for n in names)
        starts = rp.valid_starts(2)[10:30]
        v = rp.rollout(starts, [2], build_simulator(rp.model, rp.setup.sim_config, vals))[2]
        (v - rp.v[torch.as_tensor(rp.target_index(starts, 2))]).pow(2).sum().backward()
        for n in names:
            g = vals[n].grad
            assert g is not None and torch.isfinite(g).all() and g.abs().max() > 0, (kind, n, g)


@pytest.mark.parametrize("perturbation, names, truth", [
    ({"latency": 0.02, "mass_scale": 1.2}, ["latency", "mass_scale"], {"latency": 1.0, "mass_scale": 1.2}),
    ({"actuator_lag": 0.035}, ["motor_time_constant"], {"motor_time_constant": 0.035}),
])
def test_sysid_finds_latency_and_motor_lag_by_search(tmp_path, perturbation, names, truth):
    """Latency and motor lag are found by the derivative-free search.

    Parameters that are plain numbers in the simulator config (the command delay in whole
    control steps, the rotor-speed lag) are found by the derivative-free search, alongside
    the gradient fit. The plant's latency of 20 ms is one control step of config/hover.yaml.
    """
    record_standard("quadrotor", tmp_path / "bag", perturbation, steps=300, seed=2, predictions=False)
    data = read_bag(tmp_path / "bag")
    r = calibrate(data, sim_setup(data), names, **FAST)
    for name, value in truth.items():
        assert r.fitted[name][0] == pytest.approx(value, rel=0.05), (name, r.fitted)
    assert r.heldout["before"]["rmse"] > 5 * r.heldout["after"]["rmse"]


def test_sysid_recovers_a_thrust_model_error_and_writes_it(tmp_path, capsys):
    """Sysid recovers a thrust model error and writes it to calibrated.yaml.

    Motors 15 % weaker than the model the flight controller's mixer commands with
    (rotors.thrust_scale 0.85 on the stand-in only; the bag's metadata keeps the nominal file):
    sysid finds the factor, and calibrated.yaml carries it as rotors.thrust_scale, so the
    simulator it describes predicts the robot far better.
    """
    import copy

    from diffsim_ros.testing.recordings import exciter, make_plant, record_bag, standard_params

    params = standard_params("quadrotor")
    real = copy.deepcopy(params)
    real["simulator"]["rotors"]["thrust_scale"] = 0.85
    bag = tmp_path / "bag"
    record_bag(bag, make_plant(real, None), exciter(params, 3), 300, params, predictions=False)
    out = tmp_path / "cal"
    rc = cli.main(["sysid", str(bag), "--params", "thrust_scale", "--out", str(out), "--window", "3",
                   "--max-starts", "64", "--quiet"])
    assert rc == 0, capsys.readouterr().err
    report = json.loads((out / "sysid.json").read_text())
    assert report["fitted"]["thrust_scale"][0] == pytest.approx(0.85, rel=0.05)
    assert report["heldout"]["before"]["rmse"] > 5 * report["heldout"]["after"]["rmse"]
    cal = config.load_yaml(out / "calibrated.yaml")
    assert cal["simulator"]["rotors"]["thrust_scale"] == pytest.approx(0.85, rel=0.05)
    before = analyze(bag, horizons=(5,), plots=False)
    after = analyze(bag, config_path=str(out / "calibrated.yaml"), horizons=(5,), plots=False)
    assert before["prediction"]["by_horizon"]["5"]["rmse"] > 5 * after["prediction"]["by_horizon"]["5"]["rmse"]


def test_every_registry_parameter_has_the_motion_that_identifies_it():
    """Every registry parameter has the motion that identifies it.

    The verdict names, for each parameter the data cannot identify, the motion that would:
    every parameter of the registry has one, and a per-joint label gets its parameter's.
    """
    from diffsim_ros.analysis.sysid import EXCITATION, excitation_advice
    from diffsim_ros.physics.registry import PARAMETERS

    assert set(EXCITATION) == set(PARAMETERS), set(PARAMETERS) ^ set(EXCITATION)
    advice = excitation_advice(["joint_friction[2]", "drag_scale"])
    assert advice == f"joint_friction[2]: {EXCITATION['joint_friction']}; drag_scale: {EXCITATION['drag_scale']}"
    assert "reversals" in EXCITATION["joint_friction"] and "steps" in EXCITATION["latency"]
