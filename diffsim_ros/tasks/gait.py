"""Gait analysis of a legged robot from its foot contacts.

It gives the duty factor, stride frequency, the phase offsets between feet and the gait's name.

    stats = analyze_gait(contact, dt, feet, foot_xy)     # contact (T, F) bool, foot_xy (F, 2) base frame
    stats.name            # walk, trot, pace, bound, pronk, stand or irregular
    stats.duty_factor     # per foot, fraction of the stride in contact
    stats.frequency_hz    # strides per second (of the feet that step, when one does not)
    stats.phase           # per foot, touchdown offset from the left-front foot, fraction of a stride

The legs' roles (left/right, front/hind) come from the feet's positions in the base frame
(REP-103: x forward, y left), so the names hold for any quadruped whatever its link names.
Templates of the phase offsets (relative to the left-front foot, as fractions of a stride):
trot LF=RH=0, RF=LH=1/2; pace LF=LH=0, RF=RH=1/2; bound LF=RF=0, LH=RH=1/2; pronk all 0;
walk a four-beat sequence, lateral (LF 0, RH 1/4, RF 1/2, LH 3/4) or diagonal (LF 0, LH 1/4,
RF 1/2, RH 3/4). The nearest template in circular distance names the gait, unless it is
further than ``tolerance`` per foot on average ("irregular"). Feet that never leave the
ground make "stand"; a foot that never touches down or touches down once only gives no
stride and "irregular", and so do feet that step at different rates or drift in phase.

Contacts come from the simulator (the per-body contact force of each foot) or, for a bag,
from the feet's heights by forward kinematics; :func:`footfall_png` draws the diagram.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

__all__ = ["GaitStats", "analyze_gait", "leg_roles", "footfall_png", "foot_slip", "TEMPLATES"]

ROLES = ("LF", "RF", "LH", "RH")
#: Phase offsets (fraction of a stride) of LF, RF, LH, RH relative to LF.
TEMPLATES: Dict[str, List[Sequence[float]]] = {
    "trot": [(0.0, 0.5, 0.5, 0.0)],
    "pace": [(0.0, 0.5, 0.0, 0.5)],
    "bound": [(0.0, 0.0, 0.5, 0.5)],
    "pronk": [(0.0, 0.0, 0.0, 0.0)],
    "walk": [(0.0, 0.5, 0.75, 0.25), (0.0, 0.5, 0.25, 0.75)],
}


@dataclass
class GaitStats:
    """The gait of one window of contacts (see the module doc)."""

    name: str
    feet: List[str]
    roles: List[str]
    duty_factor: List[float]
    frequency_hz: float
    phase: List[float]
    template_distance: float
    touchdowns: List[int] = field(default_factory=list)

    def as_dict(self) -> Dict[str, object]:
        return {"gait": self.name, "feet": self.feet, "roles": self.roles,
                "duty_factor": [round(x, 4) for x in self.duty_factor],
                "stride_frequency_hz": round(self.frequency_hz, 4) if np.isfinite(self.frequency_hz) else None,
                "phase": [round(x, 4) if np.isfinite(x) else None for x in self.phase],
                "template_distance": round(self.template_distance, 4) if np.isfinite(self.template_distance) else None,
                "touchdowns": self.touchdowns}


def leg_roles(foot_xy) -> List[str]:
    """LF/RF/LH/RH of four feet from their (x, y) in the base frame at stance."""
    xy = np.asarray(foot_xy, dtype=np.float64).reshape(-1, 2)
    if xy.shape[0] != 4:
        raise ValueError(f"gait names are defined for four feet, got {xy.shape[0]}")
    front = xy[:, 0] > np.median(xy[:, 0])
    left = xy[:, 1] > np.median(xy[:, 1])
    roles = [("L" if lf else "R") + ("F" if fr else "H") for lf, fr in zip(left, front)]
    if sorted(roles) != sorted(ROLES):
        raise ValueError(f"cannot tell the legs apart from the foot positions {xy.tolist()} (got roles {roles})")
    return roles


def _circ(a: float, b: float) -> float:
    d = abs((a - b) % 1.0)
    return min(d, 1.0 - d)


def _circular_mean(x: np.ndarray) -> Tuple[float, float]:
    """Circular mean of phases (fractions of a cycle) and the mean resultant length R in [0, 1].

    R is 1 when all are equal and near 0 when they are spread over the cycle.
    """
    ang = 2 * np.pi * np.asarray(x)
    s, c = np.sin(ang).mean(), np.cos(ang).mean()
    return float((np.arctan2(s, c) / (2 * np.pi)) % 1.0), float(np.hypot(s, c))


#: Touchdowns this fraction of a stride before the reference foot's first touchdown or after its
#: last are phased by the nearest stride (a phase near 0: the unknown stride's length hardly
#: matters); others there are not.
EDGE = 0.2


def analyze_gait(contact, dt: float, feet: Sequence[str], foot_xy, tolerance: float = 0.125,
                 max_period_spread: float = 0.15, min_phase_coherence: float = 0.8) -> GaitStats:
    """Gait statistics of a contact timeline ``contact`` (T, 4) bool sampled every ``dt`` s.

    A gait is named only when the feet move in step: each foot touches down as often as the
    reference foot (the left fore) over the run, within ``max_period_spread`` of its count (one
    touchdown more or less always allowed), and at a steady phase of the reference's strides
    (mean resultant length at least ``min_phase_coherence``). A touchdown's phase is its delay
    after the reference's last touchdown as a fraction of that stride (the time to the
    reference's next touchdown; before its first or after its last touchdown only those within
    ``EDGE`` of the nearest stride are phased, by that stride's length, where its error is small),
    so strides of uneven length, a run of hops of different heights, keep their phases.
    """
    c = np.asarray(contact, dtype=bool)
    if c.ndim != 2 or c.shape[1] != len(feet):
        raise ValueError(f"contact must be (T, {len(feet)}), got {c.shape}")
    roles = leg_roles(foot_xy)
    duty = c.mean(axis=0).astype(float).tolist()
    downs = [np.nonzero(~c[:-1, i] & c[1:, i])[0] + 1 for i in range(c.shape[1])]
    n_down = [int(len(d)) for d in downs]
    nan = float("nan")
    if c.all():
        return GaitStats("stand", list(feet), roles, duty, 0.0, [nan] * 4, nan, n_down)
    periods = [float(np.median(np.diff(d))) * dt for d in downs if len(d) >= 2]
    if min(n_down) < 2:
        # No stride for some foot (one that never lifts, or lifts once): no gait, but the rate
        # of the feet that do step is still reported.
        rate = 1.0 / float(np.median(periods)) if periods else nan
        return GaitStats("irregular", list(feet), roles, duty, rate, [nan] * 4, nan, n_down)
    period = float(np.median(periods))
    i_ref = roles.index("LF")
    ref = downs[i_ref] * dt
    n_ref = n_down[i_ref]
    phase = []
    steady = all(abs(n - n_ref) <= max(1.0, max_period_spread * n_ref) for n in n_down)
    for i in range(c.shape[1]):
        offs = []
        for ti in downs[i] * dt:
            k = int(np.searchsorted(ref, ti + 1e-12, side="right")) - 1     # the reference's last touchdown
            if 0 <= k < len(ref) - 1:                   # within a stride of the reference (known length)
                offs.append(((ti - ref[k]) / (ref[k + 1] - ref[k])) % 1.0)
            elif k < 0 and ref[0] - ti < EDGE * (ref[1] - ref[0]):          # just before the first
                offs.append(1.0 - (ref[0] - ti) / (ref[1] - ref[0]))
            elif k == len(ref) - 1 and ti - ref[-1] < EDGE * (ref[-1] - ref[-2]):   # just after the last
                offs.append((ti - ref[-1]) / (ref[-1] - ref[-2]))
        if not offs:
            phase.append(nan)
            steady = False
            continue
        mean, r = _circular_mean(np.array(offs))
        phase.append(mean)
        steady = steady and r >= min_phase_coherence
    by_role = [phase[roles.index(r)] for r in ROLES]
    best, best_d = "irregular", float("inf")
    for name, temps in TEMPLATES.items():
        for tmpl in temps:
            d = float(np.mean([_circ(p, q) for p, q in zip(by_role, tmpl)]))
            if d < best_d:
                best, best_d = name, d
    name = best if (best_d <= tolerance and steady) else "irregular"
    return GaitStats(name, list(feet), roles, duty, 1.0 / period, phase, best_d, n_down)


def footfall_png(contact, dt: float, feet: Sequence[str], path, title: str = "", roles: Optional[Sequence[str]] = None):
    """Draw the footfall diagram: one row per foot, a bar where it touches the ground."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    c = np.asarray(contact, dtype=bool)
    fig, ax = plt.subplots(figsize=(8, 0.5 + 0.45 * c.shape[1]))
    for i in range(c.shape[1]):
        x = np.concatenate(([False], c[:, i], [False]))
        starts = np.nonzero(~x[:-1] & x[1:])[0]
        ends = np.nonzero(x[:-1] & ~x[1:])[0]
        ax.broken_barh([(s * dt, (e - s) * dt) for s, e in zip(starts, ends)], (i - 0.4, 0.8), color="0.2")
    labels = [f"{f} ({r})" if roles else f for f, r in zip(feet, roles or [""] * len(feet))]
    ax.set_yticks(range(c.shape[1]), labels)
    ax.set_ylim(-0.6, c.shape[1] - 0.4)
    ax.set_xlim(0, c.shape[0] * dt)
    ax.set_xlabel("time (s)")
    ax.invert_yaxis()
    if title:
        ax.set_title(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return str(path)


# ---------------------------------------------------------------------- from the simulator
def foot_bodies(sim) -> List[int]:
    """Find the feet of a legged robot: the bodies at the ends of the kinematic chains.

    Those are the chains that carry contact points (a foot link fixed to its shank is part of the
    shank's body).
    """
    m = sim.model
    parents = set(int(p) for p in m.parent)
    with_points = set(int(b) for b in sim.system.contact.body.tolist())
    return [b for b in range(m.nb) if b not in parents and b in with_points]


def foot_xy(sim, q) -> np.ndarray:
    """(F, 2) x, y of each foot body's origin in the base frame at configuration ``q`` (one state)."""
    import torch

    from ..physics import forward_kinematics

    m = sim.model
    q = torch.as_tensor(q, dtype=m.dtype).reshape(1, -1)
    T = forward_kinematics(m, q)[0].double().numpy()
    base = T[list(m.link_body).index(0)]             # the first link of the base body
    out = []
    for b in foot_bodies(sim):
        p = np.linalg.solve(base, T[list(m.link_body).index(b)][:, 3])
        out.append(p[0:2])
    return np.array(out)


def foot_contacts(sim, feet: Sequence[int], threshold: float = 1e-3) -> np.ndarray:
    """(B, F) bool: each foot body's ground contact force (world z, N) above ``threshold``.

    In the simulator's last step (``Simulator.last_data``).
    """
    data = sim.last_data
    if data is None:
        raise ValueError("foot_contacts needs an eager Simulator.step first (last_data is None)")
    fz = data.contact.wrench[list(feet), 2, :].T          # (B, F)
    return (fz > threshold).detach().cpu().numpy()


def foot_points(sim, q, feet: Sequence[int]) -> list:
    """Per foot body, the world positions (P, 3, T) of its contact points.

    The points are sphere centres and box corners, at the configurations ``q`` (T, nq), by the
    kinematics record.
    """
    import torch

    from ..physics.kinematics import kinematics

    cs = sim.system.contact
    q = torch.as_tensor(q, dtype=sim.model.dtype).reshape(-1, sim.model.nq)
    with torch.no_grad():
        kin = kinematics(sim.model, q)
    R, p, o = kin.R, kin.p, kin.o                        # (nb, 3, 3, T), (nb, 3, T), (1, 3, T)
    return [torch.einsum("ijt,pj->pit", R[b], cs.local[cs.body == b]) + p[b][None] + o for b in feet]


def foot_slip(sim, q, feet: Sequence[int], contact, dt: float, points: Optional[list] = None
              ) -> List[Optional[float]]:
    """Per foot, its mean horizontal speed (m/s) while it stays on the ground.

    Over each pair of consecutive steps with the foot in contact at both, the displacement of the
    foot's contact point that was lowest at the first of them (one body-fixed point, so a foot
    rolling from one corner to another does not count as a jump). A planted foot reads about 0; a
    foot dragged along reads about the speed it is dragged at. ``q`` (T, nq) configurations,
    ``contact`` (T, F) bool for the same steps; None for a foot with no such pair of steps.
    ``points``: :func:`foot_points` of ``q`` when the caller has them already.
    """
    import torch

    c = np.asarray(contact, dtype=bool)
    q = torch.as_tensor(q, dtype=sim.model.dtype).reshape(-1, sim.model.nq)
    if c.shape != (q.shape[0], len(feet)):
        raise ValueError(f"contact must be ({q.shape[0]}, {len(feet)}), got {c.shape}")
    out: List[Optional[float]] = []
    for f, x in enumerate(foot_points(sim, q, feet) if points is None else points):
        pts = x.permute(2, 0, 1).double().numpy()                      # (T, P, 3) world
        both = np.nonzero(c[:-1, f] & c[1:, f])[0]
        if len(both) == 0:
            out.append(None)
            continue
        low = pts[both, :, 2].argmin(axis=1)
        step = pts[both + 1, low, :2] - pts[both, low, :2]
        out.append(float(np.linalg.norm(step, axis=1).mean() / dt))
    return out


# ---------------------------------------------------------------------- a policy's gait
def rollout_contacts(task, policy, target=None, seed: int = 0, states: Optional[list] = None):
    """One episode of ``policy`` (obs -> action) on a legged ``task`` (batch 1, no gradients).

    Gives the (T, 4) foot contacts, the final TaskState and the feet's (x, y) at the start; with a
    list ``states``, each step's configuration q (nq,) is appended to it. A task stepping through a
    compiled simulator (which keeps no contact data) runs the episode on the eager step of the
    same system.
    """
    from ..physics import Simulator

    compiled = task.sim
    if compiled.compiled:
        task.sim = Simulator(compiled.system)
    try:
        return _rollout_contacts(task, policy, target, seed, states)
    finally:
        task.sim = compiled


def _rollout_contacts(task, policy, target, seed: int, states: Optional[list]):
    import torch

    with torch.no_grad():
        ts = task.reset(1, torch.Generator().manual_seed(seed))
        if target is not None:
            ts.target = torch.as_tensor(target, dtype=ts.target.dtype).reshape(1, -1)
        xy = foot_xy(task.sim, ts.sim.q[0])
        feet = foot_bodies(task.sim)
        contacts = []
        for _ in range(task.horizon):
            ts = task.step(ts, policy(task.observe(ts)))
            contacts.append(foot_contacts(task.sim, feet)[0])
            if states is not None:
                states.append(ts.sim.q[0].clone())
    return np.array(contacts), ts, xy


def write_gait_report(task, policy, out_dir, speeds: Sequence[float] = (0.2, 0.5, 0.8)) -> Dict[str, object]:
    """Write footfall.png and gait.json.

    footfall.png: one panel per commanded speed, or one for a forward-progress task. gait.json:
    which gait the policy uses at which commanded speed, its duty factors, stride frequency and
    foot slip (:func:`foot_slip`), and the task's own success on that episode.
    """
    import json
    from pathlib import Path

    import torch

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    feet = foot_bodies(task.sim)
    names = [task.model.body_names[b] for b in feet]
    commands = list(speeds) if getattr(task, "command_speed", None) else [None]
    report: Dict[str, object] = {"feet": names, "dt": task.dt, "episodes": []}
    for k, cmd in enumerate(commands):
        qs: list = []
        contacts, ts, xy = rollout_contacts(task, policy, None if cmd is None else [cmd], states=qs)
        skip = len(contacts) // 4                     # the start transient
        g = analyze_gait(contacts[skip:], task.dt, names, xy)
        slip = foot_slip(task.sim, torch.stack(qs[skip:]), feet, contacts[skip:], task.dt)
        entry = dict(g.as_dict(), foot_slip_m_s=[None if x is None else round(x, 4) for x in slip],
                     command_m_s=cmd, success=bool(task.success(ts)[0]))
        report["episodes"].append(entry)
        suffix = "" if cmd is None else f"_{cmd:g}"
        footfall_png(contacts, task.dt, names, out / f"footfall{suffix}.png",
                     title=f"{task.name}{'' if cmd is None else f' at {cmd:g} m/s'}: {g.name}, "
                           + (f"{g.frequency_hz:.2f} Hz" if np.isfinite(g.frequency_hz) else "no stride")
                           + f", duty {np.mean(g.duty_factor):.2f}", roles=g.roles)
    (out / "gait.json").write_text(json.dumps(report, indent=1))
    return report
