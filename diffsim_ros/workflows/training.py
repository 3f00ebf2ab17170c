"""One training path for ``diffsim-ros train`` and the ``train_node`` ROS node.

    task, result, files = train_from_params(config.load_yaml(path), path, "runs/hover")

Builds the task from the parameter mapping of a training file (config/<task>.yaml),
trains by gradients through the simulator (``learning.apg.train``) and writes the
checkpoint (``save_checkpoint``) with the training summary and the whole parameter
set, so that a controller can rebuild the task exactly from the checkpoint alone.

On the way the run keeps ``out/training.csv`` (a row per iteration), TensorBoard event
files, ``out/checkpoints/latest/`` (with ``resume.pt``) and ``out/checkpoints/best/``
(see :func:`diffsim_ros.learning.apg.train`); ``train_from_params(..., resume=True)``
continues the run in ``out`` where it stopped, refusing another configuration:

    params, source, done = resume_source("runs/hover")    # the configuration the run started with
    task, result, files = train_from_params(params, source, "runs/hover", resume=True)

Under torchrun (``distributed=``, see :mod:`diffsim_ros.learning.distributed`) every rank calls
it alike; rank 0 alone reads the resume state (the others get a copy) and writes ``out``.
"""
from __future__ import annotations

import copy
import math
import os
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple, Union


def train_from_params(params: Dict[str, Any], source: str, out: Union[str, os.PathLike],
                      overrides: Optional[Dict[str, Any]] = None, callback=None, progress: bool = False,
                      task=None, resume: bool = False, distributed=None, init_from=None):
    """Train on ``params`` (read from ``source``) into ``out``; returns (task, result, files).

    ``overrides`` replace entries of the ``training`` section (None values are ignored);
    ``task``: an already built task for these parameters (else it is built here), on the device
    to train on. ``resume``: continue the run in ``out`` from ``out/checkpoints/latest`` (bit for
    bit); a :class:`~diffsim_ros.learning.run.ResumeError` (a ConfigError) when there is no resume
    state there, or when ``params`` with ``overrides``, or the URDF's content, differ from the
    run's.

    ``distributed``: this process's :class:`~diffsim_ros.learning.distributed.Context` in a
    data-parallel run (process group set up): rank 0 reads the resume state and hands it to the
    others, and alone writes ``out`` (checkpoint, log, video); the other ranks return no files.

    ``init_from``: a trained checkpoint folder whose policy this run starts from instead of fresh
    weights (fine-tuning; :func:`~diffsim_ros.learning.checkpoint.initial_weights` says what must
    match, a CheckpointError otherwise); policy.json records it as ``training.initialized_from``.
    Ignored when resuming (the run continues from its own weights).
    """
    from .. import config, schema
    from ..learning.apg import TrainConfig, load_resume_state, train
    from ..learning.checkpoint import initial_weights, json_safe, save_checkpoint, training_summary
    from ..learning.distributed import SINGLE

    if task is None:
        config.check_keys(params, config.TRAINING_FILE_KEYS, source)
        task, _ = config.build_task(params, source)
    training = config.section(params, "training", source)
    training.update({k: v for k, v in (overrides or {}).items() if v is not None})
    try:
        # What TrainConfig.from_mapping does (schema.section attaches it to the class, where mypy cannot see it).
        cfg: TrainConfig = schema.from_mapping(TrainConfig, training, "training")
    except config.ConfigError as e:
        raise config.ConfigError(f"{source}: {e}") from None
    out = Path(out)
    # What the run is checked against when resumed: the parameters as trained (overrides applied).
    effective = copy.deepcopy(params)
    effective["training"] = copy.deepcopy(training)
    run_info = {"config": effective, "config_file": os.path.abspath(source),
                "urdf_sha256": task.model.urdf_sha256}
    dist = distributed or SINGLE
    init = origin = None
    if init_from is not None and not resume:
        init, origin = initial_weights(init_from, task, cfg.hidden, cfg.normalize_obs)
        run_info["initialized_from"] = origin
    state = None
    if resume:
        def read():
            st = load_resume_state(out)
            check_same_run(st, run_info)
            return st
        state = dist.from_rank0(read)
    if dist.is_main:
        out.mkdir(parents=True, exist_ok=True)

    if state is not None:       # a resumed run keeps the record of where it started
        origin = (state.get("run_info") or {}).get("initialized_from")
        if origin is not None:
            run_info["initialized_from"] = origin

    def summary(res):
        out_ = dict(training_summary(res, cfg), method="analytic_gradient")
        if origin is not None:
            out_["initialized_from"] = json_safe(origin)
        return out_

    def export(policy, partial, folder, info):
        """checkpoints/latest and checkpoints/best: the final checkpoint's metadata, so far."""
        save_checkpoint(policy, task, folder, extra={
            "training": summary(partial), "config": json_safe(params), "config_file": os.path.abspath(source),
            "checkpoint": info})

    result = train(task, cfg, out_dir=out, progress=progress, callback=callback, resume=state, export=export,
                   run_info=run_info, distributed=dist, init=init)
    if not dist.is_main:
        return task, result, {}
    extra = {"training": summary(result), "config": json_safe(params), "config_file": os.path.abspath(source)}
    files = save_checkpoint(result.policy, task, out, extra=extra)
    # rollout.gif beside learning_curve.png: one episode of the final policy, 160x120, <= 40 frames
    # (diffsim_ros.workflows.evaluation.training_video). DIFFSIM_NO_VIDEO=1 skips it; a rendering problem is
    # a warning, never a failed training run.
    if os.environ.get("DIFFSIM_NO_VIDEO", "").strip().lower() not in ("1", "true", "yes"):
        try:
            from .evaluation import training_video

            files["video"] = training_video(task, result.policy, params, out, source)
        except Exception as exc:  # noqa: BLE001 - the checkpoint is written; the video is a courtesy
            import sys

            print(f"warning: no rollout video of the final policy: {type(exc).__name__}: {exc}", file=sys.stderr)
    return task, result, files


def occupied(out: Union[str, os.PathLike]) -> Optional[str]:
    """Return what an earlier run left in ``out`` that a new run would overwrite.

    "policy" (a trained policy, policy.pt), "unfinished" (a run's checkpoints/latest without a
    final policy), or None.
    """
    out = Path(out)
    if (out / "policy.pt").is_file():
        return "policy"
    if (out / "checkpoints" / "latest").is_dir():
        return "unfinished"
    return None


def resume_source(out: Union[str, os.PathLike]) -> Tuple[Dict[str, Any], str, int]:
    """(parameters, training file, iterations done) of the run in ``out``.

    They come from its resume state (``out/checkpoints/latest/resume.pt``): the parameters as the
    run trained with them; a ResumeError when there is none.
    """
    from ..learning.apg import load_resume_state
    from ..learning.run import ResumeError

    state = load_resume_state(out)
    if state["finished"]:
        raise ResumeError(f"{state['path']}: the run already finished (iteration {int(state['iteration'])}); "
                          f"nothing to resume")
    info = state.get("run_info") or {}
    if not isinstance(info.get("config"), dict) or not isinstance(info.get("config_file"), str):
        raise ResumeError(f"{state['path']}: the resume state does not record its configuration; pass --config "
                          f"with the training file the run started with")
    return copy.deepcopy(info["config"]), info["config_file"], int(state["iteration"])


def _differences(then: Any, now: Any, where: str = "") -> List[str]:
    """Dotted names of the entries that differ between two parameter mappings."""
    if isinstance(then, dict) and isinstance(now, dict):
        out: List[str] = []
        for k in list(then) + [k for k in now if k not in then]:
            name = f"{where}.{k}" if where else str(k)
            if k not in then or k not in now:
                out.append(name)
            else:
                out += _differences(then[k], now[k], name)
        return out
    return [] if then == now else [where or "(all)"]


def _summarise(names: List[str], per_section: int = 3) -> str:
    """Summarise the differing entries, at most ``per_section`` named per top-level section.

    Its ``type`` comes first: another task says more than its weights.
    """
    sections: Dict[str, List[str]] = {}
    for n in names:
        sections.setdefault(n.split(".")[0], []).append(n)
    parts = []
    for top, entries in sections.items():
        entries.sort(key=lambda n: n.rsplit(".", 1)[-1] != "type")
        more = len(entries) - per_section
        parts.append(", ".join(entries[:per_section]) + (f" (and {more} more in {top})" if more > 0 else ""))
    return ", ".join(parts)


def check_same_run(state: Dict[str, Any], run_info: Dict[str, Any]) -> None:
    """Check that ``run_info`` (the configuration given now) is the one the run in ``state`` started with.

    A ResumeError names what differs when it is not: another parameter, or a URDF whose content
    changed.
    """
    from ..learning.run import ResumeError
    from ..learning.checkpoint import json_safe

    where = state["path"]
    then = state.get("run_info") or {}
    if "config" not in then:
        raise ResumeError(f"{where}: the resume state does not record its configuration")
    diff = _differences(json_safe(then["config"]), json_safe(run_info["config"]))
    if diff:
        shown = _summarise(diff)
        raise ResumeError(f"{where}: the run was started with another configuration ({then.get('config_file')}): "
                          f"{shown} differ; resume with the same training file and options, or train afresh "
                          f"into another folder")
    if then.get("urdf_sha256") != run_info["urdf_sha256"]:
        raise ResumeError(f"{where}: the robot's URDF changed since the run started (sha256 "
                          f"{str(then.get('urdf_sha256'))[:12]}... then, {str(run_info['urdf_sha256'])[:12]}... now)")


def last_eval(history, key: str = "eval_success") -> Optional[float]:
    """Return the last finite value of ``key`` in a training history."""
    vals = [h.get(key) for h in history]
    vals = [v for v in vals if isinstance(v, (int, float)) and not math.isnan(v)]
    return float(vals[-1]) if vals else None


def print_summary(kind: str, task, model, result, out_dir, files, wall: float) -> None:
    """Print what a training run did, as `diffsim-ros train` and `baseline` print it at the end."""
    history = list(result.history or [])
    last = history[-1] if history else {}
    ev = last_eval(history)
    print(f"{kind}: task {task.name} on robot {model.name} ({task.obs_dim} observations, "
          f"{task.action_dim} actions, horizon {task.horizon} x {task.dt:g} s)")
    if "iteration" in last:
        print(f"iterations      {int(last['iteration'])}")
    print(f"env steps       {int(last.get('env_steps', 0)):,}")
    print(f"final success   {'n/a' if ev is None else f'{ev:.3f}'} (evaluation on fresh episodes; "
          f"threshold {task.success_threshold:g})")
    at_limit, over = last_eval(history, "eval_at_limit"), last_eval(history, "eval_over_speed")
    if at_limit is not None or over is not None:
        fmt = lambda x: "n/a" if x is None else f"{x:.3f}"  # noqa: E731
        print(f"joint limits    {fmt(at_limit)} of those episodes put a joint at its URDF position limit, "
              f"{fmt(over)} drove one past its URDF velocity limit")
    if result.solved_env_steps is not None:
        print(f"solved after    {result.solved_env_steps:,} env steps, "
              f"{result.solved_time:.1f} s")
    else:
        print("solved after    not solved")
    print(f"time            {wall:.1f} s")
    print(f"files in {out_dir}:")
    for f in files:
        print(f"  {f}")


def written_files(out_dir, before: set) -> List[str]:
    """Return the files of ``out_dir`` a run wrote, and its checkpoint folders.

    The files are those not in ``before``, and its policy and log files.
    """
    names = sorted(n for n in os.listdir(out_dir) if os.path.isfile(os.path.join(out_dir, n))
                   and (n not in before or n in ("policy.pt", "policy.json", "training.csv",
                                                  "learning_curve.png")))
    names += [f"checkpoints/{k}/" for k in ("latest", "best") if os.path.isdir(os.path.join(out_dir, "checkpoints", k))]
    return names
