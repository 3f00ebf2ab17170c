"""The dynamics core on one robot, as ``diffsim-ros demo`` shows it.

Random states within the joint limits, forward kinematics, CRBA, RNEA and ABA on a batch, their
mutual consistency, a gradient through ABA, and ABA's speed. No argument handling or printing here
(cli/demo.py).
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Callable, List, Tuple

import torch

from . import physics


def sample_states(model, batch: int, generator):
    """Random (q, v, a) within the model's joint position limits.

    Continuous joints (infinite limits) are sampled in [-pi, pi]. A floating
    base gets a position in [-1, 1]^3 m and a uniformly random unit quaternion
    (x, y, z, w). Velocities and accelerations are standard normal.
    """
    import torch

    dtype, device = model.lower.dtype, model.lower.device
    nj = len(model.joint_names)
    lower = model.lower.to(dtype).clone()
    upper = model.upper.to(dtype).clone()
    lower[~torch.isfinite(lower)] = -math.pi
    upper[~torch.isfinite(upper)] = math.pi

    def rand(*shape):
        return torch.rand(*shape, generator=generator, dtype=dtype).to(device)

    def randn(*shape):
        return torch.randn(*shape, generator=generator, dtype=dtype).to(device)

    q_joints = lower + (upper - lower) * rand(batch, nj)
    base_nq = model.nq - nj
    if base_nq == 7:
        pos = 2.0 * rand(batch, 3) - 1.0
        quat = randn(batch, 4)
        quat = quat / quat.norm(dim=-1, keepdim=True)
        q = torch.cat([pos, quat, q_joints], dim=-1)
    elif base_nq == 0:
        q = q_joints
    else:
        raise ValueError(f"unexpected model layout: nq={model.nq} with {nj} joints")
    v = randn(batch, model.nv)
    a = randn(batch, model.nv)
    return q, v, a


def tip_position(model, poses):
    """(name, world position) of the link at the end of the longest kinematic chain.

    Ties go to the last such link. It is found from one state's link poses (n_links, 4, 4)
    (``forward_kinematics``).
    """
    def depth(b: int) -> int:
        d = 0
        while b >= 0:
            b, d = model.parent[b], d + 1
        return d
    k = max(range(len(model.link_names)), key=lambda i: (depth(model.link_body[i]), i))
    return model.link_names[k], poses[k, :3, 3].tolist()



@dataclass
class DemoReport:
    """What :func:`run` computed on ``batch`` random states (state 0 for the per-dof rows)."""

    dof_names: List[str]
    floating_dofs: int              # leading base dofs (6 for a floating base, else 0)
    rows: List[Tuple[str, float, float, float, float]]   # dof, q (nan for base dofs), M_ii, g(q), qdd|tau=0
    tip: str                        # link at the end of the longest chain
    tip_position: List[float]       # of state 0, world frame, m
    condition: Tuple[float, float, float]                # mass-matrix condition: state 0, median, max
    asymmetry: float                # max |M - M^T|
    aba_inverse_error: float        # max |aba(q, v, rnea(q, v, a)) - a|
    equation_residual: float        # max |crba(q) a + rnea(q, v, 0) - rnea(q, v, a)|
    grad_q: float                   # |d|aba|^2/dq| at state 0
    grad_tau: float                 # |d|aba|^2/dtau| at state 0
    ms_per_call: float              # batched aba
    steps_per_s: float
    calls: int


def run(model: physics.Model, batch: int, seed: int = 0, time_budget: float = 1.0,
        sync: Callable[[], None] = lambda: None) -> DemoReport:
    """Run the demo's computations on ``model`` (``sync`` waits for the device, for timing)."""
    nj = len(model.joint_names)
    nb = model.nv - nj
    base = ["base_vx", "base_vy", "base_vz", "base_wx", "base_wy", "base_wz"]
    dof_names = (base if nb == 6 else []) + list(model.joint_names)
    gen = torch.Generator().manual_seed(seed)
    q, v, a = sample_states(model, batch, gen)
    zeros = torch.zeros_like(v)
    with torch.no_grad():
        poses = physics.forward_kinematics(model, q)                # (B, L, 4, 4)
        mass_matrix = physics.crba(model, q)                        # (B, nv, nv)
        gravity = physics.rnea(model, q, zeros, zeros)              # (B, nv)
        qdd_free = physics.aba(model, q, v, torch.zeros_like(v))    # (B, nv)
        tau = physics.rnea(model, q, v, a)
        a_back = physics.aba(model, q, v, tau)
        bias = physics.rnea(model, q, v, zeros)
    M0 = mass_matrix[0]
    rows = [(name, math.nan if i < nb else float(q[0, model.nq - model.nv + i]), float(M0[i, i]),
             float(gravity[0, i]), float(qdd_free[0, i])) for i, name in enumerate(dof_names)]
    tip, p = tip_position(model, poses[0])
    cond = torch.linalg.cond(mass_matrix.to(torch.float64))
    resid = torch.einsum("...ij,...j->...i", mass_matrix, a) + bias - tau

    # gradients flow through the dynamics (state 0 only)
    q0 = q[:1].clone().requires_grad_(True)
    tau0 = torch.zeros_like(v[:1]).requires_grad_(True)
    loss = physics.aba(model, q0, v[:1], tau0).pow(2).sum()
    g_q, g_tau = torch.autograd.grad(loss, (q0, tau0))

    # timing of the batched forward dynamics
    with torch.no_grad():
        for _ in range(2):
            physics.aba(model, q, v, tau)
        sync()
        reps, t0 = 0, time.perf_counter()
        while True:
            physics.aba(model, q, v, tau)
            sync()
            reps += 1
            elapsed = time.perf_counter() - t0
            if reps >= 3 and elapsed >= time_budget:
                break
    return DemoReport(dof_names, nb, rows, tip, p, (float(cond[0]), float(cond.median()), float(cond.max())),
                      float((mass_matrix - mass_matrix.transpose(-1, -2)).abs().max()),
                      float((a_back - a).abs().max()), float(resid.abs().max()), float(g_q.norm()),
                      float(g_tau.norm()), elapsed / reps * 1e3, batch * reps / elapsed, reps)
