"""Rigid-body dynamics algorithms as free functions over batched tensors.

``forward_kinematics``, ``rnea`` (inverse dynamics), ``crba`` (joint-space mass
matrix) and ``aba`` (forward dynamics, the O(n) articulated-body algorithm),
after Featherstone, *Rigid Body Dynamics Algorithms* (2008), chapters 5-7.
Every function accepts any leading batch dimensions on ``q``/``v``/``a``/``tau``
and is differentiable by autograd in its inputs and in the model's tensors.

Two choices make the batched code fast:

* Spatial quantities are expressed in world-aligned axes at one point (the
  floating base's position, or the world origin for a fixed base), much as
  Pinocchio does internally. Motion subspaces ``S``, twists ``v``, inertias
  ``I`` and forces ``f`` of all bodies live in one frame, so the tree
  recursions of RNEA and CRBA become sums over ancestors or subtrees (one
  matrix product with the tree's ancestor matrix) and no 6x6 coordinate
  transform is applied inside a recursion. Only the body placements and the
  second and third passes of ABA loop over bodies.
* Internally the batch is the *last* dimension ("structure of arrays"): a
  batch of 6x6 matrices is a (6, 6, B) tensor. Elementwise kernels then run
  over long contiguous rows instead of 6-wide ones, which on a CPU is several
  times faster than batched GEMM on tiny matrices.

Spatial vectors are ``[linear; angular]`` (Pinocchio's order).

Mimic joints (see :mod:`.model`): the public functions take the reduced q/v/a/tau
and return reduced results. Inside, q and v are mapped to the full tree
(``q_full = G q + c``, ``v_full = G v``), the recursions run on the full tree, and
joint-space results are projected: ``tau = G^T tau_full``, ``M = G^T M_full G``,
``J = J_full G``. Forward dynamics with mimic joints solves the reduced
``M qdd = tau - b`` densely instead of running the O(n) ABA. The batch-last helpers
(``kinematics_batch_last``, ``joint_forces``, ``joint_space_inertia``, ...) follow
the same rule: kinematic quantities (S, twists) are full-tree, joint-space inputs
and outputs reduced. Without mimic joints every map is skipped.
"""
from __future__ import annotations

from typing import List, NamedTuple, Optional, Tuple, cast, overload

import torch

from .model import Model
from .spatial import _hamilton_table, kept_in, process_constant, skew, traced


# ------------------------------------------------------------------- topology
class _Topology(NamedTuple):
    anc: torch.Tensor        # (nb, nb): anc[i, j] = 1 if body j is body i or one of its ancestors
    dof_anc: torch.Tensor    # (nv, nv): 1 if the body of dof e is a strict ancestor of the body of dof d
    dof_same: torch.Tensor   # (nv, nv): 1 if dofs d and e move the same body
    body_of_dof: torch.Tensor  # (nv,) long
    jb: torch.Tensor         # (n1,) long: bodies moved by a 1-DOF joint
    jq: torch.Tensor         # (n1,) long: their index in q
    is_rev: torch.Tensor     # (n1, 1) 1.0 for revolute/continuous
    is_pri: torch.Tensor     # (n1, 1) 1.0 for prismatic
    link_src: torch.Tensor   # (n_links,) long: body of each link, nb for the world
    dof_body: torch.Tensor   # (nv_full, nb) one-hot: the body each dof moves


def _topology(parent: Tuple[int, ...], joint_type: Tuple[str, ...], q_start: Tuple[int, ...],
              link_body: Tuple[int, ...], dtype: torch.dtype, device: str) -> _Topology:
    # Kept for the process: never made of inference tensors, whatever mode the first
    # caller runs in (a policy deployed under torch.inference_mode, then trained on).
    return process_constant(("topology", parent, joint_type, q_start, link_body, str(dtype), device),
                            lambda: _make_topology(parent, joint_type, q_start, link_body, dtype, device))


def _make_topology(parent, joint_type, q_start, link_body, dtype, device) -> _Topology:
    nb = len(parent)
    anc = torch.zeros(nb, nb, dtype=dtype)
    for i in range(nb):
        j = i
        while j >= 0:
            anc[i, j] = 1.0
            j = parent[j]
    bd = torch.tensor([i for i, t in enumerate(joint_type) for _ in range(6 if t == "free" else 1)])
    dof_anc = anc[bd][:, bd] * (bd[:, None] != bd[None, :])
    dof_same = (bd[:, None] == bd[None, :]).to(dtype)
    ones = [i for i, t in enumerate(joint_type) if t != "free"]
    dev = torch.device(device)

    def flag(kinds):
        return torch.tensor([[float(joint_type[i] in kinds)] for i in ones], dtype=dtype, device=dev).reshape(-1, 1)

    return _Topology(
        anc=anc.to(dev), dof_anc=dof_anc.to(dev), dof_same=dof_same.to(dev), body_of_dof=bd.to(dev),
        jb=torch.tensor(ones, dtype=torch.long, device=dev),
        jq=torch.tensor([q_start[i] for i in ones], dtype=torch.long, device=dev),
        is_rev=flag(("revolute", "continuous")), is_pri=flag(("prismatic",)),
        link_src=torch.tensor([b if b >= 0 else nb for b in link_body], dtype=torch.long, device=dev),
        dof_body=(bd[:, None] == torch.arange(nb)[None, :]).to(dtype=dtype, device=dev),
    )


def _topo(model: Model) -> _Topology:
    return _topology(model.parent, model.joint_type, model.q_start, model.link_body, model.dtype,
                     str(model.device))


# ------------------------------------------------ batch-last small linear algebra
SMALL_BATCH = 32     # below this many environments, prefer fewer, larger ops
# A vector is (..., 3, B) or (..., 6, B); a matrix (..., n, m, B). Model constants
# broadcast with a trailing dimension of 1.
def _cross(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    if max(a.shape[-1], b.shape[-1]) < SMALL_BATCH and not traced():
        # One kernel: at a small batch the step is bound by per-op overhead.
        return torch.linalg.cross(a, b, dim=-2)
    # Written out: over long batch rows this beats the strided kernel several times.
    ax, ay, az = a.unbind(-2)
    bx, by, bz = b.unbind(-2)
    return torch.stack((ay * bz - az * by, az * bx - ax * bz, ax * by - ay * bx), -2)


def _skew(w: torch.Tensor) -> torch.Tensor:
    """(..., 3, B) -> the cross-product matrices (..., 3, 3, B).

    The components are gathered into the nine entries, times their signs (three operations).
    """
    index, sign = _skew_map(w.dtype, str(w.device))
    return (w.index_select(-2, index) * sign).unflatten(-2, (3, 3))


def _skew_map(dtype: torch.dtype, device: str) -> Tuple[torch.Tensor, torch.Tensor]:
    """Which component of w goes to each entry of [w]x, row by row, and its sign (9, 1)."""
    return process_constant(("skew", str(dtype), device), lambda: (
        torch.tensor([0, 2, 1, 2, 0, 0, 1, 0, 0], device=device),
        torch.tensor([0, -1, 1, 1, 0, -1, -1, 1, 0], dtype=dtype, device=device)[:, None]))


def _mv(A: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """(..., n, k, B) @ (..., k, B) -> (..., n, B)."""
    return (A * x.unsqueeze(-3)).sum(-2)


def _mm(A: torch.Tensor, C: torch.Tensor) -> torch.Tensor:
    """(..., n, k, B) @ (..., k, m, B) -> (..., n, m, B)."""
    return (A.unsqueeze(-2) * C.unsqueeze(-4)).sum(-3)


def _cross_motion(v: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    vl, w = v[..., :3, :], v[..., 3:, :]
    ml, mw = m[..., :3, :], m[..., 3:, :]
    return torch.cat((_cross(w, ml) + _cross(vl, mw), _cross(w, mw)), -2)


def _cross_force(v: torch.Tensor, f: torch.Tensor) -> torch.Tensor:
    vl, w = v[..., :3, :], v[..., 3:, :]
    fl, fa = f[..., :3, :], f[..., 3:, :]
    return torch.cat((_cross(w, fl), _cross(w, fa) + _cross(vl, fl)), -2)


def _quat_to_matrix(quat: torch.Tensor) -> torch.Tensor:
    """(4, B) quaternion x, y, z, w (normalised here) -> (3, 3, B).

    The rotation's entries are quadratic forms of the unit quaternion, one constant (9, 16) map of
    its outer product.
    """
    quat = quat / torch.linalg.vector_norm(quat, dim=0, keepdim=True)
    outer = (quat[:, None] * quat[None, :]).reshape(16, -1)
    return (_quat_matrix_map(quat.dtype, str(quat.device)) @ outer).reshape((3, 3) + quat.shape[1:])


def _quat_matrix_map(dtype: torch.dtype, device: str) -> torch.Tensor:
    """(9, 16): R[a, b] = sum_ij C[3 a + b, 4 i + j] q_i q_j for a unit quaternion q = (x, y, z, w)."""
    def make():
        x, y, z, w = range(4)
        rows = (((x, x, 1), (y, y, -1), (z, z, -1), (w, w, 1)), ((x, y, 2), (w, z, -2)), ((x, z, 2), (w, y, 2)),
                ((x, y, 2), (w, z, 2)), ((x, x, -1), (y, y, 1), (z, z, -1), (w, w, 1)), ((y, z, 2), (w, x, -2)),
                ((x, z, 2), (w, y, -2)), ((y, z, 2), (w, x, 2)), ((x, x, -1), (y, y, -1), (z, z, 1), (w, w, 1)))
        C = torch.zeros(9, 16, dtype=dtype)
        for r, terms in enumerate(rows):
            for i, j, c in terms:
                C[r, 4 * i + j] = c
        return C.to(device)
    return process_constant(("quat_matrix", str(dtype), device), make)


def _tree_sum(anc: torch.Tensor, x: torch.Tensor, subtree: bool = False) -> torch.Tensor:
    """Sum per-body ``x`` (nb, ..., B) over each body's ancestors (or its subtree)."""
    nb = x.shape[0]
    out = (anc.T if subtree else anc) @ x.reshape(nb, -1)
    return out.reshape(x.shape)


# ------------------------------------------------------------------- utilities
def _flatten(model: Model, *xs: torch.Tensor):
    """Broadcast inputs to common batch dims; return them batch-last, (n, B)."""
    sizes = [model.nq] + [model.nv] * (len(xs) - 1)
    for x, n, name in zip(xs, sizes, ("q", "v", "a/tau")):
        if x.shape[-1] != n:
            raise ValueError(f"{name} has last dimension {x.shape[-1]}, model '{model.name}' expects {n}")
    batch = torch.broadcast_shapes(*(x.shape[:-1] for x in xs))
    flat = [x.expand(batch + x.shape[-1:]).reshape(-1, x.shape[-1]).T for x in xs]
    return batch, flat


def _unflatten(x: torch.Tensor, batch) -> torch.Tensor:
    """(..., B) batch-last -> (*batch, ...)."""
    return x.movedim(-1, 0).reshape(batch + x.shape[:-1])


def _batch_last(x: torch.Tensor, batch, B: int) -> torch.Tensor:
    """(*batch, ...) or (...) broadcastable to the batch -> (..., B)."""
    inner = x.shape[len(x.shape) - 2:]
    return x.expand(batch + inner).reshape((B,) + inner).movedim(0, -1)


# ------------------------------------------------------------- mimic coupling
def _full_q(model: Model, qf: torch.Tensor) -> torch.Tensor:
    """Reduced batch-last q (nq, B) -> the full tree's (nq_full, B); q itself without mimic joints."""
    if not model.mimic_joints:
        return qf
    G, c = cast(torch.Tensor, model.mimic_G), cast(torch.Tensor, model.mimic_offset)[:, None]   # set with mimic
    if model.floating_base:
        return torch.cat((qf[0:7], G[6:, 6:] @ qf[7:]), 0) + c
    return G @ qf + c


@overload
def _full_v(model: Model, vf: torch.Tensor) -> torch.Tensor: ...
@overload
def _full_v(model: Model, vf: None) -> None: ...
@overload
def _full_v(model: Model, vf: Optional[torch.Tensor]) -> Optional[torch.Tensor]: ...


def _full_v(model: Model, vf: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    """Reduced batch-last v or a (nv, B) -> the full tree's (nv_full, B): G v."""
    if not model.mimic_joints or vf is None:
        return vf
    return cast(torch.Tensor, model.mimic_G) @ vf                   # set with mimic joints


def _reduce(model: Model, tau: torch.Tensor) -> torch.Tensor:
    """Full-tree generalised forces (nv_full, B) -> reduced (nv, B): G^T tau."""
    if not model.mimic_joints:
        return tau
    return cast(torch.Tensor, model.mimic_G).T @ tau                # set with mimic joints


def _reduce_matrix(model: Model, M: torch.Tensor) -> torch.Tensor:
    """Full-tree joint-space matrix (nv_full, nv_full, B) -> reduced (nv, nv, B): G^T M G."""
    if not model.mimic_joints:
        return M
    G = cast(torch.Tensor, model.mimic_G)                           # set with mimic joints
    return torch.einsum("ia,ijb,jc->acb", G, M, G)


# ------------------------------------------------------------------ kinematics
def _joint_placements(model: Model, q: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """Each body frame in its parent body frame at q (nq, B): R (nb, 3, 3, B), p (nb, 3, B)."""
    topo = _topo(model)
    Rs, ps = [], []
    if model.joint_type[0] == "free":
        Rs.append(_quat_to_matrix(q[3:7])[None])
        ps.append(q[None, 0:3])
    if len(topo.jb):
        qj = q[topo.jq]                                             # (n1, B)
        T_R, T_p, RK, Ra = _joint_tables(model)
        angle = qj * topo.is_rev
        # Rodrigues: R = T_R (1 + sin K + (1 - cos) K^2), one product with the constant
        # [T_R K, T_R K^2] (identity for prismatic joints: angle 0).
        n1, B = qj.shape
        R = T_R[..., None] + (RK @ torch.stack((torch.sin(angle), 1.0 - torch.cos(angle)), 1)).reshape(n1, 3, 3, B)
        p = T_p[..., None] + (qj * topo.is_pri)[:, None, :] * Ra
        Rs.append(R.expand(-1, -1, -1, B))
        ps.append(p.expand(-1, -1, B))
    R = torch.cat(Rs, 0) if len(Rs) > 1 else Rs[0]
    p = torch.cat(ps, 0) if len(ps) > 1 else ps[0]
    return R, p


def _joint_tables(model: Model):
    """Per 1-DOF joint, constants of the model.

    They are T_R (n1, 3, 3), T_p (n1, 3), [T_R K, T_R K^2] as (n1, 9, 2) with K the skew matrix of
    the axis, and T_R axis (n1, 3, 1). Kept in the (frozen) model's instance dict: computed once per
    model, not per step.
    """
    def make():
        jb = _topo(model).jb
        T_R, T_p, axis = model.tree_R[jb], model.tree_p[jb], model.axis[jb]
        K = skew(axis)
        RK = torch.stack(((T_R @ K).reshape(-1, 9), (T_R @ K @ K).reshape(-1, 9)), -1)
        return T_R, T_p, RK, T_R @ axis[..., None]
    return cached_on(model, "_joint_tables", make)


def cached_on(obj, key: str, make):
    """``make()``, computed once and kept in the instance dict of a frozen object (a Model).

    A replaced copy is a new object and computes its own (see spatial.kept_in).
    """
    return kept_in(obj.__dict__, key, make)


def model_constants(model: Model) -> None:
    """Compute and keep the model's per-model constants now.

    They are the joint tables and the gravity's spatial acceleration, made now so that a traced or
    compiled step finds them made (torch.compile then takes them as constants instead of tracing
    their construction).
    """
    if len(_topo(model).jb):
        _joint_tables(model)
    _gravity_acc(model)
    dev = str(model.device)
    _skew_map(model.dtype, dev)
    _quat_matrix_map(model.dtype, dev)
    _hamilton_table(model.dtype, dev)
    for level in _levels(model):                 # _gather's index lists (some it slices instead)
        for idx in level:
            _index_tensor(tuple(idx), dev)


def _body_placements(model: Model, q: torch.Tensor, relative: bool = False) -> Tuple[torch.Tensor, torch.Tensor]:
    """World pose of each body at q (nq, B): R (nb, 3, 3, B), p (nb, 3, B).

    relative: positions relative to the floating base's position (computed
    without ever forming the absolute positions, so no precision is lost far
    from the world origin); the same as absolute for a fixed base.
    """
    R, p = _joint_placements(model, q)
    if relative and model.joint_type[0] == "free":
        p = torch.cat((torch.zeros_like(p[0:1]), p[1:]), 0)
    if q.shape[-1] < SMALL_BATCH and not traced():
        return _chain_homogeneous(model, R, p)
    # Depth by depth: the bodies of one depth from their parents' poses in one product.
    Rw: List[torch.Tensor] = list(R.unbind(0))
    pw: List[torch.Tensor] = list(p.unbind(0))
    for idx, par in _levels(model):
        Rp = _gather(Rw, par)
        Rn, pn = _mm(Rp, _gather(R, idx)), _gather(pw, par) + _mv(Rp, _gather(p, idx))
        _scatter(Rw, idx, Rn)
        _scatter(pw, idx, pn)
    return torch.stack(Rw), torch.stack(pw)


def _levels(model: Model) -> List[Tuple[List[int], List[int]]]:
    """Per depth >= 1 of the tree: its bodies and their parents (python ints)."""
    return process_constant(("levels", model.parent), lambda: _level_lists(model.parent))


def _level_lists(parent: Tuple[int, ...]) -> List[Tuple[List[int], List[int]]]:
    depth: List[int] = []
    for p in parent:
        depth.append(0 if p < 0 else depth[p] + 1)
    return [([i for i, d in enumerate(depth) if d == k], [parent[i] for i, d in enumerate(depth) if d == k])
            for k in range(1, max(depth, default=0) + 1)]


def _gather(xs, idx: List[int]) -> torch.Tensor:
    """Entries ``idx`` of a list of per-body tensors (or of a tensor's first dimension), stacked.

    One body is returned as it is, with a leading 1.
    """
    if len(idx) == 1:
        return xs[idx[0]][None]
    if isinstance(xs, torch.Tensor):
        if idx == list(range(idx[0], idx[0] + len(idx))):
            return xs[idx[0]:idx[0] + len(idx)]
        return xs.index_select(0, _index_tensor(tuple(idx), str(xs.device)))
    return torch.stack([xs[i] for i in idx])


def _index_tensor(idx: Tuple[int, ...], device: str) -> torch.Tensor:
    return process_constant(("index", idx, device), lambda: torch.tensor(idx, dtype=torch.long, device=device))


def _scatter(xs: List, idx: List[int], values: torch.Tensor) -> None:
    if len(idx) == 1:
        xs[idx[0]] = values[0]
    else:
        for i, v in zip(idx, values.unbind(0)):
            xs[i] = v


def _chain_homogeneous(model: Model, R: torch.Tensor, p: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """Return the same world poses for a few environments.

    They are computed as 4x4 products batch first, one per depth of the tree (fewer, larger ops
    where per-op overhead dominates).
    """
    nb, B = R.shape[0], R.shape[-1]
    X = torch.cat((torch.cat((R, p[:, :, None]), 2),
                   torch.eye(4, dtype=R.dtype, device=R.device)[3:].reshape(1, 1, 4, 1).expand(nb, 1, 4, B)), 1)
    X = X.permute(0, 3, 1, 2)                                  # (nb, B, 4, 4)
    T: List[torch.Tensor] = list(X.unbind(0))
    for idx, par in _levels(model):
        _scatter(T, idx, _gather(T, par) @ _gather(X, idx))
    W = torch.stack(T).permute(0, 2, 3, 1)                     # (nb, 4, 4, B)
    return W[:, 0:3, 0:3], W[:, 0:3, 3]


def joint_placements(model: Model, q: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """Pose of each body frame in its parent body frame: R (..., nb, 3, 3), p (..., nb, 3)."""
    batch, (qf,) = _flatten(model, q)
    R, p = _joint_placements(model, _full_q(model, qf))
    return _unflatten(R, batch), _unflatten(p, batch)


def body_placements(model: Model, q: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """World pose of each body frame: R (..., nb, 3, 3), p (..., nb, 3)."""
    batch, (qf,) = _flatten(model, q)
    R, p = _body_placements(model, _full_q(model, qf))
    return _unflatten(R, batch), _unflatten(p, batch)


def kinematics_batch_last(model: Model, qf: torch.Tensor, vf: torch.Tensor):
    """Body kinematics on batch-last inputs q (nq, B), v (nv, B).

    Returns R (nb, 3, 3, B), positions relative to the point o (nb, 3, B), o
    (1, 3, B: the floating base's position, or the world origin) and body twists
    (nb, 6, B) in world axes at o (the velocity of the body point at o, then w).
    With mimic joints, q and v are the reduced coordinates.
    """
    topo = _topo(model)
    qf, vf = _full_q(model, qf), _full_v(model, vf)
    Rw, pw = _body_placements(model, qf, relative=True)
    o = _frame_origin(model, qf)
    S = _motion_subspaces(model, Rw, pw)
    vel = _tree_sum(topo.anc, _body_sum(topo, S * vf[:, None], model.nb))
    return Rw, pw, o, vel


def body_states(model: Model, q: torch.Tensor, v: torch.Tensor):
    """World pose and twist of every body.

    Returns R (..., nb, 3, 3), p (..., nb, 3) and the twist (..., nb, 6) as
    ``[v_o; w]`` in the world frame, where ``v_o`` is the velocity of the
    body-fixed point at the world origin: a point x of the body moves at
    ``v_o + w x x``, and a force F applied at x is the wrench ``[F; x x F]``.
    """
    batch, (qf, vf) = _flatten(model, q, v)
    Rw, pw, o, vel = kinematics_batch_last(model, qf, vf)
    # Velocity of the body point at the world origin: v_o = v_(point at o) - w x o.
    vel = torch.cat((vel[:, 0:3] - _cross(vel[:, 3:6], o.expand_as(vel[:, 3:6])), vel[:, 3:6]), 1)
    return _unflatten(Rw, batch), _unflatten(pw + o, batch), _unflatten(vel, batch)


def forward_kinematics(model: Model, q: torch.Tensor) -> torch.Tensor:
    """World pose of every link in ``model.link_names``: (..., n_links, 4, 4)."""
    batch, (qf,) = _flatten(model, q)
    B = qf.shape[-1]
    topo = _topo(model)
    Rw, pw = _body_placements(model, _full_q(model, qf))
    # Links fixed to the world hang from a virtual body with identity pose (index nb).
    eye = torch.eye(3, dtype=qf.dtype, device=qf.device)[None, :, :, None].expand(1, 3, 3, B)
    Rw = torch.cat((Rw, eye), 0)[topo.link_src]
    pw = torch.cat((pw, torch.zeros(1, 3, B, dtype=qf.dtype, device=qf.device)), 0)[topo.link_src]
    R = _mm(Rw, model.link_R[..., None])
    p = pw + _mv(Rw, model.link_p[..., None])
    bottom = torch.zeros(R.shape[0], 1, 4, B, dtype=R.dtype, device=R.device)
    bottom[:, :, 3] = 1.0
    T = torch.cat((torch.cat((R, p[:, :, None]), 2), bottom), 1)
    return _unflatten(T, batch)


def link_kinematics(model: Model, q: torch.Tensor, link: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """World position of the origin of link ``link`` and its Jacobian, from one pass.

    ``link`` is an index in ``model.link_names``, the pass is over the body placements, and the
    results are (..., 3), (..., 3, nv). The origin's velocity is ``J @ v``; the columns of dofs
    that do not move the link are zero.
    """
    batch, (qf,) = _flatten(model, q)
    topo = _topo(model)
    body = model.link_body[link]
    B = qf.shape[-1]
    if body < 0:                                   # fixed to the world
        p = model.link_p[link][:, None].expand(3, B)
        return _unflatten(p, batch), _unflatten(torch.zeros(3, model.nv, B, dtype=qf.dtype, device=qf.device), batch)
    Rw, pw = _body_placements(model, _full_q(model, qf))
    S = _motion_subspaces(model, Rw, pw)                                 # (nv_full, 6, B) at the world origin
    p = pw[body] + _mv(Rw[body], model.link_p[link][:, None])            # (3, B)
    # A dof's twist (v_O, w) at the world origin moves the point p at v_O + w x p.
    lin = S[:, 0:3] + _cross(S[:, 3:6], p[None].expand_as(S[:, 3:6]))    # (nv, 3, B)
    moves = topo.anc[body][topo.body_of_dof]                             # (nv_full,)
    J = (lin * moves[:, None, None]).transpose(0, 1)                     # (3, nv_full, B)
    if model.mimic_joints:
        J = torch.einsum("kib,ia->kab", J, model.mimic_G)
    return _unflatten(p, batch), _unflatten(J, batch)


def link_jacobian(model: Model, q: torch.Tensor, link: int) -> torch.Tensor:
    """Jacobian of the origin of link ``link`` (index in ``model.link_names``) in the world frame.

    It is (..., 3, nv) and the origin's velocity is ``J @ v``; the columns of dofs that do not move
    the link are zero. ``link_kinematics`` gives the position with it.
    """
    return link_kinematics(model, q, link)[1]


# ----------------------------------------------------------- world quantities
def _spatial_inertia(mass: torch.Tensor, c: torch.Tensor, I_c: torch.Tensor) -> torch.Tensor:
    """(nb,) or (nb, B), (nb, 3, B), (nb, 3, 3, B) -> (nb, 6, 6, B) about the origin of c's frame."""
    m = mass.reshape(mass.shape[0], 1, 1, -1)
    C = _skew(c)
    mC = m * C
    eye = torch.eye(3, dtype=c.dtype, device=c.device)[None, :, :, None]
    top = torch.cat(((m * eye).expand_as(mC), -mC), -2)
    bottom = torch.cat((mC, I_c - _mm(mC, C)), -2)
    return torch.cat((top, bottom), -3)


def _motion_subspaces(model: Model, Rw: torch.Tensor, pw: torch.Tensor) -> torch.Tensor:
    """Motion subspace of every dof, (nv, 6, B), in the world frame at the world origin."""
    topo = _topo(model)
    cols = []
    if model.joint_type[0] == "free":
        # Body twist [v; w] -> world twist at the origin: [R v + p x (R w); R w].
        R0, p0 = Rw[0], pw[0]
        top = torch.cat((R0, _mm(_skew(p0), R0)), 1)
        bottom = torch.cat((torch.zeros_like(R0), R0), 1)
        cols.append(torch.cat((top, bottom), 0).transpose(0, 1))   # (6 dofs, 6, B)
    if len(topo.jb):
        a_w = _mv(Rw[topo.jb], model.axis[topo.jb][..., None])        # (n1, 3, B)
        rev = topo.is_rev[..., None]
        lin = rev * _cross(pw[topo.jb], a_w) + topo.is_pri[..., None] * a_w
        cols.append(torch.cat((lin, rev * a_w), 1))
    return torch.cat(cols, 0) if len(cols) > 1 else cols[0]


def _frame_origin(model: Model, q: torch.Tensor) -> torch.Tensor:
    """Origin of the frame the dynamics are computed in, (1, 3, B).

    It is the floating base's position (so the results do not lose precision as the robot travels
    away from the world origin), or the world origin for a fixed base.
    """
    if model.joint_type[0] == "free":
        return q[None, 0:3]
    return torch.zeros(1, 3, 1, dtype=q.dtype, device=q.device)


def _world_quantities(model: Model, q: torch.Tensor):
    """Motion subspace of every dof (nv, 6, B), spatial inertia of every body (nb, 6, 6, B), and ``o``.

    The first two are in world-aligned axes at the point ``o`` (see :func:`_frame_origin`), which
    is (1, 3, B).
    """
    Rw, pw = _body_placements(model, q, relative=True)
    o = _frame_origin(model, q)
    S = _motion_subspaces(model, Rw, pw)
    com, inertia = inertials(model)
    c_w = pw + _mv(Rw, com)
    I_c = _mm(_mm(Rw, inertia), Rw.transpose(1, 2))
    return S, _spatial_inertia(model.mass, c_w, I_c), o, Rw, pw


def inertials(model: Model) -> Tuple[torch.Tensor, torch.Tensor]:
    """Return the bodies' centres of mass (nb, 3, B or 1) and rotational inertias (nb, 3, 3, B or 1).

    Both are batch-last: a model of one set of inertial parameters has them unbatched (mass (nb,),
    com (nb, 3), inertia (nb, 3, 3)); a model of per-environment ones (domain randomisation,
    ``parameters.apply_per_episode``) has a trailing batch dimension on each.
    """
    com = model.com if model.com.dim() == 3 else model.com[..., None]
    inertia = model.inertia if model.inertia.dim() == 4 else model.inertia[..., None]
    return com, inertia


def _shift_wrench(f_ext: torch.Tensor, o: torch.Tensor) -> torch.Tensor:
    """World-origin wrenches (nb, 6, B) -> the same wrenches about the point o."""
    F = f_ext[:, 0:3]
    return torch.cat((F, f_ext[:, 3:6] - _cross(o.expand_as(F), F)), 1)


def _gravity_acc(model: Model) -> torch.Tensor:
    """Spatial acceleration of the world that stands in for gravity: [-g; 0], (6, 1).

    Kept in the (frozen) model's instance dict, unless the gravity carries a gradient.
    """
    def make():
        return torch.cat((-model.gravity, torch.zeros_like(model.gravity)))[:, None]
    return make() if model.gravity.requires_grad else cached_on(model, "_gravity_acc", make)


def _body_sum(topo: _Topology, x: torch.Tensor, nb: int) -> torch.Tensor:
    """Per-dof (nv, k, B) -> per-body (nb, k, B) sums."""
    if traced():
        # A product with the one-hot map, not a scatter: Inductor (torch 2.13, CPU, more than
        # one thread) failed to generate the atomic-add kernel of the scatters here.
        return (topo.dof_body.T @ x.reshape(x.shape[0], -1)).reshape((nb,) + x.shape[1:])
    out = torch.zeros((nb,) + x.shape[1:], dtype=x.dtype, device=x.device)
    return out.index_add(0, topo.body_of_dof, x)


def _of_dof(topo: _Topology, x: torch.Tensor) -> torch.Tensor:
    """Per-body (nb, k, B) -> per-dof (nv, k, B): each dof's body's value.

    Compiled, a product with the one-hot map, whose gradient is another product rather than a
    scatter-add.
    """
    if traced():
        return (topo.dof_body @ x.reshape(x.shape[0], -1)).reshape(topo.dof_body.shape[:1] + x.shape[1:])
    return x[topo.body_of_dof]


# ------------------------------------------------------------- inverse dynamics
def rnea(model: Model, q: torch.Tensor, v: torch.Tensor, a: torch.Tensor,
         f_ext: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Recursive Newton-Euler: joint forces ``tau`` that produce accelerations ``a``.

    Includes gravity (``model.gravity``); for a floating base the first six
    entries are the body-frame wrench on the root. ``f_ext`` as in :func:`aba`.
    """
    batch, (qf, vf, af) = _flatten(model, q, v, a)
    topo = _topo(model)
    qf, vf = _full_q(model, qf), _full_v(model, vf)            # af stays reduced: joint_forces maps it
    S, I, o, _, _ = _world_quantities(model, qf)
    vJ = _body_sum(topo, S * vf[:, None], model.nb)            # joint twists (nb, 6, B)
    vel = _tree_sum(topo.anc, vJ)                              # body twists
    fe = None if f_ext is None else _shift_wrench(_batch_last(f_ext, batch, qf.shape[-1]), o)
    tau = joint_forces(model, S, I, vJ, vel, af, fe)
    return _unflatten(tau, batch)


def joint_forces(model: Model, S: torch.Tensor, I: torch.Tensor, vJ: torch.Tensor, vel: torch.Tensor,
                 af: Optional[torch.Tensor] = None, f_ext: Optional[torch.Tensor] = None) -> torch.Tensor:
    """RNEA on batch-last kinematics (all at the point o, world axes).

    The inputs are motion subspaces S (nv_full, 6, B), inertias I (nb, 6, 6, B), joint and body
    twists vJ, vel (nb, 6, B), accelerations af (nv, B) (None: zero; reduced coordinates) and
    external wrenches f_ext (nb, 6, B) about o. Returns tau (nv, B) (reduced: G^T tau_full with
    mimic joints); with af None it is the bias ``b(q, v) - J^T f_ext``.
    """
    topo = _topo(model)
    # a_i = a_parent + S_i qdd_i + v_i x S_i qd_i (the last term is dS_i/dt qd_i in the world frame).
    c = _cross_motion(vel, vJ)
    if af is not None:
        c = c + _body_sum(topo, S * _full_v(model, af)[:, None], model.nb)
    acc = _tree_sum(topo.anc, c) + _gravity_acc(model)
    f = _mv(I, acc) + _cross_force(vel, _mv(I, vel))
    if f_ext is not None:
        f = f - f_ext
    F = _tree_sum(topo.anc, f, subtree=True)                   # wrench transmitted by each joint
    return _reduce(model, (S * _of_dof(topo, F)).sum(1))


def gravity_joint_forces(model: Model, S: torch.Tensor, I: torch.Tensor) -> torch.Tensor:
    """Return the joint forces that hold the bodies against gravity at rest, ``rnea(q, 0, 0)``.

    They are computed on batch-last S (nv_full, 6, B) and inertias I (nb, 6, 6, B) at o, as
    (nv, B) (reduced).
    """
    topo = _topo(model)
    f = _mv(I, _gravity_acc(model))
    F = _tree_sum(topo.anc, f, subtree=True)
    return _reduce(model, (S * _of_dof(topo, F)).sum(1))


# ----------------------------------------------------------------- mass matrix
def crba(model: Model, q: torch.Tensor) -> torch.Tensor:
    """Composite-rigid-body algorithm: the joint-space mass matrix M(q), (..., nv, nv)."""
    batch, (qf,) = _flatten(model, q)
    S, I, _, _, _ = _world_quantities(model, _full_q(model, qf))
    return _unflatten(joint_space_inertia(model, S, I), batch)


def joint_space_inertia(model: Model, S: torch.Tensor, I: torch.Tensor) -> torch.Tensor:
    """CRBA on batch-last quantities at o: S (nv_full, 6, B), body inertias I (nb, 6, 6, B) -> M (nv, nv, B).

    M is reduced: G^T M_full G with mimic joints. Any symmetric per-body 6x6 blocks (a contact's
    friction damping, say) map to joint space the same way.
    """
    topo = _topo(model)
    Ic = _tree_sum(topo.anc, I, subtree=True)                  # composite inertias
    F = _mv(_of_dof(topo, Ic), S)                              # (nv, 6, B)
    G = (F[:, None] * S[None]).sum(2)                          # G[d, e] = S_e . Ic_{body(d)} S_d
    L = G * topo.dof_anc[..., None]
    return _reduce_matrix(model, L + L.transpose(0, 1) + G * topo.dof_same[..., None])


def body_inverse_weights(model: Model) -> torch.Tensor:
    """Return how readily each body's centre of mass accelerates, (nb, 2): translation, rotation.

    The means of the diagonals of J M^-1 J^T at the neutral configuration, for J the (6, nv)
    Jacobian of the body's centre of mass (linear rows, then angular): the inverse of an effective
    mass (1/kg) and of an effective inertia (1/(kg m^2)). MuJoCo computes the same at its qpos0
    (``body_invweight0``) to scale the regularisation of its soft constraints; the soft ground
    contact (``simulator.contact_model: soft``) uses it the same way, per link
    (:func:`inverse_weights` at each link's own centre of mass, as MuJoCo keeps the links fixed
    to a body as bodies of their own).
    """
    com, _ = inertials(model)
    return inverse_weights(model, torch.arange(model.nb, device=model.device), com[..., 0])


def inverse_weights(model: Model, body: torch.Tensor, point: torch.Tensor) -> torch.Tensor:
    """Return :func:`body_inverse_weights`' two numbers for points ``point`` (K, 3) fixed to bodies ``body`` (K,).

    The points are in their bodies' frames; J is the Jacobian of the point (linear rows) and of
    its body's rotation (angular rows), at the neutral configuration.
    """
    qf = model.neutral_configuration()[:, None]
    topo = _topo(model)
    S, I, _, Rw, pw = _world_quantities(model, _full_q(model, qf))
    M = joint_space_inertia(model, S, I)[..., 0]                             # (nv, nv), reduced
    c = (pw[body] + _mv(Rw[body], point[..., None]))[..., 0]                 # (K, 3)
    Sf = S[..., 0]                                                           # (nv_full, 6)
    lin = Sf[None, :, 0:3] + torch.linalg.cross(Sf[None, :, 3:6], c[:, None].expand(-1, Sf.shape[0], 3))
    ang = Sf[None, :, 3:6].expand_as(lin)
    moves = topo.anc[body][:, topo.body_of_dof].to(Sf.dtype)                # (K, nv_full)
    J = torch.cat((lin, ang), 2) * moves[..., None]                          # (K, nv_full, 6)
    if model.mimic_joints:
        J = torch.einsum("kid,ia->kad", J, cast(torch.Tensor, model.mimic_G))
    X = torch.linalg.solve(M, J.permute(1, 0, 2).reshape(M.shape[0], -1)).reshape(M.shape[0], -1, 6)
    A = (J * X.permute(1, 0, 2)).sum(1)                                      # (K, 6): diag of J M^-1 J^T
    return torch.stack((A[:, 0:3].mean(1), A[:, 3:6].mean(1)), 1)


# ------------------------------------------------------------ forward dynamics
def aba(model: Model, q: torch.Tensor, v: torch.Tensor, tau: torch.Tensor,
        f_ext: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Articulated-body algorithm: accelerations ``qdd`` (..., nv) under joint forces ``tau``.

    O(n) in the number of bodies; equals ``M(q)^-1 (tau - rnea(q, v, 0) + J^T f_ext)``.
    ``f_ext`` (..., nb, 6), optional: external wrench on each body, in the world
    frame and about the world origin, ``[force; torque]`` (see :func:`body_states`).
    """
    batch, (qf, vf, tf) = _flatten(model, q, v, tau)
    fe = None if f_ext is None else _batch_last(f_ext, batch, qf.shape[-1])
    return _unflatten(aba_batch_last(model, qf, vf, tf, f_ext=fe), batch)


def aba_batch_last(model: Model, qf: torch.Tensor, vf: torch.Tensor, tf: torch.Tensor,
                   f_ext: Optional[torch.Tensor] = None) -> torch.Tensor:
    """ABA on batch-last inputs q (nq, B), v (nv, B), tau (nv, B) -> qdd (nv, B).

    f_ext (nb, 6, B): world-origin wrenches, as in :func:`aba`. With mimic joints
    (reduced q, v, tau) the reduced ``M qdd = tau - b`` is solved densely.
    """
    nb = model.nb
    topo = _topo(model)
    if model.mimic_joints:
        return _coupled_forward_dynamics(model, qf, vf, tf, f_ext)
    S, I, o, Rw, pw = _world_quantities(model, qf)
    vJ = _body_sum(topo, S * vf[:, None], nb)
    vel = _tree_sum(topo.anc, vJ)
    # Pass 1 (vectorised over bodies): bias accelerations c and bias forces pA.
    c = _cross_motion(vel, vJ)
    pA0 = _cross_force(vel, _mv(I, vel))
    if f_ext is not None:
        pA0 = pA0 - _shift_wrench(f_ext, o)
    pA = list(pA0.unbind(0))
    IA = list(I.unbind(0))
    free = model.joint_type[0] == "free"
    # Pass 2, leaves to root: articulated-body inertias IA and bias forces pA.
    U: List[Optional[torch.Tensor]] = [None] * nb              # None: the free-flyer root's (not used)
    D: List[Optional[torch.Tensor]] = [None] * nb
    u: List[Optional[torch.Tensor]] = [None] * nb
    for i in reversed(range(nb)):
        pi = model.parent[i]
        k = model.v_start[i]
        if free and i == 0:                                    # free-flyer root: solved in pass 3
            continue
        s = S[k]
        Ui = _mv(IA[i], s)                                     # (6, B)
        Di = (Ui * s).sum(0)                                   # (B,)
        ui = tf[k] - (pA[i] * s).sum(0)
        U[i], D[i], u[i] = Ui, Di, ui
        if pi >= 0:
            Ud = Ui / Di
            Ia = IA[i] - Ui[:, None] * Ud[None, :]
            IA[pi] = IA[pi] + Ia
            pA[pi] = pA[pi] + pA[i] + _mv(Ia, c[i]) + Ud * ui
    # Pass 3, root to leaves: accelerations.
    a0 = _gravity_acc(model)
    acc: List[torch.Tensor] = []
    qdd: List[torch.Tensor] = []
    for i, pi in enumerate(model.parent):
        if free and i == 0:
            # The base's motion subspace is orthonormal (world-aligned axes at its own
            # origin: S0 = diag(R, R)), so its joint wrench is S0 tau and the base
            # acceleration solves IA a = S0 tau - pA (a in world axes, measured with the
            # world accelerating at -g); rotate a - a_g into the body frame.
            S0 = S[0:6]                                        # (6 dofs, 6, B)
            ai = _solve_spd(IA[0], (S0 * tf[0:6, None]).sum(0) - pA[0])
            x = (S0 * (ai - a0)[None]).sum(1)                  # (6, B) body-frame acceleration
            qdd.append(x)
        else:
            ai = (acc[pi] if pi >= 0 else a0) + c[i]
            s = S[model.v_start[i]]
            Ui, Di, ui = cast(torch.Tensor, U[i]), cast(torch.Tensor, D[i]), cast(torch.Tensor, u[i])  # set in pass 2
            x = (ui - (Ui * ai).sum(0)) / Di
            ai = ai + x * s
            qdd.append(x[None])
        acc.append(ai)
    return torch.cat(qdd, 0)


def _coupled_forward_dynamics(model: Model, qf: torch.Tensor, vf: torch.Tensor, tf: torch.Tensor,
                              f_ext: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Forward dynamics of a model with mimic joints: reduced q (nq, B), v, tau (nv, B) -> qdd (nv, B).

    It uses M = G^T M_full G and b = G^T b_full (the ABA recursion has no place for a coordinate
    shared by two bodies).
    """
    topo = _topo(model)
    S, I, o, _, _ = _world_quantities(model, _full_q(model, qf))
    vJ = _body_sum(topo, S * _full_v(model, vf)[:, None], model.nb)
    vel = _tree_sum(topo.anc, vJ)
    fe = None if f_ext is None else _shift_wrench(f_ext, o)
    bias = joint_forces(model, S, I, vJ, vel, None, fe)
    return solve_spd(joint_space_inertia(model, S, I), tf - bias)


def solve_spd(A: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Solve A x = b for symmetric positive-definite A (n, n, B), b (n, B) -> x (n, B).

    A few environments: one batched Cholesky factorisation (few large ops: the step
    is bound by per-op overhead there). Many: Gauss-Jordan over the batch-last layout,
    whose elementwise kernels beat batched LAPACK calls on thousands of tiny systems (and
    fuse into a few kernels under torch.compile).
    """
    if A.shape[-1] <= CHOLESKY_MAX_BATCH and not traced():
        L = torch.linalg.cholesky_ex(A.permute(2, 0, 1))[0]   # no raise: a NaN state is the NaN guard's to name
        return torch.cholesky_solve(b.T[..., None], L)[..., 0].T
    return _solve_spd(A, b)


CHOLESKY_MAX_BATCH = 64


def _solve_spd(A: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Solve A x = b for symmetric positive-definite A (n, n, B), b (n, B).

    Gauss-Jordan elimination without pivoting (safe for SPD matrices), vectorised
    over the batch; much faster on a CPU than a batched LAPACK call on thousands
    of tiny systems, and differentiable.
    """
    n = A.shape[0]
    M = torch.cat((A, b[:, None]), 1)                          # augmented (n, n+1, B)
    for k in range(n):
        row = M[k] / M[k, k]
        M = M - M[:, k:k + 1] * row[None]
        M = torch.cat((M[:k], row[None], M[k + 1:]), 0)
    return M[:, n]
