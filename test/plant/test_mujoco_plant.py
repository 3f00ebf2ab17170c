"""The MuJoCo plant (diffsim_ros.plant) against independent references (issue 5).

* MuJoCo vs our simulator: with no perturbation, the plant (MuJoCo's dynamics, the
  simulator's actuator laws) and physics.Simulator agree on short rollouts under the same
  commands: the arm under position commands (PD + gravity compensation + effort
  saturation + URDF damping), the quadrotor under CTBR hover and a rate step (rate loop,
  mixer, motor lag, drag). Both integrate with semi-implicit Euler and treat damping and
  the PD gains linearly implicitly, and the stand-in applies the simulator's smoothed joint
  friction, so the only differences left are round-off (measured below 1e-14); MuJoCo's own
  frictionloss constraint (perturbation constraint_friction) is compared separately
  (and in test_friction_agreement.py).
* Each perturbation has the effect it claims, against analytic values.
* Bad configuration raises ConfigError naming the key; bad commands raise ValueError.
"""
from __future__ import annotations

import copy
import math

import numpy as np
import pytest
import torch

from conftest import REPO_ROOT, drawn_seed

pytest.importorskip("mujoco", reason="the plant runs on MuJoCo (pip package 'mujoco')")

from diffsim_ros import config, physics  # noqa: E402
from diffsim_ros.physics import ConfigError  # noqa: E402
from diffsim_ros.testing.recordings import ARM_RECORDING_GAINS  # noqa: E402
from diffsim_ros.plant import MujocoPlant, Perturbation  # noqa: E402

ARM_YAML = REPO_ROOT / "config" / "reach_arm.yaml"
HOVER_YAML = REPO_ROOT / "config" / "hover.yaml"
F64 = torch.float64


def _params(path, **simulator):
    """Return the urdf/floating_base/simulator part of a config file, with simulator overrides."""
    p = config.load_yaml(path)
    out = {k: copy.deepcopy(p[k]) for k in ("urdf", "floating_base", "simulator") if k in p}
    out["simulator"].update(simulator)
    return out


def _compare(params, q0, commands, perturbation=None):
    """Max |q| and |v| differences per step between the plant and the simulator (float64)."""
    plant = MujocoPlant(params, initial_q=q0, perturbation=perturbation)
    model = config.load_model(params, dtype=F64)
    sim = physics.Simulator(model, config.simulator_config(params))
    st = sim.initial_state(torch.tensor(q0, dtype=F64))
    dq, dv, vmax = [], [], np.zeros(model.nv)
    for c in commands:
        st = sim.step(st, torch.tensor(c, dtype=F64))
        plant.step(c)
        dq.append(np.abs(plant.q - st.q.numpy()).max())
        dv.append(np.abs(plant.v - st.v.numpy()).max())
        vmax = np.maximum(vmax, np.abs(plant.v))
    return np.array(dq), np.array(dv), plant, vmax


ARM_Q0 = [0.0, 0.2, -0.3, 0.1]
# Two position targets, 0.5 s each: the arm swings through most of its PD range and the
# light wrist (arm_joint4) reaches 10 rad/s right after the switch.
ARM_COMMANDS = [[0.3, 0.5, -0.4, 0.2]] * 25 + [[-0.5, -0.3, 0.6, -0.4]] * 25


# ============================================================ plant vs simulator
def test_arm_position_commands_match_simulator():
    """Arm position commands on the stand-in match the simulator.

    reach_arm.yaml (dt 0.02 s, 2 substeps, PD kp/kd, gravity compensation, tanh effort
    saturation, URDF damping, joint limits) without joint friction, 1 s of position steps.

    Tolerance 1e-9 rad, 1e-8 rad/s: the two discrete updates are the same equations (MuJoCo's
    Euler with implicit dof damping carrying s kd + h s kp, the simulator's linearly implicit
    step), so they differ only by round-off (measured: 7e-16 rad, 2e-14 rad/s).
    """
    dq, dv, plant, _ = _compare(_params(ARM_YAML, joint_friction=False), ARM_Q0, ARM_COMMANDS)
    assert np.ptp(np.array(ARM_COMMANDS), 0).max() > 0.5
    assert np.abs(plant.q - ARM_Q0).max() > 0.3, "the arm should move (else the comparison shows little)"
    assert dq.max() < 1e-9, f"arm joint positions differ from the simulator's by {dq.max():.2e} rad"
    assert dv.max() < 1e-8, f"arm joint velocities differ from the simulator's by {dv.max():.2e} rad/s"


def test_arm_with_joint_friction_matches_simulator():
    """The arm with joint friction on the stand-in matches the simulator.

    The same 1 s with the URDF's Coulomb friction (0.01-0.02 N m), the stand-in applying the
    simulator's smoothed law: round-off again (measured 4e-15 rad, 4e-13 rad/s).
    """
    dq, dv, _, _ = _compare(_params(ARM_YAML), ARM_Q0, ARM_COMMANDS)
    assert dq.max() < 1e-9 and dv.max() < 1e-8, (dq.max(), dv.max())


def test_arm_with_constraint_friction_converges_to_simulator():
    """The arm with constraint friction converges to the simulator.

    With Perturbation constraint_friction the engines model the friction differently: MuJoCo as
    its frictionloss constraint, the simulator as a tanh (0.01 rad/s) whose slope enters the
    implicit step. At the config's 10 ms substeps the two part at each start from rest; both
    converge to the same motion as the substep shrinks. Over the first 0.2 s: asserted below
    2.5e-3 rad at 20 substeps and at least 5 times smaller than at 2, for soft PD gains
    (kp 10/15/8/3, kd 1/1.5/0.5/0.1).
    """
    cmds = ARM_COMMANDS[:10]
    soft = dict(kp=list(ARM_RECORDING_GAINS[0]), kd=list(ARM_RECORDING_GAINS[1]))    # the soft servo
    gap = {"constraint_friction": True}
    coarse, _, _, _ = _compare(_params(ARM_YAML, **soft), ARM_Q0, cmds, gap)
    fine, _, _, _ = _compare(_params(ARM_YAML, substeps=20, **soft), ARM_Q0, cmds, gap)
    print(f"constraint friction, first 0.2 s: {coarse.max():.2e} rad at 2 substeps, {fine.max():.2e} at 20")
    assert fine.max() < 2.5e-3, f"at 1 ms substeps plant and simulator differ by {fine.max():.2e} rad"
    assert fine.max() < coarse.max() / 5, (coarse.max(), fine.max())


HOVER_Q0 = [0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 1.0]


def test_quadrotor_ctbr_hover_matches_simulator():
    """The quadrotor's CTBR hover on the stand-in matches the simulator.

    hover.yaml (CTBR, dt 0.02 s, 4 substeps): 1 s at hover thrust from (0, 0, 1) m.
    Tolerance 1e-10 m (measured 5e-15): a hover that drifts in either engine would show.
    """
    mg = 1.0 * 9.81
    dq, dv, plant, _ = _compare(_params(HOVER_YAML), HOVER_Q0, [[mg, 0.0, 0.0, 0.0]] * 50)
    assert abs(plant.q[2] - 1.0) < 1e-9
    assert dq.max() < 1e-10 and dv.max() < 1e-10, (dq.max(), dv.max())


def test_quadrotor_rate_step_matches_simulator():
    """The quadrotor's response to a rate step on the stand-in matches the simulator.

    A body-rate step (p = 1, q = -0.5, r = 0.3 rad/s, thrust 10.5 N) for 0.4 s, then hover
    thrust and zero rates for 0.5 s: the rate loop, mixer, motor lag, rotor torques, drag
    and rigid-body motion, compared with the simulator. Tolerance 1e-9 (m, rad/s; measured
    5e-15 m and 1e-14 m/s): the free-flyer Euler of both engines is the same update.
    """
    cmds = [[9.81, 0, 0, 0]] * 5 + [[10.5, 1.0, -0.5, 0.3]] * 20 + [[9.81, 0, 0, 0]] * 25
    dq, dv, plant, vmax = _compare(_params(HOVER_YAML), HOVER_Q0, cmds)
    assert vmax[3] > 0.5 and np.linalg.norm(plant.q[3:6]) > 0.05, "the quadrotor should have rotated"
    assert dq.max() < 1e-9 and dv.max() < 1e-9, (dq.max(), dv.max())


# ============================================================ perturbations
def test_mass_scale_changes_hover_thrust_by_the_scale():
    """mass_scale changes the hover thrust by the scale.

    mass_scale 1.2: the thrust that holds altitude is 1.2 m g. At 1.2 m g the plant stays at
    1 m for 1 s (1e-9 m); at the nominal m g it sinks with specific force (m g - drag)/(1.2 m)
    along body z (Newton with the scaled mass, drag from the measured velocity).
    """
    params = _params(HOVER_YAML)
    p = MujocoPlant(params, initial_q=HOVER_Q0, perturbation={"mass_scale": 1.2})
    m0 = MujocoPlant(params).mass
    assert p.mass == pytest.approx(1.2 * m0, rel=1e-12)
    assert p.hover_thrust == pytest.approx(1.2 * m0 * 9.81, rel=1e-12)
    for _ in range(50):
        s = p.step([1.2 * m0 * 9.81, 0, 0, 0])
    assert abs(s.position[2] - 1.0) < 1e-9
    p.reset()
    for _ in range(15):                            # 0.3 s = 15 motor time constants: thrust has settled
        s = p.step([m0 * 9.81, 0, 0, 0])
    vz = s.linear_velocity_body[2]
    drag = 0.15 * vz + 0.04 * abs(vz) * vz         # hover.yaml drag_linear/drag_quadratic along z
    expected = (m0 * 9.81 - drag) / (1.2 * m0)
    assert vz < -0.1
    assert s.specific_force[2] == pytest.approx(expected, rel=2e-3)


def test_drag_scale_doubles_drag_force():
    """drag_scale 2 doubles the drag force.

    Level flight at 2 m/s along x, rotors at hover: the only horizontal force is the drag,
    F = -(D1 v + D2 v^2) = -(0.1*2 + 0.02*4) = -0.28 N. The measured specific force along x
    is F/m, and twice that with drag_scale 2 (0.5 %: v falls by < 1 % in the step).
    """
    params = _params(HOVER_YAML)
    v0 = [2.0, 0, 0, 0, 0, 0]
    fx = {}
    for scale in (1.0, 2.0):
        p = MujocoPlant(params, initial_q=HOVER_Q0, initial_v=v0, perturbation={"drag_scale": scale})
        s = p.step(None)                           # hold: hover thrust, zero rates
        v = s.linear_velocity_body[0]
        fx[scale] = s.specific_force[0]
        assert fx[scale] * p.mass == pytest.approx(-scale * (0.1 * v + 0.02 * v * v), rel=5e-3)
    assert fx[2.0] / fx[1.0] == pytest.approx(2.0, rel=5e-3)
    assert fx[1.0] * 1.0 == pytest.approx(-0.28, rel=2e-2)


@pytest.mark.parametrize("scale", [0.85, 1.1])
def test_thrust_scale_means_the_registry_parameter(scale):
    """perturbation.thrust_scale means the registry parameter.

    perturbation.thrust_scale on the stand-in is the registry's thrust_scale in the simulator
    (physics/registry.py, from_perturbation): the same body-rate step and hover as above,
    the stand-in perturbed and the simulator given the registry value, agree to 1e-9; the
    unperturbed simulator is visibly off (the peer).
    """
    from diffsim_ros.analysis.params import build_simulator
    from diffsim_ros.physics.registry import from_perturbation

    params = _params(HOVER_YAML)
    cmds = [[9.81, 0, 0, 0]] * 5 + [[10.5, 1.0, -0.5, 0.3]] * 20 + [[9.81, 0, 0, 0]] * 25
    plant = MujocoPlant(params, initial_q=HOVER_Q0, perturbation={"thrust_scale": scale})
    model, cfg = config.load_model(params, dtype=F64), config.simulator_config(params)
    values = from_perturbation(physics.build_system(model, cfg), {"thrust_scale": scale})
    assert values["thrust_scale"].tolist() == [scale]
    runs = {}
    for label, sim in (("registry", build_simulator(model, cfg, values)), ("nominal", physics.Simulator(model, cfg))):
        st = sim.initial_state(torch.tensor(HOVER_Q0, dtype=F64))
        for c in cmds:
            st = sim.step(st, torch.tensor(c, dtype=F64))
        runs[label] = [st.q.numpy().copy()]
    for c in cmds:
        plant.step(c)
    gap = np.abs(plant.q - runs["registry"][-1]).max()
    peer = np.abs(plant.q - runs["nominal"][-1]).max()
    assert gap < 1e-9 and peer > 1e-3, (gap, peer)


def test_added_joint_damping_decays_free_joint():
    """Added joint damping decays a free joint.

    The arm upright (q = 0: every centre of mass on the yaw axis, no gravity torque), the
    yaw joint spinning at 2 rad/s, zero effort, no friction: I w' = -(b + b_added) w. MuJoCo's
    implicit Euler gives exactly w_k = w_0 (I / (I + h b))^k with I from our CRBA (an
    independent inertia); the decay follows the added damping, and joint_damping_scale 0
    removes the URDF part. (With I = 1e-3 kg m^2 and h = 10 ms, h b / I = 0.5: the discrete
    solution, not exp(-b t / I), is the reference.)
    """
    params = _params(ARM_YAML, joint_friction=False, actuator="effort", velocity_limits=False)
    model = config.load_model(params, dtype=F64)
    inertia = float(physics.crba(model, torch.zeros(4, dtype=F64))[0, 0])
    b_urdf = float(model.damping[0])
    cases = [({}, b_urdf), ({"added_joint_damping": 0.02}, b_urdf + 0.02),
             ({"added_joint_damping": 0.02, "joint_damping_scale": 0.0}, 0.02)]
    for pert, b in cases:
        p = MujocoPlant(params, initial_v=[2.0, 0, 0, 0], perturbation=pert)
        for _ in range(10):
            s = p.step([0.0] * 4)
        k = 10 * p.substeps
        expected = 2.0 * (inertia / (inertia + p.h * b)) ** k
        assert s.velocity[0] == pytest.approx(expected, rel=1e-9), pert
        assert s.velocity[0] < 2.0 * 0.99 ** k


def test_actuator_lag_on_joint_torque():
    """An actuator lag on the joint torque.

    actuator_lag 0.05 s: an effort step reaches u (1 - exp(-t / tau)) at the end of each
    control step (the lag is discretised exactly per substep).
    """
    params = _params(ARM_YAML, joint_friction=False, actuator="effort", gravity_compensation=False,
                     effort_saturation=False)
    p = MujocoPlant(params, perturbation={"actuator_lag": 0.05})
    u = np.array([1.0, -0.5, 0.3, 0.1])
    for k in range(1, 4):
        p.step(u)
        np.testing.assert_allclose(p.joint_state().effort, u * (1 - math.exp(-k * p.dt / 0.05)), rtol=1e-12)
    p0 = MujocoPlant(params)
    p0.step(u)
    np.testing.assert_allclose(p0.joint_state().effort, u, rtol=0)


def test_a_lagged_servo_matches_the_simulator_and_settles():
    """A lagged servo on the stand-in matches the simulator and settles.

    reach_arm.yaml's drive (stiff PD, 10 ms substeps, velocity limits, joint friction) with a
    torque lag drawn in 5-40 ms: the stand-in and the simulator apply the lag's share of the PD
    gains implicitly, the same equations, so they agree to round-off; and at the end of the
    second half-second hold the arm is within 0.01 rad of where the unlagged servo ends, moving at
    under 0.5 rad/s. Applied explicitly, the lagged servo was unstable at these substeps whatever
    the lag: the light wrist chattered at up to 50 rad/s (10 ms) instead of settling.
    """
    seed = drawn_seed("lagged servo", "DIFFSIM_PLANT_SEED")
    lag = float(np.random.default_rng(seed).uniform(0.005, 0.04))
    dq, dv, plant, _ = _compare(_params(ARM_YAML, actuator_lag=lag), ARM_Q0, ARM_COMMANDS)
    assert dq.max() < 1e-9 and dv.max() < 1e-8, (lag, dq.max(), dv.max())
    _, _, free, _ = _compare(_params(ARM_YAML), ARM_Q0, ARM_COMMANDS)
    print(f"lag {lag:.4f} s: end {plant.q} against the unlagged servo's {free.q}")
    assert np.abs(plant.q - free.q).max() < 0.01 and np.abs(plant.v).max() < 0.5, (lag, plant.q, free.q, plant.v)


def test_latency_delays_the_response():
    """A latency delays the response by exactly its steps.

    Latency 0.04 s = 2 control steps at hover: the response to a rate step is the
    undelayed response shifted by exactly 2 steps (hover before it is an exact equilibrium).
    """
    params = _params(HOVER_YAML)
    cmds = [[10.0, 0.5, 0.2, -0.3]] * 10 + [[9.81, 0, 0, 0]] * 5
    ref = MujocoPlant(params, initial_q=HOVER_Q0)
    lat = MujocoPlant(params, initial_q=HOVER_Q0, perturbation={"latency": 0.04})
    assert lat.delay_substeps == 2 * lat.substeps
    qr = [ref.step(c) and ref.q for c in cmds]
    ql = [lat.step(c) and lat.q for c in cmds]
    assert np.abs(ql[0] - HOVER_Q0).max() < 1e-12 and np.abs(ql[1] - HOVER_Q0).max() < 1e-12
    np.testing.assert_allclose(np.array(ql[2:]), np.array(qr[:-2]), atol=1e-12)


def test_sensor_noise_has_its_std_and_leaves_the_truth():
    """Sensor noise has its standard deviations and leaves the truth.

    sensor_noise [0.01, 0.05]: measured minus true positions/velocities have those standard
    deviations (400 steps x 4 joints, 10 %), and the true trajectory equals the noise-free one
    (noise is only in the measurement).
    """
    params = _params(ARM_YAML)
    noisy = MujocoPlant(params, perturbation={"sensor_noise": [0.01, 0.05], "seed": 3})
    clean = MujocoPlant(params)
    ep, ev = [], []
    for _ in range(400):
        s = noisy.step(None)
        clean.step(None)
        t = noisy.true_joint_state()
        ep.append(s.position - t.position)
        ev.append(s.velocity - t.velocity)
    np.testing.assert_array_equal(noisy.q, clean.q)
    assert np.std(ep) == pytest.approx(0.01, rel=0.1)
    assert np.std(ev) == pytest.approx(0.05, rel=0.1)


def test_default_perturbation_is_none():
    p = Perturbation()
    assert p.is_identity and p.mass_scale == 1.0 and p.latency == 0.0 and p.actuator_lag is None
    assert p.sensor_noise == (0.0, 0.0)
    assert Perturbation.from_mapping({"actuator_lag": -1.0}).actuator_lag is None   # ROS: no nulls


# ============================================================ state and interfaces
def test_quadrotor_state_conventions():
    """The quadrotor's state conventions.

    Orientation x y z w, world/body linear velocity, body rates, specific force at rest = -g
    in the body frame; set_state round-trips the simulator convention.
    """
    p = MujocoPlant(_params(HOVER_YAML))
    a = 0.3
    q = [1.0, 2.0, 3.0, 0.0, 0.0, math.sin(a / 2), math.cos(a / 2)]      # yaw a
    v = [1.0, 0.0, 0.0, 0.0, 0.0, 0.5]
    p.reset(q, v)
    s = p.base_state()
    np.testing.assert_allclose(p.q, q, atol=1e-15)
    np.testing.assert_allclose(p.v, v, atol=1e-15)
    np.testing.assert_allclose(s.orientation, q[3:7], atol=1e-15)
    np.testing.assert_allclose(s.linear_velocity_world, [math.cos(a), math.sin(a), 0.0], atol=1e-15)
    np.testing.assert_allclose(s.linear_velocity_body, [1.0, 0.0, 0.0], atol=1e-15)
    np.testing.assert_allclose(s.specific_force, [0, 0, 9.81], atol=1e-12)
    assert p.command_names("rotor_thrust") == ["rotor_0", "rotor_1", "rotor_2", "rotor_3"]
    # per-rotor thrust interface: hover thrust per rotor holds altitude
    p.reset(HOVER_Q0)
    for _ in range(20):
        s = p.step([p.hover_thrust / 4] * 4, interface="rotor_thrust")
    assert abs(s.position[2] - 1.0) < 1e-9


def test_arm_state_by_name_and_velocity_interface():
    p = MujocoPlant(_params(ARM_YAML), interface="velocity")
    for _ in range(25):
        s = p.step([0.5, 0.0, 0.0, 0.0])
    assert list(s.by_name()) == ["arm_joint1", "arm_joint2", "arm_joint3", "arm_joint4"]
    assert s.by_name()["arm_joint1"][1] == pytest.approx(0.5, abs=0.05)   # kd drives v to the target
    assert p.time == pytest.approx(25 * 0.02)


def test_bad_commands_are_rejected_with_the_reason():
    p = MujocoPlant(_params(ARM_YAML))
    with pytest.raises(ValueError, match="3 entries, expected 4"):
        p.step([0.0, 0.0, 0.0])
    with pytest.raises(ValueError, match="non-finite entries for arm_joint2"):
        p.step([0.0, float("nan"), 0.0, 0.0])
    with pytest.raises(ValueError, match="interface 'ctbr'"):
        p.step([9.81, 0, 0, 0], interface="ctbr")
    with pytest.raises(ConfigError, match="'interface': .* cannot take 'ctbr' commands"):
        MujocoPlant(_params(ARM_YAML), interface="ctbr")


# ============================================================ bad configuration
@pytest.mark.parametrize("change, key", [
    (lambda p: p["simulator"].update(kp=[1.0, 2.0]), "'simulator.kp'"),
    (lambda p: p["simulator"].update(actuator="ctbr"),
     "'simulator.actuator' is 'ctbr', which needs a 'rotors' section"),
    (lambda p: p["simulator"].update(dt=-1.0), "'simulator.dt' must be > 0 s"),
    (lambda p: p["simulator"].update(actuated_joints=["arm_joint9"]), "'simulator.actuated_joints'"),
    (lambda p: p.update(urdf="urdf/nope.urdf"), "'urdf'"),
    (lambda p: p.update(floating_base="yes"), "'floating_base'"),
], ids=["kp_length", "rotor_interface_on_arm", "dt", "unknown_joint", "urdf_missing", "floating_base"])
def test_bad_config_names_the_key(change, key):
    params = _params(ARM_YAML)
    change(params)
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        MujocoPlant(params, source="reach_arm.yaml")


@pytest.mark.parametrize("pert, key", [
    ({"mass_scale": 0.0}, "perturbation.mass_scale"),
    ({"mas_scale": 1.2}, "perturbation.mas_scale"),
    ({"latency": -0.1}, "perturbation.latency"),
    ({"sensor_noise": [0.1, 0.2, 0.3]}, "perturbation.sensor_noise"),
    ({"drag_scale": "2"}, "perturbation.drag_scale"),
])
def test_bad_perturbation_names_the_key(pert, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        MujocoPlant(_params(HOVER_YAML), perturbation=pert)


def test_bad_rotor_link_names_it():
    params = _params(HOVER_YAML)
    params["simulator"]["rotors"]["rotor_links"] = ["rotor_0", "rotor_1", "rotor_2", "rotor_9"]
    with pytest.raises(ConfigError, match="rotor_9"):
        MujocoPlant(params)


def _standing(plant, params, lift):
    """Reset a legged plant ``lift`` m above its standing height, its joints at the task's stance."""
    q0 = np.r_[0.0, 0.0, params["task"]["base_height"] + lift, 0, 0, 0, 1, np.zeros(plant.model.nq - 7)]
    q0[7:][[plant.joint_names.index(j) for j in params["simulator"]["actuated_joints"]]] = params["task"]["stance"]
    plant.reset(q0)
    return q0


def test_a_harder_floor_is_the_contact_time_constant():
    """A harder floor is a smaller contact_time_constant.

    The quadruped standing in its stance: a smaller contact_time_constant than MuJoCo's
    default lets its feet sink less (a harder floor), a larger one more. Below twice the stand-in's
    MuJoCo step it is refused; a negative ROS value is MuJoCo's default.
    """
    params = config.load_yaml(REPO_ROOT / "config" / "locomotion_velocity.yaml")
    stance = np.asarray(params["task"]["stance"])

    def sink(**pert):
        plant = MujocoPlant(params, perturbation=pert)
        _standing(plant, params, 0.01)
        for _ in range(150):
            plant.step(stance)
        d = plant.data
        feet = [i for i in range(plant.model.ngeom) if plant.model.geom_type[i] == 2]   # the foot spheres
        return -min(float(d.geom_xpos[i][2] - plant.model.geom_size[i][0]) for i in feet)
    soft, hard, softer = sink(), sink(contact_time_constant=0.005), sink(contact_time_constant=0.05)
    assert 0 < hard < 0.5 * soft < 0.5 * softer, (hard, soft, softer)
    with pytest.raises(ConfigError, match=r"contact_time_constant.*twice the stand-in's MuJoCo step \(0.001 s\)"):
        MujocoPlant(params, perturbation={"contact_time_constant": 0.0009})      # its step: 0.5 ms
    assert Perturbation.from_mapping({"contact_time_constant": -1.0}).contact_time_constant is None


# ============================================================ the floor's friction is Coulomb's
_BOX_URDF = """<robot name="box">
  <link name="box">
    <inertial><mass value="{m}"/><inertia ixx="{i}" iyy="{i}" izz="{i}" ixy="0" ixz="0" iyz="0"/></inertial>
    <collision><geometry><box size="0.2 0.2 0.1"/></geometry></collision>
  </link>
  <link name="flap">
    <inertial><mass value="0.001"/><inertia ixx="1e-6" iyy="1e-6" izz="1e-6" ixy="0" ixz="0" iyz="0"/></inertial>
  </link>
  <joint name="hinge" type="revolute"><parent link="box"/><child link="flap"/><axis xyz="0 0 1"/>
    <limit lower="-1" upper="1" effort="1" velocity="1"/></joint>
</robot>
"""


def _pushed(plant, q0, command, force, steps=150, onset=50, observe=None):
    """Observe a plant pushed by a horizontal force on its base.

    ``observe()`` (default: the base's x, m) after each control step of ``plant`` reset to
    ``q0`` holding ``command``, a horizontal force ``force`` (N) on the base from step ``onset`` on.
    """
    observe = observe or (lambda: plant.q[0])
    plant.reset(np.asarray(q0, dtype=float))
    out = []
    for k in range(steps):
        plant.data.xfrc_applied[1, 0] = force if k >= onset else 0.0
        plant.step(command)
        out.append(observe())
    return out


def _mujoco_default_friction(plant):
    """Build the plant with MuJoCo's default friction (pyramidal cone, impratio 1): the wrong floor."""
    import mujoco
    plant.model.opt.cone = mujoco.mjtCone.mjCONE_PYRAMIDAL
    plant.model.opt.impratio = 1.0
    return plant


def test_a_box_on_the_floor_holds_below_the_friction_limit_and_slides_at_the_coulomb_rate_above(tmp_path):
    """A box on the floor holds below the friction limit and slides at the Coulomb rate above.

    A box of drawn mass on a floor of drawn friction mu, pushed sideways by a drawn fraction of
    mu m g. Coulomb's law: below the limit it stays put, above it accelerates at (F - mu m g) / m.
    The stand-in's floor creeps below 0.1 mm/s where MuJoCo's default friction creeps faster
    than that, and slides within 3 % of the analytic rate (MuJoCo's constraint is soft).
    """
    from conftest import drawn_seed
    rng = np.random.default_rng(drawn_seed("box on the floor", "DIFFSIM_TEST_BOX_SEED"))
    for _ in range(3):
        m, mu = float(rng.uniform(0.5, 5.0)), float(rng.uniform(0.3, 1.0))
        urdf = tmp_path / "box.urdf"
        urdf.write_text(_BOX_URDF.format(m=m, i=m * (0.2 ** 2 + 0.1 ** 2) / 12))
        params = {"urdf": str(urdf), "floating_base": True,
                  "simulator": {"dt": 0.01, "substeps": 5, "ground": True, "friction": mu}}
        q0 = [0, 0, 0.05, 0, 0, 0, 1.0, 0.0]
        weight = (m + 0.001) * 9.81
        below, above = float(rng.uniform(0.2, 0.8)), float(rng.uniform(1.2, 1.6))
        xs = np.array(_pushed(MujocoPlant(params), q0, np.zeros(1), below * mu * weight))
        creep = abs(xs[-1] - xs[-51]) / 0.5
        assert creep < 1e-4, (m, mu, below, creep)
        default = _mujoco_default_friction(MujocoPlant(params))
        xs_default = np.array(_pushed(default, q0, np.zeros(1), below * mu * weight))
        assert abs(xs_default[-1] - xs_default[-51]) / 0.5 > 1e-4, "MuJoCo's default friction should creep"
        xs = np.array(_pushed(MujocoPlant(params), q0, np.zeros(1), above * mu * weight))
        t = np.arange(len(xs)) * 0.01
        accel = 2 * np.polyfit(t[60:], xs[60:], 2)[0]
        expected = (above - 1) * mu * 9.81          # (F - mu m g) / m with F = above mu m g
        assert abs(accel - expected) < 0.03 * expected, (m, mu, above, accel, expected)


@pytest.mark.parametrize("robot", ["quadruped", "solo12"])
def test_a_standing_legged_robot_pushed_below_its_friction_limit_keeps_its_feet(robot):
    """A standing legged robot pushed below its friction limit keeps its feet.

    A legged robot standing in its stance, its base pushed sideways at a drawn 0.15-0.4 of
    mu m g (a step push much past 0.4 tips the quadruped over): Coulomb's law keeps its feet
    still. On the stand-in's floor the geoms touching the ground creep below 1.5 mm/s; on
    MuJoCo's default friction at centimetres per second, the skid that made stance feet slide on
    the stand-in (issue 39).
    """
    from conftest import drawn_seed
    rng = np.random.default_rng(drawn_seed(f"{robot} pushed", "DIFFSIM_TEST_PUSH_SEED"))
    name = "locomotion_velocity.yaml" if robot == "quadruped" else "locomotion_velocity_solo12.yaml"
    params = config.load_yaml(REPO_ROOT / "config" / name)
    stance = np.asarray(params["task"]["stance"], dtype=float)
    frac = float(rng.uniform(0.15, 0.4))

    def creep(default_friction):
        plant = MujocoPlant(params)
        if default_friction:
            _mujoco_default_friction(plant)
        m, d = plant.model, plant.data
        push = frac * params["simulator"]["friction"] * float(m.body_mass.sum()) * 9.81

        def geoms():          # every geom's x, and the geoms touching the ground
            return d.geom_xpos[:, 0].copy(), {int(g) for c in d.contact[:d.ncon] for g in (c.geom1, c.geom2)
                                              if m.geom_type[g] != 0}
        trace = _pushed(plant, _standing(plant, params, 0.005), stance, push, steps=250, observe=geoms)
        feet = sorted(trace[149][1])          # the geoms on the ground, once the push has settled
        assert len(feet) >= 3, feet
        x = np.array([xs[feet] for xs, _ in trace[149:]])
        return float(np.abs(x[-1] - x[0]).max() / (0.01 * (len(x) - 1)))
    here, default = creep(False), creep(True)
    print(f"{robot}: push {frac:.2f} mu m g, fastest foot creeps {here * 1e3:.2f} mm/s (MuJoCo's default "
          f"friction {default * 1e3:.1f} mm/s)")
    assert here < 1.5e-3, here
    assert default > 5e-3, default


def test_the_stand_in_resolves_its_ground_contact():
    """The stand-in resolves its ground contact.

    A robot is continuous in time, so the stand-in's step must not decide its verdict. solo12
    trotting in place on drawn joint sinusoids (its lower leg and foot weigh 0.04 kg): the feet's
    track at the simulator's 2 ms substep differs from a finer step's by far more than the
    stand-in's default step (0.5 ms, four MuJoCo steps a substep) differs from one twice as fine,
    the first-order convergence of the Euler step; without ground contact (the arm) MuJoCo keeps
    the simulator's substep.
    """
    from diffsim_ros.plant.mujoco_plant import CONTACT_STEP, default_refinement
    rng = np.random.default_rng(drawn_seed("stand-in step", "DIFFSIM_TEST_STEP_SEED"))
    params = config.load_yaml(REPO_ROOT / "config" / "locomotion_velocity_solo12.yaml")
    stance = np.asarray(params["task"]["stance"], dtype=float)
    amp, freq = rng.uniform(0.15, 0.3), rng.uniform(2.0, 3.5)
    phase = np.repeat([0.0, np.pi, np.pi, 0.0], 3)            # a trot: diagonal legs together
    gain = np.tile([0.0, 1.0, -2.0], 4) * np.repeat([1, 1, -1, -1], 3)
    commands = [stance + amp * gain * np.maximum(0.0, np.sin(2 * np.pi * freq * 0.01 * k + phase))
                for k in range(40)]

    def feet(refinement):
        plant = MujocoPlant(params, step_refinement=refinement)
        _standing(plant, params, 0.0)
        m, d = plant.model, plant.data
        bodies = [m.body(n).id for n in ("FL_FOOT", "FR_FOOT", "HL_FOOT", "HR_FOOT")]
        track = []
        for c in commands:
            plant.step(c)
            track.append(d.xpos[bodies].copy())
        return plant, np.array(track)

    plant, default = feet(None)
    assert plant.step_refinement == default_refinement(0.002, True) == 4 and plant.h <= CONTACT_STEP
    tracks = {r: feet(r)[1] for r in (1, 2, 8)}
    coarse = float(np.abs(tracks[1] - tracks[2]).max())
    fine = float(np.abs(default - tracks[8]).max())
    print(f"amplitude {amp:.2f} rad, {freq:.2f} Hz: feet 2 ms vs 1 ms {1e3 * coarse:.2f} mm, "
          f"0.5 ms vs 0.25 ms {1e3 * fine:.2f} mm")
    assert fine < 0.5 * coarse, (fine, coarse)
    arm = MujocoPlant(_params(ARM_YAML))
    assert arm.step_refinement == 1 and arm.h == pytest.approx(arm.dt / arm.substeps)
