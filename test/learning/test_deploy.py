"""PolicyRunner (diffsim_ros.learning.deploy): a checkpoint turned into commands on measured states.

Each check compares against an independent computation on the training side:
the command against ``task.command(policy(task.observe(ts)))`` on random task
states (built by the task's own ``reset``, then handed to the runner as the
measured quantities a robot reports), the prediction against ``Simulator.step``,
and refusals against checkpoints made for another robot.
"""
from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch

from builders import make_checkpoint
from conftest import REPO_ROOT
from diffsim_ros import config, physics
from diffsim_ros.learning import MLPPolicy
from diffsim_ros.learning.checkpoint import CheckpointError, save_checkpoint
from diffsim_ros.learning.deploy import PolicyRunner, StateError


@pytest.fixture(scope="module")
def hover_ckpt(tmp_path_factory):
    d = tmp_path_factory.mktemp("hover")
    pol, task = make_checkpoint("hover", d)
    return d, pol, task


@pytest.fixture(scope="module")
def reach_ckpt(tmp_path_factory):
    d = tmp_path_factory.mktemp("reach")
    pol, task = make_checkpoint("reach_arm", d)
    return d, pol, task


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_quadrotor_command_matches_task(hover_ckpt, dtype):
    d, pol, _ = hover_ckpt
    # The reference task at the runner's precision (the file says float32 for training).
    _, task, _ = config.load_training_file(REPO_ROOT / "config" / "hover.yaml", dtype=dtype)
    pol = torch.jit.load(str(d / "policy.pt"))
    runner = PolicyRunner(d, dtype=dtype)
    assert runner.kind == "quadrotor" and runner.interface == "ctbr"
    assert runner.command_names == ["collective_thrust", "body_rate/x", "body_rate/y", "body_rate/z"]
    gen = torch.Generator().manual_seed(3)
    ts = task.reset(8, gen)
    # Random attitudes and rates as well: the reset starts level.
    quat = torch.randn(8, 4, generator=gen, dtype=torch.float64).to(ts.sim.q.dtype)
    ts.sim.q[:, 3:7] = quat / quat.norm(dim=-1, keepdim=True)
    ts.sim.v[:, 3:6] = torch.randn(8, 3, generator=gen).to(ts.sim.v.dtype)
    with torch.no_grad():
        # The float32 policy one row at a time (a batched matmul rounds differently).
        obs = task.observe(ts).float()
        act = torch.cat([pol(obs[b:b + 1]) for b in range(8)])
        want = task.command(torch.clamp(act, -1, 1).to(dtype), ts).to(torch.float64)
    lo, hi = runner.command_low, runner.command_high
    for b in range(8):
        q, v = ts.sim.q[b].double().numpy(), ts.sim.v[b].double().numpy()
        runner.reset()
        out = runner.quadrotor(q[0:3], q[3:7], v[0:3], v[3:6])
        expect = np.clip(want[b].numpy(), lo, hi)
        # float64: round-off only. float32: a few units in the last place (the policy's
        # TorchScript and eager matmuls may take differently vectorised kernels; 1 ulp seen).
        ulp = 1e-12 if dtype == torch.float64 else 4 * float(torch.finfo(torch.float32).eps)
        tol = ulp * (1 + float(np.abs(expect).max()))
        np.testing.assert_allclose(out.command, expect, atol=tol, rtol=0)
    # hover target default is the task's home; an explicit target moves the position error.
    a = runner.quadrotor([0, 0, 1], [0, 0, 0, 1], [0, 0, 0], [0, 0, 0], predict=False)
    b = runner.quadrotor([0, 0, 1], [0, 0, 0, 1], [0, 0, 0], [0, 0, 0], target=[0, 0, 1], predict=False)
    c = runner.quadrotor([0, 0, 1], [0, 0, 0, 1], [0, 0, 0], [0, 0, 0], target=[1, 0, 1], predict=False)
    np.testing.assert_array_equal(a.command, b.command)
    assert not np.array_equal(a.command, c.command)


def test_arm_command_matches_task_and_reordering(reach_ckpt):
    d, _, _ = reach_ckpt
    _, task, _ = config.load_training_file(REPO_ROOT / "config" / "reach_arm.yaml", dtype=torch.float64)
    pol = torch.jit.load(str(d / "policy.pt"))
    runner = PolicyRunner(d)
    assert runner.kind == "arm" and runner.interface == "position"
    names = runner.joint_names
    gen = torch.Generator().manual_seed(5)
    ts = task.reset(8, gen)
    ts.sim.v[:] = torch.randn(ts.sim.v.shape, generator=gen).to(ts.sim.v.dtype)
    with torch.no_grad():
        obs = task.observe(ts).float()
        act = torch.cat([pol(obs[b:b + 1]) for b in range(8)])
        want = task.command(torch.clamp(act, -1, 1).double(), ts)
    lo, hi = runner.command_low, runner.command_high
    perm = list(reversed(range(len(names))))
    for b in range(8):
        q, v = ts.sim.q[b].double().numpy(), ts.sim.v[b].double().numpy()
        tgt = ts.target[b].double().numpy()
        out = runner.arm(names, q, v, target=tgt)
        np.testing.assert_allclose(out.command, np.clip(want[b].numpy(), lo, hi), atol=1e-12, rtol=0)
        # The same state with the joints listed in another order, plus a joint the model lacks.
        rn = [names[i] for i in perm] + ["gripper_finger"]
        out2 = runner.arm(rn, list(q[perm]) + [0.3], list(v[perm]) + [0.0], target=tgt)
        np.testing.assert_array_equal(out.command, out2.command)
    with pytest.raises(StateError, match="a reach policy needs a target"):
        runner.arm(names, q, v)


def test_prediction_equals_simulator_step(hover_ckpt, reach_ckpt):
    d, _, task = hover_ckpt
    runner = PolicyRunner(d)
    sim = physics.Simulator(runner.model, task.sim_config)  # an independent simulator of the same config
    p, quat, vl, w = [0.1, -0.2, 0.9], [0.05, 0.0, 0.0, 1.0], [0.2, 0.0, -0.1], [0.1, 0.3, 0.0]
    out = runner.quadrotor(p, quat, vl, w)
    q = torch.tensor([p + list(np.array(quat) / np.linalg.norm(quat))], dtype=torch.float64)
    v = torch.tensor([vl + w], dtype=torch.float64)
    s0 = sim.initial_state(q, v)
    s1 = sim.step(s0, torch.tensor(out.command).unsqueeze(0))
    torch.testing.assert_close(out.predicted.q, s1.q, rtol=0, atol=1e-12)
    torch.testing.assert_close(out.predicted.v, s1.v, rtol=0, atol=1e-12)
    # The next call carries the simulator's rotor speeds on (not measured on a robot).
    out2 = runner.quadrotor(p, quat, vl, w)
    s2 = sim.step(s0.replace(actuator=s1.actuator), torch.tensor(out2.command).unsqueeze(0))
    torch.testing.assert_close(out2.predicted.v, s2.v, rtol=0, atol=1e-12)

    d, _, task = reach_ckpt
    runner = PolicyRunner(d)
    sim = physics.Simulator(runner.model, task.sim_config)
    q = [0.3, -0.4, 0.5, 0.1]
    out = runner.arm(runner.joint_names, q, [0.1, 0.0, -0.2, 0.0], target=[0.2, 0.1, 0.4])
    s1 = sim.step(sim.initial_state(torch.tensor([q], dtype=torch.float64),
                                    torch.tensor([[0.1, 0.0, -0.2, 0.0]], dtype=torch.float64)),
                  torch.tensor(out.command).unsqueeze(0))
    torch.testing.assert_close(out.predicted.v, s1.v, rtol=0, atol=1e-12)


def test_commands_clamped_to_urdf_limits(reach_ckpt, hover_ckpt):
    d, _, _ = reach_ckpt
    runner = PolicyRunner(d)
    m = runner.model
    idx = runner.sim.act_index
    np.testing.assert_array_equal(runner.command_low, m.lower[idx].numpy())
    np.testing.assert_array_equal(runner.command_high, m.upper[idx].numpy())
    c, changed = runner.clamp(m.upper[idx].numpy() + 1.0)
    assert changed and np.array_equal(c, m.upper[idx].numpy())
    d, _, _ = hover_ckpt
    runner = PolicyRunner(d)
    rot = runner.sim.rotors
    assert runner.command_high[0] == pytest.approx(rot.n * rot.cfg.thrust_coefficient * rot.cfg.max_rotor_speed ** 2)
    c, changed = runner.clamp([-3.0, 10.0, 0.0, -10.0])
    assert changed and c[0] == 0.0 and c[1] == runner.task.max_rate and c[3] == -runner.task.max_rate
    for _ in range(20):                   # random states: every command inside the box
        x = np.random.default_rng(_).normal(size=13)
        out = runner.quadrotor(x[0:3], x[3:7], 3 * x[7:10], 5 * x[10:13], predict=False)
        assert np.all(out.command >= runner.command_low) and np.all(out.command <= runner.command_high)


def test_bad_states_are_rejected(reach_ckpt, hover_ckpt):
    runner = PolicyRunner(reach_ckpt[0])
    n = runner.joint_names
    with pytest.raises(StateError, match=f"joint\\(s\\) {n[2]} .* missing"):
        runner.arm(n[:2] + n[3:], [0.0] * 3, [0.0] * 3, target=[0.2, 0, 0.4])
    with pytest.raises(StateError, match=f"non-finite joint position of {n[1]}"):
        runner.arm(n, [0.0, float("nan"), 0.0, 0.0], [0.0] * 4, target=[0.2, 0, 0.4])
    with pytest.raises(StateError, match="velocities"):
        runner.arm(n, [0.0] * 4, [], target=[0.2, 0, 0.4])
    runner = PolicyRunner(hover_ckpt[0])
    with pytest.raises(StateError, match="non-finite angular velocity"):
        runner.quadrotor([0, 0, 1], [0, 0, 0, 1], [0, 0, 0], [0, float("inf"), 0])
    with pytest.raises(StateError, match="quaternion has norm 0"):
        runner.quadrotor([0, 0, 1], [0, 0, 0, 0], [0, 0, 0], [0, 0, 0])


def test_refuses_another_robot(reach_ckpt, hover_ckpt, tmp_path):
    arm_urdf = (REPO_ROOT / "urdf" / "diffsim_arm.urdf").read_text()
    # The quadrotor's URDF for the arm's checkpoint, and the arm's for the quadrotor's.
    with pytest.raises(CheckpointError, match="the checkpoint is for robot 'diffsim_arm' \\(fixed base"):
        PolicyRunner(reach_ckpt[0], urdf=str(REPO_ROOT / "urdf" / "diffsim_quadrotor.urdf"))
    with pytest.raises(CheckpointError, match="made for robot 'diffsim_quadrotor' with other joints"):
        PolicyRunner(hover_ckpt[0], urdf=str(REPO_ROOT / "urdf" / "diffsim_arm.urdf"))
    # The same arm with two joints declared in swapped order: refused (the model's joint order comes
    # from the kinematic tree, so this one is caught by the URDF digest).
    import xml.etree.ElementTree as ET
    root = ET.fromstring(arm_urdf)
    joints = [e for e in root if e.tag == "joint" and e.get("type") != "fixed"]
    i0, i1 = list(root).index(joints[0]), list(root).index(joints[1])
    children = list(root)
    children[i0], children[i1] = children[i1], children[i0]
    for c in list(root):
        root.remove(c)
    root.extend(children)
    swapped = ET.tostring(root, encoding="unicode")
    with pytest.raises(CheckpointError, match="the URDF differs|same joints in another order"):
        PolicyRunner(reach_ckpt[0], urdf=swapped)
    # A modified URDF (heavier link): the sha256 differs.
    heavier = arm_urdf.replace('<mass value="', '<mass value="1', 1)
    assert heavier != arm_urdf
    with pytest.raises(CheckpointError, match="the URDF differs"):
        PolicyRunner(reach_ckpt[0], urdf=heavier)
    # The metadata edited to claim reordered actuated joints.
    d = tmp_path / "edited"
    shutil.copytree(reach_ckpt[0], d)
    meta = json.loads((d / "policy.json").read_text())
    meta["robot"]["joint_names"] = list(reversed(meta["robot"]["joint_names"]))
    (d / "policy.json").write_text(json.dumps(meta))
    with pytest.raises(CheckpointError, match="same joints in another order"):
        PolicyRunner(d)


def test_rebuilds_task_without_stored_config(hover_ckpt, tmp_path):
    """A checkpoint without its stored training config still deploys.

    A checkpoint whose metadata lacks the training config (another writer) still deploys,
    from command.task_parameters, with the same commands.
    """
    d = tmp_path / "noconfig"
    shutil.copytree(hover_ckpt[0], d)
    meta = json.loads((d / "policy.json").read_text())
    del meta["config"]
    (d / "policy.json").write_text(json.dumps(meta))
    a = PolicyRunner(hover_ckpt[0]).quadrotor([0.2, 0, 0.8], [0, 0, 0, 1], [0, 0.1, 0], [0, 0, 0], predict=False)
    b = PolicyRunner(d).quadrotor([0.2, 0, 0.8], [0, 0, 0, 1], [0, 0.1, 0], [0, 0, 0], predict=False)
    np.testing.assert_array_equal(a.command, b.command)


@pytest.mark.slow
def test_compiled_prediction_equals_eager_prediction(hover_ckpt):
    """The compiled prediction equals the eager prediction.

    PolicyRunner(compile_prediction=True) predicts through the step compiled ahead of time
    (ExportedStep, float64, one environment): the same command, and the same next state as the
    eager runner to round-off, twice in a row (the rotor speeds carried on).
    """
    d, _, _ = hover_ckpt
    eager, compiled = PolicyRunner(d), PolicyRunner(d, compile_prediction=True)
    p, quat, vl, w = [0.1, -0.2, 0.9], [0.05, 0.0, 0.0, 1.0], [0.2, 0.0, -0.1], [0.1, 0.3, 0.0]
    for _ in range(2):
        a, b = eager.quadrotor(p, quat, vl, w), compiled.quadrotor(p, quat, vl, w)
        np.testing.assert_array_equal(a.command, b.command)
        torch.testing.assert_close(b.predicted.q, a.predicted.q, rtol=0, atol=1e-12)
        torch.testing.assert_close(b.predicted.v, a.predicted.v, rtol=0, atol=1e-10)
        torch.testing.assert_close(b.predicted.actuator, a.predicted.actuator, rtol=1e-12, atol=1e-9)


@pytest.mark.parametrize("robot", ["locomotion", "solo12"])
def test_legged_command_matches_task(tmp_path, robot):
    """A legged robot's command matches the task's.

    A floating base without rotors is a legged robot: joint states (any order) plus odometry give
    the task's own observation and command, at random base poses, twists and joint states.
    """
    if robot == "solo12":
        from conftest import example_robot_data_dir

        if example_robot_data_dir() is None:
            pytest.skip("example-robot-data is not installed")
        urdf = example_robot_data_dir() / "solo_description" / "robots" / "solo12.urdf"
        cfg = tmp_path / "solo12.yaml"
        text = (REPO_ROOT / "config" / "locomotion.yaml").read_text()
        import yaml

        doc = yaml.safe_load(text)
        p = doc["/**"]["ros__parameters"]
        p["urdf"] = str(urdf)
        p["simulator"]["actuated_joints"] = [f"{leg}_{j}" for leg in ("FL", "FR", "HL", "HR")
                                             for j in ("HAA", "HFE", "KFE")]
        p["task"]["stance"] = [0.0, 0.8, -1.6, 0.0, 0.8, -1.6, 0.0, -0.8, 1.6, 0.0, -0.8, 1.6]
        p["task"]["base_height"] = 0.24
        cfg.write_text(yaml.safe_dump(doc))
    else:
        cfg = REPO_ROOT / "config" / "locomotion.yaml"
    params, task, model = config.load_training_file(cfg, dtype=torch.float64)
    torch.manual_seed(1)
    pol = MLPPolicy(task.obs_dim, task.action_dim, (32, 32)).to(model.dtype)
    with torch.no_grad():
        pol.head.weight.mul_(8.0)
        pol.norm.update(task.observe(task.reset(16, torch.Generator().manual_seed(1))))
    save_checkpoint(pol, task, tmp_path / "ckpt", extra={"config": params})
    runner = PolicyRunner(tmp_path / "ckpt")
    assert runner.kind == "legged" and runner.interface == "position"
    ts = task.reset(6, torch.Generator().manual_seed(2))
    gen = torch.Generator().manual_seed(3)
    quat = torch.randn(6, 4, generator=gen, dtype=torch.float64)
    ts.sim.q[:, 3:7] = quat / quat.norm(dim=-1, keepdim=True)
    ts.sim.q[:, 0:3] += torch.randn(6, 3, generator=gen, dtype=torch.float64) * 0.1
    ts.sim.v[:] = torch.randn(ts.sim.v.shape, generator=gen, dtype=torch.float64)
    pt = torch.jit.load(str(tmp_path / "ckpt" / "policy.pt"))
    with torch.no_grad():
        obs = task.observe(ts).float()
        act = torch.cat([pt(obs[b:b + 1]) for b in range(6)])
        want = task.command(torch.clamp(act, -1, 1).double(), ts).numpy()
    names = list(runner.joint_names)
    perm = list(reversed(range(len(names))))
    for b in range(6):
        q, v = ts.sim.q[b].numpy(), ts.sim.v[b].numpy()
        out = runner.legged([names[i] for i in perm], q[7:][perm], v[6:][perm], q[0:3], q[3:7], v[0:3], v[3:6],
                            predict=False)
        np.testing.assert_allclose(out.command, np.clip(want[b], runner.command_low, runner.command_high),
                                   atol=1e-12, rtol=0)
    with pytest.raises(StateError, match="not a multirotor"):
        runner.quadrotor_state([0, 0, 1], [0, 0, 0, 1], [0] * 3, [0] * 3)


@pytest.mark.parametrize("cfg_name,kind", [("hover", "quadrotor"), ("reach_arm", "arm"), ("locomotion", "legged")])
def test_robot_kind_from_metadata_alone_matches_the_runner(cfg_name, kind, tmp_path):
    """robot_kind from the metadata alone matches the runner.

    robot_kind (what deploy.launch.py and PolicyRunner read, without building the robot) agrees
    with the robot and simulator PolicyRunner builds: a fixed base is an arm, rotors a quadrotor.
    """
    from diffsim_ros.learning.checkpoint import load_metadata, robot_kind

    make_checkpoint(cfg_name, tmp_path / "ckpt")
    runner = PolicyRunner(tmp_path / "ckpt")
    assert robot_kind(load_metadata(tmp_path / "ckpt")) == runner.kind == kind
    assert runner.model.floating_base == (kind != "arm")
    assert (runner.sim.rotors is not None) == (kind == "quadrotor")


@pytest.mark.parametrize("name", ["jump_solo12", "hover"])
def test_a_checkpoint_from_another_clone_finds_its_urdf_here(tmp_path, name):
    """A checkpoint from another clone finds its URDF here.

    policy.json records the URDF's absolute path on the machine that trained it (another clone,
    another virtual environment); where that path does not exist here, the training file's own
    entry (package://example-robot-data/... for solo12) or the file of that name in this package's
    urdf folder (the hover) is the same robot: the checkpoint loads and is the robot it was trained
    on. With none of them, the error names what it looked for.
    """
    from diffsim_ros.workflows import evaluation
    from diffsim_ros.learning.deploy import resolve_urdf_source

    folder = tmp_path / name
    shutil.copytree(REPO_ROOT / "policies" / name, folder)
    meta = json.loads((folder / "policy.json").read_text())
    meta["robot"]["urdf"] = "/elsewhere/.venv/share/robots/" + meta["robot"]["urdf"].rsplit("/", 1)[-1]
    (folder / "policy.json").write_text(json.dumps(meta))
    found = resolve_urdf_source(meta, str(folder))
    assert found != meta["robot"]["urdf"]
    task, policy = evaluation.load_checkpoint_task(folder)[:2]
    assert task.model.urdf_sha256 == meta["robot"]["urdf_sha256"]
    meta["config"] = dict(meta.get("config") or {}, urdf="package://no_such_package/robot.urdf")
    meta["robot"]["urdf"] = "/elsewhere/robot.urdf"
    with pytest.raises(CheckpointError, match="no_such_package.*not on this machine"):
        resolve_urdf_source(meta, str(folder))
