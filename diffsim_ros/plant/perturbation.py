"""Perturbations of the MuJoCo plant: the stand-in for the gap between simulation and reality.

Every field defaults to "no perturbation", so ``Perturbation()`` gives a plant whose
physics matches the training configuration.

Named presets (:data:`PRESETS`) give a robot kind's usual imperfections at once; the text form
``--perturb`` takes names one, with fields overriding it::

    resolve_perturbation("hardware", "multirotor")              # the preset's fields for a multirotor
    resolve_perturbation("hardware,latency=0.015", "arm")        # ... with one value changed
    resolve_perturbation({"mass_scale": 1.2}, "legged")          # plain fields pass through, checked

The ``hardware`` preset (every kind: 10 % more mass, 10 ms of latency):

========== ========== ======= ==================================== ============================== ===============
kind       mass_scale latency sensor_noise [position, velocity]    actuator_lag                   ground_friction
========== ========== ======= ==================================== ============================== ===============
arm        1.1        0.01 s  [0.001 rad, 0.01 rad/s]              0.005 s (joint torque)         (no ground)
legged     1.1        0.01 s  [0.001 rad or m, 0.01 rad/s or m/s]  0.005 s (joint torque)         0.7 x
multirotor 1.1        0.01 s  [0.002 m or rad, 0.02 m/s or rad/s]  0.03 s (rotor speed)           (unchanged)
========== ========== ======= ==================================== ============================== ===============

What the values stand for. Joint encoders: a 17-bit absolute encoder (Franka's joints) or Solo12's
optical encoder through its 9:1 gear resolves some 5e-5 rad, so 1 mrad of noise is a pessimistic
margin that also covers gear backlash and the encoder's mounting; a joint speed differentiated
at 1 kHz from such an encoder and low-pass filtered is good to about 0.01 rad/s. A legged robot's
base pose and twist (the stand-in applies the same pair to them): an IMU's roll and pitch estimate
is good to about 1-2 mrad and its gyroscope's white noise at a 100 Hz bandwidth is about 1 mrad/s;
a state estimator's base velocity is often worse than 0.01 m/s (a few cm/s while the feet slip),
so the preset is on the kind side there. Multirotor: motion capture (Vicon, OptiTrack) gives
positions to a fraction of a millimetre and attitudes to about 1 mrad, so 2 mm covers onboard
fusion or a coarser system; velocities differentiated from it and gyroscopes under propeller
vibration are good to about 0.02 m/s and 0.02 rad/s. The legged floor is 30 % more slippery than
the training's friction.

The slower actuator: a rotor's speed lag is 1.5 x the project quadrotor's
``rotors.motor_time_constant`` (0.02 s); a joint's torque follows its drive's command with a 5 ms
time constant (a torque bandwidth of about 30 Hz, slower than the kHz current loops of Solo12's
or a Franka's drives, pessimistic as the noise is), replacing the configuration's lag (none in
the shipped configurations). A lagged joint torque is applied as the simulator's actuation
stage applies it: the lag's share of the PD gains integrated implicitly
(physics/stages/actuation.py).

The ``default`` preset is the main job's (``diffsim-ros loop`` without ``--perturb``): 10 % more
mass and the slower actuator of the kind (a multirotor's rotors 0.03 s, with 50 % more drag; a
joint's torque 5 ms), no latency, noise or floor change: enough for the analysis to have
something to find. (Until 2026-12-06 it was one set for every kind, whose 0.03 s rotor lag
became a 30 ms joint torque lag on arms and legged robots: a torque bandwidth of 5 Hz, which no
robot's drive has, and under which the arm's servo chattered and solo12's walker fell.)
"""
from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Dict, Mapping, Optional, Tuple, Union

from ..schema import ConfigError, from_mapping, normalise, option, section


@section("perturbation")
@dataclass(frozen=True)
class Perturbation:
    """How the plant differs from the configuration it was built from (SI units).

    Every field defaults to no perturbation.

    The fields that are physical parameters of the simulator map onto the registry of
    :mod:`diffsim_ros.physics.registry` (``from_perturbation``), which gives the values a
    calibration of a recording of this plant should find.
    """

    mass_scale: float = option(1.0, """factor on every link mass and inertia tensor (the centres of mass stay).
        Gravity compensation and the CTBR rate loop keep the nominal model, as a robot's controller would""",
                               above=0)
    joint_damping_scale: float = option(1.0, "factor on the URDF <dynamics damping>", low=0)
    added_joint_damping: float = option(0.0, "viscous damping added to every joint (after the scale)",
                                        "N m s/rad (N s/m for prismatic joints)", low=0)
    drag_scale: float = option(1.0, "factor on the multirotor body drag (linear and quadratic)", low=0)
    thrust_scale: float = option(1.0, """factor on the thrust and yaw torque a multirotor's rotors really produce
        at a given speed (weaker motors or props, a low battery), on top of simulator.rotors.thrust_scale; the
        flight controller's mixer keeps the nominal coefficients""", above=0)
    actuator_lag: Optional[float] = option(None, """first-order time constant of the actuators, replacing the
        configuration's: for joints the torque lag (simulator.actuator_lag), for rotors the rotor-speed lag
        (rotors.motor_time_constant). null, or as a ROS parameter any negative number: the configuration's
        value""", "s", low=0, ros_null=-1.0)
    sensor_noise: Tuple[float, float] = option((0.0, 0.0), """standard deviation of the Gaussian noise on measured
        positions (m, rad; the base orientation gets a rotation of that many rad) and on measured velocities (m/s,
        rad/s): a number (both) or [position, velocity]. The true state is not affected""", low=0, broadcast=True)
    latency: float = option(0.0, """delay between a command and its effect; rounded to whole physics substeps
        (the stand-in's MuJoCo step: dt / substeps, finer with ground contact, plant/mujoco_plant.py) and added to
        simulator.command_delay""", "s", low=0)
    seed: int = option(0, "seed of the sensor-noise generator")
    joint_friction_scale: float = option(1.0, "factor on the URDF <dynamics friction>", low=0)
    ground_friction_scale: float = option(1.0, """factor on the Coulomb coefficient between the robot and the ground
        (simulator.friction): a slippery or grippy floor""", low=0)
    contact_time_constant: Optional[float] = option(None, """time constant of MuJoCo's soft ground contact (the
        geoms' solref[0]; MuJoCo's default 0.02 s lets a foot sink millimetres and creep): smaller is a harder
        floor, down to twice the stand-in's MuJoCo step. null, or as a ROS parameter any negative number: MuJoCo's
        default. Outside the simulator's model: its penalty contact has a stiffness instead
        (simulator.contact_stiffness, which sysid fits)""", "s", low=0, ros_null=-1.0)
    constraint_friction: bool = option(False, """the joints' Coulomb friction as MuJoCo's frictionloss constraint
        (dry friction as a soft constraint, solved with the contacts) instead of the simulator's smoothed law,
        which the stand-in otherwise applies as the simulator does (doc/friction.md): a friction model gap""")
    wind_force: Tuple[float, float, float] = option((0.0, 0.0, 0.0), """constant force on a multirotor's base,
        world frame, at its centre of mass; outside the simulator's model (sysid must reject it)""", "N")
    payload_mass: float = option(0.0, """a point mass fixed to the last body (the base of a multirotor, the last
        link of an arm); outside the calibration's scales""", "kg", low=0)
    payload_offset: Tuple[float, float, float] = option((0.0, 0.0, 0.0), "where the payload sits in that body's "
                                                        "frame", "m")

    def __post_init__(self):
        normalise(self)

    @classmethod
    def from_mapping(cls, d: Optional[Dict[str, Any]], where: str = "perturbation") -> "Perturbation":
        """Build from a mapping (a YAML section or node parameters; None: no perturbation).

        Errors name the key path under ``where``. ``actuator_lag`` or ``contact_time_constant`` < 0
        means None (ROS parameters cannot be null).
        """
        if d is None:
            return cls()
        if isinstance(d, dict):
            for key in ("actuator_lag", "contact_time_constant"):
                val = d.get(key)
                if isinstance(val, (int, float)) and not isinstance(val, bool) and val < 0:
                    d = {**d, key: None}
        return from_mapping(cls, d, where)

    def to_dict(self) -> Dict[str, Any]:
        return {f.name: (list(getattr(self, f.name)) if isinstance(getattr(self, f.name), tuple)
                         else getattr(self, f.name)) for f in fields(self)}

    @property
    def is_identity(self) -> bool:
        return self == Perturbation(seed=self.seed)


#: Robot kinds a preset has values for (DESIGN.md: arm, legged, multirotor); ``quadrotor`` (what
#: ``learning.checkpoint.robot_kind`` calls a multirotor) is read as ``multirotor``.
KINDS = ("arm", "legged", "multirotor")
_KIND_ALIASES = {"quadrotor": "multirotor"}

#: Named perturbations: {name: {robot kind: {field: value}}} (see the module doc for the values).
PRESETS: Dict[str, Dict[str, Dict[str, Any]]] = {
    "hardware": {
        "arm": {"mass_scale": 1.1, "latency": 0.01, "sensor_noise": [0.001, 0.01], "actuator_lag": 0.005},
        "legged": {"mass_scale": 1.1, "latency": 0.01, "sensor_noise": [0.001, 0.01], "actuator_lag": 0.005,
                   "ground_friction_scale": 0.7},
        "multirotor": {"mass_scale": 1.1, "latency": 0.01, "sensor_noise": [0.002, 0.02], "actuator_lag": 0.03},
    },
}
#: The main job's: the hardware preset's mass error and slower actuator alone, a multirotor also 50 % more drag.
PRESETS["default"] = {kind: dict({k: v[k] for k in ("mass_scale", "actuator_lag")},
                                 **({"drag_scale": 1.5} if kind == "multirotor" else {}))
                      for kind, v in PRESETS["hardware"].items()}

#: The key of a perturbation mapping that names a preset (``{"preset": "hardware", "latency": 0.015}``).
PRESET_KEY = "preset"


def robot_kind(kind: str) -> str:
    """``kind`` as :data:`KINDS` spells it (``quadrotor`` is ``multirotor``); ConfigError otherwise."""
    out = _KIND_ALIASES.get(kind, kind)
    if out not in KINDS:
        raise ConfigError(f"unknown robot kind {kind!r} (one of {', '.join(KINDS)}; quadrotor is multirotor)")
    return out


def _parse_value(text: str, item: str, where: str) -> Any:
    """Parse a value of the text form: a number, true/false, null, or [a, b, ...] of numbers."""
    t = text.strip()
    if t.startswith("[") and t.endswith("]"):
        return [_parse_value(x, item, where) for x in t[1:-1].split(",") if x.strip()]
    low = t.lower()
    if low in ("true", "false"):
        return low == "true"
    if low in ("null", "none"):
        return None
    try:
        return int(t)
    except ValueError:
        pass
    try:
        return float(t)
    except ValueError:
        raise ConfigError(f"{where}: entries are a preset name ({', '.join(PRESETS)}) or KEY=NUMBER (a list as "
                          f"KEY=[A,B]; e.g. hardware,latency=0.015 or mass_scale=1.2,drag_scale=2), got {item!r}"
                          ) from None


def _split(text: str):
    """Return the comma-separated entries of ``text``, commas inside [...] kept."""
    items, depth, cur = [], 0, ""
    for ch in text:
        depth += {"[": 1, "]": -1}.get(ch, 0)
        if ch == "," and depth <= 0:
            items.append(cur)
            cur = ""
        else:
            cur += ch
    items.append(cur)
    return [x.strip() for x in items if x.strip()]


def parse_perturbation(text: str, where: str = "--perturb") -> Dict[str, Any]:
    """Return the mapping of the text form ``[PRESET,]KEY=VALUE,...``.

    For example ``hardware,latency=0.015``; ``sensor_noise=[0.001,0.01]``; '' for none. The mapping
    holds the fields given, and the preset's name under ``preset``. Unknown presets and fields, and
    values the schema refuses, are a ConfigError naming ``where``; a preset's own values are filled
    in later, for a robot kind (:func:`resolve_perturbation`).
    """
    out: Dict[str, Any] = {}
    for item in _split(text or ""):
        key, sep, val = item.partition("=")
        key = key.strip()
        if not sep:
            if key not in PRESETS:
                raise ConfigError(f"{where}: {key!r} is not a preset (presets: {', '.join(PRESETS)}) nor KEY=NUMBER "
                                  "(e.g. hardware,latency=0.015 or mass_scale=1.2,drag_scale=2)")
            if PRESET_KEY in out:
                raise ConfigError(f"{where}: one preset at most, got {out[PRESET_KEY]!r} and {key!r}")
            out[PRESET_KEY] = key
            continue
        if not key:
            raise ConfigError(f"{where}: entries are KEY=NUMBER (e.g. mass_scale=1.2,drag_scale=2), got {item!r}")
        out[key] = _parse_value(val, item, where)
    _check_fields({k: v for k, v in out.items() if k != PRESET_KEY}, where)
    return out


def perturbation_spec(spec: Union[str, Mapping[str, Any], "Perturbation", None],
                      where: str = "--perturb") -> Dict[str, Any]:
    """``spec`` as a mapping of the fields given and, under ``preset``, a preset's name.

    ``spec`` is the text form, a mapping, a :class:`Perturbation` or None. It is checked as far as
    it can be without the robot's kind (a preset's values need it: :func:`resolve_perturbation`).
    """
    if spec is None:
        return {}
    if isinstance(spec, str):
        return parse_perturbation(spec, where)
    if isinstance(spec, Perturbation):
        return resolve_perturbation(spec)
    if not isinstance(spec, Mapping):
        raise ConfigError(f"{where}: a perturbation is text (KEY=VALUE,...), a mapping or None, got "
                          f"{type(spec).__name__}")
    out = dict(spec)
    if out.get(PRESET_KEY) not in (None, *PRESETS):
        raise ConfigError(f"{where}: unknown preset {out[PRESET_KEY]!r} (presets: {', '.join(PRESETS)})")
    _check_fields({k: v for k, v in out.items() if k != PRESET_KEY}, where)
    return out


def _check_fields(fields_: Mapping[str, Any], where: str) -> Perturbation:
    return Perturbation.from_mapping(dict(fields_), where)


def resolve_perturbation(spec: Union[str, Mapping[str, Any], "Perturbation", None], kind: Optional[str] = None,
                         where: str = "--perturb") -> Dict[str, Any]:
    """Return the perturbation fields of ``spec`` for a robot of ``kind``.

    ``kind`` is arm, legged, multirotor (quadrotor as multirotor). ``spec`` is the text form
    (:func:`parse_perturbation`), a mapping of fields with an optional ``preset`` name, a
    :class:`Perturbation` (its fields that differ from none) or None (none). A preset's values for
    the kind come first, the fields given replace them. Returns ``{field: value}`` of the fields
    set, checked and converted by the schema (plain Python values: lists for the vectors, so
    ``sensor_noise`` 0.001 is [0.001, 0.001]); a preset without a kind, an unknown preset or kind,
    and a bad field are a ConfigError naming ``where``.
    """
    if isinstance(spec, Perturbation):
        none = Perturbation().to_dict()
        return {k: v for k, v in spec.to_dict().items() if v != none[k]}
    spec = perturbation_spec(spec, where)
    given = {k: v for k, v in spec.items() if k != PRESET_KEY}
    preset = spec.get(PRESET_KEY)
    merged: Dict[str, Any] = {}
    if preset is not None:
        if preset not in PRESETS:
            raise ConfigError(f"{where}: unknown preset {preset!r} (presets: {', '.join(PRESETS)})")
        if kind is None:
            raise ConfigError(f"{where}: the preset {preset!r} has values per robot kind ({', '.join(KINDS)}): "
                              "give the robot's kind")
        try:
            merged.update(PRESETS[preset][robot_kind(kind)])
        except ConfigError as e:
            raise ConfigError(f"{where}: {e}") from None
    merged.update(given)
    pert = _check_fields(merged, where)
    return {k: _plain(getattr(pert, k)) for k in merged}


def _plain(val: Any) -> Any:
    return list(val) if isinstance(val, tuple) else val


def ros_values(perturbation: Mapping[str, Any], where: str = "perturbation") -> Dict[str, Any]:
    """``{field: value}`` of a perturbation mapping as mujoco_plant's ROS parameters hold them.

    The parameters are ``perturbation.<field>``. The values are checked and converted by the schema,
    vectors as lists of floats (``sensor_noise`` 0.001 is [0.001, 0.001]), floats as floats (an
    integer 0 is 0.0), and null as the field's stand-in (-1.0 for ``actuator_lag``). ConfigError
    names ``where``.<field>.
    """
    from ..schema import entries

    pert = _check_fields(dict(perturbation), where)
    nulls = {e.name: e.ros_null for e in entries(Perturbation)}
    out = {}
    for k in perturbation:
        val = getattr(pert, k)
        if val is None:
            val = nulls[k]
        elif isinstance(val, tuple):
            val = [float(x) for x in val]
        out[k] = val
    return out
