"""policy_controller's preflight at start, ROS-free.

The robot's states it receives before the policy goes active, judged by control/preflight.py as
``diffsim-ros preflight`` judges them.

    pf = StartupPreflight(duration_s=1.0, lockstep=False, required=True)
    pf.record("joint_states", clock_ns, stamp_ns, names=names, position=position)   # each state
    report = pf.judge(runner, base_from_imu, command_topic, subscriber_count)        # None until due
    hold = pf.hold_reason()           # the supervisor's preflight_hold on a NO-GO (None: run)

Timer mode listens over the first ``duration_s`` of states (nothing is sent meanwhile); lockstep
judges the first state (the plant steps only when commanded, so there is no rate to measure).
"""
from __future__ import annotations

import time
from typing import Callable, Optional, Sequence

from .preflight import FrameSample, JointSample, Observed, PreflightReport, preflight

__all__ = ["StartupPreflight"]


class StartupPreflight:
    def __init__(self, duration_s: float, lockstep: bool, required: bool):
        self.seen = Observed(duration_s=float(duration_s), source="policy_controller")
        self.lockstep, self.required = lockstep, required
        self.first: Optional[int] = None         # steady ns of the first state
        self.untimed = False                      # a state came before the clock ran (use_sim_time, no /clock)
        self.report: Optional[PreflightReport] = None

    @property
    def pending(self) -> bool:
        """No verdict yet."""
        return self.report is None

    def record(self, kind: str, clock_ns: int, stamp_ns: int, *, names: Sequence[str] = (),
               position: Sequence[float] = (), frame_id: str = "", child_frame_id: str = "",
               orientation: Optional[Sequence[float]] = None) -> None:
        """Record a state message (``kind``: joint_states, odom or imu) received at ``clock_ns``.

        ``clock_ns`` is on the node's clock (simulated time under use_sim_time, as the stamps then
        are; 0 before the first /clock: then the wall clock, and no age is judged).
        """
        if clock_ns == 0:
            self.untimed, clock_ns = True, time.time_ns()
        if kind == "joint_states":
            self.seen.joint_states.append(JointSample(clock_ns, stamp_ns, list(names), list(position)))
        else:
            sample = FrameSample(clock_ns, stamp_ns, frame_id, child_frame_id,
                                 None if orientation is None else list(orientation))
            (self.seen.imu if kind == "imu" else self.seen.odom).append(sample)
        if self.first is None:
            self.first = time.monotonic_ns()

    def judge(self, runner, base_from_imu: bool, command_topic: str, command_subscribers: Callable[[], int],
              **checks) -> Optional[PreflightReport]:
        """Return the verdict once it is due, else None.

        It is due once its window has passed (lockstep: at once) and each topic the policy needs has
        spoken, or 2 s after that at the latest; None before (and after: it is given once).
        ``checks``: preflight()'s frame_id, child_frame_id, position_margin.
        """
        if self.report is not None or self.first is None:
            return None
        pf = self.seen
        waited = (time.monotonic_ns() - self.first) / 1e9
        window = 0.0 if self.lockstep else pf.duration_s
        need = []
        if runner.kind != "quadrotor":
            need.append(pf.joint_states)
        if runner.kind != "arm":
            need.append(pf.imu if base_from_imu else pf.odom)
        if waited < window or (not all(need) and waited < window + 2.0):
            return None
        pf.command_topic = command_topic
        pf.command_subscribers = int(command_subscribers())
        pf.duration_s = max(waited, 1e-3)
        self.report = preflight(runner, pf, timing=not (self.lockstep or self.untimed or window == 0.0), **checks)
        return self.report

    def hold_reason(self) -> Optional[str]:
        """Return the supervisor's hold after a NO-GO when the preflight is required (None: run)."""
        rep = self.report
        if rep is None or rep.go or not self.required:
            return None
        return f"preflight NO-GO ({'; '.join(rep.reasons)}); ~/reset to run the policy anyway"

    def status(self) -> str:
        """Return the diagnostics value: listening, GO or NO-GO with the reasons."""
        rep = self.report
        return "listening" if rep is None else "GO" if rep.go else f"NO-GO: {'; '.join(rep.reasons)}"
