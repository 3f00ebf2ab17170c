"""Simulator options (:class:`SimConfig`): every option with its default and unit."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, fields
from typing import Optional, Tuple, Union

from .quadrotor import ConfigError, RotorConfig

ACTUATORS = ("effort", "velocity", "position", "rotor_thrust", "ctbr")
INTEGRATORS = ("semi_implicit", "rk4")

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
    velocity_limits: honour the URDF velocity limits in the drives: the torque
        in the direction of motion fades to zero at the limit and brakes beyond
        it (a torque-speed envelope; needs effort_saturation and an effort
        limit), with the PD and brake terms secant-linearised in the implicit
        step. Light links need substeps of a few ms: after a large command
        jump a joint may overshoot its limit for a control step or two.         False
    velocity_limit_band: width of that fade, as a fraction of the limit (full
        torque below about 1 - 2 x band of it).                                  0.1
    actuator_lag: first-order time constant of the torque, s (0: none).          0.0
    command_delay: whole control steps between an action and its effect.        0
    rotors: RotorConfig (or mapping) for multirotors.                            None

    gravity_compensation: add the joint torques that hold a fixed-base arm
        against gravity, rnea(q, 0, 0), to the actuated joints (as arm
        controllers such as Franka's do), saturated with the command.           False
    implicit_damping: with semi_implicit, integrate the joint-space springs and
        dampers (URDF damping, friction slope, joint limits, actuator kp/kd)
        linearly implicitly, so stiff joint terms on light links stay stable.    True
    servo_iterations: with implicit_damping, corrections per substep of a
        saturated position or velocity servo's implicit gains, each half way to
        the secant of the drive's torque from the substep's start to its
        predicted end (4 is enough for arms at 10 ms substeps; 0: the tangent
        at the start, with which a saturated drive on a light link acts
        explicitly and can oscillate from substep to substep).                   0
    implicit_contact: with implicit_damping, integrate the ground contact's
        normal spring and damper linearly implicitly too (their slopes at each
        touching point, 2 k pen and c pen along the normal, enter the
        solve as per-body blocks, as the friction's damping does), so a light
        foot on the ground stays stable at substeps of a few ms where the
        explicit penalty rings and its gradients grow without bound.            True
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
    velocity_limits: bool = False
    velocity_limit_band: float = 0.1
    actuator_lag: float = 0.0
    command_delay: int = 0
    rotors: Optional[RotorConfig] = None
    gravity_compensation: bool = False
    implicit_damping: bool = True
    servo_iterations: int = 0
    implicit_contact: bool = True
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
        if int(self.servo_iterations) != self.servo_iterations or self.servo_iterations < 0:
            raise ConfigError(f"'servo_iterations' must be an integer >= 0, got {self.servo_iterations}")
        if int(self.command_delay) != self.command_delay or self.command_delay < 0:
            raise ConfigError(f"'command_delay' must be an integer >= 0, got {self.command_delay}")
        for k in ("contact_stiffness", "contact_damping", "friction", "limit_stiffness", "limit_damping",
                  "actuator_lag"):
            if not getattr(self, k) >= 0:
                raise ConfigError(f"'{k}' must be >= 0, got {getattr(self, k)}")
        for k in ("friction_smoothing", "joint_friction_smoothing", "velocity_limit_band"):
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

