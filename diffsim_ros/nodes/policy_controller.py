"""policy_controller: runs a trained checkpoint on a robot through ROS 2.

    ros2 run diffsim_ros policy_controller --ros-args -p checkpoint:=policies/hover
    ros2 run diffsim_ros policy_controller --ros-args -p checkpoint:=policies/reach_arm \
        -p target:="[0.25, 0.1, 0.35]" -p interface:=joint_trajectory

A thin adapter over :class:`diffsim_ros.learning.deploy.PolicyRunner`: messages in
(``/joint_states`` matched by joint name, or ``/odom`` [+ ``/imu``]), commands out
on the selected interface (doc/interfaces.md), plus the bookkeeping topics the
recorder and the analysis rely on: ``/diffsim/command``, ``/diffsim/predicted_state``,
latched ``/diffsim/metadata`` and ``/diagnostics``.

Velocity policies (a legged walker, the quadrotor velocity task) also take requests on
``/cmd_vel`` (geometry_msgs/Twist, or TwistStamped with ``cmd_vel_stamped``), as a teleop
node, a joystick or Nav2 publish them: mapped into the range the policy was trained on, the
diagnostics saying what was clamped or ignored; without a request for ``cmd_vel_timeout_s``
the zero command (a walker trained above 0 m/s stands on its stance joint positions, a
quadrotor hovers). The latest of /cmd_vel and the ``target`` topic is in force
(diffsim_ros/control/velocity_command.py).

Timing: ``lockstep: false`` runs the policy on a wall timer at ``rate_hz`` on the
latest state; ``lockstep: true`` computes exactly one command per received state
(deterministic runs against mujoco_plant's lockstep mode). The command is published
before the prediction is computed, so the simulator step never delays it; at 250-500 Hz
the next state would wait for it, so ``compile_prediction`` predicts through the step
compiled ahead of time (built before the first state) and ``predict_every`` thins
predictions out. The node is spun by rclpy's EventsExecutor (``executor``), and what
start-up allocated is frozen out of the garbage collector's scans (bench/control_loop.py).

Safety: every rule lives in the ROS-free supervisor (diffsim_ros/control/supervisor.py);
this node converts messages for it and publishes what it decides. In short:

- a state is accepted only when it is plausible: finite, joint positions within the URDF
  limits (+ ``position_margin``), speeds within bounds derived from the URDF velocity limits,
  a base inside ``workspace_min``/``workspace_max``, a unit quaternion, the expected
  ``frame_id``/``child_frame_id``, message arrays of consistent lengths, stamps that never go
  backwards and lie within ``max_stamp_skew_s`` of the node's clock (set use_sim_time against
  a simulator's /clock). The hold position is only ever taken from an accepted state;
- a rejected state, a stale one (older than ``state_timeout_s``, steady clock), a bad IMU
  reading or any exception in the control path (the policy, the prediction, publishing) latches
  the safe command until ``recover_states`` consecutive new accepted states, or a call of
  ``~/reset`` (std_srvs/Trigger; it also forgets the stamp history, e.g. after a simulator
  restart). The diagnostics name the field and its value;
- safe command: arms hold the last accepted position (position / joint_trajectory interfaces)
  or command zero (effort, velocity); quadrotors ``safe_thrust`` N collective with zero body
  rates (0 = motors off). Every command is clamped to the URDF limits of the checkpoint's robot;
- ``~/emergency_stop`` (std_srvs/SetBool): true latches the safe command until a call with
  false (releasing is an explicit operator action and clears the fault latch as ~/reset does);
- a checkpoint for another robot (``urdf``, ``config`` or ``robot_description_topic``)
  is refused at start: the node prints the reason and exits with status 2;
- a dead driver is noticed in every mode: the watchdog and the diagnostics run on the steady
  clock, so under use_sim_time a simulator that stops (its /clock with it) still gets the safe
  command and a diagnostic saying the control timer's clock stopped; a clock that jumps back (a
  driver restarted at time 0) latches the safe command, its earlier-stamped states refused
  until ``~/reset``, and the control timer starts afresh on the new time;
- preflight (``preflight``, on by default): before the policy goes active the robot's topics
  are checked against the checkpoint as ``diffsim-ros preflight`` does (control/preflight.py):
  in timer mode over the first ``preflight_s`` of states, nothing sent meanwhile; in lockstep on
  the first state. A NO-GO holds the safe command, its reasons in the log and the diagnostics,
  until ``~/reset`` (``preflight_required: false``: logged, and the policy runs).

A message that names too few joints is ignored but does not trip the safe command by itself
(robots often publish a gripper's joint state separately); the watchdog trips once no
complete state has arrived for ``state_timeout_s``.
"""
from __future__ import annotations

import json
import math
import sys
import threading
import time
from collections import deque
from pathlib import Path
from typing import Any, Dict, List, Optional

import numpy as np

from .. import interfaces as ifc
from ..control.supervisor import SupervisorConfig
from ..schema import ros_constraints, ros_parameters
from .common import StartupError
from .common import EXECUTORS, resolve_path

NODE_NAME = "policy_controller"

ARM_INTERFACES = ("forward_command", "joint_trajectory")
QUAD_INTERFACES = ("ctbr", "rotor_thrust", "cmd_vel_legacy", "actuator_msgs", "px4_rates")

#: name -> (default, description). Every parameter the node reads is declared from this table.
PARAMETERS: Dict[str, Any] = {
    "mode": ("policy", "policy: run the checkpoint's policy; excite: drive an identification motion instead "
                       "(diffsim_ros/control/excitation.py: multisine or chirp joint targets for arms, attitude/"
                       "thrust/rate steps around hover for multirotors; settings excitation.*), the robot and "
                       "simulator from 'config', no checkpoint; the supervisor, limits and outputs are the same"),
    "checkpoint": ("policies/hover", "checkpoint folder (policy.pt + policy.json): absolute, relative to the working "
                                     "directory, or to the diffsim_ros share folder"),
    "urdf": ("", "URDF file of the robot being controlled; the checkpoint is refused if it was made for another "
                 "robot or URDF (empty: the 'config' file's urdf, else the URDF the checkpoint names)"),
    "config": ("", "ROS parameter file (config/*.yaml) naming the robot ('urdf', 'floating_base'); used when "
                   "'urdf' is empty"),
    "robot_description_topic": ("", "take the robot's URDF from this latched std_msgs/String topic (e.g. "
                                    "/robot_description) instead of a file; empty: do not wait for it"),
    "robot_description_timeout_s": (10.0, "s, how long to wait for robot_description_topic at start"),
    "dtype": ("float64", "float64 or float32: precision of the observation and the prediction"),
    "interface": ("auto", "command interface: arms forward_command | joint_trajectory; quadrotors ctbr | "
                          "rotor_thrust | cmd_vel_legacy (Crazyswarm2, untested here) | actuator_msgs (if "
                          "importable, untested here); auto: forward_command for arms, the checkpoint's own "
                          "(ctbr or rotor_thrust) for quadrotors"),
    "controller": ("", "forward_command_controller name: commands go to /<controller>/commands (empty: "
                       "position_controller, velocity_controller or effort_controller per the checkpoint)"),
    "controller_joints": ([], "joint order of the forward_command_controller's 'joints' parameter (empty: the "
                               "checkpoint's actuated joints in their order)"),
    "trajectory_topic": (ifc.JOINT_TRAJECTORY,
                         "trajectory_msgs/JointTrajectory topic (interface joint_trajectory)"),
    "ctbr_topic": (ifc.CMD_CTBR, "geometry_msgs/TwistStamped: linear.z collective thrust N, angular body rates rad/s"),
    "rotor_thrust_topic": (ifc.CMD_ROTOR_THRUST, "std_msgs/Float64MultiArray: per-rotor thrust N, rotor_links order"),
    "cmd_vel_legacy_topic": (ifc.CMD_VEL_LEGACY, "geometry_msgs/Twist in Crazyswarm2's cmd_vel_legacy convention"),
    "actuator_msgs_topic": (ifc.ACTUATORS, "actuator_msgs/Actuators topic (interface actuator_msgs)"),
    "px4_rates_topic": (ifc.PX4_RATES_SETPOINT, "px4_msgs/VehicleRatesSetpoint topic (interface "
                                                          "px4_rates: PX4 offboard body rates and thrust, FRD)"),
    "px4_offboard_topic": (ifc.PX4_OFFBOARD_MODE, "px4_msgs/OffboardControlMode topic, published with "
                                                            "each setpoint (body_rate true) to keep offboard alive"),
    "legacy_attitude_time_s": (0.1, "s, cmd_vel_legacy: roll/pitch setpoint = current angle + body rate * this"),
    "joint_states_topic": (ifc.JOINT_STATES, "sensor_msgs/JointState input (arms), matched by joint name"),
    "odom_topic": (ifc.ODOM, "nav_msgs/Odometry input (quadrotors; legged policies on the privileged observation): "
                             "pose in world, twist in the body frame"),
    "imu_topic": (ifc.IMU, "sensor_msgs/Imu input: a legged policy on the robot observation takes the base's "
                           "orientation and body rates from it (no odometry needed); quadrotors: checked for "
                           "NaN/Inf, see imu_angular_velocity"),
    "imu_angular_velocity": (False, "bool: take the body rates from the latest /imu instead of /odom's twist"),
    "state_reliability": ("reliable", "QoS reliability of the state subscriptions: reliable or best_effort"),
    "target": ([], "goal: reach and hover/waypoint: a point [x, y, z] m (world); velocity mode: [vx, vy, vz] "
                      "m/s; empty: the task's default (hover: its home point; reach has none)"),
    "target_topic": (ifc.TARGET, "geometry_msgs/PointStamped that replaces the goal at run time"),
    "preflight": (True, "bool: before the policy goes active, check the robot's topics against the checkpoint "
                        "(control/preflight.py, as `diffsim-ros preflight`: joints, limits, frames, the IMU, the "
                        "command topic's subscribers; in timer mode also the state rate, jitter and stamp age)"),
    "preflight_s": (1.0, "s, timer mode: how long the preflight listens from the first state (lockstep: it judges "
                         "the first state, the plant stepping only when commanded)"),
    "preflight_required": (True, "bool: on a preflight NO-GO hold the safe command until ~/reset (false: log the "
                                 "NO-GO and run the policy)"),
    "policy_format": ("torchscript", "torchscript (policy.pt) or onnx (policy.onnx from `diffsim-ros export "
                                     "CHECKPOINT --onnx`, run by onnxruntime; a stale export is refused)"),
    "cmd_vel_topic": (ifc.CMD_VEL, "geometry_msgs/Twist velocity requests (teleop_twist_keyboard, a joystick, Nav2) "
                                   "for a velocity policy (a legged walker: linear.x, forward m/s; a quadrotor "
                                   "velocity task: linear, world m/s), mapped into the trained range "
                                   "(control/velocity_command.py); empty: not subscribed"),
    "cmd_vel_stamped": (False, "bool: cmd_vel_topic carries geometry_msgs/TwistStamped instead of Twist"),
    "cmd_vel_timeout_s": (0.5, "s, no /cmd_vel request for this long returns to the zero command (a walker "
                               "trained above 0 m/s stands, a quadrotor hovers in place)"),
    "rate_hz": (0.0, "Hz, control rate of the timer (0: 1 / the checkpoint's dt); unused in lockstep"),
    "lockstep": (False, "bool: one command per received state instead of a timer"),
    "watchdog_hz": (20.0, "Hz, how often the steady-clock watchdog checks the state age (lockstep; timer mode "
                          "while the control timer's clock has stopped, e.g. a simulator's /clock)"),
    "wait_for_subscribers": (0, "answer no state until the command topic has at least this many matched "
                                "subscribers (e.g. 1: the robot's driver; 2: the driver and a recorder)"),
    "wait_for_recorders": (0, "answer no state until /diffsim/command, /diffsim/predicted_state and /diagnostics "
                              "each have at least this many matched subscribers (recorders), so that nothing "
                              "published is lost to discovery"),
    "predict_every": (1, "publish /diffsim/predicted_state every this many commands (0: never)"),
    "compile_prediction": (False, "bool: predict through the step compiled ahead of time (physics.compiled."
                                  "ExportedStep; at batch 1 the quadrotor's step takes 0.25 ms instead of 3 ms, "
                                  "what a 250-500 Hz loop needs); the node builds it before its first state (about "
                                  "a minute on a machine's first start, seconds from the cache after)"),
    "executor": ("events", "events (rclpy's EventsExecutor: ready entities queued from C++, no wait set rebuilt "
                           "per message) or single_threaded (rclpy's SingleThreadedExecutor)"),
    "command_topic": (ifc.COMMAND, "std_msgs/Float64MultiArray: the command in the simulator's interface"),
    "predicted_state_topic": (ifc.PREDICTED_STATE, "JointState (arms) or Odometry (quadrotors), one step on"),
    "metadata_topic": (ifc.METADATA, "std_msgs/String, transient local: checkpoint metadata JSON"),
    "diagnostics_topic": (ifc.DIAGNOSTICS, "diagnostic_msgs/DiagnosticArray"),
    "diagnostics_period_s": (1.0, "s, diagnostics period"),
    "stats_file": ("", "write the node's counters as JSON here at shutdown (empty: no file)"),
}
#: The supervisor's settings (control/supervisor.py's SupervisorConfig: defaults, documentation, ranges).
SUPERVISOR_PARAMETERS: Dict[str, Any] = {name: (default, text)
                                         for name, default, text in ros_parameters(SupervisorConfig, "")}
PARAMETERS.update(SUPERVISOR_PARAMETERS)


def _excitation_parameters() -> Dict[str, Any]:
    """``excitation.*``: the fields of control.excitation.ExcitationConfig with their defaults and
    documentation (mode excite)."""
    from ..control.excitation import ExcitationConfig

    return {name: (default, text) for name, default, text in ros_parameters(ExcitationConfig, "excitation")}


EXCITATION_PARAMETERS: Dict[str, Any] = _excitation_parameters()
PARAMETERS.update(EXCITATION_PARAMETERS)


def _constraints() -> Dict[str, str]:
    """The schema sections' ranges and value sets, for the descriptors' additional_constraints."""
    from ..control.excitation import ExcitationConfig

    return {**ros_constraints(SupervisorConfig, ""), **ros_constraints(ExcitationConfig, "excitation")}


CONSTRAINTS: Dict[str, str] = _constraints()

#: Element type of the list parameters (an empty default cannot say it).
ARRAY_TYPES = {"controller_joints": "string", "target": "double", "workspace_min": "double",
               "workspace_max": "double"}


def stamp_ns(stamp) -> int:
    return int(stamp.sec) * 1_000_000_000 + int(stamp.nanosec)


def ns_to_stamp(ns: int, stamp_cls):
    s = stamp_cls()
    s.sec, s.nanosec = int(ns // 1_000_000_000), int(ns % 1_000_000_000)
    return s


def percentile(values, q: float) -> float:
    if not values:
        return float("nan")
    return float(np.percentile(np.asarray(values, dtype=np.float64), q))


def _import_ros():
    import rclpy
    from rclpy.node import Node

    return rclpy, Node


def make_node_class():
    """The rclpy Node subclass (built lazily so that importing this module needs no rclpy)."""
    rclpy, Node = _import_ros()
    import torch
    from builtin_interfaces.msg import Duration, Time
    from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus, KeyValue
    from geometry_msgs.msg import PointStamped, Twist, TwistStamped
    from nav_msgs.msg import Odometry
    from rcl_interfaces.msg import ParameterDescriptor
    from rclpy.exceptions import ParameterUninitializedException
    from rclpy.parameter import Parameter
    from rclpy.qos import DurabilityPolicy, QoSProfile, ReliabilityPolicy
    from sensor_msgs.msg import Imu, JointState
    from std_msgs.msg import Float64MultiArray, MultiArrayDimension, String
    from rclpy.clock import Clock, ClockType, JumpThreshold
    from rclpy.duration import Duration as RosDuration
    from std_srvs.srv import SetBool, Trigger
    from trajectory_msgs.msg import JointTrajectory, JointTrajectoryPoint

    from ..learning.checkpoint import CheckpointError
    from ..control import (ImuIn, JointStateIn, OdometryIn, Supervisor, SupervisorConfig,
                           SupervisorConfigError)
    from ..control import outputs
    from ..control.preflight import FrameSample, JointSample, Observed
    from ..control.preflight import preflight as preflight_check
    from ..control.velocity_command import VelocityCommand
    from ..learning.deploy import PolicyRunner, StateError
    from . import common

    class PolicyController(Node):
        def __init__(self, **kw):
            super().__init__(NODE_NAME, **kw)
            self._declare()
            p = self._p
            torch.set_num_threads(1)        # batch-1 inference: a second thread only adds contention
            self.lock = threading.Lock()
            # ---------------------------------------------------------- policy
            ckpt = resolve_path(p("checkpoint"))
            dtype = {"float64": torch.float64, "float32": torch.float32}.get(p("dtype"))
            if dtype is None:
                raise StartupError(f"parameter 'dtype' must be float64 or float32, got {p('dtype')!r}")
            urdf = self._robot_urdf()
            self.mode = p("mode")
            if self.mode not in ("policy", "excite"):
                raise StartupError(f"parameter 'mode' must be policy or excite, got {self.mode!r}")
            if self.mode == "excite":
                self.runner = self._excitation_runner(urdf, dtype)
            else:
                try:
                    self.runner = PolicyRunner(ckpt, urdf=urdf, dtype=dtype, policy_format=p("policy_format"),
                                               compile_prediction=bool(p("compile_prediction"))
                                               and int(p("predict_every")) > 0)
                except CheckpointError as e:
                    raise StartupError(f"refusing checkpoint {ckpt}: {e}") from None
                built = self.runner.warm_prediction()      # before any state waits for it
                if built:
                    self.get_logger().info(f"compiled prediction ready after {built:.1f} s")
            self.executor_kind = p("executor")
            if self.executor_kind not in EXECUTORS:
                raise StartupError(f"parameter 'executor' must be one of {', '.join(EXECUTORS)}, "
                                   f"got {self.executor_kind!r}")
            r = self.runner
            self.kind = r.kind
            self.dt = r.dt
            # ---------------------------------------------------------- interface
            iface = p("interface")
            if iface == "auto":
                iface = r.interface if r.kind == "quadrotor" else "forward_command"
            allowed = QUAD_INTERFACES if r.kind == "quadrotor" else ARM_INTERFACES
            if iface not in allowed:
                raise StartupError(f"parameter 'interface': '{iface}' is not an interface for a {r.kind} "
                                   f"(one of: {', '.join(allowed)}, auto)")
            if r.kind != "quadrotor" and iface == "joint_trajectory" and r.interface != "position":
                raise StartupError(f"interface joint_trajectory needs a position checkpoint; this one commands "
                                   f"'{r.interface}' (use forward_command)")
            if r.kind == "quadrotor" and r.interface == "rotor_thrust" and iface in ("ctbr", "cmd_vel_legacy"):
                raise StartupError(f"the checkpoint commands per-rotor thrust; interface '{iface}' needs a CTBR "
                                   "checkpoint (use rotor_thrust)")
            self.iface = iface
            self.controller = p("controller") or f"{r.interface}_controller"
            cj = [j for j in p("controller_joints") if j]
            if cj:
                if sorted(cj) != sorted(r.actuated_joints):
                    raise StartupError(f"parameter 'controller_joints' {cj} must name exactly the checkpoint's "
                                       f"actuated joints {r.actuated_joints}")
                self.out_index = np.array([r.actuated_joints.index(j) for j in cj])
            else:
                self.out_index = np.arange(len(r.actuated_joints))
            self.controller_joints = cj or list(r.actuated_joints)
            # Message packages that only some installs have: imported here, so a missing one
            # stops the node at start with the reason; their classes are kept for the publishers.
            self._iface_msgs = {}
            if iface == "actuator_msgs":
                try:
                    from actuator_msgs.msg import Actuators
                    self._iface_msgs["Actuators"] = Actuators
                except ImportError:
                    raise StartupError("interface actuator_msgs: the actuator_msgs package is not importable "
                                       "here (install ros-<distro>-actuator-msgs)") from None
            if iface == "px4_rates":
                try:
                    from px4_msgs.msg import OffboardControlMode, VehicleRatesSetpoint
                    self._iface_msgs.update(OffboardControlMode=OffboardControlMode,
                                            VehicleRatesSetpoint=VehicleRatesSetpoint)
                except ImportError:
                    raise StartupError("interface px4_rates: the px4_msgs package is not importable here "
                                       "(build PX4/px4_msgs matching the autopilot's firmware)") from None
            # ---------------------------------------------------------- timing
            self.lockstep = bool(p("lockstep"))
            rate = float(p("rate_hz")) or 1.0 / self.dt
            if not rate > 0:
                raise StartupError(f"parameter 'rate_hz' must be > 0, got {rate}")
            if not self.lockstep and abs(rate * self.dt - 1.0) > 1e-6:
                self.get_logger().warning(f"rate_hz {rate:g} differs from the policy's training rate "
                                          f"{1 / self.dt:g} Hz (dt {self.dt:g} s)")
            self.rate = rate
            self.predict_every = int(p("predict_every"))
            if r.kind == "legged" and self.predict_every:
                # The prediction of a floating base with joints has no message of its own yet (the
                # analysis compares arm and multirotor bags).
                self.get_logger().info("legged robot: no /diffsim/predicted_state (predict_every 0)")
                self.predict_every = 0
            self.legacy_tau = float(p("legacy_attitude_time_s"))
            # ---------------------------------------------------------- the supervisor (control/supervisor.py)
            try:
                values = {k: p(k) for k in SUPERVISOR_PARAMETERS}
                if self.lockstep:
                    # The lockstep stand-in stamps /joint_states and /odom of a step with the same
                    # time: a legged state is made of exactly that pair.
                    values["pair_tolerance_s"] = 0.0
                sup_cfg = SupervisorConfig.from_mapping(values, "")
            except (SupervisorConfigError, TypeError) as e:
                raise StartupError(f"parameter {e}") from None
            self.velocity = None
            if self.mode == "policy" and p("cmd_vel_topic"):
                try:
                    self.velocity = VelocityCommand.for_runner(r, float(p("cmd_vel_timeout_s")))
                except ValueError as e:
                    raise StartupError(f"parameter 'cmd_vel_timeout_s': {e}") from None
            try:
                self.sup = Supervisor(r, sup_cfg, imu_rates=bool(p("imu_angular_velocity")), velocity=self.velocity)
            except ValueError as e:
                raise StartupError(f"/cmd_vel: {e} (set cmd_vel_topic to '' to run without it)") from None
            if self.sup.base_from_imu:
                self.get_logger().info(f"legged policy on the robot observation: the base from {p('imu_topic')} "
                                       "(orientation, body rates) paired with the joint states; odometry not used")
            tgt = list(p("target"))
            if len(tgt) == 3:
                self.sup.set_target(tgt)
            elif tgt:
                raise StartupError(f"parameter 'target' needs 3 numbers (or none), got {tgt}")
            if self.sup.target is None and r.kind == "arm" and self.mode == "policy":
                raise StartupError("parameter 'target' is required for a reach policy: [x, y, z] in m, world frame")
            self.last_safe_reason = ""
            self._excite_done = False
            self.last_answered: Optional[int] = None
            self._last_predicted: Optional[int] = None
            self.wait_subs, self.wait_recs = int(p("wait_for_subscribers")), int(p("wait_for_recorders"))
            self._gate_open = self.wait_subs <= 0 and self.wait_recs <= 0
            # ---------------------------------------------------------- preflight (control/preflight.py)
            self._pf = None
            self.preflight_report = None
            if self.mode == "policy" and bool(p("preflight")):
                self._pf = Observed(duration_s=float(p("preflight_s")), source="policy_controller")
                if not self._pf.duration_s >= 0:
                    raise StartupError(f"parameter 'preflight_s' must be >= 0, got {p('preflight_s')}")
            self._pf_first: Optional[int] = None
            self._pf_untimed = False
            self.preflight_required = bool(p("preflight_required"))
            self.node_counts = {k: 0 for k in ("commands_sent", "predictions_sent", "diagnostics_sent",
                                               "metadata_sent", "missed_deadlines", "errors")}
            self.compute_ms: deque = deque(maxlen=5000)
            self.period_ms: deque = deque(maxlen=5000)
            self._last_tick = None
            # ---------------------------------------------------------- ROS interfaces
            # doc/interfaces.md QoS: publishers of recorded topics keep a deep reliable history (a
            # recorder stall must not drop samples); the metadata is latched.
            default = common.state_qos()
            rel = p("state_reliability")
            if rel not in ("reliable", "best_effort"):
                raise StartupError(f"parameter 'state_reliability' must be reliable or best_effort, got {rel!r}")
            state_qos = common.state_qos(10)
            if rel == "best_effort":
                state_qos.reliability = ReliabilityPolicy.BEST_EFFORT
            latched = common.latched_qos()
            if r.kind != "quadrotor":
                self.create_subscription(JointState, p("joint_states_topic"), self._on_joint_state, state_qos)
            if r.kind != "arm":
                self.create_subscription(Odometry, p("odom_topic"), self._on_odom, state_qos)
                self.create_subscription(Imu, p("imu_topic"), self._on_imu, state_qos)
            self.create_subscription(PointStamped, p("target_topic"), self._on_target, default)
            if self.velocity is not None:
                stamped = bool(p("cmd_vel_stamped"))
                self.create_subscription(TwistStamped if stamped else Twist, p("cmd_vel_topic"),
                                         self._on_cmd_vel, default)
                self.get_logger().info(f"velocity requests on {p('cmd_vel_topic')} "
                                       f"({'TwistStamped' if stamped else 'Twist'}): {self.velocity.describe()}")
            if iface == "forward_command":
                self.out_topic = f"/{self.controller.strip('/')}/commands"
                self.pub_out = self.create_publisher(Float64MultiArray, self.out_topic, default)
            elif iface == "joint_trajectory":
                self.out_topic = p("trajectory_topic")
                self.pub_out = self.create_publisher(JointTrajectory, self.out_topic, default)
            elif iface == "ctbr":
                self.out_topic = p("ctbr_topic")
                self.pub_out = self.create_publisher(TwistStamped, self.out_topic, default)
            elif iface == "rotor_thrust":
                self.out_topic = p("rotor_thrust_topic")
                self.pub_out = self.create_publisher(Float64MultiArray, self.out_topic, default)
            elif iface == "cmd_vel_legacy":
                self.out_topic = p("cmd_vel_legacy_topic")
                self.pub_out = self.create_publisher(Twist, self.out_topic, default)
            elif iface == "px4_rates":
                from rclpy.qos import HistoryPolicy
                # The QoS PX4's uXRCE-DDS bridge expects on /fmu/in/* topics.
                px4_qos = QoSProfile(depth=1, history=HistoryPolicy.KEEP_LAST,
                                     reliability=ReliabilityPolicy.BEST_EFFORT,
                                     durability=DurabilityPolicy.TRANSIENT_LOCAL)
                self.out_topic = p("px4_rates_topic")
                self.pub_out = self.create_publisher(self._iface_msgs["VehicleRatesSetpoint"], self.out_topic, px4_qos)
                self.pub_offboard = self.create_publisher(self._iface_msgs["OffboardControlMode"],
                                                          p("px4_offboard_topic"), px4_qos)
            else:
                self.out_topic = p("actuator_msgs_topic")
                self.pub_out = self.create_publisher(self._iface_msgs["Actuators"], self.out_topic, default)
            self.pub_cmd = self.create_publisher(Float64MultiArray, p("command_topic"), default)
            self.pub_pred = self.create_publisher(Odometry if r.kind == "quadrotor" else JointState,
                                                  p("predicted_state_topic"), default)
            self.pub_meta = self.create_publisher(String, p("metadata_topic"), latched)
            self.pub_diag = self.create_publisher(DiagnosticArray, p("diagnostics_topic"), default)
            self.create_service(SetBool, "~/emergency_stop", self._on_estop)
            self.create_service(Trigger, "~/reset", self._on_reset)
            # The watchdog and the diagnostics run on the steady clock in every mode: under
            # use_sim_time a stopped simulation (a dead driver) stops the simulated clock, and with
            # it every timer on that clock, which is when they are needed.
            steady = Clock(clock_type=ClockType.STEADY_TIME)
            watchdog_period = 1.0 / max(float(p("watchdog_hz")), 1e-3)
            self.watchdog = None                  # timer mode's own watchdog (lockstep: self.timer is it)
            if self.lockstep:
                self.timer = self.create_timer(watchdog_period, self._watchdog_tick, clock=steady)
            else:
                self.timer = self.create_timer(1.0 / rate, self._control_tick)
                self.watchdog = self.create_timer(watchdog_period, self._watchdog_tick, clock=steady)
            self.create_timer(float(p("diagnostics_period_s")), self._publish_diagnostics, clock=steady)
            # A driver or simulator that restarts starts its clock again at 0: a jump back is said,
            # latched as a fault (its states now stamped before the last accepted one are refused
            # until ~/reset), and the control timer on that clock starts afresh instead of waiting
            # for the old time to come back.
            self.clock_jumps_back = 0
            self._jump_handle = self.get_clock().create_jump_callback(
                JumpThreshold(min_forward=None, min_backward=RosDuration(nanoseconds=-1),
                              on_clock_change=False), post_callback=self._on_clock_jump)
            self._publish_metadata()
            self.get_logger().info(
                f"{r.describe()}; publishing {iface} on {self.out_topic}; "
                f"{'lockstep' if self.lockstep else f'{rate:g} Hz'}; safe command: {self.sup.safe_description}")

        # -------------------------------------------------------------- parameters
        def _declare(self):
            for name, (default, desc) in PARAMETERS.items():
                d = ParameterDescriptor(description=desc, additional_constraints=CONSTRAINTS.get(name, ""))
                if isinstance(default, list) and not default:
                    # An empty list has no element type: declare the type; unset reads back as [].
                    kind = {"string": Parameter.Type.STRING_ARRAY, "double": Parameter.Type.DOUBLE_ARRAY}[
                        ARRAY_TYPES[name]]
                    self.declare_parameter(name, kind, d)
                else:
                    self.declare_parameter(name, default, d)

        def _p(self, name):
            try:
                val = self.get_parameter(name).value
            except ParameterUninitializedException:     # a list parameter left unset
                return []
            if val is None:                    # array parameters without a value
                return []
            if isinstance(val, (list, tuple)) or hasattr(val, "tolist"):
                return list(val)
            return val

        def _excitation_runner(self, urdf, dtype):
            """mode excite: the robot and simulator of 'config', the motion of excitation.*."""
            from .. import config as cfgmod
            from ..control.excitation import ExcitationConfig, ExcitationError, ExcitationRunner

            path = self._p("config")
            if not path:
                raise StartupError("mode excite needs parameter 'config': the robot's training/robot file "
                                   "(urdf, floating_base, simulator), e.g. config/reach_arm.yaml")
            path = str(resolve_path(path))
            try:
                params = cfgmod.load_yaml(path)
                params["urdf"] = str(cfgmod.resolve_urdf(params, path))
                values = {k.split(".", 1)[1]: self._p(k) for k in EXCITATION_PARAMETERS}
                cfg = ExcitationConfig.from_mapping(values)
                return ExcitationRunner(params, cfg, source=path, urdf=urdf, dtype=dtype)
            except (cfgmod.ConfigError, ExcitationError) as e:
                raise StartupError(f"mode excite: {e}") from None

        def _robot_urdf(self) -> Optional[str]:
            p = self._p
            topic = p("robot_description_topic")
            if topic:
                return self._wait_robot_description(topic, float(p("robot_description_timeout_s")))
            if p("urdf"):
                path = Path(p("urdf"))
                if not path.is_file():
                    raise StartupError(f"parameter 'urdf': no such file {path}")
                return str(path)
            if p("config"):
                from .. import config as cfgmod
                try:
                    params = cfgmod.load_yaml(p("config"))
                    return str(cfgmod.resolve_urdf(params, p("config")))
                except cfgmod.ConfigError as e:
                    raise StartupError(f"parameter 'config': {e}") from None
            return None

        def _wait_robot_description(self, topic: str, timeout: float) -> str:
            got: List[str] = []
            qos = QoSProfile(depth=1, durability=DurabilityPolicy.TRANSIENT_LOCAL)
            sub = self.create_subscription(String, topic, lambda m: got.append(m.data), qos)
            end = time.monotonic() + timeout
            while not got and time.monotonic() < end:
                rclpy.spin_once(self, timeout_sec=0.1)
            self.destroy_subscription(sub)
            if not got:
                raise StartupError(f"no URDF on {topic} within {timeout:g} s (robot_description_topic)")
            return got[-1]

        # -------------------------------------------------------------- inputs
        def _clock_ns(self) -> Optional[int]:
            """The node's clock for the stamp rule (simulated time under use_sim_time); None while
            it reads 0, i.e. under use_sim_time before the first /clock message: then only the
            order of the stamps is checked."""
            now = int(self.get_clock().now().nanoseconds)
            return now if now != 0 else None

        # -------------------------------------------------------------- preflight
        def _pf_record(self, kind: str, msg) -> None:
            """A state message for the preflight (until its verdict), received now on the node's clock
            (simulated time under use_sim_time, as the stamps then are)."""
            if self._pf is None or self.preflight_report is not None:
                return
            now = int(self.get_clock().now().nanoseconds)
            if now == 0:                       # use_sim_time before the first /clock: no age to judge
                self._pf_untimed, now = True, time.time_ns()
            stamp = stamp_ns(msg.header.stamp)
            if kind == "joint_states":
                self._pf.joint_states.append(JointSample(now, stamp, list(msg.name), list(msg.position)))
            else:
                o = msg.orientation if kind == "imu" else msg.pose.pose.orientation
                sample = FrameSample(now, stamp, msg.header.frame_id, getattr(msg, "child_frame_id", ""),
                                     [o.x, o.y, o.z, o.w])
                (self._pf.imu if kind == "imu" else self._pf.odom).append(sample)
            if self._pf_first is None:
                self._pf_first = time.monotonic_ns()
            self._pf_judge()

        def _pf_judge(self) -> None:
            """The verdict once its window has passed (lockstep: at once) and each topic the policy
            needs has spoken, or 2 s after that at the latest."""
            if self._pf is None or self.preflight_report is not None or self._pf_first is None:
                return
            r, pf = self.runner, self._pf
            waited = (time.monotonic_ns() - self._pf_first) / 1e9
            window = 0.0 if self.lockstep else pf.duration_s
            need = []
            if r.kind != "quadrotor":
                need.append(pf.joint_states)
            if r.kind != "arm":
                need.append(pf.imu if self.sup.base_from_imu else pf.odom)
            if waited < window or (not all(need) and waited < window + 2.0):
                return
            pf.command_topic = self.out_topic
            pf.command_subscribers = int(self.pub_out.get_subscription_count())
            pf.duration_s = max(waited, 1e-3)
            rep = preflight_check(r, pf, frame_id=self._p("frame_id"), child_frame_id=self._p("child_frame_id"),
                                  position_margin=float(self._p("position_margin")),
                                  timing=not (self.lockstep or self._pf_untimed or window == 0.0))
            self.preflight_report = rep
            log = self.get_logger()
            for line in rep.text().splitlines():
                (log.info if rep.go else log.error)(f"preflight: {line}")
            if not rep.go and self.preflight_required:
                self.sup.preflight_hold = (f"preflight NO-GO ({'; '.join(rep.reasons)}); ~/reset to run the policy "
                                           "anyway")

        def _ready(self) -> bool:
            """The preflight's verdict, then the gates of wait_for_subscribers / wait_for_recorders
            (checked until they open once)."""
            if self._pf is not None and self.preflight_report is None:
                return False
            if self._gate_open:
                return True
            if self.pub_out.get_subscription_count() < self.wait_subs:
                return False
            if any(pub.get_subscription_count() < self.wait_recs for pub in (self.pub_cmd, self.pub_pred,
                                                                             self.pub_diag)):
                return False
            self._gate_open = True
            self.get_logger().info("subscribers matched: answering states")
            return True

        def _on_verdict(self, what: str, v, stamp: int):
            """After the supervisor judged a state: log a rejection; in lockstep answer each new state
            once (a fault with the safe command at once). doc/interfaces.md: a lockstep plant
            republishes its initial state until the first command; answering each copy would put
            two commands in flight, so a state with the stamp answered last is not answered."""
            if v.pending:                    # a legged robot's half state, waiting for its partner
                return
            if not v.accepted:
                self.get_logger().warning(f"rejected {what} message: {v.reason}", throttle_duration_sec=1.0)
                if v.fault and self.lockstep and self._ready():
                    self._step()
                return
            if not self.lockstep:
                return
            # Not v.repeat: a re-publication of a state that arrived before the gates opened has
            # not been answered yet, and the lockstep plant waits for exactly that answer.
            if stamp == self.last_answered or not self._ready():
                return
            self.last_answered = stamp
            self._step()

        def _on_joint_state(self, msg):
            with self.lock:
                stamp = stamp_ns(msg.header.stamp)
                js = JointStateIn(list(msg.name), list(msg.position), list(msg.velocity), list(msg.effort), stamp)
                self._pf_record("joint_states", msg)
                self._on_verdict("joint_states", self.sup.on_joint_state(js, time.monotonic_ns(),
                                                                         self._clock_ns()), stamp)

        def _on_odom(self, msg):
            with self.lock:
                pp, o, tw = msg.pose.pose.position, msg.pose.pose.orientation, msg.twist.twist
                stamp = stamp_ns(msg.header.stamp)
                od = OdometryIn([pp.x, pp.y, pp.z], [o.x, o.y, o.z, o.w], [tw.linear.x, tw.linear.y, tw.linear.z],
                                [tw.angular.x, tw.angular.y, tw.angular.z], stamp, msg.header.frame_id,
                                msg.child_frame_id)
                self._pf_record("odom", msg)
                self._on_verdict("odom", self.sup.on_odometry(od, time.monotonic_ns(), self._clock_ns()), stamp)

        def _on_imu(self, msg):
            with self.lock:
                w, o, a = msg.angular_velocity, msg.orientation, msg.linear_acceleration
                stamp = stamp_ns(msg.header.stamp)
                imu = ImuIn([w.x, w.y, w.z], [o.x, o.y, o.z, o.w], [a.x, a.y, a.z], stamp)
                self._pf_record("imu", msg)
                if self.sup.base_from_imu:       # a legged robot observation: the IMU is half the state
                    self._on_verdict("imu", self.sup.on_imu(imu, time.monotonic_ns(), self._clock_ns()), stamp)
                    return
                v = self.sup.on_imu(imu, time.monotonic_ns())
                if not v.accepted:
                    self.get_logger().warning(f"rejected imu message: {v.reason}", throttle_duration_sec=1.0)

        def _on_target(self, msg):
            with self.lock:
                try:
                    before = None if self.sup.target is None else self.sup.target.clone()
                    self.sup.set_target([msg.point.x, msg.point.y, msg.point.z])
                    if self.velocity is not None:
                        self.velocity.release()          # the latest request wins: this goal now
                    if before is None or not bool(torch.equal(before, self.sup.target)):
                        # A streamed setpoint repeats its goal: only a change is logged.
                        self.get_logger().info(f"new target {self.sup.target[0].tolist()}")
                except StateError as e:
                    self.get_logger().warning(f"rejected target: {e}")

        def _on_cmd_vel(self, msg):
            tw = getattr(msg, "twist", msg)             # TwistStamped or Twist
            with self.lock:
                before = self.velocity.goal(time.monotonic_ns())
                up = self.velocity.on_twist((tw.linear.x, tw.linear.y, tw.linear.z),
                                            (tw.angular.x, tw.angular.y, tw.angular.z), time.monotonic_ns())
                log = self.get_logger()
                if not up.accepted:
                    log.warning(f"rejected /cmd_vel: {up.reason}", throttle_duration_sec=1.0)
                    return
                if up.clamped or up.ignored:
                    log.warning(f"/cmd_vel outside what the policy was trained for: clamped {up.clamped or 'none'}, "
                                f"ignored {up.ignored or 'none'} ({self.velocity.describe()})",
                                throttle_duration_sec=1.0)
                changed = (before is None or before.timed_out or before.stand != up.stand
                           or (not up.stand and not np.array_equal(before.target, up.target)))
                if changed:              # a joystick streams its request: only a change is logged
                    log.info("/cmd_vel: stand" if up.stand else f"/cmd_vel: command {up.target.tolist()}")

        def _on_estop(self, req, resp):
            with self.lock:
                resp.message = self.sup.on_estop(bool(req.data), time.monotonic_ns())
                resp.success = True
                self.get_logger().warning(resp.message)
                # At once on a timer loop; in lockstep the next state gets it (an extra command would
                # put a second one in flight in the plant's loop).
                if self.sup.estop and not self.lockstep:
                    self._step()
            return resp

        def _on_reset(self, req, resp):
            with self.lock:
                resp.message = self.sup.reset(time.monotonic_ns())
                resp.success = True
                self.get_logger().warning(f"reset: {resp.message}")
            return resp

        def _on_clock_jump(self, jump):
            back = -jump.delta.nanoseconds / 1e9
            if back <= 0:
                return
            with self.lock:
                self.clock_jumps_back += 1
                reason = (f"the clock jumped back {back:.3f} s (the robot driver or simulator restarted?): "
                          "safe command; its states are refused until ~/reset")
                self.sup.fault(reason, until_reset=True)
                self.get_logger().error(reason)
                if not self.lockstep:
                    self.timer.cancel()
                    self.destroy_timer(self.timer)
                    self.timer = self.create_timer(1.0 / self.rate, self._control_tick)

        def _timer_stalled_s(self) -> float:
            """Timer mode: seconds (steady) since the control timer last ran beyond three periods;
            0 while it runs (or before its first tick)."""
            if self.lockstep or self._last_tick is None:
                return 0.0
            late = time.monotonic() - self._last_tick
            return late if late > 3.0 / self.rate else 0.0

        # -------------------------------------------------------------- the loop
        def _control_tick(self):
            with self.lock:
                now = time.monotonic()
                if self._last_tick is not None:
                    period = (now - self._last_tick) * 1e3
                    self.period_ms.append(period)
                    if period > 1.5e3 / self.rate:
                        self.node_counts["missed_deadlines"] += 1
                self._last_tick = now
                self._pf_judge()
                if self._ready():
                    self._step()

        def _watchdog_tick(self):
            """On the steady clock. Lockstep: every new state is answered, so the watchdog only speaks
            when states stop (the latest is older than state_timeout_s): the safe command at
            watchdog_hz. Timer mode: the same while the control timer is stalled (its clock, a
            simulator's, stopped with the simulator)."""
            with self.lock:
                self._pf_judge()
                # Timer mode: only while the control timer is stalled (its clock stopped).
                if (self.lockstep or self._timer_stalled_s() > 0) and self.sup.stale(time.monotonic_ns()) \
                        and self._ready():
                    self._step()

        def _step(self):
            """One decision of the supervisor, sent; the prediction after the command went out (the
            simulator step must not delay it). Any exception here latches the safe command."""
            t0 = time.perf_counter()
            try:
                tick = self.sup.tick(time.monotonic_ns())
                if tick.command is None:
                    return
                self._publish(tick.command, tick.stamp, tick.state)
            except Exception as e:  # noqa: BLE001 - a failing step must not take the node down
                self._control_fault(f"sending the command: {type(e).__name__}: {e}")
                return
            if not tick.policy:
                if tick.reason != self.last_safe_reason:
                    # A reason that changes with every state (a stamp going backwards) once a second.
                    self.get_logger().warning(f"safe command ({self.sup.safe_description}): {tick.reason}",
                                              throttle_duration_sec=1.0)
                    self.last_safe_reason = tick.reason
                return
            self.compute_ms.append((time.perf_counter() - t0) * 1e3)
            if self.lockstep and (time.perf_counter() - t0) > self.dt:
                self.node_counts["missed_deadlines"] += 1
            if self.last_safe_reason:
                self.get_logger().info(f"policy resumed (was safe: {self.last_safe_reason})")
                self.last_safe_reason = ""
            if self.mode == "excite" and self.runner.finished and not self._excite_done:
                self._excite_done = True
                self.get_logger().info(f"excitation finished after {self.runner.k} commands: holding "
                                       f"{'the centre' if self.kind == 'arm' else 'hover'}")
            # One prediction per state: a timer faster than the state rate recomputes the command
            # from the same state, whose prediction is already out.
            n = self.sup.counts["policy_commands"]
            if self.predict_every > 0 and tick.stamp != self._last_predicted and (n - 1) % self.predict_every == 0:
                self._last_predicted = tick.stamp
                try:
                    pred = self.runner.predict(tick.state, tick.command)
                    self._publish_prediction(pred, tick.stamp + int(round(self.dt * 1e9)))
                except Exception as e:  # noqa: BLE001
                    self._control_fault(f"prediction: {type(e).__name__}: {e}")

        def _control_fault(self, reason: str):
            """An exception in the control path: latched safe command, sent at once when possible."""
            self.node_counts["errors"] += 1
            self.sup.fault(reason, time.monotonic_ns())
            self.get_logger().error(f"{reason}; safe command latched", throttle_duration_sec=1.0)
            try:
                tick = self.sup.tick(time.monotonic_ns())
                if tick.command is not None:
                    self._publish(tick.command, tick.stamp, tick.state)
            except Exception as e:  # noqa: BLE001
                self.get_logger().error(f"could not send the safe command: {type(e).__name__}: {e}",
                                        throttle_duration_sec=1.0)

        @property
        def counts(self) -> Dict[str, int]:
            """The supervisor's counters and the node's (errors summed)."""
            out = dict(self.sup.counts)
            for k, val in self.node_counts.items():
                out[k] = out.get(k, 0) + val
            return out

        @property
        def last_reject(self) -> str:
            return self.sup.last_rejection

        # -------------------------------------------------------------- outputs
        def _publish(self, cmd: np.ndarray, stamp: int, state):
            """Send ``cmd`` (simulator interface, clamped) on the selected interface and on /diffsim/command."""
            r = self.runner
            cmd = np.asarray(cmd, dtype=np.float64)
            now_stamp = self.get_clock().now().to_msg()
            if self.iface == "forward_command":
                m = Float64MultiArray()
                m.data = cmd[self.out_index].tolist()
                self.pub_out.publish(m)
            elif self.iface == "joint_trajectory":
                m = JointTrajectory()
                m.joint_names = list(self.controller_joints)
                pt = JointTrajectoryPoint()
                pt.positions = cmd[self.out_index].tolist()
                pt.velocities = [0.0] * len(cmd)
                sec = int(self.dt)
                pt.time_from_start = Duration(sec=sec, nanosec=int(round((self.dt - sec) * 1e9)))
                m.points = [pt]             # header.stamp zero: "start now" for joint_trajectory_controller
                self.pub_out.publish(m)
            elif self.iface == "ctbr":
                m = TwistStamped()
                m.header.stamp = ns_to_stamp(stamp, Time) if stamp else now_stamp
                m.header.frame_id = "base_link"
                m.twist.linear.z = float(cmd[0])
                m.twist.angular.x, m.twist.angular.y, m.twist.angular.z = (float(x) for x in cmd[1:4])
                self.pub_out.publish(m)
            else:
                thrust = self._rotor_thrusts(cmd, state)
                if self.iface == "rotor_thrust":
                    m = Float64MultiArray()
                    m.data = thrust.tolist()
                elif self.iface == "cmd_vel_legacy":
                    m = self._legacy(cmd, state)
                elif self.iface == "px4_rates":
                    m = self._px4(cmd)
                else:
                    m = self._iface_msgs["Actuators"]()
                    m.header.stamp = now_stamp
                    rc = r.sim.rotors.cfg
                    m.velocity, m.normalized = outputs.rotor_speeds(thrust, rc.thrust_coefficient, rc.max_thrust)
                self.pub_out.publish(m)
            c = Float64MultiArray()
            dim = MultiArrayDimension()
            dim.label, dim.size, dim.stride = str(int(stamp)), len(cmd), len(cmd)
            c.layout.dim = [dim]
            c.data = cmd.tolist()
            self.pub_cmd.publish(c)
            self.node_counts["commands_sent"] += 1

        def _rotor_thrusts(self, cmd: np.ndarray, state) -> np.ndarray:
            if self.runner.interface == "rotor_thrust":
                return cmd
            w = [0.0, 0.0, 0.0] if state is None else state.v[0, 3:6].to(torch.float64).tolist()
            return outputs.ctbr_rotor_thrusts(self.runner.sim.rotors, cmd, w)

        def _px4(self, cmd: np.ndarray):
            """VehicleRatesSetpoint (and its OffboardControlMode) for a CTBR command."""
            rc = self.runner.sim.rotors.cfg
            roll, pitch, yaw, thrust_body = outputs.px4_rates_setpoint(cmd, rc.max_thrust * len(rc.directions))
            t_us = int(self.get_clock().now().nanoseconds // 1000)
            mode = self._iface_msgs["OffboardControlMode"]()
            mode.timestamp = t_us
            for field in ("position", "velocity", "acceleration", "attitude", "thrust_and_torque",
                          "direct_actuator"):
                if hasattr(mode, field):
                    setattr(mode, field, False)
            mode.body_rate = True
            self.pub_offboard.publish(mode)
            m = self._iface_msgs["VehicleRatesSetpoint"]()
            m.timestamp = t_us
            m.roll, m.pitch, m.yaw = roll, pitch, yaw
            m.thrust_body = thrust_body
            return m

        def _legacy(self, cmd: np.ndarray, state):
            """Crazyswarm2 cmd_vel_legacy (untested here): see control.outputs.cmd_vel_legacy."""
            quat = (0.0, 0.0, 0.0, 1.0) if state is None else state.q[0, 3:7].to(torch.float64).tolist()
            roll, pitch, yaw_rate, thrust = outputs.cmd_vel_legacy(cmd, quat, self.legacy_tau,
                                                                   float(self.runner.command_high[0]))
            m = Twist()
            m.linear.y, m.linear.x, m.angular.z, m.linear.z = roll, pitch, yaw_rate, thrust
            return m

        def _publish_prediction(self, pred, stamp: int):
            r = self.runner
            if r.kind == "arm":
                m = JointState()
                m.header.stamp = ns_to_stamp(stamp, Time)
                m.name = list(r.joint_names)
                m.position = pred.q[0].to(torch.float64).tolist()
                m.velocity = pred.v[0].to(torch.float64).tolist()
            else:
                m = Odometry()
                m.header.stamp = ns_to_stamp(stamp, Time)
                m.header.frame_id = self._p("frame_id") or "world"
                m.child_frame_id = self._p("child_frame_id") or "base_link"
                q, v = pred.q[0].to(torch.float64).tolist(), pred.v[0].to(torch.float64).tolist()
                pp, o = m.pose.pose.position, m.pose.pose.orientation
                pp.x, pp.y, pp.z = q[0:3]
                o.x, o.y, o.z, o.w = q[3:7]
                tw = m.twist.twist
                tw.linear.x, tw.linear.y, tw.linear.z = v[0:3]
                tw.angular.x, tw.angular.y, tw.angular.z = v[3:6]
            self.pub_pred.publish(m)
            self.node_counts["predictions_sent"] += 1

        def _publish_metadata(self):
            r = self.runner
            excite = self.mode == "excite"
            doc = {"checkpoint": None if excite else r.meta, "config": r.meta.get("config"), "interface": self.iface,
                   "mode": self.mode,
                   "controller": self.controller if self.iface == "forward_command" else None,
                   "command_topic": self.out_topic, "controller_joints": self.controller_joints,
                   "lockstep": self.lockstep, "rate_hz": None if self.lockstep else self.rate,
                   "safe_command": self.sup.safe_description, "node": self.get_fully_qualified_name(),
                   "policy_format": None if excite else r.policy_format}
            if excite:
                doc["excitation"] = dict(r.meta["excitation"], steps_total=int(r.signal.steps))
            from ..learning.checkpoint import json_safe
            m = String()
            m.data = json.dumps(json_safe(doc), allow_nan=False)
            self.pub_meta.publish(m)
            self.node_counts["metadata_sent"] += 1

        def diagnostics_values(self) -> Dict[str, str]:
            vals = self.sup.status(time.monotonic_ns())
            vals.update({"interface": self.iface, "command_topic": self.out_topic,
                    "mode": "lockstep" if self.lockstep else f"{self.rate:g} Hz",
                    "compute_ms_p50": f"{percentile(self.compute_ms, 50):.3f}",
                    "compute_ms_p99": f"{percentile(self.compute_ms, 99):.3f}",
                    "period_ms_p50": f"{percentile(self.period_ms, 50):.3f}",
                    "period_ms_p99": f"{percentile(self.period_ms, 99):.3f}"})
            vals.update({k: str(v) for k, v in self.counts.items()})
            vals["controller_mode"] = self.mode
            stalled = self._timer_stalled_s()
            vals["control_timer"] = ("lockstep" if self.lockstep else "running" if stalled == 0 else
                                     f"stalled {stalled:.1f} s: the clock it runs on stopped (use_sim_time and no "
                                     "/clock: the simulator or driver is gone?)")
            vals["clock_jumps_back"] = str(self.clock_jumps_back)
            rep = self.preflight_report
            vals["preflight"] = ("off" if self._pf is None else "listening" if rep is None
                                 else "GO" if rep.go else f"NO-GO: {'; '.join(rep.reasons)}")
            if self.velocity is not None:
                vals.update(self.velocity.status(time.monotonic_ns()))
            if self.mode == "excite":
                vals["excitation_commands"] = str(self.runner.k)
                vals["excitation_finished"] = str(self.runner.finished).lower()
            return vals

        def _publish_diagnostics(self):
            with self.lock:
                if not self._ready():        # wait_for_recorders: nothing published before they listen
                    return
                try:
                    st = DiagnosticStatus()
                    st.name = f"{NODE_NAME}: {self.get_fully_qualified_name()}"
                    st.hardware_id = self.runner.model.name
                    blocked = self.sup.blocked(time.monotonic_ns())
                    if self.sup.estop:
                        st.level, st.message = DiagnosticStatus.ERROR, "emergency stop latched"
                    elif blocked is not None:
                        st.level, st.message = DiagnosticStatus.WARN, f"safe command: {blocked}"
                        if self._timer_stalled_s() > 0:
                            st.message += "; the control timer's clock stopped"
                    elif self.mode == "excite":
                        st.level = DiagnosticStatus.OK
                        st.message = ("excitation finished: holding" if self.runner.finished
                                      else "running the excitation")
                    else:
                        st.level, st.message = DiagnosticStatus.OK, "running the policy"
                        goal = None if self.velocity is None else self.velocity.goal(time.monotonic_ns())
                        last = None if self.velocity is None else self.velocity.last
                        if goal is not None and goal.stand:
                            st.message = "standing (/cmd_vel: " + ("timed out)" if goal.timed_out else "stop)")
                        if goal is not None and not goal.timed_out and last is not None and last.clamped:
                            st.level = DiagnosticStatus.WARN
                            st.message += f"; /cmd_vel clamped to the trained range ({', '.join(last.clamped)})"
                    self.node_counts["diagnostics_sent"] += 1
                    st.values = [KeyValue(key=k, value=v) for k, v in self.diagnostics_values().items()]
                    arr = DiagnosticArray()
                    arr.header.stamp = self.get_clock().now().to_msg()
                    arr.status = [st]
                    self.pub_diag.publish(arr)
                except Exception as e:  # noqa: BLE001
                    self.get_logger().error(f"diagnostics failed: {e}", throttle_duration_sec=5.0)

        def close(self):
            """Called once by run_node at shutdown (SIGINT/SIGTERM): the counters to stderr and stats_file."""
            self.timer.cancel()
            if self.watchdog is not None:
                self.watchdog.cancel()
            # Reliable subscribers (a recorder) get every message published before the process exits.
            late = common.flush_publishers((self.pub_out, self.pub_cmd, self.pub_pred, self.pub_meta, self.pub_diag))
            if late:
                self.get_logger().warning(f"shutting down with messages a subscriber has not acknowledged on {late}")
            self.finish(unacknowledged=late)

        def finish(self, unacknowledged=()):
            """Counters to the log (and stats_file) at shutdown; ``unacknowledged``: the topics a
            reliable subscriber had not acknowledged when the process gave up waiting."""
            stats = dict(self.counts)
            stats["unacknowledged_topics"] = list(unacknowledged)
            # Messages published per topic, for comparison with a recorder's bag.
            stats["published"] = {self.out_topic: self.counts["commands_sent"],
                                  self._p("command_topic"): self.counts["commands_sent"],
                                  self._p("predicted_state_topic"): self.counts["predictions_sent"],
                                  self._p("metadata_topic"): self.counts["metadata_sent"],
                                  self._p("diagnostics_topic"): self.counts["diagnostics_sent"]}
            for q in (50, 99):
                val = percentile(self.compute_ms, q)
                stats[f"compute_ms_p{q}"] = None if math.isnan(val) else round(val, 4)
            path = self._p("stats_file")
            if path:
                try:
                    Path(path).write_text(json.dumps(stats, indent=1))
                except OSError as e:
                    print(f"{NODE_NAME}: cannot write stats_file {path}: {e}", file=sys.stderr)
            print(f"{NODE_NAME}: published " + json.dumps(stats), file=sys.stderr, flush=True)

    return PolicyController


def main(argv=None) -> int:
    """Console script: runs until SIGINT/SIGTERM (exit 0); a refused checkpoint or a bad
    parameter prints ``policy_controller: error: ...`` and exits 2."""
    from .common import run_node

    def factory():
        try:
            return make_node_class()()
        except StartupError:
            raise
        except Exception as e:  # noqa: BLE001 - e.g. a parameter of the wrong type: say so, exit 2
            raise StartupError(f"{type(e).__name__}: {e}") from None

    return run_node(factory, argv, NODE_NAME)


if __name__ == "__main__":
    sys.exit(main())
