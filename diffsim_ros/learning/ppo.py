"""PPO baseline (Stable-Baselines3) on the same tasks and the same simulator.

The environment is :class:`~diffsim_ros.learning.gym_env.TaskVecEnv`: the task
batch stepped without gradients, reward = -step loss (the gradient trainer's
objective). Observations (and, by default, rewards) are normalised by SB3's
``VecNormalize``. Success is judged exactly as for the gradient trainer:
:func:`diffsim_ros.learning.apg.evaluate` on fresh episodes of the nominal
task, every ``eval_every_steps`` environment steps.

The policy returned (:class:`PPOPolicy`) maps *raw* task observations to
actions in [-1, 1]: the observation normaliser frozen at its final statistics
(a :class:`~diffsim_ros.learning.policy.RunningNorm`, as in ``MLPPolicy``), SB3's
actor network and the deterministic action (the Gaussian mean) clipped to the
box, as SB3 clips the actions it sends to the environment. It is a plain
``torch.nn.Module`` that TorchScript compiles, so the checkpoint exporter treats
both trainers alike.
"""
from __future__ import annotations

import copy
import dataclasses
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch
from torch import nn

from ..physics import ConfigError
from ..physics.schema import normalise, option, section
from ..tasks import Task
from .apg import (ResumeError, RunLog, TrainResult, _better, _Checkpoints, _clear_run, _rng_state, _set_rng_state,
                  check_same_trainer, evaluation_columns, plot_history, read_resume_file, run_state)
from .policy import RunningNorm


@section("ppo")
@dataclass(frozen=True)
class PPOConfig:
    """Options of the PPO baseline (the ``ppo:`` section of a training file)."""
    total_timesteps: int = option(2_000_000, "environment-step budget, summed over the parallel environments",
                                  low=1)
    num_envs: int = option(64, "parallel environments (the task batch)", low=1)
    n_steps: int = option(64, "control steps per environment per rollout; a rollout is num_envs * n_steps steps",
                          low=1)
    batch_size: int = option(1024, "minibatch size of the PPO update, in [2, num_envs * n_steps]", low=2)
    n_epochs: int = option(10, "passes over each rollout", low=1)
    learning_rate: float = option(3e-4, "Adam step size", above=0)
    gamma: float = option(0.99, "discount", low=0, high=1)
    gae_lambda: float = option(0.95, "GAE lambda", low=0, high=1)
    ent_coef: float = option(0.0, "entropy bonus")
    clip_range: float = option(0.2, "PPO ratio clip", above=0)
    max_grad_norm: float = option(0.5, "gradient-norm clip of the update", above=0)
    log_std_init: float = option(-0.5, """initial log standard deviation of the Gaussian policy; SB3's 0 (std 1)
        sends a third of the samples past the [-1, 1] action box even with the mean at its centre (more once the
        mean moves off it), where they are clipped and their exploration is lost; exp(-0.5) = 0.61 sends about
        10 %""")
    hidden: Tuple[int, ...] = option((64, 64), "hidden layer sizes of actor and critic (tanh)", low=1)
    normalize_obs: bool = option(True, "normalise observations with running statistics (VecNormalize)")
    normalize_reward: bool = option(True, "scale rewards by the running return deviation (VecNormalize)")
    bootstrap_time_limit: bool = option(True, "treat the episode's end as a time limit and bootstrap the value "
                                        "there")
    eval_every_steps: int = option(50_000, "environment steps between evaluations on fresh episodes", low=1)
    eval_envs: int = option(64, "episodes per evaluation", low=1)
    stop_at_success: bool = option(True, "stop once the evaluation reaches the task's success threshold")
    checkpoint_every: int = option(1, """iterations between checkpoints of a run into a folder (checkpoints/latest
        with the resume state, checkpoints/best), and at the end: an iteration is a whole rollout and its update,
        so a checkpoint costs little beside it""", low=1)
    seed: int = option(0, "random seed")

    def __post_init__(self):
        normalise(self)

    @property
    def rollout_steps(self) -> int:
        return self.num_envs * self.n_steps

    def check(self) -> None:
        if not self.batch_size <= self.rollout_steps:
            raise ConfigError(f"must be in [2, num_envs * n_steps = {self.rollout_steps}], got {self.batch_size}",
                              "batch_size")
        if not self.hidden:
            raise ConfigError("must name at least one layer", "hidden")


class PPOPolicy(nn.Module):
    """Raw observation -> action in [-1, 1]: frozen normaliser, SB3's actor MLP, the
    Gaussian mean, clipped. ``norm`` is a :class:`RunningNorm` (or identity) like
    ``MLPPolicy.norm``."""

    def __init__(self, obs_dim: int, action_dim: int, norm: nn.Module, body: nn.Module, head: nn.Linear):
        super().__init__()
        self.obs_dim, self.action_dim = obs_dim, action_dim
        self.norm = norm
        self.body = body
        self.head = head

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return torch.clamp(self.head(self.body(self.norm(obs))), -1.0, 1.0)


def actor_from_sb3(model, venv_norm, task: Task) -> PPOPolicy:
    """A :class:`PPOPolicy` (copied weights, task dtype and device) from an SB3 PPO
    ``model`` and its ``VecNormalize`` wrapper (or None)."""
    sb = model.policy
    norm: nn.Module = nn.Identity()
    if venv_norm is not None and venv_norm.norm_obs:
        rms = venv_norm.obs_rms
        norm = RunningNorm(task.obs_dim, eps=float(venv_norm.epsilon), clip=float(venv_norm.clip_obs))
        with torch.no_grad():
            norm.mean.copy_(torch.as_tensor(rms.mean))
            norm.var.copy_(torch.as_tensor(rms.var))
            norm.count.fill_(float(rms.count))
    body = copy.deepcopy(sb.mlp_extractor.policy_net)
    head = copy.deepcopy(sb.action_net)
    pol = PPOPolicy(task.obs_dim, task.action_dim, norm, body, head)
    pol.eval()
    for p in pol.parameters():
        p.requires_grad_(False)
    return pol.to(dtype=task.model.dtype, device=task.model.device)


def make_model(task: Task, cfg: PPOConfig):
    """(SB3 PPO model, its VecNormalize wrapper or None, the TaskVecEnv). The networks live on
    the task's device (the simulator's)."""
    from stable_baselines3 import PPO
    from stable_baselines3.common.vec_env import VecNormalize

    from .gym_env import TaskVecEnv

    raw = TaskVecEnv(task, cfg.num_envs, seed=cfg.seed, time_limit_truncates=cfg.bootstrap_time_limit)
    venv, vn = raw, None
    if cfg.normalize_obs or cfg.normalize_reward:
        vn = venv = VecNormalize(raw, norm_obs=cfg.normalize_obs, norm_reward=cfg.normalize_reward,
                                 gamma=cfg.gamma)
    model = PPO("MlpPolicy", venv, learning_rate=cfg.learning_rate, n_steps=cfg.n_steps,
                batch_size=cfg.batch_size, n_epochs=cfg.n_epochs, gamma=cfg.gamma, gae_lambda=cfg.gae_lambda,
                clip_range=cfg.clip_range, ent_coef=cfg.ent_coef, max_grad_norm=cfg.max_grad_norm,
                policy_kwargs=dict(net_arch=dict(pi=list(cfg.hidden), vf=list(cfg.hidden)),
                                   log_std_init=cfg.log_std_init),
                seed=cfg.seed, device=str(task.model.device), verbose=0)
    # A logger with no outputs: without one, every learn() makes an empty tempdir/SB3-<time> folder
    # (the run's own CSV and TensorBoard logs are written by this module).
    from stable_baselines3.common.logger import Logger

    model.set_logger(Logger(folder=None, output_formats=[]))
    return model, vn, raw


RESUME_FORMAT = "diffsim_ros.ppo_resume"   # checkpoints/latest/resume.pt of a PPO run
RESUME_FORMAT_VERSION = 1


def train_ppo(task: Task, cfg: PPOConfig = PPOConfig(), out_dir: Optional[Path] = None, progress: bool = True,
              callback: Optional[Callable[[Dict[str, float]], None]] = None, resume: Optional[Dict[str, Any]] = None,
              export: Optional[Callable[..., Any]] = None, run_info: Optional[Dict[str, Any]] = None) -> TrainResult:
    """Train ``task`` with PPO; history rows as :func:`diffsim_ros.learning.apg.train`
    (``grad_norm`` is nan). ``out_dir``: ``training.csv`` with one row appended (flushed) per
    iteration, TensorBoard event files of the same numbers when ``tensorboard`` is importable
    (:class:`~diffsim_ros.learning.apg.RunLog`), ``checkpoints/latest/`` (with the resume state)
    and ``checkpoints/best/`` every ``cfg.checkpoint_every`` iterations and at the end,
    ``learning_curve.png`` at the end; a fresh run removes an earlier run's checkpoints and event
    files there.

    ``resume``: the state :func:`load_resume_state` read from an earlier run of this task with this
    ``cfg``: training continues as if it had not stopped (the same rows and weights as one
    uninterrupted run): SB3's networks and optimiser, the environments mid-episode, the
    normaliser's statistics and every random generator come back. ``export(policy, result,
    folder, info)`` and ``run_info``: as for :func:`~diffsim_ros.learning.apg.train`.

    One iteration is one rollout of ``num_envs * n_steps`` environment steps and
    its PPO update; ``env_steps`` counts every environment step taken. The
    evaluation after an update judges the policy those steps produced.
    """
    torch.manual_seed(cfg.seed)
    model, vn, raw = make_model(task, cfg)
    iterations = max(1, math.ceil(cfg.total_timesteps / cfg.rollout_steps))
    history: List[Dict[str, float]] = []
    solved_steps = solved_time = None
    next_eval = cfg.eval_every_steps
    best = None
    it = 0
    if resume is not None:
        check_resume_state(resume, task, cfg)
        _set_learner_state(resume["learner"], model, vn, raw)
        history = [dict(row) for row in resume["history"]]
        it, next_eval, best = int(resume["iteration"]), int(resume["next_eval"]), resume["best"]
        solved_steps, solved_time = resume["solved_env_steps"], resume["solved_time"]
        _set_rng_state(resume["rng"], raw.generator, task.model.device)
    bar = None
    if progress:
        from tqdm import tqdm
        bar = tqdm(total=iterations * cfg.rollout_steps, initial=it * cfg.rollout_steps, desc=f"ppo {task.name}",
                   unit="step", leave=False)
    # wall_time continues the clock of the run resumed
    t_start = time.perf_counter() - (float(history[-1]["wall_time"]) if history else 0.0)
    policy = None
    log = checkpoints = None
    if out_dir is not None:
        out_dir = Path(out_dir)
        if resume is None:
            _clear_run(out_dir)     # an earlier run's checkpoints and event files would mix with this one
        log = RunLog(out_dir, history)
        checkpoints = _Checkpoints(out_dir, task, None, export or _default_export(task, cfg))
    pending_best = None

    def save(finished: bool) -> None:
        """checkpoints/best (when a better evaluation came since the last save) and checkpoints/latest
        with the resume state; nothing the run draws from its random generators changes."""
        nonlocal pending_best
        latest = actor_from_sb3(model, vn, task)
        checkpoints.save_run(raw.generator, pending_best, latest, it, history, solved_steps, solved_time,
                             lambda rng: dict(run_state(RESUME_FORMAT, RESUME_FORMAT_VERSION, task, it, finished,
                                                        history, best, solved_steps, solved_time, rng, run_info),
                                              next_eval=next_eval, learner=_learner_state(model, vn, raw),
                                              ppo_config=_config_values(cfg)))
        pending_best = None

    try:
        while it < iterations:
            # Only a fresh run's first rollout resets the environments; a resumed one goes on mid-episode.
            model.learn(total_timesteps=cfg.rollout_steps, reset_num_timesteps=(it == 0 and resume is None),
                        progress_bar=False)
            env_steps = int(model.num_timesteps)
            loss, train_success = raw.pop_stats()
            row = {"iteration": it + 1, "env_steps": env_steps, "wall_time": time.perf_counter() - t_start,
                   "loss": loss, "grad_norm": float("nan"), "train_success": train_success,
                   "eval_success": float("nan"), "eval_at_limit": float("nan"), "eval_over_speed": float("nan"),
                   "diverged": 0,     # apg's columns; SB3 has no retry
                   "lr": cfg.learning_rate}
            last = it + 1 == iterations
            policy = None
            if env_steps >= next_eval or last:
                while next_eval <= env_steps:
                    next_eval += cfg.eval_every_steps
                policy = actor_from_sb3(model, vn, task)
                row.update(evaluation_columns(task, policy, cfg.eval_envs))
                if solved_steps is None and row["eval_success"] >= task.success_threshold:
                    solved_steps, solved_time = env_steps, row["wall_time"]
                if _better(row, best):
                    best = {"iteration": it + 1, "eval_success": row["eval_success"], "loss": row["loss"]}
                    if checkpoints is not None:
                        pending_best = (policy, it + 1)
            history.append(row)
            it += 1
            done = last or (cfg.stop_at_success and solved_steps is not None)
            if log is not None:
                log.append(row)
            if checkpoints is not None and (it % cfg.checkpoint_every == 0 or done):
                save(done)
            if callback is not None:
                callback(row)
            if bar is not None:
                bar.set_postfix(loss=f"{loss:.4f}", success=f"{train_success:.2f}")
                bar.update(cfg.rollout_steps)
            if done:
                break
    finally:
        if bar is not None:
            bar.close()
        if log is not None:
            log.close()
        raw.close()
    if policy is None:
        policy = actor_from_sb3(model, vn, task)
    if out_dir is not None:
        plot_history(history, Path(out_dir), title=f"{task.name}: PPO (Stable-Baselines3)")
    return TrainResult(policy, history, solved_steps, solved_time)


def _default_export(task, cfg: PPOConfig):
    def export(policy, result, folder, info):
        from .checkpoint import save_checkpoint, training_summary

        save_checkpoint(policy, task, folder, extra={
            "training": dict(training_summary(result, cfg), method="ppo"), "checkpoint": info})
    return export


def _config_values(cfg: PPOConfig) -> Dict[str, Any]:
    return {k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(cfg).items()}


def _array(x) -> torch.Tensor:
    import numpy as np

    return torch.from_numpy(np.array(x, copy=True))


def _rms(r) -> Dict[str, Any]:
    return {"mean": _array(r.mean), "var": _array(r.var), "count": float(r.count)}


def _learner_state(model, vn, raw) -> Dict[str, Any]:
    """What SB3 carries from one ``learn`` call to the next, as tensors and plain values: the
    networks and their optimiser, the step counters, the last observation and episode starts,
    the normaliser's statistics and running returns, and the environments themselves."""
    state = {"policy": copy.deepcopy(model.policy.state_dict()),
             "optimizer": copy.deepcopy(model.policy.optimizer.state_dict()),
             "num_timesteps": int(model.num_timesteps), "n_updates": int(model._n_updates),
             "episode_num": int(model._episode_num), "last_obs": _array(model._last_obs),
             "last_episode_starts": _array(model._last_episode_starts),
             "last_original_obs": None if model._last_original_obs is None else _array(model._last_original_obs),
             "normalizer": None, "env": raw.get_state()}
    if vn is not None:
        state["normalizer"] = {"obs_rms": _rms(vn.obs_rms), "ret_rms": _rms(vn.ret_rms), "returns": _array(vn.returns),
                               "old_obs": _array(vn.old_obs), "old_reward": _array(vn.old_reward)}
    return state


def _set_learner_state(state: Dict[str, Any], model, vn, raw) -> None:
    model.policy.load_state_dict(state["policy"])
    model.policy.optimizer.load_state_dict(state["optimizer"])
    model.num_timesteps, model._n_updates = int(state["num_timesteps"]), int(state["n_updates"])
    model._episode_num = int(state["episode_num"])
    model._last_obs = state["last_obs"].numpy().copy()
    model._last_episode_starts = state["last_episode_starts"].numpy().copy()
    if state["last_original_obs"] is not None:
        model._last_original_obs = state["last_original_obs"].numpy().copy()
    norm = state["normalizer"]
    if vn is not None and norm is not None:
        for name in ("obs_rms", "ret_rms"):
            r = getattr(vn, name)
            r.mean, r.var, r.count = (norm[name]["mean"].numpy().copy(), norm[name]["var"].numpy().copy(),
                                      float(norm[name]["count"]))
        vn.returns = norm["returns"].numpy().copy()
        vn.old_obs, vn.old_reward = norm["old_obs"].numpy().copy(), norm["old_reward"].numpy().copy()
    raw.set_state(state["env"])


def load_resume_state(out_dir) -> Dict[str, Any]:
    """The PPO run's state in ``out_dir`` (``checkpoints/latest/resume.pt``), as
    :func:`diffsim_ros.learning.apg.load_resume_state` reads the gradient trainer's; a
    :class:`~diffsim_ros.learning.apg.ResumeError` naming what is wrong."""
    return read_resume_file(out_dir, RESUME_FORMAT, RESUME_FORMAT_VERSION, (
        "iteration", "finished", "history", "next_eval", "best", "learner", "rng", "ppo_config", "task"))


def check_resume_state(state: Dict[str, Any], task: Task, cfg: PPOConfig) -> None:
    """A ResumeError unless ``state`` continues a PPO run of ``task`` with ``cfg`` that has
    iterations left; it names what differs."""
    where = state.get("path", "resume state")
    check_same_trainer(state, task, "ppo", state["ppo_config"], _config_values(cfg))
    if state["finished"]:
        raise ResumeError(f"{where}: the run already finished (iteration {int(state['iteration'])}); "
                          f"nothing to resume")
