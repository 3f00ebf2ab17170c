"""Between the policy and the robot, without ROS.

The safety supervisor (plausibility rules, watchdog, emergency stop, latched safe command) and pure
converters of commands to the robot's formats (PX4, Crazyswarm2's cmd_vel_legacy, per-rotor
thrusts). The nodes only convert messages.
"""
from .outputs import cmd_vel_legacy, ctbr_rotor_thrusts, px4_rates_setpoint, quat_to_rpy, rotor_speeds
from .supervisor import (ImuIn, JointStateIn, OdometryIn, Supervisor, SupervisorConfig, SupervisorConfigError,
                         Tick, Verdict)

__all__ = ["Supervisor", "SupervisorConfig", "SupervisorConfigError", "JointStateIn", "OdometryIn", "ImuIn",
           "Verdict", "Tick", "px4_rates_setpoint", "cmd_vel_legacy", "ctbr_rotor_thrusts", "rotor_speeds",
           "quat_to_rpy"]
