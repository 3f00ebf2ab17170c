"""Policies: a small MLP with its observation normaliser inside, exportable to TorchScript."""
from __future__ import annotations

from typing import Sequence

import torch
from torch import nn


class RunningNorm(nn.Module):
    """Observation normaliser: running mean and variance (Chan's parallel update),
    frozen while gradients flow; stored as buffers so TorchScript keeps them."""

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
