"""Arm reach: bring an end-effector link to a random reachable target and stop there.

Targets are the end-effector positions of random joint configurations inside
the limits, so every target is reachable. The policy commands joint positions
(PD in the simulator, as a ros2_control position interface): absolute targets
spanning the joint range, or ``command_mode: delta`` targets offset from the
current position by at most ``delta_scale`` rad; or efforts. The observation
holds the joint positions and velocities, the end-effector error and the target,
and with ``jacobian_observation`` also J(q)^T (target - ee), the error mapped into
joint space through the arm's own kinematics.

The loss is the end effector's distance to the target (later steps weigh more), with
optional terms on the joint speeds (``velocity_weight``), the actions, the end
effector's speed (``speed_weight``) and each joint's speed beyond its URDF velocity
limit (``speed_limit_weight``, (|v| / v_max - 1)^2: a real drive faults there).

Success (independent of training): at the end of the episode the end effector
is within ``success_distance`` (2 cm) of the target and moves slower than
``success_speed`` (5 cm/s).
"""
from __future__ import annotations

from typing import List, Optional

import torch

from ..physics import Model, SimConfig, forward_kinematics, link_kinematics
from .base import Task, TaskState, actuated_limits, has_velocity_limit, uniform


class ReachTask(Task):
    """Reach: move a link (``ee_link``) of a fixed-base arm to a goal point and stop there.

    The goal is drawn per episode; success: within ``success_distance`` m and ``success_speed``
    m/s at the end.
    """

    kind = "reach"

    name = "reach"

    def __init__(self, model: Model, sim_config: SimConfig, ee_link: str, horizon: int = 100,
                 target_margin: float = 0.15, success_distance: float = 0.02, success_speed: float = 0.05,
                 velocity_weight: float = 0.01, action_weight: float = 0.0, command_mode: str = "absolute",
                 delta_scale: float = 0.3, jacobian_observation: bool = False, speed_weight: float = 0.0,
                 speed_limit_weight: float = 0.0, bearing_observation: bool = False):
        if sim_config.actuator not in ("position", "effort"):
            raise ValueError(f"reach: actuator must be 'position' or 'effort', got '{sim_config.actuator}'")
        if model.floating_base:
            raise ValueError("reach: the arm must have a fixed base (floating_base: false)")
        super().__init__(model, sim_config)
        if command_mode not in ("absolute", "delta"):
            raise ValueError(f"reach: command_mode must be 'absolute' or 'delta', got '{command_mode}'")
        self.command_mode, self.delta_scale = command_mode, delta_scale
        if not isinstance(jacobian_observation, bool):
            raise ValueError(f"reach: jacobian_observation must be true or false, got {jacobian_observation!r}")
        self.jacobian_observation = jacobian_observation
        if not isinstance(bearing_observation, bool):
            raise ValueError(f"reach: bearing_observation must be true or false, got {bearing_observation!r}")
        self.bearing_observation = bearing_observation
        if speed_weight < 0:
            raise ValueError(f"reach: speed_weight must be >= 0 s, got {speed_weight}")
        self.speed_weight = speed_weight
        if not speed_limit_weight >= 0:
            raise ValueError(f"reach: speed_limit_weight must be >= 0, got {speed_limit_weight}")
        self.speed_limit_weight = float(speed_limit_weight)
        if ee_link not in model.link_names:
            raise ValueError(f"reach: ee_link '{ee_link}' is not a link of '{model.name}' "
                             f"(links: {', '.join(model.link_names)})")
        self.ee_index = model.link_names.index(ee_link)
        self.ee_link = ee_link
        self.horizon = horizon
        self.success_distance = success_distance
        self.success_speed = success_speed
        self.velocity_weight = velocity_weight
        self.action_weight = action_weight
        idx = self.sim.act_index
        self.n = idx.numel()
        lo, hi = model.lower[idx], model.upper[idx]
        lo = torch.where(torch.isfinite(lo), lo, torch.full_like(lo, -torch.pi))
        hi = torch.where(torch.isfinite(hi), hi, torch.full_like(hi, torch.pi))
        span = hi - lo
        self.q_low, self.q_high = lo, hi
        self.t_low, self.t_high = lo + target_margin * span, hi - target_margin * span
        self.q_mid, self.q_half = 0.5 * (lo + hi), 0.5 * span
        vmax = actuated_limits(self)[2]
        self._limited = has_velocity_limit(vmax)
        self._vmax = torch.where(self._limited, vmax, torch.ones_like(vmax))
        self.obs_dim = 2 * self.n + 6 + (self.n if jacobian_observation else 0) + (2 if bearing_observation else 0)
        if bearing_observation:
            self._bearing_frame = self._first_joint_frame(model)
        self.action_dim = self.n

    def observation_names(self) -> List[str]:
        names = self.sim.actuated_joints
        return ([f"q/{n}" for n in names] + [f"v/{n}" for n in names]
                + [f"ee_error/{a}" for a in "xyz"] + [f"target/{a}" for a in "xyz"]
                + ([f"jacobian_error/{n}" for n in names] if self.jacobian_observation else [])
                + (["bearing/sin", "bearing/cos"] if self.bearing_observation else []))

    def _first_joint_frame(self, model: Model):
        """(origin, x, y) of the first actuated joint at q = 0 in the world frame.

        That is the plane about its axis in which the target's bearing is measured. Refused unless
        that joint is revolute.
        """
        dof = int(self.sim.act_index[0])
        b = model.v_start.index(dof)
        name = self.sim.actuated_joints[0]
        if model.joint_type[b] not in ("revolute", "continuous"):
            raise ValueError(f"reach: bearing_observation needs a revolute first actuated joint, "
                             f"'{name}' is {model.joint_type[b]}")
        R, p = model.tree_R[b], model.tree_p[b]
        i = model.parent[b]
        while i >= 0:                                  # the joint frame at q = 0, up to the world
            R, p = model.tree_R[i] @ R, model.tree_R[i] @ p + model.tree_p[i]
            i = model.parent[i]
        axis = R @ model.axis[b]
        axis = axis / torch.linalg.vector_norm(axis)
        ref = R[:, 0] if float(torch.linalg.vector_norm(torch.linalg.cross(R[:, 0], axis))) > 1e-6 else R[:, 1]
        x = ref - (ref @ axis) * axis
        x = x / torch.linalg.vector_norm(x)
        return p, x, torch.linalg.cross(axis, x)

    def _bearing(self, target: torch.Tensor, q1: torch.Tensor) -> torch.Tensor:
        """Sin and cos of the target's bearing about the first joint's axis less that joint's angle.

        That is which way the arm must turn, at full scale even for a target near the axis.
        """
        o, x, y = self._bearing_frame
        d = target - o
        az = torch.atan2(d @ y, d @ x)
        return torch.stack((torch.sin(az - q1), torch.cos(az - q1)), -1)

    def action_names(self) -> List[str]:
        kind = "position" if self.sim_config.actuator == "position" else "effort"
        return [f"{kind}/{n}" for n in self.sim.actuated_joints]

    def ee_position(self, q: torch.Tensor) -> torch.Tensor:
        return forward_kinematics(self.model, q)[..., self.ee_index, 0:3, 3]

    def _ee_kinematics(self, q: torch.Tensor):
        """End-effector position and Jacobian at q, from one kinematics pass.

        A rollout asks for them twice per state (the loss after a step, then the next observation), so
        the last answer is kept for the same tensor q, unchanged in place, in the same grad mode.
        """
        key = (q, q._version, torch.is_grad_enabled())
        cached = getattr(self, "_ee_cache", None)
        if cached is not None and cached[0][0] is q and cached[0][1:] == key[1:]:
            return cached[1]
        out = link_kinematics(self.model, q, self.ee_index)
        self._ee_cache = (key, out)
        return out

    def reset(self, batch: int, generator: Optional[torch.Generator] = None) -> TaskState:
        m = self.model
        kw = dict(generator=generator, dtype=m.dtype, device=m.device)
        q = m.neutral_configuration((batch,))
        q_target = q.clone()
        q[:, self.sim.act_index] = uniform((batch, self.n), self.t_low, self.t_high, **kw)
        q_target[:, self.sim.act_index] = uniform((batch, self.n), self.t_low, self.t_high, **kw)
        target = self.ee_position(q_target)
        return TaskState(self.sim.initial_state(q), target)

    def _joint(self, ts: TaskState):
        idx = self.sim.act_index
        return ts.sim.q[:, idx], ts.sim.v[:, idx]

    def observe(self, ts: TaskState) -> torch.Tensor:
        q, v = self._joint(ts)
        if self.jacobian_observation:
            # J(q)^T (target - ee): the joint-space direction that closes the error (what a
            # Jacobian-transpose controller commands), m^2 per joint, from the URDF's kinematics.
            ee, J = self._ee_kinematics(ts.sim.q)
            extra = [((ts.target - ee)[..., None] * J[..., self.sim.act_index]).sum(-2)]
        else:
            ee, extra = self.ee_position(ts.sim.q), []
        if self.bearing_observation:
            extra.append(self._bearing(ts.target, q[..., 0]))
        return torch.cat([(q - self.q_mid) / self.q_half, v, ee - ts.target, ts.target] + extra, -1)

    def command(self, action: torch.Tensor, ts: TaskState) -> torch.Tensor:
        if self.sim_config.actuator == "position":
            if self.command_mode == "delta":
                q, _ = self._joint(ts)
                return torch.minimum(torch.maximum(q + self.delta_scale * action, self.q_low), self.q_high)
            return self.q_mid + self.q_half * action
        lim = self.sim.effort_limit
        lim = torch.where(torch.isfinite(lim), lim, torch.full_like(lim, 10.0))
        return lim * action

    def step_loss(self, ts: TaskState, action: torch.Tensor) -> torch.Tensor:
        if self.speed_weight:
            ee, J = self._ee_kinematics(ts.sim.q)
        else:
            ee = self.ee_position(ts.sim.q)
        err = ee - ts.target
        dist = torch.sqrt((err ** 2).sum(-1) + 1e-6)
        _, v = self._joint(ts)
        # Later steps weigh more: the task is judged at the end of the episode.
        w = (ts.step / self.horizon)
        loss = w * dist + self.velocity_weight * (v ** 2).sum(-1) + self.action_weight * (action ** 2).sum(-1)
        if self.speed_limit_weight:
            # A real drive faults past its URDF speed limit, and at its effort limit cannot always
            # brake a heavy link whose neighbours swing it (the Panda's shoulder): every step a joint
            # spends beyond the limit costs (|v| / v_max - 1)^2, nothing within it.
            over = torch.relu(v.abs() / self._vmax - 1.0) * self._limited
            loss = loss + self.speed_limit_weight * (over ** 2).sum(-1)
        if self.speed_weight:
            # The end effector's speed |J(q) v| under the same weight: the success metric asks
            # for the arm at rest, which a distance alone does not (a step-to-step chatter
            # around the target costs almost no distance).
            speed = torch.sqrt(((J @ ts.sim.v[..., None])[..., 0] ** 2).sum(-1) + 1e-6)
            loss = loss + w * self.speed_weight * speed
        return loss

    def ee_speed(self, ts: TaskState) -> torch.Tensor:
        h = 1e-4
        q2 = self.sim.integrate(ts.sim.q, ts.sim.v, h)
        return torch.linalg.vector_norm(self.ee_position(q2) - self.ee_position(ts.sim.q), dim=-1) / h

    def distance(self, ts: TaskState) -> torch.Tensor:
        return torch.linalg.vector_norm(self.ee_position(ts.sim.q) - ts.target, dim=-1)

    def success(self, ts: TaskState) -> torch.Tensor:
        return (self.distance(ts) < self.success_distance) & (self.ee_speed(ts) < self.success_speed)

    def recorded_verdict(self, t, q, v, target) -> dict:
        """Judge the reach success (:meth:`success`) of one recorded episode from plain arrays.

        The arrays are the stand-in's or a bag's joint trajectory: ``q`` (T, nq) and ``v`` (T, nv) in
        the model's joint order, ``target`` the goal point in m. At the last recorded state the end
        effector, placed by forward kinematics, must be within ``success_distance`` of the target and
        slower than ``success_speed``. Returns the verdict and each of its parts.
        """
        import numpy as np

        m = self.model
        qt = torch.as_tensor(np.asarray(q, dtype=np.float64), dtype=m.dtype, device=m.device).reshape(-1, m.nq)
        vt = torch.as_tensor(np.asarray(v, dtype=np.float64), dtype=m.dtype, device=m.device).reshape(-1, m.nv)
        goal = torch.as_tensor(np.asarray(target, dtype=np.float64), dtype=m.dtype, device=m.device).reshape(1, 3)
        with torch.no_grad():
            ts = TaskState(self.sim.initial_state(qt[-1:], vt[-1:]), goal, len(qt) - 1)
            dist, speed = float(self.distance(ts)[0]), float(self.ee_speed(ts)[0])
        parts = {"distance_m": dist, "distance_ok": bool(dist < self.success_distance),
                 "ee_speed_m_s": speed, "speed_ok": bool(speed < self.success_speed)}
        parts["success"] = parts["distance_ok"] and parts["speed_ok"]
        return parts
