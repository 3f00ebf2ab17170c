"""The kinematics record: everything about the bodies' placements and motion that a step needs.

It is computed once per (sub)step and shared by the stages, as Pinocchio's ``Data`` after
``forwardKinematics``.

Internally the batch is the last dimension (see :mod:`.algorithms`): ``R`` is
(nb, 3, 3, B). Positions are relative to the point ``o`` (the floating base's
position, or the world origin for a fixed base) and spatial quantities are in
world-aligned axes at ``o``, so no precision is lost as a robot travels.

    kin = kinematics(model, q, v)          # batch-first inputs (..., nq), (..., nv)
    I = kin.inertia(model)                 # (nb, 6, 6, B) spatial inertias at kin.o
"""
from __future__ import annotations

from typing import NamedTuple, Optional, Tuple

import torch

from .algorithms import _body_placements, _body_sum, _flatten, _frame_origin, _full_q, _full_v, _motion_subspaces, \
    _mm, _mv, _spatial_inertia, _topo, _tree_sum, inertials
from .model import Model


class Kinematics(NamedTuple):
    """Batch-last kinematics of one state (B environments).

    R (nb, 3, 3, B): body orientations in the world; p (nb, 3, B): body origins
    relative to ``o`` (1, 3, B); S (nv_full, 6, B): every dof's motion subspace at ``o``
    (the full tree's: mimic joints included);
    vJ (nb, 6, B): the joints' twists; vel (nb, 6, B): the bodies' twists at ``o``
    (``[velocity of the body point at o; angular velocity]``; zero without v);
    batch: the leading batch shape of the inputs.
    """

    R: torch.Tensor
    p: torch.Tensor
    o: torch.Tensor
    S: torch.Tensor
    vJ: torch.Tensor
    vel: torch.Tensor
    batch: Tuple[int, ...]

    # ------------------------------------------------------------ derived
    def inertia(self, model: Model) -> torch.Tensor:
        """Spatial inertia of every body (nb, 6, 6, B) in world axes about ``o``."""
        com, inertia = inertials(model)
        c_w = self.p + _mv(self.R, com)
        I_c = _mm(_mm(self.R, inertia), self.R.transpose(1, 2))
        return _spatial_inertia(model.mass, c_w, I_c)


def kinematics_record(model: Model, qf: torch.Tensor, vf: Optional[torch.Tensor] = None,
                      batch: Tuple[int, ...] = ()) -> Kinematics:
    """Return the record for batch-last q (nq, B) and v (nv, B) (v None: at rest).

    With mimic joints q and v are the reduced coordinates; the record is of the full tree (``S``
    has one column per moving joint, mimic joints included: nv_full).
    """
    topo = _topo(model)
    qf, vf = _full_q(model, qf), _full_v(model, vf)
    R, p = _body_placements(model, qf, relative=True)
    o = _frame_origin(model, qf)
    S = _motion_subspaces(model, R, p)
    if vf is None:
        vJ = torch.zeros(model.nb, 6, qf.shape[-1], dtype=qf.dtype, device=qf.device)
        vel = vJ
    else:
        vJ = _body_sum(topo, S * vf[:, None], model.nb)
        vel = _tree_sum(topo.anc, vJ)
    return Kinematics(R=R, p=p, o=o, S=S, vJ=vJ, vel=vel, batch=tuple(batch))


def kinematics(model: Model, q: torch.Tensor, v: Optional[torch.Tensor] = None) -> Kinematics:
    """Return the kinematics record of q (..., nq) and, optionally, v (..., nv)."""
    if v is None:
        batch, (qf,) = _flatten(model, q)
        return kinematics_record(model, qf, None, batch)
    batch, (qf, vf) = _flatten(model, q, v)
    return kinematics_record(model, qf, vf, batch)
