"""A task's verdict on recorded arrays is the task's own episode verdict.

``Task.recorded_verdict`` is what the main job reports for the stand-in's flight. Simulated
episodes of the shipped hover policy, of the same policy with its thrust cut and of drawn random
policies are recorded as a bag holds them (odometry: world pose, body-frame twist) and judged
both ways; each episode's two verdicts agree, and both outcomes occur.

The same for the arms' reach (policies/reach_arm, reach_panda: the end effector's distance and
speed at the last recorded state, by forward kinematics) and the jump (policies/jump,
jump_solo12: jump_metric on the recorded base pose and the contacts judged from each recorded
state), part by part, on episodes drawn from a printed seed.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from conftest import REPO_ROOT, drawn_seed

from diffsim_ros.workflows import evaluation
from diffsim_ros.physics.spatial import roll_pitch


def _episodes(task, policy, batch, seed):
    """(task verdicts, per-episode arrays t, q, v with the twist in the body frame, targets)."""
    ts = task.reset(batch, torch.Generator().manual_seed(seed))
    qs, vs = [ts.sim.q.clone()], [ts.sim.v.clone()]
    with torch.no_grad():
        for _ in range(task.horizon):
            ts = task.step(ts, policy(task.observe(ts)))
            qs.append(ts.sim.q.clone())
            vs.append(ts.sim.v.clone())
    q, v = torch.stack(qs, 1), torch.stack(vs, 1)                   # (B, T, nq), (B, T, nv)
    # The simulator's base velocity is its own (body-frame linear and angular) twist, as odometry's.
    t = np.arange(q.shape[1]) * task.dt
    return task.success(ts).numpy(), t, q.double().numpy(), v.double().numpy(), ts.target.double().numpy()


def test_recorded_verdict_is_the_episode_verdict():
    task, policy, _, _ = evaluation.load_checkpoint_task(REPO_ROOT / "policies" / "hover")
    seed = drawn_seed("recorded verdict", "DIFFSIM_TRAIN_SEED")
    rng = np.random.default_rng(seed)
    weak = lambda obs: policy(obs) * torch.tensor([0.6, 1.0, 1.0, 1.0], dtype=obs.dtype)  # noqa: E731
    W = torch.as_tensor(rng.normal(0.0, 0.3, (task.obs_dim, task.action_dim)), dtype=torch.float32)
    wild = lambda obs: torch.tanh(obs.float() @ W).to(obs.dtype)  # noqa: E731
    outcomes = []
    for name, pol in (("shipped", policy), ("thrust cut", weak), ("random", wild)):
        ok, t, q, v, target = _episodes(task, pol, 16, int(rng.integers(1 << 31)))
        for b in range(len(ok)):
            verdict = task.recorded_verdict(t, q[b], v[b], target[b])
            assert verdict["success"] == bool(ok[b]), (f"seed {seed}", name, b, verdict)
            outcomes.append(bool(ok[b]))
    assert any(outcomes) and not all(outcomes), outcomes


def test_a_recorded_drift_fails_and_a_recorded_hold_passes():
    """A recorded drift fails and a recorded hold passes.

    A recorded hover at the target, yawed 90 degrees, drifting along body x at 0.5 m/s: too fast
    (0.2 m/s allowed) and off the target after the settling time; the same pose held still passes.
    """
    task, _, _, _ = evaluation.load_checkpoint_task(REPO_ROOT / "policies" / "hover")
    n = task.horizon + 1
    t = np.arange(n) * task.dt
    target = np.array([0.0, 0.0, 1.0])
    yaw = np.array([0.0, 0.0, np.sin(np.pi / 4), np.cos(np.pi / 4)])
    q = np.tile(np.concatenate([target, yaw]), (n, 1))
    q[:, 1] += 0.5 * t                                             # body x is world y after the yaw
    v = np.zeros((n, 6))
    v[:, 0] = 0.5
    drift = task.recorded_verdict(t, q, v, target)
    assert not drift["success"] and abs(drift["final_speed_m_s"] - 0.5) < 1e-12
    assert drift["max_distance_after_settling_m"] > 0.5
    hold = task.recorded_verdict(t, np.tile(np.concatenate([target, yaw]), (n, 1)), np.zeros((n, 6)), target)
    assert hold["success"] and hold["fraction_within_tolerance_after_settling"] == 1.0


def _policies(task, policy, rng, scale):
    """Return the shipped policy, the same scaled, and a drawn random linear policy.

    The shipped policy's actions are scaled by ``scale`` (a weaker or a slower motion).
    """
    W = torch.as_tensor(rng.normal(0.0, 0.3, (task.obs_dim, task.action_dim)), dtype=torch.float32)
    return (("shipped", policy), (f"scaled {scale:g}", lambda obs: policy(obs) * scale),
            ("random", lambda obs: torch.tanh(obs.float() @ W).to(obs.dtype)))


@pytest.mark.parametrize("name", ["reach_arm", "reach_panda"])
def test_the_reach_verdict_on_recorded_joints_is_the_tasks(name):
    """The reach verdict on recorded joints is the task's.

    Each recorded episode's reach verdict (from the joint arrays alone) equals the task's own
    success on the simulator's final state, and its distance and speed are the task's, part by part.
    """
    task, policy, _, _ = evaluation.load_checkpoint_task(REPO_ROOT / "policies" / name)
    seed = drawn_seed(f"recorded reach verdict ({name})", "DIFFSIM_TRAIN_SEED")
    rng = np.random.default_rng(seed)
    outcomes = []
    for label, pol in _policies(task, policy, rng, 0.5):
        roll = evaluation.rollout(task, pol, 12, int(rng.integers(1 << 31)))
        with torch.no_grad():
            from diffsim_ros.tasks.base import TaskState

            final = task.sim.initial_state(roll.q[-1].to(task.model.dtype), roll.v[-1].to(task.model.dtype))
            ts = TaskState(final, roll.target.to(task.model.dtype), task.horizon)
            dist, speed = task.distance(ts), task.ee_speed(ts)
        t = np.arange(roll.q.shape[0]) * task.dt
        for b in range(roll.episodes):
            v = task.recorded_verdict(t, roll.q[:, b].numpy(), roll.v[:, b].numpy(), roll.target[b].numpy())
            where = (f"seed {seed}", label, b, v)
            assert v["success"] == bool(roll.success[b]), where
            assert v["distance_m"] == pytest.approx(float(dist[b]), abs=1e-6), where
            assert v["ee_speed_m_s"] == pytest.approx(float(speed[b]), abs=1e-6), where
            assert v["distance_ok"] == bool(dist[b] < task.success_distance), where
            assert v["speed_ok"] == bool(speed[b] < task.success_speed), where
            outcomes.append(v["success"])
    assert any(outcomes) and not all(outcomes), outcomes


def _replayed_jump(task, roll):
    """Replay the jump task's own bookkeeping (update_extra) over a rollout's recorded states.

    Contact is judged from each state (``replayed``), as the main job judges a bag; returns its
    final extras.
    """
    from diffsim_ros.tasks.base import TaskState

    dt = task.model.dtype
    with torch.no_grad():
        ts = task.reset(roll.episodes, torch.Generator().manual_seed(0))
        extra = {k: v.clone() for k, v in ts.extra.items()}
        extra["peak_z"] = roll.q[0, :, 2].to(dt).clone()
        extra["replayed"] = torch.ones(roll.episodes, dtype=torch.bool)
        action = torch.zeros(roll.episodes, task.action_dim, dtype=dt)
        for k in range(1, roll.q.shape[0]):
            ts = TaskState(task.sim.initial_state(roll.q[k].to(dt), roll.v[k].to(dt)), roll.target.to(dt), k, extra)
            task.update_extra(ts, action)
            extra = ts.extra
        return extra, task.success(ts)


@pytest.mark.parametrize("name", ["jump", "jump_solo12"])
def test_the_jump_verdict_on_recorded_states_is_the_tasks(name):
    """The jump verdict on recorded states is the task's.

    jump_metric on each recorded episode (base pose, contact from each state) equals, part by
    part, the task's own verdict on the same states (update_extra's peak, airborne-at-peak and
    posture flags, contact judged from each state); and the simulator's live verdict: the apex,
    height and tilt always, success and the contact parts on every episode of the shipped and
    scaled policies. The simulator samples contact in a step's last substep and a recording at
    its end, so a touch that starts within that substep and is gone a step later is seen by one
    of the two only: where a random policy's episode differs, it is in the contact parts alone.
    """
    task, policy, _, _ = evaluation.load_checkpoint_task(REPO_ROOT / "policies" / name)
    seed = drawn_seed(f"recorded jump verdict ({name})", "DIFFSIM_TRAIN_SEED")
    rng = np.random.default_rng(seed)
    outcomes = []
    for label, pol in _policies(task, policy, rng, 0.3):
        roll = evaluation.rollout(task, pol, 12, int(rng.integers(1 << 31)))
        replayed, replayed_ok = _replayed_jump(task, roll)
        t = np.arange(roll.q.shape[0]) * task.dt
        for b in range(roll.episodes):
            v = task.recorded_verdict(t, roll.q[:, b].numpy(), roll.v[:, b].numpy(), roll.target[b].numpy())
            where = (f"seed {seed}", label, b, v)
            posture = v["height_ok"] and v["tilt_ok"] and v["only_feet_touch"]
            # The task's own rules on the same recorded states: every part.
            assert v["success"] == bool(replayed_ok[b]), where
            assert v["apex_m"] == pytest.approx(float(replayed["peak_z"][b]) - task.base_height, abs=1e-6), where
            assert v["airborne_at_apex"] == bool(replayed["airborne_peak"][b]) or not v["apex_ok"], where
            assert (not posture) == bool(replayed["violation"][b]), where
            # The simulator's live verdict.
            assert v["apex_m"] == pytest.approx(float(roll.extra["peak_z"][b]) - task.base_height, abs=1e-6), where
            z = roll.q[:, b, 2].numpy()
            r, p = (x.abs().numpy() for x in roll_pitch(roll.q[:, b, 3:7]))
            assert v["height_ok"] == bool((z >= task.fall_height).all()), where
            assert v["tilt_ok"] == bool((r <= task.max_tilt).all() and (p <= task.max_tilt).all()), where
            air_differs = v["apex_ok"] and v["airborne_at_apex"] != bool(roll.extra["airborne_peak"][b])
            touch_differs = (not posture) != bool(roll.extra["violation"][b])
            if label != "random":
                assert v["success"] == bool(roll.success[b]) and not air_differs and not touch_differs, where
            elif v["success"] != bool(roll.success[b]):
                assert air_differs or touch_differs, where
            # Height and tilt are the simulator's own: a posture difference is a contact difference.
            assert not touch_differs or (v["height_ok"] and v["tilt_ok"]), where
            outcomes.append(v["success"])
    assert any(outcomes) and not all(outcomes), outcomes
