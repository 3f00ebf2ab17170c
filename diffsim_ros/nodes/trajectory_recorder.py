"""trajectory_recorder: records the topics of doc/interfaces.md into a rosbag2 (MCAP) bag.

    ros2 run diffsim_ros trajectory_recorder --ros-args -p output_dir:=bags/hover_run1

Written with analysis.bagfile.McapBagWriter (the ``mcap`` package's writer in the
rosbag2 layout: metadata.yaml version 9, MCAP profile ros2, no rosbag2_py needed); every
connection carries its message definition from the rosbags typestore (``typestore``
parameter, default ros2_kilted), so the bag is self-describing (``ros2 bag info``,
Foxglove, PlotJuggler, rosbags).

* Messages are taken serialized (``raw=True``: rclpy hands over the CDR bytes) and
  written unchanged; the bag timestamp is the receive time (ns, this node's clock).
* A topic is subscribed once a publisher for it appears in the graph (its type and QoS
  from the graph: best-effort publishers get a best-effort subscription), or at once when
  its type is given in ``types``. ``latched_topics`` (default /diffsim/metadata) are
  subscribed transient-local so that the latched metadata is recorded even when it was
  published before the recorder started.
* No loss at 500 Hz: reliable subscriptions with a deep history (``qos_depth``) keep a
  burst queued while the callback writes.
* Crash tolerance: metadata.yaml is written when recording starts and rewritten at every
  flush; messages are flushed to disk (chunk with CRC, fsync) at most ``flush_period_s``
  after they arrive, so SIGKILL or a power loss loses at most that much.
  ``diffsim-ros bag repair BAG`` then rebuilds the index and summary the killed process
  could not write.
* SIGINT and SIGTERM: the node keeps taking queued messages for ``drain_s``, then closes
  the writer (chunks flushed, summary and metadata.yaml written): the bag reads back.
* The output directory must not exist, unless ``overwrite`` is true and it holds a bag
  (a metadata.yaml or *.mcap file) or is empty; anything else is refused.
"""
from __future__ import annotations

import importlib
import os
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Dict, List, Optional, Sequence, Tuple

from .. import interfaces as ifc
from ..schema import normalise, option, ros_constraints, ros_parameters, section
from . import common

NODE_NAME = "trajectory_recorder"

#: What the node uses of rclpy (and the bag writer), imported into ``ros`` by make_node_class():
#: importing this module needs no rclpy.
_ROS = {"rclpy.node": "Node", "rclpy.qos": "DurabilityPolicy ReliabilityPolicy",
        "diffsim_ros.analysis.bagfile": "McapBagWriter"}
ros = SimpleNamespace()

# doc/interfaces.md: states, commands, predictions, bookkeeping.
DEFAULT_TOPICS = [
    ifc.JOINT_STATES, ifc.ODOM, ifc.IMU, *ifc.CONTROLLER_COMMANDS, ifc.JOINT_TRAJECTORY, ifc.CMD_CTBR,
    ifc.CMD_ROTOR_THRUST, ifc.CMD_VEL_LEGACY, ifc.PREDICTED_STATE, ifc.COMMAND, ifc.METADATA, ifc.DIAGNOSTICS,
]

@section("trajectory_recorder", node=True)
@dataclass(frozen=True)
class TrajectoryRecorderParameters:
    """trajectory_recorder's parameters."""

    output_dir: str = option("", "bag directory to create (rosbag2, MCAP storage); empty: ./diffsim_<UTC date_time>")
    overwrite: bool = option(False, "replace output_dir if it already holds a bag (otherwise an existing output_dir "
                             "is an error)")
    topics: Tuple[str, ...] = option(tuple(DEFAULT_TOPICS), "topics to record (doc/interfaces.md); each is "
                                     "subscribed when a publisher appears, or at once when its type is given in "
                                     "'types'")
    types: Tuple[str, ...] = option(("",), "'topic:package/msg/Type' entries: types known up front (subscribed at "
                                    "start, no discovery wait), e.g. /joint_states:sensor_msgs/msg/JointState")
    latched_topics: Tuple[str, ...] = option((ifc.METADATA,), "topics subscribed transient-local (latched "
                                             "publishers)")
    qos_depth: int = option(1000, "history depth of the reliable subscriptions (messages queued while writing)",
                            low=1)
    discovery_period_s: float = option(0.1, "period of the graph polling for publishers of the topics", "s", above=0)
    drain_s: float = option(0.5, "on SIGINT/SIGTERM, time spent taking the messages already queued before closing",
                            "s")
    flush_period_s: float = option(1.0, "longest time a received message waits before it is on disk (chunk written, "
                                   "fsync): what SIGKILL or a power loss can lose", "s", above=0)
    typestore: str = option("ros2_kilted", "rosbags typestore giving the message definitions (ros2_kilted, "
                            "ros2_jazzy, ros2_humble, latest, ...)")

    def __post_init__(self):
        normalise(self)

#: (name, default, description), from the section above.
PARAMETERS = ros_parameters(TrajectoryRecorderParameters, "")
CONSTRAINTS = ros_constraints(TrajectoryRecorderParameters, "")


def default_output_dir() -> str:
    return "diffsim_" + time.strftime("%Y%m%d_%H%M%S", time.gmtime())


def prepare_output(path: Path, overwrite: bool) -> None:
    """Refuse an existing ``path`` unless ``overwrite`` and it is a bag or empty (then remove it)."""
    if not path.exists():
        return
    if not overwrite:
        raise common.StartupError(f"parameter 'output_dir': {path} exists already; not overwriting it "
                                  f"(choose another directory or set overwrite:=true)")
    if not path.is_dir():
        raise common.StartupError(f"parameter 'output_dir': {path} exists and is not a directory; not removing it")
    entries = list(path.iterdir())
    is_bag = any(e.name == "metadata.yaml" or e.suffix in (".mcap", ".db3") for e in entries)
    if entries and not is_bag:
        raise common.StartupError(f"parameter 'output_dir': {path} exists and is not a bag (no metadata.yaml or "
                                  f"*.mcap); not removing it even with overwrite:=true")
    shutil.rmtree(path)


def given_types(entries: Sequence[str], topics: List[str]) -> Dict[str, str]:
    """Return {topic: 'package/msg/Type'} of parameter 'types'.

    The parameter holds 'topic:package/msg/Type' entries; empty ones are skipped. Each topic not in
    ``topics`` is appended to it.
    """
    given: Dict[str, str] = {}
    for entry in entries:
        if not entry:
            continue
        topic, sep, msgtype = entry.rpartition(":")
        if not sep or not topic or msgtype.count("/") != 2:
            raise common.StartupError(f"parameter 'types': '{entry}' is not 'topic:package/msg/Type'")
        given[topic] = msgtype
        if topic not in topics:
            topics.append(topic)
    return given


def make_typestore(name: str):
    from rosbags.typesys import Stores, get_typestore

    try:
        return get_typestore(Stores(name.lower()))
    except ValueError:
        known = ", ".join(s.value for s in Stores)
        raise common.StartupError(f"parameter 'typestore': unknown '{name}' (rosbags knows: {known})") from None


def _msg_search_dirs() -> List[Path]:
    dirs = [Path(p) / "share" for p in os.environ.get("AMENT_PREFIX_PATH", "").split(os.pathsep) if p]
    dirs.append(Path(sys.prefix) / "share")
    return dirs


def ensure_type(typestore, msgtype: str, _depth: int = 0) -> None:
    """Register ``msgtype`` (and the types it uses) in ``typestore`` when the typestore lacks it.

    The definitions come from the installed ``share/<pkg>/msg/<Type>.msg`` files.
    """
    from rosbags.typesys import get_types_from_msg

    if msgtype in typestore.fielddefs:
        return
    if _depth > 20:
        raise LookupError(f"message type {msgtype}: definitions nest too deeply")
    pkg, _, name = msgtype.split("/")
    for d in _msg_search_dirs():
        f = d / pkg / "msg" / f"{name}.msg"
        if f.is_file():
            types = get_types_from_msg(f.read_text(), msgtype)
            typestore.register(types)
            break
    else:
        raise LookupError(f"message type {msgtype}: not in the rosbags typestore and no {pkg}/msg/{name}.msg "
                          f"installed")
    for field in typestore.fielddefs[msgtype][1]:
        for sub in _nested_types(field[1]):
            ensure_type(typestore, sub, _depth + 1)


def _nested_types(desc) -> List[str]:
    """Message type names inside a rosbags field description (nested, arrays, sequences)."""
    out = []
    if isinstance(desc, tuple):
        for x in desc:
            if isinstance(x, str) and x.count("/") == 2:
                out.append(x)
            elif isinstance(x, tuple):
                out.extend(_nested_types(x))
    return out


def message_class(msgtype: str):
    """Return the rclpy message class of 'pkg/msg/Type'."""
    pkg, kind, name = msgtype.split("/")
    return getattr(importlib.import_module(f"{pkg}.{kind}"), name)


def _qos_to_rosbags(qos):
    """Convert an rclpy QoSProfile to a rosbags Qos (for the bag's offered_qos_profiles)."""
    from rclpy.qos import DurabilityPolicy, HistoryPolicy, ReliabilityPolicy
    from rosbags.interfaces import Qos, QosDurability, QosHistory, QosLiveliness, QosReliability, QosTime

    zero = QosTime(0, 0)
    rel = {ReliabilityPolicy.RELIABLE: QosReliability.RELIABLE,
           ReliabilityPolicy.BEST_EFFORT: QosReliability.BEST_EFFORT}.get(qos.reliability,
                                                                          QosReliability.SYSTEM_DEFAULT)
    dur = {DurabilityPolicy.TRANSIENT_LOCAL: QosDurability.TRANSIENT_LOCAL,
           DurabilityPolicy.VOLATILE: QosDurability.VOLATILE}.get(qos.durability, QosDurability.SYSTEM_DEFAULT)
    hist = {HistoryPolicy.KEEP_LAST: QosHistory.KEEP_LAST,
            HistoryPolicy.KEEP_ALL: QosHistory.KEEP_ALL}.get(qos.history, QosHistory.SYSTEM_DEFAULT)
    return Qos(hist, int(qos.depth), rel, dur, zero, zero, QosLiveliness.AUTOMATIC, zero, False)


def make_node_class():
    """Build the rclpy Node subclass (built lazily so that importing this module needs no rclpy)."""
    for module, names in _ROS.items():
        ros.__dict__.update((n, getattr(importlib.import_module(module), n)) for n in names.split())
    return type("TrajectoryRecorder", (_TrajectoryRecorderLogic, ros.Node), {"__module__": __name__})


class _TrajectoryRecorderLogic:
    """The node's side of trajectory_recorder (parameters, subscriptions, timers).

    It is mixed into rclpy's Node by make_node_class(); the bag is analysis.bagfile.McapBagWriter's.
    """

    def __init__(self, **kw):
        super().__init__(NODE_NAME, **kw)          # rclpy.node.Node, next in the class built by make_node_class
        p = common.declare_all(self, PARAMETERS, CONSTRAINTS, section=TrajectoryRecorderParameters)
        self.p = p
        out = Path(p["output_dir"] or default_output_dir())
        prepare_output(out, bool(p["overwrite"]))
        self._read_topics()
        self.drain_seconds = float(p["drain_s"])
        self.path = out
        flush_period = self._open_writer(out)
        self._start_discovery(flush_period)
        self.get_logger().info(f"recording to {out} (MCAP): {', '.join(self.topics)}")

    # -------------------------------------------------------------- start-up
    def _read_topics(self) -> None:
        """Read the typestore, the topics to record, the latched ones, the depth and the types given."""
        p = self.p
        self.typestore = make_typestore(p["typestore"])
        self.topics = [t for t in p["topics"] if t]
        self.latched = set(t for t in p["latched_topics"] if t)
        self.depth = int(p["qos_depth"])
        if self.depth < 1:
            raise common.StartupError(f"parameter 'qos_depth' must be >= 1, got {self.depth}")
        self.given: Dict[str, str] = given_types(p["types"], self.topics)

    def _open_writer(self, out: Path) -> float:
        """Open the bag (metadata.yaml written); returns the flush period, s."""
        flush_period = float(self.p["flush_period_s"])
        if not flush_period > 0:
            raise common.StartupError(f"parameter 'flush_period_s' must be > 0, got {flush_period}")
        self.writer = ros.McapBagWriter(out, flush_period_s=flush_period)
        self.writer.open()
        self.subs = {}
        self.connections = {}
        self.counts: Dict[str, int] = {}
        self.closed = False
        return flush_period

    def _start_discovery(self, flush_period: float) -> None:
        """Subscribe the given types at once, the others when a publisher appears (the discovery timer)."""
        for topic, msgtype in self.given.items():
            self._subscribe(topic, msgtype, None)
        period = float(self.p["discovery_period_s"])
        if not period > 0:
            raise common.StartupError(f"parameter 'discovery_period_s' must be > 0, got {period}")
        self._discover()
        self.discovery = self.create_timer(period, self._discover)
        # Flushes when messages stop coming (write() flushes while they come).
        self.flush_timer = self.create_timer(flush_period / 4, self._tick)

    # -------------------------------------------------------------- subscriptions
    def _subscribe(self, topic: str, msgtype: str, publishers) -> None:
        try:
            ensure_type(self.typestore, msgtype)
            cls = message_class(msgtype)
        except (LookupError, ImportError, AttributeError, ValueError) as e:
            self.get_logger().error(f"not recording {topic}: {e}")
            self.subs[topic] = None
            return
        qos = common.recorder_qos(self.depth, transient_local=topic in self.latched)
        offered = [i.qos_profile for i in publishers or []]
        if offered:
            # Match what is offered: a reliable subscription would not match a best-effort
            # publisher, nor a transient-local one a volatile publisher.
            if any(q.reliability == ros.ReliabilityPolicy.BEST_EFFORT for q in offered):
                qos.reliability = ros.ReliabilityPolicy.BEST_EFFORT
            if all(q.durability == ros.DurabilityPolicy.TRANSIENT_LOCAL for q in offered):
                qos.durability = ros.DurabilityPolicy.TRANSIENT_LOCAL
            elif qos.durability == ros.DurabilityPolicy.TRANSIENT_LOCAL:
                qos.durability = ros.DurabilityPolicy.VOLATILE
        conn = self.writer.add_connection(topic, msgtype, typestore=self.typestore,
                                          offered_qos_profiles=[_qos_to_rosbags(q) for q in offered] or
                                          [_qos_to_rosbags(qos)])
        self.connections[topic] = conn
        self.counts[topic] = 0
        self.subs[topic] = self.create_subscription(cls, topic, lambda data, t=topic: self._on_message(t, data),
                                                    qos, raw=True)
        self.get_logger().info(f"recording {topic} [{msgtype}]")

    def _discover(self) -> None:
        pending = [t for t in self.topics if t not in self.subs]
        if not pending:
            self.discovery.cancel() if hasattr(self, "discovery") else None
            return
        for topic in pending:
            pubs = self.get_publishers_info_by_topic(topic)
            if not pubs:
                continue
            types = sorted(set(i.topic_type for i in pubs))
            if len(types) > 1:
                self.get_logger().warning(f"{topic} is published with several types {types}; recording "
                                          f"{types[0]}", throttle_duration_sec=10.0)
            self._subscribe(topic, types[0], pubs)

    def _on_message(self, topic: str, data: bytes) -> None:
        if self.closed:
            return
        stamp = self.get_clock().now().nanoseconds
        try:
            self.writer.write(self.connections[topic], stamp, data)
            self.counts[topic] += 1
        except Exception as e:  # never let one bad write stop the recording
            self.get_logger().error(f"{topic}: write failed: {e}", throttle_duration_sec=1.0)

    def _tick(self) -> None:
        if self.closed:
            return
        try:
            self.writer.tick()
        except Exception as e:
            self.get_logger().error(f"flush failed: {e}", throttle_duration_sec=1.0)

    # -------------------------------------------------------------- shutdown
    def close(self) -> None:
        """Flush and close the bag (run_node calls this after SIGINT/SIGTERM and the drain)."""
        if self.closed:
            return
        self.closed = True
        self.writer.close()
        total = sum(self.counts.values())
        detail = ", ".join(f"{t}: {n}" for t, n in self.counts.items())
        self.get_logger().info(f"closed {self.path}: {total} messages ({detail})")


def main(args: Optional[List[str]] = None) -> int:
    def factory():
        return make_node_class()()
    sys.exit(common.run_node(factory, args=args, name=NODE_NAME))


if __name__ == "__main__":
    main()
