"""Multirotor actuation and aerodynamics: rotor mixing, motor dynamics, a
collective-thrust-and-body-rates (CTBR) inner loop, and body drag.

Everything acts on the floating base (body 0) as a body-frame wrench
``[F; M]`` about the body origin, which for a free-flyer is exactly the
generalised force on its six base coordinates.

Conventions: rotors push along the body +z axis. ``directions[i] = +1`` means
the rotor's reaction torque on the body is ``+torque_coefficient * w^2``
about body +z (a rotor spinning clockwise seen from above), ``-1`` the
opposite.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass, fields
from typing import Tuple

import torch

from .spatial import fast_cross as cross



class ConfigError(ValueError):
    """A configuration (YAML or dict) with a wrong key, type or value; the message names it."""


def _vec3(name: str, value, allow_scalar: bool = True) -> Tuple[float, float, float]:
    if isinstance(value, bool) or (isinstance(value, (list, tuple)) and any(isinstance(x, bool) for x in value)):
        raise ConfigError(f"'{name}' must be numbers, got {value!r}")
    if not allow_scalar and not isinstance(value, (list, tuple)):
        raise ConfigError(f"'{name}' entries must be [x, y, z] lists, got {value!r}")
    try:
        if isinstance(value, (int, float)):
            value = (value, value, value)
        out = tuple(float(x) for x in value)
    except (TypeError, ValueError):
        raise ConfigError(f"'{name}' must be a number or a list of 3 numbers, got {value!r}") from None
    if len(out) != 3:
        raise ConfigError(f"'{name}' must have 3 entries, got {len(out)}")
    return out


@dataclass(frozen=True)
class RotorConfig:
    """Rotor layout and aerodynamic coefficients of a multirotor (SI units).

    rotor_links: names of URDF links at the rotor hubs (their origins give the
        positions); or give ``positions`` directly.            default: none
    positions: rotor hub positions in the base frame, m.       default: none
    directions: +1/-1 per rotor, sign of the yaw reaction torque (see module doc).
    thrust_coefficient: thrust = k_f w^2, N s^2/rad^2.        default 1.0e-5
    torque_coefficient: yaw torque = k_m w^2, N m s^2/rad^2.   default 1.6e-7
    motor_time_constant: first-order lag of rotor speed, s.    default 0.02 (0: none)
    max_rotor_speed: rad/s.                                    default 1500
    drag_linear: body-frame linear drag per axis, N s/m.       default (0.1, 0.1, 0.15)
    drag_quadratic: body-frame quadratic drag per axis, N s^2/m^2. default (0.02, 0.02, 0.04)
    rate_gain: CTBR inner-loop proportional gain on the body-rate error, 1/s. default (20, 20, 8)
    thrust_scale: factor on the thrust and yaw torque the rotors really produce at a given speed,
        relative to thrust_coefficient/torque_coefficient, which the mixer and the CTBR loop use
        to command speeds: a flight controller whose motor model is off by this factor
        (system identification writes it), dimensionless.   default 1.0
    """
    rotor_links: Tuple[str, ...] = ()
    positions: Tuple[Tuple[float, float, float], ...] = ()
    directions: Tuple[float, ...] = ()
    thrust_coefficient: float = 1.0e-5
    torque_coefficient: float = 1.6e-7
    motor_time_constant: float = 0.02
    max_rotor_speed: float = 1500.0
    drag_linear: Tuple[float, float, float] = (0.1, 0.1, 0.15)
    drag_quadratic: Tuple[float, float, float] = (0.02, 0.02, 0.04)
    rate_gain: Tuple[float, float, float] = (20.0, 20.0, 8.0)
    thrust_scale: float = 1.0

    @classmethod
    def from_dict(cls, d: dict, where: str = "rotors") -> "RotorConfig":
        if not isinstance(d, dict):
            raise ConfigError(f"'{where}' must be a mapping, got {type(d).__name__}")
        known = {f.name for f in fields(cls)}
        for k in d:
            if k not in known:
                raise ConfigError(f"unknown key '{where}.{k}' (known: {', '.join(sorted(known))})")
        kw = dict(d)
        for k in ("rotor_links", "positions", "directions"):
            if k in kw and not isinstance(kw[k], (list, tuple)):
                raise ConfigError(f"'{where}.{k}' must be a list, got {kw[k]!r}")
        for k in ("thrust_coefficient", "torque_coefficient", "motor_time_constant", "max_rotor_speed",
                  "thrust_scale"):
            if k in kw and (isinstance(kw[k], bool) or not isinstance(kw[k], (int, float))):
                raise ConfigError(f"'{where}.{k}' must be a number, got {kw[k]!r}")
        try:
            if "rotor_links" in kw:
                kw["rotor_links"] = tuple(str(x) for x in kw["rotor_links"])
            if "positions" in kw:
                kw["positions"] = tuple(_vec3(f"{where}.positions", p, allow_scalar=False) for p in kw["positions"])
            if "directions" in kw:
                kw["directions"] = tuple(float(x) for x in kw["directions"])
            for k in ("thrust_coefficient", "torque_coefficient", "motor_time_constant", "max_rotor_speed",
                      "thrust_scale"):
                if k in kw:
                    kw[k] = float(kw[k])
        except (TypeError, ValueError) as e:
            raise ConfigError(f"'{where}': {e}") from None
        for k in ("drag_linear", "drag_quadratic", "rate_gain"):
            if k in kw:
                kw[k] = _vec3(f"{where}.{k}", kw[k])
        cfg = cls(**kw)
        cfg.validate(where)
        return cfg

    def validate(self, where: str = "rotors") -> None:
        n = len(self.rotor_links) or len(self.positions)
        if n == 0:
            raise ConfigError(f"'{where}' needs 'rotor_links' or 'positions'")
        if self.rotor_links and self.positions:
            raise ConfigError(f"'{where}': give either 'rotor_links' or 'positions', not both")
        if len(self.directions) != n:
            raise ConfigError(f"'{where}.directions' has {len(self.directions)} entries for {n} rotors")
        if any(d not in (-1.0, 1.0) for d in self.directions):
            raise ConfigError(f"'{where}.directions' entries must be +1 or -1, got {self.directions}")
        for k in ("thrust_coefficient", "max_rotor_speed", "thrust_scale"):
            if not getattr(self, k) > 0:
                raise ConfigError(f"'{where}.{k}' must be > 0, got {getattr(self, k)}")
        for k in ("torque_coefficient", "motor_time_constant"):
            if not getattr(self, k) >= 0:
                raise ConfigError(f"'{where}.{k}' must be >= 0, got {getattr(self, k)}")
        for k in ("drag_linear", "drag_quadratic", "rate_gain"):
            if any(not x >= 0 for x in getattr(self, k)):
                raise ConfigError(f"'{where}.{k}' entries must be >= 0, got {getattr(self, k)}")

    @property
    def n(self) -> int:
        return len(self.rotor_links) or len(self.positions)

    @property
    def max_thrust(self) -> float:
        """Maximum thrust of one rotor, N."""
        return self.thrust_coefficient * self.max_rotor_speed ** 2


class Rotors:
    """A :class:`RotorConfig` resolved against a model: the tensors of the step.

    Immutable by convention: ``rotors.replace(drag_linear=d, thrust_scale=s)`` gives a
    copy (tensors that require grad make the step differentiable in them). The rate
    loop's inertia (``inertia``, ``com``, ``mass``) is the controller's: the model's
    at construction, kept when the physics model is calibrated.
    """

    def __init__(self, cfg: RotorConfig, model):
        if not model.floating_base:
            raise ConfigError("rotors need a floating-base model (load_urdf(..., floating_base=True))")
        self.cfg = cfg
        dt, dev = model.dtype, model.device
        if cfg.rotor_links:
            pos = []
            for name in cfg.rotor_links:
                if name not in model.link_names:
                    raise ConfigError(f"rotors.rotor_links: link '{name}' is not in the URDF "
                                      f"(links: {', '.join(model.link_names)})")
                i = model.link_names.index(name)
                if model.link_body[i] != 0:
                    raise ConfigError(f"rotors.rotor_links: link '{name}' is not rigidly attached to the base")
                pos.append(model.link_p[i])
            self.positions = torch.stack(pos).to(dtype=dt, device=dev)
        else:
            self.positions = torch.tensor(cfg.positions, dtype=dt, device=dev)
        self.directions = torch.tensor(cfg.directions, dtype=dt, device=dev)
        kf, km = cfg.thrust_coefficient, cfg.torque_coefficient
        # Allocation: [F_z; M_x; M_y; M_z] = A @ thrusts (thrust along body z at each hub).
        x, y = self.positions[:, 0], self.positions[:, 1]
        self.allocation = torch.stack((torch.ones_like(x), y, -x, self.directions * (km / kf)))
        self.allocation_pinv = torch.linalg.pinv(self.allocation)
        self.drag_linear = torch.tensor(cfg.drag_linear, dtype=dt, device=dev)
        self.drag_quadratic = torch.tensor(cfg.drag_quadratic, dtype=dt, device=dev)
        self.rate_gain = torch.tensor(cfg.rate_gain, dtype=dt, device=dev)
        self.thrust_scale = torch.tensor(cfg.thrust_scale, dtype=dt, device=dev)
        self.motor_time_constant = torch.tensor(cfg.motor_time_constant, dtype=dt, device=dev)
        # The rotor-speed lag as a state: decided by the configuration, so a calibration
        # may start the time constant anywhere (even at 0) and move it by gradient.
        self.has_motor_lag = cfg.motor_time_constant > 0
        self.inertia = model.inertia[0]
        self.com = model.com[0]
        self.mass = model.mass[0]
        # Per-rotor moment arms of the body wrench [F_z, M_x, M_y, M_z] of unit thrusts.
        self._arms = self.allocation.T.contiguous()

    def replace(self, **changes) -> "Rotors":
        """A copy with some tensors replaced (e.g. ``drag_linear`` requiring grad)."""
        unknown = [k for k in changes if k not in self.__dict__ or k.startswith("_")]
        if unknown:
            raise AttributeError(f"Rotors has no parameter {', '.join(unknown)}")
        new = copy.copy(self)
        new.__dict__.update(changes)
        return new

    @property
    def n(self) -> int:
        return self.positions.shape[0]

    # ---------------------------------------------------------------- motors
    def speed_for_thrust(self, thrust: torch.Tensor) -> torch.Tensor:
        """Rotor speed (rad/s) that gives ``thrust`` (N), smooth at zero."""
        return torch.sqrt(thrust / self.cfg.thrust_coefficient + 1e-6)

    def clamp_thrust(self, thrust: torch.Tensor) -> torch.Tensor:
        """Smoothly clamp per-rotor thrust to [0, max_thrust].

        Softplus corners 0.01 % of the range wide: gradients survive near the
        bounds, and a zero command leaves a residual thrust of only
        ln(2) 1e-4 max_thrust."""
        hi = self.cfg.max_thrust
        beta = 1.0e4 / hi
        sp = torch.nn.functional.softplus
        return sp(thrust, beta) - sp(thrust - hi, beta)

    def wrench(self, speed: torch.Tensor) -> torch.Tensor:
        """Body-frame wrench [F; M] (..., 6) about the body origin from rotor speeds (..., n)."""
        thrust = (self.thrust_scale * self.cfg.thrust_coefficient) * speed ** 2
        fm = thrust @ self._arms                                   # (..., 4): F_z, M_x, M_y, M_z
        z = torch.zeros_like(fm[..., 0:2])
        return torch.cat((z, fm), -1)

    # ---------------------------------------------------------------- CTBR
    def ctbr_thrusts(self, command: torch.Tensor, omega: torch.Tensor) -> torch.Tensor:
        """Per-rotor thrusts for a CTBR command (..., 4) = [collective thrust N, p, q, r rad/s]
        given the body rates ``omega`` (..., 3): a proportional rate loop with feedforward
        of the gyroscopic term, mixed through the allocation pseudo-inverse."""
        rate_err = command[..., 1:4] - omega
        alpha = self.rate_gain * rate_err
        J = self.inertia
        Jw = omega @ J.T
        torque = alpha @ J.T + cross(omega, Jw)
        wrench = torch.cat((command[..., 0:1], torque), -1)
        return wrench @ self.allocation_pinv.T

    # ---------------------------------------------------------------- drag
    def drag(self, v_body: torch.Tensor) -> torch.Tensor:
        """Body-frame drag wrench (..., 6) about the body origin, applied at the centre of mass.

        F = -(D_1 v + D_2 |v| v) per body axis, with v the velocity of the centre of
        mass in the body frame (low-speed regime, below about 7 m/s).
        """
        v_lin, w = v_body[..., 0:3], v_body[..., 3:6]
        v_com = v_lin + cross(w, self.com.expand_as(w))
        F = -(self.drag_linear * v_com + self.drag_quadratic * v_com.abs() * v_com)
        M = cross(self.com.expand_as(F), F)
        return torch.cat((F, M), -1)
