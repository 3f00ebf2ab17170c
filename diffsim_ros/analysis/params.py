"""Physical parameters the calibration can change, and a simulator built with them.

The parameters themselves (name, unit, bounds, nominal value, ``apply``) live in one
registry, :mod:`diffsim_ros.physics.registry`, which domain randomisation and the
stand-in's perturbations read too; this module resolves names against a bag's model and
configuration and builds the simulator.

The *controller's* model stays nominal, as on a real robot (and in the MuJoCo plant,
see ``diffsim_ros.plant.perturbation``): gravity compensation and the CTBR rate loop
use the URDF's masses and inertias, the physics uses the calibrated ones.
"""
from __future__ import annotations

from typing import Dict, List

import torch

from .. import physics
from ..physics.registry import EXCLUSIVE, PARAMETERS, Parameter, apply_values
from .errors import AnalysisError

#: The registry, under its historical name here.
SPECS: Dict[str, Parameter] = PARAMETERS


def nominal_system(model: physics.Model, cfg: physics.SimConfig) -> "physics.System":
    return physics.build_system(model, cfg)


def nominal_values(name: str, model: physics.Model, cfg: physics.SimConfig) -> torch.Tensor:
    """Nominal value(s) of a parameter, float64 (1-D)."""
    if name not in PARAMETERS:
        raise AnalysisError(f"unknown parameter '{name}' (known: {', '.join(PARAMETERS)})")
    return PARAMETERS[name].nominal(nominal_system(model, cfg))


def bounds(name: str, nominal: torch.Tensor):
    """(low, high) tensors of the registry (see :mod:`diffsim_ros.physics.registry`)."""
    return PARAMETERS[name].bounds(nominal)


def check_names(names: List[str], model: physics.Model, cfg: physics.SimConfig, where: str = "--params") -> None:
    sys = nominal_system(model, cfg)
    for n in names:
        if n not in PARAMETERS:
            raise AnalysisError(f"{where}: unknown parameter '{n}' (known: {', '.join(PARAMETERS)})")
        p = PARAMETERS[n]
        if not p.applies(sys) and p.law is not None and cfg.ground:
            raise AnalysisError(f"{where}: parameter '{n}' belongs to the {p.law} ground contact; model "
                                f"'{model.name}' is simulated with simulator.contact_model '{cfg.contact_model}'")
        if not p.applies(sys):
            raise AnalysisError(f"{where}: parameter '{n}' needs a robot with {p.needs}; model '{model.name}' "
                                f"({cfg.actuator} interface) has none")
    for a, b in EXCLUSIVE:
        if a in names and b in names:
            raise AnalysisError(f"{where}: '{a}' and '{b}' describe the same thing; choose one")


def build_simulator(model: physics.Model, cfg: physics.SimConfig, values: Dict[str, torch.Tensor]
                    ) -> physics.Simulator:
    """Build a simulator with the given parameter values (tensors, possibly requiring grad).

    Parameters not in ``values`` stay nominal. The system is built on the nominal model
    (the controller's: gravity compensation, the CTBR rate loop) and the registry's
    ``apply`` then replaces its physics (``System.replace``).
    """
    try:
        sys = apply_values(nominal_system(model, cfg), values)
    except KeyError as exc:
        raise AnalysisError(str(exc.args[0])) from None
    return physics.Simulator(sys)
