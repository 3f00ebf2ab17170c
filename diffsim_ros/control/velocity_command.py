"""Velocity commands from /cmd_vel (geometry_msgs/Twist), ROS-free.

    vc = VelocityCommand.for_runner(runner, timeout_s=0.5)   # None: not a velocity policy
    update = vc.on_twist(linear=(0.4, 0, 0), angular=(0, 0, 0), now_ns=t)
    goal = vc.goal(now_ns)        # Goal: target (the policy's command) or stand, and why

The policies this serves were trained on a range of commands, and a command outside it is a
state the policy never saw. So every request is mapped into that range, and the caller is
told what was changed:

- a legged walker (``task.command_speed: [low, high]``, a forward speed in m/s along the
  base's heading) takes ``linear.x``; ``linear.y``, ``linear.z`` and ``angular`` are ignored
  (it was not trained to side-step or turn on command), and a request past ``high`` is
  clamped to it. A walker trained without standing still (``low > 0``) cannot walk at zero:
  a request below ``low / 2`` (zero, backwards) makes it **stand** (the task's stance joint
  positions, what the node sends instead of the policy), one between ``low / 2`` and ``low``
  is raised to ``low``, reported as clamped. Where ``low <= 0`` zero is the policy's own.
- a quadrotor velocity policy (``task.mode: velocity``, each axis within
  ``+-max_speed_command``) takes ``linear`` as its commanded velocity in the world frame, the
  frame it was trained in (ENU, z up); ``angular`` is ignored; each axis is clamped.

No new request for ``timeout_s`` returns to the zero command: the walker stands (or walks at
zero where trained to), the quadrotor hovers. Before the first request, and after
:meth:`release` (a goal set another way, policy_controller's ``target`` topic), :meth:`goal` is
None: the caller's own goal is in force. A non-finite request is rejected and changes nothing.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional, Sequence

import numpy as np

__all__ = ["VelocityCommand", "VelocityUpdate", "Goal"]


@dataclass
class VelocityUpdate:
    """What became of one request.

    ``accepted``; ``target`` (the command the policy gets, None when the robot stands instead),
    ``clamped`` (the fields moved into the trained range) and ``ignored`` (nonzero fields the policy
    has no input for), ``reason`` when rejected.
    """

    accepted: bool
    target: Optional[np.ndarray] = None
    stand: bool = False
    clamped: List[str] = field(default_factory=list)
    ignored: List[str] = field(default_factory=list)
    reason: str = ""


@dataclass
class Goal:
    """The command in force now: ``target`` for the policy, or ``stand`` (no policy: the stance).

    ``timed_out``: no request for ``timeout_s``, the zero command.
    """

    target: Optional[np.ndarray]
    stand: bool
    timed_out: bool


class VelocityCommand:
    """Twist requests mapped into a velocity policy's trained range (module doc)."""

    def __init__(self, kind: str, low: Sequence[float], high: Sequence[float], timeout_s: float = 0.5):
        if kind not in ("legged", "quadrotor"):
            raise ValueError(f"velocity commands drive a legged walker or a quadrotor, not a '{kind}' policy")
        self.kind = kind
        self.low = np.asarray(low, dtype=np.float64).reshape(-1)
        self.high = np.asarray(high, dtype=np.float64).reshape(-1)
        if self.low.shape != self.high.shape or self.low.size != (1 if kind == "legged" else 3):
            raise ValueError(f"a {kind} velocity range has {1 if kind == 'legged' else 3} axes, got "
                             f"{self.low.tolist()} .. {self.high.tolist()}")
        if not (np.all(np.isfinite(self.low)) and np.all(np.isfinite(self.high)) and np.all(self.low <= self.high)):
            raise ValueError(f"velocity range {self.low.tolist()} .. {self.high.tolist()} needs finite low <= high")
        if not timeout_s > 0:
            raise ValueError(f"cmd_vel timeout must be > 0 s, got {timeout_s}")
        self.timeout_ns = int(float(timeout_s) * 1e9)
        self.fields = ["linear.x"] if kind == "legged" else ["linear.x", "linear.y", "linear.z"]
        # Where zero is outside the trained range (a walker trained at 0.2-0.8 m/s) the zero
        # command is to stand; otherwise it is the policy's own zero.
        self.can_stand_by_policy = bool(np.all(self.low <= 0.0) and np.all(self.high >= 0.0))
        self.last: Optional[VelocityUpdate] = None
        self.last_ns: Optional[int] = None
        self.counts = {"cmd_vel_received": 0, "cmd_vel_rejected": 0, "cmd_vel_clamped": 0, "cmd_vel_timeouts": 0}
        self._timed_out = True

    @classmethod
    def for_runner(cls, runner, timeout_s: float = 0.5) -> Optional["VelocityCommand"]:
        """Return the velocity command of a checkpoint's policy (a PolicyRunner).

        None when the policy takes no velocity command (a reach, a hover, a walker trained for
        forward progress).
        """
        task = runner.task
        if runner.kind == "legged":
            speed = getattr(task, "command_speed", None)
            if speed is None:
                return None
            return cls("legged", [speed[0]], [speed[1]], timeout_s)
        if runner.kind == "quadrotor" and getattr(task, "mode", None) == "velocity":
            top = float(task.max_speed_command)
            return cls("quadrotor", [-top] * 3, [top] * 3, timeout_s)
        return None

    def describe(self) -> str:
        rng = ", ".join(f"{f} {lo:g} .. {hi:g}" for f, lo, hi in zip(self.fields, self.low, self.high))
        zero = "the policy's zero" if self.can_stand_by_policy else "stand (the stance)"
        return f"{rng} m/s; after {self.timeout_ns / 1e9:g} s without a request: {zero}"

    @property
    def zero(self) -> Goal:
        if self.can_stand_by_policy:
            return Goal(np.zeros(self.low.size), False, True)
        return Goal(None, True, True)

    def on_twist(self, linear: Sequence[float], angular: Sequence[float], now_ns: int) -> VelocityUpdate:
        """Map one request (``linear``, ``angular``: x, y, z in m/s and rad/s) into the trained range."""
        self.counts["cmd_vel_received"] += 1
        lin = np.asarray(linear, dtype=np.float64).reshape(-1)
        ang = np.asarray(angular, dtype=np.float64).reshape(-1)
        if lin.size != 3 or ang.size != 3 or not (np.all(np.isfinite(lin)) and np.all(np.isfinite(ang))):
            self.counts["cmd_vel_rejected"] += 1
            return VelocityUpdate(False, reason=f"non-finite or malformed request linear {lin.tolist()} angular "
                                                f"{ang.tolist()}")
        n = self.low.size
        want = lin[:n]
        rest = [(f"linear.{a}", x) for a, x in zip("xyz", lin)][n:] + [(f"angular.{a}", x) for a, x in zip("xyz", ang)]
        ignored = [name for name, x in rest if x != 0.0]
        if self.kind == "legged" and not self.can_stand_by_policy and want[0] < self.low[0] / 2.0:
            up = VelocityUpdate(True, None, True, [], ignored)
        else:
            target = np.minimum(np.maximum(want, self.low), self.high)
            clamped = [f for f, a, b in zip(self.fields, want, target) if a != b]
            up = VelocityUpdate(True, target, False, clamped, ignored)
        self.counts["cmd_vel_clamped"] += int(bool(up.clamped))
        self.last, self.last_ns = up, int(now_ns)
        self._timed_out = False
        return up

    def release(self) -> None:
        """Forget the requests: the caller's own goal is in force again (:meth:`goal` None)."""
        self.last, self.last_ns, self._timed_out = None, None, True

    def goal(self, now_ns: int) -> Optional[Goal]:
        """Return the command in force at ``now_ns``.

        The last request, the zero command once it is older than ``timeout_s``, None before the
        first request (or after :meth:`release`).
        """
        if self.last is None:
            return None
        if now_ns - self.last_ns > self.timeout_ns:
            if not self._timed_out:
                self.counts["cmd_vel_timeouts"] += 1
            self._timed_out = True
            return self.zero
        return Goal(None if self.last.stand else self.last.target.copy(), self.last.stand, False)

    def status(self, now_ns: int) -> dict:
        """Diagnostics key/values: the command in force and the counters."""
        g = self.goal(now_ns)
        if g is None:
            now = "none received (the target parameter or topic is in force)"
        else:
            now = "stand" if g.stand else str([round(float(x), 4) for x in g.target])
            now += " (timed out: the zero command)" if g.timed_out else ""
        vals = {"cmd_vel_command": now, "cmd_vel_range": self.describe()}
        if self.last is not None:
            vals["cmd_vel_last_clamped"] = ", ".join(self.last.clamped) or "none"
            vals["cmd_vel_last_ignored"] = ", ".join(self.last.ignored) or "none"
        vals.update({k: str(v) for k, v in self.counts.items()})
        return vals
