"""The laws written once for the simulator and the stand-in (physics/laws.py).

Each law evaluated
with numpy (the stand-in's firmware) equals the same law with torch float64 (the simulator) for
random inputs (hypothesis: speeds far beyond the velocity limits, zero and infinite effort limits,
both signs), within what the two libraries' transcendentals (an ulp apart) allow; and each law
against an independent check: slopes against finite differences, secants against the chord, the
window's bounds, the lag's semigroup property, the mixer's allocation reproducing the commanded
wrench, the thrust clamp within [0, max] and the identity inside. The torch laws trace into one
graph (torch._dynamo.explain: no graph breaks), as the compiled step needs.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from diffsim_ros.physics import laws

F64 = torch.float64
INF = math.inf
HYP = settings(max_examples=200, deadline=None, print_blob=True)


def _t(x):
    return torch.as_tensor(np.asarray(x, dtype=np.float64), dtype=F64)


def _close(got_np, got_torch, atol, rtol=1e-12, what=""):
    """Check that NumPy's and torch's values of a law agree within atol + rtol |value| per entry."""
    a = np.asarray(got_np, dtype=np.float64)
    b = got_torch.detach().numpy() if isinstance(got_torch, torch.Tensor) else np.asarray(got_torch)
    assert a.shape == b.shape, (what, a.shape, b.shape)
    assert np.isfinite(a).all() and np.isfinite(b).all(), (what, a, b)
    err = np.abs(a - b)
    bound = np.broadcast_to(atol, a.shape) + rtol * np.abs(a)
    assert (err <= bound).all(), (what, a, b, err, bound)


# ----------------------------------------------------------------------------- draws
effort_limits = st.one_of(st.floats(0.05, 300.0), st.just(0.0), st.just(INF))
velocity_limits = st.one_of(st.floats(0.05, 60.0), st.just(INF))
frictions = st.one_of(st.just(0.0), st.floats(1e-6, 5.0))


@st.composite
def drives(draw):
    """Joint drives: limits, a band, commands and speeds.

    The speeds are in units of the velocity limit where there is one, up to 5 of them: far beyond
    it, both signs.
    """
    n = draw(st.integers(1, 5))
    lim = np.array(draw(st.lists(effort_limits, min_size=n, max_size=n)))
    vmax = np.array(draw(st.lists(velocity_limits, min_size=n, max_size=n)))
    band = draw(st.floats(0.02, 0.5))
    ratio = np.array(draw(st.lists(st.floats(-5.0, 5.0), min_size=n, max_size=n)))
    va = np.where(np.isfinite(vmax), ratio * np.where(np.isfinite(vmax), vmax, 1.0), 20.0 * ratio)
    scale = np.where(np.isfinite(lim) & (lim > 0), lim, 50.0)
    u = np.array(draw(st.lists(st.floats(-20.0, 20.0), min_size=n, max_size=n))) * scale
    pd = np.array(draw(st.lists(st.one_of(st.just(0.0), st.floats(-20.0, 20.0)), min_size=n, max_size=n))) * scale
    return dict(lim=lim, vmax=vmax, band=band, va=va, u=u, pd=pd)


def _safe(lim):
    return np.where(np.isfinite(lim) & (lim > 0), lim, 0.0)


def _band_width(d):
    return d["band"] * np.where(np.isfinite(d["vmax"]), d["vmax"], 1.0)


# ----------------------------------------------------------------------------- numpy == torch
@HYP
@given(drives(), st.booleans())
def test_saturation_and_window_agree_in_numpy_and_torch(d, window):
    lim, vmax, band, va, u = d["lim"], d["vmax"] if window else None, d["band"], d["va"], d["u"]
    L = _safe(lim)
    tv = None if vmax is None else _t(vmax)
    for a, b, what in zip(laws.saturate(np, u, lim, va, vmax, band),
                          laws.saturate(torch, _t(u), _t(lim), _t(va), tv, band), ("torque", "slope")):
        _close(a, b, 1e-12 * (L + np.abs(u)) if what == "torque" else 1e-12, what=what)
    lo, hi, ok = laws.torque_window(np, va, lim, d["vmax"], band)
    tlo, thi, tok = laws.torque_window(torch, _t(va), _t(lim), _t(d["vmax"]), band)
    assert (ok == tok.numpy()).all()
    _close(lo, tlo, 1e-12 * L, what="lo")
    _close(hi, thi, 1e-12 * L, what="hi")


@HYP
@given(drives())
def test_window_brake_agrees_in_numpy_and_torch(d):
    lim, vmax, band, va, u = d["lim"], d["vmax"], d["band"], d["va"], d["u"]
    L, B = _safe(lim), _band_width(d)
    tau = laws.saturate(np, u, lim, va, vmax, band)[0]
    got = laws.window_brake(np, u, va, tau, lim, vmax, band)
    ref = laws.window_brake(torch, _t(u), _t(va), _t(tau), _t(lim), _t(vmax), band)
    gap = np.abs(va - np.clip(va, -vmax, vmax))
    # The chord beyond the limit divides round-off in the torque by the distance to it.
    chord = np.where(gap > 0, 1e-14 * L / np.where(gap > 0, gap, 1.0), 0.0)
    _close(got, ref, 1e-11 * L / B + chord, what="brake")


@HYP
@given(drives(), st.booleans(), st.booleans(), st.booleans())
def test_drive_agrees_in_numpy_and_torch(d, window, servo, pd_slope):
    lim, vmax, band, va, u, pd = d["lim"], d["vmax"] if window else None, d["band"], d["va"], d["u"], d["pd"]
    L = _safe(lim)
    got = laws.drive(np, u, pd, va, lim, vmax, band, servo=servo, pd_slope=pd_slope)
    ref = laws.drive(torch, _t(u), _t(pd), _t(va), _t(lim), None if vmax is None else _t(vmax), band,
                     servo=servo, pd_slope=pd_slope)
    _close(got[0], ref[0], 1e-12 * (L + np.abs(u)), what="torque")
    for a, b, what in ((got[1], ref[1], "slope"), (got[2], ref[2], "brake")):
        assert (a is None) == (b is None), what
    if got[1] is not None:
        # A secant over the PD part divides the torques' round-off by it.
        sec = 1e-14 * L / np.maximum(np.abs(pd), 1e-9 * laws.limit_scale(np, lim))
        _close(got[1], ref[1], 1e-12 + sec, what="slope")
    if got[2] is not None:
        gap = np.abs(va - np.clip(va, -vmax, vmax))
        chord = np.where(gap > 0, 1e-14 * L / np.where(gap > 0, gap, 1.0), 0.0)
        _close(got[2], ref[2], 1e-11 * L / _band_width(d) + chord, what="brake")


@HYP
@given(drives(), st.booleans(), st.booleans(), st.floats(-3.0, 3.0), st.floats(0.1, 50.0), st.floats(1.0, 500.0),
       st.floats(1e-4, 0.02))
def test_servo_secants_agree_in_numpy_and_torch(d, window, position, move, kd, kp, h):
    lim, vmax, band, va, u, pd = d["lim"], d["vmax"] if window else None, d["band"], d["va"], d["u"], d["pd"]
    L = _safe(lim)
    torque, slope, brake = laws.drive(np, u, pd, va, lim, vmax, band, servo=True)
    slope = np.ones_like(u) if slope is None else slope
    va_next = va + move * np.where(np.isfinite(d["vmax"]), d["vmax"], 1.0)
    args = (u - pd, pd, va, torque, slope, brake, va_next, kd, kp if position else None, h, lim, vmax, band)
    targs = tuple(_t(x) if isinstance(x, np.ndarray) else x for x in args[:-2]) + (
        None if vmax is None else _t(vmax), band)
    got, ref = laws.servo_secants(np, *args), laws.servo_secants(torch, *targs)
    dpd = kd * (va_next - va) + (h * kp * va_next if position else 0.0)
    c1 = u - dpd
    err = 1e-14 * (L + np.abs(c1))
    _close(got[0], ref[0], 1e-12 + err / np.maximum(np.abs(dpd), 1e-300), what="slope")
    assert (got[1] is None) == (ref[1] is None) == (vmax is None)
    if got[1] is not None:
        dv = np.abs(va_next - va)
        _close(got[1], ref[1], 1e-11 * L / _band_width(d) + err / np.maximum(dv, 1e-300), what="brake")


@HYP
@given(st.lists(st.floats(-200.0, 200.0), min_size=1, max_size=6), st.floats(1e-3, 0.5),
       frictions, st.floats(1e-4, 0.05), st.floats(1e-3, 1.0))
def test_friction_and_lag_agree_in_numpy_and_torch(v, eps, f, h, tau):
    v = np.array(v)
    for a, b, what in zip(laws.coulomb_friction(np, v, f, eps), laws.coulomb_friction(torch, _t(v), f, eps),
                          ("force", "slope")):
        _close(a, b, 1e-14 * f / eps, what=what)
    _close(laws.tanh_ratio(np, v), laws.tanh_ratio(torch, _t(v)), 1e-15, what="tanh_ratio")
    target = 3.0 * v[::-1]
    _close(laws.first_order_lag(np, v, target, h, tau), laws.first_order_lag(torch, _t(v), _t(target), h, _t(tau)),
           1e-13 * np.abs(target - v), what="lag")


def _rotor_layout(draw):
    n = draw(st.integers(4, 8))
    angles = np.array(draw(st.lists(st.floats(0.0, 2 * math.pi), min_size=n, max_size=n)))
    arms = np.array(draw(st.lists(st.floats(0.05, 0.6), min_size=n, max_size=n)))
    z = np.array(draw(st.lists(st.floats(-0.1, 0.1), min_size=n, max_size=n)))
    positions = np.stack((arms * np.cos(angles), arms * np.sin(angles), z), -1)
    directions = np.array([1.0 if i % 2 == 0 else -1.0 for i in range(n)])
    return positions, directions


@st.composite
def multirotors(draw):
    positions, directions = _rotor_layout(draw)
    kf = draw(st.floats(1e-7, 1e-4))
    km = kf * draw(st.floats(0.0, 0.05))
    diag = np.array(draw(st.lists(st.floats(1e-4, 0.5), min_size=3, max_size=3)))
    off = np.array(draw(st.lists(st.floats(-0.3, 0.3), min_size=3, max_size=3))) * diag.min()
    inertia = np.diag(diag)
    inertia[0, 1] = inertia[1, 0] = off[0]
    inertia[0, 2] = inertia[2, 0] = off[1]
    inertia[1, 2] = inertia[2, 1] = off[2]
    gain = np.array(draw(st.lists(st.floats(0.0, 40.0), min_size=3, max_size=3)))
    batch = draw(st.integers(1, 3))
    command = np.array(draw(st.lists(st.floats(-30.0, 30.0), min_size=4 * batch, max_size=4 * batch))).reshape(batch, 4)
    omega = np.array(draw(st.lists(st.floats(-20.0, 20.0), min_size=3 * batch, max_size=3 * batch))).reshape(batch, 3)
    return dict(positions=positions, directions=directions, kf=kf, km=km, inertia=inertia, gain=gain,
                command=command, omega=omega)


@HYP
@given(multirotors(), st.floats(0.1, 60.0), st.floats(0.5, 1.5))
def test_mixer_motors_and_drag_agree_in_numpy_and_torch(r, max_thrust, scale):
    A = laws.allocation(np, r["positions"], r["directions"], r["kf"], r["km"])
    tA = laws.allocation(torch, _t(r["positions"]), _t(r["directions"]), r["kf"], r["km"])
    assert (A == tA.numpy()).all()
    pinv = np.linalg.pinv(A)
    w = laws.ctbr_wrench(np, r["command"], r["omega"], r["gain"], r["inertia"])
    tw = laws.ctbr_wrench(torch, _t(r["command"]), _t(r["omega"]), _t(r["gain"]), _t(r["inertia"]))
    size = np.abs(r["command"]).max() + np.abs(r["inertia"]).max() * (r["gain"].max() + 20.0) * 50.0
    _close(w, tw, 1e-13 * size, what="wrench")
    t = laws.ctbr_thrusts(np, r["command"], r["omega"], r["gain"], r["inertia"], pinv)
    tt = laws.ctbr_thrusts(torch, _t(r["command"]), _t(r["omega"]), _t(r["gain"]), _t(r["inertia"]), _t(pinv))
    _close(t, tt, 1e-12 * size * np.abs(pinv).max(), what="thrusts")
    thrust = t.reshape(-1) * (max_thrust / (np.abs(t).max() + 1e-9))
    thrust = np.concatenate((thrust, [0.0, max_thrust, -max_thrust, 2 * max_thrust]))
    c, tc = laws.clamp_thrust(np, thrust, max_thrust), laws.clamp_thrust(torch, _t(thrust), max_thrust)
    # torch's softplus is x itself above beta x = 20, numpy's logaddexp: apart by exp(-20) / beta there.
    _close(c, tc, 1e-12 * max_thrust, what="clamp")
    _close(laws.speed_for_thrust(np, c, r["kf"]), laws.speed_for_thrust(torch, tc, r["kf"]),
           1e-11 * math.sqrt(max_thrust / r["kf"]), what="speed")
    speed = laws.speed_for_thrust(np, c, r["kf"])
    _close(laws.rotor_thrusts(np, speed, r["kf"], scale), laws.rotor_thrusts(torch, _t(speed), r["kf"], _t(scale)),
           0.0, rtol=1e-15, what="rotor thrusts")
    v = r["omega"] / 2.0
    d1, d2 = np.array([0.1, 0.2, 0.3]) * scale, np.array([0.02, 0.03, 0.05]) / scale
    _close(laws.drag_force(np, v, d1, d2), laws.drag_force(torch, _t(v), _t(d1), _t(d2)), 0.0, rtol=1e-15,
           what="drag")


# ----------------------------------------------------------------------------- independent checks
@HYP
@given(drives())
def test_saturation_slope_is_the_derivative_and_the_torque_stays_in_the_window(d):
    """The saturation's slope = d torque / d u (central differences); |torque| <= L; inside the window at the speed."""
    lim, vmax, band, va, u = d["lim"], d["vmax"], d["band"], d["va"], d["u"]
    L = _safe(lim)
    step = 1e-6 * np.where(L > 0, L, 1.0)
    for window in (None, vmax):
        tau, slope = laws.saturate(np, u, lim, va, window, band)
        fd = (laws.saturate(np, u + step, lim, va, window, band)[0]
              - laws.saturate(np, u - step, lim, va, window, band)[0]) / (2 * step)
        np.testing.assert_allclose(slope, fd, atol=1e-6)
        # Far beyond the velocity limit the closed window is held MIN_HALF_WIDTH L wide about -L (or L).
        bound = np.where(L > 0, L, np.inf) * (1 + (0.0 if window is None else laws.MIN_HALF_WIDTH) + 1e-12)
        assert (np.abs(tau) <= bound).all()
        assert ((L > 0) | (tau == u)).all(), "a joint without an effort limit is not saturated"
    lo, hi, ok = laws.torque_window(np, va, lim, vmax, band)
    tau = laws.saturate(np, u, lim, va, vmax, band)[0]
    floor = laws.MIN_HALF_WIDTH * L         # far beyond the limit the window is held this wide
    assert (~ok | ((tau >= lo - floor - 1e-12 * L) & (tau <= hi + floor + 1e-12 * L))).all()
    assert (~ok | (hi >= -L) & (lo <= L) & (lo <= hi + 1e-12 * L)).all()


@HYP
@given(drives())
def test_window_brake_is_the_speed_slope_inside_and_the_chord_beyond(d):
    """The window brake is the speed slope inside and the chord beyond.

    Inside the velocity limit the brake is max(0, -d torque / d v) (central differences); beyond
    it at least the chord to the limit, -(torque(v) - torque(v*)) / (v - v*); never negative.
    """
    lim, vmax, band, va, u = d["lim"], d["vmax"], d["band"], d["va"], d["u"]
    L, B = _safe(lim), _band_width(d)
    tau = laws.saturate(np, u, lim, va, vmax, band)[0]
    brake = laws.window_brake(np, u, va, tau, lim, vmax, band)
    ok = laws.torque_window(np, va, lim, vmax, band)[2]
    assert (brake >= 0).all() and (~ok <= (brake == 0)).all()
    V = np.where(np.isfinite(vmax), vmax, 1.0)
    inside = np.clip(va, -V, V)
    step = 1e-6 * B
    fd = -(laws.saturate(np, u, lim, va + step, vmax, band)[0]
           - laws.saturate(np, u, lim, va - step, vmax, band)[0]) / (2 * step)
    strictly = ok & (np.abs(va) < V - 2 * step)
    err = np.abs(brake - np.maximum(fd, 0.0))
    assert (err[strictly] <= 1e-5 * (L / B)[strictly]).all(), (brake, fd)
    beyond = ok & (np.abs(va - inside) > 1e-9 * V)
    if beyond.any():
        at = laws.saturate(np, u, lim, inside, vmax, band)[0]
        chord = -(tau - at) / np.where(beyond, va - inside, 1.0)
        assert (brake[beyond] >= chord[beyond] - 1e-9 * (L / B)[beyond]).all()


@HYP
@given(st.floats(-1e3, 1e3), st.floats(-1e3, 1e3), st.floats(1e-6, 10.0), st.floats(-5.0, 5.0))
def test_secant_is_the_chord_and_falls_back_on_the_tangent(x0, x1, scale, tangent):
    f = np.array([3.0 * x0 - 2.0, 3.0 * x1 - 2.0])
    dx = np.array([x0 - x1, 1e-10 * scale])
    got = laws.secant(np, f[0], f[1], dx, tangent, scale)
    if abs(x0 - x1) > 1e-9 * scale:
        assert got[0] == pytest.approx(3.0, rel=1e-12, abs=1e-15 * np.abs(f).sum() / abs(x0 - x1))
    else:
        assert got[0] == tangent
    assert got[1] == tangent


@HYP
@given(drives(), st.booleans())
def test_drive_composes_the_saturation_its_secants_and_the_brake(d, window):
    """The drive composes the saturation, its secants and the brake.

    The drive's torque is the saturated command; with a window and a servo its slope is the secant
    of the torque over the PD part (the torque without the PD part is torque - slope pd); without a
    window and with pd_slope, the saturation's slope at the PD part alone.
    """
    lim, vmax, band, va, u, pd = d["lim"], d["vmax"] if window else None, d["band"], d["va"], d["u"], d["pd"]
    L = _safe(lim)
    torque, slope, brake = laws.drive(np, u, pd, va, lim, vmax, band, servo=True, pd_slope=True)
    np.testing.assert_array_equal(torque, laws.saturate(np, u, lim, va, vmax, band)[0])
    if vmax is None:
        assert brake is None
        np.testing.assert_array_equal(slope, laws.effort_saturation(np, pd, lim)[1])
        return
    np.testing.assert_array_equal(brake, laws.window_brake(np, u, va, torque, lim, vmax, band))
    without = laws.saturate(np, u - pd, lim, va, vmax, band)[0]
    moved = np.abs(pd) > 1e-9 * laws.limit_scale(np, lim)
    assert (np.abs(torque - slope * pd - without)[moved] <= 1e-12 * (L + np.abs(u) + np.abs(pd))[moved]).all()
    # A monotone law's secants lie in [0, 1], up to the round-off of u - pd over pd.
    tol = 1e-12 + np.where(moved, 1e-15 * (np.abs(u) + np.abs(pd)) / np.where(moved, np.abs(pd), 1.0), 0.0)
    assert (slope >= -tol).all() and (slope <= 1.0 + tol).all(), slope


@HYP
@given(drives(), st.booleans())
def test_servo_secants_tend_to_the_tangents_for_a_small_move(d, window):
    """The servo's secants tend to the tangents for a small move.

    A velocity servo whose predicted end barely moves: the secants are the tangents at the start
    (the saturation's slope, and the window brake's speed slope where it is the tangent).
    """
    lim, vmax, band, va, u = d["lim"], d["vmax"] if window else None, d["band"], d["va"], d["u"]
    kd = 2.0
    torque, tangent = laws.saturate(np, u, lim, va, vmax, band)
    brake = None if vmax is None else np.zeros_like(u)
    small = 1e-7 * np.where(np.isfinite(d["vmax"]), d["vmax"], 1.0)
    slope, _ = laws.servo_secants(np, u * 0.0, u, va, torque, tangent, brake, va + small, kd, None, 1e-3, lim,
                                  vmax, band)
    np.testing.assert_allclose(slope, tangent, atol=1e-4)


@HYP
@given(st.floats(-10.0, 10.0), st.floats(-10.0, 10.0), st.floats(1e-4, 0.05), st.floats(1e-3, 1.0))
def test_first_order_lag_is_exact_over_substeps(x, target, h, tau):
    """The exact discretisation: two steps of h are one of 2 h; the lag moves 1 - exp(-h / tau)."""
    two = laws.first_order_lag(np, laws.first_order_lag(np, x, target, h, tau), target, h, tau)
    assert two == pytest.approx(laws.first_order_lag(np, x, target, 2 * h, tau), rel=1e-12, abs=1e-12)
    assert laws.lag_factor(np, h, tau) == pytest.approx(1 - math.exp(-h / tau), rel=1e-12)


@HYP
@given(st.floats(-100.0, 100.0), st.floats(1e-3, 0.5), frictions)
def test_friction_secant_through_zero(v, eps, f):
    """The friction's slope is its secant through zero: force = slope v, and tanh(x) / x near 0."""
    force, slope = laws.coulomb_friction(np, np.array(v), f, eps)
    assert float(force) == pytest.approx(float(slope) * v, rel=1e-12, abs=1e-14 * f)
    assert float(force) == pytest.approx(f * math.tanh(v / eps), rel=1e-15, abs=0.0)
    assert 0.0 <= float(slope) <= f / eps * (1 + 1e-15)


@HYP
@given(multirotors())
def test_allocation_times_the_mixed_thrusts_is_the_commanded_wrench(r):
    """The allocation times the mixed thrusts is the commanded wrench.

    Unsaturated, the mixer's thrusts reproduce the rate loop's wrench through the allocation; the
    rate loop is J k (w* - w) + w x J w (at w = 0: J k w*; with k = 0: the gyroscopic term).
    """
    A = laws.allocation(np, r["positions"], r["directions"], r["kf"], r["km"])
    if np.linalg.matrix_rank(A) < 4:
        return                                        # a degenerate layout cannot hold every wrench
    pinv = np.linalg.pinv(A)
    wrench = laws.ctbr_wrench(np, r["command"], r["omega"], r["gain"], r["inertia"])
    thrusts = laws.ctbr_thrusts(np, r["command"], r["omega"], r["gain"], r["inertia"], pinv)
    size = np.abs(wrench).max() + 1.0
    np.testing.assert_allclose(thrusts @ A.T, wrench, atol=1e-9 * size * np.linalg.cond(A))
    J, cmd = r["inertia"], r["command"]
    rest = laws.ctbr_wrench(np, cmd, np.zeros_like(r["omega"]), r["gain"], J)
    np.testing.assert_allclose(rest[:, 1:], (r["gain"] * cmd[:, 1:]) @ J.T, rtol=1e-12, atol=1e-12)
    gyro = laws.ctbr_wrench(np, cmd, r["omega"], np.zeros(3), J)
    np.testing.assert_allclose(gyro[:, 1:], np.cross(r["omega"], r["omega"] @ J), rtol=1e-12, atol=1e-9)
    np.testing.assert_array_equal(wrench[:, 0], cmd[:, 0])


@HYP
@given(st.floats(0.1, 100.0), st.lists(st.floats(-3.0, 3.0), min_size=1, max_size=20))
def test_thrust_clamp_stays_within_range_and_is_the_identity_inside(max_thrust, fractions):
    """The thrust clamp stays within range and is the identity inside.

    Within [0, max_thrust] for every command; the command itself from 1 % to 99 % of the range
    (the corners are 0.01 % wide); ln(2) 1e-4 max_thrust left at zero; monotone.
    """
    t = np.sort(np.array(fractions)) * max_thrust
    c = laws.clamp_thrust(np, t, max_thrust)
    assert (c >= 0).all() and (c <= max_thrust * (1 + 1e-12)).all()
    assert (np.diff(c) >= -1e-12 * max_thrust).all()
    mid = (t > 1e-2 * max_thrust) & (t < (1 - 1e-2) * max_thrust)
    np.testing.assert_allclose(c[mid], t[mid], atol=1e-12 * max_thrust)
    assert laws.clamp_thrust(np, 0.0, max_thrust) == pytest.approx(math.log(2) * 1e-4 * max_thrust, rel=1e-9)


@HYP
@given(st.lists(st.floats(0.0, 50.0), min_size=1, max_size=8), st.floats(1e-7, 1e-4), st.floats(0.5, 2.0))
def test_rotor_thrust_of_the_speed_for_a_thrust_is_that_thrust(thrust, kf, scale):
    t = np.array(thrust)
    w = laws.speed_for_thrust(np, t, kf)
    np.testing.assert_allclose(laws.rotor_thrusts(np, w, kf), t + 1e-6 * kf, rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(laws.rotor_thrusts(np, w, kf, scale), scale * (t + 1e-6 * kf), rtol=1e-12,
                               atol=1e-15)


@HYP
@given(st.lists(st.floats(-10.0, 10.0), min_size=3, max_size=3))
def test_drag_opposes_the_motion_per_axis(v):
    v = np.array(v)
    d1, d2 = np.array([0.1, 0.1, 0.15]), np.array([0.02, 0.02, 0.04])
    F = laws.drag_force(np, v, d1, d2)
    assert (F * v <= 0).all()
    np.testing.assert_array_equal(laws.drag_force(np, -v, d1, d2), -F)
    np.testing.assert_allclose(np.abs(F), d1 * np.abs(v) + d2 * v * v, rtol=1e-15)


# ----------------------------------------------------------------------------- one graph
def test_the_torch_laws_trace_without_graph_breaks():
    """The simulator's laws trace into one graph each (the compiled step needs fullgraph)."""
    lim, vmax = _t([10.0, INF, 0.0, 5.0]), _t([2.0, 3.0, INF, INF])
    u, pd, va = _t([12.0, -3.0, 1.0, -7.0]), _t([2.0, 0.0, -1.0, 3.0]), _t([2.5, -1.0, 0.0, 4.0])

    def joint(u, pd, va):
        torque, slope, brake = laws.drive(torch, u, pd, va, lim, vmax, 0.1, servo=True)
        s2, b2 = laws.servo_secants(torch, u - pd, pd, va, torque, slope, brake, va * 0.5, 3.0, 40.0, 1e-3,
                                    lim, vmax, 0.1)
        f, d = laws.coulomb_friction(torch, va, 0.1, 0.01)
        return torque + s2 + b2 + f + d + laws.first_order_lag(torch, u, pd, 1e-3, _t(0.02))

    def rotors(cmd, omega):
        A = laws.allocation(torch, _t([[0.1, 0.1, 0], [-0.1, 0.1, 0], [-0.1, -0.1, 0], [0.1, -0.1, 0]]),
                            _t([1, -1, 1, -1]), 1e-5, 1.6e-7)
        t = laws.ctbr_thrusts(torch, cmd, omega, _t([20, 20, 8]), torch.eye(3, dtype=F64) * 0.01, A.T)
        w = laws.speed_for_thrust(torch, laws.clamp_thrust(torch, t, 20.0), 1e-5)
        return laws.rotor_thrusts(torch, w, 1e-5, _t(1.0)).sum() + laws.drag_force(torch, omega, 0.1, 0.02).sum()

    for fn, args in ((joint, (u, pd, va)), (rotors, (_t([[9.8, 0.1, 0.2, 0.3]]), _t([[0.5, -0.2, 0.1]])))):
        torch._dynamo.reset()
        explained = torch._dynamo.explain(fn)(*args)
        assert explained.graph_break_count == 0 and explained.graph_count == 1, explained.break_reasons
