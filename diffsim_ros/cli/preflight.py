"""``diffsim-ros preflight CHECKPOINT``: GO or NO-GO for a checkpoint on a live robot's topics or a bag.

The checks: diffsim_ros/control/preflight.py; the gathering: diffsim_ros/workflows/preflight.py.
"""
from __future__ import annotations

import argparse
import os

from .. import interfaces as ifc
from .common import CliError, _command, _workflow_call


def cmd_preflight(args: argparse.Namespace) -> int:
    if args.seconds <= 0:
        raise CliError(f"--seconds must be > 0, got {args.seconds}")
    if args.bag is not None and not os.path.exists(args.bag):
        raise CliError(f"{args.bag}: no such bag")
    from diffsim_ros.analysis.errors import AnalysisError
    from diffsim_ros.learning.checkpoint import CheckpointError
    from diffsim_ros.workflows.preflight import run_preflight

    rep = _workflow_call(run_preflight, args.checkpoint, bag=args.bag, seconds=args.seconds,
                         joint_states_topic=args.joint_states_topic, imu_topic=args.imu_topic,
                         odom_topic=args.odom_topic, command_topic=args.command_topic, max_age_s=args.max_age,
                         errors=(CheckpointError, AnalysisError, OSError))
    print(rep.text())
    return 0 if rep.go else 1


def _add_preflight(sub) -> None:
    p = _command(sub, "preflight", cmd_preflight,
                 help="check a live robot's topics (or a bag) against a checkpoint: GO or NO-GO",
                 description="""Listen to the robot's state topics for a few seconds (or read a bag) and check them
                 against the checkpoint: joint names and order, joint limits, the state rate against the policy's
                 control rate, stamp age and jitter, frame ids, the IMU where the policy needs one, a subscriber on
                 the command topic. Prints each check and GO or NO-GO; exit 0 GO, 1 NO-GO, 2 bad input.""")
    p.add_argument("checkpoint", help="checkpoint folder (policy.pt, policy.json)")
    p.add_argument("--bag", help="judge this rosbag2 recording instead of the live topics")
    p.add_argument("--seconds", type=float, default=3.0, help="how long to listen (default: 3)")
    p.add_argument("--joint-states-topic", default=ifc.JOINT_STATES, help=f"(default: {ifc.JOINT_STATES})")
    p.add_argument("--imu-topic", default=ifc.IMU, help=f"(default: {ifc.IMU})")
    p.add_argument("--odom-topic", default=ifc.ODOM, help=f"(default: {ifc.ODOM})")
    p.add_argument("--command-topic", default=None,
                   help="where the commands go (default: policy_controller's for this checkpoint, e.g. "
                        "/position_controller/commands)")
    p.add_argument("--max-age", type=float, default=0.05, help="largest median stamp age, s (default: 0.05)")
