"""What every trainer's run shares: the gradient trainer's (:mod:`.apg`) and the baselines' (:mod:`.baseline`).

- the run's log: ``training.csv`` (one row of :data:`COLUMNS` per iteration, flushed) and TensorBoard
  event files of the same numbers (:class:`RunLog`), what an earlier run left cleared
  (:func:`clear_run`), the bookkeeping after each row (:func:`after_row`), the evaluation columns of a
  row (:func:`evaluation_columns`) and which evaluation is the best (:func:`better`);
- the checkpoints: ``checkpoints/latest`` (with the resume state) and ``checkpoints/best``, each
  written whole and put in place by renames (:class:`Checkpoints`, :func:`default_export`);
- the resume state: its common entries (:func:`run_state`), every random generator's state
  (:func:`set_rng_state`), reading it back (:func:`read_resume_file`) and the check that it is a run
  of the same task and options (:func:`check_same_trainer`); a :class:`ResumeError` otherwise. Each
  trainer adds its own weights and options and reads its own format (``load_resume_state`` of
  :mod:`.apg`, :mod:`.ppo`, :mod:`.sac`);
- the history at the end: ``training.csv`` and ``learning_curve.png`` (:func:`write_history`,
  :func:`plot_history`), and the result a trainer returns (:class:`TrainResult`).
"""
from __future__ import annotations

import csv
import math
import os
import random
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional

import numpy as np
import torch

from ..physics import ConfigError
from ..tasks import Task
from .policy import MLPPolicy


CHECKPOINTS = "checkpoints"          # DIR/checkpoints/{latest,best}/
RESUME_FILE = "resume.pt"            # the training state, in checkpoints/latest/


class ResumeError(ConfigError):
    """A run that cannot be resumed: no resume state, a damaged one, or another configuration."""


@dataclass
class TrainResult:
    """What a trainer returns.

    The final policy, the rows of training.csv, and when the evaluation first reached the task's
    success threshold (None if it never did).
    """

    policy: MLPPolicy
    history: List[Dict[str, float]]
    solved_env_steps: Optional[int]      # training env steps when success was first reached
    solved_time: Optional[float]         # wall-clock seconds then


#: training.csv's columns, in order (both trainers write all of them; nan where a value does not apply).
COLUMNS = ("iteration", "env_steps", "wall_time", "loss", "grad_norm", "train_success", "eval_success",
           "eval_at_limit", "eval_over_speed", "diverged", "lr")


def evaluation_columns(task: Task, policy: Callable, episodes: int, seed: int = 12345) -> Dict[str, float]:
    """Return the evaluation columns of a training row.

    Over the same fresh episodes as :func:`~diffsim_ros.learning.apg.evaluate`:
    ``eval_success``, and the fractions of episodes with an actuated joint at its URDF position
    limit (``eval_at_limit``) or over its URDF velocity limit (``eval_over_speed``) at any step
    (nan for a robot without such limits): a policy can meet the task by leaning on a stop or by
    moving faster than the real drives would.
    """
    gen = torch.Generator().manual_seed(seed)
    rep = task.rollout_report(policy, episodes, gen)
    return {"eval_success": rep["success"], "eval_at_limit": rep["at_limit"], "eval_over_speed": rep["over_speed"]}


def better(row: Dict[str, float], best: Optional[Dict[str, float]]) -> bool:
    """Whether ``row``'s evaluation beats ``best``: a higher success rate, or the same with a lower loss."""
    if best is None:
        return True
    if row["eval_success"] != best["eval_success"]:
        return row["eval_success"] > best["eval_success"]
    return row["loss"] < best["loss"]


def after_row(row: Dict[str, float], it: int, done: bool, checkpoint_every: int, log, checkpoints, save: Callable,
              callback: Optional[Callable], bar, advance: int) -> None:
    """Do a trainer's bookkeeping after its row of iteration ``it``.

    For the gradient trainer and the baselines alike: the log, a checkpoint every
    ``checkpoint_every`` iterations and at the end (``save(done)``), the callback, the progress bar
    moved on by ``advance``.
    """
    if log is not None:
        log.append(row)
    if checkpoints is not None and (it % checkpoint_every == 0 or done):
        save(done)
    if callback is not None:
        callback(row)
    if bar is not None:
        bar.set_postfix(loss=f"{row['loss']:.4f}", success=f"{row['train_success']:.2f}")
        bar.update(advance)


# ---------------------------------------------------------------------------- the run's folder
class RunLog:
    """A run's log in ``out_dir``: ``training.csv`` and TensorBoard event files.

    ``training.csv`` is rewritten with the rows of ``history`` (a resumed run's rows up to its
    checkpoint; none for a fresh run) and then one row appended and flushed per :meth:`append`, so a
    killed run keeps every row it finished; and, when the ``tensorboard`` package is importable,
    TensorBoard event files beside it hold the same numbers (tag = column name, step =
    ``iteration``; nan left out; a resumed run's file purges the steps the killed run logged after
    its checkpoint, so TensorBoard shows each step once).
    """

    def __init__(self, out_dir: Path, history=(), tensorboard: bool = True):
        self.out_dir = Path(out_dir)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self.csv_path = self.out_dir / "training.csv"
        self._file = open(self.csv_path, "w", newline="")
        self._csv = None
        for row in history:
            self._write(row)
        self._file.flush()
        self.tensorboard = None
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError:      # TensorBoard is optional; training.csv holds the same numbers
                SummaryWriter = None
            if SummaryWriter is not None:
                purge = int(history[-1]["iteration"]) + 1 if history else None
                self.tensorboard = SummaryWriter(str(self.out_dir), purge_step=purge)

    def _write(self, row: Dict[str, float]) -> None:
        if self._csv is None:
            self._csv = csv.DictWriter(self._file, fieldnames=list(row.keys()))
            self._csv.writeheader()
        self._csv.writerow(row)

    def append(self, row: Dict[str, float]) -> None:
        self._write(row)
        self._file.flush()
        if self.tensorboard is not None:
            step = int(row["iteration"])
            for key, val in row.items():
                if key != "iteration" and isinstance(val, (int, float)) and math.isfinite(val):
                    self.tensorboard.add_scalar(key, float(val), step)
            self.tensorboard.flush()

    def close(self) -> None:
        if not self._file.closed:
            self._file.close()
        if self.tensorboard is not None:
            self.tensorboard.close()
            self.tensorboard = None


def clear_run(out_dir: Path) -> None:
    """Remove what an earlier run left in ``out_dir`` that a new run would mix with its own.

    That is the checkpoints (a later resume would otherwise take the old run's) and the TensorBoard
    event files.
    """
    shutil.rmtree(out_dir / CHECKPOINTS, ignore_errors=True)
    if out_dir.is_dir():
        for f in out_dir.glob("events.out.tfevents.*"):
            f.unlink(missing_ok=True)


def default_export(task: Task, cfg, method: str):
    """Return the checkpoint export of a run without one given.

    It writes policy.pt and policy.json with its training summary (``cfg``: the trainer's options;
    ``method``: policy.json's ``training.method``).
    """
    def export(policy, result, folder, info):
        from .checkpoint import save_checkpoint, training_summary

        save_checkpoint(policy, task, folder, extra={
            "training": dict(training_summary(result, cfg), method=method), "checkpoint": info})
    return export


class Checkpoints:
    """``out_dir/checkpoints/<kind>/``, each written whole and then put in place by two renames.

    Each is written into ``<kind>.tmp`` and the previous one kept as ``<kind>.old`` in between, so a
    kill leaves a complete checkpoint behind, never half of one.
    """

    def __init__(self, out_dir: Path, task, export: Callable[..., Any]):
        self.root = Path(out_dir) / CHECKPOINTS
        self.task = task
        self.export = export

    def path(self, kind: str) -> Path:
        return self.root / kind

    def has(self, kind: str) -> bool:
        return (self.root / kind).is_dir()

    def save_run(self, gen: torch.Generator, pending_best, policy, iteration: int, history, solved_steps,
                 solved_time, state_of: Callable[[Dict[str, Any]], Dict[str, Any]]) -> None:
        """Save a run's checkpoints.

        ``best`` when a better evaluation (``pending_best``) came since the last save, and ``latest`` of
        ``policy`` with the resume state ``state_of(rng)`` (``rng``: every generator's state, ``gen`` the
        trainer's own); nothing the run draws from its random generators changes.
        """
        device = self.task.model.device
        rng = _rng_state(gen, device)
        try:
            if pending_best is not None:
                self.write_best(pending_best, history, solved_steps, solved_time)
            self.write("latest", policy, TrainResult(policy, history, solved_steps, solved_time),
                       {"kind": "latest", "iteration": iteration}, state_of(rng))
        finally:
            set_rng_state(rng, gen, device)

    def write_best(self, pending, history: List[Dict[str, float]], solved_steps, solved_time) -> Path:
        """checkpoints/best: ``pending`` = (policy, iteration) of the best evaluation.

        With the history up to that iteration (and the solve only if it came by then).
        """
        pol, k = pending
        upto = history[:k]
        solved = solved_steps if solved_steps is not None and solved_steps <= upto[-1]["env_steps"] else None
        return self.write("best", pol, TrainResult(pol, upto, solved, solved_time if solved else None),
                          {"kind": "best", "iteration": k})

    def write(self, kind: str, policy, result: "TrainResult", info: Dict[str, Any],
              state: Optional[Dict[str, Any]] = None) -> Path:
        final, tmp, old = self.root / kind, self.root / (kind + ".tmp"), self.root / (kind + ".old")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        self.export(policy, result, tmp, info)
        if state is not None:
            torch.save(state, tmp / RESUME_FILE)
        if final.exists():
            shutil.rmtree(old, ignore_errors=True)
            os.replace(final, old)
        os.replace(tmp, final)
        shutil.rmtree(old, ignore_errors=True)
        return final


# ---------------------------------------------------------------------------- resume state
def _rng_state(gen: torch.Generator, device: torch.device) -> Dict[str, Any]:
    """Every random generator a run may draw from, as plain values and tensors.

    The trainer's ``gen``, torch's global CPU (and, on a GPU, CUDA) generator, numpy's and Python's.
    """
    name, keys, pos, has_gauss, cached = np.random.get_state()
    state = {"generator": gen.get_state(), "torch": torch.get_rng_state(),
             "numpy": {"name": name, "keys": torch.from_numpy(keys.astype(np.int64)), "pos": int(pos),
                       "has_gauss": int(has_gauss), "cached_gaussian": float(cached)},
             "python": random.getstate(), "cuda": None}
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def set_rng_state(state: Dict[str, Any], gen: torch.Generator, device: torch.device) -> None:
    gen.set_state(state["generator"])
    torch.set_rng_state(state["torch"])
    n = state["numpy"]
    np.random.set_state((n["name"], n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"],
                         n["cached_gaussian"]))
    random.setstate(state["python"])
    if state.get("cuda") is not None and device.type == "cuda":
        torch.cuda.set_rng_state(state["cuda"], device)


def read_resume_file(out_dir, fmt: str, version: int, required) -> Dict[str, Any]:
    """``out_dir``'s resume state of format ``fmt``, with its ``path``.

    See :func:`diffsim_ros.learning.apg.load_resume_state`; a :class:`ResumeError` when it is missing,
    unreadable, of another format or version, or lacks one of the ``required`` entries.
    """
    out_dir = Path(out_dir)
    root = out_dir / CHECKPOINTS
    path = next((p for p in (root / "latest" / RESUME_FILE, root / "latest.old" / RESUME_FILE) if p.is_file()),
                None)
    if path is None:
        started = root.is_dir() or (out_dir / "training.csv").is_file()
        why = ("no such folder" if not out_dir.is_dir() else
               "the run stopped before its first checkpoint (every training.checkpoint_every iterations)"
               if started else "it holds no training run")
        raise ResumeError(f"{out_dir}: no resume state ({CHECKPOINTS}/latest/{RESUME_FILE}): {why}")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - any failure to read is a damaged file
        raise ResumeError(f"{path}: unreadable resume state ({type(exc).__name__}: {exc})") from None
    if not isinstance(state, dict) or state.get("format") != fmt:
        other = state.get("format") if isinstance(state, dict) else None
        raise ResumeError(f"{path}: not a resume state of this trainer (format {fmt!r}"
                          + (f"; this one is {other!r}, another trainer's" if isinstance(other, str) else "") + ")")
    if state.get("format_version") != version:
        raise ResumeError(f"{path}: resume state format_version {state.get('format_version')!r}, this version "
                          f"reads {version}")
    missing = [k for k in required if k not in state]
    if missing:
        raise ResumeError(f"{path}: resume state without {', '.join(missing)}")
    state["path"] = str(path)
    return state


def task_signature(task: Task) -> Dict[str, Any]:
    """Return what a resume state records of its task and checks against the task it resumes on."""
    return {"name": task.name, "obs_dim": task.obs_dim, "action_dim": task.action_dim}


def run_state(fmt: str, version: int, task: Task, iteration: int, finished: bool, history, best, solved_steps,
              solved_time, rng: Dict[str, Any], run_info) -> Dict[str, Any]:
    """Return the entries every trainer's resume state has (its own weights and options are added to it)."""
    return {"format": fmt, "format_version": version, "iteration": iteration, "finished": finished,
            "history": history, "solved_env_steps": solved_steps, "solved_time": solved_time, "best": best,
            "rng": rng, "task": task_signature(task), "device": str(task.model.device), "run_info": run_info}


def check_same_trainer(state: Dict[str, Any], task: Task, section: str, then: Dict[str, Any],
                       now: Dict[str, Any]) -> None:
    """Raise a :class:`ResumeError` naming each difference when ``state``'s run was of another task or trainer.

    Another task: name, dimensions; other trainer options: ``then`` against ``now``, the
    ``section``'s.
    """
    want = task_signature(task)
    diff = [f"task {k}: {state['task'].get(k)!r} then, {v!r} now" for k, v in want.items()
            if state["task"].get(k) != v]
    diff += [f"{section}.{k}: {then.get(k)!r} then, {v!r} now" for k, v in now.items() if then.get(k) != v]
    if diff:
        raise ResumeError(f"{state.get('path', 'resume state')}: the run was started with another configuration "
                          f"({'; '.join(diff)})")


# ---------------------------------------------------------------------------- history
def write_history(history: List[Dict[str, float]], out_dir: Path, title: str = "") -> None:
    """training.csv and learning_curve.png (success rate and loss against environment steps)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    if not history:
        return
    with open(out_dir / "training.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(history[0].keys()))
        w.writeheader()
        w.writerows(history)
    plot_history(history, out_dir, title)


def plot_history(history: List[Dict[str, float]], out_dir: Path, title: str = "") -> None:
    """learning_curve.png: loss and success rate (training episodes, evaluations).

    Plotted against environment steps; nothing without matplotlib or rows.
    """
    if not history:
        return
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:      # plotting is optional; the CSV holds the same numbers
        return
    steps = [h["env_steps"] for h in history]
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 4))
    a1.plot(steps, [h["loss"] for h in history])
    a1.set_xlabel("environment steps")
    a1.set_ylabel("loss per step")
    a1.set_yscale("symlog", linthresh=1e-3)
    ev = [(h["env_steps"], h["eval_success"]) for h in history if not math.isnan(h["eval_success"])]
    a2.plot(steps, [h["train_success"] for h in history], label="success: training episodes")
    if ev:
        a2.plot(*zip(*ev), "o-", label="success: evaluation")
    over = [(h["env_steps"], h["eval_over_speed"]) for h in history
            if isinstance(h.get("eval_over_speed"), (int, float)) and math.isfinite(h["eval_over_speed"])]
    if over:
        a2.plot(*zip(*over), "x--", color="tab:red", label="evaluation: over a URDF velocity limit")
    a2.set_xlabel("environment steps")
    a2.set_ylabel("fraction of episodes")
    a2.set_ylim(-0.05, 1.05)
    a2.legend()
    from matplotlib.ticker import EngFormatter

    for ax in (a1, a2):
        ax.xaxis.set_major_formatter(EngFormatter())      # 100k, not 100000 run into its neighbour
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(Path(out_dir) / "learning_curve.png", dpi=100)
    plt.close(fig)

