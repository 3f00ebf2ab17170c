"""The multirotor's on-board logic in NumPy: CTBR rate loop, mixer, motors, drag law.

These are the *controller and actuator* definitions of ``physics/quadrotor.py``
(same allocation matrix, rate loop, smooth thrust clamp and first-order rotor-speed
lag), re-written without torch so that the MuJoCo plant computes the same commands
to its motors as the simulator does. The rigid-body physics that the resulting
forces drive is MuJoCo's, not this module's.

Conventions (as physics/quadrotor.py): rotors push along body +z; ``directions[i]
= +1``: rotor i's reaction torque on the body is ``+k_m w^2`` about body +z.
"""
from __future__ import annotations

import math

import numpy as np

from ..physics import RotorConfig


class FlightController:
    """Rate loop + mixer + motor model of one multirotor.

    positions: (n, 3) rotor hub positions in the base frame, m.
    inertia: (3, 3) the nominal base inertia about its centre of mass, kg m^2 (what
        the flight controller believes; the true one is MuJoCo's).
    com: (3,) the nominal centre of mass in the base frame, m (where drag acts).
    """

    def __init__(self, cfg: RotorConfig, positions: np.ndarray, inertia: np.ndarray, com: np.ndarray,
                 motor_time_constant: float = None):
        self.cfg = cfg
        self.positions = np.asarray(positions, dtype=np.float64).reshape(-1, 3)
        self.directions = np.asarray(cfg.directions, dtype=np.float64)
        self.n = self.positions.shape[0]
        self.kf, self.km = cfg.thrust_coefficient, cfg.torque_coefficient
        self.cfg_thrust_scale = float(cfg.thrust_scale)
        x, y = self.positions[:, 0], self.positions[:, 1]
        # [F_z; M_x; M_y; M_z] = allocation @ thrusts (thrust along body z at each hub).
        self.allocation = np.stack((np.ones_like(x), y, -x, self.directions * (self.km / self.kf)))
        self.allocation_pinv = np.linalg.pinv(self.allocation)
        self.rate_gain = np.asarray(cfg.rate_gain, dtype=np.float64)
        self.inertia = np.asarray(inertia, dtype=np.float64)
        self.com = np.asarray(com, dtype=np.float64)
        self.drag_linear = np.asarray(cfg.drag_linear, dtype=np.float64)
        self.drag_quadratic = np.asarray(cfg.drag_quadratic, dtype=np.float64)
        self.motor_time_constant = cfg.motor_time_constant if motor_time_constant is None else motor_time_constant

    @property
    def max_thrust(self) -> float:
        """Largest thrust of one rotor, N."""
        return self.cfg.max_thrust

    def ctbr_thrusts(self, command: np.ndarray, omega: np.ndarray) -> np.ndarray:
        """Per-rotor thrust (N) for ``command`` = [collective thrust N, p, q, r rad/s] at body
        rates ``omega``: proportional rate loop plus the gyroscopic feed-forward, mixed by the
        allocation pseudo-inverse (physics.quadrotor.Rotors.ctbr_thrusts)."""
        alpha = self.rate_gain * (command[1:4] - omega)
        J = self.inertia
        torque = J @ alpha + np.cross(omega, J @ omega)
        wrench = np.concatenate(([command[0]], torque))
        return self.allocation_pinv @ wrench

    def clamp_thrust(self, thrust: np.ndarray) -> np.ndarray:
        """Thrust limited to [0, max_thrust] with the simulator's softplus corners (0.01 % of
        the range wide), so that plant and simulator saturate alike."""
        hi = self.max_thrust
        beta = 1.0e4 / hi

        def softplus(x):
            return np.logaddexp(0.0, beta * x) / beta
        return softplus(thrust) - softplus(thrust - hi)

    def speed_for_thrust(self, thrust: np.ndarray) -> np.ndarray:
        """Rotor speed (rad/s) giving ``thrust`` (N), as physics.quadrotor (smooth at zero)."""
        return np.sqrt(np.asarray(thrust) / self.kf + 1e-6)

    def motor_step(self, speed: np.ndarray, thrust_command: np.ndarray, h: float) -> np.ndarray:
        """Rotor speeds after ``h`` s of the first-order lag towards the commanded thrust."""
        target = self.speed_for_thrust(self.clamp_thrust(thrust_command))
        tau = self.motor_time_constant
        if tau > 0:
            # Exact discretisation of w' = (target - w) / tau over h (the simulator's).
            return speed + (1.0 - math.exp(-h / tau)) * (target - speed)
        return target

    def rotor_thrusts(self, speed: np.ndarray) -> np.ndarray:
        """Thrust of each rotor (N) at rotor speeds ``speed`` (rad/s)."""
        # thrust_scale: the motors' real thrust against the model the mixer commands with.
        return self.cfg_thrust_scale * self.kf * speed ** 2

    def rotor_torques(self, speed: np.ndarray) -> np.ndarray:
        """Reaction yaw torque of each rotor on the body about body +z, N m."""
        return self.cfg_thrust_scale * self.directions * self.km * speed ** 2

    def drag_force(self, v_com_body: np.ndarray, scale: float = 1.0) -> np.ndarray:
        """Body-frame drag force (N) at the centre of mass moving at ``v_com_body`` (m/s, body
        frame): F = -(D1 v + D2 |v| v) per axis (physics.quadrotor.Rotors.drag)."""
        v = v_com_body
        return -scale * (self.drag_linear * v + self.drag_quadratic * np.abs(v) * v)
