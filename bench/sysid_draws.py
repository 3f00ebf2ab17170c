#!/usr/bin/env python3
"""How often system identification recovers drawn truths: the success rate behind the random
tests, over many draws instead of one per run.

    python bench/sysid_draws.py [--kind arm] [--seeds 1-10] [--friction] [--max-lag 0.06]

For each seed, the perturbation is drawn exactly as test/analysis/test_sysid_random.py draws it for
``test_sysid_recovers_four_drawn_parameters_at_once`` (latency 1-3 control steps, arm torque
lag in 0.008 s to ``--max-lag``, joint damping x0.3-3, mass x0.7-1.3; quadrotor: drag, rotor
time constant, mass), the MuJoCo stand-in records 300 exciting commands, and ``calibrate``
fits all four at once with the test's settings. Printed per seed: PASS or FAIL by the test's
own check (each identifiable parameter within 5 %, latency within 0.15 steps, held-out RMSE
5x smaller), the error of each parameter (relative; latency in steps), the loss at the end of
each start and the seconds. ``--friction`` keeps the arm's URDF joint friction on (the test
turns it off on both sides). Nothing here is a test: no figure is asserted.
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



def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kind", choices=sorted(NAMES), default="arm")
    ap.add_argument("--seeds", default="1-10", help="e.g. 1-10 or 3,7,11")
    ap.add_argument("--friction", action="store_true", help="arm: keep the URDF joint friction on")
    ap.add_argument("--max-lag", type=float, default=0.06, help="arm: upper end of the torque lag draw, s")
    a = ap.parse_args()
    torch.set_num_threads(1)
    names = NAMES[a.kind]
    passed = 0
    seeds = seed_list(a.seeds)
    for seed in seeds:
        rng = np.random.default_rng(seed)
        pert = T._draw(rng, a.kind, names)
        if a.kind == "arm":
            pert["actuator_lag"] = float(np.random.default_rng(seed + 7).uniform(0.008, a.max_lag))
        t0 = time.perf_counter()
        with tempfile.TemporaryDirectory() as tmp:
            r, truth = T._fit(Path(tmp), a.kind, pert, names, seed, joint_friction=a.friction)
        try:
            T._check(r, truth, names)
            verdict = "PASS"
            passed += 1
        except AssertionError as e:
            verdict = f"FAIL {str(e).splitlines()[0][:120]}"
        err = {n: (r.fitted[n][0] - float(truth[n][0])) if n == "latency"
               else (r.fitted[n][0] / float(truth[n][0]) - 1.0) for n in names}
        drawn = {k: round(v, 4) for k, v in pert.items()}
        errors = {k: float(f"{v:.2g}") for k, v in err.items()}
        losses = [float(f"{t.get('loss', float('nan')):.2g}") for t in r.starts_tried]
        print(f"seed {seed}: {verdict}; drawn {drawn}; error {errors}; start losses {losses}; "
              f"{time.perf_counter() - t0:.0f} s", flush=True)
    print(f"{passed} of {len(seeds)} passed the test's check")
    return 0


if __name__ == "__main__":
    sys.exit(main())
