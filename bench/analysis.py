#!/usr/bin/env python3
"""Time to analyse a 60 s, 500 Hz bag, as a multiple of real time (aim: 20 times faster).

    python bench/analysis.py [--seconds 60] [--rate 500] [--robots quadrotor,arm] [--keep DIR]

For each robot, the MuJoCo stand-in (perturbed as in the tests: mass +20 %, arm joint
damping x3, quadrotor drag x2) runs ``--seconds`` s of exciting closed-loop commands at
``--rate`` Hz (the control step; 1 physics substep for the quadrotor, 2 for the arm) and
diffsim_ros.testing.recordings writes the bag in the layout of doc/interfaces.md (MCAP:
states, commands labelled with their state's stamp, the nominal simulator's one-step
predictions, /imu for the quadrotor, metadata). Recording is not timed.

Timed: ``analysis.analyze(bag, horizons=(1, 5, 10))`` exactly as ``diffsim-ros analyze``
runs it (read and align the bag, estimate the hidden actuator state along it, replay the
commands 1 step ahead from every state and 5 and 10 steps ahead from 4096 states, compute
the metrics), once without and once with its outputs (plots, JSON, markdown).

Peer, measured in the same run on the same bag: reading the bag with rosbags'
per-message deserialiser (what an analysis written the obvious way spends before it has
computed anything). One torch thread. Nothing here is a test: no figure is asserted.
"""
from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from diffsim_ros.analysis import analyze  # noqa: E402
from diffsim_ros.testing.recordings import PERTURBATIONS, exciter, make_plant, record_bag, standard_params  # noqa: E402


def rosbags_read_all(bag: Path) -> float:
    from rosbags.highlevel import AnyReader

    from diffsim_ros.analysis.bag import _typestore

    t0 = time.perf_counter()
    with AnyReader([bag], default_typestore=_typestore()) as r:
        for c, _, raw in r.messages():
            r.deserialize(raw, c.msgtype)
    return time.perf_counter() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=60.0, help="bag duration, s (default 60)")
    ap.add_argument("--rate", type=float, default=500.0, help="control and state rate, Hz (default 500)")
    ap.add_argument("--robots", default="quadrotor,arm", help="comma-separated: quadrotor, arm")
    ap.add_argument("--keep", default=None, help="folder to keep the bags and reports in (default: temporary)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    root = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="bench_analysis_"))
    root.mkdir(parents=True, exist_ok=True)
    print(f"analysis of a {args.seconds:g} s, {args.rate:g} Hz bag; torch threads {torch.get_num_threads()}")
    rows = []
    try:
        for kind in args.robots.split(","):
            params = standard_params(kind)
            params["simulator"]["dt"] = 1.0 / args.rate
            params["simulator"]["substeps"] = 1 if kind == "quadrotor" else 2
            steps = int(round(args.seconds * args.rate))
            bag = root / f"{kind}_{int(args.rate)}hz"
            shutil.rmtree(bag, ignore_errors=True)
            t0 = time.perf_counter()
            plant = make_plant(params, PERTURBATIONS[kind])
            record_bag(bag, plant, exciter(params, seed=0), steps, params)
            t_rec = time.perf_counter() - t0
            size = sum(f.stat().st_size for f in bag.iterdir()) / 1e6
            t0 = time.perf_counter()
            m = analyze(bag, horizons=(1, 5, 10), plots=False)
            t_plain = time.perf_counter() - t0
            t0 = time.perf_counter()
            analyze(bag, out_dir=root / f"{kind}_report", horizons=(1, 5, 10))
            t_out = time.perf_counter() - t0
            t_peer = rosbags_read_all(bag)
            dur = m["duration_s"]
            nmsg = sum(s["count"] for s in m["topics"].values())
            tm = m["timing"]
            print(f"\n{kind}: {steps} control steps recorded in {t_rec:.1f} s; bag {size:.1f} MB, {nmsg} messages, "
                  f"{dur:.2f} s")
            print(f"  analyze (metrics only)      {t_plain:6.2f} s  = {dur / t_plain:6.1f}x faster than real time "
                  f"(read {tm['read_s']:.2f} s, predict {tm['predict_s']:.2f} s)")
            print(f"  analyze (+ plots, JSON, md) {t_out:6.2f} s  = {dur / t_out:6.1f}x faster than real time")
            print(f"  peer: rosbags per-message deserialisation of the whole bag {t_peer:.2f} s "
                  f"(ours reads and aligns it {t_peer / max(tm['read_s'], 1e-9):.1f}x faster)")
            print(f"  1-step velocity RMSE {m['prediction']['by_horizon']['1']['rmse']:.4g}, "
                  f"10-step {m['prediction']['by_horizon']['10']['rmse']:.4g}")
            rows.append((kind, dur / t_plain, dur / t_out))
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    print("\nsummary (x real time; aim 20):", ", ".join(f"{k} {a:.1f} (with outputs {b:.1f})" for k, a, b in rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
