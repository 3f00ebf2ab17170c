"""``diffsim-ros train`` and ``diffsim-ros baseline``: training a policy.

``train`` trains a policy by gradients through the simulator, single-process or data-parallel under
torchrun, resumable; ``baseline`` trains the PPO or SAC baseline on the same task.
"""
from __future__ import annotations

import argparse
import math
import os
import sys
import time
import warnings

from diffsim_ros.workflows.training import print_summary, written_files

from .common import CliError, _command, _describe, _device, _input_errors, _positive, _text, _threads


def _load_training_setup(args: argparse.Namespace, device="cpu", params=None):
    """(params, task, model) of ``--config`` (or of ``params``, read from ``args.config``).

    The task and model are on ``device``, with bad input turned into CliError.
    """
    if params is None and not os.path.isfile(args.config):
        raise CliError(f"{args.config}: no such file")
    _threads(args.threads)
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


def _refuse_overwrite(out: str, force: bool, command: str = "train") -> None:
    """--out must not hold a policy or an unfinished run already, unless --force."""
    from diffsim_ros.workflows.training import occupied

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
    """Return the exception for an error every process meets alike.

    A CliError in a single process; in a distributed run rank 0 prints it, and no process leaves
    before it has (torchrun stops the others as soon as one exits), all exiting with 2.
    """
    if not ctx.active:
        return CliError(message)
    if ctx.is_main:
        print(f"error: {message}", file=sys.stderr, flush=True)
    ctx.barrier(quiet=True)
    return _SharedError(message)


def _own(ctx, message: str) -> CliError:
    """Return an error of this process alone, before the processes can talk (its device): named by rank and host."""
    if not ctx.active:
        return CliError(message)
    import socket

    return CliError(f"rank {ctx.rank} on {socket.gethostname()}: {message}")


def _on_every_rank(ctx, fn, source: str):
    """Run ``fn()`` (reading the training file, building the task) in every process.

    Where it fails in some, rank 0 reports the failure once (naming ranks and hosts unless all
    failed alike: a node without the file, say) and every process stops.
    """
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
    """Return this process's place in a data-parallel run, or the single-process context.

    The place comes from torchrun's RANK, WORLD_SIZE, LOCAL_RANK (required with --distributed). A
    batch the ranks cannot share evenly is refused here, before any process waits for the others,
    when the training file is readable.
    """
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
    """Check and list train's folder (rank 0's alone in a distributed run).

    Returns the stored parameters, training file and iterations done of the run resumed, or None;
    and the names in the folder before the run.
    """
    if args.resume is not None:
        if not os.path.isdir(args.resume):
            raise CliError(f"--resume {args.resume}: no such folder")
        from diffsim_ros.workflows.training import resume_source

        return resume_source(args.resume), set(os.listdir(args.out))
    _refuse_overwrite(args.out, args.force)
    return None, None


def cmd_train(args: argparse.Namespace) -> int:
    for name in ("iterations", "num_envs"):
        _positive("--" + name.replace("_", "-"), getattr(args, name))
    if args.learning_rate is not None and not (math.isfinite(args.learning_rate) and args.learning_rate > 0):
        raise CliError(f"--learning-rate must be a positive number, got {args.learning_rate}")
    _resume_folder(args, "train")
    if args.init_from is not None:
        if args.resume is not None:
            raise CliError("--init-from with --resume: a resumed run continues from its own weights; give one")
        if not os.path.isdir(args.init_from):
            raise CliError(f"--init-from {args.init_from}: no such folder (a checkpoint folder with policy.json "
                           f"and policy.pt)")
    try:
        return _train(args, _train_context(args))
    except _SharedError:        # rank 0 has reported it
        return 2


def _train(args: argparse.Namespace, ctx) -> int:
    """cmd_train after its argument checks, as process ``ctx`` of the run.

    Errors every process meets alike are reported by rank 0 alone (:func:`_shared`).
    """
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
        from diffsim_ros.workflows.training import train_from_params

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
        if args.learning_rate is not None:
            overrides.update(learning_rate=args.learning_rate, lr_schedule="constant")
        task, result, _ = train_from_params(params, args.config, args.out, overrides,
                                            progress=not args.no_progress and ctx.is_main, task=task,
                                            resume=args.resume is not None, distributed=ctx,
                                            init_from=args.init_from)
        wall = time.perf_counter() - t0
        # Every rank leaves the process group together, once rank 0 has written the run: a rank
        # tearing its group down while another still holds its connections can abort the process
        # (gloo, seen once in CI on the rank that had finished first).
        ctx.barrier()
    except CliError as exc:         # in a distributed run: what rank 0 met, or every rank alike
        raise _shared(ctx, str(exc)) from None
    except errors as exc:
        raise _shared(ctx, _describe(exc, source or args.out)) from None
    finally:
        ddp.shutdown(ctx)
    if ctx.is_main:
        print_summary("train", task, model, result, args.out, written_files(args.out, before), wall)
    return 0


#: --algo of `diffsim-ros baseline`: (the training file's section and module, the name printed, the config class,
#: the trainer).
BASELINES = {"ppo": ("PPO", "PPOConfig", "train_ppo"), "sac": ("SAC", "SACConfig", "train_sac")}


def _baseline_algo(args: argparse.Namespace) -> str:
    """--algo, or with --resume and no --algo the run's own (checkpoints/latest/policy.json), else ppo."""
    if args.algo is not None:
        return args.algo
    if args.resume is not None:
        from diffsim_ros.learning.baseline import run_method

        method = run_method(args.resume)
        if method in BASELINES:
            return method
    return "ppo"


def cmd_baseline(args: argparse.Namespace) -> int:
    _positive("--timesteps", args.timesteps)
    _resume_folder(args, "baseline")
    if args.resume is not None:
        if not os.path.isdir(args.resume):
            raise CliError(f"--resume {args.resume}: no such folder")
    else:
        _refuse_overwrite(args.out, args.force, "baseline")
    algo = _baseline_algo(args)
    name, config_class, trainer = BASELINES[algo]
    device = _training_device(args.device)
    errors = _input_errors()
    try:
        try:
            import importlib

            module = importlib.import_module(f"diffsim_ros.learning.{algo}")
        except ModuleNotFoundError as exc:
            if exc.name == f"diffsim_ros.learning.{algo}":
                raise CliError(f"the {name} baseline (diffsim_ros.learning.{algo}) is not available in this "
                               f"installation") from None
            raise CliError(f"the {name} baseline needs '{exc.name}', which is not installed "
                           f"(pip install stable-baselines3 gymnasium; see requirements.txt)") from None
        import copy

        from diffsim_ros import config
        from diffsim_ros.learning.checkpoint import json_safe, save_checkpoint, training_summary
        from diffsim_ros.workflows.training import check_same_run

        state = None
        if args.resume is not None:
            state = module.load_resume_state(args.resume)
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
        section = config.section(params, algo, args.config)
        for key, val in (("total_timesteps", args.timesteps), ("seed", args.seed)):
            if val is not None:
                section[key] = val
        try:
            cfg = getattr(module, config_class).from_mapping(section)
        except (config.ConfigError, TypeError, ValueError) as exc:
            msg = str(exc)
            raise config.ConfigError(msg if args.config in msg else f"{args.config}: {msg}") from None
        # What a resume is checked against: the parameters as trained (options applied).
        effective = copy.deepcopy(params)
        effective[algo] = copy.deepcopy(section)
        run_info = {"config": json_safe(effective), "config_file": os.path.abspath(args.config),
                    "urdf_sha256": task.model.urdf_sha256}
        if state is not None:
            check_same_run(state, run_info)
            print(f"baseline: resuming the {name} run {args.resume} after iteration {int(state['iteration'])}",
                  flush=True)
        config_extra = {"file": os.path.abspath(args.config), "task": params.get("task")}

        def export(policy, partial, folder, info):
            """checkpoints/latest and checkpoints/best: the final checkpoint's metadata, so far."""
            save_checkpoint(policy, task, folder, extra={
                "training": dict(training_summary(partial, cfg), method=algo), "config": config_extra,
                "checkpoint": info})

        before = set(os.listdir(args.out)) if state is not None else _prepare_out(args.out)
        t0 = time.perf_counter()
        result = getattr(module, trainer)(task, cfg, out_dir=args.out, progress=not args.no_progress, resume=state,
                                          export=export, run_info=run_info)
        wall = time.perf_counter() - t0
        extra = {"training": dict(training_summary(result, cfg), method=algo), "config": config_extra}
        save_checkpoint(result.policy, task, args.out, extra=extra)
    except errors as exc:
        raise CliError(_describe(exc, args.config or args.out)) from None
    print_summary(f"baseline ({name})", task, model, result, args.out, written_files(args.out, before), wall)
    return 0


def _add_training_args(p, what: str, resumable: bool = False) -> None:
    also = " (with --resume: the run's own, else the same file)" if resumable else ""
    p.add_argument("--config", required=not resumable, metavar="YAML",
                   help="training file, e.g. config/reach_arm.yaml (a ROS 2 parameter file with urdf, "
                        "floating_base, dtype, simulator, task, training, ppo and sac sections)" + also)
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
    p = _command(sub, "train", cmd_train,
                 help="train a policy by back-propagation through the simulator and export it",
                 description="""Read a training file (config/<task>.yaml), build the robot, simulator and task,
                 train a policy with analytic gradients through the simulator, and write policy.pt (TorchScript),
                 policy.json (metadata), training.csv and learning_curve.png into --out. On the way: a row of
                 training.csv and the TensorBoard scalars per iteration, and every training.checkpoint_every
                 iterations checkpoints/latest/ (with resume.pt, the state --resume continues from) and
                 checkpoints/best/ (the best evaluation so far).""")
    _add_training_args(p, "training", resumable=True)
    p.add_argument("--iterations", type=int, default=None, metavar="N",
                   help="policy updates (default: the file's training.iterations)")
    p.add_argument("--num-envs", type=int, default=None, metavar="N",
                   help="parallel episodes per iteration (default: the file's training.num_envs)")
    p.add_argument("--init-from", default=None, metavar="DIR",
                   help=_text("""start from the policy of a trained checkpoint folder instead of fresh weights
                   (fine-tuning, e.g. on a calibrated simulator: the same joints, task and observation, the same
                   hidden layers; the URDF's values may differ); the optimiser starts afresh"""))
    p.add_argument("--learning-rate", type=float, default=None, metavar="LR",
                   help=_text("""a constant Adam step size for this run instead of the file's training.learning_rate
                   and lr_schedule, e.g. for a fine-tune with --init-from: near its optimum a policy can meet a
                   consistent gradient, along which Adam's steps are as large as along a noisy one and overshoot
                   (doc/train.md)"""))
    p.add_argument("--keep-training", action="store_true",
                   help="run all the iterations even after the success threshold is reached "
                        "(default: the file's training.stop_at_success)")
    p.add_argument("--distributed", action="store_true",
                   help=_text("""require a data-parallel run under torchrun (torchrun --nproc_per_node=N -m
                   diffsim_ros.cli train ...; its RANK, WORLD_SIZE and LOCAL_RANK are detected without this flag
                   too): each process simulates num_envs / N environments, gradients are averaged, rank 0 writes
                   --out"""))


def cmd_distill(args: argparse.Namespace) -> int:
    """diffsim-ros distill: a student on the training file's observation, taught by --teacher."""
    for name in ("iterations", "episodes"):
        _positive("--" + name, getattr(args, name))
    if not os.path.isdir(args.teacher):
        raise CliError(f"--teacher {args.teacher}: no such folder (a checkpoint folder with policy.json and policy.pt)")
    _refuse_overwrite(args.out, args.force, "distill")
    errors = _input_errors()
    try:
        params, task, model = _load_training_setup(args)
        import torch

        from diffsim_ros.config import section
        from diffsim_ros.learning.apg import TrainConfig
        from diffsim_ros.learning.checkpoint import json_safe, load_checkpoint, save_checkpoint
        from diffsim_ros.learning.deploy import task_from_metadata
        from diffsim_ros.learning.distill import DistillConfig, distill

        teacher, meta = load_checkpoint(args.teacher, model=model)        # refuses another robot
        _, teacher_task = task_from_metadata(meta, args.teacher, dtype=model.dtype)
        if list(meta["robot"]["actuated_joints"]) != list(task.sim.actuated_joints):
            raise CliError(f"--teacher {args.teacher}: its actions drive {meta['robot']['actuated_joints']}, the "
                           f"training file's {list(task.sim.actuated_joints)}")
        # The student's network, sensor noise and seed are the training file's (its schema, checked).
        training = TrainConfig.from_mapping(section(params, "training", args.config), "training")
        hidden = tuple(training.hidden)
        cfg = DistillConfig(iterations=args.iterations, episodes=args.episodes, sensor_noise=training.sensor_noise,
                            seed=training.seed if args.seed is None else args.seed)
        torch.set_num_threads(args.threads)
        t0 = time.perf_counter()
        try:
            student, history = distill(task, teacher, teacher_task, hidden, cfg, progress=print)
        except ValueError as exc:
            raise CliError(f"--teacher {args.teacher}: {exc}") from None
        wall = time.perf_counter() - t0
        last = history[-1]
        summary = {"method": "distillation", "teacher": os.path.abspath(args.teacher),
                   "iterations": len(history), "env_steps": int(last["samples"]), "wall_time": wall,
                   "final_eval_success": last["eval_success"], "history": history}
        save_checkpoint(student, task, args.out, extra={"training": json_safe(summary), "config": json_safe(params),
                                                        "config_file": os.path.abspath(args.config)})
    except errors as exc:
        raise CliError(_describe(exc, args.config)) from None
    tracked = (f" (tracking the command upright, gait rules aside: {last['eval_tracking']:.2f})"
               if "eval_tracking" in last else "")
    print(f"distill: student on '{task.name}' ({task.obs_dim} observations) alone on fresh episodes: success "
          f"{last['eval_success']:.2f}{tracked}, {wall:.0f} s; written to {args.out} (fine-tune it: diffsim-ros "
          f"train --config {args.config} --init-from {args.out} --out DIR)")
    return 0


def _add_distill(sub) -> None:
    p = _command(sub, "distill", cmd_distill,
                 help="teach a policy on the training file's observation from a trained teacher (DAgger)",
                 description="""A student policy on the training file's task and observation (e.g. a legged
                 robot's IMU and encoders, task.observation robot) learns the actions of --teacher, a checkpoint for
                 the same robot trained on another observation (e.g. privileged), on the states it visits itself
                 (DAgger). Writes policy.pt and policy.json into --out; fine-tune the student with diffsim-ros train
                 --init-from.""")
    p.add_argument("--config", required=True, metavar="YAML", help="the student's training file")
    p.add_argument("--teacher", required=True, metavar="DIR", help="the teacher's checkpoint folder")
    p.add_argument("--out", required=True, metavar="DIR", help="output folder for the student's checkpoint")
    p.add_argument("--force", action="store_true", help="overwrite a policy an earlier run left in --out")
    p.add_argument("--iterations", type=int, default=6, metavar="N", help="DAgger rounds (default 6)")
    p.add_argument("--episodes", type=int, default=64, metavar="N", help="fresh episodes per round (default 64)")
    p.add_argument("--seed", type=int, default=None, help="random seed (default: the file's training.seed)")
    p.add_argument("--threads", type=int, default=1, metavar="N", help="torch intra-op threads (default: 1)")


def _add_baseline(sub) -> None:
    p = _command(sub, "baseline", cmd_baseline,
                 help="train an RL baseline (Stable-Baselines3 PPO or SAC) on the same task and export it",
                 description="""Read a training file (config/<task>.yaml) and train PPO or SAC (Stable-Baselines3,
                 --algo) on the same simulator and task with the file's ppo or sac section; write policy.pt,
                 policy.json and the training log into --out, and on the way checkpoints/latest/ (with resume.pt,
                 which --resume continues from) and checkpoints/best/ every ppo.checkpoint_every
                 (sac.checkpoint_every) iterations.""")
    _add_training_args(p, "baseline", resumable=True)
    p.add_argument("--algo", choices=sorted(BASELINES), default=None,
                   help="ppo (on-policy, the default) or sac (off-policy, replay buffer); with --resume: the "
                        "run's own")
    p.add_argument("--timesteps", type=int, default=None, metavar="N",
                   help="environment steps (default: the file's ppo.total_timesteps or sac.total_timesteps)")
