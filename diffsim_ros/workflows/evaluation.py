"""Evaluating a trained policy (``diffsim-ros eval``).

Success on fresh episodes with a confidence interval, the ways it fails, and a video of a few
rollouts.

    report = evaluate_checkpoint("policies/reach_arm", episodes=256, seed=2024, video="reach.gif")
    print(format_report(report))             # success, 95 % Wilson interval, failure-mode table
    report.to_dict()                         # what --json writes

The checkpoint's metadata rebuilds robot, simulator and task exactly as the controller
does (``learning.deploy.task_from_metadata``), in the training file's precision; the
episodes are the task's own reset distribution drawn from ``seed`` (default 2024: not the
trainer's evaluation seed, 12345, nor the usual training seed, 0) and the verdict is the
task's own success metric on the final state, as ``learning.apg.evaluate`` computes it.
The simulator's NaN guard is off here, so an episode that diverges is counted instead of
stopping the evaluation.

Failure modes, each counted per episode (an episode counts once per mode, whatever the
number of steps; the modes overlap), from the recorded states of every control step
(the reset state included):

- ``joint_at_limit``: an actuated joint (``simulator.actuated_joints``: the ones the policy
  drives) with finite URDF limits within ``limit_margin`` (rad, or m for prismatic joints;
  default 0.01) of its lower or upper limit, or past it;
- ``over_speed_limit``: an actuated joint faster than its URDF velocity limit (|v| > limit;
  joints whose URDF gives no limit, 0, are not judged);
- ``fall`` (floating base only): the locomotion task's own fall (base below
  ``fall_height`` x base height or tipped past 60 degrees) and, for velocity-command
  locomotion, its strict bounds (base below ``min_height`` x base height, roll or pitch
  beyond ``max_tilt``); for other floating-base robots (the quadrotor) a crash: the base
  below ``ground_height + crash_height`` (default 0.1 m) or upside down;
- ``non_finite``: a NaN or Inf in the positions or velocities.

On the MuJoCo stand-in (``--plant mujoco``, :func:`evaluate_on_standin`): the same episodes (the
simulator evaluation's starts and goals) run on the stand-in, the policy fed the stand-in's
measurement, each judged by the task's verdict on the recorded states (``Task.recorded_verdict``);
the report gives the simulator's and the stand-in's success side by side and their ratio.
``--perturb hardware`` perturbs the stand-in with the imperfections of a real robot of the
checkpoint's kind (``plant.perturbation.PRESETS``).

No rclpy here.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from statistics import NormalDist
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

__all__ = ["DEFAULT_SEED", "DEFAULT_EPISODES", "EvalError", "Rollout", "EvalReport", "wilson_interval", "rollout",
           "failure_modes", "evaluate_task", "load_checkpoint_task", "evaluate_checkpoint", "rollout_video",
           "training_video", "mujoco_scene", "format_report", "evaluate_on_standin",
           "format_standin_report"]

DEFAULT_SEED = 2024
DEFAULT_EPISODES = 256
DEFAULT_VIDEO_EPISODES = 3
MODES = ("joint_at_limit", "over_speed_limit", "fall", "non_finite")
#: analysis.video.RENDERERS, spelled here so that the CLI's --help does not import the analysis package.
RENDERER_CHOICES = ("auto", "mujoco", "matplotlib")
#: The --perturb help of eval and loop: the text form and plant.perturbation.PRESETS, spelled here
#: (plain text) so that the CLI's --help does not import torch; test_perturbation_presets checks it.
PERTURB_HELP = ("[PRESET,]KEY=VALUE,...: the fields of plant.Perturbation (mass_scale, latency, sensor_noise, "
                "actuator_lag, ground_friction_scale, joint_damping_scale, drag_scale, thrust_scale, payload_mass, "
                "...; a list as KEY=[A,B]; a number where the field takes one, e.g. sensor_noise=0.001 for both "
                "entries) and the preset 'hardware' with the values of the checkpoint's robot kind, which fields "
                "after it change (hardware,latency=0.015). hardware: every kind mass_scale=1.1, latency=0.01 "
                "(s); arm: sensor_noise=[0.001,0.01] (rad, rad/s), actuator_lag=0.005 (s, joint torque); legged: the "
                "same and ground_friction_scale=0.7; multirotor: sensor_noise=[0.002,0.02] (m, m/s), "
                "actuator_lag=0.03 (s, rotor speed). default (the loop's when --perturb is not given): "
                "mass_scale=1.1, actuator_lag=0.005 (joints) or 0.03 with drag_scale=1.5 (multirotor). "
                "README.md (Evaluating a checkpoint) says what the values stand for")


class EvalError(ValueError):
    """An evaluation that cannot run as asked (bad episode count, margin, ...)."""


# ---------------------------------------------------------------------------- statistics
def wilson_interval(successes: int, n: int, confidence: float = 0.95) -> Tuple[float, float]:
    """Wilson score interval for a binomial proportion: ``successes`` of ``n`` trials.

    With z the two-sided normal quantile of ``confidence`` (1.96 for 0.95) and p = k/n:
    centre (p + z^2/2n) / (1 + z^2/n), half-width z / (1 + z^2/n) sqrt(p(1-p)/n + z^2/4n^2).
    Unlike the normal approximation it stays inside [0, 1] and is not empty at 0 or n.
    """
    if n < 1:
        raise EvalError(f"a confidence interval needs at least one episode, got n = {n}")
    if not 0 <= successes <= n:
        raise EvalError(f"successes must lie in [0, {n}], got {successes}")
    if not 0 < confidence < 1:
        raise EvalError(f"confidence must lie in (0, 1), got {confidence}")
    z = NormalDist().inv_cdf(0.5 + confidence / 2)
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z / denom * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return max(0.0, centre - half), min(1.0, centre + half)


# ---------------------------------------------------------------------------- rollouts
@dataclass
class Rollout:
    """Recorded episodes.

    ``q`` (T+1, B, nq) and ``v`` (T+1, B, nv) at every control step (float64, CPU, reset state
    first), ``target`` (B, d), the task's ``success`` (B,) bool on the final state, its final
    bookkeeping ``extra``, the control step ``dt`` (s) and the ``seed``.
    """

    q: Any
    v: Any
    target: Any
    success: Any
    extra: Dict[str, Any]
    dt: float
    seed: int

    @property
    def episodes(self) -> int:
        return int(self.q.shape[1])


def rollout(task, policy: Callable, episodes: int, seed: int = DEFAULT_SEED) -> Rollout:
    """Run ``policy`` (obs -> action in [-1, 1]) on ``episodes`` fresh episodes of ``task``, recording every state.

    The resets are drawn from ``seed``, no gradients: the same episodes and the same verdicts as
    ``apg.evaluate(task, policy, episodes, seed)``.
    """
    import torch

    if episodes < 1:
        raise EvalError(f"episodes must be at least 1, got {episodes}")
    gen = torch.Generator().manual_seed(int(seed))
    with torch.no_grad():
        ts = task.reset(int(episodes), gen)
        qs, vs = [ts.sim.q], [ts.sim.v]
        for _ in range(task.horizon):
            ts = task.step(ts, policy(task.observe(ts)))
            qs.append(ts.sim.q)
            vs.append(ts.sim.v)
        success = task.success(ts).to(torch.bool)
    cpu = lambda x: x.detach().to(device="cpu", dtype=torch.float64)  # noqa: E731
    return Rollout(q=cpu(torch.stack(qs)), v=cpu(torch.stack(vs)), target=cpu(ts.target), success=success.cpu(),
                   extra={k: v.detach().cpu() for k, v in ts.extra.items()}, dt=float(task.dt), seed=int(seed))


def _fall(task, roll: Rollout, crash_height: float):
    """(B,) bool per episode and the criterion in words; None for a fixed base."""
    import torch

    from ..physics.spatial import quat_to_matrix, roll_pitch
    from ..tasks.locomotion import LocomotionTask

    if not task.model.floating_base:
        return None, "fixed base"
    q = roll.q
    z = q[..., 2]
    if isinstance(task, LocomotionTask):
        fell = roll.extra["fallen"].to(torch.bool).clone()
        words = (f"base below {task.fall_height:.3g} m or tipped past 60 deg (the task's fall)")
        if task.command_speed:
            r, p = roll_pitch(q[..., 3:7])
            strict = (z < task.min_height) | (r.abs() > task.max_tilt) | (p.abs() > task.max_tilt)
            fell |= strict.any(0)
            words += f"; base below {task.min_height:.3g} m or roll/pitch beyond {task.max_tilt:g} rad (strict)"
        return fell, words
    ground = float(task.sim_config.ground_height)
    up = quat_to_matrix(q[..., 3:7])[..., 2, 2]
    fell = ((z < ground + crash_height) | (up < 0)).any(0)
    return fell, f"base below {ground + crash_height:.3g} m (ground + {crash_height:g} m) or upside down"


def failure_modes(task, roll: Rollout, limit_margin: float = 0.01, crash_height: float = 0.1) -> Dict[str, Any]:
    """Per-episode failure flags of a recorded rollout (see the module doc).

    ``flags`` {mode: (B,) bool tensor or None where the mode does not apply}, ``per_joint`` {mode:
    {joint: episodes}}, ``max_speed_ratio`` {joint: max |v| / limit}, ``criteria`` {mode: words}.
    """
    import torch

    if not limit_margin >= 0:
        raise EvalError(f"limit_margin must be >= 0 (rad or m), got {limit_margin}")
    from ..tasks.base import actuated_limits, has_velocity_limit, joint_limit_flags

    # The joints the policy drives (simulator.actuated_joints): a passive joint resting on its stop
    # (a gripper finger at 0) is no failure of the policy.
    names = list(task.sim.actuated_joints)
    lo, hi, vmax = (x.detach().cpu().to(torch.float64) for x in actuated_limits(task))
    has_lo, has_hi = torch.isfinite(lo), torch.isfinite(hi)
    judged = has_velocity_limit(vmax)
    at_limit, over = joint_limit_flags(task, roll.q, roll.v, limit_margin)                    # (T+1, B, nj)
    vj = roll.v[..., (6 if task.model.floating_base else 0):][..., task.sim.act_index.detach().cpu()]
    at_limit_ep, over_ep = at_limit.any(0), over.any(0)                                     # (B, nj)
    finite = torch.isfinite(roll.q).all(-1) & torch.isfinite(roll.v).all(-1)
    non_finite = (~finite).any(0)
    fall, fall_words = _fall(task, roll, crash_height)
    # A mode that no joint can show (no joints, no finite limits, no URDF velocity limits) is None.
    flags = {"joint_at_limit": at_limit_ep.any(-1) if bool((has_lo | has_hi).any()) else None,
             "over_speed_limit": over_ep.any(-1) if bool(judged.any()) else None,
             "fall": fall, "non_finite": non_finite}
    ratio = {}
    with torch.no_grad():
        speeds = torch.nan_to_num(vj.abs(), nan=0.0, posinf=0.0).amax(dim=(0, 1)) if names else torch.zeros(0)
    for i, n in enumerate(names):
        if bool(judged[i]):
            ratio[n] = float(speeds[i] / vmax[i])
    return {"flags": flags,
            "per_joint": {"joint_at_limit": {n: int(at_limit_ep[:, i].sum()) for i, n in enumerate(names)
                                             if bool(has_lo[i] | has_hi[i])},
                          "over_speed_limit": {n: int(over_ep[:, i].sum()) for i, n in enumerate(names)
                                               if bool(judged[i])}},
            "max_speed_ratio": ratio,
            "criteria": {"joint_at_limit": (f"within {limit_margin:g} rad (m) of a URDF position limit, or past it, "
                                            "at any step") if flags["joint_at_limit"] is not None
                         else "no actuated joint with URDF position limits",
                         "over_speed_limit": "|v| above the URDF velocity limit at any step"
                         if flags["over_speed_limit"] is not None else "no actuated joint with a URDF velocity limit",
                         "fall": fall_words, "non_finite": "NaN or Inf in q or v at any step"}}


# ---------------------------------------------------------------------------- reports
@dataclass
class EvalReport:
    """What an evaluation found (see :meth:`to_dict` for the JSON form)."""

    checkpoint: str
    task: str
    robot: str
    episodes: int
    seed: int
    successes: int
    confidence: float
    interval: Tuple[float, float]
    horizon: int
    dt: float
    failures: Dict[str, Optional[int]]
    failure_details: Dict[str, Any]
    per_episode: List[Dict[str, Any]] = field(default_factory=list)
    video: Optional[Dict[str, Any]] = None

    @property
    def success_rate(self) -> float:
        return self.successes / self.episodes

    def to_dict(self) -> Dict[str, Any]:
        return {"checkpoint": self.checkpoint, "task": self.task, "robot": self.robot, "episodes": self.episodes,
                "seed": self.seed, "horizon_steps": self.horizon, "dt_s": self.dt, "successes": self.successes,
                "success_rate": self.success_rate,
                "confidence_interval": {"level": self.confidence, "method": "wilson",
                                        "low": self.interval[0], "high": self.interval[1]},
                "failures": dict(self.failures), "failure_criteria": self.failure_details["criteria"],
                "failures_per_joint": self.failure_details["per_joint"],
                "max_speed_ratio": self.failure_details["max_speed_ratio"],
                "per_episode": self.per_episode, "video": self.video}


def evaluate_task(task, policy: Callable, episodes: int = DEFAULT_EPISODES, seed: int = DEFAULT_SEED,
                  limit_margin: float = 0.01, crash_height: float = 0.1, confidence: float = 0.95,
                  checkpoint: str = "", robot: Optional[str] = None) -> Tuple[EvalReport, Rollout]:
    """Roll ``policy`` out on ``episodes`` fresh episodes of ``task`` and judge them: (report, rollout)."""
    roll = rollout(task, policy, episodes, seed)
    fm = failure_modes(task, roll, limit_margin, crash_height)
    k = int(roll.success.sum())
    counts = {mode: (None if fm["flags"][mode] is None else int(fm["flags"][mode].sum())) for mode in MODES}
    per = []
    for b in range(roll.episodes):
        per.append({"episode": b + 1, "success": bool(roll.success[b]),
                    **{mode: (None if fm["flags"][mode] is None else bool(fm["flags"][mode][b])) for mode in MODES}})
    report = EvalReport(checkpoint=checkpoint, task=task.name, robot=robot or task.model.name, episodes=roll.episodes,
                        seed=int(seed), successes=k, confidence=confidence,
                        interval=wilson_interval(k, roll.episodes, confidence), horizon=int(task.horizon),
                        dt=float(task.dt), failures=counts, failure_details=fm, per_episode=per)
    return report, roll


def format_report(report: EvalReport) -> str:
    """Format the report as text: the success line, its interval, and the failure-mode table."""
    lo, hi = report.interval
    lines = [f"eval: {report.checkpoint or report.task}: task {report.task} on robot {report.robot}, "
             f"{report.episodes} episodes (seed {report.seed}) of {report.horizon} x {report.dt:g} s",
             f"success         {report.success_rate:.3f} ({report.successes} of {report.episodes}), "
             f"{100 * report.confidence:g} % CI [{lo:.3f}, {hi:.3f}] (Wilson)", ""]
    rows = []
    details = report.failure_details
    for mode in MODES:
        n = report.failures[mode]
        name = mode.replace("_", " ")
        crit = details["criteria"][mode]
        if n is None:
            rows.append([name, "n/a", "", crit])
            continue
        joints = details["per_joint"].get(mode, {})
        hit = ", ".join(f"{j} {c}" for j, c in joints.items() if c)
        rows.append([name, str(n), f"{n / report.episodes:.3f}", crit + (f" [{hit}]" if hit else "")])
    head = ["failure mode", "episodes", "fraction", "criterion"]
    widths = [max(len(head[i]), *(len(r[i]) for r in rows)) for i in range(3)]
    fmt = lambda r: "  ".join((r[0].ljust(widths[0]), r[1].rjust(widths[1]), r[2].rjust(widths[2]), r[3]))  # noqa: E731
    lines += [fmt(head), "  ".join("-" * w for w in widths) + "  " + "-" * len(head[3])]
    lines += [fmt(r).rstrip() for r in rows]
    ratios = details.get("max_speed_ratio") or {}
    if ratios:
        worst = max(ratios, key=lambda j: ratios[j])
        lines.append(f"fastest joint   {worst} at {ratios[worst]:.2f} x its URDF velocity limit")
    if report.video:
        v = report.video
        lines.append(f"video           {v['path']} ({v['frames']} frames, {v['width']}x{v['height']}, "
                     f"{v['fps']:.3g} frames/s, renderer {v['renderer']}"
                     + (f"; MuJoCo unavailable: {v['fallback_reason']}" if v.get("fallback_reason") else "") + ")")
    return "\n".join(lines)


# ---------------------------------------------------------------------------- checkpoints
def _policy_fn(module, device):
    """Wrap an exported (float32, CPU) TorchScript policy in a task-side callable."""
    import torch

    module = module.to(device)

    def act(obs):
        return module(obs.to(device=device, dtype=torch.float32)).to(obs.dtype)
    return act


def load_checkpoint_task(checkpoint: Union[str, os.PathLike], device: str = "cpu"
                         ) -> Tuple[Any, Callable, Dict[str, Any], Dict[str, Any]]:
    """(task, policy, meta, params) of a checkpoint.

    The task is rebuilt from its metadata (the training configuration's precision, float32 when it
    is not recorded) with the NaN guard off; ``policy`` maps the task's observations to actions;
    ``params`` is a parameter mapping the MuJoCo stand-in can read (urdf resolved on this machine,
    floating_base, simulator).
    """
    import torch

    from .. import config
    from ..learning import deploy
    from ..learning.checkpoint import load_checkpoint, load_metadata

    where = os.fspath(checkpoint)
    meta = load_metadata(checkpoint)
    recorded = meta.get("config")
    cfg = recorded if isinstance(recorded, dict) else {}
    dtype = config.torch_dtype(cfg, where, default="float32")
    judged = dict(meta, simulator=dict(meta["simulator"], nan_check=False))
    model, task = deploy.task_from_metadata(judged, where, dtype=dtype)
    policy, meta = load_checkpoint(checkpoint, model=model)      # refuses another robot
    dev = torch.device(device)
    if dev.type != "cpu":
        task = deploy._build_task(judged, where, model.to(device=dev))
    return task, _policy_fn(policy, dev), meta, _standin_params(meta, where)


def _standin_params(meta: Dict[str, Any], where: str) -> Dict[str, Any]:
    """Return the parameters the MuJoCo stand-in reads from a checkpoint's metadata.

    The URDF resolved on this machine, the floating base, the simulator section.
    """
    from ..learning import deploy

    return {"urdf": deploy.resolve_urdf_source(meta, where), "floating_base": bool(meta["robot"]["floating_base"]),
            "simulator": deploy._finite_floats(dict(meta["simulator"]))}


def evaluate_checkpoint(checkpoint: Union[str, os.PathLike], episodes: int = DEFAULT_EPISODES,
                        seed: int = DEFAULT_SEED, device: str = "cpu", video: Optional[str] = None,
                        video_episodes: int = DEFAULT_VIDEO_EPISODES, renderer: str = "auto", width: int = 320,
                        height: int = 240, fps: float = 25.0, limit_margin: float = 0.01,
                        crash_height: float = 0.1) -> EvalReport:
    """Evaluate a checkpoint folder (or its policy.pt / policy.json).

    With ``video`` (a .gif or .mp4 path) also draw its first ``video_episodes`` episodes. Bad input
    raises CheckpointError, EvalError or VideoError naming what is wrong, before anything runs.
    """
    from ..analysis.video import RENDERERS, VideoError, check_video_path

    if episodes < 1:
        raise EvalError(f"episodes must be at least 1, got {episodes}")
    if not limit_margin >= 0:
        raise EvalError(f"the limit margin must be >= 0 (rad or m), got {limit_margin}")
    if video is not None:
        check_video_path(video)
        if renderer not in RENDERERS:
            raise VideoError(f"unknown renderer '{renderer}' (one of {', '.join(RENDERERS)})")
        if video_episodes < 1:
            raise EvalError(f"video episodes must be at least 1, got {video_episodes}")
    task, policy, meta, params = load_checkpoint_task(checkpoint, device)
    report, roll = evaluate_task(task, policy, episodes, seed, limit_margin, crash_height,
                                 checkpoint=os.fspath(checkpoint), robot=meta["robot"]["name"])
    if video is not None:
        report.video = rollout_video(task, roll, video, params, os.fspath(checkpoint),
                                     list(range(min(video_episodes, roll.episodes))), report, renderer, width, height,
                                     fps)
    return report


# ---------------------------------------------------------------------------- on the stand-in
def _measured_qv(plant):
    """(q, v) of the stand-in's measurement (with its sensor noise, if any) in the simulator's convention.

    A floating base's pose (x y z, quaternion x y z w) and body-frame twist come first.
    """
    import numpy as np

    m = plant.measured()
    joints = m if not plant.floating_base else m.joints
    qj = np.zeros(0) if joints is None else np.asarray(joints.position, dtype=np.float64)
    vj = np.zeros(0) if joints is None else np.asarray(joints.velocity, dtype=np.float64)
    if not plant.floating_base:
        return qj, vj
    q = np.concatenate((m.position, m.orientation, qj))
    v = np.concatenate((m.linear_velocity_body, m.angular_velocity, vj))
    return q, v


def standin_episode(plant, runner, q0, v0, target, steps: int, after_step: Optional[Callable[[int], None]] = None):
    """Run one episode of ``runner``'s policy on the stand-in ``plant``; return its states ``q``, ``v`` (steps+1, n).

    The plant starts from ``q0``, ``v0``; at each control step the policy's command is computed from
    the plant's measurement (:func:`_measured_qv`) towards ``target`` (the task's goal, e.g. the
    speed command); ``after_step(k)``, when given, runs after the plant's k-th step (0-based).
    """
    import numpy as np

    plant.reset(q0, v0)
    runner.reset()
    goal = target.reshape(1, -1).to(runner.dtype)
    q, v = [plant.q], [plant.v]
    for k in range(steps):
        plant.step(runner.decide(runner.state(*_measured_qv(plant)), goal, predict=False).command)
        q.append(plant.q)
        v.append(plant.v)
        if after_step is not None:
            after_step(k)
    return np.array(q), np.array(v)


def evaluate_on_standin(checkpoint: Union[str, os.PathLike], episodes: int = 32, seed: int = DEFAULT_SEED,
                        perturbation: Any = None, simulator: bool = True) -> Dict[str, Any]:
    """Run the checkpoint's policy on the MuJoCo stand-in, episode by episode, beside the simulator.

    The stand-in is ``diffsim_ros.plant.MujocoPlant`` (another engine; no ROS); the simulator is the
    one the policy was trained in.

    The episodes are the simulator evaluation's (:func:`evaluate_checkpoint`'s rollout: the task's
    reset distribution drawn from ``seed`` in the training precision): each stand-in episode starts
    from the same state (an arm's joint positions, a legged robot's standing pose, a multirotor's
    pose and twist) with the same goal (a reach target, a setpoint, a speed command). At each
    control step the policy's command (``learning.deploy.PolicyRunner``, as the controller computes
    it) is computed from the stand-in's measurement (its true state, plus the sensor noise of the
    perturbation), and the task's own verdict is judged on the recorded true states
    (``Task.recorded_verdict``: the reach's distance and speed at the end, the quadrotor's tolerance
    after settling, the jump's metric, the legged velocity command's strict metric).

    ``perturbation``: the stand-in's (``plant.Perturbation`` fields), as a mapping, a Perturbation
    or the text form of ``--perturb``, a preset (``hardware``) taking the values of the checkpoint's robot kind
    (``plant.resolve_perturbation``). ``simulator`` False skips the simulator evaluation (the
    episodes are then drawn by the deployed task in float64). Returns the stand-in's success rate
    with its 95 % Wilson interval, per part of the verdict that has one (distance_ok, speed_ok,
    height_ok, ...) how many episodes failed it, and with ``simulator`` the simulator's success on
    the same episodes and the ratio stand-in / simulator (None when the simulator has none).
    """
    import numpy as np
    import torch

    from ..learning.deploy import PolicyRunner
    from ..plant.mujoco_plant import MujocoPlant
    from ..plant.perturbation import PRESET_KEY, perturbation_spec, resolve_perturbation, robot_kind

    if episodes < 1:
        raise EvalError(f"episodes must be at least 1, got {episodes}")
    runner = PolicyRunner(checkpoint)             # validated: another robot's checkpoint is refused
    meta, params = runner.meta, _standin_params(runner.meta, os.fspath(checkpoint))
    task = runner.task
    kind = robot_kind(runner.kind)
    spec = perturbation_spec(perturbation)
    pert = resolve_perturbation(spec, kind)
    with torch.no_grad():
        probe = task.reset(1, torch.Generator().manual_seed(seed))
    if task.recorded_verdict(np.zeros(2), probe.sim.q.repeat(2, 1).double().numpy(),
                             probe.sim.v.repeat(2, 1).double().numpy(), probe.target[0].double().numpy()) is None:
        raise EvalError(f"{os.fspath(checkpoint)}: the '{task.name}' task has no verdict on a recorded episode "
                        "(the stand-in evaluation judges reach, quadrotor tasks, the jump and velocity-command "
                        "locomotion)")
    sim_report = None
    if simulator:
        sim_report, roll = evaluate_task(*load_checkpoint_task(checkpoint)[:2], episodes, seed,
                                         checkpoint=os.fspath(checkpoint), robot=meta["robot"]["name"])
        q0, v0, targets = roll.q[0], roll.v[0], roll.target
    else:
        with torch.no_grad():
            ts = task.reset(episodes, torch.Generator().manual_seed(seed))
        q0, v0, targets = ts.sim.q, ts.sim.v, ts.target
    q0, v0, targets = (x.detach().cpu().double() for x in (q0, v0, targets))
    plant = MujocoPlant(params, source=os.fspath(checkpoint), perturbation=pert)
    verdicts = []
    for i in range(episodes):
        q, v = standin_episode(plant, runner, q0[i].numpy(), v0[i].numpy(), targets[i], int(task.horizon))
        t = np.arange(len(q)) * task.dt
        verdicts.append(task.recorded_verdict(t, q, v, targets[i].numpy()))
    ok = sum(bool(x["success"]) for x in verdicts)
    lo, hi = wilson_interval(ok, episodes)
    failed = {k: sum(1 for x in verdicts if x.get(k) is False) for k in verdicts[0] if k.endswith("_ok")
              or k in ("only_feet_touch", "airborne_at_apex")}
    rep = {"checkpoint": os.fspath(checkpoint), "robot": meta["robot"]["name"], "kind": kind, "plant": "mujoco",
           "preset": spec.get(PRESET_KEY), "perturbation": pert, "episodes": episodes, "seed": seed,
           "successes": ok, "success_rate": ok / episodes, "interval_95": [lo, hi], "failed": failed,
           "verdicts": verdicts}
    if sim_report is not None:
        rate = sim_report.success_rate
        rep["simulator"] = {"successes": sim_report.successes, "success_rate": rate,
                            "interval_95": list(sim_report.interval)}
        rep["ratio"] = (ok / episodes) / rate if rate > 0 else None
    return rep


def format_standin_report(rep: Dict[str, Any]) -> str:
    """Format the stand-in evaluation as text.

    The simulator's and the stand-in's success on the same episodes side by side, their ratio, and
    how many episodes failed each part of the verdict.
    """
    pert = rep["perturbation"]
    words = "none" if not pert else ", ".join(f"{k}={v}" for k, v in pert.items())
    if rep.get("preset"):
        words = f"preset {rep['preset']} for the {rep.get('kind', '')} kind: {words}"
    lines = [f"checkpoint      {rep['checkpoint']} ({rep['robot']})",
             f"plant           the MuJoCo stand-in, perturbation {words}",
             f"episodes        {rep['episodes']} (seed {rep['seed']})"]
    sim = rep.get("simulator")

    def row(name: str, r: Dict[str, Any]) -> str:
        lo, hi = r["interval_95"]
        return (f"{name:<16}{r['success_rate']:.3f}  [{lo:.3f}, {hi:.3f}] (95 % Wilson, {r['successes']} of "
                f"{rep['episodes']})")
    if sim is not None:
        lines.append(row("simulator", sim))
    lines.append(row("stand-in" if sim is not None else "success", rep))
    if sim is not None:
        ratio = rep.get("ratio")
        lines.append(f"{'ratio':<16}" + (f"{ratio:.3f} (stand-in / simulator)" if ratio is not None
                                         else "n/a (no success in the simulator)"))
    for k, n in rep["failed"].items():
        lines.append(f"  failed {k:<16} {n} episode(s)")
    return "\n".join(lines)


# ---------------------------------------------------------------------------- video
def mujoco_scene(params: Dict[str, Any], source: str = ""):
    """Build a :class:`~diffsim_ros.analysis.video.MujocoScene` of the robot of ``params``.

    ``params`` holds urdf, floating_base, simulator. The scene is the MuJoCo stand-in's model of the
    same URDF, with the collision primitives as geoms and a ground plane (drawn only: nothing is
    stepped).
    """
    from ..analysis.video import MujocoScene
    from ..plant.mujoco_plant import MujocoPlant

    sim = dict(params.get("simulator") or {})
    sim["ground"] = True           # the plant adds its geoms (collision primitives) with the ground
    plant = MujocoPlant({"urdf": params["urdf"], "floating_base": params.get("floating_base", False),
                         "simulator": sim}, source)
    return MujocoScene(plant.model, plant.data, lambda q: plant.set_state(q))


def _marks(task, target) -> Tuple[Optional[List[float]], float, str]:
    """(point to draw or None, its radius m, caption) of one episode's goal."""
    from ..tasks import JumpTask, LocomotionTask, QuadrotorTask, ReachTask

    t = [float(x) for x in target.reshape(-1).tolist()]
    xyz = lambda v: "(" + ", ".join(f"{x:.2f}" for x in v) + ")"  # noqa: E731
    if isinstance(task, ReachTask):
        return t, float(task.success_distance), f"target {xyz(t)} m"
    if isinstance(task, QuadrotorTask):
        if task.mode == "velocity":
            return None, 0.0, f"velocity command {xyz(t)} m/s"
        return t, float(task.success_distance), f"{'setpoint' if task.mode == 'hover' else 'waypoint'} {xyz(t)} m"
    if isinstance(task, JumpTask):
        return None, 0.0, f"jump: apex >= {task.min_apex:g} m, feet off"
    if isinstance(task, LocomotionTask):
        if task.command_speed and t:
            return None, 0.0, f"forward speed command {t[0]:.2f} m/s"
        return None, 0.0, f"forward, faster than {task.success_speed:g} m/s"
    return None, 0.0, ""


def rollout_video(task, roll: Rollout, path: Union[str, os.PathLike], params: Optional[Dict[str, Any]] = None,
                  source: str = "", episodes: Sequence[int] = (0, 1, 2), report: Optional[EvalReport] = None,
                  renderer: str = "auto", width: int = 320, height: int = 240, fps: float = 25.0,
                  max_frames: Optional[int] = None) -> Dict[str, Any]:
    """Draw the recorded ``episodes`` (indices) of ``roll`` into ``path`` (.gif or .mp4).

    Returns {path, frames, width, height, fps, renderer, fallback_reason, episodes}. ``params``
    (urdf, floating_base, simulator) lets MuJoCo draw; without it only matplotlib can.
    """
    from ..analysis.video import Episode, render_episodes, save_video

    eps = []
    for b in episodes:
        point, radius, caption = _marks(task, roll.target[b])
        ok = bool(roll.success[b])
        verdict = "success" if ok else "failed"
        if report is not None:
            bad = [m.replace("_", " ") for m in MODES if report.per_episode[b].get(m)]
            if bad:
                verdict += " (" + ", ".join(bad) + ")"
        eps.append(Episode(q=roll.q[:, b].numpy(), target=point, target_radius=radius, caption=caption,
                           verdict=verdict, ok=ok, label=f"episode {b + 1}"))
    scene = None if params is None else (lambda: mujoco_scene(params, source))
    ground = float(task.sim_config.ground_height) if tuple(task.sim_config.ground_normal) == (0.0, 0.0, 1.0) else None
    out = render_episodes(task.model, eps, roll.dt, renderer=renderer, width=width, height=height, fps=fps,
                          max_frames=max_frames, mujoco_scene=scene, ground_height=ground)
    written = save_video(path, out.frames, out.fps)
    h, w = out.frames[0].shape[:2]
    return {"path": str(written), "frames": len(out.frames), "width": int(w), "height": int(h), "fps": out.fps,
            "renderer": out.renderer, "fallback_reason": out.fallback_reason, "episodes": [b + 1 for b in episodes]}


def training_video(task, policy: Callable, params: Dict[str, Any], out_dir: Union[str, os.PathLike],
                   source: str = "", name: str = "rollout.gif", episodes: int = 1, width: int = 160,
                   height: int = 120, max_frames: int = 40) -> Path:
    """Draw the small video ``diffsim-ros train`` writes beside learning_curve.png.

    It shows ``episodes`` fresh episodes (seed DEFAULT_SEED) of the final ``policy``, at most
    ``max_frames`` frames of ``width`` x ``height`` pixels (default 1 episode, 40 frames,
    160 x 120).
    """
    roll = rollout(task, policy, episodes, DEFAULT_SEED)
    path = Path(os.fspath(out_dir)) / name
    info = rollout_video(task, roll, path, params, source, list(range(episodes)), None, "auto", width, height,
                         25.0, max_frames)
    return Path(info["path"])
