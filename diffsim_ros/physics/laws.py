"""The actuator, mixer and friction laws, written once for the simulator and the stand-in.

Every function takes the array namespace first: ``xp`` is the module ``torch`` (the
simulator: differentiable, batched, compiled by torch.compile without graph breaks) or
``numpy`` (the MuJoCo stand-in's firmware: its real-time path never dispatches to torch).
Parameters (gains, limits, coefficients) stay where they are kept (``System``, ``Rotors``,
``MujocoPlant``, ``FlightController``); only the math lives here. Arrays broadcast, with
leading batch dimensions; python floats may stand for any parameter.

Joint drives (the smooth saturation of a torque command u at the URDF effort limit L, and
with ``velocity_limits`` the drive's torque-speed window at the URDF velocity limit v_max):

    effort_saturation(xp, u, lim)                    -> (L tanh(u / L), slope d/du)
    torque_window(xp, va, lim, vmax, band)           -> (lo, hi, ok)
    saturate(xp, u, lim, va=None, vmax=None, band)   -> (torque, slope)  (vmax None: no window)
    window_brake(xp, u, va, torque, lim, vmax, band) -> the window's damping -d torque/d v
    secant(xp, f0, f1, dx, tangent, scale)           -> (f0 - f1) / dx, tangent where dx ~ 0
    drive(xp, u, pd, va, lim, vmax, band, servo, pd_slope) -> (torque, slope, brake)
    servo_secants(xp, base, pd, va, torque, slope, brake, va_next, kd, kp, h, lim, vmax, band)
    lag_factor(xp, h, tau), first_order_lag(xp, state, target, h, tau)

Smoothed Coulomb friction: ``tanh_ratio(xp, x)``, ``coulomb_friction(xp, v, f, eps)``.

Multirotors (rotors push along body +z; ``directions`` as physics/quadrotor.py):

    allocation(xp, positions, directions, kf, km)    -> A, [F_z; M_x; M_y; M_z] = A @ thrusts
    ctbr_wrench(xp, command, omega, rate_gain, inertia), ctbr_thrusts(..., allocation_pinv)
    clamp_thrust(xp, thrust, max_thrust), speed_for_thrust(xp, thrust, kf)
    rotor_thrusts(xp, speed, kf, scale), drag_force(xp, v_com, linear, quadratic)

Where numpy and torch differ, a two-line adapter picks the call (``softplus``: torch's
returns x itself above beta x = 20, numpy's is logaddexp there, a difference below
exp(-20) / beta; ``cross``; ``clamp_min``). Nothing here imports torch.
"""
from __future__ import annotations

import numpy as np

EPS_SCALE = 1e-9       # a secant's step below this fraction of its scale counts as zero
MIN_HALF_WIDTH = 1e-3  # the torque window's half-width floor, as a fraction of the effort limit


# ----------------------------------------------------------------------------- adapters
def softplus(xp, x, beta: float):
    """log(1 + exp(beta x)) / beta."""
    if xp is np:
        return np.logaddexp(0.0, beta * x) / beta
    return xp.nn.functional.softplus(x, beta)


_NEXT, _PREV = np.array([1, 2, 0]), np.array([2, 0, 1])


def cross(xp, a, b):
    """Cross product of (..., 3) vectors, broadcast.

    NumPy's is np.cross's arithmetic (the same values) by two gathers, a third of its overhead on
    3-vectors.
    """
    if xp is np:
        return a[..., _NEXT] * b[..., _PREV] - a[..., _PREV] * b[..., _NEXT]
    return xp.linalg.cross(*xp.broadcast_tensors(a, b), dim=-1)


def clamp_min(xp, x, lo: float):
    """max(x, lo) with torch's clamp_min gradient (1 where x >= lo)."""
    if xp is np:
        return np.maximum(x, lo)
    return x.clamp_min(lo)


def limit_scale(xp, x):
    """Return x where it is a limit (finite and positive), else 1: the scale of a limit that may be absent."""
    return xp.where(xp.isfinite(x) & (x > 0), x, 1.0)


# ----------------------------------------------------------------------------- first-order lags
def lag_factor(xp, h: float, tau):
    """Fraction of the way a first-order lag of time constant tau moves in h: 1 - exp(-h/tau)."""
    return -xp.expm1(-h / tau)


def first_order_lag(xp, state, target, h: float, tau):
    """Return the exact discretisation of state' = (target - state) / tau over h (target held)."""
    return state + lag_factor(xp, h, tau) * (target - state)


# ----------------------------------------------------------------------------- joint drives
def effort_saturation(xp, u, lim):
    """(torque, slope d/du) of the effort limit.

    The torque is ``L tanh(u / L)`` where L is finite and positive, ``u`` elsewhere (an infinite,
    zero or missing limit: URDF's none given).
    """
    ok = xp.isfinite(lim) & (lim > 0)
    safe = xp.where(ok, lim, 1.0)
    th = xp.tanh(u / safe)
    return xp.where(ok, safe * th, u), xp.where(ok, 1.0 - th * th, 1.0)


def _window(xp, va, lim, vmax, band: float):
    """Return the torque-speed window's parts: lo, hi, ok, and the safe L, v_max and band width."""
    ok = xp.isfinite(vmax) & xp.isfinite(lim) & (lim > 0)
    safe_v = xp.where(ok, vmax, 1.0)
    safe_l = xp.where(ok, lim, 1.0)
    width = band * safe_v
    lo = -safe_l * xp.tanh((safe_v + va) / width)
    hi = safe_l * xp.tanh((safe_v - va) / width)
    return lo, hi, ok, safe_l, safe_v, width


def torque_window(xp, va, lim, vmax, band: float):
    """(lo, hi, ok): the torques the drives can give at joint speeds ``va`` (N m or N), where ``ok``.

    A drive's torque-speed envelope, as DC-motor actuator models have it: the torque pushing
    further in the direction of motion fades smoothly to zero at the velocity limit and turns
    into braking beyond it, hi = L tanh((v_max - v) / (b v_max)), lo = -L tanh((v_max + v) / (b v_max)),
    with L the effort limit and b the band (``velocity_limit_band``); below about (1 - 2b) v_max the
    full effort is there. A joint then does not drive itself past its speed limit (gravity or a
    collision may push it there; the drive brakes it back). ``ok``: joints with a finite positive
    effort limit and a velocity limit.
    """
    return _window(xp, va, lim, vmax, band)[:3]


def _mid_half(xp, lo, hi, safe_l):
    """Return the window's centre and half-width.

    Far beyond the limit the window closes on -L..-L, and a floor on its width keeps the slope
    finite.
    """
    return 0.5 * (hi + lo), xp.maximum(0.5 * (hi - lo), MIN_HALF_WIDTH * safe_l)


def saturate(xp, u, lim, va=None, vmax=None, band: float = 0.1):
    """Smooth saturation of the torque command ``u``: (torque, its slope d/du).

    ``L tanh(u / L)`` at the effort limit L; with a window (``va`` the joint speeds and ``vmax``
    the velocity limits; None: none), ``mid + half tanh((u - mid) / half)`` with mid and half the
    centre and half-width of :func:`torque_window` (which at rest is L tanh(u / L) again).
    """
    out, slope = effort_saturation(xp, u, lim)
    if va is None or vmax is None:
        return out, slope
    lo, hi, ok, safe_l, _, _ = _window(xp, va, lim, vmax, band)
    mid, half = _mid_half(xp, lo, hi, safe_l)
    th = xp.tanh((u - mid) / half)
    return xp.where(ok, mid + half * th, out), xp.where(ok, 1.0 - th * th, slope)


def window_brake(xp, u, va, torque, lim, vmax, band: float):
    """Return the window's damping for the linearly implicit step, N m s/rad (0 where a joint has none).

    Inside the limit, -d torque / d va at fixed command (the window's stiffness). Beyond it the
    window has closed on full braking and its tangent is flat, so the secant to the limit is
    used instead, (torque(v) - torque(v*)) / (v - v*) with v* the nearest speed within the
    limit: the implicit step then lands at most on the limit instead of braking past it and
    oscillating (a light joint brakes in a fraction of a substep). ``torque``:
    saturate(xp, u, lim, va, vmax, band)'s, which the caller has already.
    """
    lo, hi, ok, safe_l, safe_v, width = _window(xp, va, lim, vmax, band)
    dhi = -(safe_l / width) * (1.0 - (hi / safe_l) ** 2)        # d hi / d v = -(L / B) sech^2
    dlo = -(safe_l / width) * (1.0 - (lo / safe_l) ** 2)
    mid, half = _mid_half(xp, lo, hi, safe_l)
    dmid, dhalf = 0.5 * (dhi + dlo), 0.5 * (dhi - dlo)
    x = (u - mid) / half
    th = xp.tanh(x)
    tangent = -(dmid * th * th + dhalf * (th - x * (1.0 - th * th)))
    inside = xp.minimum(xp.maximum(va, -safe_v), safe_v)
    gap = va - inside
    beyond = xp.abs(gap) > EPS_SCALE * safe_v
    tau_in = saturate(xp, u, lim, inside, vmax, band)[0]
    chord = -(torque - tau_in) / xp.where(beyond, gap, 1.0)
    damping = xp.where(beyond, xp.maximum(tangent, chord), tangent)
    return xp.where(ok, clamp_min(xp, damping, 0.0), 0.0)


def secant(xp, f0, f1, dx, tangent, scale):
    """Return the secant slope (f0 - f1) / dx, or ``tangent`` where |dx| <= 1e-9 ``scale``."""
    small = xp.abs(dx) <= EPS_SCALE * scale
    return xp.where(small, tangent, (f0 - f1) / xp.where(small, 1.0, dx))


def drive(xp, u, pd, va, lim, vmax=None, band: float = 0.1, servo: bool = False, pd_slope: bool = False):
    """Return a drive's saturated torque and its linearisation for the implicit step: (torque, slope, brake).

    ``u``: the torque command (the PD part ``pd`` plus any gravity compensation), ``va`` the
    joint speeds, ``vmax`` the velocity limits (None: no torque-speed window). slope: the
    factor on the PD gains, None for 1; brake: the window's damping (:func:`window_brake`),
    None without a window. With a window and a PD servo (``servo``) the slope is the secant
    of the saturated torque over the PD part, (W(u) - W(u - pd)) / pd, not its tangent: a
    saturated light joint keeps its damping (the tangent is ~0 there, and the explicit full
    torque overshoots). Without a window and with gravity compensation (``pd_slope``) the
    slope is the saturation's at the PD part alone (the torque saturates all of u).
    """
    torque, tangent = saturate(xp, u, lim, va, vmax, band)
    if vmax is not None:
        brake = window_brake(xp, u, va, torque, lim, vmax, band)
        slope = None
        if servo:
            without = saturate(xp, u - pd, lim, va, vmax, band)[0]
            slope = secant(xp, torque, without, pd, tangent, limit_scale(xp, lim))
        return torque, slope, brake
    if pd_slope:
        return torque, effort_saturation(xp, pd, lim)[1], None
    return torque, tangent, None


def servo_secants(xp, base, pd, va, torque, slope, brake, va_next, kd, kp, h: float, lim, vmax=None,
                  band: float = 0.1):
    """(slope, brake): a saturated servo's linearisation for the implicit gains (kd slope + brake, kp slope).

    Given the joint speeds ``va_next`` predicted at the end of the substep, they are secants of the
    drive's torque T(c, v) = W(base + pd, v) between the start and that end instead of its
    tangents at the start. ``base``, ``pd``, ``va``, ``torque``, ``slope``, ``brake``: the drive at
    the start (:func:`drive`; ``base`` the command outside the PD part). slope = (T(c0, v0) -
    T(c1, v0)) / (pd0 - pd1), with pd1 = pd0 - kd (v1 - v0) - h kp v1 for a position servo (the
    linearly implicit step's own prediction of q and v) and pd0 - kd (v1 - v0) for a velocity
    servo (``kp`` None); with a window (``brake`` not None), brake = -(T(c1, v1) - T(c1, v0)) /
    (v1 - v0), the window's part (else None). In the linear range these are the tangents;
    saturated, they are the average slopes over what the substep crosses.
    """
    dv = va_next - va
    dpd = kd * dv
    if kp is not None:
        dpd = dpd + h * kp * va_next
    c1 = base + pd - dpd
    end = saturate(xp, c1, lim, va, vmax, band)[0]
    new_slope = secant(xp, torque, end, dpd, slope, limit_scale(xp, lim))
    if brake is None:
        return new_slope, None
    moved = saturate(xp, c1, lim, va_next, vmax, band)[0]
    return new_slope, clamp_min(xp, secant(xp, end, moved, dv, brake, limit_scale(xp, vmax)), 0.0)


def relaxed(old, new):
    """One relaxed step of the servo iterations (SimConfig.servo_iterations).

    It goes half way from the current linearisation to the new secants, so that the iteration
    settles where a plain one alternates between a flat and a steep secant. The simulator and the
    stand-in take the same.
    """
    return 0.5 * (old + new)


# ----------------------------------------------------------------------------- joint friction
def tanh_ratio(xp, x):
    """tanh(x) / x, smooth through 0 (1 - x^2 / 3 there), with finite gradients everywhere."""
    small = xp.abs(x) < 1e-3
    safe = xp.where(small, 1.0, x)
    return xp.where(small, 1.0 - x * x / 3.0, xp.tanh(safe) / safe)


def impedance(xp, pen, solimp):
    """Return the soft contact's impedance d at penetration ``pen`` (m, >= 0), MuJoCo's solimp curve.

    ``solimp`` is (d0, d1, width, midpoint, power): d rises from d0 at contact to d1 at ``width``
    along a curve of the given power that turns at the midpoint (a straight line for power 1).
    """
    d0, d1, width, mid, power = solimp
    x = xp.clip(pen / width, 0.0, 1.0)
    if power == 1:
        y = x
    else:
        low = x ** power / mid ** (power - 1)
        high = 1.0 - (1.0 - x) ** power / (1.0 - mid) ** (power - 1)
        y = xp.where(x <= mid, low, high)
    return d0 + y * (d1 - d0)


def coulomb_friction(xp, v, f, eps: float):
    """Return the smoothed Coulomb friction's magnitude f tanh(v / eps) and its secant slope through zero.

    The friction acts against v; the slope is f tanh(v / eps) / v (doc/friction.md: with the
    secant the implicit step never carries a joint's friction-only velocity across zero).
    """
    x = v / eps
    return f * xp.tanh(x), f / eps * tanh_ratio(xp, x)


# ----------------------------------------------------------------------------- multirotors
def allocation(xp, positions, directions, kf: float, km: float):
    """Return the mixer's allocation matrix (4, n): [F_z; M_x; M_y; M_z] = A @ thrusts.

    The rotors are at ``positions`` (n, 3), pushing along body +z and reacting ``directions``
    km / kf per N about +z.
    """
    x, y = positions[:, 0], positions[:, 1]
    return xp.stack((xp.ones_like(x), y, -x, directions * (km / kf)))


def ctbr_wrench(xp, command, omega, rate_gain, inertia):
    """[F_z, M_x, M_y, M_z] (..., 4) the rate loop asks for.

    The input is a CTBR command (..., 4) = [collective thrust N, p, q, r rad/s] at body rates
    ``omega`` (..., 3); the loop is proportional on the rate error with the gyroscopic term fed
    forward, J k (w* - w) + w x J w.
    """
    alpha = rate_gain * (command[..., 1:4] - omega)
    torque = alpha @ inertia.T + cross(xp, omega, omega @ inertia.T)
    return xp.concatenate((command[..., 0:1], torque), -1)


def ctbr_thrusts(xp, command, omega, rate_gain, inertia, allocation_pinv):
    """Per-rotor thrusts (..., n) of a CTBR command.

    They are :func:`ctbr_wrench` mixed through the allocation's pseudo-inverse (n, 4).
    """
    return ctbr_wrench(xp, command, omega, rate_gain, inertia) @ allocation_pinv.T


def clamp_thrust(xp, thrust, max_thrust: float):
    """Per-rotor thrust smoothly clamped to [0, max_thrust].

    The softplus corners are 0.01 % of the range wide, so gradients survive near the bounds, and a
    zero command leaves a residual thrust of only ln(2) 1e-4 max_thrust.
    """
    beta = 1.0e4 / max_thrust
    return softplus(xp, thrust, beta) - softplus(xp, thrust - max_thrust, beta)


def speed_for_thrust(xp, thrust, kf: float):
    """Rotor speed (rad/s) that gives ``thrust`` (N) at thrust = kf w^2, smooth at zero."""
    return xp.sqrt(thrust / kf + 1e-6)


def rotor_thrusts(xp, speed, kf: float, scale=1.0):
    """Each rotor's thrust (N) at ``speed`` (rad/s): ``scale`` kf w^2.

    ``scale`` is the motors' real thrust against the model the mixer commands with (thrust_scale).
    """
    return (scale * kf) * speed ** 2


def drag_force(xp, v_com, linear, quadratic):
    """Body-frame drag force (..., 3) on a centre of mass moving at ``v_com`` (body axes, m/s).

    F = -(D_1 v + D_2 |v| v) per body axis (low-speed regime, below about 7 m/s).
    """
    return -(linear * v_com + quadratic * xp.abs(v_com) * v_com)
