"""Differentiable rigid-body physics in PyTorch (no ROS imports here).

Typical use::

    from diffsim_ros import physics
    model = physics.load_urdf("robot.urdf", floating_base=False, dtype=torch.float64)
    tau = physics.rnea(model, q, v, a)
    M = physics.crba(model, q)
    qdd = physics.aba(model, q, v, tau)
    poses = physics.forward_kinematics(model, q)   # (..., len(model.link_names), 4, 4)
    J = physics.link_jacobian(model, q, link)      # (..., 3, nv): a link origin's velocity is J @ v
    p, J = physics.link_kinematics(model, q, link) # its position (..., 3) and J from one pass

    sys = physics.build_system(model, physics.SimConfig(dt=1e-3))   # frozen; sys.replace(...)
    state, data = physics.step(sys, state, action)                   # pure; data.kin, data.qdd
"""
from .algorithms import (aba, body_placements, body_states, crba, forward_kinematics, joint_placements, link_jacobian,
                         link_kinematics, rnea)
from .description import RobotDescription, UrdfError
from .model import Collision, Model, build_model, load_urdf
from .quadrotor import RotorConfig, Rotors
from ..schema import ConfigError
from .kinematics import Kinematics, kinematics
from .pipeline import Data, applied_forces, check_finite, step
from .simulator import SimConfig, SimulationError, Simulator, State, Trajectory
from .system import ContactSet, System, build_system

__all__ = [
    "ContactSet", "Data", "Kinematics", "System", "build_system", "applied_forces", "check_finite", "kinematics",
    "step",
    "ConfigError", "RotorConfig", "Rotors", "SimConfig", "SimulationError", "Simulator", "State", "Trajectory",
    "Collision", "Model", "RobotDescription", "UrdfError",
    "aba", "body_placements", "body_states", "build_model", "crba", "forward_kinematics", "joint_placements",
    "link_jacobian", "link_kinematics", "load_urdf", "rnea",
]
