"""``diffsim-ros export CHECKPOINT --onnx``: policy.onnx beside policy.pt, checked against it.

The export is diffsim_ros/learning/onnx_export.py's; this module reads the arguments and prints.
"""
from __future__ import annotations

import argparse
import json
import os

from .common import CliError, _command, _workflow_call


def cmd_export(args: argparse.Namespace) -> int:
    if not args.onnx:
        raise CliError("choose what to export: --onnx (policy.onnx beside policy.pt)")
    if args.episodes < 0:
        raise CliError(f"--episodes must be at least 0, got {args.episodes}")
    if not os.path.isdir(args.checkpoint):
        raise CliError(f"{args.checkpoint}: no such checkpoint folder")
    from diffsim_ros.learning.checkpoint import CheckpointError
    from diffsim_ros.learning.onnx_export import export_onnx

    rep = _workflow_call(export_onnx, args.checkpoint, episodes=args.episodes, seed=args.seed,
                         errors=(CheckpointError, OSError, ValueError, KeyError))
    print(f"wrote {rep['path']} (opset {rep['opset']}; input 'observation' float32 (B, obs_dim), output 'action')")
    print(f"onnxruntime against TorchScript on {rep['observations']} observations: largest |action difference| "
          + ", ".join(f"{k} {v:.2e}" for k, v in rep["max_abs_diff"].items()) + f" (tolerance {rep['tolerance']:g})")
    print(f"run it without torch: python -m diffsim_ros.onboard {args.checkpoint}")
    if args.json:
        print(json.dumps(rep))
    return 0


def _add_export(sub) -> None:
    p = _command(sub, "export", cmd_export,
                 help="export a checkpoint's policy for other runtimes (ONNX), checked against it",
                 description="""Write policy.onnx beside a checkpoint's policy.pt (the observation normaliser inside,
                 policy.json unchanged and embedded), after onnxruntime computed the same actions as TorchScript on
                 drawn observations and on the observations of simulator episodes of the checkpoint's task. Exit 2
                 when it does not.""")
    p.add_argument("checkpoint", help="checkpoint folder (policy.pt, policy.json)")
    p.add_argument("--onnx", action="store_true", help="write policy.onnx (ONNX opset 17)")
    p.add_argument("--episodes", type=int, default=8, help="simulator episodes whose observations are compared "
                                                           "(default: 8; 0: drawn observations only)")
    p.add_argument("--seed", type=int, default=0, help="seed of the drawn observations and episodes (default: 0)")
    p.add_argument("--json", action="store_true", help="also print the report as one JSON line")
