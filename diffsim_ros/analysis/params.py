"""Physical parameters the calibration can change, and a simulator built with them.

Each parameter has a nominal value (from the URDF and the simulator config), bounds,
and a way into the simulator that keeps gradients: link masses and inertias and joint
damping/friction are tensors of the :class:`physics.Model` (``model.replace``); body
drag and a thrust factor are tensors of the simulator's :class:`physics.Rotors`. The
actuator lag, the motor time constant and the command delay are plain numbers in
:class:`physics.SimConfig`, so they are fitted by a derivative-free search instead.

The *controller's* model stays nominal, as on a real robot (and in the MuJoCo plant,
see ``diffsim_ros.plant.perturbation``): gravity compensation and the CTBR rate loop
use the URDF's masses and inertias, the physics uses the calibrated ones.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Callable, Dict, List

import torch

from .. import physics
from .errors import AnalysisError


@dataclass(frozen=True)
class ParamSpec:
    """One calibratable parameter: ``size`` values, ``bounds`` (low, high) per value, unit."""
    name: str
    doc: str
    unit: str
    differentiable: bool
    applies: Callable[[physics.Model, physics.SimConfig], bool]


def _arm(model, cfg) -> bool:
    return model.nj > 0


def _rotors(model, cfg) -> bool:
    return cfg.rotors is not None


def _any(model, cfg) -> bool:
    return True


SPECS: Dict[str, ParamSpec] = {s.name: s for s in [
    ParamSpec("mass_scale", "factor on every link mass and inertia (centres of mass kept)", "-", True, _any),
    ParamSpec("link_mass_scale", "factor on each moving body's mass and inertia (model.body_names)", "-", True, _any),
    ParamSpec("inertia_scale", "factor on every link inertia tensor (masses kept)", "-", True, _any),
    ParamSpec("joint_damping", "viscous damping per joint (URDF <dynamics damping>)", "N m s/rad", True, _arm),
    ParamSpec("joint_damping_scale", "factor on every joint's URDF damping", "-", True, _arm),
    ParamSpec("joint_friction", "Coulomb friction per joint (URDF <dynamics friction>)", "N m", True, _arm),
    ParamSpec("drag_scale", "factor on the body drag (linear and quadratic)", "-", True, _rotors),
    ParamSpec("drag_linear", "linear body drag per body axis", "N s/m", True, _rotors),
    ParamSpec("drag_quadratic", "quadratic body drag per body axis", "N s^2/m^2", True, _rotors),
    ParamSpec("thrust_scale", "factor on the rotor thrusts and torques (thrust and torque coefficients)", "-",
              True, _rotors),
    ParamSpec("actuator_lag", "first-order torque lag of the joint actuators", "s", False, _arm),
    ParamSpec("motor_time_constant", "first-order lag of the rotor speeds", "s", False, _rotors),
    ParamSpec("latency", "command delay, whole control steps (simulator.command_delay)", "steps", False, _any),
]}


def nominal_values(name: str, model: physics.Model, cfg: physics.SimConfig) -> torch.Tensor:
    """Nominal value(s) of a parameter, float64 (1-D)."""
    f64 = dict(dtype=torch.float64)
    if name in ("mass_scale", "inertia_scale", "joint_damping_scale", "drag_scale", "thrust_scale"):
        return torch.ones(1, **f64)
    if name == "link_mass_scale":
        return torch.ones(model.nb, **f64)
    if name == "joint_damping":
        return model.damping.detach().to(**f64).clone()
    if name == "joint_friction":
        return model.friction.detach().to(**f64).clone()
    if name == "drag_linear":
        return torch.tensor(cfg.rotors.drag_linear, **f64)
    if name == "drag_quadratic":
        return torch.tensor(cfg.rotors.drag_quadratic, **f64)
    if name == "actuator_lag":
        return torch.tensor([cfg.actuator_lag], **f64)
    if name == "motor_time_constant":
        return torch.tensor([cfg.rotors.motor_time_constant], **f64)
    if name == "latency":
        return torch.tensor([float(cfg.command_delay)], **f64)
    raise AnalysisError(f"unknown parameter '{name}' (known: {', '.join(SPECS)})")


def bounds(name: str, nominal: torch.Tensor):
    """(low, high) tensors: scales within [0.2, 5] (damping and drag scales [0, 20]); absolute
    values within [0, 10 x nominal + a floor that lets a zero nominal grow]."""
    if name in ("mass_scale", "link_mass_scale", "inertia_scale"):
        return torch.full_like(nominal, 0.2), torch.full_like(nominal, 5.0)
    if name == "thrust_scale":
        return torch.full_like(nominal, 0.5), torch.full_like(nominal, 2.0)
    if name in ("joint_damping_scale", "drag_scale"):
        return torch.zeros_like(nominal), torch.full_like(nominal, 20.0)
    floor = {"joint_damping": 1.0, "joint_friction": 0.5, "drag_linear": 1.0, "drag_quadratic": 0.5,
             "actuator_lag": 0.1, "motor_time_constant": 0.1, "latency": 10.0}[name]
    return torch.zeros_like(nominal), 10.0 * nominal + floor


def check_names(names: List[str], model: physics.Model, cfg: physics.SimConfig, where: str = "--params") -> None:
    for n in names:
        if n not in SPECS:
            raise AnalysisError(f"{where}: unknown parameter '{n}' (known: {', '.join(SPECS)})")
        if not SPECS[n].applies(model, cfg):
            what = "joints" if SPECS[n].applies is _arm else "rotors"
            raise AnalysisError(f"{where}: parameter '{n}' needs a robot with {what}; model '{model.name}' "
                                f"({cfg.actuator} interface) has none")
    for a, b in (("mass_scale", "link_mass_scale"), ("joint_damping", "joint_damping_scale"),
                 ("drag_scale", "drag_linear"), ("drag_scale", "drag_quadratic")):
        if a in names and b in names:
            raise AnalysisError(f"{where}: '{a}' and '{b}' describe the same thing; choose one")


def build_simulator(model: physics.Model, cfg: physics.SimConfig, values: Dict[str, torch.Tensor]
                    ) -> physics.Simulator:
    """A simulator with the given parameter values (tensors, possibly requiring grad);
    parameters not in ``values`` stay nominal. The system is built on the nominal model
    (the controller's: gravity compensation, the CTBR rate loop) and its physics model
    and rotor coefficients are then replaced (``System.replace``)."""
    dtype = model.dtype
    val = {k: (v.to(dtype) if isinstance(v, torch.Tensor) else torch.as_tensor(v, dtype=dtype))
           for k, v in values.items()}
    # Non-differentiable ones go into the config.
    changes = {}
    if "actuator_lag" in val:
        changes["actuator_lag"] = float(val["actuator_lag"].reshape(-1)[0])
    if "latency" in val:
        changes["command_delay"] = int(round(float(val["latency"].reshape(-1)[0])))
    if "motor_time_constant" in val:
        changes["rotors"] = dataclasses.replace(cfg.rotors, motor_time_constant=float(
            val["motor_time_constant"].reshape(-1)[0]))
    if changes:
        cfg = dataclasses.replace(cfg, **changes)

    mass, inertia = model.mass, model.inertia
    damping, friction = model.damping, model.friction
    if "mass_scale" in val:
        s = val["mass_scale"].reshape(())
        mass, inertia = mass * s, inertia * s
    if "link_mass_scale" in val:
        s = val["link_mass_scale"].reshape(-1)
        mass, inertia = mass * s, inertia * s[:, None, None]
    if "inertia_scale" in val:
        inertia = inertia * val["inertia_scale"].reshape(())
    if "joint_damping" in val:
        damping = val["joint_damping"].reshape(-1)
    if "joint_damping_scale" in val:
        damping = damping * val["joint_damping_scale"].reshape(())
    if "joint_friction" in val:
        friction = val["joint_friction"].reshape(-1)
    physical = model.replace(mass=mass, inertia=inertia, damping=damping, friction=friction)

    sys = physics.build_system(model, cfg)
    rot = sys.rotors
    if rot is not None:
        dl, dq, ts = rot.drag_linear, rot.drag_quadratic, rot.thrust_scale
        if "drag_linear" in val:
            dl = val["drag_linear"].reshape(3)
        if "drag_quadratic" in val:
            dq = val["drag_quadratic"].reshape(3)
        if "drag_scale" in val:
            s = val["drag_scale"].reshape(())
            dl, dq = dl * s, dq * s
        if "thrust_scale" in val:
            ts = ts * val["thrust_scale"].reshape(())
        rot = rot.replace(drag_linear=dl, drag_quadratic=dq, thrust_scale=ts)
    return physics.Simulator(sys.replace(model=physical.replace(gravity=sys.model.gravity), rotors=rot))
