"""What policy_controller reports, ROS-free.

Its loop timing, the /diagnostics status and key/values, the latched metadata and the counters it
prints at shutdown.

The node fills the messages (diagnostic_msgs/DiagnosticStatus, std_msgs/String) from these
plain values.
"""
from __future__ import annotations

import json
import math
import sys
import time
from collections import deque
from pathlib import Path
from typing import Any, Dict, Mapping, Optional, Sequence, Tuple

import numpy as np

__all__ = ["percentile", "merged_counts", "LoopTiming", "diagnostic_summary", "diagnostics_values",
           "metadata_json", "shutdown_stats", "report_stats"]

NODE_COUNTERS = ("commands_sent", "predictions_sent", "diagnostics_sent", "metadata_sent", "missed_deadlines",
                 "errors")


def percentile(values, q: float) -> float:
    if not values:
        return float("nan")
    return float(np.percentile(np.asarray(values, dtype=np.float64), q))


def merged_counts(supervisor_counts: Mapping[str, int], node_counts: Mapping[str, int]) -> Dict[str, int]:
    """Return the supervisor's counters and the node's (errors summed)."""
    out = dict(supervisor_counts)
    for k, val in node_counts.items():
        out[k] = out.get(k, 0) + val
    return out


class LoopTiming:
    """The control loop's compute times and timer periods (ms, the latest 5,000 of each).

    Also the steady time of the control timer's last tick.
    """

    def __init__(self, rate: float, lockstep: bool):
        self.rate, self.lockstep = rate, lockstep
        self.compute_ms: deque = deque(maxlen=5000)
        self.period_ms: deque = deque(maxlen=5000)
        self.last_tick: Optional[float] = None

    def tick(self, now: float) -> bool:
        """Record a tick of the control timer at ``now`` (time.monotonic()).

        True when its period was over 1.5 control periods (a missed deadline).
        """
        missed = False
        if self.last_tick is not None:
            period = (now - self.last_tick) * 1e3
            self.period_ms.append(period)
            missed = period > 1.5e3 / self.rate
        self.last_tick = now
        return missed

    def stalled_s(self) -> float:
        """Timer mode: seconds (steady) since the control timer last ran beyond three periods.

        0 while it runs (or before its first tick).
        """
        if self.lockstep or self.last_tick is None:
            return 0.0
        late = time.monotonic() - self.last_tick
        return late if late > 3.0 / self.rate else 0.0


def diagnostic_summary(sup, velocity, runner, now_ns: int, *, excite: bool, timer_stalled: bool) -> Tuple[str, str]:
    """Return the /diagnostics level (OK, WARN or ERROR) and message.

    Asks the supervisor first whether the policy may run (a stale state becomes a latched fault
    there).
    """
    blocked = sup.blocked(now_ns)
    if sup.estop:
        return "ERROR", "emergency stop latched"
    if blocked is not None:
        return "WARN", f"safe command: {blocked}" + ("; the control timer's clock stopped" if timer_stalled else "")
    if excite:
        return "OK", "excitation finished: holding" if runner.finished else "running the excitation"
    level, message = "OK", "running the policy"
    goal = None if velocity is None else velocity.goal(time.monotonic_ns())
    last = None if velocity is None else velocity.last
    if goal is not None and goal.stand:
        message = "standing (/cmd_vel: " + ("timed out)" if goal.timed_out else "stop)")
    if goal is not None and not goal.timed_out and last is not None and last.clamped:
        level = "WARN"
        message += f"; /cmd_vel clamped to the trained range ({', '.join(last.clamped)})"
    return level, message


def diagnostics_values(sup, velocity, runner, counts: Mapping[str, int], timing: LoopTiming, *, interface: str,
                       command_topic: str, mode: str, clock_jumps_back: int, preflight: str) -> Dict[str, str]:
    """Return the /diagnostics key/values.

    The supervisor's, the node's (interface, loop timing, counters, the control timer, the
    preflight), the /cmd_vel mapping's and the excitation's.
    """
    vals = sup.status(time.monotonic_ns())
    vals.update({"interface": interface, "command_topic": command_topic,
                 "mode": "lockstep" if timing.lockstep else f"{timing.rate:g} Hz",
                 "compute_ms_p50": f"{percentile(timing.compute_ms, 50):.3f}",
                 "compute_ms_p99": f"{percentile(timing.compute_ms, 99):.3f}",
                 "period_ms_p50": f"{percentile(timing.period_ms, 50):.3f}",
                 "period_ms_p99": f"{percentile(timing.period_ms, 99):.3f}"})
    vals.update({k: str(v) for k, v in counts.items()})
    vals["controller_mode"] = mode
    stalled = timing.stalled_s()
    vals["control_timer"] = ("lockstep" if timing.lockstep else "running" if stalled == 0 else
                             f"stalled {stalled:.1f} s: the clock it runs on stopped (use_sim_time and no "
                             "/clock: the simulator or driver is gone?)")
    vals["clock_jumps_back"] = str(clock_jumps_back)
    vals["preflight"] = preflight
    if velocity is not None:
        vals.update(velocity.status(time.monotonic_ns()))
    if mode == "excite":
        vals["excitation_commands"] = str(runner.k)
        vals["excitation_finished"] = str(runner.finished).lower()
    return vals


def metadata_json(runner, *, mode: str, interface: str, controller: str, command_topic: str,
                  controller_joints: Sequence[str], lockstep: bool, rate: float, safe_command: str, node: str) -> str:
    """Return the latched /diffsim/metadata text.

    The checkpoint's metadata (mode policy) or the excitation's (mode excite) and how the node runs
    it.
    """
    from ..learning.checkpoint import json_safe

    excite = mode == "excite"
    doc: Dict[str, Any] = {
        "checkpoint": None if excite else runner.meta, "config": runner.meta.get("config"), "interface": interface,
        "mode": mode, "controller": controller if interface == "forward_command" else None,
        "command_topic": command_topic, "controller_joints": controller_joints,
        "lockstep": lockstep, "rate_hz": None if lockstep else rate,
        "safe_command": safe_command, "node": node, "policy_format": None if excite else runner.policy_format}
    if excite:
        doc["excitation"] = dict(runner.meta["excitation"], steps_total=int(runner.signal.steps))
    return json.dumps(json_safe(doc), allow_nan=False)


def shutdown_stats(counts: Mapping[str, int], timing: LoopTiming, unacknowledged: Sequence[str],
                   output_topic: str, command_topic: str, predicted_state_topic: str, metadata_topic: str,
                   diagnostics_topic: str) -> Dict[str, Any]:
    """Return the statistics printed at shutdown.

    The counters at shutdown, the messages published per topic (for comparison with a recorder's
    bag), the compute time percentiles and the topics a reliable subscriber had not acknowledged
    when the process gave up waiting.
    """
    stats: Dict[str, Any] = dict(counts)
    stats["unacknowledged_topics"] = list(unacknowledged)
    stats["published"] = {output_topic: counts["commands_sent"], command_topic: counts["commands_sent"],
                          predicted_state_topic: counts["predictions_sent"],
                          metadata_topic: counts["metadata_sent"], diagnostics_topic: counts["diagnostics_sent"]}
    for q in (50, 99):
        val = percentile(timing.compute_ms, q)
        stats[f"compute_ms_p{q}"] = None if math.isnan(val) else round(val, 4)
    return stats


def report_stats(stats: Mapping[str, Any], stats_file: str, name: str) -> None:
    """``stats`` to ``stats_file`` (JSON; empty: no file) and as one line to stderr."""
    if stats_file:
        try:
            Path(stats_file).write_text(json.dumps(stats, indent=1))
        except OSError as e:
            print(f"{name}: cannot write stats_file {stats_file}: {e}", file=sys.stderr)
    print(f"{name}: published " + json.dumps(stats), file=sys.stderr, flush=True)
