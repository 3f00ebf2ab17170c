"""SAC baseline (Stable-Baselines3's Soft Actor-Critic) on the same tasks and the same simulator.

The off-policy peer of :mod:`diffsim_ros.learning.ppo`, on the same environment
(:class:`~diffsim_ros.learning.gym_env.TaskVecEnv`: the task batch stepped without gradients,
reward = -step loss), the same evaluation (the task's own success metric on fresh episodes of the
nominal task, every ``eval_every_steps`` environment steps), the same log, checkpoints and resume
(:mod:`diffsim_ros.learning.baseline`, shared with PPO). Every ``VecEnv`` step puts ``num_envs``
transitions into the replay buffer; every ``train_freq`` steps SAC makes ``gradient_steps``
updates (-1: one per transition collected, SB3's single-environment ratio). Observations are
normalised by SB3's ``VecNormalize`` by default (the buffer keeps the raw ones and normalises a
batch when it samples it, with the statistics of the moment); rewards are not, by default: the
entropy coefficient adapts to their scale.

The policy returned (:class:`SACPolicy`) maps *raw* task observations to actions in [-1, 1]: the
observation normaliser frozen at its final statistics, SB3's actor network and the deterministic
action, tanh of the Gaussian mean (the task's action box is SB3's [-1, 1], so no rescaling), what
SB3's ``predict(obs, deterministic=True)`` returns.

A resume state holds the replay buffer (the transitions stored so far, up to ``buffer_size``:
observation, next observation, action, reward, done and time-out flags), so checkpoints are
sparser than PPO's by default (``checkpoint_every``).
"""
from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, Optional, Tuple

import torch

from ..physics import ConfigError
from ..schema import option, section
from ..tasks import Task
from .baseline import (BaselineConfig, Learner, SB3Actor, array, frozen_actor, learner_state, loop_option, make_env,
                       read_state, set_learner_state, silence, train_baseline)
from .run import TrainResult


@section("sac")
@dataclass(frozen=True)
class SACConfig(BaselineConfig):
    """Options of the SAC baseline (the ``sac:`` section of a training file)."""

    total_timesteps: int = loop_option("total_timesteps", 1_000_000)
    num_envs: int = option(16, """parallel environments (the task batch); each step of them adds num_envs
        transitions to the replay buffer""", low=1)
    buffer_size: int = option(1_000_000, """replay buffer capacity, transitions (summed over the environments;
        the oldest are overwritten)""", low=1)
    learning_starts: int = option(10_000, """environment steps of uniformly random actions before the first
        update (rl-zoo's 10000)""", low=0)
    batch_size: int = option(256, "minibatch size of an update, transitions drawn from the replay buffer", low=1)
    learning_rate: float = option(3e-4, "Adam step size of actor, critics and entropy coefficient", above=0)
    tau: float = option(0.005, "soft (Polyak) update coefficient of the target critics", above=0, high=1)
    gamma: float = loop_option("gamma", 0.99)
    train_freq: int = option(1, "control steps per environment between updates", low=1)
    gradient_steps: int = option(-1, """gradient steps per update; -1: as many as transitions collected since the
        last (num_envs * train_freq), one update per transition as SB3 does with one environment""", low=-1)
    ent_coef: float = option(1.0, """entropy coefficient (temperature): its initial value when learn_ent_coef
        (SB3's 'auto' starts at 1), else its fixed value""", low=0)
    learn_ent_coef: bool = option(True, """tune the entropy coefficient towards the target entropy -action_dim
        (SB3's ent_coef 'auto')""")
    hidden: Tuple[int, ...] = option((256, 256), "hidden layer sizes of actor and both critics (ReLU, SB3's)",
                                     low=1)
    normalize_obs: bool = loop_option("normalize_obs", True)
    normalize_reward: bool = option(False, """scale rewards by the running return deviation (VecNormalize); off,
        as usual for SAC, whose learned entropy coefficient adapts to the reward scale""")
    bootstrap_time_limit: bool = loop_option("bootstrap_time_limit", True)
    eval_every_steps: int = loop_option("eval_every_steps", 50_000)
    eval_envs: int = loop_option("eval_envs", 64)
    stop_at_success: bool = loop_option("stop_at_success", True)
    checkpoint_every: int = option(25, """iterations between checkpoints of a run into a folder
        (checkpoints/latest with the resume state, checkpoints/best), and at the end: an iteration is one
        episode of every environment; the resume state holds the replay buffer, about buffer_size * (2 *
        obs_dim + action_dim + 3) * 4 bytes when full""", low=1)
    seed: int = loop_option("seed", 0)

    def check(self) -> None:
        if self.gradient_steps == 0:
            raise ConfigError("must be -1 (one per transition collected) or at least 1, got 0", "gradient_steps")
        if self.learn_ent_coef and self.ent_coef <= 0:
            raise ConfigError(f"must be > 0 when learn_ent_coef is true (its initial value), got {self.ent_coef}",
                              "ent_coef")
        super().check()

    def steps_per_iteration(self, task: Task) -> int:
        """Environment steps of one iteration (one ``learn`` call, one row of the log).

        One episode of every environment, rounded up to whole ``train_freq`` periods.
        """
        return self.num_envs * self.train_freq * math.ceil(task.horizon / self.train_freq)


class SACPolicy(SB3Actor):
    """Raw observation -> action in [-1, 1].

    Frozen normaliser, SB3's actor MLP (``latent_pi``), the Gaussian mean (``mu``) squashed by
    tanh, SB3's deterministic action.
    """

    def squash(self, out: torch.Tensor) -> torch.Tensor:
        return torch.tanh(out)


def actor_from_sb3(model, venv_norm, task: Task) -> SACPolicy:
    """Build a :class:`SACPolicy` from an SB3 SAC ``model`` and its ``VecNormalize`` wrapper (or None).

    The weights are copied, in the task's dtype and on its device.
    """
    return frozen_actor(SACPolicy, venv_norm, task, model.actor.latent_pi, model.actor.mu)


def make_model(task: Task, cfg: SACConfig):
    """(SB3 SAC model, its VecNormalize wrapper or None, the TaskVecEnv).

    The networks live on the task's device (the simulator's).
    """
    from stable_baselines3 import SAC

    venv, vn, raw = make_env(task, cfg)
    ent_coef = f"auto_{cfg.ent_coef!r}" if cfg.learn_ent_coef else cfg.ent_coef
    model = SAC("MlpPolicy", venv, learning_rate=cfg.learning_rate, buffer_size=cfg.buffer_size,
                learning_starts=cfg.learning_starts, batch_size=cfg.batch_size, tau=cfg.tau, gamma=cfg.gamma,
                train_freq=cfg.train_freq, gradient_steps=cfg.gradient_steps, ent_coef=ent_coef,
                policy_kwargs=dict(net_arch=list(cfg.hidden)), seed=cfg.seed, device=str(task.model.device),
                verbose=0)
    silence(model)
    return model, vn, raw


RESUME_FORMAT = "diffsim_ros.sac_resume"   # checkpoints/latest/resume.pt of a SAC run
RESUME_FORMAT_VERSION = 1
_BUFFER = ("observations", "next_observations", "actions", "rewards", "dones", "timeouts")


def train_sac(task: Task, cfg: SACConfig = SACConfig(), out_dir: Optional[Path] = None, progress: bool = True,
              callback: Optional[Callable[[Dict[str, float]], None]] = None, resume: Optional[Dict[str, Any]] = None,
              export: Optional[Callable[..., Any]] = None, run_info: Optional[Dict[str, Any]] = None) -> TrainResult:
    """Train ``task`` with SAC: the contract of :func:`diffsim_ros.learning.ppo.train_ppo`.

    That is history rows, ``out_dir``'s log and checkpoints, ``callback``, ``export``,
    ``run_info``; ``resume``: the state :func:`load_resume_state` read, which brings back SB3's
    networks, their three optimisers and the entropy coefficient, the replay buffer, the
    environments mid-episode, the normaliser's statistics and every random generator, the
    warm-up's uniform draws included.

    One iteration is one episode of every environment (:meth:`SACConfig.steps_per_iteration`
    environment steps) with the updates SAC makes on the way; ``env_steps`` counts every
    environment step taken, the random ones before ``learning_starts`` too.
    """
    torch.manual_seed(cfg.seed)
    model, vn, raw = make_model(task, cfg)
    learner = Learner("sac", "SAC (Stable-Baselines3)", model, vn, raw, cfg.steps_per_iteration(task),
                      actor=lambda: actor_from_sb3(model, vn, task), state=lambda: _learner_state(model, vn, raw),
                      set_state=lambda state: _set_learner_state(state, model, vn, raw),
                      resume_format=RESUME_FORMAT, resume_version=RESUME_FORMAT_VERSION)
    return train_baseline(task, cfg, learner, out_dir, progress, callback, resume, export, run_info)


def _learner_state(model, vn, raw) -> Dict[str, Any]:
    """:func:`~diffsim_ros.learning.baseline.learner_state` and SAC's own.

    SAC's own: the actor's, critics' and entropy coefficient's optimisers, the coefficient, the
    replay buffer's transitions so far and the generator of the warm-up's uniform actions.
    """
    rb = model.replay_buffer
    n = rb.buffer_size if rb.full else rb.pos
    ent = model.ent_coef_optimizer
    return dict(learner_state(model, vn, raw),
                actor_optimizer=copy.deepcopy(model.actor.optimizer.state_dict()),
                critic_optimizer=copy.deepcopy(model.critic.optimizer.state_dict()),
                ent_coef_optimizer=None if ent is None else copy.deepcopy(ent.state_dict()),
                log_ent_coef=None if model.log_ent_coef is None else model.log_ent_coef.detach().cpu().clone(),
                replay_buffer={"pos": int(rb.pos), "full": bool(rb.full),
                               **{k: array(getattr(rb, k)[:n]) for k in _BUFFER if hasattr(rb, k)}},
                action_space_rng=copy.deepcopy(model.action_space.np_random.bit_generator.state))


def _set_learner_state(state: Dict[str, Any], model, vn, raw) -> None:
    set_learner_state(state, model, vn, raw)
    model.actor.optimizer.load_state_dict(state["actor_optimizer"])
    model.critic.optimizer.load_state_dict(state["critic_optimizer"])
    if model.ent_coef_optimizer is not None:
        with torch.no_grad():
            model.log_ent_coef.copy_(state["log_ent_coef"])     # the tensor the optimiser steps
        model.ent_coef_optimizer.load_state_dict(state["ent_coef_optimizer"])
    rb, buf = model.replay_buffer, state["replay_buffer"]
    for k in _BUFFER:
        if hasattr(rb, k) and k in buf:
            getattr(rb, k)[:len(buf[k])] = buf[k].numpy()
    rb.pos, rb.full = int(buf["pos"]), bool(buf["full"])
    model.action_space.np_random.bit_generator.state = state["action_space_rng"]


def load_resume_state(out_dir) -> Dict[str, Any]:
    """Read the SAC run's state in ``out_dir`` (``checkpoints/latest/resume.pt``).

    As :func:`diffsim_ros.learning.apg.load_resume_state` reads the gradient trainer's; a
    :class:`~diffsim_ros.learning.run.ResumeError` naming what is wrong.
    """
    return read_state(out_dir, RESUME_FORMAT, RESUME_FORMAT_VERSION, "sac")
