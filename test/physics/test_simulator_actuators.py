"""Actuators, passive joint forces, the ground plane and self-collision of the simulator step.

These are issue 3's, each against an independent expectation: an analytic
solution, the textbook discretisation of it, or the same simulation done
another way (rnea/aba, a second simulator).

Models are float64 URDF strings written here; torch runs on one thread and
cases that share a model and a config run as one batch. Every test states its
tolerance and why.

  * command_delay N: the response is the undelayed one shifted by N steps,
    exactly (test_command_delay_shifts_the_response_by_n_steps,
    test_command_delay_equals_prepending_the_delay_line);
  * actuator_lag T: the applied force is F (1 - exp(-t/T)) exactly at every
    substep, the velocity its integral (test_actuator_lag_is_first_order);
  * velocity interface: first-order response with time constant m/kd, the
    linearly implicit and the explicit Euler recursions exactly
    (test_velocity_interface_first_order_response);
  * position interface: settles at the command; under gravity the error is
    rnea's gravity torque / kp (test_position_interface_settles_with_gravity_offset);
  * effort saturation: tau = L tanh(cmd / L), compared through aba
    (test_effort_saturation_matches_aba);
  * actuated_joints: the action maps by name, unactuated joints get nothing
    (test_actuated_joints_map_by_name);
  * URDF <dynamics> damping (exponential decay) and Coulomb friction (linear
    deceleration, stopping distance) (test_joint_damping_and_friction_decay);
  * ground_height and ground_normal: resting height, a box sliding at
    g (sin - mu cos) on a 20 degree slope, a ball rolling at 5/7 g sin, and a
    box that stays put at mu = 0.8 (creeping only at the regularised-Coulomb speed);
  * self_collision: two spheres on non-adjacent links squeezed together rest
    at the penalty penetration sqrt(F/k); without it they pass through.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from builders import ball_urdf, box_urdf
from diffsim_ros import physics

G = 9.81
F64 = torch.float64


def _t(x) -> torch.Tensor:
    return torch.as_tensor(x, dtype=F64)


def _run(sim, state, actions):
    """Rollout of an action sequence (T, B, n) without autograd."""
    with torch.no_grad():
        return sim.rollout(state, _t(actions))


def _const(action, steps):
    """Repeat a constant action (B, n) for ``steps`` steps: (steps, B, n)."""
    a = _t(action)
    return a.expand((steps,) + a.shape)


# ----------------------------------------------------------------- test models
def _inertial(mass, com=(0, 0, 0), i=(1e-3, 1e-3, 1e-3)):
    return (f'<inertial><origin xyz="{com[0]} {com[1]} {com[2]}"/><mass value="{mass}"/>'
            f'<inertia ixx="{i[0]}" iyy="{i[1]}" izz="{i[2]}" ixy="0" ixz="0" iyz="0"/></inertial>')


def _limit(lo=-10, hi=10, effort=1e3):
    return f'<limit lower="{lo}" upper="{hi}" effort="{effort}" velocity="100"/>'


# Two independent joints hanging from the world: a prismatic slider along x
# (mass 2 kg; gravity is along -z, so none acts along it) and a continuous
# rotor about z with its centre of mass on the axis (I_zz = 0.05 kg m^2). The
# slider has Coulomb friction 6 N, the rotor viscous damping 0.25 N m s/rad.
M_SLIDE, I_SPIN = 2.0, 0.05
F_SLIDE, D_SPIN = 6.0, 0.25
_TWO_JOINTS_URDF = f"""<robot name="two_joints">
  <link name="world"/>
  <link name="slider">{_inertial(M_SLIDE)}</link>
  <link name="rotor">{_inertial(1.0, i=(0.03, 0.03, I_SPIN))}</link>
  <joint name="slide" type="prismatic"><parent link="world"/><child link="slider"/><axis xyz="1 0 0"/>
    {_limit(-100, 100)}<dynamics damping="0" friction="{F_SLIDE}"/></joint>
  <joint name="spin" type="continuous"><parent link="world"/><child link="rotor"/><axis xyz="0 0 1"/>
    <dynamics damping="{D_SPIN}" friction="0"/></joint>
</robot>"""


def _chain_urdf(names, axis="0 1 0", length=0.4, mass=1.0, efforts=None):
    """Return the URDF of a serial chain of revolute joints ``names`` (model order = chain order).

    Its links are of ``length`` along x with the centre of mass at mid-length.
    """
    efforts = efforts or [1e3] * len(names)
    rod = 1e-3 + mass * length ** 2 / 12
    links = ['<link name="base"/>']
    joints = []
    parent = "base"
    for k, (nm, eff) in enumerate(zip(names, efforts)):
        child = f"link_{nm}"
        links.append(f'<link name="{child}">{_inertial(mass, (length / 2, 0, 0), (1e-3, rod, rod))}</link>')
        xyz = "0 0 0" if k == 0 else f"{length} 0 0"

        joints.append(f'<joint name="{nm}" type="revolute"><parent link="{parent}"/><child link="{child}"/>'
                      f'<origin xyz="{xyz}"/><axis xyz="{axis}"/>{_limit(-3, 3, eff)}</joint>')
        parent = child
    return f'<robot name="chain">{"".join(links)}{"".join(joints)}</robot>'


# ================================================================= command delay
@pytest.mark.parametrize("delay", [1, 3])
def test_command_delay_shifts_the_response_by_n_steps(delay):
    """command_delay shifts the response by N steps.

    A horizontal two-link arm (joint axes along z, so gravity exerts no joint
    torque) at rest gets a step effort command at t = 0 (four amplitudes in one
    batch, two substeps per step). With command_delay = N the delay line starts
    at zero effort, under which the arm stays at rest, so the delayed trajectory
    must be the undelayed one shifted by exactly N steps: q_d[k + N] = q_u[k].
    Both are the same floating-point operations, so the tolerance is round-off
    (1e-13 rad; measured 0).
    """
    model = physics.load_urdf(_chain_urdf(["a", "b"], axis="0 0 1"), dtype=F64)
    cfg = dict(dt=2e-3, substeps=2, effort_saturation=False)
    plain = physics.Simulator(model, physics.SimConfig(**cfg))
    late = physics.Simulator(model, physics.SimConfig(command_delay=delay, **cfg))
    B, steps = 4, 25
    q0 = _t([[0.3, -0.5]]).expand(B, 2)
    u = _t([[1.0, -0.5], [-2.0, 0.3], [0.5, 0.5], [0.0, 3.0]])
    s_late = late.initial_state(q0)
    assert s_late.delay.shape == (B, delay, 2) and float(s_late.delay.abs().max()) == 0.0
    ref = _run(plain, plain.initial_state(q0), _const(u, steps))
    got = _run(late, s_late, _const(u, steps + delay))
    # Nothing moves while the delay line empties ...
    assert float((got.q[:delay + 1] - q0).abs().max()) == 0.0
    assert float(got.v[:delay + 1].abs().max()) == 0.0
    # ... and afterwards the response is the undelayed one, N steps late.
    err_q = float((got.q[delay:] - ref.q).abs().max())
    err_v = float((got.v[delay:] - ref.v).abs().max())
    assert err_q < 1e-13 and err_v < 1e-13, f"shifted response differs by {err_q:.1e} rad, {err_v:.1e} rad/s"
    assert float((ref.q[-1] - q0).abs().min()) > 1e-3, "the step command should move every arm"


def test_command_delay_equals_prepending_the_delay_line():
    """command_delay equals prepending the delay line to the actions.

    Position interface, arm under gravity (not at rest at t = 0, with an
    initial velocity): the delay line starts filled with the current joint
    positions, so a delay of 2 steps must equal the undelayed simulator fed
    [q0, q0, a_0, a_1, ...] (a varying action sequence). Tolerance round-off
    (1e-12).
    """
    model = physics.load_urdf(_chain_urdf(["a", "b"], axis="0 1 0"), dtype=F64)
    cfg = dict(dt=2e-3, actuator="position", kp=50.0, kd=2.0)
    plain = physics.Simulator(model, physics.SimConfig(**cfg))
    late = physics.Simulator(model, physics.SimConfig(command_delay=2, **cfg))
    B, steps = 3, 30
    gen = torch.Generator().manual_seed(3)
    q0 = (torch.rand(B, 2, generator=gen, dtype=F64) - 0.5)
    v0 = (torch.rand(B, 2, generator=gen, dtype=F64) - 0.5)
    acts = torch.rand(steps, B, 2, generator=gen, dtype=F64) - 0.5
    s_late = late.initial_state(q0, v0)
    np.testing.assert_array_equal(s_late.delay.numpy(), q0[:, None, :].expand(B, 2, 2).numpy())
    got = _run(late, s_late, acts)
    ref = _run(plain, plain.initial_state(q0, v0), torch.cat((q0.expand(2, B, 2), acts[:-2])))
    err = float((got.q - ref.q).abs().max())
    assert err < 1e-12, f"delayed rollout differs from the prepended one by {err:.1e} rad"
    # The delay line holds the last two actions, oldest first.
    np.testing.assert_array_equal(got.final.delay.numpy(), acts[-2:].permute(1, 0, 2).numpy())


# ================================================================= actuator lag
def test_actuator_lag_is_first_order():
    """The actuator lag is first order.

    Effort interface with actuator_lag T = 50 ms on the free prismatic slider
    (gravity perpendicular to it; URDF friction switched off with
    joint_friction=False, the rotor unactuated and undamped). A step force F
    (three amplitudes, one batch) from rest: the lag's exact discretisation,
    alpha = 1 - exp(-h/T) per substep, makes the applied force equal
    F (1 - exp(-t/T)) exactly at every substep, and semi-implicit Euler gives
    v_n = (h/m) sum_{j=1..n} F (1 - exp(-j h / T)).

    Asserted: the actuator state against F (1 - exp(-t/T)) within 1e-12 N
    (round-off), the velocity against that discrete sum within 1e-12 m/s, and
    against the continuous solution v(t) = F/m (t - T (1 - exp(-t/T))) within
    h F / (2 m) (the right Riemann sum of an increasing concave integrand
    overshoots the integral by less than h/2 times its range; measured 0.978
    of that bound at 4 T, where the force has nearly reached F).
    """
    model = physics.load_urdf(_TWO_JOINTS_URDF, dtype=F64)
    T, dt, substeps, steps = 0.05, 2e-3, 2, 100
    h = dt / substeps
    sim = physics.Simulator(model, physics.SimConfig(
        dt=dt, substeps=substeps, actuator_lag=T, actuated_joints=("slide",), effort_saturation=False,
        joint_friction=False, joint_damping=False))
    Fs = _t([[4.0], [-1.0], [10.0]])
    s = sim.initial_state(batch=3)
    assert s.actuator.shape == (3, 1) and float(s.actuator.abs().max()) == 0.0
    applied, v = [], []
    with torch.no_grad():
        for k in range(steps):
            s = sim.step(s, Fs)
            applied.append(s.actuator[:, 0])
            v.append(s.v[:, 0])
    applied, v = torch.stack(applied), torch.stack(v)                    # (steps, B)
    t = dt * torch.arange(1, steps + 1, dtype=F64)[:, None]
    F = Fs[:, 0]
    np.testing.assert_allclose(applied.numpy(), (F * (1 - torch.exp(-t / T))).numpy(), rtol=0, atol=1e-12)
    j = torch.arange(1, steps * substeps + 1, dtype=F64)[:, None]
    discrete = (h / M_SLIDE) * torch.cumsum(F * (1 - torch.exp(-j * h / T)), 0)[substeps - 1::substeps]
    np.testing.assert_allclose(v.numpy(), discrete.numpy(), rtol=0, atol=1e-12)
    cont = F / M_SLIDE * (t - T * (1 - torch.exp(-t / T)))
    err = (v - cont).abs().max(0).values
    bound = h * F.abs() / (2 * M_SLIDE)
    assert bool((err <= bound).all()), f"velocity error {err.tolist()} exceeds h F / 2m = {bound.tolist()}"
    # The lag still matters at the end (4 T): the force is 98 % of F, not F.
    np.testing.assert_allclose((applied[-1] / F).numpy(), 1 - math.exp(-steps * dt / T), rtol=1e-12)
    assert float(s.v[:, 1].abs().max()) == 0.0, "the unactuated rotor must not move"


def _lagged_slider(T: float, dt: float, substeps: int, kp: float, kd: float, steps: int, lag=True):
    """Simulate the slider under a lagged position servo (target 0.1 m from rest): x at every control step."""
    model = physics.load_urdf(_TWO_JOINTS_URDF, dtype=F64)
    sim = physics.Simulator(model, physics.SimConfig(
        dt=dt, substeps=substeps, actuator="position", kp=kp, kd=kd, actuator_lag=T if lag else 0.0,
        actuated_joints=("slide",), effort_saturation=False, joint_friction=False, joint_damping=False))
    s = sim.initial_state()
    xs = []
    with torch.no_grad():
        for _ in range(steps):
            s = sim.step(s, _t([0.1]))
            xs.append(float(s.q[0]))
    return np.array(xs)


def test_a_lagged_position_servo_follows_its_ode_and_is_stable_at_stiff_substeps():
    """A lagged position servo follows its ODE and is stable at stiff substeps.

    Position servo kp 800 N/m, kd 40 N s/m on the 2 kg slider through a 20 ms torque lag:
    x'' = tau / m, tau' = (kp (x* - x) - kd x' - tau) / T, whose exact solution is the matrix
    exponential of that linear system. The step (the lag's share of the gains implicit) converges
    to it at first order: at 0.1 ms substeps within 3e-4 m (0.3 % of the step), and halving the substep halves the
    error. At 10 ms substeps behind a stiffer drive (kp 1e4, kd 1000, a 10 ms lag: kd h / m = 5, a
    light link behind a strong servo as the arm's wrist) the explicit form diverged (to 171 m);
    this one settles on the target. And as the lag goes to zero (T = h / 20,
    its factor 1 - 2e-9) it is the unlagged implicit servo.
    """
    m, kp, kd, T, t_end = M_SLIDE, 800.0, 40.0, 0.02, 0.5
    A = torch.tensor([[0.0, 1.0, 0.0], [0.0, 0.0, 1.0 / m], [-kp / T, -kd / T, -1.0 / T]], dtype=F64)
    b = torch.tensor([0.0, 0.0, kp * 0.1 / T], dtype=F64)
    eq = torch.linalg.solve(A, -b)                                 # the equilibrium (x*, 0, 0)
    dt = 1e-3
    t = dt * np.arange(1, int(round(t_end / dt)) + 1)
    exact = np.array([float((eq + torch.linalg.matrix_exp(A * tk) @ (torch.zeros(3, dtype=F64) - eq))[0])
                      for tk in t])
    errs = [np.abs(_lagged_slider(T, dt, n, kp, kd, len(t)) - exact).max() for n in (10, 20)]
    print(f"lagged servo against its ODE: {errs[0]:.2e} m at 0.1 ms, {errs[1]:.2e} m at 0.05 ms")
    assert errs[0] < 3e-4 and 0.4 < errs[1] / errs[0] < 0.6, errs
    stiff = _lagged_slider(0.01, 0.01, 1, 1e4, 1000.0, 100)
    assert np.isfinite(stiff).all() and abs(stiff[-1] - 0.1) < 1e-3 and np.abs(stiff).max() < 0.2, stiff[-5:]
    near = _lagged_slider(0.01 / 20, 0.01, 1, 2e4, 400.0, 50)
    unlagged = _lagged_slider(0.0, 0.01, 1, 2e4, 400.0, 50, lag=False)
    assert np.abs(near - unlagged).max() < 1e-6 * 0.1, np.abs(near - unlagged).max()


# ================================================================= velocity interface
@pytest.mark.parametrize("implicit", [True, False])
def test_velocity_interface_first_order_response(implicit):
    """The velocity interface's response is first order.

    Velocity interface on the slider (m = 2 kg, kd = 20 N s/m) and the rotor
    (I = 0.05 kg m^2, kd = 0.5 N m s/rad): both have the time constant
    m/kd = 0.1 s. From rest, commanded u (three batches of two commands), the
    exact solution is v = u (1 - exp(-t kd/m)). With c = h kd / m = 0.05
    (h = 5 ms), linearly implicit Euler gives v_{k+1} = (v_k + c u)/(1 + c) and
    explicit v_{k+1} = v_k + c (u - v_k).

    Asserted: the simulator against its recursion within 1e-12 (round-off),
    against the exact exponential within c |u| / 2 (first-order Euler on an
    exponential: the largest error is about c/(2e) |u|; measured 0.90 % and
    0.94 % of |u| against 2.5 %), and converged (|v - u| < 1 % of |u| after
    6 time constants).
    """
    model = physics.load_urdf(_TWO_JOINTS_URDF, dtype=F64)
    dt, steps = 5e-3, 120
    kd = (20.0, 0.5)
    sim = physics.Simulator(model, physics.SimConfig(
        dt=dt, actuator="velocity", kd=kd, effort_saturation=False, joint_damping=False, joint_friction=False,
        implicit_damping=implicit))
    u = _t([[0.5, 3.0], [-1.0, -10.0], [2.0, 0.1]])
    tr = _run(sim, sim.initial_state(batch=3), _const(u, steps))
    v = tr.v                                                              # (steps+1, B, 2)
    c = dt * _t(kd) / _t([M_SLIDE, I_SPIN])
    rec = [torch.zeros_like(u)]
    for _ in range(steps):
        vk = rec[-1]
        rec.append((vk + c * u) / (1 + c) if implicit else vk + c * (u - vk))
    rec = torch.stack(rec)
    err_rec = float((v - rec).abs().max())
    kind = "implicit" if implicit else "explicit"
    assert err_rec < 1e-12, f"velocity differs from the {kind} recursion by {err_rec:.1e}"

    t = dt * torch.arange(steps + 1, dtype=F64)[:, None, None]
    exact = u * (1 - torch.exp(-t * _t(kd) / _t([M_SLIDE, I_SPIN])))
    rel = float(((v - exact).abs() / u.abs()).max())
    assert rel < 0.5 * float(c.max()), f"relative error to the exponential {rel:.3e} > c/2"
    assert float(((v[-1] - u).abs() / u.abs()).max()) < 1e-2


# ================================================================= position interface
def test_position_interface_settles_with_gravity_offset():
    """The position interface settles, under gravity with an offset.

    A single-link pendulum (revolute about y, 1 kg at 0.2 m, I about the
    joint 0.041 kg m^2) under the position interface, kp = 100 N m/rad and
    kd = 2 sqrt(kp I) (critical damping at the command; omega = 49 rad/s). Four
    commands in one batch, 1 s at h = 10 ms (linearly implicit Euler, stable
    and overdamped at omega h = 0.5: the velocity is ~1e-12 rad/s by then).

    Without gravity the joint settles at the command (|q - q_c| < 1e-9 rad).
    With gravity, at rest kp (q_c - q) = g(q), the gravity torque that rnea
    gives at zero velocity and acceleration: asserted to 1e-9 N m, and q
    against the root of q_c - q - g(q)/kp = 0 found by Newton iteration on rnea
    (1e-9 rad); measured 2e-13 N m and below 1e-12 rad. The offsets are 0.007
    to 0.019 rad, far above those tolerances.
    """
    urdf = f"""<robot name="pendulum"><link name="world"/>
      <link name="arm">{_inertial(1.0, (0.2, 0, 0))}</link>
      <joint name="hinge" type="revolute"><parent link="world"/><child link="arm"/><axis xyz="0 1 0"/>
        {_limit(-3, 3)}</joint></robot>"""
    model = physics.load_urdf(urdf, dtype=F64)
    I = 1e-3 + 1.0 * 0.2 ** 2
    kp = 100.0
    kd = 2 * math.sqrt(kp * I)
    qc = _t([[-1.0], [-0.3], [0.4], [1.2]])
    B = qc.shape[0]
    for gravity in ((0.0, 0.0, 0.0), (0.0, 0.0, -G)):
        sim = physics.Simulator(model, physics.SimConfig(dt=1e-2, actuator="position", kp=kp, kd=kd,
                                                         effort_saturation=False, gravity=gravity))
        tr = _run(sim, sim.initial_state(batch=B), _const(qc, 100))
        q, v = tr.final.q, tr.final.v
        assert float(v.abs().max()) < 1e-8, "the joint should be at rest"
        if gravity[2] == 0:
            err = float((q - qc).abs().max())
            assert err < 1e-9, f"settled {err:.1e} rad from the command without gravity"
            continue
        zero = torch.zeros_like(q)
        g_tau = physics.rnea(sim.model, q, zero, zero)
        err_tau = float((kp * (qc - q) - g_tau).abs().max())
        assert err_tau < 1e-9, f"kp (q_c - q) differs from the gravity torque by {err_tau:.1e} N m"
        # Independent: the equilibrium by Newton's method on rnea (derivative by autograd).
        qs = qc.clone()
        for _ in range(20):
            x = qs.clone().requires_grad_(True)
            r = qc - x - physics.rnea(sim.model, x, torch.zeros_like(x), torch.zeros_like(x)) / kp
            (dr,) = torch.autograd.grad(r.sum(), x)
            qs = (x - r / dr).detach()
        err_q = float((q - qs).abs().max())
        offset = (qc - qs).abs()
        assert err_q < 1e-9, f"settled {err_q:.1e} rad from the gravity-loaded equilibrium"
        assert float(offset.min()) > 5e-3, "the gravity offset should be visible"
        # Analytic: g(q) = -m g l cos(q) (positive q about +y lowers the arm, so holding it takes a negative torque).
        np.testing.assert_allclose((kp * (qc - qs)).numpy(), (-1.0 * G * 0.2 * torch.cos(qs)).numpy(), rtol=1e-9)


# ================================================================= effort saturation
def test_effort_saturation_matches_aba():
    """Effort saturation matches aba.

    Effort interface on a two-link arm under gravity with URDF effort limits
    5 and 3 N m. Commands far above (+-20 L), near (L/2) and well below the
    limits, from random states (one batch of 6). One step of h = 1 ms from
    (q, v): the acceleration (v' - v)/h must equal aba(q, v, L tanh(cmd / L))
    (no damping or friction in the URDF, no limit penetration, so the linearly
    implicit correction is zero); tolerance 1e-9 relative to the largest
    acceleration (round-off of the solve and of v' - v). With
    effort_saturation=False the raw command goes through. The saturated torque
    is within 1e-8 of the limit for the commands at 20 L.
    """
    L = _t([5.0, 3.0])
    model = physics.load_urdf(_chain_urdf(["a", "b"], efforts=L.tolist()), dtype=F64)
    gen = torch.Generator().manual_seed(5)
    B = 6
    q = (torch.rand(B, 2, generator=gen, dtype=F64) - 0.5) * 2
    v = (torch.rand(B, 2, generator=gen, dtype=F64) - 0.5) * 2
    cmd = _t([[100.0, -60.0], [-100.0, 60.0], [2.5, -1.5], [0.05, 0.03], [1e4, 0.0], [-7.0, 4.0]])
    dt = 1e-3
    for saturate in (True, False):
        sim = physics.Simulator(model, physics.SimConfig(dt=dt, effort_saturation=saturate))
        with torch.no_grad():
            s1 = sim.step(sim.initial_state(q, v), cmd)
        acc = (s1.v - v) / dt
        tau = L * torch.tanh(cmd / L) if saturate else cmd
        ref = physics.aba(sim.model, q, v, tau)
        err = float((acc - ref).abs().max() / ref.abs().max())
        assert err < 1e-9, f"saturate={saturate}: acceleration differs from aba by {err:.1e} (relative)"
    sat = L * torch.tanh(cmd / L)
    assert float((sat[:2].abs() - L).abs().max()) < 1e-8
    assert bool((sat.abs() <= L).all())


# ================================================================= actuated_joints
def test_actuated_joints_map_by_name():
    """actuated_joints map the action by name.

    A three-joint chain (model order a, b, c) with actuated_joints = (b, a):
    action [u0, u1] is tau_b = u0, tau_a = u1, tau_c = 0. Effort interface: one
    step's acceleration equals aba(q, v, [u1, u0, 0]) within 1e-9 (relative).
    Position interface with per-joint gains in action order (kp = (kp_b, kp_a),
    kd likewise), explicit damping: aba with tau_b = kp_b (u0 - q_b) - kd_b v_b,
    tau_a = kp_a (u1 - q_a) - kd_a v_a, tau_c = 0. A name that is not a joint is
    a ConfigError naming it.
    """
    model = physics.load_urdf(_chain_urdf(["a", "b", "c"]), dtype=F64)
    assert model.joint_names == ["a", "b", "c"]
    gen = torch.Generator().manual_seed(6)
    B, dt = 4, 1e-3
    q = (torch.rand(B, 3, generator=gen, dtype=F64) - 0.5) * 2
    v = (torch.rand(B, 3, generator=gen, dtype=F64) - 0.5) * 2
    u = (torch.rand(B, 2, generator=gen, dtype=F64) - 0.5) * 4
    zero = torch.zeros(B, 1, dtype=F64)

    sim = physics.Simulator(model, physics.SimConfig(dt=dt, actuated_joints=("b", "a"), effort_saturation=False))
    assert sim.action_dim == 2 and sim.actuated_joints == ["b", "a"]
    with torch.no_grad():
        acc = (sim.step(sim.initial_state(q, v), u).v - v) / dt
    ref = physics.aba(sim.model, q, v, torch.cat((u[:, 1:2], u[:, 0:1], zero), -1))
    assert float((acc - ref).abs().max() / ref.abs().max()) < 1e-9
    # Same state, no torque on c even when the torques on a and b are large.
    passive = physics.aba(sim.model, q, v, torch.cat((u[:, 1:2], u[:, 0:1], zero + 5.0), -1))
    assert float((acc - passive).abs().max()) > 1.0, "a torque on c would have shown"

    kp, kd = (30.0, 70.0), (1.0, 3.0)                                   # (b, a)
    sim = physics.Simulator(model, physics.SimConfig(dt=dt, actuator="position", actuated_joints=("b", "a"),
                                                     kp=kp, kd=kd, effort_saturation=False,
                                                     implicit_damping=False))
    with torch.no_grad():
        acc = (sim.step(sim.initial_state(q, v), u).v - v) / dt
    tau_b = kp[0] * (u[:, 0] - q[:, 1]) - kd[0] * v[:, 1]
    tau_a = kp[1] * (u[:, 1] - q[:, 0]) - kd[1] * v[:, 0]
    ref = physics.aba(sim.model, q, v, torch.stack((tau_a, tau_b, zero[:, 0]), -1))
    assert float((acc - ref).abs().max() / ref.abs().max()) < 1e-9

    with pytest.raises(physics.ConfigError, match="'d' is not a joint"):
        physics.Simulator(model, physics.SimConfig(actuated_joints=("b", "d")))


# ================================================================= joint damping and friction
@pytest.mark.parametrize("implicit", [True, False])
def test_joint_damping_and_friction_decay(implicit):
    """Joint damping and friction make a pushed joint decay.

    The unactuated two-joint model, pushed and left alone (zero effort on
    both): the rotor (URDF damping d = 0.25 N m s/rad, I = 0.05 kg m^2, rate
    d/I = 5 /s) from 4 and -2 rad/s and the slider (URDF friction f = 6 N, m = 2 kg,
    deceleration f/m = 3 m/s^2) from 0.3 m/s; 0.2 s at h = 2 ms.

    Damping: v = v0 exp(-d t / I) exactly in continuous time; the linearly
    implicit step gives v_k = v0 / (1 + h d/I)^k, the explicit one
    v0 (1 - h d/I)^k: the simulator against its recursion within 1e-12 and
    against the exponential within h d/I * v0 / 2 (first-order Euler:
    ~ k c^2 / 2 relative, at most c/(2e) v0; c = h d/I = 0.01; measured
    0.0018 v0 against 0.005 v0).

    Friction (tau = -f tanh(v/eps), eps = 0.01 m/s), from 0.3 and 0.2 m/s:
    while v >> eps the deceleration is a = f/m. Explicit: asserted v(t) = v0 - a t
    within 1e-8 m/s while v0 - a t >= 10 eps (tanh(10) = 1 - 4e-9; measured
    7e-12 m/s). Linearly implicit, the friction's slope is its secant f tanh(v/eps)/v
    (physics/stages/passive.py), so each step decelerates by h a v / (v + h a): the
    simulator against that recursion within 1e-12, and against the line within its
    first-order lag, h a ln(v0 / 10 eps) summed over the early steps (6.6 and 4.2 mm/s;
    measured 6.0 mm/s). It then stops at d = v0^2 / (2 a) = 15 and 6.7 mm: within 4 %
    (explicit: semi-implicit Euler stops it v0 h / 2 short, 2 and 3 % relative, and that
    corrected distance within 1 %, measured 0.1 to 0.55 %: the tanh tail; implicit: 2 and
    3 % beyond, the secant's lag). The speed is below 1e-4 eps at the end, and it never
    moves backwards (no chatter).
    """
    model = physics.load_urdf(_TWO_JOINTS_URDF, dtype=F64)
    dt, steps = 2e-3, 100
    sim = physics.Simulator(model, physics.SimConfig(dt=dt, implicit_damping=implicit))
    eps = sim.config.joint_friction_smoothing
    v0 = _t([[0.3, 4.0], [0.2, -2.0]])
    tr = _run(sim, sim.initial_state(torch.zeros(2, 2, dtype=F64), v0), _const(torch.zeros(2, 2), steps))
    t = dt * torch.arange(steps + 1, dtype=F64)[:, None]

    # Damped rotor.
    c = dt * D_SPIN / I_SPIN
    k = torch.arange(steps + 1, dtype=F64)[:, None]
    rec = v0[:, 1] * ((1 + c) ** -k if implicit else (1 - c) ** k)
    w = tr.v[:, :, 1]
    assert float((w - rec).abs().max()) < 1e-12
    exact = v0[:, 1] * torch.exp(-D_SPIN * t / I_SPIN)
    err = ((w - exact).abs() / v0[:, 1].abs()).max()
    assert float(err) < c / 2, f"damped decay off the exponential by {float(err):.2e} v0 (bound {c / 2:.2e})"

    # Coulomb-frictional slider.
    x, vs = tr.q[:, :, 0], tr.v[:, :, 0]
    lin = v0[:, 0] - F_SLIDE / M_SLIDE * t
    early = lin >= 10 * eps
    a = F_SLIDE / M_SLIDE
    d = v0[:, 0] ** 2 / (2 * a)
    np.testing.assert_allclose(x[-1].numpy(), d.numpy(), rtol=0.04)
    if implicit:
        rec = [v0[:, 0]]
        for _ in range(steps):
            v = rec[-1]
            u = v / eps
            secant = torch.where(u.abs() < 1e-6, torch.ones_like(u), torch.tanh(u) / u) * F_SLIDE / eps
            rec.append(v - dt * F_SLIDE * torch.tanh(u) / (M_SLIDE + dt * secant))
        assert float((vs - torch.stack(rec)).abs().max()) < 1e-12
        for i in range(2):
            err_lin = float((vs[:, i] - lin[:, i])[early[:, i]].abs().max())
            lag = dt * a * math.log(float(v0[i, 0]) / (10 * eps))
            assert err_lin < lag, f"frictional deceleration off f/m by {err_lin:.1e} m/s (first-order lag {lag:.1e})"
    else:
        err_lin = float((vs - lin)[early].abs().max())
        assert err_lin < 1e-8, f"frictional deceleration off f/m by {err_lin:.1e} m/s"
        np.testing.assert_allclose(x[-1].numpy(), (d - v0[:, 0] * dt / 2).numpy(), rtol=0.01)
    assert float(vs[-1].abs().max()) < 1e-4 * eps
    assert float(vs.min()) > -1e-9, "friction must not reverse the motion"


# ================================================================= ground plane
TILT = math.radians(20.0)
NORMAL = (math.sin(TILT), 0.0, math.cos(TILT))          # R_y(20 deg) applied to z
DOWNHILL = (math.cos(TILT), 0.0, -math.sin(TILT))
QUAT_TILT = [0.0, math.sin(TILT / 2), 0.0, math.cos(TILT / 2)]  # the box's bottom parallel to the plane


def _on_slope(urdf, mu, half_height, contacts, ground_height=0.0, steps=300, dt=1e-3):
    """Place a body on the tilted plane at its resting penetration, and leave it alone."""
    model = physics.load_urdf(urdf, floating_base=True, dtype=F64)
    sim = physics.Simulator(model, physics.SimConfig(dt=dt, ground_normal=NORMAL, friction=mu,
                                                     ground_height=ground_height))
    pen = math.sqrt(float(model.mass.sum()) * G * math.cos(TILT) / (contacts * sim.config.contact_stiffness))
    p = [nk * (ground_height + half_height - pen) for nk in NORMAL]
    tr = _run(sim, sim.initial_state(_t([p + QUAT_TILT])), torch.zeros(steps, 1, 0, dtype=F64))
    along = tr.q[:, 0, 0:3] @ _t(DOWNHILL)                      # distance down the slope
    height = tr.q[:, 0, 0:3] @ _t(NORMAL)                       # distance along the normal
    return sim, tr, along, height, pen


def _acceleration(x, dt, t1, t2):
    v = (x[1:] - x[:-1]) / dt
    i1, i2 = int(round(t1 / dt)), int(round(t2 / dt))
    return float((v[i2] - v[i1]) / ((i2 - i1) * dt)), v


def test_box_slides_down_a_tilted_plane_at_coulomb_acceleration():
    """A box slides down a tilted plane at the Coulomb acceleration.

    ground_normal tilted 20 degrees about y, ground_height 0.5 m (along the
    normal), friction 0.2 < tan 20 = 0.364: a 1 kg 0.2 x 0.2 x 0.05 m box laid
    flat on the plane slides down with a = g (sin 20 - 0.2 cos 20) = 1.512 m/s^2,
    measured from its velocity between 0.05 s and 0.2 s: within 2 % (measured
    0.22 %). It keeps to the plane: its centre stays at 0.5 + 0.025 - pen along
    the normal, pen = sqrt(m g cos 20 / (4 k)) per corner (within 0.1 mm), it
    does not drift sideways (1e-9 m) and hardly turns (quaternion within 1e-3;
    measured 7e-5: the friction at its base pitches it onto its front corners
    by their difference in penetration).
    """
    dt = 1e-3
    sim, tr, along, height, pen = _on_slope(box_urdf(1.0, (0.2, 0.2, 0.05)), 0.2, 0.025, 4, ground_height=0.5,
                                            steps=200, dt=dt)
    a, v = _acceleration(along, dt, 0.05, 0.199)
    expected = G * (math.sin(TILT) - 0.2 * math.cos(TILT))
    assert abs(a / expected - 1) < 0.02, f"slides at {a:.4f} m/s^2, Coulomb predicts {expected:.4f}"
    assert float((height - (0.5 + 0.025 - pen)).abs().max()) < 1e-4
    assert float(tr.q[:, 0, 1].abs().max()) < 1e-9
    assert float((tr.q[:, 0, 3:7] - _t(QUAT_TILT)).abs().max()) < 1e-3


def test_ball_rolls_down_a_tilted_plane():
    """A ball rolls down a tilted plane.

    A ball does not stay put on a slope whatever the friction (rolling needs
    no slip): with mu = 0.2 (above the rolling limit 2/7 tan 20 = 0.104) it
    rolls at a = 5/7 g sin 20 = 2.397 m/s^2; with mu = 0.05 (below it) it
    slides at g (sin 20 - mu cos 20) = 2.894 m/s^2. Measured from the velocity
    between 0.05 and 0.15 s: within 1 % (measured 4e-14 rolling, 3e-4
    sliding). The rolling ball's contact point slips only at the small speed
    at which regularised friction carries 2/7 m g sin 20 (6 mm/s at mu = 0.2,
    eps = 1 cm/s; measured 6.1 mm/s): v - w r < 1 cm/s asserted, while the
    sliding ball's contact point slips at more than 10 % of its speed
    (measured 62 %).
    """
    dt, r = 1e-3, 0.05
    for mu, expected, rolls in ((0.2, 5 / 7 * G * math.sin(TILT), True),
                                (0.05, G * (math.sin(TILT) - 0.05 * math.cos(TILT)), False)):
        sim, tr, along, height, pen = _on_slope(ball_urdf(1.0, r), mu, r, 1, steps=150, dt=dt)
        a, v = _acceleration(along, dt, 0.05, 0.149)
        assert abs(a / expected - 1) < 0.01, f"mu={mu}: {a:.4f} m/s^2, expected {expected:.4f}"
        spin = float(tr.final.v[0, 4]) * r                        # body y rate times r (axes are tilted about y)
        slip = float(v[-1]) - spin
        if rolls:
            assert abs(slip) < 1e-2, f"mu={mu}: rolling ball slips at {slip:.4f} m/s"
        else:
            assert slip > 0.1 * float(v[-1])


def test_box_stays_put_on_a_tilted_plane_with_enough_friction():
    """A box stays put on a tilted plane with enough friction.

    Friction 0.8 > tan 20 = 0.364: the box laid on the 20-degree plane must
    stay put. Regularised Coulomb friction F = mu N v / sqrt(v^2 + eps^2) holds
    m g sin 20 only at a creep speed v = eps r / sqrt(1 - r^2),
    r = tan 20 / mu (5.1 mm/s at eps = 1 cm/s, the documented smoothing), so
    asserted: the steady speed at most 1.2 times that, and under 3 mm of
    travel in 0.15 s. (A per-point cap on the friction force once made this a
    viscous creep of 45.8 mm/s; friction is now in the linearly implicit solve.)
    """
    dt = 1e-3
    sim, tr, along, height, pen = _on_slope(box_urdf(1.0, (0.2, 0.2, 0.05)), 0.8, 0.025, 4, steps=150, dt=dt)
    r = math.tan(TILT) / 0.8
    creep = sim.config.friction_smoothing * r / math.sqrt(1 - r * r)
    speed = float((along[-1] - along[-2]) / dt)
    travel = float(along[-1] - along[0])
    assert speed <= 1.2 * creep, f"creeps at {speed * 1e3:.1f} mm/s, regularised Coulomb allows {creep * 1e3:.1f}"
    assert travel < 3e-3, f"slid {travel * 1e3:.1f} mm down a slope it should hold"


def test_ground_height_resting_sphere():
    """A sphere rests on the ground at ground_height.

    ground_height = 0.5 with the default (vertical) normal: a 1 kg ball of
    r = 5 cm rests with its centre at 0.5 + r - sqrt(m g / k) (0.3 mm of
    penetration at k = 1e7): one ball placed there stays within 1e-6 m over
    0.1 s; one dropped from 1 cm above never sinks below 0.5 m + r - 10 pen
    and is there within 1e-4 m after 0.3 s (still bobbing: the contact damping
    c pen = 9.4 N s/m damps at only ~5 /s; measured 1.3e-5 m, 2.4e-5 m at
    0.4 s); contact_forces reports the gap -pen and m g of normal force for
    the resting one.
    """
    model = physics.load_urdf(ball_urdf(1.0, 0.05), floating_base=True, dtype=F64)
    sim = physics.Simulator(model, physics.SimConfig(dt=1e-3, ground_height=0.5))
    pen = math.sqrt(1.0 * G / sim.config.contact_stiffness)
    z_rest = 0.5 + 0.05 - pen
    q0 = _t([[0, 0, z_rest, 0, 0, 0, 1], [0.1, -0.2, z_rest + 0.01, 0, 0, 0, 1]])
    tr = _run(sim, sim.initial_state(q0), torch.zeros(300, 2, 0, dtype=F64))
    assert float((tr.q[:101, 0, 2] - z_rest).abs().max()) < 1e-6
    assert float((tr.final.q[1, 2] - z_rest).abs()) < 1e-4
    assert float(tr.q[:, 1, 2].min()) > 0.5 + 0.05 - 10 * pen, "the dropped ball fell through the raised ground"
    _, gap, lam = sim.contact_forces(tr.final.q, tr.final.v)
    np.testing.assert_allclose(gap[0].numpy(), [-pen], atol=1e-9)
    np.testing.assert_allclose(lam[0].numpy(), [G], rtol=1e-6)


# ================================================================= self-collision
_SQUEEZE_URDF = f"""<robot name="squeeze">
  <link name="world"/>
  <link name="first">{_inertial(1.0)}<collision><geometry><sphere radius="0.05"/></geometry></collision></link>
  <link name="middle">{_inertial(0.01)}</link>
  <link name="last">{_inertial(1.0)}<collision><geometry><sphere radius="0.05"/></geometry></collision></link>
  <joint name="a" type="prismatic"><parent link="world"/><child link="first"/><axis xyz="1 0 0"/>{_limit()}</joint>
  <joint name="b" type="prismatic"><parent link="first"/><child link="middle"/><axis xyz="1 0 0"/>{_limit()}</joint>
  <joint name="c" type="prismatic"><parent link="middle"/><child link="last"/><origin xyz="0.105 0 0"/>
    <axis xyz="1 0 0"/>{_limit()}</joint>
</robot>"""


@pytest.mark.parametrize("self_collision", [True, False])
def test_self_collision_between_non_adjacent_links(self_collision):
    """Self-collision between non-adjacent links.

    A chain world -a-> first -b-> middle -c-> last, all prismatic along x,
    with a 5 cm sphere on `first` and on `last` (non-adjacent: `middle` is
    between them), no gravity and no ground. Efforts tau_b = tau_c = -F squeeze
    them together (the middle link gets no net force: F from b, -F from c;
    relative acceleration 2F/m). One batch: F = 4 and 10 N, each starting 5 mm
    apart (q_c = 0) and 0.1 m further (q_c = 0.1; they meet at 0.9 and
    1.4 m/s). 0.6 s at h = 2 ms (0.3 s without self-collision).

    With self_collision, the contact force k pen^2 balances F at rest:
    pen = sqrt(F / k) (0.63 and 1.0 mm at k = 1e7): within 0.1 % for the close
    starts (measured < 1e-4), within 10 % for the far ones (still bobbing after
    the hard impact; measured 5.6 %). The peak penetration never exceeds the
    undamped energy bound k p^3 / 3 = F (gap0 + p) (2.0 to 7.0 mm; measured
    1.7 to 4.6 mm, i.e. a few mm). Without it the spheres pass through each
    other: the last ends more than a diameter beyond the first.
    """
    model = physics.load_urdf(_SQUEEZE_URDF, dtype=F64)
    assert model.joint_names == ["a", "b", "c"]
    sim = physics.Simulator(model, physics.SimConfig(dt=2e-3, gravity=(0, 0, 0), ground=False,
                                                     self_collision=self_collision, effort_saturation=False))
    assert len(sim.pairs) == (1 if self_collision else 0)
    F = _t([4.0, 10.0, 4.0, 10.0])
    qc0 = _t([0.0, 0.0, 0.1, 0.1])
    q0 = torch.stack((torch.zeros(4, dtype=F64), torch.zeros(4, dtype=F64), qc0), -1)
    act = torch.stack((torch.zeros(4, dtype=F64), -F, -F), -1)
    tr = _run(sim, sim.initial_state(q0), _const(act, 300 if self_collision else 150))

    poses = physics.forward_kinematics(model, tr.q)                    # (T+1, B, links, 4, 4)
    dist = poses[..., model.link_index("last"), 0, 3] - poses[..., model.link_index("first"), 0, 3]
    gap0 = dist[0] - 0.1                                                # 5 mm and 105 mm
    pen = 0.1 - dist
    if not self_collision:
        assert bool((dist[-1] < -0.1).all()), f"spheres should pass through: final separation {dist[-1].tolist()}"
        return
    k = sim.config.contact_stiffness
    expected = torch.sqrt(F / k)
    np.testing.assert_allclose(pen[-1, :2].numpy(), expected[:2].numpy(), rtol=1e-3)
    np.testing.assert_allclose(pen[-1, 2:].numpy(), expected[2:].numpy(), rtol=0.1)
    # Energy bound for the peak: k p^3 / 3 = F (gap0 + p), by fixed-point iteration.
    bound = torch.full_like(F, 1e-3)
    for _ in range(50):
        bound = (3 * F * (gap0 + bound) / k) ** (1 / 3)
    peak = pen.max(0).values
    assert bool((peak <= bound).all()), f"peak penetration {peak.tolist()} above the energy bound {bound.tolist()}"
    assert float(peak.max()) < 5e-3


def test_gravity_compensation_removes_the_position_offset():
    """Gravity compensation removes the position offset.

    With ``gravity_compensation`` the position interface adds rnea(q, 0, 0) to
    the command, so the same pendulum settles at the commanded angle under
    gravity (|q - q_c| < 1e-9 rad), where without it it sags by g(q)/kp
    (0.007 to 0.019 rad, see the test above).
    """
    urdf = f"""<robot name="pendulum"><link name="world"/>
      <link name="arm">{_inertial(1.0, (0.2, 0, 0))}</link>
      <joint name="hinge" type="revolute"><parent link="world"/><child link="arm"/><axis xyz="0 1 0"/>
        {_limit(-3, 3)}</joint></robot>"""
    model = physics.load_urdf(urdf, dtype=F64)
    kp = 100.0
    kd = 2 * math.sqrt(kp * (1e-3 + 0.2 ** 2))
    qc = _t([[-1.0], [-0.3], [0.4], [1.2]])
    errs = {}
    for comp in (False, True):
        sim = physics.Simulator(model, physics.SimConfig(dt=1e-2, actuator="position", kp=kp, kd=kd,
                                                         effort_saturation=False, gravity_compensation=comp))
        tr = _run(sim, sim.initial_state(batch=qc.shape[0]), _const(qc, 100))
        errs[comp] = float((tr.final.q - qc).abs().max())
    assert errs[True] < 1e-9, f"settled {errs[True]:.1e} rad from the command with gravity compensation"
    assert errs[False] > 5e-3, f"without compensation the sag should be visible, got {errs[False]:.1e} rad"
