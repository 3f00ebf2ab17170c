"""The legged robot observation (issue 39 item 1) and the foot-slip loss term.

A legged policy on ``observation: robot`` sees what the robot's own sensors give: the IMU's
gravity direction and body rates, the joint encoders, its previous action and the command. So its
observation must not change when the base is moved anywhere, turned about the vertical or given
another linear velocity (a robot cannot measure those without motion capture), and must change
with the base's tilt and rates; the privileged observation fails the first property, which shows
the property can fail. The previous action is the policy's own last action, in training
(Task.step) and on the robot (PolicyRunner carries it); a checkpoint that does not record the
observation is the privileged one it was made with. The slip term equals finite differences of
the foot's lowest point moved along the state's velocity.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from builders import make_checkpoint, without_gait
from conftest import REPO_ROOT

from diffsim_ros import config
from diffsim_ros.learning.deploy import PolicyRunner
from diffsim_ros.physics.spatial import quat_exp, quat_mul, quat_rotate
from diffsim_ros.tasks import make_task


@pytest.fixture(scope="module")
def tasks():
    """(robot, privileged) velocity-command tasks of the project's quadruped, float64."""
    params, task, model = config.load_training_file(REPO_ROOT / "config" / "locomotion_velocity.yaml",
                                                    dtype=torch.float64)
    spec = without_gait(params["task"])                # the blocks without the gait clock's
    robot = make_task(model, task.sim_config, {**spec, "observation": "robot"}, "task")
    return robot, make_task(model, task.sim_config, {**spec, "observation": "privileged"}, "task")


def _walked(task, seed: int, steps: int = 20):
    """Drive a batch of 3 episodes ``steps`` control steps by a drawn open-loop motion."""
    g = torch.Generator().manual_seed(seed)
    ts = task.reset(3, g)
    phase = torch.rand(3, task.action_dim, generator=g, dtype=torch.float64) * 6.0
    for k in range(steps):
        ts = task.step(ts, 0.6 * torch.sin(phase + 0.4 * k))
    return ts


def _moved(ts, shift, yaw, lin):
    """Return ``ts`` with the base moved, turned and given another linear velocity.

    The base is translated by ``shift``, turned by ``yaw`` about the world vertical and given the
    body-frame linear velocity ``lin``.
    """
    q, v = ts.sim.q.clone(), ts.sim.v.clone()
    turn = quat_exp(torch.tensor([[0.0, 0.0, yaw]], dtype=q.dtype)).expand(len(q), 4)
    q[:, 0:3] = quat_rotate(turn, q[:, 0:3]) + torch.tensor(shift, dtype=q.dtype)
    q[:, 3:7] = quat_mul(turn, q[:, 3:7])
    v[:, 0:3] = torch.tensor(lin, dtype=v.dtype)
    return type(ts)(ts.sim.replace(q=q, v=v), ts.target, ts.step, dict(ts.extra))


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), shift=st.lists(st.floats(-50, 50), min_size=3, max_size=3),
       yaw=st.floats(-math.pi, math.pi), lin=st.lists(st.floats(-3, 3), min_size=3, max_size=3))
def test_the_robot_observation_holds_nothing_a_robot_cannot_measure(tasks, seed, shift, yaw, lin):
    robot, privileged = tasks
    ts = _walked(robot, seed)
    moved = _moved(ts, shift, yaw, lin)
    torch.testing.assert_close(robot.observe(moved), robot.observe(ts), atol=1e-9, rtol=0)
    if abs(shift[2]) > 1e-3:        # the privileged observation holds the base height: it moves
        assert not torch.allclose(privileged.observe(moved), privileged.observe(ts), atol=1e-6)


def test_the_robot_observation_is_gravity_rates_joints_previous_action_command(tasks):
    """The robot observation is gravity, rates, joints, previous action and command.

    Each block against its definition: gravity from the tilt (roll about x: (0, -sin, -cos) of
    the world's down in the base frame), the body rates, the joints about the stance, the action of
    the step before (zero at the start), the command.
    """
    robot, _ = tasks
    names = robot.observation_names()
    n = robot.n
    assert names[:6] == ["gravity/x", "gravity/y", "gravity/z", "angular_velocity/x", "angular_velocity/y",
                         "angular_velocity/z"]
    assert len(names) == robot.obs_dim == 6 + 3 * n + 1
    assert not any(x.startswith(("base_height", "R/", "base_velocity")) for x in names)
    ts = robot.reset(2, torch.Generator().manual_seed(3))
    np.testing.assert_array_equal(robot.observe(ts)[:, 6 + 2 * n:6 + 3 * n].numpy(), 0.0)
    roll = 0.3
    q = ts.sim.q.clone()
    q[:, 3:7] = quat_exp(torch.tensor([[roll, 0.0, 0.0]], dtype=q.dtype)).expand(2, 4)
    tilted = type(ts)(ts.sim.replace(q=q), ts.target, 0, dict(ts.extra))
    np.testing.assert_allclose(robot.observe(tilted)[:, 0:3].numpy(),
                               [[0.0, -math.sin(roll), -math.cos(roll)]] * 2, atol=1e-12)
    action = torch.linspace(-1, 1, n, dtype=torch.float64).expand(2, n)
    after = robot.step(ts, action)
    obs = robot.observe(after)
    np.testing.assert_allclose(obs[:, 3:6].numpy(), after.sim.v[:, 3:6].numpy())
    qj = after.sim.q[:, 7:][:, robot.sim.act_index]
    np.testing.assert_allclose(obs[:, 6:6 + n].numpy(), (qj - robot.stance).numpy())
    np.testing.assert_allclose(obs[:, 6 + 2 * n:6 + 3 * n].numpy(), action.numpy())
    np.testing.assert_allclose(obs[:, -1].numpy(), after.target[:, 0].numpy())


@pytest.mark.parametrize("name", ["locomotion_velocity", "jump"])
def test_the_runner_carries_the_previous_action_as_training_does(tmp_path, name):
    """The runner carries the previous action as training does.

    On the states of a simulated episode the deployed runner gives the actions the policy gave
    in the simulator step by step (its observation holds its own previous action), and after
    reset() it starts again from zero; for the walk and the jump alike (the jump's training
    once observed a zero previous action throughout while the runner gave it its own).
    """
    pol, task = make_checkpoint(name, tmp_path, gain=2.0, task_options={"observation": "robot"})
    assert task.observation == "robot"
    runner = PolicyRunner(tmp_path)
    assert not runner.needs_odometry
    task64 = runner.task
    ts = task64.reset(1, torch.Generator().manual_seed(4))
    for episode in range(2):
        runner.reset()
        ts = task64.reset(1, torch.Generator().manual_seed(4))
        for _ in range(15):
            want = torch.clamp(pol(task64.observe(ts).to(torch.float32)).to(torch.float64), -1, 1)
            got = runner.decide(ts.sim, ts.target, predict=False).action
            np.testing.assert_allclose(got, want[0].detach().numpy(), atol=1e-6)
            ts = task64.step(ts, want.detach())


def test_a_checkpoint_without_the_observation_key_is_the_privileged_one(tmp_path):
    """A checkpoint without the observation key is the privileged one.

    Legged checkpoints made before ``observation`` existed (test/data/jump_privileged, the jump
    shipped before 2026-12-05) do not record it: they are rebuilt on the privileged observation
    they were trained with, their metadata's observation names exactly, and run on odometry.
    """
    import json

    make_checkpoint("locomotion_velocity", tmp_path, task_options={"observation": "privileged"})
    meta_path = tmp_path / "policy.json"
    meta = json.loads(meta_path.read_text())
    del meta["command"]["task_parameters"]["observation"]
    meta["config"]["task"].pop("observation", None)
    meta_path.write_text(json.dumps(meta))
    for folder in (tmp_path, REPO_ROOT / "test" / "data" / "jump_privileged"):
        runner = PolicyRunner(folder)
        assert "observation" not in runner.meta["command"]["task_parameters"]
        assert runner.task.observation == "privileged" and runner.needs_odometry
        assert runner.task.observation_names() == runner.meta["observation"]["names"]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_slip_and_landing_terms_are_the_feet_speed_by_finite_differences(tasks, seed):
    """The slip and landing terms are the feet's speed by finite differences.

    foot_slip (horizontal) and foot_landing (downward only) against the lowest foot points
    moved by a small step along the state's velocity (forward kinematics only), with the same
    height weights; a foot above slip_height costs nothing; the gradient reaches the joint
    velocities; a foot rising costs no landing.
    """
    robot, _ = tasks
    print("seed", seed)
    ts = _walked(robot, seed, steps=25)
    q, v = ts.sim.q, ts.sim.v
    eps = 1e-7
    qn = q.clone()
    qn[:, 0:3] = q[:, 0:3] + eps * quat_rotate(q[:, 3:7], v[:, 0:3])
    qn[:, 3:7] = quat_mul(q[:, 3:7], quat_exp(eps * v[:, 3:6]))
    qn[:, 7:] = q[:, 7:] + eps * v[:, 6:]
    now, then = robot.foot_track(q), robot.foot_track(qn)
    d = (robot.foot_moved(then, now["local"]) - now["world"]) / eps
    down = torch.clamp(-d[..., 2], min=0.0)           # the ground is z = 0 here
    d[..., 2] = 0.0
    near = torch.clamp(1 - now["height"] / robot.slip_height, 0, 1)
    want = (near * (d ** 2).sum(-1)).sum(-1)
    torch.testing.assert_close(robot.foot_slip(ts), want, rtol=1e-5, atol=1e-9)
    # the vertical difference carries the rotation's second-order term: a looser relative bound
    torch.testing.assert_close(robot.foot_landing(ts), (near * down ** 2).sum(-1), rtol=1e-4, atol=1e-9)
    assert (near * down).sum() > 0, "the walked state has a foot moving down near the ground"
    rising = ts.sim.v.clone()
    rising[:, 2] = rising[:, 2].abs() + 5.0           # the whole robot moving up fast: no foot lands
    assert robot.foot_landing(type(ts)(ts.sim.replace(v=rising), ts.target, ts.step, {})).abs().max() == 0
    lifted = ts.sim.q.clone()
    lifted[:, 2] += 2 * robot.slip_height + 0.05
    up = type(ts)(ts.sim.replace(q=lifted), ts.target, ts.step, {})
    np.testing.assert_array_equal(robot.foot_slip(up).numpy(), 0.0)
    np.testing.assert_array_equal(robot.foot_landing(up).numpy(), 0.0)
    for term in (robot.foot_slip, robot.foot_landing):
        vj = ts.sim.v.clone().requires_grad_(True)
        term(type(ts)(ts.sim.replace(v=vj), ts.target, ts.step, {})).sum().backward()
        assert vj.grad[:, 6:].abs().sum() > 0


def test_the_observation_and_slip_options_are_checked(tasks):
    robot, _ = tasks
    spec = {k: v for k, v in robot.export_parameters().items()}
    for bad, match in (({"observation": "mocap"}, "observation"), ({"slip_weight": -1.0}, "slip_weight"),
                       ({"slip_height": 0.0}, "slip_height"), ({"landing_weight": -0.1}, "landing_weight")):
        with pytest.raises(Exception, match=match):
            make_task(robot.model, robot.sim_config, {**spec, **bad}, "task")
