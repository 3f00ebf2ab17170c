"""Integration: semi-implicit (symplectic) Euler or RK4 on the configuration manifold.

Joints add; a floating base moves along its body-frame twist (the orientation by the exact
exponential of w h) and its quaternion is renormalised smoothly.
"""
from __future__ import annotations

from typing import Tuple

import torch

from ..spatial import fast_cross, quat_exp, quat_mul
from ..spatial import quat_rotate as _quat_rotate


def quat_rotate(quat: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    return _quat_rotate(quat, x, fast_cross)


def _normalised(quat: torch.Tensor) -> torch.Tensor:
    return quat / torch.linalg.vector_norm(quat, dim=-1, keepdim=True)


def integrate(floating_base: bool, q: torch.Tensor, v: torch.Tensor, h: float) -> torch.Tensor:
    """Return q (+) v h."""
    if not floating_base:
        return q + v * h
    pos, quat, qj = q[..., 0:3], q[..., 3:7], q[..., 7:]
    pos = pos + quat_rotate(quat, v[..., 0:3]) * h
    quat = _normalised(quat_mul(quat, quat_exp(v[..., 3:6] * h)))
    return torch.cat((pos, quat, qj + v[..., 6:] * h), -1)


def qdot(floating_base: bool, q: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Time derivative of q (..., nq) (for RK4)."""
    if not floating_base:
        return v
    quat = q[..., 3:7]
    pd = quat_rotate(_normalised(quat), v[..., 0:3])
    w = torch.cat((v[..., 3:6], torch.zeros_like(v[..., 0:1])), -1)
    return torch.cat((pd, 0.5 * quat_mul(quat, w), v[..., 6:]), -1)


def semi_implicit_euler(floating_base: bool, q: torch.Tensor, v: torch.Tensor, qdd: torch.Tensor,
                        h: float) -> Tuple[torch.Tensor, torch.Tensor]:
    """Update v += h qdd, then move q with the new v.

    A floating base's linear velocity, stored in the body frame, is advanced in the world frame
    (so the frame's rotation does not pump energy into it, as explicit Euler on the -w x v term
    would), then expressed in the new body frame.
    """
    if not floating_base:
        v_new = v + qdd * h
        return q + v_new * h, v_new
    quat = _normalised(q[..., 3:7])
    vl, w = v[..., 0:3], v[..., 3:6]
    # The classical acceleration and the velocity, rotated into the world together.
    acc_world, vw = quat_rotate(quat.unsqueeze(-2), torch.stack((qdd[..., 0:3] + fast_cross(w, vl), vl), -2)).unbind(-2)
    vw_new = vw + h * acc_world
    w_new = w + h * qdd[..., 3:6]
    quat_new = _normalised(quat_mul(quat, quat_exp(w_new * h)))
    conj = torch.cat((-quat_new[..., 0:3], quat_new[..., 3:4]), -1)
    vl_new = quat_rotate(conj, vw_new)
    vj_new = v[..., 6:] + h * qdd[..., 6:]
    q_new = torch.cat((q[..., 0:3] + h * vw_new, quat_new, q[..., 7:] + h * vj_new), -1)
    return q_new, torch.cat((vl_new, w_new, vj_new), -1)


def rk4_combine(floating_base: bool, q, v, ks, h):
    """RK4's weighted sum of the stage derivatives ks = [(kq, kv) x 4]."""
    (k1q, k1v), (k2q, k2v), (k3q, k3v), (k4q, k4v) = ks
    q_new = q + (h / 6) * (k1q + 2 * k2q + 2 * k3q + k4q)
    v_new = v + (h / 6) * (k1v + 2 * k2v + 2 * k3v + k4v)
    if floating_base:
        q_new = torch.cat((q_new[..., 0:3], _normalised(q_new[..., 3:7]), q_new[..., 7:]), -1)
    return q_new, v_new
