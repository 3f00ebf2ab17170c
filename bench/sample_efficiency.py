#!/usr/bin/env python3
"""Sample efficiency: gradients through the simulator against PPO and SAC, in the same run.

    python bench/sample_efficiency.py [--quick] [--tasks reach,hover,locomotion] [--methods gradient,ppo,sac]
                                      [--budget STEPS] [--config NAME=PATH] [--out results.json] [--curves DIR]
    python bench/sample_efficiency.py --merge a.json b.json ...   # one table from runs made separately

For each task, the gradient trainer (``learning.apg.train``) and the two
Stable-Baselines3 baselines, PPO (``learning.ppo.train_ppo``) and SAC
(``learning.sac.train_sac``), train on the same task instance (same simulator,
same reset distribution, same loss: the baselines' reward is minus the step
loss) until the policy reaches the task's success threshold
(``task.success_threshold`` of fresh evaluation episodes succeed, judged by
``learning.apg.evaluate``, the same metric for all) or the budget of
environment steps runs out. Printed per task and method: environment steps and
wall-clock time to success, the final success rate (on 256 fresh episodes, a
different seed from the one training stops on), and the ratios PPO / gradient,
SAC / gradient and better baseline / gradient.

Tasks and hyper-parameters come from the training files config/reach_arm.yaml
(the project's arm), config/hover.yaml (quadrotor hover), config/velocity.yaml and
config/waypoint.yaml (velocity tracking and waypoints, ``--tasks velocity,waypoint``),
config/locomotion.yaml (the quadruped, forward progress) and the velocity-command
walking of config/locomotion_velocity.yaml (the quadruped) and
config/locomotion_velocity_solo12.yaml (``--tasks locomotion_velocity,locomotion_velocity_solo12``):
their ``simulator``, ``task``, ``training`` (TrainConfig), ``ppo`` (PPOConfig) and ``sac``
(SACConfig) sections; the baselines' settings are documented there. Where a file is missing
the defaults written in this script (and SACConfig's) are used.

Budgets: each baseline runs up to ``--budget`` environment steps (default: the file's
``ppo.total_timesteps`` / ``sac.total_timesteps``, rounded up to whole iterations); the
gradient trainer runs up to its file's ``training.iterations`` (its learning-rate schedule
is laid over them), cut to ``--budget`` if that is smaller. All stop at success. The
baselines are evaluated every ``--eval-every`` steps (their figure is the first evaluation
that passes, an upper bound within that resolution), the gradient trainer every
``training.eval_every`` iterations. When a baseline does not reach the threshold within
its budget the table says ``> budget`` and its ratio is a lower bound: the budget over
the gradient trainer's steps (its wall time over the gradient trainer's time for the
clock). The better baseline, per measure, is the one with the smaller ratio among those
that reached the threshold (``<=`` where the other stopped, unsolved, at a smaller bound:
it might still have beaten it), or the smaller lower bound where neither did.

An environment step is one control step of one environment (summed over the
batch), for both methods. Wall-clock includes evaluation. One torch thread
(``torch.set_num_threads(1)``); nothing here is a test, no figure is asserted.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

import torch

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO_ROOT not in sys.path:
    sys.path.insert(0, REPO_ROOT)

from diffsim_ros import config  # noqa: E402
from diffsim_ros.learning import apg  # noqa: E402
from diffsim_ros.learning.ppo import PPOConfig, train_ppo  # noqa: E402
from diffsim_ros.learning.sac import SACConfig, train_sac  # noqa: E402

CONFIG_DIR = Path(REPO_ROOT) / "config"
FILES = {"reach": "reach_arm.yaml", "hover": "hover.yaml", "velocity": "velocity.yaml", "waypoint": "waypoint.yaml",
         "locomotion": "locomotion.yaml", "locomotion_velocity": "locomotion_velocity.yaml",
         "locomotion_velocity_solo12": "locomotion_velocity_solo12.yaml"}
FINAL_EPISODES = 256
FINAL_SEED = 2024
METHODS = ("gradient", "ppo", "sac")
#: The baselines: (the training file's section and its options, the trainer, steps per iteration).
BASELINES = {"ppo": (PPOConfig, train_ppo, lambda cfg, task: cfg.rollout_steps),
             "sac": (SACConfig, train_sac, lambda cfg, task: cfg.steps_per_iteration(task))}

# Used only where config/<file> is missing (same layout as the training files).
_QUAD_SIM = {"dt": 0.02, "substeps": 4, "ground": True, "actuator": "ctbr",
             "rotors": {"rotor_links": ["rotor_0", "rotor_1", "rotor_2", "rotor_3"], "directions": [-1, 1, -1, 1],
                        "thrust_coefficient": 8.0e-7, "torque_coefficient": 8.0e-9, "motor_time_constant": 0.02,
                        "max_rotor_speed": 2350.0, "drag_linear": [0.1, 0.1, 0.15],
                        "drag_quadratic": [0.02, 0.02, 0.04], "rate_gain": [20.0, 20.0, 8.0]}}
FALLBACK: Dict[str, Dict[str, Any]] = {
    "reach": {"urdf": "urdf/diffsim_arm.urdf", "floating_base": False, "dtype": "float32",
              "simulator": {"dt": 0.02, "substeps": 2, "actuator": "position", "kp": [60.0, 40.0, 20.0, 5.0],
                            "kd": [6.0, 4.0, 2.0, 0.5], "ground": False},
              "task": {"type": "reach", "ee_link": "ee_link", "horizon": 50},
              "training": {"num_envs": 64, "window": 10, "learning_rate": 3e-3},
              "ppo": {"num_envs": 64, "n_steps": 50, "batch_size": 800}},
    "hover": {"urdf": "urdf/diffsim_quadrotor.urdf", "floating_base": True, "dtype": "float32",
              "simulator": _QUAD_SIM,
              "task": {"type": "quadrotor", "mode": "hover", "horizon": 100, "settle_time": 1.5},
              "training": {"num_envs": 64, "window": 20, "learning_rate": 3e-3},
              "ppo": {"num_envs": 64, "n_steps": 100, "batch_size": 1600}},
    "locomotion": {"urdf": "urdf/diffsim_quadruped.urdf", "floating_base": True, "dtype": "float32",
                   "simulator": {"dt": 0.01, "substeps": 5, "ground": True, "actuator": "position", "kp": 20.0,
                                 "kd": 0.5, "actuated_joints": [f"{leg}_{j}_joint" for leg in ("FL", "FR", "HL", "HR")
                                                                for j in ("hip", "thigh", "knee")]},
                   "task": {"type": "locomotion", "stance": [0.0, 0.8, -1.6] * 4, "base_height": 0.2987,
                            "horizon": 100},
                   "training": {"num_envs": 64, "window": 20, "learning_rate": 1e-3, "hidden": [128, 128]},
                   "ppo": {"num_envs": 64, "n_steps": 100, "batch_size": 1600}},
}


def load_params(name: str, override: Optional[str] = None):
    if override is not None:         # --config NAME=PATH: another training file for this task
        return config.load_yaml(override), override
    path = CONFIG_DIR / FILES[name]
    if path.is_file():
        return config.load_yaml(path), str(path.relative_to(REPO_ROOT))
    if name not in FALLBACK:
        raise SystemExit(f"error: {path} is missing (the '{name}' task has no defaults in this script)")
    return FALLBACK[name], "defaults in bench/sample_efficiency.py"


def run_method(method: str, name: str, params: Dict[str, Any], source: str, budget: int, seed: int,
               baseline_eval_every: int, curves: Optional[Path], progress: bool) -> Dict[str, Any]:
    # Training files name their dtype; one without it runs in float32 (this script's default).
    task, _ = config.build_task(params, source, dtype=config.torch_dtype(params, source, default="float32"))
    if method == "gradient":
        cfg = apg.TrainConfig.from_mapping(dict(params.get("training") or {}))
        per_iteration = cfg.num_envs * task.horizon
        iters = cfg.iterations if budget is None else max(1, min(cfg.iterations, budget // per_iteration))
        cfg = dataclasses.replace(cfg, iterations=iters, stop_at_success=True, seed=seed)
        eval_every = f"{cfg.eval_every} it = {cfg.eval_every * per_iteration} steps"
        method_budget = iters * per_iteration
        train = apg.train
    else:
        config_class, train, iteration_steps = BASELINES[method]
        cfg = config_class.from_mapping(dict(params.get(method) or {}))
        if budget is not None:
            cfg = dataclasses.replace(cfg, total_timesteps=budget)
        cfg = dataclasses.replace(cfg, stop_at_success=True, seed=seed, eval_every_steps=baseline_eval_every)
        eval_every = f"{cfg.eval_every_steps} steps"
        # The baselines run whole iterations (PPO's rollouts, SAC's episodes): the budget rounded up to one.
        step = iteration_steps(cfg, task)
        method_budget = math.ceil(cfg.total_timesteps / step) * step
    out_dir = curves / f"{name}_{method}" if curves is not None else None
    t0 = time.perf_counter()
    res = train(task, cfg, out_dir=out_dir, progress=progress)
    wall = time.perf_counter() - t0
    final = apg.evaluate(task, res.policy, FINAL_EPISODES, seed=FINAL_SEED)
    last = res.history[-1] if res.history else {}
    return {"task": name, "task_name": task.name, "method": method, "config_source": source,
            "success_threshold": task.success_threshold, "horizon": task.horizon, "budget": method_budget,
            "solved_env_steps": res.solved_env_steps, "solved_time": res.solved_time,
            "final_success": final, "final_episodes": FINAL_EPISODES,
            "last_eval_success": next((h["eval_success"] for h in reversed(res.history)
                                       if not math.isnan(h["eval_success"])), None),
            "env_steps": int(last.get("env_steps", 0)), "wall_time": wall, "eval_every": eval_every,
            "config": json.loads(json.dumps(dataclasses.asdict(cfg)))}


def ratio(g: Dict[str, Any], p: Dict[str, Any]) -> Dict[str, Any]:
    """Baseline ``p`` / gradient ``g`` for steps and time.

    '>' (a lower bound) when the baseline did not reach success within its budget: its budget (and
    the wall time it spent) over the gradient trainer's; no ratio when the gradient trainer did not
    reach success.
    """
    if g["solved_env_steps"] is None:
        return {"steps_ratio": None, "time_ratio": None, "bound": "gradient trainer did not reach success"}
    if p["solved_env_steps"] is not None:
        return {"steps_ratio": p["solved_env_steps"] / g["solved_env_steps"],
                "time_ratio": p["solved_time"] / g["solved_time"], "bound": "="}
    return {"steps_ratio": p["env_steps"] / g["solved_env_steps"], "time_ratio": p["wall_time"] / g["solved_time"],
            "bound": ">"}


def better(ratios: Dict[str, Dict[str, Any]]) -> Dict[str, Any]:
    """Return the ratio against the better baseline, per measure (steps, time).

    It is the smallest among the baselines that reached the threshold, '<=' where another stopped
    unsolved at a smaller lower bound (it might still have beaten it), else '='; the smallest lower
    bound ('>') where none did.
    """
    out: Dict[str, Any] = {}
    for key in ("steps", "time"):
        solved = sorted((r[f"{key}_ratio"], m) for m, r in ratios.items() if r["bound"] == "=")
        bounds = sorted((r[f"{key}_ratio"], m) for m, r in ratios.items() if r["bound"] == ">")
        val = method = bound = None
        if solved:
            (val, method), bound = solved[0], "="
            if bounds and bounds[0][0] < val:
                bound = "<="
        elif bounds:
            (val, method), bound = bounds[0], ">"
        out.update({f"{key}_ratio": val, f"{key}_method": method, f"{key}_bound": bound})
    return out


def ratio_row(rows: Dict[str, Dict[str, Any]]) -> Dict[str, Any]:
    """Return a task's ratios.

    Each baseline's in ``rows`` (method -> result row) over the gradient trainer's, and the better
    baseline's.
    """
    g = rows["gradient"]
    each = {m: ratio(g, rows[m]) for m in BASELINES if m in rows}
    return {"task": g["task"], **each, "better": better(each) if g["solved_env_steps"] is not None else None}


def fmt_int(x) -> str:
    return "-" if x is None else f"{int(x):,}"


def fmt_f(x, spec=".1f") -> str:
    return "-" if x is None else format(x, spec)


def print_table(rows: List[Dict[str, Any]], ratios: List[Dict[str, Any]]) -> None:
    w = max([11] + [len(r["task"]) + 2 for r in rows])     # the task column fits the longest name
    head = (f"{'task':<{w}}{'method':<10}{'steps to success':>18}{'time to success':>17}"
            f"{'final success / threshold':>27}{'budget':>12}{'steps run':>12}{'time run':>10}")
    print()
    print(head)
    print("-" * len(head))
    for r in rows:
        fin = f"{r['final_success']:.2f} / {r['success_threshold']:.2f}"
        if r["solved_env_steps"] is not None:
            steps, clock = fmt_int(r["solved_env_steps"]), fmt_f(r["solved_time"]) + " s"
        else:        # not reached within the budget: say so, with the budget and the time spent
            steps, clock = "> " + fmt_int(r["budget"]), "> " + fmt_f(r["wall_time"], ".0f") + " s"
        print(f"{r['task']:<{w}}{r['method']:<10}{steps:>18}{clock:>17}"
              f"{fin:>27}{r['budget']:>12,}{r['env_steps']:>12,}{r['wall_time']:>9.0f}s")
    if ratios:
        print()
        print(f"{'':<{w}}{'PPO / gradient':>24}{'SAC / gradient':>24}{'better baseline / gradient':>34}")
        print(f"{'task':<{w}}" + f"{'env steps':>12}{'wall-clock':>12}" * 2 + f"{'env steps':>17}{'wall-clock':>17}")
        for q in ratios:
            if q["better"] is None:
                print(f"{q['task']:<{w}}{'gradient trainer did not reach success':>48}")
                continue
            cells = []
            for m in BASELINES:
                r = q.get(m)
                cells += ["-", "-"] if r is None else [fmt_ratio(r["steps_ratio"], r["bound"]),
                                                       fmt_ratio(r["time_ratio"], r["bound"])]
            b = q["better"]
            best = [fmt_ratio(b[f"{k}_ratio"], b[f"{k}_bound"], b[f"{k}_method"]) for k in ("steps", "time")]
            print(f"{q['task']:<{w}}" + "".join(f"{c:>12}" for c in cells) + "".join(f"{c:>17}" for c in best))
        print("(> : the baseline did not reach the threshold within its budget; the ratio is a lower bound, its "
              "budget (wall time spent) over the gradient trainer's steps (time) to success. <= : the better "
              "baseline's ratio is at most this: the other stopped unsolved below it)")


def fmt_ratio(x, bound, method: Optional[str] = None) -> str:
    if x is None:
        return "-"
    prefix = {">": "> ", "<=": "<= "}.get(bound, "")
    return f"{prefix}{x:.1f}x" + (f" {method.upper()}" if method else "")


def merge(paths: List[str], out: Optional[str]) -> int:
    """Print the table and ratios from the JSON files of earlier runs.

    One row per task and method; a later file's row replaces an earlier one's. The rows are
    printed as measured, nothing is added.
    """
    rows: Dict[tuple, Dict[str, Any]] = {}
    for p in paths:
        try:
            with open(p) as f:
                data = json.load(f)
            found = data["rows"]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            print(f"error: {p}: not a results file of this script ({exc})", file=sys.stderr)
            return 2
        for r in found:
            rows[(r["task"], r["method"])] = r
        print(f"# {p}: {', '.join(r['task'] + '/' + r['method'] for r in found)} "
              f"(stable-baselines3 {data.get('stable_baselines3')}, torch {data.get('torch')})")
    ordered = [rows[k] for k in sorted(rows, key=lambda k: (list(FILES).index(k[0]) if k[0] in FILES else 99,
                                                            METHODS.index(k[1]) if k[1] in METHODS else 99))]
    ratios = []
    for t in dict.fromkeys(r["task"] for r in ordered):
        done = {m: rows[(t, m)] for m in METHODS if (t, m) in rows}
        if "gradient" in done and len(done) > 1:
            ratios.append(ratio_row(done))
    print_table(ordered, ratios)
    if out:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        with open(out, "w") as f:
            json.dump({"merged_from": paths, "rows": ordered, "ratios": ratios}, f, indent=2, default=str)
        print(f"wrote {out}")
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help="small budget (200k steps) and coarse PPO evaluation: a smoke run, not a result")
    parser.add_argument("--tasks", default="reach,hover,locomotion",
                        help=f"comma-separated, of {', '.join(FILES)} (default: all)")
    parser.add_argument("--budget", type=int, default=None,
                        help="environment-step budget per method and task (default: each file's "
                             "ppo.total_timesteps for PPO, sac.total_timesteps for SAC and training.iterations "
                             "for the gradient trainer; 200,000 with --quick)")
    parser.add_argument("--eval-every", "--ppo-eval-every", dest="eval_every", type=int, default=None,
                        help="evaluation period of the baselines (PPO and SAC), environment steps (default 25,600; "
                             "51,200 with --quick)")
    parser.add_argument("--methods", default="gradient,ppo,sac", help="comma-separated, of gradient, ppo, sac")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=None, help="write the rows as JSON here")
    parser.add_argument("--curves", default=None, help="folder for each run's training.csv and learning_curve.png")
    parser.add_argument("--progress", action="store_true", help="tqdm progress bars")
    parser.add_argument("--config", action="append", default=[], metavar="NAME=PATH",
                        help="use another training file for task NAME (repeatable), e.g. reach=my_reach.yaml")
    parser.add_argument("--merge", nargs="+", default=None, metavar="JSON",
                        help="run nothing: print the table and ratios from the --out files of earlier runs of "
                             "this script (e.g. the two methods run as separate processes)")
    args = parser.parse_args(argv)
    if args.merge:
        return merge(args.merge, args.out)

    names = [t.strip() for t in args.tasks.split(",") if t.strip()]
    bad = [t for t in names if t not in FILES]
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    if bad or not names or not methods or any(m not in METHODS for m in methods):
        parser.error(f"--tasks takes {', '.join(FILES)}; --methods takes {', '.join(METHODS)}")
    overrides = {}
    for item in args.config:
        name, sep, path = item.partition("=")
        if not sep or name not in FILES or not os.path.isfile(path):
            parser.error(f"--config takes NAME=PATH with NAME one of {', '.join(FILES)} and an existing file, "
                         f"got {item!r}")
        overrides[name] = path
    if args.budget is not None and args.budget < 1:
        parser.error(f"--budget must be at least 1, got {args.budget}")
    budget = args.budget or (200_000 if args.quick else None)
    baseline_eval = args.eval_every or (51_200 if args.quick else 25_600)
    curves = Path(args.curves) if args.curves else None

    torch.set_num_threads(1)
    import stable_baselines3
    print(f"# sample efficiency: gradient through the simulator vs PPO and SAC (stable-baselines3 "
          f"{stable_baselines3.__version__}), torch {torch.__version__}, 1 thread, "
          f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs")
    print(f"# budget: {'each file' + chr(39) + 's' if budget is None else f'{budget:,} environment steps'}; "
          f"baselines evaluated every {baseline_eval:,} steps; final success on {FINAL_EPISODES} fresh episodes")
    rows: List[Dict[str, Any]] = []
    ratios: List[Dict[str, Any]] = []
    for name in names:
        params, source = load_params(name, overrides.get(name))
        done = {}
        for method in methods:
            r = run_method(method, name, params, source, budget, args.seed, baseline_eval, curves, args.progress)
            done[method] = r
            rows.append(r)
            print(f"  {name:<10} {method:<8} solved at {fmt_int(r['solved_env_steps'])} steps / "
                  f"{fmt_f(r['solved_time'])} s; final success {r['final_success']:.2f}; "
                  f"{r['env_steps']:,} of {r['budget']:,} steps in {r['wall_time']:.1f} s "
                  f"({r['config_source']})", flush=True)
        if "gradient" in done and len(done) > 1:
            ratios.append(ratio_row(done))

    print_table(rows, ratios)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        with open(args.out, "w") as f:
            json.dump({"budget": budget, "baseline_eval_every": baseline_eval, "seed": args.seed,
                       "torch": torch.__version__, "stable_baselines3": stable_baselines3.__version__, "rows": rows,
                       "ratios": ratios}, f, indent=2, default=str)
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
