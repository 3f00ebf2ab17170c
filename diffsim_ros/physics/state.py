"""The simulator's state and rollouts (tensors with the batch as leading dimensions)."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Optional

import torch


class SimulationError(RuntimeError):
    """A non-finite quantity appeared in a simulation step."""


@dataclass
class State:
    """Simulator state; every tensor has the batch as leading dimension(s).

    q (..., nq), v (..., nv): generalised positions and velocities.
    actuator (..., n_act): actuator internal state (applied torque under a lag, or
        rotor speeds in rad/s for multirotors); None when stateless.
    delay (..., command_delay, n_act): commands waiting in the delay line; None if no delay.
    t (...): time, s.
    latency (...): each environment's command latency in physics substeps on top of the delay
        line's whole control steps (whole numbers, 0 to ``config.max_latency``); None when
        ``max_latency`` is 0. The step passes it through unchanged.
    """

    q: torch.Tensor
    v: torch.Tensor
    actuator: Optional[torch.Tensor] = None
    delay: Optional[torch.Tensor] = None
    t: Optional[torch.Tensor] = None
    latency: Optional[torch.Tensor] = None

    def replace(self, **kw) -> "State":
        return dataclasses.replace(self, **kw)

    def detach(self) -> "State":
        return State(*(None if x is None else x.detach()  # type: ignore[arg-type]  # q and v are never None
                       for x in (self.q, self.v, self.actuator, self.delay, self.t, self.latency)))


@dataclass
class Trajectory:
    """A rollout: q (T+1, ..., nq), v (T+1, ..., nv), actions (T, ..., n_act), final State."""

    q: torch.Tensor
    v: torch.Tensor
    actions: torch.Tensor
    final: State

