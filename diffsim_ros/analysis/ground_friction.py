"""The ground's friction coefficient of a legged robot from its bag, from the feet's impulses.

Over one control interval the equations of motion, integrated, read (analysis/contact_free.py)

    s (M(q) dv + b(q, v) dt) - F(q, v, u) dt = J_c(q)^T Lambda,

so with the mass scale s known (the contact-free estimate, or 1) the left side is the ground's
generalised impulse. With each touching foot taken as one contact point (the centroid of its
touching collision points) the feet's impulses Lambda (3 per foot, at most 12 unknowns against
nv equations) follow by least squares, whatever the ground's law. Coulomb's law bounds the
tangential impulse of each foot by mu times its normal impulse, with equality while the foot
slides; so a foot that slides (its material point at the contact moving along the ground faster
than ``slide_speed``, against its tangential impulse) over the whole interval gives mu as the
ratio |Lambda_t| / Lambda_n. The estimate is the median ratio over the sliding feet; with too few
of them the coefficient is not identified and the largest ratio of any loaded foot is a lower
bound (the floor holds at least that much). The simulator's contact law (stiffness, damping,
regularised friction) is not used, so a ground it models poorly (MuJoCo's soft constraints, a
real floor) does not bias the estimate.

What it needs: a bag in which some feet slide (a walker on a slippery floor slides in its
push-offs; on a grippy floor a walking gait stays inside the cone, and the verdict says the
coefficient is at least the lower bound), states at the control rate, no actuator lag (F is the
actuators' force at the recorded command).
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Dict, List, Optional

import numpy as np
import torch

from .. import physics
from ..physics.kinematics import kinematics_record
from .bag import BagData
from .contact_free import Verdict, bag_intervals, contact_free_mass, interval_equations, write_estimate
from .errors import AnalysisError
from .predict import SimSetup

LOADED = 0.1              # a foot counts as loaded above this fraction of the median normal impulse
BOUND_LOAD = 0.3          # ... and in the lower bound above this one (a lightly loaded foot's ratio is noisy)
MIN_SLIDING = 5            # foot-intervals sliding at the cone needed in each half of the bag
BAND = 0.1                 # a sliding foot counts at the cone within this fraction of the ratios' 99th percentile
MAX_DISAGREEMENT = 0.05    # relative gap between the estimates of the bag's two halves
MAX_RESIDUAL = 0.05        # an interval's least-squares residual over its impulse, at most
OPPOSING = -0.9            # cosine between the tangential impulse and the slip of a sliding foot


@dataclass
class GroundFrictionResult(Verdict):
    friction: float                    # the Coulomb coefficient (nan when not identified)
    lower_bound: float                 # the largest |Lambda_t| / Lambda_n of a foot above BOUND_LOAD (99th percentile)
    quartiles: List[float]             # 25th, 50th, 75th percentile of the sliding feet's ratios
    halves: List[float]                # the estimate from each half of the bag alone
    sliding: int                       # foot-intervals sliding at the top of the ratios (the cone)
    creeping: int                      # ... sliding well inside it (a lightly pressed foot creeping, an impact)
    loaded: int                        # loaded foot-intervals (normal impulse above LOADED of the median)
    intervals: int                     # intervals with a command and the next state
    solved: int                        # ... whose feet's impulses were solved (every touching foot steady)
    mass_scale: float                  # the mass scale used (contact-free estimate or 1)
    mass_note: str
    slide_speed: float
    contact_tolerance: float
    verdict: str = "accepted"          # accepted, not identified, rejected
    reasons: List[str] = field(default_factory=list)
    seconds: float = 0.0


def unit_twists(model, q: torch.Tensor) -> torch.Tensor:
    """(bodies, 6, B, nv): each body's twist per unit of each velocity coordinate.

    The twists are about the kinematics' origin o, at the configurations q (B, nq).
    """
    nv = model.nv
    eye = torch.eye(nv, dtype=q.dtype, device=q.device)
    kin = kinematics_record(model, q.T.repeat_interleave(nv, dim=1), eye.repeat(1, q.shape[0]))
    return kin.vel.reshape(kin.vel.shape[0], 6, q.shape[0], nv)


def point_jacobian(tw: torch.Tensor, point: torch.Tensor) -> torch.Tensor:
    """(3, nv): the world velocity of the material point at ``point`` (from o) of a body.

    The body's unit twists are ``tw`` (6, nv).
    """
    return tw[:3] + torch.linalg.cross(tw[3:], point[:, None].expand(-1, tw.shape[1]), dim=0)


def foot_rows(setup: SimSetup, qs, vs, impulse: torch.Tensor, tolerance: float) -> List[tuple]:
    """Per steady interval and touching body: its impulses, slip velocities and contact points.

    Each row holds the normal impulse, the tangential impulse vector, the tangential slip
    velocities of its contact point at the interval's start, middle and end, the interval, the body
    and its touching collision points, from the least-squares split of ``impulse`` (B, nv) over the
    touching feet. ``qs``, ``vs``: the configurations and velocities at start, middle and end.
    """
    model, cfg = setup.model, setup.sim_config
    sys = physics.build_system(model, cfg)
    cs = sys.contact
    qm = qs[1]
    n = sys.ground_normal.to(qm.dtype)
    x, gap = zip(*(collision_points(sys, model, q) for q in qs))
    twists = [unit_twists(model, q) for q in qs]
    gap_all = torch.stack(gap).amax(0)
    gap_min = torch.stack(gap).amin(0)
    rows = []
    for i in range(qm.shape[0]):
        touching = gap_all[:, i] <= tolerance
        near = gap_min[:, i] <= tolerance
        if not bool(touching.any()) or bool((near & ~touching).any()):
            continue                   # nothing touches, or a point lands or lifts off within the interval
        pts = torch.nonzero(touching)[:, 0]
        bodies = sorted(set(cs.body[pts].tolist()))
        J, slips = [], []
        for b in bodies:
            sel = pts[cs.body[pts] == b]
            # The foot's one contact point: its touching points weighted by how deep they are (the
            # deeper corner of a box foot carries more of the load).
            w = (tolerance - gap[1][sel, i]).clamp(min=0) + 1e-9
            Jb = [point_jacobian(tw[b, :, i], ((xe[sel, :, i] - cs.radius[sel, None] * n) * w[:, None]).sum(0)
                                  / w.sum()) for tw, xe in zip(twists, x)]
            J.append(Jb[1])
            slips.append([Je @ v[i] - ((Je @ v[i]) @ n) * n for Je, v in zip(Jb, vs)])
        A = torch.cat(J).T                                                        # (nv, 3 feet)
        if int(torch.linalg.matrix_rank(A)) < A.shape[1]:
            continue
        lam = torch.linalg.lstsq(A, impulse[i][:, None], driver="gelsd").solution[:, 0]
        if float((A @ lam - impulse[i]).norm()) > MAX_RESIDUAL * float(impulse[i].norm()):
            continue                   # the feet as points do not carry this interval's impulse
        for j in range(len(bodies)):
            f = lam[3 * j:3 * j + 3]
            rows.append((float(f @ n), f - (f @ n) * n, slips[j], i, bodies[j], pts[cs.body[pts] == bodies[j]]))
    return rows


def feet_impulses(data: BagData, setup: SimSetup, mass_scale: float, contact_tolerance: float):
    """(ks, rows, (setup in float64, configurations, velocities)) of the feet's impulses.

    That is the bag's control intervals (analysis.contact_free.bag_intervals), the feet's impulses
    over them (:func:`foot_rows`) with the robot's mass factor ``mass_scale``, and the start,
    middle and end configurations and velocities of each interval they were solved at.
    """
    setup64, ks, q, v, cmd = bag_intervals(data, setup)
    scaled, applied, qm = interval_equations(setup64, q[ks], v[ks], q[ks + 1], v[ks + 1], cmd)
    vm = torch.cat((0.5 * (v[ks] + v[ks + 1])[:, :6], (q[ks + 1, 7:] - q[ks, 7:]) / setup.sim_config.dt), 1)
    qs, vs = (q[ks], qm, q[ks + 1]), (v[ks], vm, v[ks + 1])
    return ks, foot_rows(setup64, qs, vs, mass_scale * scaled - applied, contact_tolerance), (setup64, qs, vs)


def ground_friction(data: BagData, setup: SimSetup, contact_tolerance: float = 0.005, slide_speed: float = 0.03,
                    mass_scale: Optional[float] = None) -> GroundFrictionResult:
    """Estimate the ground's Coulomb coefficient from a legged robot's bag (module doc).

    ``mass_scale``: the robot's mass factor on the setup's model; by default the contact-free
    estimate where it is accepted, else 1.
    """
    t0 = time.perf_counter()
    if data.kind != "legged":
        raise AnalysisError(f"{data.path}: the ground friction estimate is for a legged robot's bag (a floating base "
                            f"with joints); this bag is '{data.kind}'")
    if not setup.sim_config.ground:
        raise AnalysisError(f"{setup.source}: the simulator has no ground (simulator.ground: false)")
    if not slide_speed > 0 or not contact_tolerance > 0:
        raise AnalysisError(f"slide_speed and contact_tolerance must be > 0, got {slide_speed}, {contact_tolerance}")
    if mass_scale is None:
        cf = contact_free_mass(data, setup, contact_tolerance)
        s, note = ((cf.mass_scale, f"the contact-free estimate {cf.mass_scale:.4g} (accepted)") if cf.accepted else
                   (1.0, "1 (the contact-free mass estimate was rejected: " + "; ".join(cf.reasons) + ")"))
    else:
        s, note = float(mass_scale), f"{float(mass_scale):.4g} (given)"
    ks, rows, _ = feet_impulses(data, setup, s, contact_tolerance)
    normal = np.array([r[0] for r in rows])
    loaded = normal > LOADED * np.median(normal[normal > 0]) if (normal > 0).any() else np.zeros(len(rows), bool)
    ratio, sliding = np.full(len(rows), np.nan), np.zeros(len(rows), bool)
    for k, (fn, ft, slips, *_) in enumerate(rows):
        if not loaded[k]:
            continue
        ratio[k] = float(ft.norm()) / fn
        sliding[k] = all(float(sl.norm()) > slide_speed
                         and float(ft @ sl) < OPPOSING * float(ft.norm()) * float(sl.norm()) for sl in slips)
    heavy = normal > BOUND_LOAD * np.median(normal[normal > 0]) if loaded.any() else loaded
    lower = float(np.percentile(ratio[heavy], 99)) if heavy.any() else math.nan
    at_cone = sliding & (ratio >= (1 - BAND) * lower)
    quart = [float(x) for x in np.percentile(ratio[at_cone], [25, 50, 75])] if at_cone.any() else [math.nan] * 3
    interval = np.array([r[3] for r in rows], dtype=np.int64)
    halves = [at_cone & (interval < len(ks) // 2), at_cone & (interval >= len(ks) // 2)]
    half = [float(np.median(ratio[h])) if h.any() else math.nan for h in halves]
    reasons: List[str] = []
    if min(int(h.sum()) for h in halves) < MIN_SLIDING:
        verdict = "not identified"
        reasons.append(f"{int(halves[0].sum())} and {int(halves[1].sum())} loaded foot-intervals in the bag's two "
                       f"halves slide at the friction cone (at least {MIN_SLIDING} each: faster than {slide_speed:g} "
                       f"m/s against their friction throughout, their ratio within {BAND:.0%} of the 99th percentile "
                       f"{lower:.3g}): the feet stayed inside the cone, so the floor's coefficient is at least "
                       f"{lower:.3g}; a bag in which the feet slide (a harder push-off, a faster command) identifies "
                       "it")
    else:
        if abs(half[0] - half[1]) > MAX_DISAGREEMENT * quart[1]:
            reasons.append(f"the bag's halves give {half[0]:.4g} and {half[1]:.4g} (more than {MAX_DISAGREEMENT:.0%} "
                           "apart): not one Coulomb coefficient over the bag (another floor, a force the equations "
                           "lack)")
        verdict = "rejected" if reasons else "accepted"
    return GroundFrictionResult(friction=quart[1] if verdict == "accepted" else math.nan, lower_bound=lower,
                                quartiles=quart, halves=half, sliding=int(at_cone.sum()),
                                creeping=int((sliding & ~at_cone).sum()), loaded=int(loaded.sum()),
                                intervals=len(ks), solved=len({r[3] for r in rows}), mass_scale=s, mass_note=note,
                                slide_speed=slide_speed, contact_tolerance=contact_tolerance, verdict=verdict,
                                reasons=reasons, seconds=time.perf_counter() - t0)


def collision_points(sys, model, q: torch.Tensor):
    """(points, heights) of the collision spheres at configurations ``q`` (B, nq) of ``sys``.

    points (points, 3, B) are each collision sphere's centre from the kinematics' origin o, heights
    (points, B) its surface's height above the ground.
    """
    cs = sys.contact
    n = sys.ground_normal.to(q.dtype)
    kin = kinematics_record(model, q.T)
    x = torch.einsum("pijb,pj->pib", kin.R[cs.body], cs.local) + kin.p[cs.body]
    return x, ((x + kin.o) * n[None, :, None]).sum(1) - sys.ground_height - cs.radius[:, None]


def ground_friction_markdown(r: GroundFrictionResult, bag: str, source: str, written: bool) -> str:
    """sysid.md of the estimate."""
    lines = [f"# System identification (contact-free ground friction): {bag}", ""]
    if r.accepted:
        lines += ["**Verdict: fit accepted.**", ""]
    else:
        lines += [f"**Verdict: {'fit rejected' if r.verdict == 'rejected' else 'not identified'}.** "
                  + " ".join(f"Reason: {x}." for x in r.reasons), "",
                  "calibrated.yaml was written anyway (asked for)." if written else
                  "No calibrated.yaml was written (`--write-rejected` writes it anyway).", ""]
    q = ", ".join(f"{x:.4g}" for x in r.quartiles)
    lines += [f"Model and simulator from {source}. The feet's impulses over each control interval from the equations "
              "of motion (each touching foot one contact point; the simulator's contact law is not used), the "
              f"robot's mass scale {r.mass_note}. {r.solved} of {r.intervals} intervals with every touching foot "
              f"steady; {r.loaded} loaded foot-intervals; contact tolerance {r.contact_tolerance * 1e3:g} mm; "
              f"{r.seconds:.1f} s.", "",
              "| | value |", "|---|---|",
              f"| ground friction (median of the sliding feet's |tangential| / normal impulse) | {r.friction:.4g} |",
              f"| the sliding feet's quartiles | {q} |",
              f"| each half of the bag alone | {r.halves[0]:.4g}, {r.halves[1]:.4g} |",
              f"| sliding at the cone / creeping inside it | {r.sliding} / {r.creeping} |",
              f"| lower bound (99th percentile of the ratio of feet above {BOUND_LOAD:g} of the median load) | "
              f"{r.lower_bound:.4g} |", "",
              f"A foot slides when its contact point moves faster than {r.slide_speed:g} m/s along the ground against "
              f"its friction at the interval's start, middle and end; it counts at the cone within {BAND:.0%} of the "
              f"lower bound. Identified with at least {MIN_SLIDING} such foot-intervals in each half of the bag; "
              f"rejected when the halves' estimates are more than {MAX_DISAGREEMENT:.0%} apart."]
    return "\n".join(lines) + "\n"


def write_ground_friction(result: GroundFrictionResult, setup: SimSetup, out_dir, bag: str = "",
                          force: bool = False) -> Dict[str, str]:
    """Write sysid.json, sysid.md and, for an accepted estimate (or with ``force``), calibrated.yaml.

    In calibrated.yaml the simulator's ground friction is set to the estimate and
    training.randomize_ground_friction moved with it (analysis.sysid.calibrated_params). Returns
    the paths.
    """
    return write_estimate(result, {"ground_friction": [result.friction]}, setup, out_dir, bag, force,
                          lambda written: ground_friction_markdown(result, bag, setup.source, written),
                          [f"the sliding feet's quartiles {', '.join(f'{x:.4g}' for x in result.quartiles)}; lower "
                           f"bound {result.lower_bound:.4g}; mass scale {result.mass_note}."])
