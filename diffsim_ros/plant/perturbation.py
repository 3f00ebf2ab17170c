"""Perturbations of the MuJoCo plant: the stand-in for the gap between simulation and reality.

Every field defaults to "no perturbation", so ``Perturbation()`` gives a plant whose
physics matches the training configuration.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any, Dict, Optional, Tuple

from ..physics import ConfigError


@dataclass(frozen=True)
class Perturbation:
    """How the plant differs from the configuration it was built from (SI units).

    mass_scale: factor on every link mass and inertia tensor (the centres of mass
        stay). Gravity compensation and the CTBR rate loop keep the nominal model,
        as a robot's controller would.                                       default 1.0
    joint_damping_scale: factor on the URDF ``<dynamics damping>``.          default 1.0
    added_joint_damping: viscous damping added to every joint (after the scale),
        N m s/rad (N s/m for prismatic joints).                              default 0.0
    drag_scale: factor on the multirotor body drag (linear and quadratic).   default 1.0
    actuator_lag: first-order time constant of the actuators, s, replacing the
        configuration's: for joints the torque lag (``simulator.actuator_lag``), for
        rotors the rotor-speed lag (``rotors.motor_time_constant``). None: the
        configuration's value.                                               default None
    sensor_noise: standard deviation of the Gaussian noise on measured positions
        (m, rad; the base orientation gets a rotation of that many rad) and on
        measured velocities (m/s, rad/s): a number (both) or [position, velocity].
        The true state is not affected.                                     default (0, 0)
    latency: delay between a command and its effect, s; rounded to whole physics
        substeps (dt / substeps) and added to ``simulator.command_delay``.   default 0.0
    seed: seed of the sensor-noise generator.                                default 0
    joint_friction_scale: factor on the URDF ``<dynamics friction>``.        default 1.0
    constraint_friction: the joints' Coulomb friction as MuJoCo's ``frictionloss``
        constraint (dry friction as a soft constraint, solved with the contacts)
        instead of the simulator's smoothed law, which the stand-in otherwise applies
        as the simulator does (doc/friction.md): a friction model gap.       default False
    wind_force: constant force on a multirotor's base, world frame, N, at its
        centre of mass; outside the simulator's model (sysid must reject it).  default (0, 0, 0)
    payload_mass: a point mass fixed to the last body (the base of a multirotor,
        the last link of an arm), kg; outside the calibration's scales.      default 0.0
    payload_offset: where the payload sits in that body's frame, m.          default (0, 0, 0)

    The fields that are physical parameters of the simulator map onto the registry of
    :mod:`diffsim_ros.physics.parameters` (``from_perturbation``), which gives the values a
    calibration of a recording of this plant should find.
    """
    mass_scale: float = 1.0
    joint_damping_scale: float = 1.0
    added_joint_damping: float = 0.0
    drag_scale: float = 1.0
    actuator_lag: Optional[float] = None
    sensor_noise: Tuple[float, float] = (0.0, 0.0)
    latency: float = 0.0
    seed: int = 0
    joint_friction_scale: float = 1.0
    constraint_friction: bool = False
    wind_force: Tuple[float, float, float] = (0.0, 0.0, 0.0)
    payload_mass: float = 0.0
    payload_offset: Tuple[float, float, float] = (0.0, 0.0, 0.0)

    def __post_init__(self):
        self.validate()

    def validate(self, where: str = "perturbation") -> None:
        def number(key, val):
            if isinstance(val, bool) or not isinstance(val, (int, float)) or not math.isfinite(val):
                raise ConfigError(f"'{where}.{key}' must be a finite number, got {val!r}")
            return float(val)

        for key in ("mass_scale", "joint_damping_scale", "drag_scale", "joint_friction_scale"):
            val = number(key, getattr(self, key))
            if not val > 0 and key == "mass_scale":
                raise ConfigError(f"'{where}.mass_scale' must be > 0, got {val}")
            if val < 0:
                raise ConfigError(f"'{where}.{key}' must be >= 0, got {val}")
            object.__setattr__(self, key, val)
        for key in ("added_joint_damping", "latency", "payload_mass"):
            val = number(key, getattr(self, key))
            if val < 0:
                raise ConfigError(f"'{where}.{key}' must be >= 0, got {val}")
            object.__setattr__(self, key, val)
        if self.actuator_lag is not None:
            val = number("actuator_lag", self.actuator_lag)
            if val < 0:
                raise ConfigError(f"'{where}.actuator_lag' must be >= 0 s (or None: the configuration's), "
                                  f"got {val}")
            object.__setattr__(self, "actuator_lag", val)
        noise = self.sensor_noise
        if isinstance(noise, (int, float)) and not isinstance(noise, bool):
            noise = (noise, noise)
        if not isinstance(noise, (list, tuple)) or len(noise) != 2:
            raise ConfigError(f"'{where}.sensor_noise' must be a number or [position_std, velocity_std], "
                              f"got {self.sensor_noise!r}")
        noise = tuple(number("sensor_noise", x) for x in noise)
        if min(noise) < 0:
            raise ConfigError(f"'{where}.sensor_noise' entries must be >= 0, got {list(noise)}")
        object.__setattr__(self, "sensor_noise", noise)
        for key in ("wind_force", "payload_offset"):
            val = getattr(self, key)
            if not isinstance(val, (list, tuple)) or len(val) != 3:
                raise ConfigError(f"'{where}.{key}' must be [x, y, z], got {val!r}")
            object.__setattr__(self, key, tuple(number(key, x) for x in val))
        if not isinstance(self.constraint_friction, bool):
            raise ConfigError(f"'{where}.constraint_friction' must be true or false, got {self.constraint_friction!r}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int):
            raise ConfigError(f"'{where}.seed' must be an integer, got {self.seed!r}")

    @classmethod
    def from_dict(cls, d: Optional[Dict[str, Any]], where: str = "perturbation") -> "Perturbation":
        """Build from a mapping (a YAML section or node parameters); unknown keys are an
        error naming the key. ``actuator_lag`` < 0 means None (ROS parameters cannot be null)."""
        if d is None:
            return cls()
        if isinstance(d, Perturbation):
            return d
        if not isinstance(d, dict):
            raise ConfigError(f"'{where}' must be a mapping, got {type(d).__name__}")
        known = [f.name for f in fields(cls)]
        for k in d:
            if k not in known:
                raise ConfigError(f"unknown key '{where}.{k}' (known: {', '.join(known)})")
        kw = dict(d)
        lag = kw.get("actuator_lag")
        if isinstance(lag, (int, float)) and not isinstance(lag, bool) and lag < 0:
            kw["actuator_lag"] = None
        # Built field by field so that validate() names the keys under ``where``.
        obj = cls.__new__(cls)
        for f in fields(cls):
            object.__setattr__(obj, f.name, kw.get(f.name, f.default))
        obj.validate(where)
        return obj

    def to_dict(self) -> Dict[str, Any]:
        return {f.name: (list(getattr(self, f.name)) if isinstance(getattr(self, f.name), tuple)
                         else getattr(self, f.name)) for f in fields(self)}

    @property
    def is_identity(self) -> bool:
        return self == Perturbation(seed=self.seed)
