"""The differentiable simulator step: one pipeline per step, batched, autograd end to end.

    sim = Simulator(model, SimConfig(dt=1e-3))
    state = sim.initial_state(q0, v0)              # or sim.initial_state(batch=64)
    state = sim.step(state, action)                # pure: returns a new State
    traj = sim.rollout(state, policy_or_actions, steps)

Each (sub)step runs, in order:

1. **command**: the action enters the command-delay line; the delayed command is used;
2. **actuation**: the command becomes joint torques (effort, velocity-PD or
   position-PD interfaces, smoothly saturated at the URDF effort limit, through an
   optional first-order lag) or rotor thrusts (per-rotor thrust or CTBR);
3. **passive forces**: URDF joint damping, smoothed Coulomb joint friction, and
   joint limits as a smooth penalty;
4. **contact**: smooth penalty ``lambda_n = k max(0, -gap)^2`` plus damping, and
   regularised Coulomb friction, between collision primitives and the ground
   plane (optionally between sphere primitives of different links);
5. **aerodynamics**: rotor wrench and body drag on a floating base;
6. **acceleration**: the articulated-body algorithm with all of the above;
7. **integration**: semi-implicit Euler or RK4, the base quaternion renormalised.

A non-finite value stops the step with :class:`SimulationError`, naming the
environment and the quantity.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, fields
from typing import Callable, Optional, Sequence, Tuple, Union

import torch

from .algorithms import (_body_placements, _cross, _motion_subspaces, _mv, _solve_spd, _topo, aba_batch_last, crba,
                         kinematics_batch_last, rnea)
from .model import Model
from .quadrotor import ConfigError, RotorConfig, Rotors
from .spatial import cross

ACTUATORS = ("effort", "velocity", "position", "rotor_thrust", "ctbr")
INTEGRATORS = ("semi_implicit", "rk4")


class SimulationError(RuntimeError):
    """A non-finite quantity appeared in a simulation step."""


@dataclass(frozen=True)
class SimConfig:
    """Simulator options. Units SI; every field has its default here.

    dt: control step, s (one ``step`` call).                                    1e-3
    substeps: physics substeps per control step (each dt/substeps).             1
    integrator: "semi_implicit" (symplectic Euler) or "rk4".                     semi_implicit
    gravity: m/s^2, world frame.                                                 (0, 0, -9.81)

    ground: contact with a ground plane.                                         True
    ground_height: m, along ground_normal.                                       0.0
    ground_normal: unit normal of the ground (normalised here).                  (0, 0, 1)
    contact_stiffness: k in lambda_n = k max(0, -gap)^2, N/m^2.                  1e7
    contact_damping: c in lambda_d = -c max(0, -gap) dgap/dt, N s/m^2.          3e4
    friction: Coulomb coefficient mu.                                            0.8
    friction_smoothing: slip speed at which friction reaches 76 % of mu*lambda
        (F_t = -mu lambda v_t / sqrt(|v_t|^2 + eps^2)), m/s.                     0.01
    cylinder_rim_points: contact points per cylinder rim.                        8
    self_collision: penalty contact between sphere primitives of different,
        non-adjacent bodies.                                                     False

    joint_limits: enforce URDF position limits with a smooth penalty.            True
    limit_stiffness: tau = -k pen^2 beyond a limit, N m/rad^2 (N/m^2).           1e6
    limit_damping: tau = -c pen qd into the limit, N m s/rad^2.                  1e3
    joint_damping: apply URDF <dynamics damping>.                                True
    joint_friction: apply URDF <dynamics friction>, smoothed.                    True
    joint_friction_smoothing: velocity scale of the tanh, rad/s or m/s.          0.01

    actuator: command interface: "effort", "velocity", "position" (joints, as
        ros2_control's), "rotor_thrust" (N per rotor) or "ctbr" (collective
        thrust N, body rates rad/s).                                             effort
    actuated_joints: joint names the action drives, in action order
        (default: all joints, in model order).                                   ()
    kp: position gain, N m/rad (scalar or one per actuated joint).               100
    kd: velocity gain, N m s/rad (scalar or one per actuated joint).             10
    effort_saturation: smooth tanh saturation at the URDF effort limit.          True
    actuator_lag: first-order time constant of the torque, s (0: none).          0.0
    command_delay: whole control steps between an action and its effect.        0
    rotors: RotorConfig (or mapping) for multirotors.                            None

    gravity_compensation: add the joint torques that hold a fixed-base arm
        against gravity, rnea(q, 0, 0), to the actuated joints (as arm
        controllers such as Franka's do), saturated with the command.           False
    implicit_damping: with semi_implicit, integrate the joint-space springs and
        dampers (URDF damping, friction slope, joint limits, actuator kp/kd)
        linearly implicitly, so stiff joint terms on light links stay stable.    True
    nan_check: raise SimulationError on a non-finite state.                      True
    """
    dt: float = 1e-3
    substeps: int = 1
    integrator: str = "semi_implicit"
    gravity: Tuple[float, float, float] = (0.0, 0.0, -9.81)
    ground: bool = True
    ground_height: float = 0.0
    ground_normal: Tuple[float, float, float] = (0.0, 0.0, 1.0)
    contact_stiffness: float = 1e7
    contact_damping: float = 3e4
    friction: float = 0.8
    friction_smoothing: float = 0.01
    cylinder_rim_points: int = 8
    self_collision: bool = False
    joint_limits: bool = True
    limit_stiffness: float = 1e6
    limit_damping: float = 1e3
    joint_damping: bool = True
    joint_friction: bool = True
    joint_friction_smoothing: float = 0.01
    actuator: str = "effort"
    actuated_joints: Tuple[str, ...] = ()
    kp: Union[float, Tuple[float, ...]] = 100.0
    kd: Union[float, Tuple[float, ...]] = 10.0
    effort_saturation: bool = True
    actuator_lag: float = 0.0
    command_delay: int = 0
    rotors: Optional[RotorConfig] = None
    gravity_compensation: bool = False
    implicit_damping: bool = True
    nan_check: bool = True

    def __post_init__(self):
        if not self.dt > 0:
            raise ConfigError(f"'dt' must be > 0 s, got {self.dt}")
        if int(self.substeps) != self.substeps or self.substeps < 1:
            raise ConfigError(f"'substeps' must be an integer >= 1, got {self.substeps}")
        if self.integrator not in INTEGRATORS:
            raise ConfigError(f"'integrator' must be one of {INTEGRATORS}, got '{self.integrator}'")
        if self.actuator not in ACTUATORS:
            raise ConfigError(f"'actuator' must be one of {ACTUATORS}, got '{self.actuator}'")
        if int(self.command_delay) != self.command_delay or self.command_delay < 0:
            raise ConfigError(f"'command_delay' must be an integer >= 0, got {self.command_delay}")
        for k in ("contact_stiffness", "contact_damping", "friction", "limit_stiffness", "limit_damping",
                  "actuator_lag"):
            if not getattr(self, k) >= 0:
                raise ConfigError(f"'{k}' must be >= 0, got {getattr(self, k)}")
        for k in ("friction_smoothing", "joint_friction_smoothing"):
            if not getattr(self, k) > 0:
                raise ConfigError(f"'{k}' must be > 0, got {getattr(self, k)}")
        for k in ("gravity", "ground_normal"):
            val = getattr(self, k)
            if len(val) != 3 or not all(isinstance(x, (int, float)) and x == x for x in val):
                raise ConfigError(f"'{k}' must be 3 finite numbers, got {list(val)}")
        if not any(self.ground_normal):
            raise ConfigError("'ground_normal' must be a non-zero vector")
        if int(self.cylinder_rim_points) != self.cylinder_rim_points or self.cylinder_rim_points < 3:
            raise ConfigError(f"'cylinder_rim_points' must be an integer >= 3, got {self.cylinder_rim_points}")
        if isinstance(self.rotors, dict):
            object.__setattr__(self, "rotors", RotorConfig.from_dict(self.rotors))
        if self.actuator in ("rotor_thrust", "ctbr") and self.rotors is None:
            raise ConfigError(f"actuator '{self.actuator}' needs a 'rotors' section")

    @classmethod
    def from_dict(cls, d: dict, where: str = "simulator") -> "SimConfig":
        """Build from a mapping (e.g. a YAML section); unknown keys are an error naming the key."""
        if not isinstance(d, dict):
            raise ConfigError(f"'{where}' must be a mapping, got {type(d).__name__}")
        known = {f.name: f for f in fields(cls)}
        kw = {}
        for k, val in d.items():
            if k not in known:
                raise ConfigError(f"unknown key '{where}.{k}' (known: {', '.join(sorted(known))})")
            if k == "rotors" and val is not None:
                val = RotorConfig.from_dict(val, f"{where}.rotors")
            elif k in ("gravity", "ground_normal"):
                if not isinstance(val, (list, tuple)) or any(isinstance(x, bool) or not isinstance(x, (int, float))
                                                             for x in val):
                    raise ConfigError(f"'{where}.{k}' must be a list of 3 numbers, got {val!r}")
                val = tuple(float(x) for x in val)
            elif k == "actuated_joints":
                if not isinstance(val, (list, tuple)):
                    raise ConfigError(f"'{where}.{k}' must be a list of joint names, got {val!r}")
                val = tuple(str(x) for x in val)
            elif k in ("kp", "kd") and isinstance(val, (list, tuple)):
                val = tuple(float(x) for x in val)
            kw[k] = val
        default = cls()
        for k, val in kw.items():
            ref = getattr(default, k)
            if k in ("kp", "kd") and isinstance(val, tuple):
                continue
            if isinstance(ref, bool) and not isinstance(val, bool):
                raise ConfigError(f"'{where}.{k}' must be true or false, got {val!r}")
            if isinstance(ref, (int, float)) and not isinstance(ref, bool):
                if isinstance(val, bool) or not isinstance(val, (int, float)):
                    raise ConfigError(f"'{where}.{k}' must be a number, got {val!r}")
        return cls(**kw)

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        return d


@dataclass
class State:
    """Simulator state; every tensor has the batch as leading dimension(s).

    q (..., nq), v (..., nv): generalised positions and velocities.
    actuator (..., n_act): actuator internal state (applied torque under a lag, or
        rotor speeds in rad/s for multirotors); None when stateless.
    delay (..., command_delay, n_act): commands waiting in the delay line; None if no delay.
    t (...): time, s.
    """
    q: torch.Tensor
    v: torch.Tensor
    actuator: Optional[torch.Tensor] = None
    delay: Optional[torch.Tensor] = None
    t: Optional[torch.Tensor] = None

    def replace(self, **kw) -> "State":
        return dataclasses.replace(self, **kw)

    def detach(self) -> "State":
        return State(*(None if x is None else x.detach() for x in (self.q, self.v, self.actuator, self.delay, self.t)))


@dataclass
class Trajectory:
    """A rollout: q (T+1, ..., nq), v (T+1, ..., nv), actions (T, ..., n_act), final State."""
    q: torch.Tensor
    v: torch.Tensor
    actions: torch.Tensor
    final: State


class Simulator:
    """Batched differentiable simulator over a :class:`Model`."""

    def __init__(self, model: Model, config: Optional[SimConfig] = None):
        self.config = config = config or SimConfig()
        if isinstance(config, dict):
            self.config = config = SimConfig.from_dict(config)
        g = torch.tensor(config.gravity, dtype=model.dtype, device=model.device)
        self.model = model = model.replace(gravity=g)
        dt, dev = model.dtype, model.device
        n = torch.tensor(config.ground_normal, dtype=dt, device=dev)
        if not torch.linalg.vector_norm(n) > 0:
            raise ConfigError("'ground_normal' must be a non-zero vector")
        self.ground_normal = n / torch.linalg.vector_norm(n)
        self.nbase = 6 if model.floating_base else 0
        # Actuated joints, by name.
        names = list(config.actuated_joints) or list(model.joint_names)
        for nm in names:
            if nm not in model.joint_names:
                raise ConfigError(f"actuated_joints: '{nm}' is not a joint of '{model.name}' "
                                  f"(joints: {', '.join(model.joint_names)})")
        self.actuated_joints = names
        self.act_index = torch.tensor([model.joint_names.index(nm) for nm in names], dtype=torch.long, device=dev)
        self.rotors = Rotors(config.rotors, model) if config.rotors is not None else None
        if config.actuator in ("rotor_thrust", "ctbr"):
            self.action_dim = self.rotors.n if config.actuator == "rotor_thrust" else 4
            self.n_act = self.rotors.n
        else:
            self.action_dim = self.n_act = len(names)
        na = len(names)

        def gains(val, key):
            t = torch.as_tensor(val, dtype=dt, device=dev)
            if t.ndim == 0:
                return t.expand(na).clone()
            if t.shape != (na,):
                raise ConfigError(f"'{key}' has {t.numel()} entries for {na} actuated joints")
            return t
        self.kp, self.kd = gains(config.kp, "kp"), gains(config.kd, "kd")
        self.effort_limit = model.effort_limit[self.act_index]
        self._friction_store = None
        self._build_contact_points()

    # ------------------------------------------------------------ contact set
    def _build_contact_points(self):
        m, cfg = self.model, self.config
        bodies, pts, radii = [], [], []
        for col in m.collisions:
            if col.body < 0:
                continue
            if col.kind == "sphere":
                local = torch.zeros(1, 3, dtype=m.dtype, device=m.device)
                r = col.size[0:1]
            elif col.kind == "box":
                h = col.size / 2
                signs = torch.tensor([[sx, sy, sz] for sx in (-1, 1) for sy in (-1, 1) for sz in (-1, 1)],
                                     dtype=m.dtype, device=m.device)
                local = signs * h
                r = torch.zeros(8, dtype=m.dtype, device=m.device)
            elif col.kind == "cylinder":
                k = cfg.cylinder_rim_points
                ang = torch.arange(k, dtype=m.dtype, device=m.device) * (2 * torch.pi / k)
                rad, half = col.size[0], col.size[1] / 2
                ring = torch.stack((rad * torch.cos(ang), rad * torch.sin(ang)), -1)
                local = torch.cat((torch.cat((ring, -half.expand(k, 1)), -1), torch.cat((ring, half.expand(k, 1)), -1)))
                r = torch.zeros(2 * k, dtype=m.dtype, device=m.device)
            else:
                continue
            pts.append(local @ col.R.T + col.p)
            radii.append(r)
            bodies += [col.body] * local.shape[0]
        if pts:
            self.pt_local = torch.cat(pts)
            self.pt_radius = torch.cat(radii)
        else:
            self.pt_local = torch.zeros(0, 3, dtype=m.dtype, device=m.device)
            self.pt_radius = torch.zeros(0, dtype=m.dtype, device=m.device)
        self.pt_body = torch.tensor(bodies, dtype=torch.long, device=m.device)
        # Sphere pairs for self-collision: different bodies, not parent and child.
        pairs = []
        if cfg.self_collision:
            sph = [i for i in range(len(bodies)) if float(self.pt_radius[i]) > 0]
            for a in range(len(sph)):
                for b in range(a + 1, len(sph)):
                    i, j = sph[a], sph[b]
                    bi, bj = bodies[i], bodies[j]
                    if bi != bj and m.parent[bi] != bj and m.parent[bj] != bi:
                        pairs.append((i, j))
        self.pairs = torch.tensor(pairs, dtype=torch.long, device=m.device).reshape(-1, 2)

    # ------------------------------------------------------------ states
    def initial_state(self, q: Optional[torch.Tensor] = None, v: Optional[torch.Tensor] = None,
                      batch: Sequence[int] = ()) -> State:
        """A state at rest (or at the given q, v); actuators and delay line at hover/zero."""
        m = self.model
        if q is None:
            q = m.neutral_configuration(tuple(batch) if not isinstance(batch, int) else (batch,))
        q = q.to(dtype=m.dtype, device=m.device)
        if v is None:
            v = torch.zeros(q.shape[:-1] + (m.nv,), dtype=m.dtype, device=m.device)
        bshape = q.shape[:-1]
        actuator = None
        if self.rotors is not None:
            hover = (m.mass.sum() * -m.gravity[2]).clamp(min=0) / self.rotors.n
            actuator = self.rotors.speed_for_thrust(hover).expand(bshape + (self.n_act,)).clone()
        elif self.config.actuator_lag > 0:
            actuator = torch.zeros(bshape + (self.n_act,), dtype=m.dtype, device=m.device)
        delay = None
        if self.config.command_delay > 0:
            delay = torch.zeros(bshape + (self.config.command_delay, self.action_dim), dtype=m.dtype,
                                device=m.device)
            if self.config.actuator == "ctbr":
                delay[..., 0] = m.mass.sum() * -m.gravity[2]
            elif self.config.actuator == "rotor_thrust":
                delay[...] = m.mass.sum() * -m.gravity[2] / self.rotors.n
            elif self.config.actuator == "position":
                delay[...] = self.joint_positions(q)[..., self.act_index].unsqueeze(-2)
        t = torch.zeros(bshape, dtype=m.dtype, device=m.device)
        return State(q=q, v=v, actuator=actuator, delay=delay, t=t)

    def joint_positions(self, q: torch.Tensor) -> torch.Tensor:
        return q[..., 7:] if self.model.floating_base else q

    def joint_velocities(self, v: torch.Tensor) -> torch.Tensor:
        return v[..., 6:] if self.model.floating_base else v

    # ------------------------------------------------------------ pipeline stages
    def _actuation(self, q, v, command, act_state, h):
        """Command -> generalised force (..., nv) and the new actuator state."""
        m, cfg = self.model, self.config
        tau = torch.zeros(q.shape[:-1] + (m.nv,), dtype=q.dtype, device=q.device)
        if self.rotors is not None:
            rot = self.rotors
            if cfg.actuator == "ctbr":
                thrust = rot.ctbr_thrusts(command, v[..., 3:6])
            elif cfg.actuator == "rotor_thrust":
                thrust = command
            else:
                thrust = None
            if thrust is not None:
                target = rot.speed_for_thrust(rot.clamp_thrust(thrust))
                if rot.cfg.motor_time_constant > 0:
                    alpha = 1.0 - torch.exp(torch.tensor(-h / rot.cfg.motor_time_constant, dtype=q.dtype))
                    speed = act_state + alpha * (target - act_state)
                else:
                    speed = target
            else:
                speed = act_state
            wrench = rot.wrench(speed) + rot.drag(v[..., 0:6])
            tau = torch.cat((wrench, tau[..., 6:]), -1)
            return tau, speed
        cmd = self._joint_command(q, v, command)
        if cfg.gravity_compensation:
            zero = torch.zeros_like(v)
            cmd = cmd + rnea(m, q, zero, zero)[..., self.nbase:][..., self.act_index]
        if cfg.effort_saturation:
            lim = self.effort_limit
            finite = torch.isfinite(lim)
            safe = torch.where(finite, lim, torch.ones_like(lim))
            cmd = torch.where(finite, safe * torch.tanh(cmd / safe), cmd)
        new_act = act_state
        if cfg.actuator_lag > 0:
            alpha = 1.0 - torch.exp(torch.tensor(-h / cfg.actuator_lag, dtype=q.dtype))
            new_act = act_state + alpha * (cmd - act_state)
            cmd = new_act
        idx = self.act_index + self.nbase
        tau = tau.index_add(-1, idx, cmd)
        return tau, new_act

    def _passive(self, q, v):
        """Joint damping, smoothed Coulomb friction and joint-limit penalty, (..., nv)."""
        m, cfg = self.model, self.config
        qj, vj = self.joint_positions(q), self.joint_velocities(v)
        tau = torch.zeros_like(vj)
        if cfg.joint_damping:
            tau = tau - m.damping * vj
        if cfg.joint_friction:
            tau = tau - m.friction * torch.tanh(vj / cfg.joint_friction_smoothing)
        if cfg.joint_limits:
            pen_u, pen_l = self._limit_penetration(qj)
            tau = tau - cfg.limit_stiffness * (pen_u ** 2 - pen_l ** 2) - cfg.limit_damping * (pen_u + pen_l) * vj
        if self.nbase:
            tau = torch.cat((torch.zeros_like(v[..., :6]), tau), -1)
        return tau

    def contact_forces(self, q: torch.Tensor, v: torch.Tensor):
        """For inspection: contact wrenches per body (..., nb, 6) in the world frame
        about the world origin, and every contact point's gap (..., P) (m, negative
        in penetration) and ground normal force (..., P) (N)."""
        m = self.model
        batch = q.shape[:-1]
        qf, vf = q.reshape(-1, m.nq).T, v.reshape(-1, m.nv).T
        R, p, o, tw = kinematics_batch_last(m, qf, vf)
        info = {}
        w = self._contact_wrench(R, p, o, tw, info)
        F = w[:, 0:3]
        w = torch.cat((F, w[:, 3:6] + _cross(o.expand_as(F), F)), 1)   # about the world origin

        def out(x):
            return x.movedim(-1, 0).reshape(batch + x.shape[:-1])
        P = self.pt_body.numel()
        empty = torch.zeros(P, qf.shape[-1], dtype=q.dtype, device=q.device)
        return out(w), out(info.get("gap", empty)), out(info.get("normal", empty))

    def _contact_wrench(self, R, p, o, tw, info=None):
        """Contact wrenches (nb, 6, B) in world axes about o, from batch-last kinematics
        (see algorithms.aba_batch_last's wrench_fn)."""
        m, cfg = self.model, self.config
        B = R.shape[-1]
        wrench_b = torch.zeros(m.nb, 6, B, dtype=R.dtype, device=R.device)
        P = self.pt_body.numel()
        if P == 0 or not (cfg.ground or len(self.pairs)):
            return wrench_b
        idx = self.pt_body
        x = _mv(R[idx], self.pt_local[..., None]) + p[idx]                  # (P, 3, B), relative to o
        n = self.ground_normal[:, None]                                      # (3, 1)
        r = self.pt_radius[:, None]                                          # (P, 1)
        xc = x - r[..., None] * n                                            # contact point on the surface
        xd = tw[idx, 0:3] + _cross(tw[idx, 3:6], xc)                        # its velocity
        F = torch.zeros_like(x)
        if cfg.ground:
            gap = ((x + o) * n).sum(1) - cfg.ground_height - r              # (P, B)
            vn = (xd * n).sum(1)
            pen = torch.relu(-gap)
            lam = torch.relu(cfg.contact_stiffness * pen ** 2 - cfg.contact_damping * pen * vn)
            vt = xd - vn[:, None] * n
            slip = torch.sqrt((vt ** 2).sum(1, keepdim=True) + cfg.friction_smoothing ** 2)
            # Regularised Coulomb friction F_t = -C v_t with C = mu lambda / sqrt(|v_t|^2 + eps^2).
            # In the semi-implicit integrator C also enters the linearly implicit solve
            # (see _implicit_correction), which keeps the stiff stick regime stable.
            C = (cfg.friction * lam)[:, None] / slip                          # (P, 1, B)
            F = lam[:, None] * n - C * vt
            if self._friction_store is not None:
                self._friction_store.update(C=C[:, 0], xc=xc)
            if info is not None:
                info["gap"], info["normal"] = gap, lam
        wrench = torch.cat((F, _cross(xc, F)), 1)                            # (P, 6, B)
        if len(self.pairs):
            i, j = self.pairs[:, 0], self.pairs[:, 1]
            d = x[i] - x[j]
            dist = torch.sqrt((d ** 2).sum(1) + 1e-12)
            nij = d / dist[:, None]
            pen = torch.relu(r[i] + r[j] - dist)
            xdc = tw[idx, 0:3] + _cross(tw[idx, 3:6], x)                    # sphere-centre velocities
            vrel = ((xdc[i] - xdc[j]) * nij).sum(1)
            lam_p = torch.relu(cfg.contact_stiffness * pen ** 2 - cfg.contact_damping * pen * vrel)
            Fi = lam_p[:, None] * nij
            xm = x[j] + nij * r[j][..., None]
            wi = torch.cat((Fi, _cross(xm, Fi)), 1)
            wrench = wrench.index_add(0, i, wi).index_add(0, j, -wi)
        return wrench_b.index_add(0, idx, wrench)

    def _joint_command(self, q, v, command):
        """The actuated joints' torque command before gravity compensation and saturation."""
        cfg = self.config
        qa = self.joint_positions(q)[..., self.act_index]
        va = self.joint_velocities(v)[..., self.act_index]
        if cfg.actuator == "effort":
            return command
        if cfg.actuator == "velocity":
            return self.kd * (command - va)
        return self.kp * (command - qa) - self.kd * va

    def _saturation_slope(self, q, v, command):
        """d(saturated)/d(command) of the effort saturation at the PD command (1 without it)."""
        if not self.config.effort_saturation:
            return torch.ones_like(self.kd)
        cmd = self._joint_command(q, v, command)
        lim = self.effort_limit
        finite = torch.isfinite(lim)
        safe = torch.where(finite, lim, torch.ones_like(lim))
        return torch.where(finite, 1.0 - torch.tanh(cmd / safe) ** 2, torch.ones_like(cmd))

    def _limit_penetration(self, qj):
        """How far each joint is past its upper and its lower limit (0 inside, or without a limit)."""
        m = self.model
        pen_u = torch.relu(qj - torch.where(torch.isfinite(m.upper), m.upper, qj))
        pen_l = torch.relu(torch.where(torch.isfinite(m.lower), m.lower, qj) - qj)
        return pen_u, pen_l

    def _damping_diag(self, q, v, command):
        """-d(tau)/d(v) of the joint-space torques that depend on each joint's own velocity:
        URDF damping, the local slope of the smoothed Coulomb friction, joint-limit damping and
        the actuator's derivative gain (through the slope of its saturation). (..., nv)."""
        m, cfg = self.model, self.config
        qj, vj = self.joint_positions(q), self.joint_velocities(v)
        D = torch.zeros_like(vj)
        if cfg.joint_damping:
            D = D + m.damping
        if cfg.joint_friction:
            eps = cfg.joint_friction_smoothing
            D = D + m.friction / eps * (1.0 - torch.tanh(vj / eps) ** 2)
        if cfg.joint_limits:
            D = D + cfg.limit_damping * sum(self._limit_penetration(qj))
        if cfg.actuator in ("velocity", "position") and cfg.actuator_lag == 0:
            kd = self.kd * self._saturation_slope(q, v, command)
            D = D.index_add(-1, self.act_index, kd.expand(D.shape[:-1] + kd.shape[-1:]))
        if self.nbase:
            D = torch.cat((torch.zeros_like(v[..., :6]), D), -1)
        return D

    def _stiffness_diag(self, q, v, command):
        """-d(tau)/d(q) of the joint torques that depend on each joint's own position:
        the joint-limit penalty's slope and the position actuator's kp. (..., nv)."""
        cfg = self.config
        qj = self.joint_positions(q)
        K = torch.zeros_like(qj)
        if cfg.joint_limits:
            K = K + 2.0 * cfg.limit_stiffness * sum(self._limit_penetration(qj))
        if cfg.actuator == "position" and cfg.actuator_lag == 0:
            kp = self.kp * self._saturation_slope(q, v, command)
            K = K.index_add(-1, self.act_index, kp.expand(K.shape[:-1] + kp.shape[-1:]))
        if self.nbase:
            K = torch.cat((torch.zeros_like(v[..., :6]), K), -1)
        return K

    def _implicit_correction(self, q, v, command, qdd, h, friction):
        """Linearly implicit Euler for the stiff velocity- and position-dependent forces:
        with D = -d(tau)/d(v) and K = -d(tau)/d(q) of the joint springs and dampers
        (diagonal: damping, friction slope, limits, PD gains) and the contact friction
        F_t = -C v_t at each contact point (J its point Jacobian, P the tangential
        projector), solve (M + h (D + J^T P C P J) + h^2 K) a' = M a - h K v. Stiff
        joint terms on light links and static friction then stay stable at large
        steps (MuJoCo's Euler integrator treats joint damping the same way).
        Costs one CRBA and one SPD solve."""
        m = self.model
        batch = q.shape[:-1]
        M = crba(m, q)
        diag = torch.zeros(batch + (m.nv,), dtype=q.dtype, device=q.device)
        rhs = (M @ qdd[..., None])[..., 0]
        if m.nj:
            D = self._damping_diag(q, v, command)
            K = self._stiffness_diag(q, v, command)
            diag = h * D + h * h * K
            rhs = rhs - h * K * v
        A_bl = (M + torch.diag_embed(diag)).reshape(-1, m.nv, m.nv).permute(1, 2, 0)
        if friction:
            A_bl = A_bl + h * self._friction_matrix(q, friction)
        x = _solve_spd(A_bl, rhs.reshape(-1, m.nv).T)
        return x.T.reshape(batch + (m.nv,))

    def _friction_matrix(self, q, friction):
        """J^T P C P J summed over the contact points, (nv, nv, B) batch-last."""
        m = self.model
        qf = q.reshape(-1, m.nq).T
        Rw, pw = _body_placements(m, qf, relative=True)
        S = _motion_subspaces(m, Rw, pw)                                     # (nv, 6, B) at o
        topo = _topo(m)
        xc, C = friction["xc"], friction["C"]                               # (P, 3, B), (P, B)
        bodies = self.pt_body[friction["points"]]
        # Point Jacobian columns: the velocity that dof d gives the contact point.
        cols = S[None, :, 0:3] + _cross(S[None, :, 3:6], xc[:, None])        # (P, nv, 3, B)
        mask = topo.anc[bodies][:, topo.body_of_dof].to(q.dtype)            # (P, nv)
        J = cols * mask[..., None, None]
        n = self.ground_normal[:, None]
        Jt = J - (J * n).sum(2, keepdim=True) * n                            # tangential part
        # sum_p C_p Jt_p^T Jt_p as one batched matrix product over (point, axis) pairs.
        B = Jt.shape[-1]
        W = Jt.permute(3, 0, 2, 1).reshape(B, -1, m.nv)                                    # (B, 3P, nv)
        WC = (Jt * C[:, None, None]).permute(3, 0, 2, 1).reshape(B, -1, m.nv)
        return (WC.transpose(1, 2) @ W).permute(1, 2, 0)

    def _accel(self, q, v, tau_act):
        m = self.model
        tau = tau_act + self._passive(q, v)
        batch = q.shape[:-1]
        qf, vf, tf = q.reshape(-1, m.nq).T, v.reshape(-1, m.nv).T, tau.reshape(-1, m.nv).T
        qdd = aba_batch_last(m, qf, vf, tf, wrench_fn=self._contact_wrench)
        return qdd.T.reshape(batch + (m.nv,))

    # ------------------------------------------------------------ integration
    def integrate(self, q: torch.Tensor, v: torch.Tensor, h: float) -> torch.Tensor:
        """q (+) v h: joints add; a floating base moves along its body-frame twist
        (position by R v h, orientation by the exact exponential of w h), and its
        quaternion is renormalised (smoothly, so gradients pass)."""
        if not self.model.floating_base:
            return q + v * h
        pos, quat, qj = q[..., 0:3], q[..., 3:7], q[..., 7:]
        pos = pos + _quat_rotate(quat, v[..., 0:3]) * h
        quat = _quat_mul(quat, _quat_exp(v[..., 3:6] * h))
        quat = quat / torch.linalg.vector_norm(quat, dim=-1, keepdim=True)
        return torch.cat((pos, quat, qj + v[..., 6:] * h), -1)

    def _qdot(self, q, v):
        """Time derivative of q (..., nq) for RK4."""
        if not self.model.floating_base:
            return v
        quat = q[..., 3:7]
        pd = _quat_rotate(quat / torch.linalg.vector_norm(quat, dim=-1, keepdim=True), v[..., 0:3])
        w = torch.cat((v[..., 3:6], torch.zeros_like(v[..., 0:1])), -1)
        quatd = 0.5 * _quat_mul(quat, w)
        return torch.cat((pd, quatd, v[..., 6:]), -1)

    def _substep(self, q, v, command, act_state, h):
        tau_act, new_act = self._actuation(q, v, command, act_state, h)
        if self.config.integrator == "semi_implicit":
            self._friction_store = {} if (self.config.implicit_damping and self.config.ground
                                          and self.pt_body.numel() and self.config.friction > 0) else None
            qdd = self._accel(q, v, tau_act)
            friction = self._friction_store
            self._friction_store = None
            if friction:
                # Only the contact points touching in some environment of the batch
                # contribute (C = 0 elsewhere): select them, or drop friction entirely.
                active = torch.nonzero((friction["C"].detach() > 0).any(-1)).flatten()
                friction = None if active.numel() == 0 else {
                    "C": friction["C"][active], "xc": friction["xc"][active], "points": active}
            if self.config.implicit_damping and (self.model.nj > 0 or friction):
                qdd = self._implicit_correction(q, v, command, qdd, h, friction)
            if self.model.floating_base:
                q_new, v_new = self._free_flyer_euler(q, v, qdd, h)
            else:
                v_new = v + qdd * h
                q_new = self.integrate(q, v_new, h)
        else:
            # Actuation (PD, rate loop, drag) is evaluated at every stage from the
            # actuator state at the start of the substep.
            def f(qs, vs):
                tau_s, _ = self._actuation(qs, vs, command, act_state, h)
                return self._qdot(qs, vs), self._accel(qs, vs, tau_s)
            k1q, k1v = self._qdot(q, v), self._accel(q, v, tau_act)
            k2q, k2v = f(q + 0.5 * h * k1q, v + 0.5 * h * k1v)
            k3q, k3v = f(q + 0.5 * h * k2q, v + 0.5 * h * k2v)
            k4q, k4v = f(q + h * k3q, v + h * k3v)
            q_new = q + (h / 6) * (k1q + 2 * k2q + 2 * k3q + k4q)
            v_new = v + (h / 6) * (k1v + 2 * k2v + 2 * k3v + k4v)
            qdd = k1v
            if self.model.floating_base:
                quat = q_new[..., 3:7]
                quat = quat / torch.linalg.vector_norm(quat, dim=-1, keepdim=True)
                q_new = torch.cat((q_new[..., 0:3], quat, q_new[..., 7:]), -1)
        return q_new, v_new, new_act, qdd

    def _free_flyer_euler(self, q, v, qdd, h):
        """Semi-implicit Euler for a floating base whose linear velocity is stored in the
        body frame: the base's linear velocity is advanced in the world frame (so the
        frame's rotation does not pump energy into it, as explicit Euler on the
        -w x v term would), then expressed in the new body frame."""
        quat = q[..., 3:7] / torch.linalg.vector_norm(q[..., 3:7], dim=-1, keepdim=True)
        vl, w = v[..., 0:3], v[..., 3:6]
        acc_world = _quat_rotate(quat, qdd[..., 0:3] + cross(w, vl))       # classical acceleration
        vw_new = _quat_rotate(quat, vl) + h * acc_world
        w_new = w + h * qdd[..., 3:6]
        quat_new = _quat_mul(quat, _quat_exp(w_new * h))
        quat_new = quat_new / torch.linalg.vector_norm(quat_new, dim=-1, keepdim=True)
        conj = torch.cat((-quat_new[..., 0:3], quat_new[..., 3:4]), -1)
        vl_new = _quat_rotate(conj, vw_new)
        vj_new = v[..., 6:] + h * qdd[..., 6:]
        q_new = torch.cat((q[..., 0:3] + h * vw_new, quat_new, q[..., 7:] + h * vj_new), -1)
        return q_new, torch.cat((vl_new, w_new, vj_new), -1)

    # ------------------------------------------------------------ public step
    def step(self, state: State, action: torch.Tensor) -> State:
        """Advance by ``config.dt``: returns a new :class:`State` (the input is not changed)."""
        cfg = self.config
        action = torch.as_tensor(action, dtype=state.q.dtype, device=state.q.device)
        if action.shape[-1] != self.action_dim:
            raise ValueError(f"action has last dimension {action.shape[-1]}, the '{cfg.actuator}' interface "
                             f"of this simulator expects {self.action_dim}")
        action = action.expand(state.q.shape[:-1] + (self.action_dim,))
        delay = state.delay
        if cfg.command_delay > 0:
            command = delay[..., 0, :]
            delay = torch.cat((delay[..., 1:, :], action.unsqueeze(-2)), -2)
        else:
            command = action
        if cfg.nan_check:
            self.check_finite(state, action=action, where="input")
        h = cfg.dt / cfg.substeps
        q, v, act = state.q, state.v, state.actuator
        for _ in range(cfg.substeps):
            q, v, act, qdd = self._substep(q, v, command, act, h)
        t = state.t + cfg.dt if state.t is not None else None
        new = State(q=q, v=v, actuator=act, delay=delay, t=t)
        if cfg.nan_check:
            self.check_finite(new, action=action, qdd=qdd)
        return new

    def check_finite(self, state: State, where: str = "result", **extra: torch.Tensor) -> None:
        """Raise :class:`SimulationError` naming the first environment and quantity that is not finite."""
        items = [("action", extra.get("action")), ("qdd", extra.get("qdd")), ("q", state.q), ("v", state.v),
                 ("actuator state", state.actuator)]
        bad_any = None
        for name, x in items:
            if x is None:
                continue
            ok = torch.isfinite(x).reshape(x.shape[:state.q.ndim - 1] + (-1,)).all(-1)
            bad_any = ~ok if bad_any is None else bad_any | ~ok
        if bad_any is None or not bool(bad_any.any()):
            return
        for name, x in items:
            if x is None:
                continue
            ok = torch.isfinite(x).reshape(x.shape[:state.q.ndim - 1] + (-1,)).all(-1)
            if not bool(ok.all()):
                env = tuple(int(i) for i in torch.nonzero(~ok)[0].tolist())
                cols = torch.nonzero(~torch.isfinite(x[env] if env else x)).flatten().tolist()
                env_txt = "the (unbatched) state" if not env else f"environment {env if len(env) != 1 else env[0]}"
                origin = " of the input state" if where == "input" and name != "action" else ""
                raise SimulationError(
                    f"non-finite {name} in {env_txt}{origin} "
                    f"(entries {cols[:6]}) at t={float(state.t[env]) if state.t is not None else float('nan'):.4f} s; "
                    f"{int((~ok).sum())} of {ok.numel()} environments affected")

    def rollout(self, state: State, actions: Union[torch.Tensor, Callable[[State], torch.Tensor]],
                steps: Optional[int] = None) -> Trajectory:
        """Run ``steps`` steps from ``state`` with an action sequence (T, ..., n_act) or a
        policy ``policy(state) -> action``; returns the stacked trajectory, differentiable."""
        if callable(actions):
            if steps is None:
                raise ValueError("rollout with a policy needs 'steps'")
            policy = actions
        else:
            seq = torch.as_tensor(actions, dtype=state.q.dtype, device=state.q.device)
            steps = seq.shape[0] if steps is None else steps
            if steps > seq.shape[0]:
                raise ValueError(f"asked for {steps} steps but the action sequence has {seq.shape[0]}")
            policy = None
        qs, vs, acts = [state.q], [state.v], []
        for k in range(steps):
            a = policy(state) if policy is not None else seq[k]
            state = self.step(state, a)
            qs.append(state.q)
            vs.append(state.v)
            acts.append(torch.as_tensor(a, dtype=state.q.dtype).expand(state.q.shape[:-1] + (self.action_dim,)))
        actions_out = torch.stack(acts) if acts else torch.zeros((0,) + state.q.shape[:-1] + (self.action_dim,))
        return Trajectory(q=torch.stack(qs), v=torch.stack(vs), actions=actions_out, final=state)


def _quat_mul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Hamilton product of quaternions stored x, y, z, w."""
    ax, ay, az, aw = a.unbind(-1)
    bx, by, bz, bw = b.unbind(-1)
    return torch.stack((
        aw * bx + ax * bw + ay * bz - az * by,
        aw * by - ax * bz + ay * bw + az * bx,
        aw * bz + ax * by - ay * bx + az * bw,
        aw * bw - ax * bx - ay * by - az * bz,
    ), -1)


def _quat_rotate(quat: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """Rotate vectors x (..., 3) by unit quaternions (..., 4) stored x, y, z, w."""
    u, w = quat[..., 0:3], quat[..., 3:4]
    t = 2.0 * cross(u, x)
    return x + w * t + cross(u, t)


def _quat_exp(phi: torch.Tensor) -> torch.Tensor:
    """Unit quaternion (x, y, z, w) of the rotation vector ``phi`` (..., 3), smooth at zero."""
    theta2 = (phi ** 2).sum(-1, keepdim=True)
    theta = torch.sqrt(theta2 + 1e-24)
    half = 0.5 * theta
    # sin(theta/2)/theta with its Taylor series near zero (no 0/0 in value or gradient).
    small = theta2 < 1e-8
    k = torch.where(small, 0.5 - theta2 / 48.0, torch.sin(half) / torch.where(small, torch.ones_like(theta), theta))
    return torch.cat((phi * k, torch.cos(half)), -1)
