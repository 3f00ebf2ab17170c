"""The soft contact's solve: MuJoCo's regularised elliptic friction cone, in the primal.

Each touching point has three constraint rows, the normal n and two tangents, with the
Jacobian J (3, nv) at the contact point and the reference accelerations a_ref (the normal's
-b vn + k d pen, the tangents' -b vt). The substep's accelerations minimise

    0.5 (a - a0)^T A (a - a0) + sum over points s(J a - a_ref)

with A the matrix of the linearly implicit step (M + h D + h^2 K, the step's own stiff terms:
so the contact sees the drives' damping as the continuous system does) and a0 its solution
without contact. s is MuJoCo's cost of one elliptic contact on jar = J a - a_ref, in the
cone's scaled coordinates N = mu_c jar_n, U = mu jar_t, T = |U|: zero above the cone
(N >= mu_c T: the point lets go), 0.5 D jar^2 per row below its dual (mu_c N + T <= 0: sticking,
the tangent rows impratio times stiffer than the normal), and 0.5 Dm (N - mu_c T)^2 between
(sliding on the cone's surface: the force's friction is mu times its normal part, and a foot
sliding fast keeps a normal force while it rises, which a law with friction bounded by the
normal row's force alone lets go). mu_c = mu / sqrt(impratio), Dm = D / (mu_c^2 (1 + mu_c^2)),
D the normal row's d / ((1 - d) A_w).

The minimum is found by Newton's method with an exact line search, differentiated through
every iteration (the last one, a full Newton step on the converged zones, carries the
solution's own gradient), until the update is at round-off: cold-started from the contact-free
accelerations 5-15 iterations on a quadruped's four feet (MuJoCo, warm-started from the last
step, 5-13), warm-started from the last substep about 3. The count depends on the data, so the
soft contact has no compiled step (a graph holds a fixed count; 16 iterations unrolled did not
finish compiling in 13 minutes, and fewer left a walker metres per second from the converged
step). test/physics/test_soft_contact.py compares steps with MuJoCo's.
"""
from __future__ import annotations

from typing import NamedTuple, Optional, Tuple

import torch

from ..algorithms import solve_spd

#: Ratio of the friction rows' stiffness to the normal row's (MuJoCo's opt.impratio). The
#: stand-in sets the same (plant/mujoco_plant.py): with an elliptic cone it holds a foot loaded
#: sideways below its friction limit to a fraction of a millimetre per second.
IMPRATIO = 100.0
#: The smallest friction coefficient, as MuJoCo's (mjMINMU): a frictionless contact keeps rows.
MIN_MU = 1e-5
#: The solve iterates until the update is below TOLERANCE of the accelerations, at most
#: MAX_ITERATIONS times, each line search until its slope is LINE_SEARCH_TOLERANCE of its start,
#: at most LINE_SEARCH_ITERATIONS times.
MAX_ITERATIONS = 50
TOLERANCE = 1e-12
LINE_SEARCH_ITERATIONS = 10
LINE_SEARCH_TOLERANCE = 0.01


class SoftRows(NamedTuple):
    """The soft contact's constraint rows, points flattened (P = Gs S) and batch-last."""

    J: torch.Tensor        # (P, 3, nv, B): rows normal, tangent 1, tangent 2 at each contact point
    aref: torch.Tensor     # (P, 3, B) reference accelerations
    D: torch.Tensor        # (P, B) the normal row's 1 / R; zero where the point does not touch
    mu: torch.Tensor       # () friction coefficient (at least MIN_MU)
    frame: torch.Tensor    # (3, 3): rows n, t1, t2 in world axes
    x: torch.Tensor        # (P, 3, B) contact points (MuJoCo's: halfway through the penetration), at o
    points: Optional[torch.Tensor] = None   # (P,) long: the rows' points among all (None: all, in order)


def cone(rows: SoftRows, jar: torch.Tensor, hessian: bool = True) -> Tuple[torch.Tensor, torch.Tensor]:
    """Return the forces f (P, 3, B) = -ds/djar and the cost's Hessian (P, 3, 3, B) at jar (P, 3, B)."""
    mu = rows.mu
    muc = mu / IMPRATIO ** 0.5
    D = rows.D
    N = muc * jar[:, 0]
    U = mu * jar[:, 1:]
    T2 = (U * U).sum(1)
    moving = T2 > 0
    T = torch.sqrt(torch.where(moving, T2, torch.ones_like(T2))) * moving.to(T2.dtype)
    top = (N >= muc * T) | (D <= 0)                 # above the cone, or not touching: no force
    bottom = (~top) & (muc * N + T <= 0)
    middle = (~top) & (~bottom)                     # T > 0 there
    # Every expression a where() leaves out is kept finite, so that no NaN reaches a gradient.
    Ts = torch.where(middle, T, torch.ones_like(T))
    scale = torch.stack((torch.ones_like(D), IMPRATIO * torch.ones_like(D), IMPRATIO * torch.ones_like(D)), 1)
    Drow = D[:, None] * scale                                                       # (P, 3, B)
    Dm = D / (muc * muc * (1.0 + muc * muc))
    NmT = N - muc * T
    fn = -Dm * NmT * muc
    ft = -(fn / Ts)[:, None] * U * mu
    f_mid = torch.cat((fn[:, None], ft), 1)
    f = torch.where(bottom[:, None], -Drow * jar, torch.where(middle[:, None], f_mid, torch.zeros_like(jar)))
    if not hessian:
        return f, jar
    eye3 = torch.eye(3, dtype=jar.dtype, device=jar.device)[None, :, :, None]
    H_bottom = eye3 * Drow[:, None]                                                 # diag(Drow)
    # The middle zone's Hessian in scaled coordinates, then pre- and post-multiplied by diag(mu_c, mu, mu).
    c = (-muc / Ts)[:, None] * U                                                    # (P, 2, B)
    tt = (muc * N / (Ts * Ts * Ts))[:, None, None] * U[:, :, None] * U[:, None]     # (P, 2, 2, B)
    tt = tt + (muc * muc - muc * N / Ts)[:, None, None] * torch.eye(2, dtype=jar.dtype, device=jar.device)[
        None, :, :, None]
    first = torch.cat((torch.ones_like(N)[:, None], c), 1)                         # (P, 3, B)
    lower = torch.cat((c[:, :, None], tt), 2)                                       # (P, 2, 3, B)
    H0 = torch.cat((first[:, None], lower), 1)                                      # (P, 3, 3, B)
    s = torch.stack((muc * torch.ones_like(N), mu * torch.ones_like(N), mu * torch.ones_like(N)), 1)
    H_mid = H0 * (s[:, :, None] * s[:, None]) * Dm[:, None, None]
    H = torch.where(bottom[:, None, None], H_bottom, torch.where(middle[:, None, None], H_mid, torch.zeros_like(H0)))
    return f, H


def _rows_times(J: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
    """J a: (P, 3, nv, B), (nv, B) -> (P, 3, B)."""
    return torch.einsum("pkvb,vb->pkb", J, a)


def _transpose_times(J: torch.Tensor, f: torch.Tensor) -> torch.Tensor:
    """J^T f: (P, 3, nv, B), (P, 3, B) -> (nv, B)."""
    return torch.einsum("pkvb,pkb->vb", J, f)


def forces(rows: SoftRows, a: torch.Tensor) -> torch.Tensor:
    """Return the contact forces (P, 3, B) of the rows at accelerations a (nv, B)."""
    return cone(rows, _rows_times(rows.J, a) - rows.aref, hessian=False)[0]


def solve(A: torch.Tensor, rhs: torch.Tensor, rows: SoftRows, warm: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Return the accelerations a (nv, B) minimising the module doc's cost, A (nv, nv, B), rhs = A a0 (nv, B).

    The iterations start at ``warm`` (nv, B; no gradient flows into it) when given (the previous
    substep's accelerations, as MuJoCo warm-starts its solver), else at a0.
    """
    J, aref = rows.J, rows.aref
    if J.shape[0] == 0:
        return solve_spd(A, rhs)
    a = solve_spd(A, rhs) if warm is None else warm.detach()
    for _ in range(MAX_ITERATIONS):
        jar = _rows_times(J, a) - aref
        f, H = cone(rows, jar)
        g = (A * a[None]).sum(1) - rhs - _transpose_times(J, f)                    # the cost's gradient
        HJ = torch.einsum("pklb,plvb->pkvb", H, J)
        JHJ = torch.einsum("pkvb,pkwb->vwb", J, HJ)
        da = -solve_spd(A + JHJ, g)
        # Exact line search: Newton's method on the convex, piecewise quadratic cost along da.
        Jda = _rows_times(J, da)
        Ada = (A * da[None]).sum(1)
        slope0 = (da * g).sum(0) + (Jda * f).sum((0, 1))                          # da^T (A a - rhs)
        curv0 = (da * Ada).sum(0)
        alpha = _line_search(rows, jar, Jda, slope0, curv0)
        step = alpha[None] * da
        a = a + step
        if float(step.detach().abs().max()) <= TOLERANCE * (1.0 + float(a.detach().abs().max())):
            break
    return a


def _line_search(rows: SoftRows, jar: torch.Tensor, Jda: torch.Tensor, slope0: torch.Tensor,
                 curv0: torch.Tensor) -> torch.Tensor:
    """Return the step (B,) along da minimising the cost: safeguarded Newton on its slope.

    The slope phi'(alpha) = slope0 + alpha curv0 - Jda . f(alpha) rises with alpha (the cost is
    convex) and is negative at 0. Starting at the full step 1, a Newton step that leaves the bracket
    of the slope's sign change is replaced by bisection: a contact sliding at a small speed bends
    the slope sharply, where plain Newton steps cycle. Where the slope is still negative at 1 the
    step stays 1 (the next iteration goes on from there); at a converged solve the Newton step is 1,
    so the last iteration is a full Newton step and the gradient through it is the solution's.
    It stops once the slope is LINE_SEARCH_TOLERANCE of its value at 0 everywhere (as MuJoCo's
    line search): the outer iterations converge all the same.
    """
    one = torch.ones_like(curv0)
    alpha, lo, hi = one, torch.zeros_like(curv0), one
    beyond = torch.zeros_like(curv0, dtype=torch.bool)
    for i in range(LINE_SEARCH_ITERATIONS):
        fa, Ha = cone(rows, jar + alpha[None, None] * Jda)
        d1 = slope0 + alpha * curv0 - (Jda * fa).sum((0, 1))
        d2 = curv0 + torch.einsum("pkb,pklb,plb->b", Jda, Ha, Jda)
        if bool((d1.detach().abs() <= LINE_SEARCH_TOLERANCE * slope0.detach().abs()).all()):
            break
        if i == 0:
            beyond = d1 < 0
        lo = torch.where(d1 < 0, alpha, lo)
        hi = torch.where(d1 > 0, alpha, hi)
        curved = d2 > 0
        newton = alpha - torch.where(curved, d1 / torch.where(curved, d2, one), torch.zeros_like(d1))
        inside = curved & (newton >= lo) & (newton <= hi)
        alpha = torch.where(inside, newton, 0.5 * (lo + hi))
    return torch.where(beyond, one, alpha)
