"""policy_controller's loop without ROS (control/controller_loop.py).

The node's parameters are read from a dict as the node reads them, the publishers replaced by
lists. In lockstep every new accepted state of
the arm is answered exactly once with an independent PolicyRunner's command on it (within the URDF's
limits, read with urdf_parser_py); a re-published stamp is not answered twice; a bad state is answered
with the hold of the last accepted position; the wait_for_subscribers gate holds every answer until the
command topic has its subscriber; a preflight NO-GO (a joint outside its limits) holds the safe command.
The states are drawn at random within the limits (seed printed).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from urdf_parser_py.urdf import URDF

from conftest import REPO_ROOT, drawn_seed

from diffsim_ros.control import JointStateIn
from diffsim_ros.control import controller_settings as cs
from diffsim_ros.control.controller_loop import ControlLoop
from diffsim_ros.learning.deploy import PolicyRunner

CKPT = REPO_ROOT / "policies" / "reach_arm"
TARGET = (0.25, 0.1, 0.35)


class _Log:
    def __init__(self):
        self.lines = []

    def _add(self, level):
        return lambda text, **_: self.lines.append((level, text))

    def __getattr__(self, level):
        return self._add(level)


def _loop(subscribers=lambda: 1, **overrides):
    values = {k: v for k, (v, _) in cs.PARAMETERS.items()}
    values.update(checkpoint=str(CKPT), lockstep=True, predict_every=0, target=list(TARGET), **overrides)
    log = _Log()
    p = values.__getitem__
    s = cs.read_runner(p, log, resolve=Path, robot_description=None)
    cs.read_loop(p, log, s)
    sent = []
    loop = ControlLoop(s, log, clock_ns=lambda: 0, publish=lambda cmd, stamp, state: sent.append((stamp, cmd.copy())),
                       publish_prediction=lambda *a: None, command_subscribers=subscribers,
                       recorder_subscribers=lambda: [1, 1, 1], command_topic="/commands")
    return loop, sent, log


def _limits(runner):
    robot = URDF.from_xml_file(str(REPO_ROOT / "urdf" / "diffsim_arm.urdf"))
    by = {j.name: j.limit for j in robot.joints if j.limit is not None}
    names = runner.actuated_joints
    return np.array([by[n].lower for n in names]), np.array([by[n].upper for n in names]), names


def test_lockstep_answers_each_new_state_once_with_the_policys_command_and_holds_on_a_bad_one():
    rng = np.random.default_rng(drawn_seed("controller loop", "DIFFSIM_TEST_LOOP_SEED"))
    loop, sent, _ = _loop()
    reference = PolicyRunner(CKPT)
    lo, hi, names = _limits(reference)
    target = torch.tensor([TARGET], dtype=reference.dtype)
    accepted = None
    for k in range(1, 9):
        q = rng.uniform(lo + 0.1, hi - 0.1)
        v = rng.uniform(-0.5, 0.5, len(q))
        stamp = k * 20_000_000
        loop.on_joint_state(JointStateIn(list(names), q.tolist(), v.tolist(), [], stamp))
        assert len(sent) == k and sent[-1][0] == stamp, (k, sent[-1][0])
        expect = reference.decide(reference.state(q, v), target, predict=False).command
        expect = np.clip(np.asarray(expect, dtype=np.float64).reshape(-1), lo, hi)
        np.testing.assert_allclose(sent[-1][1], expect, rtol=0, atol=1e-9)
        assert np.all(sent[-1][1] >= lo) and np.all(sent[-1][1] <= hi)
        # The same stamp again (a lockstep plant re-publishing while it waits): no second answer.
        loop.on_joint_state(JointStateIn(list(names), q.tolist(), v.tolist(), [], stamp))
        assert len(sent) == k
        accepted = q
    bad = accepted.copy()
    bad[int(rng.integers(len(bad)))] = float("nan")
    loop.on_joint_state(JointStateIn(list(names), bad.tolist(), [0.0] * len(bad), [], 9 * 20_000_000))
    np.testing.assert_allclose(sent[-1][1], np.clip(accepted, lo, hi), rtol=0, atol=0)
    assert loop.counts["policy_commands"] == 8 and loop.counts["safe_commands"] >= 1


def test_the_subscriber_gate_and_a_preflight_no_go_hold_the_answers():
    subscribers = [0]
    loop, sent, _ = _loop(subscribers=lambda: subscribers[0], wait_for_subscribers=1)
    runner = loop.runner
    lo, hi, names = _limits(runner)
    mid = (lo + hi) / 2
    loop.on_joint_state(JointStateIn(list(names), mid.tolist(), [0.0] * len(mid), [], 10_000_000))
    assert sent == []                          # nobody listens yet: nothing answered
    subscribers[0] = 1
    loop.on_joint_state(JointStateIn(list(names), mid.tolist(), [0.0] * len(mid), [], 10_000_000))
    assert len(sent) == 1                      # the same state, now answered once

    loop, sent, log = _loop(preflight=True, preflight_required=True)
    out = mid.copy()
    out[0] = hi[0] + 0.3                       # past the URDF limit and the position margin
    loop.on_joint_state(JointStateIn(list(names), out.tolist(), [0.0] * len(out), [], 10_000_000))
    assert any(level == "error" and "preflight" in text for level, text in log.lines), log.lines
    loop.on_joint_state(JointStateIn(list(names), mid.tolist(), [0.0] * len(mid), [], 20_000_000))
    assert loop.counts["policy_commands"] == 0
    print("sent on NO-GO:", len(sent))
    assert len(sent) == 1                      # the hold of the second state, never the policy
    np.testing.assert_allclose(sent[-1][1], np.clip(mid, lo, hi), rtol=0, atol=0)
