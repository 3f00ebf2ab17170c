#!/usr/bin/env python3
"""How well the MuJoCo stand-in and the simulator agree, with the URDF's joint friction on.

The stand-in's default (the simulator's smoothed Coulomb law, applied as the simulator does)
against MuJoCo's own ``frictionloss`` constraint (Perturbation ``constraint_friction``, the
stand-in's law before issue 16), in the same run.

    python bench/friction_agreement.py [--steps 300] [--seed 0] [--robots arm,ur5]

For each robot, an unperturbed stand-in recording under the exciting controller of the
analysis tests (testing/recordings.py: random position targets, the arm's standard recording
servo) is replayed by the nominal simulator from every recorded state: the RMSE of the
predicted joint velocities 1 and 5 control steps ahead, rad/s, and the ratio between the
laws. The project's arm (URDF friction 0.01-0.02 N m) and UR5 from example-robot-data
(friction set to 0.1 N m on every joint here: its URDF has none). Nothing is timed.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "test"))            # the tests' support modules (conftest, builders)
sys.path.insert(0, os.path.join(ROOT, "test", "plant"))

from diffsim_ros import analysis  # noqa: E402
from diffsim_ros.testing.recordings import exciter, make_plant, record_bag, standard_params  # noqa: E402
import test_friction_agreement as agreement  # noqa: E402  (the test's robots)


def ur5_params(friction: float = 0.1):
    """UR5 (example-robot-data) under the arm's standard recording set-up.

    ``friction`` N m on every joint (test/plant/test_friction_agreement.py's URDF copy and servo).
    """
    out = tempfile.mkdtemp(prefix="diffsim_ur5_")
    return agreement.robot_params("ur5", agreement.friction_urdf("ur5", friction, out))


def rmse(params, constraint: bool, steps: int, seed: int):
    with tempfile.TemporaryDirectory() as tmp:
        bag = os.path.join(tmp, "bag")
        record_bag(bag, make_plant(params, {"constraint_friction": constraint}), exciter(params, seed),
                   steps, params, predictions=False)
        m = analysis.analyze(bag, horizons=(1, 5), plots=False)
    by = m["prediction"]["by_horizon"]
    return by["1"]["rmse"], by["5"]["rmse"]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=300, help="control steps recorded per robot (default 300)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the exciting controller (default 0)")
    ap.add_argument("--robots", default="arm,ur5", help="comma-separated: arm, ur5 (default both)")
    args = ap.parse_args(argv)
    print(f"unperturbed stand-in vs nominal simulator, joint friction on, {args.steps} steps, seed {args.seed}")
    print("| robot | law in the stand-in | 1-step RMSE, rad/s | 5-step RMSE, rad/s |")
    print("|---|---|---|---|")
    ratios = []
    for robot in args.robots.split(","):
        params = standard_params("arm") if robot == "arm" else ur5_params()
        old = rmse(params, True, args.steps, args.seed)
        new = rmse(params, False, args.steps, args.seed)
        print(f"| {robot} | frictionloss constraint (before) | {old[0]:.2e} | {old[1]:.2e} |")
        print(f"| {robot} | smoothed law, as the simulator | {new[0]:.2e} | {new[1]:.2e} |")
        ratios.append((robot, old[1] / max(new[1], 1e-300)))
    for robot, r in ratios:
        print(f"{robot}: 5-step RMSE {r:.3g}x smaller with the simulator's law")
    return 0


if __name__ == "__main__":
    sys.exit(main())
