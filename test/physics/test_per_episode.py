"""Per-environment physics (``parameters.apply_per_episode``).

One batched system in which every
environment has its own drawn mass, centre of mass, servo strength, lag, drag and ground steps
each environment exactly as a system of its own (``apply_values`` of its row) steps it alone;
gradients with respect to the drawn values agree too. The draws are random (seed printed); the
robots are the project's quadruped on the ground, example-robot-data's solo12, the project's arm
and quadrotor.
"""
from __future__ import annotations

import random

import pytest
import torch

from conftest import REPO_ROOT

from diffsim_ros import config
from diffsim_ros.physics import Simulator
from diffsim_ros.physics.registry import PARAMETERS, apply_per_episode, apply_values

B = 3

#: Per robot: the training file and the ranges drawn (each value uniform in its range, per component).
CASES = {
    "quadruped": ("locomotion_velocity", {"mass_scale": (0.8, 1.25), "com_offset": (-0.03, 0.03),
                                          "servo_gain_scale": (0.7, 1.3), "effort_scale": (0.5, 1.5),
                                          "ground_friction": (0.3, 1.2), "contact_stiffness": (3e6, 3e7),
                                          "contact_damping": (1e4, 6e4), "actuator_lag": (0.002, 0.02),
                                          "friction_smoothing": (0.005, 0.3)}),
    "solo12": ("locomotion_velocity_solo12", {"mass_scale": (0.8, 1.25), "com_offset": (-0.02, 0.02),
                                              "ground_friction": (0.3, 1.2), "servo_gain_scale": (0.7, 1.3)}),
    "arm": ("reach_arm", {"mass_scale": (0.7, 1.4), "servo_gain_scale": (0.6, 1.5), "effort_scale": (0.6, 1.4)}),
    "quadrotor": ("hover", {"mass_scale": (0.8, 1.3), "drag_scale": (0.5, 2.0), "com_offset": (-0.01, 0.01),
                            "motor_time_constant": (0.01, 0.05)}),
}


def _draw(sys, ranges, gen):
    out = {}
    for name, (lo, hi) in ranges.items():
        k = PARAMETERS[name].size(sys)
        out[name] = lo + (hi - lo) * torch.rand(B, k, generator=gen, dtype=torch.float64)
    return out


def _rollout(sim, q, v, actions):
    state = sim.initial_state(q=q, v=v)
    states = []
    for a in actions:
        state = sim.step(state, a)
        states.append(state)
    return states


@pytest.mark.parametrize("robot", list(CASES))
def test_each_environment_steps_as_its_own_system(robot):
    seed = random.randrange(2**31)
    print("robot", robot, "seed", seed)
    gen = torch.Generator().manual_seed(seed)
    name, ranges = CASES[robot]
    params, task, model = config.load_training_file(REPO_ROOT / "config" / f"{name}.yaml", dtype=torch.float64)
    sys = task.sim.system
    drawn = _draw(sys, ranges, gen)
    ts = task.reset(B, gen)
    q, v = ts.sim.q, ts.sim.v + 0.05 * torch.randn(ts.sim.v.shape, generator=gen, dtype=torch.float64)
    steps = 25
    actions = [torch.clamp(0.4 * torch.randn(B, task.action_dim, generator=gen, dtype=torch.float64), -1, 1)
               for _ in range(steps)]
    commands = None
    if hasattr(task, "command"):
        commands = [task.command(a, ts) for a in actions]
    batched = Simulator(apply_per_episode(sys, drawn))
    together = _rollout(batched, q, v, commands)
    for i in range(B):
        own = Simulator(apply_values(sys, {n: x[i] for n, x in drawn.items()}))
        alone = _rollout(own, q[i:i + 1], v[i:i + 1], [c[i:i + 1] for c in commands])
        for k in (0, steps // 2, steps - 1):
            torch.testing.assert_close(together[k].q[i:i + 1], alone[k].q, rtol=1e-10, atol=1e-11)
            torch.testing.assert_close(together[k].v[i:i + 1], alone[k].v, rtol=1e-9, atol=1e-9)
    # The environments do differ: the draws act.
    assert (together[-1].v[0] - together[-1].v[1]).abs().max() > 1e-6


def test_gradients_reach_each_environments_own_values():
    """Gradients reach each environment's own values.

    d(final state of environment i)/d(its drawn values), batched, equals the gradient of its
    own system; the other environments' values do not move it.
    """
    seed = random.randrange(2**31)
    print("seed", seed)
    gen = torch.Generator().manual_seed(seed)
    params, task, model = config.load_training_file(REPO_ROOT / "config" / "locomotion_velocity.yaml",
                                                    dtype=torch.float64)
    sys = task.sim.system
    ranges = {"mass_scale": (0.8, 1.25), "ground_friction": (0.4, 1.0), "servo_gain_scale": (0.7, 1.3)}
    drawn = {n: x.requires_grad_(True) for n, x in _draw(sys, ranges, gen).items()}
    ts = task.reset(B, gen)
    actions = [task.command(0.4 * torch.randn(B, task.action_dim, generator=gen, dtype=torch.float64), ts)
               for _ in range(15)]
    final = _rollout(Simulator(apply_per_episode(sys, drawn)), ts.sim.q, ts.sim.v, actions)[-1]
    w = torch.randn(final.v.shape, generator=gen, dtype=torch.float64)
    grads = torch.autograd.grad((final.v * w).sum(), list(drawn.values()))
    for i in range(B):
        own_vals = {n: x[i].detach().clone().requires_grad_(True) for n, x in drawn.items()}
        alone = _rollout(Simulator(apply_values(sys, own_vals)), ts.sim.q[i:i + 1], ts.sim.v[i:i + 1],
                         [a[i:i + 1] for a in actions])[-1]
        own = torch.autograd.grad((alone.v * w[i:i + 1]).sum(), list(own_vals.values()))
        for g, o, n in zip(grads, own, drawn):
            torch.testing.assert_close(g[i], o, rtol=1e-7, atol=1e-9, msg=f"{n}, environment {i}")


def test_per_episode_values_are_checked():
    params, task, model = config.load_training_file(REPO_ROOT / "config" / "locomotion_velocity.yaml",
                                                    dtype=torch.float64)
    sys = task.sim.system
    with pytest.raises(ValueError, match="link_mass_scale.*no per-episode form"):
        apply_per_episode(sys, {"link_mass_scale": torch.ones(B, sys.model.nb, dtype=torch.float64)})
    with pytest.raises(ValueError, match="different batches"):
        apply_per_episode(sys, {"mass_scale": torch.ones(3, 1), "ground_friction": torch.ones(4, 1)})
    with pytest.raises(KeyError, match="unknown"):
        apply_per_episode(sys, {"mass": torch.ones(3, 1)})
