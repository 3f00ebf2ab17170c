"""Rigid-body dynamics algorithms as free functions over batched tensors.

``forward_kinematics``, ``rnea`` (inverse dynamics), ``crba`` (joint-space mass
matrix) and ``aba`` (forward dynamics, the O(n) articulated-body algorithm),
after Featherstone, *Rigid Body Dynamics Algorithms* (2008), chapters 5-7.
Every function accepts any leading batch dimensions on ``q``/``v``/``a``/``tau``
and is differentiable by autograd in its inputs and in the model's tensors.

Per body ``i`` with parent ``p = model.parent[i]``: ``X[i]`` maps motion
vectors from the parent frame to the body frame, ``S[i]`` is the motion
subspace (a 6-vector for 1-DOF joints, the 6x6 identity for the free-flyer),
and spatial vectors are ``[linear; angular]``.
"""
from __future__ import annotations

from typing import List, Tuple

import torch

from .model import Model
from .spatial import (axis_angle_to_matrix, cross_force, cross_motion, homogeneous, motion_transform,
                      quat_to_matrix, spatial_inertia)


# ------------------------------------------------------------------- utilities
def _flatten(model: Model, *xs: torch.Tensor):
    """Broadcast inputs to common batch dims and flatten them to one batch dim."""
    sizes = [model.nq] + [model.nv] * (len(xs) - 1)
    for x, n, name in zip(xs, sizes, ("q", "v/tau", "a/tau")):
        if x.shape[-1] != n:
            raise ValueError(f"{name} has last dimension {x.shape[-1]}, model '{model.name}' expects {n}")
    batch = torch.broadcast_shapes(*(x.shape[:-1] for x in xs))
    flat = [x.expand(batch + x.shape[-1:]).reshape(-1, x.shape[-1]) for x in xs]
    return batch, flat


def joint_placements(model: Model, q: torch.Tensor) -> Tuple[List[torch.Tensor], List[torch.Tensor]]:
    """Pose of each body frame in its parent body frame (R (B,3,3), p (B,3)) at ``q`` (B, nq)."""
    Rs, ps = [], []
    for i, jt in enumerate(model.joint_type):
        k = model.q_start[i]
        if jt == "free":
            Rs.append(quat_to_matrix(q[:, k + 3:k + 7]))
            ps.append(q[:, k:k + 3])
            continue
        T_R, T_p = model.tree_R[i], model.tree_p[i]
        qi = q[:, k]
        if jt == "prismatic":
            Rs.append(T_R.expand(q.shape[0], 3, 3))
            ps.append(T_p + qi[:, None] * (T_R @ model.axis[i]))
        else:
            Rs.append(T_R @ axis_angle_to_matrix(model.axis[i], qi))
            ps.append(T_p.expand(q.shape[0], 3))
    return Rs, ps


def _motion_subspace(model: Model, i: int) -> torch.Tensor:
    """S for a 1-DOF joint as a 6-vector [linear; angular] in the body frame."""
    a = model.axis[i]
    z = torch.zeros_like(a)
    return torch.cat((a, z)) if model.joint_type[i] == "prismatic" else torch.cat((z, a))


def _body_inertias(model: Model) -> torch.Tensor:
    return spatial_inertia(model.mass, model.com, model.inertia)


def _gravity_acc(model: Model, B: int) -> torch.Tensor:
    """Spatial acceleration of the world frame that stands in for gravity: [-g; 0]."""
    g = torch.cat((-model.gravity, torch.zeros_like(model.gravity)))
    return g.expand(B, 6)


def _matvec(M: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    return (M @ x[..., None])[..., 0]


def _transforms(model: Model, q: torch.Tensor) -> List[torch.Tensor]:
    Rs, ps = joint_placements(model, q)
    return [motion_transform(R, p) for R, p in zip(Rs, ps)]


# ------------------------------------------------------------------ kinematics
def forward_kinematics(model: Model, q: torch.Tensor) -> torch.Tensor:
    """World pose of every link in ``model.link_names``: (..., n_links, 4, 4)."""
    batch, (qf,) = _flatten(model, q)
    B = qf.shape[0]
    Rs, ps = joint_placements(model, qf)
    Rw, pw = [], []
    for i, pi in enumerate(model.parent):
        if pi < 0:
            Rw.append(Rs[i])
            pw.append(ps[i])
        else:
            Rw.append(Rw[pi] @ Rs[i])
            pw.append(pw[pi] + _matvec(Rw[pi], ps[i]))
    out_R, out_p = [], []
    for li, b in enumerate(model.link_body):
        lR, lp = model.link_R[li], model.link_p[li]
        if b < 0:
            out_R.append(lR.expand(B, 3, 3))
            out_p.append(lp.expand(B, 3))
        else:
            out_R.append(Rw[b] @ lR)
            out_p.append(pw[b] + _matvec(Rw[b], lp))
    T = homogeneous(torch.stack(out_R, 1), torch.stack(out_p, 1))
    return T.reshape(batch + T.shape[1:])


# ------------------------------------------------------------- inverse dynamics
def rnea(model: Model, q: torch.Tensor, v: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
    """Recursive Newton-Euler: joint forces ``tau`` that produce accelerations ``a``.

    Includes gravity (``model.gravity``); for a floating base the first six
    entries are the body-frame wrench on the root.
    """
    batch, (qf, vf, af) = _flatten(model, q, v, a)
    B = qf.shape[0]
    X = _transforms(model, qf)
    I = _body_inertias(model)
    a0 = _gravity_acc(model, B)
    vb, ab, f = [], [], []
    for i, pi in enumerate(model.parent):
        k = model.v_start[i]
        if model.joint_type[i] == "free":
            vJ, aJ = vf[:, k:k + 6], af[:, k:k + 6]
        else:
            S = _motion_subspace(model, i)
            vJ, aJ = vf[:, k:k + 1] * S, af[:, k:k + 1] * S
        v_par = vb[pi] if pi >= 0 else None
        a_par = ab[pi] if pi >= 0 else a0
        vi = vJ if v_par is None else _matvec(X[i], v_par) + vJ
        ai = _matvec(X[i], a_par) + aJ + cross_motion(vi, vJ)
        Iv = _matvec(I[i], vi)
        vb.append(vi)
        ab.append(ai)
        f.append(_matvec(I[i], ai) + cross_force(vi, Iv))
    taus = [None] * model.nb
    for i in reversed(range(model.nb)):
        pi = model.parent[i]
        if model.joint_type[i] == "free":
            taus[i] = f[i]
        else:
            taus[i] = (f[i] * _motion_subspace(model, i)).sum(-1, keepdim=True)
        if pi >= 0:
            f[pi] = f[pi] + _matvec(X[i].transpose(-1, -2), f[i])
    tau = torch.cat(taus, -1)
    return tau.reshape(batch + (model.nv,))


# ----------------------------------------------------------------- mass matrix
def crba(model: Model, q: torch.Tensor) -> torch.Tensor:
    """Composite-rigid-body algorithm: the joint-space mass matrix M(q), (..., nv, nv)."""
    batch, (qf,) = _flatten(model, q)
    B = qf.shape[0]
    X = _transforms(model, qf)
    Ic = list(_body_inertias(model).expand(B, model.nb, 6, 6).unbind(1))
    for i in reversed(range(model.nb)):
        pi = model.parent[i]
        if pi >= 0:
            Ic[pi] = Ic[pi] + X[i].transpose(-1, -2) @ Ic[i] @ X[i]
    eye6 = torch.eye(6, dtype=qf.dtype, device=qf.device)
    S = [eye6 if t == "free" else _motion_subspace(model, i)[:, None] for i, t in enumerate(model.joint_type)]
    M = torch.zeros(B, model.nv, model.nv, dtype=qf.dtype, device=qf.device)
    for i in range(model.nb):
        ki, ni = model.v_start[i], S[i].shape[1]
        F = Ic[i] @ S[i]                      # (B, 6, ni)
        M[:, ki:ki + ni, ki:ki + ni] = S[i].transpose(-1, -2) @ F
        j = i
        while model.parent[j] >= 0:
            F = X[j].transpose(-1, -2) @ F
            j = model.parent[j]
            kj, nj = model.v_start[j], S[j].shape[1]
            blk = S[j].transpose(-1, -2) @ F    # (B, nj, ni)
            M[:, kj:kj + nj, ki:ki + ni] = blk
            M[:, ki:ki + ni, kj:kj + nj] = blk.transpose(-1, -2)
    return M.reshape(batch + (model.nv, model.nv))


# ------------------------------------------------------------ forward dynamics
def aba(model: Model, q: torch.Tensor, v: torch.Tensor, tau: torch.Tensor) -> torch.Tensor:
    """Articulated-body algorithm: accelerations ``qdd`` (..., nv) under joint forces ``tau``.

    O(n) in the number of bodies; equals ``M(q)^-1 (tau - rnea(q, v, 0))``.
    """
    batch, (qf, vf, tf) = _flatten(model, q, v, tau)
    B = qf.shape[0]
    X = _transforms(model, qf)
    I = _body_inertias(model)
    nb = model.nb
    vb, c, IA, pA, S = [], [], [], [], []
    # Pass 1, root to leaves: velocities, bias accelerations, rigid-body inertias and bias forces.
    for i, pi in enumerate(model.parent):
        k = model.v_start[i]
        if model.joint_type[i] == "free":
            vi = vf[:, k:k + 6]
            ci = torch.zeros_like(vi)
            S.append(None)
        else:
            s = _motion_subspace(model, i)
            vJ = vf[:, k:k + 1] * s
            vi = vJ if pi < 0 else _matvec(X[i], vb[pi]) + vJ
            ci = cross_motion(vi, vJ)
            S.append(s)
        vb.append(vi)
        c.append(ci)
        IA.append(I[i].expand(B, 6, 6))
        pA.append(cross_force(vi, _matvec(I[i], vi)))
    # Pass 2, leaves to root: articulated inertias and bias forces.
    U, D, u = [None] * nb, [None] * nb, [None] * nb
    for i in reversed(range(nb)):
        pi = model.parent[i]
        k = model.v_start[i]
        if S[i] is None:           # free-flyer: S = identity, always the root
            U[i], D[i], u[i] = IA[i], IA[i], tf[:, k:k + 6] - pA[i]
            continue
        Ui = _matvec(IA[i], S[i])                       # (B, 6)
        Di = (Ui * S[i]).sum(-1)                        # (B,)
        ui = tf[:, k] - (pA[i] * S[i]).sum(-1)          # (B,)
        U[i], D[i], u[i] = Ui, Di, ui
        if pi >= 0:
            Ia = IA[i] - Ui[:, :, None] * (Ui / Di[:, None])[:, None, :]
            pa = pA[i] + _matvec(Ia, c[i]) + Ui * (ui / Di)[:, None]
            XT = X[i].transpose(-1, -2)
            IA[pi] = IA[pi] + XT @ Ia @ X[i]
            pA[pi] = pA[pi] + _matvec(XT, pa)
    # Pass 3, root to leaves: accelerations.
    a0 = _gravity_acc(model, B)
    ab, qdd = [], []
    for i, pi in enumerate(model.parent):
        a_par = ab[pi] if pi >= 0 else a0
        ai = _matvec(X[i], a_par) + c[i]
        if S[i] is None:
            acc = torch.linalg.solve(D[i], u[i] - _matvec(U[i].transpose(-1, -2), ai))
            ai = ai + acc
        else:
            acc = ((u[i] - (U[i] * ai).sum(-1)) / D[i])[:, None]
            ai = ai + acc * S[i]
        ab.append(ai)
        qdd.append(acc)
    out = torch.cat(qdd, -1)
    return out.reshape(batch + (model.nv,))
