"""rosbag2 bags (MCAP storage) written to survive a crash, and their repair.

A rosbag2 bag is a directory holding ``metadata.yaml`` (version 9) and one ``.mcap``
file (profile ``ros2``, ``ros2msg`` schemas with the message definitions, ``cdr``
message encoding), as rosbag2 and the ``rosbags`` library write it; ``ros2 bag info``,
Foxglove, PlotJuggler and rosbags read it. :class:`McapBagWriter` writes that layout with
the ``mcap`` package's writer so that a process killed at any moment (SIGKILL, OOM
killer, power loss) loses at most the last ``flush_period_s`` of messages:

* the MCAP header is on disk as soon as the bag is opened, and ``metadata.yaml`` too
  (rewritten atomically, temp file + ``os.replace``, whenever a topic is added and at
  every flush, listing the messages that are on disk);
* messages are grouped in chunks that carry the CRC of their content; the chunk in
  progress is closed, written and fsync'ed once its oldest message is half a flush
  period old (on the next write, or on :meth:`McapBagWriter.tick` from a timer), so no
  message waits longer than ``flush_period_s``;
* :meth:`McapBagWriter.close` writes the summary (schemas, channels, statistics, chunk
  and metadata indexes, with the summary CRC), the footer and the final metadata.yaml.

A killed writer leaves a valid data section cut off somewhere: :func:`repair` (the CLI
``diffsim-ros bag repair BAG``, the equivalent of ``ros2 bag reindex``) keeps every
complete chunk whose CRC holds, writes a new file with its summary, index and footer,
and rewrites metadata.yaml from what the file really holds.
"""
from __future__ import annotations

import os
import time
import zlib
from dataclasses import dataclass, field
from io import StringIO
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence

from .errors import AnalysisError

#: rosbag2 metadata.yaml version written here (rosbag2 Jazzy and later).
BAG_VERSION = 9
#: The rosbag2 key/value metadata record in the MCAP file (as rosbag2's MCAP storage plugin writes it).
ROSBAG2_METADATA = "rosbag2"


def _yaml():
    from ruamel.yaml import YAML

    y = YAML(typ="safe")
    y.default_flow_style = False
    return y


def _dump_yaml(obj) -> str:
    s = StringIO()
    _yaml().dump(obj, s)
    return s.getvalue()


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def write_atomically(path: Path, text: str, fsync: bool = True) -> None:
    """Replace ``path`` by ``text`` so that a reader (or a crash) sees the old or the new file, never half."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf8") as f:
        f.write(text)
        if fsync:
            f.flush()
            os.fsync(f.fileno())
    os.replace(tmp, path)
    if fsync:
        _fsync_dir(path.parent)


@dataclass
class Topic:
    """One recorded topic (an MCAP channel); ``qos`` is the offered QoS as rosbag2 v9 dumps it."""

    id: int
    topic: str
    msgtype: str
    qos: List[Dict[str, Any]]
    digest: str = ""
    serialization_format: str = "cdr"
    count: int = 0              # messages on disk (flushed)


def metadata_yaml(file_name: str, topics: Sequence[Topic], start_ns: int, end_ns: int,
                  custom_data: Optional[Dict[str, str]] = None) -> str:
    """metadata.yaml of a one-file MCAP bag (the layout rosbags' and rosbag2's writers give)."""
    count = sum(t.count for t in topics)
    start = int(start_ns) if count else 0
    duration = max(0, int(end_ns) - int(start_ns)) if count else 0
    info = {
        "version": BAG_VERSION,
        "storage_identifier": "mcap",
        "relative_file_paths": [file_name],
        "duration": {"nanoseconds": duration},
        "starting_time": {"nanoseconds_since_epoch": start},
        "message_count": count,
        "topics_with_message_count": [
            {"topic_metadata": {"name": t.topic, "type": t.msgtype, "serialization_format": t.serialization_format,
                                "offered_qos_profiles": t.qos, "type_description_hash": t.digest},
             "message_count": t.count}
            for t in topics],
        "compression_format": "",
        "compression_mode": "",
        "files": [{"path": file_name, "starting_time": {"nanoseconds_since_epoch": start},
                   "duration": {"nanoseconds": duration}, "message_count": count}],
        "custom_data": custom_data or None,
        "ros_distro": "diffsim_ros",
    }
    return _dump_yaml({"rosbag2_bagfile_information": info})


def _serialized_metadata(text: str) -> str:
    """Return the body of metadata.yaml (without the top-level key), as rosbag2 stores it in the MCAP file."""
    info = _yaml().load(text)["rosbag2_bagfile_information"]
    return _dump_yaml(info).strip()


def qos_yaml(qos: List[Dict[str, Any]]) -> str:
    """Return the offered_qos_profiles string of an MCAP channel (rosbag2 v9: a YAML list)."""
    return _dump_yaml(qos).strip()


class McapBagWriter:
    """A rosbag2 bag directory with one MCAP file, flushed at least every ``flush_period_s``.

        with McapBagWriter("run1") as w:
            c = w.add_connection("/joint_states", "sensor_msgs/msg/JointState", typestore=store)
            w.write(c, receive_ns, cdr_bytes)

    ``path`` must not exist. ``fsync``: each flush also fsyncs the file (and the directory
    after metadata.yaml is replaced), so what was flushed survives a power loss, not only
    a killed process. ``clock``: monotonic seconds (for the flush schedule only).
    """

    def __init__(self, path, flush_period_s: float = 1.0, fsync: bool = True, chunk_size: int = 1 << 20,
                 clock: Callable[[], float] = time.monotonic):
        if not flush_period_s > 0:
            raise ValueError(f"flush_period_s must be > 0, got {flush_period_s}")
        self.path = Path(os.fspath(path))
        self.flush_period_s = float(flush_period_s)
        self.fsync = bool(fsync)
        self.chunk_size = int(chunk_size)
        self.clock = clock
        self.file_name = f"{self.path.name}.mcap"
        self.topics: List[Topic] = []
        self._schemas: Dict[str, int] = {}
        self._writer = None
        self._file = None
        self._pending: Dict[int, int] = {}        # topic id -> messages not yet flushed
        self._pending_since: Optional[float] = None
        self._start = self._end = None            # log time range of the flushed messages
        self._pstart = self._pend = None          # ... and of the pending ones
        self.custom_data: Dict[str, str] = {}

    # ------------------------------------------------------------------ life cycle
    def open(self) -> "McapBagWriter":
        from mcap.writer import CompressionType, Writer

        try:
            self.path.mkdir(mode=0o755, parents=True)
        except FileExistsError:
            raise AnalysisError(f"{self.path}: exists already; not overwriting it") from None
        self._file = open(self.path / self.file_name, "xb")
        self._writer = Writer(self._file, chunk_size=self.chunk_size, compression=CompressionType.NONE,
                              enable_crcs=True, enable_data_crcs=True)
        self._writer.start(profile="ros2", library="diffsim_ros (mcap-python)")
        self._sync_file()
        self._write_metadata()
        return self

    def __enter__(self) -> "McapBagWriter":
        return self.open()

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def closed(self) -> bool:
        return self._writer is None

    def add_connection(self, topic: str, msgtype: str, *, typestore=None, msgdef: Optional[str] = None,
                       digest: Optional[str] = None, offered_qos_profiles: Sequence[Any] = ()) -> Topic:
        """Register a topic; the message definition comes from ``typestore`` (rosbags) unless given.

        ``offered_qos_profiles``: rosbags ``Qos`` objects.
        """
        from rosbags.rosbag2.metadata import dump_qos_v9

        self._check_open()
        if any(t.topic == topic for t in self.topics):
            raise AnalysisError(f"{self.path}: topic '{topic}' added twice")
        if msgdef is None or digest is None:
            if typestore is None:
                raise AnalysisError(f"{self.path}: topic '{topic}': a typestore or msgdef and digest are needed")
            msgdef = typestore.generate_msgdef(msgtype, ros_version=2)[0]
            digest = typestore.hash_rihs01(msgtype)
        sid = self._schemas.get(msgtype)
        if sid is None:
            enc = "ros2idl" if msgdef.startswith("=" * 80 + "\nIDL: ") else "ros2msg"
            sid = self._schemas[msgtype] = self._writer.register_schema(msgtype, enc, msgdef.encode())
        qos = dump_qos_v9(list(offered_qos_profiles))
        cid = self._writer.register_channel(topic, "cdr", sid, {"offered_qos_profiles": qos_yaml(qos),
                                                                "topic_type_hash": digest})
        t = Topic(cid, topic, msgtype, qos, digest)
        self.topics.append(t)
        self._write_metadata()                     # readers see the topic list at once
        return t

    def write(self, conn: Topic, timestamp: int, data) -> None:
        """One serialised message; ``timestamp`` (ns) is the bag (receive) time."""
        self._check_open()
        ts = int(timestamp)
        self._writer.add_message(conn.id, log_time=ts, data=bytes(data), publish_time=ts)
        self._pending[conn.id] = self._pending.get(conn.id, 0) + 1
        self._pstart = ts if self._pstart is None else min(self._pstart, ts)
        self._pend = ts if self._pend is None else max(self._pend, ts)
        if self._pending_since is None:
            self._pending_since = self.clock()
        self.tick()

    def tick(self) -> bool:
        """Flush when the oldest unflushed message is half a flush period old.

        Call it from a timer (every quarter period) so that messages do not wait when none follow.
        True if it flushed.
        """
        if self._pending_since is not None and self.clock() - self._pending_since >= 0.5 * self.flush_period_s:
            self.flush()
            return True
        return False

    def flush(self) -> None:
        """Close the chunk in progress, write it and fsync; then rewrite metadata.yaml."""
        self._check_open()
        self._writer.flush()
        self._sync_file()
        self._settle()
        self._write_metadata()

    def close(self) -> None:
        """Finish the file (summary, index, footer) and write the final metadata.yaml."""
        if self._writer is None:
            return
        self._writer.flush()
        self._settle()
        text = self._metadata_text()
        self._writer.add_metadata(ROSBAG2_METADATA, {"serialized_metadata": _serialized_metadata(text)})
        self._writer.finish()
        self._sync_file()
        self._file.close()
        self._writer = self._file = None
        write_atomically(self.path / "metadata.yaml", text, self.fsync)

    def abort(self) -> None:
        """Close the file as it is (no summary): what a crash leaves, for tests."""
        if self._file is not None:
            self._file.close()
        self._writer = self._file = None

    # ------------------------------------------------------------------ helpers
    def _check_open(self) -> None:
        if self._writer is None:
            raise AnalysisError(f"{self.path}: the bag is not open for writing")

    def _sync_file(self) -> None:
        self._file.flush()
        if self.fsync:
            os.fsync(self._file.fileno())

    def _settle(self) -> None:
        """Pending messages are now on disk: count them."""
        by_id = {t.id: t for t in self.topics}
        for cid, n in self._pending.items():
            by_id[cid].count += n
        if self._pstart is not None:
            self._start = self._pstart if self._start is None else min(self._start, self._pstart)
            self._end = self._pend if self._end is None else max(self._end, self._pend)
        self._pending.clear()
        self._pending_since = self._pstart = self._pend = None

    def _metadata_text(self) -> str:
        return metadata_yaml(self.file_name, self.topics, self._start or 0, self._end or 0, self.custom_data)

    def _write_metadata(self) -> None:
        write_atomically(self.path / "metadata.yaml", self._metadata_text(), self.fsync)


# ---------------------------------------------------------------------------- repair
@dataclass
class RepairReport:
    """What :func:`repair` found and did."""

    path: str
    file: str
    complete: bool                 # the MCAP file had its summary and footer, every CRC held
    rewritten: bool                # the MCAP file was rebuilt
    messages: int = 0
    chunks: int = 0
    bad_chunks: List[str] = field(default_factory=list)     # chunks dropped (CRC or structure), described
    stopped: str = ""              # what ended the scan early (a cut-off or unreadable record, a bad summary)
    topics: Dict[str, int] = field(default_factory=dict)

    def summary(self) -> str:
        lines = [f"{self.path}: {self.messages} messages in {self.chunks} chunks "
                 + ("(the file was complete; metadata.yaml rewritten)" if not self.rewritten
                    else f"(rebuilt {self.file}: summary, index, footer; metadata.yaml rewritten)")]
        for t, n in self.topics.items():
            lines.append(f"  {t}: {n}")
        if self.stopped:
            lines.append(f"  {self.stopped}")
        for b in self.bad_chunks:
            lines.append(f"  dropped {b}")
        return "\n".join(lines)


def _bag_file(path: Path) -> Path:
    if path.is_file() and path.suffix == ".mcap":
        return path
    if not path.is_dir():
        raise AnalysisError(f"{path}: no such bag (expected a rosbag2 directory holding an .mcap file)")
    files = sorted(path.glob("*.mcap"))
    if not files:
        if list(path.glob("*.db3")):
            raise AnalysisError(f"{path}: sqlite3 storage; only MCAP bags can be repaired here")
        raise AnalysisError(f"{path}: no .mcap file in the bag directory; nothing to repair")
    if len(files) > 1:
        raise AnalysisError(f"{path}: {len(files)} .mcap files; repair handles one-file bags "
                            f"({', '.join(f.name for f in files)})")
    return files[0]


def _scan(f: Path, size: int):
    """Every record of the data section of ``f`` that is complete and intact, in file order.

    Returns (header, records, complete, stopped, bad_chunks, chunk count): ``records`` are
    Schema, Channel, Message and Metadata records (chunks broken up, their CRCs checked);
    ``complete``: the scan reached the footer with every CRC holding.
    """
    from mcap.records import Channel, Chunk, DataEnd, Footer, Header, Message, Metadata, Schema
    from mcap.stream_reader import StreamReader, breakup_chunk

    header, records, bad = None, [], []
    complete, stopped, chunks = False, "", 0
    with open(f, "rb") as fh:
        reader = StreamReader(fh, emit_chunks=True, validate_crcs=True, record_size_limit=max(size, 1))
        it = reader.records
        while True:
            pos = fh.tell()
            try:
                rec = next(it)
            except StopIteration:
                break
            except Exception as exc:       # truncated record, bad length, CRC of the data section, ...
                stopped = (f"the data section ends at byte {pos} ({type(exc).__name__}: {exc}); anything after "
                           f"it is lost" if size > 8 else "the file is empty")
                break
            if isinstance(rec, Header):
                header = rec
            elif isinstance(rec, Chunk):
                try:
                    inner = breakup_chunk(rec, validate_crc=True)
                except Exception as exc:
                    bad.append(f"the chunk before byte {fh.tell()} (messages t=[{rec.message_start_time}, "
                               f"{rec.message_end_time}] ns): {type(exc).__name__}: {exc}")
                    continue
                chunks += 1
                records.extend(inner)
            elif isinstance(rec, (Schema, Channel, Message, Metadata)):
                records.append(rec)
            elif isinstance(rec, DataEnd):
                pass
            elif isinstance(rec, Footer):
                complete = not bad and _summary_crc_holds(fh, rec, size)
                if not complete and not bad:
                    stopped = "the summary failed its CRC check; rebuilt from the data section"
                break
    return header, records, complete, stopped, bad, chunks


def _summary_crc_holds(fh, footer, size: int) -> bool:
    """Check the footer's summary CRC: over the summary section and the footer's first 25 bytes."""
    if not footer.summary_crc:
        return True
    start = footer.summary_start or size - 37
    if not 0 < start <= size - 37:
        return False
    fh.seek(start)
    return zlib.crc32(fh.read(size - 12 - start)) == footer.summary_crc


def repair(path) -> RepairReport:
    """Rebuild what a killed recorder could not finish (``ros2 bag reindex``'s job).

    That is the summary, chunk and message indexes and the footer of the MCAP file, and
    metadata.yaml's topics, message counts, start and duration. A complete file is left as it is
    (only metadata.yaml is rewritten from it). Chunks whose CRC fails are dropped and reported;
    the scan stops at the first record cut off or unreadable.
    """
    from mcap.records import Channel, Message, Schema
    from mcap.writer import CompressionType, Writer

    path = Path(os.fspath(path))
    f = _bag_file(path)
    bag_dir = path if path.is_dir() else path.parent
    size = f.stat().st_size
    header, records, complete, stopped, bad, nchunks = _scan(f, size)
    with open(f, "rb") as fh:
        head = fh.read(8)
    if head != b"\x89MCAP0\r\n"[:len(head)]:
        raise AnalysisError(f"{f}: not an MCAP file (no MCAP magic at its start)")

    schemas: Dict[int, Any] = {}
    channels: Dict[int, Any] = {}
    messages: List[Any] = []
    for r in records:
        if isinstance(r, Schema):
            schemas.setdefault(r.id, r)
        elif isinstance(r, Channel):
            channels.setdefault(r.id, r)
        elif isinstance(r, Message):
            messages.append(r)
    orphans = sum(1 for m in messages if m.channel_id not in channels)
    if orphans:
        bad.append(f"{orphans} message(s) of channels defined nowhere in the file")
        messages = [m for m in messages if m.channel_id in channels]

    topics: List[Topic] = []
    for cid in sorted(channels):
        ch = channels[cid]
        sch = schemas.get(ch.schema_id)
        try:
            qos = _yaml().load(ch.metadata.get("offered_qos_profiles", "[]")) or []
        except Exception:
            qos = []
        topics.append(Topic(cid, ch.topic, sch.name if sch else "", qos if isinstance(qos, list) else [],
                            ch.metadata.get("topic_type_hash", ""), ch.message_encoding))
    counts: Dict[int, int] = {}
    for m in messages:
        counts[m.channel_id] = counts.get(m.channel_id, 0) + 1
    for t in topics:
        t.count = counts.get(t.id, 0)
    start = min((m.log_time for m in messages), default=0)
    end = max((m.log_time for m in messages), default=0)
    rep = RepairReport(str(path), f.name, complete, not complete, len(messages), nchunks, bad, stopped,
                       {t.topic: t.count for t in topics})
    text = metadata_yaml(f.name, topics, start, end)

    if not complete:
        tmp = f.with_name(f.name + ".repair")
        with open(tmp, "wb") as out:
            w = Writer(out, compression=CompressionType.NONE, enable_crcs=True, enable_data_crcs=True)
            w.start(profile=(header.profile if header else "ros2") or "ros2",
                    library=(header.library if header else "") or "diffsim_ros repair")
            sid_map = {}
            for sid in sorted(schemas):
                s = schemas[sid]
                sid_map[sid] = w.register_schema(s.name, s.encoding, s.data)
            cid_map = {}
            for cid in sorted(channels):
                c = channels[cid]
                cid_map[cid] = w.register_channel(c.topic, c.message_encoding, sid_map.get(c.schema_id, 0),
                                                  dict(c.metadata))
            for m in messages:
                w.add_message(cid_map[m.channel_id], log_time=m.log_time, data=m.data,
                              publish_time=m.publish_time, sequence=m.sequence)
            w.add_metadata(ROSBAG2_METADATA, {"serialized_metadata": _serialized_metadata(text)})
            w.finish()
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, f)
        _fsync_dir(f.parent)
    write_atomically(bag_dir / "metadata.yaml", text)
    return rep
