"""Per-environment command latency in substeps (simulator.max_latency, State.latency).

Compared with an independent construction of the same delay: the simulator at the substep's
own dt (one substep per step) with command_delay = L whole steps and each action held for
``substeps`` steps applies exactly the same command at every substep, so both must agree to
rounding, state by state, for every latency; gradients of the latency step against finite
differences. (The compiled step takes the latency as an input of its graphs: the compiled
randomised training of test/learning/test_apg.py draws it per episode and equals the eager run.)
"""
import dataclasses

import numpy as np
import pytest
import torch

from diffsim_ros import config
from diffsim_ros.physics import Simulator

from conftest import REPO_ROOT as ROOT, drawn_seed


def _arm(**changes):
    params = config.load_yaml(ROOT / "config" / "reach_arm.yaml")
    model = config.load_model(params, "reach_arm.yaml", dtype=torch.float64)
    cfg = dataclasses.replace(config.simulator_config(params, "reach_arm.yaml"), nan_check=True, **changes)
    return model, cfg


def _quadrotor(**changes):
    params = config.load_yaml(ROOT / "config" / "hover.yaml")
    model = config.load_model(params, "hover.yaml", dtype=torch.float64)
    cfg = dataclasses.replace(config.simulator_config(params, "hover.yaml"), **changes)
    return model, cfg


@pytest.mark.parametrize("robot", ["arm", "quadrotor"])
def test_latency_equals_the_delay_line_of_a_substep_simulator(robot):
    """A latency equals the delay line of a substep simulator.

    Drawn latencies (0..max, one per environment, seed printed) and a drawn command delay: each
    environment's trajectory equals that of a simulator stepping at dt / substeps with command_delay
    = substeps * delay + L and every action held for substeps steps.
    """
    rng_seed = drawn_seed("latency", "DIFFSIM_LATENCY_SEED")
    gen = torch.Generator().manual_seed(rng_seed)
    make = _arm if robot == "arm" else _quadrotor
    model, base = make()
    S = int(base.substeps)
    max_latency = int(torch.randint(1, 2 * S + 2, (), generator=gen))
    delay = int(torch.randint(0, 2, (), generator=gen))
    print(f"seed {rng_seed}: substeps {S}, max_latency {max_latency}, command_delay {delay}")
    sim = Simulator(model, dataclasses.replace(base, max_latency=max_latency, command_delay=delay))
    B = 6
    lat = torch.randint(0, max_latency + 1, (B,), generator=gen).to(torch.float64)
    lat[0], lat[1] = 0, max_latency
    steps = 6
    na = sim.action_dim
    if robot == "arm":
        actions = 0.5 * torch.randn(steps, B, na, generator=gen, dtype=torch.float64)
    else:
        hover = float(model.mass.sum()) * 9.81
        actions = torch.randn(steps, B, na, generator=gen, dtype=torch.float64) * torch.tensor([2.0, 1, 1, 1])
        actions[..., 0] += hover
    q0 = model.neutral_configuration((B,))
    if robot == "quadrotor":
        q0[:, 2] = 1.0
    st = sim.initial_state(q0, latency=lat)
    if robot == "arm" and delay + max_latency > 0:
        assert st.delay is not None
    ours = [st.q]
    for k in range(steps):
        st = sim.step(st, actions[k])
        ours.append(st.q)
    for b in range(B):
        L = int(lat[b])
        ref = Simulator(model, dataclasses.replace(base, dt=base.dt / S, substeps=1, max_latency=0,
                                                   command_delay=S * delay + L))
        rs = ref.initial_state(q0[b:b + 1])
        if robot == "arm" and rs.delay is not None and sim.config.actuator != "position":
            rs.delay.zero_()
        theirs = [rs.q]
        for k in range(steps):
            for _ in range(S):
                rs = ref.step(rs, actions[k, b:b + 1])
            theirs.append(rs.q)
        np.testing.assert_allclose(torch.stack(ours)[:, b].numpy(), torch.cat(theirs).numpy(), rtol=0, atol=1e-9,
                                   err_msg=f"environment {b}, latency {L} substeps")


def test_no_latency_is_the_plain_step():
    """max_latency > 0 with every environment at latency 0 is the step without the option, bit for bit."""
    model, base = _quadrotor()
    plain, lat = Simulator(model, base), Simulator(model, dataclasses.replace(base, max_latency=5))
    q0 = model.neutral_configuration((3,))
    q0[:, 2] = 1.0
    a = torch.tensor([[11.0, 0.3, -0.2, 0.1]] * 3, dtype=torch.float64)
    s1, s2 = plain.initial_state(q0), lat.initial_state(q0)
    for _ in range(4):
        s1, s2 = plain.step(s1, a), lat.step(s2, a)
    assert torch.equal(s1.q, s2.q) and torch.equal(s1.v, s2.v)


def test_latency_gradients_match_finite_differences():
    """d(final state)/d(actions) through the latency's choice of commands, central differences."""
    model, base = _quadrotor()
    sim = Simulator(model, dataclasses.replace(base, max_latency=6))
    q0 = model.neutral_configuration((2,))
    q0[:, 2] = 1.0
    lat = torch.tensor([3.0, 6.0], dtype=torch.float64)
    a = torch.tensor([[10.5, 0.2, -0.1, 0.05]] * 2, dtype=torch.float64).repeat(3, 1, 1)

    def f(x):
        st = sim.initial_state(q0, latency=lat)
        for k in range(3):
            st = sim.step(st, x[k])
        return (st.q[:, 0:3] ** 2).sum() + (st.v ** 2).sum()
    x = a.clone().requires_grad_(True)
    g = torch.autograd.grad(f(x), x)[0]
    eps = 1e-6
    for idx in [(0, 0, 0), (0, 1, 1), (1, 0, 2), (2, 1, 0), (1, 1, 3)]:
        xp, xm = a.clone(), a.clone()
        xp[idx] += eps
        xm[idx] -= eps
        fd = (f(xp) - f(xm)) / (2 * eps)
        assert float(g[idx]) == pytest.approx(float(fd), rel=1e-5, abs=1e-8), idx


def test_latency_out_of_range_is_refused():
    model, base = _quadrotor()
    sim = Simulator(model, dataclasses.replace(base, max_latency=2))
    with pytest.raises(ValueError, match="max_latency"):
        sim.initial_state(model.neutral_configuration((2,)), latency=torch.tensor([1.0, 3.0]))
    with pytest.raises(ValueError, match="max_latency > 0"):
        Simulator(model, base).initial_state(model.neutral_configuration((2,)), latency=1)

