#!/usr/bin/env python3
"""Where the sysid verdict turns for a wind it cannot model.

A constant horizontal force on the MuJoCo stand-in quadrotor, drawn as
test/analysis/test_sysid_random.py draws it (``test_sysid_rejects_a_wind_force_it_cannot_model``:
a direction, a mass x0.8-1.2), at each force given, several draws each.

    python bench/sysid_wind.py [--forces 0.3,0.5,0.7,1.0] [--draws 3] [--seed 5]

Printed per draw: the force, the exit status of ``diffsim-ros sysid --params
mass_scale,drag_scale`` (0 accepted, 3 rejected), the held-out RMSE before and after, the
residual and its per-dof bias as shares of the velocity change over a window. Nothing here is
a test: no figure is asserted.
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "test"))   # the tests' support modules
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "test" / "analysis"))

import test_sysid_random as T  # noqa: E402
from diffsim_ros import cli  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--forces", default="0.3,0.5,0.7,1.0", help="wind forces, N, comma-separated")
    ap.add_argument("--draws", type=int, default=3, help="draws (direction, mass, noise seed) per force")
    ap.add_argument("--seed", type=int, default=5)
    a = ap.parse_args()
    torch.set_num_threads(1)
    rng = np.random.default_rng(a.seed)
    for force in (float(f) for f in a.forces.split(",")):
        rejected = 0
        for k in range(a.draws):
            ang, mass = rng.uniform(0, 2 * np.pi), rng.uniform(0.8, 1.2)
            pert = {"wind_force": [force * np.cos(ang), force * np.sin(ang), 0.0], "mass_scale": mass}
            d = Path(tempfile.mkdtemp(prefix="sysid_wind_"))
            T.record_standard("quadrotor", d / "bag", pert, steps=T.STEPS, seed=k, predictions=False)
            with contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()):
                rc = cli.main(["sysid", str(d / "bag"), "--params", "mass_scale,drag_scale", "--out", str(d / "out"),
                               "--window", "3", "--max-starts", "48", "--quiet"])
            r = json.loads((d / "out" / "sysid.json").read_text())
            h = r["heldout"]
            rejected += rc == 3
            print(f"force {force:.2f} N  direction {ang:.2f} rad  mass x{mass:.3f}  exit {rc}  held-out RMSE "
                  f"{h['before']['rmse']:.4f} -> {h['after']['rmse']:.4f}  residual {r['unexplained']:.1%}  "
                  f"bias {r['systematic']:.1%}", flush=True)
        print(f"force {force:.2f} N: {rejected} of {a.draws} rejected", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
