#!/usr/bin/env python3
"""How often system identification recovers drawn truths.

The success rate behind the random tests, over many draws instead of one per run.

    python bench/sysid_draws.py [--kind arm|arm_friction_lag|quadrotor|legged] [--seeds 1-20] [--friction]
                                [--max-lag 0.06] [--plant simulator|mujoco] [--direct] [--velocity-limits]

For each seed, the perturbation is drawn exactly as test/analysis/test_sysid_random.py draws it for
``test_sysid_recovers_four_drawn_parameters_at_once`` (latency 1-3 control steps, arm torque
lag in 0.008 s to ``--max-lag``, joint damping x0.3-3, mass x0.7-1.3; quadrotor: drag, rotor
time constant, mass), the MuJoCo stand-in records 300 exciting commands, and ``calibrate``
fits all four at once with the test's settings. ``--kind legged``: the shipped walker
(policies/locomotion_velocity) walks 250 control steps (5 s) at 0.5 m/s on a drawn mass (x0.8-1.3)
and floor (friction x0.4-1.2), as test/analysis/test_legged_analysis.py draws them, recorded on
``--plant`` (default the simulator: the stand-in's soft constraint ground is not the penalty
contact, doc/sysid.md), and mass and ground friction are fitted. ``--kind legged_contact``: the
same walk on the soft contact (simulator.contact_model: soft) with the stand-in's (or the
simulator's) contact time constant drawn in 0.01-0.06 s, and contact_time_constant fitted. ``--kind arm_friction_lag``:
the arm's joint friction and torque lag as ``test_joint_friction_with_actuator_lag`` draws them
(``--velocity-limits``: with config/reach_arm.yaml's drive velocity limits on). ``--direct``: each
start fitted on the requested windows directly, without the one-step fit first (for comparison
with the horizon continuation, doc/sysid.md). Printed per seed: PASS or FAIL
by the test's own check (each identifiable parameter within 5 %, latency within 0.15 steps,
held-out RMSE 5x smaller; legged: accepted, both within 5 %), the error of each parameter
(relative; latency in steps), the loss at the end of each start and the seconds; last line
``sysid_draws: KIND K/N passed, median S s, worst W s``. ``--friction`` keeps the arm's URDF
joint friction on (the test turns it off on both sides). Nothing here is a test: no figure is
asserted.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "test"))   # the tests' support modules
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "test" / "analysis"))

import test_sysid_random as T  # noqa: E402
from seed_list import seed_list  # noqa: E402

NAMES = {"arm": ["latency", "actuator_lag", "joint_damping_scale", "mass_scale"],
         "quadrotor": ["latency", "drag_scale", "motor_time_constant", "mass_scale"]}



def _legged(seed: int, plant: str):
    """Return (result, truth, names, perturbation): the legged test's draw and fit on ``plant``."""
    import test_legged_analysis as L
    from diffsim_ros.learning.deploy import PolicyRunner

    with tempfile.TemporaryDirectory() as tmp:
        r, truth, pert, _ = L.fit_drawn_floor(Path(tmp) / "bag", PolicyRunner(L.POLICY), plant, seed)
    return r, truth, L.LEGGED_NAMES, pert


def _legged_contact(seed: int, plant: str):
    """Return (result, truth, names, perturbation): a drawn contact time constant fitted on the soft contact."""
    import test_legged_analysis as L
    from diffsim_ros import config, physics
    from diffsim_ros.analysis import calibrate, read_bag, sim_setup
    from diffsim_ros.learning.deploy import PolicyRunner
    from diffsim_ros.physics.registry import from_perturbation

    params = config.load_yaml(L.CONFIG)
    params["simulator"] = dict(params["simulator"], contact_model="soft")
    pert = {"contact_time_constant": float(np.random.default_rng(seed).uniform(0.01, 0.06))}
    names = ["contact_time_constant"]
    with tempfile.TemporaryDirectory() as tmp:
        L._record(Path(tmp) / "bag", PolicyRunner(L.POLICY), plant, pert, 250, params)
        data = read_bag(Path(tmp) / "bag")
        setup = sim_setup(data)
        r = calibrate(data, setup, names, window=3, max_starts=48, max_iter=15)
    truth = from_perturbation(physics.build_system(setup.model, setup.sim_config), pert)
    return r, truth, names, pert


def _check_legged(r, truth, names):
    assert r.accepted, r.reasons
    for n in names:
        assert abs(r.fitted[n][0] / float(truth[n][0]) - 1.0) < 0.05, (n, r.fitted[n][0], float(truth[n][0]))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kind", choices=sorted(NAMES) + ["arm_friction_lag", "legged", "legged_contact"], default="arm")
    ap.add_argument("--seeds", default="1-20", help="e.g. 1-20 or 3,7,11")
    ap.add_argument("--friction", action="store_true", help="arm: keep the URDF joint friction on")
    ap.add_argument("--max-lag", type=float, default=0.06, help="arm: upper end of the torque lag draw, s")
    ap.add_argument("--plant", choices=["simulator", "mujoco"], default="simulator",
                    help="legged: what records the bag")
    ap.add_argument("--direct", action="store_true", help="arm_friction_lag: no horizon continuation")
    ap.add_argument("--velocity-limits", action="store_true", help="arm_friction_lag: the drives' velocity limits on")
    a = ap.parse_args()
    torch.set_num_threads(1)
    passed = 0
    seeds = seed_list(a.seeds)
    seconds = []
    for seed in seeds:
        t0 = time.perf_counter()
        if a.kind in ("legged", "legged_contact"):
            r, truth, names, pert = (_legged if a.kind == "legged" else _legged_contact)(seed, a.plant)
            check = _check_legged
        elif a.kind == "arm_friction_lag":
            names = T.FRICTION_AND_LAG
            with tempfile.TemporaryDirectory() as tmp:
                r, truth, pert = T.fit_friction_and_lag(Path(tmp) / "bag", seed, a.velocity_limits, not a.direct)
            check = T._check
        else:
            names = NAMES[a.kind]
            pert = T._draw(np.random.default_rng(seed), a.kind, names)
            if a.kind == "arm":
                pert["actuator_lag"] = float(np.random.default_rng(seed + 7).uniform(0.008, a.max_lag))
            with tempfile.TemporaryDirectory() as tmp:
                r, truth = T._fit(Path(tmp), a.kind, pert, names, seed, joint_friction=a.friction)
            check = T._check
        seconds.append(time.perf_counter() - t0)
        try:
            check(r, truth, names)
            verdict = "PASS"
            passed += 1
        except AssertionError as e:
            verdict = f"FAIL {str(e).splitlines()[0][:120]}"
        err = {n: (r.fitted[n][0] - float(truth[n][0])) if n == "latency"        # the worst entry per parameter
               else max((f / float(t) - 1.0 for f, t in zip(r.fitted[n], truth[n])), key=abs) for n in names}
        drawn = {k: round(v, 4) for k, v in pert.items()}
        errors = {k: float(f"{v:.2g}") for k, v in err.items()}
        losses = [float(f"{t.get('loss', float('nan')):.2g}") for t in r.starts_tried]
        print(f"seed {seed}: {verdict}; drawn {drawn}; error {errors}; start losses {losses}; "
              f"fit {r.seconds:.0f} s, with the recording {seconds[-1]:.0f} s", flush=True)
    print(f"sysid_draws: {a.kind} {passed}/{len(seeds)} passed, median {float(np.median(seconds)):.0f} s, "
          f"worst {max(seconds):.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
