"""Actuation: the delayed command becomes joint torques or rotor speeds.

Joint torques come from effort, velocity-PD or position-PD interfaces, as ros2_control's,
smoothly saturated at the URDF effort limit and, with ``velocity_limits``, within a torque-speed
envelope that honours the URDF velocity limit, through an optional first-order lag. Rotor speeds
come from per-rotor thrust or CTBR through the rate loop and mixer, with the motors' first-order
lag.

Vectors are batch-first here: q (B, nq), v (B, nv), command (B, action_dim).
"""
from __future__ import annotations

from typing import NamedTuple, Optional, cast

import torch

from .. import laws
from ..quadrotor import Rotors
from ..system import System


class Actuation(NamedTuple):
    tau: Optional[torch.Tensor]     # (B, nv) joint torques (None for rotors: see speed)
    state: Optional[torch.Tensor]   # (B, n_act) new actuator state (lagged torque, rotor speeds)
    speed: Optional[torch.Tensor]   # (B, n_rotors) rotor speeds acting in this substep
    kd: Optional[torch.Tensor]      # (B, na) -d tau/d v of the actuated joints (for the implicit solve)
    kp: Optional[torch.Tensor]      # (B, na) -d tau/d q
    servo: Optional["Servo"] = None  # a saturated PD servo's linearisation, for servo_slope


def lagged_torque(act: torch.Tensor, kd: Optional[torch.Tensor], kp: Optional[torch.Tensor], dv: torch.Tensor,
                  dq: torch.Tensor) -> torch.Tensor:
    """Return the lagged torque at the end of a linearly implicit substep.

    It is the explicit one ``act`` (B, na) less the implicit terms the solve applied,
    ``kd dv + kp dq`` over the actuated joints' changes of speed and position in the substep
    (kd, kp: the Actuation's, the lag factor inside).
    """
    out = act if kd is None else act - kd * dv
    return out if kp is None else out - kp * dq


class Servo(NamedTuple):
    """What :func:`servo_slope` needs to re-linearise a saturated position or velocity servo."""

    base: torch.Tensor              # (B, na) the drive command's part outside the PD (gravity compensation)
    pd: torch.Tensor                # (B, na) the PD part at the substep's start
    va: torch.Tensor                # (B, na) the actuated joints' speeds there
    torque: torch.Tensor            # (B, na) the saturated torque applied in the substep
    slope: torch.Tensor             # (B, na) the slope in the kd, kp of the Actuation
    brake: Optional[torch.Tensor]   # (B, na) the velocity-limit brake in its kd (velocity_limits), else None


def joint_command(sys: System, qa: torch.Tensor, va: torch.Tensor, command: torch.Tensor) -> torch.Tensor:
    """Return the actuated joints' torque command before gravity compensation and saturation."""
    act = sys.config.actuator
    if act == "effort":
        return command
    if act == "velocity":
        return sys.kd * (command - va)
    return sys.kp * (command - qa) - sys.kd * va


def _window(sys: System):
    """Return the drives' velocity limits and band as the laws take them (limits None: no window)."""
    cfg = sys.config
    return (sys.velocity_limit if cfg.velocity_limits else None), cfg.velocity_limit_band


def torque_window(sys: System, va: torch.Tensor):
    """(lo, hi, ok): the torques the drives can give at joint speeds ``va`` (N m or N), where ``ok``.

    See physics/laws.py, torque_window: the torque-speed envelope of ``velocity_limits``.
    """
    return laws.torque_window(torch, va, sys.effort_limit, sys.velocity_limit, sys.config.velocity_limit_band)


def saturate(sys: System, cmd: torch.Tensor, va: Optional[torch.Tensor] = None):
    """Smooth saturation of the torque command: (torque, its slope d/dcmd).

    As physics/laws.py, saturate: ``L tanh(cmd / L)`` at the URDF effort limit L; with
    ``velocity_limits`` (and ``va``, the joint speeds) inside the drives' torque-speed window.
    """
    vmax, band = _window(sys)
    return laws.saturate(torch, cmd, sys.effort_limit, va, vmax, band)


def servo_slope(sys: System, servo: Servo, va_next: torch.Tensor, h: float):
    """(slope, brake): the saturated servo's linearisation for the implicit gains (kd slope + brake, kp slope).

    Given the actuated joints' speeds ``va_next`` (B, na) predicted at the end of the substep,
    they are secants of the drive's torque between the start and that end instead of its
    tangents at the start (physics/laws.py, servo_secants). A drive that would flip from full
    effort one way to full effort the other within a substep (a light link behind a strong servo)
    is then integrated implicitly instead of overshooting. Iterated, the step solves the drive's
    nonlinear law at the end of the substep.
    """
    vmax, band = _window(sys)
    kp = sys.kp if sys.config.actuator == "position" else None
    return laws.servo_secants(torch, servo.base, servo.pd, servo.va, servo.torque, servo.slope, servo.brake,
                              va_next, sys.kd, kp, h, sys.effort_limit, vmax, band)


def rotor_speeds(sys: System, v: torch.Tensor, command: torch.Tensor, act_state: Optional[torch.Tensor], h: float):
    """Rotor speeds (B, n) after this substep's motor response, and the new actuator state."""
    rot, act = cast(Rotors, sys.rotors), sys.config.actuator            # a system with rotors
    if act == "ctbr":
        thrust = rot.ctbr_thrusts(command, v[..., 3:6])
    elif act == "rotor_thrust":
        thrust = command
    else:
        return act_state, act_state
    target = rot.speed_for_thrust(rot.clamp_thrust(thrust))
    if rot.has_motor_lag:
        speed = laws.first_order_lag(torch, act_state, target, h, rot.motor_time_constant)
    else:
        speed = target
    return speed, speed


def actuation(sys: System, q: torch.Tensor, v: torch.Tensor, command: torch.Tensor,
              act_state: Optional[torch.Tensor], h: float, gravity: Optional[torch.Tensor] = None) -> Actuation:
    """Command -> actuator output.

    ``gravity`` (B, nj): the controller's gravity torques of the joints (rnea of the nominal
    model at rest), needed with gravity_compensation.
    """
    cfg = sys.config
    if sys.rotors is not None:
        speed, new = rotor_speeds(sys, v, command, act_state, h)
        return Actuation(None, new, speed, None, None)
    nb = sys.nbase
    idx = sys.act_index
    qa, va = q[..., (7 if nb else 0):][..., idx], v[..., nb:][..., idx]   # q holds 7 base coordinates, v 6
    cmd = pd = joint_command(sys, qa, va, command)
    if cfg.gravity_compensation and gravity is not None:   # None: no joints (_forces), nothing to hold
        cmd = cmd + gravity[..., idx]
    cmd_in = cmd
    slope = brake = None
    if cfg.effort_saturation:
        vmax, band = _window(sys)
        cmd, slope, brake = laws.drive(torch, cmd, pd, va, sys.effort_limit, vmax, band,
                                       servo=cfg.actuator in ("velocity", "position"),
                                       pd_slope=cfg.gravity_compensation)
    new = act_state
    lagged = cfg.actuator_lag > 0
    if lagged:
        new = laws.first_order_lag(torch, act_state, cmd, h, sys.actuator_lag)
        cmd = new
    tau = torch.zeros_like(v).index_add(-1, idx + nb, cmd)
    kd = kp = None
    if cfg.actuator in ("velocity", "position"):
        kd = sys.kd if slope is None else sys.kd * slope
        if cfg.actuator == "position":
            kp = sys.kp if slope is None else sys.kp * slope
    if brake is not None:
        kd = brake if kd is None else kd + brake
    if lagged and kd is not None:
        # The lag moves the torque a fraction a of the way to the drive's command, so the torque's
        # slopes in v and q are a times the drive's: integrated implicitly as the unlagged servo's
        # (a -> 1 as the lag -> 0), and the lagged torque kept at the substep's end (lagged_torque).
        a = laws.lag_factor(torch, h, sys.actuator_lag)
        kd = a * kd
        kp = None if kp is None else a * kp
    servo = None
    if (cfg.servo_iterations and cfg.effort_saturation and cfg.actuator in ("velocity", "position")
            and cfg.actuator_lag == 0):
        servo = Servo(cmd_in - pd, pd, va, cmd, cast(torch.Tensor, slope), brake)   # a servo's drive has a slope
    return Actuation(tau, new, None, kd, kp, servo)
