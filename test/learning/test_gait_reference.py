"""The gait reference (training.gait_reference).

A fixed stepping pattern the policy adds to its own action, read from the gait clock in the
observation.

Checked against what it claims, through paths of their own: applied to the stance, its joint
offsets move each foot's lowest point (forward kinematics, the gait rules' path) by the pattern's
height and stride to first order; the height follows the task's own swing target
(``swing_target``, the loss's path) at every step of the clock; a stance foot moves backwards at
the commanded speed times the stride gain. Drawn over phases, commands and gaits (hypothesis), on
our quadruped and example-robot-data's solo12. The policy exports to TorchScript unchanged and is
refused, with the reason, where the task has no clock.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import REPO_ROOT, example_robot_data_dir

from diffsim_ros import config
from diffsim_ros.learning.apg import TrainConfig, make_policy
from diffsim_ros.learning.checkpoint import export_policy
from diffsim_ros.learning.policy import GaitReference
from diffsim_ros.physics import ConfigError
from diffsim_ros.tasks import make_task

ROBOTS = {"quadruped": "locomotion_velocity.yaml", "solo12": "locomotion_velocity_solo12.yaml"}


@pytest.fixture(scope="module", params=sorted(ROBOTS))
def base(request):
    if request.param == "solo12" and example_robot_data_dir() is None:
        pytest.skip("example-robot-data (pip package 'example-robot-data') is not installed")
    return config.load_training_file(REPO_ROOT / "config" / ROBOTS[request.param], dtype=torch.float64)


def _task(base, **options):
    params, task, model = base
    spec = {**params["task"], "observation": "robot", "gait_period": 0.4, "gait_offsets": [0.0, 0.5, 0.5, 0.0],
            "gait_duty": 0.5, "swing_height": 0.05, **options}
    return make_task(model, task.sim_config, spec, "task")


def _obs(task, step: int, command: float) -> torch.Tensor:
    """Build an observation at clock step ``step`` with forward speed command ``command``.

    The rest is zero: the reference reads the clock and the command only.
    """
    ts = task.reset(1, torch.Generator().manual_seed(0))
    ts.step = step
    ts.target = torch.full_like(ts.target, command)
    return task.observe(ts)


def _feet(task, action: torch.Tensor) -> torch.Tensor:
    """Return the (F, 3) world positions of each foot's lowest point at the stance.

    By forward kinematics, with the joints at ``stance + action_scale action`` and the base where
    the stance puts it.
    """
    m = task.model
    q = m.neutral_configuration((1,))
    q[:, 2] = task.base_height
    q[:, 7:] = q[:, 7:].index_copy(1, task.sim.act_index, (task.stance + task.action_scale * action)[None])
    base = m.neutral_configuration((1,))
    base[:, 2] = task.base_height
    base[:, 7:] = base[:, 7:].index_copy(1, task.sim.act_index, task.stance[None])
    local = task.foot_track(base)["local"]
    return task.foot_moved(task.foot_track(q), local)[0]


@settings(max_examples=25, deadline=None)
@given(step=st.integers(0, 400), command=st.floats(0.0, 0.4), gait=st.sampled_from(["trot", "walk", "pace"]),
       height=st.floats(0.002, 0.01))
def test_the_offsets_move_each_foot_by_the_pattern_to_first_order(base, step, command, gait, height):
    """The offsets move each foot by the pattern to first order.

    FK(stance + offsets) - FK(stance) = (stride, 0, height) per foot, up to the linearisation's
    second-order error (small amplitudes: at most 1 cm, a stride of at most 1.6 cm).
    """
    offsets = {"trot": [0.0, 0.5, 0.5, 0.0], "walk": [0.0, 0.5, 0.75, 0.25], "pace": [0.0, 0.5, 0.0, 0.5]}[gait]
    duty = 0.75 if gait == "walk" else 0.5
    task = _task(base, gait_offsets=offsets, gait_duty=duty, swing_height=height, gait_period=0.04)
    ref = GaitReference(**task.gait_pattern())
    moved = _feet(task, ref(_obs(task, step, command))[0]) - _feet(task, torch.zeros(task.action_dim,
                                                                                      dtype=torch.float64))
    phase = np.remainder(step * task.dt / 0.04 + np.asarray(offsets), 1.0)
    swing = np.clip((phase - duty) / (1 - duty), 0.0, None)
    want_z = height * np.sin(math.pi * swing) ** 2
    d = command * 0.04 * duty
    # Swinging: the cubic from -1/2 to 1/2 (Hermite basis) with the stance's slope at both ends.
    k = -(1 - duty) / duty
    h00, h10, h01, h11 = 2 * swing ** 3 - 3 * swing ** 2 + 1, swing ** 3 - 2 * swing ** 2 + swing, \
        -2 * swing ** 3 + 3 * swing ** 2, swing ** 3 - swing ** 2
    flight = -0.5 * h00 + 0.5 * h01 + k * (h10 + h11)
    want_x = np.where(phase >= duty, flight, 0.5 - np.minimum(phase / duty, 1.0)) * d
    got = moved.numpy()
    scale = max(height, d)
    np.testing.assert_allclose(got[:, 2], want_z, atol=10 * scale ** 2 + 1e-9)
    np.testing.assert_allclose(got[:, 0], want_x, atol=10 * scale ** 2 + 1e-9)
    np.testing.assert_allclose(got[:, 1], 0.0, atol=10 * scale ** 2 + 1e-9)


def test_the_height_follows_the_tasks_swing_target_and_a_stance_foot_the_command(base):
    """The height follows the task's swing target, and a stance foot the command.

    Over two periods of the clock: the reference's height pattern, read back through the lift
    matrix's inverse, is zero where the task's swing target is (the stance) and its square over
    swing_height elsewhere (sin^2 against the target's half sine); while a foot stands its stride
    falls at the commanded speed times the stride gain (per second of the clock).
    """
    task = _task(base)
    cfg = TrainConfig(hidden=(8,), gait_reference=True, reference_stride_gain=2.0)
    policy = make_policy(task, cfg).to(torch.float64)
    ref = policy.reference
    lift, stride = ref.lift.numpy(), ref.stride.numpy()                   # (A, F) each
    basis = np.linalg.pinv(np.concatenate([lift, stride], 1))             # (2F, A): back to (height, stride)
    F = lift.shape[1]
    command = 0.6
    rows = []
    for k in range(80):
        rows.append(basis @ ref(_obs(task, k, command))[0].numpy())
    rows = np.asarray(rows)                                               # (steps, 2F)
    heights, strides = rows[:, :F], rows[:, F:]
    want = torch.stack([task.swing_target(k) for k in range(80)]).numpy()
    np.testing.assert_allclose(heights, want ** 2 / task.swing_height, atol=1e-9)
    standing = (want[:-1] == 0) & (want[1:] == 0)
    speed = np.diff(strides, axis=0) / task.dt
    phase = np.remainder(np.arange(80)[:, None] * task.dt / task.gait_period + task.gait_offsets.numpy(), 1.0)
    inner = standing & (phase[:-1] < task.gait_duty - 1e-9) & (phase[1:] > 1e-9)    # not across the wrap
    assert inner.sum() > 20
    np.testing.assert_allclose(speed[inner], -command * 2.0, rtol=1e-9)


def test_the_reference_policy_exports_and_starts_at_the_pattern(base):
    """The reference policy exports and starts at the pattern.

    A reference policy's action is its pattern plus the network's own, clamped, and the float32
    TorchScript export computes the same action.
    """
    task = _task(base)
    policy = make_policy(task, TrainConfig(hidden=(16,), gait_reference=True)).to(torch.float64)
    obs = torch.cat([_obs(task, k, 0.5) for k in range(0, 40, 3)])
    with torch.no_grad():
        own = torch.tanh(policy.head(policy.body(policy.norm(obs))))
        want = torch.clamp(policy.reference(obs) + own, -1, 1)
        np.testing.assert_allclose(policy(obs).numpy(), want.numpy(), atol=1e-12)
        assert float(policy.reference(obs).abs().max()) > 0.05                 # the pattern moves the joints
        scripted, _ = export_policy(policy, task.obs_dim)                    # float32, as deployed
        np.testing.assert_allclose(scripted(obs.float()).double().numpy(), policy(obs).numpy(), atol=1e-5)


def test_a_reference_needs_a_gait_clock(base):
    params, task, model = base
    plain = make_task(model, task.sim_config, {**params["task"], "observation": "robot", "gait_period": 0.0,
                                               "gait_weight": 0.0}, "task")
    with pytest.raises(ConfigError, match="gait_reference.*gait_period"):
        make_policy(plain, TrainConfig(gait_reference=True))


def test_starting_weights_must_agree_on_the_reference(base):
    """Starting weights must agree on the reference.

    Fine-tuning (train's ``init``) from weights with a reference into a run without one, or the
    other way round, is refused naming the setting, not a state-dict traceback.
    """
    from diffsim_ros.learning.apg import train

    task = _task(base)
    with_ref = make_policy(task, TrainConfig(hidden=(8,), gait_reference=True)).state_dict()
    plain = make_policy(task, TrainConfig(hidden=(8,))).state_dict()
    for init, ref in ((with_ref, False), (plain, True)):
        with pytest.raises(ConfigError, match="gait_reference"):
            train(task, TrainConfig(hidden=(8,), iterations=1, num_envs=2, gait_reference=ref), init=init,
                  progress=False)
