"""Multirotor actuation and aerodynamics.

The parts are rotor mixing, motor dynamics, a collective-thrust-and-body-rates (CTBR) inner
loop, and body drag.

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
from dataclasses import dataclass
from typing import Tuple

import torch

from . import laws
from ..schema import ConfigError, normalise, option, section
from .spatial import fast_cross as cross



@section("simulator.rotors")
@dataclass(frozen=True)
class RotorConfig:
    """Rotor layout and aerodynamic coefficients of a multirotor (SI units).

    The rotors are ``rotor_links`` (URDF links at the hubs, whose origins give the positions) or
    ``positions``, one of the two; ``directions`` has one entry per rotor (see the module doc).
    """

    rotor_links: Tuple[str, ...] = option((), "names of the URDF links at the rotor hubs (their origins give the "
                                          "positions); or give positions")
    positions: Tuple[Tuple[float, float, float], ...] = option(
        (), "rotor hub positions in the base frame, [x0, y0, z0, x1, ...] (ROS parameters hold a flat list)", "m")
    directions: Tuple[float, ...] = option((), "+1/-1 per rotor: the sign of its yaw reaction torque about body +z",
                                           choices=(-1.0, 1.0))
    thrust_coefficient: float = option(1.0e-5, "thrust = k_f w^2", "N s^2/rad^2", above=0)
    torque_coefficient: float = option(1.6e-7, "yaw torque = k_m w^2", "N m s^2/rad^2", low=0)
    motor_time_constant: float = option(0.02, "first-order lag of the rotor speed (0: none)", "s", low=0)
    max_rotor_speed: float = option(1500.0, "largest rotor speed", "rad/s", above=0)
    drag_linear: Tuple[float, float, float] = option((0.1, 0.1, 0.15), "body-frame linear drag per axis", "N s/m",
                                                     low=0, broadcast=True)
    drag_quadratic: Tuple[float, float, float] = option((0.02, 0.02, 0.04), "body-frame quadratic drag per axis",
                                                        "N s^2/m^2", low=0, broadcast=True)
    rate_gain: Tuple[float, float, float] = option((20.0, 20.0, 8.0), "CTBR inner-loop proportional gain on the "
                                                   "body-rate error", "1/s", low=0, broadcast=True)
    thrust_scale: float = option(1.0, """factor on the thrust and yaw torque the rotors really produce at a given
        speed, relative to thrust_coefficient/torque_coefficient, which the mixer and the CTBR loop use to command
        speeds: a flight controller whose motor model is off by this factor (system identification writes
        it)""", above=0)

    #: The layout rules (check) run when a configuration is read, not on construction.
    check_when_read = True

    def __post_init__(self):
        normalise(self)

    def check(self) -> None:
        """Check the rules between fields (the layout), with relative key paths."""
        n = len(self.rotor_links) or len(self.positions)
        if n == 0:
            raise ConfigError("needs 'rotor_links' or 'positions'", "")
        if self.rotor_links and self.positions:
            raise ConfigError("has both 'rotor_links' and 'positions'; give one of them", "")
        if len(self.directions) != n:
            raise ConfigError(f"has {len(self.directions)} entries for {n} rotors", "directions")

    def validate(self, where: str = "rotors") -> None:
        """:meth:`check`, errors named under ``where``."""
        try:
            self.check()
        except ConfigError as e:
            raise e.under(where) from None

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
                    raise ConfigError(f"names link '{name}', which is not in the URDF "
                                      f"(links: {', '.join(model.link_names)})", "simulator.rotors.rotor_links")
                i = model.link_names.index(name)
                if model.link_body[i] != 0:
                    raise ConfigError(f"names link '{name}', which is not rigidly attached to the base",
                                      "simulator.rotors.rotor_links")
                pos.append(model.link_p[i])
            self.positions = torch.stack(pos).to(dtype=dt, device=dev)
        else:
            self.positions = torch.tensor(cfg.positions, dtype=dt, device=dev)
        self.directions = torch.tensor(cfg.directions, dtype=dt, device=dev)
        kf, km = cfg.thrust_coefficient, cfg.torque_coefficient
        # Allocation: [F_z; M_x; M_y; M_z] = A @ thrusts (thrust along body z at each hub).
        self.allocation = laws.allocation(torch, self.positions, self.directions, kf, km)
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
        """Return a copy with some tensors replaced (e.g. ``drag_linear`` requiring grad)."""
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
        return laws.speed_for_thrust(torch, thrust, self.cfg.thrust_coefficient)

    def clamp_thrust(self, thrust: torch.Tensor) -> torch.Tensor:
        """Smoothly clamp per-rotor thrust to [0, max_thrust] (physics/laws.py, clamp_thrust)."""
        return laws.clamp_thrust(torch, thrust, self.cfg.max_thrust)

    def wrench(self, speed: torch.Tensor) -> torch.Tensor:
        """Body-frame wrench [F; M] (..., 6) about the body origin from rotor speeds (..., n)."""
        thrust = laws.rotor_thrusts(torch, speed, self.cfg.thrust_coefficient, self.thrust_scale)
        fm = thrust @ self._arms                                   # (..., 4): F_z, M_x, M_y, M_z
        z = torch.zeros_like(fm[..., 0:2])
        return torch.cat((z, fm), -1)

    # ---------------------------------------------------------------- CTBR
    def ctbr_thrusts(self, command: torch.Tensor, omega: torch.Tensor) -> torch.Tensor:
        """Per-rotor thrusts for a CTBR command (..., 4) = [collective thrust N, p, q, r rad/s].

        The command is taken at the body rates ``omega`` (..., 3): a proportional rate loop with
        feedforward of the gyroscopic term, mixed through the allocation pseudo-inverse
        (physics/laws.py).
        """
        return laws.ctbr_thrusts(torch, command, omega, self.rate_gain, self.inertia, self.allocation_pinv)

    # ---------------------------------------------------------------- drag
    def drag(self, v_body: torch.Tensor) -> torch.Tensor:
        """Body-frame drag wrench (..., 6) about the body origin, applied at the centre of mass.

        F = -(D_1 v + D_2 |v| v) per body axis, with v the velocity of the centre of
        mass in the body frame (low-speed regime, below about 7 m/s).
        """
        v_lin, w = v_body[..., 0:3], v_body[..., 3:6]
        v_com = v_lin + cross(w, self.com.expand_as(w))
        F = laws.drag_force(torch, v_com, self.drag_linear, self.drag_quadratic)
        M = cross(self.com.expand_as(F), F)
        return torch.cat((F, M), -1)
