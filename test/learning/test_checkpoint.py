"""Checkpoints: a TorchScript policy plus JSON metadata.

The exported policy acts as
the one in memory, the metadata round-trips, a checkpoint for another robot (other
joints, or the same joints with another URDF) is refused with a CheckpointError
naming the mismatch, and a damaged checkpoint is a CheckpointError, never another
exception. Loading never unpickles.
"""
from __future__ import annotations

import json
import pickle
import shutil
from pathlib import Path

import pytest
import torch

from diffsim_ros import config, physics
from diffsim_ros.learning.checkpoint import (FORMAT, FORMAT_VERSION, CheckpointError, load_checkpoint,
                                             load_metadata, save_checkpoint)
from diffsim_ros.learning.policy import MLPPolicy
from diffsim_ros.tasks import make_task

REPO = Path(__file__).resolve().parents[2]
ARM_URDF = REPO / "urdf" / "diffsim_arm.urdf"
QUADRUPED_URDF = REPO / "urdf" / "diffsim_quadruped.urdf"


@pytest.fixture(scope="module")
def arm_task():
    params = config.load_yaml(REPO / "config" / "reach_arm.yaml")
    params["task"]["command_mode"] = "absolute"      # the affine mapping (delta: see its own test)
    task, _ = config.build_task(params, "reach_arm.yaml")
    return task


def trained_like_policy(task, dtype=torch.float32, seed=0) -> MLPPolicy:
    """Build an MLPPolicy with random weights and a non-trivial observation normaliser."""
    torch.manual_seed(seed)
    policy = MLPPolicy(task.obs_dim, task.action_dim, (32, 32)).to(dtype)
    with torch.no_grad():
        for p in policy.parameters():
            p.add_(0.3 * torch.randn_like(p))
        policy.norm.update(3.0 + 2.0 * torch.randn(256, task.obs_dim, dtype=dtype))
    return policy


@pytest.fixture(scope="module")
def saved(arm_task, tmp_path_factory):
    """(policy in memory, checkpoint folder, files) for the project arm's reach task."""
    out = tmp_path_factory.mktemp("ckpt")
    policy = trained_like_policy(arm_task)
    files = save_checkpoint(policy, arm_task, out, extra={"training": {"env_steps": 1234, "success": True}})
    return policy, out, files


def copy_ckpt(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def edit_json(folder: Path, fn) -> None:
    path = folder / "policy.json"
    meta = json.loads(path.read_text())
    fn(meta)
    path.write_text(json.dumps(meta))


# ------------------------------------------------------------------------ export


def test_exported_policy_matches_the_one_in_memory(saved, arm_task):
    policy, out, files = saved
    assert files["policy"] == out / "policy.pt" and files["metadata"] == out / "policy.json"
    scripted, meta = load_checkpoint(out)
    assert isinstance(scripted, torch.jit.ScriptModule)
    obs = 4.0 * torch.randn(500, arm_task.obs_dim, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        want = policy(obs)
        got = scripted(obs)
    assert got.dtype == torch.float32 and got.shape == (500, arm_task.action_dim)
    torch.testing.assert_close(got, want, atol=1e-6, rtol=0)
    assert float(want.abs().max()) > 0.1          # the comparison is not between two near-zero outputs


def test_float64_policy_is_exported_in_float32(arm_task, tmp_path):
    policy = trained_like_policy(arm_task, dtype=torch.float64, seed=1)
    save_checkpoint(policy, arm_task, tmp_path)
    scripted, meta = load_checkpoint(tmp_path)
    assert meta["policy"]["dtype"] == "float32"
    obs = torch.randn(64, arm_task.obs_dim, dtype=torch.float64)
    with torch.no_grad():
        got = scripted(obs.float())
        want = policy(obs)
    torch.testing.assert_close(got.double(), want, atol=1e-5, rtol=0)
    assert next(policy.parameters()).dtype == torch.float64      # the policy in memory is untouched


def test_any_module_can_be_exported(arm_task, tmp_path):
    """A policy without a RunningNorm (e.g. another trainer's) exports; normalization is null."""
    policy = torch.nn.Sequential(torch.nn.Linear(arm_task.obs_dim, 8), torch.nn.Tanh(),
                                 torch.nn.Linear(8, arm_task.action_dim), torch.nn.Tanh())
    save_checkpoint(policy, arm_task, tmp_path)
    scripted, meta = load_checkpoint(tmp_path)
    assert meta["normalization"] is None
    obs = torch.randn(5, arm_task.obs_dim)
    torch.testing.assert_close(scripted(obs), policy(obs), atol=1e-6, rtol=0)


def test_metadata_round_trips(saved, arm_task):
    policy, out, _ = saved
    _, meta = load_checkpoint(out)
    assert meta == json.loads((out / "policy.json").read_text()) == load_metadata(out)
    assert meta["format"] == FORMAT and meta["format_version"] == FORMAT_VERSION
    spec = arm_task.spec()
    assert meta["task"] == "reach"
    assert meta["observation"] == spec["observation"]
    assert meta["action"] == spec["action"] and meta["action"]["interface"] == "position"
    assert meta["dt"] == pytest.approx(0.02) and meta["horizon"] == arm_task.horizon
    model = arm_task.model
    assert meta["robot"] == {"name": model.name, "urdf_sha256": model.urdf_sha256, "urdf": str(model.source),
                             "floating_base": False, "joint_names": model.joint_names,
                             "actuated_joints": list(arm_task.sim.actuated_joints)}
    sim = meta["simulator"]
    assert sim["dt"] == 0.02 and sim["substeps"] == 2 and sim["actuator"] == "position"
    assert sim["kp"] == list(arm_task.sim_config.kp)
    assert physics.SimConfig.from_mapping({k: v for k, v in sim.items() if k not in ("kp", "kd")}).dt == 0.02
    # normalisation: the running statistics, exactly as float32
    norm = meta["normalization"]
    assert torch.equal(torch.tensor(norm["mean"], dtype=torch.float32), policy.norm.mean)
    assert torch.equal(torch.tensor(norm["var"], dtype=torch.float32), policy.norm.var)
    # command mapping: offset + scale * action is what the task commands
    cmd = meta["command"]
    assert cmd["type"] == "affine" and cmd["names"] == list(arm_task.sim.actuated_joints)
    assert cmd["units"] == ["rad"] * 4
    # The task's own parameters: rebuilding the task from them gives the same task.
    assert cmd["task_parameters"] == arm_task.export_parameters()
    rebuilt = make_task(arm_task.model, arm_task.sim_config, cmd["task_parameters"])
    assert rebuilt.export_parameters() == arm_task.export_parameters()
    torch.testing.assert_close(rebuilt.q_half, arm_task.q_half)
    a = 2 * torch.rand(16, arm_task.action_dim) - 1
    ts = arm_task.reset(16)
    mapped = torch.tensor(cmd["offset"]) + torch.tensor(cmd["scale"]) * a
    torch.testing.assert_close(mapped, arm_task.command(a, ts), atol=1e-5, rtol=1e-5)
    assert meta["training"] == {"env_steps": 1234, "success": True}
    assert meta["policy"]["export"] in ("script", "trace") and len(meta["policy"]["sha256"]) == 64
    assert meta["created"].endswith("+00:00") and meta["diffsim_ros_version"]


def test_quadrotor_command_mapping(tmp_path):
    """CTBR: thrust = hover_thrust (1 + thrust_range a0), rates = max_rate a, from the JSON alone."""
    params = config.load_yaml(REPO / "config" / "hover.yaml")
    task, _ = config.build_task(params, "hover.yaml")
    save_checkpoint(trained_like_policy(task), task, tmp_path)
    cmd = load_metadata(tmp_path)["command"]
    assert cmd["interface"] == "ctbr" and cmd["units"] == ["N", "rad/s", "rad/s", "rad/s"]
    tp = cmd["task_parameters"]
    assert tp == task.export_parameters() and tp["type"] == "quadrotor"
    assert cmd["offset"] == pytest.approx([task.hover_thrust, 0.0, 0.0, 0.0], rel=1e-6)
    assert cmd["scale"] == pytest.approx([task.hover_thrust * tp["thrust_range"]] + [tp["max_rate"]] * 3, rel=1e-6)


def test_delta_command_mapping(tmp_path):
    """Reach with ``command_mode: delta``: the target is the measured position plus a clamped step."""
    params = config.load_yaml(REPO / "config" / "reach_arm.yaml")
    params["task"].update(command_mode="delta", delta_scale=0.25)
    try:
        task, _ = config.build_task(params, "reach_arm.yaml")
    except physics.ConfigError as e:
        pytest.skip(f"this ReachTask has no delta command mode ({e})")
    save_checkpoint(trained_like_policy(task), task, tmp_path)
    _, meta = load_checkpoint(tmp_path)
    cmd = meta["command"]
    assert cmd["type"] == "delta" and "offset" not in cmd and cmd["scale"] == [0.25] * 4
    ts = task.reset(32)
    a = 2 * torch.rand(32, task.action_dim) - 1
    q = ts.sim.q[:, task.sim.act_index]
    mapped = torch.minimum(torch.maximum(q + torch.tensor(cmd["scale"]) * a, torch.tensor(cmd["low"])),
                           torch.tensor(cmd["high"]))
    torch.testing.assert_close(mapped, task.command(a, ts), atol=1e-5, rtol=1e-5)


def test_undescribable_command_map_is_refused(arm_task, tmp_path, monkeypatch):
    monkeypatch.setattr(arm_task, "command", lambda action, ts: arm_task.q_mid + arm_task.q_half * action ** 3)
    with pytest.raises(CheckpointError, match="neither affine"):
        save_checkpoint(trained_like_policy(arm_task), arm_task, tmp_path)


def test_save_rejects_reserved_extra_and_wrong_policy(arm_task, tmp_path):
    with pytest.raises(ValueError, match="reserved.*robot"):
        save_checkpoint(trained_like_policy(arm_task), arm_task, tmp_path, extra={"robot": "other"})
    wrong = MLPPolicy(arm_task.obs_dim, arm_task.action_dim + 1)
    with pytest.raises(CheckpointError, match="5.*4 actions|4 actions"):
        save_checkpoint(wrong, arm_task, tmp_path)
    assert not (tmp_path / "policy.json").exists()


# ------------------------------------------------------------------------ compatibility


def test_matching_model_and_joints_are_accepted(saved, arm_task):
    _, out, _ = saved
    model = physics.load_urdf(str(ARM_URDF), dtype=torch.float64)       # another dtype: still the same robot
    load_checkpoint(out, model=model, expect_joints=list(reversed(arm_task.sim.actuated_joints)))


def test_checkpoint_for_another_robot_is_refused(saved):
    _, out, _ = saved
    quadruped = physics.load_urdf(str(QUADRUPED_URDF), floating_base=True)
    with pytest.raises(CheckpointError) as info:
        load_checkpoint(out, model=quadruped)
    msg = str(info.value)
    assert "diffsim_arm" in msg and "diffsim_quadruped" in msg
    assert "joints" in msg and "arm_joint1" in msg and "FL_hip_joint" in msg


def test_modified_urdf_is_refused(saved, tmp_path):
    """Same joints, another URDF (a heavier link): the sha256 differs and the load is refused."""
    _, out, _ = saved
    text = ARM_URDF.read_text()
    heavier = text.replace('<mass value="', '<mass value="1', 1)
    assert heavier != text
    path = tmp_path / "diffsim_arm.urdf"
    path.write_text(heavier)
    model = physics.load_urdf(str(path))
    assert model.joint_names == physics.load_urdf(str(ARM_URDF)).joint_names
    with pytest.raises(CheckpointError, match=r"URDF differs.*sha256"):
        load_checkpoint(out, model=model)


def test_floating_base_mismatch_is_refused(saved):
    _, out, _ = saved
    with pytest.raises(CheckpointError, match="floating_base"):
        load_checkpoint(out, model=physics.load_urdf(str(ARM_URDF), floating_base=True))


def test_expected_joints_mismatch_is_refused(saved):
    _, out, _ = saved
    with pytest.raises(CheckpointError, match=r"actuated joints do not match.*not driven by the checkpoint: gripper"):
        load_checkpoint(out, expect_joints=["arm_joint1", "arm_joint2", "arm_joint3", "arm_joint4", "gripper"])
    with pytest.raises(CheckpointError, match=r"not expected: arm_joint4"):
        load_checkpoint(out, expect_joints=["arm_joint1", "arm_joint2", "arm_joint3"])


# ------------------------------------------------------------------------ damaged checkpoints


def test_corrupted_policy_file(saved, tmp_path):
    _, out, _ = saved
    bad = copy_ckpt(out, tmp_path / "a")
    data = bytearray((bad / "policy.pt").read_bytes())
    data[len(data) // 2: len(data) // 2 + 64] = b"\x00" * 64
    (bad / "policy.pt").write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="policy.pt.*corrupted"):
        load_checkpoint(bad)
    # the same damage with the recorded sha256 updated: TorchScript's reader fails, still a CheckpointError
    (bad / "policy.pt").write_bytes(b"not a zip archive at all")
    edit_json(bad, lambda m: m["policy"].__setitem__("sha256", None))
    with pytest.raises(CheckpointError, match="not a readable TorchScript policy"):
        load_checkpoint(bad)
    (bad / "policy.pt").unlink()
    with pytest.raises(CheckpointError, match="policy file not found"):
        load_checkpoint(bad)


def test_pickle_in_place_of_the_policy_is_not_loaded(saved, tmp_path, monkeypatch):
    """A pickle (e.g. torch.save of the module) is refused, and never unpickled."""
    policy, out, _ = saved
    bad = copy_ckpt(out, tmp_path / "p")
    torch.save(policy, bad / "policy.pt")
    edit_json(bad, lambda m: m["policy"].__setitem__("sha256", None))

    def boom(*a, **k):
        raise AssertionError("unpickling during load_checkpoint")
    monkeypatch.setattr(pickle, "load", boom)
    monkeypatch.setattr(pickle, "loads", boom)
    monkeypatch.setattr(pickle, "Unpickler", boom)
    monkeypatch.setattr(torch, "load", boom)
    with pytest.raises(CheckpointError, match="not a readable TorchScript policy"):
        load_checkpoint(bad)


@pytest.mark.parametrize("damage, match", [
    (lambda p: p.unlink(), "metadata not found"),
    (lambda p: p.write_text("{not json"), r"malformed JSON at line 1"),
    (lambda p: p.write_bytes(b"\xff\xfe\x00garbage"), "cannot read checkpoint metadata|malformed JSON"),
    (lambda p: p.write_text("[1, 2]"), "top level must be a JSON object"),
    (lambda p: p.write_text('{"format": NaN}'), "malformed JSON"),
    (lambda p: p.write_text(""), "malformed JSON"),
])
def test_missing_or_garbled_metadata(saved, tmp_path, damage, match):
    _, out, _ = saved
    bad = copy_ckpt(out, tmp_path / "m")
    damage(bad / "policy.json")
    with pytest.raises(CheckpointError, match=match):
        load_checkpoint(bad)


@pytest.mark.parametrize("edit, match", [
    (lambda m: m["action"].pop("dim"), r"missing field 'action\.dim'"),
    (lambda m: m["robot"].pop("urdf_sha256"), r"missing field 'robot\.urdf_sha256'"),
    (lambda m: m.pop("robot"), r"missing field 'robot\.name'"),
    (lambda m: m["observation"].__setitem__("dim", "14"), r"'observation\.dim' must be an integer >= 1, got '14'"),
    (lambda m: m.__setitem__("dt", -0.02), r"'dt' must be a number > 0"),
    (lambda m: m["robot"].__setitem__("joint_names", "arm_joint1"), r"'robot\.joint_names' must be a list of strings"),
    (lambda m: m["robot"].__setitem__("urdf_sha256", "abc"), r"'robot\.urdf_sha256' is not a sha256"),
    (lambda m: m["robot"]["actuated_joints"].append("elbow"), r"'robot\.actuated_joints'.*elbow"),
    (lambda m: m.__setitem__("format_version", 99), "format_version 99 is not supported"),
    (lambda m: m.__setitem__("format", "something_else"), "field 'format'"),
    (lambda m: m["normalization"]["mean"].pop(), r"'normalization\.mean' has 19 entries for observation dim 20"),
    (lambda m: m["command"].pop("scale"), r"missing field 'command\.scale'"),
    (lambda m: m["command"].__setitem__("type", "spline"), r"'command\.type' must be one of affine, delta"),
    (lambda m: m["policy"].__setitem__("file", "../../etc/passwd"), r"'policy\.file' must be a file name"),
    (lambda m: m.__setitem__("action", [4]), r"'action' must be an object"),
])
def test_wrong_metadata_fields_are_named(saved, tmp_path, edit, match):
    _, out, _ = saved
    bad = copy_ckpt(out, tmp_path / "f")
    edit_json(bad, edit)
    with pytest.raises(CheckpointError, match=match):
        load_checkpoint(bad)


def test_declared_dimensions_must_match_the_module(saved, tmp_path):
    _, out, _ = saved
    bad = copy_ckpt(out, tmp_path / "d")

    def more_actions(m):
        m["action"]["dim"] = 5
        m["action"]["names"].append("position/extra")
        for k in ("offset", "scale"):
            m["command"][k].append(1.0)
        m["command"]["names"].append("extra")
    edit_json(bad, more_actions)
    with pytest.raises(CheckpointError, match=r"outputs \(2, 4\).*'action\.dim' = 5"):
        load_checkpoint(bad)

    bad2 = copy_ckpt(out, tmp_path / "o")

    extra_dim = json.loads((out / "policy.json").read_text())["observation"]["dim"] + 1

    def more_obs(m):
        m["observation"]["dim"] = extra_dim
        m["observation"]["names"].append("extra")
        for k in ("mean", "var"):
            m["normalization"][k].append(1.0)
    edit_json(bad2, more_obs)
    with pytest.raises(CheckpointError, match=rf"fails on a \(2, {extra_dim}\) observation"):
        load_checkpoint(bad2)


def test_loading_never_unpickles(saved, monkeypatch, arm_task):
    _, out, _ = saved

    def boom(*a, **k):
        raise AssertionError("pickle used while loading a checkpoint")
    for name in ("load", "loads", "Unpickler"):
        monkeypatch.setattr(pickle, name, boom)
    monkeypatch.setattr(torch, "load", boom)
    policy, meta = load_checkpoint(out, model=arm_task.model)
    assert policy(torch.zeros(1, meta["observation"]["dim"])).shape == (1, meta["action"]["dim"])


def test_paths_accepted(saved):
    _, out, _ = saved
    for p in (out, out / "policy.json", out / "policy.pt", str(out)):
        load_checkpoint(p)
    with pytest.raises(CheckpointError, match="no such checkpoint"):
        load_checkpoint(out / "nope")
    assert issubclass(CheckpointError, ValueError)


@pytest.mark.parametrize("name", sorted(p.name for p in (REPO / "policies").iterdir() if (p / "policy.json").is_file()))
def test_shipped_policy_succeeds_on_fresh_episodes(name):
    """Each shipped policy succeeds on fresh episodes.

    Each pretrained policy in policies/<name> loads against config/<name>.yaml's robot
    (its URDF hash and joints match) and meets the task's own success metric on 128
    episodes that training never saw (at least 0.8; their 256-episode figures are in
    policies/README.md). Fails when a change to the simulator or the task breaks them; the
    walkers are judged by the strict metric with its gait rules (every foot steps, none slides).
    """
    from conftest import example_robot_data_dir
    from diffsim_ros.learning import apg

    cfg_file = REPO / "config" / f"{name}.yaml"
    if "example-robot-data" in cfg_file.read_text() and example_robot_data_dir() is None:
        pytest.skip("example-robot-data (pip package 'example-robot-data') is not installed")
    params, task, model = config.load_training_file(cfg_file)
    policy, meta = load_checkpoint(REPO / "policies" / name, model=model)
    assert meta["task"] == task.name and meta["horizon"] == task.horizon
    assert apg.evaluate(task, policy, 128, seed=11) >= 0.8
