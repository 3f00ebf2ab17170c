"""The multirotor's on-board logic in NumPy: CTBR rate loop, mixer, motors, drag law.

These are the *controller and actuator* laws of ``physics/quadrotor.py`` (the same
allocation matrix, rate loop, smooth thrust clamp and first-order rotor-speed lag),
written once in physics/laws.py and evaluated here with NumPy (no torch on the
plant's real-time path), so that the MuJoCo plant computes the same commands to its
motors as the simulator does. The rigid-body physics that the resulting forces drive
is MuJoCo's, not this module's.

Conventions (as physics/quadrotor.py): rotors push along body +z; ``directions[i]
= +1``: rotor i's reaction torque on the body is ``+k_m w^2`` about body +z.
"""
from __future__ import annotations

import numpy as np

from ..physics import RotorConfig, laws


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
        # [F_z; M_x; M_y; M_z] = allocation @ thrusts (thrust along body z at each hub).
        self.allocation = laws.allocation(np, self.positions, self.directions, self.kf, self.km)
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
        """Per-rotor thrust (N) for ``command`` = [collective thrust N, p, q, r rad/s] at body rates ``omega``.

        A proportional rate loop plus the gyroscopic feed-forward, mixed by the allocation
        pseudo-inverse (physics/laws.py, as physics.quadrotor.Rotors.ctbr_thrusts).
        """
        return laws.ctbr_thrusts(np, command, omega, self.rate_gain, self.inertia, self.allocation_pinv)

    def clamp_thrust(self, thrust: np.ndarray) -> np.ndarray:
        """Thrust limited to [0, max_thrust] with the simulator's softplus corners (0.01 % of the range wide).

        Plant and simulator thus saturate alike.
        """
        return laws.clamp_thrust(np, thrust, self.max_thrust)

    def speed_for_thrust(self, thrust: np.ndarray) -> np.ndarray:
        """Rotor speed (rad/s) giving ``thrust`` (N), as physics.quadrotor (smooth at zero)."""
        return laws.speed_for_thrust(np, np.asarray(thrust), self.kf)

    def motor_step(self, speed: np.ndarray, thrust_command: np.ndarray, h: float) -> np.ndarray:
        """Rotor speeds after ``h`` s of the first-order lag towards the commanded thrust."""
        target = self.speed_for_thrust(self.clamp_thrust(thrust_command))
        tau = self.motor_time_constant
        if tau > 0:
            return laws.first_order_lag(np, speed, target, h, tau)
        return target

    def rotor_thrusts(self, speed: np.ndarray) -> np.ndarray:
        """Thrust of each rotor (N) at rotor speeds ``speed`` (rad/s)."""
        # thrust_scale: the motors' real thrust against the model the mixer commands with.
        return laws.rotor_thrusts(np, speed, self.kf, self.cfg_thrust_scale)

    def rotor_torques(self, speed: np.ndarray) -> np.ndarray:
        """Reaction yaw torque of each rotor on the body about body +z, N m.

        The allocation's yaw row times the thrust.
        """
        return self.allocation[3] * self.rotor_thrusts(speed)

    def drag_force(self, v_com_body: np.ndarray, scale: float = 1.0) -> np.ndarray:
        """Body-frame drag force (N) at the centre of mass moving at ``v_com_body`` (m/s, body frame).

        F = -(D1 v + D2 |v| v) per axis (physics.quadrotor.Rotors.drag).
        """
        return scale * laws.drag_force(np, v_com_body, self.drag_linear, self.drag_quadratic)
