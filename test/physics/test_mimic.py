"""URDF <mimic> joints as coupled coordinates: q_mimic = multiplier * q_leader + offset.

A mimic joint is not a degree of freedom: the model's q/v (``nq``, ``nv``,
``joint_names``) leave it out, and every algorithm maps the reduced coordinates to
the full tree (v_full = G v, q_full = G q + c) and projects back (tau = G^T tau_full,
M = G^T M_full G). Checked here, in float64 over seeded random states:

* against Pinocchio's JointModelMimic (``buildModelFromUrdf(path, mimic=True)``):
  every link pose, M(q), the gravity torques, rnea, and aba (Pinocchio 4 has no aba
  for mimic joints: M^-1 (tau - nle) from its crba and rnea), to 1e-10 relative;
* against a second reference built by hand: Pinocchio's full model (mimic joints
  free) at q_full, projected with G (its own crba and rnea, no mimic code involved);
* on the Panda (its second finger mimics the first) and on a purpose-built tree whose
  mimic joints have multipliers 0.6 and -1.7 and offsets -0.2 and 0.3, one of them
  below its leader, one on a sibling branch with an independent joint below it;
* that the comparisons fail when the coupling is dropped (the mimic rows of G and the
  offsets zeroed: the mimic joints then stay at zero);
* gradients of a short Simulator rollout by torch.autograd.gradcheck;
* energy conservation of a frictionless pair of pendulums, the second mimicking the
  first (x -1.5, offset 0.4), with an elbow on the first, in the Simulator (RK4);
* the mimic joint's damping and friction folded into its leader's, and the errors of
  a mimic chain that is a cycle or whose leader does not move.
"""
from __future__ import annotations

import re

import numpy as np
import pytest
import torch

pin = pytest.importorskip("pinocchio", reason="Pinocchio (pip package 'pin') is the reference; not installed")

from diffsim_ros import physics  # noqa: E402
from diffsim_ros.physics.description import UrdfError  # noqa: E402
from pin_reference import PinReference, random_states, rel_err, symmetrised  # noqa: E402

F64 = torch.float64
TOL = 1e-10
N_STATES = 20
SEED = 1811


def _inertial(m, xyz, ixx, iyy, izz, ixy=0.0, ixz=0.0, iyz=0.0, rpy="0 0 0"):
    return ('<inertial><origin xyz="%s" rpy="%s"/><mass value="%g"/>'
            '<inertia ixx="%g" iyy="%g" izz="%g" ixy="%g" ixz="%g" iyz="%g"/></inertial>'
            % (xyz, rpy, m, ixx, iyy, izz, ixy, ixz, iyz))


def _limit(lo=-2.0, hi=2.0):
    return '<limit lower="%g" upper="%g" effort="10" velocity="5"/>' % (lo, hi)


# j3 mimics j2 below it (a gear); j4 (an axis off the coordinate axes) mimics j2 on a
# sibling branch and carries the independent prismatic j5. Independent: j1, j2, j5.
MIMIC_TREE = """<?xml version="1.0"?>
<robot name="mimic_tree">
  <link name="base">%s</link>
  <link name="l1">%s</link>
  <link name="l2">%s</link>
  <link name="l3">%s</link>
  <link name="l4">%s</link>
  <link name="l5">%s</link>
  <link name="tip"/>
  <joint name="j1" type="revolute"><parent link="base"/><child link="l1"/>
    <origin xyz="0 0 0.1"/><axis xyz="0 0 1"/>%s</joint>
  <joint name="j2" type="revolute"><parent link="l1"/><child link="l2"/>
    <origin xyz="0.1 0 0.2" rpy="0.1 0.2 0.3"/><axis xyz="0 1 0"/>%s
    <dynamics damping="0.1" friction="0.05"/></joint>
  <joint name="j3" type="revolute"><parent link="l2"/><child link="l3"/>
    <origin xyz="0 0.05 0.3" rpy="-0.2 0 0.1"/><axis xyz="1 0 0"/>%s
    <mimic joint="j2" multiplier="0.6" offset="-0.2"/></joint>
  <joint name="j4" type="revolute"><parent link="l1"/><child link="l4"/>
    <origin xyz="-0.1 0.1 0.15" rpy="0 0.3 0"/><axis xyz="0.36 0.48 0.8"/>%s
    <dynamics damping="0.2" friction="0.03"/><mimic joint="j2" multiplier="-1.7" offset="0.3"/></joint>
  <joint name="j5" type="prismatic"><parent link="l4"/><child link="l5"/>
    <origin xyz="0 0 0.2"/><axis xyz="0 1 0"/>%s</joint>
  <joint name="tip_joint" type="fixed"><parent link="l3"/><child link="tip"/><origin xyz="0.05 0 0.2"/></joint>
</robot>
""" % (_inertial(2.0, "0 0 0.05", 0.02, 0.02, 0.03),
       _inertial(1.0, "0.02 -0.01 0.1", 0.01, 0.012, 0.008, 0.001, -0.0005, 0.0002),
       _inertial(0.8, "0.01 0.02 0.15", 0.008, 0.009, 0.004, -0.0003, 0.0004, 0.0001, "0.1 0 0.2"),
       _inertial(0.5, "0 0 0.1", 0.003, 0.004, 0.002, 0.0002, 0, 0),
       _inertial(0.7, "-0.02 0.03 0.08", 0.005, 0.006, 0.003, 0, 0.0003, -0.0002),
       _inertial(0.3, "0.01 0 0.05", 0.001, 0.002, 0.0015),
       _limit(), _limit(), _limit(-3, 3), _limit(-3, 3), _limit(-0.5, 0.5))

# Two pendulums side by side; b mimics a (x -1.5, offset 0.4); a carries an elbow.
PENDULUMS = """<?xml version="1.0"?>
<robot name="mimic_pendulums">
  <link name="base">%s</link>
  <link name="arm_a">%s</link>
  <link name="forearm">%s</link>
  <link name="arm_b">%s</link>
  <joint name="hinge_a" type="continuous"><parent link="base"/><child link="arm_a"/>
    <axis xyz="0 1 0"/></joint>
  <joint name="elbow" type="continuous"><parent link="arm_a"/><child link="forearm"/>
    <origin xyz="0 0 -0.5"/><axis xyz="0 1 0"/></joint>
  <joint name="hinge_b" type="continuous"><parent link="base"/><child link="arm_b"/>
    <origin xyz="0.4 0 0"/><axis xyz="0 1 0"/><mimic joint="hinge_a" multiplier="-1.5" offset="0.4"/></joint>
</robot>
""" % (_inertial(1.0, "0 0 0", 0.01, 0.01, 0.01),
       _inertial(1.0, "0 0 -0.25", 0.02, 0.02, 0.002),
       _inertial(0.6, "0 0 -0.2", 0.01, 0.01, 0.001),
       _inertial(0.8, "0 0 -0.3", 0.02, 0.02, 0.002))


@pytest.fixture(scope="module")
def tree_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("mimic") / "mimic_tree.urdf"
    path.write_text(MIMIC_TREE)
    return str(path)


def _path(name, robots_dir, tree_path):
    if name == "panda":
        return str(robots_dir / "panda_description" / "urdf" / "panda.urdf")
    return tree_path


def _T(x):
    return torch.as_tensor(np.asarray(x), dtype=F64)


def _decoupled(model):
    """Return the model with the coupling dropped.

    Mimic rows of G and the offsets are zero (the mimic joints stay at 0, as if the URDF had no
    <mimic> and nothing drove them).
    """
    G = model.mimic_G.clone()
    for name in model.mimic_joints:
        G[(6 if model.floating_base else 0) + model.full_joint_names.index(name)] = 0.0
    return model.replace(mimic_G=G, mimic_offset=torch.zeros_like(model.mimic_offset))


class _Projected:
    """Reference by hand: Pinocchio's full model (mimic joints free), projected.

    It is evaluated at q_full = G q + c and projected with G. Fixed base, no continuous joints.
    """

    def __init__(self, path, model):
        self.pm = pin.buildModelFromUrdf(path)
        self.pd = self.pm.createData()
        G = model.mimic_G.numpy()
        c = model.mimic_offset.numpy()
        # Our full joint order -> Pinocchio's v order (by name).
        order = [self.pm.joints[self.pm.getJointId(n)].idx_v for n in model.full_joint_names]
        P = np.zeros((self.pm.nv, len(order)))
        P[order, np.arange(len(order))] = 1.0
        self.G = P @ G                      # reduced v -> Pinocchio's full v
        self.c = P @ c
        self.frames = [self.pm.getFrameId(n, pin.BODY) for n in model.link_names]

    def q_full(self, q):
        return self.G @ q + self.c

    def fk(self, q):
        pin.framesForwardKinematics(self.pm, self.pd, self.q_full(q))
        return np.stack([self.pd.oMf[i].homogeneous for i in self.frames])

    def crba(self, q):
        return self.G.T @ symmetrised(pin.crba(self.pm, self.pd, self.q_full(q))) @ self.G

    def rnea(self, q, v, a):
        return self.G.T @ pin.rnea(self.pm, self.pd, self.q_full(q), self.G @ v, self.G @ a)

    def gravity(self, q):
        return self.G.T @ pin.computeGeneralizedGravity(self.pm, self.pd, self.q_full(q))

    def aba(self, q, v, tau):
        return np.linalg.solve(self.crba(q), tau - self.rnea(q, v, 0 * v))


class _Mimic:
    """Pinocchio's JointModelMimic model through the project's name-based map."""

    def __init__(self, path, model):
        self.ref = PinReference(path, False, model.joint_names, model.link_names)
        assert self.ref.mimic and self.ref.model.nv == model.nv

    def fk(self, q):
        return self.ref.fk(q)

    def crba(self, q):
        return self.ref.crba(q)

    def rnea(self, q, v, a):
        return self.ref.rnea(q, v, a)

    def gravity(self, q):
        r = self.ref
        return r.v_from_pin(pin.computeGeneralizedGravity(r.model, r.data, r.q_to_pin(q)))

    def aba(self, q, v, tau):
        return self.ref.aba(q, v, tau)


def _compare(model, ref, q, v, a, tau):
    """Largest relative error of each quantity over the states."""
    qt, vt, at, tt = (_T(x) for x in (q, v, a, tau))
    ours = {
        "fk": physics.forward_kinematics(model, qt),
        "crba": physics.crba(model, qt),
        "gravity": physics.rnea(model, qt, torch.zeros_like(vt), torch.zeros_like(at)),
        "rnea": physics.rnea(model, qt, vt, at),
        "aba": physics.aba(model, qt, vt, tt),
    }
    theirs = {
        "fk": np.stack([ref.fk(x) for x in q]),
        "crba": np.stack([ref.crba(x) for x in q]),
        "gravity": np.stack([ref.gravity(x) for x in q]),
        "rnea": np.stack([ref.rnea(*s) for s in zip(q, v, a)]),
        "aba": np.stack([ref.aba(*s) for s in zip(q, v, tau)]),
    }
    dims = {"fk": 3, "crba": 2}
    return {k: float(rel_err(ours[k].numpy(), theirs[k], dims.get(k, 1)).max()) for k in ours}


@pytest.mark.parametrize("kind", ["pinocchio_mimic", "pinocchio_projected"])
@pytest.mark.parametrize("name", ["panda", "mimic_tree"])
def test_dynamics_match_pinocchio(name, kind, robots_dir, tree_path):
    path = _path(name, robots_dir, tree_path)
    model = physics.load_urdf(path, collision=False, dtype=F64)
    assert model.has_mimic
    ref = (_Mimic if kind == "pinocchio_mimic" else _Projected)(path, model)
    q, v, a = random_states(model.lower.numpy(), model.upper.numpy(), False, N_STATES, SEED)
    tau = np.stack([ref.rnea(*s) for s in zip(q, v, np.random.default_rng(SEED + 1).standard_normal(a.shape))])
    err = _compare(model, ref, q, v, a, tau)
    bad = {k: e for k, e in err.items() if not e <= TOL}
    assert not bad, f"{name} vs {kind}: relative errors over {TOL:g}: {bad}"
    # The same comparison fails without the coupling: the checks see it.
    dropped = _compare(_decoupled(model), ref, q, v, a, tau)
    for what in ("fk", "crba", "gravity", "rnea", "aba"):
        assert dropped[what] > 1e-4, f"{name} {what}: dropping the coupling went unnoticed ({dropped[what]:.2e})"


def test_coordinates(tree_path, robots_dir):
    m = physics.load_urdf(tree_path, collision=False, dtype=F64)
    assert (m.nq, m.nv, m.nq_full, m.nv_full) == (3, 3, 5, 5)
    assert m.joint_names == ["j1", "j2", "j5"]
    # Bodies are numbered as the tree is built (a link's child joints when it is reached).
    assert m.full_joint_names == ("j1", "j2", "j4", "j3", "j5")
    assert m.mimic_joints == ("j4", "j3") and m.mimic_leader == ("j2", "j2")
    q = torch.tensor([0.3, -0.7, 0.1], dtype=F64)
    torch.testing.assert_close(m.full_configuration(q),
                               torch.tensor([0.3, -0.7, -1.7 * -0.7 + 0.3, 0.6 * -0.7 - 0.2, 0.1], dtype=F64))
    torch.testing.assert_close(m.full_velocity(q), torch.tensor([0.3, -0.7, 1.19, -0.42, 0.1], dtype=F64))
    with pytest.raises(KeyError, match="'j4' of model 'mimic_tree' is a <mimic> of 'j2'"):
        m.joint_index("j4")
    # Damping and friction through the coupling: d2 + 1.7^2 d4 (j3 has none), f2 + 1.7 f4.
    torch.testing.assert_close(m.damping, torch.tensor([0.0, 0.1 + 1.7 ** 2 * 0.2, 0.0], dtype=F64))
    torch.testing.assert_close(m.friction, torch.tensor([0.0, 0.05 + 1.7 * 0.03, 0.0], dtype=F64))
    # Limits are the independent joints' own.
    torch.testing.assert_close(m.upper, torch.tensor([2.0, 2.0, 0.5], dtype=F64))
    # The link Jacobian is the full tree's times G (finite differences of FK through q).
    link = m.link_index("tip")
    J = physics.link_jacobian(m, q, link)
    eps = 1e-6
    fd = torch.stack([(physics.forward_kinematics(m, q + eps * e)[link, :3, 3]
                       - physics.forward_kinematics(m, q - eps * e)[link, :3, 3]) / (2 * eps)
                      for e in torch.eye(3, dtype=F64)], -1)
    torch.testing.assert_close(J, fd, rtol=1e-7, atol=1e-9)
    # A model without mimic joints has no map.
    plain = physics.load_urdf(re.sub(r"<mimic\b[^>]*/>", "", MIMIC_TREE), collision=False, dtype=F64)
    assert not plain.has_mimic and plain.mimic_G is None and plain.nv == plain.nv_full == 5
    assert plain.joint_names == list(plain.full_joint_names)


def test_mimic_chain_and_errors():
    base = MIMIC_TREE.replace('<mimic joint="j2" multiplier="0.6" offset="-0.2"/>',
                              '<mimic joint="j4" multiplier="0.6" offset="-0.2"/>')
    m = physics.load_urdf(base, collision=False, dtype=F64)
    # j3 = 0.6 j4 - 0.2 = 0.6 (-1.7 j2 + 0.3) - 0.2
    assert m.mimic_leader == ("j2", "j2")
    q = torch.tensor([0.0, 0.5, 0.0], dtype=F64)
    assert float(m.full_configuration(q)[3]) == pytest.approx(0.6 * (-1.7 * 0.5 + 0.3) - 0.2, abs=1e-15)
    cycle = base.replace('<mimic joint="j2" multiplier="-1.7" offset="0.3"/>',
                         '<mimic joint="j3" multiplier="-1.7" offset="0.3"/>')
    with pytest.raises(UrdfError, match=r"joint .j4.: the <mimic> chain j4 -> j3 -> j4 is a cycle"):
        physics.load_urdf(cycle, collision=False)
    fixed = MIMIC_TREE.replace('<mimic joint="j2" multiplier="0.6"', '<mimic joint="tip_joint" multiplier="0.6"')
    with pytest.raises(UrdfError, match="joint 'j3': <mimic> names joint 'tip_joint', which is not a moving"):
        physics.load_urdf(fixed, collision=False)


def _sim(model, **kw):
    cfg = dict(dt=1e-2, substeps=1, ground=False, joint_limits=False, joint_friction=False, joint_damping=False,
               actuator="effort", effort_saturation=False, gravity_compensation=False)
    cfg.update(kw)
    return physics.Simulator(model, physics.SimConfig(**cfg))


def test_rollout_gradients(tree_path):
    """Rollout gradients by gradcheck.

    d(final q, v)/d(initial q, v, efforts) of 4 steps, by gradcheck (finite differences),
    with the implicit damping path (URDF damping, folded) on.
    """
    model = physics.load_urdf(tree_path, collision=False, dtype=F64)
    sim = _sim(model, joint_damping=True, implicit_damping=True)
    gen = torch.Generator().manual_seed(3)
    q0 = (0.5 * torch.randn(2, 3, generator=gen, dtype=F64)).requires_grad_()
    v0 = torch.randn(2, 3, generator=gen, dtype=F64).requires_grad_()
    u = torch.randn(4, 2, 3, generator=gen, dtype=F64).requires_grad_()

    def rollout(q, v, acts):
        tr = sim.rollout(sim.initial_state(q, v), acts)
        return tr.final.q, tr.final.v

    assert torch.autograd.gradcheck(rollout, (q0, v0, u), eps=1e-6, atol=1e-7, rtol=1e-6)


def _energy(model, q, v):
    """Kinetic 1/2 v^T M v plus potential -sum m g . c of every body (J)."""
    M = physics.crba(model, q)
    kin = 0.5 * torch.einsum("...i,...ij,...j->...", v, M, v)
    R, p = physics.body_placements(model, q)
    com = p + (R @ model.com[..., None])[..., 0]
    pot = -(model.mass[:, None] * com * model.gravity).sum((-1, -2))
    return kin + pot


def test_energy_conservation_of_mimic_pendulums():
    """Mimic pendulums conserve energy.

    Frictionless, undamped, unactuated: total energy stays constant over 1 s (RK4 at
    2 ms; its truncation leaves a drift of 4e-10 here; tolerance 1e-8), while the
    pendulums swing and exchange energy through the coupling; the same run with the
    coupling dropped does not conserve the energy the coupled model measures (0.37
    relative: the check sees a wrong coupling in the dynamics).
    """
    model = physics.load_urdf(PENDULUMS, collision=False, dtype=F64)
    assert model.joint_names == ["hinge_a", "elbow"] and model.mimic_joints == ("hinge_b",)
    q0 = torch.tensor([[1.2, -0.5], [0.3, 1.5]], dtype=F64)
    v0 = torch.tensor([[0.0, 0.0], [2.0, -1.0]], dtype=F64)
    sim = _sim(model, dt=2e-3, integrator="rk4")
    tr = sim.rollout(sim.initial_state(q0, v0), torch.zeros(500, 2, 2, dtype=F64))
    E = _energy(model, tr.q, tr.v)                                    # (T+1, 2)
    swing = (tr.q[..., 0].max(0).values - tr.q[..., 0].min(0).values).min()
    assert swing > 1.0, "the pendulums should swing"
    drift = ((E - E[0]).abs().max(0).values / E[0].abs().clamp(min=1.0)).max()
    assert drift < 1e-8, f"energy drifts by {drift:.2e} (relative) over 1 s"
    # The mimic pendulum moves with its leader: its link pose is that of q_full.
    b = model.link_index("arm_b")
    R = physics.forward_kinematics(model, tr.q[-1])[:, b, :3, :3]
    ang = -1.5 * tr.q[-1, :, 0] + 0.4
    torch.testing.assert_close(R[:, 0, 2], torch.sin(ang), rtol=0, atol=1e-12)
    # Dropping the coupling in the dynamics (arm_b stays put) breaks conservation of this energy.
    wrong = _sim(_decoupled(model), dt=2e-3, integrator="rk4")
    tw = wrong.rollout(wrong.initial_state(q0, v0), torch.zeros(250, 2, 2, dtype=F64))
    Ew = _energy(model, tw.q, tw.v)
    wrong_drift = ((Ew - Ew[0]).abs().max(0).values / Ew[0].abs().clamp(min=1.0)).max()
    assert wrong_drift > 1e-3


def test_simulator_step_matches_reduced_dynamics(tree_path):
    """The simulator step matches the reduced dynamics.

    One explicit step (no implicit terms) moves v by dt * aba: the pipeline's
    acceleration stage projects as aba does.
    """
    model = physics.load_urdf(tree_path, collision=False, dtype=F64)
    sim = _sim(model, implicit_damping=False, dt=1e-3)
    q = torch.tensor([[0.2, -0.4, 0.1]], dtype=F64)
    v = torch.tensor([[0.5, 1.0, -0.3]], dtype=F64)
    u = torch.tensor([[0.3, -0.2, 0.1]], dtype=F64)
    new = sim.step(sim.initial_state(q, v), u)
    torch.testing.assert_close((new.v - v) / 1e-3, physics.aba(model, q, v, u), rtol=1e-10, atol=1e-10)


def test_the_stand_in_couples_the_panda_finger_as_the_simulator_does(robots_dir):
    """The stand-in couples the Panda's finger as the simulator does.

    example-robot-data's panda on the MuJoCo stand-in, its second finger a <mimic> of the first
    (multiplier 1, offset 0): under random position targets held 0.2 s each (seed printed), moving
    the arm and opening and closing the gripper, MuJoCo's equality constraint keeps the follower on
    its leader within 3 mm at the end of each hold and within 1 cm while the arm accelerates (the
    constraint is soft: time constant two substeps, and the fingers weigh 15 g each), and the
    leaders' trajectory matches the simulator's (one coordinate for both fingers). With the
    coupling switched off the same motion leaves the follower more than 6 mm off at the end of a
    hold (the targets keep the fingers 8-32 mm open; the check can fail).
    Gains kp 50, kd 10: over 164 seeds the arm and leader stayed within 2.4e-3 of the simulator,
    the follower within 0.75 mm (held) and 1.8 mm (moving). At kp 200 three seeds in 32 (246085998,
    126, 112) left the engines 5e-3-0.08 apart: every drive saturating at once against the soft
    coupling, not the coupling itself (without saturation those seeds agree within 4e-3).
    """
    import os
    import random
    import warnings

    from diffsim_ros import config
    from diffsim_ros.plant import MujocoPlant

    seed = int(os.environ.get("DIFFSIM_MIMIC_SEED", random.randrange(1 << 30)))
    print(f"DIFFSIM_MIMIC_SEED={seed}")
    path = str(robots_dir / "panda_description" / "urdf" / "panda.urdf")
    params = {"urdf": path, "floating_base": False, "simulator": {
        "dt": 0.02, "substeps": 5, "ground": False, "actuator": "position", "kp": 50.0, "kd": 10.0,
        "gravity_compensation": True, "joint_friction": False,
        # The two engines' joint stops differ (a penalty here, MuJoCo's constraint there: 0.17 rad
        # apart once an overshooting joint touches one), which is not what is compared here.
        "joint_limits": False}}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")                       # "mesh replaced by its bounding box"
        model = config.load_model(params, dtype=torch.float64)
        plants = {on: MujocoPlant(params) for on in (True, False)}
    assert model.joint_names[-1] == "panda_finger_joint1" and model.nq == 8
    plants[False].model.opt.disableflags |= int(plants[False]._mj.mjtDisableBit.mjDSBL_EQUALITY)
    lo, hi = model.lower.double().numpy(), model.upper.double().numpy()
    result = {}
    for on, plant in plants.items():
        rng = np.random.default_rng(seed)
        sim = physics.Simulator(model, config.simulator_config(params))
        st = sim.initial_state()
        mj = plant.model
        lead, follow = mj.joint("panda_finger_joint1").qposadr[0], mj.joint("panda_finger_joint2").qposadr[0]
        held, moving, worst_q, travel = 0.0, 0.0, 0.0, 0.0
        for k in range(40):
            if k % 10 == 0:
                target = rng.uniform(lo + 0.2 * (hi - lo), hi - 0.2 * (hi - lo))
            st = sim.step(st, torch.as_tensor(target))
            plant.step(target)
            q = plant.data.qpos
            gap = abs(q[follow] - q[lead])
            moving = max(moving, gap)
            if k % 10 == 9:
                held = max(held, gap)
            worst_q = max(worst_q, float(np.abs(plant.q - st.q.numpy()).max()))
            travel = max(travel, abs(q[lead]))
        result[on] = (held, moving, worst_q, travel)
    held, moving, worst_q, travel = result[True]
    assert travel > 0.005, (seed, travel)           # the fingers did move (their range is 0-0.04 m)
    assert held < 3e-3 and moving < 1e-2, (seed, result)
    assert worst_q < 5e-3, (seed, result)           # the arm and the leader as the simulator's
    assert result[False][0] > 6e-3, (seed, result)  # uncoupled, the follower is left behind
