"""A Stable-Baselines3 ``VecEnv`` over a :class:`~diffsim_ros.tasks.Task`.

The whole task batch is one vectorised environment (``num_envs`` = batch): one
``step`` advances every episode through the same differentiable simulator the
gradient trainer uses, here without gradients (``torch.no_grad``).

- observation: ``task.observe`` (float32 ``Box``, unbounded);
- action: ``Box(-1, 1, (task.action_dim,))``, the task's normalised command box
  (actions are clamped to it, as ``Task.step`` does);
- reward: ``-task.step_loss`` of the state reached, the same objective the
  gradient trainer minimises;
- episodes: ``task.horizon`` control steps, all episodes of the batch in
  lockstep, then every environment resets at once (auto-reset). The end of an
  episode is a time limit, not a terminal state: ``info['TimeLimit.truncated']``
  is true (SB3 then bootstraps the value of ``info['terminal_observation']``)
  unless ``time_limit_truncates=False`` (the episode's end is then terminal);
- ``info['is_success']`` at every episode end, from ``task.success`` on the
  final state (the metric the trainers are judged by), and ``info['episode']``
  (return ``r``, length ``l``, time ``t``) as SB3's monitor writes it.

Running statistics for the trainer's log (mean step loss, success of finished
episodes) are collected by :meth:`TaskVecEnv.pop_stats`.
"""
from __future__ import annotations

import time
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch
from gymnasium import spaces
from stable_baselines3.common.vec_env import VecEnv

from ..tasks import Task, TaskState


class TaskVecEnv(VecEnv):
    """``num_envs`` episodes of ``task`` stepped together (see the module doc)."""

    render_mode = None

    def __init__(self, task: Task, num_envs: int, seed: Optional[int] = None, time_limit_truncates: bool = True):
        if num_envs < 1:
            raise ValueError(f"TaskVecEnv: num_envs must be >= 1, got {num_envs}")
        self.task = task
        self.time_limit_truncates = time_limit_truncates
        self.generator = torch.Generator()
        if seed is not None:
            self.generator.manual_seed(int(seed))
        obs_space = spaces.Box(-np.inf, np.inf, shape=(task.obs_dim,), dtype=np.float32)
        act_space = spaces.Box(-1.0, 1.0, shape=(task.action_dim,), dtype=np.float32)
        super().__init__(num_envs, obs_space, act_space)
        self.ts: Optional[TaskState] = None
        self._actions: Optional[np.ndarray] = None
        self._returns = np.zeros(num_envs, dtype=np.float64)
        self._t0 = time.perf_counter()
        self.total_steps = 0                   # environment steps taken (summed over the batch)
        self._loss_sum = 0.0
        self._loss_count = 0
        self._successes: List[float] = []

    # ---------------------------------------------------------------- helpers
    def _obs(self) -> np.ndarray:
        return self.task.observe(self.ts).detach().to("cpu", torch.float32).numpy()

    def _reset_batch(self) -> None:
        self.ts = self.task.reset(self.num_envs, self.generator)
        self._returns[:] = 0.0

    def pop_stats(self) -> Tuple[float, float]:
        """(mean step loss, success rate of the episodes finished) since the last call; nan if none."""
        loss = self._loss_sum / self._loss_count if self._loss_count else float("nan")
        succ = float(np.mean(self._successes)) if self._successes else float("nan")
        self._loss_sum, self._loss_count, self._successes = 0.0, 0, []
        return loss, succ

    def get_state(self) -> Dict[str, Any]:
        """Return what the batch carries between steps.

        That is the episodes' task state, the reset generator, the running returns and counters, as
        tensors and plain values (``torch.load(..., weights_only=True)`` reads them back);
        :meth:`set_state` restores it.
        """
        ts = None
        if self.ts is not None:
            sim = self.ts.sim
            ts = {"sim": {k: getattr(sim, k) for k in ("q", "v", "actuator", "delay", "t")},
                  "target": self.ts.target, "step": int(self.ts.step), "extra": dict(self.ts.extra)}
        return {"ts": ts, "generator": self.generator.get_state(), "returns": torch.from_numpy(self._returns.copy()),
                "total_steps": int(self.total_steps), "loss_sum": float(self._loss_sum),
                "loss_count": int(self._loss_count), "successes": list(self._successes)}

    def set_state(self, state: Dict[str, Any]) -> None:
        from ..physics import State

        m = self.task.model
        to = lambda x: None if x is None else x.to(m.device)  # noqa: E731
        ts = state["ts"]
        self.ts = None if ts is None else TaskState(State(**{k: to(v) for k, v in ts["sim"].items()}),
                                                    to(ts["target"]), int(ts["step"]),
                                                    {k: to(v) for k, v in ts["extra"].items()})
        self.generator.set_state(state["generator"])
        self._returns = state["returns"].numpy().astype(np.float64).copy()
        self.total_steps = int(state["total_steps"])
        self._loss_sum, self._loss_count = float(state["loss_sum"]), int(state["loss_count"])
        self._successes = [float(x) for x in state["successes"]]

    # ---------------------------------------------------------------- VecEnv API
    def seed(self, seed: Optional[int] = None) -> Sequence[None]:
        if seed is not None:
            self.generator.manual_seed(int(seed))
        return [None] * self.num_envs

    def reset(self) -> np.ndarray:
        seeds = [s for s in self._seeds if s is not None]
        if seeds:
            self.generator.manual_seed(int(seeds[0]))
        self._reset_seeds()
        self._reset_options()
        with torch.no_grad():
            self._reset_batch()
            return self._obs()

    def step_async(self, actions: np.ndarray) -> None:
        self._actions = np.asarray(actions)

    def step_wait(self):
        if self.ts is None:
            raise RuntimeError("TaskVecEnv: step() before reset()")
        task, m = self.task, self.task.model
        act = torch.as_tensor(self._actions, dtype=m.dtype, device=m.device)
        act = act.reshape(self.num_envs, task.action_dim).clamp(-1.0, 1.0)
        with torch.no_grad():
            self.ts = task.step(self.ts, act)
            loss = task.step_loss(self.ts, act)
            rewards = (-loss).to("cpu", torch.float64).numpy()
            self._loss_sum += float(loss.sum())
            self._loss_count += self.num_envs
            self._returns += rewards
            self.total_steps += self.num_envs
            infos: List[Dict[str, Any]] = [{} for _ in range(self.num_envs)]
            done = self.ts.step >= task.horizon
            if done:
                success = task.success(self.ts).to("cpu").numpy().astype(bool)
                final_obs = self._obs()
                elapsed = round(time.perf_counter() - self._t0, 6)
                for i, info in enumerate(infos):
                    info["is_success"] = bool(success[i])
                    info["TimeLimit.truncated"] = self.time_limit_truncates
                    info["terminal_observation"] = final_obs[i]
                    info["episode"] = {"r": float(self._returns[i]), "l": int(task.horizon), "t": elapsed}
                self._successes.extend(success.astype(np.float64).tolist())
                self._reset_batch()
            obs = self._obs()
        dones = np.full(self.num_envs, done, dtype=bool)
        return obs, rewards.astype(np.float32), dones, infos

    def close(self) -> None:
        self.ts = None

    # The batch is one object: attributes and methods are the same for every index.
    def _n(self, indices) -> int:
        return len(self._get_indices(indices))

    def get_attr(self, attr_name: str, indices=None) -> List[Any]:
        return [getattr(self, attr_name)] * self._n(indices)

    def set_attr(self, attr_name: str, value: Any, indices=None) -> None:
        setattr(self, attr_name, value)

    def env_method(self, method_name: str, *method_args, indices=None, **method_kwargs) -> List[Any]:
        out = getattr(self, method_name)(*method_args, **method_kwargs)
        return [out] * self._n(indices)

    def env_is_wrapped(self, wrapper_class, indices=None) -> List[bool]:
        return [False] * self._n(indices)
