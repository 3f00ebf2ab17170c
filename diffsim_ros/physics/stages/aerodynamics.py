"""Aerodynamics of a floating base: the rotors' wrench from their speeds and the body's drag.

The drag is smooth, linear-plus-quadratic. Both act as the generalised force on the base's six
coordinates (a body-frame wrench about the base origin).
"""
from __future__ import annotations

from typing import cast

import torch

from ..quadrotor import Rotors
from ..system import System


def aerodynamics(sys: System, v: torch.Tensor, speed: torch.Tensor) -> torch.Tensor:
    """(B, nv) generalised force: rotor wrench + drag on the base, zero on the joints."""
    rot = cast(Rotors, sys.rotors)                                      # a system with rotors
    wrench = rot.wrench(speed) + rot.drag(v[..., 0:6])
    if v.shape[-1] == 6:
        return wrench
    return torch.cat((wrench, torch.zeros_like(v[..., 6:])), -1)
