"""The MuJoCo stand-in robot, without ROS (see doc/interfaces.md and mujoco_plant.py).

    from diffsim_ros import config
    from diffsim_ros.plant import MujocoPlant, Perturbation
    plant = MujocoPlant(config.load_yaml("config/hover.yaml"), source="config/hover.yaml",
                        perturbation=Perturbation(mass_scale=1.2, latency=0.01))
    # or a named preset for the robot's kind (arm, legged, multirotor), one value changed:
    # perturbation=resolve_perturbation("hardware,latency=0.015", "multirotor")
    state = plant.step([plant.hover_thrust, 0.0, 0.0, 0.0])

Imports mujoco, numpy and diffsim_ros.physics/config only; never rclpy.
"""
from .flight import FlightController
from .mujoco_plant import (INTERFACES, JOINT_INTERFACES, ROTOR_INTERFACES, BaseState, JointState, MujocoPlant,
                           from_file, quat_to_matrix)
from .perturbation import PRESETS, Perturbation, parse_perturbation, resolve_perturbation

__all__ = ["MujocoPlant", "Perturbation", "PRESETS", "parse_perturbation", "resolve_perturbation", "JointState",
           "BaseState", "FlightController", "from_file", "quat_to_matrix", "INTERFACES", "JOINT_INTERFACES",
           "ROTOR_INTERFACES"]
