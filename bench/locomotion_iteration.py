#!/usr/bin/env python3
"""Wall-clock time of one gradient-trainer iteration of locomotion on solo12 (example-robot-data).

    python bench/locomotion_iteration.py [--envs 16] [--steps 200] [--repeat 2]

The iteration is the trainer's own (diffsim_ros.learning.apg.train, one iteration): 16
environments reset to a standing pose, a 200-step episode (dt 0.01 s, 5 substeps of 2 ms:
1000 contact substeps per environment), the policy run forward, the forward-progress loss
back-propagated through the simulator every 20 steps (truncated windows) and Adam steps.
Beside it, in the same run: the forward rollout alone (no_grad) of the same episode, and
the same iteration on the project's quadruped (config/locomotion.yaml's set-up), so the
printed ratios say what the backward pass and the robot cost. The issue's target is at
most 10 s for the solo12 iteration on one CPU thread; the ratio to it is printed.

solo12's set-up here: position PD (kp 3 N m/rad, kd 0.2 N m s/rad), the standing pose
(hip 0, thigh +-0.8, knee -+1.6 rad), the base height found by lowering the robot onto
the ground, its collision meshes as bounding boxes, float32, torch.set_num_threads(1).
``--compile`` adds a row per robot with training.compile_step (the compiled simulator), its
forward-alone column the eager rollout's; ``--randomize`` a row per robot (and per compiled row)
with the transfer recipe's randomisation (mass, centre of mass, servo gains, effort limits, ground
friction, contact stiffness and damping and latency up to 20 ms drawn per episode, sensor noise,
pushes), and the cost of randomising as the ratio to the same row without it. Nothing here is a
test: no figure is asserted.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
import warnings

import torch

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO_ROOT not in sys.path:
    sys.path.insert(0, REPO_ROOT)

from diffsim_ros import config, physics  # noqa: E402
from diffsim_ros.learning.apg import TrainConfig, train  # noqa: E402
from diffsim_ros.tasks.locomotion import LocomotionTask  # noqa: E402

ERD = os.path.join("cmeel.prefix", "share", "example-robot-data", "robots")
SOLO_STANCE = [0.0, 0.8, -1.6, 0.0, 0.8, -1.6, 0.0, -0.8, 1.6, 0.0, -0.8, 1.6]


def solo12_task(steps: int) -> LocomotionTask:
    for entry in sys.path:
        path = os.path.join(entry, ERD, "solo_description", "robots", "solo12.urdf")
        if os.path.isfile(path):
            break
    else:
        sys.exit("bench/locomotion_iteration.py: example-robot-data is not installed (pip install example-robot-data)")
    share = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(path))))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")   # meshes replaced by their bounding boxes
        model = physics.load_urdf(path, floating_base=True, dtype=torch.float32, package_dirs=[share])
    cfg = physics.SimConfig(dt=0.01, substeps=5, actuator="position", kp=3.0, kd=0.2)
    sim = physics.Simulator(model, cfg)
    q = model.neutral_configuration()
    q[7:] = torch.tensor(SOLO_STANCE)
    _, gap, _ = sim.contact_forces(q, torch.zeros(model.nv))
    base_height = -float(gap.min())           # the base height at which the lowest point touches
    return LocomotionTask(model, cfg, SOLO_STANCE, base_height, horizon=steps)


def quadruped_task(steps: int) -> LocomotionTask:
    path = os.path.join(REPO_ROOT, "config", "locomotion.yaml")
    params = config.load_yaml(path)
    params["task"]["horizon"] = steps
    task, _ = config.build_task(params, path, dtype=torch.float32)
    return task


#: The randomisation --randomize times (training options).
RANDOMIZE = {"randomize_mass": [0.9, 1.1], "randomize_ground_friction": [0.5, 1.0],
             "randomize_contact_stiffness": [1e5, 1e7], "randomize_contact_damping": [1e4, 1e5],
             "randomize_com_offset": [-0.01, 0.01], "randomize_servo_gain": [0.9, 1.1],
             "randomize_effort": [0.8, 1.2], "randomize_latency": [0.0, 0.02], "sensor_noise": [0.001, 0.01],
             "push_speed": [0.1, 0.3]}


def iteration_seconds(task, envs: int, repeat: int, compile_step: bool = False, randomize: bool = False):
    """Return the best wall time of one iteration, and how many attempts diverged on the way.

    A diverged attempt is dropped and retried on fresh episodes; its time counts in the
    iteration's. With compile_step: the trainer's compiled simulator, after one iteration that
    compiles it.
    """
    cfg = TrainConfig(iterations=1, num_envs=envs, window=20, learning_rate=3e-3, eval_envs=1, seed=0,
                      compile_step=compile_step, **(RANDOMIZE if randomize else {}))
    best, diverged = float("inf"), 0
    if compile_step:
        start = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            train(task, cfg, progress=False)
        print("compile_step: the first iteration (compiling, or loading the compiled graphs) took %.1f s"
              % (time.perf_counter() - start), flush=True)
    for _ in range(repeat):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            res = train(task, cfg, progress=False)
        best = min(best, res.history[0]["wall_time"])
        diverged += int(res.history[0]["diverged"])
    return best, diverged


def forward_seconds(task, envs: int, repeat: int) -> float:
    best = float("inf")
    policy = torch.nn.Linear(task.obs_dim, task.action_dim).to(torch.float32)
    for _ in range(repeat):
        start = time.perf_counter()
        with torch.no_grad():
            ts = task.reset(envs, torch.Generator().manual_seed(0))
            for _ in range(task.horizon):
                ts = task.step(ts, torch.tanh(policy(task.observe(ts))))
        best = min(best, time.perf_counter() - start)
    return best


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--envs", type=int, default=16)
    parser.add_argument("--steps", type=int, default=200, help="control steps per episode (5 substeps each)")
    parser.add_argument("--repeat", type=int, default=2, help="runs per figure; the best is printed")
    parser.add_argument("--compile", action="store_true",
                        help="also time the iteration with training.compile_step (the compiled simulator; compiling "
                             "it takes minutes the first time)")
    parser.add_argument("--randomize", action="store_true",
                        help="also time each iteration with domain randomisation, latency and sensor noise")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    print("one gradient-trainer iteration, %d environments x %d control steps (x 5 substeps), float32, "
          "torch %s, one thread; load average %.2f %.2f %.2f" % ((args.envs, args.steps, torch.__version__)
                                                              + os.getloadavg()))
    rows = []
    for name, make in (("solo12 (example-robot-data)", solo12_task), ("diffsim_quadruped", quadruped_task)):
        task = make(args.steps)
        fwd = forward_seconds(task, args.envs, args.repeat)
        for compiled in (False, True) if args.compile else (False,):
            label = name + (", compile_step" if compiled else "")
            it, diverged = iteration_seconds(task, args.envs, args.repeat, compile_step=compiled)
            rows.append((label, task.sim.pt_body.numel(), it, fwd, diverged, None))
            if args.randomize:
                it_r, diverged_r = iteration_seconds(task, args.envs, args.repeat, compiled, randomize=True)
                rows.append((label + ", randomised", task.sim.pt_body.numel(), it_r, fwd, diverged_r, it_r / it))
    print("")
    print("| robot | contact points | iteration (s) | forward rollout alone (s) | iteration / forward | "
          "iteration / 10 s target | randomised / not | diverged attempts |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for name, points, it, fwd, diverged, cost in rows:
        print("| %s | %d | %.2f | %.2f | %.2f | %.2f | %s | %d of %d |" % (
            name, points, it, fwd, it / fwd, it / 10.0, "" if cost is None else "%.2f" % cost, diverged, args.repeat))
    return 0


if __name__ == "__main__":
    sys.exit(main())
