"""``diffsim-ros preflight``: a robot's topics (live for a few seconds, or a bag) against a checkpoint.

    report = run_preflight("policies/reach_arm", seconds=3.0)          # live, over DDS
    report = run_preflight("policies/reach_arm", bag="runs/x/bag")     # a recording
    print(report.text()); sys.exit(0 if report.go else 1)

The checks are control/preflight.py's (joint names and order, limits, state rate and jitter,
stamp age, frames, the IMU where the policy needs one, a subscriber on the command topic);
this module gathers what they judge. Live, it subscribes the state topics (and /clock, whose
time a simulator's stamps follow) for ``seconds`` and counts the command topic's subscribers.
From a bag, receive times are the bag's timestamps, and the command topic's subscribers are not
known (a warning, not a failure).
"""
from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple, Union

from .. import interfaces as ifc
from ..control.preflight import FrameSample, JointSample, Observed, PreflightReport, preflight

__all__ = ["run_preflight", "observe_live", "observe_bag", "default_command_topic"]


def default_command_topic(runner) -> str:
    """Return the topic policy_controller commands this checkpoint's robot on by default."""
    if runner.kind == "quadrotor":
        return {"ctbr": ifc.CMD_CTBR, "rotor_thrust": ifc.CMD_ROTOR_THRUST}.get(runner.interface, ifc.CMD_CTBR)
    return {"position": ifc.CONTROLLER_COMMANDS[0], "velocity": ifc.CONTROLLER_COMMANDS[1],
            "effort": ifc.CONTROLLER_COMMANDS[2]}[runner.interface]


def _stamp(header) -> int:
    return int(header.stamp.sec) * 1_000_000_000 + int(header.stamp.nanosec)


def _imu(t: int, m) -> FrameSample:
    o = m.orientation
    return FrameSample(t, _stamp(m.header), m.header.frame_id, "", [o.x, o.y, o.z, o.w])


def _odom(t: int, m) -> FrameSample:
    o = m.pose.pose.orientation
    return FrameSample(t, _stamp(m.header), m.header.frame_id, m.child_frame_id, [o.x, o.y, o.z, o.w])


def _clock(t: int, m) -> tuple:
    return (t, int(m.clock.sec) * 1_000_000_000 + int(m.clock.nanosec))


def _joints(t: int, m) -> JointSample:
    return JointSample(t, _stamp(m.header), list(m.name), list(m.position))


def observe_bag(path: Union[str, os.PathLike], joint_states_topic: str = ifc.JOINT_STATES,
                imu_topic: str = ifc.IMU, odom_topic: str = ifc.ODOM, command_topic: str = "") -> Observed:
    """Read what a bag's state topics held, receive times from the bag."""
    from ..analysis.bag import _messages, _opened

    path = Path(os.fspath(path))
    seen = Observed(duration_s=0.0, command_topic=command_topic, source=f"bag {path}")
    # topic: (message -> sample, the list of Observed it goes to)
    convert: Dict[str, Tuple[Callable[[int, Any], Any], List[Any]]] = {
        joint_states_topic: (_joints, seen.joint_states), imu_topic: (_imu, seen.imu),
        odom_topic: (_odom, seen.odom), ifc.CLOCK: (_clock, seen.clock)}
    times = []
    with _opened(path) as reader:
        conns = [c for c in reader.connections if c.topic in convert]
        for conn in conns:
            fn, into = convert[conn.topic]
            for t, msg in _messages(reader, path, [conn], conn.topic):
                into.append(fn(int(t), msg))
                times.append(int(t))
    if times:
        seen.duration_s = (max(times) - min(times)) / 1e9
    return seen


def observe_live(seconds: float, joint_states_topic: str = ifc.JOINT_STATES, imu_topic: str = ifc.IMU,
                 odom_topic: str = ifc.ODOM, command_topic: str = "", domain_id: Optional[int] = None,
                 discovery_s: float = 5.0) -> Observed:
    """Subscribe the state topics for ``seconds`` from the first state message.

    It waits up to ``discovery_s`` for that message (DDS discovery), takes their receive time on
    this machine's clock, and counts the subscribers of ``command_topic`` at the end.
    """
    import rclpy
    from nav_msgs.msg import Odometry
    from rclpy.executors import SingleThreadedExecutor
    from rclpy.qos import QoSProfile, ReliabilityPolicy
    from rosgraph_msgs.msg import Clock
    from sensor_msgs.msg import Imu, JointState

    ctx = rclpy.context.Context()
    rclpy.init(context=ctx, domain_id=None if domain_id is None else int(domain_id))  # None: ROS_DOMAIN_ID
    seen = Observed(duration_s=float(seconds), command_topic=command_topic, source="live")
    try:
        node = rclpy.create_node(f"diffsim_preflight_{os.getpid()}", context=ctx)
        # Best effort matches both a reliable and a best-effort publisher (a robot's IMU often is).
        qos = QoSProfile(depth=100, reliability=ReliabilityPolicy.BEST_EFFORT)
        node.create_subscription(JointState, joint_states_topic,
                                 lambda m: seen.joint_states.append(_joints(time.time_ns(), m)), qos)
        node.create_subscription(Imu, imu_topic, lambda m: seen.imu.append(_imu(time.time_ns(), m)), qos)
        node.create_subscription(Odometry, odom_topic, lambda m: seen.odom.append(_odom(time.time_ns(), m)), qos)
        node.create_subscription(Clock, ifc.CLOCK, lambda m: seen.clock.append(_clock(time.time_ns(), m)), qos)
        ex = SingleThreadedExecutor(context=ctx)
        ex.add_node(node)
        # Discovery first: the window starts at the first state message (or after discovery_s).
        start = time.monotonic() + float(discovery_s)
        while time.monotonic() < start and not (seen.joint_states or seen.imu or seen.odom):
            ex.spin_once(timeout_sec=0.01)
        end = time.monotonic() + float(seconds)
        while time.monotonic() < end:
            ex.spin_once(timeout_sec=0.01)
        if command_topic:
            seen.command_subscribers = int(node.count_subscribers(command_topic))
        ex.shutdown()
        node.destroy_node()
    finally:
        rclpy.shutdown(context=ctx)
    return seen


def run_preflight(checkpoint: Union[str, os.PathLike], bag: Optional[Union[str, os.PathLike]] = None,
                  seconds: float = 3.0, joint_states_topic: str = ifc.JOINT_STATES, imu_topic: str = ifc.IMU,
                  odom_topic: str = ifc.ODOM, command_topic: Optional[str] = None, **limits) -> PreflightReport:
    """Load the checkpoint, gather the topics and judge them.

    The checkpoint is loaded as a PolicyRunner (it refuses another robot's URDF); the topics come
    from a bag, else live for ``seconds``; they are judged by control.preflight.preflight
    (``limits`` its settings).
    """
    from ..learning.deploy import PolicyRunner

    runner = PolicyRunner(checkpoint)
    topic = default_command_topic(runner) if command_topic is None else command_topic
    if bag is not None:
        seen = observe_bag(bag, joint_states_topic=joint_states_topic, imu_topic=imu_topic, odom_topic=odom_topic,
                           command_topic=topic)
    else:
        seen = observe_live(seconds, joint_states_topic=joint_states_topic, imu_topic=imu_topic,
                            odom_topic=odom_topic, command_topic=topic)
    return preflight(runner, seen, **limits)
