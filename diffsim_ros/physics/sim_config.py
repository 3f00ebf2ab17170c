"""Simulator options (:class:`SimConfig`): every option with its default and unit."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Optional, Tuple, Union

from .quadrotor import RotorConfig
from ..schema import ConfigError, normalise, option, section

ACTUATORS = ("effort", "velocity", "position", "rotor_thrust", "ctbr")
INTEGRATORS = ("semi_implicit", "rk4")
CONTACT_MODELS = ("penalty", "soft")

@section("simulator")
@dataclass(frozen=True)
class SimConfig:
    """Simulator options.

    Units SI; every field has its documentation, unit, range and default here in the schema's
    terms (:mod:`diffsim_ros.schema`), listed below and in doc/parameters.md.
    """

    dt: float = option(1e-3, "control step (one step call)", "s", above=0)
    substeps: int = option(1, "physics substeps per control step (each dt/substeps)", low=1)
    integrator: str = option("semi_implicit", "semi_implicit (symplectic Euler) or rk4", choices=INTEGRATORS)
    gravity: Tuple[float, float, float] = option((0.0, 0.0, -9.81), "gravity, world frame", "m/s^2")

    ground: bool = option(True, "contact with a ground plane")
    ground_height: float = option(0.0, "height of the ground along ground_normal", "m")
    ground_normal: Tuple[float, float, float] = option((0.0, 0.0, 1.0), "unit normal of the ground (normalised "
                                                      "here; not zero)")
    contact_stiffness: float = option(1e7, "k in lambda_n = k max(0, -gap)^2", "N/m^2", low=0)
    contact_damping: float = option(3e4, "c in lambda_d = -c max(0, -gap) dgap/dt", "N s/m^2", low=0)
    contact_model: str = option("penalty", """ground contact law: penalty (the seed paper's lambda_n = k
        max(0, -gap)^2 with damping: contact_stiffness, contact_damping) or soft (MuJoCo's regularised
        constraint with its elliptic friction cone, impratio 100 as the stand-in's: each touching point's
        normal acceleration is pulled towards -b dgap/dt - k d gap with k = 1/(w^2 tc^2 zeta^2), b = 2/(w tc),
        w the impedance's end value, tc contact_time_constant, zeta contact_damping_ratio, d the impedance at
        this penetration, its tangential ones towards -b v_t, and the step minimises MuJoCo's cost of the
        cone by Newton's method; its force scales with the effective mass of the touching body, so one
        setting describes a light foot and a heavy base alike; friction_smoothing does not apply; needs the
        semi_implicit integrator). Contact between the robot's own bodies
        stays penalty""",
                               choices=CONTACT_MODELS)
    contact_time_constant: float = option(0.02, """soft contact: time constant tc of the penetration's
        response (MuJoCo's solref[0]; at least two physics steps)""", "s", above=0)
    contact_damping_ratio: float = option(1.0, "soft contact: damping ratio zeta (MuJoCo's solref[1]; 1 critical)",
                                          above=0)
    contact_impedance: Tuple[float, float, float, float, float] = option(
        (0.9, 0.95, 0.001, 0.5, 2.0), """soft contact: impedance d(penetration) as MuJoCo's solimp (d at contact,
        d at full width, the width in m, the midpoint and power of the curve between): the share of the
        reference acceleration the contact enforces""")
    friction: float = option(0.8, "Coulomb coefficient mu of the ground contact", low=0)
    friction_smoothing: float = option(0.01, "slip speed at which friction reaches 71 % of mu lambda "
                                       "(F_t = -mu lambda v_t / sqrt(|v_t|^2 + eps^2))", "m/s", above=0)
    cylinder_rim_points: int = option(8, "contact points per cylinder rim", low=3)
    self_collision: bool = option(False, "penalty contact between sphere primitives of different, non-adjacent "
                                  "bodies")

    joint_limits: bool = option(True, "enforce the URDF position limits with a smooth penalty")
    limit_stiffness: float = option(1e6, "tau = -k pen^2 beyond a limit", "N m/rad^2 (N/m^2)", low=0)
    limit_damping: float = option(1e3, "tau = -c pen qd into the limit", "N m s/rad^2", low=0)
    joint_damping: bool = option(True, "apply the URDF <dynamics damping>")
    joint_friction: bool = option(True, "apply the URDF <dynamics friction>, smoothed")
    joint_friction_smoothing: float = option(0.01, "velocity scale of the friction's tanh", "rad/s or m/s",
                                             above=0)

    actuator: str = option("effort", "command interface: effort, velocity, position (joints, as ros2_control's), "
                           "rotor_thrust (N per rotor) or ctbr (collective thrust N, body rates rad/s)",
                           choices=ACTUATORS)
    actuated_joints: Tuple[str, ...] = option((), "joint names the action drives, in action order (empty: all "
                                              "joints, in model order)")
    kp: Union[float, Tuple[float, ...]] = option(100.0, "position gain (one number or one per actuated joint)",
                                                 "N m/rad", low=0)
    kd: Union[float, Tuple[float, ...]] = option(10.0, "velocity gain (one number or one per actuated joint)",
                                                 "N m s/rad", low=0)
    effort_saturation: bool = option(True, "smooth tanh saturation at the URDF effort limit")
    velocity_limits: bool = option(False, """honour the URDF velocity limits in the drives: the torque in the
        direction of motion fades to zero at the limit and brakes beyond it (a torque-speed envelope; needs
        effort_saturation and an effort limit), with the PD and brake terms secant-linearised in the implicit
        step. Light links need substeps of a few ms: after a large command jump a joint may overshoot its
        limit for a control step or two""")
    velocity_limit_band: float = option(0.1, "width of that fade, as a fraction of the limit (full torque below "
                                        "about 1 - 2 x band of it)", above=0)
    actuator_lag: float = option(0.0, "first-order time constant of the torque (0: none)", "s", low=0)
    command_delay: int = option(0, "whole control steps between an action and its effect", low=0)
    max_latency: int = option(0, """largest per-environment command latency on top of command_delay, in physics
        substeps (dt / substeps): each environment's own latency is State.latency (0 to max_latency substeps, a
        tensor over the batch, an input of the step as the state is), so one batch holds episodes of different
        latencies (domain randomisation). During the first L substeps of a control step an environment of latency
        L still applies the earlier command, as a robot whose command arrives L substeps late. 0: no such
        latency (State.latency is None)""", "substeps", low=0)
    rotors: Optional[RotorConfig] = option(None, "rotor layout and aerodynamics of a multirotor")

    gravity_compensation: bool = option(False, """add the joint torques that hold a fixed-base arm against
        gravity, rnea(q, 0, 0), to the actuated joints (as arm controllers such as Franka's do), saturated with
        the command""")
    implicit_damping: bool = option(True, """with semi_implicit, integrate the joint-space springs and dampers
        (URDF damping, friction slope, joint limits, actuator kp/kd) linearly implicitly, so stiff joint terms
        on light links stay stable""")
    servo_iterations: int = option(0, """with implicit_damping, corrections per substep of a saturated position
        or velocity servo's implicit gains, each half way to the secant of the drive's torque from the substep's
        start to its predicted end (4 is enough for arms at 10 ms substeps; 0: the tangent at the start, with
        which a saturated drive on a light link acts explicitly and can oscillate from substep to substep)""",
                                   low=0)
    implicit_contact: bool = option(True, """with implicit_damping, integrate the ground contact's normal spring
        and damper linearly implicitly too (their slopes at each touching point, 2 k pen and c pen along the
        normal, enter the solve as per-body blocks, as the friction's damping does), so a light foot on the
        ground stays stable at substeps of a few ms where the explicit penalty rings and its gradients grow
        without bound""")
    nan_check: bool = option(True, "raise SimulationError on a non-finite state")

    def __post_init__(self):
        normalise(self)

    def check(self) -> None:
        """Check the rules between fields (relative key paths)."""
        if not any(self.ground_normal):
            raise ConfigError("must be a non-zero vector", "ground_normal")
        if self.contact_model == "soft" and self.integrator != "semi_implicit":
            raise ConfigError("is 'soft', which needs integrator: semi_implicit", "contact_model")
        d0, d1, width, mid, power = self.contact_impedance
        if not (0 < d0 < 1 and 0 < d1 < 1 and width > 0 and 0 < mid < 1 and power >= 1):
            raise ConfigError("must be [d0, d1, width, midpoint, power] with d0 and d1 in (0, 1), width > 0, "
                              "midpoint in (0, 1) and power >= 1", "contact_impedance")
        if self.actuator in ("rotor_thrust", "ctbr") and self.rotors is None:
            raise ConfigError(f"is '{self.actuator}', which needs a 'rotors' section", "actuator")

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)
