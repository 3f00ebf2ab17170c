"""The gait clock of the locomotion task.

The settings are ``gait_period``, ``gait_offsets``, ``gait_duty``, ``swing_height`` and
``gait_weight``: a trot reference the loss follows and the policy observes.

The reference is checked by its defining properties over drawn clocks (hypothesis): it repeats
every period, each foot is on the ground for the duty fraction of its cycle and peaks at
``swing_height`` in the middle of its swing, and two feet half a cycle apart at duty 0.5 never
swing together. The loss term is checked against the feet's heights by forward kinematics (the
gait rules' own path, not the loss's) and its gradient against finite differences. On the robot
the runner's clock is the count of its decisions, as the task's step counts in training.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from builders import make_checkpoint, without_gait
from conftest import REPO_ROOT

from diffsim_ros import config
from diffsim_ros.learning.deploy import PolicyRunner
from diffsim_ros.tasks import make_task

TROT = [0.0, 0.5, 0.5, 0.0]


@pytest.fixture(scope="module")
def base():
    params, task, model = config.load_training_file(REPO_ROOT / "config" / "locomotion_velocity.yaml",
                                                    dtype=torch.float64)
    return params, task, model


def _task(base, **options):
    params, task, model = base
    spec = {**without_gait(params["task"]), "observation": "robot", **options}
    return make_task(model, task.sim_config, spec, "task")


@settings(max_examples=40, deadline=None)
@given(cycle=st.integers(4, 60), duty=st.floats(0.2, 0.8), height=st.floats(0.01, 0.1),
       offsets=st.lists(st.floats(0.0, 0.99), min_size=4, max_size=4), start=st.integers(0, 500))
def test_the_swing_reference_repeats_stands_for_its_duty_and_peaks_mid_swing(base, cycle, duty, height, offsets,
                                                                              start):
    task = _task(base, gait_period=cycle * 0.01, gait_offsets=offsets, gait_duty=duty, swing_height=height,
                 gait_weight=1.0)
    ref = torch.stack([task.swing_target(start + k) for k in range(2 * cycle)]).numpy()     # (2 cycles, F)
    np.testing.assert_allclose(ref[:cycle], ref[cycle:], atol=1e-12)                        # periodic
    assert (ref >= -1e-12).all() and (ref <= height + 1e-12).all()
    # Sampled finely, a foot stands (target 0) for the duty fraction of its cycle and peaks at
    # swing_height half way through its swing.
    fine = _task(base, gait_period=1.0, gait_offsets=offsets, gait_duty=duty, swing_height=height, gait_weight=1.0)
    n = 100                                                    # the clock at dt = 0.01 over one 1 s period
    ref = torch.stack([fine.swing_target(k) for k in range(n)]).numpy()
    np.testing.assert_allclose((ref <= 1e-12).mean(0), duty, atol=2.5 / n)
    # A sample is at most one sample's phase (1 / n of a cycle, 1 / (n (1 - duty)) of a swing)
    # from mid-swing: the half sine there is within 1 - cos(pi / (n (1 - duty))) of its peak.
    near = 1.0 - math.cos(math.pi / (n * (1.0 - duty)))
    for f, off in enumerate(offsets):
        peak = (duty + (1 - duty) / 2 - off) % 1.0             # the phase of mid-swing, in clock time
        k = int(round(peak * n)) % n
        assert ref[k, f] >= height * (1.0 - near) - 1e-12
        assert ref[:, f].max() >= height * (1.0 - near) - 1e-12


def test_diagonal_pairs_of_a_trot_never_swing_together(base):
    task = _task(base, gait_period=0.37, gait_offsets=TROT, gait_duty=0.5, swing_height=0.05, gait_weight=1.0)
    ref = torch.stack([task.swing_target(k) for k in range(200)]) > 1e-9
    assert not (ref[:, 0] & ref[:, 1]).any() and not (ref[:, 0] & ref[:, 2]).any()
    assert torch.equal(ref[:, 0], ref[:, 3]) and torch.equal(ref[:, 1], ref[:, 2])
    assert ref[:, 0].any() and ref[:, 1].any()


@pytest.mark.parametrize("seed", [0, 1])
def test_the_gait_term_is_the_squared_gap_to_the_reference_and_its_gradient_the_finite_difference(base, seed):
    """The gait term is the squared gap to the reference, its gradient the finite difference.

    The loss with gait_weight w less the loss without is w x sum over the feet of (height of the
    foot's lowest point - reference)^2, the heights by the gait rules' forward kinematics; its
    gradient in the joint positions matches central differences.
    """
    print("seed", seed)
    w = 37.0
    task = _task(base, gait_period=0.35, gait_offsets=TROT, swing_height=0.05, gait_weight=w)
    plain = _task(base)
    g = torch.Generator().manual_seed(seed)
    ts = task.reset(3, g)
    phase = torch.rand(3, task.action_dim, generator=g, dtype=torch.float64) * 6.0
    for k in range(12):
        ts = task.step(ts, 0.6 * torch.sin(phase + 0.4 * k))
    a = torch.zeros(3, task.action_dim, dtype=torch.float64)
    plain_ts = type(ts)(ts.sim, ts.target, ts.step, dict(ts.extra))
    got = task.step_loss(ts, a) - plain.step_loss(plain_ts, a)
    height = task.foot_track(ts.sim.q)["height"]
    want = w * ((height - task.swing_target(ts.step)) ** 2).sum(-1)
    torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-12)

    def term(q):
        s = type(ts)(ts.sim.replace(q=q), ts.target, ts.step, {})
        return w * ((task.foot_motion(s)[0] - task.swing_target(ts.step)) ** 2).sum()
    q = ts.sim.q.clone().requires_grad_(True)
    term(q).backward()
    for j in (9, 10, 12, 16):                            # thigh and knee joints of two legs, hip of one
        e = torch.zeros_like(q)
        e[:, j] = 1e-6
        fd = (term(ts.sim.q + e) - term(ts.sim.q - e)) / 2e-6
        assert float(q.grad[:, j].sum()) == pytest.approx(float(fd), rel=1e-5, abs=1e-8)


def test_the_runner_counts_the_clock_as_training_steps_it(tmp_path):
    """The runner counts the clock as training steps it.

    The deployed runner observes the clock of its own decisions: on the states of a simulated
    episode it gives the policy's actions step by step, its clock block is sin/cos of 2 pi k dt /
    period at decision k, and reset() starts the clock again.
    """
    period = 0.3
    pol, task = make_checkpoint("locomotion_velocity", tmp_path, gain=2.0,
                                task_options={"observation": "robot", "gait_period": period, "gait_offsets": TROT,
                                              "gait_weight": 10.0})
    runner = PolicyRunner(tmp_path)
    task64 = runner.task
    assert task64.gait_period == period
    names = runner.meta["observation"]["names"]
    clock = [names.index("clock/sin"), names.index("clock/cos")]
    for _ in range(2):
        runner.reset()
        ts = task64.reset(1, torch.Generator().manual_seed(7))
        for k in range(40):
            obs = task64.observe(ts)
            angle = 2 * math.pi * k * task64.dt / period
            np.testing.assert_allclose(obs[0, clock].numpy(), [math.sin(angle), math.cos(angle)], atol=1e-12)
            want = torch.clamp(pol(obs.to(torch.float32)).to(torch.float64), -1, 1)
            got = runner.decide(ts.sim, ts.target, predict=False).action
            np.testing.assert_allclose(got, want[0].detach().numpy(), atol=1e-6)
            ts = task64.step(ts, want.detach())


def test_the_clock_options_are_checked(base):
    for bad, match in (({"gait_weight": 1.0}, "gait_period"),
                       ({"gait_period": 0.3, "gait_offsets": [0.0, 0.5]}, "one phase in \\[0, 1\\) per foot"),
                       ({"gait_period": 0.3, "gait_offsets": [0.0, 0.5, 0.5, 1.0]}, "gait_offsets"),
                       ({"gait_period": 0.015, "gait_offsets": TROT}, "two control steps"),
                       ({"gait_period": 0.3, "gait_offsets": TROT, "gait_duty": 1.0}, "gait_duty"),
                       ({"gait_period": -1.0}, "gait_period")):
        with pytest.raises(Exception, match=match):
            _task(base, **bad)
    assert "clock/sin" not in _task(base).observation_names()
