"""What the Stable-Baselines3 baselines (:mod:`.ppo`, :mod:`.sac`) share.

- the options of their sections (``ppo:``, ``sac:``) that mean the same for both, declared once
  (:func:`loop_option`), and what the sections do when built (:class:`BaselineConfig`);
- the environment: :class:`~diffsim_ros.learning.gym_env.TaskVecEnv` over the task batch, with
  SB3's ``VecNormalize`` when the section asks for it (:func:`make_env`);
- the exported actor (:class:`SB3Actor`): the normaliser frozen at its final statistics (a
  :class:`~diffsim_ros.learning.policy.RunningNorm`, as in ``MLPPolicy``), a copy of SB3's actor
  network and its output layer, a plain ``torch.nn.Module`` that TorchScript compiles, so the
  checkpoint exporter treats every trainer alike;
- the training loop (:func:`train_baseline`): one ``learn`` call per iteration, a row of the
  gradient trainer's columns after it, evaluations on fresh episodes by the task's own success
  metric (:func:`diffsim_ros.learning.run.evaluation_columns`), ``training.csv`` and TensorBoard,
  ``checkpoints/latest`` (with the resume state) and ``checkpoints/best``, and resume (the run's
  folder and the resume state's common entries are :mod:`.run`'s, shared with the gradient trainer);
- the parts of a resume state every SB3 learner has: networks, step counters, the last
  observation, the normaliser's statistics and the environments mid-episode (:func:`learner_state`).

Stable-Baselines3 and gymnasium are imported only when a model is built.
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
from ..schema import normalise, option
from ..tasks import Task
from .policy import RunningNorm
from .run import (Checkpoints, ResumeError, RunLog, TrainResult, after_row, better, check_same_trainer, clear_run,
                  default_export, evaluation_columns, plot_history, read_resume_file, run_state, set_rng_state)


#: The options of a baseline's section that the shared environment and loop (:func:`make_env`,
#: :func:`train_baseline`) read alike for every algorithm: name -> (documentation, bounds).
LOOP_OPTIONS: Dict[str, Tuple[str, Dict[str, Any]]] = {
    "total_timesteps": ("environment-step budget, summed over the parallel environments", {"low": 1}),
    "gamma": ("discount", {"low": 0, "high": 1}),
    "normalize_obs": ("normalise observations with running statistics (VecNormalize)", {}),
    "bootstrap_time_limit": ("treat the episode's end as a time limit and bootstrap the value there", {}),
    "eval_every_steps": ("environment steps between evaluations on fresh episodes", {"low": 1}),
    "eval_envs": ("episodes per evaluation", {"low": 1}),
    "stop_at_success": ("stop once the evaluation reaches the task's success threshold", {}),
    "seed": ("random seed", {}),
}


def loop_option(name: str, default: Any) -> Any:
    """Return the field ``name`` of :data:`LOOP_OPTIONS` with this algorithm's ``default``.

    The field is the schema.option with its documentation and bounds; the sections declare each where they list it.
    """
    doc, bounds = LOOP_OPTIONS[name]
    return option(default, doc, **bounds)


class BaselineConfig:
    """What the sections of the baselines do alike.

    The sections (:class:`~.ppo.PPOConfig`, :class:`~.sac.SACConfig`) are frozen dataclasses under schema.section.
    What they do alike: check and convert every field when built (schema.normalise), and the rules between fields
    (:meth:`check`: a subclass's own rules, then these).
    """

    def __post_init__(self):
        normalise(self)

    def check(self) -> None:
        if not self.hidden:
            raise ConfigError("must name at least one layer", "hidden")


class SB3Actor(nn.Module):
    """Raw observation -> action in [-1, 1].

    Frozen normaliser (``norm``, a :class:`RunningNorm` or identity, like ``MLPPolicy.norm``), SB3's
    actor MLP (``body``) and output layer (``head``); :meth:`squash` maps the output into the action
    box (each algorithm's deterministic action).
    """

    def __init__(self, obs_dim: int, action_dim: int, norm: nn.Module, body: nn.Module, head: nn.Linear):
        super().__init__()
        self.obs_dim, self.action_dim = obs_dim, action_dim
        self.norm = norm
        self.body = body
        self.head = head

    def squash(self, out: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.squash(self.head(self.body(self.norm(obs))))


def frozen_actor(cls, venv_norm, task: Task, body: nn.Module, head: nn.Linear) -> SB3Actor:
    """Build an actor of class ``cls`` in the task's dtype and device, without gradients.

    It holds copies of ``body`` and ``head`` and the observation normaliser of ``venv_norm``, SB3's
    ``VecNormalize`` or None, frozen.
    """
    norm: nn.Module = nn.Identity()
    if venv_norm is not None and venv_norm.norm_obs:
        rms = venv_norm.obs_rms
        norm = RunningNorm(task.obs_dim, eps=float(venv_norm.epsilon), clip=float(venv_norm.clip_obs))
        with torch.no_grad():
            norm.mean.copy_(torch.as_tensor(rms.mean))
            norm.var.copy_(torch.as_tensor(rms.var))
            norm.count.fill_(float(rms.count))
    pol = cls(task.obs_dim, task.action_dim, norm, copy.deepcopy(body), copy.deepcopy(head))
    pol.eval()
    for p in pol.parameters():
        p.requires_grad_(False)
    return pol.to(dtype=task.model.dtype, device=task.model.device)


def make_env(task: Task, cfg):
    """Build the environment SB3 learns on for a baseline section ``cfg``.

    Returns (the environment SB3 learns on, its VecNormalize wrapper or None, the TaskVecEnv); ``cfg``
    gives ``num_envs``, ``seed``, ``bootstrap_time_limit``, ``normalize_obs``, ``normalize_reward``
    and ``gamma``.
    """
    from stable_baselines3.common.vec_env import VecNormalize

    from .gym_env import TaskVecEnv

    raw = TaskVecEnv(task, cfg.num_envs, seed=cfg.seed, time_limit_truncates=cfg.bootstrap_time_limit)
    if not (cfg.normalize_obs or cfg.normalize_reward):
        return raw, None, raw
    vn = VecNormalize(raw, norm_obs=cfg.normalize_obs, norm_reward=cfg.normalize_reward, gamma=cfg.gamma)
    return vn, vn, raw


def silence(model) -> None:
    """Return a logger with no outputs.

    Without one, every ``learn()`` makes an empty tempdir/SB3-<time> folder (the run's own CSV and
    TensorBoard logs are written by :func:`train_baseline`).
    """
    from stable_baselines3.common.logger import Logger

    model.set_logger(Logger(folder=None, output_formats=[]))


# ---------------------------------------------------------------------------- resume state
def array(x) -> torch.Tensor:
    """Return a numpy array (or a list) as a tensor of its own memory, for a resume state."""
    import numpy as np

    return torch.from_numpy(np.array(x, copy=True))


def _rms(r) -> Dict[str, Any]:
    return {"mean": array(r.mean), "var": array(r.var), "count": float(r.count)}


def learner_state(model, vn, raw) -> Dict[str, Any]:
    """Return what every SB3 learner carries from one ``learn`` call to the next.

    As tensors and plain values: the networks (``policy``; the optimisers are each algorithm's), the
    step counters, the last observation and episode starts, the normaliser's statistics and running
    returns, and the environments themselves.
    """
    state = {"policy": copy.deepcopy(model.policy.state_dict()),
             "num_timesteps": int(model.num_timesteps), "n_updates": int(model._n_updates),
             "episode_num": int(model._episode_num), "last_obs": array(model._last_obs),
             "last_episode_starts": array(model._last_episode_starts),
             "last_original_obs": None if model._last_original_obs is None else array(model._last_original_obs),
             "normalizer": None, "env": raw.get_state()}
    if vn is not None:
        state["normalizer"] = {"obs_rms": _rms(vn.obs_rms), "ret_rms": _rms(vn.ret_rms), "returns": array(vn.returns),
                               "old_obs": array(vn.old_obs), "old_reward": array(vn.old_reward)}
    return state


def set_learner_state(state: Dict[str, Any], model, vn, raw) -> None:
    """Put :func:`learner_state`'s ``state`` back into ``model``, ``vn`` and ``raw``."""
    model.policy.load_state_dict(state["policy"])
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


def config_values(cfg) -> Dict[str, Any]:
    """Return a section's values as a resume state records them (lists for tuples)."""
    return {k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(cfg).items()}


def read_state(out_dir, fmt: str, version: int, method: str) -> Dict[str, Any]:
    """Read the ``method`` run's resume state in ``out_dir`` (``checkpoints/latest/resume.pt``).

    As :func:`diffsim_ros.learning.apg.load_resume_state` reads the gradient trainer's; a
    :class:`~diffsim_ros.learning.run.ResumeError` naming what is wrong.
    """
    return read_resume_file(out_dir, fmt, version, (
        "iteration", "finished", "history", "next_eval", "best", "learner", "rng", f"{method}_config", "task"))


def check_state(state: Dict[str, Any], task: Task, method: str, cfg) -> None:
    """Raise a ResumeError unless ``state`` continues a ``method`` run of ``task`` with ``cfg``.

    The run must have iterations left; the error names what differs.
    """
    check_same_trainer(state, task, method, state[f"{method}_config"], config_values(cfg))
    if state["finished"]:
        raise ResumeError(f"{state.get('path', 'resume state')}: the run already finished (iteration "
                          f"{int(state['iteration'])}); nothing to resume")


def run_method(out_dir) -> Optional[str]:
    """Return the trainer of the run in ``out_dir``, or None where it has none or the file is unreadable.

    The trainer is ``training.method`` of checkpoints/latest/policy.json: "ppo", "sac", ...
    """
    import json

    for kind in ("latest", "latest.old"):
        try:
            with open(Path(out_dir) / "checkpoints" / kind / "policy.json") as f:
                method = json.load(f).get("training", {}).get("method")
        except (OSError, ValueError, AttributeError):
            continue
        if isinstance(method, str):
            return method
    return None


# ---------------------------------------------------------------------------- the loop
@dataclass
class Learner:
    """One SB3 algorithm as :func:`train_baseline` drives it."""

    method: str                                  # "ppo", "sac": policy.json's training.method, the section
    title: str                                   # the learning curve's title
    model: Any                                   # the SB3 algorithm
    vn: Any                                      # its VecNormalize, or None
    raw: Any                                     # the TaskVecEnv
    steps_per_iteration: int                     # environment steps of one ``learn`` call
    actor: Callable[[], nn.Module]               # the deterministic actor now (copied weights)
    state: Callable[[], Dict[str, Any]]          # the learner's resume state
    set_state: Callable[[Dict[str, Any]], None]
    resume_format: str
    resume_version: int


def train_baseline(task: Task, cfg, learner: Learner, out_dir: Optional[Path] = None, progress: bool = True,
                   callback: Optional[Callable[[Dict[str, float]], None]] = None,
                   resume: Optional[Dict[str, Any]] = None, export: Optional[Callable[..., Any]] = None,
                   run_info: Optional[Dict[str, Any]] = None) -> TrainResult:
    """Train with the SB3 ``learner`` until ``cfg.total_timesteps`` environment steps or the success threshold.

    The steps are whole iterations of ``learner.steps_per_iteration``; the threshold is the task's success
    threshold, with ``cfg.stop_at_success``. See :func:`diffsim_ros.learning.ppo.train_ppo` for the log, the
    checkpoints and ``resume``, ``export`` and ``run_info``. ``cfg``: the baseline's section
    (``total_timesteps``, ``eval_every_steps``, ``eval_envs``, ``stop_at_success``, ``checkpoint_every``,
    ``learning_rate``).
    """
    model, raw, step = learner.model, learner.raw, learner.steps_per_iteration
    iterations = max(1, math.ceil(cfg.total_timesteps / step))
    history: List[Dict[str, float]] = []
    solved_steps = solved_time = None
    next_eval = cfg.eval_every_steps
    best = None
    it = 0
    if resume is not None:
        check_state(resume, task, learner.method, cfg)
        learner.set_state(resume["learner"])
        history = [dict(row) for row in resume["history"]]
        it, next_eval, best = int(resume["iteration"]), int(resume["next_eval"]), resume["best"]
        solved_steps, solved_time = resume["solved_env_steps"], resume["solved_time"]
        set_rng_state(resume["rng"], raw.generator, task.model.device)
    bar = None
    if progress:
        from tqdm import tqdm
        bar = tqdm(total=iterations * step, initial=it * step, desc=f"{learner.method} {task.name}",
                   unit="step", leave=False)
    # wall_time continues the clock of the run resumed
    t_start = time.perf_counter() - (float(history[-1]["wall_time"]) if history else 0.0)
    policy = None
    log = checkpoints = None
    if out_dir is not None:
        out_dir = Path(out_dir)
        if resume is None:
            clear_run(out_dir)     # an earlier run's checkpoints and event files would mix with this one
        log = RunLog(out_dir, history)
        checkpoints = Checkpoints(out_dir, task, export or default_export(task, cfg, learner.method))
    pending_best = None

    def save(finished: bool) -> None:
        """Save checkpoints/best and checkpoints/latest with the resume state.

        checkpoints/best only when a better evaluation came since the last save; nothing the run draws
        from its random generators changes.
        """
        nonlocal pending_best
        fmt, version = learner.resume_format, learner.resume_version
        checkpoints.save_run(raw.generator, pending_best, learner.actor(), it, history, solved_steps, solved_time,
                             lambda rng: dict(run_state(fmt, version, task, it, finished, history, best, solved_steps,
                                                        solved_time, rng, run_info),
                                              next_eval=next_eval, learner=learner.state(),
                                              **{f"{learner.method}_config": config_values(cfg)}))
        pending_best = None

    try:
        while it < iterations:
            # Only a fresh run's first iteration resets the environments; a resumed one goes on mid-episode.
            model.learn(total_timesteps=step, reset_num_timesteps=(it == 0 and resume is None), progress_bar=False)
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
                policy = learner.actor()
                row.update(evaluation_columns(task, policy, cfg.eval_envs))
                if solved_steps is None and row["eval_success"] >= task.success_threshold:
                    solved_steps, solved_time = env_steps, row["wall_time"]
                if better(row, best):
                    best = {"iteration": it + 1, "eval_success": row["eval_success"], "loss": row["loss"]}
                    if checkpoints is not None:
                        pending_best = (policy, it + 1)
            history.append(row)
            it += 1
            done = last or (cfg.stop_at_success and solved_steps is not None)
            after_row(row, it, done, cfg.checkpoint_every, log, checkpoints, save, callback, bar, step)
            if done:
                break
    finally:
        if bar is not None:
            bar.close()
        if log is not None:
            log.close()
        raw.close()
    if policy is None:
        policy = learner.actor()
    if out_dir is not None:
        plot_history(history, Path(out_dir), title=f"{task.name}: {learner.title}")
    return TrainResult(policy, history, solved_steps, solved_time)
