"""Where a legged policy's feet slide on the MuJoCo stand-in: per episode and foot, how deep it
sinks, how fast it moves along the ground over the first samples of each stance and later, and
how much of the friction cone the ground's force uses there.

    python bench/foot_slide.py policies/locomotion_velocity_solo12 [--perturb actuator_lag=0.005]
        [--episodes 4] [--seed 99]

Episodes are the stand-in evaluation's (``diffsim-ros eval --plant mujoco``: the task's reset
draws from ``--seed``), judged by the strict metric from the recorded states. Per foot, over the
judged window: ``slide`` the metric's mean horizontal speed in contact (m/s), ``sink`` the
deepest penetration of its lowest point (mm), ``stance speed`` the mean horizontal speed of
that point at the 1st, 2nd, 3rd and later samples of a stance (m/s), and ``|f_t|/f_n`` the
mean ratio of the net horizontal to the normal contact force MuJoCo applies to the foot while
it is loaded (the Coulomb coefficient bounds it; near it the foot slips, well below it a moving
foot creeps through the soft contact).
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
    args = ap.parse_args()
    torch.set_num_threads(1)

    import mujoco

    from diffsim_ros.evaluation import _measured_qv, _standin_params
    from diffsim_ros.learning.deploy import PolicyRunner
    from diffsim_ros.plant.mujoco_plant import MujocoPlant
    from diffsim_ros.plant.perturbation import perturbation_spec, resolve_perturbation, robot_kind

    runner = PolicyRunner(args.checkpoint)
    task = runner.task
    if not getattr(task, "command_speed", None):
        raise SystemExit(f"{args.checkpoint}: not a velocity-command walker (task '{task.name}')")
    pert = resolve_perturbation(perturbation_spec(args.perturb), robot_kind(runner.kind))
    plant = MujocoPlant(_standin_params(runner.meta, args.checkpoint), source=args.checkpoint, perturbation=pert)
    m, d = plant.model, plant.data
    names = [task.model.body_names[b] for b in task.feet]
    bodies = [mujoco.mj_name2id(m, mujoco.mjtObj.mjOBJ_BODY, n) for n in names]
    with torch.no_grad():
        ts = task.reset(args.episodes, torch.Generator().manual_seed(args.seed))
    i0 = task.window_start_step()
    print(f"{args.checkpoint} on the stand-in, perturbation {pert or 'none'}, {args.episodes} episodes "
          f"(seed {args.seed})")
    for e in range(args.episodes):
        plant.reset(ts.sim.q[e].double().numpy(), ts.sim.v[e].double().numpy())
        runner.reset()
        target = ts.target[e:e + 1].to(runner.dtype)
        q, ratio = [plant.q], [[] for _ in bodies]
        for k in range(int(task.horizon)):
            plant.step(runner.decide(runner.state(*_measured_qv(plant)), target, predict=False).command)
            q.append(plant.q)
            if k + 1 < i0:
                continue
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
        q = np.array(q)
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
            print(f"  {name:<14} slide {slide if slide is not None else float('nan'):.3f}  "
                  f"sink {-1000 * height[i0:, f].min():5.1f} mm  stance speed "
                  f"{' '.join(f'{x:.3f}' for x in by)} then {later:.3f}  "
                  f"|f_t|/f_n {np.mean(ratio[f]) if ratio[f] else float('nan'):.2f}")


if __name__ == "__main__":
    main()
