"""Command-line entry point: ``diffsim-ros COMMAND ...``.

Installed as the ``diffsim-ros`` console script (see setup.py) and runnable as
``python -m diffsim_ros.cli``. Each subcommand is a small function registered
in :func:`build_parser`; heavy imports (torch, the physics core) happen inside
the command so that ``--help`` stays fast.

Commands: ``demo`` (the dynamics core on a URDF), ``train`` (a policy by gradients
through the simulator, exported as a checkpoint), ``baseline`` (the PPO baseline),
``analyze`` (sim-vs-real velocity comparison of a bag), ``sysid`` (calibration on a bag),
``bag repair`` (rebuild the index of a bag whose recorder was killed), ``excite`` (an
identification motion on the MuJoCo stand-in, recorded for ``sysid``).

Exit codes: 0 success, 2 bad input (unreadable or invalid URDF, YAML, checkpoint or
bag, bad option).
"""
from __future__ import annotations

import argparse
import math
import os
import sys
import time
import warnings
from typing import List, Optional, Sequence

from diffsim_ros.robot_data import example_robot_data_dirs

DEFAULT_ROBOT = os.path.join("panda_description", "urdf", "panda.urdf")


class CliError(Exception):
    """Bad input detected by the CLI itself; reported as ``error: ...``, exit code 2."""


# --------------------------------------------------------------------------- helpers


def default_urdf() -> str:
    for robots in example_robot_data_dirs():
        path = os.path.join(robots, DEFAULT_ROBOT)
        if os.path.isfile(path):
            return path
    raise CliError(
        "the default robot (example-robot-data's panda) was not found on sys.path; "
        "install example-robot-data (scripts/bootstrap.sh does) or pass --urdf PATH")


def _device(name: str):
    import torch

    try:
        device = torch.device(name)
    except RuntimeError as exc:
        raise CliError(f"--device {name!r}: {exc}") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise CliError(f"--device {name!r}: CUDA is not available on this machine")
    return device


def _sync(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _fmt(x: float, width: int = 10) -> str:
    return f"{x:>{width}.4g}"


def _table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h)
              for i, h in enumerate(headers)]
    lines = ["  ".join(h.ljust(w) if i == 0 else h.rjust(w)
                       for i, (h, w) in enumerate(zip(headers, widths)))]
    lines.append("  ".join("-" * w for w in widths))
    for r in rows:
        lines.append("  ".join(c.ljust(w) if i == 0 else c.rjust(w)
                               for i, (c, w) in enumerate(zip(r, widths))))
    return "\n".join(lines)


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


# --------------------------------------------------------------------------- demo


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


# --------------------------------------------------------------------------- train / baseline


def _input_errors():
    """Exception types that mean bad input (reported as ``error: ...``, exit 2)."""
    from diffsim_ros.learning.checkpoint import CheckpointError
    from diffsim_ros.physics import ConfigError, SimulationError, UrdfError

    # SimulationError: the simulator diverged, almost always from the file's dt, substeps or gains.
    return (ConfigError, UrdfError, CheckpointError, SimulationError)


def _describe(exc: Exception, source: str) -> str:
    from diffsim_ros.physics import SimulationError

    if isinstance(exc, SimulationError):
        return (f"{source}: the simulation diverged ({exc}); try a smaller simulator.dt, more "
                f"simulator.substeps or lower gains")
    return str(exc)


def _positive(name: str, value: Optional[int]) -> None:
    if value is not None and value < 1:
        raise CliError(f"{name} must be at least 1, got {value}")


def _load_training_setup(args: argparse.Namespace, device="cpu", params=None):
    """(params, task, model) of ``--config`` (or of ``params``, read from ``args.config``), the
    task and model on ``device``, with bad input turned into CliError."""
    if params is None and not os.path.isfile(args.config):
        raise CliError(f"{args.config}: no such file")
    _positive("--threads", args.threads)
    import torch

    torch.set_num_threads(args.threads)
    from diffsim_ros import config

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        if params is None:
            params, task, model = config.load_training_file(args.config, device=device)
        else:
            config.check_keys(params, config.TRAINING_FILE_KEYS, args.config)
            task, model = config.build_task(params, args.config, device=device)
    for w in caught:
        if issubclass(w.category, UserWarning):
            print(f"warning: {w.message}", file=sys.stderr)
    return params, task, model


def _last_eval(history, key: str = "eval_success") -> Optional[float]:
    vals = [h.get(key) for h in history]
    vals = [v for v in vals if isinstance(v, (int, float)) and not math.isnan(v)]
    return float(vals[-1]) if vals else None


def _summary(kind: str, task, model, result, cfg, out_dir: str, files, wall: float) -> None:
    history = list(result.history or [])
    last = history[-1] if history else {}
    ev = _last_eval(history)
    print(f"{kind}: task {task.name} on robot {model.name} ({task.obs_dim} observations, "
          f"{task.action_dim} actions, horizon {task.horizon} x {task.dt:g} s)")
    if "iteration" in last:
        print(f"iterations      {int(last['iteration'])}")
    print(f"env steps       {int(last.get('env_steps', 0)):,}")
    print(f"final success   {'n/a' if ev is None else f'{ev:.3f}'} (evaluation on fresh episodes; "
          f"threshold {task.success_threshold:g})")
    at_limit, over = _last_eval(history, "eval_at_limit"), _last_eval(history, "eval_over_speed")
    if at_limit is not None or over is not None:
        fmt = lambda x: "n/a" if x is None else f"{x:.3f}"  # noqa: E731
        print(f"joint limits    {fmt(at_limit)} of those episodes put a joint at its URDF position limit, "
              f"{fmt(over)} drove one past its URDF velocity limit")
    if result.solved_env_steps is not None:
        print(f"solved after    {result.solved_env_steps:,} env steps, "
              f"{result.solved_time:.1f} s")
    else:
        print("solved after    not solved")
    print(f"time            {wall:.1f} s")
    print(f"files in {out_dir}:")
    for f in files:
        print(f"  {f}")


def _written(out_dir: str, before: set) -> List[str]:
    names = sorted(n for n in os.listdir(out_dir) if os.path.isfile(os.path.join(out_dir, n))
                   and (n not in before or n in ("policy.pt", "policy.json", "training.csv",
                                                  "learning_curve.png")))
    names += [f"checkpoints/{k}/" for k in ("latest", "best") if os.path.isdir(os.path.join(out_dir, "checkpoints", k))]
    return names


def _refuse_overwrite(out: str, force: bool, command: str = "train") -> None:
    """--out must not hold a policy or an unfinished run already, unless --force."""
    from diffsim_ros.training import occupied

    if force:
        return
    left = occupied(out)
    if left == "policy":
        raise CliError(f"--out {out}: holds a trained policy already (policy.pt); pass --force to overwrite it "
                       f"(its log and checkpoints go too), or choose another folder")
    if left == "unfinished":
        raise CliError(f"--out {out}: holds an unfinished training run (checkpoints/latest); continue it with "
                       f"`diffsim-ros {command} --resume {out}`, or pass --force to start afresh there")


def _prepare_out(out: str) -> set:
    try:
        os.makedirs(out, exist_ok=True)
        return {n for n in os.listdir(out)}
    except OSError as exc:
        raise CliError(f"--out {out}: {exc.strerror or exc}") from None


def _training_device(name: str):
    """--device of train/baseline: a torch device whose backend this machine has (CliError otherwise)."""
    import torch

    try:
        return _device(name)
    except CliError as exc:
        if torch.version.cuda is None and name.startswith("cuda"):
            raise CliError(f"{exc}: torch {torch.__version__} is a CPU-only build (install a CUDA build: "
                           f"DIFFSIM_TORCH=cuda scripts/bootstrap.sh, see README)") from None
        raise


class _SharedError(Exception):
    """An error every process of a distributed run met alike, reported by rank 0 already: exit 2."""


def _shared(ctx, message: str) -> Exception:
    """The exception for an error every process meets alike: a CliError in a single process; in a
    distributed run rank 0 prints it, and no process leaves before it has (torchrun stops the others
    as soon as one exits), all exiting with 2."""
    if not ctx.active:
        return CliError(message)
    if ctx.is_main:
        print(f"error: {message}", file=sys.stderr, flush=True)
    ctx.barrier(quiet=True)
    return _SharedError(message)


def _own(ctx, message: str) -> CliError:
    """An error of this process alone, before the processes can talk (its device): named by rank and host."""
    if not ctx.active:
        return CliError(message)
    import socket

    return CliError(f"rank {ctx.rank} on {socket.gethostname()}: {message}")


def _on_every_rank(ctx, fn, source: str):
    """``fn()`` (reading the training file, building the task) in every process; where it fails in
    some, rank 0 reports the failure once (naming ranks and hosts unless all failed alike: a node
    without the file, say) and every process stops."""
    if not ctx.active:
        return fn()
    import socket

    result, msg = None, None
    try:
        result = fn()
    except CliError as exc:
        msg = str(exc)
    except _input_errors() as exc:
        msg = _describe(exc, source)
    seen = ctx.gather_objects((msg, socket.gethostname()))
    failed = [(r, host, m) for r, (m, host) in enumerate(seen) if m is not None]
    if not failed:
        return result
    if len(failed) == ctx.world_size and len({m for _, _, m in failed}) == 1:
        raise _shared(ctx, failed[0][2])
    raise _shared(ctx, "; ".join(f"rank {r} on {host}: {m}" for r, host, m in failed))


def _train_context(args: argparse.Namespace):
    """This process's place in a data-parallel run (torchrun's RANK, WORLD_SIZE, LOCAL_RANK; required
    with --distributed), or the single-process context. A batch the ranks cannot share evenly is
    refused here, before any process waits for the others, when the training file is readable."""
    from diffsim_ros.learning import distributed as ddp

    try:
        ctx = ddp.from_environment(required=args.distributed)
    except ddp.DistributedError as exc:
        raise CliError(str(exc)) from None
    # Rank 0 alone: the others meet it in the trainer, or are stopped by torchrun when rank 0 exits.
    try:
        if ctx.active and ctx.is_main and args.config is not None and os.path.isfile(args.config):
            n = args.num_envs
            if n is None:
                from diffsim_ros import config
                from diffsim_ros.learning.apg import TrainConfig

                try:
                    training = config.load_yaml(args.config).get("training") or {}
                    n = int(training.get("num_envs", TrainConfig.num_envs))
                except Exception:  # noqa: BLE001 - a broken file is reported when it is loaded
                    n = None
            if n is not None:
                ddp.check_divisible(n, ctx.world_size, "--num-envs" if args.num_envs else "training.num_envs")
    except ddp.DistributedError as exc:
        raise CliError(str(exc)) from None
    return ctx


def _resume_folder(args: argparse.Namespace, command: str) -> None:
    """--config and --out, or --resume DIR alone (which then is --out too)."""
    if args.resume is None and (args.config is None or args.out is None):
        raise CliError(f"{command} needs --config YAML and --out DIR (or --resume DIR to continue a run)")
    if args.resume is not None:
        if args.out is not None and os.path.abspath(args.out) != os.path.abspath(args.resume):
            raise CliError(f"--out {args.out} with --resume {args.resume}: a resumed run continues in its own "
                           f"folder; give --resume alone")
        args.out = args.resume


def _train_folder(args: argparse.Namespace):
    """The checks and the listing of train's folder (rank 0's alone in a distributed run): (the stored
    parameters, training file and iterations done of the run resumed, or None; names in the folder
    before the run)."""
    if args.resume is not None:
        if not os.path.isdir(args.resume):
            raise CliError(f"--resume {args.resume}: no such folder")
        from diffsim_ros.training import resume_source

        return resume_source(args.resume), set(os.listdir(args.out))
    _refuse_overwrite(args.out, args.force)
    return None, None


def cmd_train(args: argparse.Namespace) -> int:
    for name in ("iterations", "num_envs"):
        _positive("--" + name.replace("_", "-"), getattr(args, name))
    _resume_folder(args, "train")
    try:
        return _train(args, _train_context(args))
    except _SharedError:        # rank 0 has reported it
        return 2


def _train(args: argparse.Namespace, ctx) -> int:
    """cmd_train after its argument checks, as process ``ctx`` of the run (errors every process meets
    alike are reported by rank 0 alone: :func:`_shared`)."""
    from diffsim_ros.learning import distributed as ddp

    try:
        device = _training_device(args.device)
        device = ddp.rank_device(ctx, device)
        ddp.init(ctx, device)
    except ddp.DistributedError as exc:
        raise _own(ctx, str(exc)) from None
    except CliError as exc:
        raise _own(ctx, str(exc)) from None
    errors = _input_errors()
    source = args.config
    try:
        # rank 0 alone looks at the folder (a node of a multi-node run may have none); the others
        # raise what it raised
        resumed, before = ctx.from_rank0(lambda: _train_folder(args))
        from diffsim_ros.training import train_from_params

        if resumed is not None:
            stored, stored_file, done = resumed
            if args.config is None:       # the run's own parameters
                args.config = source = stored_file
                params, task, model = _on_every_rank(
                    ctx, lambda: _load_training_setup(args, device, params=stored), source)
            else:
                params, task, model = _on_every_rank(ctx, lambda: _load_training_setup(args, device), source)
            if ctx.is_main:
                print(f"train: resuming {args.resume} after iteration {done}", flush=True)
        else:
            params, task, model = _on_every_rank(ctx, lambda: _load_training_setup(args, device), source)
            before = ctx.from_rank0(lambda: _prepare_out(args.out))
        if ctx.active and ctx.is_main:
            print(f"train: data-parallel over {ctx.world_size} processes ({ctx.backend}, {device.type}), "
                  f"each simulating 1/{ctx.world_size} of the environments", flush=True)
        t0 = time.perf_counter()
        overrides = {"iterations": args.iterations, "num_envs": args.num_envs, "seed": args.seed,
                     "stop_at_success": False if args.keep_training else None}
        task, result, _ = train_from_params(params, args.config, args.out, overrides,
                                            progress=not args.no_progress and ctx.is_main, task=task,
                                            resume=args.resume is not None, distributed=ctx)
        wall = time.perf_counter() - t0
    except CliError as exc:         # in a distributed run: what rank 0 met, or every rank alike
        raise _shared(ctx, str(exc)) from None
    except errors as exc:
        raise _shared(ctx, _describe(exc, source or args.out)) from None
    finally:
        ddp.shutdown(ctx)
    if ctx.is_main:
        _summary("train", task, model, result, None, args.out, _written(args.out, before), wall)
    return 0


def cmd_baseline(args: argparse.Namespace) -> int:
    _positive("--timesteps", args.timesteps)
    _resume_folder(args, "baseline")
    if args.resume is not None:
        if not os.path.isdir(args.resume):
            raise CliError(f"--resume {args.resume}: no such folder")
    else:
        _refuse_overwrite(args.out, args.force, "baseline")
    device = _training_device(args.device)
    errors = _input_errors()
    try:
        try:
            from diffsim_ros.learning import ppo
        except ModuleNotFoundError as exc:
            if exc.name == "diffsim_ros.learning.ppo":
                raise CliError("the PPO baseline (diffsim_ros.learning.ppo) is not available in this "
                               "installation") from None
            raise CliError(f"the PPO baseline needs '{exc.name}', which is not installed "
                           f"(pip install stable-baselines3 gymnasium; see requirements.txt)") from None
        import copy

        from diffsim_ros import config
        from diffsim_ros.learning.checkpoint import json_safe, save_checkpoint, training_summary
        from diffsim_ros.training import check_same_run

        state = None
        if args.resume is not None:
            state = ppo.load_resume_state(args.resume)
            info = state.get("run_info") or {}
            if args.config is None:       # the run's own parameters
                if not isinstance(info.get("config"), dict) or not isinstance(info.get("config_file"), str):
                    raise CliError(f"{state['path']}: the resume state does not record its configuration; pass "
                                   f"--config with the training file the run started with")
                args.config = info["config_file"]
                params, task, model = _load_training_setup(args, device, params=copy.deepcopy(info["config"]))
            else:
                params, task, model = _load_training_setup(args, device)
        else:
            params, task, model = _load_training_setup(args, device)
        section = config.section(params, "ppo", args.config)
        for key, val in (("total_timesteps", args.timesteps), ("seed", args.seed)):
            if val is not None:
                section[key] = val
        try:
            cfg = ppo.PPOConfig.from_dict(section)
        except (config.ConfigError, TypeError, ValueError) as exc:
            msg = str(exc)
            raise config.ConfigError(msg if args.config in msg else f"{args.config}: {msg}") from None
        # What a resume is checked against: the parameters as trained (options applied).
        effective = copy.deepcopy(params)
        effective["ppo"] = copy.deepcopy(section)
        run_info = {"config": json_safe(effective), "config_file": os.path.abspath(args.config),
                    "urdf_sha256": task.model.urdf_sha256}
        if state is not None:
            check_same_run(state, run_info)
            print(f"baseline: resuming {args.resume} after iteration {int(state['iteration'])}", flush=True)
        config_extra = {"file": os.path.abspath(args.config), "task": params.get("task")}

        def export(policy, partial, folder, info):
            """checkpoints/latest and checkpoints/best: the final checkpoint's metadata, so far."""
            save_checkpoint(policy, task, folder, extra={
                "training": dict(training_summary(partial, cfg), method="ppo"), "config": config_extra,
                "checkpoint": info})

        before = set(os.listdir(args.out)) if state is not None else _prepare_out(args.out)
        t0 = time.perf_counter()
        result = ppo.train_ppo(task, cfg, out_dir=args.out, progress=not args.no_progress, resume=state,
                               export=export, run_info=run_info)
        wall = time.perf_counter() - t0
        extra = {"training": dict(training_summary(result, cfg), method="ppo"), "config": config_extra}
        save_checkpoint(result.policy, task, args.out, extra=extra)
    except errors as exc:
        raise CliError(_describe(exc, args.config or args.out)) from None
    _summary("baseline (PPO)", task, model, result, cfg, args.out, _written(args.out, before), wall)
    return 0


def _add_training_args(p, what: str, resumable: bool = False) -> None:
    also = " (with --resume: the run's own, else the same file)" if resumable else ""
    p.add_argument("--config", required=not resumable, metavar="YAML",
                   help="training file, e.g. config/reach_arm.yaml (a ROS 2 parameter file with urdf, "
                        "floating_base, dtype, simulator, task, training and ppo sections)" + also)
    p.add_argument("--out", required=not resumable, metavar="DIR",
                   help=f"output folder: policy.pt, policy.json and the {what} log (training.csv, "
                        f"TensorBoard event files); refused when it holds a policy already, unless --force")
    p.add_argument("--force", action="store_true",
                   help="overwrite the policy (and the log) an earlier run left in --out")
    p.add_argument("--device", default="cpu",
                   help="torch device the simulator and the policy run on: cpu, cuda or cuda:N (default: cpu); "
                        "the checkpoint is written for the CPU either way")
    p.add_argument("--seed", type=int, default=None, help="random seed (default: the file's)")
    if resumable:
        p.add_argument("--resume", default=None, metavar="DIR",
                       help=f"continue the {what} run in DIR from checkpoints/latest (exactly as if it had not "
                            f"stopped); refused when DIR holds no such resume state or the configuration differs")
    p.add_argument("--threads", type=int, default=1, metavar="N",
                   help="torch intra-op threads (default: 1; more threads contend on small batches)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


def _add_train(sub) -> None:
    p = sub.add_parser(
        "train", help="train a policy by back-propagation through the simulator and export it",
        description="Read a training file (config/<task>.yaml), build the robot, simulator and task, "
                    "train a policy with analytic gradients through the simulator, and write "
                    "policy.pt (TorchScript), policy.json (metadata), training.csv and "
                    "learning_curve.png into --out. On the way: a row of training.csv and the TensorBoard "
                    "scalars per iteration, and every training.checkpoint_every iterations "
                    "checkpoints/latest/ (with resume.pt, the state --resume continues from) and "
                    "checkpoints/best/ (the best evaluation so far).")
    _add_training_args(p, "training", resumable=True)
    p.add_argument("--iterations", type=int, default=None, metavar="N",
                   help="policy updates (default: the file's training.iterations)")
    p.add_argument("--num-envs", type=int, default=None, metavar="N",
                   help="parallel episodes per iteration (default: the file's training.num_envs)")
    p.add_argument("--keep-training", action="store_true",
                   help="run all the iterations even after the success threshold is reached "
                        "(default: the file's training.stop_at_success)")
    p.add_argument("--distributed", action="store_true",
                   help="require a data-parallel run under torchrun (torchrun --nproc_per_node=N -m "
                        "diffsim_ros.cli train ...; its RANK, WORLD_SIZE and LOCAL_RANK are detected "
                        "without this flag too): each process simulates num_envs / N environments, "
                        "gradients are averaged, rank 0 writes --out")
    p.set_defaults(func=cmd_train)


def _add_baseline(sub) -> None:
    p = sub.add_parser(
        "baseline", help="train the PPO baseline (Stable-Baselines3) on the same task and export it",
        description="Read a training file (config/<task>.yaml) and train PPO (Stable-Baselines3) "
                    "on the same simulator and task with the file's ppo section; write policy.pt, "
                    "policy.json and the training log into --out, and on the way checkpoints/latest/ "
                    "(with resume.pt, which --resume continues from) and checkpoints/best/ every "
                    "ppo.checkpoint_every iterations.")
    _add_training_args(p, "PPO", resumable=True)
    p.add_argument("--timesteps", type=int, default=None, metavar="N",
                   help="environment steps (default: the file's ppo.total_timesteps)")
    p.set_defaults(func=cmd_baseline)


# --------------------------------------------------------------------------- analyze / sysid


def _one_line(text: str) -> str:
    return "; ".join(line.strip() for line in str(text).splitlines() if line.strip())


def _analysis_call(fn, *args, where=None, **kw):
    """Run an analysis function, turning its bad-input errors into CliError (exit 2, one line).
    ``where`` (the bag): any other exception is reported naming it, never as a traceback."""
    from diffsim_ros.analysis import AnalysisError

    errors = (AnalysisError,) + _input_errors()
    try:
        return fn(*args, **kw)
    except errors as exc:
        raise CliError(_one_line(exc)) from None
    except Exception as exc:
        if where is None:
            raise
        raise CliError(_one_line(f"{where}: {type(exc).__name__}: {exc} (unexpected: a damaged bag, or a bug to "
                                 f"report)")) from None


def _int_list(text: str, option: str) -> List[int]:
    try:
        vals = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise CliError(f"{option} must be comma-separated integers, got {text!r}") from None
    if not vals or min(vals) < 1:
        raise CliError(f"{option} must list positive integers, got {text!r}")
    return vals


def cmd_analyze(args: argparse.Namespace) -> int:
    horizons = _int_list(args.horizons, "--horizons")
    _positive("--threads", args.threads)
    import torch

    torch.set_num_threads(args.threads)
    from diffsim_ros.analysis import analyze
    from diffsim_ros.analysis.legged import is_legged_bag, legged_report

    if is_legged_bag(args.bag):
        rep = _analysis_call(legged_report, args.bag, where=args.bag, out_dir=args.out)
        g = rep["gait"] or {}
        print(f"analyze: {rep['bag']} (legged '{rep['robot']}', {rep['duration_s']:.2f} s, {rep['steps']} steps)")
        print(f"  gait {g.get('gait', 'n/a')}, stride frequency {g.get('stride_frequency_hz')} Hz, duty factors "
              f"{g.get('duty_factor')} ({', '.join(rep['feet'])})")
        print(f"  mean forward speed {rep['mean_forward_speed_m_s']:.3f} m/s, lowest base height "
              f"{rep['min_base_height_m']:.3f} m, largest roll/pitch {rep['max_tilt_rad']:.3f} rad")
        print("warning: the sim-vs-real velocity comparison is not implemented for legged bags yet", file=sys.stderr)
        if args.out:
            print(f"files in {args.out}: " + ", ".join(os.path.basename(f) for f in rep["files"].values()))
        return 0
    m = _analysis_call(analyze, args.bag, where=args.bag, out_dir=args.out, config_path=args.config, horizons=horizons,
                       max_starts=args.max_starts, plots=not args.no_plots, state_topic=args.state_topic,
                       command_topic=args.command_topic)
    byh = m["prediction"]["by_horizon"]
    print(f"analyze: {m['bag']} ({m['kind']} '{m['model']['name']}', {m['duration_s']:.2f} s, {m['storage']}; "
          f"model from {m['model']['source']})")
    for t, s in m["topics"].items():
        print(f"  {t:<28} {s['count']:>7} msgs {s['rate_hz']:>9.4g} Hz  jitter {s['jitter_std_s'] * 1e3:.3g} ms  "
              f"drops {s['drops']}  duplicates {s['duplicates']}  out-of-order {s['out_of_order']}")
    hs = m["prediction"]["horizons"]
    rows = [[dof] + [_fmt(byh[str(k)]["per_dof"][dof]["rmse"]) for k in hs]
            + [_fmt(byh[str(hs[0])]["per_dof"][dof]["bias"])] for dof in m["model"]["dofs"]]
    rows.append(["all"] + [_fmt(byh[str(k)]["rmse"]) for k in hs] + [""])
    print("velocity error, predicted - recorded (rad/s or m/s):")
    print(_table(["dof"] + [f"rmse@{k}" for k in hs] + [f"bias@{hs[0]}"], rows))
    for w in m["warnings"] + m["notes"]:
        print(f"warning: {w}", file=sys.stderr)
    tm = m["timing"]
    print(f"time {tm['analysis_s']:.2f} s ({tm['faster_than_real_time']:.1f}x faster than the bag's duration)")
    if args.out:
        print(f"files in {args.out}: " + ", ".join(os.path.basename(f) for f in m.get("files", {}).values()))
    return 0


def cmd_sysid(args: argparse.Namespace) -> int:
    names = [n.strip() for n in args.params.split(",") if n.strip()]
    if not names:
        raise CliError("--params must name at least one parameter")
    _positive("--window", args.window)
    _positive("--threads", args.threads)
    import torch

    torch.set_num_threads(args.threads)
    from diffsim_ros.analysis import calibrate, read_bag, sim_setup, write_calibrated

    data = _analysis_call(read_bag, args.bag, where=args.bag, state_topic=args.state_topic,
                          command_topic=args.command_topic)
    setup = _analysis_call(sim_setup, data, args.config, where=args.bag)

    def progress(n, loss, vals):
        if not args.quiet:
            shown = "  ".join(f"{k}=[{', '.join(f'{x:.4g}' for x in v)}]" for k, v in vals.items())
            print(f"  eval {n:>3}  loss {loss:.5g}  {shown}", flush=True)

    r = _analysis_call(calibrate, data, setup, names, where=args.bag, window=args.window,
                       fit_fraction=args.fit_fraction, max_starts=args.max_starts, max_iter=args.max_iter,
                       progress=progress, velocity_noise=args.velocity_noise)
    files = _analysis_call(write_calibrated, r, setup, args.out, bag=str(args.bag), force=args.write_rejected)
    print(f"sysid: {args.bag} ({r.fit_starts} windows of {r.window} steps to fit, {r.heldout_starts} held out; "
          f"{r.evaluations} evaluations, {r.seconds:.1f} s)")
    rows = [[n, ", ".join(f"{x:.5g}" for x in r.nominal[n]), ", ".join(f"{x:.5g}" for x in r.fitted[n]),
             ", ".join(f"{x:.2g}" for x in r.std.get(n, []))] for n in r.names]
    print(_table(["parameter", "nominal", "calibrated", "std"], rows))
    h = r.heldout
    print(f"held-out velocity RMSE {h['before']['rmse']:.4g} -> {h['after']['rmse']:.4g} "
          f"({h['improvement']:.2f}x smaller)")
    for n in r.notes:
        print(f"warning: {n}", file=sys.stderr)
    print(f"files in {args.out}: " + ", ".join(os.path.basename(f) for f in files.values()))
    if not r.accepted:
        print("sysid: fit rejected: " + "; ".join(r.reasons), file=sys.stderr)
        return 3
    print(f"retrain: diffsim-ros train --config {files['yaml']} --out DIR")
    return 0


def _add_bag_args(p) -> None:
    p.add_argument("bag", metavar="BAG", help="rosbag2 directory (MCAP or sqlite3 storage)")
    p.add_argument("--config", metavar="YAML", default=None,
                   help="training file giving the robot and simulator (default: the bag's /diffsim/metadata)")
    p.add_argument("--state-topic", default=None, metavar="TOPIC",
                   help="state topic (default: /joint_states, else /odom)")
    p.add_argument("--command-topic", default=None, metavar="TOPIC",
                   help="command topic (default: /diffsim/command, else /cmd_ctbr, /cmd_rotor_thrust, "
                        "/<controller>/commands)")
    p.add_argument("--threads", type=int, default=1, metavar="N", help="torch intra-op threads (default: 1)")


def _add_analyze(sub) -> None:
    p = sub.add_parser(
        "analyze", help="compare a bag's recorded velocities with the simulator's, 1 and k steps ahead",
        description="Read a rosbag2 bag (layout of doc/interfaces.md), report the topics' timing (jitter, drops, "
                    "duplicates, out-of-order), replay the recorded commands through the simulator from every "
                    "recorded state 1 and k steps ahead, and report the velocity error per joint or axis (RMSE, "
                    "bias, maximum, growth with the horizon); with --out, write metrics.json, velocity.png, "
                    "error_vs_horizon.png and report.md.")
    _add_bag_args(p)
    p.add_argument("--out", default=None, metavar="DIR", help="output folder (default: print only)")
    p.add_argument("--horizons", default="1,5,10", metavar="K,K,...",
                   help="prediction horizons in control steps (default: 1,5,10)")
    p.add_argument("--max-starts", type=int, default=4096, metavar="N",
                   help="start states of the k > 1 step predictions, evenly spread (default: 4096; one-step "
                        "predictions use every state)")
    p.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    p.set_defaults(func=cmd_analyze)


def _add_sysid(sub) -> None:
    from diffsim_ros.physics.parameters import help_text

    from_params = help_text()
    p = sub.add_parser(
        "sysid", help="calibrate simulator parameters on a bag by gradient descent through the simulator",
        description="Fit simulator parameters to a bag through the differentiable simulator, on the "
                    "velocity error over short multi-step windows of the first part of the bag, judged on the "
                    "rest, all parameters jointly (projected Levenberg-Marquardt in log coordinates, a few starts "
                    "for latency and lags); report uncertainties, unidentifiable parameters and a verdict; write "
                    "sysid.json and sysid.md, and for an accepted fit calibrated.yaml (a training file for "
                    "`diffsim-ros train --config`) and calibrated.urdf when masses, damping or friction change. "
                    "Exit status: 0 accepted, 3 fit rejected (the held-out RMSE did not improve clearly, or the "
                    "residual stays far above the noise floor, or the fit did not converge within twice --max-iter "
                    "iterations; reasons in sysid.md), 2 bad input.")
    _add_bag_args(p)
    p.add_argument("--params", required=True, metavar="NAME,...", help=f"parameters to fit: {from_params}")
    p.add_argument("--out", required=True, metavar="DIR", help="output folder")
    p.add_argument("--window", type=int, default=5, metavar="STEPS",
                   help="control steps per fitting window (default: 5)")
    p.add_argument("--fit-fraction", type=float, default=0.7, metavar="F",
                   help="fraction of the bag (from its start) used to fit; the rest is held out (default: 0.7)")
    p.add_argument("--max-starts", type=int, default=256, metavar="N",
                   help="windows used to fit (and to judge), evenly spread (default: 256)")
    p.add_argument("--max-iter", type=int, default=30, metavar="N",
                   help="Levenberg-Marquardt iterations per start (default: 30)")
    p.add_argument("--velocity-noise", type=float, default=0.0, metavar="STD",
                   help="the sensor's velocity noise (standard deviation, rad/s or m/s) for the verdict's noise "
                        "floor (default: 0)")
    p.add_argument("--write-rejected", action="store_true",
                   help="write calibrated.yaml even for a rejected fit")
    p.add_argument("--quiet", action="store_true", help="no per-evaluation progress")
    p.set_defaults(func=cmd_sysid)


# --------------------------------------------------------------------------- bag


def cmd_bag_repair(args: argparse.Namespace) -> int:
    from diffsim_ros.analysis.bagfile import repair

    report = _analysis_call(repair, args.bag, where=args.bag)
    print(report.summary())
    return 0


def _add_bag(sub) -> None:
    p = sub.add_parser("bag", help="bag maintenance (repair)",
                       description="Maintenance of rosbag2 bags (MCAP storage).")
    bag_sub = p.add_subparsers(dest="bag_command", metavar="SUBCOMMAND", required=True)
    r = bag_sub.add_parser(
        "repair", help="rebuild the index, summary and metadata.yaml of a bag whose recorder was killed",
        description="The equivalent of `ros2 bag reindex`: scan the MCAP file of BAG, keep every complete chunk "
                    "whose CRC holds, write its summary, chunk index and footer, and rewrite metadata.yaml "
                    "(topics, message counts, start, duration) from what the file holds. A complete file is left "
                    "unchanged (metadata.yaml is still rewritten).")
    r.add_argument("bag", metavar="BAG", help="rosbag2 directory (MCAP storage) or .mcap file")
    r.set_defaults(func=cmd_bag_repair)


# --------------------------------------------------------------------------- loop


def _perturbation(text: str) -> dict:
    out = {}
    for item in filter(None, (x.strip() for x in text.split(","))):
        key, sep, val = item.partition("=")
        try:
            out[key.strip()] = float(val)
        except ValueError:
            sep = ""
        if not sep or not key.strip():
            raise CliError(f"--perturb entries are KEY=NUMBER (e.g. mass_scale=1.2,drag_scale=2), got {item!r}")
    return out


def cmd_loop(args: argparse.Namespace) -> int:
    _positive("--threads", args.threads)
    if not args.duration > 0:
        raise CliError(f"--duration must be positive, got {args.duration}")
    from diffsim_ros.loop import DEFAULT_PERTURBATION, LoopError, run_loop
    from diffsim_ros.analysis import AnalysisError

    pert = dict(DEFAULT_PERTURBATION) if args.perturb is None else _perturbation(args.perturb)
    if args.config is None and args.checkpoint is None:
        from diffsim_ros.config import package_share

        share = package_share()
        if share is None or not (share / "config" / "hover.yaml").is_file():
            raise CliError("no --config given and the package's config/hover.yaml was not found")
        args.config = str(share / "config" / "hover.yaml")
    out = args.out or os.path.join("runs", "loop_" + time.strftime("%Y%m%d_%H%M%S", time.gmtime()))
    try:
        targets = None
        if args.target:
            try:
                targets = [[float(x) for x in t.split(",")] for t in args.target]
            except ValueError:
                raise CliError(f"--target takes X,Y,Z in m, got {args.target}") from None
        summary = run_loop(args.config, out, checkpoint=args.checkpoint, duration=args.duration,
                           perturbation=pert, threads=args.threads, iterations=args.iterations,
                           domain=args.domain_id, targets=targets, n_targets=args.targets)
    except (LoopError, AnalysisError) as exc:
        raise CliError(str(exc)) from None
    except _input_errors() as exc:
        raise CliError(_describe(exc, args.config)) from None
    ok = summary.get("task", {}).get("success", True) and not summary.get("lost")
    return 0 if ok else 1


def _add_loop(sub) -> None:
    p = sub.add_parser("loop", help="train, deploy on the MuJoCo stand-in over ROS 2, record a bag, compare",
                       description="The whole loop on the embedded default robot: train a policy by gradients "
                                   "through the simulator, run it with policy_controller on the mujoco_plant "
                                   "stand-in (separate processes over DDS, lockstep), record everything with "
                                   "trajectory_recorder, then print the sim-vs-real analysis of the bag. "
                                   "Exit status 1 when the task fails on the stand-in or a message is missing "
                                   "from the bag.")
    p.add_argument("--config", default=None,
                   help="training YAML (default: with --checkpoint, the robot, simulator and task the checkpoint "
                        "was trained with; else the package's config/hover.yaml, quadrotor hover)")
    p.add_argument("--out", default=None, help="output folder (default: runs/loop_<UTC time>)")
    p.add_argument("--checkpoint", default=None, help="deploy this checkpoint instead of training one")
    p.add_argument("--iterations", type=int, default=None, help="override training.iterations")
    p.add_argument("--duration", type=float, default=4.0,
                   help="simulated seconds on the stand-in (default 4); arms: per target")
    p.add_argument("--target", action="append", default=None, metavar="X,Y,Z",
                   help="arms: a goal point in m (world frame); repeat for several in sequence")
    p.add_argument("--targets", type=int, default=3,
                   help="arms without --target: this many goals drawn from the task's reset distribution (default 3)")
    p.add_argument("--perturb", default=None,
                   help="stand-in perturbation, KEY=VALUE,... (mass_scale, joint_damping_scale, "
                        "added_joint_damping, drag_scale, actuator_lag, latency); default: "
                        "mass_scale=1.1,drag_scale=1.5,actuator_lag=0.03; '' for none")
    p.add_argument("--domain-id", type=int, default=None, help="ROS_DOMAIN_ID (default: a random one, isolated)")
    p.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    p.set_defaults(func=cmd_loop)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="diffsim-ros",
        description="Differentiable rigid-body simulation for ROS 2 robots.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    _add_demo(sub)
    _add_train(sub)
    _add_baseline(sub)
    _add_analyze(sub)
    _add_sysid(sub)
    _add_loop(sub)
    from diffsim_ros import excite   # diffsim-ros excite: an identification motion, recorded

    excite.add_parser(sub, sys.modules[__name__])
    _add_bag(sub)
    from diffsim_ros import evaluation   # diffsim-ros eval (torch loads inside the command)

    evaluation.add_parser(sub, sys.modules[__name__])   # this module (__main__ under python -m): its CliError
    from diffsim_ros import init_config   # diffsim-ros init: a training file for a URDF

    init_config.add_parser(sub, sys.modules[__name__])
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except CliError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
