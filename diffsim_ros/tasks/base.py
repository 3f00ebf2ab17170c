"""What every task provides.

Observation, action mapping, a differentiable loss, a reset distribution and a success
metric independent of the trainer.

A task owns a :class:`~diffsim_ros.physics.Simulator`. Policies act in the
normalised box [-1, 1]^action_dim; :meth:`Task.command` maps that box to the
simulator's command interface (joint targets, torques, thrust and rates), so
the same policy output means the same thing to the gradient trainer, to PPO
and to the ROS controller.
"""
from __future__ import annotations

import functools
import inspect
import typing
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Tuple

import torch

from ..physics import ConfigError, Model, SimConfig, Simulator, State
from ..schema import convert_value, unknown_key


#: rad (or m for prismatic joints): how close to a URDF position limit counts as at the limit.
LIMIT_MARGIN = 0.01


@dataclass
class TaskState:
    """A batch of episodes.

    The simulator state, the goal of each episode (``target``, task-specific), the step index and
    the reward-free bookkeeping the success metric needs (``extra``).
    """

    sim: State
    target: torch.Tensor
    step: int = 0
    extra: Dict[str, torch.Tensor] = field(default_factory=dict)

    def detach(self) -> "TaskState":
        return TaskState(self.sim.detach(), self.target.detach(), self.step,
                         {k: v.detach() for k, v in self.extra.items()})


class Task:
    """Base class of the tasks.

    Subclasses set ``kind`` (the ``type`` of their ``task:`` section), ``name``,
    ``obs_dim``, ``action_dim``, ``horizon`` and implement ``reset``, ``observe``, ``command``,
    ``step_loss`` and ``success``.

    A task's parameters are its constructor's keyword arguments after ``model`` and
    ``sim_config``: :meth:`from_mapping` builds one from a ``task:`` mapping (checked
    against the constructor's annotations, errors naming the key path) and
    :meth:`export_parameters` gives the mapping that rebuilds it (what a checkpoint stores).
    """

    kind = ""
    name = "task"
    obs_dim: int
    action_dim: int
    horizon: int                      # control steps per episode
    success_threshold: float = 0.9    # success rate at which training counts as solved

    def __init_subclass__(cls, **kwargs):
        """Record the arguments each task is built with (the outermost constructor's)."""
        super().__init_subclass__(**kwargs)
        init = cls.__dict__.get("__init__")
        if init is None:
            return
        signature = inspect.signature(init)

        @functools.wraps(init)
        def recording(self, *args, **kw):
            if "_parameters" not in self.__dict__:
                bound = signature.bind(self, *args, **kw)
                bound.apply_defaults()
                self._parameters = {k: v for k, v in bound.arguments.items()
                                    if k not in ("self", "model", "sim_config")}
            init(self, *args, **kw)
        cls.__init__ = recording

    @classmethod
    def parameter_spec(cls) -> List[Tuple[str, Any, Any]]:
        """``(name, type hint, default)`` of the task's parameters.

        The parameters are its constructor's keyword arguments after model and sim_config; the default
        is ``inspect.Parameter.empty`` for a required one. What from_mapping converts to and the
        reference's task tables show.
        """
        init = inspect.unwrap(cls.__init__)
        hints = typing.get_type_hints(init)
        params = inspect.signature(init).parameters
        return [(p, hints.get(p, Any), params[p].default) for p in params if p not in ("self", "model", "sim_config")]

    @classmethod
    def parameter_names(cls) -> List[str]:
        """Return the task's parameters (its constructor's keyword arguments after model and sim_config)."""
        return [name for name, _, _ in cls.parameter_spec()]

    @classmethod
    def from_mapping(cls, model: Model, sim_config: SimConfig, spec: Mapping[str, Any],
                        where: str = "task") -> "Task":
        """Build the task of the mapping ``spec`` (its ``type`` key, if present, is ignored here).

        Unknown keys, values of the wrong type and values the task refuses are a ConfigError naming
        the key path under ``where``.
        """
        hints = {name: hint for name, hint, _ in cls.parameter_spec()}
        allowed = list(hints)
        kw = {}
        for k, v in spec.items():
            if k == "type":
                continue
            if k not in allowed:
                raise unknown_key(k, allowed, where).under(where)
            try:
                kw[k] = convert_value(hints[k], v, str(k))
            except ConfigError as e:
                raise e.under(where) from None
        try:
            return cls(model, sim_config, **kw)
        except ConfigError as e:
            raise e.under(where) from None
        except (TypeError, ValueError) as e:
            raise ConfigError(f"{{key}}: {e}", "").under(where) from None

    def export_parameters(self) -> Dict[str, Any]:
        """``{type: kind, parameter: value, ...}``: the ``task:`` mapping that rebuilds this task.

        It rebuilds it with :meth:`from_mapping` (plain Python values: lists, numbers, strings).
        """
        out: Dict[str, Any] = {"type": self.kind}
        for k, v in getattr(self, "_parameters", {}).items():
            if isinstance(v, torch.Tensor):
                v = v.tolist()
            elif isinstance(v, tuple):
                v = list(v)
            out[k] = v
        return out

    def __init__(self, model: Model, sim_config: SimConfig):
        self.model = model
        self.sim = Simulator(model, sim_config)
        self.sim_config = self.sim.config

    @property
    def dt(self) -> float:
        return self.sim_config.dt

    # -------------------------------------------------------------- interface
    def reset(self, batch: int, generator: Optional[torch.Generator] = None) -> TaskState:
        raise NotImplementedError

    def recorded_verdict(self, t, q, v, target) -> Optional[dict]:
        """Give the task's own verdict on one recorded trajectory, or None where recordings are judged otherwise.

        The trajectory is plain arrays: times ``t`` in s, ``q`` and ``v`` as recorded, a floating
        base's twist in the body frame, ``target`` the goal. Judged otherwise: an arm per target by
        :meth:`success` on the recorded state, a legged robot by its strict metric
        (tasks.locomotion.strict_metric).
        """
        return None

    def deployment_start(self) -> Optional[list]:
        """Where a deployment on the stand-in starts by default (None: the plant's own start)."""
        return None

    def observe(self, ts: TaskState) -> torch.Tensor:
        raise NotImplementedError

    def command(self, action: torch.Tensor, ts: TaskState) -> torch.Tensor:
        """Policy action in [-1, 1] -> simulator command."""
        raise NotImplementedError

    def step_loss(self, ts: TaskState, action: torch.Tensor) -> torch.Tensor:
        """Differentiable per-environment loss (B,) of the state reached after a step."""
        raise NotImplementedError

    def success(self, ts: TaskState) -> torch.Tensor:
        """Per-environment success (B,) bool, judged on the final state of an episode."""
        raise NotImplementedError

    def observation_names(self) -> List[str]:
        return [f"obs_{i}" for i in range(self.obs_dim)]

    def action_names(self) -> List[str]:
        return [f"act_{i}" for i in range(self.action_dim)]

    # -------------------------------------------------------------- shared
    def step(self, ts: TaskState, action: torch.Tensor) -> TaskState:
        """Apply a policy action (clamped to [-1, 1]) for one control step."""
        action = torch.clamp(action, -1.0, 1.0)
        sim_state = self.sim.step(ts.sim, self.command(action, ts))
        new = TaskState(sim_state, ts.target, ts.step + 1, dict(ts.extra))
        self.update_extra(new, action)
        return new

    def update_extra(self, ts: TaskState, action: torch.Tensor) -> None:
        """Accumulate per-episode quantities used by ``success`` (a hook)."""

    def spec(self) -> dict:
        """Observation and action specification for checkpoint metadata."""
        return {
            "task": self.name,
            "observation": {"dim": self.obs_dim, "names": self.observation_names()},
            "action": {"dim": self.action_dim, "names": self.action_names(), "low": -1.0, "high": 1.0,
                       "interface": self.sim_config.actuator},
            "dt": self.dt,
            "horizon": self.horizon,
        }

    def rollout_success(self, policy, batch: int, generator: Optional[torch.Generator] = None) -> float:
        """Success rate of ``policy`` (obs -> action) over ``batch`` fresh episodes, no gradients."""
        return self.rollout_report(policy, batch, generator)["success"]

    def rollout_report(self, policy, batch: int, generator: Optional[torch.Generator] = None,
                       limit_margin: float = LIMIT_MARGIN) -> Dict[str, float]:
        """``policy`` (obs -> action) on ``batch`` fresh episodes, no gradients.

        Gives the fractions of episodes that succeed (``success``), that put an actuated joint at its
        URDF position limit at any step (``at_limit``, within ``limit_margin``) and that drive one past
        its URDF velocity limit at any step (``over_speed``); nan for a mode no joint of the robot can
        show (no joints with limits). The same episodes as :meth:`rollout_success` for the same
        generator.
        """
        with torch.no_grad():
            ts = self.reset(batch, generator)
            at_limit, over = joint_limit_flags(self, ts.sim.q, ts.sim.v, limit_margin)
            for _ in range(self.horizon):
                ts = self.step(ts, policy(self.observe(ts)))
                a, o = joint_limit_flags(self, ts.sim.q, ts.sim.v, limit_margin)
                at_limit, over = at_limit | a, over | o
            frac = lambda flags, applies: (float(flags.any(-1).to(torch.float64).mean())   # noqa: E731
                                           if applies else float("nan"))
            lo, hi, vmax = actuated_limits(self)
            return {"success": float(self.success(ts).to(torch.float64).mean()),
                    "at_limit": frac(at_limit, bool((torch.isfinite(lo) | torch.isfinite(hi)).any())),
                    "over_speed": frac(over, bool(has_velocity_limit(vmax).any()))}


def actuated_limits(task: Task):
    """Return the actuated joints' URDF (lower, upper, velocity) limits, in the model's dtype and device."""
    idx = task.sim.act_index
    m = task.model
    return m.lower[idx], m.upper[idx], m.velocity_limit[idx]


def has_velocity_limit(vmax: torch.Tensor) -> torch.Tensor:
    """Joints whose URDF gives a velocity limit (0 or missing: not judged)."""
    return torch.isfinite(vmax) & (vmax > 0)


def joint_limit_flags(task: Task, q: torch.Tensor, v: torch.Tensor, limit_margin: float = LIMIT_MARGIN):
    """Per actuated joint: (at_limit, over_speed).

    The actuated joints are ``simulator.actuated_joints``, the joints the policy drives. The flags
    are bool tensors of shape (..., n_actuated) for configurations q (..., nq) and speeds
    v (..., nv). at_limit: within ``limit_margin`` of a finite URDF position limit, or past it;
    over_speed: |v| above the URDF velocity limit (joints without one are never over).
    """
    off_q, off_v = (7, 6) if task.model.floating_base else (0, 0)
    idx = task.sim.act_index.to(q.device)
    qj, vj = q[..., off_q:][..., idx], v[..., off_v:][..., idx]
    lo, hi, vmax = (x.to(qj) for x in actuated_limits(task))
    at_limit = ((qj <= lo + limit_margin) & torch.isfinite(lo)) | ((qj >= hi - limit_margin) & torch.isfinite(hi))
    return at_limit, (vj.abs() > vmax) & has_velocity_limit(vmax)


def uniform(shape, low, high, generator=None, dtype=torch.float64, device="cpu") -> torch.Tensor:
    low = torch.as_tensor(low, dtype=dtype, device=device)
    high = torch.as_tensor(high, dtype=dtype, device=device)
    u = torch.rand(shape, generator=generator, dtype=dtype, device="cpu").to(device)
    return low + (high - low) * u
