"""The ground calibrated from a walker's bag on the MuJoCo stand-in, and what it gives a walker (issue 39 item 6).

    python bench/ground_calibration.py [--kind friction|contact] [--seed 39] [--checkpoint DIR]
        [--config YAML] [--speed S] [--steps N] [--out DIR] [--compare] [--iterations 30]
        [--learning-rate LR] [--episodes 64] [--eval-seeds 11,99] [--write-rejected]

``--kind friction`` (default): from ``--seed`` the stand-in's floor (``ground_friction_scale``
uniform in 0.4-0.6 of the simulator's coefficient: a floor the nominal training's draw, 0.5-1.0,
does not reach) and the robot's mass (x0.9-1.1); the checkpoint's walker walks ``--steps``
control steps at ``--speed`` m/s on it (default 1000 at 0.8: the push-offs reach the friction
cone and the feet slide), recorded as a bag; ``diffsim-ros sysid BAG --params ground_friction
--method contact-free`` estimates the coefficient without the simulator's contact model
(analysis/ground_friction.py).

``--kind contact``: from ``--seed`` the stand-in's contact time constant (uniform in 0.05-0.065 s:
floors softer than the stand-in's default 0.02 s, where the shipped walker loses episodes); the
walker walks (default 250 steps at 0.5 m/s) with the training file on the soft contact
(``simulator.contact_model: soft``, its time constant drawn per episode in 0.018-0.022 s instead
of the penalty law's stiffness and damping), and ``diffsim-ros sysid BAG --params
contact_time_constant`` fits the time constant through the simulator.

Either way sysid writes DIR/sysid/calibrated.yaml, the training file with the fitted value and its
per-episode draw re-centred on it. Printed: the truth, the estimate and its error, and the commands
that fine-tune the walker on the nominal and on the calibrated file (the same iterations and step
size) and compare both on that stand-in. ``--compare`` runs them (a fine-tune whose folder holds a
policy already is not run again; a fit sysid rejects stops it, unless
``--write-rejected``: sysid writes its calibrated.yaml all the same) and prints, per evaluation seed,
the successes of both on ``--episodes`` stand-in episodes; last line
``ground_calibration: KIND nominal A/N, calibrated B/N``. Nothing here is a test: no figure is
asserted. For friction the stand-in's floor is the checkpoint's own coefficient times
ground_friction_scale, so the same floor under the calibrated walker is truth / estimate; the
contact time constant is absolute, the same value for both.
"""
from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

import numpy as np

from diffsim_ros import cli, config
from diffsim_ros.learning.deploy import PolicyRunner
from diffsim_ros.testing.recordings import record_walker
from diffsim_ros.workflows.evaluation import evaluate_on_standin

REPO = Path(__file__).resolve().parents[1]


def _friction(seed: int, params: dict, bag: Path, out: Path, a) -> tuple:
    """Draw the floor, record, estimate; return truth, estimate, each walker's perturbation, sysid's exit."""
    rng = np.random.default_rng(seed)
    pert = {"ground_friction_scale": float(rng.uniform(0.4, 0.6)), "mass_scale": float(rng.uniform(0.9, 1.1))}
    if not bag.exists():
        record_walker(bag, PolicyRunner(a.checkpoint), params, pert, a.speed or 0.8, a.steps or 1000)
    rc = cli.main(["sysid", str(bag), "--params", "ground_friction", "--method", "contact-free", "--out", str(out)]
                  + (["--write-rejected"] if a.write_rejected else []))
    truth = float(params["simulator"]["friction"]) * pert["ground_friction_scale"]
    fitted = json.loads((out / "sysid.json").read_text())["friction"]
    same = dict(pert, ground_friction_scale=truth / fitted)
    return truth, fitted, pert, same, rc


def soft_params(params: dict) -> dict:
    """Return the training file on the soft contact, a time constant drawn instead of a stiffness and a damping."""
    p = dict(params, simulator=dict(params["simulator"], contact_model="soft"), training=dict(params["training"]))
    for key in ("randomize_contact_stiffness", "randomize_contact_damping"):
        p["training"].pop(key, None)
    p["training"]["randomize_contact_time_constant"] = [0.018, 0.022]
    return p


def _contact(seed: int, params: dict, bag: Path, out: Path, a) -> tuple:
    """Draw the contact time constant, record on the soft contact, fit; as :func:`_friction`."""
    pert = {"contact_time_constant": float(np.random.default_rng(seed).uniform(0.05, 0.065))}
    soft = soft_params(params)
    if not bag.exists():
        record_walker(bag, PolicyRunner(a.checkpoint), soft, pert, a.speed or 0.5, a.steps or 250)
    rc = cli.main(["sysid", str(bag), "--params", "contact_time_constant", "--window", "3", "--max-starts", "48",
                   "--max-iter", "15", "--out", str(out)] + (["--write-rejected"] if a.write_rejected else []))
    fitted = float(json.loads((out / "sysid.json").read_text())["fitted"]["contact_time_constant"][0])
    return pert["contact_time_constant"], fitted, pert, pert, rc


def _perturb(pert: dict) -> str:
    return ",".join(f"{k}={v:.5g}" for k, v in pert.items())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kind", choices=["friction", "contact"], default="friction")
    ap.add_argument("--checkpoint", default=str(REPO / "policies" / "locomotion_velocity"))
    ap.add_argument("--config", default=str(REPO / "config" / "locomotion_velocity.yaml"))
    ap.add_argument("--seed", type=int, default=39)
    ap.add_argument("--speed", type=float, default=None, help="m/s (default: friction 0.8, contact 0.5)")
    ap.add_argument("--steps", type=int, default=None, help="control steps (default: friction 1000, contact 250)")
    ap.add_argument("--out", default=None, help="default runs/ground_calibration/KIND_SEED")
    ap.add_argument("--compare", action="store_true", help="fine-tune both walkers and judge them on the stand-in")
    ap.add_argument("--iterations", type=int, default=30)
    ap.add_argument("--learning-rate", default=None,
                    help="the fine-tunes' constant step size (default: the file's learning_rate and schedule)")
    ap.add_argument("--episodes", type=int, default=64)
    ap.add_argument("--eval-seeds", default="11,99")
    ap.add_argument("--write-rejected", action="store_true",
                    help="sysid writes calibrated.yaml for a rejected fit too, and --compare goes on with it")
    a = ap.parse_args()
    params = config.load_yaml(a.config)
    out = Path(a.out or f"runs/ground_calibration/{a.kind}_{a.seed}")
    out.mkdir(parents=True, exist_ok=True)
    truth, fitted, pert, same, rc = (_friction if a.kind == "friction" else _contact)(
        a.seed, params, out / "bag", out / "sysid", a)
    print(f"seed {a.seed}: stand-in {_perturb(pert)}; {a.kind} {truth:.4g}, estimated {fitted:.4g} "
          f"({100 * (fitted / truth - 1):+.2f} %), sysid exit {rc}", flush=True)
    calibrated = out / "sysid" / "calibrated.yaml"
    runs = {"nominal": (a.config, pert), "calibrated": (str(calibrated), same)}
    tune = ["--init-from", a.checkpoint, "--iterations", str(a.iterations), "--keep-training", "--no-progress"]
    tune += ["--learning-rate", a.learning_rate] if a.learning_rate else []
    for name, (cfg, p) in runs.items():
        print(f"fine-tune: diffsim-ros train --config {cfg} --out {out / name} {' '.join(tune)}")
        print(f"judge:     diffsim-ros eval {out / name} --plant mujoco --episodes {a.episodes} --seed S "
              f"--perturb {_perturb(p)}")
    if not a.compare or not (rc == 0 or (rc == 3 and a.write_rejected)):
        return rc
    wins = {}
    for name, (cfg, p) in runs.items():
        if not (out / name / "policy.pt").exists():
            code = cli.main(["train", "--config", cfg, "--out", str(out / name), "--force"] + tune)
            if code != 0:
                return code
        for s in re.split(r"[,\s]+", a.eval_seeds.strip()):
            rep = evaluate_on_standin(out / name, episodes=a.episodes, seed=int(s), perturbation=p, simulator=False)
            wins.setdefault(name, []).append(int(rep["successes"]))
            print(f"{name} walker, stand-in seed {s}: {rep['successes']}/{a.episodes}, failed {rep['failed']}",
                  flush=True)
    total = a.episodes * len(wins["nominal"])
    print(f"ground_calibration: {a.kind} nominal {sum(wins['nominal'])}/{total}, "
          f"calibrated {sum(wins['calibrated'])}/{total}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
