"""The safety supervisor: every rule between a measured state and a command, ROS-free.

    sup = Supervisor(runner, SupervisorConfig(state_timeout_s=0.1))
    v = sup.on_joint_state(JointStateIn(names, position, velocity, effort, stamp_ns), now_ns, clock_ns)
    out = sup.tick(now_ns)        # Tick: command (or None), policy (bool), reason
    sup.on_estop(True, now_ns); sup.reset(now_ns); sup.fault("prediction failed: ...", now_ns)

One state machine. A measured state is *accepted* (it becomes the state the policy
answers, and for arms the hold position) only after every plausibility rule passed:

- shapes: each of position/velocity/effort is empty or as long as name (velocity is
  required), no repeated names; odometry and IMU fields have their sizes;
- values: finite; joint positions within the URDF limits widened by ``position_margin``;
  joint speeds within ``velocity_limit_factor`` x the URDF velocity limit (or
  ``default_velocity_limit`` where the URDF gives none); base position inside the
  ``workspace_min``/``workspace_max`` box, linear and angular speeds within
  ``max_linear_speed``/``max_angular_speed``, a unit quaternion (within
  ``quaternion_tolerance``);
- frames (odometry): ``header.frame_id`` and ``child_frame_id`` non-empty and equal to the
  configured ones (an empty setting accepts any non-empty frame);
- stamps: never backwards; within ``max_stamp_skew_s`` of the node's clock (when the caller
  passes that clock; 0 turns the comparison off). An equal stamp is a re-publication of the
  previous state: accepted, it refreshes the watchdog but does not count as a new state.

A message that breaks a rule is a *fault*: it latches the safe command, and the
diagnostics name the field and its value. So does any exception in the control path
(the policy, a non-finite or wrongly sized command, a failed prediction reported through
:meth:`fault`), a state older than ``state_timeout_s`` (watchdog), and a bad IMU reading.
A latched safe command is held until ``recover_states`` consecutive new, accepted states
have arrived after the last fault, or until :meth:`reset` (the node's ``~/reset`` service); a
fault raised with ``until_reset`` (the node's clock jumping back: the robot or simulator restarted)
holds until :meth:`reset` alone.
The emergency stop latches the safe command until it is released; releasing it is an
explicit operator action and clears the fault latch as :meth:`reset` does.

A joint state that does not name every joint of the robot is not a fault (a gripper's
joints often come from another publisher): it is ignored, and the watchdog judges the age
of the last complete state.

The safe command: arms hold the last *accepted* measured position (clamped to the URDF
limits; position interfaces) or command zero (velocity and effort); quadrotors command
``safe_thrust`` N collective with zero body rates (0: motors off). Every command the
supervisor returns is finite and within the limits of the robot the checkpoint was made for.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Dict, Optional, Sequence, Tuple

import numpy as np

from ..schema import ConfigError, normalise, option, section

__all__ = ["Supervisor", "SupervisorConfig", "JointStateIn", "OdometryIn", "ImuIn", "Verdict", "Tick",
           "SupervisorConfigError"]


class SupervisorConfigError(ConfigError):
    """A supervisor setting out of its range (the message names the setting)."""


@section("supervisor")
@dataclass(frozen=True)
class SupervisorConfig:
    """The supervisor's rules (policy_controller's parameters of these names; units SI; see the module doc)."""

    config_error = SupervisorConfigError
    state_timeout_s: float = option(0.1, "watchdog: a state older than this (receive time, steady clock) latches "
                                    "the safe command", "s", above=0)
    recover_states: int = option(10, """after a fault (rejected state, stale state, exception in the control path)
        the safe command is held until this many consecutive new accepted states, or a ~/reset call""", low=1)
    position_margin: float = option(0.1, "a measured joint position further than this outside its URDF limits is "
                                    "rejected", "rad or m", low=0)
    velocity_limit_factor: float = option(10.0, """a measured joint speed above this multiple of its URDF velocity
        limit is rejected. A plausibility bound against broken sensors, not the robot's velocity limit: the
        shipped reach policies, trained without simulator.velocity_limits, reach 3.8x (panda) and 7.4x
        (diffsim_arm) of them on the stand-in""", above=0)
    default_velocity_limit: float = option(20.0, "joint speed bound where the URDF gives no velocity limit",
                                           "rad/s or m/s", above=0)
    workspace_min: Tuple[float, float, float] = option((-100.0, -100.0, -5.0), "[x, y, z] lower corner of the box "
                                                       "a measured base position must lie in (floating base)", "m")
    workspace_max: Tuple[float, float, float] = option((100.0, 100.0, 200.0), "[x, y, z] upper corner of that box",
                                                       "m")
    max_linear_speed: float = option(30.0, "bound of the measured base linear speed", "m/s", above=0)
    max_angular_speed: float = option(35.0, "bound of the measured base angular speed (odometry, IMU)", "rad/s",
                                      above=0)
    quaternion_tolerance: float = option(0.01, "largest accepted | |q| - 1 | of a measured orientation", above=0)
    frame_id: str = option("world", """world frame: the required header.frame_id of /odom and the frame of the
        predicted odometry (empty: accept any non-empty frame)""")
    child_frame_id: str = option("base_link", """body frame: the required child_frame_id of /odom and of the
        predicted odometry (empty: accept any non-empty frame)""")
    max_stamp_skew_s: float = option(0.5, """a state whose header stamp is further than this from the node's
        clock is rejected (0: not compared; stamps must never go backwards either way). Against a simulator's time
        set use_sim_time""", "s", low=0)
    pair_tolerance_s: float = option(0.02, """legged robots: a joint state and an odometry message whose stamps are
        this close make one state (lockstep: equal stamps)""", "s", low=0)
    safe_mode: str = option("auto", """arms: hold (last accepted measured position), zero (zero effort/velocity) or
        auto (hold for position and joint_trajectory, zero for effort and velocity)""",
                            choices=("auto", "hold", "zero"))
    safe_thrust: float = option(0.0, "quadrotors: collective thrust of the safe command (body rates zero); 0: "
                                "motors off", "N", low=0)
    position_rate_limit: bool = option(False, """position interfaces: each command moves each joint at most its
        URDF velocity limit x one control step from the previous command (from the measured position at the start
        and after a safe command), as ros2_control's joint limiters do; joints without a limit are free""")

    def __post_init__(self):
        normalise(self)

    def check(self) -> None:
        if not all(lo < hi for lo, hi in zip(self.workspace_min, self.workspace_max)):
            raise SupervisorConfigError(f"{{key}} {list(self.workspace_min)} and 'workspace_max' "
                                        f"{list(self.workspace_max)} must have min < max on every axis",
                                        "workspace_min")


# ---------------------------------------------------------------------- inputs (plain records)
@dataclass
class JointStateIn:
    """sensor_msgs/JointState as plain lists (stamp in ns)."""

    names: Sequence[str]
    position: Sequence[float]
    velocity: Sequence[float]
    effort: Sequence[float] = ()
    stamp_ns: int = 0


@dataclass
class OdometryIn:
    """nav_msgs/Odometry as plain lists: world position, orientation x y z w, body-frame twist."""

    position: Sequence[float]
    orientation: Sequence[float]
    linear: Sequence[float]
    angular: Sequence[float]
    stamp_ns: int = 0
    frame_id: str = ""
    child_frame_id: str = ""


@dataclass
class ImuIn:
    """sensor_msgs/Imu as plain lists."""

    angular_velocity: Sequence[float]
    orientation: Sequence[float] = (0.0, 0.0, 0.0, 1.0)
    linear_acceleration: Sequence[float] = (0.0, 0.0, 0.0)
    stamp_ns: int = 0


@dataclass(frozen=True)
class Verdict:
    """What became of one message.

    ``accepted``; else ``reason`` and whether it was a ``fault`` (latched the safe command) or only
    ignored (a partial joint state). ``repeat``: an accepted state with the stamp of the previous
    one (a re-publication, not a new state). ``pending``: a legged robot's valid joint state or
    odometry still waiting for its partner.
    """

    accepted: bool
    reason: str = ""
    fault: bool = False
    repeat: bool = False
    pending: bool = False


@dataclass
class Tick:
    """One control decision.

    ``command`` (simulator interface, float64, finite, within limits; None when nothing safe can be
    sent yet), ``policy`` (True: the policy's command), ``reason`` (why the safe command, empty for
    the policy), the ``stamp`` and ``state`` it answers.
    """

    command: Optional[np.ndarray]
    policy: bool
    reason: str
    stamp: int = 0
    state: Any = None
    clamped: bool = False


class _Rejected(Exception):
    """Internal: a plausibility rule failed (message: the field and its value)."""


def _fmt(x: float) -> str:
    return f"{x:.6g}"


def _seq(x: Any, what: str) -> np.ndarray:
    try:
        a = np.asarray(x, dtype=np.float64).reshape(-1)
    except (TypeError, ValueError) as e:
        raise _Rejected(f"{what} is not numeric ({e})") from None
    return a


class Supervisor:
    """The controller's safety state machine over a :class:`~diffsim_ros.learning.deploy.PolicyRunner`.

    ``runner`` gives the robot (limits, joint names), turns accepted measurements into
    simulator states and states into commands. ``policy`` (default ``runner.decide``) may be
    replaced, e.g. by tests that make the policy misbehave.
    """

    def __init__(self, runner, config: Optional[SupervisorConfig] = None,
                 policy: Optional[Callable[..., Any]] = None, imu_rates: bool = False, velocity=None):
        self.runner = runner
        # /cmd_vel (control/velocity_command.py): its goal, when one is in force, replaces the
        # target; standing sends the stance instead of the policy's command.
        self.velocity = velocity
        self.standing = False
        if velocity is not None and not velocity.can_stand_by_policy:
            runner.stance_command()        # raises where this checkpoint cannot stand
        self.imu_rates = bool(imu_rates)     # body rates from the latest accepted IMU reading
        self.config = cfg = config or SupervisorConfig()
        self.kind = runner.kind
        self._policy = policy or (lambda state, target: runner.decide(state, target, predict=False))
        mode = cfg.safe_mode
        if self.kind in ("arm", "legged"):
            if mode == "auto":
                mode = "hold" if runner.interface == "position" else "zero"
            if mode == "hold" and runner.interface != "position":
                raise SupervisorConfigError(f"safe_mode hold needs a position interface; this checkpoint "
                                            f"commands '{runner.interface}'")
        else:
            mode = "thrust"
        self.safe_mode = mode
        m = runner.model
        nj = len(runner.joint_names)
        lower = m.lower.detach().double().cpu().numpy().reshape(-1)[:nj]
        upper = m.upper.detach().double().cpu().numpy().reshape(-1)[:nj]
        vlim = m.velocity_limit.detach().double().cpu().numpy().reshape(-1)[:nj]
        self.pos_low = lower - cfg.position_margin
        self.pos_high = upper + cfg.position_margin
        self.vel_bound = np.where(vlim > 0, vlim * cfg.velocity_limit_factor, cfg.default_velocity_limit)
        self.cmd_low, self.cmd_high = runner.command_low, runner.command_high
        self.n_cmd = len(self.cmd_low)
        # position_rate_limit: the largest step of a position command per control step (actuated joints)
        self.rate_step: Optional[np.ndarray] = None
        if cfg.position_rate_limit and self.kind != "quadrotor" and runner.interface == "position":
            act = runner.sim.act_index.cpu().numpy()
            va = vlim[act]
            self.rate_step = np.where(va > 0, va * float(runner.dt), np.inf)
        self.last_command: Optional[np.ndarray] = None          # the last policy command sent
        self.target = None
        self.timeout_ns = int(cfg.state_timeout_s * 1e9)
        # ------------------------------------------------------------ machine state
        self.latest: Optional[Tuple[int, int, Any]] = None     # (receive ns, stamp ns, simulator State)
        self.last_stamp: Optional[int] = None
        self.hold_q: Optional[np.ndarray] = None
        self.imu_w: Optional[np.ndarray] = None
        self._parts: Dict[str, Tuple[Optional[int], Any]] = {"joints": (None, None), "base": (None, None)}
        # A legged policy on the robot observation pairs its joint states with the IMU (orientation
        # and body rates); odometry, if a robot publishes it, is not needed and not used.
        self.base_from_imu = self.kind == "legged" and not getattr(runner, "needs_odometry", True)
        self.estop = False
        # A NO-GO of the controller's preflight (control/preflight.py): the safe command until reset().
        self.preflight_hold: Optional[str] = None
        self.fault_reason: Optional[str] = None
        self.good_since_fault = 0
        # A fault only reset() (or releasing the emergency stop) clears: good states do not.
        self.reset_required: Optional[str] = None
        self.last_rejection = ""
        self.counts: Dict[str, int] = {k: 0 for k in (
            "states_received", "states_accepted", "states_repeated", "states_rejected", "states_ignored",
            "imu_received", "imu_rejected", "faults", "recoveries", "policy_commands", "safe_commands",
            "commands_clamped", "stand_commands", "errors")}

    # ------------------------------------------------------------------ configuration
    def set_target(self, target) -> None:
        """Set the goal (see PolicyRunner.target_tensor); raises StateError for a bad one."""
        self.target = self.runner.target_tensor(target)

    @property
    def safe_description(self) -> str:
        if self.kind != "quadrotor":
            return "hold the last accepted position" if self.safe_mode == "hold" else f"zero {self.runner.interface}"
        return f"{self.config.safe_thrust:g} N collective thrust, zero body rates"

    # ------------------------------------------------------------------ faults and latching
    def fault(self, reason: str, now_ns: Optional[int] = None, until_reset: bool = False) -> None:
        """Latch the safe command for ``reason`` (a rejected message, an exception in the control path).

        It holds until ``recover_states`` new accepted states or :meth:`reset`; with ``until_reset``
        (a clock that jumped back: the robot restarted) until :meth:`reset` alone, whatever faults
        or good states follow.
        """
        self.counts["faults"] += 1
        self.fault_reason = reason
        self.good_since_fault = 0
        self.last_rejection = reason
        if until_reset:
            self.reset_required = reason

    def reset(self, now_ns: Optional[int] = None) -> str:
        """Clear the fault latch, a preflight NO-GO hold and the stamp history.

        Clearing the NO-GO hold is an operator's decision to run anyway; the stamp history is
        cleared after a robot or simulator restart whose clock went back. Does not release the
        emergency stop.
        """
        was = self.reset_required or self.fault_reason or self.preflight_hold
        self.fault_reason = None
        self.reset_required = None
        self.preflight_hold = None
        self.good_since_fault = 0
        self.last_stamp = None
        self._parts = {"joints": (None, None), "base": (None, None)}
        return f"fault latch cleared (was: {was})" if was else "no fault was latched"

    def on_estop(self, engaged: bool, now_ns: Optional[int] = None) -> str:
        self.estop = bool(engaged)
        if self.estop:
            return "emergency stop engaged: safe command latched until released"
        self.fault_reason = None
        self.reset_required = None
        self.good_since_fault = 0
        return "emergency stop released"

    def _reject(self, reason: str, counter: str = "states_rejected") -> Verdict:
        self.counts[counter] += 1
        self.fault(reason)
        return Verdict(False, reason, fault=True)

    def _stamp_rule(self, stamp: int, clock_ns: Optional[int], what: str, last: Optional[int]) -> None:
        if not isinstance(stamp, (int, np.integer)) or stamp < 0:
            raise _Rejected(f"{what} header.stamp {stamp!r} is not a valid time")
        if last is not None and stamp < last:
            raise _Rejected(f"{what} header.stamp went backwards: {stamp / 1e9:.9f} s after {last / 1e9:.9f} s")
        skew = self.config.max_stamp_skew_s
        if clock_ns is not None and skew > 0 and abs(stamp - clock_ns) > skew * 1e9:
            raise _Rejected(f"{what} header.stamp {stamp / 1e9:.9f} s is {(stamp - clock_ns) / 1e9:+.3f} s from "
                            f"the node's clock (max_stamp_skew_s {skew:g})")

    def _accept(self, stamp: int, state, now_ns: int) -> Verdict:
        repeat = self.last_stamp is not None and stamp == self.last_stamp
        self.latest = (now_ns, stamp, state)
        self.last_stamp = stamp
        self.counts["states_repeated" if repeat else "states_accepted"] += 1
        if self.kind != "quadrotor":
            self.hold_q = self.runner.joint_positions(state)
        if self.fault_reason is not None and not repeat:
            self.good_since_fault += 1
            if self.good_since_fault >= self.config.recover_states and self.reset_required is None:
                self.fault_reason = None
                self.good_since_fault = 0
                self.counts["recoveries"] += 1
        return Verdict(True, repeat=repeat)

    # ------------------------------------------------------------------ inputs
    def _check_joints(self, js: JointStateIn, clock_ns: Optional[int], last: Optional[int]):
        """Return (positions, velocities) of the robot's joints in model order, or None for a partial message.

        A partial message (missing joints) is ignored. Raises _Rejected naming the field and value.
        """
        names = [str(n) for n in js.names]
        n = len(names)
        pos, vel = _seq(js.position, "position"), _seq(js.velocity, "velocity")
        eff = _seq(js.effort, "effort")
        if pos.size != n:
            raise _Rejected(f"{n} joint names but {pos.size} positions")
        if vel.size != n:
            raise _Rejected(f"{n} joint names but {vel.size} velocities (velocity is required)")
        if eff.size not in (0, n):
            raise _Rejected(f"{n} joint names but {eff.size} efforts (empty or one per name)")
        if len(set(names)) != n:
            dup = sorted({x for x in names if names.count(x) > 1})
            raise _Rejected(f"joint names repeat: {', '.join(dup)}")
        index = {x: i for i, x in enumerate(names)}
        missing = [j for j in self.runner.joint_names if j not in index]
        if missing:
            self.counts["states_ignored"] += 1
            self.last_rejection = (f"joint_states: joint(s) {', '.join(missing)} missing (got: "
                                   f"{', '.join(names) or 'none'}); ignored")
            return None
        idx = np.array([index[j] for j in self.runner.joint_names], dtype=np.int64)
        p, v = pos[idx], vel[idx]
        for what, x in (("position", p), ("velocity", v)):
            bad = np.nonzero(~np.isfinite(x))[0]
            if bad.size:
                j = bad[0]
                raise _Rejected(f"non-finite {what} {x[j]} of joint {self.runner.joint_names[j]}")
        out = np.nonzero((p < self.pos_low) | (p > self.pos_high))[0]
        if out.size:
            j = out[0]
            raise _Rejected(f"position of joint {self.runner.joint_names[j]} is {_fmt(p[j])}, outside its "
                            f"limits [{_fmt(self.pos_low[j] + self.config.position_margin)}, "
                            f"{_fmt(self.pos_high[j] - self.config.position_margin)}] by more than "
                            f"position_margin {self.config.position_margin:g}")
        fast = np.nonzero(np.abs(v) > self.vel_bound)[0]
        if fast.size:
            j = fast[0]
            raise _Rejected(f"velocity of joint {self.runner.joint_names[j]} is {_fmt(v[j])}, beyond the bound "
                            f"{_fmt(self.vel_bound[j])} (velocity_limit_factor x URDF limit)")
        self._stamp_rule(js.stamp_ns, clock_ns, "joint_states", last)
        return p, v

    def _check_base(self, od: OdometryIn, clock_ns: Optional[int], last: Optional[int]):
        """(position, orientation, linear, angular) arrays of plausible odometry; raises _Rejected."""
        cfg = self.config
        parts = []
        for what, val, n in (("pose.position", od.position, 3), ("pose.orientation", od.orientation, 4),
                             ("twist.linear", od.linear, 3), ("twist.angular", od.angular, 3)):
            a = _seq(val, what)
            if a.size != n:
                raise _Rejected(f"{what} needs {n} numbers, got {a.size}")
            if not np.isfinite(a).all():
                raise _Rejected(f"non-finite {what} {a.tolist()}")
            parts.append(a)
        for what, got, want in (("header.frame_id", od.frame_id, cfg.frame_id),
                                ("child_frame_id", od.child_frame_id, cfg.child_frame_id)):
            if not got:
                raise _Rejected(f"empty {what} (expected '{want or 'a frame'}')")
            if want and got != want:
                raise _Rejected(f"{what} is '{got}', expected '{want}'")
        pos, quat, lin, ang = parts
        lo, hi = np.asarray(cfg.workspace_min), np.asarray(cfg.workspace_max)
        out = np.nonzero((pos < lo) | (pos > hi))[0]
        if out.size:
            k = out[0]
            raise _Rejected(f"pose.position.{'xyz'[k]} is {_fmt(pos[k])} m, outside the workspace "
                            f"[{_fmt(lo[k])}, {_fmt(hi[k])}]")
        norm = float(np.linalg.norm(quat))
        if abs(norm - 1.0) > cfg.quaternion_tolerance:
            raise _Rejected(f"pose.orientation has norm {_fmt(norm)} (a unit quaternion x y z w expected, "
                            f"quaternion_tolerance {cfg.quaternion_tolerance:g})")
        for what, x, bound, unit in (("twist.linear", lin, cfg.max_linear_speed, "m/s"),
                                     ("twist.angular", ang, cfg.max_angular_speed, "rad/s")):
            sp = float(np.linalg.norm(x))
            if sp > bound:
                raise _Rejected(f"{what} speed is {_fmt(sp)} {unit}, beyond {_fmt(bound)}")
        self._stamp_rule(od.stamp_ns, clock_ns, "odom", last)
        return pos, quat, lin, ang

    def on_joint_state(self, js: JointStateIn, now_ns: int, clock_ns: Optional[int] = None) -> Verdict:
        """Judge a joint state (arms; legged robots pair it with odometry).

        ``now_ns``: receive time on a steady clock; ``clock_ns``: the node's clock for the stamp
        rule (None: not compared).
        """
        self.counts["states_received"] += 1
        if self.kind == "quadrotor":
            return self._reject("joint_states: this robot is a multirotor (odometry expected)")
        legged = self.kind == "legged"
        try:
            got = self._check_joints(js, clock_ns, self._parts["joints"][0] if legged else self.last_stamp)
            if got is None:
                return Verdict(False, self.last_rejection)
            if legged:
                self._parts["joints"] = (int(js.stamp_ns), got)
                return self._pair(now_ns)
            state = self.runner.arm_state(self.runner.joint_names, got[0].tolist(), got[1].tolist())
        except _Rejected as e:
            return self._reject(f"joint_states: {e}")
        except Exception as e:  # noqa: BLE001 - anything the rules missed is still a bad message
            return self._reject(f"joint_states: {type(e).__name__}: {e}")
        return self._accept(int(js.stamp_ns), state, now_ns)

    def on_odometry(self, od: OdometryIn, now_ns: int, clock_ns: Optional[int] = None) -> Verdict:
        """Odometry (floating base): pose in the world frame, twist in the body (child) frame."""
        self.counts["states_received"] += 1
        if self.kind == "arm":
            return self._reject("odom: this robot has a fixed base (joint states expected)")
        if self.base_from_imu:
            self.counts["states_ignored"] += 1
            return Verdict(False, "", pending=True)
        legged = self.kind == "legged"
        try:
            pos, quat, lin, ang = self._check_base(od, clock_ns, self._parts["base"][0] if legged else self.last_stamp)
            if legged:
                self._parts["base"] = (int(od.stamp_ns), (pos, quat, lin, ang))
                return self._pair(now_ns)
            w = self.imu_w if (self.imu_rates and self.imu_w is not None) else ang
            state = self.runner.quadrotor_state(pos, quat, lin, w)
        except _Rejected as e:
            return self._reject(f"odom: {e}")
        except Exception as e:  # noqa: BLE001
            return self._reject(f"odom: {type(e).__name__}: {e}")
        return self._accept(int(od.stamp_ns), state, now_ns)

    def _pair(self, now_ns: int) -> Verdict:
        """Pair the latest accepted joint state and odometry of a legged robot into one state.

        They make one state when their stamps lie within ``pair_tolerance_s``; its stamp is the
        later one.
        """
        (tj, joints), (tb, base) = self._parts["joints"], self._parts["base"]
        if joints is None or base is None or abs(tj - tb) > self.config.pair_tolerance_s * 1e9:
            return Verdict(False, "", pending=True)
        stamp = max(tj, tb)
        if self.last_stamp is not None and stamp < self.last_stamp:
            return Verdict(False, "", pending=True)
        pos, quat, lin, ang = base
        w = self.imu_w if (self.imu_rates and self.imu_w is not None) else ang
        state = self.runner.legged_state(self.runner.joint_names, joints[0].tolist(), joints[1].tolist(),
                                         pos, quat, lin, w)
        return self._accept(stamp, state, now_ns)

    def on_imu(self, imu: ImuIn, now_ns: int, clock_ns: Optional[int] = None) -> Verdict:
        """Judge an IMU reading: a broken one (non-finite, impossible rate) is a fault like a bad state.

        A legged policy on the robot observation (``base_from_imu``) takes its base from it: the
        orientation (a unit quaternion, as odometry's) and the body rates, paired with the joint
        state of the same time as odometry is otherwise.
        """
        self.counts["imu_received"] += 1
        last = self._parts["base"][0]
        try:
            w = _seq(imu.angular_velocity, "angular_velocity")
            o = _seq(imu.orientation, "orientation")
            a = _seq(imu.linear_acceleration, "linear_acceleration")
            for what, x, n in (("angular_velocity", w, 3), ("orientation", o, 4), ("linear_acceleration", a, 3)):
                if x.size != n:
                    raise _Rejected(f"{what} needs {n} numbers, got {x.size}")
                if not np.isfinite(x).all():
                    raise _Rejected(f"non-finite {what} {x.tolist()}")
            s = float(np.linalg.norm(w))
            if s > self.config.max_angular_speed:
                raise _Rejected(f"angular_velocity is {_fmt(s)} rad/s, beyond {_fmt(self.config.max_angular_speed)}")
            if self.base_from_imu:
                norm = float(np.linalg.norm(o))
                if abs(norm - 1.0) > self.config.quaternion_tolerance:
                    raise _Rejected(f"orientation has norm {_fmt(norm)} (a unit quaternion x y z w expected, "
                                    f"quaternion_tolerance {self.config.quaternion_tolerance:g})")
                self._stamp_rule(imu.stamp_ns, clock_ns, "imu", last)
        except _Rejected as e:
            return self._reject(f"imu: {e}", "imu_rejected")
        self.imu_w = w
        if not self.base_from_imu:
            return Verdict(True)
        # The base's position and linear velocity are not observed: zeros stand in for them.
        self._parts["base"] = (int(imu.stamp_ns), (np.zeros(3), o, np.zeros(3), w))
        return self._pair(now_ns)

    # ------------------------------------------------------------------ the decision
    def _latch_text(self) -> str:
        if self.reset_required is not None:
            last = "" if self.fault_reason == self.reset_required else f"; last fault: {self.fault_reason}"
            return f"latched until ~/reset after: {self.reset_required}{last}"
        return (f"latched after: {self.fault_reason} ({self.good_since_fault}/{self.config.recover_states} "
                "good states since)")

    def stale(self, now_ns: int) -> bool:
        """Return whether an accepted state exists and it is older than ``state_timeout_s``."""
        return self.latest is not None and now_ns - self.latest[0] > self.timeout_ns

    def blocked(self, now_ns: int) -> Optional[str]:
        """Why the policy may not run now (None: it may). A stale state becomes a latched fault."""
        if self.estop:
            return "emergency stop"
        if self.preflight_hold is not None:
            return self.preflight_hold
        if self.fault_reason is not None:
            return self._latch_text()
        if self.latest is None:
            return "no state received yet"
        age = now_ns - self.latest[0]
        if age > self.timeout_ns:
            reason = f"watchdog: state is {age / 1e9:.3f} s old (state_timeout_s {self.config.state_timeout_s:g})"
            self.fault(reason)
            return reason
        return None

    def tick(self, now_ns: int) -> Tick:
        """Return the command to send now: the policy's on the latest accepted state, or the safe one."""
        reason = self.blocked(now_ns)
        stamp, state = (self.latest[1], self.latest[2]) if self.latest is not None else (0, None)
        if reason == "no state received yet":
            return Tick(None, False, reason)          # nothing is sent before the first state
        if reason is None:
            try:
                target, stand, pre_clamped = self.target, False, False
                goal = self.velocity.goal(now_ns) if self.velocity is not None else None
                if goal is not None:
                    target, stand = goal.target, goal.stand
                if stand:
                    cmd = self.runner.stance_command()
                    self.counts["stand_commands"] += 1
                else:
                    if self.standing:
                        self.runner.reset()       # walking again: a fresh episode (clock, last action)
                    d = self._policy(state, target)
                    cmd = np.asarray(d.command, dtype=np.float64).reshape(-1)
                    pre_clamped = bool(getattr(d, "clamped", False))
                self.standing = stand
                if cmd.shape != (self.n_cmd,):
                    raise ValueError(f"the policy gave {cmd.size} commands, the interface takes {self.n_cmd}")
                if not np.isfinite(cmd).all():
                    raise ValueError(f"the policy gave a non-finite command {cmd.tolist()}")
                lim = np.minimum(np.maximum(cmd, self.cmd_low), self.cmd_high)
                if self.rate_step is not None:
                    ref = self.last_command if self.last_command is not None else self.runner.joint_positions(state)
                    lim = np.minimum(np.maximum(lim, ref - self.rate_step), ref + self.rate_step)
                clamped = pre_clamped or bool(np.any(lim != cmd))
                self.counts["policy_commands"] += 1
                self.counts["commands_clamped"] += int(clamped)
                self.last_command = lim
                return Tick(lim, True, "", stamp, state, clamped)
            except Exception as e:  # noqa: BLE001 - any failure of the control path latches
                self.counts["errors"] += 1
                reason = f"control path: {type(e).__name__}: {e}"
                self.fault(reason)
        cmd = self.safe_command()
        if cmd is not None:
            self.counts["safe_commands"] += 1
        self.last_command = None            # the rate limit starts again from the measured position
        return Tick(cmd, False, reason, stamp, state)

    def safe_command(self) -> Optional[np.ndarray]:
        """Return the safe command (simulator interface, within limits).

        None: nothing safe to send yet (hold mode before any state was accepted).
        """
        r = self.runner
        if self.kind != "quadrotor":
            if self.safe_mode == "hold":
                if self.hold_q is None:
                    return None
                c = self.hold_q
            else:
                c = np.zeros(self.n_cmd)
        elif r.interface == "ctbr":
            c = np.array([self.config.safe_thrust, 0.0, 0.0, 0.0])
        else:
            c = np.full(self.n_cmd, self.config.safe_thrust / self.n_cmd)
        return np.minimum(np.maximum(np.asarray(c, dtype=np.float64), self.cmd_low), self.cmd_high)

    def status(self, now_ns: int) -> Dict[str, str]:
        """Diagnostics key/values: the watchdog/latch state, the last rejection, the counters."""
        if self.estop:
            state = "emergency stop"
        elif self.fault_reason is not None:
            state = self._latch_text()
        elif self.latest is None:
            state = "no state received yet"
        else:
            age = now_ns - self.latest[0]
            state = "ok" if age <= self.timeout_ns else f"state is {age / 1e9:.3f} s old"
        vals = {"watchdog": state, "emergency_stop": str(self.estop).lower(),
                "last_rejection": self.last_rejection or "none", "safe_command": self.safe_description}
        vals.update({k: str(v) for k, v in self.counts.items()})
        return vals
