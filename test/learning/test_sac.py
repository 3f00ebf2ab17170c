"""The SAC baseline (Stable-Baselines3's SAC on the project's tasks, diffsim_ros.learning.sac).

Each check compares against something SAC's own code does not decide: the exported actor
against SB3's ``model.predict(deterministic=True)`` on random observations; learning by the
task's own loss on fresh episodes, before and after; the checkpoint by ``diffsim-ros eval``
and PolicyRunner loading it; a resumed run against the same run left alone; a wrong key by the
error naming it. No timing is asserted.
"""
from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import torch

pytest.importorskip("stable_baselines3", reason="stable-baselines3 (SAC baseline) is not installed")
pytest.importorskip("gymnasium", reason="gymnasium is not installed")

from diffsim_ros import config, physics  # noqa: E402
from diffsim_ros.learning import apg  # noqa: E402
from diffsim_ros.learning.checkpoint import load_checkpoint, save_checkpoint  # noqa: E402
from diffsim_ros.learning.sac import SACConfig, SACPolicy, actor_from_sb3, make_model, train_sac  # noqa: E402

from conftest import REPO_ROOT, csv_rows, drawn_seed, run_main, without_time, write_params  # noqa: E402


def reach_params(horizon: int, dtype: str = "float32") -> dict:
    """config/reach_arm.yaml with a short episode.

    The project's arm; delta targets and J^T e in the observation.
    """
    params = config.load_yaml(REPO_ROOT / "config" / "reach_arm.yaml")
    params["dtype"] = dtype
    params["task"]["horizon"] = horizon
    params["training"].update(eval_envs=4, window=4)
    return params


@pytest.fixture(scope="module")
def task():
    return config.build_task(reach_params(20), "reach")[0]


# ----------------------------------------------------------------------------- config


def test_config_from_dict_and_its_refusals():
    cfg = SACConfig.from_mapping({"total_timesteps": 1000, "hidden": [32, 32], "gradient_steps": 4})
    assert cfg.total_timesteps == 1000 and cfg.hidden == (32, 32) and cfg.gradient_steps == 4
    with pytest.raises(physics.ConfigError, match=r"unknown key 'sac\.gradient_step'; did you mean 'gradient_steps'"):
        SACConfig.from_mapping({"gradient_step": 4})
    # A PPO option in the SAC section names the section it belongs to.
    with pytest.raises(physics.ConfigError, match=r"unknown key 'sac\.n_epochs'; it is a key of 'ppo'"):
        SACConfig.from_mapping({"n_epochs": 3})
    with pytest.raises(physics.ConfigError, match=r"'sac\.gradient_steps' must be -1 .* or at least 1, got 0"):
        SACConfig.from_mapping({"gradient_steps": 0})
    with pytest.raises(physics.ConfigError, match=r"'sac\.ent_coef' must be > 0 when learn_ent_coef"):
        SACConfig.from_mapping({"ent_coef": 0.0})
    assert SACConfig.from_mapping({"ent_coef": 0.0, "learn_ent_coef": False}).ent_coef == 0.0
    with pytest.raises(physics.ConfigError, match=r"'sac\.tau' must be in \(0, 1\]"):
        SACConfig.from_mapping({"tau": 0.0})


def test_sac_sections_of_the_training_files_parse():
    files = [f for f in sorted(REPO_ROOT.glob("config/*.yaml")) if "sac" in config.load_yaml(f)]
    assert len(files) >= 6
    for f in files:
        params = config.load_yaml(f)
        cfg = SACConfig.from_mapping(params["sac"])
        # Each file's discount is its PPO section's (the same effective horizon for both baselines).
        assert cfg.gamma == params["ppo"].get("gamma", 0.99), f


def test_bad_sac_key_in_a_training_file_is_refused_naming_it(tmp_path, capsys):
    params = reach_params(8)
    params["sac"]["buffer_sise"] = 1000
    cfg = write_params(tmp_path / "bad.yaml", params)
    rc, _, err = run_main(capsys, "baseline", "--algo", "sac", "--config", cfg, "--out", tmp_path / "o")
    assert rc == 2 and err.startswith("error: ") and "Traceback" not in err, err
    assert "bad.yaml" in err and "'sac.buffer_sise'" in err and "did you mean 'buffer_size'" in err, err
    params["sac"] = {"gradient_steps": 0}
    rc, _, err = run_main(capsys, "baseline", "--algo", "sac", "--config", write_params(tmp_path / "bad.yaml", params),
                          "--out", tmp_path / "o")
    assert rc == 2 and "'sac.gradient_steps' must be -1" in err, err
    assert not (tmp_path / "o" / "policy.pt").exists()


# ----------------------------------------------------------------------------- the exported actor


@pytest.mark.parametrize("normalize_obs", [True, False])
def test_exported_actor_is_sb3_deterministic_predict(task, tmp_path, normalize_obs):
    """The exported actor is SB3's deterministic predict.

    After some updates (weights and normaliser statistics moved), the exported actor gives what
    SB3's deterministic predict gives (through the VecNormalize when there is one), on random
    observations near and far outside the training distribution; so does its checkpoint.
    """
    cfg = SACConfig(num_envs=8, learning_starts=160, batch_size=64, hidden=(32, 32), seed=1,
                    normalize_obs=normalize_obs)
    model, vn, raw = make_model(task, cfg)
    model.learn(total_timesteps=480)
    assert model._n_updates > 0
    pol = actor_from_sb3(model, vn, task)
    assert isinstance(pol, SACPolicy) and (vn is not None) == normalize_obs
    gen = torch.Generator().manual_seed(0)
    obs = task.observe(task.reset(32, gen))
    obs = torch.cat((obs, torch.randn(32, task.obs_dim, generator=gen), 50.0 * obs[:8]))
    seen = obs.numpy() if vn is None else vn.normalize_obs(obs.numpy())
    sb3, _ = model.predict(seen, deterministic=True)
    act = pol(obs)
    np.testing.assert_allclose(act.numpy(), sb3, rtol=1e-5, atol=1e-5)
    assert float(act.abs().max()) <= 1.0 and float(act.abs().max()) > 0.0
    save_checkpoint(pol, task, tmp_path)
    loaded, meta = load_checkpoint(tmp_path, model=task.model)
    torch.testing.assert_close(loaded(obs), act)
    if normalize_obs:
        assert meta["normalization"]["mean"] == pytest.approx(vn.obs_rms.mean.tolist(), rel=1e-6, abs=1e-6)
    else:
        assert meta["normalization"] is None


# ----------------------------------------------------------------------------- training


def episode_loss(task, policy, episodes: int = 128, seed: int = 7) -> float:
    """Return the task's loss summed over an episode, mean over fresh episodes.

    The summed loss is the objective both trainers minimise.
    """
    with torch.no_grad():
        ts = task.reset(episodes, torch.Generator().manual_seed(seed))
        total = torch.zeros(episodes, dtype=task.model.dtype)
        for _ in range(task.horizon):
            a = policy(task.observe(ts))
            ts = task.step(ts, a)
            total += task.step_loss(ts, a)
    return float(total.mean())


def test_short_sac_run_learns(tmp_path):
    """A short SAC run learns.

    16,000 environment steps of the arm reaching in 0.5 s: the deterministic actor's episode loss
    on 128 fresh episodes falls well below the untrained actor's (by 24-32 % on seeds 0-3; the
    untrained actor, mean action about 0, holds the arm still). The history has the gradient
    trainer's columns; evaluations come every eval_every_steps and at the end.
    """
    seed = drawn_seed("short SAC run", "SAC_TEST_SEED", bits=16)
    task = config.build_task(reach_params(25), "reach")[0]
    cfg = SACConfig(total_timesteps=16_000, num_envs=16, learning_starts=400, batch_size=128, learning_rate=1e-3,
                    gamma=0.95, gradient_steps=4, hidden=(64, 64), eval_every_steps=6400, eval_envs=16,
                    stop_at_success=False, seed=seed)
    model, vn, _ = make_model(task, cfg)
    before = episode_loss(task, actor_from_sb3(model, vn, task))
    rows = []
    res = train_sac(task, cfg, out_dir=tmp_path, progress=False, callback=rows.append)
    after = episode_loss(task, res.policy)
    print(f"episode loss: untrained {before:.3f}, after {cfg.total_timesteps} steps {after:.3f}")
    assert after < 0.9 * before
    step = cfg.steps_per_iteration(task)
    assert step == 16 * 25 and len(res.history) == 40 and rows == res.history
    assert [r["env_steps"] for r in res.history] == [step * (i + 1) for i in range(40)]
    apg_res = apg.train(task, apg.TrainConfig(iterations=1, num_envs=2, eval_envs=2), progress=False)
    assert list(res.history[0].keys()) == list(apg_res.history[0].keys())
    evaluated = [r["iteration"] for r in res.history if not np.isnan(r["eval_success"])]
    assert evaluated == [16, 32, 40]          # 6,400 / 400 steps per iteration, and the last
    assert res.history[-1]["eval_success"] == apg.evaluate(task, res.policy, cfg.eval_envs)
    assert (tmp_path / "training.csv").is_file() and (tmp_path / "learning_curve.png").is_file()
    _, meta = load_checkpoint(tmp_path / "checkpoints" / "latest", model=task.model)
    assert meta["training"]["method"] == "sac" and meta["checkpoint"]["iteration"] == 40


def test_cli_sac_baseline_writes_a_checkpoint_eval_and_policy_runner_load(tmp_path, capsys):
    from diffsim_ros.learning.deploy import PolicyRunner

    params = reach_params(8)
    params["sac"].update(num_envs=4, learning_starts=16, batch_size=16, hidden=[16, 16], eval_envs=4)
    cfg = write_params(tmp_path / "tiny_sac.yaml", params)
    out = tmp_path / "run"
    rc, stdout, err = run_main(capsys, "baseline", "--algo", "sac", "--config", cfg, "--out", out, "--timesteps", 96,
                               "--no-progress")
    assert rc == 0, err
    assert "baseline (SAC)" in stdout and "env steps       96" in stdout, stdout
    _, meta = load_checkpoint(out, model=physics.load_urdf(str(REPO_ROOT / "urdf" / "diffsim_arm.urdf")))
    assert meta["training"]["method"] == "sac" and meta["training"]["config"]["total_timesteps"] == 96
    rc, stdout, err = run_main(capsys, "eval", out, "--episodes", "4", "--seed", "3")
    assert rc == 0 and "of 4)" in stdout, stdout + err
    runner = PolicyRunner(out)
    obs = torch.randn(5, meta["observation"]["dim"], generator=torch.Generator().manual_seed(2))
    loaded, _ = load_checkpoint(out, model=runner.task.model)
    torch.testing.assert_close(runner.policy(obs), loaded(obs))
    assert float(runner.policy(obs).abs().max()) <= 1.0


SAC_KILLER = """
import os, signal, sys
import stable_baselines3
from diffsim_ros import cli
real, calls = stable_baselines3.SAC.train, [0]
def dying(self, *args, **kwargs):
    calls[0] += 1
    if calls[0] == {kill}:
        os.kill(os.getpid(), signal.SIGKILL)       # inside an update of iteration 6
    return real(self, *args, **kwargs)
stable_baselines3.SAC.train = dying
sys.exit(cli.main({argv!r}))
"""


def test_killed_sac_run_resumes_bit_for_bit(tmp_path, capsys):
    """A killed SAC run resumes bit for bit.

    ``diffsim-ros baseline --resume``: a SAC run killed inside iteration 6 (checkpoint every 2)
    and resumed ends with the same rows, networks, optimisers, entropy coefficient, replay buffer
    and observation statistics as the run left alone. An iteration (4 environments x 9 steps:
    train_freq 3 over 8-step episodes) ends mid-episode, and the uniform warm-up (40 steps) spans
    the first checkpoint's iterations.
    """
    params = reach_params(8, dtype="float64")
    params["sac"] = dict(total_timesteps=7 * 36, num_envs=4, learning_starts=40, batch_size=16, train_freq=3,
                         gradient_steps=2, hidden=[16, 16], eval_every_steps=72, eval_envs=4, stop_at_success=False,
                         checkpoint_every=2, seed=3)
    cfg = write_params(tmp_path / "tiny_sac.yaml", params)
    one_go, out = tmp_path / "one_go", tmp_path / "run"
    rc, _, err = run_main(capsys, "baseline", "--algo", "sac", "--config", cfg, "--out", one_go, "--no-progress")
    assert rc == 0, err
    # Updates (3 per iteration) from the first step past 40: iterations 2-5 make calls 1-12, the kill is call 14.
    argv = ["baseline", "--algo", "sac", "--config", str(cfg), "--out", str(out), "--no-progress"]
    proc = subprocess.run([sys.executable, "-c", SAC_KILLER.format(kill=14, argv=argv)], cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == -9, proc.stdout + proc.stderr
    killed = csv_rows(out / "training.csv")
    assert [int(r["iteration"]) for r in killed] == [1, 2, 3, 4, 5]
    assert without_time(killed) == without_time(csv_rows(one_go / "training.csv")[:5])
    rc, _, err = run_main(capsys, *argv)
    assert rc == 2 and "diffsim-ros baseline --resume" in err, err
    rc, _, err = run_main(capsys, "baseline", "--algo", "ppo", "--resume", out)
    assert rc == 2 and "another trainer's" in err, err

    rc, stdout, err = run_main(capsys, "baseline", "--resume", out, "--no-progress")     # SAC: the run's own
    assert rc == 0, err
    assert "resuming the SAC run" in stdout and "after iteration 4" in stdout, stdout
    rows = csv_rows(out / "training.csv")
    assert without_time(rows) == without_time(csv_rows(one_go / "training.csv"))
    a, b = (torch.load(d / "checkpoints" / "latest" / "resume.pt", map_location="cpu", weights_only=True)
            for d in (one_go, out))
    assert a["finished"] and b["finished"] and a["iteration"] == b["iteration"] == 7
    la, lb = a["learner"], b["learner"]
    for k in la["policy"]:
        assert torch.equal(la["policy"][k], lb["policy"][k]), k
    for name in ("actor_optimizer", "critic_optimizer", "ent_coef_optimizer"):
        for i, st in la[name]["state"].items():
            for k, v in st.items():
                assert torch.equal(v, lb[name]["state"][i][k]), (name, i, k)
    assert torch.equal(la["log_ent_coef"], lb["log_ent_coef"])
    assert la["replay_buffer"]["pos"] == lb["replay_buffer"]["pos"] == 7 * 36 // 4
    for k in ("observations", "next_observations", "actions", "rewards", "dones", "timeouts"):
        assert torch.equal(la["replay_buffer"][k], lb["replay_buffer"][k]), k
    assert torch.equal(la["normalizer"]["obs_rms"]["mean"], lb["normalizer"]["obs_rms"]["mean"])
    assert torch.equal(la["env"]["ts"]["sim"]["q"], lb["env"]["ts"]["sim"]["q"])
    model = physics.load_urdf(str(REPO_ROOT / "urdf" / "diffsim_arm.urdf"))
    pa, _ = load_checkpoint(one_go, model=model)
    pb, meta = load_checkpoint(out, model=model)
    obs = torch.randn(16, meta["observation"]["dim"], generator=torch.Generator().manual_seed(3))
    assert torch.equal(pa(obs), pb(obs))
    assert meta["training"]["method"] == "sac" and meta["training"]["iterations"] == 7
    rc, _, err = run_main(capsys, "baseline", "--resume", out)
    assert rc == 2 and "already finished" in err, err
