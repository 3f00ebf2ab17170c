"""Actuation: the delayed command becomes joint torques (effort, velocity-PD or
position-PD interfaces, as ros2_control's, smoothly saturated at the URDF effort limit and,
with ``velocity_limits``, within a torque-speed envelope that honours the URDF velocity limit,
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
    servo: Optional["Servo"] = None  # a saturated PD servo's linearisation, for servo_slope


class Servo(NamedTuple):
    """What :func:`servo_slope` needs to re-linearise a saturated position or velocity servo."""
    base: torch.Tensor              # (B, na) the drive command's part outside the PD (gravity compensation)
    pd: torch.Tensor                # (B, na) the PD part at the substep's start
    va: torch.Tensor                # (B, na) the actuated joints' speeds there
    torque: torch.Tensor            # (B, na) the saturated torque applied in the substep
    slope: torch.Tensor             # (B, na) the slope in the kd, kp of the Actuation
    brake: Optional[torch.Tensor]   # (B, na) the velocity-limit brake in its kd (velocity_limits), else None


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


def torque_window(sys: System, va: torch.Tensor):
    """(lo, hi, ok): the torques the drives can give at joint speeds ``va`` (N m or N), where ``ok``.

    A drive's torque-speed envelope, as DC-motor actuator models have it (``velocity_limits``):
    the torque pushing further in the direction of motion fades smoothly to zero at the URDF
    velocity limit and turns into braking beyond it, hi = L tanh((v_max - v) / (b v_max)),
    lo = -L tanh((v_max + v) / (b v_max)), with L the effort limit and b ``velocity_limit_band``;
    below about (1 - 2b) v_max the full effort is there. A joint then does not drive itself past
    its speed limit (gravity or a collision may push it there; the drive brakes it back).
    ``ok``: joints with a finite positive effort limit and a velocity limit."""
    lim, vmax = sys.effort_limit, sys.velocity_limit
    ok = torch.isfinite(vmax) & torch.isfinite(lim) & (lim > 0)
    safe_v = torch.where(ok, vmax, torch.ones_like(vmax))
    safe_l = torch.where(ok, lim, torch.ones_like(lim))
    band = sys.config.velocity_limit_band * safe_v
    return -safe_l * torch.tanh((safe_v + va) / band), safe_l * torch.tanh((safe_v - va) / band), ok


def window_damping(sys: System, cmd: torch.Tensor, va: torch.Tensor, tau: torch.Tensor) -> torch.Tensor:
    """The brake's damping for the linearly implicit step, N m s/rad (0 where a joint has no window).

    Inside the limit, -d torque / d va at fixed command (the window's stiffness). Beyond it the
    window has closed on full braking and its tangent is flat, so the secant to the limit is
    used instead, (torque(v) - torque(v*)) / (v - v*) with v* the nearest speed within the
    limit: the implicit step then lands at most on the limit instead of braking past it and
    oscillating (a light joint brakes in a fraction of a substep). ``tau``: saturate(sys, cmd, va)'s
    torque, which the caller has already."""
    lim, vmax = sys.effort_limit, sys.velocity_limit
    lo, hi, ok = torque_window(sys, va)
    safe_v = torch.where(ok, vmax, torch.ones_like(vmax))
    band = sys.config.velocity_limit_band * safe_v
    safe_l = torch.where(ok, lim, torch.ones_like(lim))
    dhi = -(safe_l / band) * (1.0 - (hi / safe_l) ** 2)        # d hi / d v = -(L / B) sech^2
    dlo = -(safe_l / band) * (1.0 - (lo / safe_l) ** 2)
    mid, half = 0.5 * (hi + lo), torch.maximum(0.5 * (hi - lo), 1e-3 * safe_l)
    dmid, dhalf = 0.5 * (dhi + dlo), 0.5 * (dhi - dlo)
    u = (cmd - mid) / half
    th = torch.tanh(u)
    tangent = -(dmid * th * th + dhalf * (th - u * (1.0 - th * th)))
    inside = torch.minimum(torch.maximum(va, -safe_v), safe_v)
    gap = va - inside
    beyond = gap.abs() > 1e-9 * safe_v
    tau_in = saturate(sys, cmd, inside)[0]
    secant = -(tau - tau_in) / torch.where(beyond, gap, torch.ones_like(gap))
    damping = torch.where(beyond, torch.maximum(tangent, secant), tangent)
    return torch.where(ok, damping.clamp_min(0.0), torch.zeros_like(damping))


def saturate(sys: System, cmd: torch.Tensor, va: Optional[torch.Tensor] = None):
    """Smooth saturation of the torque command: (torque, its slope d/dcmd).

    ``L tanh(cmd / L)`` at the URDF effort limit L; with ``velocity_limits`` (and ``va``, the
    joint speeds), ``mid + half tanh((cmd - mid) / half)`` with mid and half the centre and
    half-width of ``torque_window`` (which at rest is L tanh(cmd / L) again)."""
    lim = sys.effort_limit
    finite = torch.isfinite(lim)
    safe = torch.where(finite, lim, torch.ones_like(lim))
    th = torch.tanh(cmd / safe)
    out, slope = torch.where(finite, safe * th, cmd), torch.where(finite, 1.0 - th * th, torch.ones_like(cmd))
    if va is None or not sys.config.velocity_limits:
        return out, slope
    lo, hi, ok = torque_window(sys, va)
    mid = 0.5 * (hi + lo)
    # Far beyond the limit the window closes on -L..-L: a floor on its width keeps the slope finite.
    half = torch.maximum(0.5 * (hi - lo), 1e-3 * torch.where(ok, lim, torch.ones_like(lim)))
    th = torch.tanh((cmd - mid) / half)
    return torch.where(ok, mid + half * th, out), torch.where(ok, 1.0 - th * th, slope)


def servo_slope(sys: System, servo: Servo, va_next: torch.Tensor, h: float):
    """(slope, brake): the saturated servo's linearisation for the implicit gains (kd slope + brake,
    kp slope), given the actuated joints' speeds ``va_next`` (B, na) predicted at the end of the
    substep, as secants of the drive's torque T(c, v) = W(base + pd, v) between the start and that
    end instead of its tangents at the start. slope = (T(c0, v0) - T(c1, v0)) / (pd0 - pd1), with
    pd1 = pd0 - kd (v1 - v0) - h kp v1 for a position servo (the linearly implicit step's own
    prediction of q and v) and pd0 - kd (v1 - v0) for a velocity servo; with velocity_limits,
    brake = -(T(c1, v1) - T(c1, v0)) / (v1 - v0), the torque-speed window's part (else None).
    In the linear range these are the tangents; saturated, they are the average slopes over what
    the substep crosses, so a drive that would flip from full effort one way to full effort the
    other within a substep (a light link behind a strong servo) is integrated implicitly instead
    of overshooting. Iterated, the step solves the drive's nonlinear law at the end of the substep."""
    dv = va_next - servo.va
    dpd = sys.kd * dv
    if sys.config.actuator == "position":
        dpd = dpd + h * sys.kp * va_next
    c1 = servo.base + servo.pd - dpd
    end = saturate(sys, c1, servo.va)[0]
    lim = sys.effort_limit
    scale = torch.where(torch.isfinite(lim), lim, torch.ones_like(lim))
    small = dpd.abs() <= 1e-9 * scale
    slope = torch.where(small, servo.slope, (servo.torque - end) / torch.where(small, torch.ones_like(dpd), dpd))
    if servo.brake is None:
        return slope, None
    vmax = sys.velocity_limit
    still = dv.abs() <= 1e-9 * torch.where(torch.isfinite(vmax), vmax, torch.ones_like(vmax))
    moved = saturate(sys, c1, va_next)[0]
    brake = torch.where(still, servo.brake, -(moved - end) / torch.where(still, torch.ones_like(dv), dv))
    return slope, brake.clamp_min(0.0)


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
    cmd = pd = joint_command(sys, qa, va, command)
    if cfg.gravity_compensation:
        cmd = cmd + gravity[..., idx]
    cmd_in = cmd
    slope = brake = None
    if cfg.effort_saturation:
        total, s = saturate(sys, cmd, va)
        if cfg.velocity_limits:
            brake = window_damping(sys, cmd, va, total)
            if cfg.actuator in ("velocity", "position"):
                # The PD gains enter the implicit step with the secant of the saturated torque over
                # the PD part, (W(c) - W(c - pd)) / pd, not its tangent: a saturated light joint keeps
                # its damping (the tangent is ~0 there, and the explicit full torque overshoots).
                lim = sys.effort_limit
                small = pd.abs() <= 1e-9 * torch.where(torch.isfinite(lim), lim, torch.ones_like(lim))
                without = saturate(sys, cmd - pd, va)[0]
                slope = torch.where(small, s, (total - without) / torch.where(small, torch.ones_like(pd), pd))
        elif cfg.gravity_compensation:
            # The implicit gains take the saturation's slope at the PD part alone (as the
            # MuJoCo stand-in's implicit dof damping does), the torque saturates all of it.
            slope = saturate(sys, pd)[1]
        else:
            slope = s
        cmd = total
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
    if brake is not None and cfg.actuator_lag == 0:
        kd = brake if kd is None else kd + brake
    servo = None
    if (cfg.servo_iterations and cfg.effort_saturation and cfg.actuator in ("velocity", "position")
            and cfg.actuator_lag == 0):
        servo = Servo(cmd_in - pd, pd, va, cmd, slope, brake)
    return Actuation(tau, new, None, kd, kp, servo)
