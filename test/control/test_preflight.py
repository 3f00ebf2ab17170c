"""Preflight (control/preflight.py) on synthetic topic captures, without DDS.

A clean capture of each robot kind is GO; each fault, drawn at random with its size (seed
printed), is NO-GO naming the check, or a warning where the controller copes (extra or
reordered joints, jitter).
"""
from __future__ import annotations

import numpy as np
import pytest

from builders import make_checkpoint
from conftest import drawn_seed

from diffsim_ros.control.preflight import FrameSample, JointSample, Observed, preflight
from diffsim_ros.learning.deploy import PolicyRunner

T0 = 1_764_000_000 * 10 ** 9


@pytest.fixture(scope="module")
def runners(tmp_path_factory):
    d = tmp_path_factory.mktemp("preflight")
    make_checkpoint("reach_arm", d / "arm")
    make_checkpoint("hover", d / "quad")
    make_checkpoint("locomotion_velocity_solo12", d / "legged")
    return {k: PolicyRunner(d / k) for k in ("arm", "quad", "legged")}


def capture(runner, rng, hz=None, seconds=2.0, age_s=0.002, names=None, positions=None, subscribers=1):
    """Build a clean capture of ``runner``'s robot.

    States at 2x the control rate (or ``hz``), stamps ``age_s`` before receipt, positions inside
    the limits, the IMU or odometry it needs.
    """
    hz = hz or 2.0 / runner.dt
    n = int(seconds * hz)
    names = list(runner.joint_names) if names is None else names
    m = runner.model
    lo = m.lower.double().numpy()[:len(runner.joint_names)]
    hi = m.upper.double().numpy()[:len(runner.joint_names)]
    lo, hi = np.where(np.isfinite(lo), lo, -1.0), np.where(np.isfinite(hi), hi, 1.0)
    seen = Observed(seconds, command_topic="/cmd", command_subscribers=subscribers)
    for k in range(n):
        recv = T0 + int(k * 1e9 / hz + rng.uniform(0, 2e5))
        stamp = recv - int(age_s * 1e9)
        pos = dict(zip(runner.joint_names, rng.uniform(lo, hi)))
        if runner.kind != "quadrotor":
            seen.joint_states.append(JointSample(recv, stamp, names, [pos.get(j, 0.0) for j in names]
                                                 if positions is None else positions))
        if runner.kind == "legged":
            seen.imu.append(FrameSample(recv, stamp, "imu_link", "", [0.0, 0.0, 0.0, 1.0]))
        if runner.kind == "quadrotor":
            seen.odom.append(FrameSample(recv, stamp, "world", "base_link", [0.0, 0.0, 0.0, 1.0]))
    return seen


def test_clean_captures_are_go(runners):
    rng = np.random.default_rng(drawn_seed("preflight clean", "DIFFSIM_PREFLIGHT_SEED"))
    for kind, r in runners.items():
        rep = preflight(r, capture(r, rng))
        print(rep.text())
        assert rep.go and rep.reasons == [], (kind, rep.text())


FAULTS = ["missing joint", "extra joint", "reordered", "out of limits", "nan position", "slow", "stale",
          "future", "no subscriber", "jitter"]


def _fault(name, r, rng):
    """(capture, the check that must fail or None where it is GO with a warning, size in words)."""
    joints = list(r.joint_names)
    if name == "missing joint":
        drop = joints[int(rng.integers(len(joints)))]
        return capture(r, rng, names=[j for j in joints if j != drop]), "joints", drop
    if name == "extra joint":
        return capture(r, rng, names=joints + ["gripper_finger"]), None, "gripper_finger"
    if name == "reordered":
        order = list(rng.permutation(joints))
        while order == joints:
            order = list(rng.permutation(joints))
        return capture(r, rng, names=order), None, str(order)
    if name in ("out of limits", "nan position"):
        seen = capture(r, rng)
        k, j = int(rng.integers(len(seen.joint_states))), int(rng.integers(len(joints)))
        hi = float(r.model.upper.double().numpy()[j])
        bad = float("nan") if name == "nan position" else hi + float(rng.uniform(0.15, 2.0))
        s = seen.joint_states[k]
        s.position = list(s.position)
        s.position[j] = bad
        return seen, "limits", f"{joints[j]} = {bad}"
    if name == "slow":
        hz = float(rng.uniform(0.2, 0.8)) / r.dt
        return capture(r, rng, hz=hz), "rate", f"{hz:.1f} Hz"
    if name == "stale":
        age = float(rng.uniform(0.08, 2.0))
        return capture(r, rng, age_s=age), "stamp age", f"{age:.2f} s"
    if name == "future":
        age = -float(rng.uniform(0.08, 2.0))
        return capture(r, rng, age_s=age), "stamp age", f"{age:.2f} s"
    if name == "no subscriber":
        return capture(r, rng, subscribers=0), "command", "0"
    seen = capture(r, rng)                                     # jitter: a few long gaps
    states = seen.joint_states
    for k in rng.choice(np.arange(5, len(states)), 6, replace=False):
        for s in states[k:]:
            s.receive_ns += int(6 * r.dt * 1e9)
            s.stamp_ns += int(6 * r.dt * 1e9)
    return seen, None, "gaps of 6 control periods"


@pytest.mark.parametrize("kind", ["arm", "legged"])
def test_each_drawn_fault_is_named(runners, kind):
    seed = drawn_seed(f"preflight faults {kind}", "DIFFSIM_PREFLIGHT_FAULT_SEED")
    rng = np.random.default_rng(seed)
    r = runners[kind]
    for name in FAULTS:
        seen, check, size = _fault(name, r, rng)
        rep = preflight(r, seen)
        print(kind, name, size, "->", rep.text().splitlines()[-1])
        if check is None:
            assert rep.go, (name, size, rep.text())
            assert any(c.status == "warn" for c in rep.checks), (name, rep.text())
        else:
            assert not rep.go and any(check in reason for reason in rep.reasons), (name, size, rep.text())


def test_quadrotor_and_legged_specific_faults(runners):
    rng = np.random.default_rng(drawn_seed("preflight frames", "DIFFSIM_PREFLIGHT_FRAME_SEED"))
    quad, legged = runners["quad"], runners["legged"]
    seen = capture(quad, rng)
    for s in seen.odom[::7]:
        s.frame_id = "map"
    rep = preflight(quad, seen)
    assert not rep.go and any("frames" in x and "map" in x for x in rep.reasons), rep.text()
    seen = capture(quad, rng)
    seen.odom = []
    assert not preflight(quad, seen).go
    seen = capture(legged, rng)
    seen.imu = []
    rep = preflight(legged, seen)
    assert not rep.go and any(x.startswith("imu") for x in rep.reasons), rep.text()
    seen = capture(legged, rng)
    seen.imu[3].orientation = [0.0, 0.0, 0.0, 0.5]
    rep = preflight(legged, seen)
    assert not rep.go and any("unit quaternion" in x for x in rep.reasons), rep.text()
    # A simulator's stamps follow /clock: judged against it, not the receiver's clock.
    seen = capture(legged, rng, age_s=-1e6)
    assert not preflight(legged, seen).go
    seen.clock = [(T0 + k * 10 ** 8, T0 + int(1e15) + k * 10 ** 8) for k in range(-5, 40)]
    rep = preflight(legged, seen)
    assert rep.go, rep.text()
