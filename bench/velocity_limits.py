#!/usr/bin/env python3
"""Joint speeds against the URDF velocity limits with and without ``simulator.velocity_limits``.

    python bench/velocity_limits.py [--substeps 5] [--draws 6] [--seed 5]

The project's arm (config/reach_arm.yaml, joint friction off) gets random position steps (targets
uniform in +-1.5 rad from starts uniform in +-0.5 rad, held 1.5 s) in one batch, once with the
drives' velocity limits on and once off, in the same run. Printed per draw: the largest
|v| / v_max over the whole run and after the first three control steps (the transient of the
command jump), and the final distance to the target. Not a speed benchmark: a behaviour figure
with its peer (the same draws without limits) beside it.
"""
from __future__ import annotations

import argparse
import copy
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from diffsim_ros import config, physics  # noqa: E402

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
TRANSIENT = 3


def rollout(on: bool, substeps: int, q0: np.ndarray, target: np.ndarray, steps: int = 75):
    p = config.load_yaml(os.path.join(ROOT, "config", "reach_arm.yaml"))
    params = {k: copy.deepcopy(p[k]) for k in ("urdf", "floating_base", "simulator")}
    params["simulator"].update(velocity_limits=on, joint_friction=False, substeps=substeps)
    model = config.load_model(params, dtype=torch.float64)
    sim = physics.Simulator(model, config.simulator_config(params))
    state = sim.initial_state(torch.as_tensor(q0))
    vs = []
    with torch.no_grad():
        for _ in range(steps):
            state = sim.step(state, torch.as_tensor(target))
            vs.append(state.v.numpy().copy())
    vmax = model.velocity_limit.double().numpy()
    return np.abs(np.array(vs)) / vmax, np.abs(state.q.numpy() - target).max(axis=-1)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--substeps", type=int, default=5, help="substeps per 20 ms control step (default 5)")
    ap.add_argument("--draws", type=int, default=6, help="random position steps (default 6)")
    ap.add_argument("--seed", type=int, default=5)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    rng = np.random.default_rng(args.seed)
    q0 = rng.uniform(-0.5, 0.5, size=(args.draws, 4))
    target = rng.uniform(-1.5, 1.5, size=(args.draws, 4))
    on, err_on = rollout(True, args.substeps, q0, target)
    off, err_off = rollout(False, args.substeps, q0, target)
    print(f"reach_arm, {args.substeps} substeps of {20 / args.substeps:g} ms, seed {args.seed}: max |v| / v_max")
    print("| draw | limits on: run | on: after 3 steps | on: final error rad | limits off: run | off: after 3 steps |")
    print("|---|---|---|---|---|---|")
    for b in range(args.draws):
        print(f"| {b} | {on[:, b].max():.2f} | {on[TRANSIENT:, b].max():.2f} | {err_on[b]:.3f} | "
              f"{off[:, b].max():.2f} | {off[TRANSIENT:, b].max():.2f} |")
    print(f"all draws: on {on.max():.2f} ({on[TRANSIENT:].max():.2f} after 3 steps), "
          f"off {off.max():.2f} ({off[TRANSIENT:].max():.2f} after 3 steps)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
