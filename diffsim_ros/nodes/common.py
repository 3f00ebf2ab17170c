"""Small rclpy helpers shared by the nodes (a stable API: other nodes import it).

Parameters
    declare(node, name, default, description, *, dynamic_typing=False, read_only=False) -> value
        An override of a compatible type is converted first (coerce_value: an integer for a
        double, ...); one of another type is a StartupError naming the parameter.
    declare_all(node, specs) -> {name: value}            specs: [(name, default, description), ...]
    coerce_override(node, name, convert): replace a parameter's override by convert(value)
        before it is declared (mujoco_plant converts perturbation.* through the schema)
    value(node, name) -> the parameter's value (lists as lists; unset arrays as [])
    config_parameters(node, config_param="config", sections=("simulator",),
                      keys=("urdf", "floating_base")) -> dict
        The ``ros__parameters`` mapping of a training/robot YAML: the file named by the
        ``config`` parameter, overlaid with the same keys given directly to the node
        (``--params-file config/hover.yaml`` or ``-p simulator.dt:=0.01``); each such key
        is declared with its description and constraints from SimConfig's schema.

QoS (doc/interfaces.md)
    state_qos(depth=1000), command_qos(depth=10): reliable, volatile, keep last ``depth``.
    latched_qos(depth=1): reliable, transient local (``/diffsim/metadata``).
    recorder_qos(depth=1000, transient_local=False): reliable, deep history (no loss at 500 Hz).

Time
    stamp(t_seconds) -> builtin_interfaces/Time;  stamp_from_ns(ns);  stamp_to_ns(stamp) -> int

Messages <-> numpy, joints always by name (MessageError, a ValueError, names the field)
    joint_state_msg(names, position, velocity=None, effort=None, t=None) -> JointState
    joint_state_arrays(msg, names) -> (position, velocity|None, effort|None) in ``names`` order
    float64_array(msg, size=None, what="command") -> np.ndarray (finite, ``size`` entries)
    trajectory_point(msg, names) -> (positions, velocities|None) of a one-point JointTrajectory
    odometry_msg(t, position, orientation_xyzw, linear_velocity_body, angular_velocity,
                 frame_id="world", child_frame_id="base_link") -> Odometry
    imu_msg(t, orientation_xyzw, angular_velocity, specific_force, frame_id="base_link") -> Imu
    clock_msg(t) -> rosgraph_msgs/Clock
    tf_message(t, transforms) -> tf2_msgs/TFMessage of (parent, child, xyz, quaternion xyzw)
    have_tf2_msgs() -> whether tf2_msgs is importable (it comes with a ROS 2 install, not the PyPI wheels)
    string_msg(text) -> std_msgs/String (e.g. /robot_description, latched)

Process
    StartupError: a node that cannot start with its parameters (message printed, exit 2).
    run_node(factory, args=None, name="node") -> exit status: rclpy.init, the node, a
        spin loop that ends on SIGINT/SIGTERM (our handlers; then ``node.drain_seconds`` more
        of spinning if set, and the node's ``close()`` before shutdown, e.g. to close a bag), errors
        at start printed as ``error: ...`` with status 2, never a traceback for bad configuration.

rclpy and the message packages are imported inside the functions, so this module
imports where ROS is absent (the pure helpers then still work).
"""
from __future__ import annotations

import gc
import numbers
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

import numpy as np

__all__ = ["MessageError", "StartupError", "declare", "declare_all", "check_section", "value", "coerce_value",
           "coerce_override", "config_parameters",
           "state_qos", "command_qos", "latched_qos", "recorder_qos", "flush_publishers", "stamp",
           "stamp_from_ns", "stamp_to_ns",
           "joint_state_msg", "joint_state_arrays", "float64_array", "trajectory_point",
           "odometry_msg", "imu_msg", "clock_msg", "tf_message", "have_tf2_msgs", "string_msg", "run_node"]


class MessageError(ValueError):
    """A received message that cannot be used; the text names the field at fault."""


class StartupError(RuntimeError):
    """A node cannot start with its parameters; the text names the parameter."""


# ============================================================================ parameters
def _is_int(x: Any) -> bool:
    return isinstance(x, numbers.Integral) and not isinstance(x, bool)


def _is_real(x: Any) -> bool:
    return isinstance(x, numbers.Real) and not isinstance(x, bool)


def coerce_value(default: Any, val: Any) -> Any:
    """Return ``val`` (a parameter's override) in the type of the parameter's ``default`` where that loses nothing.

    This is how the configuration schema reads numbers: an integer where a double is declared
    (``-p real_time_factor:=2``, ``latency: 0`` in a YAML file), integers in a double array
    (``initial_positions:=[0, 0, 1]``), one number where a double array is declared (a list of that
    number) and a whole double where an integer is (``seed:=3.0``). Anything else is returned
    unchanged (a wrong type stays wrong, for :func:`declare` to report).
    """
    if isinstance(default, float):
        return float(val) if _is_int(val) else val
    if _is_int(default):
        return int(val) if isinstance(val, float) and val.is_integer() else val
    if isinstance(default, (list, tuple)) and default and all(isinstance(x, float) for x in default):
        if _is_real(val):
            return [float(val)]
        items = val.tolist() if hasattr(val, "tolist") else val
        if isinstance(items, (list, tuple)) and items and all(_is_real(x) for x in items):
            return [float(x) for x in items]
    return val


def coerce_override(node, name: str, convert: Callable[[Any], Any]) -> None:
    """Replace the override of the not yet declared parameter ``name`` with ``convert(value)``.

    The override comes from the command line or a params file; the parameter is then declared with
    the converted value. Nothing is done when the parameter has no override. rclpy keeps the
    overrides in ``Node._parameter_overrides``.
    """
    from rclpy.parameter import Parameter

    overrides = getattr(node, "_parameter_overrides", None)
    if overrides is None or name not in overrides:
        return
    overrides[name] = Parameter(name, value=convert(overrides[name].value))


def _type_words(x: Any) -> str:
    if isinstance(x, bool):
        return "true or false"
    if _is_int(x):
        return "an integer"
    if isinstance(x, float):
        return "a number"
    if isinstance(x, str):
        return "a string"
    if isinstance(x, (list, tuple)):
        return "a list" + (" of numbers" if x and all(_is_real(v) for v in x) else
                           " of strings" if x and all(isinstance(v, str) for v in x) else "")
    return type(x).__name__


def declare(node, name: str, default: Any, description: str, *, dynamic_typing: bool = False,
            read_only: bool = False, constraints: str = "", array_type: str = "") -> Any:
    """Declare ``name`` with ``default``, ``description`` and ``constraints``, and return its value.

    ``constraints`` are the descriptor's additional_constraints; both they and the description are
    shown by ``ros2 param describe``. The value is the override from the command line or a params
    file, if any. The override is first converted to the default's type where nothing is lost
    (:func:`coerce_value`: an integer for a double, ...); an override of another type is a
    StartupError naming the parameter, not rclpy's exception. An empty list has no element type:
    ``array_type`` (``"double"``, ``"string"``, ...) gives it, and the parameter left unset reads
    back as [].
    """
    from rcl_interfaces.msg import ParameterDescriptor
    from rclpy.exceptions import InvalidParameterTypeException
    from rclpy.parameter import Parameter

    like = default
    if isinstance(default, list) and not default and array_type:
        like = {"double": [0.0], "integer": [0], "string": [""], "bool": [False]}.get(array_type, default)
        default = getattr(Parameter.Type, f"{array_type.upper()}_ARRAY")
    if not dynamic_typing:
        coerce_override(node, name, lambda val: coerce_value(like, val))
    desc = ParameterDescriptor(description=description, read_only=read_only, dynamic_typing=dynamic_typing,
                               additional_constraints=constraints)
    try:
        node.declare_parameter(name, default, desc)
    except InvalidParameterTypeException:
        given = _overrides(node).get(name)
        shown = "[]" if like is not default else repr(default)
        raise StartupError(f"parameter '{name}' must be {_type_words(like)} (default {shown}), got "
                           f"{given!r} ({_type_words(given)})") from None
    return value(node, name)


def declare_all(node, specs: Iterable[Tuple[str, Any, str]], constraints: Optional[Mapping[str, str]] = None,
                array_types: Optional[Mapping[str, str]] = None, section: Optional[type] = None) -> Dict[str, Any]:
    """Declare every ``(name, default, description)``, with its ``constraints[name]`` where given.

    ``array_types[name]``: the element type of an empty list default (:func:`declare`).
    ``section``: the node's schema section; its fields' values are checked against their types,
    ranges and choices (:func:`check_section`). Returns {name: value}.
    """
    constraints, array_types = constraints or {}, array_types or {}
    values = {name: declare(node, name, default, text, constraints=constraints.get(name, ""),
                            array_type=array_types.get(name, ""))
              for name, default, text in specs}
    if section is not None:
        check_section(section, values)
    return values


def check_section(section: type, values: Mapping[str, Any]) -> Any:
    """Return the schema section ``section`` built from a node's parameter ``values`` (its fields' names).

    A value outside its type, range or choices is a StartupError naming the parameter and what it
    must be, before the node does anything with it.
    """
    from dataclasses import fields

    from ..schema import ConfigError

    try:
        return section.from_mapping({f.name: values[f.name] for f in fields(section) if f.name in values}, "")
    except ConfigError as e:
        raise StartupError(f"parameter {e}") from None


def value(node, name: str) -> Any:
    """Return a declared parameter's value; arrays as Python lists, unset arrays as []."""
    from rclpy.exceptions import ParameterUninitializedException

    try:
        val = node.get_parameter(name).value
    except ParameterUninitializedException:
        return []
    if val is None:
        return None
    if hasattr(val, "tolist"):
        return val.tolist()
    if isinstance(val, (tuple, list)):
        return list(val)
    return val


def _overrides(node) -> Dict[str, Any]:
    """Parameter values given to the node at start (params files, ``-p``), by name.

    rclpy keeps them in ``Node._parameter_overrides`` (every release since Foxy).
    """
    return {name: p.value for name, p in getattr(node, "_parameter_overrides", {}).items()}


def config_parameters(node, config_param: str = "config", sections: Sequence[str] = ("simulator",),
                      keys: Sequence[str] = ("urdf", "floating_base")) -> Dict[str, Any]:
    """Return the training/robot configuration of a node, as :func:`diffsim_ros.config.load_yaml` returns it.

    The file named by the ``config_param`` parameter (declared here, default "") is read
    first; then every key in ``keys`` and under ``sections`` that the node was given
    directly overrides it. Those keys are declared here with their description and constraints
    (the simulator's schema, diffsim_ros/schema.py) so that ``ros2 param describe`` explains them.
    Raises ConfigError (naming the file or the key) on a bad file.
    """
    from .. import config as cfgmod
    from ..physics import SimConfig
    from ..schema import describe, entries

    path = declare(node, config_param, "", "training/robot YAML (config/<task>.yaml): urdf, floating_base and the "
                   "simulator section; keys given to the node directly (--params-file, -p) override it")
    params: Dict[str, Any] = cfgmod.load_yaml(path) if path else {}
    docs = {e.name: (describe(e), e.constraints) for e in entries(SimConfig, "simulator")}
    docs.update({"urdf": ("URDF of the robot: absolute, package://pkg/path, or relative to the diffsim_ros share "
                          "folder", ""), "floating_base": ("the root link gets a free-flyer joint (quadrotors) [bool]",
                                                           "")})
    flat = {}
    for name, val in sorted(_overrides(node).items()):
        if name in keys or any(name.startswith(s + ".") for s in sections):
            if not node.has_parameter(name):
                text, limits = docs.get(name, ("configuration key (see the config file's comments)", ""))
                declare(node, name, val, text, dynamic_typing=True, constraints=limits)
            flat[name] = value(node, name)
    if flat:
        cfgmod.merge(params, cfgmod.unflatten(flat))
    return params


# ============================================================================ QoS
def _qos(depth: int, transient_local: bool = False):
    from rclpy.qos import DurabilityPolicy, HistoryPolicy, QoSProfile, ReliabilityPolicy

    return QoSProfile(history=HistoryPolicy.KEEP_LAST, depth=depth, reliability=ReliabilityPolicy.RELIABLE,
                      durability=DurabilityPolicy.TRANSIENT_LOCAL if transient_local else DurabilityPolicy.VOLATILE)


def state_qos(depth: int = 1000):
    """Reliable, volatile, keep last ``depth``: states (/joint_states, /odom, /imu) and recorded topics.

    The recorded topics are the controller's. The deep default is for the publisher side: a reliable
    KEEP_LAST writer drops unacknowledged samples beyond its depth, so depth 1000 lets a recorder
    stall 2 s at 500 Hz unharmed (a lockstep plant under the emergency stop runs faster than that,
    and a loaded 2-core machine stalled a recorder past depth 100).
    """
    return _qos(depth)


def flush_publishers(publishers, timeout_s: float = 5.0) -> List[str]:
    """At shutdown, wait until every reliable subscriber has acknowledged what ``publishers`` sent.

    The wait is at most ``timeout_s`` in all, so that a recorder gets the last messages before the
    process exits. Returns the topics still unacknowledged at the deadline.
    """
    from rclpy.duration import Duration

    end = time.monotonic() + timeout_s
    late = []
    for pub in publishers:
        if pub is None:
            continue
        try:
            ok = pub.wait_for_all_acked(Duration(seconds=max(end - time.monotonic(), 0.0)))
        except Exception:  # noqa: BLE001 - best effort at shutdown (e.g. an RMW without the call)
            ok = True
        if not ok:
            late.append(pub.topic_name)
    return late


def command_qos(depth: int = 10):
    """Reliable, volatile, keep last ``depth``: commands (a lost command is a lost control step)."""
    return _qos(depth)


def latched_qos(depth: int = 1):
    """Reliable, transient local: late subscribers get the last message (/diffsim/metadata)."""
    return _qos(depth, transient_local=True)


def recorder_qos(depth: int = 1000, transient_local: bool = False):
    """Reliable with a deep history.

    A burst at 500 Hz then waits in the queue instead of being dropped while the recorder writes.
    """
    return _qos(depth, transient_local)


# ============================================================================ time
def stamp_from_ns(ns: int):
    from builtin_interfaces.msg import Time

    ns = int(ns)
    return Time(sec=ns // 1_000_000_000, nanosec=ns % 1_000_000_000)


def stamp(t: float):
    """builtin_interfaces/Time of ``t`` seconds (rounded to the nanosecond)."""
    return stamp_from_ns(int(round(t * 1e9)))


def stamp_to_ns(s) -> int:
    return int(s.sec) * 1_000_000_000 + int(s.nanosec)


def clock_msg(t: float):
    from rosgraph_msgs.msg import Clock

    return Clock(clock=stamp(t))


# ============================================================================ messages
def _floats(values) -> List[float]:
    return [float(x) for x in np.asarray(values, dtype=np.float64).reshape(-1)]


def joint_state_msg(names: Sequence[str], position, velocity=None, effort=None, t: Optional[float] = None,
                    frame_id: str = ""):
    """sensor_msgs/JointState with ``header.stamp`` = ``t`` (s)."""
    from sensor_msgs.msg import JointState

    msg = JointState()
    if t is not None:
        msg.header.stamp = stamp(t)
    msg.header.frame_id = frame_id
    msg.name = list(names)
    msg.position = _floats(position)
    msg.velocity = _floats(velocity) if velocity is not None else []
    msg.effort = _floats(effort) if effort is not None else []
    return msg


def joint_state_arrays(msg, names: Sequence[str]) -> Tuple[np.ndarray, Optional[np.ndarray], Optional[np.ndarray]]:
    """Positions (and velocities, efforts when present) of ``names`` from a JointState, by name.

    MessageError when a joint is missing, a field's length differs from ``name``'s, a name
    repeats, or a used value is not finite.
    """
    got = list(msg.name)
    n = len(got)
    if len(set(got)) != n:
        raise MessageError(f"JointState.name repeats a joint: {got}")
    if len(msg.position) != n:
        raise MessageError(f"JointState.position has {len(msg.position)} entries for {n} names")
    for field in ("velocity", "effort"):
        k = len(getattr(msg, field))
        if k not in (0, n):
            raise MessageError(f"JointState.{field} has {k} entries for {n} names")
    missing = [j for j in names if j not in got]
    if missing:
        raise MessageError(f"JointState lacks joints {missing} (it names {got})")
    idx = [got.index(j) for j in names]
    out = []
    for field in ("position", "velocity", "effort"):
        vals = getattr(msg, field)
        if len(vals) == 0:
            out.append(None)
            continue
        arr = np.asarray(vals, dtype=np.float64)[idx]
        bad = [names[i] for i in np.flatnonzero(~np.isfinite(arr))]
        if bad:
            raise MessageError(f"JointState.{field} is not finite for {bad}")
        out.append(arr)
    return out[0], out[1], out[2]


def float64_array(msg, size: Optional[int] = None, what: str = "command") -> np.ndarray:
    """Return the data of a Float64MultiArray as a float64 array.

    MessageError on a wrong length or a non-finite entry.
    """
    arr = np.asarray(msg.data, dtype=np.float64).reshape(-1)
    if size is not None and arr.size != size:
        raise MessageError(f"{what}: Float64MultiArray.data has {arr.size} entries, expected {size}")
    bad = np.flatnonzero(~np.isfinite(arr))
    if bad.size:
        raise MessageError(f"{what}: Float64MultiArray.data[{int(bad[0])}] is {arr[bad[0]]} (not finite)")
    return arr


def trajectory_point(msg, names: Sequence[str]) -> Tuple[np.ndarray, Optional[np.ndarray]]:
    """Positions (and velocities if given) of ``names`` from a trajectory_msgs/JointTrajectory.

    They are taken from the first point of the trajectory, by joint name (MessageError otherwise).
    """
    got = list(msg.joint_names)
    if not msg.points:
        raise MessageError("JointTrajectory has no points")
    missing = [j for j in names if j not in got]
    if missing:
        raise MessageError(f"JointTrajectory lacks joints {missing} (it names {got})")
    pt = msg.points[0]
    if len(pt.positions) != len(got):
        raise MessageError(f"JointTrajectory.points[0].positions has {len(pt.positions)} entries for "
                           f"{len(got)} joint_names")
    idx = [got.index(j) for j in names]
    pos = np.asarray(pt.positions, dtype=np.float64)[idx]
    vel = None
    if len(pt.velocities):
        if len(pt.velocities) != len(got):
            raise MessageError(f"JointTrajectory.points[0].velocities has {len(pt.velocities)} entries for "
                               f"{len(got)} joint_names")
        vel = np.asarray(pt.velocities, dtype=np.float64)[idx]
    for what, arr in (("positions", pos), ("velocities", vel)):
        if arr is not None and not np.isfinite(arr).all():
            bad = [names[i] for i in np.flatnonzero(~np.isfinite(arr))]
            raise MessageError(f"JointTrajectory.points[0].{what} is not finite for {bad}")
    return pos, vel


def _vec3(msg_vec, values):
    msg_vec.x, msg_vec.y, msg_vec.z = (float(x) for x in values)


def odometry_msg(t: float, position, orientation_xyzw, linear_velocity_body, angular_velocity,
                 frame_id: str = "world", child_frame_id: str = "base_link"):
    """nav_msgs/Odometry: pose in ``frame_id``, twist in the body (child) frame (REP-105)."""
    from nav_msgs.msg import Odometry

    msg = Odometry()
    msg.header.stamp = stamp(t)
    msg.header.frame_id = frame_id
    msg.child_frame_id = child_frame_id
    _vec3(msg.pose.pose.position, position)
    o = msg.pose.pose.orientation
    o.x, o.y, o.z, o.w = (float(x) for x in orientation_xyzw)
    _vec3(msg.twist.twist.linear, linear_velocity_body)
    _vec3(msg.twist.twist.angular, angular_velocity)
    return msg


def have_tf2_msgs() -> bool:
    """tf2_msgs comes with a ROS 2 install; the PyPI ROS wheels used here do not include it."""
    try:
        import tf2_msgs.msg  # noqa: F401
    except ImportError:
        return False
    return True


def tf_message(t: float, transforms: Sequence[Tuple[str, str, Sequence[float], Sequence[float]]]):
    """tf2_msgs/TFMessage: one geometry_msgs/TransformStamped per transform, stamped ``t``.

    A transform is (parent frame, child frame, translation x y z in the parent frame (m), rotation
    quaternion x y z w).
    """
    from geometry_msgs.msg import TransformStamped
    from tf2_msgs.msg import TFMessage

    msg = TFMessage()
    st = stamp(t)
    for parent, child, xyz, quat in transforms:
        tr = TransformStamped()
        tr.header.stamp = st
        tr.header.frame_id = parent
        tr.child_frame_id = child
        _vec3(tr.transform.translation, xyz)
        r = tr.transform.rotation
        r.x, r.y, r.z, r.w = (float(x) for x in quat)
        msg.transforms.append(tr)
    return msg


def string_msg(text: str):
    """std_msgs/String."""
    from std_msgs.msg import String

    msg = String()
    msg.data = text
    return msg


def imu_msg(t: float, orientation_xyzw, angular_velocity, specific_force, frame_id: str = "base_link"):
    """sensor_msgs/Imu: orientation x y z w, body rates (rad/s), body specific force (m/s^2)."""
    from sensor_msgs.msg import Imu

    msg = Imu()
    msg.header.stamp = stamp(t)
    msg.header.frame_id = frame_id
    o = msg.orientation
    o.x, o.y, o.z, o.w = (float(x) for x in orientation_xyzw)
    _vec3(msg.angular_velocity, angular_velocity)
    _vec3(msg.linear_acceleration, specific_force)
    return msg


# ============================================================================ process
#: The executors a node can ask for by its ``executor_kind`` attribute (run_node's loop).
EXECUTORS = ("events", "single_threaded")


def make_executor(kind: str):
    """Return rclpy's EventsExecutor (``events``) or SingleThreadedExecutor.

    The EventsExecutor queues ready entities from C++ and calls their callbacks without rebuilding a
    wait set per message.
    """
    if kind == "events":
        from rclpy.experimental import EventsExecutor

        return EventsExecutor()
    if kind == "single_threaded":
        from rclpy.executors import SingleThreadedExecutor

        return SingleThreadedExecutor()
    raise ValueError(f"executor must be one of {', '.join(EXECUTORS)}, got {kind!r}")


def run_node(factory: Callable[[], Any], args: Optional[List[str]] = None, name: str = "node") -> int:
    """Run a node until SIGINT or SIGTERM; returns the exit status.

    ``factory()`` builds the node after ``rclpy.init``; a StartupError or ConfigError
    raised there is printed as ``<name>: error: ...`` (status 2). Our own signal handlers
    (rclpy's are disabled) only set a flag; the loop then calls the node's ``close()`` if
    it has one (flush files, stop timers), destroys the node and shuts rclpy down, so a
    signal never interrupts a callback half-way. A node with a ``drain_seconds`` attribute
    keeps being spun that long after the signal (queued messages are taken) before close.
    """
    import rclpy
    from rclpy.executors import ExternalShutdownException
    from rclpy.signals import SignalHandlerOptions

    if os.environ.get("DIFFSIM_DIE_WITH_PARENT") == "1":
        # Started by `diffsim-ros loop` through ros2 launch: SIGTERM when launch dies, even by SIGKILL.
        from ..workflows.loop import die_with_parent

        die_with_parent()
    rclpy.init(args=args, signal_handler_options=SignalHandlerOptions.NO)
    stop = threading.Event()
    received: List[int] = []

    def on_signal(signum, frame):
        received.append(signum)
        stop.set()
    old = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    node = None
    status = 0
    try:
        try:
            node = factory()
        except Exception as e:
            # Bad configuration (StartupError, physics.ConfigError naming the key) is reported
            # without a traceback; anything else is a bug and keeps its traceback.
            phys = sys.modules.get("diffsim_ros.physics.quadrotor")
            expected = (StartupError, MessageError) + ((phys.ConfigError,) if phys is not None else ())
            if not isinstance(e, expected):
                raise
            print(f"{name}: error: {e}", file=sys.stderr, flush=True)
            return 2
        executor = make_executor(getattr(node, "executor_kind", "single_threaded"))
        executor.add_node(node)
        # What start-up allocated (the model, the task, compiled code) is never collected: frozen,
        # a full collection scans only what the loop allocates since, not a pause of tens of ms.
        gc.collect()
        gc.freeze()
        while not stop.is_set() and rclpy.ok():
            executor.spin_once(timeout_sec=0.05)
        if received:
            node.get_logger().info(f"{signal.Signals(received[0]).name} received: shutting down")
        # Messages already queued (e.g. the last ones before the signal) are taken for
        # node.drain_seconds; a second signal cuts the drain short.
        end = time.monotonic() + float(getattr(node, "drain_seconds", 0.0) or 0.0)
        while time.monotonic() < end and len(received) < 2 and rclpy.ok():
            executor.spin_once(timeout_sec=0.02)
    except (KeyboardInterrupt, ExternalShutdownException):
        pass
    finally:
        if node is not None:
            close = getattr(node, "close", None)
            if callable(close):
                try:
                    close()
                except Exception as e:  # report, but still shut down cleanly
                    print(f"{name}: error while closing: {e}", file=sys.stderr, flush=True)
                    status = 1
            try:
                node.destroy_node()
            except Exception:
                pass
        for s, h in old.items():
            signal.signal(s, h)
        if rclpy.ok():
            rclpy.try_shutdown()
    return status


def resolve_path(path: str) -> Path:
    """Resolve a file parameter: absolute, relative to the working directory, or to the share folder.

    The share folder is diffsim_ros's (config/..., policies/...); the path is returned unchanged
    when none exists.
    """
    p = Path(os.path.expanduser(path))
    if p.is_absolute() or p.exists():
        return p
    from ..config import package_share

    share = package_share()
    if share is not None and (share / p).exists():
        return share / p
    return p
