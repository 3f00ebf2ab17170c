"""Where in a stance the feet slide: the MuJoCo stand-in beside the simulator, by depth and direction.

    python bench/slide_phases.py [CHECKPOINT] [--contact-time-constant 0.05] [--episodes 8] [--seed 11]
        [--simulator KEY=VALUE,...]

The checkpoint's walker (default policies/locomotion_velocity) runs the same episodes (the
evaluation's reset draws from ``--seed``) on the stand-in, whose ground has the contact time
constant given, and in the simulator on the soft contact (``simulator.contact_model: soft``) with
the same time constant, plus the ``--simulator`` settings (e.g. friction_smoothing=0.03). Over the
strict metric's window, the feet's samples in contact at both ends of a control step (the metric's
contact: the lowest point within the task's contact_height of the ground) are sorted by how deep
the foot is and, when shallower than 8 mm, by whether it is sinking or rising. Printed per plant:
the median depth in contact, the metric's slide (m/s), and per band its share of the contact
time, its share of the displacement and its speed. The two plants' slides can agree in total and
differ in where they come from: a foot sweeping forward while it rises out of the ground is a
different physics from one creeping under load. Nothing here is a test: no figure is asserted.
"""
from __future__ import annotations

import argparse
import json
import shutil
import tempfile
from pathlib import Path

import numpy as np
import torch

from diffsim_ros.learning.deploy import PolicyRunner
from diffsim_ros.plant.mujoco_plant import MujocoPlant
from diffsim_ros.plant.perturbation import perturbation_spec, resolve_perturbation
from diffsim_ros.workflows.evaluation import _standin_params, load_checkpoint_task, rollout, standin_episode

REPO = Path(__file__).resolve().parents[1]
BANDS = [(-1.0, -0.015), (-0.015, -0.008), (-0.008, -0.003), (-0.003, 1.0)]


def _soft_task(checkpoint: str, tc: float, extra: dict):
    """Return (task, policy) of the checkpoint rebuilt on the soft contact with time constant ``tc``."""
    folder = Path(tempfile.mkdtemp()) / "checkpoint"
    shutil.copytree(checkpoint, folder)
    meta = json.loads((folder / "policy.json").read_text())
    for sim in (meta["simulator"], meta["config"]["simulator"]):
        sim.update(contact_model="soft", contact_time_constant=tc, **extra)
    (folder / "policy.json").write_text(json.dumps(meta))
    return load_checkpoint_task(folder)[:2]


def _standin(checkpoint: str, tc: float, n: int, seed: int, horizon: int):
    """Return the recorded configurations (T, nq) of ``n`` stand-in episodes."""
    runner = PolicyRunner(checkpoint)
    with torch.no_grad():
        ts = runner.task.reset(n, torch.Generator().manual_seed(seed))
    pert = resolve_perturbation(perturbation_spec({"contact_time_constant": tc}), "legged")
    plant = MujocoPlant(_standin_params(runner.meta, checkpoint), source=checkpoint, perturbation=pert)
    return [standin_episode(plant, runner, ts.sim.q[i].double().numpy(), ts.sim.v[i].double().numpy(), ts.target[i],
                            horizon)[0] for i in range(n)]


def _bands(task, episodes) -> str:
    """Sort the in-contact displacement by depth and direction; return the printed rows."""
    disp, time = np.zeros(len(BANDS)), np.zeros(len(BANDS))
    rising, sinking, depths = np.zeros(2), np.zeros(2), []
    w0 = task.window_start_step()
    for q in episodes:
        h = task.foot_track(torch.as_tensor(q, dtype=task.model.dtype))["height"].double().numpy()
        contact, step = task.foot_arrays(q)
        depths.append(np.median(h[w0:][contact[w0:]]))
        for k in range(w0 + 1, len(q)):
            for f in np.nonzero(contact[k] & contact[k - 1])[0]:
                j = next(i for i, (lo, hi) in enumerate(BANDS) if lo <= h[k, f] < hi)
                disp[j] += step[k, f]
                time[j] += task.dt
                if j >= 2:
                    (rising if h[k, f] > h[k - 1, f] else sinking)[:] += (step[k, f], task.dt)
    rows = [f"  median depth in contact {1000 * np.median(depths):.1f} mm, slide {disp.sum() / time.sum():.3f} m/s"]
    for (lo, hi), d, t in zip(BANDS, disp, time):
        band = f"deeper than {-1000 * hi:.0f} mm" if lo < -0.5 else (
            f"shallower than {-1000 * lo:.0f} mm" if hi > 0.5 else f"{-1000 * lo:.0f} to {-1000 * hi:.0f} mm deep")
        rows.append(f"  {band}: time {t / time.sum():.2f}, displacement {d / disp.sum():.2f}, "
                    f"speed {d / max(t, 1e-9):.3f} m/s")
    for name, (d, t) in (("sinking", sinking), ("rising", rising)):
        rows.append(f"  shallower than 8 mm, {name}: {t:.2f} s in all, {d / max(t, 1e-9):.3f} m/s")
    return "\n".join(rows)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("checkpoint", nargs="?", default=str(REPO / "policies" / "locomotion_velocity"))
    ap.add_argument("--contact-time-constant", type=float, default=0.05)
    ap.add_argument("--episodes", type=int, default=8)
    ap.add_argument("--seed", type=int, default=11)
    ap.add_argument("--simulator", default="", help="KEY=VALUE,... more simulator settings (numbers)")
    a = ap.parse_args()
    torch.set_num_threads(1)
    extra = {k: float(v) for k, v in (kv.split("=") for kv in a.simulator.split(",") if kv)}
    task, policy = _soft_task(a.checkpoint, a.contact_time_constant, extra)
    roll = rollout(task, policy, a.episodes, seed=a.seed)
    sim = [roll.q[:, i].numpy() for i in range(a.episodes)]
    stand_in = _standin(a.checkpoint, a.contact_time_constant, a.episodes, a.seed, int(task.horizon))
    print(f"stand-in, contact time constant {a.contact_time_constant} s:\n{_bands(task, stand_in)}")
    print(f"simulator, soft contact {a.contact_time_constant} s {extra or ''}:\n{_bands(task, sim)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
