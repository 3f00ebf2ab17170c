"""Training you can trust (issue 18, item 3; --device of item 5).

A run into a folder appends training.csv every iteration and mirrors it into
TensorBoard event files, keeps checkpoints/latest (with resume.pt) and
checkpoints/best, and ``diffsim-ros train --resume DIR`` continues it exactly:
the run killed (SIGKILL, in a separate process) and resumed ends with the same
weights and the same rows as the same run left alone. Resuming refuses a folder
without a resume state and another configuration; a divergence past
max_divergences names the iteration and keeps the last good state; --out refuses
to overwrite a policy without --force; --device refuses CUDA where there is none.

The problem is tiny and in float64: the project's arm reaching (config/reach_arm.yaml)
with 8-step episodes, 4 environments, the critic and mass randomisation on (so the
critic, both optimisers and the trainer's generator must all come back).
"""
from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from diffsim_ros import config, physics
from diffsim_ros.cli import main
from diffsim_ros.learning import apg
from diffsim_ros.learning.checkpoint import load_checkpoint
from diffsim_ros.learning.run import RunLog

from conftest import csv_rows, run_main, without_time
from conftest import write_params as write_config

ROOT = Path(__file__).resolve().parents[1]
ITERATIONS = 7          # N + M
KILL_DURING = 6         # the separate process kills itself inside iteration 6: rows 1-5 done, checkpoint at 4
CHECKPOINT_EVERY = 2


def tiny_params(**training) -> dict:
    params = config.load_yaml(ROOT / "config" / "reach_arm.yaml")
    params["dtype"] = "float64"
    params["task"]["horizon"] = 8
    params["training"].update(iterations=ITERATIONS, num_envs=4, window=4, eval_every=2, eval_envs=4,
                              checkpoint_every=CHECKPOINT_EVERY, stop_at_success=False, critic=True,
                              randomize_mass=[0.8, 1.2])
    params["training"].update(training)
    return params


def resume_state(folder: Path) -> dict:
    return torch.load(folder / "checkpoints" / "latest" / "resume.pt", map_location="cpu", weights_only=True)


KILLER = """
import os, signal, sys
from diffsim_ros import cli
from diffsim_ros.learning import apg
real, calls = apg._iteration, [0]
def dying(*args, **kw):
    calls[0] += 1
    if calls[0] == {kill}:
        os.kill(os.getpid(), signal.SIGKILL)       # as the OOM killer or a lost node would
    return real(*args, **kw)
apg._iteration = dying
sys.exit(cli.main({argv!r}))
"""


@pytest.fixture(scope="module")
def tiny_config(tmp_path_factory) -> Path:
    return write_config(tmp_path_factory.mktemp("cfg") / "tiny_reach.yaml", tiny_params())


@pytest.fixture(scope="module")
def uninterrupted(tiny_config, tmp_path_factory) -> Path:
    """Run the N + M iterations in one go (through the CLI, in this process)."""
    out = tmp_path_factory.mktemp("one_go") / "run"
    assert main(["train", "--config", str(tiny_config), "--out", str(out), "--no-progress"]) == 0
    return out


def test_killed_run_resumes_bit_for_bit(tiny_config, uninterrupted, tmp_path, capsys):
    out = tmp_path / "run"
    argv = ["train", "--config", str(tiny_config), "--out", str(out), "--no-progress"]
    proc = subprocess.run([sys.executable, "-c", KILLER.format(kill=KILL_DURING, argv=argv)], cwd=ROOT,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == -9, proc.stdout + proc.stderr
    # The killed run kept every row it finished, and they are the uninterrupted run's.
    one_go = csv_rows(uninterrupted / "training.csv")
    killed = csv_rows(out / "training.csv")
    assert [int(r["iteration"]) for r in killed] == list(range(1, KILL_DURING))
    assert without_time(killed) == without_time(one_go[:KILL_DURING - 1])
    assert not (out / "policy.pt").exists()
    assert resume_state(out)["iteration"] == 4
    # The latest checkpoint is a loadable one, for this robot.
    model = physics.load_urdf(str(ROOT / "urdf" / "diffsim_arm.urdf"))
    _, meta = load_checkpoint(out / "checkpoints" / "latest", model=model)
    assert meta["checkpoint"] == {"kind": "latest", "iteration": 4}

    rc, stdout, err = run_main(capsys, "train", "--resume", out, "--no-progress")
    assert rc == 0, err
    assert "resuming" in stdout and "after iteration 4" in stdout
    # Rows 1-7 equal the uninterrupted run's, exactly as written (rows 5 of the killed run replaced).
    assert without_time(csv_rows(out / "training.csv")) == without_time(one_go)
    assert len(one_go) == ITERATIONS
    # The weights (policy, normaliser, critic) and both optimisers' states, to the last bit (float64).
    a, b = resume_state(uninterrupted), resume_state(out)
    assert a["iteration"] == b["iteration"] == ITERATIONS and a["finished"] and b["finished"]
    for part in ("policy", "critic"):
        assert a[part].keys() == b[part].keys()
        for k in a[part]:
            assert a[part][k].dtype == torch.float64 or k.endswith("count"), (part, k, a[part][k].dtype)
            assert torch.equal(a[part][k], b[part][k]), (part, k)
    for part in ("optimizer", "critic_optimizer"):
        for i, st in a[part]["state"].items():
            for k, v in st.items():
                assert torch.equal(v, b[part]["state"][i][k]), (part, i, k)
    assert torch.equal(a["rng"]["generator"], b["rng"]["generator"])
    # The exported policies (what a controller loads) answer alike.
    pa, _ = load_checkpoint(uninterrupted, model=model)
    pb, meta_b = load_checkpoint(out, model=model)
    obs = torch.randn(16, meta_b["observation"]["dim"], generator=torch.Generator().manual_seed(3))
    assert torch.equal(pa(obs), pb(obs))
    assert meta_b["training"]["iterations"] == ITERATIONS


def scalars(folder: Path) -> dict:
    """{tag: {step: value}} read back by TensorBoard's own reader; each step once."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(folder), size_guidance={"scalars": 0})
    acc.Reload()
    out = {}
    for tag in acc.Tags()["scalars"]:
        events = acc.Scalars(tag)
        steps = [e.step for e in events]
        assert len(steps) == len(set(steps)), (tag, steps)
        out[tag] = {e.step: e.value for e in events}
    return out


def assert_scalars_match_csv(folder: Path):
    rows = csv_rows(folder / "training.csv")
    tb = scalars(folder)
    # Every column but the step, less those never finite (PPO's grad_norm): nan is not logged.
    columns = [c for c in rows[0] if c != "iteration" and any(math.isfinite(float(r[c])) for r in rows)]
    assert set(tb) == set(columns), (sorted(tb), columns)
    for c in columns:
        want = {int(r["iteration"]): np.float32(float(r[c])) for r in rows if math.isfinite(float(r[c]))}
        assert tb[c] == want, c            # TensorBoard keeps float32
    return tb


def test_tensorboard_scalars_equal_the_csv(uninterrupted):
    tb = assert_scalars_match_csv(uninterrupted)
    for tag in ("loss", "lr", "env_steps", "grad_norm", "train_success"):
        assert sorted(tb[tag]) == list(range(1, ITERATIONS + 1)), tag
    assert sorted(tb["eval_success"]) == [2, 4, 6, 7]          # evaluations only


def test_tensorboard_after_a_resume_shows_each_step_once(tiny_config, tmp_path):
    """TensorBoard after a resume shows each step once.

    A run stopped after its row 5 (checkpoint at 4) and resumed: the first event file's step 5
    is purged by the second, so the scalars still equal the final csv.
    """
    from diffsim_ros.workflows.training import train_from_params

    class Stop(Exception):
        pass

    def stop(row):
        if row["iteration"] == 5:
            raise Stop

    params = config.load_yaml(tiny_config)
    with pytest.raises(Stop):
        train_from_params(params, str(tiny_config), tmp_path, callback=stop)
    assert len(list(tmp_path.glob("events.out.tfevents.*"))) == 1
    train_from_params(config.load_yaml(tiny_config), str(tiny_config), tmp_path, resume=True)
    assert len(list(tmp_path.glob("events.out.tfevents.*"))) == 2
    tb = assert_scalars_match_csv(tmp_path)
    assert sorted(tb["loss"]) == list(range(1, ITERATIONS + 1))


def test_best_checkpoint_is_the_best_evaluation(uninterrupted):
    """The best checkpoint is the best evaluation.

    checkpoints/best: the evaluated iteration with the highest success, ties to the lower loss,
    as the csv says; a loadable checkpoint.
    """
    rows = [r for r in csv_rows(uninterrupted / "training.csv") if r["eval_success"] != "nan"]
    want = max(rows, key=lambda r: (float(r["eval_success"]), -float(r["loss"])))
    model = physics.load_urdf(str(ROOT / "urdf" / "diffsim_arm.urdf"))
    best, meta = load_checkpoint(uninterrupted / "checkpoints" / "best", model=model)
    assert meta["checkpoint"] == {"kind": "best", "iteration": int(want["iteration"])}
    assert meta["training"]["iterations"] == int(want["iteration"])
    assert not (uninterrupted / "checkpoints" / "best" / "resume.pt").exists()
    state = resume_state(uninterrupted)
    assert state["best"]["iteration"] == int(want["iteration"])
    assert state["best"]["loss"] == float(want["loss"])
    if int(want["iteration"]) != ITERATIONS:          # then it is not the final policy
        final, _ = load_checkpoint(uninterrupted, model=model)
        obs = torch.randn(8, meta["observation"]["dim"], generator=torch.Generator().manual_seed(0))
        assert not torch.equal(best(obs), final(obs))


def test_csv_is_written_as_each_iteration_ends(tiny_config, tmp_path):
    from diffsim_ros.workflows.training import train_from_params

    seen = []

    def look(row):
        rows = csv_rows(tmp_path / "training.csv")
        seen.append(len(rows))
        assert rows[-1]["loss"] == str(row["loss"])

    train_from_params(config.load_yaml(tiny_config), str(tiny_config), tmp_path, overrides={"iterations": 3},
                      callback=look)
    assert seen == [1, 2, 3]


def test_ppo_csv_is_written_as_each_iteration_ends(tmp_path):
    pytest.importorskip("stable_baselines3", reason="the PPO baseline needs stable-baselines3")
    from diffsim_ros.learning.ppo import PPOConfig, train_ppo

    task, _ = config.build_task(tiny_params(), "tiny")
    cfg = PPOConfig(total_timesteps=3 * 4 * 8, num_envs=4, n_steps=8, batch_size=16, n_epochs=1,
                    eval_every_steps=10 ** 6, eval_envs=4, stop_at_success=False)
    seen = []
    res = train_ppo(task, cfg, out_dir=tmp_path, progress=False,
                    callback=lambda row: seen.append(len(csv_rows(tmp_path / "training.csv"))))
    assert seen == [1, 2, 3] and len(res.history) == 3
    assert_scalars_match_csv(tmp_path)


PPO_KILLER = """
import os, signal, sys
import stable_baselines3
from diffsim_ros import cli
real, calls = stable_baselines3.PPO.train, [0]
def dying(self):
    calls[0] += 1
    if calls[0] == {kill}:
        os.kill(os.getpid(), signal.SIGKILL)       # inside the update of iteration {kill}
    return real(self)
stable_baselines3.PPO.train = dying
sys.exit(cli.main({argv!r}))
"""


def test_killed_ppo_run_resumes_bit_for_bit(tmp_path, capsys):
    """A killed PPO run resumes bit for bit.

    ``diffsim-ros baseline --resume``: a PPO run killed inside iteration 6 (checkpoint every 2)
    and resumed ends with the same rows, networks, optimiser state and observation statistics as
    the run left alone. The rollout (5 steps) is shorter than the episode (8): the checkpoint (after 20 steps)
    falls mid-episode, so the environments themselves must come back.
    """
    pytest.importorskip("stable_baselines3", reason="the PPO baseline needs stable-baselines3")
    params = tiny_params()
    params["ppo"] = dict(total_timesteps=ITERATIONS * 4 * 5, num_envs=4, n_steps=5, batch_size=10, n_epochs=2,
                         eval_every_steps=48, eval_envs=4, stop_at_success=False, checkpoint_every=2, seed=3,
                         hidden=[16, 16])
    cfg = write_config(tmp_path / "tiny_ppo.yaml", params)
    one_go, out = tmp_path / "one_go", tmp_path / "run"
    rc, _, err = run_main(capsys, "baseline", "--config", cfg, "--out", one_go, "--no-progress")
    assert rc == 0, err
    argv = ["baseline", "--config", str(cfg), "--out", str(out), "--no-progress"]
    proc = subprocess.run([sys.executable, "-c", PPO_KILLER.format(kill=KILL_DURING, argv=argv)], cwd=ROOT,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == -9, proc.stdout + proc.stderr
    killed = csv_rows(out / "training.csv")
    assert [int(r["iteration"]) for r in killed] == list(range(1, KILL_DURING))
    assert without_time(killed) == without_time(csv_rows(one_go / "training.csv")[:KILL_DURING - 1])
    # Rerunning into the folder is refused, naming the way on.
    rc, _, err = run_main(capsys, *argv)
    assert rc == 2 and "diffsim-ros baseline --resume" in err, err
    # The gradient trainer's resume refuses a PPO run's state by name.
    rc, _, err = run_main(capsys, "train", "--resume", out)
    assert rc == 2 and "another trainer's" in err, err

    rc, stdout, err = run_main(capsys, "baseline", "--resume", out, "--no-progress")
    assert rc == 0, err
    assert "resuming" in stdout and "after iteration 4" in stdout
    rows = csv_rows(out / "training.csv")
    assert without_time(rows) == without_time(csv_rows(one_go / "training.csv"))
    assert rows[:4] == killed[:4]            # continued, not redone: the killed run's rows, wall times too
    a, b = resume_state(one_go), resume_state(out)
    assert a["iteration"] == b["iteration"] == ITERATIONS and a["finished"] and b["finished"]
    la, lb = a["learner"], b["learner"]
    for k in la["policy"]:
        assert torch.equal(la["policy"][k], lb["policy"][k]), k
    for i, st in la["optimizer"]["state"].items():
        for k, v in st.items():
            assert torch.equal(v, lb["optimizer"]["state"][i][k]), (i, k)
    for k in ("mean", "var"):
        assert torch.equal(la["normalizer"]["obs_rms"][k], lb["normalizer"]["obs_rms"][k]), k
    assert torch.equal(la["env"]["ts"]["sim"]["q"], lb["env"]["ts"]["sim"]["q"])
    model = physics.load_urdf(str(ROOT / "urdf" / "diffsim_arm.urdf"))
    pa, _ = load_checkpoint(one_go, model=model)
    pb, meta = load_checkpoint(out, model=model)
    obs = torch.randn(16, meta["observation"]["dim"], generator=torch.Generator().manual_seed(3))
    assert torch.equal(pa(obs), pb(obs))
    assert meta["training"]["method"] == "ppo" and meta["training"]["iterations"] == ITERATIONS
    # The best checkpoint is the best evaluation's, and loads for the robot.
    evals = [r for r in rows if r["eval_success"] != "nan"]
    _, best = load_checkpoint(out / "checkpoints" / "best", model=model)
    assert best["checkpoint"]["kind"] == "best"
    assert float(evals[[int(r["iteration"]) for r in evals].index(best["checkpoint"]["iteration"])]
                 ["eval_success"]) == max(float(r["eval_success"]) for r in evals)
    # Resuming a finished run, or with another option, is refused.
    rc, _, err = run_main(capsys, "baseline", "--resume", out)
    assert rc == 2 and "already finished" in err, err


# ------------------------------------------------------------------------ refusals


@pytest.fixture
def stopped_run(tiny_config, tmp_path):
    """Stop a run after 3 iterations (checkpoint at 2), ready to resume."""
    from diffsim_ros.workflows.training import train_from_params

    class Stop(Exception):
        pass

    def stop(row):
        if row["iteration"] == 3:
            raise Stop

    out = tmp_path / "stopped"
    with pytest.raises(Stop):
        train_from_params(config.load_yaml(tiny_config), str(tiny_config), out, callback=stop)
    return out


def test_resume_refuses_a_folder_without_a_resume_state(tmp_path, capsys):
    rc, _, err = run_main(capsys, "train", "--resume", tmp_path / "nowhere")
    assert rc == 2 and "--resume" in err and "no such folder" in err, err
    (tmp_path / "empty").mkdir()
    rc, _, err = run_main(capsys, "train", "--resume", tmp_path / "empty")
    assert rc == 2 and "no resume state" in err and "checkpoints/latest/resume.pt" in err, err
    (tmp_path / "bad" / "checkpoints" / "latest").mkdir(parents=True)
    (tmp_path / "bad" / "checkpoints" / "latest" / "resume.pt").write_bytes(b"not a resume state")
    rc, _, err = run_main(capsys, "train", "--resume", tmp_path / "bad")
    assert rc == 2 and "unreadable resume state" in err and "Traceback" not in err, err
    rc, _, err = run_main(capsys, "train", "--out", tmp_path / "x")
    assert rc == 2 and "--config" in err and "--resume" in err, err
    (tmp_path / "early").mkdir()
    (tmp_path / "early" / "training.csv").write_text("iteration,loss\n1,0.5\n")
    rc, _, err = run_main(capsys, "train", "--resume", tmp_path / "early")
    assert rc == 2 and "stopped before its first checkpoint" in err, err


def test_resume_refuses_another_configuration(stopped_run, tiny_config, tmp_path, capsys):
    hover = ROOT / "config" / "hover.yaml"
    rc, _, err = run_main(capsys, "train", "--resume", stopped_run, "--config", hover)
    assert rc == 2 and err.startswith("error: ") and "another configuration" in err, err
    assert "urdf" in err and "task.type" in err, err
    rc, _, err = run_main(capsys, "train", "--resume", stopped_run, "--iterations", "20")
    assert rc == 2 and "training.iterations" in err, err
    rc, _, err = run_main(capsys, "train", "--resume", stopped_run, "--out", tmp_path / "elsewhere")
    assert rc == 2 and "continues in its own folder" in err, err
    # A fresh run over it is refused too (it would throw the unfinished run away).
    rc, _, err = run_main(capsys, "train", "--config", tiny_config, "--out", stopped_run)
    assert rc == 2 and "unfinished training run" in err and "--resume" in err and "--force" in err, err
    # Nothing was changed by the refusals: it still resumes, from iteration 2.
    assert resume_state(stopped_run)["iteration"] == 2
    rc, out, err = run_main(capsys, "train", "--resume", stopped_run, "--no-progress")
    assert rc == 0, err
    assert [int(r["iteration"]) for r in csv_rows(stopped_run / "training.csv")] == list(range(1, ITERATIONS + 1))
    rc, _, err = run_main(capsys, "train", "--resume", stopped_run)
    assert rc == 2 and "already finished" in err, err


def test_resume_refuses_a_changed_urdf(tmp_path, capsys):
    urdf = tmp_path / "arm.urdf"
    shutil.copy(ROOT / "urdf" / "diffsim_arm.urdf", urdf)
    params = tiny_params()
    params["urdf"] = str(urdf)
    cfg = write_config(tmp_path / "arm.yaml", params)
    from diffsim_ros.workflows.training import train_from_params

    def stop(row):
        if row["iteration"] == 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        train_from_params(config.load_yaml(cfg), str(cfg), tmp_path / "run", callback=stop)
    urdf.write_text(urdf.read_text().replace("<robot ", "<!-- edited -->\n<robot ", 1))
    rc, _, err = run_main(capsys, "train", "--resume", tmp_path / "run")
    assert rc == 2 and "URDF changed" in err, err


def test_divergence_keeps_the_last_good_checkpoint(tmp_path):
    """A divergence keeps the last good checkpoint.

    The simulation diverging in every iteration from the 5th on: past max_divergences training stops
    with an error naming the iteration and the quantity, and checkpoints/latest holds iteration 4 (the
    periodic checkpoint was at 3), loadable and resumable.
    """
    from diffsim_ros.physics import SimulationError
    from diffsim_ros.workflows.training import train_from_params

    # No evaluation on the way (its rollouts would step the task too): task.step counts training steps.
    params = tiny_params(iterations=10, checkpoint_every=3, critic=False, randomize_mass=[], eval_every=100)
    task, model = config.build_task(params, "tiny")
    step, calls = task.step, {"n": 0}

    def diverging(ts, action):
        calls["n"] += 1
        if calls["n"] > 4 * params["task"]["horizon"]:
            raise SimulationError("non-finite qdd in environment 2 (injected)")
        return step(ts, action)

    task.step = diverging
    with pytest.warns(RuntimeWarning, match="iteration 5"):
        with pytest.raises(SimulationError) as info:
            train_from_params(params, "tiny.yaml", tmp_path, task=task, overrides={"max_divergences": 2})
    msg = str(info.value)
    assert "iteration 5" in msg and "non-finite qdd in environment 2" in msg and "max_divergences = 2" in msg
    assert "iteration 4" in msg and str(tmp_path / "checkpoints" / "latest") in msg
    latest = tmp_path / "checkpoints" / "latest"
    _, meta = load_checkpoint(latest, model=model)
    assert meta["checkpoint"]["iteration"] == 4 and meta["training"]["iterations"] == 4
    state = resume_state(tmp_path)
    assert state["iteration"] == 4 and not state["finished"] and state["diverged"] == 3
    assert [int(r["iteration"]) for r in csv_rows(tmp_path / "training.csv")] == [1, 2, 3, 4]


def test_out_refuses_to_overwrite_a_policy_without_force(tiny_config, tmp_path, capsys):
    out = tmp_path / "run"
    argv = ["train", "--config", tiny_config, "--out", out, "--no-progress", "--iterations", "2"]
    assert run_main(capsys, *argv)[0] == 0
    before = (out / "policy.pt").read_bytes()
    (out / "notes.txt").write_text("mine")
    rc, _, err = run_main(capsys, *argv)
    assert rc == 2 and "policy.pt" in err and "--force" in err, err
    assert (out / "policy.pt").read_bytes() == before
    rc, _, err = run_main(capsys, "baseline", "--config", tiny_config, "--out", out)
    assert rc == 2 and "--force" in err, err
    # --force: a new run; the old one's checkpoints and event files do not mix with it.
    rc, _, err = run_main(capsys, *argv, "--force", "--iterations", "3")
    assert rc == 0, err
    assert len(list(out.glob("events.out.tfevents.*"))) == 1
    assert resume_state(out)["iteration"] == 3 and len(csv_rows(out / "training.csv")) == 3
    assert (out / "notes.txt").read_text() == "mine"


def test_the_loop_retrains_into_its_own_folder(tiny_config, tmp_path, capsys):
    """The loop retrains into its own folder.

    The main job trains into its own folder (diffsim-ros loop's policy/), through the training
    function itself: a rerun into the same folder is a fresh run (the first run's event file and
    rows do not mix with the second's), as `diffsim-ros train --force` is.
    """
    from diffsim_ros.workflows.loop import train_policy

    out = tmp_path / "policy"
    for iterations in (2, 3):
        assert train_policy(tiny_config, out, threads=1, iterations=iterations) == out
        assert (out / "policy.pt").exists()
        assert len(csv_rows(out / "training.csv")) == iterations
        assert len(list(out.glob("events.out.tfevents.*"))) == 1
        assert resume_state(out)["iteration"] == iterations
    printed = capsys.readouterr().out
    assert printed.count("train: task") == 2 and "final success" in printed


def test_the_loop_names_what_is_wrong_with_a_training_file(tiny_config, tmp_path):
    """The loop names what is wrong with a training file.

    A bad training file stops the main job's training step with the CLI's one line (the file,
    the key), not a traceback.
    """
    from diffsim_ros.workflows.loop import LoopError, train_policy

    doc = yaml.safe_load(Path(tiny_config).read_text())
    doc["/**"]["ros__parameters"]["training"]["iteratoins"] = 3
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(doc))
    with pytest.raises(LoopError, match=r"training failed: .*iteratoins") as info:
        train_policy(str(bad), tmp_path / "policy", threads=1)
    assert str(bad) in str(info.value)


# ------------------------------------------------------------------------ options


def test_checkpoint_every_default_and_range():
    assert apg.TrainConfig().checkpoint_every == 10
    doc = apg.TrainConfig.__doc__
    assert "(>= 1) default: 10" in doc[doc.index("checkpoint_every:"):]    # its range and default documented
    assert apg.TrainConfig.from_mapping({"checkpoint_every": 3}).checkpoint_every == 3
    with pytest.raises(physics.ConfigError, match="training.checkpoint_every' must be >= 1, got 0"):
        apg.TrainConfig.from_mapping({"checkpoint_every": 0})


def test_device_cuda_without_cuda_is_a_clear_error(tiny_config, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    for cmd in ("train", "baseline"):
        rc, _, err = run_main(capsys, cmd, "--config", tiny_config, "--out", tmp_path / cmd, "--device", "cuda")
        assert rc == 2 and "--device 'cuda'" in err and "CUDA is not available" in err, err
        assert not (tmp_path / cmd).exists()
    rc, _, err = run_main(capsys, "train", "--config", tiny_config, "--out", tmp_path / "t", "--device", "tpu9")
    assert rc == 2 and "--device 'tpu9'" in err, err


def test_device_cpu_trains(tiny_config, tmp_path, capsys):
    out = tmp_path / "run"
    rc, stdout, err = run_main(capsys, "train", "--config", tiny_config, "--out", out, "--device", "cpu",
                               "--iterations", "1", "--no-progress")
    assert rc == 0, err
    meta = json.loads((out / "policy.json").read_text())
    assert meta["policy"]["device"] == "cpu" and meta["policy"]["dtype"] == "float32"
    assert "checkpoints/latest/" in stdout


def test_without_tensorboard_the_csv_is_still_written(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)
    log = RunLog(tmp_path)
    assert log.tensorboard is None
    log.append({"iteration": 1, "loss": 0.5})
    log.close()
    assert csv_rows(tmp_path / "training.csv") == [{"iteration": "1", "loss": "0.5"}]
    assert not list(tmp_path.glob("events.out.tfevents.*"))
