"""``diffsim-ros train`` / ``diffsim-ros baseline`` and the per-task training files.

One short training run goes through a separate process, exactly as a user starts
it; error cases call ``main`` in-process (they stop before any training). Every
``config/<task>.yaml`` must load and build its task.
"""
from __future__ import annotations

import csv
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from diffsim_ros import config, physics
from diffsim_ros.cli import main
from diffsim_ros.learning.apg import TrainConfig
from diffsim_ros.learning.checkpoint import CheckpointError, load_checkpoint

ROOT = Path(__file__).resolve().parents[2]
TRAINING_FILES = ["reach_arm", "reach_panda", "hover", "waypoint", "velocity", "locomotion"]
# Every training file states at least these PPO settings (files used by the benchmark state more).
PPO_KEYS = {"total_timesteps", "num_envs", "n_steps", "batch_size", "learning_rate", "seed"}


def write_params(path: Path, params: dict) -> Path:
    path.write_text(yaml.safe_dump({"/**": {"ros__parameters": params}}, sort_keys=False))
    return path


def small_copy(tmp_path: Path, name: str = "reach_arm", **changes) -> Path:
    """Write a copy of config/<name>.yaml with a short episode and a small evaluation."""
    params = config.load_yaml(ROOT / "config" / f"{name}.yaml")
    params["task"]["horizon"] = 8
    params["training"].update(eval_envs=4, window=4)
    for dotted, val in changes.items():
        node = params
        *parents, leaf = dotted.split("__")
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = val
    return write_params(tmp_path / f"{name}.yaml", params)


# ------------------------------------------------------------------------ the training files


@pytest.mark.parametrize("name", TRAINING_FILES)
def test_training_file_loads_and_builds_its_task(name):
    path = ROOT / "config" / f"{name}.yaml"
    params, task, model = config.load_training_file(path)
    # Every key is a known one, and every key but the optional excitation section is there.
    assert set(config.TRAINING_FILE_KEYS) - {"excitation"} <= set(params) <= set(config.TRAINING_FILE_KEYS)
    assert model.dtype == torch.float32 and params["dtype"] == "float32"
    TrainConfig.from_mapping(params["training"])
    assert PPO_KEYS <= set(params["ppo"])
    try:
        from diffsim_ros.learning.ppo import PPOConfig
    except ImportError:
        pass
    else:
        PPOConfig.from_mapping(params["ppo"])
    ts = task.reset(2, torch.Generator().manual_seed(0))
    obs = task.observe(ts)
    assert obs.shape == (2, task.obs_dim) and torch.isfinite(obs).all()
    with torch.no_grad():
        ts = task.step(ts, torch.zeros(2, task.action_dim, dtype=model.dtype))
    assert torch.isfinite(task.step_loss(ts, torch.zeros(2, task.action_dim))).all()


def test_training_file_values():
    """The values the tasks were specified with (the lead retunes the rest)."""
    arm = config.load_yaml(ROOT / "config" / "reach_arm.yaml")
    assert arm["simulator"]["kp"] == [30.0, 45.0, 24.0, 3.0] and arm["simulator"]["ground"] is False
    assert arm["task"]["command_mode"] == "delta" and arm["task"]["jacobian_observation"] is True
    # 2 s per target (1 s until the drives honoured the URDF velocity limits: then 6.5 % of the
    # drawn start-target pairs need more than 1 s at full joint speed, before any acceleration)
    assert arm["task"] == {**arm["task"], "type": "reach", "ee_link": "ee_link", "horizon": 100}
    for mode in ("hover", "waypoint", "velocity"):
        p = config.load_yaml(ROOT / "config" / f"{mode}.yaml")
        assert p["task"]["mode"] == mode and p["simulator"]["dt"] == 0.02 and p["simulator"]["substeps"] == 4
    loco = config.load_yaml(ROOT / "config" / "locomotion.yaml")
    _, task, model = config.load_training_file(ROOT / "config" / "locomotion.yaml")
    # base_height: the feet (spheres) touch the ground in the standing pose
    q = model.neutral_configuration((1,))
    q[0, 2] = loco["task"]["base_height"]
    q[0, 7:] = q[0, 7:].index_copy(0, task.sim.act_index, task.stance)
    poses = physics.forward_kinematics(model, q)[0]
    feet = [c for c in model.collisions if c.kind == "sphere" and "foot" in c.link]
    assert len(feet) == 4
    for c in feet:       # the foot link's origin is its sphere's centre (URDF)
        centre = poses[model.link_names.index(c.link), :3, 3]
        assert abs(float(centre[2]) - float(c.size[0])) < 1e-3, (c.link, float(centre[2]))


# ------------------------------------------------------------------------ train


def test_train_writes_a_checkpoint(tmp_path):
    cfg = small_copy(tmp_path)
    out = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-m", "diffsim_ros.cli", "train", "--config", str(cfg), "--out", str(out),
                           "--iterations", "2", "--num-envs", "4", "--no-progress", "--keep-training",
                           "--learning-rate", "7e-4"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for name in ("policy.pt", "policy.json", "training.csv", "learning_curve.png"):
        assert (out / name).is_file(), name
        assert name in proc.stdout
    for word in ("iterations      2", "env steps       64", "final success", "time"):
        assert word in proc.stdout, proc.stdout
    rows = list(csv.DictReader(open(out / "training.csv")))
    assert [int(r["iteration"]) for r in rows] == [1, 2]
    assert [float(r["lr"]) for r in rows] == [7e-4, 7e-4]              # --learning-rate: constant
    model = physics.load_urdf(str(ROOT / "urdf" / "diffsim_arm.urdf"))
    policy, meta = load_checkpoint(out, model=model)
    assert meta["training"]["iterations"] == 2 and meta["training"]["env_steps"] == 64
    assert meta["training"]["config"]["num_envs"] == 4 and meta["training"]["method"] == "analytic_gradient"
    assert meta["training"]["config"]["stop_at_success"] is False        # --keep-training
    trained = meta["training"]["config"]
    assert trained["learning_rate"] == 7e-4 and trained["lr_schedule"] == "constant"          # --learning-rate
    assert meta["horizon"] == 8 and meta["config"]["task"]["type"] == "reach"
    assert policy(torch.zeros(3, meta["observation"]["dim"])).shape == (3, 4)
    quadruped = physics.load_urdf(str(ROOT / "urdf" / "diffsim_quadruped.urdf"), floating_base=True)
    with pytest.raises(CheckpointError, match="joints"):
        load_checkpoint(out, model=quadruped)


def run_main(capsys, *argv):
    rc = main(list(argv))
    cap = capsys.readouterr()
    return rc, cap.out, cap.err


@pytest.mark.parametrize("where, key", [("training", "bogus_rate"), ("simulator", "bogus_gain"),
                                        ("task", "bogus_weight"), (None, "bogus_section")])
def test_unknown_key_is_exit_2_naming_it(tmp_path, capsys, where, key):
    params = config.load_yaml(ROOT / "config" / "reach_arm.yaml")
    (params[where] if where else params)[key] = 1.0
    cfg = write_params(tmp_path / "bad.yaml", params)
    rc, out, err = run_main(capsys, "train", "--config", str(cfg), "--out", str(tmp_path / "o"))
    assert rc == 2
    assert err.startswith("error: ") and key in err and "bad.yaml" in err, err
    assert "Traceback" not in err and not (tmp_path / "o" / "policy.pt").exists()


def test_bad_inputs_are_exit_2(tmp_path, capsys):
    rc, _, err = run_main(capsys, "train", "--config", str(tmp_path / "missing.yaml"), "--out", str(tmp_path))
    assert rc == 2 and "missing.yaml: no such file" in err
    (tmp_path / "broken.yaml").write_text("/**:\n  ros__parameters:\n    urdf: [unclosed\n")
    rc, _, err = run_main(capsys, "train", "--config", str(tmp_path / "broken.yaml"), "--out", str(tmp_path))
    assert rc == 2 and "malformed YAML" in err
    cfg = small_copy(tmp_path, urdf="urdf/no_such_robot.urdf")
    rc, _, err = run_main(capsys, "train", "--config", str(cfg), "--out", str(tmp_path))
    assert rc == 2 and "no_such_robot.urdf" in err
    (tmp_path / "bad.urdf").write_text("<robot name='x'><link name='a'/><joint/></robot>")
    cfg = small_copy(tmp_path, urdf=str(tmp_path / "bad.urdf"))
    rc, _, err = run_main(capsys, "train", "--config", str(cfg), "--out", str(tmp_path))
    assert rc == 2 and err.startswith("error: ") and "bad.urdf" in err, err
    cfg = small_copy(tmp_path, training__learning_rate="fast")
    rc, _, err = run_main(capsys, "train", "--config", str(cfg), "--out", str(tmp_path))
    assert rc == 2 and "training.learning_rate" in err
    cfg = small_copy(tmp_path, dtype="float16")
    rc, _, err = run_main(capsys, "train", "--config", str(cfg), "--out", str(tmp_path))
    assert rc == 2 and "'dtype'" in err
    cfg = small_copy(tmp_path, task__ee_link="hand")
    rc, _, err = run_main(capsys, "train", "--config", str(cfg), "--out", str(tmp_path))
    assert rc == 2 and "ee_link 'hand'" in err
    rc, _, err = run_main(capsys, "train", "--config", str(cfg), "--out", str(tmp_path), "--iterations", "0")
    assert rc == 2 and "--iterations must be at least 1" in err
    for bad in ("0", "-1e-3", "nan"):
        rc, _, err = run_main(capsys, "train", "--config", str(cfg), "--out", str(tmp_path), f"--learning-rate={bad}")
        assert rc == 2 and "--learning-rate must be a positive number" in err, err


# ------------------------------------------------------------------------ baseline


def test_baseline_without_the_ppo_module_is_a_clear_error(tmp_path, capsys, monkeypatch):
    import diffsim_ros.learning as learning

    monkeypatch.delattr(learning, "ppo", raising=False)
    monkeypatch.setitem(sys.modules, "diffsim_ros.learning.ppo", None)
    rc, _, err = run_main(capsys, "baseline", "--config", str(small_copy(tmp_path)), "--out", str(tmp_path / "o"))
    assert rc == 2 and "PPO baseline (diffsim_ros.learning.ppo) is not available" in err, err


def test_baseline_bad_ppo_key_is_exit_2(tmp_path, capsys):
    pytest.importorskip("diffsim_ros.learning.ppo", reason="the PPO baseline module is not there yet")
    cfg = small_copy(tmp_path, ppo__bogus_clip=0.2)
    rc, _, err = run_main(capsys, "baseline", "--config", str(cfg), "--out", str(tmp_path / "o"))
    assert rc == 2 and "bogus_clip" in err and err.startswith("error: "), err
