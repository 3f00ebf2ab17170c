"""The soft ground contact (simulator.contact_model: soft) against MuJoCo, which has the same law.

A dropped ball bouncing and settling follows MuJoCo's trajectory (same step, Euler integration,
solref and solimp on both geoms) to round-off, for drawn masses, sizes, time constants, damping
ratios and impedance curves, where the penalty law does not; a tilted box landing corner after
corner within 1e-6 m; every step of a quadruped landing and sliding on its feet equals MuJoCo's
from the same state (the friction cone, its rows and MuJoCo's Newton solver). The
bodies' inverse weights equal MuJoCo's body_invweight0 on the robots' bodies that MuJoCo keeps
whole; the registry's contact_time_constant and contact_damping_ratio step as a configuration
holding them, per environment too, with gradients equal to central finite differences; wrong
settings (a compiled step too) are refused by name.

Drawn values print their seed (replay with DIFFSIM_SOFT_SEED=<seed>).
"""
from __future__ import annotations

import dataclasses
from typing import cast

import numpy as np
import pytest
import torch
import transforms3d

from conftest import drawn_seed

from diffsim_ros import config, physics
from diffsim_ros.analysis.errors import AnalysisError
from diffsim_ros.analysis.params import check_names
from diffsim_ros.physics.algorithms import body_inverse_weights, inverse_weights
from diffsim_ros.physics.registry import PARAMETERS, apply_per_episode, apply_values, from_perturbation

mujoco = pytest.importorskip("mujoco")

F64 = torch.float64
SEED_ENV = "DIFFSIM_SOFT_SEED"


def _write(tmp_path, name, geometry, mass, inertia):
    ixx, iyy, izz = inertia
    path = tmp_path / f"{name}.urdf"
    path.write_text(f"""<robot name="{name}"><link name="{name}">
  <inertial><mass value="{mass}"/><inertia ixx="{ixx}" iyy="{iyy}" izz="{izz}" ixy="0" ixz="0" iyz="0"/></inertial>
  <collision><geometry>{geometry}</geometry></collision></link></robot>""")
    return physics.load_urdf(str(path), floating_base=True, dtype=F64)


def _ball(tmp_path, mass, radius):
    i = 0.4 * mass * radius ** 2
    model = _write(tmp_path, "ball", f'<sphere radius="{radius}"/>', mass, (i, i, i))
    return model, f'<geom type="sphere" size="{radius}" mass="{mass}" {{contact}}/>'


def _box(tmp_path, mass, size):
    sx, sy, sz = size
    inertia = (mass * (sy * sy + sz * sz) / 12, mass * (sx * sx + sz * sz) / 12, mass * (sx * sx + sy * sy) / 12)
    model = _write(tmp_path, "box", f'<box size="{sx} {sy} {sz}"/>', mass, inertia)
    return model, f'<geom type="box" size="{sx / 2} {sy / 2} {sz / 2}" mass="{mass}" {{contact}}/>'


def _rollout(model, geom, cfg, q0, v0, steps):
    """Positions (steps, 3) of the body in the simulator and in MuJoCo from q0, v0 (x y z w quaternion)."""
    contact = (f'solref="{cfg.contact_time_constant} {cfg.contact_damping_ratio}" '
               f'solimp="{" ".join(str(x) for x in cfg.contact_impedance)}" friction="{cfg.friction} 0 0"')
    x, y, z, w = q0[3:7]
    xml = f"""<mujoco><option timestep="{cfg.dt}" integrator="Euler" cone="elliptic" impratio="100"/>
  <worldbody><geom type="plane" size="5 5 .1" {contact}/>
  <body pos="{q0[0]} {q0[1]} {q0[2]}" quat="{w} {x} {y} {z}"><freejoint/>{geom.format(contact=contact)}</body>
  </worldbody></mujoco>"""
    m = mujoco.MjModel.from_xml_string(xml)
    d = mujoco.MjData(m)
    d.qvel[:] = v0                  # the free joint's velocity: world linear, body angular (as the simulator's v)
    sim = physics.Simulator(model, cfg)
    state = sim.initial_state(torch.tensor([q0], dtype=F64), torch.tensor([v0], dtype=F64))
    ours, theirs = [], []
    for _ in range(steps):
        state = sim.step(state, torch.zeros(1, 0, dtype=F64))
        mujoco.mj_step(m, d)
        ours.append(state.q[0, :3].numpy().copy())
        theirs.append(d.qpos[:3].copy())
    return np.array(ours), np.array(theirs)


def _soft(rng, dt):
    d0 = rng.uniform(0.8, 0.95)
    return physics.SimConfig(dt=dt, contact_model="soft", friction=0.0,
                             contact_time_constant=float(rng.uniform(2.5 * dt, 0.06)),
                             contact_damping_ratio=float(rng.uniform(0.4, 2.0)),
                             contact_impedance=(d0, float(rng.uniform(d0, 0.99)), float(10 ** rng.uniform(-4, -2)),
                                                float(rng.uniform(0.2, 0.8)), float(rng.uniform(1.0, 3.0))))


def test_a_dropped_ball_follows_mujoco_and_the_penalty_law_does_not(tmp_path):
    rng = np.random.default_rng(drawn_seed("soft ball", SEED_ENV))
    for _ in range(3):
        dt = float(rng.choice([1e-3, 5e-4]))
        mass, radius = float(10 ** rng.uniform(-1, 0.7)), float(rng.uniform(0.02, 0.2))
        cfg = _soft(rng, dt)
        model, geom = _ball(tmp_path, mass, radius)
        q0 = [0.0, 0.0, radius + rng.uniform(0.0, 0.2), 0.0, 0.0, 0.0, 1.0]
        v0 = [0.0, 0.0, -rng.uniform(0.0, 2.0), 0.0, 0.0, 0.0]
        ours, theirs = _rollout(model, geom, cfg, q0, v0, int(0.8 / dt))
        print(f"m {mass:.3g} r {radius:.3g} {cfg.contact_time_constant:.4g} s {cfg.contact_damping_ratio:.3g} "
              f"{cfg.contact_impedance}: max |dz| {np.abs(ours - theirs).max():.3g}, rest "
              f"{radius - theirs[-1, 2]:.3g} m deep")
        assert theirs[:, 2].min() < radius                   # it touched
        np.testing.assert_allclose(ours, theirs, rtol=0, atol=1e-9)
        # The penalty law (the default) at its defaults sinks to another depth or bounces otherwise.
        penalty, theirs_again = _rollout(model, geom, dataclasses.replace(cfg, contact_model="penalty"), q0, v0,
                                         int(0.8 / dt))
        assert np.abs(penalty - theirs_again).max() > 1e-5


def test_a_tilted_box_lands_and_settles_as_in_mujoco(tmp_path):
    rng = np.random.default_rng(drawn_seed("soft box", SEED_ENV))
    for _ in range(2):
        size = tuple(float(x) for x in rng.uniform(0.05, 0.3, 3))
        mass = float(rng.uniform(0.2, 5.0))
        cfg = _soft(rng, 1e-3)
        model, geom = _box(tmp_path, mass, size)
        w, x, y, z = transforms3d.euler.euler2quat(*rng.uniform(-0.4, 0.4, 3))
        q0 = [0.0, 0.0, max(size) + 0.05, x, y, z, w]
        ours, theirs = _rollout(model, geom, cfg, q0, [0.0] * 6, 1000)
        print(f"box {size} {mass:.3g} kg: max |d| {np.abs(ours - theirs).max(0)}")
        # Seen: below 1e-7 m over drawn boxes (MuJoCo's friction rows kept at its smallest
        # coefficient 1e-5, as the simulator's; bounding friction by the normal row's force
        # instead left them 0.17 mm apart).
        np.testing.assert_allclose(ours, theirs, rtol=0, atol=1e-6)
        assert theirs[-1, 2] < q0[2] - 0.05                  # it landed


@pytest.mark.parametrize("training_file", ["config/locomotion_velocity_solo12.yaml", "config/locomotion_velocity.yaml",
                                           "config/reach_arm.yaml"])
def test_inverse_weights_are_mujocos_for_bodies_and_for_links_fixed_to_them(training_file):
    from diffsim_ros.plant.mujoco_plant import MujocoPlant
    params = config.load_yaml(training_file)
    plant = MujocoPlant(params, training_file)
    m, pm = plant.model, plant.physics_model
    whole = body_inverse_weights(pm).numpy()
    links = inverse_weights(pm, torch.tensor(pm.link_body), cast(torch.Tensor, pm.link_com)).numpy()
    compared = 0
    for i, name in enumerate(pm.link_names):
        mid = mujoco.mj_name2id(m, mujoco.mjtObj.mjOBJ_BODY, name)
        if pm.link_body[i] < 0 or mid < 0 or m.body_mass[mid] == 0:
            continue      # fixed to the world, not a body in MuJoCo's model, or massless (MuJoCo's compiler
            #               places such a body's centre among its geoms, the simulator at the link's origin)
        # MuJoCo keeps the links fixed to a body as bodies of their own (fusestatic off): each
        # link's weight at its own centre of mass is MuJoCo's.
        np.testing.assert_allclose(links[i], m.body_invweight0[mid], rtol=1e-8, err_msg=name)
        if sum(1 for b in pm.link_body if b == pm.link_body[i]) == 1:   # a body of one link: its own weight
            np.testing.assert_allclose(whole[pm.link_body[i]], m.body_invweight0[mid], rtol=1e-8, err_msg=name)
        compared += 1
    assert compared >= pm.nb


@pytest.fixture(scope="module")
def quadruped():
    params = config.load_yaml("config/locomotion_velocity.yaml")
    model = config.load_model(params, dtype=F64)
    cfg = dataclasses.replace(config.simulator_config(params), dt=2e-3, substeps=1, contact_model="soft")
    return model, cfg


def _standing(model, batch, gen):
    q = model.neutral_configuration((batch,))
    q[:, 7:] = torch.tensor([0.0, 0.8, -1.6] * 4, dtype=F64) + 0.1 * torch.randn(batch, 12, generator=gen, dtype=F64)
    q[:, 2] = 0.29 + 0.01 * torch.randn(batch, generator=gen, dtype=F64)
    v = 0.3 * torch.randn(batch, model.nv, generator=gen, dtype=F64)
    return q, v


def _run(sim, q, v, steps=30):
    s = sim.initial_state(q, v)
    a = torch.zeros(q.shape[0], sim.system.action_dim, dtype=F64)
    for _ in range(steps):
        s = sim.step(s, a)
    return s


def test_soft_contact_parameters_step_as_configured_and_per_environment(quadruped):
    model, cfg = quadruped
    seed = drawn_seed("soft parameters", SEED_ENV)
    rng, gen = np.random.default_rng(seed), torch.Generator().manual_seed(seed)
    q, v = _standing(model, 3, gen)
    nominal = physics.build_system(model, cfg)
    rows = []
    for _ in range(3):
        tc, zeta = float(rng.uniform(0.01, 0.06)), float(rng.uniform(0.5, 2.0))
        applied = apply_values(nominal, {"contact_time_constant": torch.tensor([tc], dtype=F64),
                                         "contact_damping_ratio": torch.tensor([zeta], dtype=F64)})
        built = physics.build_system(model, dataclasses.replace(cfg, contact_time_constant=tc,
                                                                contact_damping_ratio=zeta))
        a, b = _run(physics.Simulator(applied), q, v), _run(physics.Simulator(built), q, v)
        torch.testing.assert_close(a.q, b.q, rtol=0, atol=1e-12)
        assert float((a.q - _run(physics.Simulator(nominal), q, v).q).abs().max()) > 1e-6
        rows.append((tc, zeta, a.q[0]))       # environment 0 of each draw
    per = apply_per_episode(nominal, {"contact_time_constant": torch.tensor([[r[0]] for r in rows], dtype=F64),
                                      "contact_damping_ratio": torch.tensor([[r[1]] for r in rows], dtype=F64)})
    s = _run(physics.Simulator(per), q[0:1].expand(3, -1).clone(), v[0:1].expand(3, -1).clone())
    for i, row in enumerate(rows):
        torch.testing.assert_close(s.q[i], row[2], rtol=0, atol=1e-12)


@pytest.mark.parametrize("name", ["contact_time_constant", "contact_damping_ratio"])
def test_soft_contact_gradients_match_finite_differences(quadruped, name):
    model, cfg = quadruped
    gen = torch.Generator().manual_seed(drawn_seed(f"soft gradient {name}", SEED_ENV))
    q, v = _standing(model, 4, gen)
    nominal = physics.build_system(model, cfg)
    x0 = float(PARAMETERS[name].nominal(nominal)[0]) * float(torch.empty(1).uniform_(0.7, 1.4, generator=gen))

    def loss(x):
        s = _run(physics.Simulator(apply_values(nominal, {name: x.reshape(1)})), q, v, steps=20)
        return s.q[:, 0:3].sum() + 0.1 * s.v.square().sum()
    x = torch.tensor(x0, dtype=F64, requires_grad=True)
    (g,) = torch.autograd.grad(loss(x), x)
    eps = 1e-6 * x0
    fd = (loss(torch.tensor(x0 + eps, dtype=F64)) - loss(torch.tensor(x0 - eps, dtype=F64))) / (2 * eps)
    print(f"{name} {x0:.4g}: autograd {float(g):.6g}, finite differences {float(fd):.6g}")
    assert abs(float(fd)) > 1e-6
    assert abs(float(g) - float(fd)) <= 1e-4 * abs(float(fd))


def test_wrong_soft_contact_settings_are_refused_by_name(quadruped):
    model, cfg = quadruped
    with pytest.raises(physics.ConfigError, match="'simulator.contact_model': the soft contact has no compiled step"):
        physics.Simulator(model, cfg, compile=True)
    with pytest.raises(physics.ConfigError, match="contact_model.*semi_implicit"):
        physics.SimConfig(contact_model="soft", integrator="rk4").check()
    with pytest.raises(physics.ConfigError, match="contact_impedance"):
        physics.SimConfig(contact_model="soft", contact_impedance=(0.9, 1.2, 0.001, 0.5, 2.0)).check()
    with pytest.raises(physics.ConfigError, match="contact_model"):
        physics.SimConfig(contact_model="mujoco")
    with pytest.raises(AnalysisError, match="'contact_stiffness' belongs to the penalty ground contact"):
        check_names(["contact_stiffness"], model, cfg)
    with pytest.raises(AnalysisError, match="'contact_time_constant' belongs to the soft ground contact"):
        check_names(["contact_time_constant"], model, dataclasses.replace(cfg, contact_model="penalty"))
    # The stand-in's contact time constant is the soft contact's truth, and nothing on the penalty law.
    soft = physics.build_system(model, cfg)
    assert float(from_perturbation(soft, {"contact_time_constant": 0.04})["contact_time_constant"][0]) == 0.04
    assert "contact_time_constant" not in from_perturbation(physics.build_system(model, dataclasses.replace(
        cfg, contact_model="penalty")), {"contact_time_constant": 0.04})


def test_a_quadruped_sliding_onto_the_ground_steps_as_mujoco(tmp_path):
    """Each step of a quadruped landing and sliding on its feet equals MuJoCo's step from the same state.

    The stand-in's ground (elliptic cone, impratio 100, MuJoCo's Newton solver at a tight
    tolerance), MuJoCo stepping at the simulator's substep, no drive torques, joint damping or
    limits (whose implicit terms MuJoCo solves apart from the contact). The base starts above
    the floor with a drawn sliding velocity and yaw rate; every step, the simulator starts from
    MuJoCo's state; compared while only spheres and boxes touch (a collapsed quadruped's shank
    cylinder meets the ground at MuJoCo's own points, not at the simulator's rim points).
    Measured: at most 9e-9 m/s apart, with feet on the cone's surface (MuJoCo's cone zone, where
    a law bounding friction by the normal row's force alone parts from it); the penalty law is
    metres per second apart.
    """
    from diffsim_ros.plant.mujoco_plant import MujocoPlant
    rng = np.random.default_rng(drawn_seed("soft quadruped", SEED_ENV))
    p = config.load_yaml("config/locomotion_velocity.yaml")
    params = {k: p[k] for k in ("urdf", "floating_base")}
    params["simulator"] = dict(p["simulator"], contact_model="soft", actuator="effort", joint_damping=False,
                               joint_friction=False, joint_limits=False, gravity_compensation=False, dt=1e-3,
                               substeps=1, contact_time_constant=float(rng.uniform(0.01, 0.06)),
                               friction=float(rng.uniform(0.3, 1.0)))
    for key in ("actuator_lag", "velocity_limits"):
        params["simulator"].pop(key, None)
    plant = MujocoPlant(params, step_refinement=1,         # the floor's time constant is the stand-in's perturbation
                        perturbation={"contact_time_constant": params["simulator"]["contact_time_constant"]})
    plant.model.opt.tolerance = 1e-14
    plant.model.opt.iterations = 200
    model = config.load_model(params, dtype=F64)
    cfg = config.simulator_config(params)
    sims = {law: physics.Simulator(model, dataclasses.replace(cfg, contact_model=law)) for law in ("soft", "penalty")}
    q0 = np.r_[0.0, 0.0, p["task"]["base_height"] + 0.02, 0, 0, 0, 1, np.zeros(plant.model.nq - 7)]
    q0[7:][[plant.joint_names.index(j) for j in params["simulator"]["actuated_joints"]]] = p["task"]["stance"]
    v0 = np.zeros(model.nv)
    v0[0:2], v0[5] = rng.uniform(-1, 1, 2), rng.uniform(-2, 2)
    plant.reset(q0, v0)
    zero = torch.zeros(1, len(params["simulator"]["actuated_joints"]), dtype=F64)
    worst = {"soft": 0.0, "penalty": 0.0}
    contact_steps, zones = 0, set()
    # Steps where only spheres and boxes touch: their contact points are MuJoCo's; a cylinder's rim
    # points are not (MuJoCo's plane-cylinder contact places its own), seen 1.6e-3 m/s apart.
    same_points = {int(mujoco.mjtGeom.mjGEOM_SPHERE), int(mujoco.mjtGeom.mjGEOM_BOX)}
    for _ in range(600):                           # until 80 steps in contact are compared
        if contact_steps >= 80:
            break
        q, v = (torch.tensor(x[None], dtype=F64) for x in (plant.q, plant.v))
        ours = {law: sim.step(sim.initial_state(q, v), zero).v[0].numpy() for law, sim in sims.items()}
        plant.step(zero.numpy()[0])
        m, d = plant.model, plant.data
        shapes = {int(m.geom_type[g]) for c in d.contact[:d.ncon] for g in c.geom if m.geom_bodyid[g] != 0}
        if d.ncon and shapes <= same_points:
            contact_steps += 1
            zones |= set(int(z) for z in plant.data.efc_state[:plant.data.nefc])
            for law in worst:
                worst[law] = max(worst[law], float(np.abs(ours[law] - plant.v).max()))
    print(f"tc {cfg.contact_time_constant:.4g} s, mu {cfg.friction:.3g}: {contact_steps} steps in contact, "
          f"zones {sorted(zones)}, max |dv| {worst}")
    assert contact_steps >= 20                     # a hard floor bounces it: 22 of its first 200 steps
    assert int(mujoco.mjtConstraintState.mjCNSTRSTATE_CONE) in zones       # feet on the cone's surface
    assert worst["soft"] < 1e-6
    assert worst["penalty"] > 1e-2
