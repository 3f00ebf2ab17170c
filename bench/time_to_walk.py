#!/usr/bin/env python3
"""Wall-clock from fresh weights to a solo12 walker that passes the strict locomotion metric.

    python bench/time_to_walk.py [--seeds 10] [--threads 2] [--max-iterations 60] [--eval-every 2]
        [--config config/locomotion_velocity_solo12.yaml] [--set key=value ...]

For each seed the gradient trainer runs the file's recipe (the robot observation, the trot
reference, the physics drawn per episode, sensor noise, pushes, the compiled step: the shipped
walker's) from fresh weights, with ``training.seed`` the seed, and stops as soon as an evaluation
on 128 fresh episodes (``eval_envs``) passes the task's threshold (0.9) by the strict metric with
its gait rules (every foot steps, none slides). The clock runs from the start of training to that
evaluation: the compiled step's first compile is not in it when torch's compile cache already
holds the graphs (``~/.cache/diffsim_ros``; a first run compiles for 20 min); each run uses
``--threads`` torch threads (both cores of a 2-core machine by default). A walker that solved is
then judged once more on 128 episodes of another seed (99), which the trainer never saw. A seed
that does not solve within ``--max-iterations`` counts as not walking.

Per seed: the iteration it solved at, seconds, the evaluations along the way and the fresh
success. Last line: ``time_to_walk: solo12 K/N seeds, median S s, worst W s`` (the median and
worst over all seeds, a failed seed counting as its whole run). Nothing here is a test.
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from train_seeds import train_to_threshold  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
EVAL_ENVS = 128
CHECK_SEED = 99


def time_one(path: Path, sets, seed: int, max_iterations: int, eval_every: int):
    """Train one seed until the threshold; return (solved iteration or None, seconds, evaluations, fresh success)."""
    task, res, evals, solved, secs = train_to_threshold(path, sets, seed, eval_envs=EVAL_ENVS, eval_every=eval_every,
                                                        iterations=max_iterations)
    fresh = (float(task.rollout_success(res.policy, EVAL_ENVS, torch.Generator().manual_seed(CHECK_SEED)))
             if solved is not None else float("nan"))
    return solved, secs, evals, fresh


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", default=str(REPO / "config" / "locomotion_velocity_solo12.yaml"))
    ap.add_argument("--seeds", type=int, default=10, help="seeds 1..N")
    ap.add_argument("--threads", type=int, default=2, help="torch threads of the training")
    ap.add_argument("--max-iterations", type=int, default=60)
    ap.add_argument("--eval-every", type=int, default=2, help="iterations between evaluations of 128 episodes")
    ap.add_argument("--set", action="append", default=[], help="key=value override, e.g. training.num_envs=32")
    a = ap.parse_args(argv)
    torch.set_num_threads(a.threads)
    print(f"{a.config} {' '.join(a.set)}: seeds 1-{a.seeds}, {a.threads} threads, at most {a.max_iterations} "
          f"iterations, {EVAL_ENVS} fresh episodes every {a.eval_every}", flush=True)
    times, walked = [], 0
    for seed in range(1, a.seeds + 1):
        solved, secs, evals, fresh = time_one(Path(a.config), a.set, seed, a.max_iterations, a.eval_every)
        walked += solved is not None
        times.append(secs)
        tag = f"walks at iteration {solved}" if solved is not None else "FAIL"
        print(f"seed {seed}: {tag}; {secs:.0f} s; {EVAL_ENVS} episodes of seed {CHECK_SEED}: {fresh:.3f}; "
              f"evaluations {evals}", flush=True)
    print(f"time_to_walk: solo12 {walked}/{a.seeds} seeds, median {statistics.median(times):.0f} s, "
          f"worst {max(times):.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
