#!/usr/bin/env python3
"""How often a training file's recipe trains to its task's threshold, over many seeds.

The success rate behind a slow training test, instead of one drawn seed per run.

    python bench/train_seeds.py --config config/jump.yaml --seeds 1-8 [--jobs 2]
        [--set training.num_envs=32 --set training.lr_schedule=cosine ...]

For each seed the gradient trainer runs the file's ``training:`` section (with the ``--set``
overrides, ``key=value`` read as YAML) with ``--eval-envs`` (32) and ``stop_at_success`` as the
tests use it; printed per seed: the iteration it first reached the threshold (or FAIL), the
evaluations along the way, the success of 64 fresh episodes the trainer never saw, and the
seconds. Each job runs on one torch thread. Nothing here is a test: no figure is asserted.
"""
from __future__ import annotations

import argparse
import copy
import multiprocessing as mp
import sys
import time
from pathlib import Path

import torch
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from diffsim_ros import config  # noqa: E402
from seed_list import seed_list  # noqa: E402


def _apply(params, sets):
    params = copy.deepcopy(params)
    for s in sets:
        key, _, value = s.partition("=")
        node = params
        *path, leaf = key.split(".")
        for k in path:
            node = node.setdefault(k, {})
        node[leaf] = yaml.safe_load(value)
    return params


def train_to_threshold(path, sets, seed: int, **training):
    """Train the file's recipe (with the ``--set`` overrides and ``training``) until its threshold.

    ``stop_at_success`` is on and ``training.seed`` is ``seed``. Returns (task, the training
    result, the evaluations as (iteration, success), the first iteration at the threshold or None,
    seconds of training).
    """
    from diffsim_ros.learning import TrainConfig, train

    params = _apply(config.load_yaml(path), sets)
    task, _ = config.build_task(params, str(path))
    cfg = TrainConfig.from_mapping(dict(params["training"], stop_at_success=True, seed=seed, **training), "training")
    t0 = time.perf_counter()
    res = train(task, cfg, progress=False)
    secs = time.perf_counter() - t0
    evals = [(int(r["iteration"]), round(float(r["eval_success"]), 3)) for r in res.history
             if r["eval_success"] == r["eval_success"]]
    solved = next((it for it, s in evals if s >= task.success_threshold), None)
    return task, res, evals, solved, secs


def run_one(args):
    path, sets, seed, eval_envs = args
    torch.set_num_threads(1)
    task, res, evals, solved, secs = train_to_threshold(path, sets, seed, eval_envs=eval_envs)
    fresh = task.rollout_success(res.policy, 64, torch.Generator().manual_seed(99))
    return seed, solved, evals, fresh, secs, float(res.history[-1]["loss"])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", required=True)
    ap.add_argument("--seeds", default="1-8")
    ap.add_argument("--jobs", type=int, default=1)
    ap.add_argument("--eval-envs", type=int, default=32, help="episodes per evaluation (the tests' 32)")
    ap.add_argument("--set", action="append", default=[], help="key=value override, e.g. training.num_envs=32")
    a = ap.parse_args(argv)
    seeds = seed_list(a.seeds)
    print(f"{a.config} {' '.join(a.set)}: {len(seeds)} seeds, {a.jobs} jobs", flush=True)
    jobs = [(a.config, a.set, s, a.eval_envs) for s in seeds]
    n_ok = 0
    with mp.get_context("spawn").Pool(a.jobs) as pool:
        for seed, solved, evals, fresh, secs, loss in pool.imap_unordered(run_one, jobs):
            n_ok += solved is not None
            tag = f"solved at iteration {solved}" if solved is not None else "FAIL"
            print(f"seed {seed}: {tag}; fresh success {fresh:.3f}; last loss {loss:.4f}; {secs:.0f} s; "
                  f"evaluations {evals}", flush=True)
    print(f"{n_ok} of {len(seeds)} seeds solved", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
