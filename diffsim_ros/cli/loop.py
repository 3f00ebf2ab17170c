"""``diffsim-ros loop``: the whole loop in one command (diffsim_ros.workflows.loop).

The loop trains, deploys on the MuJoCo stand-in over ROS 2, records and analyses.
"""
from __future__ import annotations

import argparse
import os
import time

from diffsim_ros.workflows.evaluation import PERTURB_HELP

from .common import CliError, _command, _perturbation, _positive, _workflow_call


def cmd_loop(args: argparse.Namespace) -> int:
    _positive("--threads", args.threads)
    if not args.duration > 0:
        raise CliError(f"--duration must be positive, got {args.duration}")
    from diffsim_ros.workflows.loop import DEFAULT_PERTURBATION, LoopError, run_loop
    from diffsim_ros.analysis import AnalysisError

    pert = dict(DEFAULT_PERTURBATION) if args.perturb is None else _perturbation(args.perturb)
    if args.config is None and args.checkpoint is None:
        from diffsim_ros.config import package_share

        share = package_share()
        if share is None or not (share / "config" / "hover.yaml").is_file():
            raise CliError("no --config given and the package's config/hover.yaml was not found")
        args.config = str(share / "config" / "hover.yaml")
    out = args.out or os.path.join("runs", "loop_" + time.strftime("%Y%m%d_%H%M%S", time.gmtime()))
    targets = None
    if args.target:
        try:
            targets = [[float(x) for x in t.split(",")] for t in args.target]
        except ValueError:
            raise CliError(f"--target takes X,Y,Z in m, got {args.target}") from None
    summary = _workflow_call(run_loop, args.config, out, checkpoint=args.checkpoint, duration=args.duration,
                             perturbation=pert, threads=args.threads, iterations=args.iterations,
                             domain=args.domain_id, targets=targets, n_targets=args.targets,
                             errors=(LoopError, AnalysisError), inputs=True, source=args.config)
    ok = summary.get("task", {}).get("success", True) and not summary.get("lost")
    return 0 if ok else 1


def _add_loop(sub) -> None:
    p = _command(sub, "loop", cmd_loop, help="train, deploy on the MuJoCo stand-in over ROS 2, record a bag, compare",
                 description="""The whole loop on the embedded default robot: train a policy by gradients through
                 the simulator, run it with policy_controller on the mujoco_plant stand-in (separate processes over
                 DDS, lockstep), record everything with trajectory_recorder, then print the sim-vs-real analysis of
                 the bag. Exit status 1 when the task fails on the stand-in or a message is missing from the
                 bag.""")
    p.add_argument("--config", default=None,
                   help="training YAML (default: with --checkpoint, the robot, simulator and task the checkpoint "
                        "was trained with; else the package's config/hover.yaml, quadrotor hover)")
    p.add_argument("--out", default=None, help="output folder (default: runs/loop_<UTC time>)")
    p.add_argument("--checkpoint", default=None, help="deploy this checkpoint instead of training one")
    p.add_argument("--iterations", type=int, default=None, help="override training.iterations")
    p.add_argument("--duration", type=float, default=4.0,
                   help="simulated seconds on the stand-in (default 4); arms: per target")
    p.add_argument("--target", action="append", default=None, metavar="X,Y,Z",
                   help="arms: a goal point in m (world frame); repeat for several in sequence")
    p.add_argument("--targets", type=int, default=3,
                   help="arms without --target: this many goals drawn from the task's reset distribution (default 3)")
    p.add_argument("--perturb", default=None, metavar="[PRESET,]KEY=VALUE,...",
                   help="the stand-in's perturbation, " + PERTURB_HELP.replace("%", "%%")
                        + "; default: the preset 'default'; '' for none")
    p.add_argument("--domain-id", type=int, default=None, help="ROS_DOMAIN_ID (default: a random one, isolated)")
    p.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
