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
both trainers alike. The environment, the exported actor's frame, the training
loop and the resume state's common parts are :mod:`diffsim_ros.learning.baseline`'s,
shared with the SAC baseline (:mod:`diffsim_ros.learning.sac`).
"""
from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, Optional, Tuple

import torch

from ..physics import ConfigError
from ..schema import option, section
from ..tasks import Task
from .baseline import (BaselineConfig, Learner, SB3Actor, check_state, frozen_actor, learner_state, loop_option,
                       make_env, read_state, set_learner_state, silence, train_baseline)
from .run import TrainResult


@section("ppo")
@dataclass(frozen=True)
class PPOConfig(BaselineConfig):
    """Options of the PPO baseline (the ``ppo:`` section of a training file)."""

    total_timesteps: int = loop_option("total_timesteps", 2_000_000)
    num_envs: int = option(64, "parallel environments (the task batch)", low=1)
    n_steps: int = option(64, "control steps per environment per rollout; a rollout is num_envs * n_steps steps",
                          low=1)
    batch_size: int = option(1024, "minibatch size of the PPO update, in [2, num_envs * n_steps]", low=2)
    n_epochs: int = option(10, "passes over each rollout", low=1)
    learning_rate: float = option(3e-4, "Adam step size", above=0)
    gamma: float = loop_option("gamma", 0.99)
    gae_lambda: float = option(0.95, "GAE lambda", low=0, high=1)
    ent_coef: float = option(0.0, "entropy bonus")
    clip_range: float = option(0.2, "PPO ratio clip", above=0)
    max_grad_norm: float = option(0.5, "gradient-norm clip of the update", above=0)
    log_std_init: float = option(-0.5, """initial log standard deviation of the Gaussian policy; SB3's 0 (std 1)
        sends a third of the samples past the [-1, 1] action box even with the mean at its centre (more once the
        mean moves off it), where they are clipped and their exploration is lost; exp(-0.5) = 0.61 sends about
        10 %""")
    hidden: Tuple[int, ...] = option((64, 64), "hidden layer sizes of actor and critic (tanh)", low=1)
    normalize_obs: bool = loop_option("normalize_obs", True)
    normalize_reward: bool = option(True, "scale rewards by the running return deviation (VecNormalize)")
    bootstrap_time_limit: bool = loop_option("bootstrap_time_limit", True)
    eval_every_steps: int = loop_option("eval_every_steps", 50_000)
    eval_envs: int = loop_option("eval_envs", 64)
    stop_at_success: bool = loop_option("stop_at_success", True)
    checkpoint_every: int = option(1, """iterations between checkpoints of a run into a folder (checkpoints/latest
        with the resume state, checkpoints/best), and at the end: an iteration is a whole rollout and its update,
        so a checkpoint costs little beside it""", low=1)
    seed: int = loop_option("seed", 0)

    @property
    def rollout_steps(self) -> int:
        return self.num_envs * self.n_steps

    def check(self) -> None:
        if not self.batch_size <= self.rollout_steps:
            raise ConfigError(f"must be in [2, num_envs * n_steps = {self.rollout_steps}], got {self.batch_size}",
                              "batch_size")
        super().check()


class PPOPolicy(SB3Actor):
    """Raw observation -> action in [-1, 1].

    Frozen normaliser, SB3's actor MLP, the Gaussian mean, clipped. ``norm`` is a
    :class:`RunningNorm` (or identity) like ``MLPPolicy.norm``.
    """

    def squash(self, out: torch.Tensor) -> torch.Tensor:
        return torch.clamp(out, -1.0, 1.0)


def actor_from_sb3(model, venv_norm, task: Task) -> PPOPolicy:
    """Build a :class:`PPOPolicy` from an SB3 PPO ``model`` and its ``VecNormalize`` wrapper (or None).

    The weights are copied, in the task's dtype and on its device.
    """
    return frozen_actor(PPOPolicy, venv_norm, task, model.policy.mlp_extractor.policy_net, model.policy.action_net)


def make_model(task: Task, cfg: PPOConfig):
    """(SB3 PPO model, its VecNormalize wrapper or None, the TaskVecEnv).

    The networks live on the task's device (the simulator's).
    """
    from stable_baselines3 import PPO

    venv, vn, raw = make_env(task, cfg)
    model = PPO("MlpPolicy", venv, learning_rate=cfg.learning_rate, n_steps=cfg.n_steps,
                batch_size=cfg.batch_size, n_epochs=cfg.n_epochs, gamma=cfg.gamma, gae_lambda=cfg.gae_lambda,
                clip_range=cfg.clip_range, ent_coef=cfg.ent_coef, max_grad_norm=cfg.max_grad_norm,
                policy_kwargs=dict(net_arch=dict(pi=list(cfg.hidden), vf=list(cfg.hidden)),
                                   log_std_init=cfg.log_std_init),
                seed=cfg.seed, device=str(task.model.device), verbose=0)
    silence(model)
    return model, vn, raw


RESUME_FORMAT = "diffsim_ros.ppo_resume"   # checkpoints/latest/resume.pt of a PPO run
RESUME_FORMAT_VERSION = 1


def train_ppo(task: Task, cfg: PPOConfig = PPOConfig(), out_dir: Optional[Path] = None, progress: bool = True,
              callback: Optional[Callable[[Dict[str, float]], None]] = None, resume: Optional[Dict[str, Any]] = None,
              export: Optional[Callable[..., Any]] = None, run_info: Optional[Dict[str, Any]] = None) -> TrainResult:
    """Train ``task`` with PPO; history rows as :func:`diffsim_ros.learning.apg.train`.

    ``grad_norm`` is nan. ``out_dir``: ``training.csv`` with one row appended (flushed) per
    iteration, TensorBoard event files of the same numbers when ``tensorboard`` is importable
    (:class:`~diffsim_ros.learning.run.RunLog`), ``checkpoints/latest/`` (with the resume state)
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
    learner = Learner("ppo", "PPO (Stable-Baselines3)", model, vn, raw, cfg.rollout_steps,
                      actor=lambda: actor_from_sb3(model, vn, task), state=lambda: _learner_state(model, vn, raw),
                      set_state=lambda state: _set_learner_state(state, model, vn, raw),
                      resume_format=RESUME_FORMAT, resume_version=RESUME_FORMAT_VERSION)
    return train_baseline(task, cfg, learner, out_dir, progress, callback, resume, export, run_info)


def _learner_state(model, vn, raw) -> Dict[str, Any]:
    """:func:`~diffsim_ros.learning.baseline.learner_state` and PPO's optimiser."""
    return dict(learner_state(model, vn, raw), optimizer=copy.deepcopy(model.policy.optimizer.state_dict()))


def _set_learner_state(state: Dict[str, Any], model, vn, raw) -> None:
    set_learner_state(state, model, vn, raw)
    model.policy.optimizer.load_state_dict(state["optimizer"])


def load_resume_state(out_dir) -> Dict[str, Any]:
    """Read the PPO run's state in ``out_dir`` (``checkpoints/latest/resume.pt``).

    As :func:`diffsim_ros.learning.apg.load_resume_state` reads the gradient trainer's; a
    :class:`~diffsim_ros.learning.run.ResumeError` naming what is wrong.
    """
    return read_state(out_dir, RESUME_FORMAT, RESUME_FORMAT_VERSION, "ppo")


def check_resume_state(state: Dict[str, Any], task: Task, cfg: PPOConfig) -> None:
    """Raise a ResumeError unless ``state`` continues a PPO run of ``task`` with ``cfg``.

    The run must have iterations left; the error names what differs.
    """
    check_state(state, task, "ppo", cfg)
