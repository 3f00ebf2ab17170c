"""The jump task (issue 17 item 4) and its metric, which must fail on the wrong behaviour.

On the project's quadruped: standing still never rises, stretching the legs raises the base
with the feet on the ground (no flight), and an open-loop crouch-and-extend leaves the ground
but pitches past the limit in the air; each fails ``jump_metric``, and the task's own verdict
equals the metric computed from the recorded arrays. The metric's rules are checked on
synthetic ballistic hops (hypothesis).
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import REPO_ROOT

from diffsim_ros import config
from diffsim_ros.physics.spatial import roll_pitch
from diffsim_ros.tasks.jump import JumpTask, jump_metric


@pytest.fixture(scope="module")
def task():
    _, t, _ = config.load_training_file(REPO_ROOT / "config" / "jump.yaml", dtype=torch.float64)
    assert isinstance(t, JumpTask)
    return t


def rollout(task, act, batch=1, seed=0):
    """Roll out ``batch`` episodes under ``act(step, obs) -> actions``.

    Returns (final task state, recorded arrays): per step (T = horizon + 1, the start included)
    base height, roll and pitch (T, B), foot contacts (T, F, B; all feet down at the start) and
    other bodies' contact (T, B).
    """
    ts = task.reset(batch, torch.Generator().manual_seed(seed))
    rec = {k: [] for k in ("z", "roll", "pitch", "feet", "other")}

    def record(feet, other):
        r, p = roll_pitch(ts.sim.q[:, 3:7])
        for k, v in (("z", ts.sim.q[:, 2]), ("roll", r), ("pitch", p), ("feet", feet), ("other", other)):
            rec[k].append(v.clone())

    record(torch.ones(len(task.feet), batch, dtype=torch.bool), torch.zeros(batch, dtype=torch.bool))
    with torch.no_grad():
        for k in range(task.horizon):
            ts = task.step(ts, torch.as_tensor(act(k, task.observe(ts)), dtype=ts.sim.q.dtype).reshape(batch, -1))
            record(task.feet_contact(), task.other_contact())
    return ts, {k: torch.stack(v).numpy() for k, v in rec.items()}


def verdict(task, rec, b=0):
    """jump_metric of episode ``b`` of a :func:`rollout`."""
    return jump_metric(rec["z"][:, b], rec["roll"][:, b], rec["pitch"][:, b], rec["feet"][:, :, b],
                       rec["other"][:, b], task.base_height, task.min_apex, task.max_tilt,
                       task.fall_height / task.base_height)


CROUCH = np.tile([0.0, 1.0, -1.0], 4)       # thighs forward, knees more bent: the base goes down


def stand(k, obs=None):
    return np.zeros(12)


def stretch(k, obs=None):
    return -CROUCH * min(1.0, k / 30)          # legs straightened slowly and held: up, feet down


def crouch_and_extend(k, obs=None):
    return CROUCH if 10 <= k < 30 else (-CROUCH if 30 <= k < 45 else np.zeros(12))


def test_standing_stretching_and_an_untrimmed_leap_fail(task):
    ts, rec = rollout(task, stand)
    v = verdict(task, rec)
    assert not v["success"] and not v["apex_ok"] and v["apex_m"] < 0.01, v
    ts, rec = rollout(task, stretch)
    v = verdict(task, rec)
    assert not v["success"] and v["apex_m"] > 0.02 and not v["airborne_at_apex"], v
    ts, rec = rollout(task, crouch_and_extend)
    v = verdict(task, rec)
    # It does leave the ground, higher than the threshold, but lands tipped over.
    assert v["apex_ok"] and v["airborne_at_apex"] and not v["tilt_ok"] and not v["success"], v


@pytest.mark.parametrize("policy", [stand, stretch, crouch_and_extend])
def test_the_task_verdict_is_the_metric_on_the_recorded_arrays(task, policy):
    ts, rec = rollout(task, policy)
    v = verdict(task, rec)
    assert v["success"] == bool(task.success(ts)[0])
    assert v["apex_m"] == pytest.approx(float(ts.extra["peak_z"][0]) - task.base_height, abs=1e-12)
    assert v["airborne_at_apex"] == bool(ts.extra["airborne_peak"][0]) or not v["apex_ok"]
    assert (not (v["height_ok"] and v["tilt_ok"] and v["only_feet_touch"])) == bool(ts.extra["violation"][0])


def test_the_loss_rewards_height_and_upward_speed(task):
    """The loss rewards height and upward speed.

    The per-step loss is minus the ballistic apex above standing: a state higher, or moving
    up faster, has a lower loss by exactly the apex's change (z + vz^2 / 2g).
    """
    ts = task.reset(2, torch.Generator().manual_seed(1))
    a = torch.zeros(2, task.action_dim, dtype=torch.float64)
    q, v = ts.sim.q.clone(), ts.sim.v.clone()
    q[1, 2] += 0.1
    v[1, 2] = 2.0                                  # base upright at reset: body z is world z
    ts.sim = ts.sim.replace(q=q, v=v)
    loss = task.step_loss(ts, a)
    assert float(loss[0] - loss[1]) == pytest.approx(0.1 + 2.0 ** 2 / (2 * task.gravity), rel=1e-9)


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2 ** 31 - 1), weight=st.floats(0.01, 2.0))
def test_the_drift_term_is_the_weighted_horizontal_speed_squared(task, seed, weight):
    """The drift term is the weighted horizontal speed squared.

    With ``drift_weight`` the loss grows by exactly weight x the base's horizontal speed squared
    in the world frame: the body-frame velocity of a drawn state rotated by its drawn orientation
    with transforms3d (an independent rotation), its vertical part left out; a vertical velocity
    alone costs nothing. A negative weight is refused naming the key.
    """
    import transforms3d

    from diffsim_ros.schema import ConfigError
    from diffsim_ros.tasks import make_task

    spec = dict(task.export_parameters())
    task = make_task(task.model, task.sim_config, dict(spec, drift_weight=0.0))     # the file's has one
    drifting = make_task(task.model, task.sim_config, dict(spec, drift_weight=weight))
    rng = np.random.default_rng(seed)
    ts = task.reset(3, torch.Generator().manual_seed(seed))
    q, v = ts.sim.q.clone(), ts.sim.v.clone()
    quat = rng.normal(size=(3, 4))
    quat /= np.linalg.norm(quat, axis=1, keepdims=True)
    q[:, 3:7] = torch.as_tensor(quat)                       # x y z w
    v[:, 0:3] = torch.as_tensor(rng.uniform(-2, 2, (3, 3)))
    ts.sim = ts.sim.replace(q=q, v=v)
    a = torch.zeros(3, task.action_dim, dtype=torch.float64)
    extra = (drifting.step_loss(ts, a) - task.step_loss(ts, a)).numpy()
    for b in range(3):
        R = transforms3d.quaternions.quat2mat(quat[b, [3, 0, 1, 2]])
        world = R @ v[b, 0:3].numpy()
        assert extra[b] == pytest.approx(weight * (world[0] ** 2 + world[1] ** 2), rel=1e-9, abs=1e-12), (seed, b)
    vertical = v.clone()
    q[:, 3:7] = torch.tensor([0.0, 0.0, 0.0, 1.0], dtype=q.dtype)
    vertical[:, 0:3] = torch.tensor([0.0, 0.0, 1.5], dtype=v.dtype)
    ts.sim = ts.sim.replace(q=q, v=vertical)
    np.testing.assert_allclose(drifting.step_loss(ts, a).numpy(), task.step_loss(ts, a).numpy(), rtol=0, atol=1e-12)
    with pytest.raises(ConfigError, match="drift_weight"):
        make_task(task.model, task.sim_config, dict(spec, drift_weight=-0.1))


@settings(max_examples=60, deadline=None)
@given(apex=st.floats(0.0, 0.3), tilt=st.floats(0.0, 0.8), touch=st.booleans(), hold=st.booleans())
def test_metric_on_synthetic_hops(apex, tilt, touch, hold):
    """The jump metric on synthetic hops.

    A ballistic hop of ``apex`` m above standing: a success exactly when the apex reaches
    min_apex with the feet off the ground there (``hold``: the feet stay down, a stretch),
    the tilt stays within max_tilt and no other body touches.
    """
    h, g, dt = 0.3, 9.81, 0.01
    t_up = np.sqrt(2 * apex / g)
    t = np.arange(0, 2 * t_up + 0.3, dt)
    z = h + np.clip(apex - 0.5 * g * (t - 0.1 - t_up) ** 2, 0.0, None) * ((t > 0.1) & (t < 0.1 + 2 * t_up))
    flight = z > h + 1e-9
    feet = np.repeat((~flight | hold)[:, None], 4, axis=1)
    pitch = np.full_like(t, tilt)
    other = np.zeros_like(t, dtype=bool)
    if touch:
        other[len(t) // 2] = True
    v = jump_metric(z, np.zeros_like(t), pitch, feet, other, h, min_apex=0.05, max_tilt=0.5)
    expect = bool(z.max() - h >= 0.05 and flight.any() and not hold and tilt <= 0.5 and not touch)
    assert v["success"] == expect, v


@pytest.mark.parametrize("name", ["jump", "jump_solo12"])
def test_the_shipped_jump_policy_jumps_by_the_metric_on_recorded_arrays(name):
    """The shipped jump policy jumps by the metric on recorded arrays.

    policies/<name> on 32 fresh episodes, judged by jump_metric from the recorded heights,
    attitudes and foot contacts (not the task's own flags): at least 0.8 jump, each one with a
    flight; the same episodes under the zero action (standing) do not.
    """
    from conftest import example_robot_data_dir
    from diffsim_ros.learning.checkpoint import load_checkpoint

    cfg = REPO_ROOT / "config" / f"{name}.yaml"
    if "example-robot-data" in cfg.read_text() and example_robot_data_dir() is None:
        pytest.skip("example-robot-data (pip package 'example-robot-data') is not installed")
    _, task, model = config.load_training_file(cfg)
    policy, _ = load_checkpoint(REPO_ROOT / "policies" / name, model=model)
    rates = {}
    for label, act in (("policy", lambda k, obs: policy(obs)), ("stand", lambda k, obs: torch.zeros(len(obs), 12))):
        ts, rec = rollout(task, act, batch=32, seed=3)
        verdicts = [verdict(task, rec, b) for b in range(32)]
        rates[label] = np.mean([v["success"] for v in verdicts])
        if label == "policy":
            assert all(v["airborne_at_apex"] for v in verdicts if v["success"])
            assert [v["success"] for v in verdicts] == task.success(ts).tolist()
    assert rates["policy"] >= 0.8 and rates["stand"] == 0.0, rates


@pytest.mark.slow
def test_a_jump_emerges_from_the_apex_objective():
    """A jump emerges from the apex objective.

    config/jump.yaml's quadruped, task (its drift term included) and trainer settings with a drawn
    seed (printed; replay with DIFFSIM_TRAIN_SEED), stopped at the threshold rather than the file's
    40 iterations kept to the best: the untrained policy never jumps by the metric; within 60
    iterations the trainer's evaluation (64 episodes after every iteration) reaches the task's
    threshold, and fresh episodes the trainer never saw hold at least 0.8. Evaluated every 5
    iterations, about 1 run in 8 failed: the training swings, and the successes in between were
    missed (bench/train_seeds.py; policies/README.md, jump). At a step size of 0.001 instead of
    the file's 0.002: since the file draws the physics per episode, 0.002 found a jump and lost it
    again (seed 4242: 0.84 at iteration 3, then 0 for 35 iterations, solved at 40; seed 11679
    never within 60), where 0.001 solved both (iterations 28 and 11). At 0.001, 2 of 10 seeds
    (108, 112) then reared on their hind legs with saturated actions and never jumped in 60
    iterations (CI's seed 5259 failed so too once): restart_after (20) starts such a run again
    from a fresh policy, and both jumped in their second attempt (29, 31).
    """
    from conftest import drawn_seed
    from diffsim_ros.learning import MLPPolicy, TrainConfig, train

    seed = drawn_seed("jump training", "DIFFSIM_TRAIN_SEED", bits=16)
    params, task, _ = config.load_training_file(REPO_ROOT / "config" / "jump.yaml")     # float32, as trained
    t = params["training"]
    cfg = TrainConfig.from_mapping(dict(t, learning_rate=0.001, eval_envs=64, iterations=60, stop_at_success=True,
                                     restart_after=20, seed=seed), "training")
    torch.manual_seed(seed)
    untrained = MLPPolicy(task.obs_dim, task.action_dim, cfg.hidden, normalize=cfg.normalize_obs).to(task.model.dtype)
    before = task.rollout_success(untrained, 32, torch.Generator().manual_seed(99))
    res = train(task, cfg, progress=False)
    assert res.solved_env_steps is not None, (f"seed {seed} (DIFFSIM_TRAIN_SEED): not solved", res.history[-3:])
    after = task.rollout_success(res.policy, 64, torch.Generator().manual_seed(99))
    assert before == 0.0 and after >= 0.8, (seed, before, after)


def test_contact_of_a_replayed_state_comes_from_the_state(task):
    """The contact of a replayed state comes from the state.

    A recorded episode read back (``diffsim-ros loop``) has states no step produced: the feet
    and other contact are then taken from each state itself. Analytic cases: the standing pose has
    every foot on the ground and nothing else once settled; lifted 5 cm, nothing touches; sunk 25 cm, the trunk
    touches. On the open-loop leap, the replayed flags agree with the step's own on at least 95 %
    of the (step, foot) pairs (they differ only where a foot lands or lifts off within the step),
    and the replayed verdict equals the task's.
    """
    from diffsim_ros.tasks.base import TaskState

    ts, _ = rollout(task, lambda k, obs: np.zeros((3, 12)), batch=3)     # settled on its feet after the 1 s episode
    q = ts.sim.q.clone()
    q[1, 2] += 0.05
    q[2, 2] -= 0.25
    replay = TaskState(ts.sim.replace(q=q), ts.target, 0, dict(ts.extra, replayed=torch.ones(1, dtype=torch.bool)))
    feet, other = task.feet_contact(replay), task.other_contact(replay)
    assert feet[:, 0].all() and not other[0]
    assert not feet[:, 1].any() and not other[1]
    assert bool(other[2])

    states, flags = [], []
    ts = task.reset(1, torch.Generator().manual_seed(0))
    with torch.no_grad():
        for k in range(task.horizon):
            ts = task.step(ts, torch.as_tensor(crouch_and_extend(k), dtype=ts.sim.q.dtype).reshape(1, -1))
            states.append(ts.sim)
            flags.append(task.feet_contact()[:, 0])
        stepped = bool(task.success(ts)[0])
        peak = float(ts.extra["peak_z"][0])
        r = task.reset(1, torch.Generator().manual_seed(0))
        r.extra["replayed"] = torch.ones(1, dtype=torch.bool)
        replayed = []
        for k, s in enumerate(states):
            r = TaskState(s, r.target, k + 1, dict(r.extra))
            task.update_extra(r, torch.zeros(1, task.action_dim, dtype=s.q.dtype))
            replayed.append(task.feet_contact(r)[:, 0])
    agree = float((torch.stack(flags) == torch.stack(replayed)).to(torch.float64).mean())
    assert agree >= 0.95, agree
    assert bool(task.success(r)[0]) == stepped and float(r.extra["peak_z"][0]) == peak
    assert bool(r.extra["airborne_peak"][0]) == bool(ts.extra["airborne_peak"][0])
