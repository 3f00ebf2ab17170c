"""Policy training by back-propagation through the differentiable simulator.

Batched rollouts; the task loss of every step flows back through the
integrator, the contact model and the policy (analytic policy gradients).
Back-propagation through time is truncated into windows of ``window`` steps
(the policy is updated after each window and the state is detached), with
gradient-norm clipping, observation normalisation and, optionally, a
short-horizon critic that bootstraps the loss-to-go at the end of each window
(as in SHAC). Domain randomisation of mass, drag and actuator lag draws new
values every iteration.
"""
from __future__ import annotations

import copy
import csv
import math
import time
import warnings
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Callable, Dict, List, Optional, Tuple

import torch

from ..physics import ConfigError, SimulationError, Simulator
from ..physics.parameters import apply_values
from ..tasks import Task
from .policy import MLPPolicy, ValueNet


LR_SCHEDULES = ("constant", "cosine")


@dataclass(frozen=True)
class TrainConfig:
    """Options of the gradient trainer (defaults in brackets).

    iterations: policy-update rounds; each runs ``num_envs`` full episodes [100]
    num_envs: parallel environments [64]
    window: truncated-BPTT length, control steps [32]
    learning_rate: Adam step size [3e-3]
    lr_schedule: "constant", or "cosine": the step size falls from learning_rate to
        final_learning_rate along half a cosine over ``iterations`` (a large step finds
        the basin quickly; a small one then settles the precision the success metric
        asks for, where a constant step keeps jittering around it) [constant]
    final_learning_rate: last step size of the cosine schedule [1e-4]
    grad_clip: maximum gradient norm [1.0]
    hidden: hidden layer sizes of the policy [(64, 64)]
    normalize_obs: running observation normalisation [True]
    critic: bootstrap each window's loss-to-go with a learned value (SHAC); the value
        sees the normalised observation and the fraction of the episode elapsed, since
        a finite episode's loss-to-go depends on the time left [False]
    gamma: discount of the critic's loss-to-go [0.99]
    critic_learning_rate, critic_updates: critic fitting per window [1e-3, 8]
    randomize_mass: (low, high) scale on every link mass, drawn per iteration, or () [()]
    randomize_drag: (low, high) scale on rotor drag coefficients [()]
    randomize_actuator_lag: (low, high) actuator lag, s [()]
    eval_every: iterations between evaluations on fresh episodes (no gradient) [5]
    eval_envs: episodes per evaluation [64]
    stop_at_success: stop once the evaluation reaches the task's success threshold [True]
    seed: random seed [0]
    max_divergences: iterations whose simulation diverged (non-finite state or gradient) that
        are dropped and retried from fresh episodes, the policy and optimiser put back to the
        iteration's start, before training gives up [10]
    """
    iterations: int = 100
    num_envs: int = 64
    window: int = 32
    learning_rate: float = 3e-3
    lr_schedule: str = "constant"
    final_learning_rate: float = 1e-4
    grad_clip: float = 1.0
    hidden: Tuple[int, ...] = (64, 64)
    normalize_obs: bool = True
    critic: bool = False
    gamma: float = 0.99
    critic_learning_rate: float = 1e-3
    critic_updates: int = 8
    randomize_mass: Tuple[float, ...] = ()
    randomize_drag: Tuple[float, ...] = ()
    randomize_actuator_lag: Tuple[float, ...] = ()
    eval_every: int = 5
    eval_envs: int = 64
    stop_at_success: bool = True
    seed: int = 0
    max_divergences: int = 10

    @classmethod
    def from_dict(cls, d: dict, where: str = "training") -> "TrainConfig":
        if not isinstance(d, dict):
            raise ConfigError(f"'{where}' must be a mapping")
        known = {f.name: f for f in fields(cls)}
        kw = {}
        for k, v in d.items():
            if k not in known:
                raise ConfigError(f"unknown key '{where}.{k}' (known: {', '.join(sorted(known))})")
            ref = getattr(cls(), k)
            if isinstance(ref, tuple):
                if not isinstance(v, (list, tuple)):
                    raise ConfigError(f"'{where}.{k}' must be a list, got {v!r}")
                v = tuple(type(ref[0])(x) if ref else float(x) for x in v)
            elif isinstance(ref, bool):
                if not isinstance(v, bool):
                    raise ConfigError(f"'{where}.{k}' must be true or false, got {v!r}")
            elif isinstance(ref, str):
                if not isinstance(v, str):
                    raise ConfigError(f"'{where}.{k}' must be a string, got {v!r}")
            elif isinstance(ref, (int, float)):
                if isinstance(v, bool) or not isinstance(v, (int, float)):
                    raise ConfigError(f"'{where}.{k}' must be a number, got {v!r}")
                v = type(ref)(v)
            kw[k] = v
        for k in ("randomize_mass", "randomize_drag", "randomize_actuator_lag"):
            r = kw.get(k, ())
            if r and (len(r) != 2 or not r[0] <= r[1]):
                raise ConfigError(f"'{where}.{k}' must be [low, high] with low <= high, got {list(r)}")
        if kw.get("lr_schedule", "constant") not in LR_SCHEDULES:
            raise ConfigError(f"'{where}.lr_schedule' must be one of {', '.join(LR_SCHEDULES)}, "
                              f"got {kw['lr_schedule']!r}")
        for k in ("learning_rate", "final_learning_rate"):
            if k in kw and not kw[k] > 0:
                raise ConfigError(f"'{where}.{k}' must be > 0, got {kw[k]}")
        return cls(**kw)

    def learning_rate_at(self, iteration: int) -> float:
        """Adam step size of iteration ``iteration`` (0-based) under ``lr_schedule``."""
        if self.lr_schedule == "constant" or self.iterations <= 1:
            return self.learning_rate
        frac = min(iteration / (self.iterations - 1), 1.0)
        return self.final_learning_rate + 0.5 * (self.learning_rate - self.final_learning_rate) * (
            1.0 + math.cos(math.pi * frac))


@dataclass
class TrainResult:
    policy: MLPPolicy
    history: List[Dict[str, float]]
    solved_env_steps: Optional[int]      # training env steps when success was first reached
    solved_time: Optional[float]         # wall-clock seconds then


def _randomized_sim(nominal: Simulator, cfg: TrainConfig, gen: torch.Generator) -> Simulator:
    """The nominal simulator with randomised physics, through the parameter registry
    (:mod:`diffsim_ros.physics.parameters`, ``System.replace``): ``mass_scale`` (every link
    mass and inertia; the controller's model, which gravity compensation and the rate loop
    use, stays nominal, as on a robot), the actuator or motor time constant
    (``motor_time_constant`` for rotors, ``actuator_lag`` for joints), ``drag_scale``."""
    sys = nominal.system
    dt, dev = sys.model.dtype, sys.model.device

    def draw(r):
        return torch.tensor(float(r[0] + (r[1] - r[0]) * torch.rand((), generator=gen)), dtype=dt, device=dev)
    values = {}
    if cfg.randomize_mass:
        values["mass_scale"] = draw(cfg.randomize_mass)
    if cfg.randomize_actuator_lag:
        values["motor_time_constant" if sys.rotors is not None else "actuator_lag"] = draw(cfg.randomize_actuator_lag)
    if cfg.randomize_drag and sys.rotors is not None:
        values["drag_scale"] = draw(cfg.randomize_drag)
    return Simulator(apply_values(sys, values))


def evaluate(task: Task, policy: Callable, episodes: int, seed: int = 12345) -> float:
    """Success rate over fresh episodes (no gradients, no randomisation)."""
    gen = torch.Generator().manual_seed(seed)
    return task.rollout_success(policy, episodes, gen)


def train(task: Task, cfg: TrainConfig, out_dir: Optional[Path] = None, progress: bool = True,
          callback: Optional[Callable[[Dict[str, float]], None]] = None) -> TrainResult:
    """Train a policy for ``task``; write ``training.csv`` and ``learning_curve.png`` to ``out_dir``."""
    torch.manual_seed(cfg.seed)
    gen = torch.Generator().manual_seed(cfg.seed)
    dtype, device = task.model.dtype, task.model.device
    policy = MLPPolicy(task.obs_dim, task.action_dim, cfg.hidden, normalize=cfg.normalize_obs).to(dtype=dtype,
                                                                                               device=device)
    opt = torch.optim.Adam(policy.parameters(), lr=cfg.learning_rate)
    critic = critic_opt = None
    if cfg.critic:
        critic = ValueNet(task.obs_dim + 1, cfg.hidden).to(dtype=dtype, device=device)
        critic_opt = torch.optim.Adam(critic.parameters(), lr=cfg.critic_learning_rate)
    nominal_sim = task.sim
    history: List[Dict[str, float]] = []
    env_steps = 0
    solved_steps = solved_time = None
    t_start = time.perf_counter()
    bar = None
    if progress:
        from tqdm import tqdm
        bar = tqdm(total=cfg.iterations, desc=f"train {task.name}", unit="it", leave=False)
    diverged = 0
    try:
        it = 0
        while it < cfg.iterations:
            if cfg.randomize_mass or cfg.randomize_drag or cfg.randomize_actuator_lag:
                task.sim = _randomized_sim(nominal_sim, cfg, gen)
            lr = cfg.learning_rate_at(it)
            for group in opt.param_groups:
                group["lr"] = lr
            # A contact-rich episode can diverge in one environment: the iteration is then dropped
            # (policy, optimiser and normaliser back to its start) and retried on fresh episodes.
            snapshot = (copy.deepcopy(policy.state_dict()), copy.deepcopy(opt.state_dict()),
                        copy.deepcopy(critic.state_dict()) if critic is not None else None,
                        copy.deepcopy(critic_opt.state_dict()) if critic is not None else None)
            try:
                ts, total_loss, grad_norm, env_steps = _iteration(task, cfg, policy, opt, critic, critic_opt, gen,
                                                                  env_steps)
            except SimulationError as exc:
                diverged += 1
                policy.load_state_dict(snapshot[0])
                opt.load_state_dict(snapshot[1])
                if critic is not None:
                    critic.load_state_dict(snapshot[2])
                    critic_opt.load_state_dict(snapshot[3])
                task.sim = nominal_sim
                if diverged > cfg.max_divergences:
                    raise SimulationError(f"{exc} (the simulation diverged in {diverged} iterations, more than "
                                          f"training.max_divergences = {cfg.max_divergences})") from None
                warnings.warn(f"iteration {it + 1}: {exc}; dropped and retried on fresh episodes "
                              f"({diverged} of at most {cfg.max_divergences})", RuntimeWarning)
                continue
            train_success = float(task.success(ts).to(torch.float64).mean())
            task.sim = nominal_sim
            row = {"iteration": it + 1, "env_steps": env_steps, "wall_time": time.perf_counter() - t_start,
                   "loss": total_loss / task.horizon, "grad_norm": grad_norm, "train_success": train_success,
                   "eval_success": float("nan"), "diverged": diverged}
            if (it + 1) % cfg.eval_every == 0 or it + 1 == cfg.iterations:
                row["eval_success"] = evaluate(task, policy, cfg.eval_envs)
                if solved_steps is None and row["eval_success"] >= task.success_threshold:
                    solved_steps, solved_time = env_steps, row["wall_time"]
            history.append(row)
            it += 1
            if callback is not None:
                callback(row)
            if bar is not None:
                bar.set_postfix(loss=f"{row['loss']:.4f}", success=f"{train_success:.2f}")
                bar.update(1)
            if cfg.stop_at_success and solved_steps is not None:
                break
    finally:
        task.sim = nominal_sim
        if bar is not None:
            bar.close()
    if out_dir is not None:
        write_history(history, Path(out_dir), title=f"{task.name}: gradient through the simulator")
        if getattr(task, "feet", None) and len(task.feet) == 4:
            # Legged: the footfall diagram and the gait the policy uses (tasks/gait.py).
            from ..tasks.gait import write_gait_report

            write_gait_report(task, policy, Path(out_dir))
    return TrainResult(policy, history, solved_steps, solved_time)


def _iteration(task, cfg, policy, opt, critic, critic_opt, gen, env_steps):
    """One training iteration over ``cfg.num_envs`` fresh episodes, truncated back-propagation
    every ``cfg.window`` steps. A non-finite gradient is a SimulationError (as a non-finite
    state is): the update it would make is not taken."""
    ts = task.reset(cfg.num_envs, gen)
    total_loss = 0.0
    grad_norm = 0.0
    while ts.step < task.horizon:
        k_end = min(cfg.window, task.horizon - ts.step)
        loss = 0.0
        obs_list, loss_list = [], []
        for k in range(k_end):
            obs = task.observe(ts)
            if cfg.normalize_obs:
                policy.norm.update(obs)
            action = policy(obs)
            ts = task.step(ts, action)
            step_loss = task.step_loss(ts, action)
            loss = loss + (cfg.gamma ** k if critic is not None else 1.0) * step_loss
            if critic is not None:
                obs_list.append((obs.detach(), ts.step - 1))
                loss_list.append(step_loss.detach())
        env_steps += cfg.num_envs * k_end
        total_loss += float(loss.detach().mean())
        if critic is not None and ts.step < task.horizon:
            loss = loss + (cfg.gamma ** k_end) * critic(_critic_input(policy, cfg, task, task.observe(ts), ts.step))
        objective = loss.mean() / task.horizon
        opt.zero_grad()
        objective.backward()
        grad_norm = float(torch.nn.utils.clip_grad_norm_(policy.parameters(), cfg.grad_clip))
        if not math.isfinite(grad_norm):
            opt.zero_grad()
            raise SimulationError(f"non-finite policy gradient at step {ts.step} (loss {float(objective):.4g})")
        opt.step()
        if critic is not None:
            _fit_critic(critic, critic_opt, policy, cfg, obs_list, loss_list, task, ts)
        ts = ts.detach()
    return ts, total_loss, grad_norm, env_steps


def _critic_input(policy, cfg, task, obs, step):
    """The value's input: the policy's normalised observation and the elapsed fraction of the episode."""
    x = policy.norm(obs) if cfg.normalize_obs else obs
    return torch.cat((x, torch.full_like(x[..., :1], step / task.horizon)), -1)


def _fit_critic(critic, opt, policy, cfg, obs_list, loss_list, task, ts):
    """Regress V(obs_t, t) on the discounted loss-to-go inside the window, bootstrapped at its end."""
    with torch.no_grad():
        boot = (critic(_critic_input(policy, cfg, task, task.observe(ts), ts.step)) if ts.step < task.horizon
                else torch.zeros_like(loss_list[-1]))
        targets, g = [], boot
        for lk in reversed(loss_list):
            g = lk + cfg.gamma * g
            targets.append(g)
        targets.reverse()
        X = torch.stack([_critic_input(policy, cfg, task, o, t) for o, t in obs_list]).reshape(-1, task.obs_dim + 1)
        Y = torch.stack(targets).reshape(-1)
    for _ in range(cfg.critic_updates):
        opt.zero_grad()
        ((critic(X) - Y) ** 2).mean().backward()
        opt.step()


def write_history(history: List[Dict[str, float]], out_dir: Path, title: str = "") -> None:
    """training.csv and learning_curve.png (success rate and loss against environment steps)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    if not history:
        return
    with open(out_dir / "training.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(history[0].keys()))
        w.writeheader()
        w.writerows(history)
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:      # plotting is optional; the CSV holds the same numbers
        return
    steps = [h["env_steps"] for h in history]
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 4))
    a1.plot(steps, [h["loss"] for h in history])
    a1.set_xlabel("environment steps")
    a1.set_ylabel("loss per step")
    a1.set_yscale("symlog", linthresh=1e-3)
    ev = [(h["env_steps"], h["eval_success"]) for h in history if not math.isnan(h["eval_success"])]
    a2.plot(steps, [h["train_success"] for h in history], label="training episodes")
    if ev:
        a2.plot(*zip(*ev), "o-", label="evaluation")
    a2.set_xlabel("environment steps")
    a2.set_ylabel("success rate")
    a2.set_ylim(-0.05, 1.05)
    a2.legend()
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(out_dir / "learning_curve.png", dpi=100)
    plt.close(fig)
