"""policy_controller's command outputs (doc/interfaces.md).

One table of adapters, interface -> the messages it publishes, each with its message type, the
parameter naming its topic and the converter that builds it from a command. The node creates its
publishers from the table and publishes through it; the numbers come from control/outputs.py
(ROS-free).

A converter is ``convert(cmd, stamp, now_ns, state, ctx) -> message``: ``cmd`` the command in
the simulator's interface (float64, clamped), ``stamp`` the stamp (ns) of the state it answers
(0: none), ``now_ns`` the node's clock, ``state`` the simulator State it was computed on (None:
unknown), ``ctx`` the node's :class:`OutputContext`.

The message classes are imported when the node is built (:func:`load_messages`), so importing
this module needs no ROS; a package that only some installs have (px4_msgs, actuator_msgs) is a
StartupError naming what to install.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any, Callable, Dict, Optional, Sequence, Tuple

import numpy as np
import torch

from ..control import outputs
from .common import StartupError, stamp_from_ns

__all__ = ["Channel", "Output", "OutputContext", "OUTPUTS", "msgs", "load_messages", "qos_profile",
           "command_msg", "prediction_type", "prediction_msg", "diagnostics_msg"]

#: Message classes by name, filled by load_messages().
msgs = SimpleNamespace()

#: The messages the node always publishes (and the outputs' building blocks), besides the outputs' own.
_COMMON = ("std_msgs/msg/Float64MultiArray", "std_msgs/msg/MultiArrayDimension", "std_msgs/msg/String",
           "trajectory_msgs/msg/JointTrajectoryPoint", "builtin_interfaces/msg/Duration",
           "sensor_msgs/msg/JointState", "nav_msgs/msg/Odometry", "diagnostic_msgs/msg/DiagnosticArray",
           "diagnostic_msgs/msg/DiagnosticStatus", "diagnostic_msgs/msg/KeyValue")


@dataclass(frozen=True)
class Channel:
    msg_type: str                                   # package/msg/Type
    topic_param: Optional[str]                      # the parameter naming the topic; None: /<controller>/commands
    convert: Callable[..., Any]

    @property
    def name(self) -> str:
        return self.msg_type.rsplit("/", 1)[1]


@dataclass(frozen=True)
class Output:
    """An interface's messages, published in this order.

    The last one carries the command (its topic is the node's ``command_topic`` in the metadata, its
    publisher the one the preflight and wait_for_subscribers count).
    """

    channels: Tuple[Channel, ...]
    qos: str = "default"          # px4: the QoS PX4's uXRCE-DDS bridge expects on /fmu/in/*
    missing: str = ""             # the StartupError when a message package is not importable


@dataclass(frozen=True)
class OutputContext:
    runner: Any                   # PolicyRunner or ExcitationRunner: the robot, its rotors, the command range
    out_index: np.ndarray         # command index of each controller joint
    controller_joints: Sequence[str]
    dt: float
    legacy_tau: float             # legacy_attitude_time_s


# ============================================================================ converters
def _float64_array(values) -> Any:
    m = msgs.Float64MultiArray()
    m.data = values
    return m


def _forward_command(cmd, stamp, now_ns, state, ctx: OutputContext):
    return _float64_array(cmd[ctx.out_index].tolist())


def _joint_trajectory(cmd, stamp, now_ns, state, ctx: OutputContext):
    m = msgs.JointTrajectory()
    m.joint_names = list(ctx.controller_joints)
    pt = msgs.JointTrajectoryPoint()
    pt.positions = cmd[ctx.out_index].tolist()
    pt.velocities = [0.0] * len(cmd)
    sec = int(ctx.dt)
    pt.time_from_start = msgs.Duration(sec=sec, nanosec=int(round((ctx.dt - sec) * 1e9)))
    m.points = [pt]             # header.stamp zero: "start now" for joint_trajectory_controller
    return m


def _ctbr(cmd, stamp, now_ns, state, ctx: OutputContext):
    m = msgs.TwistStamped()
    m.header.stamp = stamp_from_ns(stamp if stamp else now_ns)
    m.header.frame_id = "base_link"
    m.twist.linear.z = float(cmd[0])
    m.twist.angular.x, m.twist.angular.y, m.twist.angular.z = (float(x) for x in cmd[1:4])
    return m


def _rotor_thrusts(cmd: np.ndarray, state, ctx: OutputContext) -> np.ndarray:
    if ctx.runner.interface == "rotor_thrust":
        return cmd
    w = [0.0, 0.0, 0.0] if state is None else state.v[0, 3:6].to(torch.float64).tolist()
    return outputs.ctbr_rotor_thrusts(ctx.runner.sim.rotors, cmd, w)


def _rotor_thrust(cmd, stamp, now_ns, state, ctx: OutputContext):
    return _float64_array(_rotor_thrusts(cmd, state, ctx).tolist())


def _cmd_vel_legacy(cmd, stamp, now_ns, state, ctx: OutputContext):
    """Crazyswarm2 cmd_vel_legacy (untested here): see control.outputs.cmd_vel_legacy."""
    quat = (0.0, 0.0, 0.0, 1.0) if state is None else state.q[0, 3:7].to(torch.float64).tolist()
    roll, pitch, yaw_rate, thrust = outputs.cmd_vel_legacy(cmd, quat, ctx.legacy_tau,
                                                           float(ctx.runner.command_high[0]))
    m = msgs.Twist()
    m.linear.y, m.linear.x, m.angular.z, m.linear.z = roll, pitch, yaw_rate, thrust
    return m


def _px4_offboard_mode(cmd, stamp, now_ns, state, ctx: OutputContext):
    """OffboardControlMode (body rates), sent with each setpoint to keep offboard mode alive."""
    mode = msgs.OffboardControlMode()
    mode.timestamp = int(now_ns // 1000)
    for field in ("position", "velocity", "acceleration", "attitude", "thrust_and_torque", "direct_actuator"):
        if hasattr(mode, field):
            setattr(mode, field, False)
    mode.body_rate = True
    return mode


def _px4_rates(cmd, stamp, now_ns, state, ctx: OutputContext):
    """VehicleRatesSetpoint for a CTBR command."""
    rc = ctx.runner.sim.rotors.cfg
    roll, pitch, yaw, thrust_body = outputs.px4_rates_setpoint(cmd, rc.max_thrust * len(rc.directions))
    m = msgs.VehicleRatesSetpoint()
    m.timestamp = int(now_ns // 1000)
    m.roll, m.pitch, m.yaw = roll, pitch, yaw
    m.thrust_body = thrust_body
    return m


def _actuators(cmd, stamp, now_ns, state, ctx: OutputContext):
    m = msgs.Actuators()
    m.header.stamp = stamp_from_ns(now_ns)
    rc = ctx.runner.sim.rotors.cfg
    m.velocity, m.normalized = outputs.rotor_speeds(_rotor_thrusts(cmd, state, ctx), rc.thrust_coefficient,
                                                    rc.max_thrust)
    return m


#: interface -> its output (the ``interface`` parameter's values; control/controller_settings.py
#: says which fit which robot and checkpoint).
OUTPUTS: Dict[str, Output] = {
    "forward_command": Output((Channel("std_msgs/msg/Float64MultiArray", None, _forward_command),)),
    "joint_trajectory": Output((Channel("trajectory_msgs/msg/JointTrajectory", "trajectory_topic",
                                        _joint_trajectory),)),
    "ctbr": Output((Channel("geometry_msgs/msg/TwistStamped", "ctbr_topic", _ctbr),)),
    "rotor_thrust": Output((Channel("std_msgs/msg/Float64MultiArray", "rotor_thrust_topic", _rotor_thrust),)),
    "cmd_vel_legacy": Output((Channel("geometry_msgs/msg/Twist", "cmd_vel_legacy_topic", _cmd_vel_legacy),)),
    "px4_rates": Output((Channel("px4_msgs/msg/OffboardControlMode", "px4_offboard_topic", _px4_offboard_mode),
                         Channel("px4_msgs/msg/VehicleRatesSetpoint", "px4_rates_topic", _px4_rates)),
                        qos="px4", missing="interface px4_rates: the px4_msgs package is not importable here "
                                           "(build PX4/px4_msgs matching the autopilot's firmware)"),
    "actuator_msgs": Output((Channel("actuator_msgs/msg/Actuators", "actuator_msgs_topic", _actuators),),
                            missing="interface actuator_msgs: the actuator_msgs package is not importable "
                                    "here (install ros-<distro>-actuator-msgs)"),
}


# ============================================================================ the node's side
def _load(msg_type: str) -> None:
    package, _, name = msg_type.rpartition("/")
    setattr(msgs, name, getattr(importlib.import_module(package.replace("/", ".")), name))


def load_messages(output: Output) -> None:
    """Import the message classes of ``output`` (and the common ones) into :data:`msgs`.

    Message packages that only some installs have: a missing one stops the node at start with the
    reason.
    """
    for msg_type in _COMMON:
        _load(msg_type)
    try:
        for ch in output.channels:
            _load(ch.msg_type)
    except (ImportError, AttributeError):
        raise StartupError(output.missing or f"cannot import {ch.msg_type}") from None


def qos_profile(output: Output, default):
    """Return the publishers' QoS of ``output``: ``default``, or the one PX4's uXRCE-DDS bridge expects."""
    if output.qos != "px4":
        return default
    from rclpy.qos import DurabilityPolicy, HistoryPolicy, QoSProfile, ReliabilityPolicy

    return QoSProfile(depth=1, history=HistoryPolicy.KEEP_LAST, reliability=ReliabilityPolicy.BEST_EFFORT,
                      durability=DurabilityPolicy.TRANSIENT_LOCAL)


def command_msg(cmd: np.ndarray, stamp: int):
    """/diffsim/command: the command in the simulator's interface.

    Its state's stamp (ns) is the dimension's label.
    """
    c = msgs.Float64MultiArray()
    dim = msgs.MultiArrayDimension()
    dim.label, dim.size, dim.stride = str(int(stamp)), len(cmd), len(cmd)
    c.layout.dim = [dim]
    c.data = cmd.tolist()
    return c


def prediction_type(kind: str):
    """Return the /diffsim/predicted_state message class of a robot ``kind``."""
    return msgs.Odometry if kind == "quadrotor" else msgs.JointState


def prediction_msg(pred, stamp: int, runner, param: Callable[[str], Any]):
    """/diffsim/predicted_state: the simulator's state one step on, stamped ``stamp`` (ns).

    A JointState for an arm, an Odometry (frames of the ``frame_id``/``child_frame_id`` parameters,
    read through ``param``) for a multirotor.
    """
    if runner.kind == "arm":
        m = msgs.JointState()
        m.header.stamp = stamp_from_ns(stamp)
        m.name = list(runner.joint_names)
        m.position = pred.q[0].to(torch.float64).tolist()
        m.velocity = pred.v[0].to(torch.float64).tolist()
        return m
    m = msgs.Odometry()
    m.header.stamp = stamp_from_ns(stamp)
    m.header.frame_id = param("frame_id") or "world"
    m.child_frame_id = param("child_frame_id") or "base_link"
    q, v = pred.q[0].to(torch.float64).tolist(), pred.v[0].to(torch.float64).tolist()
    pp, o = m.pose.pose.position, m.pose.pose.orientation
    pp.x, pp.y, pp.z = q[0:3]
    o.x, o.y, o.z, o.w = q[3:7]
    tw = m.twist.twist
    tw.linear.x, tw.linear.y, tw.linear.z = v[0:3]
    tw.angular.x, tw.angular.y, tw.angular.z = v[3:6]
    return m


def diagnostics_msg(name: str, hardware_id: str, level: str, message: str, values: Dict[str, str], stamp: int):
    """/diagnostics: one DiagnosticStatus (``level`` OK, WARN or ERROR) with ``values``, stamped ``stamp`` (ns)."""
    st = msgs.DiagnosticStatus(name=name, hardware_id=hardware_id, message=message,
                               level=getattr(msgs.DiagnosticStatus, level))
    st.values = [msgs.KeyValue(key=k, value=v) for k, v in values.items()]
    arr = msgs.DiagnosticArray(status=[st])
    arr.header.stamp = stamp_from_ns(stamp)
    return arr
