"""Quadrotor flight through collective thrust and body rates (CTBR).

Modes:
  hover     reach and hold a fixed point from a perturbed start;
  waypoint  fly to a random point within ``waypoint_radius`` and hold it;
  velocity  track a commanded world velocity; the loss is the squared gap
            between desired and simulated velocity, the objective of training
            flight policies by back-propagation through Newton's laws.

Success (independent of training), checked on every step after the settling
time: within 10 cm of the target and slower than 0.2 m/s (hover, waypoint), or
within 0.2 m/s of the commanded velocity (velocity).
"""
from __future__ import annotations

from typing import List, Optional

import torch

from ..physics import Model, SimConfig
from ..physics.spatial import quat_rotate
from ..physics.spatial import quat_to_matrix
from .base import Task, TaskState, uniform

MODES = ("hover", "waypoint", "velocity")


class QuadrotorTask(Task):
    """A multirotor on the CTBR interface: hover at a point, fly to a waypoint or track a velocity.

    Which one is set by ``mode`` (the velocity is commanded); success: within
    ``success_distance`` m (or of the commanded velocity) and ``success_speed`` after
    ``settle_time`` s.
    """

    kind = "quadrotor"

    def __init__(self, model: Model, sim_config: SimConfig, mode: str = "hover", horizon: int = 150,
                 settle_time: float = 2.0, start_radius: float = 0.5, start_speed: float = 0.3,
                 waypoint_radius: float = 1.0, max_speed_command: float = 1.5, max_rate: float = 3.0,
                 thrust_range: float = 0.8, success_distance: float = 0.10, success_speed: float = 0.2,
                 rate_weight: float = 0.01, tilt_weight: float = 0.0, position_loss: str = "squared",
                 speed_weight: float = 0.1):
        if mode not in MODES:
            raise ValueError(f"quadrotor: mode must be one of {MODES}, got '{mode}'")
        if position_loss not in ("squared", "distance"):
            raise ValueError(f"quadrotor: position_loss must be 'squared' or 'distance', got '{position_loss}'")
        if sim_config.actuator != "ctbr":
            raise ValueError(f"quadrotor: actuator must be 'ctbr', got '{sim_config.actuator}'")
        super().__init__(model, sim_config)
        self.name = f"quadrotor_{mode}"
        self.mode = mode
        self.horizon = horizon
        self.settle_steps = min(int(round(settle_time / sim_config.dt)), horizon - 1)
        self.start_radius, self.start_speed = start_radius, start_speed
        self.waypoint_radius, self.max_speed_command = waypoint_radius, max_speed_command
        self.max_rate, self.thrust_range = max_rate, thrust_range
        self.success_distance, self.success_speed = success_distance, success_speed
        self.rate_weight, self.tilt_weight = rate_weight, tilt_weight
        self.position_loss, self.speed_weight = position_loss, speed_weight
        self.hover_thrust = float(model.mass.sum()) * -float(self.sim.model.gravity[2])
        self.obs_dim = 18
        self.action_dim = 4
        self.home = torch.tensor([0.0, 0.0, 1.0], dtype=model.dtype, device=model.device)

    def observation_names(self) -> List[str]:
        first = "velocity_error" if self.mode == "velocity" else "position_error"
        return ([f"{first}/{a}" for a in "xyz"] + [f"velocity/{a}" for a in "xyz"]
                + [f"R/{i}{j}" for i in range(3) for j in range(3)] + [f"body_rate/{a}" for a in "xyz"])

    def action_names(self) -> List[str]:
        return ["collective_thrust", "body_rate/x", "body_rate/y", "body_rate/z"]

    # -------------------------------------------------------------- state
    def world_velocity(self, ts: TaskState) -> torch.Tensor:
        q, v = ts.sim.q, ts.sim.v
        quat = q[:, 3:7] / torch.linalg.vector_norm(q[:, 3:7], dim=-1, keepdim=True)
        return quat_rotate(quat, v[:, 0:3])

    def reset(self, batch: int, generator: Optional[torch.Generator] = None) -> TaskState:
        m = self.model
        kw = dict(generator=generator, dtype=m.dtype, device=m.device)
        q = m.neutral_configuration((batch,))
        start = self.home + uniform((batch, 3), -self.start_radius, self.start_radius, **kw)
        q[:, 0:3] = start
        v = torch.zeros(batch, m.nv, dtype=m.dtype, device=m.device)
        v[:, 0:3] = uniform((batch, 3), -self.start_speed, self.start_speed, **kw)
        if self.mode == "hover":
            target = self.home.expand(batch, 3).clone()
        elif self.mode == "waypoint":
            target = self.home + uniform((batch, 3), -self.waypoint_radius, self.waypoint_radius, **kw)
        else:
            target = uniform((batch, 3), -self.max_speed_command, self.max_speed_command, **kw)
        ts = TaskState(self.sim.initial_state(q, v), target)
        ts.extra["ok_steps"] = torch.zeros(batch, dtype=m.dtype, device=m.device)
        return ts

    def observe(self, ts: TaskState) -> torch.Tensor:
        q, v = ts.sim.q, ts.sim.v
        vw = self.world_velocity(ts)
        first = vw - ts.target if self.mode == "velocity" else q[:, 0:3] - ts.target
        R = quat_to_matrix(q[:, 3:7]).reshape(-1, 9)
        return torch.cat((first, vw, R, v[:, 3:6]), -1)

    def command(self, action: torch.Tensor, ts: TaskState) -> torch.Tensor:
        thrust = self.hover_thrust * (1.0 + self.thrust_range * action[:, 0:1])
        return torch.cat((thrust, self.max_rate * action[:, 1:4]), -1)

    def step_loss(self, ts: TaskState, action: torch.Tensor) -> torch.Tensor:
        vw = self.world_velocity(ts)
        rates = ts.sim.v[:, 3:6]
        if self.mode == "velocity":
            loss = ((vw - ts.target) ** 2).sum(-1)
        elif self.position_loss == "squared":
            loss = ((ts.sim.q[:, 0:3] - ts.target) ** 2).sum(-1) + self.speed_weight * (vw ** 2).sum(-1)
        else:
            # Distance, not its square: the pull towards the target keeps its strength in the
            # last centimetres (the square's gradient vanishes there, and the success metric
            # is a 10 cm / 0.2 m/s box). The small epsilon keeps the gradient finite at zero.
            dist = torch.sqrt(((ts.sim.q[:, 0:3] - ts.target) ** 2).sum(-1) + 1e-4)
            speed = torch.sqrt((vw ** 2).sum(-1) + 1e-4)
            loss = dist + self.speed_weight * speed
        loss = loss + self.rate_weight * (rates ** 2).sum(-1)
        if self.tilt_weight:
            R = quat_to_matrix(ts.sim.q[:, 3:7])
            loss = loss + self.tilt_weight * (1.0 - R[:, 2, 2])
        return loss

    def within_tolerance(self, position: torch.Tensor, world_velocity: torch.Tensor,
                         target: torch.Tensor) -> torch.Tensor:
        """Per-sample tolerance of one step (positions and world-frame velocities, (..., 3)).

        Hover and waypoint: within ``success_distance`` of the target and slower than
        ``success_speed``; velocity tracking: within ``success_speed`` of the commanded velocity.
        Also used on recorded trajectories (the main job's stand-in flight).
        """
        if self.mode == "velocity":
            return torch.linalg.vector_norm(world_velocity - target, dim=-1) < self.success_speed
        dist = torch.linalg.vector_norm(position - target, dim=-1)
        return (dist < self.success_distance) & (torch.linalg.vector_norm(world_velocity, dim=-1) < self.success_speed)

    def recorded_verdict(self, t, q, v, target) -> dict:
        """:meth:`within_tolerance` on a recorded flight, as :meth:`success` judges an episode.

        The flight is odometry: q = position + quaternion x y z w, v = body-frame twist; the
        tolerance is checked at every state after the settling time.
        """
        import numpy as np

        from ..physics.rotation import quat_to_matrix as matrix

        t = np.asarray(t, dtype=np.float64) - float(t[0])
        q, v, target = (np.asarray(x, dtype=np.float64) for x in (q, v, target))
        pos = q[:, 0:3]
        vw = np.einsum("nij,nj->ni", np.stack([matrix(qq) for qq in q[:, 3:7]]), v[:, 0:3])
        dist = np.linalg.norm(pos - target, axis=1)
        speed = np.linalg.norm(vw, axis=1)
        settle = self.settle_steps * self.dt
        # The states after the settling time, as :meth:`update_extra` counts them: control steps
        # past settle_steps (the state at exactly the settling time is not judged).
        after = np.round(t / self.dt) > self.settle_steps
        ok = self.within_tolerance(torch.as_tensor(pos), torch.as_tensor(vw), torch.as_tensor(target)).numpy()
        return {"settle_time_s": settle, "final_distance_m": float(dist[-1]), "final_speed_m_s": float(speed[-1]),
                "max_distance_after_settling_m": float(dist[after].max()) if after.any() else float("nan"),
                "fraction_within_tolerance_after_settling": float(ok[after].mean()) if after.any() else float("nan"),
                "success": bool(after.any() and ok[after].all()),
                "tolerance": {"distance_m": self.success_distance, "speed_m_s": self.success_speed}}

    def deployment_start(self) -> list:
        """Inside the training distribution of starts and off the goal: the policy has to fly there."""
        r = float(self.start_radius)
        return [0.6 * r, -0.5 * r, 1.0 - 0.5 * r]

    def _ok(self, ts: TaskState) -> torch.Tensor:
        return self.within_tolerance(ts.sim.q[:, 0:3], self.world_velocity(ts), ts.target)

    def update_extra(self, ts: TaskState, action: torch.Tensor) -> None:
        if ts.step > self.settle_steps:
            ts.extra["ok_steps"] = ts.extra["ok_steps"] + self._ok(ts).to(ts.extra["ok_steps"].dtype)

    def success(self, ts: TaskState) -> torch.Tensor:
        """Every step after the settling time met the tolerance (and the episode got there)."""
        needed = max(ts.step - self.settle_steps, 0)
        if needed == 0:
            return self._ok(ts)
        return ts.extra["ok_steps"] >= needed
