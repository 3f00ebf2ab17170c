"""A legged jump: the base as high as it can go, through ground contact.

The objective is the base's ballistic apex ``z_t + max(vz_t, 0)^2 / 2g`` (``vz`` the world
vertical speed: the height the base reaches if it flies from step t) above its standing
height, averaged over the episode, plus a small regulariser on the action and, with
``upright_weight``, the base's tilt (1 - cos of the angle between its z axis and the world's) and,
with ``drift_weight``, the base's horizontal speed squared (a jump in place: without it a policy may
hop on in a run that carries it away and tips it over after the judged second). Every step counts,
so a push-off is rewarded at once by the apex it sets up, and the flight (whose ascent holds the
apex) outweighs standing tall on extended legs. There is no term on legs, phases, contacts or
posture: crouching, pushing off and the flight come from the apex through the contact model.
(The episode's maximum alone, the running maximum's rise per step, gave no gradient while the
robot stood: the trainer never left the stance.)

Success (independent of training, :func:`jump_metric`): the base rises at least ``min_apex``
m above its standing height while every foot is off the ground at that step (a flight, not
a stretch on extended legs); at every step the base stays above ``fall_height`` x its
standing height with roll and pitch within ``max_tilt`` rad, and no body but the feet
touches the ground.
"""
from __future__ import annotations

from typing import Optional, Sequence

import numpy as np
import torch

from ..physics import Model, SimConfig
from .base import TaskState
from .locomotion import LocomotionTask


class JumpTask(LocomotionTask):
    """A legged robot on the position interface jumps as high as it can from the ``stance`` pose.

    Joint targets are about that pose, ``action_scale`` rad per unit action; see the module doc.
    """

    kind = "jump"

    name = "jump"

    def __init__(self, model: Model, sim_config: SimConfig, stance: Sequence[float], base_height: float,
                 horizon: int = 100, action_scale: float = 0.5, action_weight: float = 1e-3,
                 upright_weight: float = 0.0, min_apex: float = 0.05, max_tilt: float = 0.5,
                 fall_height: float = 0.5, observation: str = "robot", drift_weight: float = 0.0):
        super().__init__(model, sim_config, stance, base_height, horizon=horizon, action_scale=action_scale,
                         action_weight=action_weight, upright_weight=upright_weight, fall_height=fall_height,
                         max_tilt=max_tilt, observation=observation)
        if not min_apex > 0:
            raise ValueError(f"jump: 'min_apex' must be > 0 m, got {min_apex}")
        self.min_apex = float(min_apex)
        if not drift_weight >= 0:
            raise ValueError(f"jump: 'drift_weight' must be >= 0 (s^2/m), got {drift_weight}")
        self.drift_weight = float(drift_weight)
        self.gravity = float(-sim_config.gravity[2])
        if not self.gravity > 0:
            raise ValueError(f"jump: gravity must point down (-z), got {list(sim_config.gravity)}")

    def apex(self, ts: TaskState) -> torch.Tensor:
        """(B,) the base's ballistic apex from the current state: z + max(vz, 0)^2 / 2g (m)."""
        vz = self.base_velocity_world(ts)[:, 2]
        return ts.sim.q[:, 2] + torch.clamp(vz, min=0.0) ** 2 / (2.0 * self.gravity)

    def reset(self, batch: int, generator: Optional[torch.Generator] = None) -> TaskState:
        ts = super().reset(batch, generator)
        ts.extra["peak_z"] = ts.sim.q[:, 2].detach().clone()
        ts.extra["airborne_peak"] = torch.zeros(batch, dtype=torch.bool, device=self.model.device)
        ts.extra["violation"] = torch.zeros(batch, dtype=torch.bool, device=self.model.device)
        return ts

    def update_extra(self, ts: TaskState, action: torch.Tensor) -> None:
        super().update_extra(ts, action)           # the previous action, the fall (no command here)
        ts.extra["violation"] = ts.extra["violation"] | self.posture_violation(ts, self.fall_height)
        with torch.no_grad():
            z = ts.sim.q[:, 2]
            feet = self.feet_contact(ts)
            higher = z > ts.extra["peak_z"]
            ts.extra["peak_z"] = torch.where(higher, z, ts.extra["peak_z"])
            if feet is not None:
                ts.extra["airborne_peak"] = torch.where(higher, ~feet.any(0), ts.extra["airborne_peak"])

    def feet_contact(self, ts: Optional[TaskState] = None) -> Optional[torch.Tensor]:
        """(F, B) bool: each foot touching the ground in the last step, or in the replayed state ``ts``.

        None when the step kept no contact data.
        """
        return self.touching(self.feet, ts)

    def step_loss(self, ts: TaskState, action: torch.Tensor) -> torch.Tensor:
        loss = -(self.apex(ts) - self.base_height)
        if self.drift_weight:
            loss = loss + self.drift_weight * (self.base_velocity_world(ts)[:, 0:2] ** 2).sum(-1)
        return self.with_physical_terms(loss, ts, action)

    def success(self, ts: TaskState) -> torch.Tensor:
        high = ts.extra["peak_z"] - self.base_height >= self.min_apex
        return high & ts.extra["airborne_peak"] & ~ts.extra["violation"]

    def recorded_verdict(self, t, q, v, target) -> dict:
        """:func:`jump_metric` of one recorded episode from plain arrays, as the stand-in or a bag gives them.

        ``q`` is the base pose then the joints, ``v`` the body-frame twist then the joints, per step;
        ``t`` and ``target`` are not needed. Base height, roll and pitch come from the pose, and the
        feet's and the other bodies' ground contact is judged from each recorded state's own
        configuration and velocity (no simulator step produced them). The same parts as
        :meth:`success` judges from the simulator's own flags.
        """
        import numpy as np

        from ..physics.spatial import roll_pitch

        m = self.model
        qt = torch.as_tensor(np.asarray(q, dtype=np.float64), dtype=m.dtype, device=m.device).reshape(-1, m.nq)
        vt = torch.as_tensor(np.asarray(v, dtype=np.float64), dtype=m.dtype, device=m.device).reshape(-1, m.nv)
        with torch.no_grad():
            roll, pitch = roll_pitch(qt[:, 3:7])
            ts = TaskState(self.sim.initial_state(qt, vt), torch.zeros(len(qt), 0, dtype=m.dtype, device=m.device),
                           0, {"replayed": torch.ones(len(qt), dtype=torch.bool, device=m.device)})
            feet = self.touching(self.feet, ts)                             # (F, T) or None
            other = self.touching(self.other_bodies, ts)
        n = len(qt)
        feet = np.zeros((n, 0), bool) if feet is None else feet.T.cpu().numpy()
        other = np.zeros(n, bool) if other is None else other.any(0).cpu().numpy()
        return jump_metric(qt[:, 2].cpu().numpy(), roll.cpu().numpy(), pitch.cpu().numpy(), feet, other,
                           self.base_height, self.min_apex, self.max_tilt, self.fall_height / self.base_height)


def jump_metric(z, roll, pitch, feet_contact, other_contact, base_height: float, min_apex: float = 0.05,
                max_tilt: float = 0.5, fall_height: float = 0.5) -> dict:
    """Judge the jump's success on one recorded episode, from plain arrays.

    The arrays may come from the simulator, the stand-in or a bag alike: base height ``z`` (m),
    ``roll`` and ``pitch`` (rad) per step, ``feet_contact`` (T, F) bool per foot, ``other_contact``
    (T,) bool (a body other than a foot touching). Returns the verdict and each of its parts.
    """
    z = np.asarray(z, dtype=np.float64)
    roll, pitch = np.asarray(roll, dtype=np.float64), np.asarray(pitch, dtype=np.float64)
    feet = np.asarray(feet_contact, dtype=bool).reshape(len(z), -1)
    other = np.asarray(other_contact, dtype=bool)
    k = int(np.argmax(z))
    parts = {"apex_m": float(z[k] - base_height), "apex_ok": bool(z[k] - base_height >= min_apex),
             "airborne_at_apex": bool(not feet[k].any()),
             "min_height_m": float(z.min()), "height_ok": bool((z >= fall_height * base_height).all()),
             "max_tilt_rad": float(max(np.abs(roll).max(), np.abs(pitch).max())),
             "tilt_ok": bool((np.abs(roll) <= max_tilt).all() and (np.abs(pitch) <= max_tilt).all()),
             "only_feet_touch": bool(not other.any())}
    parts["success"] = (parts["apex_ok"] and parts["airborne_at_apex"] and parts["height_ok"] and parts["tilt_ok"]
                        and parts["only_feet_touch"])
    return parts
