#!/usr/bin/env python3
"""What ``simulator.servo_iterations`` costs and buys.

The saturated servo re-linearised in the implicit step (physics/stages/actuation.py,
servo_slope), against the tangent alone (0), same run.

    python bench/servo_solve.py [--iterations 4] [--batches 1,32] [--seconds 0.5] [--seed 0]
    python bench/servo_solve.py --survey 100        # the distribution behind the test's bounds

The project's arm as config/reach_arm.yaml has it (position servos with gravity compensation,
10 ms substeps, joint friction off here), with and without the drives' velocity limits:

* accuracy: 24 random starts and position steps of up to 0.6 rad held two control steps each
  (test/physics/test_servo_solve.py's draws), the largest |v - v_ref| / v_max over 8 control steps and
  the actuated joints, v_ref from 0.5 ms substeps;
* cost: steps per second of a 10-step forward+backward rollout (the trainer's window) at each
  batch, float32, one torch thread, best of 3 windows; the ratio is iterations / tangent alone;
* ``--survey N``: instead, N batches of the test's DRAWS draws each (seeds seed .. seed+N-1), the
  range over batches of each batch's 90th and 99th percentile and maximum of that error, with
  the iterations and without them (the statistics test_servo_solve.py bounds).
"""
from __future__ import annotations

import argparse
import copy
import os
import sys
import time

import numpy as np
import torch

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "test"))            # the tests' support modules (conftest, builders)
sys.path.insert(0, os.path.join(ROOT, "test", "physics"))

from diffsim_ros import config, physics  # noqa: E402
import test_servo_solve as draws  # noqa: E402  (the test's draws and reference)


def _params(velocity_limits: bool, iterations: int):
    p = copy.deepcopy(draws._arm_params())
    p["simulator"].update(velocity_limits=velocity_limits, servo_iterations=iterations)
    return p


def steps_per_second(params, batch: int, seconds: float, window: int = 10) -> float:
    model = config.load_model(params, dtype=torch.float32)
    sim = physics.Simulator(model, config.simulator_config(params))
    gen = torch.Generator().manual_seed(0)
    q0 = (torch.rand((batch, model.nq), generator=gen) - 0.5)
    target = q0 + 0.6 * (torch.rand((batch, model.nq), generator=gen) - 0.5)
    best = 0.0
    for _ in range(3):
        n, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            q = q0.clone().requires_grad_(True)
            state = sim.initial_state(q)
            for _ in range(window):
                state = sim.step(state, target)
            (state.q.sum() + state.v.sum()).backward()
            n += window * batch
        best = max(best, n / (time.perf_counter() - t0))
    return best


def survey(batches: int, iterations: int, seed: int) -> int:
    print(f"reach_arm, 10 ms substeps, {batches} batches of {draws.DRAWS} draws, seeds {seed}-{seed + batches - 1}")
    print("| velocity_limits | servo_iterations | p90 (range over batches) | p99 | max |")
    print("|---|---|---|---|---|")
    for vl in (False, True):
        rows = {iterations: [], 0: []}
        for k in range(batches):
            on, off, _ = draws._errors(_params(vl, iterations), np.random.default_rng(seed + k), draws.DRAWS, 0.6, 2)
            for it, e in ((iterations, on), (0, off)):
                rows[it].append((np.quantile(e, 0.9), np.quantile(e, 0.99), e.max()))
        for it, r in rows.items():
            r = np.array(r)
            print(f"| {vl} | {it} | " + " | ".join(f"{r[:, i].min():.3f}-{r[:, i].max():.3f}" for i in range(3)) + " |",
                  flush=True)
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--iterations", type=int, default=4, help="servo_iterations compared with 0 (default 4)")
    ap.add_argument("--batches", default="1,32", help="comma-separated batch sizes (default 1,32)")
    ap.add_argument("--seconds", type=float, default=0.5, help="length of one timing window (default 0.5 s)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the accuracy draws (default 0)")
    ap.add_argument("--survey", type=int, default=0, metavar="N",
                    help="accuracy only: N batches of the test's draws, per-batch percentiles")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    if args.survey:
        return survey(args.survey, args.iterations, args.seed)
    batches = [int(b) for b in args.batches.split(",")]
    print(f"reach_arm, 10 ms substeps, servo_iterations {args.iterations} against 0, seed {args.seed}")
    print("| velocity_limits | max err / v_max, iterations | max err / v_max, 0 | "
          + " | ".join(f"fwd+bwd steps/s B={b}: iterations / 0 (ratio)" for b in batches) + " |")
    print("|---|---|---|" + "---|" * len(batches))
    for vl in (False, True):
        on, off, _ = draws._errors(_params(vl, args.iterations), np.random.default_rng(args.seed), 24, 0.6, 2)
        cells = []
        for b in batches:
            fast = steps_per_second(_params(vl, 0), b, args.seconds)
            slow = steps_per_second(_params(vl, args.iterations), b, args.seconds)
            cells.append(f"{slow:,.0f} / {fast:,.0f} ({slow / fast:.2f})")
        print(f"| {vl} | {on.max():.2f} | {off.max():.2f} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
