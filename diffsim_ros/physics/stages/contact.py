"""Contact: the seed paper's smooth penalty between the contact points and the ground plane.

The same penalty acts between sphere points of different bodies: lambda_n = k max(0, -gap)^2
with damping, and regularised Coulomb friction F_t = -C v_t, C = mu lambda / sqrt(|v_t|^2 + eps^2).

For the linearly implicit integrator the friction's damping C is also returned per
body as a symmetric 6x6 block (world axes at o): a point x with tangential projector
P contributes C [1; [x]x] P [1, -[x]x]; the acceleration stage maps the blocks to
joint space with the composite-rigid-body recursion, as it does the inertias. That
keeps static friction stable at large steps (MuJoCo's Euler integrator treats joint
damping the same way), with no per-point Jacobian and no data-dependent selection.
With ``normal`` the normal force's own slopes join them: its damping c pen and its
stiffness 2 k pen (where the force is on) along the normal n. Both are pen times a
constant, so one set of blocks serves both: W, the sum over a body's touching points of
pen [n; x x n][n; x x n]^T (m); the normal damping is c W and the stiffness 2 k W.
Explicitly, a foot of a few tens of grams on the quadratic penalty rings at 2 ms
substeps (h c pen / m > 2), and the step's Jacobian grows by an order of magnitude per
control step, so gradients through a 20-step window overflow.

With ``simulator.contact_model: soft`` the ground takes no penalty: its touching points become
MuJoCo's constraint rows (:func:`_soft_rows`), which the acceleration stage's solve minimises
over (:mod:`.cone`); :func:`soft_forces` then records the forces it applied.

Batch-last layout (see :mod:`..kinematics`): points (P, 3, B), wrenches (nb, 6, B).
"""
from __future__ import annotations

from typing import NamedTuple, Optional, cast

import torch

from .. import laws
from ..algorithms import _cross, _mm, _mv, _skew, _topo, cached_on
from ..kinematics import Kinematics
from ..spatial import traced
from ..system import System
from .cone import MIN_MU, SoftRows, forces


class Contact(NamedTuple):
    wrench: torch.Tensor              # (nb, 6, B) per body, world axes about o
    damping: Optional[torch.Tensor]   # (nb, 6, 6, B) friction damping blocks, or None
    groups: Optional[torch.Tensor]    # (Gs,) long: the point groups evaluated (None: all)
    gap: Optional[torch.Tensor]       # (Gs, S, B) m, negative in penetration (None: no group evaluated)
    normal: Optional[torch.Tensor]    # (Gs, S, B) N, ground normal force (soft contact: after soft_forces)
    normal_blocks: Optional[torch.Tensor] = None   # (nb, 6, 6, B) W: the normal force's damping c W, stiffness 2 k W
    soft: Optional[SoftRows] = None   # soft contact: its constraint rows (the solve applies its forces)

    def flat(self, cs, x: Optional[torch.Tensor], fill: float) -> torch.Tensor:
        """Flatten grouped per-point values (Gs, S, B) to (P, B) in collision order.

        Points of groups not evaluated get ``fill``.
        """
        G, S = cs.group_valid.shape
        B = self.wrench.shape[-1]
        full = torch.full((G, S, B), fill, dtype=self.wrench.dtype, device=self.wrench.device)
        if x is not None:
            full = full.index_copy(0, self.groups, x) if self.groups is not None else x
        return full.reshape(G * S, B)[cs.flat_index]


def _to_bodies(nb: int, gb: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """Per-group (Gs, k, B) -> per-body (nb, k, B) sums, as one product with a one-hot matrix.

    An index_add here, in one graph with the joint-space scatters, was miscompiled by Inductor on
    the CPU, torch 2.13.
    """
    # A comparison rather than one_hot, which reads the indices' range back to the host (a
    # synchronisation eagerly; a data-dependent read that make_fx's tracing refuses).
    onehot = (gb[:, None] == torch.arange(nb, device=gb.device)).to(x.dtype)       # (Gs, nb)
    return (onehot.T @ x.reshape(x.shape[0], -1)).reshape((nb,) + x.shape[1:])


def _near_groups(sys: System, kin: Kinematics) -> torch.Tensor:
    """(G,) bool: groups whose bounding sphere reaches the ground in some environment."""
    cs = sys.contact
    gb = cs.group_body
    c = _mv(kin.R[gb], cs.group_center[..., None]) + kin.p[gb] + kin.o              # (G, 3, B)
    height = (c * sys.ground_normal[:, None]).sum(1) - sys.ground_height            # (G, B)
    return (height < cs.group_reach[:, None]).any(-1)


def _picked(cs, groups: torch.Tensor):
    """Return the contact set's group tensors (body, local points, radii, valid) at ``groups``.

    ``groups`` is a CPU index tensor. The tensors are kept per selection on the (frozen) contact
    set: a robot's set of groups near the ground changes rarely, so the gathers are made once per
    set, not once per substep.
    """
    cache = cs.__dict__.setdefault("_picked", {})
    key = tuple(groups.tolist())
    hit = cache.get(key)
    if hit is None:
        if len(cache) >= 256:
            cache.clear()
        with torch.inference_mode(False):      # never inference tensors, whatever mode the first caller runs in
            index = torch.tensor(key, dtype=torch.long, device=groups.device)
            hit = cache[key] = tuple(x.index_select(0, index) for x in
                                     (cs.group_body, cs.group_local, cs.group_radius, cs.group_valid,
                                      cs.group_weight))
    return hit


def contact(sys: System, kin: Kinematics, implicit_friction: bool = False, select: Optional[bool] = None,
            normal: bool = False) -> Contact:
    """Contact wrenches from the kinematics record, with blocks for the linearly implicit step.

    The blocks are the friction's damping blocks (``implicit_friction``) and the normal force's
    blocks W (``normal``; see the module doc). ``select`` (default: on the CPU, outside
    torch.compile): evaluate only the point groups whose bounding sphere reaches the ground
    in some environment (exact: the others have no penetration, so no force and no
    gradient), at the price of one host synchronisation. The soft contact returns its rows
    (``soft``) and no ground force: the solve applies it (:mod:`.cone`, then :func:`soft_forces`).
    """
    m, cfg, cs = sys.model, sys.config, sys.contact
    R, o, tw = kin.R, kin.o, kin.vel
    B = R.shape[-1]
    dt, dev = R.dtype, R.device
    pairs = cs.pairs.numel() > 0
    if cs.n == 0 or not (cfg.ground or pairs):
        return Contact(torch.zeros(m.nb, 6, B, dtype=dt, device=dev), None, None, None, None)
    if select is None:
        select = dev.type == "cpu" and not traced()
    groups = None
    gb, local, radius, valid, weight = (cs.group_body, cs.group_local, cs.group_radius, cs.group_valid,
                                        cs.group_weight)
    if select and cfg.ground and not pairs:
        near = _near_groups(sys, kin)
        if not bool(near.any()):                                                   # nothing can touch
            return Contact(torch.zeros(m.nb, 6, B, dtype=dt, device=dev), None, near.nonzero()[:, 0], None, None)
        if not bool(near.all()):
            groups = near.nonzero()[:, 0]
            gb, local, radius, valid, weight = _picked(cs, groups)
    Gs, S = valid.shape
    Rg, twg = R[gb], tw[gb]
    # Points of each group at once: x[g, s] = R_g local[g, s] + p_g, as one batched product.
    x = (local @ Rg.permute(0, 2, 1, 3).reshape(Gs, 3, 3 * B)).reshape(Gs, S, 3, B) + kin.p[gb][:, None]
    n = sys.ground_normal[:, None]                                                  # (3, 1)
    r = radius[..., None]                                                           # (Gs, S, 1)
    xc, gap, lam, damping, blocks, soft = x, None, None, None, None, None
    F = None if cfg.ground else torch.zeros_like(x)
    if cfg.ground:
        xc = x - r[..., None] * n                                                   # contact point on the surface
        gap = ((x + o) * n).sum(2) - sys.ground_height - r                          # (Gs, S, B)
        pen = torch.relu(-gap)
        if cfg.contact_model == "soft":
            # The solve applies the ground's forces (stages/cone.py); here only its rows.
            soft = _soft_rows(sys, kin, gb, weight, gap, pen, twg, xc, valid)
            F = torch.zeros_like(x)
        else:
            xd = twg[:, None, 0:3] + _cross(twg[:, None, 3:6], xc)                 # the contact point's velocity
            vn = (xd * n).sum(2)
            lam = torch.relu(sys.contact_stiffness * pen ** 2 - sys.contact_damping * pen * vn) * valid[..., None]
            vt = xd - vn[:, :, None] * n
            eps = sys.friction_smoothing
            slip = torch.sqrt((vt ** 2).sum(2) + eps * eps)   # (inductor cannot lower pow of a folded constant)
            C = sys.friction * lam / slip                                           # (Gs, S, B)
            F = lam[:, :, None] * n - C[:, :, None] * vt
            if normal or implicit_friction:
                # The normal slopes are both pen where the force is on, times c (-d lambda / d vn)
                # and 2 k (the spring's -d lambda / d gap): one set of blocks serves both.
                w = pen * (lam > 0).to(lam.dtype) if normal else None
                damping, blocks = _point_blocks(m.nb, gb, C if implicit_friction else None, xc, n, w)
    F = cast(torch.Tensor, F)                                                      # set on either branch
    wrench = torch.cat((F.sum(1), _cross(xc, F).sum(1)), 1)                        # (Gs, 6, B)
    wrench_b = _to_bodies(m.nb, gb, wrench)
    if pairs:
        wrench_b = wrench_b + _self_collision(sys, kin, x, radius)
    return Contact(wrench_b, damping, groups, gap, lam, blocks, soft)


def _soft_rows(sys: System, kin: Kinematics, gb: torch.Tensor, weight: torch.Tensor, gap: torch.Tensor,
               pen: torch.Tensor, tw: torch.Tensor, xc: torch.Tensor, valid: torch.Tensor) -> SoftRows:
    """Return the soft contact's constraint rows (:class:`.cone.SoftRows`) of the points (Gs, S).

    MuJoCo's regularised constraint: the force pulls each row's acceleration J a towards its
    reference a_ref (the normal's -b vn + k d pen, the tangents' -b vt; k = 1 / (w^2 tc^2 zeta^2),
    b = 2 / (w tc), w the impedance's end value, d the impedance at this penetration) with
    stiffness D = d / ((1 - d) A), A the touching link's inverse weight (MuJoCo's R = (1 - d) A / d);
    the rows sit at MuJoCo's contact point, halfway through the penetration.
    """
    m, cfg = sys.model, sys.config
    n = sys.ground_normal
    d1 = cfg.contact_impedance[1]
    tc, zeta = sys.contact_time_constant, sys.contact_damping_ratio
    imp = laws.impedance(torch, pen, cfg.contact_impedance)
    k = 1.0 / (d1 * d1 * tc * tc * zeta * zeta)
    b = 2.0 / (d1 * tc)
    on = (gap < 0).to(gap.dtype) * valid[..., None]
    D = imp / ((1.0 - imp) * weight.clamp_min(1e-15)[..., None]) * on
    frame = cached_on(sys, "_ground_frame", lambda: _frame(n))                    # (3, 3) rows n, t1, t2
    x = xc + 0.5 * pen[:, :, None] * n[:, None]
    xd = tw[:, None, 0:3] + _cross(tw[:, None, 3:6], x)                            # the point's velocity
    vel = (xd[:, :, None] * frame[None, None, :, :, None]).sum(3)                   # (Gs, S, 3, B)
    aref = -b * vel
    aref = torch.cat(((aref[:, :, 0] + k * imp * pen)[:, :, None], aref[:, :, 1:]), 2)
    if m.floating_base:
        # MuJoCo's rows hold J qacc with its free joint's linear velocity in the world, ours in the
        # base frame: the same point acceleration differs by w x v of the base origin in J qdd.
        w0 = kin.vel[0, 3:6]
        c = _cross(w0, kin.vel[0, 0:3] + _cross(w0, kin.p[0]))                     # (3, B)
        aref = aref - (frame[:, :, None] * c[None]).sum(1)[None, None]
    # Row r of a point: the wrench direction [d_r; x x d_r] against each dof's motion subspace,
    # for the dofs that move the point's link.
    d = frame[None, None, :, :, None].expand(x.shape[0], x.shape[1], 3, 3, x.shape[-1])
    w = torch.cat((d, _cross(x[:, :, None].expand_as(d), d)), 3)                    # (Gs, S, 3, 6, B)
    topo = _topo(m)
    moves = topo.anc[gb] @ topo.dof_body.T                                          # (Gs, nv_full)
    J = (w[:, :, :, None] * kin.S[None, None, None]).sum(4) * moves[:, None, None, :, None]
    if m.mimic_joints:
        J = (J.unsqueeze(4) * cast(torch.Tensor, m.mimic_G)[:, :, None]).sum(3)     # J G: the reduced dofs'
    Gs, S = gap.shape[0], gap.shape[1]
    rows = SoftRows(J=J.reshape((Gs * S,) + J.shape[2:]), aref=aref.reshape(Gs * S, 3, -1), D=D.reshape(Gs * S, -1),
                    mu=sys.friction.clamp_min(MIN_MU), frame=frame, x=x.reshape(Gs * S, 3, -1))
    if D.device.type == "cpu" and not traced():
        # Eagerly, only the points touching in some environment (one host synchronisation): the
        # solve's cost grows with its rows, and most of a walker's points are in the air.
        index = (rows.D > 0).any(-1).nonzero()[:, 0]
        if index.numel() < Gs * S:
            rows = rows._replace(J=rows.J[index], aref=rows.aref[index], D=rows.D[index], x=rows.x[index],
                                 points=index)
    return rows


def _frame(n: torch.Tensor) -> torch.Tensor:
    """Rows n, t1, t2 (3, 3): the ground normal and two tangents (the elliptic cone is isotropic)."""
    e = torch.zeros_like(n)
    e[int(torch.argmin(n.abs()))] = 1.0
    t1 = torch.linalg.cross(n, e)
    t1 = t1 / torch.linalg.vector_norm(t1)
    return torch.stack((n, t1, torch.linalg.cross(n, t1)))


def soft_forces(sys: System, con: Contact, qdd: torch.Tensor) -> Contact:
    """Return ``con`` with the soft contact's solved ground forces at accelerations qdd (nv, B).

    Its wrench (per body) and normal forces (Gs, S, B) are then the ground's as the solve
    applied them (for the tasks' contact tests and the Data record), plus the self-collision
    penalty's wrench it already held.
    """
    rows = cast(SoftRows, con.soft)
    f = forces(rows, qdd)                                                           # (P, 3, B)
    F = (f[:, :, None] * rows.frame[None, :, :, None]).sum(1)                       # (P, 3, B) world
    gb = sys.contact.group_body if con.groups is None else sys.contact.group_body[con.groups]
    Gs = gb.shape[0]
    S = cast(torch.Tensor, con.gap).shape[1]
    wrench = torch.cat((F, _cross(rows.x, F)), 1)                                   # (P, 6, B)
    normal = f[:, 0]
    if rows.points is not None:                                                      # back to every point
        wrench = torch.zeros((Gs * S,) + wrench.shape[1:], dtype=F.dtype, device=F.device).index_copy(
            0, rows.points, wrench)
        normal = torch.zeros((Gs * S,) + normal.shape[1:], dtype=F.dtype, device=F.device).index_copy(
            0, rows.points, normal)
    return con._replace(wrench=con.wrench + _to_bodies(sys.model.nb, gb, wrench.reshape(Gs, S, 6, -1).sum(1)),
                        normal=normal.reshape(Gs, S, -1))


def _self_collision(sys: System, kin: Kinematics, x: torch.Tensor, radius: torch.Tensor) -> torch.Tensor:
    """Penalty between sphere points of different bodies (every group evaluated)."""
    cs, m = sys.contact, sys.model
    G, S = radius.shape
    B = x.shape[-1]
    xf = x.reshape(G * S, 3, B)[cs.flat_index]                                      # (P, 3, B)
    r = cs.radius[:, None]
    tw = kin.vel[cs.body]
    i, j = cs.pairs[:, 0], cs.pairs[:, 1]
    d = xf[i] - xf[j]
    dist = torch.sqrt((d ** 2).sum(1) + 1e-12)
    nij = d / dist[:, None]
    pen = torch.relu(r[i] + r[j] - dist)
    xdc = tw[:, 0:3] + _cross(tw[:, 3:6], xf)                                       # sphere-centre velocities
    vrel = ((xdc[i] - xdc[j]) * nij).sum(1)
    lam = torch.relu(sys.contact_stiffness * pen ** 2 - sys.contact_damping * pen * vrel)
    Fi = lam[:, None] * nij
    xm = xf[j] + nij * r[j][..., None]
    wi = torch.cat((Fi, _cross(xm, Fi)), 1)
    per_point = torch.zeros(cs.n, 6, B, dtype=x.dtype, device=x.device).index_add(0, i, wi).index_add(0, j, -wi)
    return torch.zeros(m.nb, 6, B, dtype=x.dtype, device=x.device).index_add(0, cs.body, per_point)


def _point_blocks(nb: int, gb: torch.Tensor, C: Optional[torch.Tensor], x: torch.Tensor, n: torch.Tensor,
                  w: Optional[torch.Tensor] = None):
    """Per-body sums (nb, 6, 6, B) of the points' implicit blocks.

    The inputs are C and w (Gs, S, B) and x (Gs, S, 3, B), grouped by body ``gb``. The blocks are
    the friction's damping blocks C [1; [x]x] P [1, -[x]x] with P = 1 - n n^T (None without C),
    and the normal blocks w [n; m][n; m]^T with m = x x n (None without w).

    The friction blocks are C P, -P [C x]x, [C x]x P and -C (x x^T - |x|^2 1 + m m^T);
    the moments C, C x, C (x x^T + m m^T), C |x|^2 and, for the normal blocks, w, w m and
    w m m^T are summed over each group's points first. The 6x6 blocks are then assembled
    per group and summed into the bodies when there are fewer groups than bodies (a robot
    with a few feet near the ground), else the moments are summed into the bodies first:
    one product into the bodies either way.
    """
    mm = _cross(x, n.expand_as(x))                                                  # (Gs, S, 3, B)
    parts = []
    if C is not None:
        Cx = C[:, :, None] * x
        Cm = C[:, :, None] * mm
        outer = (Cx[:, :, :, None] * x[:, :, None] + Cm[:, :, :, None] * mm[:, :, None]).sum(1)   # (Gs, 3, 3, B)
        parts += [C.sum(1)[:, None], Cx.sum(1), outer.flatten(1, 2), (Cx * x).sum((1, 2))[:, None]]
    if w is not None:
        wm = w[:, :, None] * mm
        parts += [w.sum(1)[:, None], wm.sum(1), (wm[:, :, :, None] * mm[:, :, None]).sum(1).flatten(1, 2)]
    moments = torch.cat(parts, 1)                                                   # (Gs, 14 + 13, B)
    if gb.shape[0] >= nb:
        return _assemble(_to_bodies(nb, gb, moments), C is not None, w is not None, n)
    friction, normal = _assemble(moments, C is not None, w is not None, n)
    blocks = [b for b in (friction, normal) if b is not None]
    summed = _to_bodies(nb, gb, torch.cat(blocks, 1) if len(blocks) > 1 else blocks[0])
    if friction is not None and normal is not None:
        return summed[:, 0:6], summed[:, 6:12]
    return (summed, None) if friction is not None else (None, summed)


def _assemble(s: torch.Tensor, friction: bool, normal: bool, n: torch.Tensor):
    """Assemble the 6x6 blocks (rows, 6, 6, B) from the moments (rows, k, B) of :func:`_point_blocks`."""
    rows, B = s.shape[0], s.shape[-1]
    eye = torch.eye(3, dtype=s.dtype, device=s.device)[None, :, :, None]
    nn = (n[:, None] * n[None, :])[None]                                            # (1, 3, 3, 1)
    fb = nb_ = None
    if friction:
        c, cx, xxmm, xx = s[:, 0], s[:, 1:4], s[:, 4:13].unflatten(1, (3, 3)), s[:, 13]
        Pm = (eye - nn).expand(rows, 3, 3, B)                                       # tangential projector
        X = _skew(cx)                                                               # [sum C x]x
        top = torch.cat((c[:, None, None] * Pm, -_mm(Pm, X)), 2)
        bottom = torch.cat((_mm(X, Pm), -(xxmm - xx[:, None, None] * eye)), 2)
        fb = torch.cat((top, bottom), 1)
    if normal:
        k = 14 if friction else 0
        ws, wm, wmm = s[:, k], s[:, k + 1:k + 4], s[:, k + 4:k + 13].unflatten(1, (3, 3))
        nw = n[None, :, :, None] * wm[:, None]                                      # n (w m)^T: (rows, 3, 3, B)
        nb_ = torch.cat((torch.cat((ws[:, None, None] * nn, nw), 2), torch.cat((nw.transpose(1, 2), wmm), 2)), 1)
    return fb, nb_
