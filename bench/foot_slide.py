"""Where a legged policy's feet slide on the MuJoCo stand-in.

Per episode and foot: how deep it sinks, how fast it moves along the ground over the first
samples of each stance and later, and how much of the friction cone the ground's force uses
there.

    python bench/foot_slide.py policies/locomotion_velocity_solo12 [--perturb actuator_lag=0.005]
        [--episodes 4] [--seed 99] [--step-refinement 1,2,4,8]

Episodes are the stand-in evaluation's (``diffsim-ros eval --plant mujoco``: the task's reset
draws from ``--seed``), judged by the strict metric from the recorded states. Per foot, over the
judged window: ``slide`` the metric's mean horizontal speed in contact (m/s), ``sink`` the
deepest penetration of its lowest point (mm), ``stance speed`` the mean horizontal speed of
that point at the 1st, 2nd, 3rd and later samples of a stance (m/s), and ``|f_t|/f_n`` the
mean ratio of the net horizontal to the normal contact force MuJoCo applies to the foot while
it is loaded (the Coulomb coefficient bounds it; near it the foot slips, well below it a moving
foot creeps through the soft contact).

``--step-refinement`` runs the episodes once per value, MuJoCo's step the simulator's substep
divided by it (default: the stand-in's own, plant/mujoco_plant.py ``default_refinement``), and
ends with one line per value: the stand-in's step and the feet's mean slide, whose convergence as
the step shrinks says whether the stand-in resolves the contact.
"""
from __future__ import annotations

import argparse

import numpy as np
import torch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("checkpoint")
    ap.add_argument("--perturb", default=None, help="the stand-in's perturbation, as diffsim-ros eval takes it")
    ap.add_argument("--episodes", type=int, default=4)
    ap.add_argument("--seed", type=int, default=99)
    ap.add_argument("--step-refinement", default=None,
                    help="comma-separated MuJoCo steps per simulator substep (default: the stand-in's)")
    args = ap.parse_args()
    refinements = [None] if args.step_refinement is None else [int(x) for x in args.step_refinement.split(",")]
    summary = [run(args, r) for r in refinements]
    if len(summary) > 1:
        for step, slides in summary:
            print(f"stand-in step {1000 * step:.3f} ms: mean slide {np.mean(slides):.3f} m/s "
                  f"(feet and episodes: {np.min(slides):.3f}-{np.max(slides):.3f})")


def run(args, refinement):
    """One pass over the episodes at ``refinement``; returns (MuJoCo step, every foot's slide)."""
    torch.set_num_threads(1)

    import mujoco

    from diffsim_ros.workflows.evaluation import _standin_params, standin_episode
    from diffsim_ros.learning.deploy import PolicyRunner
    from diffsim_ros.plant.mujoco_plant import MujocoPlant
    from diffsim_ros.plant.perturbation import perturbation_spec, resolve_perturbation, robot_kind

    runner = PolicyRunner(args.checkpoint)
    task = runner.task
    if not getattr(task, "command_speed", None):
        raise SystemExit(f"{args.checkpoint}: not a velocity-command walker (task '{task.name}')")
    pert = resolve_perturbation(perturbation_spec(args.perturb), robot_kind(runner.kind))
    plant = MujocoPlant(_standin_params(runner.meta, args.checkpoint), source=args.checkpoint, perturbation=pert,
                        step_refinement=refinement)
    m, d = plant.model, plant.data
    names = [task.model.body_names[b] for b in task.feet]
    bodies = [mujoco.mj_name2id(m, mujoco.mjtObj.mjOBJ_BODY, n) for n in names]
    with torch.no_grad():
        ts = task.reset(args.episodes, torch.Generator().manual_seed(args.seed))
    i0 = task.window_start_step()
    print(f"{args.checkpoint} on the stand-in, perturbation {pert or 'none'}, {args.episodes} episodes "
          f"(seed {args.seed}), MuJoCo step {1000 * plant.h:.3f} ms")
    slides = []
    for e in range(args.episodes):
        ratio = [[] for _ in bodies]

        def loads(k, ratio=ratio):
            """After the plant's k-th step: each loaded foot's horizontal over normal contact force."""
            if k + 1 < i0:
                return
            for f, b in enumerate(bodies):
                force = np.zeros(3)
                for i in range(d.ncon):
                    c = d.contact[i]
                    sign = 1.0 if m.geom_bodyid[c.geom2] == b else (-1.0 if m.geom_bodyid[c.geom1] == b else 0.0)
                    if sign:
                        f6 = np.zeros(6)
                        mujoco.mj_contactForce(m, d, i, f6)
                        force += sign * (c.frame.reshape(3, 3).T @ f6[:3])
                if force[2] > 1.0:                          # loaded: more than 1 N on the ground
                    ratio[f].append(np.hypot(force[0], force[1]) / force[2])
        q, _ = standin_episode(plant, runner, ts.sim.q[e].double().numpy(), ts.sim.v[e].double().numpy(),
                               ts.target[e], int(task.horizon), loads)
        v = task.recorded_verdict(np.arange(len(q)) * task.dt, q, np.zeros((len(q), plant.nv)),
                                  ts.target[e].double().numpy())
        contact, step = task.foot_arrays(q)
        height = task.foot_track(torch.as_tensor(q, dtype=task.model.dtype))["height"].numpy()
        print(f"episode {e}: command {v['command_m_s']:.2f} m/s, window speed {v['window_speed_m_s']:.2f}, "
              f"success {v['success']}")
        for f, name in enumerate(names):
            c, s = contact[i0:, f], step[i0:, f] / task.dt
            run = np.zeros(len(c), int)
            for j in range(1, len(c)):
                run[j] = run[j - 1] + 1 if c[j] and c[j - 1] else 0
            by = [s[run == j].mean() if (run == j).any() else np.nan for j in (1, 2, 3)]
            later = s[run >= 4].mean() if (run >= 4).any() else np.nan
            slide = v["foot_slide_m_s"][f]
            slides.append(np.nan if slide is None else slide)
            print(f"  {name:<14} slide {slide if slide is not None else float('nan'):.3f}  "
                  f"sink {-1000 * height[i0:, f].min():5.1f} mm  stance speed "
                  f"{' '.join(f'{x:.3f}' for x in by)} then {later:.3f}  "
                  f"|f_t|/f_n {np.mean(ratio[f]) if ratio[f] else float('nan'):.2f}")
    return plant.h, np.array(slides)


if __name__ == "__main__":
    main()
