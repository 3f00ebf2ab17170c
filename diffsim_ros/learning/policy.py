"""Policies: a small MLP with its observation normaliser inside, exportable to TorchScript."""
from __future__ import annotations

import math
from typing import Sequence

import torch
from torch import nn


class RunningNorm(nn.Module):
    """Observation normaliser: running mean and variance (Chan's parallel update).

    Frozen while gradients flow; stored as buffers so TorchScript keeps them.
    """

    def __init__(self, dim: int, eps: float = 1e-6, clip: float = 10.0):
        super().__init__()
        self.register_buffer("mean", torch.zeros(dim))
        self.register_buffer("var", torch.ones(dim))
        self.register_buffer("count", torch.tensor(1e-4))
        self.eps = eps
        self.clip = clip

    @torch.jit.ignore
    def update(self, x: torch.Tensor) -> None:
        x = x.detach().reshape(-1, x.shape[-1]).to(self.mean.dtype)
        n = x.shape[0]
        m, v = x.mean(0), x.var(0, unbiased=False)
        tot = self.count + n
        delta = m - self.mean
        self.mean += delta * n / tot
        self.var = (self.var * self.count + v * n + delta ** 2 * self.count * n / tot) / tot
        self.count = tot

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        z = (x - self.mean) / torch.sqrt(self.var + self.eps)
        return torch.clamp(z, -self.clip, self.clip)


class MLPPolicy(nn.Module):
    """obs -> action in [-1, 1] (tanh), with the normaliser applied first."""

    def __init__(self, obs_dim: int, action_dim: int, hidden: Sequence[int] = (64, 64),
                 activation: str = "elu", normalize: bool = True):
        super().__init__()
        self.obs_dim, self.action_dim = obs_dim, action_dim
        self.norm = RunningNorm(obs_dim) if normalize else nn.Identity()
        act = {"elu": nn.ELU, "tanh": nn.Tanh, "relu": nn.ReLU}[activation]
        layers, d = [], obs_dim
        for h in hidden:
            layers += [nn.Linear(d, h), act()]
            d = h
        self.body = nn.Sequential(*layers)
        self.head = nn.Linear(d, action_dim)
        with torch.no_grad():
            self.head.weight.mul_(0.1)
            self.head.bias.zero_()

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.head(self.body(self.norm(obs))))


class GaitReference(nn.Module):
    """A fixed trajectory generator stepping each foot through the gait clock's pattern.

    Its output is joint offsets (action units), read from the clock's sine and cosine in the
    observation (and the speed command, where there is one). Foot ``f``'s phase is the clock's plus
    ``offsets[f]``, mod 1. For the first ``duty`` of its cycle it is in stance: it moves backwards
    along the base at the commanded speed (from ``+d/2`` to ``-d/2``, ``d = command x stride_time``);
    through the rest it swings: up and down along ``swing_height`` sin^2 (it leaves and meets the
    ground at zero vertical speed, where the task's swing target, a half sine, meets it at speed) and
    forwards back to ``+d/2`` along a cubic whose slope at both ends is the stance's, so that the foot
    leaves and meets the ground at rest relative to it (a foot landing with the base's speed skids; a
    servo a step or two behind the pattern still follows a continuous velocity). ``lift`` and
    ``stride`` (A, F) turn each foot's height and forward displacement (m) into joint offsets in
    action units (the leg's Jacobian at the stance, inverted, over the action scale). Its
    arguments come from the task (``LocomotionTask.gait_pattern``). Buffers only: nothing here is
    trained, and TorchScript keeps it.
    """

    def __init__(self, clock_index: int, command_index: int, offsets: torch.Tensor, duty: float,
                 swing_height: float, stride_time: float, lift: torch.Tensor, stride: torch.Tensor):
        super().__init__()
        self.clock_index, self.command_index = int(clock_index), int(command_index)
        self.duty, self.swing_height, self.stride_time = float(duty), float(swing_height), float(stride_time)
        self.register_buffer("offsets", offsets.detach().clone())
        self.register_buffer("lift", lift.detach().clone())
        self.register_buffer("stride", stride.detach().clone())

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        i = self.clock_index
        angle = torch.atan2(obs[..., i:i + 1], obs[..., i + 1:i + 2])                  # (..., 1)
        phase = torch.remainder(angle / (2.0 * math.pi) + self.offsets.to(obs), 1.0)   # (..., F)
        swinging = phase >= self.duty
        swing = torch.clamp((phase - self.duty) / (1.0 - self.duty), min=0.0)
        height = self.swing_height * torch.sin(math.pi * swing) ** 2
        offset = torch.matmul(height, self.lift.to(obs).transpose(0, 1))
        if self.command_index >= 0:
            d = obs[..., self.command_index:self.command_index + 1] * self.stride_time
            # Hermite cubic from -1/2 to 1/2 over the swing, its end slopes the stance's -(1 - duty) / duty
            k = -(1.0 - self.duty) / self.duty
            s2, s3 = swing * swing, swing * swing * swing
            flight = -0.5 + 3.0 * s2 - 2.0 * s3 + k * (2.0 * s3 - 3.0 * s2 + swing)
            unit = torch.where(swinging, flight, 0.5 - torch.clamp(phase / self.duty, max=1.0))
            offset = offset + torch.matmul(unit * d, self.stride.to(obs).transpose(0, 1))
        return offset


class ReferencePolicy(MLPPolicy):
    """An :class:`MLPPolicy` whose action is a :class:`GaitReference`'s plus the network's own.

    The sum is clamped to [-1, 1]: the network learns to balance and steer a stepping pattern
    rather than to find one (the trajectory-generator policies of legged locomotion).
    """

    def __init__(self, obs_dim: int, action_dim: int, reference: GaitReference, hidden: Sequence[int] = (64, 64),
                 activation: str = "elu", normalize: bool = True):
        super().__init__(obs_dim, action_dim, hidden, activation, normalize)
        self.reference = reference

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        own = torch.tanh(self.head(self.body(self.norm(obs))))
        return torch.clamp(own + self.reference(obs), -1.0, 1.0)


class ValueNet(nn.Module):
    """State-value critic for short-horizon actor-critic training."""

    def __init__(self, obs_dim: int, hidden: Sequence[int] = (64, 64)):
        super().__init__()
        layers, d = [], obs_dim
        for h in hidden:
            layers += [nn.Linear(d, h), nn.ELU()]
            d = h
        layers.append(nn.Linear(d, 1))
        self.net = nn.Sequential(*layers)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.net(obs)[..., 0]
