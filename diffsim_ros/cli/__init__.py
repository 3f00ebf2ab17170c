"""Command-line entry point: ``diffsim-ros COMMAND ...``.

Installed as the ``diffsim-ros`` console script (see setup.py) and runnable as
``python -m diffsim_ros.cli``. One module per command, argument handling only: each
registers its subparser (``_add_*``, with :func:`.common._command`) and hands the parsed options to
the library (the workflows, diffsim_ros.workflows, and the layers below; no library module imports
cli/), turning what it raises for bad input into ``CliError`` (:func:`.common._workflow_call`);
heavy imports (torch, the physics core) happen inside the command so that ``--help`` stays fast.
:mod:`.common` holds what they share (``CliError``: exit status 2).

Modules: :mod:`.demo`, :mod:`.train` (train, baseline, distill), :mod:`.bags` (analyze, sysid, bag
repair), :mod:`.loop`, :mod:`.excite`, :mod:`.evaluate` (eval), :mod:`.init`, :mod:`.export`,
:mod:`.preflight`.

Commands: ``demo`` (the dynamics core on a URDF), ``train`` (a policy by gradients
through the simulator, exported as a checkpoint), ``baseline`` (the PPO or SAC baseline),
``distill`` (a student on the robot's observation taught by a trained teacher),
``analyze`` (sim-vs-real velocity comparison of a bag), ``sysid`` (calibration on a bag),
``bag repair`` (rebuild the index of a bag whose recorder was killed), ``excite`` (an
identification motion on the MuJoCo stand-in, recorded for ``sysid``), ``export`` (policy.onnx
beside a checkpoint's policy.pt, :mod:`.export`), ``preflight`` (a robot's topics against a
checkpoint, GO or NO-GO, :mod:`.preflight`).

Exit codes: 0 success, 2 bad input (unreadable or invalid URDF, YAML, checkpoint or
bag, bad option).
"""
from __future__ import annotations

import argparse
import sys
from typing import Optional, Sequence

from .bags import _add_analyze, _add_bag, _add_sysid
from .common import DEFAULT_ROBOT, CliError, default_urdf
from .demo import _add_demo
from .evaluate import _add_eval
from .excite import _add_excite
from .export import _add_export
from .init import _add_init
from .preflight import _add_preflight
from .loop import _add_loop
from .train import _add_baseline, _add_distill, _add_train

__all__ = ["main", "build_parser", "CliError", "default_urdf", "DEFAULT_ROBOT"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="diffsim-ros",
        description="Differentiable rigid-body simulation for ROS 2 robots.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    _add_demo(sub)
    _add_train(sub)
    _add_baseline(sub)
    _add_distill(sub)
    _add_analyze(sub)
    _add_sysid(sub)
    _add_loop(sub)
    _add_excite(sub)                        # diffsim-ros excite: an identification motion, recorded
    _add_bag(sub)
    _add_eval(sub)                          # diffsim-ros eval
    _add_init(sub)                          # diffsim-ros init: a training file for a URDF
    _add_export(sub)
    _add_preflight(sub)
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except CliError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
