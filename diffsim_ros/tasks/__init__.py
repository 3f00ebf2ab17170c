"""Tasks: observation, action mapping, differentiable loss, reset distribution and
success metric over the differentiable simulator (no ROS imports here)."""
from __future__ import annotations

import inspect
from typing import Any, Dict

from ..physics import ConfigError, Model, SimConfig
from .base import Task, TaskState
from .locomotion import LocomotionTask
from .quadrotor import QuadrotorTask
from .reach import ReachTask

TASKS = {"reach": ReachTask, "quadrotor": QuadrotorTask, "locomotion": LocomotionTask}

__all__ = ["Task", "TaskState", "ReachTask", "QuadrotorTask", "LocomotionTask", "TASKS", "make_task"]


def make_task(model: Model, sim_config: SimConfig, spec: Dict[str, Any], where: str = "task") -> Task:
    """Build a task from a mapping such as ``{type: reach, ee_link: ee_link, horizon: 100}``;
    an unknown type or key is a :class:`ConfigError` naming it."""
    if not isinstance(spec, dict) or "type" not in spec:
        raise ConfigError(f"'{where}' must be a mapping with a 'type' ({', '.join(TASKS)})")
    kind = spec["type"]
    if kind not in TASKS:
        raise ConfigError(f"'{where}.type' must be one of {', '.join(TASKS)}, got '{kind}'")
    cls = TASKS[kind]
    params = inspect.signature(cls.__init__).parameters
    allowed = [p for p in params if p not in ("self", "model", "sim_config")]
    kw = {}
    for k, v in spec.items():
        if k == "type":
            continue
        if k not in allowed:
            raise ConfigError(f"unknown key '{where}.{k}' for task type '{kind}' (known: {', '.join(allowed)})")
        kw[k] = v
    try:
        return cls(model, sim_config, **kw)
    except (TypeError, ValueError) as e:
        raise ConfigError(f"'{where}': {e}") from None
