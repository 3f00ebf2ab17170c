"""Passive joint forces: URDF damping, smoothed Coulomb friction and the joint limits as a smooth penalty.

They come with their slopes for the linearly implicit solve.

The friction's slope is its secant through zero, ``f tanh(v / eps) / v``, not its tangent
``f / eps (1 - tanh^2)``: with the secant the implicit step scales a joint's friction-only
velocity by ``M / (M + h D)`` and never carries it across zero, where with the tangent
(about 0 away from rest) the friction acts explicitly and a light joint flips sign from
substep to substep (doc/friction.md).
"""
from __future__ import annotations

from typing import NamedTuple

import torch

from .. import laws
from ..system import System


class Passive(NamedTuple):
    tau: torch.Tensor   # (B, nj) joint torques
    D: torch.Tensor     # (B, nj) -d tau/d qd of each joint's own terms
    K: torch.Tensor     # (B, nj) -d tau/d q


def limit_penetration(sys: System, qj: torch.Tensor):
    """How far each joint is past its upper and its lower limit (0 inside, or without a limit)."""
    m = sys.model
    return torch.relu(qj - m.upper), torch.relu(m.lower - qj)      # an infinite limit: relu(-inf) = 0


def passive(sys: System, qj: torch.Tensor, vj: torch.Tensor) -> Passive:
    """Joint positions qj (B, nj) and velocities vj (B, nj) -> torques and slopes."""
    m, cfg = sys.model, sys.config
    tau = torch.zeros_like(vj)
    D = torch.zeros_like(vj)
    K = torch.zeros_like(vj)
    if cfg.joint_damping:
        tau = tau - m.damping * vj
        D = D + m.damping
    if cfg.joint_friction:
        force, slope = laws.coulomb_friction(torch, vj, m.friction, cfg.joint_friction_smoothing)
        tau = tau - force
        D = D + slope
    if cfg.joint_limits:
        pen_u, pen_l = limit_penetration(sys, qj)
        pen = pen_u + pen_l
        tau = tau - cfg.limit_stiffness * (pen_u ** 2 - pen_l ** 2) - cfg.limit_damping * pen * vj
        D = D + cfg.limit_damping * pen
        K = K + 2.0 * cfg.limit_stiffness * pen
    return Passive(tau, D, K)
