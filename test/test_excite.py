"""`diffsim-ros excite` on the MuJoCo stand-in makes every parameter identifiable.

Each run draws the stand-in's perturbation with a fresh seed (printed; replay with
``DIFFSIM_EXCITE_SEED=<seed>``), records the excitation through the real nodes over DDS
(`diffsim-ros excite`: mujoco_plant, policy_controller in excite mode, trajectory_recorder)
and calibrates with `diffsim-ros sysid` every parameter the excitation is meant to identify
(control.excitation.identifiable_parameters: one per physical quantity of the registry).
sysid must call each of them identifiable (its unidentifiable list empty, none at a bound)
and find each within 5 % of the drawn truth (latency within 0.15 steps); the truths are the
registry's reading of the perturbation, independent of the fit. A steady hover of the same
vehicle, recorded with the same sensor noise, leaves the drag unidentifiable.

The arm runs with its URDF joint friction, drawn x0.6-2.5, and sysid fits it beside the five
(the stand-in and the simulator share one friction law, doc/friction.md). The arm's lag is
drawn in 0.008-0.015 s and latency in 1-2 steps. Beyond them the replay's estimate of the
lagged torque used to diverge (fixed: test_sysid_random.py draws 0.008-0.06 s and 1-3 steps
with friction off), but with the joint friction on the four-parameter fit still ends in a
local minimum in about 1 draw of 10 (README, sysid), and this six-parameter fit has not been
measured over the wider ranges.
"""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import yaml

pytest.importorskip("rosbags")
pytest.importorskip("mujoco")
pytest.importorskip("rclpy")
pytestmark = pytest.mark.ros

from conftest import drawn_away, drawn_seed, ros_domain  # noqa: E402

from diffsim_ros import cli, physics  # noqa: E402
from diffsim_ros import config as cfgmod  # noqa: E402
from diffsim_ros.testing.recordings import make_plant, record_bag, standard_params  # noqa: E402
from diffsim_ros.control.excitation import ExcitationConfig, ExcitationRunner, identifiable_parameters  # noqa: E402
from diffsim_ros.physics.registry import from_perturbation  # noqa: E402

SYSID = ["--window", "3", "--max-iter", "10", "--quiet"]
# Fit windows: 24 hold the arm's parameters, but the quadrotor's drag from 24 noisy windows
# scattered 4-5 % (seeds 53989120, 4256449606: 5.2 %, 5.3 %, beyond 4 reported stds); from 128
# windows the first of them came back within 0.1 % (24: 3.8 %) at 5 s more.
MAX_STARTS = {"arm": 24, "quadrotor": 128, "hover": 24}
NOISE = 3e-4           # the quadrotor's sensor noise (position m, velocity m/s), both recordings: at 1e-3 the
                       # drag's std from 8 s of excitation is ~4 %, too close to the 5 % tolerance


def _seed(name: str) -> int:
    return drawn_seed(name, "DIFFSIM_EXCITE_SEED")



def _draw(rng, kind):
    pert = {"mass_scale": drawn_away(rng, 0.85 if kind == "arm" else 0.8, 1.25, 1.0, 0.08),
            "latency": 0.02 * int(rng.integers(1, 3))}            # 1-2 control steps of 20 ms
    if kind == "arm":
        pert["joint_damping_scale"] = float(np.exp(rng.uniform(np.log(0.6), np.log(3.0))))
        pert["actuator_lag"] = float(rng.uniform(0.008, 0.015))
        # Below about 0.5x the URDF's friction the excitation barely feels it: at 0.42x beside 2.3x
        # damping (seed 2005816777) a 10 % change of joint 1's friction moved the predictions by
        # 1.8-1.9e-4 of the velocity change, under sysid's floor of 2e-4 (MIN_SENSITIVITY), and sysid
        # called it unidentifiable although it came back exact from the noise-free data. At 0.5x: 2.3e-4
        # (damping 3x) and 2.5e-4 (0.6x); at 0.6x: 2.7e-4. The draw starts at 0.6x.
        pert["joint_friction_scale"] = float(np.exp(rng.uniform(np.log(0.6), np.log(2.5))))
    else:
        pert["drag_scale"] = drawn_away(rng, 0.5, 2.5, 1.0, 0.3)
        pert["actuator_lag"] = drawn_away(rng, 0.02, 0.08, 0.02, 0.01)   # the rotors' time constant
        pert["sensor_noise"] = NOISE
    return pert


def _truth(setup_params, pert, names):
    model = cfgmod.load_model(setup_params)
    sys0 = physics.build_system(model, cfgmod.simulator_config(setup_params))
    t = {k: v.tolist() for k, v in from_perturbation(sys0, pert).items()}
    if "joint_damping" in names and "joint_damping_scale" in t:
        t["joint_damping"] = (model.damping.double() * t.pop("joint_damping_scale")[0]).tolist()
    t.setdefault("inertia_scale", [1.0])          # mass_scale scales the inertias with the masses
    return t


def _config(tmp_path, kind):
    params = standard_params(kind)
    params["urdf"] = str(cfgmod.resolve_urdf(params))
    path = tmp_path / f"{kind}.yaml"
    path.write_text(yaml.safe_dump({"/**": {"ros__parameters": params}}, sort_keys=False))
    return path, params


def _sysid(bag, names, out, noise, kind):
    argv = ["sysid", str(bag), "--params", ",".join(names), "--out", str(out), "--max-starts",
            str(MAX_STARTS[kind])] + SYSID
    if noise:
        argv += ["--velocity-noise", str(noise)]
    rc = cli.main(argv)
    return rc, json.loads((out / "sysid.json").read_text())


def _table(res, truth, names):
    print("| parameter | truth | recovered | std | identifiable |")
    for n in names:
        print(f"| {n} | {[round(x, 4) for x in truth[n]]} | {[round(x, 4) for x in res['fitted'][n]]} | "
              f"{[float(f'{x:.2g}') for x in res['std'][n]]} | "
              f"{not any(u == n or u.startswith(n + '[') for u in res['unidentifiable'])} |")
    h = res["heldout"]
    print(f"held-out RMSE {h['before']['rmse']:.4g} -> {h['after']['rmse']:.4g} ({h['improvement']:.1f}x), "
          f"verdict {res['verdict']} {res['reasons']}, unidentifiable {res['unidentifiable']}, "
          f"at bound {res['at_bound']}, {res['seconds']:.1f} s")


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["arm", "quadrotor"])
def test_an_excite_recording_makes_every_parameter_identifiable(tmp_path, kind):
    seed = _seed(f"excite {kind}")
    rng = np.random.default_rng(seed)
    pert = _draw(rng, kind)
    cfg, params = _config(tmp_path, kind)
    names = identifiable_parameters(kind == "quadrotor", kind == "quadrotor")
    out = tmp_path / "run"
    argv = ["excite", "--config", str(cfg), "--out", str(out), "--seed", str(seed % 100000),
            "--duration", "6" if kind == "arm" else "8", "--amplitude", "0.5" if kind == "arm" else "0.8",
            "--perturb", ",".join(f"{k}={v}" for k, v in pert.items()), "--domain-id", str(ros_domain())]
    print("perturbation", pert)
    rc = cli.main(argv)
    summary = json.loads((out / "excite.json").read_text())
    where = f"seed {seed}, perturbation {pert}"          # in every message: -s under xdist shows no prints
    assert rc == 0, (where, summary)
    assert summary["lost"] == {} and summary["controller"]["safe_commands"] == 0, (where, summary)
    assert list(summary["parameters"]) == list(names)
    if kind == "arm":
        names = tuple(names) + ("joint_friction",)     # the URDF's Coulomb friction, drawn x0.6-2.5
    rc, res = _sysid(out / "bag", names, tmp_path / "sysid", NOISE if kind == "quadrotor" else 0.0, kind)
    truth = _truth(params, pert, names)
    _table(res, truth, names)
    assert rc == 0, (where, res["reasons"])
    assert res["unidentifiable"] == [] and res["at_bound"] == [], (where, res["unidentifiable"], res["at_bound"])
    for n in names:
        for k, (fitted, true) in enumerate(zip(res["fitted"][n], truth[n])):
            if n == "latency":
                assert abs(fitted - true) < 0.15, (where, n, fitted, true)
            elif n == "drag_scale":
                # The drag from 8 s at sensor noise 3e-4 has a std of 3-4 % (reported by sysid): in a
                # full-suite run one draw (seed 2841794190, truth 0.57) came back 9 % and, replayed,
                # 13 % off, 3.4 std. Within 5 % or 4 reported stds; a wrong model misses both.
                std = float(res["std"][n][k])
                assert abs(fitted - true) <= max(0.05 * true, 4.0 * std), (where, n, fitted, true, std)
            else:
                assert fitted == pytest.approx(true, rel=0.05), (where, n, fitted, true)
    assert res["heldout"]["improvement"] >= 5.0, where


@pytest.mark.slow
def test_a_steady_hover_leaves_the_drag_unidentifiable(tmp_path):
    """A steady hover leaves the drag unidentifiable.

    The contrast: a quadrotor drawn as above, in a steady hover (the excitation's position
    hold alone, recorded once it has settled), with the same sensor noise: sysid flags the drag
    (and the time constants) as unidentifiable and advises an excitation motion.
    """
    seed = _seed("hover")
    pert = _draw(np.random.default_rng(seed), "quadrotor")
    print("perturbation", pert)
    cfg, params = _config(tmp_path, "quadrotor")
    names = identifiable_parameters(True, True)
    hover = ExcitationRunner(params, ExcitationConfig(steps=(), duration=30.0))
    plant = make_plant(params, pert)

    def hold(k, q, v):
        st = hover.sim.initial_state(torch.as_tensor(q)[None], torch.as_tensor(v)[None])
        return hover.decide(st, None, predict=False).command

    for k in range(750):                                    # 15 s to settle (not recorded)
        _, q, v = plant.state()
        plant.step(hold(k, q, v))
    rec = record_bag(tmp_path / "hover", plant, hold, 400, params, predictions=False)
    print("hover: largest speed", float(np.abs(rec["v"][:, 0:3]).max()), "m/s")
    rc, res = _sysid(tmp_path / "hover", names, tmp_path / "sysid_hover", NOISE, "hover")
    _table(res, _truth(params, pert, names), names)
    assert "drag_scale" in res["unidentifiable"], (seed, pert, res["unidentifiable"])
    assert any("diffsim-ros excite" in n for n in res["notes"]), res["notes"]


def test_sysid_flags_mass_thrust_and_drag_together_as_unidentifiable(tmp_path):
    """Sysid flags mass, thrust and drag together as unidentifiable.

    Why identifiable_parameters leaves thrust_scale out: mass_scale, thrust_scale and drag_scale
    together have a direction the data cannot see (all three times one factor). On noise-free
    data every standard deviation is ~1e-8 and the fit ends ~9 % off along that direction
    (an xfail until sysid looked for blind combinations in the scaled J^T J): all three are
    flagged and the note names the combination.
    """
    from diffsim_ros.analysis import calibrate, read_bag, sim_setup

    params = standard_params("quadrotor")
    runner = ExcitationRunner(params, ExcitationConfig(amplitude=0.8, duration=6.0, seed=1))
    plant = make_plant(params, {"mass_scale": 1.2, "drag_scale": 1.5})

    def ctrl(k, q, v):
        st = runner.sim.initial_state(torch.as_tensor(q)[None], torch.as_tensor(v)[None])
        return runner.decide(st, None, predict=False).command

    record_bag(tmp_path / "bag", plant, ctrl, 310, params, predictions=False)
    data = read_bag(tmp_path / "bag")
    r = calibrate(data, sim_setup(data), ["mass_scale", "thrust_scale", "drag_scale"], window=3, max_starts=32,
                  max_iter=12)
    f = r.fitted
    print(f, r.std, r.unidentifiable)
    # The ratios the data do hold come back either way.
    assert f["mass_scale"][0] / f["thrust_scale"][0] == pytest.approx(1.2, rel=0.01)
    assert f["drag_scale"][0] / f["thrust_scale"][0] == pytest.approx(1.5, rel=0.01)
    assert sorted(r.unidentifiable) == ["drag_scale", "mass_scale", "thrust_scale"], (f, r.std, r.unidentifiable)
    assert any("only a combination of" in n and "thrust_scale" in n for n in r.notes), r.notes
