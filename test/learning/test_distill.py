"""``diffsim-ros distill``: a student on the robot observation learns a teacher's actions (DAgger).

The teacher here is a function of what both observations hold (the joint positions) through the
privileged observation's own layout, so a student that learned it must act as it does on states
of its own; the first round executes the teacher alone (each observation's previous action is the
teacher's action of the step before), later rounds mix in the student; and the command refuses a
teacher for another robot with exit status 2 naming it.
"""
from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
import torch

from builders import make_checkpoint, without_gait
from conftest import REPO_ROOT

from diffsim_ros import config
from diffsim_ros.learning.distill import DistillConfig, _mixed_rollout, distill
from diffsim_ros.tasks import make_task


@pytest.fixture(scope="module")
def pair():
    params, task, model = config.load_training_file(REPO_ROOT / "config" / "locomotion_velocity.yaml",
                                                    dtype=torch.float64)
    spec = {**without_gait(params["task"]), "horizon": 30, "window_s": 0.2}
    student = make_task(model, task.sim_config, {**spec, "observation": "robot"}, "task")
    teacher_task = make_task(model, task.sim_config, {**spec, "observation": "privileged"}, "task")
    names = teacher_task.observation_names()
    joints = [i for i, x in enumerate(names) if x.startswith("q/")]
    W = torch.randn(len(joints), teacher_task.action_dim, generator=torch.Generator().manual_seed(2),
                    dtype=torch.float64) * 2.0

    def teacher(obs):
        return torch.tanh(obs.to(torch.float64)[:, joints] @ W).to(obs.dtype)
    return student, teacher_task, teacher


def test_the_first_round_executes_the_teacher(pair):
    student, teacher_task, teacher = pair
    from diffsim_ros.learning.policy import MLPPolicy

    net = MLPPolicy(student.obs_dim, student.action_dim, (16,)).to(torch.float64)
    obs, act = _mixed_rollout(student, teacher_task, net, teacher, 1.0, 4, torch.Generator().manual_seed(0), ())
    n = student.n
    prev = obs.reshape(student.horizon, 4, -1)[:, :, 6 + 2 * n:6 + 3 * n]
    np.testing.assert_array_equal(prev[0].numpy(), 0.0)
    np.testing.assert_allclose(prev[1:].numpy(), act.reshape(student.horizon, 4, -1)[:-1].numpy(), atol=1e-12)


def test_the_student_acts_as_the_teacher_on_its_own_states(pair):
    student_task, teacher_task, teacher = pair
    cfg = DistillConfig(iterations=3, episodes=8, updates=300, batch=256, eval_episodes=4, seed=1)
    student, history = distill(student_task, teacher, teacher_task, (64, 64), cfg)
    assert [h["beta"] for h in history] == [1.0, 0.5, 0.25]
    assert history[-1]["samples"] == 3 * 8 * student_task.horizon
    # Fresh episodes driven by the student alone: its actions against the teacher's on the same states.
    with torch.no_grad():
        ts = student_task.reset(8, torch.Generator().manual_seed(99))
        err, spread = [], []
        for _ in range(student_task.horizon):
            a = student(student_task.observe(ts))
            want = teacher(teacher_task.observe(ts))
            err.append(((a - want) ** 2).mean())
            spread.append(want.var())
            ts = student_task.step(ts, a)
    mse, var = float(torch.stack(err).mean()), float(torch.stack(spread).mean())
    print(f"student mse {mse:.4g}, teacher action variance {var:.4g}")
    assert mse < 0.05 * var


def test_distill_refuses_a_teacher_for_another_robot(tmp_path):
    make_checkpoint("hover", tmp_path / "hover")
    r = subprocess.run([sys.executable, "-m", "diffsim_ros.cli", "distill", "--config",
                        str(REPO_ROOT / "config" / "locomotion_velocity.yaml"), "--teacher", str(tmp_path / "hover"),
                        "--out", str(tmp_path / "out")], capture_output=True, text=True, timeout=300)
    assert r.returncode == 2, r.stderr
    assert "robot" in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert not (tmp_path / "out" / "policy.json").exists()
    meta = json.loads((tmp_path / "hover" / "policy.json").read_text())
    assert meta["robot"]["name"] in r.stderr


def test_distill_writes_a_student_checkpoint_the_runner_deploys(tmp_path):
    """Distill writes a student checkpoint that the runner deploys.

    The command end to end (one round of two episodes): a checkpoint on the file's robot
    observation that PolicyRunner loads (no odometry needed), its metadata naming the teacher and
    the round; the teacher's own observation was the privileged one.
    """
    import yaml

    from diffsim_ros.learning.deploy import PolicyRunner

    make_checkpoint("locomotion_velocity", tmp_path / "teacher", gain=1.0, task_options={"observation": "privileged"})
    doc = yaml.safe_load((REPO_ROOT / "config" / "locomotion_velocity.yaml").read_text())
    p = doc["/**"]["ros__parameters"]
    p["urdf"] = str(REPO_ROOT / "urdf" / "diffsim_quadruped.urdf")
    p["task"].update(observation="robot", horizon=100, window_s=0.5)
    cfg = tmp_path / "student.yaml"
    cfg.write_text(yaml.safe_dump(doc))
    r = subprocess.run([sys.executable, "-m", "diffsim_ros.cli", "distill", "--config", str(cfg), "--teacher",
                        str(tmp_path / "teacher"), "--out", str(tmp_path / "out"), "--iterations", "1",
                        "--episodes", "2"], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    assert "tracking the command upright" in r.stdout, r.stdout
    runner = PolicyRunner(tmp_path / "out")
    assert runner.task.observation == "robot" and not runner.needs_odometry
    meta = runner.meta
    assert meta["training"]["method"] == "distillation"
    assert meta["training"]["teacher"] == str((tmp_path / "teacher").resolve())
    assert [h["samples"] for h in meta["training"]["history"]] == [2 * 100]
    teacher = PolicyRunner(tmp_path / "teacher")
    assert teacher.task.observation == "privileged" and teacher.needs_odometry
