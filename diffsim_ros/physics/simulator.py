"""The differentiable simulator: a thin stateful convenience over the pure step.

    sim = Simulator(model, SimConfig(dt=1e-3))
    state = sim.initial_state(q0, v0)              # or sim.initial_state(batch=64)
    state = sim.step(state, action)                # returns a new State
    traj = sim.rollout(state, policy_or_actions, steps)

Underneath (see :mod:`.pipeline` and :mod:`.system`): ``sim.system`` is the frozen
:class:`System` and ``sim.step`` is ``pipeline.step(sim.system, state, action)`` plus
the NaN guard. Each (sub)step runs, in order:

1. **command**: the action enters the command-delay line; the delayed command is used;
2. **kinematics**: body placements, motion subspaces and twists, once (the record);
3. **actuation**: the command becomes joint torques (effort, velocity-PD or
   position-PD interfaces, smoothly saturated at the URDF effort limit, through an
   optional first-order lag) or rotor speeds (per-rotor thrust or CTBR);
4. **passive forces**: URDF joint damping, smoothed Coulomb joint friction, and
   joint limits as a smooth penalty;
5. **contact**: smooth penalty ``lambda_n = k max(0, -gap)^2`` plus damping, and
   regularised Coulomb friction, between collision primitives and the ground
   plane (optionally between sphere primitives of different links);
6. **aerodynamics**: rotor wrench and body drag on a floating base;
7. **acceleration**: M qdd = tau - b + J^T f, linearly implicit in the stiff terms;
8. **integration**: semi-implicit Euler or RK4, the base quaternion renormalised.

A non-finite value stops the step with :class:`SimulationError`, naming the
environment and the quantity.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Callable, List, Mapping, Optional, Sequence, Union, cast

import torch

from .algorithms import _cross
from .kinematics import kinematics_record
from .model import Model
from .pipeline import Data, batch_action, check_finite, guard, latency_lookback, step as pure_step
from .quadrotor import RotorConfig, Rotors  # noqa: F401  (re-exported)
from ..schema import ConfigError  # noqa: F401  (re-exported)
from .sim_config import ACTUATORS, INTEGRATORS, SimConfig  # noqa: F401  (re-exported)
from .stages.contact import contact
from .stages.integration import integrate as _integrate
from .state import SimulationError, State, Trajectory  # noqa: F401  (re-exported)
from .system import System, build_system

if TYPE_CHECKING:                       # for the annotations: Simulator imports .compiled when compile is asked for
    from .compiled import CompiledStep, ExportedStep

# Also importable from here, as before the pipeline had modules of its own.
__all__ = ["ACTUATORS", "INTEGRATORS", "ConfigError", "RotorConfig", "Rotors", "SimConfig", "SimulationError",
           "Simulator", "State", "Trajectory"]


class Simulator:
    """Batched differentiable simulator over a :class:`Model` (or a ready :class:`System`)."""

    def __init__(self, model: Union[Model, System], config: Optional[SimConfig] = None,
                 compile: Union[bool, str] = False, varying: Sequence[str] = ()):
        """Set up the simulator; ``compile`` and ``varying`` choose how it steps.

        compile: True steps through :class:`~diffsim_ros.physics.compiled.CompiledStep`
        (Inductor; minutes the first time, then cached; differentiable); ``"aot"`` through
        :class:`~diffsim_ros.physics.compiled.ExportedStep` (compiled ahead of time, forward
        only, the fastest at one environment). Either way ``last_data`` stays None.
        ``varying`` (with compile=True): names of registry parameters (:mod:`.registry`) that
        the compiled graphs take as inputs instead of constants; :meth:`with_values` then gives
        simulators of other values of them that share the graphs (domain randomisation).
        """
        if isinstance(model, System):
            self.system = model
        else:
            self.system = build_system(model, config)
        self.last_data: Optional[Data] = None
        self._compiled: Optional[Union[CompiledStep, ExportedStep]] = None
        self._values: Optional[torch.Tensor] = None   # the varying parameters' vector the compiled graphs take
        self._base = self.system        # the system those graphs hold (with_values applies values to it)
        if varying and compile is not True:
            raise ValueError("varying parameters are inputs of the compiled step: give compile=True")
        if compile not in (False, True, "aot"):
            raise ValueError(f"compile must be False, True or 'aot', not {compile!r}")
        if compile and self.system.config.contact_model == "soft":
            raise ConfigError("{key}: the soft contact has no compiled step (its solve iterates until it converges, "
                              "a count a graph cannot hold); step it eagerly", "simulator.contact_model")
        if compile == "aot":
            from .compiled import ExportedStep
            self._compiled = ExportedStep(self.system)
        elif compile:
            from .compiled import CompiledStep, pack_values
            from .registry import PARAMETERS
            unknown = [n for n in varying if n not in PARAMETERS or not PARAMETERS[n].differentiable]
            if unknown:
                raise ValueError(f"{unknown}: not parameters the compiled step can take as inputs (the registry's "
                                 "differentiable ones; a lag needs the system's structure to have one)")
            absent = {n: PARAMETERS[n].need(self.system) for n in varying if not PARAMETERS[n].applies(self.system)}
            if absent:
                raise ValueError("not parameters of this system: " + ", ".join(
                    f"'{n}' (needs {need})" for n, need in absent.items())
                    + "; 'joints' means actuated joints without rotors")
            spec = [(n, PARAMETERS[n].size(self.system)) for n in varying]
            self._compiled = CompiledStep(self.system, varying=spec)
            if spec:
                nominal = {n: PARAMETERS[n].nominal(self.system) for n in varying}
                self._values = pack_values(spec, nominal, self.system.model.mass)

    def with_values(self, values: Mapping[str, object], per_episode: bool = False) -> "Simulator":
        """Return a simulator of this one's system with the registry ``values`` applied.

        The values are applied as by :func:`~.registry.apply_values`; the new simulator steps
        through the same compiled graphs, the values passed to them as inputs: every parameter this
        simulator was compiled with as ``varying``, and no other. ``per_episode``: each value is
        (B, size), one row per environment (:func:`~.registry.apply_per_episode`); the simulator
        then steps batches of B. Eager simulators (compiled False) take them too, applied to their
        system.
        """
        from .compiled import pack_values
        from .registry import apply_per_episode, apply_values

        apply = apply_per_episode if per_episode else apply_values
        spec = getattr(self._compiled, "varying", ())
        if self._compiled is None:
            return Simulator(apply(self.system, values))
        if not spec:
            raise ValueError("with_values needs a simulator compiled with varying parameters")
        new = Simulator.__new__(Simulator)
        new._base, new.system = self._base, apply(self._base, values)
        new.last_data, new._compiled = None, self._compiled
        new._values = pack_values(spec, values, self.system.model.mass, per_episode)
        return new

    @property
    def compiled(self) -> Union[bool, str]:
        """How it steps: False (eager), True (CompiledStep) or ``"aot"`` (ExportedStep)."""
        if self._compiled is None:
            return False
        from .compiled import ExportedStep
        return "aot" if isinstance(self._compiled, ExportedStep) else True

    def replace(self, **changes) -> "Simulator":
        """Return a simulator over ``self.system.replace(**changes)`` (calibration, randomisation).

        It is an eager one: a compiled step holds its system's tensors as constants.
        """
        return Simulator(self.system.replace(**changes))

    # ------------------------------------------------------------ the system's fields
    @property
    def model(self) -> Model:
        return self.system.model

    @property
    def config(self) -> SimConfig:
        return self.system.config

    @property
    def rotors(self) -> Optional[Rotors]:
        return self.system.rotors

    @property
    def kp(self) -> torch.Tensor:
        return self.system.kp

    @property
    def kd(self) -> torch.Tensor:
        return self.system.kd

    @property
    def act_index(self) -> torch.Tensor:
        return self.system.act_index

    @property
    def actuated_joints(self) -> List[str]:
        return list(self.system.actuated_joints)

    @property
    def effort_limit(self) -> torch.Tensor:
        return self.system.effort_limit

    @property
    def ground_normal(self) -> torch.Tensor:
        return self.system.ground_normal

    @property
    def nbase(self) -> int:
        return self.system.nbase

    @property
    def action_dim(self) -> int:
        return self.system.action_dim

    @property
    def n_act(self) -> int:
        return self.system.n_act

    @property
    def pt_body(self) -> torch.Tensor:
        return self.system.contact.body

    @property
    def pt_local(self) -> torch.Tensor:
        return self.system.contact.local

    @property
    def pt_radius(self) -> torch.Tensor:
        return self.system.contact.radius

    @property
    def pairs(self) -> torch.Tensor:
        return self.system.contact.pairs

    # ------------------------------------------------------------ states
    def initial_state(self, q: Optional[torch.Tensor] = None, v: Optional[torch.Tensor] = None,
                      batch: Sequence[int] = (), latency=None) -> State:
        """Return a state at rest (or at the given q, v); actuators and delay line at hover/zero.

        ``latency``: each environment's command latency in substeps (a number or a tensor over
        the batch, whole numbers up to ``config.max_latency``; default 0), with max_latency > 0.
        """
        m, cfg = self.model, self.config
        if q is None:
            q = m.neutral_configuration(tuple(batch) if not isinstance(batch, int) else (batch,))
        q = q.to(dtype=m.dtype, device=m.device)
        if v is None:
            v = torch.zeros(q.shape[:-1] + (m.nv,), dtype=m.dtype, device=m.device)
        bshape = q.shape[:-1]
        actuator = None
        weight = m.mass.sum(0) * -m.gravity[2]        # N; (B,) with per-environment masses
        if weight.dim():
            weight = weight.reshape(bshape + (1,))
        if self.rotors is not None:
            hover = weight.clamp(min=0) / self.rotors.n
            actuator = self.rotors.speed_for_thrust(hover).expand(bshape + (self.n_act,)).clone()
        elif cfg.actuator_lag > 0:
            actuator = torch.zeros(bshape + (self.n_act,), dtype=m.dtype, device=m.device)
        latency_in, delay, latency = latency, None, None
        line = cfg.command_delay + latency_lookback(self.system)
        if cfg.max_latency > 0:
            latency = torch.zeros(bshape, dtype=m.dtype, device=m.device)
            if latency_in is not None:
                given = torch.as_tensor(latency_in, dtype=m.dtype, device=m.device)
                if not bool(((given >= 0) & (given <= cfg.max_latency) & (given == given.round())).all()):
                    raise ValueError(f"latency must be whole substeps in [0, {cfg.max_latency}] "
                                     f"(simulator.max_latency), got {given.tolist()}")
                latency = latency + given
        elif latency_in is not None and bool(torch.as_tensor(latency_in).ne(0).any()):
            raise ValueError("a per-environment latency needs simulator.max_latency > 0")
        if line > 0:
            delay = torch.zeros(bshape + (line, self.action_dim), dtype=m.dtype, device=m.device)
            if cfg.actuator == "ctbr":
                delay[..., 0] = weight
            elif cfg.actuator == "rotor_thrust":
                delay[...] = (weight[..., None] if weight.dim() else weight) / cast(Rotors, self.rotors).n
            elif cfg.actuator == "position":
                delay[...] = self.joint_positions(q)[..., self.act_index].unsqueeze(-2)
        t = torch.zeros(bshape, dtype=m.dtype, device=m.device)
        return State(q=q, v=v, actuator=actuator, delay=delay, t=t, latency=latency)

    def joint_positions(self, q: torch.Tensor) -> torch.Tensor:
        return q[..., 7:] if self.model.floating_base else q

    def joint_velocities(self, v: torch.Tensor) -> torch.Tensor:
        return v[..., 6:] if self.model.floating_base else v

    def integrate(self, q: torch.Tensor, v: torch.Tensor, h: float) -> torch.Tensor:
        """Return q (+) v h: joints add; a floating base moves along its body-frame twist.

        The base's position moves by R v h, its orientation by the exact exponential of w h, and
        its quaternion is renormalised (smoothly, so gradients pass).
        """
        return _integrate(self.model.floating_base, q, v, h)

    # ------------------------------------------------------------ inspection
    def contact_forces(self, q: torch.Tensor, v: torch.Tensor):
        """For inspection: contact wrenches per body (..., nb, 6) in the world frame about the world origin.

        With them, every contact point's gap (..., P) (m, negative in penetration) and ground
        normal force (..., P) (N).
        """
        m = self.model
        batch = q.shape[:-1]
        kin = kinematics_record(m, q.reshape(-1, m.nq).T, v.reshape(-1, m.nv).T, batch)
        c = contact(self.system, kin, select=False)
        F = c.wrench[:, 0:3]
        w = torch.cat((F, c.wrench[:, 3:6] + _cross(kin.o.expand_as(F), F)), 1)   # about the world origin

        def out(x):
            return x.movedim(-1, 0).reshape(batch + x.shape[:-1])
        cs = self.system.contact
        return out(w), out(c.flat(cs, c.gap, 0.0)), out(c.flat(cs, c.normal, 0.0))

    # ------------------------------------------------------------ public step
    def step(self, state: State, action: torch.Tensor) -> State:
        """Advance by ``config.dt``: returns a new :class:`State` (the input is not changed).

        The last step's :class:`Data` is kept as ``last_data`` (eager steps only).
        """
        if self._compiled is not None:
            if self._values is None:
                return self._compiled(state, action)
            return cast("CompiledStep", self._compiled)(state, action, self._values)   # values: a CompiledStep's
        action = batch_action(self.system, state, action)
        new, data = pure_step(self.system, state, action)
        self.last_data = data
        if self.config.nan_check:
            guard(state, new, action, data.qdd)
        return new

    def check_finite(self, state: State, where: str = "result", **extra: torch.Tensor) -> None:
        """Raise :class:`SimulationError` naming the first environment and quantity that is not finite."""
        check_finite(state, where=where, **extra)

    def rollout(self, state: State, actions: Union[torch.Tensor, Callable[[State], torch.Tensor]],
                steps: Optional[int] = None) -> Trajectory:
        """Run ``steps`` steps from ``state`` with an action sequence or a policy.

        The action sequence is (T, ..., n_act), the policy ``policy(state) -> action``; returns the
        stacked trajectory, differentiable.
        """
        if callable(actions):
            if steps is None:
                raise ValueError("rollout with a policy needs 'steps'")
            policy = actions
        else:
            seq = torch.as_tensor(actions, dtype=state.q.dtype, device=state.q.device)
            steps = seq.shape[0] if steps is None else steps
            if steps > seq.shape[0]:
                raise ValueError(f"asked for {steps} steps but the action sequence has {seq.shape[0]}")
            policy = None
        qs, vs, acts = [state.q], [state.v], []
        for k in range(steps):
            a = policy(state) if policy is not None else seq[k]
            state = self.step(state, a)
            qs.append(state.q)
            vs.append(state.v)
            acts.append(torch.as_tensor(a, dtype=state.q.dtype).expand(state.q.shape[:-1] + (self.action_dim,)))
        actions_out = torch.stack(acts) if acts else torch.zeros((0,) + state.q.shape[:-1] + (self.action_dim,))
        return Trajectory(q=torch.stack(qs), v=torch.stack(vs), actions=actions_out, final=state)
