"""Tasks over the differentiable simulator (no ROS imports here).

Each gives the observation, action mapping, differentiable loss, reset distribution and
success metric.
"""
from __future__ import annotations

from typing import Any, Dict, Mapping

from ..physics import ConfigError, Model, SimConfig
from .base import Task, TaskState
from .jump import JumpTask
from .locomotion import LocomotionTask
from .quadrotor import QuadrotorTask
from .reach import ReachTask

TASKS = {cls.kind: cls for cls in (ReachTask, QuadrotorTask, LocomotionTask, JumpTask)}

__all__ = ["Task", "TaskState", "ReachTask", "QuadrotorTask", "LocomotionTask", "JumpTask", "TASKS", "make_task"]


def make_task(model: Model, sim_config: SimConfig, spec: Dict[str, Any], where: str = "task") -> Task:
    """Build a task from a mapping such as ``{type: reach, ee_link: ee_link, horizon: 100}``.

    Uses :meth:`Task.from_mapping` of the type's class; an unknown type or key, or a wrong
    value, is a :class:`ConfigError` naming the key path under ``where``.
    """
    if not isinstance(spec, Mapping) or "type" not in spec:
        raise ConfigError(f"must be a mapping with a 'type' ({', '.join(TASKS)}), got {spec!r}", where)
    kind = spec["type"]
    if kind not in TASKS:
        raise ConfigError(f"must be one of {', '.join(TASKS)}, got {kind!r}", f"{where}.type")
    return TASKS[kind].from_mapping(model, sim_config, spec, where)
