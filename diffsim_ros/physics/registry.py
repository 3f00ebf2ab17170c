"""One registry of the physical parameters that calibration, domain randomisation and perturbations change.

The perturbations are the stand-in's; the registry works over the frozen
:class:`~diffsim_ros.physics.system.System`.

    from diffsim_ros.physics.registry import PARAMETERS, apply_values
    p = PARAMETERS["mass_scale"]
    p.unit, p.doc, p.bounds(p.nominal(sys))          # "-", ..., (0.2, 5)
    sys2 = p.apply(sys, torch.tensor([1.2]))         # differentiable in the value
    sys3 = apply_values(sys, {"latency": 1.0, "drag_scale": 2.0})   # registry order, any dict order

Every entry has a name, a unit, a one-line meaning, what the robot needs for it (joints or
rotors), a nominal value read from a system (1-D float64 tensor), bounds and ``apply(sys,
value) -> System``. ``apply`` keeps gradients wherever the quantity is a tensor of the system:
masses, inertias, damping, friction, drag, the thrust factor, and also the time constants
``actuator_lag`` and ``motor_time_constant`` (the lag factor ``1 - exp(-h / tau)`` is smooth in
tau). The first-order lag is a *state* of the step only when the configuration has one, so
``apply`` of a time constant to a system without that state rebuilds it with the state
(structure) and then sets the tensor; ``latency`` (whole control steps of command delay) is
structure alone: the step's delay line has an integer length. System identification fits a
fractional latency outside the step, as a blend of neighbouring commands (see
``analysis.sysid``).

``log_space`` entries are positive quantities that an optimiser should move in log space
(equal relative steps, a bound approached but never crossed into zero or negative values);
``latency`` lives in linear space on [0, high].
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Callable, Dict, Mapping, Optional, Tuple, cast

import torch

from .algorithms import inertials
from .quadrotor import RotorConfig, Rotors
from .system import System, build_system

Tensor = torch.Tensor
#: ``apply(sys, value) -> System``: the value a tensor, or a number or list (torch.as_tensor's input).
_Apply = Callable[[System, object], System]


@dataclass(frozen=True)
class Parameter:
    """A physical parameter: ``size(sys)`` values of ``unit``; see the module doc."""

    name: str
    doc: str
    unit: str
    needs: Optional[str]                  # "joints", "rotors", "ground" (contact on), "floating" or None (any)
    nominal: Callable[[System], Tensor]   # (n,) float64
    bounds: Callable[[Tensor], Tuple[Tensor, Tensor]]
    apply: _Apply
    log_space: bool = True
    structural: bool = False              # apply() may rebuild the system (applied before the others)
    time_like: bool = False               # a time constant or a delay: a multi-start grid helps the fit
    differentiable: bool = True           # apply() keeps gradients in the value
    physical_low: bool = False            # the lower bound is the quantity's own limit (a delay is >= 0): a
                                          # fit that ends there found a value, not a bound to widen
    per_episode: Optional[_Apply] = None  # apply() of one value per environment,
                                          # (B, size): see apply_per_episode
    law: Optional[str] = None             # a parameter of one ground contact law (simulator.contact_model)

    def need(self, sys: System) -> Optional[str]:
        """Return what ``sys`` lacks for this parameter (None: it applies), in words for an error."""
        if not self.applies(sys):
            if self.law is not None and sys.config.ground:
                return f"simulator.contact_model {self.law}, not {sys.config.contact_model}"
            return self.needs
        return None

    def applies(self, sys: System) -> bool:
        if self.needs == "joints":
            return sys.model.nj > 0 and sys.rotors is None
        if self.needs == "rotors":
            return sys.rotors is not None
        if self.needs == "ground":
            return bool(sys.config.ground) and self.law in (None, sys.config.contact_model)
        if self.needs == "floating":
            return bool(sys.model.floating_base)
        return True

    def size(self, sys: System) -> int:
        return int(self.nominal(sys).numel())


# ------------------------------------------------------------------------------ helpers
def _f64(x) -> Tensor:
    return torch.as_tensor(x, dtype=torch.float64).reshape(-1).clone()


def _val(sys: System, value) -> Tensor:
    m = sys.model
    if isinstance(value, Tensor):
        return value.to(dtype=m.dtype, device=m.device)
    return torch.as_tensor(value, dtype=m.dtype, device=m.device)


def _scalar(sys, value) -> Tensor:
    return _val(sys, value).reshape(())


def _scale_bounds(lo: float, hi: float):
    def b(nominal: Tensor):
        return torch.full_like(nominal, lo), torch.full_like(nominal, hi)
    return b


def _scale_bounds_of_nominal(lo: float, hi: float):
    """[lo x nominal, hi x nominal] (a positive nominal)."""
    def b(nominal: Tensor):
        return lo * nominal, hi * nominal
    return b


def _abs_bounds(floor: float, rel_low: float = 1e-3):
    """[rel_low x (nominal or floor), 10 x nominal + floor].

    Positive, so log space works, and wide enough for a zero nominal to grow.
    """
    def b(nominal: Tensor):
        base = torch.where(nominal > 0, nominal, torch.full_like(nominal, floor))
        return rel_low * base, 10.0 * nominal + floor
    return b


# ------------------------------------------------------------------------------ apply()
def _mass_scale(sys, value):
    s = _scalar(sys, value)
    m = sys.model
    return sys.replace(model=m.replace(mass=m.mass * s, inertia=m.inertia * s))


def _link_mass_scale(sys, value):
    s = _val(sys, value).reshape(-1)
    m = sys.model
    return sys.replace(model=m.replace(mass=m.mass * s, inertia=m.inertia * s[:, None, None]))


def _inertia_scale(sys, value):
    m = sys.model
    return sys.replace(model=m.replace(inertia=m.inertia * _scalar(sys, value)))


def _joint_damping(sys, value):
    return sys.replace(model=sys.model.replace(damping=_val(sys, value).reshape(-1)))


def _joint_damping_scale(sys, value):
    m = sys.model
    return sys.replace(model=m.replace(damping=m.damping * _scalar(sys, value)))


def _joint_friction(sys, value):
    return sys.replace(model=sys.model.replace(friction=_val(sys, value).reshape(-1)))


def _ground(name: str, convert=None):
    """apply() of one of the ground contact's scalars (System.contact_stiffness, ...).

    With ``convert`` :func:`_column`, one per environment ((B,), as the contact stage's batch).
    """
    def apply(sys, value):
        v = _scalar(sys, value) if convert is None else convert(sys, value)[:, 0]
        return sys.replace(**{name: v})
    return apply


def _rotors(sys, **changes):
    return sys.replace(rotors=sys.rotors.replace(**changes))


def _drag_scale(convert=None):
    def apply(sys, value):
        k, r = (convert or _scalar)(sys, value), sys.rotors
        return _rotors(sys, drag_linear=r.drag_linear * k, drag_quadratic=r.drag_quadratic * k)
    return apply


def _drag_linear(sys, value):
    return _rotors(sys, drag_linear=_val(sys, value).reshape(3))


def _drag_quadratic(sys, value):
    return _rotors(sys, drag_quadratic=_val(sys, value).reshape(3))


def _thrust_scale(sys, value):
    return _rotors(sys, thrust_scale=sys.rotors.thrust_scale * _scalar(sys, value))


def rebuild(sys: System, cfg) -> System:
    """Rebuild the same physics (model, controller model) under a new structure."""
    new = build_system(sys.model, cfg, nominal=sys.nominal)
    if sys.rotors is not None and new.rotors is not None:
        r = sys.rotors
        new = new.replace(rotors=new.rotors.replace(drag_linear=r.drag_linear, drag_quadratic=r.drag_quadratic,
                                                    thrust_scale=r.thrust_scale))
    return new


def _lag(convert):
    """apply() of ``actuator_lag`` with ``convert`` (one value, or one per environment)."""
    def apply(sys, value):
        v = convert(sys, value)
        if sys.config.actuator_lag <= 0:
            sys = rebuild(sys, dataclasses.replace(sys.config, actuator_lag=max(float(v.detach().max()), 1e-6)))
        return sys.replace(actuator_lag=v)
    return apply


def _motor_lag(convert):
    """apply() of ``motor_time_constant`` with ``convert``."""
    def apply(sys, value):
        v = convert(sys, value)
        if not sys.rotors.has_motor_lag:
            cfg = sys.config
            sys = rebuild(sys, dataclasses.replace(cfg, rotors=dataclasses.replace(
                cfg.rotors, motor_time_constant=max(float(v.detach().max()), 1e-6))))
        return _rotors(sys, motor_time_constant=v)
    return apply


def _latency(sys, value):
    d = int(round(float(_scalar(sys, value).detach())))
    if d == sys.config.command_delay:
        return sys
    return rebuild(sys, dataclasses.replace(sys.config, command_delay=max(d, 0)))


def _com_offset(sys, value):
    m = sys.model
    x = _val(sys, value).reshape(3)
    return sys.replace(model=m.replace(com=m.com + _base_row(m, x if m.com.dim() == 2 else x[:, None])))


def _base_row(m, x: Tensor) -> Tensor:
    """Return a zero tensor shaped as the bodies' centres of mass with ``x`` in the first body's row."""
    rows = torch.zeros(m.com.shape[0], dtype=x.dtype, device=x.device)
    rows[0] = 1.0
    return rows.reshape((-1,) + (1,) * x.dim()) * x


def _servo_gain_scale(convert=None):
    def apply(sys, value):
        k = (convert or _scalar)(sys, value)
        return sys.replace(kp=sys.kp * k, kd=sys.kd * k)
    return apply


def _effort_scale(convert=None):
    def apply(sys, value):
        return sys.replace(effort_limit=sys.effort_limit * (convert or _scalar)(sys, value))
    return apply


# ------------------------------------------------------------------------------ per episode
# Each takes (B, size) values, one row per environment, and gives the system tensors a batch
# dimension where the stage that reads them has its batch: last in the rigid-body algorithms
# and the contact stage (masses (nb, B), inertias (nb, 3, 3, B), centres of mass (nb, 3, B),
# the ground's coefficients (B,)), first in actuation (gains and effort limits (B, na), time
# constants and drag (B, 1) or (B, 3)).
def _column(sys, value) -> Tensor:
    """(B, 1) values -> (B, 1), in the system's dtype and device."""
    return _val(sys, value).reshape(-1, 1)


def _mass_scale_pe(sys, value):
    s = _column(sys, value)[:, 0]                                      # (B,)
    m = sys.model
    if m.mass.dim() != 1:
        raise ValueError("mass_scale per episode: the model's masses are per environment already")
    return sys.replace(model=m.replace(mass=m.mass[:, None] * s, inertia=m.inertia[..., None] * s))


def _com_offset_pe(sys, value):
    x = _val(sys, value).reshape(-1, 3).T                              # (3, B)
    m = sys.model
    return sys.replace(model=m.replace(com=inertials(m)[0] + _base_row(m, x)))


def apply_per_episode(sys: System, values: Mapping[str, object]) -> System:
    """``sys`` with one value of each named parameter per environment.

    ``values`` maps names to (B, size) tensors (row i: environment i), all of one batch B. The
    result steps B environments at once, each with its own physics, as B systems of
    :func:`apply_values` of its row would (``test_per_episode`` compares them). Parameters without
    a per-episode form (per-link or per-joint vectors, latency: ``State.latency`` is per
    environment already) are a ValueError naming them; the order is :func:`apply_values`'.
    """
    order = _in_order(values)
    fixed = [n for n in order if PARAMETERS[n].per_episode is None]
    if fixed:
        raise ValueError(f"{fixed}: no per-episode form (those that have one: "
                         f"{', '.join(n for n, p in PARAMETERS.items() if p.per_episode)})")
    batches = {n: int(torch.as_tensor(v).shape[0]) for n, v in values.items()}   # (B, size) or (B,): B rows
    if len(set(batches.values())) > 1:
        raise ValueError(f"per-episode values of different batches: {batches}")
    for n in order:
        sys = cast(_Apply, PARAMETERS[n].per_episode)(sys, values[n])   # not None: tested above
    return sys


# ------------------------------------------------------------------------------ the registry
def _ones(sys):
    return torch.ones(1, dtype=torch.float64)


PARAMETERS: Dict[str, Parameter] = {p.name: p for p in [
    Parameter("mass_scale", "factor on every link mass and inertia (centres of mass kept)", "-", None,
              _ones, _scale_bounds(0.2, 5.0), _mass_scale, per_episode=_mass_scale_pe),
    Parameter("link_mass_scale", "factor on each moving body's mass and inertia (model.body_names)", "-", None,
              lambda s: torch.ones(s.model.nb, dtype=torch.float64), _scale_bounds(0.2, 5.0), _link_mass_scale),
    Parameter("inertia_scale", "factor on every link inertia tensor (masses kept)", "-", None,
              _ones, _scale_bounds(0.2, 5.0), _inertia_scale),
    Parameter("joint_damping", "viscous damping per joint (URDF <dynamics damping>)", "N m s/rad", "joints",
              lambda s: _f64(s.model.damping.detach()), _abs_bounds(1.0), _joint_damping),
    Parameter("joint_damping_scale", "factor on every joint's URDF damping", "-", "joints",
              _ones, _scale_bounds(1e-3, 20.0), _joint_damping_scale),
    Parameter("joint_friction", "Coulomb friction per joint (URDF <dynamics friction>)", "N m", "joints",
              lambda s: _f64(s.model.friction.detach()), _abs_bounds(0.5), _joint_friction),
    Parameter("drag_scale", "factor on the body drag (linear and quadratic)", "-", "rotors",
              _ones, _scale_bounds(1e-3, 20.0), _drag_scale(), per_episode=_drag_scale(_column)),
    Parameter("drag_linear", "linear body drag per body axis", "N s/m", "rotors",
              lambda s: _f64(cast(Rotors, s.rotors).drag_linear.detach()), _abs_bounds(1.0), _drag_linear),
    Parameter("drag_quadratic", "quadratic body drag per body axis", "N s^2/m^2", "rotors",
              lambda s: _f64(cast(Rotors, s.rotors).drag_quadratic.detach()), _abs_bounds(0.5), _drag_quadratic),
    Parameter("thrust_scale", "factor on the rotor thrusts and torques (thrust and torque coefficients)", "-",
              "rotors", _ones, _scale_bounds(0.5, 2.0), _thrust_scale),
    Parameter("actuator_lag", "first-order time constant of the joint torques", "s", "joints",
              lambda s: _f64([s.config.actuator_lag]),
              lambda n: (torch.full_like(n, 1e-3), 10.0 * n + 0.1), _lag(_scalar), structural=True,
              time_like=True, per_episode=_lag(_column)),
    Parameter("motor_time_constant", "first-order time constant of the rotor speeds", "s", "rotors",
              lambda s: _f64([cast(RotorConfig, s.config.rotors).motor_time_constant]),
              lambda n: (torch.full_like(n, 1e-3), 10.0 * n + 0.1), _motor_lag(_scalar), structural=True,
              time_like=True, per_episode=_motor_lag(_column)),
    Parameter("contact_stiffness", "ground contact stiffness k in lambda_n = k max(0, -gap)^2 "
                                   "(simulator.contact_stiffness)", "N/m^2", "ground",
              lambda s: _f64([float(s.contact_stiffness)]), _scale_bounds_of_nominal(1e-3, 10.0),
              _ground("contact_stiffness"), per_episode=_ground("contact_stiffness", _column), law="penalty"),
    Parameter("contact_damping", "ground contact damping c in lambda_d = -c max(0, -gap) dgap/dt "
                                 "(simulator.contact_damping)", "N s/m^2", "ground",
              lambda s: _f64([float(s.contact_damping)]), _scale_bounds_of_nominal(1e-3, 100.0),
              _ground("contact_damping"), per_episode=_ground("contact_damping", _column), law="penalty"),
    Parameter("contact_time_constant", "time constant of the soft ground contact's response "
                                       "(simulator.contact_time_constant)", "s", "ground",
              lambda s: _f64([float(s.contact_time_constant)]), _scale_bounds_of_nominal(0.1, 10.0),
              _ground("contact_time_constant"), time_like=True,
              per_episode=_ground("contact_time_constant", _column), law="soft"),
    Parameter("contact_damping_ratio", "damping ratio of the soft ground contact "
                                       "(simulator.contact_damping_ratio)", "-", "ground",
              lambda s: _f64([float(s.contact_damping_ratio)]), _scale_bounds_of_nominal(0.1, 10.0),
              _ground("contact_damping_ratio"), per_episode=_ground("contact_damping_ratio", _column), law="soft"),
    Parameter("ground_friction", "Coulomb coefficient of the ground contact (simulator.friction)", "-", "ground",
              lambda s: _f64([float(s.friction)]), _abs_bounds(0.5, rel_low=0.05), _ground("friction"),
              per_episode=_ground("friction", _column)),
    Parameter("friction_smoothing", "slip speed of the ground's regularised Coulomb friction "
                                    "(simulator.friction_smoothing): a loaded foot creeps at about this speed times "
                                    "the share of its friction cone it uses (a soft floor's creep)", "m/s", "ground",
              lambda s: _f64([float(s.friction_smoothing)]), _scale_bounds_of_nominal(1e-2, 100.0),
              _ground("friction_smoothing"), per_episode=_ground("friction_smoothing", _column)),
    Parameter("com_offset", "shift of the floating base's centre of mass, in its frame (a payload or battery "
                            "off centre)", "m", "floating",
              lambda s: torch.zeros(3, dtype=torch.float64), lambda n: (n - 0.1, n + 0.1), _com_offset,
              log_space=False, per_episode=_com_offset_pe),
    Parameter("servo_gain_scale", "factor on the joint servos' gains kp and kd (simulator.kp, kd)", "-", "joints",
              _ones, _scale_bounds(0.2, 5.0), _servo_gain_scale(), per_episode=_servo_gain_scale(_column)),
    Parameter("effort_scale", "factor on the joints' effort limits (a weaker or stronger motor)", "-", "joints",
              _ones, _scale_bounds(0.2, 5.0), _effort_scale(), per_episode=_effort_scale(_column)),
    Parameter("latency", "command delay, control steps (simulator.command_delay; whole steps in the step, "
                         "fractional in sysid)", "steps", None,
              lambda s: _f64([float(s.config.command_delay)]),
              lambda n: (torch.zeros_like(n), torch.full_like(n, 10.0)), _latency, log_space=False,
              structural=True, time_like=True, differentiable=False, physical_low=True),
]}

#: Pairs that describe the same physical quantity: never both in one set of values.
EXCLUSIVE = (("mass_scale", "link_mass_scale"), ("joint_damping", "joint_damping_scale"),
             ("drag_scale", "drag_linear"), ("drag_scale", "drag_quadratic"))


def apply_values(sys: System, values: Mapping[str, object]) -> System:
    """``sys`` with every named parameter applied.

    Structural ones apply first, then the rest, each group in registry order (the result does not
    depend on the mapping's order). Unknown names are a KeyError naming them.
    """
    for n in _in_order(values):
        sys = PARAMETERS[n].apply(sys, values[n])
    return sys


def _in_order(values: Mapping[str, object]) -> list:
    """Return the names of ``values`` in the order they apply.

    Structural ones come first, then the rest, each group in registry order; unknown names are a
    KeyError naming them.
    """
    unknown = [n for n in values if n not in PARAMETERS]
    if unknown:
        raise KeyError(f"unknown parameter(s) {unknown} (known: {', '.join(PARAMETERS)})")
    return ([n for n, p in PARAMETERS.items() if p.structural and n in values]
            + [n for n, p in PARAMETERS.items() if not p.structural and n in values])


def help_text() -> str:
    """One line per parameter, ``name [unit]: meaning``, for CLI help."""
    return "; ".join(f"{p.name} [{p.unit}]: {p.doc}" + (f" ({p.needs})" if p.needs else "")
                     for p in PARAMETERS.values())


#: The stand-in's perturbation fields (``diffsim_ros.plant.Perturbation``) that are registry
#: parameters; the rest (sensor noise, seed, wind, payload) lie outside the simulator's model.
PERTURBATION_FIELDS = ("mass_scale", "joint_damping_scale", "added_joint_damping", "drag_scale", "thrust_scale",
                       "actuator_lag", "latency", "joint_friction_scale", "ground_friction_scale",
                       "contact_time_constant")


def from_perturbation(sys: System, perturbation: Mapping[str, float]) -> Dict[str, Tensor]:
    """Return the registry values that describe a stand-in perturbation on the robot of ``sys``.

    The perturbation is given as the fields of ``diffsim_ros.plant.Perturbation`` (others are
    ignored); the values are the truth a calibration should find. ``actuator_lag`` is the rotors'
    ``motor_time_constant`` on a multirotor; ``latency`` (s) becomes control steps after the
    plant's rounding to substeps; ``added_joint_damping`` and ``joint_friction_scale`` become
    per-joint values, ``ground_friction_scale`` the ground's coefficient, ``contact_time_constant``
    the soft contact's (MuJoCo's solref[0] is the same law's time constant) where ``sys`` has it.
    """
    p = dict(perturbation)
    out: Dict[str, Tensor] = {}
    for k in ("mass_scale", "drag_scale", "thrust_scale"):
        if k in p and (k == "mass_scale" or sys.rotors is not None):
            out[k] = _f64([float(p[k])])
    if sys.model.nj and sys.rotors is None:
        scale, added = float(p.get("joint_damping_scale", 1.0)), float(p.get("added_joint_damping", 0.0))
        if "added_joint_damping" in p:
            out["joint_damping"] = _f64(sys.model.damping.detach()) * scale + added
        elif "joint_damping_scale" in p:
            out["joint_damping_scale"] = _f64([scale])
        if "joint_friction_scale" in p:
            out["joint_friction"] = _f64(sys.model.friction.detach()) * float(p["joint_friction_scale"])
    if "ground_friction_scale" in p and sys.config.ground:
        out["ground_friction"] = _f64([float(sys.friction) * float(p["ground_friction_scale"])])
    if p.get("contact_time_constant") is not None and PARAMETERS["contact_time_constant"].applies(sys):
        out["contact_time_constant"] = _f64([float(p["contact_time_constant"])])
    lag = p.get("actuator_lag")
    if lag is not None and lag >= 0:
        out["motor_time_constant" if sys.rotors is not None else "actuator_lag"] = _f64([float(lag)])
    if "latency" in p:
        cfg = sys.config
        h = cfg.dt / cfg.substeps
        out["latency"] = _f64([float(cfg.command_delay) + round(float(p["latency"]) / h) * h / cfg.dt])
    return out
