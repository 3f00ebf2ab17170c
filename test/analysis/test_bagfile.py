"""Bags that survive a crash and corrupt bags that never crash the analysis (issue 15).

* repair: a bag written by the recorder's writer (analysis.bagfile.McapBagWriter), cut at
  random offsets as a killed process leaves it, is rebuilt by ``repair`` and then read by
  rosbags and by the independent ``mcap`` package's indexed reader, holding every message
  flushed before the cut;
* fuzz: a small recorded bag mutated hundreds of ways (truncations, flipped bytes in record
  headers, payloads, chunk headers, the summary and index, metadata.yaml): ``read_bag``
  either raises the project's AnalysisError naming the bag or returns exactly the intact
  bag's data; a few through the real CLI exit 2 with one line on stderr, no traceback;
* the timing report computes latency only where header stamps and receive times share a clock.

Random draws print their seed so a failure replays.
"""
from __future__ import annotations

import random
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("rosbags")
mcap_reader = pytest.importorskip("mcap.reader", reason="the mcap package reads the bags independently")

from diffsim_ros.analysis import AnalysisError, BagWriter, read_bag  # noqa: E402
from diffsim_ros.analysis.bag import timing_stats  # noqa: E402
from diffsim_ros.analysis.bagfile import McapBagWriter, repair  # noqa: E402

NAMES = ["arm_joint1", "arm_joint2", "arm_joint3", "arm_joint4"]


def _seed(tag: str) -> random.Random:
    seed = random.SystemRandom().randrange(2 ** 31)
    print(f"{tag}: seed {seed}")
    return random.Random(seed)


def _store():
    from rosbags.typesys import Stores, get_typestore

    return get_typestore(Stores.ROS2_JAZZY)


def _mcap(bag: Path) -> Path:
    (f,) = bag.glob("*.mcap")
    return f


def _read_independently(bag: Path):
    """(rosbags: [(topic, time, bytes)], mcap package: [(topic, time, bytes)], mcap summary)."""
    from rosbags.highlevel import AnyReader
    from rosbags.typesys import Stores, get_typestore

    with AnyReader([bag], default_typestore=get_typestore(Stores.EMPTY)) as r:
        a = [(c.topic, t, bytes(raw)) for c, t, raw in r.messages()]
    with open(_mcap(bag), "rb") as f:
        reader = mcap_reader.make_reader(f, validate_crcs=True)
        summary = reader.get_summary()
        b = [(ch.topic, m.log_time, bytes(m.data)) for _, ch, m in reader.iter_messages(log_time_order=True)]
    return a, b, summary


# ------------------------------------------------------------------------------ repair
def test_repair_of_cut_files_keeps_every_flushed_message(tmp_path):
    """Repair of a cut-off bag keeps exactly the messages flushed before the cut.

    A writer that flushed every 40 messages and was then cut off (the file truncated at a
    random offset, no summary, no footer, a stale metadata.yaml): repair keeps exactly the
    messages flushed at or before the cut, which rosbags and the mcap reader then read.
    """
    rng = _seed("repair cuts")
    store = _store()
    src = tmp_path / "src"
    w = McapBagWriter(src, fsync=False).open()
    c1 = w.add_connection("/counter", "std_msgs/msg/Float64MultiArray", typestore=store)
    c2 = w.add_connection("/text", "std_msgs/msg/String", typestore=store)
    F, S = store.types["std_msgs/msg/Float64MultiArray"], store.types["std_msgs/msg/String"]
    sizes, written = [], []                        # (file size, messages on disk) after each flush
    for i in range(400):
        if i % 3 == 2:
            data, conn = store.serialize_cdr(S(data=f"message {i}"), "std_msgs/msg/String"), c2
        else:
            data, conn = store.serialize_cdr(F(layout=store.types["std_msgs/msg/MultiArrayLayout"](
                dim=[], data_offset=0), data=np.array([float(i)])), "std_msgs/msg/Float64MultiArray"), c1
        w.write(conn, 1_000_000_000 + i * 2_000_000, data)
        written.append((conn.topic, 1_000_000_000 + i * 2_000_000, bytes(data)))
        if i % 40 == 39:
            w.flush()
            sizes.append((_mcap(src).stat().st_size, i + 1))
    w.abort()                                      # killed: no summary, no footer
    full = _mcap(src).read_bytes()
    meta = (src / "metadata.yaml").read_text()
    cuts = [len(full), 0, 8] + [rng.randrange(0, len(full)) for _ in range(7)] + [s for s, _ in sizes[:2]]
    for k, cut in enumerate(cuts):
        bag = tmp_path / f"cut{k}"
        bag.mkdir()
        (bag / "metadata.yaml").write_text(meta)
        (bag / "src.mcap").write_bytes(full[:cut])
        rep = repair(bag)
        # Everything flushed before the cut; one chunk more when the cut only took its message indexes.
        expect = max([n for s, n in sizes if s <= cut], default=0)
        a, b, summary = _read_independently(bag)
        print(f"cut at {cut} of {len(full)} bytes: {rep.messages} messages recovered, {expect} expected")
        assert rep.messages in (expect, expect + 40) and rep.rewritten and not rep.bad_chunks
        assert a == b == written[:rep.messages]
        assert summary.statistics.message_count == rep.messages
        with pytest.raises(AnalysisError, match="no state topic"):
            read_bag(bag)                          # opens (then finds no robot topics): the bag is whole again
    # A complete bag is left as it is.
    done = tmp_path / "cut0"
    before = _mcap(done).read_bytes()
    rep = repair(done)
    assert not rep.rewritten and rep.complete and _mcap(done).read_bytes() == before


def test_repair_drops_a_chunk_whose_crc_fails(tmp_path):
    rng = _seed("repair crc")
    bag = tmp_path / "bag"
    _small_bag(bag, steps=40)
    a0, _, _ = _read_independently(bag)
    f = _mcap(bag)
    b = bytearray(f.read_bytes())
    chunks = [r for r in _records(bytes(b)) if r[0] == 0x06]
    op, at, body, end = chunks[len(chunks) // 2]
    inner = body + 32 + 8                          # uncompressed: content after the compression string and size
    b[rng.randrange(inner, end)] ^= 0x40
    f.write_bytes(bytes(b))
    rep = repair(bag)
    assert rep.rewritten and len(rep.bad_chunks) == 1 and "CRC" in rep.bad_chunks[0]
    a, bb, _ = _read_independently(bag)
    assert a == bb and 0 < len(a) < len(a0) and set(a) <= set(a0)


# ------------------------------------------------------------------------------ fuzz
def _small_bag(path: Path, steps: int = 30, receive_offset_ns: int = 0) -> None:
    """Write an arm bag like the stand-in's, in small chunks.

    The bag holds metadata, states, labelled commands and predictions, in small chunks so that
    a mutation hits one of several. ``receive_offset_ns``: added to the receive times (a wall
    clock against simulated header stamps, as in a lockstep run).
    """
    from diffsim_ros.testing.recordings import standard_params

    params = standard_params("arm")
    rng = np.random.default_rng(0)
    with BagWriter(path, chunk_size=1500) as w:
        off = receive_offset_ns
        w.metadata({"config": params}, receive_ns=100_000_000_000 + off)
        for i in range(steps):
            t = 100_000_000_000 + i * 20_000_000
            q, v = rng.normal(size=4) * 0.3, rng.normal(size=4) * 0.1
            w.joint_state(t, NAMES, q, v, receive_ns=t + 200_000 + off)
            w.command(t + 400_000 + off, rng.normal(size=4) * 0.5, t)
            w.joint_state(t + 20_000_000, NAMES, q, v * 1.01, receive_ns=t + 400_000 + off,
                          topic="/diffsim/predicted_state")


def _records(b: bytes):
    """Return the top-level records and those inside uncompressed chunks.

    (opcode, record start, content start, content end) of the top-level records, and inside
    uncompressed chunks, as far as the lengths are sane.
    """
    out, pending = [], [(8, len(b))]
    while pending:
        o, end = pending.pop(0)
        while o + 9 <= end:
            op, n = b[o], int.from_bytes(b[o + 1:o + 9], "little")
            if o + 9 + n > end:
                break
            out.append((op, o, o + 9, o + 9 + n))
            if op == 0x06 and b[o + 9 + 28:o + 9 + 32] == b"\0\0\0\0":
                pending.append((o + 9 + 40, o + 9 + n))
            o += 9 + n
    return out


def _same(a, b) -> bool:
    for name in ("kind", "state_topic", "joint_names", "command_topic", "cmd_names", "cmd_stamp_source",
                 "pred_joint_names", "metadata", "warnings", "storage"):
        if getattr(a, name) != getattr(b, name):
            return False
    for name in ("t_state", "q", "v", "cmd_state_stamp", "cmd", "pred_t", "pred_v"):
        x, y = getattr(a, name), getattr(b, name)
        if (x is None) != (y is None) or (x is not None and (x.shape != y.shape or not np.array_equal(x, y))):
            return False
    return {t: s.as_dict() for t, s in a.topics.items()} == {t: s.as_dict() for t, s in b.topics.items()}


def _mutations(rng: random.Random, b: bytes, meta: bytes, n_each: int):
    """Return (description, new mcap bytes, new metadata.yaml bytes) of every kind of damage."""
    recs = _records(b)
    footer = len(b) - 37
    summary_start = int.from_bytes(b[footer + 9:footer + 17], "little")
    heads = [r for r in recs if r[1] < summary_start]
    payloads = [r for r in recs if r[0] == 0x05]
    chunks = [r for r in recs if r[0] == 0x06]
    index = [r for r in recs if r[0] == 0x07]

    def flip(data: bytes, at: int) -> bytes:
        x = bytearray(data)
        x[at] ^= rng.randrange(1, 256)
        return bytes(x)

    for _ in range(n_each):
        cut = rng.randrange(0, len(b))
        yield f"mcap truncated at {cut}", b[:cut], meta
        op, at, body, end = rng.choice(heads)
        pos = rng.randrange(at, body)               # opcode or length of a record (top level or in a chunk)
        yield f"record header byte {pos} (opcode {op:#x})", flip(b, pos), meta
        op, at, body, end = rng.choice(payloads)
        pos = rng.randrange(body, end)
        yield f"message record byte {pos}", flip(b, pos), meta
        op, at, body, end = rng.choice(chunks)
        pos = rng.randrange(body, body + 40)        # times, sizes, CRC, compression, length
        yield f"chunk header byte {pos}", flip(b, pos), meta
        op, at, body, end = rng.choice(index)
        pos = rng.randrange(at, end)
        yield f"message index byte {pos}", flip(b, pos), meta
        pos = rng.randrange(summary_start, len(b))
        yield f"summary/footer byte {pos}", flip(b, pos), meta
        pos = rng.randrange(0, len(meta))
        yield f"metadata.yaml byte {pos}", b, flip(meta, pos)
        cut = rng.randrange(0, len(meta))
        yield f"metadata.yaml truncated at {cut}", b, meta[:cut]


FUZZ_ROUNDS = 30            # x 8 kinds of damage = 240 mutated bags


def test_fuzz_corrupt_bags_raise_analysis_error_or_read_the_same(tmp_path):
    rng = _seed("bag fuzz")
    intact = tmp_path / "intact"
    _small_bag(intact)
    ref = read_bag(intact)
    b, meta = _mcap(intact).read_bytes(), (intact / "metadata.yaml").read_bytes()
    bag = tmp_path / "damaged"
    counts = {"error": 0, "same": 0}
    for desc, nb, nm in _mutations(rng, b, meta, FUZZ_ROUNDS):
        shutil.rmtree(bag, ignore_errors=True)
        bag.mkdir()
        (bag / "intact.mcap").write_bytes(nb)
        (bag / "metadata.yaml").write_bytes(nm)
        try:
            got = read_bag(bag)
        except AnalysisError as exc:
            assert str(bag) in str(exc), (desc, str(exc))
            assert "\n" not in str(exc), (desc, str(exc))
            counts["error"] += 1
            continue
        except Exception as exc:                    # anything else is a failure, with the damage that caused it
            raise AssertionError(f"{desc}: {type(exc).__name__}: {exc}") from exc
        assert _same(got, ref), desc
        counts["same"] += 1
    print(f"{sum(counts.values())} mutated bags: {counts['error']} AnalysisError naming the bag, "
          f"{counts['same']} read exactly as the intact bag")
    assert sum(counts.values()) >= 200


def test_crc_mismatch_names_bag_topic_and_time(tmp_path):
    bag = tmp_path / "bag"
    _small_bag(bag)
    f = _mcap(bag)
    b = bytearray(f.read_bytes())
    # The second message: the first state (the first is the metadata, alone in its chunk).
    op, at, body, end = [r for r in _records(bytes(b)) if r[0] == 0x05][1]
    b[end - 3] ^= 0xFF
    f.write_bytes(bytes(b))
    with pytest.raises(AnalysisError) as exc:
        read_bag(bag)
    text = str(exc.value)
    assert str(bag) in text and "CRC" in text and "/joint_states" in text and "t=[100000200000, " in text, text


def test_log_time_beyond_int64_in_a_bag_without_crcs(tmp_path):
    """Rosbags' own writer (no CRCs): a log time with the top bit set is refused, naming the topic."""
    from rosbags.rosbag2 import StoragePlugin, Writer

    store = _store()
    bag = tmp_path / "old"
    with Writer(bag, version=9, storage_plugin=StoragePlugin.MCAP) as w:
        c = w.add_connection("/joint_states", "sensor_msgs/msg/JointState", typestore=store)
        for i in range(5):
            msg = store.types["sensor_msgs/msg/JointState"](
                header=store.types["std_msgs/msg/Header"](
                    stamp=store.types["builtin_interfaces/msg/Time"](sec=100 + i, nanosec=0), frame_id=""),
                name=["a"], position=np.zeros(1), velocity=np.zeros(1), effort=np.zeros(0))
            w.write(c, (100 + i) * 10 ** 9, store.serialize_cdr(msg, "sensor_msgs/msg/JointState"))
    f = _mcap(bag)
    b = bytearray(f.read_bytes())
    op, at, body, end = [r for r in _records(bytes(b)) if r[0] == 0x05][2]
    b[body + 6 + 7] |= 0x80                          # log_time's most significant byte
    f.write_bytes(bytes(b))
    with pytest.raises(AnalysisError, match=r"/joint_states.*log time \d+ ns") as exc:
        read_bag(bag)
    assert str(bag) in str(exc.value)


def test_cli_reports_corrupt_bags_in_one_line(tmp_path):
    """The real CLI: exit status 2, one line on stderr naming the bag, no traceback."""
    rng = _seed("cli corrupt")
    intact = tmp_path / "intact"
    _small_bag(intact)
    b = _mcap(intact).read_bytes()
    payloads = [r for r in _records(b) if r[0] == 0x05]
    hit = rng.randrange(payloads[5][2], payloads[5][3])
    cases = {
        "truncated": (b[:rng.randrange(len(b) // 4, len(b) - 40)], None),
        "payload": (b[:hit] + bytes([b[hit] ^ 0x20]) + b[hit + 1:], None),
        "summary": (b[:-60] + bytes([b[-60] ^ 0x01]) + b[-59:], None),
        "yaml": (b, b"rosbag2_bagfile_information: {version: [\n"),
    }
    for name, (nb, nm) in cases.items():
        bag = tmp_path / name
        shutil.copytree(intact, bag)
        (bag / "intact.mcap").write_bytes(nb)
        if nm is not None:
            (bag / "metadata.yaml").write_bytes(nm)
        cmd = ["analyze", str(bag), "--no-plots"] if name != "payload" else \
            ["sysid", str(bag), "--params", "joint_damping", "--out", str(tmp_path / "sysid")]
        r = subprocess.run([sys.executable, "-m", "diffsim_ros.cli", *cmd], capture_output=True, text=True,
                           timeout=120)
        print(f"{name}: {r.stderr.strip()}")
        assert r.returncode == 2, r.stdout + r.stderr
        assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
        assert r.stderr.startswith("error: ") and str(bag) in r.stderr


# ------------------------------------------------------------------------------ latency
def test_latency_only_where_stamps_and_receive_times_share_a_clock():
    stamps = np.arange(100, dtype=np.int64) * 10_000_000 + 5_000_000_000          # simulated time, from 5 s
    wall = stamps + 1_760_000_000_000_000_000                                     # received on the wall clock
    lockstep = timing_stats("/odom", "nav_msgs/msg/Odometry", stamps, wall, True)
    assert lockstep.latency_mean_s is None and lockstep.latency_max_s is None
    assert "another clock" in lockstep.latency_note
    same = timing_stats("/odom", "nav_msgs/msg/Odometry", stamps, stamps + 300_000, True)
    assert same.latency_mean_s == pytest.approx(3e-4) and same.latency_note == ""


def test_report_of_a_lockstep_bag_says_latency_is_not_computed(tmp_path):
    """A lockstep bag's report says why it gives no latency figure.

    Header stamps in simulated time (100 s), receive times on the wall clock: report.md has
    no latency figure and says why; the same bag on one clock reports 0.2 ms on the states.
    """
    from diffsim_ros.analysis import analyze

    _small_bag(tmp_path / "lockstep", receive_offset_ns=1_760_000_000_000_000_000)
    m = analyze(tmp_path / "lockstep", out_dir=tmp_path / "a", horizons=(1,), plots=False)
    assert all(s["latency_mean_s"] is None for s in m["topics"].values())
    md = (tmp_path / "a" / "report.md").read_text()
    assert "header stamps are on another clock (simulated time)" in md and "e+12" not in md
    _small_bag(tmp_path / "same", receive_offset_ns=0)
    m = analyze(tmp_path / "same", horizons=(1,), plots=False)
    assert m["topics"]["/joint_states"]["latency_mean_s"] == pytest.approx(2e-4)


def test_a_diverging_replay_names_the_bag(tmp_path):
    """A diverging replay raises an AnalysisError naming the bag and the topics.

    Finite but absurd recorded states (intact CRCs: they were recorded so) make the simulator
    diverge: an AnalysisError naming the bag and the topics, not a bare simulator error.
    """
    from diffsim_ros.analysis import analyze
    from diffsim_ros.testing.recordings import standard_params

    bag = tmp_path / "absurd"
    with BagWriter(bag) as w:
        w.metadata({"config": standard_params("arm")}, receive_ns=100_000_000_000)
        for i in range(20):
            t = 100_000_000_000 + i * 20_000_000
            w.joint_state(t, NAMES, np.full(4, 1e300), np.full(4, 1e300), receive_ns=t + 200_000)
            w.command(t + 400_000, np.full(4, 1e300), t)
    with pytest.raises(AnalysisError) as exc:
        analyze(bag, horizons=(1,), plots=False)
    text = str(exc.value)
    print(text)
    assert str(bag) in text and "/joint_states" in text and "/diffsim/command" in text, text
