"""Rebuild the simulator a bag was recorded against, and replay its commands k steps ahead.

The commands are replayed from every recorded state, k control steps ahead, all start states in
one batch.

    setup = sim_setup(data, config_path=None)       # from /diffsim/metadata, or --config
    rp = Replay(data, setup)
    out = rp.predict([1, 5, 10])                     # {k: Prediction(start, v_pred, v_true)}

The bag's states and commands become tensors in the model's order (joints by name).
A prediction from command ``i`` over ``k`` steps is made only where the commands
``i .. i+k-1`` follow each other one control step apart and a state was recorded
``k`` steps after the start, so drops and gaps never pair the wrong samples.

Hidden actuator state (rotor speeds, a first-order torque lag) is not in the bag: it
is estimated along the whole bag with the recorded states put back at every step
(:meth:`Replay.actuator_track`), and the first ``warmup`` starts of each run of
consecutive commands, where that estimate has not yet forgotten its initial guess, are
not used. The delay line of ``command_delay`` is filled with the recorded earlier commands.
"""
from __future__ import annotations

import contextlib
import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence

import numpy as np
import torch

from .. import config as _config
from .. import physics
from .bag import BASE_AXES, CMD_CTBR, CMD_ROTOR_THRUST, COMMAND, BagData, legged_in_model_order
from .errors import AnalysisError

#: Passes of the plain actuator chain at most (Replay.actuator_chain), where the lag's form does not converge.
SHIFT_PASSES = 400


@dataclass
class SimSetup:
    """Parameters (the training-file mapping), model and simulator config, and where they came from."""

    params: Dict[str, Any]
    model: physics.Model
    sim_config: physics.SimConfig
    source: str
    notes: List[str] = field(default_factory=list)


def params_from_metadata(meta: Dict[str, Any], where: str) -> Dict[str, Any]:
    """Return the training-file mapping inside ``/diffsim/metadata``.

    That is its ``config`` (the training config), else what the checkpoint records
    (``robot.urdf``, ``robot.floating_base``, ``simulator``).
    """
    cfg = meta.get("config")
    if isinstance(cfg, dict) and isinstance(cfg.get("urdf"), str):
        return dict(cfg)
    ck = meta.get("checkpoint")
    if isinstance(ck, dict) and isinstance(ck.get("robot"), dict) and isinstance(ck.get("simulator"), dict):
        robot = ck["robot"]
        sim = {k: v for k, v in ck["simulator"].items()}
        rot = sim.get("rotors")
        if isinstance(rot, dict):
            # SimConfig.to_dict() writes both forms; keep the one the config used.
            rot = dict(rot)
            if rot.get("rotor_links"):
                rot.pop("positions", None)
            else:
                rot.pop("rotor_links", None)
            sim["rotors"] = rot
        if not isinstance(robot.get("urdf"), str):
            raise AnalysisError(f"{where}: metadata field 'checkpoint.robot.urdf' is missing")
        from ..learning.checkpoint import CheckpointError
        from ..learning.deploy import resolve_urdf_source

        try:
            # The recorded path, else the file of that name in this package (checkpoints made elsewhere).
            urdf = resolve_urdf_source(ck, where)
        except CheckpointError as exc:
            raise AnalysisError(f"{exc}; or pass --config YAML") from None
        return {"urdf": urdf, "floating_base": bool(robot.get("floating_base", False)), "simulator": sim}
    raise AnalysisError(f"{where}: metadata has neither 'config' (with 'urdf') nor 'checkpoint' (with 'robot' "
                        f"and 'simulator'); pass --config YAML")


def sim_setup(data: BagData, config_path: Optional[str] = None, dtype=torch.float64,
              params: Optional[Dict[str, Any]] = None) -> SimSetup:
    """Model and SimConfig for a bag.

    ``params`` or ``config_path`` (a training file, config/*.yaml) override the bag's
    ``/diffsim/metadata``.
    """
    notes: List[str] = []
    if params is not None:
        source = "parameters given"
    elif config_path is not None:
        try:
            params = _config.load_yaml(config_path)
        except physics.ConfigError as exc:
            raise AnalysisError(str(exc)) from None
        source = str(config_path)
    elif data.metadata is not None:
        params = params_from_metadata(data.metadata, f"{data.path}: /diffsim/metadata")
        source = f"{data.path}: /diffsim/metadata"
    else:
        raise AnalysisError(f"{data.path}: the bag has no /diffsim/metadata to rebuild the model and simulator "
                            f"from; pass --config YAML (a training file such as config/reach_arm.yaml)")
    try:
        model = _config.load_model(params, source, dtype=dtype)
        cfg = _config.simulator_config(params, source)
    except (physics.ConfigError, physics.UrdfError) as exc:
        raise AnalysisError(str(exc)) from None
    if data.kind == "quadrotor" and not model.floating_base:
        raise AnalysisError(f"{data.path}: the bag holds odometry ('{data.state_topic}') but the model from {source} "
                            f"has a fixed base; set floating_base: true")
    if data.kind == "legged" and not (model.floating_base and model.nj):
        raise AnalysisError(f"{data.path}: the bag holds a legged robot's odometry and joint states but the model "
                            f"from {source} has " + ("no joints" if model.floating_base else "a fixed base"))
    if data.kind == "arm" and model.floating_base:
        raise AnalysisError(f"{data.path}: the bag holds joint states but the model from {source} has a floating "
                            f"base; the analysis of floating-base robots needs '/odom'")
    # The command period in the bag is the control step of the replay.
    period = command_period(data)
    if period is not None and abs(period - cfg.dt) > 0.05 * cfg.dt:
        h = cfg.dt / cfg.substeps
        subs = max(1, int(round(period / h)))
        notes.append(f"commands arrive every {period * 1e3:.3g} ms but the simulator's dt is {cfg.dt * 1e3:.3g} ms "
                     f"({source}); replaying at the bag's period with {subs} substeps")
        cfg = dataclasses.replace(cfg, dt=period, substeps=subs)
    return SimSetup(params=params, model=model, sim_config=cfg, source=source, notes=notes)


@contextlib.contextmanager
def replaying(data: BagData):
    """Turn a diverging simulation while replaying ``data`` into an AnalysisError.

    The simulation's physics.SimulationError becomes an AnalysisError naming the bag and its
    topics.
    """
    try:
        yield
    except physics.SimulationError as exc:
        raise AnalysisError(f"{data.path}: replaying '{data.command_topic}' from the states on '{data.state_topic}' "
                            f"(t=[{data.t_state[0]}, {data.t_state[-1]}] ns) the simulator diverged ({exc}); the "
                            f"recorded states or commands are implausible, or the simulator settings are "
                            f"wrong") from None


def command_period(data: BagData) -> Optional[float]:
    d = np.diff(data.cmd_state_stamp)
    d = d[d > 0]
    return float(np.median(d)) * 1e-9 if len(d) else None


@dataclass
class Prediction:
    """Predictions ``k`` steps ahead.

    ``start`` (indices into the commands), and velocities (n, nv): predicted, measured; ``t`` the
    stamp (ns) predicted for.
    """

    k: int
    start: np.ndarray
    t: np.ndarray
    v_pred: torch.Tensor
    v_true: torch.Tensor


class Replay:
    """A bag's states and commands on the model, ready for batched k-step prediction."""

    def __init__(self, data: BagData, setup: SimSetup, warmup: Optional[int] = None):
        self.data, self.setup = data, setup
        model, cfg = setup.model, setup.sim_config
        self.model = model
        try:
            self.sim = physics.Simulator(model, cfg)
        except physics.ConfigError as exc:
            raise AnalysisError(f"{setup.source}: {exc}") from None
        dt_ns = cfg.dt * 1e9
        self.dt = cfg.dt
        dtype, dev = model.dtype, model.device

        # States in model order.
        if data.kind == "arm":
            missing = [j for j in model.joint_names if j not in data.joint_names]
            if missing:
                raise AnalysisError(f"{data.path}: topic '{data.state_topic}' lacks joint(s) {missing} of model "
                                    f"'{model.name}' (bag joints: {data.joint_names})")
            idx = [data.joint_names.index(j) for j in model.joint_names]
            q, v = data.q[:, idx], data.v[:, idx]
            self.dof_names = list(model.joint_names)
        elif data.kind == "legged":
            q, v = legged_in_model_order(data.path, data.q, data.v, data.joint_names, model)
            self.dof_names = list(BASE_AXES) + list(model.joint_names)
        else:
            if model.nj:
                raise AnalysisError(f"{data.path}: model '{model.name}' has {model.nj} joints besides the floating "
                                    f"base; odometry alone does not give their state")
            q, v = data.q, data.v
            self.dof_names = list(BASE_AXES)
        self.q = torch.as_tensor(q, dtype=dtype, device=dev)
        self.v = torch.as_tensor(v, dtype=dtype, device=dev)
        self.t_state = data.t_state

        # Commands in the simulator's action order.
        cmd = data.cmd
        if cmd.shape[1] != self.sim.action_dim:
            raise AnalysisError(f"{data.path}: topic '{data.command_topic}' has {cmd.shape[1]} entries per command; "
                                f"the simulator's '{cfg.actuator}' interface ({setup.source}) takes "
                                f"{self.sim.action_dim}")
        if data.kind in ("arm", "legged") and all(n in data.cmd_names for n in self.sim.actuated_joints):
            cmd = cmd[:, [data.cmd_names.index(n) for n in self.sim.actuated_joints]]
        topic = data.command_topic
        if topic not in (COMMAND,):
            want = {CMD_CTBR: "ctbr", CMD_ROTOR_THRUST: "rotor_thrust"}.get(topic, topic.strip("/").split("_")[0])
            if want != cfg.actuator:
                raise AnalysisError(f"{data.path}: commands on '{topic}' are the '{want}' interface but the "
                                    f"simulator ({setup.source}) uses '{cfg.actuator}'")
        self.cmd = torch.as_tensor(cmd, dtype=dtype, device=dev)
        stamps = data.cmd_state_stamp
        self.cmd_stamp = stamps
        # Index of each command's state (exists by construction of BagData).
        self.cmd_state = np.searchsorted(self.t_state, stamps)
        # Length of the run of consecutive commands starting at each one.
        tol = 0.25 * dt_ns
        ok = np.abs(np.diff(stamps) - dt_ns) < tol
        run = np.ones(len(stamps), dtype=np.int64)
        for i in range(len(stamps) - 2, -1, -1):
            if ok[i]:
                run[i] = run[i + 1] + 1
        self.run = run
        self._tol = tol
        if warmup is None:
            tau = 0.0
            if cfg.rotors is not None:
                tau = cfg.rotors.motor_time_constant
            tau = max(tau, cfg.actuator_lag)
            warmup = int(math.ceil(6 * tau / cfg.dt)) if tau > 0 else 0
        self.warmup = int(warmup)

    # ----------------------------------------------------------------------------------
    def target_index(self, start: np.ndarray, k: int) -> np.ndarray:
        """Index of the state recorded k steps after each start command, or -1."""
        want = self.cmd_stamp[start] + int(round(k * self.dt * 1e9))
        j = np.clip(np.searchsorted(self.t_state, want), 1, len(self.t_state) - 1)
        j = np.where(np.abs(self.t_state[j - 1] - want) < np.abs(self.t_state[j] - want), j - 1, j)
        return np.where(np.abs(self.t_state[j] - want) < self._tol, j, -1)

    def valid_starts(self, k: int) -> np.ndarray:
        """Commands from which a k-step prediction can be checked against a recorded state."""
        start = np.nonzero(self.run >= k)[0]
        if self.warmup:
            # The actuator estimate needs the commands before the start, one control step apart.
            w = self.warmup
            start = start[start >= w]
            start = start[self.run[start - w] >= w + 1]
        return start[self.target_index(start, k) >= 0]

    def initial(self, start: np.ndarray, sim: Optional[physics.Simulator] = None) -> physics.State:
        """Return the simulator state at each start command.

        It holds the recorded q, v, the estimated actuator state (:meth:`actuator_track`) and the
        delay line of the preceding commands.
        """
        sim = sim or self.sim
        start_t = torch.as_tensor(start, device=self.q.device)
        si = torch.as_tensor(self.cmd_state[start], device=self.q.device)
        state = sim.initial_state(self.q[si], self.v[si])
        d = sim.config.command_delay
        if d > 0:
            prev = torch.stack([self.cmd[(start_t - d + m).clamp(min=0)] for m in range(d)], -2)
            state = state.replace(delay=prev)
        if state.actuator is not None:
            track = self.actuator_track(sim)
            if track is not None:
                state = state.replace(actuator=track[start_t])
        return state

    def actuator_track(self, sim: Optional[physics.Simulator] = None, passes: int = 20,
                       tol: float = 1e-8) -> Optional[torch.Tensor]:
        """Hidden actuator state (rotor speeds, lagged torques) at the state of every command.

        It is estimated along the whole bag with the recorded states put back at every step
        (:meth:`actuator_chain`); None for a simulator without actuator state.
        """
        chain = self.actuator_chain(sim, passes, tol)
        return None if chain is None else chain.track

    def actuator_chain(self, sim: Optional[physics.Simulator] = None, passes: int = 20, tol: float = 1e-8,
                       start: Optional["ActuatorChain"] = None) -> Optional["ActuatorChain"]:
        """Solve the actuator state's chain ``s[k+1] = F_k(s[k])`` over the whole bag.

        The actuator state follows the chain ``s[k+1] = F_k(s[k])``: one simulator step from
        the recorded state of command ``k`` with actuator state ``s[k]``. Run one command at a
        time that is a bag's length of batch-1 steps, so the chain is solved in passes of one
        batched step over all commands, each from the last estimate, until it changes by less
        than ``tol`` (relative):

        * first, at most ``passes`` times, as a first-order lag, which it is over a step:
          ``s[k+1] = c s[k] + (1 - c) T[k]`` with ``c = exp(-dt / tau)``, ``T[k]`` the step's
          mean target taken from the batched step and the recurrence run in closed form. ``T``
          depends on ``s`` through the motion within the step (a rotor's speed moves the body,
          which moves the rate loop's target): a pass gains about a factor 10 on a quadrotor;
        * where a pass does not halve the change, as the plain chain from the first estimate:
          ``s[k+1] = F_k(s_old[k])``, exact ``n`` steps into a run after ``n`` passes and
          converging as fast as the chain forgets its start (at most SHIFT_PASSES passes). A
          lagged torque moving a light, lightly damped arm joint moves the drive's PD torque
          more than the lag pulls it, and the first form diverged there (0.017 s lag, a third of
          the damping: each pass 3x further off, the fit 6 % off); Newton's method on the
          chain diverged too with the arm's joint friction (its steep Jacobian at rest).

        Each run of consecutive commands starts from the simulator's default (hover speeds, zero
        torque): the first ``warmup`` starts of a run are not used. ``start``: the chain at
        nearby parameter values, its track the first estimate (and its form the first form).
        No gradient flows out (sysid adds the parameters'); cached per simulator.
        """
        sim = sim or self.sim
        cache = getattr(sim, "_diffsim_actuator_chain", None)
        if cache is not None and cache[0] is self:
            return cache[1]
        cfg = sim.config
        tau = cfg.rotors.motor_time_constant if sim.rotors is not None else cfg.actuator_lag
        if not tau > 0:
            return None
        st = self.command_states(sim)
        first = st.actuator.detach()
        init = first if start is None else start.track.detach().to(first.dtype)
        shift = start is not None and start.shift                  # the lag alone did not do there
        c = math.exp(-cfg.dt / tau)
        guess, last = init, None
        chain_start = np.ones(len(self.cmd_stamp), dtype=bool)
        chain_start[1:] = self.run[:-1] < 2          # command k-1 not one step before command k
        s0 = first.cpu().numpy()
        cs = torch.as_tensor(chain_start, device=first.device)[:, None]
        n, limit = 0, SHIFT_PASSES if shift else passes
        while n < limit:
            n += 1
            with torch.no_grad():
                out = sim.step(st.replace(actuator=guess), self.cmd).actuator
            if shift:
                new = torch.where(cs, first, torch.cat([first[:1], out[:-1]]))
            else:
                g = guess.cpu().numpy()
                new = torch.as_tensor(_lag_filter((out.cpu().numpy() - c * g) / (1 - c), c, chain_start, s0),
                                      dtype=out.dtype, device=out.device)
            change = float((new - guess).abs().max())
            guess = new
            if change <= tol * (1.0 + float(guess.abs().max())):
                break
            if not shift and last is not None and change > 0.5 * last:
                # The lag alone does not converge: the plain chain from the first estimate.
                shift, guess, last, n, limit = True, init, None, 0, SHIFT_PASSES
                continue
            last = change
        chain = ActuatorChain(guess, chain_start, shift)
        sim._diffsim_actuator_chain = (self, chain)
        return chain

    def command_states(self, sim: physics.Simulator) -> physics.State:
        """Return the simulator state at every command (batch M).

        It holds the recorded q, v and the delay line of the preceding commands; the actuator state
        is the simulator's default.
        """
        si = torch.as_tensor(self.cmd_state, device=self.q.device)
        with torch.no_grad():
            st = sim.initial_state(self.q[si], self.v[si])
            d = sim.config.command_delay
            if d > 0:
                k = torch.arange(len(self.cmd_stamp), device=self.q.device)
                st = st.replace(delay=torch.stack([self.cmd[(k - d + m).clamp(min=0)] for m in range(d)], -2))
        return st

    def rollout(self, start: np.ndarray, horizons: Sequence[int], sim: Optional[physics.Simulator] = None
                ) -> Dict[int, torch.Tensor]:
        """Predicted velocities (len(start), nv) at each horizon, from the recorded states."""
        sim = sim or self.sim
        K = max(horizons)
        state = self.initial(start, sim)
        start_t = torch.as_tensor(start, device=self.q.device)
        last = self.cmd.shape[0] - 1
        out = {}
        for m in range(K):
            state = sim.step(state, self.cmd[(start_t + m).clamp(max=last)])
            if m + 1 in horizons:
                out[m + 1] = state.v
        return out

    def predict(self, horizons: Sequence[int], max_starts: Optional[int] = None,
                sim: Optional[physics.Simulator] = None, chunk: int = 4096) -> Dict[int, Prediction]:
        """k-step predictions for every valid start (strided down to ``max_starts`` for k > 1)."""
        horizons = sorted({int(k) for k in horizons})
        if not horizons or horizons[0] < 1:
            raise AnalysisError(f"horizons must be positive integers, got {horizons}")
        out: Dict[int, Prediction] = {}
        # One rollout per group of horizons. With max_starts, the one-step predictions keep
        # every start (they are cheap) and the longer ones share one strided start set.
        if max_starts is None:
            groups = [horizons]
        else:
            groups = [g for g in ([k for k in horizons if k == 1], [k for k in horizons if k > 1]) if g]
        with torch.no_grad():
            for ks in groups:
                starts = self.valid_starts(min(ks))
                if max_starts is not None and ks[0] > 1 and len(starts) > max_starts:
                    starts = starts[np.unique(np.linspace(0, len(starts) - 1, max_starts).round().astype(np.int64))]
                vel = {}
                # In chunks: the batched step is fastest at a few thousand states (cache-sized).
                parts = [self.rollout(starts[a:a + chunk], ks, sim) for a in range(0, len(starts), chunk)]
                if parts:
                    vel = {k: torch.cat([pt[k] for pt in parts]) for k in ks}
                for k in ks:
                    tgt = self.target_index(starts, k) if len(starts) else starts
                    sel = (self.run[starts] >= k) & (tgt >= 0)
                    if not sel.any():
                        out[k] = Prediction(k, starts[:0], starts[:0], self.v[:0], self.v[:0])
                        continue
                    out[k] = Prediction(k, starts[sel], self.t_state[tgt[sel]], vel[k][torch.as_tensor(sel)],
                                        self.v[torch.as_tensor(tgt[sel])])
        return out


@dataclass
class ActuatorChain:
    """:meth:`Replay.actuator_chain`'s result.

    The actuator state at every command (M, na), where a run of consecutive commands starts (M,)
    and whether it took the plain chain.
    """

    track: torch.Tensor
    chain_start: np.ndarray
    shift: bool = False


def _lag_filter(T: np.ndarray, c: float, chain_start: np.ndarray, s0: np.ndarray) -> np.ndarray:
    """``s[k+1] = c s[k] + (1 - c) T[k]``, restarting at ``s0[k]`` where ``chain_start[k]``.

    It runs in blocks, each a closed form ``s[b+i] = c^i (s[b] + (1 - c) sum_{j<i} c^-(j+1) T[b+j])``
    with ``c^-i`` kept below e^30.
    """
    M = T.shape[0]
    s = np.empty_like(T)
    B = int(max(1, min(1024, 30.0 / max(-math.log(c), 1e-12))))
    starts = list(np.nonzero(chain_start)[0]) + [M]
    for a, b in zip(starts[:-1], starts[1:]):
        cur = s0[a]
        k = a
        while k < b:
            n = min(B, b - k)
            i = np.arange(n, dtype=np.float64)
            ci = c ** i                                  # c^i, i = 0..n-1
            inv = c ** -(i + 1)
            acc = np.cumsum(T[k:k + n] * inv[:, None], axis=0)        # sum_{j<=i} c^-(j+1) T[k+j]
            s[k] = cur
            if n > 1:
                s[k + 1:k + n] = (ci[1:, None] * (cur + (1 - c) * acc[:-1]))
            # state after the block's last step
            cur = c ** n * (cur + (1 - c) * acc[-1])
            k += n
    return s


# ---------------------------------------------------------------------------- metrics
def error_stats(v_pred: torch.Tensor, v_true: torch.Tensor, names: Sequence[str]) -> Dict[str, Any]:
    """RMSE, bias (mean of predicted - actual) and maximum |error| per dof, and overall."""
    e = (v_pred - v_true).detach().cpu().numpy()
    if e.shape[0] == 0:
        return {"count": 0, "per_dof": {}, "rmse": float("nan")}
    per = {}
    for i, n in enumerate(names):
        per[n] = {"rmse": float(np.sqrt((e[:, i] ** 2).mean())), "bias": float(e[:, i].mean()),
                  "max_abs": float(np.abs(e[:, i]).max())}
    return {"count": int(e.shape[0]), "rmse": float(np.sqrt((e ** 2).mean())), "per_dof": per}


def recorded_predictions(data: BagData, names: Sequence[str]) -> np.ndarray:
    """Return the velocities of /diffsim/predicted_state, arms in the joint order ``names``."""
    if data.kind != "arm":
        return data.pred_v
    missing = [j for j in names if j not in data.pred_joint_names]
    if missing:
        raise AnalysisError(f"{data.path}: /diffsim/predicted_state lacks joint(s) {missing}")
    return data.pred_v[:, [data.pred_joint_names.index(j) for j in names]]


def online_prediction_stats(rp: Replay) -> Optional[Dict[str, Any]]:
    """Error of the controller's own predictions (/diffsim/predicted_state).

    The predictions are compared with the states recorded at the stamps they were made for.
    """
    d = rp.data
    if d.pred_t is None or len(d.pred_t) == 0:
        return None
    pv = recorded_predictions(d, rp.dof_names)
    j = np.clip(np.searchsorted(rp.t_state, d.pred_t), 0, len(rp.t_state) - 1)
    ok = rp.t_state[j] == d.pred_t
    if not ok.any():
        return {"count": 0, "matched": 0, "note": "no prediction stamp matches a recorded state stamp"}
    st = error_stats(torch.as_tensor(pv[ok]), rp.v[torch.as_tensor(j[ok])].cpu(), rp.dof_names)
    st["matched"] = int(ok.sum())
    st["unmatched"] = int((~ok).sum())
    return st
