"""Legged forward progress through ground contact.

The loss is the negative forward (world x) velocity of the base, plus a small
torque-free regulariser on the action; there is no gait term (no foot
clearance, phase or symmetry reward): whatever gait appears comes from the
forward-progress objective through the contact model.

Success (independent of training): mean forward speed over the episode above
``success_speed`` (m/s) without falling (base height above ``fall_height``
and the base not tipped past 60 degrees at every step).
"""
from __future__ import annotations

from typing import List, Optional, Sequence

import torch

from ..physics import Model, SimConfig
from ..physics.spatial import quat_rotate
from ..physics.spatial import quat_to_matrix
from .base import Task, TaskState, uniform


class LocomotionTask(Task):
    name = "locomotion"

    def __init__(self, model: Model, sim_config: SimConfig, stance: Sequence[float], base_height: float,
                 horizon: int = 100, action_scale: float = 0.5, success_speed: float = 0.1,
                 fall_height: float = 0.5, action_weight: float = 1e-3, upright_weight: float = 0.0):
        if not model.floating_base:
            raise ValueError("locomotion: the robot needs a floating base (floating_base: true)")
        if sim_config.actuator != "position":
            raise ValueError(f"locomotion: actuator must be 'position', got '{sim_config.actuator}'")
        super().__init__(model, sim_config)
        n = self.sim.act_index.numel()
        if len(stance) != n:
            raise ValueError(f"locomotion: 'stance' has {len(stance)} entries for {n} actuated joints")
        self.stance = torch.tensor(list(stance), dtype=model.dtype, device=model.device)
        self.base_height = base_height
        self.horizon = horizon
        self.action_scale = action_scale
        self.success_speed = success_speed
        self.fall_height = fall_height * base_height
        self.action_weight, self.upright_weight = action_weight, upright_weight
        self.n = n
        self.obs_dim = 1 + 9 + 6 + 2 * n
        self.action_dim = n

    def observation_names(self) -> List[str]:
        names = self.sim.actuated_joints
        return (["base_height"] + [f"R/{i}{j}" for i in range(3) for j in range(3)]
                + [f"base_velocity/{a}" for a in ("x", "y", "z", "wx", "wy", "wz")]
                + [f"q/{x}" for x in names] + [f"v/{x}" for x in names])

    def action_names(self) -> List[str]:
        return [f"position/{x}" for x in self.sim.actuated_joints]

    def reset(self, batch: int, generator: Optional[torch.Generator] = None) -> TaskState:
        m = self.model
        q = m.neutral_configuration((batch,))
        q[:, 2] = self.base_height
        qj = self.stance + uniform((batch, self.n), -0.05, 0.05, generator=generator, dtype=m.dtype,
                                   device=m.device)
        q[:, 7:] = q[:, 7:].index_copy(1, self.sim.act_index, qj)
        ts = TaskState(self.sim.initial_state(q), torch.zeros(batch, 0, dtype=m.dtype, device=m.device))
        ts.extra["x0"] = q[:, 0].clone()
        ts.extra["fallen"] = torch.zeros(batch, dtype=torch.bool, device=m.device)
        return ts

    def observe(self, ts: TaskState) -> torch.Tensor:
        q, v = ts.sim.q, ts.sim.v
        R = quat_to_matrix(q[:, 3:7]).reshape(-1, 9)
        qj, vj = q[:, 7:][:, self.sim.act_index], v[:, 6:][:, self.sim.act_index]
        return torch.cat((q[:, 2:3] - self.base_height, R, v[:, 0:6], qj - self.stance, 0.1 * vj), -1)

    def command(self, action: torch.Tensor, ts: TaskState) -> torch.Tensor:
        return self.stance + self.action_scale * action

    def forward_velocity(self, ts: TaskState) -> torch.Tensor:
        quat = ts.sim.q[:, 3:7]
        quat = quat / torch.linalg.vector_norm(quat, dim=-1, keepdim=True)
        return quat_rotate(quat, ts.sim.v[:, 0:3])[:, 0]

    def step_loss(self, ts: TaskState, action: torch.Tensor) -> torch.Tensor:
        loss = -self.forward_velocity(ts) + self.action_weight * (action ** 2).sum(-1)
        if self.upright_weight:
            loss = loss + self.upright_weight * (1.0 - quat_to_matrix(ts.sim.q[:, 3:7])[:, 2, 2])
        return loss

    def _fallen(self, ts: TaskState) -> torch.Tensor:
        up = quat_to_matrix(ts.sim.q[:, 3:7])[:, 2, 2]
        return (ts.sim.q[:, 2] < self.fall_height) | (up < 0.5)

    def update_extra(self, ts: TaskState, action: torch.Tensor) -> None:
        ts.extra["fallen"] = ts.extra["fallen"] | self._fallen(ts)

    def mean_speed(self, ts: TaskState) -> torch.Tensor:
        return (ts.sim.q[:, 0] - ts.extra["x0"]) / max(ts.step * self.dt, 1e-9)

    def success(self, ts: TaskState) -> torch.Tensor:
        return (self.mean_speed(ts) > self.success_speed) & ~ts.extra["fallen"]
