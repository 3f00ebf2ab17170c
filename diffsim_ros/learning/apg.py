"""Policy training by back-propagation through the differentiable simulator.

Batched rollouts; the task loss of every step flows back through the
integrator, the contact model and the policy (analytic policy gradients).
Back-propagation through time is truncated into windows of ``window`` steps
(the policy is updated after each window and the state is detached), with
gradient-norm clipping, observation normalisation and, optionally, a
short-horizon critic that bootstraps the loss-to-go at the end of each window
(as in SHAC). Domain randomisation draws the physics (mass, centre of mass, servo strength,
lags, drag, the ground) per episode, as inputs of the (compiled) step, the command latency per
episode and the sensor noise per step, and pushes floating bases at random times.

The run's folder (training.csv, TensorBoard, checkpoints/latest and best, the resume state's shared
parts, the random generators' state, the learning curve) is :mod:`.run`'s, shared with the baselines.
"""
from __future__ import annotations

import copy
import dataclasses
import math
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch

from ..physics import ConfigError, SimulationError, Simulator
from ..schema import normalise, option, section
from ..physics.registry import apply_values, rebuild as rebuild_system
from ..tasks import Task
from .distributed import SINGLE, Context, slice_state
from .policy import GaitReference, MLPPolicy, ReferencePolicy, ValueNet
from .run import (COLUMNS, Checkpoints, ResumeError, RunLog, TrainResult, after_row, better, check_same_trainer,
                  clear_run, default_export, evaluation_columns, plot_history, read_resume_file, run_state,
                  set_rng_state)


LR_SCHEDULES = ("constant", "cosine")
RESUME_FORMAT = "diffsim_ros.resume"
RESUME_FORMAT_VERSION = 1


@section("training")
@dataclass(frozen=True)
class TrainConfig:
    """Options of the gradient trainer (the ``training:`` section of a training file)."""

    iterations: int = option(100, "policy-update rounds; each runs num_envs full episodes", low=1)
    num_envs: int = option(64, "parallel environments", low=1)
    window: int = option(32, "truncated-BPTT length", "control steps", low=1)
    learning_rate: float = option(3e-3, "Adam step size", above=0)
    lr_schedule: str = option("constant", """constant, or cosine: the step size falls from learning_rate to
        final_learning_rate along half a cosine over iterations (a large step finds the basin quickly; a small one
        then settles the precision the success metric asks for, where a constant step keeps jittering around
        it)""", choices=LR_SCHEDULES)
    final_learning_rate: float = option(1e-4, "last step size of the cosine schedule", above=0)
    grad_clip: float = option(1.0, "largest gradient norm", above=0)
    hidden: Tuple[int, ...] = option((64, 64), "hidden layer sizes of the policy", low=1)
    normalize_obs: bool = option(True, "running observation normalisation")
    gait_reference: bool = option(False, """the policy's action is a fixed stepping pattern from the task's gait clock
        (gait_period, gait_offsets, gait_duty, swing_height; each foot's height and stride mapped to joint offsets
        through its leg's Jacobian at the stance) plus the network's own, which learns to balance and steer it
        (learning.policy.ReferencePolicy); legged velocity tasks with a gait clock""")
    reference_stride_gain: float = option(1.0, """factor on the reference's stride over the distance the command
        covers in a stance (a position servo tracks a fast stride only in part: solo12's open-loop trot at 0.3 s
        walked half the command at 1, the command at 2)""", low=0)
    critic: bool = option(False, """bootstrap each window's loss-to-go with a learned value (SHAC); the value sees
        the normalised observation and the fraction of the episode elapsed, since a finite episode's loss-to-go
        depends on the time left""")
    gamma: float = option(0.99, "discount of the critic's loss-to-go", low=0, high=1)
    critic_learning_rate: float = option(1e-3, "Adam step size of the critic", above=0)
    critic_updates: int = option(8, "critic fitting steps per window", low=0)
    randomize_mass: Tuple[float, ...] = option((), "[low, high] scale on every link mass and inertia, drawn per "
                                               "episode, or [] (none)", low=0)
    randomize_drag: Tuple[float, ...] = option((), "[low, high] scale on the rotor drag coefficients, or []", low=0)
    randomize_actuator_lag: Tuple[float, ...] = option((), "[low, high] actuator lag, or []", "s", low=0)
    randomize_contact_stiffness: Tuple[float, ...] = option((), """[low, high] ground contact stiffness
        (simulator.contact_stiffness), drawn log-uniformly per episode, or []: a floor or foot softer or harder
        than the model's""", "N/m^2", low=0)
    randomize_contact_damping: Tuple[float, ...] = option((), """[low, high] ground contact damping
        (simulator.contact_damping), drawn log-uniformly per episode, or []""", "N s/m^2", low=0)
    randomize_contact_time_constant: Tuple[float, ...] = option((), """[low, high] time constant of the soft
        ground contact (simulator.contact_time_constant, with contact_model soft), drawn log-uniformly per
        episode, or []""", "s", low=0)
    randomize_contact_damping_ratio: Tuple[float, ...] = option((), """[low, high] damping ratio of the soft
        ground contact (simulator.contact_damping_ratio, with contact_model soft), drawn per episode, or []""",
        low=0)
    randomize_ground_friction: Tuple[float, ...] = option((), """[low, high] Coulomb coefficient of the ground
        (simulator.friction), drawn per episode, or []""", low=0)
    randomize_friction_smoothing: Tuple[float, ...] = option((), """[low, high] slip speed of the ground's
        regularised friction (simulator.friction_smoothing), drawn log-uniformly per episode, or []: a floor
        on which a loaded foot creeps, as on MuJoCo's default soft contact""", "m/s", low=0)
    randomize_com_offset: Tuple[float, ...] = option((), """[low, high] shift of a floating base's centre of mass
        along each of its axes, drawn per episode and axis, or []: a payload or battery off centre""", "m")
    randomize_servo_gain: Tuple[float, ...] = option((), """[low, high] factor on the joint servos' gains kp
        and kd, drawn per episode, or []""", low=0)
    randomize_effort: Tuple[float, ...] = option((), """[low, high] factor on the joints' effort limits, drawn
        per episode, or []: a weaker or stronger motor""", low=0)
    push_speed: Tuple[float, ...] = option((), """[low, high] horizontal speed a push adds to a floating base
        (its direction drawn uniformly), or [] (no pushes): a bump or a kick""", "m/s", low=0)
    push_interval_s: float = option(2.0, """mean time between pushes of one episode (each control step pushes
        with probability dt / push_interval_s)""", "s", above=0)
    randomize_latency: Tuple[float, ...] = option((), """[low, high] command latency drawn per episode, rounded to
        whole physics substeps (dt / substeps), or []: during the first substeps of every control step an episode
        still applies its previous command, as on a robot whose command arrives late (the stand-in's
        perturbation.latency). The training simulator gets simulator.max_latency to match""", "s", low=0)
    sensor_noise: Tuple[float, ...] = option((), """standard deviation of the Gaussian noise on the state the policy
        observes during training, as the stand-in's perturbation.sensor_noise: [position (m, rad; the base
        orientation gets a rotation of that many rad), velocity (m/s, rad/s)], a number for both, or [] (none).
        Drawn afresh every control step; the physics and the loss see the true state""", low=0, broadcast=True)
    eval_every: int = option(5, "iterations between evaluations on fresh episodes (no gradient)", low=1)
    eval_envs: int = option(64, "episodes per evaluation", low=1)
    stop_at_success: bool = option(True, "stop once the evaluation reaches the task's success threshold")
    restart_after: int = option(0, """iterations an attempt gets to reach the task's success threshold (by the
        evaluation) before the run starts again from a freshly initialised policy, optimiser and critic (0: never):
        a gradient descent that got stuck in a local minimum (a quadruped rearing on its hind legs instead of
        jumping) does not leave it, a fresh start usually does not enter it. Needs stop_at_success; env_steps and
        wall_time count every attempt""", low=0)
    seed: int = option(0, "random seed")
    compile_step: bool = option(False, """step through the compiled simulator (physics.compiled.CompiledStep): about
        7x faster an iteration of solo12's locomotion on one CPU thread, after compiling its graphs once (minutes the
        first time, cached on disk after). Randomised parameters (randomize_*) are inputs of the compiled graphs,
        not constants: compiled once, they serve every draw. The soft contact (simulator.contact_model: soft) has no
        compiled step: with it training warns and steps eagerly""")
    max_divergences: int = option(10, """iterations whose simulation diverged (non-finite state or gradient) that
        are dropped and retried from fresh episodes, the policy and optimiser put back to the iteration's start,
        before training gives up""", low=0)
    checkpoint_every: int = option(10, """iterations between checkpoints of a run into a folder:
        checkpoints/latest (the policy now, with the state to resume from) and checkpoints/best (the best
        evaluation so far, ties broken by the lower loss); the last iteration always writes one""", low=1)

    def __post_init__(self):
        noise = self.sensor_noise
        if isinstance(noise, (int, float)) and not isinstance(noise, bool):     # one number: both alike
            object.__setattr__(self, "sensor_noise", [noise, noise])
        normalise(self)

    def check(self) -> None:
        if self.restart_after and not self.stop_at_success:
            raise ConfigError("restart_after needs stop_at_success: true (an attempt ends at the threshold)",
                              "restart_after")
        for k in RANDOMIZED + ("randomize_latency", "push_speed"):
            r = getattr(self, k)
            if r and (len(r) != 2 or not r[0] <= r[1]):
                raise ConfigError(f"must be [low, high] with low <= high, got {list(r)}", k)
        if self.sensor_noise and len(self.sensor_noise) != 2:
            raise ConfigError(f"must be [position, velocity] or one number, got {list(self.sensor_noise)}",
                              "sensor_noise")

    @property
    def randomized(self) -> bool:
        """Whether any physical parameter is drawn per episode."""
        return any(getattr(self, k) for k in RANDOMIZED)

    def learning_rate_at(self, iteration: int) -> float:
        """Adam step size of iteration ``iteration`` (0-based) under ``lr_schedule``."""
        if self.lr_schedule == "constant" or self.iterations <= 1:
            return self.learning_rate
        frac = min(iteration / (self.iterations - 1), 1.0)
        return self.final_learning_rate + 0.5 * (self.learning_rate - self.final_learning_rate) * (
            1.0 + math.cos(math.pi * frac))


#: The domain randomisation options of TrainConfig (the physics, drawn per episode).
RANDOMIZED = ("randomize_mass", "randomize_drag", "randomize_actuator_lag", "randomize_contact_stiffness",
              "randomize_contact_damping", "randomize_ground_friction", "randomize_com_offset",
              "randomize_servo_gain", "randomize_effort", "randomize_friction_smoothing",
              "randomize_contact_time_constant", "randomize_contact_damping_ratio")


def _draw_values(sys, cfg: TrainConfig, gen: torch.Generator, n: int = 1,
                 rows: Optional[slice] = None) -> Dict[str, torch.Tensor]:
    """One iteration's draws of the physical parameters for its ``n`` episodes.

    The draws are per-episode registry values (:mod:`diffsim_ros.physics.registry`, (n, size) each;
    this rank's ``rows`` kept when distributed, so each rank's episodes get what the single process
    would give them): ``mass_scale`` (every link mass and inertia; the controller's model, which
    gravity compensation and the rate loop use, stays nominal, as on a robot), ``com_offset`` (a
    floating base), the actuator or motor time constant (``motor_time_constant`` for rotors,
    ``actuator_lag`` for joints), ``servo_gain_scale`` and ``effort_scale`` (joints),
    ``drag_scale`` (rotors), and with ground contact ``contact_stiffness``, ``contact_damping``
    (log-uniform: they span orders of magnitude; the penalty contact) or ``contact_time_constant``
    (log-uniform) and ``contact_damping_ratio`` (the soft contact), ``ground_friction`` and
    ``friction_smoothing`` (log-uniform).
    """
    dt, dev = sys.model.dtype, sys.model.device

    def draw(r, k=1, log=False):
        lo, hi = (math.log(max(x, 1e-12)) for x in r) if log else r
        x = lo + (hi - lo) * _batch_draw(torch.rand, gen, n, (k,), rows)
        return (torch.exp(x) if log else x).to(dtype=dt, device=dev)
    joints = sys.model.nj > 0 and sys.rotors is None
    penalty = sys.config.ground and sys.config.contact_model == "penalty"
    soft = sys.config.ground and sys.config.contact_model == "soft"
    wanted = [("mass_scale", cfg.randomize_mass, True, {}),
              ("com_offset", cfg.randomize_com_offset, sys.model.floating_base, {"k": 3}),
              ("motor_time_constant" if sys.rotors is not None else "actuator_lag", cfg.randomize_actuator_lag,
               sys.rotors is not None or joints, {}),
              ("servo_gain_scale", cfg.randomize_servo_gain, joints, {}),
              ("effort_scale", cfg.randomize_effort, joints, {}),
              ("drag_scale", cfg.randomize_drag, sys.rotors is not None, {}),
              ("contact_stiffness", cfg.randomize_contact_stiffness, penalty, {"log": True}),
              ("contact_damping", cfg.randomize_contact_damping, penalty, {"log": True}),
              ("contact_time_constant", cfg.randomize_contact_time_constant, soft, {"log": True}),
              ("contact_damping_ratio", cfg.randomize_contact_damping_ratio, soft, {}),
              ("ground_friction", cfg.randomize_ground_friction, sys.config.ground, {}),
              ("friction_smoothing", cfg.randomize_friction_smoothing, sys.config.ground, {"log": True})]
    return {name: draw(r, **kw) for name, r, applies, kw in wanted if r and applies}


def _randomized_sim(nominal: Simulator, cfg: TrainConfig, gen: torch.Generator,
                    rows: Optional[slice] = None) -> Simulator:
    """Return the simulator of one iteration.

    That is ``nominal`` with one draw of the physics of :func:`_draw_values` per episode
    (``parameters.apply_per_episode``). A simulator compiled with those parameters as inputs
    (:func:`_training_sim` with compile_step) keeps its graphs: the draws are passed to them
    (``Simulator.with_values``).
    """
    values = _draw_values(nominal.system, cfg, gen, cfg.num_envs, rows)
    return nominal.with_values(values, per_episode=True)


def _training_sim(nominal: Simulator, cfg: TrainConfig) -> Simulator:
    """Return the simulator training resets its episodes with.

    That is before the per-episode draws of :func:`_randomized_sim`: the nominal one, with
    simulator.max_latency raised to cover ``randomize_latency``'s high end and, with a drawn actuator
    lag the configuration does not have, the lag's state (at the range's high end); with
    compile_step and randomised physics, compiled with the drawn parameters as inputs of its graphs
    rather than constants.
    """
    sys = nominal.system
    c = sys.config
    need = int(round(cfg.randomize_latency[1] / (c.dt / c.substeps))) if cfg.randomize_latency else 0
    compiled = nominal.compiled is True
    if need > c.max_latency:
        sys = rebuild_system(sys, dataclasses.replace(c, max_latency=need))
    drawn = _draw_values(sys, cfg, torch.Generator().manual_seed(0)) if cfg.randomized else {}
    lags = {k: torch.tensor(max(cfg.randomize_actuator_lag[1], 1e-6), dtype=sys.model.dtype)
            for k in ("actuator_lag", "motor_time_constant") if k in drawn}
    if lags:
        sys = apply_values(sys, lags)
    if compiled and drawn:
        return Simulator(sys, compile=True, varying=tuple(drawn))
    return nominal if sys is nominal.system else Simulator(sys, compile=compiled)


def _batch_draw(sample: Callable, gen: torch.Generator, total: int, shape: Tuple[int, ...],
                rows: Optional[slice] = None) -> torch.Tensor:
    """``sample`` (torch.rand or torch.randn) of shape (total,) + ``shape`` in float64.

    Drawn for the whole batch of ``total`` episodes and this rank's ``rows`` kept (all without):
    so each rank's episodes get what the single process would give them.
    """
    x = sample((total,) + tuple(shape), generator=gen, dtype=torch.float64)
    return x if rows is None else x[rows]


def _draw_latency(sim: Simulator, cfg: TrainConfig, n: int, gen: torch.Generator) -> torch.Tensor:
    """Each of ``n`` episodes' latency in whole substeps, uniform over randomize_latency's range."""
    h = sim.config.dt / sim.config.substeps
    low, high = (int(round(x / h)) for x in cfg.randomize_latency)
    drawn = torch.randint(low, high + 1, (n,), generator=gen)
    return drawn.to(dtype=sim.model.dtype, device=sim.model.device)


def make_policy(task: Task, cfg: TrainConfig) -> MLPPolicy:
    """Build a fresh policy for ``task`` as ``cfg`` asks.

    An :class:`MLPPolicy` of ``cfg.hidden``, or with ``cfg.gait_reference`` a
    :class:`ReferencePolicy` stepping through the task's gait clock.
    """
    if not cfg.gait_reference:
        return MLPPolicy(task.obs_dim, task.action_dim, cfg.hidden, normalize=cfg.normalize_obs)
    pattern = getattr(task, "gait_pattern", None)
    if pattern is None:
        raise ConfigError(f"needs a legged task with a gait clock; task '{task.spec()['task']}' has none",
                          "gait_reference")
    try:
        kw = pattern()
    except ValueError as e:
        raise ConfigError(str(e), "gait_reference") from None
    reference = GaitReference(**dict(kw, stride_time=kw["stride_time"] * cfg.reference_stride_gain))
    return ReferencePolicy(task.obs_dim, task.action_dim, reference, cfg.hidden, normalize=cfg.normalize_obs)


def measured(task: Task, ts, noise: Tuple[float, float], gen: torch.Generator, total: Optional[int] = None,
             rows: Optional[slice] = None):
    """``ts`` as the policy measures it.

    Gaussian noise of standard deviation ``noise`` = (position, velocity) on the positions (m, rad;
    a floating base's orientation turned by a random rotation vector of that many rad) and the
    velocities, as the stand-in's perturbation.sensor_noise. Distributed: the noise is drawn for the
    whole batch of ``total`` episodes and this rank's ``rows`` kept, so each rank sees what the
    single process would.
    """
    from ..physics.spatial import quat_exp, quat_mul

    q, v = ts.sim.q, ts.sim.v

    def randn(width):
        return _batch_draw(torch.randn, gen, total or q.shape[0], (width,), rows).to(dtype=q.dtype, device=q.device)
    pos, vel = noise
    if task.model.floating_base:
        quat = quat_mul(q[:, 3:7], quat_exp(pos * randn(3)))
        qn = torch.cat((q[:, 0:3] + pos * randn(3), quat, q[:, 7:] + pos * randn(q.shape[1] - 7)), -1)
    else:
        qn = q + pos * randn(q.shape[1])
    vn = v + vel * randn(v.shape[1])
    return dataclasses.replace(ts, sim=ts.sim.replace(q=qn, v=vn))


def pushed(task: Task, ts, cfg: TrainConfig, gen: torch.Generator, total: int, rows: Optional[slice] = None):
    """``ts`` with some floating bases pushed.

    Each episode, with probability dt / ``push_interval_s`` this control step, gains a horizontal
    velocity of a speed drawn from ``push_speed`` in a direction drawn uniformly (the base's
    body-frame linear velocity changes by that vector turned into its frame). Drawn for the whole
    batch of ``total`` episodes and this rank's ``rows`` kept, as :func:`measured` draws its noise.
    """
    from ..physics.spatial import quat_rotate

    def rand():
        return _batch_draw(torch.rand, gen, total, (), rows).to(dtype=ts.sim.q.dtype, device=ts.sim.q.device)
    hit = (rand() < task.dt / cfg.push_interval_s).to(ts.sim.q.dtype)
    lo, hi = cfg.push_speed
    speed, angle = hit * (lo + (hi - lo) * rand()), 2.0 * math.pi * rand()
    kick = torch.stack((speed * torch.cos(angle), speed * torch.sin(angle), torch.zeros_like(speed)), -1)
    v = ts.sim.v
    inverse = ts.sim.q[:, 3:7] * torch.tensor([-1.0, -1.0, -1.0, 1.0], dtype=v.dtype, device=v.device)
    v = torch.cat((v[:, 0:3] + quat_rotate(inverse, kick), v[:, 3:]), -1)
    return dataclasses.replace(ts, sim=ts.sim.replace(v=v))


def evaluate(task: Task, policy: Callable, episodes: int, seed: int = 12345) -> float:
    """Success rate over fresh episodes (no gradients, no randomisation)."""
    gen = torch.Generator().manual_seed(seed)
    return task.rollout_success(policy, episodes, gen)


@dataclass
class _Learners:
    """The networks a run trains and their optimisers (the critic and its optimiser None without one)."""

    policy: torch.nn.Module
    opt: torch.optim.Optimizer
    critic: Optional[torch.nn.Module] = None
    critic_opt: Optional[torch.optim.Optimizer] = None

    def snapshot(self) -> Tuple[Any, Any, Any, Any]:
        """Copy every state dict (policy, optimiser, critic, critic's optimiser), for :meth:`restore`."""
        return (copy.deepcopy(self.policy.state_dict()), copy.deepcopy(self.opt.state_dict()),
                copy.deepcopy(self.critic.state_dict()) if self.critic is not None else None,
                copy.deepcopy(self.critic_opt.state_dict()) if self.critic is not None else None)

    def restore(self, snapshot: Tuple[Any, Any, Any, Any]) -> None:
        """Every network and optimiser back to the state of ``snapshot``."""
        self.policy.load_state_dict(snapshot[0])
        self.opt.load_state_dict(snapshot[1])
        if self.critic is not None:
            self.critic.load_state_dict(snapshot[2])
            self.critic_opt.load_state_dict(snapshot[3])

    def broadcast(self, dist: Context) -> None:
        """Rank 0's weights of the policy (and critic) copied to every rank."""
        dist.broadcast_module(self.policy)
        if self.critic is not None:
            dist.broadcast_module(self.critic)


@dataclass
class _RunState:
    """Where a run stands.

    Its rows, the iterations done, environment steps, diverged iterations, when it was solved, the
    best evaluation (``{"iteration", "eval_success", "loss"}``), the best policy not yet on disk
    (``(copy of the policy, its iteration)``), the iteration last saved and the one after which the
    current attempt began (restart_after).
    """

    history: List[Dict[str, float]] = dataclasses.field(default_factory=list)
    it: int = 0
    env_steps: int = 0
    diverged: int = 0
    solved_steps: Optional[int] = None
    solved_time: Optional[float] = None
    best: Optional[Dict[str, float]] = None
    pending_best: Optional[Tuple[torch.nn.Module, int]] = None
    last_saved: int = 0
    attempt: int = 0


def _make_learners(task: Task, cfg: TrainConfig) -> _Learners:
    """Build a fresh policy and Adam optimiser for ``task``, in the model's dtype and on its device.

    With ``cfg.critic``, the critic with its own optimiser too.
    """
    dtype, device = task.model.dtype, task.model.device
    policy = make_policy(task, cfg).to(dtype=dtype, device=device)
    opt = torch.optim.Adam(policy.parameters(), lr=cfg.learning_rate)
    if not cfg.critic:
        return _Learners(policy, opt)
    critic = ValueNet(task.obs_dim + 1, cfg.hidden).to(dtype=dtype, device=device)
    return _Learners(policy, opt, critic, torch.optim.Adam(critic.parameters(), lr=cfg.critic_learning_rate))


def _load_initial_weights(policy: torch.nn.Module, init: Dict[str, torch.Tensor]) -> None:
    """``init`` loaded into ``policy``; a ConfigError when one has a gait reference and the other not."""
    ref_mine, ref_theirs = (any(k.startswith("reference.") for k in d) for d in (policy.state_dict(), init))
    if ref_mine != ref_theirs:
        raise ConfigError(f"the starting weights {'have' if ref_theirs else 'have no'} gait reference, this run's "
                          f"is {ref_mine}: train with the setting the checkpoint was trained with",
                          "gait_reference")
    policy.load_state_dict(init)


def _resumed(resume: Dict[str, Any], task: Task, cfg: TrainConfig, net: _Learners, gen: torch.Generator
             ) -> _RunState:
    """Set the networks, optimisers and random generators of ``net`` and ``gen`` from the resume state.

    The state is checked against ``task`` and ``cfg`` first; returns the run's state at its
    checkpoint.
    """
    check_resume_state(resume, task, cfg)
    net.policy.load_state_dict(resume["policy"])
    net.opt.load_state_dict(resume["optimizer"])
    if net.critic is not None:
        net.critic.load_state_dict(resume["critic"])
        net.critic_opt.load_state_dict(resume["critic_optimizer"])
    run = _RunState(history=[dict(row) for row in resume["history"]], it=int(resume["iteration"]),
                    env_steps=int(resume["env_steps"]), diverged=int(resume["diverged"]),
                    solved_steps=resume["solved_env_steps"], solved_time=resume["solved_time"], best=resume["best"])
    set_rng_state(resume["rng"], gen, task.model.device)
    return run


def _save_run(checkpoints: Checkpoints, gen: torch.Generator, net: _Learners, run: _RunState, task: Task,
              cfg: TrainConfig, run_info: Optional[Dict[str, Any]], finished: bool) -> None:
    """Save checkpoints/best and checkpoints/latest with the resume state.

    checkpoints/best only when a better evaluation came since the last save; nothing the run draws
    from its random generators changes.
    """
    critic, critic_opt = net.critic, net.critic_opt
    checkpoints.save_run(gen, run.pending_best, net.policy, run.it, run.history, run.solved_steps, run.solved_time,
                         lambda rng: dict(
        run_state(RESUME_FORMAT, RESUME_FORMAT_VERSION, task, run.it, finished, run.history, run.best,
                  run.solved_steps, run.solved_time, rng, run_info),
        env_steps=run.env_steps, diverged=run.diverged, policy=net.policy.state_dict(), optimizer=net.opt.state_dict(),
        critic=critic.state_dict() if critic is not None else None,
        critic_optimizer=critic_opt.state_dict() if critic is not None else None,
        train_config=dataclasses.asdict(cfg)))
    run.pending_best = None
    run.last_saved = run.it


def _count_divergence(exc: SimulationError, run: _RunState, cfg: TrainConfig, checkpoints: Optional[Checkpoints],
                      save: Callable[[bool], None], dist: Context) -> None:
    """Count a diverged iteration (already rolled back).

    Past ``cfg.max_divergences`` a SimulationError naming the iteration and what is kept on disk (the
    last good state saved first); otherwise a warning that it is retried on fresh episodes.
    """
    run.diverged += 1
    it, diverged = run.it, run.diverged
    if diverged > cfg.max_divergences:
        kept = ""
        if checkpoints is not None:
            if it > 0 and (it > run.last_saved or not checkpoints.has("latest")):
                save(False)
            kept = (f"; the last good state, iteration {it}, is kept in {checkpoints.path('latest')}"
                    if it > 0 else "; no iteration completed, no checkpoint was written")
        raise SimulationError(f"iteration {it + 1}: {exc} (the simulation diverged in {diverged} "
                              f"iterations, more than training.max_divergences = "
                              f"{cfg.max_divergences}){kept}") from None
    if dist.is_main:
        warnings.warn(f"iteration {it + 1}: {exc}; dropped and retried on fresh episodes "
                      f"({diverged} of at most {cfg.max_divergences})", RuntimeWarning)


def _record_row(task: Task, cfg: TrainConfig, policy: torch.nn.Module, run: _RunState, dist: Context,
                loss: float, grad_norm: float, train_success: float, wall_time: float, lr: float,
                keep_best: bool) -> Dict[str, float]:
    """Record the row of the iteration just run; returns the row.

    The row is evaluated every ``cfg.eval_every`` iterations and at the last (the solve and the best
    evaluation noted in ``run``; the best policy copied when ``keep_best``), appended to the
    history, and the iteration counted.
    """
    row = {"iteration": run.it + 1, "env_steps": run.env_steps, "wall_time": wall_time,
           "loss": loss / task.horizon, "grad_norm": grad_norm, "train_success": train_success,
           "eval_success": float("nan"), "eval_at_limit": float("nan"), "eval_over_speed": float("nan"),
           "diverged": run.diverged, "lr": lr}
    if (run.it + 1) % cfg.eval_every == 0 or run.it + 1 == cfg.iterations:
        row.update(dist.from_rank0(lambda: evaluation_columns(task, policy, cfg.eval_envs)))
        if run.solved_steps is None and row["eval_success"] >= task.success_threshold:
            run.solved_steps, run.solved_time = run.env_steps, row["wall_time"]
        if better(row, run.best):
            run.best = {"iteration": run.it + 1, "eval_success": row["eval_success"], "loss": row["loss"]}
            if keep_best:
                run.pending_best = (copy.deepcopy(policy), run.it + 1)
    run.history.append(row)
    run.it += 1
    return row


def _open_run_folder(out_dir: Optional[Path], fresh: bool, history: List[Dict[str, float]], task: Task,
                     cfg: TrainConfig, export) -> Tuple[Optional[RunLog], Optional[Checkpoints]]:
    """Open the run's log (rewritten with ``history``) and checkpoints in ``out_dir``.

    What an earlier run left there is cleared first when the run is ``fresh``; (None, None) without
    a folder.
    """
    if out_dir is None:
        return None, None
    if fresh:
        clear_run(out_dir)
    export = export or default_export(task, cfg, "analytic_gradient")
    return RunLog(out_dir, history), Checkpoints(out_dir, task, export)


def _progress_bar(task: Task, cfg: TrainConfig, it: int):
    """Return a tqdm progress bar over the run's iterations, starting at iteration ``it``."""
    from tqdm import tqdm

    return tqdm(total=cfg.iterations, initial=it, desc=f"train {task.name}", unit="it", leave=False)


def _train_iteration(task: Task, cfg: TrainConfig, net: _Learners, run: _RunState, gen: torch.Generator,
                     dist: Context, sims: Tuple[Simulator, Simulator], t_start: float,
                     on_divergence: Callable[[SimulationError], None], keep_best: bool) -> Optional[Dict[str, float]]:
    """One iteration of :func:`train`.

    The episodes' physics drawn (``sims`` = the training and the nominal simulator), the learning
    rate set, the windows trained (:func:`_iteration`) and the row recorded (:func:`_record_row`),
    which it returns. A diverged iteration is rolled back, passed to ``on_divergence`` and gives
    None.
    """
    train_sim, nominal_sim = sims
    task.sim = train_sim
    drawn = (_randomized_sim(train_sim, cfg, gen, dist.shard(cfg.num_envs) if dist.active else None)
             if cfg.randomized else None)
    lr = cfg.learning_rate_at(run.it)
    for group in net.opt.param_groups:
        group["lr"] = lr
    # A contact-rich episode can diverge in one environment: the iteration is then dropped
    # (policy, optimiser and normaliser back to its start) and retried on fresh episodes.
    snapshot = net.snapshot()
    try:
        ts, total_loss, grad_norm, run.env_steps = _iteration(task, cfg, net.policy, net.opt, net.critic,
                                                              net.critic_opt, gen, run.env_steps, dist, drawn)
    except SimulationError as exc:
        net.restore(snapshot)
        task.sim = nominal_sim
        on_divergence(exc)
        return None
    train_success = float(task.success(ts).to(torch.float64).mean())
    if dist.active:     # the ranks' slices are equal: the mean of their means is the batch's
        total_loss, train_success = dist.mean([total_loss, train_success])
    task.sim = nominal_sim
    return _record_row(task, cfg, net.policy, run, dist, total_loss, grad_norm, train_success,
                       time.perf_counter() - t_start, lr, keep_best)


def _write_run_reports(task: Task, policy: torch.nn.Module, history: List[Dict[str, float]], out_dir: Path) -> None:
    """Write the end of a run in ``out_dir``.

    The learning curve, and for a four-footed robot the footfall diagram and the gait the policy
    uses (tasks/gait.py).
    """
    plot_history(history, out_dir, title=f"{task.name}: gradient through the simulator")
    if getattr(task, "feet", None) and len(task.feet) == 4:
        # Legged: the footfall diagram and the gait the policy uses (tasks/gait.py).
        from ..tasks.gait import write_gait_report

        write_gait_report(task, policy, out_dir)


def train(task: Task, cfg: TrainConfig, out_dir: Optional[Path] = None, progress: bool = True,
          callback: Optional[Callable[[Dict[str, float]], None]] = None, resume: Optional[Dict[str, Any]] = None,
          export: Optional[Callable[..., Any]] = None, run_info: Optional[Dict[str, Any]] = None,
          distributed: Optional[Context] = None, init: Optional[Dict[str, torch.Tensor]] = None) -> TrainResult:
    """Train a policy for ``task``.

    ``out_dir``: the run's folder. ``training.csv`` gets one row per iteration as it ends (flushed),
    TensorBoard event files the same numbers (when ``tensorboard`` is importable; tag = column,
    step = iteration), ``checkpoints/latest/`` and ``checkpoints/best/`` are written every
    ``cfg.checkpoint_every`` iterations and at the end, ``learning_curve.png`` at the end. A fresh
    run (no ``resume``) starts the folder's log anew: the rows, event files and checkpoints of an
    earlier run there are removed. ``callback(row)``: after every iteration (and its checkpoint).

    ``resume``: the state :func:`load_resume_state` read from an earlier run of this task with this
    ``cfg``; training continues from it as if it had never stopped: the same rows and the same
    weights as one uninterrupted run, on the same device and torch build.

    ``export(policy, result, folder, info)`` writes a loadable checkpoint of ``policy`` into
    ``folder`` (``result``: a :class:`TrainResult` of the history so far; ``info``: {"kind": "latest"
    or "best", "iteration": n}); default: :func:`~diffsim_ros.learning.checkpoint.save_checkpoint`
    with the training summary. ``run_info``: plain values (dicts, lists, numbers, strings) kept in
    the resume state as they are, e.g. the caller's configuration to check a resume against.

    A simulation that diverges in more than ``cfg.max_divergences`` iterations stops training with a
    SimulationError naming the iteration and the quantity; with ``out_dir`` the last completed
    iteration is then in ``checkpoints/latest/``.

    ``distributed``: this process's place in a data-parallel run (:mod:`.distributed`, process group
    set up): every rank draws the full batch of ``cfg.num_envs`` episodes and simulates its slice,
    gradients and the logged means are averaged over the ranks, the normaliser sees the whole
    batch, rank 0 evaluates, a divergence on one rank is retried by all; the result equals the
    single-process run's up to rounding. Only rank 0 writes ``out_dir`` (the others ignore it and
    show no progress bar); every rank returns the same result. ``resume`` must then be given to
    every rank. A DistributedError (a ConfigError) when ``cfg.num_envs`` does not split evenly.

    ``init``: the policy's starting weights (a state dict of an :class:`MLPPolicy` of ``cfg.hidden``,
    e.g. :func:`~diffsim_ros.learning.checkpoint.initial_weights` of a trained checkpoint) instead of a
    fresh initialisation; the optimiser starts afresh. A resumed run takes its own weights.
    """
    dist = distributed or SINGLE
    dist.shard(cfg.num_envs)            # refuses a batch the ranks cannot share evenly
    if not dist.is_main:
        out_dir, progress = None, False
    torch.manual_seed(cfg.seed)
    gen = torch.Generator().manual_seed(cfg.seed)
    net = _make_learners(task, cfg)
    soft = task.sim.system.config.contact_model == "soft"
    if cfg.compile_step and soft:
        warnings.warn("compile_step: the soft contact (simulator.contact_model: soft) has no compiled step; "
                      "training steps eagerly", stacklevel=2)
    if cfg.compile_step and not soft and task.sim.compiled is not True:   # the task keeps it (graphs included)
        task.sim = Simulator(task.sim.system, compile=True)
    nominal_sim = task.sim
    train_sim = _training_sim(nominal_sim, cfg)
    run = _RunState()
    if init is not None and resume is None:
        _load_initial_weights(net.policy, init)
    if resume is not None:
        run = _resumed(resume, task, cfg, net, gen)
    run.attempt = _attempt_start(run.history, cfg)   # the iteration the current attempt began after (restart_after)
    # Same seed, same weights on every rank; rank 0's are copied anyway (another build or device
    # could initialise differently).
    net.broadcast(dist)
    # wall_time continues the clock of the run resumed
    t_start = time.perf_counter() - (float(run.history[-1]["wall_time"]) if run.history else 0.0)
    out_dir = Path(out_dir) if out_dir is not None else None
    log, checkpoints = _open_run_folder(out_dir, resume is None, run.history, task, cfg, export)
    run.last_saved = run.it

    def save(finished: bool) -> None:
        """Save this run's checkpoints (:func:`_save_run`)."""
        _save_run(checkpoints, gen, net, run, task, cfg, run_info, finished)

    bar = _progress_bar(task, cfg, run.it) if progress else None
    try:
        while run.it < cfg.iterations:
            row = _train_iteration(task, cfg, net, run, gen, dist, (train_sim, nominal_sim), t_start,
                                   lambda exc: _count_divergence(exc, run, cfg, checkpoints, save, dist),
                                   keep_best=checkpoints is not None)
            if row is None:         # diverged: rolled back, retried on fresh episodes
                continue
            if _restarts_now(run.it, run.attempt, run.solved_steps, cfg):
                run.attempt = run.it
                _fresh_start(task, cfg, run.it, net.policy, net.opt, net.critic, net.critic_opt)
                net.broadcast(dist)
            done = run.it >= cfg.iterations or (cfg.stop_at_success and run.solved_steps is not None)
            after_row(row, run.it, done, cfg.checkpoint_every, log, checkpoints, save, callback, bar, 1)
            if done:
                break
    finally:
        task.sim = nominal_sim
        if bar is not None:
            bar.close()
        if log is not None:
            log.close()
    if out_dir is not None:
        _write_run_reports(task, net.policy, run.history, out_dir)
    return TrainResult(net.policy, run.history, run.solved_steps, run.solved_time)


def _restarts_now(it: int, attempt: int, solved_steps, cfg: TrainConfig) -> bool:
    """Whether the attempt that began after iteration ``attempt`` ends unsolved after iteration ``it``.

    That is restart_after, with iterations left to try again.
    """
    return bool(cfg.restart_after) and solved_steps is None and it - attempt >= cfg.restart_after \
        and it < cfg.iterations


def _attempt_start(history: List[Dict[str, float]], cfg: TrainConfig) -> int:
    """Return the iteration after which the current attempt began.

    The rule of :func:`_restarts_now` replayed over a resumed run's history (0 for a new run; a
    solved run has stopped, so every row before the last is unsolved).
    """
    attempt = 0
    for row in history:
        if _restarts_now(int(row["iteration"]), attempt, None, cfg):
            attempt = int(row["iteration"])
    return attempt


def _fresh_start(task: Task, cfg: TrainConfig, it: int, policy: torch.nn.Module, opt, critic, critic_opt) -> None:
    """Start a new attempt after iteration ``it``.

    The policy (and its observation normaliser) and the critic initialised afresh from a seed of
    their own (``cfg.seed`` and ``it``), the optimisers' moments forgotten.
    """
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(cfg.seed * 1_000_003 + it)
        fresh = make_policy(task, cfg)
        policy.load_state_dict(fresh.to(dtype=task.model.dtype, device=task.model.device).state_dict())
        if critic is not None:
            for m in critic.modules():
                if hasattr(m, "reset_parameters"):
                    m.reset_parameters()
    for o in (opt, critic_opt):
        if o is not None:
            o.state.clear()


# ---------------------------------------------------------------------------- resume (this trainer's state)
def load_resume_state(out_dir) -> Dict[str, Any]:
    """Read the training state of the run in ``out_dir`` (``checkpoints/latest/resume.pt``).

    The ``.old`` copy is read when a kill fell between the two renames that replace it. The state is
    read without unpickling arbitrary objects (``torch.load(weights_only=True)``), tensors on the
    CPU. A folder without one, or an unreadable one, is a :class:`ResumeError` naming the file.
    """
    state = read_resume_file(out_dir, RESUME_FORMAT, RESUME_FORMAT_VERSION, (
        "iteration", "env_steps", "diverged", "finished", "history", "policy", "optimizer", "rng",
        "train_config", "task"))
    # A run saved before a column existed continues with nan there, so training.csv keeps one header.
    state["history"] = [{k: row.get(k, float("nan")) for k in COLUMNS} | {k: v for k, v in row.items()}
                        for row in state["history"]]
    return state


def check_resume_state(state: Dict[str, Any], task: Task, cfg: TrainConfig) -> None:
    """Raise a :class:`ResumeError` unless ``state`` continues a run of ``task`` with ``cfg``.

    The run must have iterations left; the error names what differs.
    """
    where = state.get("path", "resume state")
    # An option added since the run started is taken at its default.
    then = {**dataclasses.asdict(TrainConfig()), **state["train_config"]}
    check_same_trainer(state, task, "training", then, dataclasses.asdict(cfg))
    if state["finished"] or int(state["iteration"]) >= cfg.iterations:
        raise ResumeError(f"{where}: the run already finished (iteration {int(state['iteration'])} of "
                          f"{cfg.iterations}); nothing to resume")


def _iteration(task, cfg, policy, opt, critic, critic_opt, gen, env_steps, dist: Context = SINGLE,
               drawn: Optional[Simulator] = None):
    """One training iteration over ``cfg.num_envs`` fresh episodes.

    Truncated back-propagation every ``cfg.window`` steps. A non-finite gradient is a
    SimulationError (as a non-finite state is): the update it would make is not taken.
    Distributed (``dist``): this rank's slice of the episodes, gradients averaged over the ranks
    before clipping; the returned loss is this rank's (``train`` averages it). ``drawn``: the
    simulator of this iteration's per-episode physics (:func:`_randomized_sim`), which steps the
    episodes once they start (from the states the task's own simulator resets them to, as a robot
    starts from its controller's guess).
    """
    ts = task.reset(cfg.num_envs, gen)
    if cfg.randomize_latency:
        ts.sim = ts.sim.replace(latency=_draw_latency(task.sim, cfg, cfg.num_envs, gen))
    rows = None
    if dist.active:
        rows = dist.shard(cfg.num_envs)
        ts = slice_state(ts, rows)
    if drawn is not None:
        task.sim = drawn
    total_loss = 0.0
    grad_norm = 0.0
    while ts.step < task.horizon:
        k_end = min(cfg.window, task.horizon - ts.step)
        loss = 0.0
        obs_list, loss_list = [], []
        for k in range(k_end):
            obs = task.observe(measured(task, ts, cfg.sensor_noise, gen, cfg.num_envs, rows)
                               if cfg.sensor_noise else ts)
            if cfg.normalize_obs:
                policy.norm.update(dist.gather_batch(obs))
            action = policy(obs)
            ts = dist.agreed(task.step, ts, action)
            if cfg.push_speed and task.model.floating_base:
                ts = pushed(task, ts, cfg, gen, cfg.num_envs, rows)
            step_loss = task.step_loss(ts, action)
            loss = loss + (cfg.gamma ** k if critic is not None else 1.0) * step_loss
            if critic is not None:
                obs_list.append((obs.detach(), ts.step - 1))
                loss_list.append(step_loss.detach())
        env_steps += cfg.num_envs * k_end
        total_loss += float(loss.detach().mean())
        if critic is not None and ts.step < task.horizon:
            loss = loss + (cfg.gamma ** k_end) * critic(_critic_input(policy, cfg, task, task.observe(ts), ts.step))
        objective = loss.mean() / task.horizon
        opt.zero_grad()
        objective.backward()
        dist.average_gradients(policy.parameters())
        grad_norm = float(torch.nn.utils.clip_grad_norm_(policy.parameters(), cfg.grad_clip))
        if not math.isfinite(grad_norm):
            opt.zero_grad()
            raise SimulationError(f"non-finite policy gradient at step {ts.step} "
                                  f"(loss {float(objective.detach()):.4g})")
        opt.step()
        if critic is not None:
            _fit_critic(critic, critic_opt, policy, cfg, obs_list, loss_list, task, ts, dist)
        ts = ts.detach()
    return ts, total_loss, grad_norm, env_steps


def _critic_input(policy, cfg, task, obs, step):
    """Return the value's input: the policy's normalised observation and the elapsed fraction of the episode."""
    x = policy.norm(obs) if cfg.normalize_obs else obs
    return torch.cat((x, torch.full_like(x[..., :1], step / task.horizon)), -1)


def _fit_critic(critic, opt, policy, cfg, obs_list, loss_list, task, ts, dist: Context = SINGLE):
    """Regress V(obs_t, t) on the discounted loss-to-go inside the window, bootstrapped at its end.

    Distributed: on this rank's environments, the gradients averaged over the ranks.
    """
    with torch.no_grad():
        boot = (critic(_critic_input(policy, cfg, task, task.observe(ts), ts.step)) if ts.step < task.horizon
                else torch.zeros_like(loss_list[-1]))
        targets, g = [], boot
        for lk in reversed(loss_list):
            g = lk + cfg.gamma * g
            targets.append(g)
        targets.reverse()
        X = torch.stack([_critic_input(policy, cfg, task, o, t) for o, t in obs_list]).reshape(-1, task.obs_dim + 1)
        Y = torch.stack(targets).reshape(-1)
    for _ in range(cfg.critic_updates):
        opt.zero_grad()
        ((critic(X) - Y) ** 2).mean().backward()
        dist.average_gradients(critic.parameters())
        opt.step()
