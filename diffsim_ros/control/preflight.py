"""Preflight: a robot's topics checked against a checkpoint before its policy goes active, ROS-free.

    seen = Observed(duration_s=3.0, command_topic="/position_controller/commands", command_subscribers=1)
    seen.joint_states.append(JointSample(receive_ns, stamp_ns, names, positions))
    seen.imu.append(FrameSample(receive_ns, stamp_ns, "imu_link"))
    report = preflight(runner, seen)          # report.go, report.text()

What a few seconds of the robot's topics held (live, ``diffsim-ros preflight``, or from a bag)
is judged against what the checkpoint was trained on. Each check is ``ok``, ``warn`` (worth
knowing, not a reason to stop) or ``fail`` (NO-GO):

- **joints**: every joint of the checkpoint's robot is named on the joint state topic (missing:
  fail); extra names and another order are reported (the controller matches by name);
- **limits**: every measured position within the URDF limits (+ ``position_margin``), every value
  finite;
- **rate**: the state arrives at least ``rate_tolerance`` x the policy's control rate (1 / dt);
  **jitter**: the 99th percentile of its periods within ``jitter_factor`` x the median;
- **age**: receive time minus header stamp at most ``max_age_s`` (median) and never negative by
  more than it (a clock ahead of the receiver's); where /clock ticks (a simulator), its time at
  receipt instead of the receiver's;
- **frames**: odometry's ``header.frame_id`` and ``child_frame_id`` as configured, an IMU frame named;
- **imu**: where the policy needs one (a legged robot observation) the IMU arrives at the state rate
  with unit quaternions;
- **command**: at least one subscriber on the command topic (live only: a bag cannot say).

A checkpoint whose robot needs no joints (a quadrotor) skips the joint checks and judges /odom.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional, Sequence

import numpy as np

__all__ = ["JointSample", "FrameSample", "Observed", "Check", "PreflightReport", "preflight"]


@dataclass
class JointSample:
    receive_ns: int
    stamp_ns: int
    names: Sequence[str]
    position: Sequence[float]


@dataclass
class FrameSample:
    """An IMU or odometry message: times, frames, orientation (x y z w) when it has one."""

    receive_ns: int
    stamp_ns: int
    frame_id: str
    child_frame_id: str = ""
    orientation: Optional[Sequence[float]] = None


@dataclass
class Observed:
    duration_s: float
    joint_states: List[JointSample] = field(default_factory=list)
    imu: List[FrameSample] = field(default_factory=list)
    odom: List[FrameSample] = field(default_factory=list)
    command_topic: str = ""
    command_subscribers: Optional[int] = None          # None: not known (a bag)
    source: str = "live"
    #: (receive ns, clock ns) of /clock messages: a simulator's time, which its stamps follow
    clock: List[tuple] = field(default_factory=list)

    def now_at(self, receive_ns: np.ndarray) -> np.ndarray:
        """Return the publishers' clock at these receive times: the receiver's own, or /clock's when it ticks."""
        if len(self.clock) < 2:
            return receive_ns.astype(np.float64)
        c = np.array(sorted(self.clock), dtype=np.float64)
        return np.interp(receive_ns.astype(np.float64), c[:, 0], c[:, 1])


@dataclass
class Check:
    name: str
    status: str          # ok | warn | fail
    detail: str


@dataclass
class PreflightReport:
    checks: List[Check]

    @property
    def go(self) -> bool:
        return not any(c.status == "fail" for c in self.checks)

    @property
    def reasons(self) -> List[str]:
        return [f"{c.name}: {c.detail}" for c in self.checks if c.status == "fail"]

    def text(self) -> str:
        mark = {"ok": "ok  ", "warn": "WARN", "fail": "FAIL"}
        lines = [f"[{mark[c.status]}] {c.name}: {c.detail}" for c in self.checks]
        lines.append("GO" if self.go else f"NO-GO ({len(self.reasons)} failed: {'; '.join(self.reasons)})")
        return "\n".join(lines)


def _periods(samples) -> np.ndarray:
    t = np.array(sorted(s.receive_ns for s in samples), dtype=np.float64) / 1e9
    return np.diff(t)


def _timing_checks(what: str, samples, control_hz: float, cfg: dict, out: List[Check], seen: "Observed") -> None:
    duration_s = seen.duration_s
    if len(samples) < 2:
        out.append(Check(f"{what} rate", "fail", f"{len(samples)} message(s) in {duration_s:.1f} s"))
        return
    p = _periods(samples)
    med = float(np.median(p))
    hz = 1.0 / med if med > 0 else float("inf")
    need = cfg["rate_tolerance"] * control_hz
    out.append(Check(f"{what} rate", "ok" if hz >= need else "fail",
                     f"{hz:.1f} Hz (median period {med * 1e3:.2f} ms); the policy runs at {control_hz:g} Hz"
                     + ("" if hz >= need else f", needs at least {need:.1f} Hz")))
    p99 = float(np.percentile(p, 99))
    bad = med > 0 and p99 > cfg["jitter_factor"] * med
    out.append(Check(f"{what} jitter", "warn" if bad else "ok",
                     f"p99 period {p99 * 1e3:.2f} ms, {p99 / med if med > 0 else float('inf'):.1f}x the median"
                     + (f" (more than {cfg['jitter_factor']:g}x)" if bad else "")))
    recv = np.array([s.receive_ns for s in samples], dtype=np.int64)
    age = (seen.now_at(recv) - np.array([s.stamp_ns for s in samples], dtype=np.float64)) / 1e9
    med_age, low = float(np.median(age)), float(age.min())
    against = " against /clock" if len(seen.clock) >= 2 else ""
    if low < -cfg["max_age_s"]:
        out.append(Check(f"{what} stamp age", "fail", f"stamps up to {-low * 1e3:.1f} ms in the future of the "
                                                      f"receiver's clock{against} (clocks not synchronised, or a "
                                                      "simulator's time without /clock)"))
    elif med_age > cfg["max_age_s"]:
        out.append(Check(f"{what} stamp age", "fail", f"median {med_age * 1e3:.1f} ms old when received{against} (at "
                                                      f"most {cfg['max_age_s'] * 1e3:.0f} ms; a stamp on another "
                                                      "clock, e.g. a simulator's without /clock, reads so too)"))
    else:
        out.append(Check(f"{what} stamp age", "ok", f"median {med_age * 1e3:.2f} ms, largest {age.max() * 1e3:.2f} ms"
                                                    f"{against}"))


def preflight(runner, seen: Observed, frame_id: str = "world", child_frame_id: str = "base_link",
              position_margin: float = 0.1, rate_tolerance: float = 0.9, jitter_factor: float = 3.0,
              max_age_s: float = 0.05, timing: bool = True) -> PreflightReport:
    """Judge ``seen`` against ``runner`` (a PolicyRunner: its robot, joints, limits, dt); module doc.

    ``timing`` False skips rate, jitter and stamp age (a lockstep plant steps when commanded: its
    state rate is the controller's own).
    """
    cfg = dict(rate_tolerance=rate_tolerance, jitter_factor=jitter_factor, max_age_s=max_age_s)
    timed = _timing_checks if timing else (lambda *args: None)
    out: List[Check] = []
    control_hz = 1.0 / float(runner.dt)
    joints = list(runner.joint_names)
    if runner.kind != "quadrotor":
        names = [list(s.names) for s in seen.joint_states]
        if not names:
            out.append(Check("joints", "fail", f"no joint state received in {seen.duration_s:.1f} s"))
        else:
            last = names[-1]
            missing = [j for j in joints if j not in last]
            extra = [j for j in last if j not in joints]
            order = [j for j in last if j in joints]
            if missing:
                out.append(Check("joints", "fail", f"missing {missing} of the checkpoint's {joints}"
                                 + (f"; extra {extra}" if extra else "")))
            else:
                notes = []
                if extra:
                    notes.append(f"extra {extra} (ignored)")
                if order != joints:
                    notes.append(f"reordered: {order} (the checkpoint's order: {joints}; matched by name)")
                out.append(Check("joints", "warn" if notes else "ok",
                                 "; ".join(notes) if notes else f"all {len(joints)} in the checkpoint's order"))
                m = runner.model
                lo = m.lower.detach().double().cpu().numpy().reshape(-1)[:len(joints)]
                hi = m.upper.detach().double().cpu().numpy().reshape(-1)[:len(joints)]
                worst = {}
                for s in seen.joint_states:
                    pos = dict(zip(s.names, s.position))
                    for j, a, b in zip(joints, lo, hi):
                        if j not in pos:
                            continue
                        x = float(pos[j])
                        if not np.isfinite(x):
                            worst[j] = f"{x}"
                        elif x < a - position_margin or x > b + position_margin:
                            worst[j] = f"{x:.3f} outside [{a:.3f}, {b:.3f}]"
                out.append(Check("limits", "fail" if worst else "ok",
                                 "; ".join(f"{j} {w}" for j, w in worst.items()) if worst
                                 else f"every position within the URDF limits (+{position_margin:g})"))
            timed("joint state", seen.joint_states, control_hz, cfg, out, seen)
    needs_odom = bool(getattr(runner, "needs_odometry", runner.kind != "arm")) and runner.kind != "arm"
    if needs_odom:
        if not seen.odom:
            out.append(Check("odometry", "fail", f"none received in {seen.duration_s:.1f} s"))
        else:
            timed("odometry", seen.odom, control_hz, cfg, out, seen)
            bad = {(s.frame_id, s.child_frame_id) for s in seen.odom
                   if (frame_id and s.frame_id != frame_id) or (child_frame_id and s.child_frame_id != child_frame_id)}
            out.append(Check("frames", "fail" if bad else "ok",
                             f"odometry frames {sorted(bad)}, expected ({frame_id!r}, {child_frame_id!r})" if bad
                             else f"odometry in {frame_id!r}, body {child_frame_id!r}"))
    needs_imu = runner.kind == "legged" and not needs_odom
    if needs_imu:
        if not seen.imu:
            out.append(Check("imu", "fail", f"the policy observes the IMU; none received in {seen.duration_s:.1f} s"))
        else:
            timed("imu", seen.imu, control_hz, cfg, out, seen)
            norms = [abs(float(np.linalg.norm(s.orientation)) - 1.0) for s in seen.imu if s.orientation is not None]
            unnamed = sum(1 for s in seen.imu if not s.frame_id)
            bad_q = [n for n in norms if not n <= 0.01]
            detail = []
            if bad_q:
                detail.append(f"{len(bad_q)} orientation(s) not a unit quaternion (|q| off by up to {max(bad_q):.3g})")
            if unnamed:
                detail.append(f"{unnamed} message(s) without header.frame_id")
            out.append(Check("imu", "fail" if detail else "ok",
                             "; ".join(detail) if detail else f"unit quaternions, frame {seen.imu[-1].frame_id!r}"))
    if seen.command_subscribers is None:
        out.append(Check("command", "warn", f"subscribers of {seen.command_topic or 'the command topic'} not known "
                                            f"({seen.source})"))
    else:
        out.append(Check("command", "ok" if seen.command_subscribers > 0 else "fail",
                         f"{seen.command_subscribers} subscriber(s) on {seen.command_topic}"
                         + ("" if seen.command_subscribers > 0 else ": nothing would receive the commands")))
    return PreflightReport(out)
