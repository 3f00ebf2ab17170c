"""The mass of a legged robot from its bag, without a contact model.

Over one control interval [t_k, t_k+1] the equations of motion, integrated, read

    s (M(q) dv + b(q, v) dt) = F(q, v, u) dt + J_c(q)^T Lambda

with s the factor on every link mass and inertia (``mass_scale``: M and the bias b, gravity
and velocity terms, are linear in the inertial parameters), F the actuators' and joints'
forces at the recorded state under the recorded command (the simulator's laws:
``physics.applied_forces``), and Lambda the unknown ground impulses at the touching contact
points, whatever the ground's law (stiffness, damping, friction cone, slip). Projecting each
interval's equation on the null space of J_c (the directions no ground force can push)
removes Lambda; what remains is linear in s, and the least-squares s over the whole bag is
the estimate. Where the simulator's contact model differs from the robot's (the MuJoCo
stand-in's soft constraints, a real floor), replaying windows through the simulator (the
``calibrate`` fit) blames the mass for the contact's error; this does not use the contact
model at all.

Discretisation: M at the interval's mid configuration; b as the mean of both ends, with the
base's linear velocity in one frame (the mid body frame) and the bias of the classical
acceleration, so the rotating body frame does not enter dv; F at the mid configuration and
the mean velocity (q_k+1 - q_k) / dt of the joints, which integrates the damping exactly. A
contact point touches when it is within ``contact_tolerance`` of the ground at the mid
configuration (a larger tolerance drops more equations; a smaller one can let a touching
foot's impulse in). The residual's share of the applied impulse and the estimate from the
held-out end of the bag judge the fit.
"""
from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List

import numpy as np
import torch

from .. import physics
from ..physics.kinematics import kinematics_record
from ..physics.spatial import quat_to_matrix
from .bag import BagData
from .errors import AnalysisError
from .predict import Replay, SimSetup

MIN_EXPLAINED = 0.98       # share of the projected applied impulse the fitted model must explain (0.999 when it holds)
MAX_DISAGREEMENT = 0.03    # relative gap between the fit's and the held-out part's estimate
MIN_EQUATIONS = 30         # projected equations needed on each part


class Verdict:
    """What an estimate's result (a dataclass with a ``verdict``) answers alike."""

    @property
    def accepted(self) -> bool:
        return getattr(self, "verdict") == "accepted"

    def as_dict(self) -> Dict[str, Any]:
        return dataclasses.asdict(self)      # type: ignore[call-overload]


@dataclass
class ContactFreeResult(Verdict):
    mass_scale: float                  # on the setup's model
    std: float                         # one standard deviation (least squares)
    heldout_mass_scale: float          # the same estimate from the held-out end of the bag alone
    explained: float                   # 1 - |residual|^2 / |applied|^2 on the fit part
    explained_heldout: float           # the same, held out, with the fit's mass_scale
    intervals: int                     # intervals with a command and a recorded next state
    fit_intervals: int                 # ... of the fit part with at least one projected equation
    heldout_intervals: int
    equations: int                     # projected equations, both parts
    contact_tolerance: float
    free_directions: Dict[str, int] = field(default_factory=dict)   # histogram: directions left -> intervals
    verdict: str = "accepted"
    reasons: List[str] = field(default_factory=list)
    seconds: float = 0.0


def _mid_configuration(q0: torch.Tensor, q1: torch.Tensor) -> torch.Tensor:
    qm = 0.5 * (q0 + q1)
    return torch.cat((qm[:, :3], qm[:, 3:7] / qm[:, 3:7].norm(dim=1, keepdim=True), qm[:, 7:]), 1)


def _classical_bias(model, q: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Return b such that M a_c + b is the equations' left side.

    Here a_c is the base's classical acceleration (the body-frame velocity's own rate plus w x v)
    and the joints' accelerations.
    """
    a = torch.zeros_like(v)
    a[:, :3] = -torch.linalg.cross(v[:, 3:6], v[:, :3])
    return physics.rnea(model, q, v, a)


def interval_equations(setup: SimSetup, q0, v0, q1, v1, command):
    """Per interval: the mass-scaled impulse, the applied impulse and the mid configuration.

    The mass-scaled impulse is M dv + b dt (B, nv), the applied impulse F dt (B, nv), and the mid
    configuration (B, nq) (see the module doc).
    """
    model, cfg = setup.model, setup.sim_config
    dt = cfg.dt
    qm = _mid_configuration(q0, q1)
    Rm = quat_to_matrix(qm[:, 3:7])

    def lin_in_mid(q, v):
        return torch.einsum("bji,bjk,bk->bi", Rm, quat_to_matrix(q[:, 3:7]), v[:, :3])
    dv = torch.cat((lin_in_mid(q1, v1) - lin_in_mid(q0, v0), (v1 - v0)[:, 3:]), 1)
    b = 0.5 * (_classical_bias(model, q0, v0) + _classical_bias(model, q1, v1))
    scaled = (physics.crba(model, qm) @ dv[..., None])[..., 0] + dt * b
    vm = torch.cat((0.5 * (v0 + v1)[:, :6], (q1[:, 7:] - q0[:, 7:]) / dt), 1)
    try:
        sys_free = physics.build_system(model, dataclasses.replace(cfg, ground=False))
        applied = dt * physics.applied_forces(sys_free, qm, vm, command)
    except ValueError as exc:
        raise AnalysisError(f"{setup.source}: the contact-free mass estimate {exc}") from None
    return scaled, applied, qm


def _free_directions(setup: SimSetup, qm: torch.Tensor, tolerance: float) -> List[torch.Tensor]:
    """Per interval, an orthonormal basis (nv, r) of the velocity directions free of contact forces.

    These are the directions that no touching contact point's force can act along (the null space
    of their stacked point Jacobians).
    """
    model, cfg = setup.model, setup.sim_config
    nv = model.nv
    eye = torch.eye(nv, dtype=qm.dtype, device=qm.device)
    if not cfg.ground:
        return [eye] * qm.shape[0]
    sys = physics.build_system(model, cfg)
    cs = sys.contact
    if cs.n == 0:
        return [eye] * qm.shape[0]
    kin = kinematics_record(model, qm.T)
    n = sys.ground_normal.to(qm.dtype)
    x = torch.einsum("pijb,pj->pib", kin.R[cs.body], cs.local) + kin.p[cs.body]      # (P, 3, B) from o
    gap = ((x + kin.o) * n[None, :, None]).sum(1) - sys.ground_height - cs.radius[:, None]
    touching = gap <= tolerance
    out = []
    for i in range(qm.shape[0]):
        pts = torch.nonzero(touching[:, i])[:, 0]
        if not len(pts):
            out.append(eye)
            continue
        unit = kinematics_record(model, qm[i:i + 1].T.expand(-1, nv), eye)       # twists of v = e_j
        xc = (x[pts, :, i] - cs.radius[pts, None] * n)[:, :, None]              # surface points, from o
        tw = unit.vel[cs.body[pts]]                                              # (p, 6, nv)
        J = tw[:, :3] + torch.linalg.cross(tw[:, 3:], xc.expand(-1, -1, nv), dim=1)
        _, S, Vh = torch.linalg.svd(J.reshape(-1, nv))
        rank = int((S > 1e-9 * S.max()).sum())
        out.append(Vh[rank:].T)
    return out


def _explained(A: torch.Tensor, C: torch.Tensor, s: float) -> float:
    """Share of |C|^2 that s A explains."""
    r = C - s * A
    return float(1.0 - (r @ r) / (C @ C))


def _fit(rows_a: List[torch.Tensor], rows_c: List[torch.Tensor]):
    """Least squares of C = s A over the projected equations.

    Gives s, its standard deviation, the share explained and the number of equations (NaNs and 0
    where there are none).
    """
    if not rows_a:
        return math.nan, math.nan, math.nan, 0
    A, C = torch.cat(rows_a), torch.cat(rows_c)
    if float(A @ A) == 0.0:
        return math.nan, math.nan, math.nan, 0
    s = float(A @ C / (A @ A))
    r = C - s * A
    std = float(torch.sqrt((r @ r) / max(len(r) - 1, 1)) / A.norm())
    return s, std, _explained(A, C, s), len(A)


def bag_intervals(data: BagData, setup: SimSetup):
    """Return (setup in float64, ks, q, v, cmd) of the bag's control intervals that have a command.

    The intervals [k, k+1] that have a command are ``ks`` (the command's delay taken into account);
    q, v are the recorded states in float64 and cmd the command acting over each interval.
    """
    rp = Replay(data, setup)
    d = setup.sim_config.command_delay
    at = {int(s): i for i, s in enumerate(rp.cmd_state)}
    ks = np.array([k for k in range(rp.q.shape[0] - 1) if (k - d) in at], dtype=np.int64)
    if len(ks) < 10:
        raise AnalysisError(f"{data.path}: {len(ks)} control intervals with a command and the next state "
                            "(at least 10 needed)")
    q, v = rp.q.to(torch.float64), rp.v.to(torch.float64)
    cmd = rp.cmd.to(q.dtype)[[at[int(k) - d] for k in ks]]
    model = setup.model if setup.model.dtype == torch.float64 else setup.model.to(dtype=torch.float64)
    return dataclasses.replace(setup, model=model), ks, q, v, cmd


def contact_free_mass(data: BagData, setup: SimSetup, contact_tolerance: float = 0.005,
                      fit_fraction: float = 0.7) -> ContactFreeResult:
    """Estimate the mass scale of a legged robot's bag by the contact-free projection (module doc).

    It is fitted on the first ``fit_fraction`` of the bag and checked on the rest.
    """
    t0 = time.perf_counter()
    if data.kind != "legged":
        raise AnalysisError(f"{data.path}: the contact-free mass estimate is for a legged robot's bag (a floating "
                            f"base with joints); this bag is '{data.kind}'")
    if not 0.0 < fit_fraction < 1.0:
        raise AnalysisError(f"fit_fraction must be in (0, 1), got {fit_fraction}")
    setup64, ks, q, v, cmd = bag_intervals(data, setup)
    scaled, applied, qm = interval_equations(setup64, q[ks], v[ks], q[ks + 1], v[ks + 1], cmd)
    bases = _free_directions(setup64, qm, contact_tolerance)
    split = int(round(fit_fraction * len(ks)))
    parts: List[Dict[str, list]] = [{"a": [], "c": []}, {"a": [], "c": []}]
    hist: Dict[str, int] = {}
    for i, N in enumerate(bases):
        hist[str(N.shape[1])] = hist.get(str(N.shape[1]), 0) + 1
        if N.shape[1] == 0:
            continue
        part = parts[0 if i < split else 1]
        part["a"].append(N.T @ scaled[i])
        part["c"].append(N.T @ applied[i])
    s, std, explained, n_fit = _fit(parts[0]["a"], parts[0]["c"])
    s_h, _, _, n_held = _fit(parts[1]["a"], parts[1]["c"])
    explained_h = (_explained(torch.cat(parts[1]["a"]), torch.cat(parts[1]["c"]), s) if n_held else math.nan)
    reasons = []
    if n_fit < MIN_EQUATIONS or n_held < MIN_EQUATIONS:
        reasons.append(f"too few equations once the touching contacts are projected out ({n_fit} to fit, {n_held} "
                       f"held out; at least {MIN_EQUATIONS} each): the feet touch in too many directions at once")
    else:
        if explained < MIN_EXPLAINED or explained_h < MIN_EXPLAINED:
            reasons.append(f"the model explains {explained:.1%} of the projected applied impulse on the fit part and "
                           f"{explained_h:.1%} held out (at least {MIN_EXPLAINED:.0%}): forces the simulator lacks "
                           "act besides the ground (a lag, a delay, a push) or the states are too coarse")
        if not abs(s_h - s) <= MAX_DISAGREEMENT * abs(s):
            reasons.append(f"the held-out end of the bag alone gives mass_scale {s_h:.4g}, the fit part {s:.4g} "
                           f"(more than {MAX_DISAGREEMENT:.0%} apart)")
        if not s > 0:
            reasons.append(f"the estimate {s:.4g} is not a mass scale")
    return ContactFreeResult(mass_scale=s, std=std, heldout_mass_scale=s_h, explained=explained,
                             explained_heldout=explained_h, intervals=len(ks),
                             fit_intervals=len(parts[0]["a"]), heldout_intervals=len(parts[1]["a"]),
                             equations=n_fit + n_held, contact_tolerance=contact_tolerance, free_directions=hist,
                             verdict="rejected" if reasons else "accepted", reasons=reasons,
                             seconds=time.perf_counter() - t0)


def contact_free_markdown(r: ContactFreeResult, bag: str, source: str, written: bool) -> str:
    lines = [f"# System identification (contact-free): {bag}", ""]
    if r.accepted:
        lines += ["**Verdict: fit accepted.**", ""]
    else:
        lines += ["**Verdict: fit rejected.** " + " ".join(f"Reason: {x}." for x in r.reasons), "",
                  "calibrated.yaml was written anyway (asked for)." if written else
                  "No calibrated.yaml was written (`--write-rejected` writes it anyway).", ""]
    free = ", ".join(f"{k}: {v}" for k, v in sorted(r.free_directions.items(), key=lambda kv: int(kv[0])))
    lines += [f"Model and simulator from {source}. mass_scale (every link's mass and inertia) from the equations "
              "of motion over each control interval, projected on the directions no touching contact point can "
              "push (the ground's law is not used). "
              f"{r.intervals} intervals: {r.fit_intervals} with equations left in the fit part, "
              f"{r.heldout_intervals} held out; {r.equations} projected equations; contact tolerance "
              f"{r.contact_tolerance * 1e3:g} mm; {r.seconds:.1f} s.", "",
              "| | mass_scale | std (1 sigma) | explained |", "|---|---|---|---|",
              f"| fit (first part) | {r.mass_scale:.5g} | {r.std:.2g} | {r.explained:.2%} |",
              f"| held-out end alone | {r.heldout_mass_scale:.5g} | | {r.explained_heldout:.2%} "
              "(with the fit's value) |",
              "", f"Directions left per interval (directions: intervals): {free}.", "",
              f"Rejected when the fitted model explains less than {MIN_EXPLAINED:.0%} of the projected applied "
              f"impulse on either part, when the two parts' estimates are more than {MAX_DISAGREEMENT:.0%} apart, "
              f"or when either part has fewer than {MIN_EQUATIONS} equations."]
    return "\n".join(lines) + "\n"


def write_contact_free(result: ContactFreeResult, setup: SimSetup, out_dir, bag: str = "", force: bool = False
                       ) -> Dict[str, str]:
    """Write sysid.json and sysid.md, and for an accepted fit calibrated.yaml and calibrated.urdf.

    calibrated.yaml (a training file for ``diffsim-ros train --config``) and calibrated.urdf (holding
    the scaled masses) are written for an accepted fit, or with ``force``. Returns the paths.
    """
    return write_estimate(result, {"mass_scale": [result.mass_scale]}, setup, out_dir, bag, force,
                          lambda written: contact_free_markdown(result, bag, setup.source, written),
                          [f"std {result.std:.2g}; the held-out end of the bag alone gives "
                           f"{result.heldout_mass_scale:.5g}."])


def write_estimate(result, fitted: Dict[str, List[float]], setup: SimSetup, out_dir, bag: str, force: bool,
                   markdown, summary: List[str]) -> Dict[str, str]:
    """Write what a contact-free estimate writes.

    That is sysid.json (``result.as_dict()`` with ``fitted``), sysid.md (``markdown(written)``) and,
    for an accepted ``result`` (or with ``force``), calibrated.yaml and calibrated.urdf from
    ``fitted`` with the ``summary`` lines in its header.
    """
    import json

    from ..learning.checkpoint import json_safe
    from .sysid import write_training_file

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    files: Dict[str, str] = {}
    notes: List[str] = []
    if result.accepted or force:
        files.update(write_training_file(fitted, setup, out, bag, notes, "`diffsim-ros sysid --method contact-free`",
                                         summary))
    d = dict(result.as_dict(), method="contact-free", bag=bag, model_source=setup.source, fitted=fitted, notes=notes)
    (out / "sysid.json").write_text(json.dumps(json_safe(d), indent=2))
    files["json"] = str(out / "sysid.json")
    (out / "sysid.md").write_text(markdown("yaml" in files) + "".join(f"\nNote: {n}\n" for n in notes))
    files["markdown"] = str(out / "sysid.md")
    return files
