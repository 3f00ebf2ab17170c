"""policy_controller's settings, ROS-free.

The parameters it declares (name -> default, description, from the schema sections
:class:`PolicyControllerParameters`, the supervisor's and the excitation's) and the checks they pass
at start.

Each check raises :class:`SetupError` (diffsim_ros.errors, the stand-in's settings raise it too)
naming the parameter; the node prints the text and exits with status 2 (nodes/policy_controller.py
turns it into its StartupError). The runner, the supervisor and the velocity command are built here
from the parameters' values, read through a callable ``p(name)`` (the node's), in two steps:
:func:`read_runner` (the runner and the command interface), then, once the node has imported the
interface's messages, :func:`read_loop` (timing, supervisor, goal, gates, preflight). The order of
the checks is the order of the messages a node with several bad parameters prints first.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from .. import interfaces as ifc
from ..errors import SetupError
from ..schema import normalise, option, ros_array_types, ros_constraints, ros_parameters, section
from .supervisor import Supervisor, SupervisorConfig, SupervisorConfigError
from .velocity_command import VelocityCommand

__all__ = ["SetupError", "PolicyControllerParameters", "PARAMETERS", "SUPERVISOR_PARAMETERS",
           "EXCITATION_PARAMETERS", "CONSTRAINTS", "ARRAY_TYPES", "ARM_INTERFACES", "QUAD_INTERFACES", "torch_dtype",
           "urdf_path", "policy_runner", "excitation_runner", "choose_interface",
           "command_order", "control_rate", "supervisor_config", "velocity_command", "supervisor", "apply_target",
           "Settings", "read_runner", "read_loop"]


ARM_INTERFACES = ("forward_command", "joint_trajectory")
QUAD_INTERFACES = ("ctbr", "rotor_thrust", "cmd_vel_legacy", "actuator_msgs", "px4_rates")

@section("policy_controller", node=True)
@dataclass(frozen=True)
class PolicyControllerParameters:
    """policy_controller's own parameters (the supervisor's and the excitation's are their sections)."""

    mode: str = option("policy", "policy: run the checkpoint's policy; excite: drive an identification motion "
                       "instead (diffsim_ros/control/excitation.py: multisine or chirp joint targets for arms, "
                       "attitude/thrust/rate steps around hover for multirotors; settings excitation.*), the robot "
                       "and simulator from 'config', no checkpoint; the supervisor, limits and outputs are the same",
                       choices=("policy", "excite"))
    checkpoint: str = option("policies/hover", "checkpoint folder (policy.pt + policy.json): absolute, relative to "
                             "the working directory, or to the diffsim_ros share folder")
    urdf: str = option("", "URDF file of the robot being controlled; the checkpoint is refused if it was made for "
                       "another robot or URDF (empty: the 'config' file's urdf, else the URDF the checkpoint names)")
    config: str = option("", "ROS parameter file (config/*.yaml) naming the robot ('urdf', 'floating_base'); used "
                         "when 'urdf' is empty")
    robot_description_topic: str = option("", "take the robot's URDF from this latched std_msgs/String topic (e.g. "
                                          "/robot_description) instead of a file; empty: do not wait for it")
    robot_description_timeout_s: float = option(10.0, "how long to wait for robot_description_topic at start", "s",
                                                above=0)
    dtype: str = option("float64", "float64 or float32: precision of the observation and the prediction",
                        choices=("float64", "float32"))
    interface: str = option("auto", "command interface: arms forward_command | joint_trajectory; quadrotors ctbr | "
                            "rotor_thrust | cmd_vel_legacy (Crazyswarm2, untested here) | actuator_msgs (if "
                            "importable, untested here); auto: forward_command for arms, the checkpoint's own "
                            "(ctbr or rotor_thrust) for quadrotors",
                            choices=("auto",) + ARM_INTERFACES + QUAD_INTERFACES)
    controller: str = option("", "forward_command_controller name: commands go to /<controller>/commands (empty: "
                             "position_controller, velocity_controller or effort_controller per the checkpoint)")
    controller_joints: Tuple[str, ...] = option((), "joint order of the forward_command_controller's 'joints' "
                                                "parameter (empty: the checkpoint's actuated joints in their order)")
    trajectory_topic: str = option(ifc.JOINT_TRAJECTORY,
                                   "trajectory_msgs/JointTrajectory topic (interface joint_trajectory)")
    ctbr_topic: str = option(ifc.CMD_CTBR, "geometry_msgs/TwistStamped: linear.z collective thrust N, angular body "
                             "rates rad/s")
    rotor_thrust_topic: str = option(ifc.CMD_ROTOR_THRUST, "std_msgs/Float64MultiArray: per-rotor thrust N, "
                                     "rotor_links order")
    cmd_vel_legacy_topic: str = option(ifc.CMD_VEL_LEGACY, "geometry_msgs/Twist in Crazyswarm2's cmd_vel_legacy "
                                       "convention")
    actuator_msgs_topic: str = option(ifc.ACTUATORS, "actuator_msgs/Actuators topic (interface actuator_msgs)")
    px4_rates_topic: str = option(ifc.PX4_RATES_SETPOINT, "px4_msgs/VehicleRatesSetpoint topic (interface "
                                  "px4_rates: PX4 offboard body rates and thrust, FRD)")
    px4_offboard_topic: str = option(ifc.PX4_OFFBOARD_MODE, "px4_msgs/OffboardControlMode topic, published with "
                                     "each setpoint (body_rate true) to keep offboard alive")
    legacy_attitude_time_s: float = option(0.1, "cmd_vel_legacy: roll/pitch setpoint = current angle + body rate * "
                                           "this", "s")
    joint_states_topic: str = option(ifc.JOINT_STATES, "sensor_msgs/JointState input (arms), matched by joint name")
    odom_topic: str = option(ifc.ODOM, "nav_msgs/Odometry input (quadrotors; legged policies on the privileged "
                             "observation): pose in world, twist in the body frame")
    imu_topic: str = option(ifc.IMU, "sensor_msgs/Imu input: a legged policy on the robot observation takes the "
                            "base's orientation and body rates from it (no odometry needed); quadrotors: checked "
                            "for NaN/Inf, see imu_angular_velocity")
    imu_angular_velocity: bool = option(False, "take the body rates from the latest /imu instead of /odom's twist")
    state_reliability: str = option("reliable", "QoS reliability of the state subscriptions: reliable or "
                                    "best_effort", choices=("reliable", "best_effort"))
    target: Tuple[float, ...] = option((), "goal: reach and hover/waypoint: a point [x, y, z] m (world); velocity "
                                       "mode: [vx, vy, vz] m/s; empty: the task's default (hover: its home point; "
                                       "reach has none)")
    target_topic: str = option(ifc.TARGET, "geometry_msgs/PointStamped that replaces the goal at run time")
    preflight: bool = option(True, "before the policy goes active, check the robot's topics against the "
                             "checkpoint (control/preflight.py, as `diffsim-ros preflight`: joints, limits, frames, "
                             "the IMU, the command topic's subscribers; in timer mode also the state rate, jitter and "
                             "stamp age)")
    preflight_s: float = option(1.0, "timer mode: how long the preflight listens from the first state (lockstep: it "
                                "judges the first state, the plant stepping only when commanded)", "s", low=0)
    preflight_required: bool = option(True, "on a preflight NO-GO hold the safe command until ~/reset (false: log "
                                      "the NO-GO and run the policy)")
    policy_format: str = option("torchscript", "torchscript (policy.pt) or onnx (policy.onnx from `diffsim-ros "
                                "export CHECKPOINT --onnx`, run by onnxruntime; a stale export is refused)",
                                choices=("torchscript", "onnx"))
    cmd_vel_topic: str = option(ifc.CMD_VEL, "geometry_msgs/Twist velocity requests (teleop_twist_keyboard, a "
                                "joystick, Nav2) for a velocity policy (a legged walker: linear.x, forward m/s; a "
                                "quadrotor velocity task: linear, world m/s), mapped into the trained range "
                                "(control/velocity_command.py); empty: not subscribed")
    cmd_vel_stamped: bool = option(False, "cmd_vel_topic carries geometry_msgs/TwistStamped instead of Twist")
    cmd_vel_timeout_s: float = option(0.5, "no /cmd_vel request for this long returns to the zero command (a walker "
                                      "trained above 0 m/s stands, a quadrotor hovers in place)", "s", above=0)
    rate_hz: float = option(0.0, "control rate of the timer (0: 1 / the checkpoint's dt); unused in lockstep", "Hz",
                            low=0)
    lockstep: bool = option(False, "one command per received state instead of a timer")
    watchdog_hz: float = option(20.0, "how often the steady-clock watchdog checks the state age (lockstep; timer "
                                "mode while the control timer's clock has stopped, e.g. a simulator's /clock)", "Hz",
                                above=0)
    wait_for_subscribers: int = option(0, "answer no state until the command topic has at least this many matched "
                                       "subscribers (e.g. 1: the robot's driver; 2: the driver and a recorder)",
                                       low=0)
    wait_for_recorders: int = option(0, "answer no state until /diffsim/command, /diffsim/predicted_state and "
                                     "/diagnostics each have at least this many matched subscribers (recorders), so "
                                     "that nothing published is lost to discovery", low=0)
    predict_every: int = option(1, "publish /diffsim/predicted_state every this many commands (0: never)", low=0)
    compile_prediction: bool = option(False, "predict through the step compiled ahead of time (physics.compiled."
                                      "ExportedStep; at batch 1 the quadrotor's step takes 0.25 ms instead of 3 ms, "
                                      "what a 250-500 Hz loop needs); the node builds it before its first state "
                                      "(about a minute on a machine's first start, seconds from the cache after)")
    executor: str = option("events", "events (rclpy's EventsExecutor: ready entities queued from C++, no wait set "
                           "rebuilt per message) or single_threaded (rclpy's SingleThreadedExecutor)",
                           choices=("events", "single_threaded"))
    command_topic: str = option(ifc.COMMAND, "std_msgs/Float64MultiArray: the command in the simulator's interface")
    predicted_state_topic: str = option(ifc.PREDICTED_STATE, "JointState (arms) or Odometry (quadrotors), one step "
                                        "on")
    metadata_topic: str = option(ifc.METADATA, "std_msgs/String, transient local: checkpoint metadata JSON")
    diagnostics_topic: str = option(ifc.DIAGNOSTICS, "diagnostic_msgs/DiagnosticArray")
    diagnostics_period_s: float = option(1.0, "diagnostics period", "s", above=0)
    stats_file: str = option("", "write the node's counters as JSON here at shutdown (empty: no file)")

    def __post_init__(self):
        normalise(self)


#: name -> (default, description). Every parameter the node reads is declared from this table: its own
#: (the section above), the supervisor's and the excitation's.
PARAMETERS: Dict[str, Any] = {name: (default, text)
                              for name, default, text in ros_parameters(PolicyControllerParameters, "")}
#: The supervisor's settings (control/supervisor.py's SupervisorConfig: defaults, documentation, ranges).
SUPERVISOR_PARAMETERS: Dict[str, Any] = {name: (default, text)
                                         for name, default, text in ros_parameters(SupervisorConfig, "")}
PARAMETERS.update(SUPERVISOR_PARAMETERS)


def _excitation_parameters() -> Dict[str, Any]:
    """Return the ``excitation.*`` parameters (mode excite).

    The fields of control.excitation.ExcitationConfig with their defaults and documentation.
    """
    from ..control.excitation import ExcitationConfig

    return {name: (default, text) for name, default, text in ros_parameters(ExcitationConfig, "excitation")}


EXCITATION_PARAMETERS: Dict[str, Any] = _excitation_parameters()
PARAMETERS.update(EXCITATION_PARAMETERS)


def _constraints() -> Dict[str, str]:
    """Return the schema sections' ranges and value sets, for the descriptors' additional_constraints."""
    from ..control.excitation import ExcitationConfig

    return {**ros_constraints(PolicyControllerParameters, ""), **ros_constraints(SupervisorConfig, ""),
            **ros_constraints(ExcitationConfig, "excitation")}


CONSTRAINTS: Dict[str, str] = _constraints()

#: Element type of the list parameters (an empty default cannot say it): the node's own and the supervisor's.
ARRAY_TYPES: Dict[str, str] = {**ros_array_types(PolicyControllerParameters, ""),
                               **ros_array_types(SupervisorConfig, "")}



# ============================================================================ the policy
def torch_dtype(name: str):
    """``dtype``: the torch dtype of the observation and the prediction."""
    import torch

    dtype = {"float64": torch.float64, "float32": torch.float32}.get(name)
    if dtype is None:
        raise SetupError(f"parameter 'dtype' must be float64 or float32, got {name!r}")
    return dtype


def urdf_path(urdf: str, config: str) -> Optional[str]:
    """Return the robot's URDF file, or None for the checkpoint's own.

    ``urdf``, else the one the ``config`` file names, else None (the checkpoint's own).
    """
    if urdf:
        path = Path(urdf)
        if not path.is_file():
            raise SetupError(f"parameter 'urdf': no such file {path}")
        return str(path)
    if config:
        from .. import config as cfgmod
        try:
            params = cfgmod.load_yaml(config)
            return str(cfgmod.resolve_urdf(params, config))
        except cfgmod.ConfigError as e:
            raise SetupError(f"parameter 'config': {e}") from None
    return None


def policy_runner(checkpoint: Path, urdf: Optional[str], dtype, policy_format: str, compile_prediction: bool):
    """Mode policy: the checkpoint's PolicyRunner (a checkpoint for another robot is refused)."""
    from ..learning.checkpoint import CheckpointError
    from ..learning.deploy import PolicyRunner

    try:
        return PolicyRunner(checkpoint, urdf=urdf, dtype=dtype, policy_format=policy_format,
                            compile_prediction=compile_prediction)
    except CheckpointError as e:
        raise SetupError(f"refusing checkpoint {checkpoint}: {e}") from None


def excitation_runner(config: str, values: Dict[str, Any], urdf: Optional[str], dtype):
    """Return the runner of mode excite.

    The robot and simulator of the ``config`` file (a resolved path, '' when unset), the motion of
    the ``excitation.*`` parameters ``values``.
    """
    from .. import config as cfgmod
    from .excitation import ExcitationConfig, ExcitationError, ExcitationRunner

    if not config:
        raise SetupError("mode excite needs parameter 'config': the robot's training/robot file "
                         "(urdf, floating_base, simulator), e.g. config/reach_arm.yaml")
    try:
        params = cfgmod.load_yaml(config)
        params["urdf"] = str(cfgmod.resolve_urdf(params, config))
        cfg = ExcitationConfig.from_mapping({k.split(".", 1)[1]: v for k, v in values.items()})
        return ExcitationRunner(params, cfg, source=config, urdf=urdf, dtype=dtype)
    except (cfgmod.ConfigError, ExcitationError) as e:
        raise SetupError(f"mode excite: {e}") from None


# ============================================================================ the command interface
def choose_interface(requested: str, runner) -> str:
    """Return ``interface`` for the runner's robot and command.

    Auto: forward_command for arms and legged robots, the checkpoint's own for quadrotors.
    """
    kind = runner.kind
    iface = requested
    if iface == "auto":
        iface = runner.interface if kind == "quadrotor" else "forward_command"
    allowed = QUAD_INTERFACES if kind == "quadrotor" else ARM_INTERFACES
    if iface not in allowed:
        raise SetupError(f"parameter 'interface': '{iface}' is not an interface for a {kind} "
                         f"(one of: {', '.join(allowed)}, auto)")
    if kind != "quadrotor" and iface == "joint_trajectory" and runner.interface != "position":
        raise SetupError(f"interface joint_trajectory needs a position checkpoint; this one commands "
                         f"'{runner.interface}' (use forward_command)")
    if kind == "quadrotor" and runner.interface == "rotor_thrust" and iface in ("ctbr", "cmd_vel_legacy"):
        raise SetupError(f"the checkpoint commands per-rotor thrust; interface '{iface}' needs a CTBR "
                         "checkpoint (use rotor_thrust)")
    return iface


def command_order(controller_joints: Sequence[str], runner) -> Tuple[np.ndarray, List[str]]:
    """Map ``controller_joints`` onto the command.

    Return the index of each controller joint in the command, and the joint names in the
    controller's order (empty: the checkpoint's actuated joints in their order).
    """
    cj = [j for j in controller_joints if j]
    if not cj:
        return np.arange(len(runner.actuated_joints)), list(runner.actuated_joints)
    if sorted(cj) != sorted(runner.actuated_joints):
        raise SetupError(f"parameter 'controller_joints' {cj} must name exactly the checkpoint's "
                         f"actuated joints {runner.actuated_joints}")
    return np.array([runner.actuated_joints.index(j) for j in cj]), cj


def control_rate(rate_hz: float, dt: float) -> float:
    """``rate_hz`` (0: the policy's own rate, 1 / dt)."""
    rate = rate_hz or 1.0 / dt
    if not rate > 0:
        raise SetupError(f"parameter 'rate_hz' must be > 0, got {rate}")
    return rate


# ============================================================================ the supervisor
def supervisor_config(values: Dict[str, Any], lockstep: bool) -> SupervisorConfig:
    """Return the supervisor's settings from their parameters ``values``."""
    try:
        values = dict(values)
        if lockstep:
            # The lockstep stand-in stamps /joint_states and /odom of a step with the same
            # time: a legged state is made of exactly that pair.
            values["pair_tolerance_s"] = 0.0
        return SupervisorConfig.from_mapping(values, "")
    except (SupervisorConfigError, TypeError) as e:
        raise SetupError(f"parameter {e}") from None


def velocity_command(runner, timeout_s: float) -> VelocityCommand:
    """Return the /cmd_vel requests' mapping into the runner's trained range."""
    try:
        return VelocityCommand.for_runner(runner, timeout_s)
    except ValueError as e:
        raise SetupError(f"parameter 'cmd_vel_timeout_s': {e}") from None


def supervisor(runner, cfg: SupervisorConfig, imu_rates: bool, velocity: Optional[VelocityCommand]) -> Supervisor:
    try:
        return Supervisor(runner, cfg, imu_rates=imu_rates, velocity=velocity)
    except ValueError as e:
        raise SetupError(f"/cmd_vel: {e} (set cmd_vel_topic to '' to run without it)") from None


def apply_target(sup: Supervisor, target: Sequence[float], kind: str, mode: str) -> None:
    """``target``: 3 numbers or none; a reach policy needs one."""
    tgt = list(target)
    if len(tgt) == 3:
        sup.set_target(tgt)
    elif tgt:
        raise SetupError(f"parameter 'target' needs 3 numbers (or none), got {tgt}")
    if sup.target is None and kind == "arm" and mode == "policy":
        raise SetupError("parameter 'target' is required for a reach policy: [x, y, z] in m, world frame")


# ============================================================================ all of it
@dataclass
class Settings:
    """What policy_controller runs with (read_runner fills the first block, read_loop the rest)."""

    mode: str
    runner: Any                          # PolicyRunner (mode policy) or ExcitationRunner (mode excite)
    executor_kind: str
    iface: str
    controller: str                      # forward_command_controller name
    out_index: np.ndarray                # command index of each controller joint
    controller_joints: List[str]
    lockstep: bool = False
    rate: float = 0.0                    # Hz, the control timer's
    predict_every: int = 0
    legacy_tau: float = 0.0              # legacy_attitude_time_s
    sup: Any = None                      # the Supervisor
    velocity: Optional[VelocityCommand] = None
    wait_subs: int = 0
    wait_recs: int = 0
    preflight_s: Optional[float] = None  # None: no preflight
    preflight_required: bool = True
    reliability: str = "reliable"        # state_reliability: reliable or best_effort


def read_runner(p: Callable[[str], Any], log, *, resolve: Callable[[str], Path],
                robot_description: Callable[[str, float], str]) -> Settings:
    """Read the runner and the command interface.

    ``log``: the node's logger (info, warning); ``resolve``: a path parameter to a file (absolute,
    the working directory, the package's share folder); ``robot_description(topic, timeout_s)``: the
    URDF text the node received on a topic.
    """
    ckpt = resolve(p("checkpoint"))
    dtype = torch_dtype(p("dtype"))
    topic = p("robot_description_topic")
    urdf = (robot_description(topic, float(p("robot_description_timeout_s"))) if topic
            else urdf_path(p("urdf"), p("config")))
    mode = p("mode")
    if mode == "excite":
        config = p("config") and str(resolve(p("config")))
        runner = excitation_runner(config, {k: p(k) for k in EXCITATION_PARAMETERS}, urdf, dtype)
    else:
        runner = policy_runner(ckpt, urdf, dtype, p("policy_format"),
                               bool(p("compile_prediction")) and int(p("predict_every")) > 0)
        built = runner.warm_prediction()      # before any state waits for it
        if built:
            log.info(f"compiled prediction ready after {built:.1f} s")
    executor_kind = p("executor")
    iface = choose_interface(p("interface"), runner)
    out_index, joints = command_order(p("controller_joints"), runner)
    return Settings(mode, runner, executor_kind, iface, p("controller") or f"{runner.interface}_controller",
                    out_index, joints)


def read_loop(p: Callable[[str], Any], log, s: Settings) -> None:
    """Read timing, the supervisor, the /cmd_vel mapping, the goal, the gates and the preflight into ``s``."""
    r = s.runner
    s.lockstep = bool(p("lockstep"))
    s.rate = control_rate(float(p("rate_hz")), r.dt)
    if not s.lockstep and abs(s.rate * r.dt - 1.0) > 1e-6:
        log.warning(f"rate_hz {s.rate:g} differs from the policy's training rate {1 / r.dt:g} Hz (dt {r.dt:g} s)")
    s.predict_every = int(p("predict_every"))
    if r.kind == "legged" and s.predict_every:
        # The prediction of a floating base with joints has no message of its own yet (the
        # analysis compares arm and multirotor bags).
        log.info("legged robot: no /diffsim/predicted_state (predict_every 0)")
        s.predict_every = 0
    s.legacy_tau = float(p("legacy_attitude_time_s"))
    sup_cfg = supervisor_config({k: p(k) for k in SUPERVISOR_PARAMETERS}, s.lockstep)
    if s.mode == "policy" and p("cmd_vel_topic"):
        s.velocity = velocity_command(r, float(p("cmd_vel_timeout_s")))
    s.sup = supervisor(r, sup_cfg, bool(p("imu_angular_velocity")), s.velocity)
    if s.sup.base_from_imu:
        log.info(f"legged policy on the robot observation: the base from {p('imu_topic')} "
                 "(orientation, body rates) paired with the joint states; odometry not used")
    apply_target(s.sup, p("target"), r.kind, s.mode)
    s.wait_subs, s.wait_recs = int(p("wait_for_subscribers")), int(p("wait_for_recorders"))
    if s.mode == "policy" and bool(p("preflight")):
        s.preflight_s = float(p("preflight_s"))
    s.preflight_required = bool(p("preflight_required"))
    s.reliability = p("state_reliability")
