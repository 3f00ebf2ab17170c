"""The PPO baseline: the VecEnv over a task, and a short Stable-Baselines3 run.

SB3's ``env_checker`` checks single gymnasium environments, not VecEnvs, so the
VecEnv contract is checked directly: spaces, reset and step shapes, reward =
-step loss of the same simulator, auto-reset after ``horizon`` steps with
``terminal_observation`` and ``is_success`` at every episode end. The short
run checks the trainer end to end and that the policy it returns maps raw task
observations to actions in [-1, 1] exactly as SB3's deterministic actor does.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

pytest.importorskip("stable_baselines3", reason="stable-baselines3 (PPO baseline) is not installed")
pytest.importorskip("gymnasium", reason="gymnasium is not installed")

from stable_baselines3.common.vec_env import VecCheckNan, VecEnv, VecNormalize  # noqa: E402

from diffsim_ros import physics  # noqa: E402
from diffsim_ros.learning import apg  # noqa: E402
from diffsim_ros.learning.gym_env import TaskVecEnv  # noqa: E402
from diffsim_ros.learning.ppo import PPOConfig, PPOPolicy, actor_from_sb3, make_model, train_ppo  # noqa: E402
from diffsim_ros.tasks import ReachTask  # noqa: E402

from conftest import PROJECT_URDFS, REPO_ROOT  # noqa: E402

HORIZON = 20
B = 8


@pytest.fixture(scope="module")
def task():
    m = physics.load_urdf(str(PROJECT_URDFS["arm"]), dtype=torch.float32)
    sc = physics.SimConfig(dt=0.02, substeps=2, actuator="position", kp=(60, 40, 20, 5), kd=(6, 4, 2, 0.5),
                           ground=False)
    return ReachTask(m, sc, ee_link="ee_link", horizon=HORIZON)


# ----------------------------------------------------------------------------- VecEnv


def test_spaces_and_reset(task):
    env = TaskVecEnv(task, B, seed=3)
    assert isinstance(env, VecEnv) and env.num_envs == B
    assert env.observation_space.shape == (task.obs_dim,)
    assert env.action_space.shape == (task.action_dim,)
    assert np.all(env.action_space.low == -1.0) and np.all(env.action_space.high == 1.0)
    obs = env.reset()
    assert obs.shape == (B, task.obs_dim) and obs.dtype == np.float32
    assert env.observation_space.contains(obs[0])
    # Same reset distribution as the task's own, with the same seed.
    ref = task.observe(task.reset(B, torch.Generator().manual_seed(3)))
    np.testing.assert_allclose(obs, ref.numpy(), rtol=1e-6, atol=1e-6)
    assert env.get_attr("render_mode") == [None] * B
    assert env.env_is_wrapped(object) == [False] * B


def test_step_reward_autoreset_and_success(task):
    """Two episodes side by side with the task stepped directly under the same actions."""
    env = TaskVecEnv(task, B, seed=7)
    gen = torch.Generator().manual_seed(7)
    obs = env.reset()
    ts = task.reset(B, gen)
    rng = np.random.default_rng(0)
    for episode in range(2):
        for k in range(HORIZON):
            a = rng.uniform(-1.3, 1.3, size=(B, task.action_dim)).astype(np.float32)   # out of the box too
            obs, rew, done, infos = env.step(a)
            at = torch.as_tensor(a).clamp(-1, 1)
            ts = task.step(ts, at)
            assert obs.shape == (B, task.obs_dim) and rew.shape == (B,) and done.shape == (B,)
            np.testing.assert_allclose(rew, -task.step_loss(ts, at).numpy(), rtol=1e-5, atol=1e-6)
            if k < HORIZON - 1:
                assert not done.any()
                assert all("is_success" not in i and "terminal_observation" not in i for i in infos)
                np.testing.assert_allclose(obs, task.observe(ts).numpy(), rtol=1e-5, atol=1e-6)
            else:
                assert done.all(), "every episode ends after task.horizon steps"
                succ = task.success(ts).numpy()
                for i, info in enumerate(infos):
                    assert info["is_success"] == bool(succ[i])
                    assert info["TimeLimit.truncated"] is True
                    np.testing.assert_allclose(info["terminal_observation"], task.observe(ts)[i].numpy(),
                                               rtol=1e-5, atol=1e-6)
                    assert info["episode"]["l"] == HORIZON
                ts = task.reset(B, gen)      # auto-reset: the next observation starts a fresh episode
                np.testing.assert_allclose(obs, task.observe(ts).numpy(), rtol=1e-6, atol=1e-6)
    loss, success = env.pop_stats()
    assert math.isfinite(loss) and 0.0 <= success <= 1.0
    assert env.total_steps == 2 * HORIZON * B


def test_sb3_wrappers_accept_the_env(task):
    env = VecNormalize(VecCheckNan(TaskVecEnv(task, B, seed=0), raise_exception=True), gamma=0.99)
    obs = env.reset()
    assert obs.shape == (B, task.obs_dim)
    for _ in range(HORIZON):
        obs, rew, done, infos = env.step(np.zeros((B, task.action_dim), np.float32))
    assert done.all() and "terminal_observation" in infos[0]


# ----------------------------------------------------------------------------- config


def test_config_from_dict():
    cfg = PPOConfig.from_mapping({"total_timesteps": 1000, "hidden": [32, 32], "learning_rate": 1e-3,
                               "stop_at_success": False})
    assert cfg.total_timesteps == 1000 and cfg.hidden == (32, 32) and cfg.learning_rate == 1e-3
    with pytest.raises(physics.ConfigError, match="ppo.n_step"):
        PPOConfig.from_mapping({"n_step": 10})
    with pytest.raises(physics.ConfigError, match="ppo.stop_at_success"):
        PPOConfig.from_mapping({"stop_at_success": 1})
    with pytest.raises(physics.ConfigError, match="ppo.num_envs"):
        PPOConfig.from_mapping({"num_envs": "many"})
    with pytest.raises(physics.ConfigError, match="batch_size"):
        PPOConfig.from_mapping({"num_envs": 4, "n_steps": 8, "batch_size": 64})


def test_ppo_sections_of_the_training_files_parse():
    from diffsim_ros import config
    files = [f for f in sorted(REPO_ROOT.glob("config/*.yaml")) if "ppo" in config.load_yaml(f)]
    for f in files:
        cfg = PPOConfig.from_mapping(config.load_yaml(f)["ppo"])
        assert cfg.batch_size <= cfg.rollout_steps, f


# ----------------------------------------------------------------------------- training


def test_exported_policy_is_sb3_deterministic_actor(task, tmp_path):
    cfg = PPOConfig(num_envs=B, n_steps=HORIZON, batch_size=B * HORIZON // 2, n_epochs=2, seed=1)
    model, vn, raw = make_model(task, cfg)
    model.learn(total_timesteps=cfg.rollout_steps)      # non-trivial normaliser statistics and weights
    pol = actor_from_sb3(model, vn, task)
    obs = task.observe(task.reset(16, torch.Generator().manual_seed(0)))
    obs = torch.cat((obs, 50.0 * obs[:4]))               # far outside the training distribution too
    sb3, _ = model.predict(vn.normalize_obs(obs.numpy()), deterministic=True)
    act = pol(obs)
    np.testing.assert_allclose(act.numpy(), np.clip(sb3, -1, 1), rtol=1e-5, atol=1e-5)
    assert float(act.abs().max()) <= 1.0
    # The checkpoint exporter (TorchScript + metadata) takes it as it takes the gradient trainer's policy.
    from diffsim_ros.learning.checkpoint import load_checkpoint, save_checkpoint
    save_checkpoint(pol, task, tmp_path)
    loaded, meta = load_checkpoint(tmp_path, model=task.model)
    torch.testing.assert_close(loaded(obs), act)
    assert meta["normalization"]["mean"] == pytest.approx(vn.obs_rms.mean.tolist(), rel=1e-6, abs=1e-6)


def test_short_ppo_run(task, tmp_path):
    cfg = PPOConfig(total_timesteps=2880, num_envs=16, n_steps=3 * HORIZON, batch_size=240, n_epochs=3,
                    eval_every_steps=1920, eval_envs=16, stop_at_success=False)
    rows = []
    res = train_ppo(task, cfg, out_dir=tmp_path, progress=False, callback=rows.append)
    assert isinstance(res.policy, PPOPolicy)
    assert len(res.history) == 3 and rows == res.history      # 3 rollouts of 16 x 60 steps
    # Same log as the gradient trainer.
    apg_res = apg.train(task, apg.TrainConfig(iterations=1, num_envs=2, eval_envs=2), progress=False)
    assert list(res.history[0].keys()) == list(apg_res.history[0].keys())
    assert [r["env_steps"] for r in res.history] == [cfg.rollout_steps * (i + 1) for i in range(3)]
    assert all(math.isnan(r["grad_norm"]) for r in res.history)
    # Evaluations every 1920 steps (after rollout 2) and at the end.
    assert [not math.isnan(r["eval_success"]) for r in res.history] == [False, True, True]
    assert all(0.0 <= r["train_success"] <= 1.0 and r["loss"] > 0 for r in res.history)
    assert (tmp_path / "training.csv").is_file() and (tmp_path / "learning_curve.png").is_file()
    # The returned policy: raw observations -> [-1, 1], judged by the gradient trainer's metric.
    obs = task.observe(task.reset(32, torch.Generator().manual_seed(5)))
    act = res.policy(torch.cat((obs, 100.0 * obs)))
    assert act.shape == (64, task.action_dim) and float(act.abs().max()) <= 1.0
    assert res.history[-1]["eval_success"] == apg.evaluate(task, res.policy, cfg.eval_envs)
    assert res.solved_env_steps is None or res.solved_env_steps in [r["env_steps"] for r in res.history]
