"""``diffsim-ros excite``: an identification motion on the MuJoCo stand-in, recorded for sysid.

The work: diffsim_ros.workflows.excite.
"""
from __future__ import annotations

import argparse

from .common import _command, _perturbation, _text, _workflow_call


def cmd_excite(args: argparse.Namespace) -> int:
    from diffsim_ros.analysis import AnalysisError
    from diffsim_ros.control.excitation import ExcitationError
    from diffsim_ros.workflows.excite import run_excite
    from diffsim_ros.workflows.loop import LoopError

    overrides = {"duration": args.duration, "amplitude": args.amplitude, "seed": args.seed, "signal": args.signal,
                 "steps": args.steps}
    pert = _perturbation(args.perturb) if args.perturb else {}
    summary = _workflow_call(run_excite, args.config, args.out, overrides, pert, domain=args.domain_id,
                             timeout=args.timeout, named=(ExcitationError,), errors=(LoopError, AnalysisError),
                             inputs=True, source=args.config)
    return 1 if summary["lost"] or summary["controller"].get("safe_commands") else 0


def _add_excite(sub) -> None:
    p = _command(sub, "excite", cmd_excite,
                 help="drive an identification motion on the MuJoCo stand-in and record a bag for sysid",
                 description="""Run policy_controller in excitation mode (multisine or chirp joint targets inside the
                 URDF limits for arms; attitude, thrust and rate steps around hover with a position hold for
                 multirotors; bounded by --amplitude, through the same safety supervisor and outputs as a policy)
                 against the mujoco_plant stand-in in lockstep, with trajectory_recorder, and write OUT/bag for
                 `diffsim-ros sysid`. The config's 'excitation:' section holds the other settings
                 (control/excitation.py). Exit status 0: recorded, every command in the bag and no safe command; 1: a
                 safe command or a lost message; 2: bad input.""")
    p.add_argument("--config", required=True, metavar="YAML",
                   help="the robot's training/robot file (urdf, floating_base, simulator; optional excitation:)")
    p.add_argument("--out", required=True, metavar="DIR", help="output folder (bag/, logs/, excite.json)")
    p.add_argument("--duration", type=float, default=None, metavar="S",
                   help="seconds of motion (default: the config's excitation.duration, else 12)")
    p.add_argument("--amplitude", type=float, default=None, metavar="A",
                   help="fraction (0, 1] of the bounds: arms the safe joint range, multirotors the tilt/thrust/rate "
                        "steps (default 0.5)")
    p.add_argument("--seed", type=int, default=None, metavar="N", help="seed of the signal (default 0)")
    p.add_argument("--signal", choices=("multisine", "chirp"), default=None,
                   help="arms: the signal (default multisine)")
    p.add_argument("--steps", default=None, metavar="KIND,...",
                   help="multirotors: step kinds among attitude,thrust,rate (default all); none: a hover")
    p.add_argument("--perturb", default=None, metavar="KEY=VALUE,...",
                   help=_text("""stand-in perturbation (mass_scale, joint_damping_scale, drag_scale, actuator_lag,
                   latency, sensor_noise, ...; a preset: hardware, with the values of the robot's kind, see diffsim-ros
                   eval --help; default none)"""))
    p.add_argument("--domain-id", type=int, default=None, help="ROS_DOMAIN_ID (default: a random one, isolated)")
    p.add_argument("--timeout", type=float, default=600.0, metavar="S", help="wall-clock limit (default 600)")
