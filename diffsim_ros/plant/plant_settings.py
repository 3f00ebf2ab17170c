"""mujoco_plant's settings, ROS-free.

The parameters the node declares (the schema sections :class:`MujocoPlantParameters` and
plant.Perturbation) and the checks their values pass at start (nodes/mujoco_plant.py is the node).

Each check raises :class:`SetupError` (diffsim_ros.errors, policy_controller's settings raise it
too) naming the parameter; the node turns it into its StartupError (the message printed, exit
status 2). The node calls the checks in the order it reads the parameters, so a node with several
bad parameters names the same one first.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, List, Mapping, Sequence, Tuple

import numpy as np

from .. import interfaces as ifc
from ..errors import SetupError
from ..schema import normalise, option, ros_constraints, ros_parameters, section
from .perturbation import Perturbation, ros_values

__all__ = ["SetupError", "MujocoPlantParameters", "PARAMETERS", "CONSTRAINTS", "PERTURBATION_KEYS",
           "perturbation_parameter", "check_robot", "initial_state", "controller_order",
           "realtime_timing", "subscriber_count"]


@section("mujoco_plant", node=True)
@dataclass(frozen=True)
class MujocoPlantParameters:
    """mujoco_plant's own parameters (besides the configuration keys and perturbation.*)."""

    interface: str = option("", "command interface before the first command arrives (its hold command is applied): "
                            "position, velocity, effort, ctbr, rotor_thrust; empty: the config's simulator.actuator. "
                            "Afterwards each command's topic decides its interface")
    mode: str = option("realtime", "realtime (a wall timer steps the plant) or lockstep (one control step per "
                       "command received, then one state)", choices=("realtime", "lockstep"))
    real_time_factor: float = option(1.0, "realtime mode: simulated seconds per wall-clock second", above=0)
    publish_rate_hz: float = option(0.0, "realtime mode: state publishing rate (0: after every control step)", "Hz",
                                    low=0)
    lockstep_republish_s: float = option(1.0, "lockstep mode: period at which the initial state is republished "
                                         "until the first command arrives (0: never)", "s")
    wait_for_subscribers: int = option(0, "publish no state and start no clock until each state topic "
                                       "(/joint_states, /odom) has at least this many matched subscriptions (a "
                                       "controller and a recorder: 2), and then 0.25 s more (the subscribers' own "
                                       "side of the match), so that nothing the stand-in publishes is missed and a "
                                       "robot does not fall before its controller listens (0: start at once)", low=0)
    controller_joints: Tuple[str, ...] = option(("",), "order of the entries of the Float64MultiArray commands (the "
                                                "ros2_control controller's 'joints'); empty: the config's actuated "
                                                "joints")
    position_command_topic: str = option("/position_controller/commands", "arm position commands "
                                         "(Float64MultiArray, rad)")
    velocity_command_topic: str = option("/velocity_controller/commands", "arm velocity commands "
                                         "(Float64MultiArray, rad/s)")
    effort_command_topic: str = option("/effort_controller/commands", "arm effort commands (Float64MultiArray, N m)")
    trajectory_topic: str = option("/joint_trajectory_controller/joint_trajectory", "arm JointTrajectory commands "
                                   "(first point's positions by joint name)")
    ctbr_topic: str = option(ifc.CMD_CTBR, "quadrotor collective thrust (twist.linear.z, N) and body rates "
                             "(twist.angular, rad/s), TwistStamped")
    rotor_thrust_topic: str = option(ifc.CMD_ROTOR_THRUST, "quadrotor per-rotor thrust (Float64MultiArray, N, "
                                     "rotor_links order)")
    joint_states_topic: str = option(ifc.JOINT_STATES, "sensor_msgs/JointState out (arms, and the joints of a "
                                     "floating base)")
    odom_topic: str = option(ifc.ODOM, "nav_msgs/Odometry out (floating base): pose in world_frame, twist in "
                             "base_frame")
    imu_topic: str = option(ifc.IMU, "sensor_msgs/Imu out (floating base): orientation, body rates, body specific "
                            "force")
    clock_topic: str = option(ifc.CLOCK, "rosgraph_msgs/Clock out: the simulated time (empty: not published)")
    tf_topic: str = option(ifc.TF, "tf2_msgs/TFMessage out: link poses (parent -> child) and, for a floating base, "
                           "world_frame -> base (empty: not published)")
    publish_link_tf: bool = option(True, "publish the links' transforms on tf_topic (false: robot_state_publisher "
                                   "does; a floating base's world -> base is published either way)")
    robot_description_topic: str = option(ifc.ROBOT_DESCRIPTION, "std_msgs/String out, transient local: the URDF "
                                          "text (empty: not published)")
    world_frame: str = option("world", "frame_id of /odom")
    base_frame: str = option("base_link", "child_frame_id of /odom and frame_id of /imu")
    initial_positions: Tuple[float, ...] = option((0.0,), "initial state: arms: joint positions in the model's "
                                                  "joint order (rad); floating base: [x, y, z], [x, y, z, qx, qy, "
                                                  "qz, qw] or the whole q (legged: the base pose, then the joints "
                                                  "in the model's order); [0.0] alone: the neutral configuration "
                                                  "(at the origin)")
    initial_velocities: Tuple[float, ...] = option((0.0,), "initial velocities in the simulator convention "
                                                   "(floating base: body-frame linear and angular velocity first); "
                                                   "[0.0] alone: at rest")

    def __post_init__(self):
        normalise(self)

# (name, default, description): every parameter of the node besides the configuration keys: its own
# (the section above) and perturbation.*, the fields of plant.Perturbation (diffsim_ros/schema.py).
PARAMETERS = ros_parameters(MujocoPlantParameters, "") + ros_parameters(Perturbation, "perturbation")
CONSTRAINTS = {**ros_constraints(MujocoPlantParameters, ""), **ros_constraints(Perturbation, "perturbation")}
PERTURBATION_KEYS = tuple(f.name for f in dataclasses.fields(Perturbation))


def perturbation_parameter(key: str, val):
    """Return the value of parameter ``perturbation.<key>`` as the node declares it.

    It is made from any value the configuration schema accepts for the field (plant.Perturbation):
    one number for ``sensor_noise`` (both entries), integers for doubles (``latency: 0``), a whole
    double for the integer ``seed``, ... -> a list of floats, a float, an int, a bool. A value the
    schema refuses (a string for a number, two numbers for three) is a ConfigError naming the
    parameter.
    """
    if hasattr(val, "tolist") and not isinstance(val, (str, bytes)):
        val = val.tolist()                      # rclpy's arrays (array.array)
    if isinstance(val, tuple):
        val = list(val)
    return ros_values({key: val}, "perturbation")[key]


def check_robot(params: Mapping[str, Any]) -> None:
    """Check that the configuration (``config_parameters``) names a robot."""
    if not params.get("urdf"):
        raise SetupError("no robot: set parameter 'config' (a training/robot YAML) or pass its "
                         "keys (--params-file config/<robot>.yaml)")


def initial_state(plant, positions: Sequence[float], velocities: Sequence[float]) -> Tuple[np.ndarray, np.ndarray]:
    """(q, v) of parameters ``initial_positions`` and ``initial_velocities`` for ``plant`` (a MujocoPlant).

    [0.0] alone is the neutral configuration, at rest.
    """
    pos = [float(x) for x in positions]
    vel = [float(x) for x in velocities]
    q = plant.physics_model.neutral_configuration().numpy()
    if pos != [0.0]:
        if plant.floating_base and len(pos) in (3, 7, plant.nq):
            q[:len(pos)] = pos          # a legged robot's full q: base pose, then its joints
        elif not plant.floating_base and len(pos) == plant.nq:
            q[:] = pos
        else:
            need = (f"[x, y, z], [x, y, z, qx, qy, qz, qw] or all {plant.nq} of q" if plant.floating_base
                    else f"{plant.nq} joint positions ({', '.join(plant.joint_names)})")
            raise SetupError(f"parameter 'initial_positions' has {len(pos)} entries; it needs {need}")
    v = np.zeros(plant.nv)
    if vel != [0.0]:
        if len(vel) != plant.nv:
            raise SetupError(f"parameter 'initial_velocities' has {len(vel)} entries; it needs "
                             f"{plant.nv}")
        v[:] = vel
    return q, v


def controller_order(controller_joints: Sequence[str], actuated_joints) -> Tuple[List[str], np.ndarray]:
    """Return the command order of parameter ``controller_joints`` (empty: the plant's order).

    As (the command arrays' joint order, the index taking a command in that order to the plant's
    ``actuated_joints`` order).
    """
    cj = [j for j in controller_joints if j]
    if cj and sorted(cj) != sorted(actuated_joints):
        raise SetupError(f"parameter 'controller_joints' {cj} must name exactly the actuated "
                         f"joints {actuated_joints}")
    joints = cj or list(actuated_joints)
    return joints, np.array([joints.index(j) for j in actuated_joints], dtype=int)


def realtime_timing(dt: float, real_time_factor, publish_rate_hz) -> Tuple[int, float]:
    """Realtime mode: (control steps per published state, the wall timer's period in s)."""
    rtf = float(real_time_factor)
    if not rtf > 0:
        raise SetupError(f"parameter 'real_time_factor' must be > 0, got {rtf}")
    rate = float(publish_rate_hz)
    if rate < 0:
        raise SetupError(f"parameter 'publish_rate_hz' must be >= 0, got {rate}")
    publish_every = max(1, int(round(1.0 / (rate * dt)))) if rate > 0 else 1
    return publish_every, dt / rtf


def subscriber_count(wait_for_subscribers) -> int:
    """Parameter ``wait_for_subscribers``: matched subscriptions each state topic waits for."""
    wait = int(wait_for_subscribers)
    if wait < 0:
        raise SetupError(f"parameter 'wait_for_subscribers' must be >= 0, got {wait}")
    return wait
