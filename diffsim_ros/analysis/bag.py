"""rosbag2 reading and writing for the analysis, with the ``rosbags`` library (no ROS install).

Layout (doc/interfaces.md): states on ``/joint_states`` (sensor_msgs/JointState, arms)
or ``/odom`` (nav_msgs/Odometry, quadrotors; twist in the body frame) and ``/imu``, or
both for a legged robot (its state is the pair of nearest stamp);
commands on ``/diffsim/command`` (std_msgs/Float64MultiArray in the simulator's own
interface, ``layout.dim[0].label`` = the stamp in ns of the state it was computed
from) or on the interface topics (``/cmd_ctbr``, ``/cmd_rotor_thrust``,
``/<controller>/commands``); predictions on ``/diffsim/predicted_state``; and the
latched JSON ``/diffsim/metadata``.

    data = read_bag("run1")                 # BagData: arrays in model order + timing report
    with BagWriter("out", storage="mcap") as w:
        w.metadata({...}); w.joint_state(t_ns, names, q, v); w.command(t_ns, values, state_ns)

Both MCAP and sqlite3 storage are read (rosbags' AnyReader picks the plugin).
Every problem is an :class:`AnalysisError` naming the bag and the topic or field.
"""
from __future__ import annotations

import contextlib
import json
import os
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from . import cdr
from .errors import AnalysisError

# Default topic names and their types (doc/interfaces.md).
from ..interfaces import (CMD_CTBR, CMD_ROTOR_THRUST, COMMAND, CONTROLLER_COMMANDS, FLOAT64_ARRAY_T, IMU,  # noqa: E402
                          IMU_T, JOINT_STATE_T, JOINT_STATES, METADATA, ODOM, ODOMETRY_T, STRING_T, TWIST_STAMPED_T)
from ..interfaces import PREDICTED_STATE as PREDICTED  # noqa: E402

#: Velocity components of a floating base, as nav_msgs/Odometry's body-frame twist.
BASE_AXES = ["vx", "vy", "vz", "wx", "wy", "wz"]


def _typestore():
    from rosbags.typesys import Stores, get_typestore

    # The message definitions used here are identical in every ROS 2 release since Humble.
    store = getattr(Stores, "ROS2_KILTED", None) or Stores.ROS2_JAZZY
    return get_typestore(store)


# ---------------------------------------------------------------------------- timing report
@dataclass
class TopicStats:
    """Timing of one topic, from its header stamps (or receive stamps when it has no header)."""

    topic: str
    msgtype: str
    count: int
    stamp_source: str               # "header", "label" (/diffsim/command's state stamp) or "receive"
    duration_s: float = 0.0
    rate_hz: float = 0.0
    period_s: float = 0.0           # median interval between consecutive stamps
    jitter_std_s: float = 0.0       # standard deviation of the intervals
    jitter_max_s: float = 0.0       # largest |interval - period|, drops excluded
    drops: int = 0                  # messages missing from gaps longer than 1.5 periods
    duplicates: int = 0             # messages repeating an earlier stamp
    out_of_order: int = 0           # messages (in receive order) stamped earlier than their predecessor
    latency_mean_s: Optional[float] = None   # receive - header stamp, where both are on one clock
    latency_max_s: Optional[float] = None
    latency_note: str = ""                   # why the latency was not computed

    def as_dict(self) -> Dict[str, Any]:
        return dict(self.__dict__)


#: Receive time minus header stamp (s) within which the two are taken to be on one clock
#: (the median over a topic): a little negative for clocks synchronised between machines,
#: up to seconds for a slow link. Outside it the stamps are on another clock, e.g. the
#: simulated time of a lockstep run against the recorder's wall clock.
SAME_CLOCK_WINDOW_S = (-1.0, 10.0)


def timing_stats(topic: str, msgtype: str, stamps: np.ndarray, receive: np.ndarray,
                 has_header: bool) -> TopicStats:
    """Jitter, drops, duplicates and out-of-order counts of one topic, and the latency.

    The latency (receive - header stamp) is given where stamps and receive times share a clock
    (:data:`SAME_CLOCK_WINDOW_S`; otherwise ``latency_note`` says why there is none).

    ``stamps`` and ``receive`` are int64 ns in receive (bag) order. The nominal period is
    the median interval between distinct sorted stamps, so a few drops or bursts do not
    move it.
    """
    st = TopicStats(topic, msgtype, int(len(stamps)), "header" if has_header else "receive")
    s = np.asarray(stamps if has_header else receive, dtype=np.int64)
    if has_header and len(s):
        lat = (np.asarray(receive, dtype=np.int64) - s) * 1e-9
        med = float(np.median(lat))
        lo, hi = SAME_CLOCK_WINDOW_S
        if lo <= med <= hi:
            st.latency_mean_s, st.latency_max_s = float(lat.mean()), float(lat.max())
        else:
            st.latency_note = (f"header stamps are on another clock than the receive times (median receive - stamp "
                               f"{med:.4g} s, e.g. simulated time); latency not computed")
    if len(s) < 2:
        return st
    st.out_of_order = int((np.diff(s) < 0).sum())
    srt = np.sort(s)
    d = np.diff(srt)
    st.duplicates = int((d == 0).sum())
    d = d[d > 0]
    if len(d) == 0:
        return st
    period = float(np.median(d))
    st.period_s = period * 1e-9
    st.duration_s = float(srt[-1] - srt[0]) * 1e-9
    st.rate_hz = 1.0 / st.period_s if st.period_s > 0 else 0.0
    gaps = d > 1.5 * period
    st.drops = int(np.maximum(np.round(d[gaps] / period) - 1, 0).sum())
    regular = d[~gaps]
    if len(regular):
        st.jitter_std_s = float(regular.std()) * 1e-9
        st.jitter_max_s = float(np.abs(regular - period).max()) * 1e-9
    return st


# ---------------------------------------------------------------------------- reading
@dataclass
class BagData:
    """What the analysis needs from a bag, as arrays (times in int64 ns).

    States are sorted by header stamp with duplicate stamps dropped; ``q``/``v`` follow
    the message layout: arms in ``joint_names`` order (the JointState's own order, mapped
    to a model's by name later), quadrotors ``q = [x y z qx qy qz qw]``,
    ``v = [v_lin v_ang]`` in the body frame, legged robots the base's then the joints'
    (``q = [x y z qx qy qz qw, joints]``, ``v = [v_lin v_ang, joint velocities]``, joints in
    ``joint_names`` order). ``cmd_state_stamp[i]`` is the stamp of the state command ``i``
    was computed from.
    """

    path: str
    storage: str
    kind: str                                   # "arm", "quadrotor" or "legged"
    state_topic: str
    joint_names: List[str]
    t_state: np.ndarray
    q: np.ndarray
    v: np.ndarray
    command_topic: str
    cmd_state_stamp: np.ndarray
    cmd: np.ndarray
    cmd_names: List[str]
    cmd_stamp_source: str                       # "label", "header" or "receive"
    pred_t: Optional[np.ndarray] = None
    pred_v: Optional[np.ndarray] = None
    pred_joint_names: List[str] = field(default_factory=list)
    metadata: Optional[Dict[str, Any]] = None
    topics: Dict[str, TopicStats] = field(default_factory=dict)
    warnings: List[str] = field(default_factory=list)

    @property
    def dof_names(self) -> List[str]:
        if self.kind == "legged":
            return list(BASE_AXES) + list(self.joint_names)
        return list(self.joint_names) if self.kind == "arm" else list(BASE_AXES)

    @property
    def duration_s(self) -> float:
        return float(self.t_state[-1] - self.t_state[0]) * 1e-9 if len(self.t_state) > 1 else 0.0


def _ns(stamp) -> int:
    return int(stamp.sec) * 1_000_000_000 + int(stamp.nanosec)


def _open_reader(path: Path):
    from rosbags.highlevel import AnyReader

    if not path.exists():
        raise AnalysisError(f"{path}: no such bag (expected a rosbag2 directory with metadata.yaml, "
                            f"or an .mcap/.db3 file)")
    if path.is_dir() and not (path / "metadata.yaml").is_file():
        raise AnalysisError(f"{path}: not a rosbag2 directory: metadata.yaml is missing (a recording that was "
                            f"killed before closing may lack it; `diffsim-ros bag repair` or `ros2 bag reindex` "
                            f"rebuilds it)")
    try:
        reader = AnyReader([path], default_typestore=_typestore())
        reader.open()
    except Exception as exc:  # rosbags raises several types for broken files; all mean the same here
        unfinished = [f.name for f in (path.glob("*.mcap") if path.is_dir() else [path])
                      if f.suffix == ".mcap" and not _has_footer(f)]
        hint = (f"{', '.join(unfinished)} has no MCAP footer: the recording was not closed (killed?) or the file is "
                f"truncated; `diffsim-ros bag repair {path}` rebuilds its index" if unfinished
                else "is it a rosbag2 directory, and complete (not truncated)? (`diffsim-ros bag repair` "
                     "rewrites the metadata.yaml of an MCAP bag from its file)")
        raise AnalysisError(f"{path}: cannot open the bag ({type(exc).__name__}: {_one_line(exc)}); {hint}") from None
    return reader


def _one_line(exc) -> str:
    return "; ".join(x.strip() for x in str(exc).splitlines() if x.strip())


def _has_footer(f: Path) -> bool:
    try:
        with open(f, "rb") as fh:
            fh.seek(0, 2)
            if fh.tell() < 45:
                return False
            fh.seek(-37, 2)
            tail = fh.read()
        return tail[0] == 0x02 and tail[-8:] == b"\x89MCAP0\r\n"
    except OSError:
        return False


def _storage_of(path: Path) -> str:
    if path.is_dir():
        names = [p.suffix for p in path.iterdir()]
        if ".mcap" in names:
            return "mcap"
        if ".db3" in names:
            return "sqlite3"
    return {".mcap": "mcap", ".db3": "sqlite3"}.get(path.suffix, "unknown")


def _check_type(path: Path, topic: str, got: str, want: Sequence[str]) -> None:
    if got not in want:
        raise AnalysisError(f"{path}: topic '{topic}' has message type {got}, expected "
                            f"{' or '.join(want)} (doc/interfaces.md)")


def read_bag(path, state_topic: Optional[str] = None, command_topic: Optional[str] = None,
             predicted_topic: str = PREDICTED, metadata_topic: str = METADATA) -> BagData:
    """Read a rosbag2 bag (MCAP or sqlite3) into :class:`BagData`; see the module doc.

    ``state_topic``/``command_topic`` override the defaults (first of ``/joint_states``,
    ``/odom``; first of ``/diffsim/command``, ``/cmd_ctbr``, ``/cmd_rotor_thrust``,
    ``/<controller>/commands``).
    """
    path = Path(os.fspath(path))
    with _opened(path) as reader:
        return _read(reader, path, state_topic, command_topic, predicted_topic, metadata_topic)


@contextlib.contextmanager
def _opened(path: Path):
    """Open the bag's reader (:func:`_open_reader`) and close it on the way out, whatever happened."""
    reader = _open_reader(path)
    try:
        yield reader
    finally:
        try:
            reader.close()
        except Exception:
            pass


def read_legged_states(path) -> Tuple[np.ndarray, np.ndarray, np.ndarray, List[str], List[str]]:
    """(stamps ns, q, v, joint names, warnings) of a legged robot's bag.

    Its /odom and /joint_states are paired as :func:`read_bag` pairs them (the nearest stamp within
    half the shorter period; the pair's stamp the later one); q = base position, quaternion xyzw,
    joint positions, v = the odometry's twist, joint velocities, joints in the message's order. No
    command topic is needed (a robot's own recording has none).
    """
    path = Path(os.fspath(path))
    with _opened(path) as reader:
        src = _Source(reader, path)
        for topic in (ODOM, JOINT_STATES):
            if topic not in src.topics:
                raise AnalysisError(f"{path}: a legged robot's state is '{ODOM}' + '{JOINT_STATES}'; '{topic}' is "
                                    f"not in the bag (topics: {src.present})")
        warnings: List[str] = []
        t, q, v, _, names = _read_legged_states(src, {}, warnings)
        return t, q, v, list(names or []), warnings


def legged_in_model_order(where: str, q: np.ndarray, v: np.ndarray, names: Sequence[str], model):
    """(q, v) of a legged bag's states with the joints in ``model``'s order.

    The states given hold the base, then the joints in ``names`` order; an AnalysisError naming
    ``where`` when the bag lacks one of the model's joints.
    """
    missing = [j for j in model.joint_names if j not in names]
    if missing:
        raise AnalysisError(f"{where}: '{JOINT_STATES}' lacks joint(s) {missing} of model '{model.name}' "
                            f"(bag joints: {list(names)})")
    idx = [list(names).index(j) for j in model.joint_names]
    return (np.concatenate((q[:, :7], q[:, 7:][:, idx]), axis=1),
            np.concatenate((v[:, :6], v[:, 6:][:, idx]), axis=1))


def _messages(reader, path: Path, conns, what: str):
    """(receive ns, deserialised message) of ``conns``; a read error names the topic."""
    try:
        for conn, t, raw in reader.messages(connections=conns):
            try:
                msg = reader.deserialize(raw, conn.msgtype)
            except Exception as exc:
                raise AnalysisError(f"{path}: topic '{conn.topic}': a message at t={t} ns cannot be "
                                    f"deserialised as {conn.msgtype} ({type(exc).__name__}: {exc})") from None
            yield t, msg
    except AnalysisError:
        raise
    except Exception as exc:
        raise AnalysisError(f"{path}: reading {what} failed ({type(exc).__name__}: {exc}); the bag is "
                            f"probably truncated or corrupt") from None


#: Read uncompressed MCAP bags with the vectorised scanner of cdr.mcap_messages (False: rosbags only).
FAST_MCAP = True


def _fast_mcap(path: Path, topics: Sequence[str]):
    """cdr.mcap_messages over the bag's MCAP files, or None (then rosbags reads it)."""
    if not FAST_MCAP or not path.is_dir():
        return None
    files = sorted(str(f) for f in path.glob("*.mcap"))
    if not files:
        return None
    try:
        return cdr.mcap_messages(files, topics)
    except cdr.McapCorrupt as exc:
        raise AnalysisError(f"{path}: {Path(exc.file).name}: {exc.detail}") from None
    except (struct.error, UnicodeDecodeError, IndexError, OSError, OverflowError, ValueError):
        return None


def _raw(reader, path: Path, conns, what: str, fast=None):
    """(receive ns (N,), [raw CDR bytes]) of ``conns`` in bag order; a read error names the topic."""
    if fast is not None and what in fast:
        return fast[what]
    recv, raws = [], []
    try:
        for _, t, raw in reader.messages(connections=conns):
            if not 0 <= t < 2 ** 63:
                raise AnalysisError(f"{path}: topic '{what}': a message has log time {t} ns, outside int64 "
                                    f"(corrupt)")
            recv.append(t)
            raws.append(bytes(raw))
    except AnalysisError:
        raise
    except Exception as exc:
        raise AnalysisError(f"{path}: reading {what} failed ({type(exc).__name__}: {exc}); the bag is "
                            f"probably truncated or corrupt") from None
    return np.asarray(recv, dtype=np.int64), raws


def _check_index(path: Path, topics: Dict[str, str], channels: Dict[str, str]) -> None:
    """metadata.yaml's topics and types (what rosbags reads) against the MCAP file's channels."""
    for topic, msgtype in topics.items():
        if topic not in channels:
            raise AnalysisError(f"{path}: metadata.yaml lists topic '{topic}', which the MCAP file does not hold; "
                                f"metadata.yaml is damaged (`diffsim-ros bag repair` rewrites it)")
        if channels[topic] and channels[topic] != msgtype:
            raise AnalysisError(f"{path}: topic '{topic}' is {msgtype} in metadata.yaml but {channels[topic]} in "
                                f"the MCAP file; metadata.yaml is damaged (`diffsim-ros bag repair` rewrites it)")
    missing = sorted(set(channels) - set(topics))
    if missing:
        raise AnalysisError(f"{path}: the MCAP file holds topic(s) {', '.join(missing)} that metadata.yaml does not "
                            f"list; metadata.yaml is damaged or stale (`diffsim-ros bag repair` rewrites it)")


def _slow(reader, path: Path, conn_type: str, topic: str, recv, raws):
    """Per-message deserialisation (the fallback of the vectorised decoders in cdr.py)."""
    for t, raw in zip(recv, raws):
        try:
            yield int(t), reader.deserialize(raw, conn_type)
        except Exception as exc:
            raise AnalysisError(f"{path}: topic '{topic}': a message at t={t} ns cannot be "
                                f"deserialised as {conn_type} ({type(exc).__name__}: {exc})") from None


class _Source:
    """One open bag as the per-topic readers below see it.

    Its topics and types, the fast MCAP index where there is one, and the messages of a topic (raw,
    or deserialised).
    """

    def __init__(self, reader, path: Path):
        self.reader, self.path = reader, path
        self.topics = {c.topic: c.msgtype for c in reader.connections}
        self.present = ", ".join(sorted(self.topics)) or "none"
        self.mcap = _fast_mcap(path, list(self.topics))
        if self.mcap is not None:
            _check_index(path, self.topics, self.mcap.pop(None))

    def conns(self, topic: str):
        return [c for c in self.reader.connections if c.topic == topic]

    def raw(self, topic: str):
        """(receive times, raw CDR messages or None) of ``topic``."""
        return _raw(self.reader, self.path, self.conns(topic), topic, self.mcap)

    def decoded(self, topic: str, recv, raws):
        """(receive time, message) of ``topic``, deserialised one by one."""
        return _slow(self.reader, self.path, self.topics[topic], topic, recv, raws)


def _read_metadata(src: _Source, topic: str) -> Optional[Dict[str, Any]]:
    """Return the last message of the latched metadata topic, parsed (None when absent)."""
    if topic not in src.topics:
        return None
    path = src.path
    _check_type(path, topic, src.topics[topic], [STRING_T])
    last = None
    if src.mcap is not None:
        mrecv, mraws = src.mcap[topic]
        for _, msg in _slow(src.reader, path, STRING_T, topic, mrecv[-1:], mraws[-1:]):
            last = msg.data
    else:
        for _, msg in _messages(src.reader, path, src.conns(topic), topic):
            last = msg.data
    if last is None:
        return None
    try:
        metadata = json.loads(last)
    except json.JSONDecodeError as exc:
        raise AnalysisError(f"{path}: topic '{topic}' does not hold JSON ({exc})") from None
    if not isinstance(metadata, dict):
        raise AnalysisError(f"{path}: topic '{topic}' must hold a JSON object, got {type(metadata).__name__}")
    return metadata


def _state_topic(src: _Source, state_topic: Optional[str]) -> str:
    """Return the state topic asked for, or the first of /joint_states and odometry in the bag."""
    path, topics = src.path, src.topics
    if state_topic is None:
        for cand in (JOINT_STATES, ODOM):
            if cand in topics:
                state_topic = cand
                break
        else:
            raise AnalysisError(f"{path}: no state topic: expected '{JOINT_STATES}' (sensor_msgs/JointState) "
                                f"or '{ODOM}' (nav_msgs/Odometry); topics in the bag: {src.present}")
    if state_topic not in topics:
        raise AnalysisError(f"{path}: state topic '{state_topic}' is not in the bag; topics: {src.present}")
    _check_type(path, state_topic, topics[state_topic], [JOINT_STATE_T, ODOMETRY_T])
    return state_topic


def _read_states(src: _Source, state_topic: str, kind: str, stats: Dict[str, TopicStats], warnings: List[str]):
    """(t_state, q, v, receive times, joint names) of the state topic.

    Sorted by stamp, a repeated stamp kept once, the receive time standing in for stamps that are
    all zero.
    """
    path = src.path
    recv_a, raws = src.raw(state_topic)
    names: Optional[List[str]] = None
    fast = None
    if raws:
        fast = cdr.joint_states(raws) if kind == "arm" else cdr.odometry(raws)
    if fast is not None and kind == "arm":
        stamps, names, q_arr, v_arr = fast
    elif fast is not None:
        stamps, q_arr, v_arr = fast
    else:
        stamps, qs, vs = [], [], []
        for t, msg in src.decoded(state_topic, recv_a, raws):
            stamps.append(_ns(msg.header.stamp))
            if kind == "arm":
                nm = list(msg.name)
                if names is None:
                    names = nm
                if nm != names:
                    raise AnalysisError(f"{path}: topic '{state_topic}': message at t={t} ns has joints {nm}, the "
                                        f"first message had {names} (the analysis expects one fixed joint set)")
                pos, vel = np.asarray(msg.position, dtype=float), np.asarray(msg.velocity, dtype=float)
                if len(pos) != len(nm) or len(vel) != len(nm):
                    raise AnalysisError(f"{path}: topic '{state_topic}': message at t={t} ns has {len(nm)} names but "
                                        f"{len(pos)} positions and {len(vel)} velocities (field 'velocity' is "
                                        f"required)")
                qs.append(pos)
                vs.append(vel)
            else:
                p, o = msg.pose.pose.position, msg.pose.pose.orientation
                lin, ang = msg.twist.twist.linear, msg.twist.twist.angular
                qs.append((p.x, p.y, p.z, o.x, o.y, o.z, o.w))
                vs.append((lin.x, lin.y, lin.z, ang.x, ang.y, ang.z))
        q_arr, v_arr = np.asarray(qs, dtype=float), np.asarray(vs, dtype=float)
    if len(stamps) < 2:
        raise AnalysisError(f"{path}: topic '{state_topic}' has {len(stamps)} message(s); at least 2 are needed")
    stamps_a = np.asarray(stamps, dtype=np.int64)
    stats[state_topic] = timing_stats(state_topic, src.topics[state_topic], stamps_a, recv_a, True)
    if stamps_a.max() == 0:
        # All headers zero: the publisher did not stamp; fall back to the receive time.
        warnings.append(f"'{state_topic}': header stamps are all zero; aligned by bag receive time instead")
        stamps_a = recv_a.copy()
    order = np.argsort(stamps_a, kind="stable")
    keep = np.ones(len(order), dtype=bool)
    keep[1:] = np.diff(stamps_a[order]) != 0          # drop repeated stamps, keep the first
    order = order[keep]
    t_state = stamps_a[order]
    q, v = q_arr[order], v_arr[order]
    if not np.isfinite(v).all() or not np.isfinite(q).all():
        bad = int((~np.isfinite(v).all(1) | ~np.isfinite(q).all(1)).sum())
        raise AnalysisError(f"{path}: topic '{state_topic}' has {bad} message(s) with NaN/Inf positions or velocities")
    # the receive time of each kept state: the commands' fallback alignment
    return t_state, q, v, recv_a[order], names


def _read_legged_states(src: _Source, stats: Dict[str, TopicStats], warnings: List[str]):
    """Read a legged robot's states: each /odom message paired with a /joint_states message.

    The partner is the /joint_states message nearest in stamp, within half the shorter of the two
    topics' periods (the stand-in in lockstep publishes both with one stamp; a robot's drivers stamp
    them apart). The state holds the base's q, v then the joints'; the pair's stamp is the later
    one, as policy_controller's supervisor stamps it. A message without a partner is left out, with
    a warning counting them.
    """
    t_o, q_o, v_o, r_o, _ = _read_states(src, ODOM, "quadrotor", stats, warnings)
    t_j, q_j, v_j, _, names = _read_states(src, JOINT_STATES, "arm", stats, warnings)
    periods = [float(np.median(np.diff(t))) for t in (t_o, t_j)]
    tol = 0.5 * min(periods)
    j = np.clip(np.searchsorted(t_j, t_o), 1, len(t_j) - 1)
    j = np.where(np.abs(t_j[j - 1] - t_o) <= np.abs(t_j[j] - t_o), j - 1, j)
    ok = np.abs(t_j[j] - t_o) <= tol
    io, ij = np.nonzero(ok)[0], j[ok]
    first = np.ones(len(ij), dtype=bool)
    first[1:] = np.diff(ij) != 0                      # a joint state pairs once (the first odometry)
    io, ij = io[first], ij[first]
    if len(io) < 2:
        raise AnalysisError(f"{src.path}: a legged robot's state is an '{ODOM}' and a '{JOINT_STATES}' message of "
                            f"(nearly) equal stamp; {len(io)} pair(s) within {tol * 1e-6:.3g} ms ({len(t_o)} "
                            f"odometry, {len(t_j)} joint states)")
    lone = len(t_o) + len(t_j) - 2 * len(io)
    if lone:
        warnings.append(f"'{ODOM}' + '{JOINT_STATES}': {lone} message(s) without a partner within "
                        f"{tol * 1e-6:.3g} ms on the other topic; left out")
    q = np.concatenate((q_o[io], q_j[ij]), axis=1)
    v = np.concatenate((v_o[io], v_j[ij]), axis=1)
    stamps = np.maximum(t_o[io], t_j[ij])
    return stamps, q, v, np.maximum(r_o[io], 0), names


def _imu_stats(src: _Source, stats: Dict[str, TopicStats]) -> None:
    """Record the IMU topic's timing, where the bag has one (its values are not analysed)."""
    if IMU not in src.topics:
        return
    _check_type(src.path, IMU, src.topics[IMU], [IMU_T])
    rc_, raws_ = src.raw(IMU)
    if raws_:
        try:
            st_ = cdr.header_stamps(raws_)
        except Exception:
            st_ = np.asarray([_ns(m.header.stamp) for _, m in _slow(src.reader, src.path, IMU_T, IMU, rc_, raws_)])
        stats[IMU] = timing_stats(IMU, IMU_T, st_, rc_, True)


def _command_topic(src: _Source, command_topic: Optional[str]) -> str:
    """Return the command topic asked for, or the first of the known command topics in the bag."""
    path, topics = src.path, src.topics
    if command_topic is None:
        cands = [COMMAND, CMD_CTBR, CMD_ROTOR_THRUST, *CONTROLLER_COMMANDS]
        for cand in cands:
            if cand in topics:
                command_topic = cand
                break
        else:
            raise AnalysisError(f"{path}: no command topic: expected '{COMMAND}' (std_msgs/Float64MultiArray) or "
                                f"one of {', '.join(cands[1:])}; topics in the bag: {src.present}")
    if command_topic not in topics:
        raise AnalysisError(f"{path}: command topic '{command_topic}' is not in the bag; topics: {src.present}")
    _check_type(path, command_topic, topics[command_topic],
                [TWIST_STAMPED_T] if command_topic == CMD_CTBR else [FLOAT64_ARRAY_T])
    return command_topic


def _read_commands(src: _Source, command_topic: str, state_topic: str, t_state, recv_state,
                   stats: Dict[str, TopicStats], warnings: List[str]):
    """(cmd_state_stamp, cmd, stamp source): each command aligned to the state it answers.

    A command is aligned by its header stamp (CTBR), by the state-stamp label, or else by receive
    time; one per state.
    """
    path = src.path
    ctype = src.topics[command_topic]
    crecv_a, craws = src.raw(command_topic)
    cvals, clabel, chead = [], [], []
    fast_cmd = cdr.float64_arrays(craws) if (craws and ctype == FLOAT64_ARRAY_T) else None
    if fast_cmd is not None:
        cvals, clabel = list(fast_cmd[0]), fast_cmd[1]
    else:
        for t, msg in src.decoded(command_topic, crecv_a, craws):
            if ctype == TWIST_STAMPED_T:
                tw = msg.twist
                cvals.append((tw.linear.z, tw.angular.x, tw.angular.y, tw.angular.z))
                chead.append(_ns(msg.header.stamp))
            else:
                cvals.append(np.asarray(msg.data, dtype=float))
                label = msg.layout.dim[0].label if len(msg.layout.dim) else ""
                try:
                    clabel.append(int(label))
                except (TypeError, ValueError):
                    clabel.append(None)
    widths = {len(c) for c in cvals}
    if len(widths) != 1:
        raise AnalysisError(f"{path}: topic '{command_topic}': commands have different lengths {sorted(widths)}")
    cmd = np.asarray(cvals, dtype=float)
    if ctype == TWIST_STAMPED_T:
        source = "header"
        stamp_of = np.asarray(chead, dtype=np.int64)
        # A command is computed from the newest state at or before its stamp.
        idx = np.searchsorted(t_state, stamp_of, side="right") - 1
    elif all(lbl is not None for lbl in clabel):
        source = "label"
        stamp_of = np.asarray(clabel, dtype=np.int64)
        idx = np.searchsorted(t_state, stamp_of, side="left")
        idx_c = np.clip(idx, 0, len(t_state) - 1)
        exact = t_state[idx_c] == stamp_of
        if not exact.all():
            # Labels that are no state's stamp: take the newest state at or before it.
            idx = np.where(exact, idx_c, np.searchsorted(t_state, stamp_of, side="right") - 1)
            warnings.append(f"'{command_topic}': {int((~exact).sum())} command label(s) match no state stamp "
                            f"exactly (the state may be dropped); aligned to the newest earlier state")
    else:
        source = "receive"
        if any(lbl is not None for lbl in clabel):
            warnings.append(f"'{command_topic}': some commands lack the state-stamp label; all are aligned by "
                            f"bag receive time")
        idx = np.searchsorted(recv_state, crecv_a, side="right") - 1
    if source == "label":
        # The label is the stamp (robot clock) of the state the command answers: the command
        # stream's own timing in that clock; receive - label is compute plus transport delay.
        stats[command_topic] = timing_stats(command_topic, ctype, stamp_of, crecv_a, True)
        stats[command_topic].stamp_source = "label"
    else:
        stats[command_topic] = timing_stats(command_topic, ctype, crecv_a, crecv_a, False)
    valid = idx >= 0
    if not valid.any() or (source != "receive" and (stamp_of.max() < t_state[0] or stamp_of.min() > t_state[-1])):
        lo, hi = (t_state[0] * 1e-9, t_state[-1] * 1e-9)
        raise AnalysisError(f"{path}: no overlap in time between '{command_topic}' and '{state_topic}': states "
                            f"span [{lo:.3f}, {hi:.3f}] s, commands "
                            + (f"[{stamp_of.min() * 1e-9:.3f}, {stamp_of.max() * 1e-9:.3f}] s"
                               if source != "receive" else "arrive before the first state"))
    if (~valid).any():
        warnings.append(f"'{command_topic}': {int((~valid).sum())} command(s) precede the first state; ignored")
    cmd, idx = cmd[valid], idx[valid]
    cmd_state_stamp = t_state[idx]
    # One command per state: a repeated one (same state stamp) keeps the last sent.
    order = np.argsort(cmd_state_stamp, kind="stable")
    cmd_state_stamp, cmd = cmd_state_stamp[order], cmd[order]
    last = np.ones(len(order), dtype=bool)
    last[:-1] = np.diff(cmd_state_stamp) != 0
    if (~last).any():
        warnings.append(f"'{command_topic}': {int((~last).sum())} command(s) share their state with a later one; "
                        f"the last one sent is used")
    cmd_state_stamp, cmd = cmd_state_stamp[last], cmd[last]
    if not np.isfinite(cmd).all():
        raise AnalysisError(f"{path}: topic '{command_topic}' has NaN/Inf commands")
    return cmd_state_stamp, cmd, source


def _read_predictions(src: _Source, topic: str, kind: str, stats: Dict[str, TopicStats]):
    """(stamps, velocities, joint names) of the controller's online predictions, sorted by stamp.

    (None, None, []) when the bag has none.
    """
    pred_names: List[str] = []
    if topic not in src.topics or kind == "legged":     # policy_controller predicts no legged state
        return None, None, pred_names
    path = src.path
    _check_type(path, topic, src.topics[topic], [JOINT_STATE_T if kind == "arm" else ODOMETRY_T])
    prc, praws = src.raw(topic)
    fast_p = None
    if praws:
        fast_p = cdr.joint_states(praws) if kind == "arm" else cdr.odometry(praws)
    pt, pv = [], []
    if fast_p is not None:
        pt, pv = list(fast_p[0]), list(fast_p[-1])
        if kind == "arm":
            pred_names = list(fast_p[1])
    else:
        for t, msg in src.decoded(topic, prc, praws):
            pt.append(_ns(msg.header.stamp))
            if kind == "arm":
                if not pred_names:
                    pred_names = list(msg.name)
                if list(msg.name) != pred_names:
                    raise AnalysisError(f"{path}: topic '{topic}': joint names change between messages")
                pv.append(np.asarray(msg.velocity, dtype=float))
            else:
                lin, ang = msg.twist.twist.linear, msg.twist.twist.angular
                pv.append((lin.x, lin.y, lin.z, ang.x, ang.y, ang.z))
    if not pt:
        return None, None, pred_names
    stats[topic] = timing_stats(topic, src.topics[topic], np.asarray(pt), prc, True)
    o = np.argsort(np.asarray(pt), kind="stable")
    return np.asarray(pt, dtype=np.int64)[o], np.asarray(pv, dtype=float)[o], pred_names


def _read(reader, path, state_topic, command_topic, predicted_topic, metadata_topic) -> BagData:
    src = _Source(reader, path)
    # Metadata first: it tells the robot kind and the command layout.
    metadata = _read_metadata(src, metadata_topic)
    stats: Dict[str, TopicStats] = {}
    warnings: List[str] = []
    if state_topic is None and _legged(src, metadata):
        kind, state_topic = "legged", f"{ODOM} + {JOINT_STATES}"
        t_state, q, v, recv_state, names = _read_legged_states(src, stats, warnings)
    else:
        state_topic = _state_topic(src, state_topic)
        kind = "arm" if src.topics[state_topic] == JOINT_STATE_T else "quadrotor"
        t_state, q, v, recv_state, names = _read_states(src, state_topic, kind, stats, warnings)
    _imu_stats(src, stats)
    command_topic = _command_topic(src, command_topic)
    cmd_state_stamp, cmd, source = _read_commands(src, command_topic, state_topic, t_state, recv_state, stats,
                                                  warnings)
    cmd_names = _command_names(metadata, command_topic, cmd.shape[1], kind, names)
    pred_t, pred_v, pred_names = _read_predictions(src, predicted_topic, kind, stats)
    return BagData(path=str(path), storage=_storage_of(path), kind=kind, state_topic=state_topic,
                   joint_names=list(names or []), t_state=t_state, q=q, v=v, command_topic=command_topic,
                   cmd_state_stamp=cmd_state_stamp, cmd=cmd, cmd_names=cmd_names, cmd_stamp_source=source,
                   pred_t=pred_t, pred_v=pred_v, pred_joint_names=pred_names, metadata=metadata,
                   topics=stats, warnings=warnings)


def describes_legged_robot(metadata: Dict[str, Any]) -> bool:
    """Return whether /diffsim/metadata describes a floating base without rotors (a legged robot).

    What is judged is its ``checkpoint`` metadata where the controller ran one, else the training
    file in ``config``.
    """
    ck = metadata.get("checkpoint")
    if isinstance(ck, dict):
        floating, sim = (ck.get("robot") or {}).get("floating_base"), ck.get("simulator") or {}
    else:
        cfg = metadata.get("config") if isinstance(metadata.get("config"), dict) else {}
        floating, sim = cfg.get("floating_base"), cfg.get("simulator") or {}
    return bool(floating) and not sim.get("rotors")


def _legged(src: _Source, metadata: Optional[Dict[str, Any]]) -> bool:
    """Return whether the bag is a legged robot's.

    Both /odom and /joint_states are in the bag, and the metadata (where there is some) describes a
    legged robot.
    """
    if not (ODOM in src.topics and JOINT_STATES in src.topics):
        return False
    return metadata is None or describes_legged_robot(metadata)


def _command_names(metadata, topic, width, kind, joint_names) -> List[str]:
    """Names of the command entries.

    For a ros2_control forward-command topic, the controller's joints (policy_controller's metadata
    ``controller_joints``); else the checkpoint's ``command.names`` when the bag has them.
    """
    cj = (metadata or {}).get("controller_joints")
    if topic in CONTROLLER_COMMANDS and isinstance(cj, list) and len(cj) == width:
        return [str(n) for n in cj]
    ck = (metadata or {}).get("checkpoint") or {}
    names = ((ck.get("command") or {}).get("names") if isinstance(ck, dict) else None)
    if isinstance(names, list) and len(names) == width:
        return [str(n) for n in names]
    if topic == CMD_CTBR or (kind == "quadrotor" and width == 4 and topic != CMD_ROTOR_THRUST):
        return ["collective_thrust", "body_rate/x", "body_rate/y", "body_rate/z"]
    if kind == "arm" and joint_names and len(joint_names) == width:
        return list(joint_names)
    return [f"command_{i}" for i in range(width)]


# ---------------------------------------------------------------------------- writing
class BagWriter:
    """Writes bags in the layout of doc/interfaces.md (header stamps and receive times in ns).

    ``storage``: "mcap" (the default, written as trajectory_recorder writes it, with
    :class:`~diffsim_ros.analysis.bagfile.McapBagWriter`: chunk CRCs, ``chunk_size`` bytes
    a chunk at most) or "sqlite3" (rosbags' writer).
    Connections are added on first use; the metadata topic is offered transient-local,
    as policy_controller latches it.
    """

    def __init__(self, path, storage: str = "mcap", chunk_size: int = 1 << 20):
        from rosbags.rosbag2 import StoragePlugin, Writer

        from .bagfile import McapBagWriter

        if storage not in ("mcap", "sqlite3"):
            raise AnalysisError(f"storage must be 'mcap' or 'sqlite3', got {storage!r}")
        self.path = Path(os.fspath(path))
        self.store = _typestore()
        if storage == "mcap":
            # The recorder's writer (chunk CRCs, summary CRC); no fsync: these are test and benchmark bags.
            self._writer = McapBagWriter(self.path, fsync=False, chunk_size=chunk_size)
        else:
            self._writer = Writer(self.path, version=9, storage_plugin=StoragePlugin.SQLITE3)
        self._conns: Dict[str, Any] = {}
        T = self.store.types
        self._Time = T["builtin_interfaces/msg/Time"]
        self._Header = T["std_msgs/msg/Header"]

    def __enter__(self) -> "BagWriter":
        self._writer.open()
        return self

    def __exit__(self, *exc) -> None:
        self._writer.close()

    def _conn(self, topic: str, msgtype: str, latched: bool = False):
        c = self._conns.get(topic)
        if c is None:
            qos = ()
            if latched:
                from rosbags.interfaces import (Qos, QosDurability, QosHistory, QosLiveliness, QosReliability,
                                                QosTime)
                zero = QosTime(0, 0)
                qos = (Qos(QosHistory.KEEP_LAST, 1, QosReliability.RELIABLE, QosDurability.TRANSIENT_LOCAL,
                           zero, zero, QosLiveliness.AUTOMATIC, zero, False),)
            c = self._conns[topic] = self._writer.add_connection(topic, msgtype, typestore=self.store,
                                                                 offered_qos_profiles=qos)
        return c

    def _header(self, stamp_ns: int, frame_id: str = ""):
        stamp_ns = int(stamp_ns)
        return self._Header(stamp=self._Time(sec=stamp_ns // 1_000_000_000, nanosec=stamp_ns % 1_000_000_000),
                            frame_id=frame_id)

    def raw(self, topic: str, msgtype: str, receive_ns: int, msg) -> None:
        """Write a message object of ``self.store.types[msgtype]`` (for unusual test bags)."""
        self._writer.write(self._conn(topic, msgtype), int(receive_ns), self.store.serialize_cdr(msg, msgtype))

    def metadata(self, meta: Dict[str, Any], receive_ns: int = 0, topic: str = METADATA) -> None:
        msg = self.store.types[STRING_T](data=json.dumps(meta))
        self._writer.write(self._conn(topic, STRING_T, latched=True), int(receive_ns),
                           self.store.serialize_cdr(msg, STRING_T))

    def joint_state(self, stamp_ns: int, names: Sequence[str], q, v, effort=None, receive_ns: Optional[int] = None,
                    topic: str = JOINT_STATES) -> None:
        msg = self.store.types[JOINT_STATE_T](
            header=self._header(stamp_ns), name=list(names), position=np.ascontiguousarray(q, dtype=np.float64),
            velocity=np.ascontiguousarray(v, dtype=np.float64),
            effort=np.ascontiguousarray(effort if effort is not None else [], dtype=np.float64))
        self._writer.write(self._conn(topic, JOINT_STATE_T), int(stamp_ns if receive_ns is None else receive_ns),
                           self.store.serialize_cdr(msg, JOINT_STATE_T))

    def odometry(self, stamp_ns: int, q, v, receive_ns: Optional[int] = None, topic: str = ODOM) -> None:
        """``q = [x y z qx qy qz qw]`` (world), ``v = [v_lin v_ang]`` (body frame)."""
        T = self.store.types
        q, v = [float(x) for x in q], [float(x) for x in v]
        pose = T["geometry_msgs/msg/PoseWithCovariance"](
            pose=T["geometry_msgs/msg/Pose"](position=T["geometry_msgs/msg/Point"](x=q[0], y=q[1], z=q[2]),
                                             orientation=T["geometry_msgs/msg/Quaternion"](
                                                 x=q[3], y=q[4], z=q[5], w=q[6])),
            covariance=np.zeros(36))
        twist = T["geometry_msgs/msg/TwistWithCovariance"](
            twist=T["geometry_msgs/msg/Twist"](linear=T["geometry_msgs/msg/Vector3"](x=v[0], y=v[1], z=v[2]),
                                               angular=T["geometry_msgs/msg/Vector3"](x=v[3], y=v[4], z=v[5])),
            covariance=np.zeros(36))
        msg = T[ODOMETRY_T](header=self._header(stamp_ns, "world"), child_frame_id="base_link", pose=pose,
                            twist=twist)
        self._writer.write(self._conn(topic, ODOMETRY_T), int(stamp_ns if receive_ns is None else receive_ns),
                           self.store.serialize_cdr(msg, ODOMETRY_T))

    def imu(self, stamp_ns: int, quat, omega, specific_force, receive_ns: Optional[int] = None,
            topic: str = IMU) -> None:
        T = self.store.types
        V = T["geometry_msgs/msg/Vector3"]
        quat, omega, f = [float(x) for x in quat], [float(x) for x in omega], [float(x) for x in specific_force]
        msg = T[IMU_T](header=self._header(stamp_ns, "base_link"),
                       orientation=T["geometry_msgs/msg/Quaternion"](x=quat[0], y=quat[1], z=quat[2], w=quat[3]),
                       orientation_covariance=np.zeros(9), angular_velocity=V(x=omega[0], y=omega[1], z=omega[2]),
                       angular_velocity_covariance=np.zeros(9), linear_acceleration=V(x=f[0], y=f[1], z=f[2]),
                       linear_acceleration_covariance=np.zeros(9))
        self._writer.write(self._conn(topic, IMU_T), int(stamp_ns if receive_ns is None else receive_ns),
                           self.store.serialize_cdr(msg, IMU_T))

    def command(self, receive_ns: int, values, state_stamp_ns: Optional[int], topic: str = COMMAND) -> None:
        """Write the simulator-interface command, labelled with the stamp of the state it was computed from."""
        T = self.store.types
        vals = np.ascontiguousarray(values, dtype=np.float64)
        dims = [T["std_msgs/msg/MultiArrayDimension"](
            label="" if state_stamp_ns is None else str(int(state_stamp_ns)), size=len(vals), stride=len(vals))]
        msg = T[FLOAT64_ARRAY_T](layout=T["std_msgs/msg/MultiArrayLayout"](dim=dims, data_offset=0), data=vals)
        self._writer.write(self._conn(topic, FLOAT64_ARRAY_T), int(receive_ns),
                           self.store.serialize_cdr(msg, FLOAT64_ARRAY_T))

    def ctbr(self, stamp_ns: int, values, receive_ns: Optional[int] = None, topic: str = CMD_CTBR) -> None:
        T = self.store.types
        c = [float(x) for x in values]
        V = T["geometry_msgs/msg/Vector3"]
        msg = T[TWIST_STAMPED_T](header=self._header(stamp_ns, "base_link"),
                                 twist=T["geometry_msgs/msg/Twist"](linear=V(x=0.0, y=0.0, z=c[0]),
                                                                    angular=V(x=c[1], y=c[2], z=c[3])))
        self._writer.write(self._conn(topic, TWIST_STAMPED_T), int(stamp_ns if receive_ns is None else receive_ns),
                           self.store.serialize_cdr(msg, TWIST_STAMPED_T))
