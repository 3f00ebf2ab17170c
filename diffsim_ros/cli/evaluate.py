"""``diffsim-ros eval CHECKPOINT``: success on fresh episodes with its confidence interval, and more.

Also the failure modes, a video, or the same episodes on the MuJoCo stand-in (the work:
diffsim_ros.workflows.evaluation).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Tuple

from diffsim_ros.workflows.evaluation import (DEFAULT_EPISODES, DEFAULT_SEED, DEFAULT_VIDEO_EPISODES, PERTURB_HELP,
                                              RENDERER_CHOICES, EvalError, evaluate_checkpoint, evaluate_on_standin,
                                              format_report, format_standin_report)

from .common import CliError, _command, _device, _perturbation, _positive, _text, _workflow_call


def _size(text: str) -> Tuple[int, int]:
    try:
        w, h = (int(x) for x in text.lower().split("x"))
    except ValueError:
        raise CliError(f"--size takes WIDTHxHEIGHT in pixels (e.g. 320x240), got {text!r}") from None
    if w < 16 or h < 16 or w > 4096 or h > 4096 or w % 2 or h % 2:
        raise CliError(f"--size {text}: width and height must be even numbers of pixels in 16..4096")
    return w, h


def cmd_eval(args: argparse.Namespace) -> int:
    """``diffsim-ros eval``: see :func:`_add_eval`."""
    _positive("--episodes", args.episodes)
    _positive("--threads", args.threads)
    _positive("--video-episodes", args.video_episodes)
    if not args.fps > 0:
        raise CliError(f"--fps must be positive, got {args.fps}")
    width, height = _size(args.size)
    if not os.path.exists(args.checkpoint):
        raise CliError(f"{args.checkpoint}: no such checkpoint (give a folder written by diffsim-ros train, "
                       "or its policy.pt / policy.json)")
    from diffsim_ros.analysis.video import VideoError

    if args.video is not None:
        try:
            from diffsim_ros.analysis.video import check_video_path
            check_video_path(args.video)
        except VideoError as exc:
            raise CliError(f"--video {exc}") from None
    import torch

    torch.set_num_threads(args.threads)
    device = _device(args.device)
    errors = (EvalError, VideoError)
    if args.plant == "mujoco":
        if args.video is not None or str(device) != "cpu":
            raise CliError("--plant mujoco runs on the CPU and draws no video (leave out --video and --device)")
        pert = _perturbation(args.perturb or "")
        rep = _workflow_call(evaluate_on_standin, args.checkpoint, args.episodes, args.seed, pert, errors=errors,
                             inputs=True, source=args.checkpoint)
        print(format_standin_report(rep))
        if args.json:
            Path(args.json).parent.mkdir(parents=True, exist_ok=True)
            Path(args.json).write_text(json.dumps(rep, indent=2, default=str) + "\n")
            print(f"json            {args.json}")
        return 0
    if args.perturb:
        raise CliError("--perturb perturbs the MuJoCo stand-in: use it with --plant mujoco")
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        report = _workflow_call(evaluate_checkpoint, args.checkpoint, args.episodes, args.seed, str(device),
                                args.video, args.video_episodes, args.renderer, width, height, args.fps,
                                args.limit_margin, args.crash_height, errors=errors, inputs=True,
                                source=args.checkpoint)
    seen = set()
    for w in caught:
        if issubclass(w.category, UserWarning) and str(w.message) not in seen:
            seen.add(str(w.message))
            print(f"warning: {w.message}", file=sys.stderr)
    print(format_report(report))
    if args.json:
        from diffsim_ros.learning.checkpoint import json_safe

        try:
            Path(args.json).parent.mkdir(parents=True, exist_ok=True)
            Path(args.json).write_text(json.dumps(json_safe(report.to_dict()), indent=2) + "\n")
        except OSError as exc:
            raise CliError(f"--json {args.json}: {exc.strerror or exc}") from None
        print(f"json            {args.json}")
    sys.stdout.flush()
    return 0


def _add_eval(sub) -> None:
    p = _command(sub, "eval", cmd_eval,
                 help="evaluate a checkpoint: success with a confidence interval, failure modes, a video",
                 description="""Rebuild the robot, simulator and task from a checkpoint written by diffsim-ros
                 train, run the policy on fresh episodes, and print the task's own success rate with its 95 % Wilson
                 interval and how many episodes put a joint at its URDF position limit, over its URDF velocity
                 limit, fell (floating base) or went non-finite. --video draws a few of the episodes (MuJoCo's
                 offscreen renderer where EGL or OSMesa works, else matplotlib). --plant mujoco runs the same
                 episodes on the MuJoCo stand-in as well (--perturb hardware: with a robot's usual imperfections)
                 and prints both success rates and their ratio.""")
    p.add_argument("checkpoint", metavar="CHECKPOINT", help="checkpoint folder (or its policy.pt / policy.json)")
    p.add_argument("--episodes", type=int, default=DEFAULT_EPISODES, metavar="N",
                   help=f"fresh episodes (default {DEFAULT_EPISODES})")
    p.add_argument("--seed", type=int, default=DEFAULT_SEED,
                   help=f"seed of the episodes' reset draws (default {DEFAULT_SEED}; the trainer's own evaluation "
                        "uses 12345)")
    p.add_argument("--device", default="cpu", help="torch device of the simulation (default cpu; e.g. cuda)")
    p.add_argument("--threads", type=int, default=1, metavar="N", help="torch intra-op threads (default 1)")
    p.add_argument("--json", default=None, metavar="FILE", help="also write the report as JSON")
    p.add_argument("--video", default=None, metavar="FILE", help="write a video of the first episodes: .gif or .mp4")
    p.add_argument("--video-episodes", type=int, default=DEFAULT_VIDEO_EPISODES, metavar="N",
                   help=f"episodes in the video (default {DEFAULT_VIDEO_EPISODES})")
    p.add_argument("--renderer", choices=RENDERER_CHOICES, default="auto",
                   help="auto (MuJoCo where OpenGL works, else matplotlib), mujoco or matplotlib (default auto)")
    p.add_argument("--size", default="320x240", metavar="WxH", help="video frame size in pixels (default 320x240)")
    p.add_argument("--fps", type=float, default=25.0,
                   help="frames per second of simulated time (default 25; played in real time)")
    p.add_argument("--limit-margin", type=float, default=0.01, metavar="RAD",
                   help="distance to a URDF position limit counted as at the limit, rad or m (default 0.01)")
    p.add_argument("--crash-height", type=float, default=0.1, metavar="M",
                   help="quadrotor: base height above the ground counted as a crash, m (default 0.1)")
    p.add_argument("--plant", choices=("simulator", "mujoco"), default="simulator",
                   help=_text("""where the episodes run: the simulator the policy was trained in (default), or the
                   MuJoCo stand-in (another engine, no ROS; the task's verdict on each recorded episode: reach,
                   quadrotor tasks, the jump and velocity-command locomotion), printed beside the simulator's success
                   on the same episodes with the ratio stand-in / simulator"""))
    p.add_argument("--perturb", default=None, metavar="[PRESET,]KEY=VALUE,...",
                   help="with --plant mujoco: the stand-in's perturbation, " + PERTURB_HELP.replace("%", "%%"))
