"""Actuation: the delayed command becomes joint torques (effort, velocity-PD or
position-PD interfaces, as ros2_control's, smoothly saturated at the URDF effort limit,
through an optional first-order lag) or rotor speeds (per-rotor thrust or CTBR through
the rate loop and mixer, with the motors' first-order lag).

Vectors are batch-first here: q (B, nq), v (B, nv), command (B, action_dim).
"""
from __future__ import annotations

from typing import NamedTuple, Optional

import torch

from ..system import System


class Actuation(NamedTuple):
    tau: Optional[torch.Tensor]     # (B, nv) joint torques (None for rotors: see speed)
    state: Optional[torch.Tensor]   # (B, n_act) new actuator state (lagged torque, rotor speeds)
    speed: Optional[torch.Tensor]   # (B, n_rotors) rotor speeds acting in this substep
    kd: Optional[torch.Tensor]      # (B, na) -d tau/d v of the actuated joints (for the implicit solve)
    kp: Optional[torch.Tensor]      # (B, na) -d tau/d q


def lag_factor(h: float, tau: torch.Tensor) -> torch.Tensor:
    """Fraction of the way a first-order lag of time constant tau moves in h: 1 - exp(-h/tau)."""
    return -torch.expm1(-h / tau)


def joint_command(sys: System, qa: torch.Tensor, va: torch.Tensor, command: torch.Tensor) -> torch.Tensor:
    """The actuated joints' torque command before gravity compensation and saturation."""
    act = sys.config.actuator
    if act == "effort":
        return command
    if act == "velocity":
        return sys.kd * (command - va)
    return sys.kp * (command - qa) - sys.kd * va


def saturate(sys: System, cmd: torch.Tensor):
    """Smooth tanh saturation at the URDF effort limit: (torque, its slope d/dcmd)."""
    lim = sys.effort_limit
    finite = torch.isfinite(lim)
    safe = torch.where(finite, lim, torch.ones_like(lim))
    th = torch.tanh(cmd / safe)
    return torch.where(finite, safe * th, cmd), torch.where(finite, 1.0 - th * th, torch.ones_like(cmd))


def rotor_speeds(sys: System, v: torch.Tensor, command: torch.Tensor, act_state: torch.Tensor, h: float):
    """Rotor speeds (B, n) after this substep's motor response, and the new actuator state."""
    rot, act = sys.rotors, sys.config.actuator
    if act == "ctbr":
        thrust = rot.ctbr_thrusts(command, v[..., 3:6])
    elif act == "rotor_thrust":
        thrust = command
    else:
        return act_state, act_state
    target = rot.speed_for_thrust(rot.clamp_thrust(thrust))
    if rot.has_motor_lag:
        speed = act_state + lag_factor(h, rot.motor_time_constant) * (target - act_state)
    else:
        speed = target
    return speed, speed


def actuation(sys: System, q: torch.Tensor, v: torch.Tensor, command: torch.Tensor,
              act_state: Optional[torch.Tensor], h: float, gravity: Optional[torch.Tensor] = None) -> Actuation:
    """Command -> actuator output. ``gravity`` (B, nj): the controller's gravity torques
    of the joints (rnea of the nominal model at rest), needed with gravity_compensation."""
    cfg = sys.config
    if sys.rotors is not None:
        speed, new = rotor_speeds(sys, v, command, act_state, h)
        return Actuation(None, new, speed, None, None)
    nb = sys.nbase
    idx = sys.act_index
    qa, va = q[..., (7 if nb else 0):][..., idx], v[..., nb:][..., idx]   # q holds 7 base coordinates, v 6
    cmd = joint_command(sys, qa, va, command)
    slope = None
    if cfg.gravity_compensation:
        if cfg.effort_saturation:
            # The implicit gains take the saturation's slope at the PD part alone (as the
            # MuJoCo stand-in's implicit dof damping does), the torque saturates all of it.
            slope = saturate(sys, cmd)[1]
        cmd = cmd + gravity[..., idx]
    if cfg.effort_saturation:
        cmd, s = saturate(sys, cmd)
        slope = s if slope is None else slope
    new = act_state
    if cfg.actuator_lag > 0:
        new = act_state + lag_factor(h, sys.actuator_lag) * (cmd - act_state)
        cmd = new
    tau = torch.zeros_like(v).index_add(-1, idx + nb, cmd)
    kd = kp = None
    if cfg.actuator in ("velocity", "position") and cfg.actuator_lag == 0:
        kd = sys.kd if slope is None else sys.kd * slope
        if cfg.actuator == "position":
            kp = sys.kp if slope is None else sys.kp * slope
    return Actuation(tau, new, None, kd, kp)
