"""Excitation and system identification on robots the project does not ship, as a new user runs them.

example-robot-data's UR5 and hector quadrotor: ``diffsim-ros init`` writes each one's file, ``diffsim-ros
excite`` records an identification motion on the MuJoCo stand-in with a drawn perturbation (fresh seed,
printed; replay with ``DIFFSIM_EXCITE_SEED=<seed>``), and ``diffsim-ros sysid`` must find every drawn
quantity within 5 % (latency within 0.15 steps), call each identifiable and at no bound, and cut the
held-out error at least 5x. The truths are the parameter registry's reading of the perturbation.
(A small damping on the UR5's heavy shoulders may be flagged unidentifiable, see the test.)

The UR5's URDF gives no joint damping, so the drawn damping is an added one (0.1-0.9 N m s/rad; the
bound of a zero-nominal damping is 1). Its drives have no lag; fitted with actuator_lag among the
parameters (the UR5's second fit) sysid must report 0 for it: the lagged fits alone ended in a wrong minimum there
(README, sysid limits), and sysid now fits the drive without a lag beside them.
"""
from __future__ import annotations

import json

import numpy as np
import pytest

pytest.importorskip("rosbags")
pytest.importorskip("mujoco")
pytest.importorskip("rclpy")
pytestmark = pytest.mark.ros

from conftest import drawn_away, drawn_seed, ros_domain  # noqa: E402

from diffsim_ros import cli, physics  # noqa: E402
from diffsim_ros import config as cfgmod  # noqa: E402
from diffsim_ros.physics.registry import from_perturbation  # noqa: E402

ROBOTS = {   # name: (URDF under example-robot-data's robots folder, init task, the sysid fits of one recording)
    # The UR5 twice on one recording: then with actuator_lag among the parameters (as `excite` suggests) on
    # drives that have no lag, where sysid must say 0, not a short lag traded against latency and damping.
    "ur5": ("ur_description/urdf/ur5_robot.urdf", "reach",
            [("mass_scale", "inertia_scale", "joint_damping", "latency"),
             ("mass_scale", "inertia_scale", "joint_damping", "actuator_lag", "latency")]),
    "hector": ("hector_description/robots/quadrotor_base.urdf", "hover",
               [("mass_scale", "inertia_scale", "drag_scale", "motor_time_constant", "latency")]),
}



def _draw(rng, name, nominal_lag):
    pert = {"mass_scale": drawn_away(rng, 0.8, 1.25, 1.0, 0.08), "latency": 0.02 * int(rng.integers(1, 3))}
    if name.startswith("ur5"):
        pert["added_joint_damping"] = float(rng.uniform(0.1, 0.9))
    else:
        pert["drag_scale"] = drawn_away(rng, 0.5, 2.5, 1.0, 0.3)
        pert["actuator_lag"] = drawn_away(rng, 0.02, 0.08, nominal_lag, 0.01)     # the rotors' time constant
    return pert


@pytest.mark.slow
@pytest.mark.parametrize("name", list(ROBOTS))
def test_excite_and_sysid_recover_a_drawn_perturbation_of_an_example_robot_data_robot(robots_dir, tmp_path, name):
    urdf, task, fits = ROBOTS[name]
    cfg = tmp_path / f"{name}.yaml"
    assert cli.main(["init", "--urdf", str(robots_dir / urdf), "--task", task, "--out", str(cfg)]) == 0
    params = cfgmod.load_yaml(cfg)
    model = cfgmod.load_model(params)
    sys0 = physics.build_system(model, cfgmod.simulator_config(params))
    nominal_lag = sys0.config.rotors.motor_time_constant if sys0.rotors is not None else 0.0
    seed = drawn_seed(f"sysid {name}", "DIFFSIM_EXCITE_SEED")
    pert = _draw(np.random.default_rng(seed), name, nominal_lag)
    where = f"{name}, seed {seed}, perturbation {pert}"
    out = tmp_path / "run"
    rc = cli.main(["excite", "--config", str(cfg), "--out", str(out), "--seed", str(seed % 100000),
                   "--duration", "8" if name == "hector" else "6", "--amplitude", "0.8" if name == "hector" else "0.5",
                   "--perturb", ",".join(f"{k}={v}" for k, v in pert.items()), "--domain-id", str(ros_domain())])
    summary = json.loads((out / "excite.json").read_text())
    assert rc == 0 and summary["lost"] == {} and summary["controller"]["safe_commands"] == 0, (where, summary)
    for k, names in enumerate(fits):
        where = f"{name} fit {k} {names}, seed {seed}, perturbation {pert}"
        # sysid's own iteration limit (30): at 10, seed 977935094 stopped short (0.3 % of the velocity change
        # unexplained, below the escalation to further starts) with two dampings 37-65 % off, accepted.
        rc = cli.main(["sysid", str(out / "bag"), "--params", ",".join(names), "--out", str(tmp_path / f"sysid{k}"),
                       "--window", "3", "--max-starts", "128" if name == "hector" else "24", "--quiet"])
        res = json.loads((tmp_path / f"sysid{k}" / "sysid.json").read_text())
        truth = {key: v.tolist() for key, v in from_perturbation(sys0, pert).items()}
        truth.setdefault("inertia_scale", [1.0])          # mass_scale scales the inertias with the masses
        truth.setdefault("actuator_lag", [0.0])            # the UR5's drives have none
        print("| parameter | truth | recovered |")
        for n in names:
            print(f"| {n} | {[round(x, 4) for x in truth[n]]} | {[round(x, 4) for x in res['fitted'][n]]} |")
        assert rc == 0, (where, res["reasons"])
        assert res["at_bound"] == [], (where, res["at_bound"])
        # The UR5's shoulders (about 4 kg m^2) under a small drawn damping (0.31 N m s/rad, seed 3611294835)
        # are flagged: a 10 % change of it moves the predictions too little to count, although this
        # noise-free recording gives it exactly. Every other quantity must be identifiable, and some
        # joint's damping too.
        flagged = res["unidentifiable"]
        assert all(u.startswith("joint_damping[") for u in flagged), (where, flagged)
        assert len(flagged) < len(res["fitted"].get("joint_damping", [None])), (where, flagged)
        for n in names:
            for fitted, true in zip(res["fitted"][n], truth[n]):
                if n == "latency":
                    assert abs(fitted - true) < 0.15, (where, n, fitted, true)
                elif true == 0.0:
                    assert fitted == 0.0, (where, n, fitted, res["notes"])
                else:
                    assert fitted == pytest.approx(true, rel=0.05), (where, n, fitted, true)
        assert res["heldout"]["improvement"] >= 5.0, where
