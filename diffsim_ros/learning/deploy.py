"""Running a trained checkpoint on measured robot states, without ROS.

    runner = PolicyRunner("policies/hover")                 # refuses another robot (urdf=...)
    out = runner.quadrotor(position, orientation_xyzw, body_linear_velocity, body_angular_velocity)
    out.command        # (n,) float64 numpy, the simulator's interface (runner.command_names / units), clamped
    out.predicted      # physics.State one control step later (one Simulator.step, no grad)

    out = PolicyRunner("policies/reach_arm").arm(names, positions, velocities, target=(0.3, 0.1, 0.4))

The runner rebuilds everything the policy was trained with from the checkpoint's
metadata alone: the model (the URDF it names, or the one given, checked by
sha256), the simulator (``simulator``), the task (its own export,
``command.task_parameters``, else the stored training config's ``task``). The observation
is the task's own ``observe`` and the command the task's own ``command``, so the
deployed policy sees exactly what it saw in training.

Safety: every command is clamped to the limits of the robot the checkpoint was
made for (URDF effort, position range and velocity limits of the actuated
joints; rotor thrust in [0, max] per rotor, or collective thrust in
[0, n max] for CTBR, body rates within the task's ``max_rate``). Position
commands are not rate-limited: an absolute-position policy is trained to jump
its targets across the range, and the PD actuator and the URDF effort limit
bound what that does.

The simulator's internal actuator state (rotor speeds, lagged torque, command
delay line) is not measured on a robot; the runner carries it from one
prediction to the next (an open-loop estimate), starting from the simulator's
``initial_state`` (hover speed / zero) and after :meth:`PolicyRunner.reset`.

No rclpy here: nodes convert messages to the plain arrays these methods take.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Optional, Sequence, Tuple, Union

import numpy as np
import torch

from .. import physics
from ..physics import SimConfig, Simulator, State
from ..tasks import make_task
from ..tasks.base import TaskState
from .checkpoint import CheckpointError, load_checkpoint, load_metadata, robot_kind

__all__ = ["PolicyRunner", "Decision", "StateError", "ARM", "QUADROTOR", "LEGGED", "task_from_metadata"]

#: Robot kinds: fixed base (joint states), floating base with rotors (odometry), floating base
#: with actuated joints and no rotors (odometry and joint states).
ARM, QUADROTOR, LEGGED = "arm", "quadrotor", "legged"


class StateError(ValueError):
    """A measured state the policy cannot use (missing joint, NaN/Inf, zero quaternion, ...)."""


@dataclass
class Decision:
    """One policy step.

    ``command`` (simulator interface, clamped, float64 numpy), ``action`` (the raw policy output in
    [-1, 1]), ``clamped`` (True if a limit changed the command), ``state`` (the simulator state it
    was computed from) and ``predicted`` (one step later), or None when the runner was asked not to
    predict.
    """

    command: np.ndarray
    action: np.ndarray
    clamped: bool
    state: State
    predicted: Optional[State]


def _finite_floats(x: Any) -> Any:
    """Undo json_safe's non-finite strings inside simulator parameters."""
    if isinstance(x, str) and x in ("inf", "-inf", "nan"):
        return float(x)
    if isinstance(x, dict):
        return {k: _finite_floats(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_finite_floats(v) for v in x]
    return x


#: Task parameters whose default changed, with the value a checkpoint that does not record them
#: was made with: legged policies observed the simulator's full state before ``observation``.
FORMER_DEFAULTS = {"locomotion": {"observation": "privileged"}, "jump": {"observation": "privileged"}}


def _task_spec(meta: Dict[str, Any], where: str) -> Dict[str, Any]:
    """Return the ``task:`` mapping that rebuilds the checkpoint's task.

    The task's own export (``command.task_parameters``, Task.export_parameters), else the stored
    training config's; a parameter it does not record takes the value it had when the checkpoint
    was made (:data:`FORMER_DEFAULTS`).
    """
    def completed(spec):
        return {**FORMER_DEFAULTS.get(spec["type"], {}), **spec}
    exported = meta["command"].get("task_parameters")
    if isinstance(exported, dict) and "type" in exported:
        return completed(exported)
    cfg = meta.get("config")
    if isinstance(cfg, dict):
        # Either the whole training file's parameters ({..., task: {...}}) or {file, task}.
        spec = cfg.get("task")
        if isinstance(spec, dict) and "type" in spec:
            return completed(spec)
    raise CheckpointError(f"{where}: cannot rebuild task '{meta['task']}' for deployment: the metadata has neither "
                          "the task's parameters ('command.task_parameters' with a 'type') nor the training "
                          "config's 'task' section")


def resolve_urdf_source(meta: Dict[str, Any], where: str) -> str:
    """Find the URDF the checkpoint names, on this machine.

    Its recorded path where that file exists, else the training file's own ``urdf`` entry
    (``package://...`` or a path in this package's share folder, recorded in ``config``: a checkpoint
    trained in another clone or virtual environment names that one's absolute path), else the file
    of the recorded name in this package's urdf folder. Whether it is the same robot is checked when
    the model is compared with the checkpoint.
    """
    src = str(meta["robot"].get("urdf") or "")
    if src and os.path.isfile(src):
        return src
    from ..config import ConfigError, package_share, resolve_urdf

    trained = meta["config"].get("urdf") if isinstance(meta.get("config"), dict) else None
    trained = trained.strip() if isinstance(trained, str) and trained.strip() else None
    if trained is not None:
        try:
            return str(resolve_urdf({"urdf": trained}, where))
        except ConfigError:
            pass
    share = package_share()
    if src and share is not None:
        cand = share / "urdf" / Path(src).name
        if cand.is_file():
            return str(cand)
    shown = f"'{src}'" + (f", trained from '{trained}'" if trained is not None else "")
    raise CheckpointError(f"{where}: the URDF it was trained on ({shown}) is not on this machine; pass the "
                          "robot's URDF (a path or the robot_description XML)")


def _load_model(meta: Dict[str, Any], where: str, urdf: Optional[str], dtype: torch.dtype):
    source = urdf if urdf is not None else resolve_urdf_source(meta, where)
    try:
        return physics.load_urdf(source, floating_base=bool(meta["robot"]["floating_base"]), dtype=dtype)
    except physics.UrdfError as e:
        robot = meta["robot"]
        base = "floating" if robot["floating_base"] else "fixed"
        raise CheckpointError(f"{where}: the checkpoint is for robot '{robot['name']}' ({base} base, joints "
                              f"{', '.join(robot['joint_names']) or 'none'}); the URDF given cannot be loaded as "
                              f"that robot: {e}") from None


def _build_task(meta: Dict[str, Any], where: str, model):
    try:
        sim_cfg = SimConfig.from_mapping(_finite_floats(dict(meta["simulator"])), "simulator")
        return make_task(model, sim_cfg, _finite_floats(_task_spec(meta, where)), "task")
    except physics.ConfigError as e:
        raise CheckpointError(f"{where}: cannot rebuild the simulator/task from its metadata: {e}") from None


def task_from_metadata(meta: Dict[str, Any], where: str, urdf: Optional[str] = None,
                       dtype: torch.dtype = torch.float64):
    """Build the model and task a checkpoint's metadata describes (robot, simulator, task), without its policy.

    That is what the analysis of a bag needs. Raises CheckpointError naming ``where``.
    """
    model = _load_model(meta, where, urdf, dtype)
    return model, _build_task(meta, where, model)


POLICY_FORMATS = ("torchscript", "onnx")


def _onnx_policy(checkpoint: Path, meta: Dict[str, Any]):
    """Return the checkpoint's policy.onnx (diffsim-ros export --onnx) run by onnxruntime.

    It is a callable from float32 observations (B, n) to actions (B, m) like the TorchScript module;
    refused when it was exported from another policy.pt than the checkpoint's (a stale export).
    """
    from ..onboard import SOURCE_SHA_KEY, OnnxPolicy

    folder = checkpoint if checkpoint.is_dir() else checkpoint.parent
    try:
        pol = OnnxPolicy(folder)
    except (OSError, ValueError) as e:
        raise CheckpointError(f"{folder}: policy_format onnx: {e}") from None
    sha = pol.session.get_modelmeta().custom_metadata_map.get(SOURCE_SHA_KEY)
    if sha != meta["policy"].get("sha256"):
        raise CheckpointError(f"{folder}: policy.onnx was exported from another policy.pt (sha256 {sha}, this "
                              f"checkpoint's {meta['policy'].get('sha256')}): export it again with "
                              f"`diffsim-ros export {folder} --onnx`")

    def act(obs: torch.Tensor) -> torch.Tensor:
        return torch.from_numpy(pol.act(obs.detach().cpu().numpy()))
    return act


class PolicyRunner:
    """A checkpoint ready to turn measured states into commands (batch of one).

    checkpoint: folder (or its policy.json / policy.pt).
    urdf: the robot being controlled (path, .xacro path or XML string, e.g. robot_description);
        default: the URDF the checkpoint names. A URDF for another robot, with other joints or
        the same joints in another order, or any other difference (sha256) is refused with a
        :class:`CheckpointError`.
    dtype: of the simulator used for observation and prediction (float64 default; float32 works).
    compile_prediction: predict through the step compiled ahead of time
        (physics.compiled.ExportedStep): about 10x faster than the eager step at one
        environment; the first prediction exports the step and builds its library (about
        half a minute the first time on a machine, a few seconds from the cache after).
    policy_format: ``torchscript`` (policy.pt) or ``onnx`` (policy.onnx, written by
        ``diffsim-ros export --onnx``, run by onnxruntime; refused when stale).
    """

    def __init__(self, checkpoint: Union[str, os.PathLike], urdf: Optional[str] = None,
                 dtype: torch.dtype = torch.float64, compile_prediction: bool = False,
                 policy_format: str = "torchscript"):
        if policy_format not in POLICY_FORMATS:
            raise CheckpointError(f"policy_format must be one of {', '.join(POLICY_FORMATS)}, got {policy_format!r}")
        where = os.fspath(checkpoint)
        meta = load_metadata(checkpoint)                  # validated; raises CheckpointError
        model = _load_model(meta, where, urdf, dtype)
        # load_checkpoint refuses another robot: other joints, their order, floating base, URDF sha256.
        self.policy, self.meta = load_checkpoint(checkpoint, model=model)
        self.policy_format = policy_format
        if policy_format == "onnx":
            self.policy = _onnx_policy(Path(where), self.meta)
        self.task = _build_task(meta, where, model)
        self.model = model
        self.checkpoint = Path(os.fspath(checkpoint))
        self.sim: Simulator = self.task.sim
        self._predictor: Simulator = Simulator(self.sim.system, compile="aot") if compile_prediction else self.sim
        self.dtype = dtype
        self.kind = robot_kind(meta)
        cmd = self.meta["command"]
        self.interface: str = cmd["interface"]
        self.command_names = list(cmd["names"])
        self.command_units = list(cmd["units"])
        self.actuated_joints = list(self.sim.actuated_joints)
        self.joint_names = list(model.joint_names)
        self.dt = float(self.meta["dt"])
        if list(self.meta["robot"]["actuated_joints"]) != self.actuated_joints:
            raise CheckpointError(f"{where}: 'robot.actuated_joints' {self.meta['robot']['actuated_joints']} does "
                                  f"not match the simulator's actuated joints {self.actuated_joints}")
        if self.sim.action_dim != int(self.meta["action"]["dim"]):
            raise CheckpointError(f"{where}: the '{self.interface}' interface takes {self.sim.action_dim} commands, "
                                  f"the policy gives {self.meta['action']['dim']}")
        self._low, self._high = self._limits()
        self.home = getattr(self.task, "home", None)
        # The goal's size: a point (reach, hover, waypoint) or a velocity; a legged task's own
        # (e.g. none for forward progress), with its reset's value as the default.
        self._default_target = None
        self.target_dim = 3
        if self.kind == LEGGED:
            with torch.no_grad():
                self._default_target = self.task.reset(1, torch.Generator().manual_seed(0)).target.to(dtype)
            self.target_dim = int(self._default_target.shape[-1])
        self.mode = getattr(self.task, "mode", None)
        # A legged policy on the robot observation reads the base from the IMU alone (orientation
        # and body rates): its position and linear velocity are not observed, so a robot without
        # odometry (no motion capture, no state estimator) runs it.
        self.needs_odometry = self.kind != LEGGED or getattr(self.task, "observation", "robot") != "robot"
        self._name_cache: Tuple[Tuple[str, ...], Optional[np.ndarray]] = ((), None)
        self._carry: Tuple[Optional[torch.Tensor], Optional[torch.Tensor]] = (None, None)
        self._action: Optional[torch.Tensor] = None         # the policy's last action (robot observations)
        self._steps = 0                                      # decisions since reset() (a gait clock's time)

    # ------------------------------------------------------------------ limits
    def _limits(self) -> Tuple[torch.Tensor, torch.Tensor]:
        """Per-command bounds from the URDF (and the rotor layout); +-inf where there is none."""
        m, sim, dt = self.model, self.sim, self.dtype
        inf = float("inf")
        if self.interface in ("position", "velocity", "effort"):
            idx = sim.act_index
            if self.interface == "position":
                lo, hi = m.lower[idx].clone(), m.upper[idx].clone()
            elif self.interface == "velocity":
                hi = m.velocity_limit[idx].clone()
                lo = -hi
            else:
                hi = m.effort_limit[idx].clone()
                lo = -hi
            # A URDF limit of 0 (or missing) means "none given" for velocity/effort; keep it unbounded.
            if self.interface != "position":
                none = ~(hi > 0)
                hi = torch.where(none, torch.full_like(hi, inf), hi)
                lo = torch.where(none, torch.full_like(lo, -inf), lo)
            return lo.to(dt), hi.to(dt)
        rot = sim.rotors
        if self.interface == "rotor_thrust":
            n = rot.n
            return (torch.zeros(n, dtype=dt), torch.full((n,), rot.cfg.max_thrust, dtype=dt))
        # CTBR: collective thrust within what the rotors can give; rates within the task's range.
        rate = float(getattr(self.task, "max_rate", inf))
        lo = torch.tensor([0.0, -rate, -rate, -rate], dtype=dt)
        hi = torch.tensor([rot.n * rot.cfg.max_thrust, rate, rate, rate], dtype=dt)
        return lo, hi

    @property
    def command_low(self) -> np.ndarray:
        return self._low.numpy().copy()

    @property
    def command_high(self) -> np.ndarray:
        return self._high.numpy().copy()

    def clamp(self, command) -> Tuple[np.ndarray, bool]:
        """``command`` clamped to the robot's limits (float64 numpy) and whether anything changed."""
        c = np.asarray(command, dtype=np.float64)
        out = np.minimum(np.maximum(c, self._low.numpy()), self._high.numpy())
        return out, bool(np.any(out != c))

    # ------------------------------------------------------------------ measured state -> simulator state
    def joint_index(self, names: Sequence[str]) -> np.ndarray:
        """For each model joint, its index in ``names`` (a message's name list).

        Cached for the last list seen. A model joint missing from ``names`` is a :class:`StateError`.
        """
        key = tuple(names)
        if key == self._name_cache[0] and self._name_cache[1] is not None:
            return self._name_cache[1]
        pos = {n: i for i, n in enumerate(key)}
        if len(pos) != len(key):
            dup = sorted({n for n in key if key.count(n) > 1})
            raise StateError(f"joint names repeat: {', '.join(dup)}")
        missing = [j for j in self.joint_names if j not in pos]
        if missing:
            raise StateError(f"joint(s) {', '.join(missing)} of robot '{self.model.name}' missing from the state "
                             f"(got: {', '.join(key) or 'none'})")
        idx = np.array([pos[j] for j in self.joint_names], dtype=np.int64)
        self._name_cache = (key, idx)
        return idx

    def _joints(self, names: Sequence[str], positions: Sequence[float], velocities: Sequence[float]):
        """(positions, velocities) of the model's joints, in its order, from a joint state matched by name."""
        if len(positions) != len(names):
            raise StateError(f"{len(names)} joint names but {len(positions)} positions")
        if len(velocities) != len(names):
            raise StateError(f"{len(names)} joint names but {len(velocities)} velocities (velocity is required)")
        idx = self.joint_index(names)
        p = np.asarray(positions, dtype=np.float64)[idx]
        v = np.asarray(velocities, dtype=np.float64)[idx]
        for what, x in (("position", p), ("velocity", v)):
            bad = ~np.isfinite(x)
            if bad.any():
                j = [self.joint_names[i] for i in np.nonzero(bad)[0]]
                raise StateError(f"non-finite joint {what} of {', '.join(j)}")
        return p, v

    def _base(self, position, orientation_xyzw, linear_velocity_body, angular_velocity_body) -> np.ndarray:
        """[x y z, qx qy qz qw (normalised), body linear velocity, body angular velocity] from odometry."""
        # One array and one finiteness check on the fast path; the slow path names the field.
        try:
            x = np.concatenate([np.asarray(position, dtype=np.float64).reshape(-1),
                                np.asarray(orientation_xyzw, dtype=np.float64).reshape(-1),
                                np.asarray(linear_velocity_body, dtype=np.float64).reshape(-1),
                                np.asarray(angular_velocity_body, dtype=np.float64).reshape(-1)])
        except (TypeError, ValueError) as e:
            raise StateError(f"odometry is not numeric: {e}") from None
        if x.shape != (13,) or not np.isfinite(x).all():
            parts = (("position", position, 3), ("orientation", orientation_xyzw, 4),
                     ("linear velocity", linear_velocity_body, 3), ("angular velocity", angular_velocity_body, 3))
            for what, val, n in parts:
                a = np.asarray(val, dtype=np.float64).reshape(-1)
                if a.shape != (n,):
                    raise StateError(f"{what} needs {n} numbers, got {a.shape[0]}")
                if not np.all(np.isfinite(a)):
                    raise StateError(f"non-finite {what}: {a.tolist()}")
        norm = float(np.linalg.norm(x[3:7]))
        if not norm > 1e-6:
            raise StateError(f"orientation quaternion has norm {norm:g} (expected a unit quaternion x y z w)")
        x[3:7] /= norm
        return x

    def state(self, q, v) -> State:
        """Build the simulator state (batch 1) of a whole q, v in the simulator's convention.

        That is a floating base's pose then the joints, its twist in the body frame, with the carried
        actuator state.
        """
        return self._tensors(np.asarray(q, dtype=np.float64), np.asarray(v, dtype=np.float64))

    def _tensors(self, q: np.ndarray, v: np.ndarray) -> State:
        return self._with_carry(torch.from_numpy(q).to(self.dtype).unsqueeze(0),
                                torch.from_numpy(v).to(self.dtype).unsqueeze(0))

    def arm_state(self, names: Sequence[str], positions: Sequence[float], velocities: Sequence[float]) -> State:
        """Build the simulator state from a joint state matched by name (any order, extra joints ignored)."""
        if self.kind != ARM:
            raise StateError(f"robot '{self.model.name}' has a floating base: use "
                             f"{'quadrotor' if self.kind == QUADROTOR else 'legged'}_state(), not arm_state()")
        p, v = self._joints(names, positions, velocities)
        return self._tensors(p, v)

    def quadrotor_state(self, position, orientation_xyzw, linear_velocity_body, angular_velocity_body) -> State:
        """Build the simulator state from odometry.

        World position, orientation (x y z w), body-frame linear and angular velocity (nav_msgs/Odometry's
        twist is in the child, i.e. body, frame). Joints of a floating-base robot with rotors (none
        measured) are at zero.
        """
        if self.kind != QUADROTOR:
            raise StateError(f"robot '{self.model.name}' is not a multirotor: use "
                             f"{'arm' if self.kind == ARM else 'legged'}_state(), not quadrotor_state()")
        x = self._base(position, orientation_xyzw, linear_velocity_body, angular_velocity_body)
        nj = self.model.nq - 7
        if nj:
            return self._tensors(np.concatenate((x[0:7], np.zeros(nj))), np.concatenate((x[7:13], np.zeros(nj))))
        return self._tensors(x[0:7], x[7:13])

    def legged_state(self, names: Sequence[str], positions: Sequence[float], velocities: Sequence[float],
                     position, orientation_xyzw, linear_velocity_body, angular_velocity_body) -> State:
        """Build the simulator state of a legged robot from the joint state (matched by name) and the base odometry."""
        if self.kind != LEGGED:
            raise StateError(f"robot '{self.model.name}' is not a legged robot (kind {self.kind})")
        x = self._base(position, orientation_xyzw, linear_velocity_body, angular_velocity_body)
        p, v = self._joints(names, positions, velocities)
        return self._tensors(np.concatenate((x[0:7], p)), np.concatenate((x[7:13], v)))

    def _with_carry(self, q: torch.Tensor, v: torch.Tensor) -> State:
        """Build a simulator state at the measured q, v with the carried (else initial) actuator state."""
        act, delay = self._carry
        has_act = self.sim.rotors is not None or self.sim.config.actuator_lag > 0
        has_delay = self.sim.config.command_delay > 0 or self.sim.config.max_latency > 0
        if (act is not None or not has_act) and (delay is not None or not has_delay):
            # Fast path (every call after the first): no initial_state() needed.
            return State(q=q, v=v, actuator=act, delay=delay, t=torch.zeros(1, dtype=self.dtype))
        st = self.sim.initial_state(q, v)
        if act is not None:
            st.actuator = act
        if delay is not None:
            st.delay = delay
        return st

    def reset(self) -> None:
        """Forget the carried state, the policy's last action and the count of decisions.

        The carried state is the actuator state (rotor speeds, lag, delay line); the last action is
        what a legged robot observation holds; the count of decisions is a gait clock's time. The next
        call starts an episode afresh.
        """
        self._carry = (None, None)
        self._action = None
        self._steps = 0

    # ------------------------------------------------------------------ target
    def target_tensor(self, target=None) -> torch.Tensor:
        """(1, 3) goal.

        reach: a point (required); hover/waypoint: a point (default: the task's home); velocity mode: a
        world velocity (default zero).
        """
        if target is None:
            if self.kind == QUADROTOR:
                if self.mode == "velocity":
                    return torch.zeros(1, 3, dtype=self.dtype)
                return self.home.to(self.dtype).reshape(1, 3)
            if self.kind == LEGGED:
                return self._default_target.clone()
            raise StateError("a reach policy needs a target point (x, y, z) in m")
        t = torch.as_tensor(np.asarray(target, dtype=np.float64).reshape(-1), dtype=self.dtype)
        if t.shape != (self.target_dim,):
            raise StateError(f"target needs {self.target_dim} numbers, got {t.numel()}")
        if not bool(torch.isfinite(t).all()):
            raise StateError(f"non-finite target {t.tolist()}")
        return t.reshape(1, self.target_dim)

    # ------------------------------------------------------------------ the step
    def decide(self, state: State, target=None, predict: bool = True) -> Decision:
        """Command (and prediction) for a simulator state of batch 1.

        The runner remembers the action it gave (a legged robot observation holds the previous one, as
        in training) until :meth:`reset`, and counts its decisions: the task's step, which a gait clock
        observes (its time is that count x the control period, as in training).
        """
        tgt = (target if isinstance(target, torch.Tensor) and target.shape == (1, self.target_dim)
               else self.target_tensor(target))
        with torch.inference_mode():
            ts = TaskState(state, tgt, self._steps, extra={} if self._action is None else {"action": self._action})
            obs = self.task.observe(ts)
            action = self.policy(obs.to(torch.float32)).to(self.dtype)
            action = torch.clamp(action, -1.0, 1.0)        # Task.step clamps as well
            self._action = action                          # the next observation's previous action
            self._steps += 1
            raw = self.task.command(action, ts)[0]
            cmd, clamped = self.clamp(raw.to(torch.float64).numpy())
            predicted = None
            if predict:
                predicted = self.predict(state, cmd)
        return Decision(cmd, action[0].to(torch.float64).numpy().copy(), clamped, state, predicted)

    def predict(self, state: State, command) -> State:
        """One Simulator.step from ``state`` with ``command`` (no grad); carries the actuator state on."""
        # A compiled graph is called under no_grad (its inputs must not be inference tensors).
        with (torch.no_grad() if self._predictor is not self.sim else torch.inference_mode()):
            c = torch.as_tensor(np.asarray(command, dtype=np.float64), dtype=self.dtype).reshape(1, -1)
            nxt = self._predictor.step(state, c)
        self._carry = (nxt.actuator, nxt.delay)
        return nxt

    def warm_prediction(self) -> float:
        """Build the compiled prediction now instead of on the first measured state.

        It is built from the neutral configuration at rest, the safe command's zeros, and that step's
        carried actuator state is forgotten; returns the seconds it took (0 without
        ``compile_prediction``).
        """
        if self._predictor is self.sim:
            return 0.0
        t0 = time.perf_counter()
        q = self.model.neutral_configuration((1,)).to(self.dtype)
        self.predict(self._with_carry(q, torch.zeros(1, self.model.nv, dtype=self.dtype)),
                     np.zeros(self.sim.action_dim))
        self._carry = (None, None)
        return time.perf_counter() - t0

    def legged(self, names, positions, velocities, position, orientation_xyzw, linear_velocity_body,
               angular_velocity_body, target=None, predict: bool = True) -> Decision:
        return self.decide(self.legged_state(names, positions, velocities, position, orientation_xyzw,
                                             linear_velocity_body, angular_velocity_body), target, predict)

    def arm(self, names, positions, velocities, target=None, predict: bool = True) -> Decision:
        return self.decide(self.arm_state(names, positions, velocities), target, predict)

    def quadrotor(self, position, orientation_xyzw, linear_velocity_body, angular_velocity_body, target=None,
                  predict: bool = True) -> Decision:
        return self.decide(self.quadrotor_state(position, orientation_xyzw, linear_velocity_body,
                                                angular_velocity_body), target, predict)

    # ------------------------------------------------------------------ helpers for nodes / analysis
    def joint_positions(self, state: State) -> np.ndarray:
        """Actuated joint positions of a (batch-1) state, in ``actuated_joints`` order."""
        return self.sim.joint_positions(state.q)[0, self.sim.act_index].to(torch.float64).numpy()

    def stance_command(self) -> np.ndarray:
        """Return the stance command of a legged robot standing.

        Its task's stance joint positions as a position command (in ``actuated_joints`` order), what a
        walker's controller sends when told to stop.
        """
        if self.kind != LEGGED or self.interface != "position" or getattr(self.task, "stance", None) is None:
            raise ValueError(f"standing needs a legged checkpoint on the position interface; this one is a "
                             f"{self.kind} policy commanding '{self.interface}'")
        return self.task.stance.detach().reshape(-1).to(device="cpu", dtype=torch.float64).numpy().copy()

    def joint_velocities(self, state: State) -> np.ndarray:
        return self.sim.joint_velocities(state.v)[0, self.sim.act_index].to(torch.float64).numpy()

    def describe(self) -> str:
        return (f"task {self.meta['task']} on robot '{self.model.name}' ({self.kind}), interface "
                f"{self.interface} [{', '.join(f'{n} ({u})' for n, u in zip(self.command_names, self.command_units))}]"
                f", dt {self.dt:g} s")
