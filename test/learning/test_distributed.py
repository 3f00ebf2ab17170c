"""Data-parallel gradient training under torchrun (issue 18, item 6).

Two ranks on the CPU (gloo), each simulating half of the environments, must train
the same policy as one process over all of them with the same seed: the same rows
in training.csv and the same weights (policy, normaliser, critic) to float64
rounding. The runs are started as a user would (``python -m torch.distributed.run
--standalone --nproc_per_node=2`` running ``diffsim_ros.cli`` as ``__main__``),
through a small wrapper that

- injects one divergence (a SimulationError from Task.step) on one rank only, inside
  iteration 3, so that the retry must be collective (a rank retrying alone would leave
  the other waiting in a collective: a hang, cut by the timeout) and the single-process
  reference gets the same divergence at the same step;
- makes every rank but 0 fail when it opens a file for writing, creates, renames or
  removes anything inside --out (rank 0 alone writes the run).

One run starts afresh; another resumes, with 2 ranks, the state a single-process run
left after its checkpoint at iteration 2 (all ranks continue from the state rank 0
read). A world size that does not divide training.num_envs is refused with a message.

Tolerance: rtol 1e-10 and atol 1e-12 on float64 values. The runs differ only in the
order of floating-point sums (the batch's gradient mean over 8 environments against
the mean of two ranks' means over 4, and batched matrix products of 4 rows against 8),
a few units of 1e-16 per operation; three iterations of 8-step episodes and Adam keep
that near 1e-16 (measured: 3e-16 at most on the weights), while ranks that each train on
their own half (gradients not all-reduced) end 1.7e-2 apart on the weights, and ranks whose
normalisers see only their half 0.18 apart on its mean.
"""
from __future__ import annotations

import csv
import json
import math
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from diffsim_ros import config
from diffsim_ros.cli import main
from diffsim_ros.learning import apg
from diffsim_ros.learning import distributed as ddp
from diffsim_ros.physics import SimulationError
from diffsim_ros.tasks.base import Task

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.skipif(
    not (torch.distributed.is_available() and torch.distributed.is_gloo_available()),
    reason="this torch build has no torch.distributed with the gloo backend")

RTOL, ATOL = 1e-10, 1e-12
HORIZON = 8                     # control steps per episode: one Task.step call per step and iteration
ITERATIONS = 3
FAULT_STEP = 2 * HORIZON + 6    # the 6th step of iteration 3, counting gradient-carrying steps from the start
TIMEOUT_S = 300                 # s, a whole torchrun launch (a hang fails the test instead of the suite)

WRAPPER = r'''
import builtins, io, os, runpy, shutil, sys
import torch
from diffsim_ros.physics import SimulationError
from diffsim_ros.tasks.base import Task

rank = int(os.environ["RANK"])
fault_rank, fault_call = (int(x) for x in os.environ["FAULT"].split(":"))
real_step, calls = Task.step, [0]

def step(self, ts, action):
    if torch.is_grad_enabled():          # training steps; evaluation runs without gradients
        calls[0] += 1
        if rank == fault_rank and calls[0] == fault_call:
            raise SimulationError("non-finite qdd in environment 1 (injected)")
    return real_step(self, ts, action)
Task.step = step

if rank != 0:                            # the other ranks must not touch the run's folder
    out = os.path.realpath(os.environ["WATCH"])
    def inside(p):
        try:
            p = os.path.realpath(os.fspath(p))
        except TypeError:
            return False
        return p == out or p.startswith(out + os.sep)
    def guard(name, real, writes=lambda *a, **k: True):
        def wrapped(path, *a, **k):
            if inside(path) and writes(*a, **k):
                raise AssertionError(f"rank {rank} wrote into the run's folder: {name}({path!r})")
            return real(path, *a, **k)
        return wrapped
    writing = lambda mode="r", *a, **k: any(c in mode for c in "wax+")
    builtins.open = io.open = guard("open", builtins.open, writing)
    for name in ("mkdir", "makedirs", "remove", "unlink", "rmdir", "replace", "rename"):
        setattr(os, name, guard(name, getattr(os, name)))
    shutil.rmtree = guard("rmtree", shutil.rmtree)

sys.argv = ["diffsim_ros.cli"] + sys.argv[1:]
runpy.run_module("diffsim_ros.cli", run_name="__main__", alter_sys=True)
'''


def tiny_params(**training) -> dict:
    """Return the training parameters of the project's arm reaching.

    float64, 8-step episodes, 8 environments, critic and mass randomisation on (both must stay in
    step across the ranks), a checkpoint every 2 iterations.
    """
    params = config.load_yaml(ROOT / "config" / "reach_arm.yaml")
    params["dtype"] = "float64"
    params["task"]["horizon"] = HORIZON
    params["training"].update(iterations=ITERATIONS, num_envs=8, window=4, eval_every=2, eval_envs=4,
                              checkpoint_every=2, stop_at_success=False, critic=True, randomize_mass=[0.8, 1.2])
    params["training"].update(training)
    return params


def write_config(path: Path, params: dict) -> Path:
    path.write_text(yaml.safe_dump({"/**": {"ros__parameters": params}}, sort_keys=False))
    return path


def csv_rows(path: Path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def resume_state(folder: Path) -> dict:
    return torch.load(folder / "checkpoints" / "latest" / "resume.pt", map_location="cpu", weights_only=True)


def listing(folder: Path):
    """Every file under ``folder``, relative, the TensorBoard event files' names reduced to their kind."""
    names = sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())
    return [("events.out.tfevents" if "tfevents" in n else n) for n in names]


def assert_same_rows(got, want):
    assert len(got) == len(want) == ITERATIONS
    for g, w in zip(got, want):
        assert g.keys() == w.keys()
        for k in w:
            if k == "wall_time":
                continue
            if k in ("iteration", "env_steps", "diverged"):
                assert g[k] == w[k], (k, g, w)
            else:
                a, b = float(g[k]), float(w[k])
                assert (math.isnan(a) and math.isnan(b)) or math.isclose(a, b, rel_tol=RTOL, abs_tol=ATOL), (k, g, w)


def assert_same_weights(got: dict, want: dict) -> float:
    """Policy (with its normaliser) and critic of two resume states agree; the largest difference."""
    worst = 0.0
    for part in ("policy", "critic"):
        assert got[part].keys() == want[part].keys()
        for k in want[part]:
            torch.testing.assert_close(got[part][k], want[part][k], rtol=RTOL, atol=ATOL, msg=f"{part}.{k}")
            worst = max(worst, float((got[part][k] - want[part][k]).abs().max()))
    return worst


def torchrun(tmp_path: Path, argv, fault: str, watch: Path) -> subprocess.CompletedProcess:
    """``argv`` of diffsim_ros.cli on 2 CPU ranks; its own process group, killed whole on timeout."""
    script = tmp_path / "wrapper.py"
    script.write_text(WRAPPER)
    env = dict(os.environ, DIFFSIM_NO_VIDEO="1", OMP_NUM_THREADS="1", FAULT=fault, WATCH=str(watch))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(script),
           *[str(a) for a in argv]]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"torchrun did not finish within {TIMEOUT_S} s (a rank waiting for another?):\n{out}\n{err}")
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


@pytest.fixture(scope="module")
def tiny_config(tmp_path_factory) -> Path:
    return write_config(tmp_path_factory.mktemp("cfg") / "tiny_reach.yaml", tiny_params())


@pytest.fixture(scope="module")
def single(tiny_config, tmp_path_factory):
    """Run the reference: one process over all 8 environments.

    The injected divergence is at the same step. Returns (its folder, a copy of the folder as it
    was right after the checkpoint of iteration 2).
    """
    from diffsim_ros.workflows.training import train_from_params

    base = tmp_path_factory.mktemp("single")
    out, stopped = base / "run", base / "stopped"
    calls = [0]

    def step(self, ts, action):
        if torch.is_grad_enabled():
            calls[0] += 1
            if calls[0] == FAULT_STEP:
                raise SimulationError("non-finite qdd in environment 1 (injected)")
        return real_step(self, ts, action)

    def copy_at_2(row):
        if row["iteration"] == 2:
            shutil.copytree(out, stopped)

    real_step = Task.step
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("DIFFSIM_NO_VIDEO", "1")
        mp.setattr(Task, "step", step)
        with pytest.warns(RuntimeWarning, match="dropped and retried"):
            train_from_params(config.load_yaml(tiny_config), str(tiny_config), out, callback=copy_at_2)
    assert resume_state(stopped)["iteration"] == 2 and not (stopped / "policy.pt").exists()
    return out, stopped


def test_two_ranks_train_the_single_process_policy(tiny_config, single, tmp_path):
    ref, _ = single
    out = tmp_path / "run"
    proc = torchrun(tmp_path, ["train", "--config", tiny_config, "--out", out, "--no-progress"],
                    fault=f"1:{FAULT_STEP}", watch=out)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "data-parallel over 2 processes (gloo, cpu)" in proc.stdout
    assert proc.stdout.count("files in ") == 1          # rank 0 alone reports
    rows, want = csv_rows(out / "training.csv"), csv_rows(ref / "training.csv")
    assert [r["diverged"] for r in want] == ["0", "0", "1"]      # the divergence hit both runs in iteration 3
    assert_same_rows(rows, want)
    worst = assert_same_weights(resume_state(out), resume_state(ref))
    print(f"largest weight difference, 2 ranks against 1 process: {worst:.3g}")
    # The exported float32 policy too.
    a, b = torch.jit.load(str(out / "policy.pt")).state_dict(), torch.jit.load(str(ref / "policy.pt")).state_dict()
    for k in b:
        torch.testing.assert_close(a[k], b[k], rtol=1e-6, atol=1e-7, msg=k)
    # The same files as the single-process run: one training.csv, one event file (a second rank's
    # writer would add its own), the checkpoints and the policy.
    assert listing(out) == listing(ref)
    assert listing(out).count("events.out.tfevents") == 1
    meta = json.loads((out / "policy.json").read_text())
    assert meta["training"]["method"] == "analytic_gradient"


def test_two_ranks_resume_a_run(tiny_config, single, tmp_path):
    """Two ranks resume a run.

    Rank 0 reads checkpoints/latest of a run stopped after iteration 2, both ranks continue it; the
    divergence now hits rank 0 (6th step since the resume).
    """
    ref, stopped = single
    out = tmp_path / "resumed"
    shutil.copytree(stopped, out)
    proc = torchrun(tmp_path, ["train", "--resume", out, "--no-progress"], fault=f"0:{FAULT_STEP - 2 * HORIZON}",
                    watch=out)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("resuming") == 1 and "after iteration 2" in proc.stdout
    assert_same_rows(csv_rows(out / "training.csv"), csv_rows(ref / "training.csv"))
    a = resume_state(out)
    assert a["iteration"] == ITERATIONS and a["finished"]
    assert_same_weights(a, resume_state(ref))


def test_a_world_size_that_does_not_divide_num_envs_is_refused(tiny_config, tmp_path, capsys, monkeypatch):
    """Refused before any process waits for another: rank 0 of 3 (no peers started) gets the message."""
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "3")
    monkeypatch.setenv("LOCAL_RANK", "0")
    out = tmp_path / "run"
    rc = main(["train", "--config", str(tiny_config), "--out", str(out), "--no-progress"])
    err = capsys.readouterr().err
    assert rc == 2 and "training.num_envs = 8 is not divisible by the world size 3" in err, err
    assert "use 6 or 9" in err, err
    rc = main(["train", "--config", str(tiny_config), "--out", str(out), "--num-envs", "10", "--no-progress"])
    err = capsys.readouterr().err
    assert rc == 2 and "--num-envs = 10 is not divisible by the world size 3" in err, err
    assert not out.exists()
    # The trainer itself refuses too (a resumed run's num_envs is known only from its state).
    params = tiny_params()
    task, _ = config.build_task(params, "tiny")
    cfg = apg.TrainConfig.from_mapping(params["training"])
    with pytest.raises(ddp.DistributedError, match="not divisible by the world size 3"):
        apg.train(task, cfg, progress=False, distributed=ddp.Context(rank=1, world_size=3))


def test_distributed_flag_needs_torchrun(tiny_config, tmp_path, capsys, monkeypatch):
    for k in ddp.TORCHRUN_VARS:
        monkeypatch.delenv(k, raising=False)
    rc = main(["train", "--config", str(tiny_config), "--out", str(tmp_path / "run"), "--distributed"])
    err = capsys.readouterr().err
    assert rc == 2 and "--distributed: no torchrun environment" in err and "torchrun --nproc_per_node" in err, err


def test_sharding_and_a_single_process_context():
    ctx = ddp.Context(rank=2, world_size=4)
    assert ctx.shard(16) == slice(8, 12) and ctx.active and not ctx.is_main
    assert ddp.SINGLE.shard(7) == slice(0, 7) and not ddp.SINGLE.active
    x = torch.arange(6.0)
    assert ddp.SINGLE.gather_batch(x) is x and ddp.SINGLE.mean([1.0, 2.0]) == [1.0, 2.0]
    with pytest.raises(ddp.DistributedError, match="--device cuda:1"):
        ddp.rank_device(ddp.Context(rank=0, world_size=2), torch.device("cuda:1"))
