"""Identification motions (excitation), ROS-free.

What ``policy_controller`` in ``mode: excite`` sends instead of a policy's commands, through the
same supervisor and outputs.

    cfg = ExcitationConfig.from_mapping({"amplitude": 0.5, "duration": 12.0, "seed": 3})
    runner = ExcitationRunner(params, cfg)           # params: a training/robot file's mapping
    sup = Supervisor(runner, SupervisorConfig())     # watchdog, e-stop, limits: unchanged

Arms (position interface): joint position targets about a safe centre (the middle of each
joint's URDF range). ``signal: multisine``: a sum of harmonics of ``1 / period`` between
``f_min`` and ``f_max``, each joint on its own harmonics (dealt out in turn, in an order drawn
from the seed, so the joints move independently of each other: an orthogonal multisine, and
each joint gets one of the lowest harmonics), with Schroeder's phases (a low crest
factor: large motion for a given peak) and amplitudes falling as 1 / f (about the same speed
in every band); ``signal: chirp``: a sine sweeping from ``f_min`` to ``f_max`` over the
duration, each joint with its own phase, its amplitude cut where the speed would exceed the
bound. The peak excursion from the centre is ``amplitude`` x the half range left after a
``margin`` (fraction of the range) at both ends, and every target stays inside
``[lower + margin, upper - margin]``; the speed of the targets stays within
``velocity_fraction`` x the URDF velocity limit (a joint whose signal would be faster is
scaled down: :attr:`ArmExcitation.scale` says how much). The robot is first led from where it
is to the centre at that speed, the signal fades in and out over ``ramp`` s, and after
``duration`` s the targets stay at the centre.

Multirotors (CTBR interface): steps around hover with a position hold that keeps the vehicle
in the arena: a PD loop on the nominal mass pulls towards ``home``; on top of it, one
piecewise-constant step after another (held between ``hold_min`` and ``hold_max`` s, drawn
from the seed): an attitude step (a roll/pitch set-point offset of up to ``amplitude`` x
``tilt_max``), a thrust step (up to ``amplitude`` x ``thrust_fraction`` x hover thrust) or a
body-rate step (up to ``amplitude`` x ``rate_max``; roll/pitch rate steps only while the
measured tilt is below ``tilt_max``), and a short rest at hover in between. Bounds that hold
for every state: the tilt set-point within ``tilt_max``, the collective thrust within
``(1 +- thrust_limit)`` x hover, every body rate within ``rate_max``. Beyond
``arena_radius`` m from home no step is added (the hold alone brings it back).

Everything is deterministic from ``seed``; the time base is the control step (the n-th
command is at ``n dt``), so a lockstep run and a timer run send the same sequence.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Dict, Mapping, Optional, Sequence, Tuple

import numpy as np

from ..physics.rotation import quat_to_matrix
from ..schema import ConfigError, from_mapping, normalise, option, section

__all__ = ["ExcitationConfig", "ExcitationError", "ArmExcitation", "QuadrotorExcitation", "ExcitationRunner",
           "SIGNALS", "identifiable_parameters"]

SIGNALS = ("multisine", "chirp")


class ExcitationError(ConfigError):
    """An excitation setting or robot the excitation refuses; the message names the key."""


STEP_KINDS = ("attitude", "thrust", "rate")


@section("excitation")
@dataclass(frozen=True)
class ExcitationConfig:
    """The excitation's settings: an ``excitation:`` section, the ``excitation.*`` parameters of policy_controller.

    Units SI; see the module doc.
    """

    config_error = ExcitationError
    amplitude: float = option(0.5, """fraction (0, 1] of the bounds used: arms the safe half range of each joint,
        multirotors the tilt/thrust/rate step bounds""", above=0, high=1)
    duration: float = option(12.0, "length of the motion (arms: after the lead-in to the centre of the ranges)",
                             "s", above=0)
    seed: int = option(0, "random seed of the signal (harmonic assignment and time shifts; step schedule)", low=0)
    signal: str = option("multisine", "arms: multisine or chirp", choices=SIGNALS)
    f_min: float = option(0.2, "lowest frequency (multisine: its period is 1 / f_min)", "Hz", above=0)
    f_max: float = option(4.0, "highest frequency", "Hz", above=0)
    margin: float = option(0.15, "arms: fraction of each joint range kept clear at both ends (below 0.5)", low=0)
    velocity_fraction: float = option(0.8, "arms: largest target speed as a fraction of the URDF velocity limit",
                                      above=0, high=1)
    ramp: float = option(1.0, "fade in and out of the signal", "s", low=0)
    tilt_max: float = option(0.35, "multirotors: largest tilt set-point (below 1.2 rad)", "rad", above=0)
    thrust_fraction: float = option(0.2, "multirotors: largest thrust step, a fraction of hover thrust (at most "
                                    "thrust_limit)", above=0)
    thrust_limit: float = option(0.5, """multirotors: the collective thrust command stays within (1 +- this) x
        hover thrust (below 1; at least thrust_fraction: the hold needs room beside the step, more so on a heavier
        vehicle)""", above=0)
    rate_max: float = option(2.0, "multirotors: largest body-rate step and commanded rate", "rad/s", above=0)
    hold_min: float = option(0.15, "multirotors: shortest step", "s", above=0)
    hold_max: float = option(0.6, "multirotors: longest step", "s", above=0)
    arena_radius: float = option(1.0, "multirotors: no step is added beyond this distance from home (the hold "
                                 "brings it back)", "m", above=0)
    home: Tuple[float, float, float] = option((0.0, 0.0, 1.0), "multirotors: [x, y, z] the position hold keeps",
                                              "m")
    position_gain: float = option(2.0, "multirotors: position gain of the hold along x and y", "1/s^2", above=0)
    velocity_gain: float = option(1.8, "multirotors: velocity gain of the hold along x and y", "1/s", above=0)
    height_gain: float = option(6.0, """multirotors: position gain of the hold along z (stiffer than x/y: thrust
        steps and a mass other than the nominal one push along z)""", "1/s^2", above=0)
    height_velocity_gain: float = option(4.0, "multirotors: velocity gain of the hold along z", "1/s", above=0)
    attitude_gain: float = option(8.0, "multirotors: body rate per rad of attitude error", "1/s", above=0)
    steps: Tuple[str, ...] = option(STEP_KINDS, """multirotors: the kinds of step (attitude, thrust, rate); empty
        (or none): the hold alone, a hover""", choices=STEP_KINDS)
    integral_gain: float = option(3.0, """multirotors: integral gain of the hold along z (a heavier or weaker
        vehicle than the nominal one still holds its height; the integral's acceleration is kept within
        0.4 g)""", "1/s^3", above=0)

    def __post_init__(self):
        normalise(self)

    def check(self) -> None:
        """Check the rules between settings (relative keys)."""
        if not self.margin < 0.5:
            raise ConfigError(f"must be below 0.5 (it is kept clear at both ends of the range), got {self.margin}",
                              "margin")
        if not self.f_min < self.f_max:
            raise ConfigError(f"must be above excitation.f_min ({self.f_min}), got {self.f_max}", "f_max")
        if not self.tilt_max < 1.2:
            raise ConfigError(f"must be below 1.2 rad, got {self.tilt_max}", "tilt_max")
        if not self.thrust_limit < 1.0:
            raise ConfigError(f"must be below 1 (a fraction of hover thrust), got {self.thrust_limit}",
                              "thrust_limit")
        if not self.thrust_fraction <= self.thrust_limit:
            raise ConfigError(f"must be at most excitation.thrust_limit ({self.thrust_limit}), got "
                              f"{self.thrust_fraction}", "thrust_fraction")
        if not self.hold_min <= self.hold_max:
            raise ConfigError(f"must be at least excitation.hold_min ({self.hold_min}), got {self.hold_max}",
                              "hold_max")

    @classmethod
    def from_mapping(cls, values: Optional[Mapping[str, Any]], where: str = "excitation") -> "ExcitationConfig":
        """Build the settings from a mapping of setting names.

        A config file's ``excitation:`` section, the node's ``excitation.*`` parameters; ``steps``
        may be a comma-separated string and ``none`` an empty list. Errors are an ExcitationError
        naming the key.
        """
        kw = dict(values or {})
        st = kw.get("steps")
        if isinstance(st, str):
            st = [x.strip() for x in st.split(",")]
        if isinstance(st, (list, tuple)):
            kw["steps"] = tuple(x for x in st if not (isinstance(x, str) and x.strip() in ("", "none")))
        return from_mapping(cls, kw, where)

    def as_dict(self) -> Dict[str, Any]:
        d = asdict(self)
        d["home"] = list(self.home)
        d["steps"] = list(self.steps)
        return d


# ---------------------------------------------------------------------------------------- arms
def _smooth_window(t: np.ndarray, duration: float, ramp: float) -> np.ndarray:
    """1 inside [ramp, duration - ramp], a raised-cosine fade to 0 at both ends, 0 outside [0, duration]."""
    if ramp <= 0:
        return ((t >= 0) & (t <= duration)).astype(float)
    r = min(ramp, duration / 2)
    if r <= 0:                                  # no time to fade in: no motion
        return np.zeros_like(t)
    up = np.clip(t / r, 0.0, 1.0)
    down = np.clip((duration - t) / r, 0.0, 1.0)
    w = np.minimum(0.5 - 0.5 * np.cos(np.pi * up), 0.5 - 0.5 * np.cos(np.pi * down))
    return np.where((t >= 0) & (t <= duration), w, 0.0)


class ArmExcitation:
    """Joint position targets for ``n`` joints at control step ``dt``; see the module doc.

    The joints have ``lower``/``upper`` limits (rad or m) and ``velocity_limit`` (> 0).

    ``targets`` ((N, n), N = round(duration / dt) + 1) is the excitation about the centre (no
    lead-in); :meth:`command` adds the lead-in from a measured start and the rate bound.
    """

    def __init__(self, lower, upper, velocity_limit, dt: float, cfg: ExcitationConfig,
                 names: Optional[Sequence[str]] = None):
        lo = np.asarray(lower, dtype=np.float64).reshape(-1)
        hi = np.asarray(upper, dtype=np.float64).reshape(-1)
        vl = np.asarray(velocity_limit, dtype=np.float64).reshape(-1)
        n = lo.size
        names = list(names) if names is not None else [f"joint {i}" for i in range(n)]
        for i in range(n):
            if not (np.isfinite(lo[i]) and np.isfinite(hi[i]) and lo[i] < hi[i]):
                raise ExcitationError(f"joint {names[i]} has no finite position limits (URDF <limit lower=... "
                                      f"upper=...>: {lo[i]}, {hi[i]}); the excitation needs them to stay inside")
            if not (np.isfinite(vl[i]) and vl[i] > 0):
                raise ExcitationError(f"joint {names[i]} has no velocity limit (URDF <limit velocity=...>: "
                                      f"{vl[i]}); the excitation needs it to bound the speed")
        if not (math.isfinite(dt) and dt > 0):
            raise ExcitationError(f"control step dt must be > 0, got {dt}")
        self.cfg, self.dt, self.n, self.names = cfg, float(dt), n, names
        self.lower, self.upper, self.velocity_limit = lo, hi, vl
        rng = hi - lo
        self.safe_low, self.safe_high = lo + cfg.margin * rng, hi - cfg.margin * rng
        self.centre = (lo + hi) / 2
        self.half = (self.safe_high - self.safe_low) / 2
        self.max_step = cfg.velocity_fraction * vl * self.dt          # largest target change per step
        steps = int(round(cfg.duration / self.dt))
        self.t = np.arange(steps + 1) * self.dt
        self.T = steps * self.dt                               # the sampled duration
        raw = self._multisine() if cfg.signal == "multisine" else self._chirp()          # (N, n), peak 1
        win = _smooth_window(self.t, self.T, cfg.ramp)[:, None]
        x = raw * win * (cfg.amplitude * self.half)[None, :]
        # Speed bound: scale a joint down where its fastest step is too fast (the window is part of it).
        step = np.abs(np.diff(x, axis=0)).max(axis=0) if len(x) > 1 else np.zeros(n)
        self.scale = np.where(step > self.max_step, self.max_step / np.maximum(step, 1e-300), 1.0)
        x = x * self.scale[None, :]
        self.targets = np.clip(self.centre[None, :] + x, self.safe_low, self.safe_high)
        self.amplitude = np.abs(x).max(axis=0) if len(x) else np.zeros(n)    # achieved peak excursion per joint
        self._start: Optional[np.ndarray] = None
        self._lead = 0
        self._last: Optional[np.ndarray] = None

    # -- the signals (peak |x| = 1 per joint over the sampled steps)
    def _multisine(self) -> np.ndarray:
        cfg, n = self.cfg, self.n
        f0 = cfg.f_min
        k = np.arange(1, int(math.floor(cfg.f_max / f0 + 1e-9)) + 1)
        if len(k) < n:
            raise ExcitationError(f"'excitation.f_max' {cfg.f_max} Hz leaves {len(k)} harmonics of f_min "
                                  f"{cfg.f_min} Hz for {n} joints; raise f_max or lower f_min")
        gen = np.random.default_rng(cfg.seed)
        order = gen.permutation(n)                             # which joint takes the 1st, 2nd, ... harmonic
        out = np.zeros((len(self.t), n))
        for j in range(n):
            kj = k[int(np.nonzero(order == j)[0][0])::n]       # this joint's own harmonics (a zipper)
            m = len(kj)
            i = np.arange(1, m + 1)
            phase = -np.pi * i * (i - 1) / m                    # Schroeder's phases
            shift = gen.uniform(0.0, 1.0 / f0)                  # a time shift of the periodic signal
            amp = 1.0 / kj                                      # ~ 1 / f: about equal speed per band
            arg = 2 * np.pi * f0 * kj[None, :] * (self.t[:, None] + shift) + phase[None, :]
            s = (amp[None, :] * np.cos(arg)).sum(axis=1)
            out[:, j] = s / max(float(np.abs(s).max()), 1e-300)
        return out

    def _chirp(self) -> np.ndarray:
        cfg, n = self.cfg, self.n
        gen = np.random.default_rng(cfg.seed)
        T = max(self.T, self.dt)
        f = cfg.f_min + (cfg.f_max - cfg.f_min) * self.t / T
        phase = 2 * np.pi * (cfg.f_min * self.t + 0.5 * (cfg.f_max - cfg.f_min) * self.t ** 2 / T)
        out = np.zeros((len(self.t), n))
        for j in range(n):
            # The amplitude at which this joint's speed bound binds: a(t) 2 pi f(t) <= v.
            a_full = cfg.amplitude * self.half[j]
            v = cfg.velocity_fraction * self.velocity_limit[j]
            env = np.minimum(1.0, v / (2 * np.pi * f * max(a_full, 1e-300)))
            s = env * np.sin(phase + gen.uniform(0, 2 * np.pi))
            out[:, j] = s / max(float(np.abs(s).max()), 1e-300)
        return out

    # -- the run
    @property
    def steps(self) -> int:
        """Control steps of the signal (the lead-in comes before)."""
        return len(self.t) - 1

    def lead_steps(self, start) -> int:
        """Control steps of the lead-in from ``start`` to the centre at the speed bound."""
        d = np.abs(np.clip(np.asarray(start, float), self.lower, self.upper) - self.centre)
        return int(np.ceil((d / self.max_step).max())) if self.n else 0

    def start(self, position) -> None:
        """Begin from the measured ``position``: the lead-in to the centre, then the signal."""
        p = np.clip(np.asarray(position, dtype=np.float64).reshape(-1), self.lower, self.upper)
        self._start = p
        self._lead = self.lead_steps(p)
        self._last = p.copy()

    def command(self, k: int) -> np.ndarray:
        """Return the k-th target (k = 0, 1, ...) after :meth:`start`.

        It is inside the URDF limits, within the speed bound of the previous one, inside the margin
        once the lead-in is over.
        """
        if self._start is None:
            raise RuntimeError("ArmExcitation.start(position) first")
        if k < self._lead:
            s = (k + 1) / self._lead
            raw = self._start + s * (self.centre - self._start)
        else:
            raw = self.targets[min(k - self._lead, len(self.targets) - 1)]
        step = np.clip(raw - self._last, -self.max_step, self.max_step)
        out = np.clip(self._last + step, self.lower, self.upper)
        self._last = out
        return out

    def total_steps(self, start=None) -> int:
        return self.steps + (self.lead_steps(start) if start is not None else self._lead)


# ---------------------------------------------------------------------------------------- multirotors
class QuadrotorExcitation:
    """CTBR commands [collective thrust N, p, q, r rad/s] around hover; see the module doc.

    For a vehicle of ``mass`` kg (nominal). ``max_thrust`` (N, collective) and ``max_rate`` (rad/s)
    are the command interface's own limits, which the bounds never exceed.
    """

    KINDS = STEP_KINDS

    def __init__(self, mass: float, dt: float, cfg: ExcitationConfig, gravity: float = 9.81,
                 max_thrust: float = math.inf, max_rate: float = math.inf):
        if not (math.isfinite(mass) and mass > 0):
            raise ExcitationError(f"the vehicle's mass must be > 0, got {mass}")
        self.cfg, self.dt, self.mass, self.g = cfg, float(dt), float(mass), float(gravity)
        self.hover = self.mass * self.g
        lo, hi = self.hover * (1 - cfg.thrust_limit), self.hover * (1 + cfg.thrust_limit)
        if hi > max_thrust:
            raise ExcitationError(f"'excitation.thrust_limit' {cfg.thrust_limit}: hover x (1 + it) = {hi:.3g} N "
                                  f"exceeds what the rotors give ({max_thrust:.3g} N)")
        self.thrust_low, self.thrust_high = lo, hi
        self.rate_bound = min(cfg.rate_max, max_rate)
        self.home = np.asarray(cfg.home, dtype=np.float64)
        self.tan_tilt = math.tan(cfg.tilt_max)
        self.kp = np.array([cfg.position_gain, cfg.position_gain, cfg.height_gain])
        self.kd = np.array([cfg.velocity_gain, cfg.velocity_gain, cfg.height_velocity_gain])
        # The step schedule: (start s, end s, kind, value (3,)); a rest at hover after each step.
        gen = np.random.default_rng(cfg.seed)
        sched = []
        t, i = 0.0, int(gen.integers(len(self.KINDS)))
        a = cfg.amplitude
        kinds = [k for k in self.KINDS if k in cfg.steps]
        while kinds and t < cfg.duration:
            hold = float(gen.uniform(cfg.hold_min, cfg.hold_max))
            kind = kinds[i % len(kinds)]
            i += 1
            val = np.zeros(3)
            if kind == "attitude":            # roll/pitch offset of the tilt set-point, world x/y
                ang, r = gen.uniform(0, 2 * np.pi), a * cfg.tilt_max * math.sqrt(gen.uniform(0.25, 1.0))
                val[:2] = r * np.array([math.cos(ang), math.sin(ang)])
            elif kind == "thrust":
                val[0] = a * cfg.thrust_fraction * self.hover * gen.choice([-1.0, 1.0]) * gen.uniform(0.5, 1.0)
            else:                             # body rates: roll, pitch and yaw
                val[:] = a * self.rate_bound * gen.uniform(-1.0, 1.0, 3)
            end = min(t + hold, cfg.duration)
            sched.append((t, end, kind, val))
            t = end + float(gen.uniform(0.5, 1.0)) * cfg.hold_min      # rest
        self.schedule = sched
        self._starts = np.array([s[0] for s in sched]) if sched else np.zeros(0)
        self.integral = np.zeros(3)          # m s: the hold's integrated position error (z only)

    @property
    def steps(self) -> int:
        return int(round(self.cfg.duration / self.dt))

    def step_at(self, t: float):
        """(kind, value) of the step active at time ``t`` s, or (None, zeros)."""
        i = int(np.searchsorted(self._starts, t, side="right")) - 1
        if i >= 0:
            s, e, kind, val = self.schedule[i]
            if s <= t < e:
                return kind, val
        return None, np.zeros(3)

    def command(self, k: int, q: np.ndarray, v: np.ndarray) -> np.ndarray:
        """Return the k-th command (time ``k dt``) for the measured state q, v.

        q = [x y z qx qy qz qw ...], v = [body linear, body angular, ...]; after ``duration`` the
        hold alone.
        """
        cfg = self.cfg
        q = np.asarray(q, dtype=np.float64)
        v = np.asarray(v, dtype=np.float64)
        R = quat_to_matrix(q[3:7])
        p, vw = q[0:3], R @ v[0:3]
        err = self.home - p
        kind, val = self.step_at(k * self.dt) if k < self.steps else (None, np.zeros(3))
        if np.linalg.norm(err) > cfg.arena_radius:
            kind, val = None, np.zeros(3)                   # outside the arena: the hold alone
        lim = 0.4 * self.g / cfg.integral_gain
        self.integral = np.clip(self.integral + err * self.dt * np.array([0.0, 0.0, 1.0]), -lim, lim)
        a = self.kp * err - self.kd * vw + cfg.integral_gain * self.integral
        # Tilt set-point: z_des ~ (a_x / g + step, a_y / g + step, 1), tilt within tilt_max.
        tilt = a[:2] / self.g
        if kind == "attitude":
            tilt = tilt + np.tan(val[:2])
        nt = float(np.linalg.norm(tilt))
        if nt > self.tan_tilt:
            tilt = tilt * (self.tan_tilt / nt)
        z_des = np.array([tilt[0], tilt[1], 1.0])
        z_des /= np.linalg.norm(z_des)
        zb = R[:, 2]
        thrust = self.mass * (self.g + a[2]) / max(float(zb[2]), math.cos(cfg.tilt_max))
        if kind == "thrust":
            thrust += val[0]
        thrust = float(np.clip(thrust, self.thrust_low, self.thrust_high))
        e = R.T @ np.cross(zb, z_des)
        yaw = math.atan2(R[1, 0], R[0, 0])
        rates = np.array([cfg.attitude_gain * e[0], cfg.attitude_gain * e[1], -2.0 * yaw])
        if kind == "rate":
            measured_tilt = math.acos(max(-1.0, min(1.0, float(zb[2]))))
            rates[2] += val[2]
            if measured_tilt < cfg.tilt_max:
                rates[:2] += val[:2]
        rates = np.clip(rates, -self.rate_bound, self.rate_bound)
        return np.concatenate(([thrust], rates))

    def tilt_setpoint(self, k: int, q: np.ndarray, v: np.ndarray) -> float:
        """Return the tilt (rad) of the set-point :meth:`command` steers to.

        For checks; with the integral as the last command left it.
        """
        cfg = self.cfg
        q = np.asarray(q, dtype=np.float64)
        R = quat_to_matrix(q[3:7])
        a = (self.kp * (self.home - q[0:3]) - self.kd * (R @ np.asarray(v, float)[0:3])
             + cfg.integral_gain * self.integral)
        kind, val = self.step_at(k * self.dt) if k < self.steps else (None, np.zeros(3))
        if np.linalg.norm(self.home - q[0:3]) > cfg.arena_radius:
            kind = None
        tilt = a[:2] / self.g + (np.tan(val[:2]) if kind == "attitude" else 0.0)
        return math.atan(min(float(np.linalg.norm(tilt)), self.tan_tilt))


# ---------------------------------------------------------------------------------------- the runner
def identifiable_parameters(floating_base: bool, rotors: bool) -> Tuple[str, ...]:
    """Return the registry parameters an excitation recording is meant to identify on this kind of robot.

    They are parameters of physics/registry.py, identified together, one per physical quantity:

    * arms: ``mass_scale``, ``inertia_scale``, ``joint_damping`` (per joint), ``actuator_lag``,
      ``latency``. ``joint_friction`` is identifiable beside them when the URDF has friction
      (test_excite fits it as a sixth, from the project arm's 0.01-0.02 N m drawn x0.4-2.5:
      within 0.5 %; one law on both sides, doc/friction.md), but not listed: many URDFs carry
      none (UR5's is 0), and there is nothing to fit;
    * multirotors: ``mass_scale``, ``inertia_scale``, ``drag_scale``, ``motor_time_constant``,
      ``latency``. Not ``thrust_scale`` beside ``mass_scale`` and ``drag_scale``: with the thrust
      commanded, one factor on every force (thrust, rotor torques, drag) and on the mass and
      inertia leaves every acceleration the same, so only two ratios of the three are in the
      data (fit two of them; the stand-in has no thrust perturbation); ``drag_scale`` rather than ``drag_linear`` and
      ``drag_quadratic`` apart: at the speeds of a bounded excitation (1-2 m/s) the quadratic
      term changes the predictions too little to be told from the linear one.

    The alternatives of the registry's EXCLUSIVE pairs are the other choice of the same
    quantity (``link_mass_scale`` for ``mass_scale`` and so on).
    """
    if rotors:
        return ("mass_scale", "inertia_scale", "drag_scale", "motor_time_constant", "latency")
    return ("mass_scale", "inertia_scale", "joint_damping", "actuator_lag", "latency")


def _runner_base():
    from ..learning.deploy import PolicyRunner
    return PolicyRunner


class ExcitationRunner(_runner_base()):
    """A :class:`~diffsim_ros.learning.deploy.PolicyRunner` without a policy.

    The robot, the simulator (for the predictions) and the command limits come from a training/robot
    file's mapping ``params`` (its ``urdf``, ``floating_base`` and ``simulator`` sections), the
    commands from the excitation. The supervisor and the node use it exactly as a policy's runner.
    """

    def __init__(self, params: Mapping[str, Any], excitation: ExcitationConfig, source: str = "",
                 urdf: Optional[str] = None, dtype=None):
        import torch

        from .. import config as _config
        from .. import physics
        from ..learning.deploy import ARM, QUADROTOR

        dtype = dtype or torch.float64
        pre = f"{source}: " if source else ""
        params = dict(params)
        try:
            if urdf is not None:
                model = physics.load_urdf(urdf, floating_base=bool(params.get("floating_base", False)), dtype=dtype)
            else:
                model = _config.load_model(params, source, dtype=dtype)
            cfg = _config.simulator_config(params, source)
            sim = physics.Simulator(model, cfg)
        except (physics.ConfigError, physics.UrdfError) as e:
            raise ExcitationError(str(e)) from None
        self.model, self.sim, self._predictor, self.dtype = model, sim, sim, dtype
        self.params, self.source, self.excitation = params, source, excitation
        self.task = None
        self.checkpoint = None
        self.interface = cfg.actuator
        self.dt = float(cfg.dt)
        self.actuated_joints = list(sim.actuated_joints)
        self.joint_names = list(model.joint_names)
        self._name_cache = ((), None)
        self._carry = (None, None)
        self.mode = None
        self.target_dim = 3
        self._default_target = None
        if model.floating_base:
            if sim.rotors is None:
                raise ExcitationError(f"{pre}a floating-base robot without rotors (legged): the excitation drives "
                                      "arms and multirotors only")
            if cfg.actuator != "ctbr":
                raise ExcitationError(f"{pre}'simulator.actuator' is {cfg.actuator!r}: the multirotor excitation "
                                      "commands collective thrust and body rates (ctbr)")
            self.kind = QUADROTOR
            self.home = torch.tensor(list(excitation.home), dtype=dtype)
            rc = sim.rotors.cfg
            task = params.get("task") if isinstance(params.get("task"), dict) else {}
            max_rate = float(task.get("max_rate", math.inf))
            self.signal = QuadrotorExcitation(float(model.mass.sum()), self.dt, excitation,
                                              -float(model.gravity[2]), max_thrust=rc.max_thrust * sim.rotors.n,
                                              max_rate=max_rate)
            lo = torch.tensor([0.0, -self.signal.rate_bound, -self.signal.rate_bound, -self.signal.rate_bound])
            hi = torch.tensor([rc.max_thrust * sim.rotors.n, self.signal.rate_bound, self.signal.rate_bound,
                               self.signal.rate_bound])
            self._low, self._high = lo.to(dtype), hi.to(dtype)
            self.command_names = ["thrust", "roll_rate", "pitch_rate", "yaw_rate"]
            self.command_units = ["N", "rad/s", "rad/s", "rad/s"]
        else:
            if cfg.actuator != "position":
                raise ExcitationError(f"{pre}'simulator.actuator' is {cfg.actuator!r}: the arm excitation commands "
                                      "joint positions (position)")
            self.kind = ARM
            self.home = None
            idx = sim.act_index
            self.signal = ArmExcitation(model.lower[idx].double().numpy(), model.upper[idx].double().numpy(),
                                        model.velocity_limit[idx].double().numpy(), self.dt, excitation,
                                        names=self.actuated_joints)
            self._low = torch.as_tensor(self.signal.lower, dtype=dtype)
            self._high = torch.as_tensor(self.signal.upper, dtype=dtype)
            self.command_names = list(self.actuated_joints)
            self.command_units = ["rad"] * len(self.actuated_joints)
        self.meta = {"config": params, "excitation": excitation.as_dict(), "dt": self.dt,
                     "interface": self.interface}
        self.k = 0                  # commands sent so far: the excitation's clock (k dt)

    # -- what the supervisor calls
    def target_tensor(self, target=None):
        import torch

        if target is None:
            return None if self.home is None else self.home.reshape(1, 3).clone()
        return torch.as_tensor(np.asarray(target, dtype=np.float64).reshape(1, 3), dtype=self.dtype)

    def decide(self, state, target=None, predict: bool = True):
        import torch

        from ..learning.deploy import Decision

        q = state.q[0].to(torch.float64).numpy()
        v = state.v[0].to(torch.float64).numpy()
        if self.kind == "arm":
            if self.k == 0:
                self.signal.start(self.joint_positions(state))
            raw = self.signal.command(self.k)
        else:
            raw = self.signal.command(self.k, q, v)
        self.k += 1
        cmd, clamped = self.clamp(raw)
        pred = self.predict(state, cmd) if predict else None
        return Decision(cmd, np.zeros(len(cmd)), clamped, state, pred)

    @property
    def total_steps(self) -> int:
        """Commands until the motion is over (arms: the lead-in included once started)."""
        return self.signal.total_steps() if self.kind == "arm" and self.signal._start is not None else \
            self.signal.steps

    @property
    def finished(self) -> bool:
        return self.k > 0 and self.k >= self.total_steps

    def describe(self) -> str:
        e = self.excitation
        what = (f"{e.signal} joint targets, amplitude {e.amplitude:g} of the range inside a {e.margin:g} margin"
                if self.kind == "arm" else
                f"attitude/thrust/rate steps around hover, amplitude {e.amplitude:g} (tilt {e.tilt_max:g} rad, "
                f"thrust +-{e.thrust_fraction:g} hover, rates {self.signal.rate_bound:g} rad/s)")
        return (f"excitation on robot '{self.model.name}' ({self.kind}): {what}, {e.duration:g} s, seed {e.seed}; "
                f"interface {self.interface}, dt {self.dt:g} s")
