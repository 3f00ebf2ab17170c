"""``diffsim-ros train --init-from DIR``: a run that starts from a trained policy (fine-tuning).

The weights it starts from are the checkpoint's (read back from the checkpoint file, not from the
trainer), the normaliser's statistics go on from the checkpoint's, policy.json says where the run
started, a calibrated URDF (other masses) is accepted, and another robot, task or network is
refused with an error naming the difference. The problem is the tiny arm reach of
test_training_resume (8-step episodes, 4 environments).
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch

from diffsim_ros.learning.checkpoint import load_checkpoint

from test_training_resume import ROOT, run_main, tiny_params, write_config


def weights(folder: Path) -> dict:
    policy, _ = load_checkpoint(folder)
    return {k: v.clone() for k, v in policy.state_dict().items()}


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """Run 3 iterations of the tiny arm reach: the checkpoint the others start from."""
    base = tmp_path_factory.mktemp("init_from")
    cfg = write_config(base / "arm.yaml", tiny_params(iterations=3, critic=False, randomize_mass=[]))
    out = base / "first"
    from diffsim_ros.cli import main

    assert main(["train", "--config", str(cfg), "--out", str(out), "--no-progress"]) == 0
    return base, cfg, out


def test_a_run_starts_from_the_checkpoints_weights(trained, capsys, tmp_path):
    base, _, first = trained
    # A step size too small to move a float32 weight: what the second run exports is where it started.
    still = write_config(tmp_path / "still.yaml", tiny_params(iterations=1, critic=False, randomize_mass=[],
                                                               learning_rate=1e-12, lr_schedule="constant"))
    rc, out, err = run_main(capsys, "train", "--config", still, "--out", tmp_path / "tuned", "--init-from", first,
                            "--no-progress")
    assert rc == 0, err
    then, now = weights(first), weights(tmp_path / "tuned")
    for k in then:
        if k.startswith(("body.", "head.")):
            torch.testing.assert_close(now[k], then[k], rtol=0, atol=1e-6, msg=f"{k} moved")
    # the normaliser went on from the checkpoint's statistics: more samples, not a restart
    assert now["norm.count"] > then["norm.count"]
    # the same run without --init-from starts from the first run's own initial weights, which its 3
    # iterations moved by far more than the tolerance above (so that comparison can fail)
    rc, _, err = run_main(capsys, "train", "--config", still, "--out", tmp_path / "fresh", "--no-progress")
    assert rc == 0, err
    fresh = weights(tmp_path / "fresh")
    assert max(float((fresh[k] - then[k]).abs().max()) for k in then if k.startswith("body.")) > 1e-3
    meta = json.loads((tmp_path / "tuned" / "policy.json").read_text())
    origin = meta["training"]["initialized_from"]
    assert origin["checkpoint"] == str(first.resolve())
    assert origin["policy_sha256"] == json.loads((first / "policy.json").read_text())["policy"]["sha256"]
    assert origin["same_urdf"] is True
    assert "initialized_from" not in json.loads((tmp_path / "fresh" / "policy.json").read_text())["training"]


def test_a_calibrated_urdf_is_accepted_and_recorded(trained, capsys, tmp_path):
    """Sysid writes a copy of the URDF with other masses; fine-tuning on it is the point."""
    _, _, first = trained
    text = (ROOT / "urdf" / "diffsim_arm.urdf").read_text()
    calibrated, n = re.subn(r'<mass value="([0-9.]+)"/>', lambda m: f'<mass value="{1.1 * float(m.group(1)):.6g}"/>',
                            text)
    assert n >= 3
    (tmp_path / "arm_calibrated.urdf").write_text(calibrated)
    params = tiny_params(iterations=1, critic=False, randomize_mass=[])
    params["urdf"] = str(tmp_path / "arm_calibrated.urdf")
    cfg = write_config(tmp_path / "calibrated.yaml", params)
    rc, _, err = run_main(capsys, "train", "--config", cfg, "--out", tmp_path / "tuned", "--init-from", first,
                          "--no-progress")
    assert rc == 0, err
    origin = json.loads((tmp_path / "tuned" / "policy.json").read_text())["training"]["initialized_from"]
    assert origin["same_urdf"] is False
    assert origin["urdf_sha256"] == json.loads((first / "policy.json").read_text())["robot"]["urdf_sha256"]


@pytest.mark.parametrize("case", ["robot", "hidden", "task", "resume", "missing"])
def test_what_cannot_be_fine_tuned_is_refused(trained, capsys, tmp_path, case):
    base, cfg, first = trained
    args = ["train", "--config", cfg, "--out", tmp_path / "run", "--init-from", first, "--no-progress"]
    hidden = tiny_params()["training"]["hidden"]
    expect = {"robot": "made for robot", "hidden": f"hidden layers are {hidden}", "task": "trained for task",
              "resume": "--init-from with --resume", "missing": "no such folder"}[case]
    if case == "robot":
        args[args.index(first)] = ROOT / "policies" / "hover"
    elif case == "hidden":
        args[2] = write_config(tmp_path / "wide.yaml", tiny_params(iterations=1, critic=False, hidden=[32]))
    elif case == "task":
        # the same robot, joints and observation size, but a checkpoint trained for another task
        other = tmp_path / "other_task"
        other.mkdir()
        for name in ("policy.pt", "policy.json"):
            (other / name).write_bytes((first / name).read_bytes())
        meta = json.loads((other / "policy.json").read_text())
        meta["task"] = "locomotion"
        (other / "policy.json").write_text(json.dumps(meta))
        args[args.index(first)] = other
    elif case == "resume":
        args = ["train", "--resume", first, "--init-from", first, "--no-progress"]
    else:
        args[args.index(first)] = tmp_path / "nowhere"
    rc, _, err = run_main(capsys, *args)
    assert rc == 2
    assert expect in err, err
    assert not (tmp_path / "run" / "policy.pt").exists()
