#!/usr/bin/env python3
"""Gradients through contact: the ground's normal spring and damper explicit, or linearly implicit.

    python bench/contact_gradients.py [--draws 4] [--window 20]

Legged robots standing on their feet (solo12 from example-robot-data, the project's
quadruped with config/locomotion.yaml's set-up), 2 ms substeps as the locomotion configs
have them, 30 control steps of random joint targets (+-0.3 rad about the stance) and then
one truncated window of the gradient trainer: the norm of the gradient of the base's
velocity and height at the window's end with respect to the window's actions, once with
``simulator.implicit_contact: false`` (the penalty explicit, as before) and once with the
default. Beside it, in the same run: the largest eigenvalue modulus of one control step's
Jacobian (state to state) at the window's start, and the forward+backward time of the
window both ways. Float64, one thread. Nothing here is a test: no figure is asserted.
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time

import torch

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO_ROOT)
sys.path.insert(0, os.path.join(REPO_ROOT, "bench"))

from diffsim_ros import physics  # noqa: E402
from diffsim_ros.physics import State  # noqa: E402

import locomotion_iteration as li  # noqa: E402


def _tasks():
    yield "solo12 (example-robot-data)", li.solo12_task(100)
    yield "diffsim_quadruped", li.quadruped_task(100)


def _spectral_radius(sys_, st: State, command: torch.Tensor) -> float:
    def f(q, v):
        s, _ = physics.step(sys_, State(q=q, v=v, actuator=st.actuator, delay=st.delay, t=st.t), command)
        return torch.cat((s.q, s.v), -1)
    J = torch.autograd.functional.jacobian(f, (st.q[:1], st.v[:1]))
    nq, nv = st.q.shape[-1], st.v.shape[-1]
    J = torch.cat((J[0].reshape(nq + nv, nq), J[1].reshape(nq + nv, nv)), 1)
    return float(torch.linalg.eigvals(J).abs().max())


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--draws", type=int, default=4, help="random action sequences per robot")
    parser.add_argument("--window", type=int, default=20, help="control steps of the back-propagated window")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    print(f"torch {torch.__version__}, float64, one thread; load average %.2f %.2f %.2f" % os.getloadavg())
    print("")
    print("| robot | draw | gradient norm, explicit | gradient norm, implicit | step eigenvalue, explicit | "
          "step eigenvalue, implicit | window fwd+bwd explicit / implicit (s) |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name, task in _tasks():
        model = task.model.to(dtype=torch.float64)
        stance = task.stance.to(torch.float64)
        idx = task.sim.act_index
        for draw in range(args.draws):
            row = {}
            for implicit in (False, True):
                cfg = dataclasses.replace(task.sim_config, implicit_contact=implicit, nan_check=False)
                sim = physics.Simulator(model, cfg)
                q = model.neutral_configuration()
                q[7:] = q[7:].index_copy(0, idx, stance)
                _, gap, _ = sim.contact_forces(q, torch.zeros(model.nv, dtype=torch.float64))
                q[2] -= float(gap.min())
                g = torch.Generator().manual_seed(draw)
                acts = stance + 0.3 * (2 * torch.rand(30 + args.window, 4, len(stance), generator=g,
                                                      dtype=torch.float64) - 1)
                st = sim.initial_state(q[None].expand(4, -1).clone())
                with torch.no_grad():
                    for k in range(30):
                        st = sim.step(st, acts[k])
                radius = _spectral_radius(sim.system, st, acts[30, :1])
                a = acts[30:].clone().requires_grad_(True)
                start = time.perf_counter()
                s = st
                for k in range(args.window):
                    s = sim.step(s, a[k])
                grad, = torch.autograd.grad(s.v[:, 0:3].sum() + s.q[:, 2].sum(), a)
                row[implicit] = (float(grad.norm()), radius, time.perf_counter() - start)
            print(f"| {name} | {draw} | {row[False][0]:.3g} | {row[True][0]:.3g} | {row[False][1]:.3g} | "
                  f"{row[True][1]:.3g} | {row[False][2]:.2f} / {row[True][2]:.2f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
