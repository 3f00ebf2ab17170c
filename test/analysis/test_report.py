"""Tests of ``diffsim-ros analyze``.

Bag reading (MCAP and sqlite3), alignment, the timing report, k-step velocity comparison
against bags the MuJoCo stand-in records here, and clear errors for bad bags.
"""
from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

pytest.importorskip("rosbags")
pytest.importorskip("mujoco")

from diffsim_ros import cli  # noqa: E402
from diffsim_ros.analysis import AnalysisError, BagWriter, analyze, read_bag  # noqa: E402
from diffsim_ros.testing.recordings import PERTURBATIONS, record_standard, standard_params, write_recording  # noqa: E402

STEPS = 250


@pytest.fixture(scope="module")
def bags(tmp_path_factory):
    """MuJoCo stand-in recordings: {(kind, "nominal"|"perturbed"): (path, recorded arrays)}."""
    root = tmp_path_factory.mktemp("bags")
    out = {}
    for kind in ("arm", "quadrotor"):
        for name, pert in (("nominal", {}), ("perturbed", PERTURBATIONS[kind])):
            path = root / f"{kind}_{name}"
            out[(kind, name)] = (path, record_standard(kind, path, pert, steps=STEPS))
    return out


# ------------------------------------------------------------------------------ the gap
@pytest.mark.parametrize("kind", ["arm", "quadrotor"])
def test_analyze_reports_the_gap_of_the_perturbed_plant(bags, kind, tmp_path):
    nominal = analyze(bags[(kind, "nominal")][0], horizons=(1, 5, 10), plots=False)
    out = tmp_path / "report"
    pert = analyze(bags[(kind, "perturbed")][0], out_dir=out, horizons=(1, 5, 10))
    n1, p1 = nominal["prediction"]["by_horizon"]["1"]["rmse"], pert["prediction"]["by_horizon"]["1"]["rmse"]
    # Unperturbed, simulator and MuJoCo agree closely; perturbed, the gap is many times larger.
    assert p1 > 5 * n1, (n1, p1)
    assert pert["prediction"]["by_horizon"]["1"]["count"] >= STEPS - 10
    if kind == "quadrotor":
        assert n1 < 1e-3
        # 20 % more mass than the model: the simulator climbs faster than the robot, so the
        # vertical velocity bias is positive and grows with the horizon.
        vz = [pert["prediction"]["by_horizon"][k]["per_dof"]["vz"] for k in ("1", "5", "10")]
        assert 0 < vz[0]["bias"] < vz[1]["bias"] < vz[2]["bias"]
        assert vz[0]["rmse"] < vz[1]["rmse"] < vz[2]["rmse"]
    # Every output is written and consistent with the returned metrics.
    saved = json.loads((out / "metrics.json").read_text())
    assert saved["prediction"]["by_horizon"]["1"]["rmse"] == pytest.approx(p1)
    assert set(saved["model"]["dofs"]) == set(pert["prediction"]["by_horizon"]["1"]["per_dof"])
    for png in ("velocity.png", "error_vs_horizon.png"):
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    md = (out / "report.md").read_text()
    assert "| dof |" in md and f"{p1:.4g}" in md
    # The controller's one-step predictions in the bag are the nominal simulator's from the same
    # states and commands: for the arm (no hidden actuator state) they are the replayed ones.
    on = pert["online_prediction"]
    assert on["count"] == STEPS and on["unmatched"] == 0
    if kind == "arm":
        assert pert["prediction"]["by_horizon"]["1"]["count"] == STEPS
        assert on["rmse"] == pytest.approx(p1, rel=1e-9)


def test_cli_analyze_writes_the_report(bags, tmp_path, capsys):
    out = tmp_path / "cli"
    rc = cli.main(["analyze", str(bags[("arm", "perturbed")][0]), "--out", str(out), "--horizons", "1,3",
                   "--no-plots"])
    text = capsys.readouterr().out
    assert rc == 0
    assert "rmse@3" in text and "arm_joint4" in text
    m = json.loads((out / "metrics.json").read_text())
    assert m["prediction"]["horizons"] == [1, 3]


# ------------------------------------------------------------------------------ storage and alignment
def test_sqlite3_bag_reads_like_mcap(bags, tmp_path):
    _, rec = bags[("quadrotor", "perturbed")]
    write_recording(tmp_path / "sq", rec, [], True, rec["params"], storage="sqlite3")
    a, b = read_bag(bags[("quadrotor", "perturbed")][0]), read_bag(tmp_path / "sq")
    assert (a.storage, b.storage) == ("mcap", "sqlite3")
    np.testing.assert_array_equal(a.t_state, b.t_state)
    np.testing.assert_array_equal(a.v, b.v)
    np.testing.assert_array_equal(a.cmd, b.cmd)
    np.testing.assert_array_equal(a.cmd_state_stamp, b.cmd_state_stamp)


def test_receive_time_fallback_aligns_like_the_stamp_labels(bags, tmp_path):
    _, rec = bags[("arm", "perturbed")]
    write_recording(tmp_path / "nolabel", rec, ["arm_joint1", "arm_joint2", "arm_joint3", "arm_joint4"], False,
                    rec["params"], labels=False)
    lab, rcv = read_bag(bags[("arm", "perturbed")][0]), read_bag(tmp_path / "nolabel")
    assert (lab.cmd_stamp_source, rcv.cmd_stamp_source) == ("label", "receive")
    np.testing.assert_array_equal(lab.cmd_state_stamp, rcv.cmd_state_stamp)
    m1 = analyze(None, data=lab, horizons=(1,), plots=False)
    m2 = analyze(None, data=rcv, horizons=(1,), plots=False)
    assert m1["prediction"]["by_horizon"]["1"]["rmse"] == m2["prediction"]["by_horizon"]["1"]["rmse"]


def _arm_bag(path, stamps_ms, receive_order=None, names=None, label_offset_ms=0.0, state_type=None,
             commands=True, states=True, metadata=True):
    """Write a small arm bag with states at the given stamps (ms) and one command per state."""
    params = standard_params("arm")
    names = names or ["arm_joint1", "arm_joint2", "arm_joint3", "arm_joint4"]
    order = receive_order if receive_order is not None else range(len(stamps_ms))
    with BagWriter(path) as w:
        if metadata:
            w.metadata({"config": params})
        for r, i in enumerate(order):
            t = int(round((100_000 + stamps_ms[i]) * 1e6))
            recv = int(round((100_000 + r * 10 + 0.2) * 1e6))
            if states and state_type is None:
                w.joint_state(t, names, np.zeros(4), np.full(4, 0.01 * i), receive_ns=recv)
            elif states:
                msg = w.store.types[state_type](data="not a joint state")
                w.raw("/joint_states", state_type, recv, msg)
            if commands:
                w.command(recv + 100_000, np.zeros(4), t + int(round(label_offset_ms * 1e6)))


def test_timing_report_counts_drops_duplicates_and_out_of_order(tmp_path):
    # 100 Hz stamps; 3 messages dropped after the 10th, the 20th repeated twice, the 31st and
    # 32nd received swapped, and one interval 0.3 ms late.
    stamps = [10.0 * i for i in range(60) if i not in (11, 12, 13)]
    stamps[40] += 0.3
    stamps = stamps[:20] + [stamps[19], stamps[19]] + stamps[20:]
    order = list(range(len(stamps)))
    order[30], order[31] = order[31], order[30]
    _arm_bag(tmp_path / "timing", stamps, receive_order=order)
    d = read_bag(tmp_path / "timing")
    st = d.topics["/joint_states"]
    assert (st.count, st.drops, st.duplicates, st.out_of_order) == (len(stamps), 3, 2, 1)
    assert st.rate_hz == pytest.approx(100.0)
    assert st.jitter_max_s == pytest.approx(0.3e-3, rel=1e-6)
    assert len(d.t_state) == len(stamps) - 2 and np.all(np.diff(d.t_state) > 0)


# ------------------------------------------------------------------------------ bad bags
def _run(capsys, *argv):
    rc = cli.main(["analyze", *map(str, argv), "--no-plots"])
    return rc, capsys.readouterr().err


def test_bad_bag_truncated(bags, tmp_path, capsys):
    bag = tmp_path / "truncated"
    shutil.copytree(bags[("arm", "nominal")][0], bag)
    mcap = next(bag.glob("*.mcap"))
    mcap.write_bytes(mcap.read_bytes()[: mcap.stat().st_size // 2])
    rc, err = _run(capsys, bag)
    assert rc == 2 and "truncated" in err and str(bag) in err
    (bag / "metadata.yaml").unlink()
    rc, err = _run(capsys, bag)
    assert rc == 2 and "metadata.yaml is missing" in err


def test_bad_bag_missing_topics(tmp_path, capsys):
    _arm_bag(tmp_path / "nostates", [10.0 * i for i in range(5)], states=False)
    rc, err = _run(capsys, tmp_path / "nostates")
    assert rc == 2 and "no state topic" in err and "/joint_states" in err and "/diffsim/command" in err
    _arm_bag(tmp_path / "nocmd", [10.0 * i for i in range(5)], commands=False)
    rc, err = _run(capsys, tmp_path / "nocmd")
    assert rc == 2 and "no command topic" in err and "/diffsim/command" in err
    rc, err = _run(capsys, tmp_path / "nowhere")
    assert rc == 2 and "no such bag" in err


def test_bad_bag_wrong_message_type(tmp_path, capsys):
    _arm_bag(tmp_path / "wrongtype", [10.0 * i for i in range(5)], state_type="std_msgs/msg/String")
    rc, err = _run(capsys, tmp_path / "wrongtype")
    assert rc == 2 and "'/joint_states' has message type std_msgs/msg/String" in err
    assert "sensor_msgs/msg/JointState" in err


def test_bad_bag_no_overlap_in_time(tmp_path, capsys):
    _arm_bag(tmp_path / "apart", [10.0 * i for i in range(20)], label_offset_ms=3_600_000.0)
    rc, err = _run(capsys, tmp_path / "apart")
    assert rc == 2 and "no overlap in time" in err and "/diffsim/command" in err and "/joint_states" in err


def test_bad_bag_joint_names_and_missing_model(tmp_path, capsys):
    _arm_bag(tmp_path / "names", [20.0 * i for i in range(20)], names=["a", "b", "c", "d"])
    rc, err = _run(capsys, tmp_path / "names")
    assert rc == 2 and "lacks joint(s)" in err and "arm_joint1" in err
    _arm_bag(tmp_path / "nometa", [20.0 * i for i in range(20)], metadata=False)
    with pytest.raises(AnalysisError, match="--config"):
        analyze(tmp_path / "nometa", plots=False)
    # ... and --config supplies the model instead.
    rc = cli.main(["analyze", str(tmp_path / "nometa"), "--config", str(cli_config()), "--no-plots"])
    assert rc == 0


def cli_config():
    from diffsim_ros import config

    return config.package_share() / "config" / "reach_arm.yaml"


def test_vectorised_decoding_matches_rosbags(bags):
    """The fast CDR path (analysis/cdr.py) reads exactly what rosbags' deserialiser reads."""
    from rosbags.highlevel import AnyReader

    from diffsim_ros.analysis import cdr
    from diffsim_ros.analysis.bag import _typestore

    for kind in ("arm", "quadrotor"):
        with AnyReader([bags[(kind, "perturbed")][0]], default_typestore=_typestore()) as r:
            by_topic = {}
            for c, _, raw in r.messages():
                by_topic.setdefault(c.topic, (c.msgtype, []))[1].append(bytes(raw))
            for topic, (msgtype, raws) in by_topic.items():
                msgs = [r.deserialize(x, msgtype) for x in raws]
                if msgtype.endswith("JointState"):
                    st, names, pos, vel = cdr.joint_states(raws)
                    assert names == list(msgs[0].name)
                    np.testing.assert_array_equal(pos, [m.position for m in msgs])
                    np.testing.assert_array_equal(vel, [m.velocity for m in msgs])
                elif msgtype.endswith("Odometry"):
                    st, q, v = cdr.odometry(raws)
                    np.testing.assert_array_equal(v[:, 3:], [[m.twist.twist.angular.x, m.twist.twist.angular.y,
                                                              m.twist.twist.angular.z] for m in msgs])
                    np.testing.assert_array_equal(q[:, 3:], [[m.pose.pose.orientation.x, m.pose.pose.orientation.y,
                                                              m.pose.pose.orientation.z, m.pose.pose.orientation.w]
                                                             for m in msgs])
                elif msgtype.endswith("Float64MultiArray"):
                    vals, labels = cdr.float64_arrays(raws)
                    np.testing.assert_array_equal(vals, [m.data for m in msgs])
                    assert labels == [int(m.layout.dim[0].label) for m in msgs]
                    continue
                else:
                    continue
                assert list(st) == [m.header.stamp.sec * 1_000_000_000 + m.header.stamp.nanosec for m in msgs]
    # A layout that changes between messages is refused (the reader then deserialises one by one).
    with AnyReader([bags[("arm", "perturbed")][0]], default_typestore=_typestore()) as r:
        raws = [bytes(raw) for c, _, raw in r.messages() if c.topic == "/joint_states"][:3]
    assert cdr.joint_states(raws[:2] + [raws[2][:-8]]) is None


@pytest.mark.parametrize("kind", ["arm", "quadrotor"])
def test_fast_mcap_scan_reads_like_rosbags(bags, kind, monkeypatch):
    """The direct MCAP scan (analysis/cdr.py mcap_messages) gives the same BagData as rosbags' reader."""
    from diffsim_ros.analysis import bag as bagmod

    path = bags[(kind, "perturbed")][0]
    fast = read_bag(path)
    assert bagmod._fast_mcap(path, ["/diffsim/command"]) is not None
    monkeypatch.setattr(bagmod, "FAST_MCAP", False)
    slow = read_bag(path)
    for field in ("t_state", "q", "v", "cmd", "cmd_state_stamp", "pred_t", "pred_v"):
        np.testing.assert_array_equal(getattr(fast, field), getattr(slow, field), err_msg=field)
    assert {t: s.as_dict() for t, s in fast.topics.items()} == {t: s.as_dict() for t, s in slow.topics.items()}


def test_mixed_message_layouts_fall_back_to_per_message_decoding(tmp_path, capsys):
    """Mixed message layouts fall back to per-message decoding.

    JointStates whose layout changes (effort present in some messages only) cannot use the
    vectorised decoder; the per-message path reads them the same, and a joint set that changes
    mid-bag is refused with the message stamp.
    """
    from diffsim_ros.analysis import cdr

    names = ["arm_joint1", "arm_joint2", "arm_joint3", "arm_joint4"]
    with BagWriter(tmp_path / "mixed") as w:
        w.metadata({"config": standard_params("arm")})
        for i in range(30):
            t = int(100e9) + i * 20_000_000
            w.joint_state(t, names, np.full(4, 0.001 * i), np.full(4, 0.01 * i),
                          effort=np.ones(4) if i % 2 else None)
            w.command(t + 1000, np.zeros(4), t)
    d = read_bag(tmp_path / "mixed")
    np.testing.assert_allclose(d.v[:, 2], 0.01 * np.arange(30))
    np.testing.assert_allclose(d.q[:, 0], 0.001 * np.arange(30))
    assert d.joint_names == names
    with BagWriter(tmp_path / "renamed") as w:
        w.metadata({"config": standard_params("arm")})
        for i in range(10):
            t = int(100e9) + i * 20_000_000
            w.joint_state(t, names if i < 5 else names[::-1], np.zeros(4), np.zeros(4))
            w.command(t + 1000, np.zeros(4), t)
    rc = cli.main(["analyze", str(tmp_path / "renamed"), "--no-plots"])
    err = capsys.readouterr().err
    assert rc == 2 and "the first message had" in err and "t=100100000000 ns" in err
    assert cdr.joint_states([b"\x00\x01\x00\x00"]) is None


def test_controller_topic_commands_map_by_the_controllers_joint_order(bags, tmp_path):
    """Commands on the controller's topic map by the controller's joint order.

    Commands recorded only on /position_controller/commands, in the controller's own joint
    order (reversed here), give the same analysis as /diffsim/command in the model's order.
    """
    _, rec = bags[("arm", "perturbed")]
    names = ["arm_joint1", "arm_joint2", "arm_joint3", "arm_joint4"]
    with BagWriter(tmp_path / "ctrl") as w:
        w.metadata({"config": rec["params"], "controller_joints": names[::-1]})
        for k, t in enumerate(np.round((rec["t"] + 100.0) * 1e9).astype(np.int64)):
            w.joint_state(t, names, rec["q"][k], rec["v"][k], receive_ns=t + 1000)
            if k < len(rec["cmd"]):
                w.command(t + 2000, rec["cmd"][k][::-1], None, topic="/position_controller/commands")
    ref = analyze(bags[("arm", "perturbed")][0], horizons=(1, 3), plots=False)
    got = analyze(tmp_path / "ctrl", horizons=(1, 3), plots=False)
    assert got["alignment"]["command_topic"] == "/position_controller/commands"
    assert got["alignment"]["command_stamps"] == "receive"
    for k in ("1", "3"):
        assert got["prediction"]["by_horizon"][k]["rmse"] == pytest.approx(ref["prediction"]["by_horizon"][k]["rmse"],
                                                                          rel=1e-12)


def test_cmd_ctbr_interface_topic_aligns_by_header_stamp(bags, tmp_path):
    """The /cmd_ctbr interface topic aligns by header stamp.

    Without /diffsim/command, /cmd_ctbr (TwistStamped: thrust in linear.z, rates in angular)
    stamped with its state's time gives the same analysis.
    """
    _, rec = bags[("quadrotor", "perturbed")]
    with BagWriter(tmp_path / "ctbr") as w:
        w.metadata({"config": rec["params"]})
        for k, t in enumerate(np.round((rec["t"] + 100.0) * 1e9).astype(np.int64)):
            w.odometry(t, rec["q"][k], rec["v"][k], receive_ns=t + 1000)
            if k < len(rec["cmd"]):
                w.ctbr(t, rec["cmd"][k], receive_ns=t + 2000)
    ref = analyze(bags[("quadrotor", "perturbed")][0], horizons=(1, 5), plots=False)
    got = analyze(tmp_path / "ctbr", horizons=(1, 5), plots=False)
    assert (got["alignment"]["command_topic"], got["alignment"]["command_stamps"]) == ("/cmd_ctbr", "header")
    for k in ("1", "5"):
        assert got["prediction"]["by_horizon"][k]["rmse"] == pytest.approx(ref["prediction"]["by_horizon"][k]["rmse"],
                                                                          rel=1e-9)


def test_analysis_layer_never_imports_rclpy():
    import subprocess
    import sys

    code = ("import sys, diffsim_ros.analysis, diffsim_ros.testing.recordings, diffsim_ros.analysis.cdr; "
            "print('rclpy' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"
