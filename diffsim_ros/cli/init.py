"""``diffsim-ros init``: a commented training file for a URDF and a task.

The work: diffsim_ros.workflows.init_config.
"""
from __future__ import annotations

import argparse
import os
import sys
import warnings
from pathlib import Path
from typing import List, Optional

from diffsim_ros.workflows.init_config import (DEFAULT_BANDWIDTH_HZ, DEFAULT_DAMPING_RATIO, TASK_CHOICES, InitError,
                                               controllers_path, plan, report, ros2_controllers, write)

from .common import CliError, _command


def _joint_list(text: Optional[str]) -> List[str]:
    return [s.strip() for s in (text or "").split(",") if s.strip()]


def cmd_init(args: argparse.Namespace) -> int:
    from diffsim_ros.physics import ConfigError, UrdfError

    try:
        p = plan(args.urdf, args.task, floating_base=args.floating_base, ee_link=args.ee_link,
                 include_joints=_joint_list(args.include_joints), bandwidth=args.bandwidth,
                 damping_ratio=args.damping_ratio)
        cpath = controllers_path(args.out)
        multirotor = "rotors" in p.params.get("simulator", {})
        if not multirotor and os.path.exists(cpath) and not args.force:
            raise InitError(f"{cpath}: the file exists; pass --force to overwrite it")
        write(p, args.out, args.force)
    except (InitError, UrdfError, ConfigError) as exc:
        raise CliError(str(exc)) from None
    except OSError as exc:
        raise CliError(f"--out {args.out}: {exc.strerror or exc}") from None
    for line in report(p):
        print(line)
    # The file must load as a training file; say so now rather than at train time.
    from diffsim_ros import config

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            _, task, _ = config.load_training_file(args.out)
    except (ConfigError, UrdfError) as exc:
        raise CliError(f"{args.out} was written but does not load: {exc}") from None
    controllers = ros2_controllers(p, list(task.sim.actuated_joints), args.out)
    if controllers is not None:
        from diffsim_ros.analysis.bagfile import write_atomically

        try:
            write_atomically(Path(cpath), controllers, fsync=False)
        except OSError as exc:
            raise CliError(f"{cpath}: {exc.strerror or exc}") from None
    print(f"wrote {args.out}; train it with: diffsim-ros train --config {args.out} --out runs/"
          f"{Path(args.out).stem}")
    if controllers is not None:
        print(f"wrote {cpath}: the ros2_control controllers for the robot (doc/hardware.md)")
    else:
        print("no ros2_controllers.yaml: a multirotor takes its commands through PX4 or its own driver "
              "(doc/hardware.md)")
    sys.stdout.flush()
    return 0


def _add_init(sub) -> None:
    p = _command(sub, "init", cmd_init, help="write a commented training file for a URDF and a task",
                 description="""Derive a training file (config/<task>.yaml layout) from a URDF: the actuated joints
                 (gripper and mimic joints left out, with the reason printed), PD gains from the mass matrix and the
                 effort limits, the end effector and target range (reach), the stance and base height from the
                 collision geometry (locomotion), a rotor layout template (multirotors). The file loads and trains as
                 written.""")
    p.add_argument("--urdf", required=True, metavar="PATH", help="URDF or xacro file (or package://...)")
    p.add_argument("--floating-base", action="store_true",
                   help="the root link gets a free-flyer joint (implied by hover, waypoint, velocity, locomotion)")
    p.add_argument("--task", required=True, metavar="TASK",
                   help=f"one of {', '.join(TASK_CHOICES)}")
    p.add_argument("--ee-link", default=None, metavar="LINK",
                   help="reach: the link brought to the target (default: the tip of the longest actuated chain)")
    p.add_argument("--include-joints", default=None, metavar="J1,J2",
                   help="actuate these joints too (e.g. a gripper's); mimic joints never are")
    p.add_argument("--bandwidth", type=float, default=DEFAULT_BANDWIDTH_HZ, metavar="HZ",
                   help=f"servo bandwidth the gains are derived for (default {DEFAULT_BANDWIDTH_HZ:g} Hz)")
    p.add_argument("--damping-ratio", type=float, default=DEFAULT_DAMPING_RATIO, metavar="ZETA",
                   help=f"servo damping ratio (default {DEFAULT_DAMPING_RATIO:g})")
    p.add_argument("--out", required=True, metavar="FILE", help="training file to write (.yaml)")
    p.add_argument("--force", action="store_true", help="overwrite --out if it exists")
