"""The ground's friction calibrated from a walker's bag on the MuJoCo stand-in (issue 39 item 6).

    python bench/friction_calibration.py [--checkpoint policies/locomotion_velocity]
        [--config config/locomotion_velocity.yaml] [--seed 39] [--speed 0.8] [--steps 1000] [--out DIR]

From ``--seed``: the stand-in's floor (``ground_friction_scale`` uniform in 0.4-0.6 of the
simulator's coefficient: a floor the nominal training's draw, 0.5-1.0, does not reach) and the
robot's mass (x0.9-1.1). The checkpoint's walker walks ``--steps`` control steps at ``--speed``
m/s on it (a fast command: the push-offs reach the friction cone and the feet slide), recorded
as a bag; ``diffsim-ros sysid BAG --params ground_friction --method contact-free --out DIR``
estimates the coefficient without the simulator's contact model (analysis/ground_friction.py)
and writes DIR/calibrated.yaml, the training file with that floor (and its per-episode draw
re-centred on it). Prints the truth, the estimate and its error, and the commands that retrain
on the calibrated file and compare both walkers on that stand-in:

    diffsim-ros train --config DIR/calibrated.yaml --out DIR/walker
    diffsim-ros eval CHECKPOINT --plant mujoco --episodes 64 --seed 99 --perturb ground_friction_scale=S,mass_scale=M
    diffsim-ros eval DIR/walker --plant mujoco --episodes 64 --seed 99 --perturb ground_friction_scale=S',mass_scale=M

(the stand-in's floor is the checkpoint's own coefficient times ground_friction_scale, so the same
floor under the calibrated walker is S' = truth / estimate).
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from diffsim_ros import cli, config
from diffsim_ros.learning.deploy import PolicyRunner
from diffsim_ros.testing.recordings import record_walker

REPO = Path(__file__).resolve().parents[1]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--checkpoint", default=str(REPO / "policies" / "locomotion_velocity"))
    ap.add_argument("--config", default=str(REPO / "config" / "locomotion_velocity.yaml"))
    ap.add_argument("--seed", type=int, default=39)
    ap.add_argument("--speed", type=float, default=0.8)
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--out", default="runs/friction_calibration")
    a = ap.parse_args()
    rng = np.random.default_rng(a.seed)
    pert = {"ground_friction_scale": float(rng.uniform(0.4, 0.6)), "mass_scale": float(rng.uniform(0.9, 1.1))}
    params = config.load_yaml(a.config)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    bag = out / "bag"
    if not bag.exists():
        record_walker(bag, PolicyRunner(a.checkpoint), params, pert, a.speed, a.steps)
    rc = cli.main(["sysid", str(bag), "--params", "ground_friction", "--method", "contact-free", "--out",
                   str(out / "sysid")])
    truth = float(params["simulator"]["friction"]) * pert["ground_friction_scale"]
    fitted = json.loads((out / "sysid" / "sysid.json").read_text())["friction"]
    stand_in = ",".join(f"{k}={v:.4f}" for k, v in pert.items())
    print(f"seed {a.seed}: stand-in {stand_in}; floor friction {truth:.4f}, estimated {fitted:.4f} "
          f"({100 * (fitted / truth - 1):+.2f} %), sysid exit {rc}")
    # The stand-in's floor is the checkpoint's own coefficient times ground_friction_scale: the same
    # floor under a checkpoint trained on the calibrated file is truth / estimate.
    same_floor = ",".join([f"ground_friction_scale={truth / fitted:.5f}", f"mass_scale={pert['mass_scale']:.4f}"])
    print(f"retrain:  diffsim-ros train --config {out / 'sysid' / 'calibrated.yaml'} --out {out / 'walker'}  (or "
          f"fine-tune: --init-from {a.checkpoint} with fewer iterations)")
    print(f"compare:  diffsim-ros eval {a.checkpoint} --plant mujoco --episodes 64 --seed 99 --perturb {stand_in}")
    print(f"          diffsim-ros eval {out / 'walker'} --plant mujoco --episodes 64 --seed 99 --perturb {same_floor}")
    return rc


if __name__ == "__main__":
    raise SystemExit(main())
