"""A task's verdict on recorded arrays (``Task.recorded_verdict``, what the main job reports for
the stand-in's flight) is the task's own episode verdict: simulated episodes of the shipped hover
policy, of the same policy with its thrust cut and of drawn random policies are recorded as a bag
holds them (odometry: world pose, body-frame twist) and judged both ways; each episode's two
verdicts agree, and both outcomes occur."""
from __future__ import annotations

import numpy as np
import torch

from conftest import REPO_ROOT, drawn_seed

from diffsim_ros import evaluation


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
    """A recorded hover at the target, yawed 90 degrees, drifting along body x at 0.5 m/s: too fast
    (0.2 m/s allowed) and off the target after the settling time; the same pose held still passes."""
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
