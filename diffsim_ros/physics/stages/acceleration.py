"""Acceleration: the equations of motion M(q) qdd + b(q, v) = tau + J^T f from one kinematics record.

The equations are solved as

    (M + h (D + J^T C J) + h^2 (K + J^T E J)) qdd = tau - b + J^T (f - h E J v) - h K v

with D = -d tau/d qd and K = -d tau/d q of the stiff joint-space terms (damping, the
friction slope, joint limits, PD gains: diagonal), C the contact's damping (friction and
the normal force's) and E its normal stiffness (per-body 6x6 blocks, mapped to joint space
by the composite-rigid-body recursion with the inertias; J v are the bodies' twists): a
linearly implicit Euler step (h = 0 gives the explicit accelerations). The bias b
comes from one vectorised RNEA pass and M from the composite-rigid-body recursion over
the same world-frame quantities, so one substep computes the placements once.
"""
from __future__ import annotations

from typing import Callable, Optional, Tuple, cast

import torch

from ..algorithms import joint_forces, joint_space_inertia, solve_spd
from ..kinematics import Kinematics
from ..spatial import traced
from ..system import System

#: ``refine(qdd) -> (D, K)`` of :func:`acceleration`.
Refine = Callable[[torch.Tensor], Tuple[torch.Tensor, torch.Tensor]]
#: ``constraint(A, rhs) -> qdd`` of :func:`acceleration`.
Constraint = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def acceleration(sys: System, kin: Kinematics, tau: torch.Tensor, f_ext: Optional[torch.Tensor] = None,
                 h: float = 0.0, D: Optional[torch.Tensor] = None, K: Optional[torch.Tensor] = None,
                 vf: Optional[torch.Tensor] = None, damping: Optional[torch.Tensor] = None,
                 refine: Optional[Refine] = None,
                 iterations: int = 0, normal_blocks: Optional[torch.Tensor] = None,
                 constraint: Optional[Constraint] = None) -> torch.Tensor:
    """Return qdd (nv, B) from batch-last tau (nv, B) and body wrenches f_ext (nb, 6, B) about o.

    For the implicit step it also takes h, the diagonals D and K (nv, B), v (nv, B), the
    friction's damping blocks and the contact's normal blocks W (nb, 6, 6, B; damping c W,
    stiffness E = 2 k W). ``refine(qdd) -> (D, K)``: new diagonals from a solution, applied
    ``iterations`` times (the same M and bias; one more solve each). ``constraint(A, rhs) -> qdd``
    replaces the linear solve A qdd = rhs (the soft contact's, :func:`.cone.solve`).
    """
    m = sys.model
    I = kin.inertia(m)
    blocks = I if damping is None else I.add(damping, alpha=h)
    compiled = traced()
    if normal_blocks is not None:
        k2 = 2.0 * sys.contact_stiffness
        blocks = blocks.addcmul(normal_blocks, h * sys.contact_damping + h * h * k2)
        if not compiled:
            # -h E (J v): the bodies' twists through the blocks, a wrench on each body (f_ext: the contact's).
            f_ext = cast(torch.Tensor, f_ext).addcmul((normal_blocks * kin.vel[:, None]).sum(2), -h * k2)
    rhs0 = tau - joint_forces(m, kin.S, I, kin.vJ, kin.vel, None, f_ext)
    A0 = joint_space_inertia(m, kin.S, blocks)
    if normal_blocks is not None and compiled:
        # The same -h J^T E J v through one more composite pass: Inductor (torch 2.13, CPU)
        # compiled the gradient of the wrench form above wrong (test_compiled compares the two).
        rhs0 = rhs0 - (h * k2) * (joint_space_inertia(m, kin.S, normal_blocks) * cast(torch.Tensor, vf)[None]).sum(1)

    def solve(D, K):
        A, rhs = A0, rhs0
        if D is not None or K is not None:
            diag = 0.0
            if D is not None:
                diag = h * D
            if K is not None:
                diag = diag + (h * h) * K
                rhs = rhs - h * K * vf
            eye = torch.eye(m.nv, dtype=A.dtype, device=A.device)[:, :, None]
            A = A + eye * diag[None]
        return solve_spd(A, rhs) if constraint is None else constraint(A, rhs)
    qdd = solve(D, K)
    for _ in range(iterations if refine is not None else 0):
        qdd = solve(*cast(Refine, refine)(qdd))                   # iterations only with a refine
    return qdd
