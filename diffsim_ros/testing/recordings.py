"""Record a plant rollout under exciting commands into a bag in the layout of doc/interfaces.md.

Shared by the tests and bench/analysis.py, so both analyse bags made the way the
recorder makes them (header stamps = the plant's time, commands labelled with the
stamp of the state they were computed from, metadata latched).

    plant = make_plant("config/reach_arm.yaml", {"mass_scale": 1.2}, backend="mujoco")
    ctrl = arm_exciter(plant, seed=0)                    # closed loop: (q, v) -> command
    record_bag("bags/arm", plant, ctrl, steps=500, params=params)

Plants: the MuJoCo stand-in (``diffsim_ros.plant``), or :class:`SimulatorPlant`, the
differentiable simulator itself with the same perturbations (for fast, exact checks of
the analysis machinery). Both expose ``dt``, ``joint_names``, ``floating_base``,
``state() -> (t, q, v)`` and ``step(command)``.
"""
from __future__ import annotations

import math
from typing import Any, Callable, Dict, Optional, Tuple

import numpy as np
import torch

from .. import config as _config
from .. import physics
from ..analysis.bag import BagWriter
from ..interfaces import PREDICTED_STATE
from ..physics.rotation import quat_to_matrix
from ..physics.registry import PERTURBATION_FIELDS, from_perturbation
from ..analysis.params import build_simulator


class SimulatorPlant:
    """The differentiable simulator as a plant: batch 1, float64.

    With perturbations named as ``diffsim_ros.plant.Perturbation``'s (those of
    ``physics.registry.PERTURBATION_FIELDS``, mapped onto the registry by ``from_perturbation``;
    latency in s).
    """

    def __init__(self, params: Dict[str, Any], perturbation: Optional[Dict[str, Any]] = None,
                 q0: Optional[np.ndarray] = None):
        p = dict(perturbation or {})
        self.params = params
        self.model = _config.load_model(params, dtype=torch.float64)
        self.cfg = _config.simulator_config(params)
        unsupported = sorted(k for k in p if k not in PERTURBATION_FIELDS)
        if unsupported:
            raise ValueError(f"SimulatorPlant: unsupported perturbation(s) {unsupported}")
        values = from_perturbation(physics.build_system(self.model, self.cfg), p)
        self.sim = build_simulator(self.model, self.cfg, values)
        self.dt = self.cfg.dt
        self.joint_names = list(self.model.joint_names)
        self.floating_base = self.model.floating_base
        q = None if q0 is None else torch.as_tensor(q0, dtype=torch.float64)[None]
        if q is None and self.floating_base:
            q = self.model.neutral_configuration((1,))
            q[0, 2] = 1.0
        self._state = self.sim.initial_state(q, batch=(1,))
        self._t = 0.0

    def state(self):
        return self._t, self._state.q[0].numpy().copy(), self._state.v[0].numpy().copy()

    def step(self, command) -> None:
        with torch.no_grad():
            self._state = self.sim.step(self._state, torch.as_tensor(command, dtype=torch.float64)[None])
        self._t += self.dt


class MujocoStandIn:
    """``diffsim_ros.plant.MujocoPlant`` behind the recording interface.

    ``state()`` returns the measured state in the simulator's convention (base twist in the body
    frame).
    """

    def __init__(self, params: Dict[str, Any], perturbation: Optional[Dict[str, Any]] = None,
                 q0: Optional[np.ndarray] = None, source: str = ""):
        from ..plant.mujoco_plant import MujocoPlant

        self.plant = MujocoPlant(params, source=source, perturbation=perturbation or {})
        self.dt = self.plant.dt
        self.joint_names = list(self.plant.joint_names)
        self.floating_base = self.plant.floating_base
        if q0 is None and self.floating_base:
            q0 = np.array([0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 1.0] + [0.0] * len(self.joint_names))
        self._m = self.plant.reset(q0)

    def state(self):
        m = self._m
        if not self.floating_base:
            idx = [list(m.names).index(n) for n in self.joint_names]
            return m.t, np.asarray(m.position)[idx], np.asarray(m.velocity)[idx]
        q = np.concatenate((m.position, m.orientation))
        v = np.concatenate((m.linear_velocity_body, m.angular_velocity))
        if m.joints is not None:                   # a legged robot: the joints follow the base
            idx = [list(m.joints.names).index(n) for n in self.joint_names]
            q = np.concatenate((q, np.asarray(m.joints.position)[idx]))
            v = np.concatenate((v, np.asarray(m.joints.velocity)[idx]))
        return m.t, q, v

    def step(self, command) -> None:
        self._m = self.plant.step(np.asarray(command, dtype=np.float64))


def make_plant(params: Dict[str, Any], perturbation: Optional[Dict[str, Any]] = None, backend: str = "mujoco",
               q0: Optional[np.ndarray] = None):
    """Make a plant for :func:`record_bag`.

    The MuJoCo stand-in (``backend="mujoco"``) or the differentiable simulator itself
    (``"simulator"``), with the same perturbation names.
    """
    if backend == "mujoco":
        return MujocoStandIn(params, perturbation, q0)
    if backend == "simulator":
        return SimulatorPlant(params, perturbation, q0)
    raise ValueError(f"backend must be 'mujoco' or 'simulator', got {backend!r}")


def record_walker(path, runner, params: Dict[str, Any], perturbation: Optional[Dict[str, Any]] = None,
                  speed: float = 0.5, steps: int = 300, backend: str = "mujoco", predictions: bool = False
                  ) -> Dict[str, Any]:
    """Record a legged checkpoint's walking policy as a bag whose metadata names the checkpoint.

    The policy (``runner``: a learning.deploy.PolicyRunner) walks from its task's standing start on
    ``backend`` at the commanded forward ``speed`` (m/s) for ``steps`` control steps; the metadata
    names the checkpoint as policy_controller's does (:func:`record_bag`; the recorded arrays are
    returned).
    """
    with torch.no_grad():
        q0 = runner.task.reset(1, torch.Generator().manual_seed(0)).sim.q[0].double().numpy()
    plant = make_plant(params, perturbation, backend, q0)
    names = list(plant.joint_names)
    runner.reset()

    def walk(k, q, v):
        return runner.legged(names, q[7:], v[6:], q[:3], q[3:7], v[:3], v[3:6], target=[speed],
                             predict=False).command
    return record_bag(path, plant, walk, steps, params, predictions=predictions,
                      extra_metadata={"checkpoint": runner.meta})


# ---------------------------------------------------------------------------- exciting commands
def arm_exciter(params: Dict[str, Any], seed: int = 0, hold: float = 0.4, margin: float = 0.3,
                noise: float = 0.3) -> Callable[[int, np.ndarray, np.ndarray], np.ndarray]:
    """Closed-loop exciting commands for an arm in its configured interface.

    Joint targets drawn in the middle ``1 - 2 margin`` of each range, held ``hold`` s, plus white
    noise (``noise`` x the range half-width for position targets; for efforts, a PD with the
    nominal gravity compensation towards the target plus ``noise`` x the effort limit).
    Keeps clear of the joint limits, where plant and simulator model contact differently.
    """
    model = _config.load_model(params, dtype=torch.float64)
    cfg = _config.simulator_config(params)
    sim = physics.Simulator(model, cfg)
    idx = sim.act_index.numpy()
    lo, hi = model.lower.numpy()[idx], model.upper.numpy()[idx]
    lo = np.where(np.isfinite(lo), lo, -math.pi)
    hi = np.where(np.isfinite(hi), hi, math.pi)
    mid, half = (lo + hi) / 2, (hi - lo) / 2 * (1 - 2 * margin)
    limit = model.effort_limit.numpy()[idx]
    kp, kd = sim.kp.numpy(), sim.kd.numpy()
    rng = np.random.default_rng(seed)
    every = max(1, int(round(hold / cfg.dt)))
    target = {"q": mid.copy()}

    def command(k: int, q: np.ndarray, v: np.ndarray) -> np.ndarray:
        if k % every == 0:
            target["q"] = mid + half * rng.uniform(-1, 1, len(mid))
        qa, va = q[idx], v[idx]
        if cfg.actuator == "position":
            return target["q"] + noise * half * rng.standard_normal(len(mid)) * 0.3
        if cfg.actuator == "velocity":
            return np.clip(2.0 * (target["q"] - qa), -2, 2) + noise * rng.standard_normal(len(mid))
        with torch.no_grad():
            g = physics.rnea(model, torch.as_tensor(q)[None], torch.zeros(1, model.nv, dtype=torch.float64),
                             torch.zeros(1, model.nv, dtype=torch.float64))[0].numpy()[idx]
        # A fifth of the position gains: a torque held over a whole control step destabilises
        # the stiffest joint at the full gains.
        tau = 0.2 * kp * (target["q"] - qa) - 0.2 * kd * va + g
        return np.clip(tau + noise * 0.2 * limit * rng.standard_normal(len(mid)), -limit, limit)
    return command


def quadrotor_exciter(params: Dict[str, Any], seed: int = 0, hold: float = 1.0, radius: float = 1.5,
                      noise: float = 0.3) -> Callable[[int, np.ndarray, np.ndarray], np.ndarray]:
    """Closed-loop exciting CTBR commands.

    A PD position loop on the nominal mass towards waypoints drawn within ``radius`` m of (0, 0, 1)
    and changed every ``hold`` s (so the velocity sweeps up to a few m/s, which is what shows the
    drag), an attitude loop to body rates, and white noise on thrust (``noise`` x 10 % of hover)
    and rates (``noise`` rad/s).
    """
    model = _config.load_model(params, dtype=torch.float64)
    cfg = _config.simulator_config(params)
    mass = float(model.mass.sum())
    g = 9.81
    rng = np.random.default_rng(seed)
    every = max(1, int(round(hold / cfg.dt)))
    home = np.array([0.0, 0.0, 1.0])
    wp = {"p": home.copy()}

    def command(k: int, q: np.ndarray, v: np.ndarray) -> np.ndarray:
        if k % every == 0:
            wp["p"] = home + radius * rng.uniform(-1, 1, 3) * np.array([1.0, 1.0, 0.4])
        R = quat_to_matrix(q[3:7])
        vw = R @ v[0:3]
        a_des = 2.0 * (wp["p"] - q[0:3]) - 1.5 * vw
        n = np.linalg.norm(a_des[:2])
        if n > 4.0:
            a_des[:2] *= 4.0 / n
        f = a_des + np.array([0.0, 0.0, g])
        thrust = mass * float(f @ R[:, 2])
        z_des = f / np.linalg.norm(f)
        e = R.T @ np.cross(R[:, 2], z_des)
        yaw = math.atan2(R[1, 0], R[0, 0])
        rates = np.array([8.0 * e[0], 8.0 * e[1], -2.0 * yaw])
        rates = rates + noise * rng.standard_normal(3)
        thrust *= 1.0 + noise * 0.1 * rng.standard_normal()
        return np.concatenate(([max(thrust, 0.1 * mass * g)], rates))
    return command


def legged_exciter(params: Dict[str, Any], seed: int = 0, amplitude: float = 0.3,
                   frequency: Tuple[float, float] = (1.0, 3.0)) -> Callable[[int, np.ndarray, np.ndarray], np.ndarray]:
    """Exciting joint targets for a legged robot on the position interface.

    The task's ``stance`` plus a sine per joint (``amplitude`` rad, a frequency drawn in
    ``frequency`` Hz and a phase), so that the feet lift, stamp and slide for as long as the
    recording lasts: contact throughout, which a walking policy that stops does not give.
    """
    cfg = _config.simulator_config(params)
    stance = np.asarray(params["task"]["stance"], dtype=np.float64)
    rng = np.random.default_rng(seed)
    f = rng.uniform(frequency[0], frequency[1], len(stance))
    phase = rng.uniform(0.0, 2 * math.pi, len(stance))

    def command(k: int, q: np.ndarray, v: np.ndarray) -> np.ndarray:
        return stance + amplitude * np.sin(2 * math.pi * f * k * cfg.dt + phase)
    return command


def exciter(params: Dict[str, Any], seed: int = 0, **kw):
    """Return the exciting controller for the configured robot.

    The robot is an arm, a quadrotor, or a legged robot: a floating base with a ``task.stance``.
    """
    if bool(params.get("floating_base", False)):
        if "stance" in (params.get("task") or {}):
            return legged_exciter(params, seed, **kw)
        return quadrotor_exciter(params, seed, **kw)
    return arm_exciter(params, seed, **kw)


# ---------------------------------------------------------------------------- recording
def record_bag(path, plant, controller: Callable[[int, np.ndarray, np.ndarray], np.ndarray], steps: int,
               params: Dict[str, Any], storage: str = "mcap", predictions: bool = True,
               receive_delay: float = 2e-4, extra_metadata: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    """Run ``plant`` for ``steps`` control steps under ``controller`` and write the bag.

    Each step: the state is stamped with the plant time (receive time ``receive_delay`` s
    later), the command computed from it is written on /diffsim/command with the state's
    stamp as its label, and the plant advances one control step. With ``predictions``,
    /diffsim/predicted_state holds the nominal simulator's one-step predictions, as
    policy_controller publishes them. ``params`` (the training-file mapping) goes into
    /diffsim/metadata. Returns the recorded arrays (t, q, v, cmd).
    """
    ts, qs, vs, cs = [], [], [], []
    for k in range(steps):
        t, q, v = plant.state()
        c = np.asarray(controller(k, q, v), dtype=np.float64)
        ts.append(t)
        qs.append(q)
        vs.append(v)
        cs.append(c)
        plant.step(c)
    t, q, v = plant.state()
    ts.append(t)
    qs.append(q)
    vs.append(v)
    rec = {"t": np.asarray(ts), "q": np.asarray(qs), "v": np.asarray(vs), "cmd": np.asarray(cs)}
    write_recording(path, rec, plant.joint_names, plant.floating_base, params, storage=storage,
                    predictions=predictions, receive_delay=receive_delay, extra_metadata=extra_metadata)
    return rec


def write_recording(path, rec: Dict[str, np.ndarray], joint_names, floating_base: bool, params: Dict[str, Any],
                    storage: str = "mcap", predictions: bool = True, receive_delay: float = 2e-4,
                    extra_metadata: Optional[Dict[str, Any]] = None, t0: float = 100.0, labels: bool = True,
                    metadata: bool = True) -> None:
    """Write recorded arrays (``t`` (N+1,), ``q``, ``v`` (N+1, .), ``cmd`` (N, .)) as a bag.

    ``t0`` s is added to every stamp (a bag rarely starts at time zero). ``labels=False``
    leaves the commands without their state stamp (alignment then falls back to the bag's
    receive times); ``metadata=False`` leaves out /diffsim/metadata.
    """
    t_ns = np.round((rec["t"] + t0) * 1e9).astype(np.int64)
    d_ns = int(round(receive_delay * 1e9))
    cfg = _config.simulator_config(params)
    pred = None
    if predictions and len(rec["cmd"]):
        model = _config.load_model(params, dtype=torch.float64)
        sim = physics.Simulator(model, cfg)
        with torch.no_grad():
            n = len(rec["cmd"])
            st = sim.initial_state(torch.as_tensor(rec["q"][:n]), torch.as_tensor(rec["v"][:n]))
            pred = sim.step(st, torch.as_tensor(rec["cmd"])).v.numpy()
    meta = {"config": params, "interface": cfg.actuator, "checkpoint": None,
            "controller": {"type": "record.exciter", "dt": cfg.dt}}
    meta.update(extra_metadata or {})
    g = np.array([0.0, 0.0, -9.81])
    with BagWriter(path, storage=storage) as w:
        if metadata:
            w.metadata(meta, receive_ns=t_ns[0])
        for k in range(len(t_ns)):
            q, v = rec["q"][k], rec["v"][k]
            if floating_base:
                w.odometry(t_ns[k], q, v, receive_ns=t_ns[k] + d_ns)
                # IMU: body rates and the specific force from the change of world velocity.
                R = quat_to_matrix(q[3:7])
                acc = np.zeros(3)
                if k > 0:
                    Rp = quat_to_matrix(rec["q"][k - 1][3:7])
                    acc = (R @ v[0:3] - Rp @ rec["v"][k - 1][0:3]) / max(rec["t"][k] - rec["t"][k - 1], 1e-9)
                w.imu(t_ns[k], q[3:7], v[3:6], R.T @ (acc - g), receive_ns=t_ns[k] + d_ns)
                if len(joint_names):               # a legged robot: its joints with the base's stamp
                    w.joint_state(t_ns[k], joint_names, q[7:], v[6:], receive_ns=t_ns[k] + d_ns)
            else:
                w.joint_state(t_ns[k], joint_names, q, v, receive_ns=t_ns[k] + d_ns)
            if k < len(rec["cmd"]):
                w.command(t_ns[k] + 2 * d_ns, rec["cmd"][k], t_ns[k] if labels else None)
                if pred is not None and not (floating_base and len(joint_names)):   # none for legged robots
                    tp = t_ns[k] + int(round(cfg.dt * 1e9))
                    if floating_base:
                        w.odometry(tp, rec["q"][k + 1], pred[k], receive_ns=t_ns[k] + 2 * d_ns,
                                   topic=PREDICTED_STATE)
                    else:
                        w.joint_state(tp, joint_names, rec["q"][k + 1], pred[k], receive_ns=t_ns[k] + 2 * d_ns,
                                      topic=PREDICTED_STATE)


# ---------------------------------------------------------------------------- standard test recordings
#: The perturbations of the proof (issue 6): the stand-in robot heavier, more damped, draggier.
PERTURBATIONS = {"arm": {"mass_scale": 1.2, "joint_damping_scale": 3.0},
                 "quadrotor": {"mass_scale": 1.2, "drag_scale": 2.0}}
CONFIGS = {"arm": "config/reach_arm.yaml", "quadrotor": "config/hover.yaml"}
#: PD gains (kp N m/rad, kd N m s/rad) of the arm in the standard recordings.
ARM_RECORDING_GAINS = ((10.0, 15.0, 8.0, 3.0), (1.0, 1.5, 0.5, 0.1))


def standard_params(kind: str) -> Dict[str, Any]:
    """Return the training file of ``kind`` as recorded in the tests and the benchmark.

    arm: config/reach_arm.yaml, quadrotor: config/hover.yaml. The arm runs 4 physics substeps per
    control step instead of 2: at 10 ms substeps its light wrist joint (kp 3 N m/rad on about
    2.7e-4 kg m^2, w h ~ 1) sits where the simulator's and MuJoCo's implicit integrators
    visibly part, which would blur the perturbations the analysis has to find. It also runs
    a softer servo (kp 10/15/8/3 N m/rad, kd 1/1.5/0.5/0.1) than the training file's: under
    the stiff one the controller's damping (kd) dwarfs the joints' own, and arm_joint3's
    fitted damping came out 13 % off in the calibration test (0.102 for 0.090 N m s/rad;
    tolerance 5 %).
    """
    share = _config.package_share()
    params = _config.load_yaml(share / CONFIGS[kind])
    if kind == "arm":
        sim = params.setdefault("simulator", {})
        sim.update(substeps=4, kp=list(ARM_RECORDING_GAINS[0]), kd=list(ARM_RECORDING_GAINS[1]))
    return params


def record_standard(kind: str, path, perturbation: Optional[Dict[str, Any]] = None, steps: int = 300,
                    seed: int = 0, storage: str = "mcap", backend: str = "mujoco", **kw) -> Dict[str, Any]:
    """Record ``steps`` control steps of the standard ``kind`` robot under exciting commands.

    The robot is as :func:`standard_params` gives it; the bag is ``path``. Returns the recorded
    arrays plus ``params``.
    """
    params = standard_params(kind)
    plant = make_plant(params, perturbation, backend=backend)
    rec = record_bag(path, plant, exciter(params, seed), steps, params, storage=storage, **kw)
    rec["params"] = params
    return rec
