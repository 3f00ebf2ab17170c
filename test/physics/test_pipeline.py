"""The pure step and its stages, each against something independent of the pipeline.

The public (Pinocchio-checked) rnea/crba/aba, per-point Jacobians built from unit
velocities, finite differences, and the step's own definition (purity, exact skipping).

Random draws print their seed so a failure replays.
"""
from __future__ import annotations

import random

import pytest
import torch

import pin_reference

from diffsim_ros import physics
from diffsim_ros.physics.kinematics import kinematics_record
from diffsim_ros.physics.stages.contact import contact

F64 = torch.float64


def _seed(tag: str) -> torch.Generator:
    seed = random.SystemRandom().randrange(2 ** 31)
    print(f"{tag}: seed {seed}")
    return torch.Generator().manual_seed(seed)


ROBOT_NAMES = [("diffsim_arm", False), ("diffsim_quadruped", True), ("ur5", False), ("panda", False),
               ("solo12", True)]


def _load(name):
    """Load our model of a pin_reference robot, with its collision geometry (meshes as boxes).

    None when example-robot-data is absent (the project's robots are always there).
    """
    import warnings
    case = pin_reference.ROBOTS_BY_NAME[name]
    if not case.project and pin_reference.example_robot_data_dir() is None:
        return None
    share = pin_reference.example_robot_data_share()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")   # meshes replaced by their bounding boxes
        return physics.load_urdf(case.path(), floating_base=case.floating, dtype=F64,
                                 package_dirs=[share] if share else None)


def _random_state(model, batch, gen):
    q = model.neutral_configuration((batch,))
    nb = 7 if model.floating_base else 0
    lo = torch.where(torch.isfinite(model.lower), model.lower, torch.full_like(model.lower, -3.0))
    hi = torch.where(torch.isfinite(model.upper), model.upper, torch.full_like(model.upper, 3.0))
    q[:, nb:] = lo + (hi - lo) * torch.rand(batch, model.nj, generator=gen, dtype=F64)
    if model.floating_base:
        q[:, 0:3] = torch.randn(batch, 3, generator=gen, dtype=F64) + torch.tensor([0, 0, 1.0], dtype=F64)
        quat = torch.randn(batch, 4, generator=gen, dtype=F64)
        q[:, 3:7] = quat / quat.norm(dim=-1, keepdim=True)
    v = torch.randn(batch, model.nv, generator=gen, dtype=F64)
    return q, v


@pytest.fixture(scope="module")
def robots():
    out = [(name, _load(name)) for name, _ in ROBOT_NAMES]
    return [(n, m) for n, m in out if m is not None]


def test_actuation_and_passive_forces_reach_the_equations_of_motion(robots):
    """Actuation and passive forces reach the equations of motion.

    Explicit step (no implicit terms, no ground): data.qdd equals aba(q, v, tau) with tau
    written out here: position PD kp (target - q) - kd v on the actuated joints, gravity
    compensation rnea(q, 0, 0), URDF damping and the tanh friction, on fixed- and
    floating-base robots.
    """
    gen = _seed("actuation")
    for name, model in robots:
        B, nj = 5, model.nj
        q, v = _random_state(model, B, gen)
        kp = 5.0 + 50.0 * torch.rand(nj, generator=gen, dtype=F64)
        kd = 0.5 + 2.0 * torch.rand(nj, generator=gen, dtype=F64)
        gcomp = not model.floating_base
        cfg = physics.SimConfig(dt=1e-3, actuator="position", kp=tuple(kp.tolist()), kd=tuple(kd.tolist()),
                                ground=False, implicit_damping=False, effort_saturation=False,
                                joint_limits=False, gravity_compensation=gcomp)
        sys = physics.build_system(model, cfg)
        target = torch.randn(B, nj, generator=gen, dtype=F64)
        state = physics.State(q=q, v=v)
        _, data = physics.step(sys, state, target)
        nq0, nv0 = (7, 6) if model.floating_base else (0, 0)
        qj, vj = q[:, nq0:], v[:, nv0:]
        tau_j = kp * (target - qj) - kd * vj - model.damping * vj - model.friction * torch.tanh(vj / 0.01)
        if gcomp:
            zero = torch.zeros_like(v)
            tau_j = tau_j + physics.rnea(sys.model, q, zero, zero)
        tau = torch.cat((torch.zeros(B, nv0, dtype=F64), tau_j), -1)
        want = physics.aba(sys.model, q, v, tau)
        torch.testing.assert_close(data.qdd, want, rtol=1e-9, atol=1e-9, msg=lambda m: f"{name}: {m}")


def test_linearly_implicit_step_solves_its_defining_equation(robots):
    """The linearly implicit step solves its defining equation.

    With implicit_damping the accelerations solve (M + h D + h^2 K) a = tau - b - h K v,
    D and K the slopes of the PD and damping terms (diagonal), checked with the public crba
    and rnea.
    """
    gen = _seed("implicit")
    for name, model in robots:
        B, nj = 3, model.nj
        q, v = _random_state(model, B, gen)
        kp, kd, h = 40.0, 2.0, 4e-3
        cfg = physics.SimConfig(dt=h, actuator="position", kp=kp, kd=kd, ground=False, effort_saturation=False,
                                joint_limits=False, joint_friction=False)
        sys = physics.build_system(model, cfg)
        target = torch.randn(B, nj, generator=gen, dtype=F64)
        _, data = physics.step(sys, physics.State(q=q, v=v), target)
        nq0, nv0 = (7, 6) if model.floating_base else (0, 0)
        qj, vj = q[:, nq0:], v[:, nv0:]
        pad = torch.zeros(B, nv0, dtype=F64)
        tau = torch.cat((pad, kp * (target - qj) - kd * vj - model.damping * vj), -1)
        D = torch.cat((pad, (kd + model.damping).expand(B, nj)), -1)
        K = torch.cat((pad, torch.full((B, nj), kp, dtype=F64)), -1)
        M = physics.crba(sys.model, q)
        b = physics.rnea(sys.model, q, v, torch.zeros_like(v))
        lhs = ((M + torch.diag_embed(h * D + h * h * K)) @ data.qdd[..., None])[..., 0]
        torch.testing.assert_close(lhs, tau - b - h * K * v, rtol=1e-9, atol=1e-8, msg=lambda m: f"{name}: {m}")


def test_applied_forces_are_the_pd_and_damping_torques_and_refuse_an_actuator_with_state(robots):
    """Applied forces are the PD and damping torques; an actuator with state is refused.

    physics.applied_forces: every generalised force but contact at a state, explicit. With
    the ground on (it must not count), PD targets and joint damping: kp (target - q) - kd v -
    d v on the joints, zero on a floating base; with the gravity compensation, plus the
    nominal model's gravity torques (the public rnea at rest). An actuator lag is refused.
    """
    gen = _seed("applied forces")
    for name, model in robots:
        B, nj = 3, model.nj
        q, v = _random_state(model, B, gen)
        kp, kd = 40.0, 2.0
        target = torch.randn(B, nj, generator=gen, dtype=F64)
        nq0, nv0 = (7, 6) if model.floating_base else (0, 0)
        qj, vj = q[:, nq0:], v[:, nv0:]
        pd = kp * (target - qj) - kd * vj - model.damping * vj
        for comp in (False, True):
            cfg = physics.SimConfig(dt=4e-3, actuator="position", kp=kp, kd=kd, ground=True, effort_saturation=False,
                                    joint_limits=False, joint_friction=False, gravity_compensation=comp)
            tau = physics.applied_forces(physics.build_system(model, cfg), q, v, target)
            want = pd + (physics.rnea(model, q, torch.zeros_like(v), torch.zeros_like(v))[:, nv0:] if comp else 0)
            torch.testing.assert_close(tau[:, nv0:], want, rtol=1e-10, atol=1e-10, msg=lambda m: f"{name}: {m}")
            assert not nv0 or float(tau[:, :nv0].abs().max()) == 0.0, name
        lagged = physics.build_system(model, physics.SimConfig(dt=4e-3, actuator="position", actuator_lag=0.01))
        with pytest.raises(ValueError, match="actuator without state"):
            physics.applied_forces(lagged, q, v, target)


def _point_jacobians(sys, q):
    """Build per-point (P, 3, nv) Jacobians of the contact points on the surface.

    From the kinematics of unit velocities (one environment per dof): independent of the blocks.
    """
    m = sys.model
    cs = sys.contact
    eye = torch.eye(m.nv, dtype=F64)
    kin = kinematics_record(m, q[None].expand(m.nv, -1).T.contiguous(), eye)
    R, p, tw = kin.R[cs.body], kin.p[cs.body], kin.vel[cs.body]                 # batch = dofs
    x = (R * cs.local[:, None, :, None]).sum(2) + p
    xc = x - cs.radius[:, None, None] * sys.ground_normal[:, None]
    vel = tw[:, 0:3] + torch.linalg.cross(tw[:, 3:6], xc, dim=1)                # (P, 3, nv)
    return vel


def test_contact_blocks_equal_the_point_jacobian_sums(robots):
    """The contact blocks equal the sums over points of the point Jacobians.

    The contact's implicit blocks mapped through the composite-rigid-body recursion equal
    the per-point sums written out with J_p built from unit velocities: the damping
    sum_p C_p J_p^T (1 - n n^T) J_p + d_p J_p^T n n^T J_p and the stiffness sum_p k_p J_p^T n n^T J_p,
    with C = mu lambda / sqrt(|v_t|^2 + eps^2), d = c pen and k = 2 k pen where the
    normal force is on (and zero elsewhere).
    """
    gen = _seed("contact blocks")
    for name, model in robots:
        if not model.floating_base:
            continue
        cfg = physics.SimConfig(dt=1e-3, actuator="position", ground=True)
        sys = physics.build_system(model, cfg)
        q, v = _random_state(model, 1, gen)
        v = 0.1 * v        # slow enough that the penetration's damping leaves a normal force
        # Lower the robot until some contact points penetrate (a few mm).
        _, gap, _ = physics.Simulator(sys).contact_forces(q, v)
        q[:, 2] -= float(gap.min()) + 0.004
        kin = kinematics_record(sys.model, q.T, v.T)
        from diffsim_ros.physics.algorithms import joint_space_inertia
        # Reference: the per-point quantities, written out.
        J = _point_jacobians(sys, q[0])
        n = sys.ground_normal
        Pm = torch.eye(3, dtype=F64) - torch.outer(n, n)
        R, p, tw = kin.R[sys.contact.body], kin.p[sys.contact.body], kin.vel[sys.contact.body]
        x = (R * sys.contact.local[:, None, :, None]).sum(2) + p
        xc = x - sys.contact.radius[:, None, None] * n[:, None]
        xd = (tw[:, 0:3] + torch.linalg.cross(tw[:, 3:6], xc, dim=1))[..., 0]
        vn = xd @ n
        vt = xd - vn[:, None] * n
        pen = torch.relu(-((x + kin.o)[..., 0] @ n - sys.contact.radius))
        for normal, select in ((False, False), (True, False), (True, True)):
            # select: only the groups near the ground, fewer than the bodies (blocks assembled per group)
            c = contact(sys, kin, implicit_friction=True, select=select, normal=normal)
            assert c.damping is not None and float(c.normal.max()) > 0, name
            assert (c.normal_blocks is not None) == normal, name
            if select:
                assert c.groups is not None and len(c.groups) < sys.model.nb, (name, c.groups)
            lam = c.flat(sys.contact, c.normal, 0.0)[:, 0]
            torch.testing.assert_close(lam, torch.relu(cfg.contact_stiffness * pen ** 2
                                                       - cfg.contact_damping * pen * vn))
            C = cfg.friction * lam / torch.sqrt((vt ** 2).sum(-1) + cfg.friction_smoothing ** 2)
            want = torch.einsum("p,pid,ij,pje->de", C, J, Pm, J)
            on = (lam > 0).to(F64)
            nn = torch.outer(n, n)
            blocks = [(c.damping, want)]
            if normal:
                # W: the normal blocks, the damping c W and the stiffness 2 k W.
                W = torch.einsum("p,pid,ij,pje->de", pen * on, J, nn, J)
                blocks += [(cfg.contact_damping * c.normal_blocks, cfg.contact_damping * W),
                           (2 * cfg.contact_stiffness * c.normal_blocks, 2 * cfg.contact_stiffness * W)]
            for got_blocks, ref in blocks:
                got = joint_space_inertia(sys.model, kin.S, got_blocks)[..., 0]
                torch.testing.assert_close(got, ref, rtol=1e-9, atol=1e-6 * float(ref.abs().max()),
                                           msg=lambda m: f"{name} (normal={normal}, select={select}): {m}")


def test_skipping_distant_contact_groups_is_exact(robots):
    """Skipping distant contact groups is exact.

    Contact with the near-ground selection equals contact over every group, in forces
    and in gradients, with some bodies on the ground and some far above it.
    """
    gen = _seed("selection")
    for name, model in robots:
        sys = physics.build_system(model, physics.SimConfig(dt=1e-3, actuator="effort", ground=True))
        if sys.contact.n == 0:
            continue
        q, v = _random_state(model, 4, gen)
        v = 0.1 * v
        if model.floating_base:
            q[:, 2] = 0.5 + torch.rand(4, generator=gen, dtype=F64)      # far up, but for env 0 ...
        # ... whose lowest point the ground is raised to, 3 mm into it.
        _, gap, _ = physics.Simulator(sys).contact_forces(q, v)
        sys = sys.replace(ground_height=sys.ground_height + gap[0].min() + 0.003)
        q.requires_grad_(True)
        outs = []
        for select in (True, False):
            kin = kinematics_record(sys.model, q.T, v.T)
            c = contact(sys, kin, implicit_friction=True, select=select)
            assert c.wrench.requires_grad, f"{name}: no contact at all in the drawn states"
            g, = torch.autograd.grad(c.wrench.square().sum(), q)
            outs.append((c.wrench.detach(), g))
        # The same sums over fewer terms: equal up to the order of the additions.
        torch.testing.assert_close(outs[0][0], outs[1][0], rtol=1e-12, atol=1e-12, msg=lambda m: f"{name}: {m}")
        torch.testing.assert_close(outs[0][1], outs[1][1], rtol=1e-10, atol=1e-10, msg=lambda m: f"{name}: {m}")
        assert float(outs[0][0].abs().max()) > 0, f"{name}: the drawn states should touch the ground"


def test_step_is_pure_and_system_replace_is_differentiable():
    """step() is pure, and System.replace is differentiable.

    step() changes none of its inputs and gives the same answer twice; a parameter put in
    with System.replace carries gradients that match central finite differences.
    """
    model = _load("diffsim_quadruped")
    cfg = physics.SimConfig(dt=2e-3, actuator="position", kp=20.0, kd=0.5)
    sys = physics.build_system(model, cfg)
    q0 = model.neutral_configuration((2,))
    q0[:, 2] = 0.25
    v0 = torch.zeros(2, model.nv, dtype=F64)
    v0[:, 0] = 0.8                                  # sliding: the friction coefficient matters
    state = physics.Simulator(sys).initial_state(q0, v0)
    action = torch.zeros(2, model.nj, dtype=F64) + 0.3
    copies = [t.clone() for t in (state.q, state.v, action, sys.model.mass, sys.friction)]
    a, _ = physics.step(sys, state, action)
    b, _ = physics.step(sys, state, action)
    assert torch.equal(a.q, b.q) and torch.equal(a.v, b.v)
    for before, after in zip(copies, (state.q, state.v, action, sys.model.mass, sys.friction)):
        assert torch.equal(before, after)

    def final_height(mass_scale, mu):
        s = sys.replace(model=sys.model.replace(mass=sys.model.mass * mass_scale), friction=mu)
        st = state
        for _ in range(40):
            st, _ = physics.step(s, st, action)
        return st.q[:, 0:3].sum()
    x = torch.tensor([1.2, 0.7], dtype=F64, requires_grad=True)
    grad, = torch.autograd.grad(final_height(x[0], x[1]), x)
    eps = 1e-6
    fd = []
    for i in range(2):
        e = torch.zeros(2, dtype=F64)
        e[i] = eps
        fd.append((final_height(*(x + e).detach()) - final_height(*(x - e).detach())) / (2 * eps))
    torch.testing.assert_close(grad, torch.stack(fd), rtol=1e-4, atol=1e-7)
    assert float(grad.abs().min()) > 0, "both parameters should change the motion"
    # The controller's model stays nominal under a replaced physics model.
    heavier = sys.replace(model=sys.model.replace(mass=sys.model.mass * 2))
    assert torch.equal(heavier.nominal.mass, sys.nominal.mass)
