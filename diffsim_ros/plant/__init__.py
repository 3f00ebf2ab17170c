"""The MuJoCo stand-in robot, without ROS (see doc/interfaces.md and mujoco_plant.py).

    from diffsim_ros import config
    from diffsim_ros.plant import MujocoPlant, Perturbation
    plant = MujocoPlant(config.load_yaml("config/hover.yaml"), source="config/hover.yaml",
                        perturbation=Perturbation(mass_scale=1.2, latency=0.01))
    state = plant.step([plant.hover_thrust, 0.0, 0.0, 0.0])

Imports mujoco, numpy and diffsim_ros.physics/config only; never rclpy.
"""
from .flight import FlightController
from .mujoco_plant import (INTERFACES, JOINT_INTERFACES, ROTOR_INTERFACES, BaseState, JointState, MujocoPlant,
                           from_file, quat_to_matrix)
from .perturbation import Perturbation

__all__ = ["MujocoPlant", "Perturbation", "JointState", "BaseState", "FlightController", "from_file",
           "quat_to_matrix", "INTERFACES", "JOINT_INTERFACES", "ROTOR_INTERFACES"]
