#!/usr/bin/env python3
"""What per-episode domain randomisation costs the step.

Simulator.step with every environment's own physics (``parameters.apply_per_episode``) beside the
same step with one physics for all, eager and compiled, in the same run.

    python bench/randomized_step.py [--batches 256,4096] [--seconds 0.25] [--compile 1]

The case is bench/step.py's panda with ground contact (16 boxes, live contacts, effort
actuation, dt 1 ms, float32, one thread). The randomised row draws per environment what the
training options ``randomize_mass``, ``randomize_servo_gain``, ``randomize_effort``,
``randomize_ground_friction``, ``randomize_contact_stiffness`` and ``randomize_contact_damping``
draw: masses and inertias (nb x B), gains and effort limits (B x 7) and the ground's three
coefficients (B). Compiled (``--compile 1``), the draws are inputs of the graphs
(``Simulator(..., compile=True, varying=names).with_values(values, per_episode=True)``), so one
compile serves every draw; the nominal compiled row holds the physics as constants. The issue's
target: at batch 4096 the compiled randomised step loses at most 20 % against the compiled step
without randomisation (ratio >= 0.8). Ratios > 1 mean the randomised step is faster. Nothing
here is a test: no figure is asserted.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
REPO_ROOT = os.path.dirname(HERE)
for p in (REPO_ROOT, HERE):
    if p not in sys.path:
        sys.path.insert(0, p)

from diffsim_ros import physics  # noqa: E402
from diffsim_ros.physics.registry import PARAMETERS  # noqa: E402
from step import fmt, panda_case, rate, steps_for  # noqa: E402

#: name -> (low, high), as the trainer draws them (uniform; log-uniform for the ground's stiffness and damping).
DRAWS = {"mass_scale": (0.8, 1.2), "servo_gain_scale": (0.9, 1.1), "effort_scale": (0.8, 1.2),
         "ground_friction": (0.4, 1.0), "contact_stiffness": (1e5, 1e7), "contact_damping": (1e3, 1e5)}


def draw(sys, batch: int, gen: torch.Generator):
    out = {}
    for name, (lo, hi) in DRAWS.items():
        if not PARAMETERS[name].applies(sys):
            continue
        u = torch.rand(batch, 1, generator=gen, dtype=torch.float64)
        x = lo * (hi / lo) ** u if name.startswith("contact") else lo + (hi - lo) * u
        out[name] = x.to(sys.model.dtype)
    return out


def timings(sim, q0, action, batch: int, seconds: float):
    """(fwd, fwd+bwd) steps/s and the seconds of the first forward+backward call (a compile)."""
    state0 = sim.initial_state(q0.expand(batch, -1).clone())
    act = action.expand(batch, -1).clone()
    k_f, k_b = steps_for(batch, True), steps_for(batch, False)

    def forward():
        with torch.no_grad():
            s = state0
            for _ in range(k_f):
                s = sim.step(s, act)

    def forward_backward():
        s = state0.replace(q=state0.q.clone().requires_grad_(True), v=state0.v.clone().requires_grad_(True))
        for _ in range(k_b):
            s = sim.step(s, act)
        (s.q.sum() + s.v.sum()).backward()
    t0 = time.perf_counter()
    forward_backward()
    forward()
    first = time.perf_counter() - t0
    return rate(forward, k_f * batch, seconds), rate(forward_backward, k_b * batch, seconds), first


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batches", default="256,4096", help="comma-separated batch sizes (default 256,4096)")
    parser.add_argument("--seconds", type=float, default=0.25, help="length of one timing window (default 0.25 s)")
    parser.add_argument("--compile", type=int, default=1, help="1: also the compiled rows (minutes the first time)")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    case = panda_case()
    sys_ = case.sim.system
    gen = torch.Generator().manual_seed(0)
    print(f"case: {case.name} ({case.note}); torch {torch.__version__}, {torch.get_num_threads()} thread")
    print(f"drawn per environment: {', '.join(n for n in draw(sys_, 1, gen))}")
    print()
    print("| batch | step | fwd steps/s (nominal) | fwd steps/s (randomised) | randomised / nominal | "
          "fwd+bwd (nominal) | fwd+bwd (randomised) | randomised / nominal |")
    print("|---|---|---|---|---|---|---|---|")
    for batch in (int(b) for b in args.batches.split(",")):
        values = draw(sys_, batch, gen)
        rows = [("eager", physics.Simulator(sys_), physics.Simulator(sys_).with_values(values, per_episode=True))]
        if args.compile:
            varying = physics.Simulator(sys_, compile=True, varying=tuple(values))
            rows.append(("compiled", physics.Simulator(sys_, compile=True),
                         varying.with_values(values, per_episode=True)))
        for label, nominal, randomised in rows:
            fn, bn, _ = timings(nominal, case.q0, case.action, batch, args.seconds)
            fr, br, _ = timings(randomised, case.q0, case.action, batch, args.seconds)
            print(f"| {batch} | {label} | {fmt(fn)} | {fmt(fr)} | {fr / fn:.2f} | {fmt(bn)} | {fmt(br)} | "
                  f"{br / bn:.2f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
