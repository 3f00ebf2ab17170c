"""Does the ground push back as a penalty law? The feet's normal forces against their depth, from bags.

    python bench/contact_law.py [--robot quadruped|solo12] [--speed 0.5] [--steps 500]
        [--time-constants 0.005,0.02,0.05] [--seed 0]

The checkpoint's walker (policies/locomotion_velocity or _solo12) walks ``--steps`` control steps
at ``--speed`` m/s, recorded as a bag, on (a) the differentiable simulator with a contact
stiffness k and damping c drawn from ``--seed`` (log-uniform, k in 1e6-1e7 N/m^2, c in 5e3-3e4
N s/m^2) and (b) the MuJoCo stand-in at each of ``--time-constants`` (its soft contact's solref
time constant, the perturbation ``contact_time_constant``). From each bag the feet's normal
impulses over every steady control interval come from the equations of motion, without a
contact model (analysis/ground_friction.py: feet_impulses); each foot's depth from forward
kinematics. Printed per bag: the median normal force per depth band, and the least-squares fit
of the simulator's law lambda_n = k pen^2 - c pen dgap/dt integrated over the interval
(k against the integral of pen^2 by Simpson's rule on the interval's start, middle and end; c
against (pen_end^2 - pen_start^2) / 2, the damping term's exact integral while in contact),
with the share of the impulses it explains on each half of the bag. On the simulator k comes
back (c as an effective damping: the implicit contact step adds to it); where the force does not
grow with depth no stiffness describes the ground.
"""
from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import numpy as np
from diffsim_ros import config, physics
from diffsim_ros.analysis import read_bag, sim_setup
from diffsim_ros.analysis.contact_free import contact_free_mass
from diffsim_ros.analysis.ground_friction import collision_points, feet_impulses
from diffsim_ros.learning.deploy import PolicyRunner
from diffsim_ros.testing.recordings import record_walker

REPO = Path(__file__).resolve().parents[1]
NAMES = {"quadruped": "locomotion_velocity", "solo12": "locomotion_velocity_solo12"}
BANDS_MM = (0.0, 0.5, 1.0, 2.0, 4.0, 8.0, np.inf)
TOLERANCE = 0.005          # m, a collision point within this of the ground touches


def law_features(bag: Path):
    """Return the law's arrays of every loaded steady foot-interval of the bag.

    They are (features (rows, 2), normal impulses (rows,), rms depth (rows,), halves (rows,) bool,
    dt).
    """
    data = read_bag(bag)
    setup = sim_setup(data)
    cf = contact_free_mass(data, setup, TOLERANCE)
    ks, rows, (setup64, qs, _) = feet_impulses(data, setup, cf.mass_scale if cf.accepted else 1.0, TOLERANCE)
    model = setup64.model
    sys = physics.build_system(model, setup64.sim_config)
    points = [collision_points(sys, model, q) for q in qs]
    dt = setup.sim_config.dt
    X, y, depth, first = [], [], [], []
    for fn, _, _, i, _, sel in rows:
        pen2 = [float(((-gap[sel, i]).clamp(min=0) ** 2).sum()) for _, gap in points]
        integral = dt * (pen2[0] + 4 * pen2[1] + pen2[2]) / 6
        X.append((integral, 0.5 * (pen2[2] - pen2[0])))
        y.append(fn)
        depth.append(np.sqrt(integral / dt))
        first.append(i < len(ks) // 2)
    X, y, depth, first = np.array(X), np.array(y), np.array(depth), np.array(first)
    loaded = y > 0.1 * np.median(y[y > 0])
    return X[loaded], y[loaded], depth[loaded], first[loaded], dt


def report(label: str, bag: Path) -> None:
    X, y, depth, first, dt = law_features(bag)
    print(f"\n{label}: {len(y)} loaded foot-intervals")
    print("  depth (mm)      n   median normal force (N)")
    for lo, hi in zip(BANDS_MM[:-1], BANDS_MM[1:]):
        m = (depth * 1e3 >= lo) & (depth * 1e3 < hi)
        if m.any():
            print(f"  {lo:4.1f}-{hi:<5.1f} {int(m.sum()):6d}   {np.median(y[m]) / dt:8.2f}")
    for part, m in (("first half", first), ("second half", ~first)):
        (k, c), *_ = np.linalg.lstsq(X[m], y[m], rcond=None)
        other = ~m
        res = y[other] - X[other] @ (k, c)
        explained = 1 - float((res ** 2).sum() / (y[other] ** 2).sum())
        r2 = 1 - float(res.var() / y[other].var())
        print(f"  fit on the {part}: k {k:.4g} N/m^2, c {c:.4g} N s/m^2; on the other half it explains "
              f"{explained:.1%} of the impulses (R^2 {r2:.3f})")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--robot", choices=sorted(NAMES), default="quadruped")
    ap.add_argument("--speed", type=float, default=0.5)
    ap.add_argument("--steps", type=int, default=500)
    ap.add_argument("--time-constants", default="0.005,0.02,0.05")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    name = NAMES[a.robot]
    rng = np.random.default_rng(a.seed)
    k, c = float(np.exp(rng.uniform(np.log(1e6), np.log(1e7)))), float(np.exp(rng.uniform(np.log(5e3), np.log(3e4))))
    runner = PolicyRunner(REPO / "policies" / name)
    with tempfile.TemporaryDirectory() as tmp:
        params = config.load_yaml(REPO / "config" / f"{name}.yaml")
        params["simulator"].update(contact_stiffness=k, contact_damping=c)
        record_walker(Path(tmp) / "sim", runner, params, None, a.speed, a.steps, backend="simulator")
        report(f"simulator, k {k:.4g} N/m^2, c {c:.4g} N s/m^2 (seed {a.seed})", Path(tmp) / "sim")
        params = config.load_yaml(REPO / "config" / f"{name}.yaml")
        for tc in (float(x) for x in a.time_constants.split(",")):
            record_walker(Path(tmp) / f"mj{tc}", runner, params, {"contact_time_constant": tc}, a.speed, a.steps)
            report(f"MuJoCo stand-in, contact time constant {tc:g} s", Path(tmp) / f"mj{tc}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
