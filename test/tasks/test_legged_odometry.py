"""Legged odometry in the robot observation (``task.velocity_estimate``, issue 39 item 1).

A legged robot has no sensor of its base's linear velocity; it estimates it from its IMU and
joint encoders: a foot on the ground is at rest, so the base moves at minus that foot's velocity
relative to the base (LocomotionTask.foot_velocities), and the estimate weighs the feet by how
low they are along gravity (LocomotionTask.estimated_velocity).

Checked against independent references:
- per foot, for drawn orientations, joints, body rates and joint velocities of the project's
  quadruped and example-robot-data's solo12 (hypothesis): a floating base moving at that foot's
  estimate leaves the foot's lowest point at rest by the full floating-base kinematics, and the
  point's depth below the base is the base height less the foot height the strict metric uses;
- the observation holding the estimate still holds nothing a robot cannot measure (moving,
  turning or pushing the base changes nothing) and is the same in the runner as in training;
- on the MuJoCo stand-in (another engine) with the shipped walker walking, the estimate from the
  measured joint states and IMU alone (the base's linear velocity zeroed, as policy_controller
  has it) follows MuJoCo's true forward velocity (0.5 s means within 0.08 m/s, plain and under
  the hardware preset, seed drawn; measured 0.019-0.048 over 7 seeds); the same feet averaged
  without the weights (the swinging feet counted as standing) miss it by more than 0.3 m/s
  (measured 0.44-0.81), which shows the check can fail;
- on a recorded stand-in bag, the bag report's odometry section against the recorded /odom: the
  shipped walker's within 0.08 m/s, the sliding walker's (feet skating) well off.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import REPO_ROOT, drawn_seed, example_robot_data_dir

from diffsim_ros import config
from diffsim_ros.physics.kinematics import kinematics
from diffsim_ros.physics.spatial import quat_exp, quat_mul, quat_rotate
from diffsim_ros.tasks import make_task

FILES = {"quadruped": "locomotion_velocity.yaml", "solo12": "locomotion_velocity_solo12.yaml"}


@pytest.fixture(scope="module")
def tasks():
    """{robot: its velocity-command task on the robot observation with the estimate, float64}."""
    out = {}
    for robot, name in FILES.items():
        if robot == "solo12" and example_robot_data_dir() is None:
            continue
        params, task, model = config.load_training_file(REPO_ROOT / "config" / name, dtype=torch.float64)
        out[robot] = make_task(model, task.sim_config, {**params["task"], "observation": "robot",
                                                        "velocity_estimate": True}, "task")
    return out


def _drawn_state(task, seed: int):
    """Draw 4 states: the reset's stance with drawn joints about it.

    Also drawn: orientation, body rates, joint velocities and a base linear velocity (which the
    estimate must not read).
    """
    g = torch.Generator().manual_seed(seed)
    ts = task.reset(4, g)
    q, v = ts.sim.q.clone(), torch.randn(4, task.model.nv, generator=g, dtype=torch.float64)
    q[:, 7:] = q[:, 7:] + 0.4 * torch.randn(4, task.model.nq - 7, generator=g, dtype=torch.float64)
    q[:, 7:] = torch.minimum(torch.maximum(q[:, 7:], task.model.lower), task.model.upper)
    rot = quat_exp(0.5 * torch.randn(4, 3, generator=g, dtype=torch.float64))
    q[:, 3:7] = quat_mul(rot, q[:, 3:7])
    return q, v


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 100_000), robot=st.sampled_from(sorted(FILES)))
def test_a_base_moving_at_a_feet_estimate_leaves_that_foot_at_rest(tasks, seed, robot):
    if robot not in tasks:
        pytest.skip("example-robot-data is not installed")
    task = tasks[robot]
    q, v = _drawn_state(task, seed)
    est, depth = task.foot_velocities(q, v)
    assert est.shape == (4, len(task.feet), 3) and depth.shape == (4, len(task.feet))
    track = task.foot_track(q)
    ground = float(task.sim.system.ground_height)
    np.testing.assert_allclose((q[:, 2:3] - depth).numpy(), (track["height"] + ground).numpy(), atol=1e-12)
    for i, foot in enumerate(task.feet):
        moved = v.clone()
        moved[:, 0:3] = est[:, i]
        kin = kinematics(task.model, q, moved)
        R, p, vel = kin.R[foot].permute(2, 0, 1), kin.p[foot].T, kin.vel[foot].T
        x = torch.einsum("bij,bj->bi", R, track["local"][:, i]) + p
        speed = vel[:, 0:3] + torch.cross(vel[:, 3:6], x, dim=-1)
        np.testing.assert_allclose(speed.numpy(), 0.0, atol=1e-12, err_msg=f"{robot}, foot {i}, seed {seed}")
        # and any other base velocity moves it
        moved[:, 0:3] += 0.1
        kin = kinematics(task.model, q, moved)
        assert float((kin.vel[foot].T[:, 0:3] + torch.cross(kin.vel[foot].T[:, 3:6], x, dim=-1)).abs().max()) > 0.05


@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 100_000), shift=st.lists(st.floats(-50, 50), min_size=3, max_size=3),
       yaw=st.floats(-math.pi, math.pi), lin=st.lists(st.floats(-3, 3), min_size=3, max_size=3))
def test_the_estimate_reads_nothing_a_robot_cannot_measure(tasks, seed, shift, yaw, lin):
    """The estimate reads nothing a robot cannot measure.

    The observation with the estimate, for a drawn state, does not change when the base is
    moved, turned about the vertical or given another linear velocity; its three entries follow
    the gravity and rates blocks.
    """
    task = tasks["quadruped"]
    q, v = _drawn_state(task, seed)
    ts = task.reset(4, torch.Generator().manual_seed(seed))
    ts = type(ts)(ts.sim.replace(q=q, v=v), ts.target, 0, dict(ts.extra))
    turn = quat_exp(torch.tensor([[0.0, 0.0, yaw]], dtype=q.dtype)).expand(4, 4)
    q2, v2 = q.clone(), v.clone()
    q2[:, 0:3] = quat_rotate(turn, q[:, 0:3]) + torch.tensor(shift, dtype=q.dtype)
    q2[:, 3:7] = quat_mul(turn, q[:, 3:7])
    v2[:, 0:3] = torch.tensor(lin, dtype=v.dtype)
    moved = type(ts)(ts.sim.replace(q=q2, v=v2), ts.target, 0, dict(ts.extra))
    torch.testing.assert_close(task.observe(moved), task.observe(ts), atol=1e-9, rtol=0)
    names = task.observation_names()
    assert names[6:9] == ["velocity_estimate/x", "velocity_estimate/y", "velocity_estimate/z"]
    torch.testing.assert_close(task.observe(ts)[:, 6:9], task.estimated_velocity(q, v))


def test_the_estimate_needs_the_robot_observation_and_feet(tasks):
    params, task, model = config.load_training_file(REPO_ROOT / "config" / "locomotion_velocity.yaml",
                                                    dtype=torch.float64)
    with pytest.raises(ValueError, match="velocity_estimate"):
        make_task(model, task.sim_config, {**params["task"], "observation": "privileged",
                                           "velocity_estimate": True}, "task")


def _moving_average(x: np.ndarray, n: int) -> np.ndarray:
    return np.convolve(x, np.ones(n) / n, mode="valid")


def test_the_estimate_follows_the_standins_true_velocity_from_the_topics_alone():
    """The estimate follows the stand-in's true velocity from the topics alone.

    The shipped quadruped walker on the MuJoCo stand-in at a drawn command of 0.4-0.8 m/s, one
    drawn episode each plain and under
    the hardware preset (its sensor noise included): the estimate computed from the measured joint
    state and the IMU's orientation and rates, the base's position and linear velocity zeroed as
    policy_controller holds them, against MuJoCo's true body-frame forward velocity.
    """
    from diffsim_ros.workflows.evaluation import _measured_qv, _standin_params
    from diffsim_ros.learning.deploy import PolicyRunner
    from diffsim_ros.plant.mujoco_plant import MujocoPlant
    from diffsim_ros.plant.perturbation import resolve_perturbation

    seed = drawn_seed("legged odometry on the stand-in", "DIFFSIM_ODOMETRY_SEED") % 10_000
    speed = float(np.random.default_rng(seed).uniform(0.4, 0.8))     # walking (at 0.2 m/s the feet barely move)
    ck = REPO_ROOT / "policies" / "locomotion_velocity"
    runner = PolicyRunner(ck)
    task = runner.task
    n = int(round(0.5 / task.dt))
    for pert in (None, "hardware"):
        plant = MujocoPlant(_standin_params(runner.meta, str(ck)), source=str(ck),
                            perturbation=resolve_perturbation(pert, "legged"))
        with torch.no_grad():
            ts = task.reset(1, torch.Generator().manual_seed(seed))
        ts.target = torch.full_like(ts.target, speed)
        plant.reset(ts.sim.q[0].double().numpy(), ts.sim.v[0].double().numpy())
        runner.reset()
        est, flat, true = [], [], []
        for _ in range(task.horizon):
            q, v = (np.asarray(x, dtype=np.float64) for x in _measured_qv(plant))
            plant.step(runner.decide(runner.state(q, v), ts.target[0:1].to(runner.dtype), predict=False).command)
            true.append(plant.v[0:3])                           # MuJoCo's true state, body frame
            qt, vt = torch.as_tensor(q)[None].clone(), torch.as_tensor(v)[None].clone()
            qt[:, 0:3], vt[:, 0:3] = 0.0, 0.0
            with torch.no_grad():
                est.append(task.estimated_velocity(qt, vt)[0].numpy())
                flat.append(task.foot_velocities(qt, vt)[0][0].mean(0).numpy())
        est, flat, true = (np.array(x)[:, 0] for x in (est, flat, true))
        good = np.abs(_moving_average(est, n) - _moving_average(true, n)).max()
        bad = np.abs(_moving_average(flat, n) - _moving_average(true, n)).max()
        print(f"{pert or 'plain'}, seed {seed}: true forward speed {true.mean():.3f} m/s; 0.5 s means of the "
              f"estimate within {good:.3f}, of the unweighted feet {bad:.3f}")
        assert true.mean() > 0.2, (pert, seed)       # it walked
        assert good < 0.08, (pert, seed)
        assert bad > 0.3, (pert, seed)


def test_the_runner_observes_the_estimate_from_imu_and_joints_alone(tmp_path):
    """The runner observes the estimate from the IMU and joints alone.

    A checkpoint trained with the estimate: the deployed runner needs no odometry, and on a
    state whose base position and linear velocity are zeroed (what policy_controller builds from
    /joint_states and /imu) gives the action the policy gives on the true state in training.
    """
    from builders import make_checkpoint
    from diffsim_ros.learning.deploy import PolicyRunner

    pol, _ = make_checkpoint("locomotion_velocity", tmp_path, gain=2.0,
                             task_options={"observation": "robot", "velocity_estimate": True})
    runner = PolicyRunner(tmp_path)
    assert runner.task.velocity_estimate and not runner.needs_odometry
    task = runner.task
    ts = task.reset(1, torch.Generator().manual_seed(5))
    runner.reset()
    for _ in range(10):
        want = torch.clamp(pol(task.observe(ts).to(torch.float32)).to(torch.float64), -1, 1).detach()
        q, v = ts.sim.q.clone(), ts.sim.v.clone()
        q[:, 0:3], v[:, 0:3] = 0.0, 0.0
        got = runner.decide(ts.sim.replace(q=q, v=v), ts.target, predict=False).action
        np.testing.assert_allclose(got, want[0].numpy(), atol=1e-6)
        ts = task.step(ts, want)


def test_the_bag_report_compares_the_odometry_with_the_recorded_odom(tmp_path):
    """The bag report compares the odometry with the recorded /odom.

    A stand-in bag of the shipped walker at a drawn command (seed printed): legged_report's
    odometry section, computed from the bag's /joint_states and the base's orientation and rates,
    follows the recorded /odom (forward 0.5 s means within 0.08 m/s, measured 0.020-0.045; the
    forward RMS error below 0.15, measured 0.06-0.08) and its recorded means are the plant's own
    states read back. A bag of the sliding walker (test/data/quadruped_sliding, feet skating at
    0.3-0.8 m/s) breaks odometry's premise of feet at rest, and the report shows it: forward RMS
    error 0.51 (its 0.5 s means 0.10-0.22 off, by the command).
    """
    from diffsim_ros.analysis.legged import legged_report
    from diffsim_ros.learning.deploy import PolicyRunner
    from diffsim_ros.testing.recordings import make_plant, record_bag

    seed = drawn_seed("legged odometry on a stand-in bag", "DIFFSIM_ODOMETRY_SEED") % 10_000
    speed = float(np.random.default_rng(seed).uniform(0.4, 0.7))
    params = config.load_yaml(REPO_ROOT / "config" / "locomotion_velocity.yaml")
    errors = {}
    for name, folder in (("shipped", REPO_ROOT / "policies" / "locomotion_velocity"),
                         ("sliding", REPO_ROOT / "test" / "data" / "quadruped_sliding")):
        runner = PolicyRunner(folder)
        with torch.no_grad():
            q0 = runner.task.reset(1, torch.Generator().manual_seed(seed)).sim.q[0].double().numpy()
        plant = make_plant(params, {}, "mujoco", q0)
        names = list(plant.joint_names)

        def walk(k, q, v):
            return runner.legged(names, q[7:], v[6:], q[:3], q[3:7], v[:3], v[3:6], target=[speed],
                                 predict=False).command
        rec = record_bag(tmp_path / name, plant, walk, runner.task.horizon, params,
                         extra_metadata={"checkpoint": runner.meta}, predictions=False)
        od = legged_report(tmp_path / name, command=speed)["odometry"]
        print(f"{name} walker at {speed:.3f} m/s (seed {seed}): {od}")
        skip = (runner.task.horizon + 1) // 4
        np.testing.assert_allclose(od["mean_recorded_m_s"], rec["v"][skip:, 0:3].mean(0), atol=2e-4)
        errors[name] = (od["forward_window_error_m_s"], od["rms_error_m_s"][0])
    assert errors["shipped"][0] < 0.08 and errors["shipped"][1] < 0.15, (errors, seed)
    assert errors["sliding"][1] > 0.3, (errors, seed)
