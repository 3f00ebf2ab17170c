"""``diffsim-ros demo``: the dynamics core on a URDF (forward dynamics, batched, timed).

The computations are diffsim_ros/dynamics_demo.py's, this module reads the arguments and prints.
"""
from __future__ import annotations

import argparse
import math
import os
import sys
import time
import warnings

from .common import CliError, _command, _device, _fmt, _sync, _table, default_urdf


def cmd_demo(args: argparse.Namespace) -> int:
    if args.batch < 1:
        raise CliError(f"--batch must be at least 1, got {args.batch}")
    path = args.urdf if args.urdf is not None else default_urdf()
    if not os.path.isfile(path):
        raise CliError(f"{path}: no such file")

    import torch

    from diffsim_ros import dynamics_demo, physics

    dtype = {"float32": torch.float32, "float64": torch.float64}[args.dtype]
    device = _device(args.device)

    t0 = time.perf_counter()
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            model = physics.load_urdf(path, floating_base=args.floating_base,
                                      dtype=dtype, device=device)
    except physics.UrdfError as exc:
        msg = str(exc)
        raise CliError(msg if path in msg else f"{path}: {msg}") from None
    except OSError as exc:
        raise CliError(f"{path}: {exc.strerror or exc}") from None
    t_load = time.perf_counter() - t0
    for w in caught:
        print(f"warning: {w.message}", file=sys.stderr)

    nj = len(model.joint_names)
    try:
        rep = dynamics_demo.run(model, args.batch, args.seed, args.time_budget, lambda: _sync(device))
    except ValueError as exc:
        raise CliError(str(exc)) from None

    print(f"robot       {model.name}  ({path})")
    print(f"model       {len(model.link_names)} links, {nj} joints, nq={model.nq}, nv={model.nv}"
          f"{', floating base' if rep.floating_dofs else ', fixed base'}  (loaded in {t_load * 1e3:.0f} ms)")
    print(f"batch       {args.batch} random states within joint limits, "
          f"{args.dtype} on {device}, seed {args.seed}")
    print()
    rows = [[name, "-" if math.isnan(qi) else _fmt(qi), _fmt(m), _fmt(g), _fmt(qdd)]
            for name, qi, m, g, qdd in rep.rows]
    print("state 0 (rad, kg m^2, N m, rad/s^2; prismatic joints in m, kg, N, m/s^2)")
    print(_table(["dof", "q", "M_ii", "g(q)", "qdd|tau=0"], rows))
    print()
    p = rep.tip_position
    print(f"forward kinematics: link {rep.tip!r} (the tip of the longest chain) of state 0 at "
          f"x={p[0]:+.4f} y={p[1]:+.4f} z={p[2]:+.4f} m (world frame)")
    c0, cmed, cmax = rep.condition
    print(f"mass matrix: condition number {c0:.4g} for state 0 (batch median {cmed:.4g}, max {cmax:.4g}); "
          f"max asymmetry {rep.asymmetry:.2g}")
    print(f"consistency: max |aba(q, v, rnea(q, v, a)) - a| = {rep.aba_inverse_error:.3e} over {args.batch} states")
    print(f"consistency: max |crba(q) a + rnea(q, v, 0) - rnea(q, v, a)| = {rep.equation_residual:.3e}")
    print(f"autograd: |d|aba|^2/dq| = {rep.grad_q:.4g}, |d|aba|^2/dtau| = {rep.grad_tau:.4g} at state 0")
    print(f"timing: aba on {args.batch} states: {rep.ms_per_call:.3f} ms per call, "
          f"{rep.steps_per_s:,.0f} steps/s ({rep.calls} calls)")
    return 0


def _add_demo(sub) -> None:
    p = _command(sub, "demo", cmd_demo, help="run the dynamics core on a real URDF and print what it computed",
                 description="""Load a URDF, sample a batch of random states within the joint limits, and run
                 forward kinematics, CRBA, RNEA and ABA on it: prints a table for the first state, consistency checks,
                 a gradient, and the speed of ABA.""")
    p.add_argument("--urdf", metavar="PATH",
                   help="URDF or xacro file (default: panda from example-robot-data)")
    p.add_argument("--floating-base", action="store_true",
                   help="attach the root link to the world by a free-flyer joint")
    p.add_argument("--batch", type=int, default=1024, metavar="N",
                   help="number of random states (default: 1024)")
    p.add_argument("--dtype", choices=["float32", "float64"], default="float64",
                   help="floating-point type (default: float64)")
    p.add_argument("--device", default="cpu",
                   help="torch device, e.g. cpu or cuda:0 (default: cpu)")
    p.add_argument("--seed", type=int, default=0, help="random seed (default: 0)")
    p.add_argument("--time-budget", type=float, default=1.0, metavar="SECONDS",
                   help="wall-clock time spent timing aba (default: 1.0 s)")
