"""train_node: the console script trains over a small config.

It publishes its loss and diagnostics over DDS, writes a checkpoint the controller's
PolicyRunner loads, and exits 0; it takes the URDF from the latched robot_description topic;
bad input exits 2 with the reason.
"""
from __future__ import annotations

import csv
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

rclpy = pytest.importorskip("rclpy", reason="rclpy not installed (ROS 2 client library)")
pytestmark = pytest.mark.ros

from conftest import REPO_ROOT, ros_domain  # noqa: E402
from diffsim_ros import config  # noqa: E402
from diffsim_ros.learning.deploy import PolicyRunner  # noqa: E402

DOMAIN = ros_domain(2)
EXE = Path(sys.executable).with_name("train_node")


def small_config(tmp_path, iterations=3) -> Path:
    params = config.load_yaml(REPO_ROOT / "config" / "hover.yaml")
    params["urdf"] = str(REPO_ROOT / "urdf" / "diffsim_quadrotor.urdf")
    params["task"].update(horizon=10, settle_time=0.1)
    params["training"].update(iterations=iterations, num_envs=4, window=10, eval_every=1, eval_envs=4,
                              stop_at_success=False)
    params.pop("ppo", None)
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump({"/**": {"ros__parameters": params}}))
    return path


def _start(args, domain):
    env = dict(os.environ, ROS_DOMAIN_ID=str(domain))
    return subprocess.Popen([str(EXE), "--ros-args", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env)


def test_train_node_publishes_progress_and_writes_checkpoint(tmp_path):
    from diagnostic_msgs.msg import DiagnosticArray
    from std_msgs.msg import Float64, String
    from rclpy.qos import DurabilityPolicy, QoSProfile

    cfg = small_config(tmp_path)
    out = tmp_path / "out"
    ctx = rclpy.context.Context()
    rclpy.init(context=ctx, domain_id=DOMAIN)
    node = rclpy.create_node("train_listener", context=ctx)
    losses, diags = [], []
    node.create_subscription(Float64, "/diffsim/train/loss", lambda m: losses.append(m.data), 100)
    node.create_subscription(DiagnosticArray, "/diagnostics", lambda m: diags.append(m), 100)
    # The URDF comes from a latched robot_description topic, as robot_state_publisher offers it.
    xml = (REPO_ROOT / "urdf" / "diffsim_quadrotor.urdf").read_text()
    pub = node.create_publisher(String, "/robot_description",
                                QoSProfile(depth=1, durability=DurabilityPolicy.TRANSIENT_LOCAL))
    pub.publish(String(data=xml))
    try:
        proc = _start(["-p", f"config:={cfg}", "-p", f"out:={out}", "-p",
                       "robot_description_topic:=/robot_description"], DOMAIN)
        end = time.monotonic() + 120
        while proc.poll() is None and time.monotonic() < end:
            _spin(node, ctx, 0.1)
        _spin(node, ctx, 0.5)
        stdout, stderr = proc.communicate(timeout=10)
    finally:
        node.destroy_node()
        rclpy.shutdown(context=ctx)
    assert proc.returncode == 0, stderr
    rows = list(csv.DictReader(open(out / "training.csv")))
    assert len(rows) == 3
    assert len(losses) == 3, (losses, stderr)
    assert losses == pytest.approx([float(r["loss"]) for r in rows], rel=1e-6)
    assert any("done: checkpoint" in s.message for d in diags for s in d.status)
    # The checkpoint was trained on the received URDF and deploys on it.
    runner = PolicyRunner(out)
    assert runner.meta["robot"]["urdf"] == str((out / "robot_description.urdf").resolve())
    assert (out / "robot_description.urdf").read_text() == xml
    # ... and is refused for a different robot description.
    with pytest.raises(Exception, match="the URDF differs"):
        PolicyRunner(out, urdf=xml.replace("<mass value=\"", "<mass value=\"1", 1))
    assert runner.meta["config"]["task"]["horizon"] == 10
    out_cmd = runner.quadrotor([0, 0, 1], [0, 0, 0, 1], [0, 0, 0], [0, 0, 0])
    assert out_cmd.command.shape == (4,)


def _spin(node, ctx, seconds):
    from rclpy.executors import SingleThreadedExecutor

    ex = SingleThreadedExecutor(context=ctx)
    ex.add_node(node)
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        ex.spin_once(timeout_sec=0.02)
    ex.remove_node(node)
    ex.shutdown()


def test_train_node_bad_config_exits_2(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("/**:\n  ros__parameters:\n    urdf: urdf/diffsim_quadrotor.urdf\n    tsk: {}\n")
    proc = _start(["-p", f"config:={bad}", "-p", f"out:={tmp_path / 'o'}"], DOMAIN + 1)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 2 and "unknown key 'tsk'" in err, err
    proc = _start(["-p", f"config:={tmp_path / 'missing.yaml'}"], DOMAIN + 1)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 2 and "no such file" in err, err


@pytest.mark.slow
def test_train_node_refuses_an_earlier_run_replaces_it_with_force_and_resumes_one_bit_for_bit(tmp_path):
    """The train node refuses an earlier run, replaces it with force, and resumes one bit for bit.

    The node keeps what an earlier run left as ``diffsim-ros train`` does: a folder with a policy
    or an unfinished run is refused (exit 2, naming force and resume, nothing touched); force:=true
    trains afresh there; resume:=true continues a run killed mid-way (SIGKILL in the CLI, as
    test_training_resume does) and ends with the same weights and rows as the run left alone.
    """
    import torch

    from test_training_resume import (ITERATIONS, KILL_DURING, KILLER, csv_rows, resume_state, tiny_params,
                                      without_time, write_config)

    from diffsim_ros.cli import main as cli_main

    cfg = write_config(tmp_path / "tiny_reach.yaml", tiny_params())
    one_go = tmp_path / "one_go"
    assert cli_main(["train", "--config", str(cfg), "--out", str(one_go), "--no-progress"]) == 0
    out = tmp_path / "killed"
    argv = ["train", "--config", str(cfg), "--out", str(out), "--no-progress"]
    proc = subprocess.run([sys.executable, "-c", KILLER.format(kill=KILL_DURING, argv=argv)], cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == -9, proc.stdout + proc.stderr
    stopped = (out / "training.csv").read_bytes()
    stopped_rows = csv_rows(out / "training.csv")
    domain = DOMAIN + 2

    def node(*args):
        p = _start(["-p", f"out:={out}", *args], domain)
        _, err = p.communicate(timeout=300)
        return p.returncode, err

    # An unfinished run without resume or force: refused, and left as it was.
    rc, err = node("-p", f"config:={cfg}")
    assert rc == 2 and "unfinished training run" in err and "resume:=true" in err and "force:=true" in err, err
    assert (out / "training.csv").read_bytes() == stopped
    rc, err = node("-p", "resume:=true", "-p", "force:=true")
    assert rc == 2 and "exclude each other" in err, err
    # Another configuration is refused by name (the run's own is used when config is not read).
    rc, err = node("-p", "resume:=true", "-p", "iterations:=9")
    assert rc == 2 and "training.iterations differ" in err, err
    # resume:=true: the run's own configuration, bit for bit the uninterrupted run.
    rc, err = node("-p", "resume:=true")
    assert rc == 0, err
    assert "resuming" in err and "after iteration 4" in err, err
    rows = csv_rows(out / "training.csv")
    assert without_time(rows) == without_time(csv_rows(one_go / "training.csv"))
    # Continued, not redone: rows 1-4 (to the checkpoint) are the killed run's own, its wall times too.
    assert rows[:4] == stopped_rows[:4]
    a, b = resume_state(one_go), resume_state(out)
    assert a["iteration"] == b["iteration"] == ITERATIONS and b["finished"]
    for part in ("policy", "critic"):
        for k in a[part]:
            assert torch.equal(a[part][k], b[part][k]), (part, k)
    # A finished run: refused without force (a policy is there), resume has nothing to continue.
    policy = (out / "policy.pt").read_bytes()
    rc, err = node("-p", f"config:={cfg}")
    assert rc == 2 and "trained policy (policy.pt)" in err and "force:=true" in err, err
    rc, err = node("-p", "resume:=true")
    assert rc == 2 and "already finished" in err, err
    assert (out / "policy.pt").read_bytes() == policy
    # force:=true: a new run of 2 iterations replaces it.
    rc, err = node("-p", f"config:={cfg}", "-p", "force:=true", "-p", "iterations:=2")
    assert rc == 0, err
    assert [int(r["iteration"]) for r in csv_rows(out / "training.csv")] == [1, 2]
    assert (out / "policy.pt").read_bytes() != policy
