"""policy_controller's loop without ROS, between the states it receives and the commands it sends.

It runs around the supervisor (control/supervisor.py).

The node converts each message into the supervisor's records (JointStateIn, OdometryIn, ImuIn)
and calls the ``on_*`` method; the loop decides what is sent and calls back the
node's publishers:

    loop = ControlLoop(settings, log, clock_ns=..., publish=..., publish_prediction=...,
                       command_subscribers=..., recorder_subscribers=..., command_topic="/position_controller/commands")
    loop.on_joint_state(JointStateIn(names, q, v, effort, stamp_ns))     # lockstep: answered
    loop.control_tick()          # timer mode, at rate_hz
    loop.watchdog_tick()         # steady clock, at watchdog_hz

``log`` is the node's logger (info, warning and error, with ``throttle_duration_sec``). Each
entry point (``on_*``, the ticks, ``diagnostics``) holds the loop's lock; the callbacks run under it.
What it decides, in order: the start-up preflight (control/startup_preflight.py) judges the first
states; the gates wait_for_subscribers / wait_for_recorders hold every answer until they open
once; lockstep answers each new state once (a rejected one with the safe command at once), the
timer answers the latest; the command goes out before the prediction (the simulator step never
delays it), the prediction once per state every ``predict_every`` commands; any exception on the
way latches the safe command (sent at once where possible).
"""
from __future__ import annotations

import functools
import threading
import time
from typing import Any, Callable, Dict, Optional, Sequence, Tuple

import numpy as np
import torch

from . import controller_status as status
from .controller_settings import Settings
from .startup_preflight import StartupPreflight
from .supervisor import ImuIn, JointStateIn, OdometryIn

__all__ = ["ControlLoop"]


def _locked(method):
    """Mark an entry point of the loop: it runs holding the loop's lock."""
    # functools.wraps keeps the method's signature, which rclpy's executors inspect: a timer callback
    # without parameters is called without a TimerInfo.
    @functools.wraps(method)
    def run(self, *args):
        with self.lock:
            return method(self, *args)
    return run


class ControlLoop:
    """The node's decisions between its inputs and its publishers (module doc)."""

    def __init__(self, s: Settings, log, *, clock_ns: Callable[[], int],
                 publish: Callable[[np.ndarray, int, Any], None], publish_prediction: Callable[[Any, int], None],
                 command_subscribers: Callable[[], int], recorder_subscribers: Callable[[], Sequence[int]],
                 command_topic: str):
        self.settings, self.lock = s, threading.Lock()
        self.sup, self.runner, self.velocity, self.mode = s.sup, s.runner, s.velocity, s.mode
        self.lockstep, self.dt, self.predict_every = s.lockstep, s.runner.dt, s.predict_every
        self.log, self.command_topic, self._clock_ns = log, command_topic, clock_ns
        self._publish, self._publish_prediction = publish, publish_prediction
        self._command_subscribers, self._recorder_subscribers = command_subscribers, recorder_subscribers
        self.preflight = (None if s.preflight_s is None
                          else StartupPreflight(s.preflight_s, s.lockstep, s.preflight_required))
        self.last_safe_reason = ""
        self._excite_done = False
        self.last_answered: Optional[int] = None
        self._last_predicted: Optional[int] = None
        self._gate_open = s.wait_subs <= 0 and s.wait_recs <= 0
        self.node_counts = {k: 0 for k in status.NODE_COUNTERS}
        self.timing = status.LoopTiming(s.rate, s.lockstep)
        self.clock_jumps_back = 0

    # ------------------------------------------------------------------ inputs
    @_locked
    def on_joint_state(self, js: JointStateIn) -> None:
        """Handle a joint state, received now on the node's clock.

        The node's clock is ``clock_ns()``; it is 0 under use_sim_time before the first /clock
        message: then only the order of the stamps is checked.
        """
        clock_ns = self._clock_ns()
        self._pf_record("joint_states", clock_ns, js.stamp_ns, names=js.names, position=js.position)
        self._on_verdict("joint_states", self.sup.on_joint_state(js, time.monotonic_ns(), clock_ns or None),
                         js.stamp_ns)

    @_locked
    def on_odometry(self, od: OdometryIn) -> None:
        clock_ns = self._clock_ns()
        self._pf_record("odom", clock_ns, od.stamp_ns, frame_id=od.frame_id, child_frame_id=od.child_frame_id,
                        orientation=od.orientation)
        self._on_verdict("odom", self.sup.on_odometry(od, time.monotonic_ns(), clock_ns or None), od.stamp_ns)

    @_locked
    def on_imu(self, imu: ImuIn, frame_id: str) -> None:
        clock_ns = self._clock_ns()
        self._pf_record("imu", clock_ns, imu.stamp_ns, frame_id=frame_id, orientation=imu.orientation)
        if self.sup.base_from_imu:       # a legged robot observation: the IMU is half the state
            self._on_verdict("imu", self.sup.on_imu(imu, time.monotonic_ns(), clock_ns or None), imu.stamp_ns)
            return
        v = self.sup.on_imu(imu, time.monotonic_ns())
        if not v.accepted:
            self.log.warning(f"rejected imu message: {v.reason}", throttle_duration_sec=1.0)

    @_locked
    def on_target(self, point: Sequence[float]) -> None:
        from ..learning.deploy import StateError

        try:
            before = None if self.sup.target is None else self.sup.target.clone()
            self.sup.set_target(list(point))
            if self.velocity is not None:
                self.velocity.release()          # the latest request wins: this goal now
            if before is None or not bool(torch.equal(before, self.sup.target)):
                # A streamed setpoint repeats its goal: only a change is logged.
                self.log.info(f"new target {self.sup.target[0].tolist()}")
        except StateError as e:
            self.log.warning(f"rejected target: {e}")

    @_locked
    def on_cmd_vel(self, linear: Sequence[float], angular: Sequence[float]) -> None:
        before = self.velocity.goal(time.monotonic_ns())
        up = self.velocity.on_twist(tuple(linear), tuple(angular), time.monotonic_ns())
        if not up.accepted:
            self.log.warning(f"rejected /cmd_vel: {up.reason}", throttle_duration_sec=1.0)
            return
        if up.clamped or up.ignored:
            self.log.warning(f"/cmd_vel outside what the policy was trained for: clamped {up.clamped or 'none'}, "
                             f"ignored {up.ignored or 'none'} ({self.velocity.describe()})", throttle_duration_sec=1.0)
        changed = (before is None or before.timed_out or before.stand != up.stand
                   or (not up.stand and not np.array_equal(before.target, up.target)))
        if changed:              # a joystick streams its request: only a change is logged
            self.log.info("/cmd_vel: stand" if up.stand else f"/cmd_vel: command {up.target.tolist()}")

    @_locked
    def on_estop(self, engaged: bool) -> str:
        message = self.sup.on_estop(engaged, time.monotonic_ns())
        self.log.warning(message)
        # At once on a timer loop; in lockstep the next state gets it (an extra command would
        # put a second one in flight in the plant's loop).
        if self.sup.estop and not self.lockstep:
            self.step()
        return message

    @_locked
    def on_reset(self) -> str:
        message = self.sup.reset(time.monotonic_ns())
        self.log.warning(f"reset: {message}")
        return message

    @_locked
    def on_clock_jump(self, back_s: float) -> bool:
        """Handle the node's clock jumping back ``back_s`` > 0 s (a driver or simulator restarted at time 0).

        The jump is latched as a fault until ~/reset (its states now stamped before the last
        accepted one are refused). True: timer mode, the control timer on that clock must start
        afresh.
        """
        self.clock_jumps_back += 1
        reason = (f"the clock jumped back {back_s:.3f} s (the robot driver or simulator restarted?): "
                  "safe command; its states are refused until ~/reset")
        self.sup.fault(reason, until_reset=True)
        self.log.error(reason)
        return not self.lockstep

    # ------------------------------------------------------------------ the preflight and the gates
    def _pf_record(self, kind: str, clock_ns: int, stamp_ns: int, **sample) -> None:
        if self.preflight is None or not self.preflight.pending:
            return
        self.preflight.record(kind, clock_ns, stamp_ns, **sample)
        self._pf_judge()

    def _pf_judge(self) -> None:
        pf = self.preflight
        if pf is None or not pf.pending:
            return
        cfg = self.sup.config
        rep = pf.judge(self.runner, self.sup.base_from_imu, self.command_topic, self._command_subscribers,
                       frame_id=cfg.frame_id, child_frame_id=cfg.child_frame_id,
                       position_margin=float(cfg.position_margin))
        if rep is None:
            return
        for line in rep.text().splitlines():
            (self.log.info if rep.go else self.log.error)(f"preflight: {line}")
        hold = pf.hold_reason()
        if hold is not None:
            self.sup.preflight_hold = hold

    def ready(self) -> bool:
        """Check the preflight's verdict, then the gates of wait_for_subscribers / wait_for_recorders.

        The gates are checked until they open once.
        """
        if self.preflight is not None and self.preflight.pending:
            return False
        if self._gate_open:
            return True
        s = self.settings
        if self._command_subscribers() < s.wait_subs:
            return False
        if any(n < s.wait_recs for n in self._recorder_subscribers()):
            return False
        self._gate_open = True
        self.log.info("subscribers matched: answering states")
        return True

    def _on_verdict(self, what: str, v, stamp: int) -> None:
        """After the supervisor judged a state: log a rejection, and in lockstep answer the state.

        In lockstep each new state is answered once (a fault with the safe command at once).
        doc/interfaces.md: a lockstep plant republishes its initial state until the first command;
        answering each copy would put two commands in flight, so a state with the stamp answered
        last is not answered.
        """
        if v.pending:                    # a legged robot's half state, waiting for its partner
            return
        if not v.accepted:
            self.log.warning(f"rejected {what} message: {v.reason}", throttle_duration_sec=1.0)
            if v.fault and self.lockstep and self.ready():
                self.step()
            return
        if not self.lockstep:
            return
        # Not v.repeat: a re-publication of a state that arrived before the gates opened has
        # not been answered yet, and the lockstep plant waits for exactly that answer.
        if stamp == self.last_answered or not self.ready():
            return
        self.last_answered = stamp
        self.step()

    # ------------------------------------------------------------------ the loop
    @_locked
    def control_tick(self) -> None:
        """Timer mode, at rate_hz: the command on the latest state."""
        if self.timing.tick(time.monotonic()):
            self.node_counts["missed_deadlines"] += 1
        self._pf_judge()
        if self.ready():
            self.step()

    @_locked
    def watchdog_tick(self) -> None:
        """Run the watchdog on the steady clock.

        Lockstep: every new state is answered, so the watchdog only speaks when states stop (the
        latest is older than state_timeout_s): the safe command at watchdog_hz. Timer mode: the same
        while the control timer is stalled (its clock, a simulator's, stopped with the simulator).
        """
        self._pf_judge()
        if (self.lockstep or self.timing.stalled_s() > 0) and self.sup.stale(time.monotonic_ns()) and self.ready():
            self.step()

    def _send(self, cmd: np.ndarray, stamp: int, state) -> None:
        self._publish(cmd, stamp, state)
        self.node_counts["commands_sent"] += 1

    def step(self) -> None:
        """Send one decision of the supervisor, then the prediction.

        The prediction goes after the command went out (the simulator step must not delay it). Any
        exception here latches the safe command.
        """
        t0 = time.perf_counter()
        try:
            tick = self.sup.tick(time.monotonic_ns())
            if tick.command is None:
                return
            self._send(tick.command, tick.stamp, tick.state)
        except Exception as e:  # noqa: BLE001 - a failing step must not take the node down
            self.fault(f"sending the command: {type(e).__name__}: {e}")
            return
        if not tick.policy:
            if tick.reason != self.last_safe_reason:
                # A reason that changes with every state (a stamp going backwards) once a second.
                self.log.warning(f"safe command ({self.sup.safe_description}): {tick.reason}",
                                 throttle_duration_sec=1.0)
                self.last_safe_reason = tick.reason
            return
        self.timing.compute_ms.append((time.perf_counter() - t0) * 1e3)
        if self.lockstep and (time.perf_counter() - t0) > self.dt:
            self.node_counts["missed_deadlines"] += 1
        if self.last_safe_reason:
            self.log.info(f"policy resumed (was safe: {self.last_safe_reason})")
            self.last_safe_reason = ""
        if self.mode == "excite" and self.runner.finished and not self._excite_done:
            self._excite_done = True
            self.log.info(f"excitation finished after {self.runner.k} commands: holding "
                          f"{'the centre' if self.runner.kind == 'arm' else 'hover'}")
        # One prediction per state: a timer faster than the state rate recomputes the command
        # from the same state, whose prediction is already out.
        n = self.sup.counts["policy_commands"]
        if self.predict_every > 0 and tick.stamp != self._last_predicted and (n - 1) % self.predict_every == 0:
            self._last_predicted = tick.stamp
            try:
                pred = self.runner.predict(tick.state, tick.command)
                self._publish_prediction(pred, tick.stamp + int(round(self.dt * 1e9)))
                self.node_counts["predictions_sent"] += 1
            except Exception as e:  # noqa: BLE001
                self.fault(f"prediction: {type(e).__name__}: {e}")

    def fault(self, reason: str) -> None:
        """Handle an exception in the control path: latched safe command, sent at once when possible."""
        self.node_counts["errors"] += 1
        self.sup.fault(reason, time.monotonic_ns())
        self.log.error(f"{reason}; safe command latched", throttle_duration_sec=1.0)
        try:
            tick = self.sup.tick(time.monotonic_ns())
            if tick.command is not None:
                self._send(tick.command, tick.stamp, tick.state)
        except Exception as e:  # noqa: BLE001
            self.log.error(f"could not send the safe command: {type(e).__name__}: {e}", throttle_duration_sec=1.0)

    # ------------------------------------------------------------------ reports
    def describe(self) -> str:
        """Return the node's start-up line: the runner, the output, the timing, the safe command."""
        s = self.settings
        return (f"{self.runner.describe()}; publishing {s.iface} on {self.command_topic}; "
                f"{'lockstep' if s.lockstep else f'{s.rate:g} Hz'}; safe command: {self.sup.safe_description}")

    @property
    def counts(self) -> Dict[str, int]:
        """The supervisor's counters and the node's (errors summed)."""
        return status.merged_counts(self.sup.counts, self.node_counts)

    def diagnostics_values(self) -> Dict[str, str]:
        return status.diagnostics_values(
            self.sup, self.velocity, self.runner, self.counts, self.timing, interface=self.settings.iface,
            command_topic=self.command_topic, mode=self.mode, clock_jumps_back=self.clock_jumps_back,
            preflight="off" if self.preflight is None else self.preflight.status())

    @_locked
    def diagnostics(self) -> Optional[Tuple[str, str, Dict[str, str]]]:
        """/diagnostics now (counted as sent): level (OK, WARN, ERROR), message, key/values.

        None until ready() (wait_for_recorders: nothing published before they listen).
        """
        if not self.ready():
            return None
        level, message = status.diagnostic_summary(self.sup, self.velocity, self.runner, time.monotonic_ns(),
                                                   excite=self.mode == "excite",
                                                   timer_stalled=self.timing.stalled_s() > 0)
        self.node_counts["diagnostics_sent"] += 1
        return level, message, self.diagnostics_values()

    def metadata_json(self, node: str) -> str:
        """/diffsim/metadata's text (``node``: the node's fully qualified name)."""
        s = self.settings
        return status.metadata_json(self.runner, mode=self.mode, interface=s.iface, controller=s.controller,
                                    command_topic=self.command_topic, controller_joints=s.controller_joints,
                                    lockstep=self.lockstep, rate=s.rate, safe_command=self.sup.safe_description,
                                    node=node)
