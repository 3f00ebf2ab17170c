"""Vectorised decoding of the few CDR message layouts the analysis reads in bulk.

Deserialising message by message costs tens of microseconds each in Python, which
for a 60 s, 500 Hz bag (tens of thousands of states, commands and predictions) is
most of the analysis time. Within one topic, these messages nearly always share one
byte layout (same joint names, frame ids and array lengths), so the fields sit at
fixed offsets: the messages are joined into one (N, L) byte array and each field is
read as a strided NumPy view. Each decoder checks that the layout really is shared
(lengths, names, frame ids, sequence counts) and returns None otherwise; the caller
then falls back to rosbags' per-message deserialisation, so the result never depends
on which path ran.

CDR (XCDR1): a 4-byte encapsulation header (byte 1 = 1: little endian), then the
fields, each primitive aligned to its size relative to the end of that header;
strings are a uint32 length (with the terminating NUL) and the bytes; sequences a
uint32 count and the elements.
"""
from __future__ import annotations

import struct
import zlib
from typing import List, Optional, Sequence, Tuple

import numpy as np


class _Walker:
    """Offsets of the fields of one message, walked in declaration order."""

    def __init__(self, raw: bytes):
        if len(raw) < 4 or raw[1] != 1:
            raise ValueError("not little-endian CDR")
        self.b, self.o = raw, 4

    def align(self, n: int) -> None:
        self.o += (-(self.o - 4)) % n

    def u32(self) -> int:
        self.align(4)
        v = struct.unpack_from("<I", self.b, self.o)[0]
        self.o += 4
        return v

    def string(self) -> bytes:
        n = self.u32()
        if n == 0 or self.o + n > len(self.b):
            raise ValueError("bad string")
        s = bytes(self.b[self.o:self.o + n - 1])
        self.o += n
        return s

    def doubles(self, n: int) -> int:
        if n == 0:
            return self.o                  # nothing serialised, so no padding either
        self.align(8)
        off = self.o
        self.o += 8 * n
        if self.o > len(self.b):
            raise ValueError("truncated")
        return off

    def header(self) -> None:
        self.o = 12                     # int32 sec, uint32 nanosec
        self.string()                   # frame_id


def _rows(raws: Sequence[bytes]) -> Optional[Tuple[bytes, np.ndarray, int]]:
    """Return the messages as one buffer and an (N, L) byte view, if they all have length L."""
    L = len(raws[0])
    if any(len(r) != L for r in raws):
        return None
    buf = b"".join(raws)
    return buf, np.frombuffer(buf, dtype=np.uint8).reshape(len(raws), L), L


def _shared_layout(raws: Sequence[bytes], w: _Walker, end: int) -> Optional[Tuple[bytes, int, int]]:
    """(buffer, N, L) of :func:`_rows` when every message shares the first one's layout up to ``end``, else None.

    That is when ``w`` has walked the whole first message and every message repeats its bytes from the frame id
    up to ``end`` (names, lengths: then every later field sits at the same offset).
    """
    if w.o != len(raws[0]):
        return None
    rows = _rows(raws)
    if rows is None:
        return None
    buf, arr, L = rows
    if not (arr[:, 12:end] == arr[0, 12:end]).all():
        return None
    return buf, len(raws), L


def _f64(buf: bytes, n_rows: int, L: int, off: int, n: int) -> np.ndarray:
    return np.ndarray((n_rows, n), dtype="<f8", buffer=buf, offset=off, strides=(L, 8)).copy()


def _u32(buf: bytes, n_rows: int, L: int, off: int) -> np.ndarray:
    return np.ndarray((n_rows,), dtype="<u4", buffer=buf, offset=off, strides=(L,))


def header_stamps(raws: Sequence[bytes]) -> np.ndarray:
    """header.stamp in ns of messages that start with a std_msgs/Header (any layout)."""
    out = np.empty(len(raws), dtype=np.int64)
    for i, r in enumerate(raws):
        sec, nsec = struct.unpack_from("<iI", r, 4)
        out[i] = sec * 1_000_000_000 + nsec
    return out


def _stamps(buf: bytes, n: int, L: int) -> np.ndarray:
    sec = np.ndarray((n,), dtype="<i4", buffer=buf, offset=4, strides=(L,)).astype(np.int64)
    nsec = _u32(buf, n, L, 8).astype(np.int64)
    return sec * 1_000_000_000 + nsec


def joint_states(raws: Sequence[bytes]):
    """(stamps ns, names, position (N, n), velocity (N, n)) of sensor_msgs/JointState, or None."""
    try:
        w = _Walker(raws[0])
        w.header()
        names = [w.string().decode() for _ in range(w.u32())]
        names_end = w.o
        counts, offs = [], []
        for _ in range(3):                          # position, velocity, effort
            w.align(4)
            cnt_off = w.o
            n = w.u32()
            counts.append((cnt_off, n))
            offs.append(w.doubles(n))
    except (ValueError, struct.error, UnicodeDecodeError):
        return None
    layout = _shared_layout(raws, w, names_end)       # the same frame id and names in every message
    if layout is None:
        return None
    buf, N, L = layout
    for cnt_off, n in counts:                          # and the same sequence counts
        if not (_u32(buf, N, L, cnt_off) == n).all():
            return None
    n = len(names)
    if counts[0][1] != n or counts[1][1] != n:
        return None                                  # the caller's slow path reports it
    return _stamps(buf, N, L), names, _f64(buf, N, L, offs[0], n), _f64(buf, N, L, offs[1], n)


def odometry(raws: Sequence[bytes]):
    """(stamps ns, q, v) of nav_msgs/Odometry, or None.

    q (N, 7) = position + quaternion xyzw, v (N, 6) = twist linear + angular.
    """
    try:
        w = _Walker(raws[0])
        w.header()
        w.string()                                   # child_frame_id
        base = w.doubles(7 + 36 + 6 + 36)
    except (ValueError, struct.error):
        return None
    layout = _shared_layout(raws, w, base)            # the same frame ids in every message
    if layout is None:
        return None
    buf, N, L = layout
    block = _f64(buf, N, L, base, 7 + 36 + 6 + 36)
    return _stamps(buf, N, L), block[:, 0:7], block[:, 43:49]


def float64_arrays(raws: Sequence[bytes]):
    """(values (N, n), labels) of std_msgs/Float64MultiArray.

    ``labels[i]`` is the integer in layout.dim[0].label, or None (no dim, empty or not a number).
    None if the messages do not share their data length.
    """
    groups = {}
    for i, r in enumerate(raws):
        groups.setdefault(len(r), []).append(i)
    values: Optional[np.ndarray] = None
    labels: List[Optional[int]] = [None] * len(raws)
    width = None
    for L, idx in groups.items():
        sub = [raws[i] for i in idx]
        try:
            w = _Walker(sub[0])
            ndim_off = 4
            ndim = w.u32()
            lab = None
            for d in range(ndim):
                w.align(4)
                len_off = w.o
                s = w.string()
                if d == 0:
                    lab = (len_off + 4, len(s), len_off)
                w.u32()
                w.u32()
            w.u32()                                   # data_offset
            w.align(4)
            cnt_off = w.o
            n = w.u32()
            off = w.doubles(n)
            if w.o != L:
                return None
        except (ValueError, struct.error):
            return None
        if width is None:
            width = n
            values = np.empty((len(raws), n), dtype=np.float64)
        elif n != width:
            return None
        rows = _rows(sub)
        buf, arr, _ = rows
        N = len(sub)
        if not (_u32(buf, N, L, ndim_off) == ndim).all() or not (_u32(buf, N, L, cnt_off) == n).all():
            return None
        if lab is not None and not (_u32(buf, N, L, lab[2]) == lab[1] + 1).all():
            return None
        values[idx] = _f64(buf, N, L, off, n)
        if lab is not None and lab[1] > 0:
            digits = arr[:, lab[0]:lab[0] + lab[1]].astype(np.int64) - 48
            ok = ((digits >= 0) & (digits <= 9)).all(1)
            if lab[1] <= 18:
                num = digits @ (10 ** np.arange(lab[1] - 1, -1, -1, dtype=np.int64))
                for j, i in enumerate(idx):
                    if ok[j]:
                        labels[i] = int(num[j])
            else:
                for j, i in enumerate(idx):
                    if ok[j]:
                        labels[i] = int(bytes(arr[j, lab[0]:lab[0] + lab[1]]))
    return values, labels


# ---------------------------------------------------------------------------- MCAP
_MCAP_MAGIC = b"\x89MCAP0\r\n"
_FOOTER = 37                        # footer record (1 + 8 + 20 bytes) and the closing magic
_INT64_MAX = 2 ** 63 - 1


class McapCorrupt(ValueError):
    """An integrity check of an MCAP file failed.

    The check is a chunk, data section or summary CRC, or an impossible field; the message names
    the file and, where known, the topics and times.
    """

    def __init__(self, file: str, detail: str):
        super().__init__(f"{file}: {detail}")
        self.file, self.detail = str(file), detail


def _summary_channels(b, unpack) -> dict:
    """{channel id: topic} from the summary's repeated Channel records ({} if there is none)."""
    out = {}
    try:
        if len(b) < 8 + _FOOTER or b[-_FOOTER] != 0x02:
            return out
        start = unpack("<Q", b, len(b) - _FOOTER + 9)[0]
        o, end = start, len(b) - _FOOTER
        while start and o + 9 <= end:
            op, n = b[o], unpack("<Q", b, o + 1)[0]
            if op == 0x04:
                ln = unpack("<I", b, o + 13)[0]
                out[unpack("<H", b, o + 9)[0]] = bytes(b[o + 17:o + 17 + ln]).decode()
            o += 9 + n
    except (struct.error, UnicodeDecodeError):
        pass
    return out


def _verify_crcs(f: str, b) -> None:
    """Check the footer's summary CRC and the data end record's data section CRC, where written (non-zero)."""
    if len(b) < 8 + _FOOTER or b[-_FOOTER] != 0x02 or bytes(b[-8:]) != _MCAP_MAGIC:
        raise McapCorrupt(f, "no MCAP footer at the end of the file (truncated, or the recorder was killed: "
                          "`diffsim-ros bag repair` rebuilds it)")
    foot = len(b) - _FOOTER
    summary_start, _, summary_crc = struct.unpack_from("<QQI", b, foot + 9)
    if summary_start and not 8 <= summary_start <= foot:
        raise McapCorrupt(f, f"the footer's summary offset {summary_start} lies outside the file")
    if summary_crc:
        got = zlib.crc32(memoryview(b)[summary_start or foot:len(b) - 12])
        if got != summary_crc:
            raise McapCorrupt(f, "the summary (index) fails its CRC check; `diffsim-ros bag repair` rebuilds it")
    if summary_start:
        de = summary_start - 13                       # the data end record precedes the summary
        if de < 8 or b[de] != 0x0F or struct.unpack_from("<Q", b, de + 1)[0] != 4:
            raise McapCorrupt(f, f"no data end record before the summary at byte {summary_start}")
        data_crc = struct.unpack_from("<I", b, de + 9)[0]
        if data_crc and zlib.crc32(memoryview(b)[:de]) != data_crc:
            raise McapCorrupt(f, "the data section fails its CRC check (a record header or index between "
                              "chunks is damaged)")


def mcap_messages(files: Sequence[str], topics: Sequence[str], verify: bool = True):
    """{topic: (log times ns (N,), [message bytes])} of uncompressed MCAP files, in time order.

    The order is stable (equal times keep their order in the file). None when a file has something
    this reader does not handle (compressed chunks, an unexpected record), so that the caller reads
    it with rosbags instead. rosbags parses every record through file-like objects, which costs
    several microseconds a message; here one loop over the raw bytes finds them.

    ``verify``: check every chunk's CRC (a mismatch raises :class:`McapCorrupt` naming the
    chunk's topics and time span), then the data section and summary CRCs of the file, and
    refuse log times beyond int64. Old files without CRCs (zero) are read unchecked.
    ``topics`` may be empty; the returned dict also maps ``None`` to {channel topic: schema name}
    of every channel met.

    MCAP records: opcode (uint8), length (uint64), content. Schema (0x03): id uint16, name
    string, ...; Channel (0x04): id uint16, schema_id uint16, topic string; Message (0x05):
    channel_id uint16, sequence uint32, log_time uint64, publish_time uint64, data; Chunk (0x06):
    start, end, uncompressed size (uint64), crc (uint32), compression string, records
    (uint64-sized) holding more records; Message index (0x07): channel_id uint16, ...
    Strings are uint32-length-prefixed.
    """
    unpack = struct.unpack_from
    channels = {}
    schemas, all_channels = {}, {}
    found = {t: ([], []) for t in topics}
    for f in files:
        with open(f, "rb") as fh:
            b = fh.read()
        if not b.startswith(_MCAP_MAGIC):
            return None
        names = None                                       # channel names for error messages, on demand
        handled = True
        pending = [(b, len(_MCAP_MAGIC), len(b))]
        while pending and handled:
            buf, o, end = pending.pop()
            while o + 9 <= end:
                op = buf[o]
                n = unpack("<Q", buf, o + 1)[0]
                c = o + 9
                rec = o
                o = c + n
                if o > end:
                    handled = False                        # a record runs past the end: truncated
                    break
                if op == 0x05:
                    ch = unpack("<H", buf, c)[0]
                    topic = channels.get(ch)
                    if topic is not None:
                        t = unpack("<Q", buf, c + 6)[0]
                        if t > _INT64_MAX:
                            raise McapCorrupt(f, f"topic '{topic}': a message has log time {t} ns, beyond "
                                              f"int64 (corrupt)")
                        lst = found[topic]
                        lst[0].append(t)
                        lst[1].append(buf[c + 22:o])
                elif op == 0x04:
                    ch, sid = unpack("<HH", buf, c)
                    ln = unpack("<I", buf, c + 4)[0]
                    topic = bytes(buf[c + 8:c + 8 + ln]).decode()
                    all_channels[topic] = schemas.get(sid, "")
                    if topic in found:
                        channels[ch] = topic
                elif op == 0x03:
                    sid = unpack("<H", buf, c)[0]
                    ln = unpack("<I", buf, c + 2)[0]
                    schemas[sid] = bytes(buf[c + 6:c + 6 + ln]).decode()
                elif op == 0x06:
                    t0, t1, _, crc = unpack("<QQQI", buf, c)
                    ln = unpack("<I", buf, c + 28)[0]
                    if ln != 0:
                        handled = False                    # compressed: leave it to rosbags
                        break
                    r = c + 32 + ln
                    rlen = unpack("<Q", buf, r)[0]
                    if r + 8 + rlen > o:
                        handled = False
                        break
                    if verify and crc and zlib.crc32(memoryview(buf)[r + 8:r + 8 + rlen]) != crc:
                        if names is None:
                            names = _summary_channels(b, unpack)
                        ids, k = [], o
                        while k + 11 <= len(b) and b[k] == 0x07:   # the chunk's message indexes name its channels
                            ids.append(unpack("<H", b, k + 9)[0])
                            k += 9 + unpack("<Q", b, k + 1)[0]
                        which = ", ".join(f"'{names[i]}'" if i in names else f"channel {i}" for i in ids)
                        raise McapCorrupt(f, f"the chunk at byte {rec} fails its CRC check: messages of "
                                          f"t=[{t0}, {t1}] ns" + (f" on {which}" if which else "") + " are damaged")
                    # Inner records are scanned after this level, in file order per chunk: a
                    # stable sort by log time afterwards restores the bag's order.
                    pending.insert(0, (buf, r + 8, r + 8 + rlen))
                elif op == 0x0F:                           # data end: the summary follows
                    break
        if verify:
            _verify_crcs(f, b)
        if not handled:
            return None
    out = {}
    for topic, (times, datas) in found.items():
        t = np.asarray(times, dtype=np.int64)
        order = np.argsort(t, kind="stable")
        out[topic] = (t[order], [datas[i] for i in order])
    out[None] = all_channels
    return out
