"""A student policy on the robot's observation, taught by a teacher on another observation.

    student, history = distill(task, teacher, teacher_task, hidden=(128, 128))

The teacher (a trained checkpoint) observes what the simulator knows (``observation:
privileged``: base height, world pose and twist); the student observes what the robot's own
sensors give (``observation: robot``). Both drive the same robot with the same actions, so the
student can learn the teacher's actions from its own observations: DAgger (Ross, Gordon &
Bagnell 2011). Each iteration runs ``episodes`` fresh episodes of the task in which each
environment, at each step, executes the teacher's action with probability ``beta`` (1 in the
first iteration, halved every iteration after) and the student's otherwise, records the
student's observation with the teacher's action on the same state, adds them to the data set of
every iteration before, and fits the student to it by least squares. The student's own states
(its mistakes included) are thus labelled by the teacher, which plain imitation of the
teacher's episodes would never show it.

The result is a starting point: its gait is the teacher's. ``diffsim-ros train --init-from``
fine-tunes it by gradients through the simulator on the student's own task (its loss terms,
randomisation, latency and sensor noise).
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Sequence

import torch

from ..tasks.base import Task
from .policy import MLPPolicy


@dataclass
class DistillConfig:
    """Settings of the DAgger distillation.

    iterations: DAgger rounds; episodes: fresh episodes per round; updates: least-squares
    steps per round (Adam, ``learning_rate``, minibatches of ``batch`` samples); eval_episodes:
    the student alone on fresh episodes after every round; sensor_noise: [position, velocity]
    noise on the student's observation (as training.sensor_noise; none: []).
    """

    iterations: int = 6
    episodes: int = 64
    updates: int = 400
    batch: int = 4096
    learning_rate: float = 1e-3
    eval_episodes: int = 32
    sensor_noise: Sequence[float] = ()
    seed: int = 0


def _mixed_rollout(task: Task, teacher_task: Task, student: MLPPolicy, teacher: Callable, beta: float,
                   episodes: int, gen: torch.Generator, noise: Sequence[float]):
    """One round's data: (student observations, teacher actions), each (horizon x episodes, dim)."""
    from .apg import measured

    obs_s, act_t = [], []
    with torch.no_grad():
        ts = task.reset(episodes, gen)
        for _ in range(task.horizon):
            seen = measured(task, ts, tuple(noise), gen) if noise else ts
            o = task.observe(seen)
            want = torch.clamp(teacher(teacher_task.observe(ts).to(torch.float32)).to(o.dtype), -1.0, 1.0)
            obs_s.append(o)
            act_t.append(want)
            own = torch.clamp(student(o), -1.0, 1.0)
            pick = torch.rand((episodes, 1), generator=gen, dtype=torch.float64).to(o) < beta
            ts = task.step(ts, torch.where(pick, want, own))
    return torch.cat(obs_s), torch.cat(act_t)


def _evaluate(task: Task, policy: Callable, episodes: int) -> Dict[str, float]:
    """Evaluate the student alone on fresh episodes.

    Gives ``eval_success`` by the task's metric and, for a legged velocity command,
    ``eval_tracking``: the speed and posture parts of the strict metric without the gait rules
    (what a teacher with a gait the rules refuse can pass on).
    """
    with torch.no_grad():
        ts = task.reset(episodes, torch.Generator().manual_seed(12345))
        for _ in range(task.horizon):
            ts = task.step(ts, policy(task.observe(ts)))
        out = {"eval_success": float(task.success(ts).double().mean())}
        if getattr(task, "command_speed", None):
            parts = task.strict_parts(ts)
            out["eval_tracking"] = float((parts["speed_ok"] & parts["posture_ok"]).double().mean())
    return out


def distill(task: Task, teacher: Callable, teacher_task: Task, hidden: Sequence[int] = (128, 128),
            config: Optional[DistillConfig] = None, progress: Optional[Callable[[str], None]] = None):
    """Distil ``teacher`` into a student and return the student and the history of its rounds.

    The student is an :class:`MLPPolicy` on ``task``'s observation, normaliser inside; the
    history lists its rounds (``iteration``, ``beta``, ``samples``, ``fit_mse``, ``eval_success``,
    ``wall_time``). ``teacher``: observations of ``teacher_task`` -> actions in [-1, 1] (a loaded
    checkpoint's policy); ``teacher_task`` must drive the same robot as ``task`` with the same
    actions (it only observes: the episodes are ``task``'s, its horizon and reset included).
    """
    cfg = config or DistillConfig()
    if teacher_task.action_dim != task.action_dim:
        raise ValueError(f"distill: the teacher's task has {teacher_task.action_dim} actions, the student's "
                         f"{task.action_dim}")
    torch.manual_seed(cfg.seed)
    gen = torch.Generator().manual_seed(cfg.seed)
    dtype = task.model.dtype
    student = MLPPolicy(task.obs_dim, task.action_dim, hidden).to(dtype)
    opt = torch.optim.Adam(student.parameters(), lr=cfg.learning_rate)
    data_o: List[torch.Tensor] = []
    data_a: List[torch.Tensor] = []
    history: List[Dict[str, float]] = []
    t0 = time.perf_counter()
    for it in range(cfg.iterations):
        beta = 0.5 ** it
        o, a = _mixed_rollout(task, teacher_task, student, teacher, beta, cfg.episodes, gen, cfg.sensor_noise)
        data_o.append(o)
        data_a.append(a)
        student.norm.update(o)
        X, Y = torch.cat(data_o), torch.cat(data_a)
        # Least squares on the tanh's input: atanh of the teacher's action (clamped off +-1, where
        # the gradient of a squared error through the tanh would vanish).
        Yz = torch.atanh(Y.clamp(-0.995, 0.995))
        fit = math.nan
        for _ in range(cfg.updates):
            idx = torch.randint(0, X.shape[0], (min(cfg.batch, X.shape[0]),), generator=gen)
            z = student.head(student.body(student.norm(X[idx])))
            loss = ((z - Yz[idx]) ** 2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            fit = float(loss.detach())
        with torch.no_grad():
            mse = float(((student(X) - Y) ** 2).mean())
        row = {"iteration": it + 1, "beta": beta, "samples": int(X.shape[0]), "fit_loss": fit, "action_mse": mse,
               **_evaluate(task, student, cfg.eval_episodes), "wall_time": time.perf_counter() - t0}
        history.append(row)
        if progress is not None:
            tracked = f", tracking the command {row['eval_tracking']:.2f}" if "eval_tracking" in row else ""
            progress(f"distill {it + 1}/{cfg.iterations}: beta {beta:.3f}, {X.shape[0]} samples, action mse "
                     f"{mse:.4f}, student alone: success {row['eval_success']:.2f}{tracked} "
                     f"({row['wall_time']:.0f} s)")
    return student, history
