"""ONNX export (diffsim-ros export --onnx, learning/onnx_export.py) against TorchScript.

Drawn shipped and untrained checkpoints exported and run by onnxruntime give TorchScript's
actions; a graph that computes something else is refused; the numpy + onnxruntime runner
(diffsim_ros/onboard.py, torch blocked) gives the controller's commands; PolicyRunner on
policy.onnx gives policy.pt's commands and refuses a stale export.
"""
from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from builders import make_checkpoint
from conftest import REPO_ROOT, drawn_seed

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

from diffsim_ros.learning import onnx_export  # noqa: E402
from diffsim_ros.learning.checkpoint import CheckpointError  # noqa: E402
from diffsim_ros.learning.deploy import PolicyRunner  # noqa: E402
from diffsim_ros.onboard import METADATA_KEY  # noqa: E402
from diffsim_ros.tasks.base import TaskState  # noqa: E402

SHIPPED = ["hover", "reach_arm", "reach_panda", "jump", "jump_solo12", "locomotion_velocity",
           "locomotion_velocity_solo12"]
UNTRAINED = ["reach_arm", "velocity", "locomotion_velocity_solo12", "jump"]


def _copy(name: str, tmp: Path) -> Path:
    out = tmp / name
    shutil.copytree(REPO_ROOT / "policies" / name, out, ignore=shutil.ignore_patterns("checkpoints", "events.*"))
    return out


def test_drawn_checkpoints_export_to_onnx_that_computes_their_actions(tmp_path):
    seed = drawn_seed("onnx export", "DIFFSIM_ONNX_SEED")
    rng = random.Random(seed)
    shipped, untrained = rng.sample(SHIPPED, 2), rng.choice(UNTRAINED)
    print("shipped", shipped, "untrained", untrained)
    folders = [_copy(n, tmp_path) for n in shipped]
    make_checkpoint(untrained, tmp_path / "untrained", seed=rng.randrange(1 << 16), gain=rng.uniform(1.0, 8.0))
    folders.append(tmp_path / "untrained")
    for folder in folders:
        before = (folder / "policy.json").read_bytes()
        rep = onnx_export.export_onnx(folder, episodes=2, seed=rng.randrange(1 << 16))
        print(folder.name, rep["max_abs_diff"])
        assert set(rep["max_abs_diff"]) == {"drawn", "far", "episodes"}
        assert max(rep["max_abs_diff"].values()) <= 1e-5
        assert (folder / "policy.json").read_bytes() == before                  # metadata unchanged
        model = onnx.load(str(folder / "policy.onnx"))
        props = {p.key: p.value for p in model.metadata_props}
        assert json.loads(props[METADATA_KEY]) == json.loads(before)
        assert props["diffsim_ros.policy_pt_sha256"] == hashlib.sha256((folder / "policy.pt").read_bytes()).hexdigest()
        assert not [p for p in folder.iterdir() if p.name.startswith("tmp")]        # nothing left over
        # An independent comparison: a batch of 1 and of 33 through a fresh session and torch.jit.
        n = json.loads(before)["observation"]["dim"]
        x = np.random.default_rng(rng.randrange(1 << 16)).standard_normal((33, n)).astype(np.float32)
        sess = ort.InferenceSession(str(folder / "policy.onnx"), providers=["CPUExecutionProvider"])
        module = torch.jit.load(str(folder / "policy.pt"))
        for batch in (x[:1], x):
            np.testing.assert_allclose(sess.run(["action"], {"observation": batch})[0],
                                       module(torch.from_numpy(batch)).detach().numpy(), rtol=0, atol=1e-5)


def test_a_graph_that_computes_other_actions_is_refused(tmp_path, monkeypatch):
    """A graph that computes other actions is refused.

    The check can fail: an exporter that writes a slightly different policy (one weight moved)
    is refused, naming the difference, and no policy.onnx is left.
    """
    folder = _copy("reach_arm", tmp_path)
    real = torch.onnx.export

    def wrong(module, args, path, **kw):
        other = torch.jit.load(str(folder / "policy.pt"))
        with torch.no_grad():
            next(p for p in other.parameters() if p.dim() == 2)[0, 0] += 0.5
        return real(other, args, path, **kw)

    monkeypatch.setattr(onnx_export.torch.onnx, "export", wrong)
    with pytest.raises(onnx_export.OnnxExportError, match="differ from TorchScript"):
        onnx_export.export_onnx(folder, episodes=1)
    assert not (folder / "policy.onnx").exists()


def _commands_by_runner(folder: Path, fmt: str, n: int, seed: int):
    """Compute the commands of PolicyRunner(policy_format=fmt) on n states.

    The states are drawn from the task's reset distribution; each command comes with the
    observation it was computed from.
    """
    runner = PolicyRunner(folder, policy_format=fmt)
    with torch.no_grad():
        ts = runner.task.reset(n, torch.Generator().manual_seed(seed))
    out = []
    for i in range(n):
        runner.reset()
        state = runner.state(ts.sim.q[i].double().numpy(), ts.sim.v[i].double().numpy())
        target = ts.target[i:i + 1].to(runner.dtype)
        d = runner.decide(state, target, predict=False)
        obs = runner.task.observe(TaskState(state, target, 0)).double().numpy()[0]
        q = runner.joint_positions(state)
        out.append((obs, q, d.command))
    return out


@pytest.mark.parametrize("name", ["reach_arm", "locomotion_velocity_solo12"])
def test_the_onnx_policy_gives_the_controllers_commands_with_and_without_torch(tmp_path, name):
    """The ONNX policy gives the controller's commands with and without torch.

    PolicyRunner on policy.onnx gives policy.pt's commands; the numpy + onnxruntime runner, in a
    process where torch cannot be imported, gives the same from the same observations (reach_arm:
    the delta map about the measured joints; solo12: the affine map about its stance).
    """
    folder = _copy(name, tmp_path)
    onnx_export.export_onnx(folder, episodes=0)
    seed = drawn_seed(f"onnx runner {name}", "DIFFSIM_ONNX_RUNNER_SEED")
    ts_cmds = _commands_by_runner(folder, "torchscript", 6, seed)
    onnx_cmds = _commands_by_runner(folder, "onnx", 6, seed)
    for (_, _, a), (_, _, b) in zip(ts_cmds, onnx_cmds):
        np.testing.assert_allclose(b, a, rtol=0, atol=1e-5)
    obs = np.array([o for o, _, _ in ts_cmds])
    act = np.array([q for _, q, _ in ts_cmds])
    np.save(tmp_path / "obs.npy", obs)
    np.save(tmp_path / "q.npy", act)
    code = ("import sys; sys.modules['torch'] = None\n"
            "from diffsim_ros import onboard\n"
            f"sys.exit(onboard.main([{str(folder)!r}, '--observations', {str(tmp_path / 'obs.npy')!r}, "
            f"'--joint-positions', {str(tmp_path / 'q.npy')!r}]))\n")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         cwd=str(REPO_ROOT), env=dict(os.environ))
    assert res.returncode == 0, res.stderr
    got = [json.loads(line)["command"] for line in res.stdout.splitlines()]
    np.testing.assert_allclose(np.array(got), np.array([c for _, _, c in ts_cmds]), rtol=0, atol=2e-5)


def test_a_stale_or_missing_export_is_refused(tmp_path):
    folder = _copy("reach_arm", tmp_path)
    with pytest.raises(CheckpointError, match="diffsim-ros export"):
        PolicyRunner(folder, policy_format="onnx")                   # none written yet
    other = _copy("hover", tmp_path)
    onnx_export.export_onnx(other, episodes=0)
    shutil.copy(other / "policy.onnx", folder / "policy.onnx")
    with pytest.raises(CheckpointError, match="another policy.pt"):
        PolicyRunner(folder, policy_format="onnx")
    with pytest.raises(CheckpointError, match="policy_format"):
        PolicyRunner(folder, policy_format="tflite")


def test_the_export_command_line(tmp_path):
    folder = _copy("jump_solo12", tmp_path)
    exe = Path(sys.executable).with_name("diffsim-ros")
    res = subprocess.run([str(exe), "export", str(folder), "--onnx", "--episodes", "1"], capture_output=True,
                         text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    assert "largest |action difference|" in res.stdout and (folder / "policy.onnx").is_file()
    res = subprocess.run([str(exe), "export", str(folder)], capture_output=True, text=True, timeout=120)
    assert res.returncode == 2 and "--onnx" in res.stderr
    res = subprocess.run([str(exe), "export", str(tmp_path / "nothing"), "--onnx"], capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 2 and "no such checkpoint" in res.stderr
