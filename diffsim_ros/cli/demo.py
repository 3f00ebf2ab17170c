"""``diffsim-ros demo``: the dynamics core on a URDF (forward dynamics, batched, timed)."""
from __future__ import annotations

import argparse
import math
import os
import sys
import time
import warnings

from .common import CliError, _device, _fmt, _sync, _table, default_urdf


def sample_states(model, batch: int, generator):
    """Random (q, v, a) within the model's joint position limits.

    Continuous joints (infinite limits) are sampled in [-pi, pi]. A floating
    base gets a position in [-1, 1]^3 m and a uniformly random unit quaternion
    (x, y, z, w). Velocities and accelerations are standard normal.
    """
    import torch

    dtype, device = model.lower.dtype, model.lower.device
    nj = len(model.joint_names)
    lower = model.lower.to(dtype).clone()
    upper = model.upper.to(dtype).clone()
    lower[~torch.isfinite(lower)] = -math.pi
    upper[~torch.isfinite(upper)] = math.pi

    def rand(*shape):
        return torch.rand(*shape, generator=generator, dtype=dtype).to(device)

    def randn(*shape):
        return torch.randn(*shape, generator=generator, dtype=dtype).to(device)

    q_joints = lower + (upper - lower) * rand(batch, nj)
    base_nq = model.nq - nj
    if base_nq == 7:
        pos = 2.0 * rand(batch, 3) - 1.0
        quat = randn(batch, 4)
        quat = quat / quat.norm(dim=-1, keepdim=True)
        q = torch.cat([pos, quat, q_joints], dim=-1)
    elif base_nq == 0:
        q = q_joints
    else:
        raise CliError(f"unexpected model layout: nq={model.nq} with {nj} joints")
    v = randn(batch, model.nv)
    a = randn(batch, model.nv)
    return q, v, a


def cmd_demo(args: argparse.Namespace) -> int:
    if args.batch < 1:
        raise CliError(f"--batch must be at least 1, got {args.batch}")
    path = args.urdf if args.urdf is not None else default_urdf()
    if not os.path.isfile(path):
        raise CliError(f"{path}: no such file")

    import torch

    from diffsim_ros import physics

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
    base = ["base_vx", "base_vy", "base_vz", "base_wx", "base_wy", "base_wz"]
    dof_names = (base if model.nv - nj == 6 else []) + list(model.joint_names)
    nb = model.nv - nj

    gen = torch.Generator().manual_seed(args.seed)
    q, v, a = sample_states(model, args.batch, gen)
    zeros = torch.zeros_like(v)

    print(f"robot       {model.name}  ({path})")
    print(f"model       {len(model.link_names)} links, {nj} joints, nq={model.nq}, nv={model.nv}"
          f"{', floating base' if nb else ', fixed base'}  (loaded in {t_load * 1e3:.0f} ms)")
    print(f"batch       {args.batch} random states within joint limits, "
          f"{args.dtype} on {device}, seed {args.seed}")
    print()

    with torch.no_grad():
        poses = physics.forward_kinematics(model, q)                # (B, L, 4, 4)
        mass_matrix = physics.crba(model, q)                        # (B, nv, nv)
        gravity = physics.rnea(model, q, zeros, zeros)              # (B, nv)
        qdd_free = physics.aba(model, q, v, torch.zeros_like(v))    # (B, nv)
        tau = physics.rnea(model, q, v, a)
        a_back = physics.aba(model, q, v, tau)
        bias = physics.rnea(model, q, v, zeros)

    # state 0, one row per degree of freedom
    rows = []
    M0 = mass_matrix[0]
    for i, name in enumerate(dof_names):
        if i < nb:
            qi = "-"
        else:
            qi = _fmt(float(q[0, model.nq - model.nv + i]))
        rows.append([name, qi, _fmt(float(M0[i, i])), _fmt(float(gravity[0, i])),
                     _fmt(float(qdd_free[0, i]))])
    print("state 0 (rad, kg m^2, N m, rad/s^2; prismatic joints in m, kg, N, m/s^2)")
    print(_table(["dof", "q", "M_ii", "g(q)", "qdd|tau=0"], rows))
    print()

    last, p = _tip_position(model, poses[0])
    print(f"forward kinematics: link {last!r} (the tip of the longest chain) of state 0 at "
          f"x={p[0]:+.4f} y={p[1]:+.4f} z={p[2]:+.4f} m (world frame)")
    cond = torch.linalg.cond(mass_matrix.to(torch.float64))
    print(f"mass matrix: condition number {float(cond[0]):.4g} for state 0 "
          f"(batch median {float(cond.median()):.4g}, max {float(cond.max()):.4g}); "
          f"max asymmetry {float((mass_matrix - mass_matrix.transpose(-1, -2)).abs().max()):.2g}")

    err = float((a_back - a).abs().max())
    print(f"consistency: max |aba(q, v, rnea(q, v, a)) - a| = {err:.3e} over {args.batch} states")
    resid = torch.einsum("...ij,...j->...i", mass_matrix, a) + bias - tau
    print(f"consistency: max |crba(q) a + rnea(q, v, 0) - rnea(q, v, a)| = "
          f"{float(resid.abs().max()):.3e}")

    # gradients flow through the dynamics (state 0 only)
    q0 = q[:1].clone().requires_grad_(True)
    tau0 = torch.zeros_like(v[:1]).requires_grad_(True)
    loss = physics.aba(model, q0, v[:1], tau0).pow(2).sum()
    g_q, g_tau = torch.autograd.grad(loss, (q0, tau0))
    print(f"autograd: |d|aba|^2/dq| = {float(g_q.norm()):.4g}, "
          f"|d|aba|^2/dtau| = {float(g_tau.norm()):.4g} at state 0")

    # timing of the batched forward dynamics
    with torch.no_grad():
        for _ in range(2):
            physics.aba(model, q, v, tau)
        _sync(device)
        reps, t0 = 0, time.perf_counter()
        while True:
            physics.aba(model, q, v, tau)
            _sync(device)
            reps += 1
            elapsed = time.perf_counter() - t0
            if reps >= 3 and elapsed >= args.time_budget:
                break
    print(f"timing: aba on {args.batch} states: {elapsed / reps * 1e3:.3f} ms per call, "
          f"{args.batch * reps / elapsed:,.0f} steps/s ({reps} calls)")
    return 0


def _tip_position(model, poses):
    """(name, world position) of the link at the end of the longest kinematic chain (ties: the last
    such link) from one state's link poses (n_links, 4, 4) (``forward_kinematics``)."""
    def depth(b: int) -> int:
        d = 0
        while b >= 0:
            b, d = model.parent[b], d + 1
        return d
    k = max(range(len(model.link_names)), key=lambda i: (depth(model.link_body[i]), i))
    return model.link_names[k], poses[k, :3, 3].tolist()


def _add_demo(sub) -> None:
    p = sub.add_parser(
        "demo", help="run the dynamics core on a real URDF and print what it computed",
        description="Load a URDF, sample a batch of random states within the joint limits, "
                    "and run forward kinematics, CRBA, RNEA and ABA on it: prints a table for "
                    "the first state, consistency checks, a gradient, and the speed of ABA.")
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
    p.set_defaults(func=cmd_demo)
