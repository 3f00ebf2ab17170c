"""Legged forward progress through ground contact.

The loss is the negative forward (world x) velocity of the base, plus a small
torque-free regulariser on the action; there is no gait term (no foot
clearance, phase or symmetry reward): whatever gait appears comes from the
forward-progress objective through the contact model.

Success (independent of training): mean forward speed over the episode above
``success_speed`` (m/s) without falling (base height above ``fall_height``
and the base not tipped past 60 degrees at every step).

Velocity command (``command_speed: [low, high]``, m/s): each episode draws a forward speed
command the policy observes; the loss is the squared tracking error of the forward speed (with
``speed_average_s``, of its moving average; with ``relative_tracking``, as a fraction of the command,
as the metric judges it) plus the physical terms only (the action; optionally uprightness, and with ``height_weight`` a
barrier at the metric's height floor): no gait shaping. Its success is the strict metric
:func:`strict_metric` (over the last ``window_s`` of the episode: mean forward speed within
``speed_tolerance`` of the command; at every step of the episode the base above
``min_height`` x its standing height, roll and pitch within ``max_tilt`` rad, and no body but
the feet touching the ground).

A gait clock is optional (``gait_period`` s, one phase offset per foot in ``gait_offsets``,
``gait_duty``, ``swing_height``): the policy then also observes the clock's sine and cosine (time
since the episode started; on the robot, the runner's count of its decisions), and with
``gait_weight`` the loss pulls each foot's lowest point onto a reference, on the ground for the
duty fraction of its cycle and a half sine of ``swing_height`` through its swing
(:meth:`LocomotionTask.swing_target`). Without it nothing in the loss names a gait.

The strict metric also asks for a gait a robot can make. Over the window every foot touches
down at least ``min_touchdown_rate`` times a second (``steps_ok``: a foot dragged along fails),
and each foot's mean horizontal speed while in contact is below ``max_foot_slide`` m/s
(``no_slide_ok``: a foot scuffing or skating fails). Contact comes from forward kinematics
alone, the same way for the simulator's states, the stand-in's and a bag's: a foot is on the
ground when its lowest collision point (a sphere's bottom, a box corner) is at most
``contact_height`` above it. The default, 1 mm, is less than a foot bearing its share of the
weight sinks (1.1 mm for the project's quadruped, 1.7 mm for solo12 into the penalty ground, 0.7
mm into MuJoCo's), so a loaded foot always counts and of a swing only its last millimetre does.
On the shipped walkers' episodes contact at 0 mm agrees with the simulator's contact forces at
97-99 % of the steps and at 5 mm at 78-93 %: a band of several millimetres counts a swinging
foot's approach as stance and its motion as slide. A touchdown is a sample in contact after
the foot was off the ground for at least ``min_swing_s`` (0.02 s, two control steps: contact
that flickers from one step to the next is not stepping). The slide of an interval with the
foot in contact at both ends is the horizontal displacement of the foot-fixed point that was
lowest at its start (a sphere's bottom: a foot rolling on its sphere does not slide); the mean
is their sum over the intervals' time. The feet are the bodies ending the kinematic chains
(:func:`.gait.foot_bodies`).
"""
from __future__ import annotations

import math
from typing import List, Optional, Sequence

import torch

from ..physics import Model, SimConfig
from ..physics.spatial import quat_rotate
from ..physics.spatial import quat_to_matrix, roll_pitch
from .base import Task, TaskState, uniform


#: m, the depth scale of the legged odometry's weights (LocomotionTask.estimated_velocity).
ODOMETRY_DEPTH_SCALE = 0.01

#: The legged observations: what a robot's IMU and encoders give, or the full simulator state.
OBSERVATIONS = ("robot", "privileged")


class LocomotionTask(Task):
    """A legged robot on the position interface: move forward or track a commanded forward speed.

    It moves from the ``stance`` pose (joint targets about it, ``action_scale`` rad per unit
    action); the speed is drawn per episode from ``command_speed``. See the module doc for the
    success metric.
    """

    kind = "locomotion"

    name = "locomotion"

    def __init__(self, model: Model, sim_config: SimConfig, stance: Sequence[float], base_height: float,
                 horizon: int = 100, action_scale: float = 0.5, success_speed: float = 0.1,
                 fall_height: float = 0.5, action_weight: float = 1e-3, upright_weight: float = 0.0,
                 command_speed: Optional[Sequence[float]] = None, window_s: float = 3.0,
                 speed_tolerance: float = 0.2, min_height: float = 0.7, max_tilt: float = 0.5,
                 height_weight: float = 0.0, speed_average_s: float = 0.0, relative_tracking: bool = False,
                 min_touchdown_rate: float = 1.0, max_foot_slide: float = 0.1, contact_height: float = 0.001,
                 min_swing_s: float = 0.02, observation: str = "robot", slip_weight: float = 0.0,
                 slip_height: float = 0.005, gait_period: float = 0.0, gait_offsets: Sequence[float] = (),
                 gait_duty: float = 0.5, swing_height: float = 0.04, gait_weight: float = 0.0,
                 landing_weight: float = 0.0, velocity_estimate: bool = False):
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
        self.height_weight = float(height_weight)
        self.n = n
        self.command_speed = None
        if command_speed is not None:
            lo, hi = (float(x) for x in command_speed)
            if not 0 <= lo <= hi:
                raise ValueError(f"locomotion: 'command_speed' must be [low, high] with 0 <= low <= high, got "
                                 f"{list(command_speed)}")
            self.command_speed = (lo, hi)
            if not 0 < window_s <= horizon * self.dt:
                raise ValueError(f"locomotion: 'window_s' {window_s} must lie within the episode "
                                 f"({horizon} x {self.dt} s)")
        self.speed_average_s, self.relative_tracking = float(speed_average_s), bool(relative_tracking)
        if self.speed_average_s < 0:
            raise ValueError(f"locomotion: 'speed_average_s' must be >= 0, got {speed_average_s}")
        if self.relative_tracking and (self.command_speed is None or self.command_speed[0] <= 0):
            raise ValueError("locomotion: 'relative_tracking' divides by the command: it needs 'command_speed' "
                             "[low, high] with low > 0")
        self.window_s, self.speed_tolerance = float(window_s), float(speed_tolerance)
        self.min_height, self.max_tilt = float(min_height) * base_height, float(max_tilt)
        from .gait import foot_bodies

        self.feet = foot_bodies(self.sim)
        bodies = sorted(set(int(b) for b in self.sim.system.contact.body.tolist()))
        self.other_bodies = [b for b in bodies if b not in self.feet]
        for key, val in (("min_touchdown_rate", min_touchdown_rate), ("max_foot_slide", max_foot_slide),
                         ("contact_height", contact_height), ("min_swing_s", min_swing_s)):
            if not val >= 0:
                raise ValueError(f"locomotion: '{key}' must be >= 0, got {val}")
        self.min_touchdown_rate, self.max_foot_slide = float(min_touchdown_rate), float(max_foot_slide)
        self.contact_height, self.min_swing_s = float(contact_height), float(min_swing_s)
        if self.command_speed and not self.feet:
            raise ValueError(f"locomotion: the strict metric judges the feet, and '{model.name}' has none (no "
                             "kinematic chain ends in a body with collision geometry)")
        self._foot_table()
        if observation not in OBSERVATIONS:
            raise ValueError(f"locomotion: 'observation' must be one of {', '.join(OBSERVATIONS)}, got '{observation}'")
        self.observation = observation
        self.velocity_estimate = bool(velocity_estimate)
        if self.velocity_estimate and (observation != "robot" or not self.feet):
            raise ValueError("locomotion: 'velocity_estimate' is part of the robot observation (observation: robot) "
                             f"and stands on the feet, and '{model.name}' has "
                             + ("none" if not self.feet else f"observation: {observation}"))
        if not slip_weight >= 0 or not slip_height > 0:
            raise ValueError(f"locomotion: 'slip_weight' must be >= 0 and 'slip_height' > 0, got {slip_weight}, "
                             f"{slip_height}")
        if not landing_weight >= 0:
            raise ValueError(f"locomotion: 'landing_weight' must be >= 0, got {landing_weight}")
        self.slip_weight, self.slip_height = float(slip_weight), float(slip_height)
        self.landing_weight = float(landing_weight)
        for key, weight in (("slip_weight", self.slip_weight), ("landing_weight", self.landing_weight)):
            if weight and not self.feet:
                raise ValueError(f"locomotion: '{key}' acts on the feet, and '{model.name}' has none")
        self._gait_clock(gait_period, gait_offsets, gait_duty, swing_height, gait_weight)
        self.obs_dim = len(self.observation_names())
        self.action_dim = n

    def observation_names(self) -> List[str]:
        names = self.sim.actuated_joints
        joints = [f"q/{x}" for x in names] + [f"v/{x}" for x in names]
        command = ["command/forward_speed"] if self.command_speed else []
        clock = ["clock/sin", "clock/cos"] if self.gait_period else []
        if self.observation == "robot":
            estimate = [f"velocity_estimate/{a}" for a in "xyz"] if self.velocity_estimate else []
            return ([f"gravity/{a}" for a in "xyz"] + [f"angular_velocity/{a}" for a in "xyz"] + estimate + joints
                    + [f"previous_action/{x}" for x in names] + clock + command)
        return (["base_height"] + [f"R/{i}{j}" for i in range(3) for j in range(3)]
                + [f"base_velocity/{a}" for a in ("x", "y", "z", "wx", "wy", "wz")] + joints + clock + command)

    def action_names(self) -> List[str]:
        return [f"position/{x}" for x in self.sim.actuated_joints]

    def reset(self, batch: int, generator: Optional[torch.Generator] = None) -> TaskState:
        m = self.model
        q = m.neutral_configuration((batch,))
        q[:, 2] = self.base_height
        qj = self.stance + uniform((batch, self.n), -0.05, 0.05, generator=generator, dtype=m.dtype,
                                   device=m.device)
        q[:, 7:] = q[:, 7:].index_copy(1, self.sim.act_index, qj)
        if self.command_speed:
            target = uniform((batch, 1), *self.command_speed, generator=generator, dtype=m.dtype, device=m.device)
        else:
            target = torch.zeros(batch, 0, dtype=m.dtype, device=m.device)
        ts = TaskState(self.sim.initial_state(q), target)
        ts.extra["x0"] = q[:, 0].clone()
        ts.extra["fallen"] = torch.zeros(batch, dtype=torch.bool, device=m.device)
        if self.command_speed:
            ts.extra["x_window"] = q[:, 0].clone()                 # base x when the judged window starts
            ts.extra["violation"] = torch.zeros(batch, dtype=torch.bool, device=m.device)
            ts.extra["speed_average"] = torch.zeros(batch, dtype=m.dtype, device=m.device)
            self._start_feet(ts)
        return ts

    def observe(self, ts: TaskState) -> torch.Tensor:
        """``observation: robot``: what a legged robot's own sensors give.

        The IMU's gravity direction in the base frame and its body rates, the joint encoders' positions
        (about the stance) and velocities, the policy's previous action (``ts.extra["action"]``, zero at
        the start of an episode) and the command; with ``velocity_estimate``, the base's linear velocity
        in its own frame as legged odometry estimates it from those sensors
        (:meth:`estimated_velocity`); with ``gait_period``, the gait clock's sine and cosine
        (time since the episode started, ``ts.step``: a controller's own clock). ``privileged``:
        the base height, its world orientation and body-frame twist, the joints and the command (a
        motion-capture room's state; the observation of policies trained before the robot
        observation existed).
        """
        q, v = ts.sim.q, ts.sim.v
        qj, vj = q[:, 7:][:, self.sim.act_index], v[:, 6:][:, self.sim.act_index]
        if self.observation == "robot":
            R = quat_to_matrix(q[:, 3:7])
            gravity = -R[:, 2, :]                  # R^T (0, 0, -1): the world's down in the base frame
            previous = ts.extra.get("action")
            if previous is None:
                previous = torch.zeros_like(qj)
            obs = [gravity, v[:, 3:6]]
            if self.velocity_estimate:
                obs.append(self.estimated_velocity(q, v))
            obs += [qj - self.stance, 0.1 * vj, previous]
        else:
            R = quat_to_matrix(q[:, 3:7]).reshape(-1, 9)
            obs = [q[:, 2:3] - self.base_height, R, v[:, 0:6], qj - self.stance, 0.1 * vj]
        if self.gait_period:
            angle = 2.0 * math.pi * ts.step * self.dt / self.gait_period
            obs.append(torch.tensor([[math.sin(angle), math.cos(angle)]], dtype=q.dtype,
                                    device=q.device).expand(q.shape[0], 2))
        if self.command_speed:
            obs.append(ts.target)
        return torch.cat(obs, -1)

    def foot_velocities(self, q: torch.Tensor, v: torch.Tensor):
        """Legged odometry, per foot, from what the robot's IMU and joint encoders give.

        That is the base's orientation (its gravity direction only), body rates and the joints'
        positions and velocities of ``q`` (B, nq), ``v`` (B, nv); the base's position and linear
        velocity are not read. Returns, in the base frame, (B, F, 3) the base's linear velocity that
        would keep each foot's lowest point (along gravity) at rest, and (B, F) how far below the base
        that point lies along gravity (m). Forward kinematics of the base held at the origin with the
        measured body rates: a foot's point moves there at ``w x r + J qdot``; standing on the
        ground it is at rest in the world, so the base moves at minus that.
        """
        from ..physics.kinematics import kinematics

        base = torch.zeros(q.shape[0], 7, dtype=q.dtype, device=q.device)
        base[:, 6] = 1.0
        kin = kinematics(self.model, torch.cat([base, q[:, 7:]], -1),
                         torch.cat([torch.zeros_like(v[:, 0:3]), v[:, 3:]], -1))
        down = -quat_to_matrix(q[:, 3:7])[:, 2, :]                                # (B, 3) gravity, base frame
        R = kin.R[self.feet].permute(3, 0, 1, 2)                                  # (B, F, 3, 3)
        o = kin.o.permute(2, 0, 1)                                                # (B, 1, 3)
        p = kin.p[self.feet].permute(2, 0, 1) + o                                 # (B, F, 3) from the base
        vel = kin.vel[self.feet].permute(2, 0, 1)                                 # (B, F, 6) at o
        depth, point, _ = self._lowest_points(R, p, down)
        speed = vel[..., 0:3] + torch.cross(vel[..., 3:6], point - o, dim=-1)
        return -speed, depth

    def estimated_velocity(self, q: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """(B, 3) the base's linear velocity in its own frame by legged odometry (:meth:`foot_velocities`).

        Each foot's estimate is weighted by how low it is, a softmax of its depth along gravity over
        ``ODOMETRY_DEPTH_SCALE`` (a foot 3 cm above the lowest weighs e^-3 of it): the feet on the
        ground, whatever the gait. Differentiable.
        """
        est, depth = self.foot_velocities(q, v)
        w = torch.softmax(depth / ODOMETRY_DEPTH_SCALE, dim=-1)
        return (w[..., None] * est).sum(1)

    def command(self, action: torch.Tensor, ts: TaskState) -> torch.Tensor:
        return self.stance + self.action_scale * action

    def base_velocity_world(self, ts: TaskState) -> torch.Tensor:
        """(B, 3) the base's linear velocity in the world frame (the state holds it in the body frame)."""
        quat = ts.sim.q[:, 3:7]
        quat = quat / torch.linalg.vector_norm(quat, dim=-1, keepdim=True)
        return quat_rotate(quat, ts.sim.v[:, 0:3])

    def forward_velocity(self, ts: TaskState) -> torch.Tensor:
        return self.base_velocity_world(ts)[:, 0]

    def with_physical_terms(self, loss: torch.Tensor, ts: TaskState, action: torch.Tensor) -> torch.Tensor:
        """(B,) ``loss`` plus the physical terms every legged objective carries.

        The action squared and, with ``upright_weight``, the base's tilt (1 - cos of its z axis's angle
        from vertical), and, with ``height_weight``, the base's drop below ``min_height`` as a fraction
        of its standing height, squared (nothing above it: a barrier at the metric's floor, not a
        posture target).
        """
        loss = loss + self.action_weight * (action ** 2).sum(-1)
        if self.upright_weight:
            loss = loss + self.upright_weight * (1.0 - quat_to_matrix(ts.sim.q[:, 3:7])[:, 2, 2])
        if self.height_weight:
            drop = torch.clamp(self.min_height - ts.sim.q[:, 2], min=0.0) / self.base_height
            loss = loss + self.height_weight * drop ** 2
        if self.slip_weight or self.gait_weight or self.landing_weight:
            height, slip, landing = self.foot_motion(ts)
            if self.slip_weight:
                loss = loss + self.slip_weight * slip
            if self.landing_weight:
                loss = loss + self.landing_weight * landing
            if self.gait_weight:
                loss = loss + self.gait_weight * ((height - self.swing_target(ts.step)) ** 2).sum(-1)
        return loss

    def _gait_clock(self, period, offsets, duty, swing_height, weight) -> None:
        """Check and set the gait clock's options (see :meth:`swing_target`)."""
        period, duty, swing_height, weight = float(period), float(duty), float(swing_height), float(weight)
        offsets = [float(x) for x in offsets]
        if not period >= 0 or not weight >= 0:
            raise ValueError(f"locomotion: 'gait_period' and 'gait_weight' must be >= 0, got {period}, {weight}")
        if weight and not period:
            raise ValueError("locomotion: 'gait_weight' needs the clock it follows: set 'gait_period' (s)")
        if period:
            if period < 2 * self.dt:
                raise ValueError(f"locomotion: 'gait_period' {period} s is shorter than two control steps "
                                 f"({2 * self.dt} s)")
            names = [self.model.body_names[b] for b in self.feet]
            if len(offsets) != len(self.feet) or not all(0 <= x < 1 for x in offsets):
                raise ValueError(f"locomotion: 'gait_offsets' needs one phase in [0, 1) per foot ({len(self.feet)}: "
                                 f"{', '.join(names)}), got {offsets}")
            if not 0 < duty < 1 or not swing_height > 0:
                raise ValueError(f"locomotion: 'gait_duty' must lie in (0, 1) and 'swing_height' be > 0, got "
                                 f"{duty}, {swing_height}")
        self.gait_period, self.gait_duty, self.swing_height, self.gait_weight = period, duty, swing_height, weight
        self.gait_offsets = torch.tensor(offsets, dtype=self.model.dtype, device=self.model.device)

    def swing_target(self, step: int) -> torch.Tensor:
        """(F,) m: the height each foot's lowest point follows at control step ``step`` under the gait clock.

        The clock: ``gait_period`` s, a foot's phase ``step dt / gait_period + gait_offsets[foot]`` mod
        1. The foot is on the ground (0) for the first ``gait_duty`` of its cycle, then follows a half
        sine of peak ``swing_height`` through its swing. The gait term, ``gait_weight`` x the squared
        gap summed over the feet, is the only gait shaping the task has, and only where asked for.
        """
        phase = torch.remainder(step * self.dt / self.gait_period + self.gait_offsets, 1.0)
        swing = torch.clamp((phase - self.gait_duty) / (1.0 - self.gait_duty), min=0.0)
        return self.swing_height * torch.sin(math.pi * swing)

    def gait_pattern(self) -> dict:
        """Return what a stepping pattern on the gait clock needs of this task.

        These are the keyword arguments of :class:`diffsim_ros.learning.policy.GaitReference`: where the
        clock and the command sit in the observation, each foot's phase offset, the duty, the swing
        height, the stance's duration (a stride covers the command's distance in it), and ``lift`` and
        ``stride`` (A, F): each foot's height and forward displacement mapped to joint offsets in action
        units through the pseudo-inverse of its lowest point's Jacobian (base frame, joints of the
        action) at the stance.
        """
        from ..physics.kinematics import kinematics

        if not self.gait_period:
            raise ValueError("locomotion: a gait reference follows the gait clock: set 'gait_period' (s)")
        m = self.model
        q0 = m.neutral_configuration((1,))
        q0[:, 2] = self.base_height
        local = self.foot_track(q0.index_copy(1, 7 + self.sim.act_index, self.stance[None]))["local"][0]  # (F, 3)

        def feet(qa):
            q = q0[0].index_copy(0, 7 + self.sim.act_index, qa)
            kin = kinematics(m, q[None])
            R, p = kin.R[self.feet][..., 0], (kin.p[self.feet] + kin.o)[..., 0]          # (F, 3, 3), (F, 3)
            return torch.einsum("fij,fj->fi", R, local.to(R)) + p

        J = torch.autograd.functional.jacobian(feet, self.stance.detach().clone())       # (F, 3, A)
        inv = torch.linalg.pinv(J) / self.action_scale                                  # (F, A, 3)
        names = self.observation_names()
        command = names.index("command/forward_speed") if self.command_speed else -1
        return {"clock_index": names.index("clock/sin"), "command_index": command, "offsets": self.gait_offsets,
                "duty": self.gait_duty, "swing_height": self.swing_height,
                "stride_time": self.gait_period * self.gait_duty, "lift": inv[:, :, 2].T, "stride": inv[:, :, 0].T}

    def foot_slip(self, ts: TaskState) -> torch.Tensor:
        """(B,) differentiable: over the feet, the squared horizontal speed (m^2/s^2) of each foot's lowest point.

        The lowest point is the foot-fixed point the gait rules follow; each is weighted by how close it
        is to the ground: 1 in contact, falling linearly to 0 at ``slip_height`` above it. A foot
        skating or scuffing along the ground costs; one swinging clear of it does not. A physical
        term (sliding feet waste work and wear on carpet or grass), not a gait pattern: how and
        when the feet lift is left to the forward-progress objective.
        """
        return self.foot_motion(ts)[1]

    def foot_landing(self, ts: TaskState) -> torch.Tensor:
        """(B,) differentiable: the squared landing speed (m^2/s^2) of each foot's lowest point, over the feet.

        That is the speed at which the point moves into the ground, weighted as :meth:`foot_slip`
        weights the sliding (1 in contact, 0 from ``slip_height`` up). A foot that lands hard sinks
        into a soft floor (on the stand-in's default ground a foot arriving at 1 m/s sank 14 mm); solo12
        trained with it landed at 0.45 m/s and sank 6 mm, though its feet still slid there. A physical
        term, ``landing_weight`` in the loss; when and where the feet land is left to the objective.
        """
        return self.foot_motion(ts)[2]

    def foot_motion(self, ts: TaskState):
        """Differentiable, of each foot's lowest point.

        Its height above the ground (B, F) m, :meth:`foot_slip` (B,) and :meth:`foot_landing` (B,).
        """
        from ..physics.kinematics import kinematics

        sys = self.sim.system
        q, v = ts.sim.q, ts.sim.v
        kin = kinematics(self.model, q, v)
        feet = self.feet
        R = kin.R[feet].permute(3, 0, 1, 2)                                       # (B, F, 3, 3)
        p = kin.p[feet].permute(2, 0, 1)                                          # (B, F, 3), relative to o
        vel = kin.vel[feet].permute(2, 0, 1)                                      # (B, F, 6) at o
        n = sys.ground_normal.to(R)
        local = self.foot_track(q, kin)["local"].to(R)                            # (B, F, 3) lowest points
        x = torch.einsum("bfij,bfj->bfi", R, local) + p                           # relative to o
        speed = vel[..., 0:3] + torch.cross(vel[..., 3:6], x, dim=-1)
        height = ((x + kin.o.permute(2, 0, 1)) * n).sum(-1) - sys.ground_height.to(R)
        near = torch.clamp(1.0 - height / self.slip_height, 0.0, 1.0)
        normal = (speed * n).sum(-1)
        horizontal = speed - normal[..., None] * n
        down = torch.clamp(-normal, min=0.0)
        return height, (near * (horizontal ** 2).sum(-1)).sum(-1), (near * down ** 2).sum(-1)

    def tracked_speed(self, ts: TaskState) -> torch.Tensor:
        """(B,) the forward speed the loss compares with the command.

        The base's forward velocity now, or with ``speed_average_s`` its exponential moving average of
        that time constant (a hopping or stepping base's speed swings within every stride; the metric
        judges the mean over seconds).
        """
        return ts.extra["speed_average"] if self.speed_average_s > 0 else self.forward_velocity(ts)

    def step_loss(self, ts: TaskState, action: torch.Tensor) -> torch.Tensor:
        if self.command_speed:
            err = self.tracked_speed(ts) - ts.target[:, 0]
            if self.relative_tracking:          # the metric's tolerance is a fraction of the command
                err = err / ts.target[:, 0]
            return self.with_physical_terms(err ** 2, ts, action)
        return self.with_physical_terms(-self.forward_velocity(ts), ts, action)

    def _fallen(self, ts: TaskState) -> torch.Tensor:
        up = quat_to_matrix(ts.sim.q[:, 3:7])[:, 2, 2]
        return (ts.sim.q[:, 2] < self.fall_height) | (up < 0.5)

    def window_start_step(self) -> int:
        return self.horizon - int(round(self.window_s / self.dt))

    def touching(self, bodies: Sequence[int], ts: Optional[TaskState] = None) -> Optional[torch.Tensor]:
        """(len(bodies), B) bool: each body pushed by the ground (normal force over 1 mN) in the last step.

        None when the step kept no contact data, e.g. under torch.compile, or no body is given. A state
        no step of this task produced (``ts.extra["replayed"]``: a recorded episode read back) is judged
        from its own configuration and velocity instead.
        """
        if not bodies:
            return None
        if ts is not None and "replayed" in ts.extra:
            with torch.no_grad():
                wrench = self.sim.contact_forces(ts.sim.q, ts.sim.v)[0]          # (B, nb, 6), world frame
            return wrench[:, list(bodies), 2].T > 1e-3
        data = self.sim.last_data
        if data is None:
            return None
        return data.contact.wrench[list(bodies), 2, :] > 1e-3

    def other_contact(self, ts: Optional[TaskState] = None) -> Optional[torch.Tensor]:
        """(B,) bool: a body other than the feet touched the ground in the last step.

        Or in the replayed state ``ts``; None when the step kept no contact data, e.g. under
        torch.compile.
        """
        other = self.touching(self.other_bodies, ts)
        return None if other is None else other.any(0)

    def posture_violation(self, ts: TaskState, floor: float) -> torch.Tensor:
        """(B,) bool: a posture violation in this step.

        The base below ``floor`` m, roll or pitch beyond ``max_tilt``, or a body other than the feet
        touching the ground.
        """
        with torch.no_grad():
            roll, pitch = roll_pitch(ts.sim.q[:, 3:7])
            bad = (ts.sim.q[:, 2] < floor) | (roll.abs() > self.max_tilt) | (pitch.abs() > self.max_tilt)
            other = self.other_contact(ts)
            return bad if other is None else bad | other

    # -------------------------------------------------------------- the gait rules
    def _foot_table(self) -> None:
        """Each foot's collision points as one table, ``_foot_point`` (F, P).

        The points are sphere centres with their radii and box corners with radius 0; the table holds
        indices into the contact set, padded with the set's size where a foot has fewer points than
        another.
        """
        cs = self.sim.system.contact
        rows = [torch.nonzero(cs.body == b).flatten() for b in self.feet]
        size = int(cs.body.numel())
        self._foot_point = torch.full((len(rows), max((len(r) for r in rows), default=0)), size,
                                      dtype=torch.long, device=cs.body.device)
        for i, r in enumerate(rows):
            self._foot_point[i, :len(r)] = r

    def foot_track(self, q: torch.Tensor, kin=None) -> dict:
        """Where each foot meets the ground at the configurations ``q`` (B, nq).

        By forward kinematics, without gradients: ``height`` (B, F) m, the height of the foot's lowest
        collision point (a sphere's bottom, a box corner) above the ground, negative in penetration;
        that point as a point of the foot's body, ``local`` (B, F, 3) in the body's frame and ``world``
        (B, F, 3); and the foot bodies' placements ``R`` (B, F, 3, 3) and ``p`` (B, F, 3) (for
        :meth:`foot_moved`). ``kin``: the kinematics record of ``q`` where the caller has it already
        (physics.kinematics).
        """
        from ..physics.kinematics import kinematics

        sys = self.sim.system
        with torch.no_grad():
            if kin is None:
                kin = kinematics(self.model, q.detach())
            R = kin.R[self.feet].detach().permute(3, 0, 1, 2)                     # (B, F, 3, 3)
            p = (kin.p[self.feet] + kin.o).detach().permute(2, 0, 1)              # (B, F, 3)
            n = sys.ground_normal.to(R)
            depth, world, local_pt = self._lowest_points(R, p, -n.expand(R.shape[0], 3))
            h = -depth - sys.ground_height.to(R)                                   # (B, F)
        return {"height": h, "local": local_pt, "world": world, "R": R, "p": p}

    def _lowest_points(self, R: torch.Tensor, p: torch.Tensor, down: torch.Tensor):
        """Each foot's lowest collision point along the unit vectors ``down`` (B, 3).

        Its feet placed at ``R`` (B, F, 3, 3), ``p`` (B, F, 3) (positions from any common origin,
        ``down`` in the same axes): (B, F) how far the point lies along ``down`` (the bottom of its
        lowest sphere, a box corner), the point (B, F, 3) from that origin, and the point in the foot
        body's frame (B, F, 3). Differentiable in ``R``, ``p`` and ``down``.
        """
        cs = self.sim.system.contact
        idx = self._foot_point
        valid = idx < cs.body.numel()
        safe = idx.clamp(max=max(cs.body.numel() - 1, 0))
        local, radius = cs.local[safe].to(R), cs.radius[safe].to(R)              # (F, P, 3), (F, P)
        centre = torch.einsum("bfij,fpj->bfpi", R, local) + p[:, :, None]          # (B, F, P, 3)
        depth = ((centre * down[:, None, None, :]).sum(-1) + radius).masked_fill(~valid, float("-inf"))
        d, k = depth.max(-1)                                                       # (B, F)
        B, F, P = depth.shape
        at = k[..., None, None].expand(B, F, 1, 3)
        pick = lambda x: x.expand(B, F, P, 3).gather(2, at)[:, :, 0]             # noqa: E731  (B, F, 3)
        r = radius.expand(B, F, P).gather(2, k[..., None])                         # (B, F, 1)
        # The material point at the bottom of the lowest sphere: its centre plus r along down
        # (in the body frame R^T down).
        return d, pick(centre) + r * down[:, None], pick(local) + r * torch.einsum("bfji,bj->bfi", R, down)

    def foot_moved(self, track: dict, local: torch.Tensor) -> torch.Tensor:
        """(B, F, 3) world positions of the foot-fixed points ``local`` at the placements of ``track``.

        ``track`` is from :meth:`foot_track`; ``local`` is (B, F, 3), each in its foot body's frame.
        """
        return torch.einsum("bfij,bfj->bfi", track["R"], local) + track["p"]

    def horizontal(self, d: torch.Tensor) -> torch.Tensor:
        """(...) length of the displacements ``d`` (..., 3) along the ground (the normal part removed)."""
        n = self.sim.system.ground_normal.to(d)
        return torch.linalg.vector_norm(d - (d * n).sum(-1, keepdim=True) * n, dim=-1)

    def foot_arrays(self, q) -> tuple:
        """Return the feet of one recorded episode, ``q`` (T, nq), as :func:`strict_metric` takes them.

        ``contact`` (T, F) bool, the foot's lowest point within ``contact_height`` of the ground,
        and ``step`` (T, F) m, the horizontal displacement from the sample before of the
        foot-fixed point that was lowest there (0 at the first sample).
        """
        import numpy as np

        qt = torch.as_tensor(np.asarray(q, dtype=np.float64), dtype=self.model.dtype, device=self.model.device)
        tr = self.foot_track(qt)
        contact = tr["height"] <= self.contact_height
        prev = {k: v[:-1] for k, v in tr.items()}
        now = {k: v[1:] for k, v in tr.items()}
        with torch.no_grad():
            step = self.horizontal(self.foot_moved(now, prev["local"]) - prev["world"])
            step = torch.cat((torch.zeros_like(step[:1]), step))
        return contact.cpu().numpy(), step.double().cpu().numpy()

    def _start_feet(self, ts: TaskState) -> None:
        """Start the gait rules' bookkeeping at the start of an episode (see :meth:`_step_feet`)."""
        tr = self.foot_track(ts.sim.q)
        contact = tr["height"] <= self.contact_height
        e = ts.extra
        e["foot_contact"], e["foot_local"], e["foot_world"] = contact, tr["local"], tr["world"]
        e["foot_off_steps"] = (~contact).to(torch.long)       # samples since the foot last touched
        e["touchdowns"] = torch.zeros(contact.shape, dtype=tr["height"].dtype, device=contact.device)
        e["slide_distance"] = torch.zeros_like(e["touchdowns"])
        e["contact_time"] = torch.zeros_like(e["touchdowns"])

    def _step_feet(self, ts: TaskState) -> None:
        """Update the gait rules' bookkeeping per control step, without gradients.

        Each foot's contact from forward kinematics; within the judged window its touchdowns (in contact
        after a swing of at least ``min_swing_s``) and, over each step it spends in contact at both
        ends, the horizontal displacement of the foot-fixed point that was lowest at the step's start,
        with the time.
        """
        e = ts.extra
        tr = self.foot_track(ts.sim.q)
        with torch.no_grad():
            contact = tr["height"] <= self.contact_height
            was = e["foot_contact"]
            if ts.step > self.window_start_step():
                swung = e["foot_off_steps"] * self.dt >= self.min_swing_s - 1e-9
                e["touchdowns"] = e["touchdowns"] + (contact & ~was & swung).to(e["touchdowns"].dtype)
                both = contact & was
                moved = self.horizontal(self.foot_moved(tr, e["foot_local"]) - e["foot_world"])
                e["slide_distance"] = e["slide_distance"] + torch.where(both, moved, torch.zeros_like(moved))
                e["contact_time"] = e["contact_time"] + both.to(moved.dtype) * self.dt
            e["foot_off_steps"] = torch.where(contact, torch.zeros_like(e["foot_off_steps"]), e["foot_off_steps"] + 1)
            e["foot_contact"], e["foot_local"], e["foot_world"] = contact, tr["local"], tr["world"]

    def gait_parts(self, ts: TaskState) -> dict:
        """Judge the gait rules of the strict metric on a finished batch of episodes (velocity command).

        ``touchdowns_per_s`` (B, F) over the judged window, ``foot_slide_m_s`` (B, F), each foot's
        mean horizontal speed while in contact (nan for a foot never in contact over a step of the
        window), and ``steps_ok``, ``no_slide_ok`` (B,) bool.
        """
        e = ts.extra
        duration = (self.horizon - self.window_start_step()) * self.dt
        slide = e["slide_distance"] / e["contact_time"]
        return {"touchdowns_per_s": e["touchdowns"] / duration, "foot_slide_m_s": slide,
                "steps_ok": (e["touchdowns"] >= self.min_touchdown_rate * duration - 1e-6).all(-1),
                "no_slide_ok": ((e["contact_time"] == 0) | (slide < self.max_foot_slide)).all(-1)}

    def update_extra(self, ts: TaskState, action: torch.Tensor) -> None:
        ts.extra["action"] = action                # the robot observation's previous action
        ts.extra["fallen"] = ts.extra["fallen"] | self._fallen(ts)
        if self.command_speed:
            ts.extra["violation"] = ts.extra["violation"] | self.posture_violation(ts, self.min_height)
            if self.speed_average_s > 0:
                rate = min(self.dt / self.speed_average_s, 1.0)
                avg = ts.extra["speed_average"]
                ts.extra["speed_average"] = avg + rate * (self.forward_velocity(ts) - avg)
            if ts.step == self.window_start_step():
                ts.extra["x_window"] = ts.sim.q[:, 0].detach().clone()
            self._step_feet(ts)

    def recorded_verdict(self, t, q, v, target) -> Optional[dict]:
        """Judge the strict metric (:func:`strict_metric`) of one recorded velocity-command episode.

        The episode is plain arrays, as the stand-in or a bag gives them: ``q`` the base pose then the
        joints, ``v`` the body-frame twist then the joints, ``target`` the command. Whether a body other
        than a foot touches is judged from each recorded state's own configuration and velocity, the
        feet's contacts and slide by forward kinematics of ``q`` (:meth:`foot_arrays`). None for the
        forward-progress task (no command: its episode is judged by :meth:`success`).
        """
        if not self.command_speed:
            return None
        import numpy as np

        m = self.model
        qt = torch.as_tensor(np.asarray(q, dtype=np.float64), dtype=m.dtype, device=m.device)
        vt = torch.as_tensor(np.asarray(v, dtype=np.float64), dtype=m.dtype, device=m.device)
        with torch.no_grad():
            roll, pitch = roll_pitch(qt[:, 3:7])
            other = self.touching(self.other_bodies, TaskState(self.sim.initial_state(qt, vt),
                                                               torch.zeros(len(qt), 1), 0, {"replayed": True}))
        other = np.zeros(len(qt), bool) if other is None else other.any(0).cpu().numpy()
        contact, step = self.foot_arrays(qt)
        cmd = float(np.asarray(target, dtype=np.float64).reshape(-1)[0])
        verdict = strict_metric(np.asarray(t, dtype=np.float64), qt[:, 0].cpu().numpy(), qt[:, 2].cpu().numpy(),
                                roll.cpu().numpy(), pitch.cpu().numpy(), other, cmd, self.base_height, self.window_s,
                                self.speed_tolerance, self.min_height / self.base_height, self.max_tilt,
                                feet_contact=contact, feet_step=step, min_touchdown_rate=self.min_touchdown_rate,
                                max_foot_slide=self.max_foot_slide, min_swing_s=self.min_swing_s)
        if "steps_ok" in verdict:
            verdict["feet"] = [m.body_names[b] for b in self.feet]
        return verdict

    def mean_speed(self, ts: TaskState) -> torch.Tensor:
        return (ts.sim.q[:, 0] - ts.extra["x0"]) / max(ts.step * self.dt, 1e-9)

    def window_speed(self, ts: TaskState) -> torch.Tensor:
        """Mean forward speed over the judged window (velocity command)."""
        steps = ts.step - self.window_start_step()
        return (ts.sim.q[:, 0] - ts.extra["x_window"]) / max(steps * self.dt, 1e-9)

    def strict_parts(self, ts: TaskState) -> dict:
        """Judge the strict metric's parts on a batch of velocity-command episodes, each (B,).

        The window's mean speed ``window_speed_m_s`` and ``speed_ok``; ``posture_ok``, no step below
        the height floor, beyond the tilt or with a body other than a foot touching
        (:func:`strict_metric`'s height_ok, tilt_ok and only_feet_touch together); the gait rules
        of :meth:`gait_parts`; and ``success``, all of them at the episode's end.
        """
        cmd = ts.target[:, 0]
        speed = self.window_speed(ts)
        parts = {"window_speed_m_s": speed, "speed_ok": (speed - cmd).abs() <= self.speed_tolerance * cmd,
                 "posture_ok": ~ts.extra["violation"], **self.gait_parts(ts)}
        parts["success"] = (parts["speed_ok"] & parts["posture_ok"] & parts["steps_ok"] & parts["no_slide_ok"]
                            & (ts.step >= self.horizon))
        return parts

    def success(self, ts: TaskState) -> torch.Tensor:
        if self.command_speed:
            return self.strict_parts(ts)["success"]
        return (self.mean_speed(ts) > self.success_speed) & ~ts.extra["fallen"]


def strict_metric(t, x, z, roll, pitch, other_contact, command: float, base_height: float, window_s: float = 3.0,
                  speed_tolerance: float = 0.2, min_height: float = 0.7, max_tilt: float = 0.5, feet_contact=None,
                  feet_step=None, min_touchdown_rate: float = 1.0, max_foot_slide: float = 0.1,
                  min_swing_s: float = 0.02) -> dict:
    """Judge the velocity-command success of one recorded episode, from plain arrays.

    The arrays may come from the simulator, the stand-in or a bag alike: times ``t`` (s), base
    ``x``, ``z`` (m), ``roll``, ``pitch`` (rad), ``other_contact`` (bool: a body other than a foot
    touching the ground), the commanded forward speed (m/s). Returns the verdict and each of its
    parts.

    With ``feet_contact`` (T, F) bool, each foot on the ground, and ``feet_step`` (T, F) m, the
    horizontal displacement of each foot's lowest point since the sample before
    (:meth:`LocomotionTask.foot_arrays` gives both), the gait rules join the verdict: over the
    window every foot touches down at least ``min_touchdown_rate`` times a second
    (``steps_ok``; a touchdown is a sample in contact after one out of it, the foot having been
    off the ground for at least ``min_swing_s``), and each foot's mean horizontal speed while in
    contact (its displacement over the intervals with the foot in contact at both ends, over
    their time) is below ``max_foot_slide`` m/s (``no_slide_ok``; a foot with no such interval
    does not slide). Without them those rules are not judged.
    """
    import numpy as np

    t, x, z = (np.asarray(a, dtype=np.float64) for a in (t, x, z))
    roll, pitch = np.asarray(roll, dtype=np.float64), np.asarray(pitch, dtype=np.float64)
    other = np.asarray(other_contact, dtype=bool)
    t0 = t[-1] - window_s
    if t[-1] - t[0] < window_s - 1e-9:
        return {"success": False, "reason": f"episode of {t[-1] - t[0]:.2f} s is shorter than the {window_s} s window"}
    i0 = int(np.searchsorted(t, t0 - 1e-9))
    speed = float((x[-1] - x[i0]) / (t[-1] - t[i0]))
    parts = {"window_speed_m_s": speed, "command_m_s": float(command),
             "speed_ok": bool(abs(speed - command) <= speed_tolerance * command),
             "min_height_m": float(z.min()), "height_ok": bool((z >= min_height * base_height).all()),
             "max_tilt_rad": float(max(np.abs(roll).max(), np.abs(pitch).max())),
             "tilt_ok": bool((np.abs(roll) <= max_tilt).all() and (np.abs(pitch) <= max_tilt).all()),
             "only_feet_touch": bool(not other.any())}
    parts["success"] = parts["speed_ok"] and parts["height_ok"] and parts["tilt_ok"] and parts["only_feet_touch"]
    if feet_contact is not None:
        parts.update(gait_rules(t, i0, feet_contact, feet_step, min_touchdown_rate, max_foot_slide, min_swing_s))
        parts["success"] = parts["success"] and parts["steps_ok"] and parts["no_slide_ok"]
    return parts


def gait_rules(t, i0: int, feet_contact, feet_step, min_touchdown_rate: float = 1.0, max_foot_slide: float = 0.1,
               min_swing_s: float = 0.02) -> dict:
    """Apply the gait rules of :func:`strict_metric` over the window from sample ``i0`` to the end.

    Gives ``touchdowns_per_s`` and ``foot_slide_m_s`` per foot (None for a foot never in contact
    over an interval of the window), ``steps_ok`` and ``no_slide_ok``.
    """
    import numpy as np

    t = np.asarray(t, dtype=np.float64)
    c = np.asarray(feet_contact, dtype=bool).reshape(len(t), -1)
    step = np.asarray(feet_step, dtype=np.float64).reshape(c.shape)
    # The first sample of the swing before each sample: one past the foot's last contact (0 if none).
    last_on = np.maximum.accumulate(np.where(c, np.arange(len(t))[:, None], -1), axis=0)
    k = np.arange(i0 + 1, len(t))
    swing = t[k][:, None] - t[last_on[k - 1] + 1]
    down = c[k] & ~c[k - 1] & (swing >= min_swing_s - 1e-9)
    duration = t[-1] - t[i0]
    both = c[k] & c[k - 1]
    dwell = (both * np.diff(t)[k - 1][:, None]).sum(0)
    moved = np.where(both, step[k], 0.0).sum(0)
    slide = [float(d / s) if s > 0 else None for d, s in zip(moved, dwell)]
    return {"touchdowns_per_s": [float(n / duration) for n in down.sum(0)],
            "steps_ok": bool((down.sum(0) >= min_touchdown_rate * duration - 1e-6).all()),
            "foot_slide_m_s": slide,
            "no_slide_ok": bool(all(s is None or s < max_foot_slide for s in slide))}
