"""The pure simulation step: ``step(sys, state, action) -> (state, data)``.

One pipeline per substep, as MuJoCo's: kinematics (the record, once) -> actuation ->
passive forces -> contact -> aerodynamics -> acceleration -> integration. Every stage
is a function of the frozen :class:`~diffsim_ros.physics.system.System` and tensors,
so the step is differentiable in the state, the action and every tensor of the system,
has no side effects, and leaves the NaN guard (a host synchronisation) to the caller:

    sys = build_system(model, SimConfig(dt=2e-3))
    state, data = step(sys, state, action)
    check_finite(state, action=action, qdd=data.qdd)     # optional, one host sync

``Data`` is the record of the last substep: its kinematics (at the substep's start),
the accelerations and the contact quantities.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, NamedTuple, Optional, Tuple, cast

import torch

from . import laws
from .algorithms import gravity_joint_forces
from .kinematics import Kinematics, kinematics_record
from .stages.acceleration import acceleration
from .stages.actuation import Servo, actuation, lagged_torque, servo_slope
from .stages.aerodynamics import aerodynamics
from .stages import cone
from .stages.contact import Contact, contact, soft_forces
from .stages.integration import qdot, rk4_combine, semi_implicit_euler
from .stages.passive import passive
from .state import SimulationError, State
from .system import System


@dataclass
class Data:
    """What the last substep computed.

    qdd (..., nv) the accelerations; kin the kinematics record (batch-last, at the substep's
    start); contact the wrenches per body (nb, 6, B) about kin.o and the evaluated points' gaps
    and normal forces (see :class:`~diffsim_ros.physics.stages.contact.Contact`; ``Contact.flat``
    lays them out per point).
    """

    qdd: torch.Tensor
    kin: Kinematics
    contact: Contact


class _Forces(NamedTuple):
    tau: torch.Tensor                 # (B, nv) generalised forces but contact
    act: Optional[torch.Tensor]       # new actuator state
    contact: Contact
    D: Optional[torch.Tensor]         # (B, nv) implicit damping diagonal
    K: Optional[torch.Tensor]         # (B, nv) implicit stiffness diagonal
    servo: Optional[Servo] = None     # a saturated joint servo to re-linearise (servo_iterations)
    lag: Optional[Tuple[Optional[torch.Tensor], Optional[torch.Tensor]]] = None  # a lagged drive's implicit (kd, kp)


def _pad(sys: System, x: torch.Tensor) -> torch.Tensor:
    """Joint-part (B, nj) -> (B, nv) with zeros on a floating base."""
    if not sys.nbase:
        return x
    return torch.cat((torch.zeros(x.shape[:-1] + (6,), dtype=x.dtype, device=x.device), x), -1)


def _forces(sys: System, kin: Kinematics, q, v, command, act, h: float, implicit: bool) -> _Forces:
    cfg, m = sys.config, sys.model
    nb = sys.nbase
    gravity = None
    if cfg.gravity_compensation and sys.rotors is None and m.nj:
        # The controller's gravity torques: the nominal model's inertias on this record's
        # placements (calibration changes inertial parameters, never the kinematic tree).
        gravity = gravity_joint_forces(sys.nominal, kin.S, kin.inertia(sys.nominal)).T[:, nb:]
    a = actuation(sys, q, v, command, act, h, gravity)
    tau = aerodynamics(sys, v, cast(torch.Tensor, a.speed)) if a.tau is None else a.tau   # rotors: speed, no tau
    D = K = None
    if m.nj:
        qj = q[:, 7:] if nb else q
        pas = passive(sys, qj, v[:, nb:])
        tau = tau + _pad(sys, pas.tau)
        if implicit:
            Dj, Kj = pas.D, pas.K
            if a.kd is not None:
                Dj = Dj.index_add(-1, sys.act_index, a.kd.expand(Dj.shape[:-1] + a.kd.shape[-1:]))
            if a.kp is not None:
                Kj = Kj.index_add(-1, sys.act_index, a.kp.expand(Kj.shape[:-1] + a.kp.shape[-1:]))
            D, K = _pad(sys, Dj), _pad(sys, Kj)
    implicit_friction = (implicit and cfg.ground and sys.contact.n > 0 and cfg.friction > 0)
    # The penalty's slopes enter the solve when asked for (the soft contact's rows always do).
    normal = implicit and cfg.implicit_contact and cfg.contact_model != "soft" and cfg.ground and sys.contact.n > 0
    servo = a.servo if (implicit and D is not None) else None
    lag = (a.kd, a.kp) if (implicit and D is not None and cfg.actuator_lag > 0 and a.kd is not None) else None
    return _Forces(tau, a.state, contact(sys, kin, implicit_friction, normal=normal), D, K, servo, lag)


def applied_forces(sys: System, q: torch.Tensor, v: torch.Tensor, command: torch.Tensor) -> torch.Tensor:
    """Return the generalised forces (B, nv) at batch-first states q (B, nq), v (B, nv) under ``command``.

    ``command`` is (B, action_dim). Contact is excluded: the forces are the actuators' (the
    controller's gravity torques included), the passive joint forces and aerodynamics, explicit (as
    one substep's right-hand side before the implicit terms). For actuators without their own
    state (no actuator_lag, no rotors): with one, the force depends on the history, and this raises
    ValueError.
    """
    if sys.rotors is not None or sys.config.actuator_lag > 0:
        raise ValueError("applied_forces needs an actuator without state (no rotors, actuator_lag 0)")
    kin = kinematics_record(sys.model, q.T, v.T)
    return _forces(sys, kin, q, v, command, None, sys.config.dt / sys.config.substeps, False).tau


def _servo_refinement(sys: System, f: _Forces, v: torch.Tensor, h: float):
    """Return the implicit diagonals (D, K), batch-last, with the saturated servo's slopes re-taken.

    The slopes are re-taken from a predicted end of the substep (accelerations qdd, batch-last):
    each call moves them half way to servo_slope's secants there (relaxed, so that the iteration
    settles where a plain one would alternate between a flat and a steep secant).
    """
    nb, idx, servo = sys.nbase, sys.act_index, cast(Servo, f.servo)   # made for a servo to re-linearise
    cur: List[Optional[torch.Tensor]] = [servo.slope, servo.brake]

    def refine(qdd: torch.Tensor):
        va_next = (v + h * qdd.T)[:, nb:][:, idx]
        slope, brake = servo_slope(sys, servo, va_next, h)
        cur[0] = laws.relaxed(cur[0], slope)
        ds = cast(torch.Tensor, cur[0]) - servo.slope
        dd = sys.kd * ds
        if brake is not None:
            cur[1] = laws.relaxed(cur[1], brake)
            dd = dd + (cast(torch.Tensor, cur[1]) - cast(torch.Tensor, servo.brake))   # only a braked servo gets one
        zero = torch.zeros_like(v[:, nb:])
        D = cast(torch.Tensor, f.D) + _pad(sys, zero.index_add(-1, idx, dd))   # a servo comes with D and K
        K = cast(torch.Tensor, f.K)
        if sys.config.actuator == "position":
            K = K + _pad(sys, zero.index_add(-1, idx, sys.kp * ds))
        return D.T, K.T
    return refine


def _substep(sys: System, q, v, command, act, h: float, warm: Optional[torch.Tensor] = None):
    """One substep on flat batch-first q (B, nq), v (B, nv): (q, v, actuator state, qdd, kin, contact).

    ``warm`` (nv, B): the soft contact's solve starts there (the last substep's accelerations).
    """
    cfg, m = sys.config, sys.model
    fb = m.floating_base
    kin = kinematics_record(m, q.T, v.T)
    if cfg.integrator == "semi_implicit":
        f = _forces(sys, kin, q, v, command, act, h, cfg.implicit_damping)
        refine = (_servo_refinement(sys, f, v, h) if f.servo is not None and cfg.servo_iterations else None)
        con = f.contact

        def solve(con):
            rows = con.soft
            return acceleration(sys, kin, f.tau.T, con.wrench, h, None if f.D is None else f.D.T,
                                None if f.K is None else f.K.T, v.T, con.damping, refine, cfg.servo_iterations,
                                con.normal_blocks,
                                None if rows is None else (lambda A, rhs: cone.solve(A, rhs, rows, warm)))
        qdd = solve(con)
        if con.soft is not None:
            con = soft_forces(sys, con, qdd)         # the ground's forces as the solve applied them
        qdd = qdd.T
        q_new, v_new = semi_implicit_euler(fb, q, v, qdd, h)
        act = f.act
        if f.lag is not None:
            va_new = v_new[:, sys.nbase:][:, sys.act_index]
            act = lagged_torque(act, f.lag[0], f.lag[1], h * qdd[:, sys.nbase:][:, sys.act_index], h * va_new)
        return q_new, v_new, act, qdd, kin, con

    # RK4: actuation (PD, rate loop, drag) is evaluated at every stage from the actuator
    # state at the start of the substep.
    def deriv(qs, vs, kin_s=None):
        kin_s = kinematics_record(m, qs.T, vs.T) if kin_s is None else kin_s
        f = _forces(sys, kin_s, qs, vs, command, act, h, False)
        return (qdot(fb, qs, vs), acceleration(sys, kin_s, f.tau.T, f.contact.wrench).T), f

    k1, f1 = deriv(q, v, kin)
    k2, _ = deriv(q + 0.5 * h * k1[0], v + 0.5 * h * k1[1])
    k3, _ = deriv(q + 0.5 * h * k2[0], v + 0.5 * h * k2[1])
    k4, _ = deriv(q + h * k3[0], v + h * k3[1])
    q_new, v_new = rk4_combine(fb, q, v, (k1, k2, k3, k4), h)
    return q_new, v_new, f1.act, k1[1], kin, f1.contact


def step(sys: System, state: State, action: torch.Tensor) -> Tuple[State, Data]:
    """Advance by ``sys.config.dt``: the new :class:`State` and the last substep's :class:`Data`.

    Pure: the inputs are not changed. The only host synchronisation is the contact stage's
    choice of point groups on the CPU in eager mode (none under torch.compile or on a GPU).
    """
    cfg, m = sys.config, sys.model
    batch = state.q.shape[:-1]
    na = sys.action_dim
    action = batch_action(sys, state, action)
    delay = state.delay
    h = cfg.dt / cfg.substeps
    q, v = state.q.reshape(-1, m.nq), state.v.reshape(-1, m.nv)
    B = q.shape[0]
    if cfg.max_latency > 0:
        commands, delay = latency_commands(sys, cast(torch.Tensor, delay), action, state.latency)   # a line of K >= 1
        commands = [c.reshape(B, na) for c in commands]
    else:
        if cfg.command_delay > 0:
            command = cast(torch.Tensor, delay)[..., 0, :]            # the line holds command_delay commands
            delay = torch.cat((cast(torch.Tensor, delay)[..., 1:, :], action.unsqueeze(-2)), -2)
        else:
            command = action
        commands = [command.reshape(B, na)] * cfg.substeps
    act = None if state.actuator is None else state.actuator.reshape(B, state.actuator.shape[-1])
    warm = None
    for command in commands:
        q, v, act, qdd, kin, con = _substep(sys, q, v, command, act, h, warm)
        warm = qdd.detach().T if con.soft is not None else None
    kin = kin._replace(batch=tuple(batch))
    new = State(q=q.reshape(batch + (m.nq,)), v=v.reshape(batch + (m.nv,)),
                actuator=None if act is None else act.reshape(batch + act.shape[-1:]), delay=delay,
                t=state.t + cfg.dt if state.t is not None else None, latency=state.latency)
    return new, Data(qdd=qdd.reshape(batch + (m.nv,)), kin=kin, contact=con)


def latency_lookback(sys: System) -> int:
    """K: how many control steps back a command of the largest latency can reach.

    K = ceil(max_latency / substeps); the delay line then holds command_delay + K commands.
    """
    return -(-int(sys.config.max_latency) // int(sys.config.substeps))


def latency_commands(sys: System, line: torch.Tensor, action: torch.Tensor, latency: Optional[torch.Tensor]):
    """Return the command of each substep and the delay line after the step, under per-environment latency.

    ``line`` (..., D + K, na) holds the last D + K actions, oldest first (D = command_delay, K =
    :func:`latency_lookback`); with the current action appended, entry K is the action of D steps
    ago, entry K - c that of D + c steps ago. Substep j of an environment of latency L (substeps)
    applies the action issued (L - j) substeps before it would apply without latency, that is
    c = ceil((L - j) / substeps) control steps further back (none once j >= L). The choice is a
    comparison per environment, so the commands stay differentiable in every action and the
    latency is an input tensor, not a constant of the step.
    """
    cfg = sys.config
    S, K = int(cfg.substeps), latency_lookback(sys)
    seq = torch.cat((line, action.unsqueeze(-2)), -2)
    window = seq[..., :K + 1, :]                                    # actions D + K ... D steps ago
    L = torch.zeros(action.shape[:-1], dtype=action.dtype, device=action.device) if latency is None else \
        latency.to(action.dtype).clamp(0, cfg.max_latency)
    slots = torch.arange(K + 1, dtype=action.dtype, device=action.device)
    commands = []
    for j in range(S):
        back = torch.ceil((L - j) / S).clamp(min=0)                 # control steps further back
        weight = (slots == (K - back).unsqueeze(-1)).to(action.dtype)   # one-hot over the window
        commands.append((weight.unsqueeze(-1) * window).sum(-2))
    return commands, seq[..., 1:, :]


def batch_action(sys: System, state: State, action) -> torch.Tensor:
    """Return the action as a tensor of the state's dtype and device, expanded to its batch.

    A wrong last dimension is a ValueError naming the interface.
    """
    q = state.q
    na = sys.action_dim
    if (isinstance(action, torch.Tensor) and action.shape[:-1] == q.shape[:-1] and action.shape[-1] == na
            and action.dtype == q.dtype and action.device == q.device):
        return action                   # already the batch's (a view costs microseconds at one environment)
    action = torch.as_tensor(action, dtype=q.dtype, device=q.device)
    if action.shape[-1] != na:
        raise ValueError(f"action has last dimension {action.shape[-1]}, the '{sys.config.actuator}' interface "
                         f"of this simulator expects {na}")
    return action.expand(q.shape[:-1] + (na,))


def guard(before: State, after: State, action: torch.Tensor, qdd: torch.Tensor) -> None:
    """Run the NaN guard of a step: raise SimulationError for a non-finite result.

    The error names the input state instead when that was already bad.
    """
    try:
        check_finite(after, action=action, qdd=qdd)
    except SimulationError:
        check_finite(before, where="input")
        raise


def check_finite(state: State, where: str = "result", **extra: Optional[torch.Tensor]) -> None:
    """Raise :class:`SimulationError` naming the first environment and quantity that is not finite.

    One host synchronisation when all is well (a sum of everything: any NaN or infinity makes it
    non-finite).
    """
    named: List[Tuple[str, Optional[torch.Tensor]]] = [
        ("action", extra.get("action")), ("qdd", extra.get("qdd")), ("q", state.q), ("v", state.v),
        ("actuator state", state.actuator)]
    items = [(n, x) for n, x in named if x is not None]
    total = cast(torch.Tensor, sum(x.detach().sum() for _, x in items))   # a tensor: q and v are always there
    if bool(torch.isfinite(total)):
        return
    bshape = state.q.shape[:-1]
    for name, x in items:
        ok = torch.isfinite(x).reshape(x.shape[:len(bshape)] + (-1,)).all(-1)
        if not bool(ok.all()):
            env = tuple(int(i) for i in torch.nonzero(~ok)[0].tolist())
            cols = torch.nonzero(~torch.isfinite(x[env] if env else x)).flatten().tolist()
            env_txt = "the (unbatched) state" if not env else f"environment {env if len(env) != 1 else env[0]}"
            origin = " of the input state" if where == "input" and name != "action" else ""
            raise SimulationError(
                f"non-finite {name} in {env_txt}{origin} "
                f"(entries {cols[:6]}) at t={float(state.t[env]) if state.t is not None else float('nan'):.4f} s; "
                f"{int((~ok).sum())} of {ok.numel()} environments affected")
