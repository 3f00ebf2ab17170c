"""Pure conversions of a command in the simulator's interface to the robot's command formats.

All take and return plain numbers/numpy arrays (no ROS messages): the node copies the
results into the message fields of doc/interfaces.md.

* :func:`px4_rates_setpoint`: CTBR in FLU (REP-103) to PX4's VehicleRatesSetpoint (FRD,
  normalised thrust along -z).
* :func:`cmd_vel_legacy`: CTBR to Crazyswarm2's cmd_vel_legacy (roll/pitch setpoints in
  degrees, yaw rate in deg/s, thrust as 16-bit PWM).
* :func:`ctbr_rotor_thrusts`: CTBR to per-rotor thrusts through the simulator's own rate
  loop and mixer (the law the policy was trained with), clipped to [0, max_thrust].
* :func:`rotor_speeds`: per-rotor thrusts to rotor speeds (rad/s) and normalised thrusts
  (actuator_msgs/Actuators).
"""
from __future__ import annotations

import math
from typing import List, Sequence, Tuple

import numpy as np
import torch

from ..physics.rotation import quat_to_rpy

__all__ = ["px4_rates_setpoint", "cmd_vel_legacy", "ctbr_rotor_thrusts", "rotor_speeds", "quat_to_rpy"]


def px4_rates_setpoint(cmd: Sequence[float], max_total_thrust: float) -> Tuple[float, float, float, List[float]]:
    """Convert a CTBR command to PX4's VehicleRatesSetpoint fields.

    The command is [collective thrust N, p q r rad/s in the body frame FLU]; the fields: roll,
    pitch, yaw rates in FRD (q and r change sign); thrust_body normalised by the total maximum
    thrust, along -z of FRD, within [0, 1].
    """
    t = float(np.clip(float(cmd[0]) / max_total_thrust, 0.0, 1.0))
    return float(cmd[1]), -float(cmd[2]), -float(cmd[3]), [0.0, 0.0, -t]


def cmd_vel_legacy(cmd: Sequence[float], orientation_xyzw: Sequence[float], attitude_time_s: float,
                   max_collective: float) -> Tuple[float, float, float, float]:
    """Crazyswarm2's cmd_vel_legacy for a CTBR command.

    As (roll deg, pitch deg, yaw rate deg/s, thrust PWM 0..65535). The body rates become attitude
    setpoints ``attitude_time_s`` ahead of the current ``orientation_xyzw`` (identity when unknown).
    """
    roll, pitch, _ = quat_to_rpy(*orientation_xyzw)
    thrust = float(np.clip(float(cmd[0]) / max_collective, 0.0, 1.0)) * 65535.0
    return (math.degrees(roll + float(cmd[1]) * attitude_time_s),
            math.degrees(pitch + float(cmd[2]) * attitude_time_s),
            math.degrees(float(cmd[3])), thrust)


def ctbr_rotor_thrusts(rotors, cmd: Sequence[float], body_rates: Sequence[float]) -> np.ndarray:
    """Per-rotor thrusts (N, float64, rotor_links order) for a CTBR command at the measured body rates.

    Computed through the simulator's rate loop and allocation (physics.quadrotor.Rotors).
    """
    dtype = rotors.inertia.dtype
    c = torch.as_tensor(np.asarray(cmd, dtype=np.float64), dtype=dtype).reshape(1, 4)
    w = torch.as_tensor(np.asarray(body_rates, dtype=np.float64), dtype=dtype).reshape(1, 3)
    with torch.inference_mode():
        t = rotors.ctbr_thrusts(c, w)[0]
    return np.clip(t.to(torch.float64).numpy(), 0.0, rotors.cfg.max_thrust)


def rotor_speeds(thrusts: Sequence[float], thrust_coefficient: float, max_thrust: float
                 ) -> Tuple[List[float], List[float]]:
    """Rotor speeds (rad/s, thrust = k w^2) and normalised thrusts (thrust / max) of per-rotor thrusts."""
    t = np.clip(np.asarray(thrusts, dtype=np.float64), 0.0, None)
    return np.sqrt(t / thrust_coefficient).tolist(), (t / max_thrust).tolist()
