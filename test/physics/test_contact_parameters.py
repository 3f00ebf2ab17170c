"""The ground contact's parameters in the registry.

The parameters are contact_stiffness, contact_damping, ground_friction and friction_smoothing.
Applied to a system they step exactly as a system built from a
configuration holding those values; their gradients through a contact-rich rollout match
central finite differences; the stand-in's ground_friction_scale maps onto them; robots
without ground contact refuse them by name.

Drawn values print their seed (replay with DIFFSIM_CONTACT_SEED=<seed>).
"""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from conftest import drawn_seed

from diffsim_ros import config, physics
from diffsim_ros.analysis.errors import AnalysisError
from diffsim_ros.analysis.params import check_names
from diffsim_ros.physics.registry import PARAMETERS, apply_values, from_perturbation

F64 = torch.float64
NAMES = ("contact_stiffness", "contact_damping", "ground_friction", "friction_smoothing")
CONFIG = "config/locomotion_velocity.yaml"


@pytest.fixture(scope="module")
def quadruped():
    params = config.load_yaml(CONFIG)
    model = config.load_model(params, dtype=F64)
    cfg = dataclasses.replace(config.simulator_config(params), dt=2e-3, substeps=1)
    return model, cfg


def _contact_states(model, batch, gen):
    """Draw quadruped states a little above or into the ground, tilted, sliding and turning.

    Most environments touch with some feet, some slide.
    """
    q = model.neutral_configuration((batch,))
    q[:, 7:] = torch.tensor([0.0, 0.8, -1.6] * 4, dtype=F64) + 0.2 * torch.randn(batch, 12, generator=gen, dtype=F64)
    q[:, 2] = 0.295 + 0.01 * torch.randn(batch, generator=gen, dtype=F64)
    quat = torch.cat((0.05 * torch.randn(batch, 3, generator=gen, dtype=F64), torch.ones(batch, 1, dtype=F64)), 1)
    q[:, 3:7] = quat / quat.norm(dim=1, keepdim=True)
    v = 0.5 * torch.randn(batch, model.nv, generator=gen, dtype=F64)
    return q, v


def _draw(rng):
    return {"contact_stiffness": float(10 ** rng.uniform(5.0, 7.5)),
            "contact_damping": float(10 ** rng.uniform(3.0, 5.0)),
            "ground_friction": float(rng.uniform(0.2, 1.5)),
            "friction_smoothing": float(10 ** rng.uniform(-2.5, -0.5))}


def _drawn_case(quadruped, label, batch):
    """(rng, nominal system, contact state, action) drawn from a printed seed."""
    model, cfg = quadruped
    seed = drawn_seed(label, "DIFFSIM_CONTACT_SEED")
    rng, gen = np.random.default_rng(seed), torch.Generator().manual_seed(seed)
    q, v = _contact_states(model, batch, gen)
    action = 0.3 * torch.randn(batch, 12, generator=gen, dtype=F64)
    sys = physics.build_system(model, cfg)
    return rng, sys, physics.Simulator(sys).initial_state(q, v), action


def test_applied_contact_parameters_step_as_the_configured_ones(quadruped):
    model, cfg = quadruped
    rng, nominal, state, action = _drawn_case(quadruped, "contact parameters", 16)
    for _ in range(3):
        values = _draw(rng)
        applied = apply_values(nominal, values)
        built = physics.build_system(model, dataclasses.replace(
            cfg, contact_stiffness=values["contact_stiffness"], contact_damping=values["contact_damping"],
            friction=values["ground_friction"], friction_smoothing=values["friction_smoothing"]))
        a, _ = physics.step(applied, state, action)
        b, _ = physics.step(built, state, action)
        n, _ = physics.step(nominal, state, action)
        torch.testing.assert_close(a.v, b.v, rtol=1e-12, atol=1e-12, msg=lambda m: f"{values}: {m}")
        assert float((a.v - n.v).abs().max()) > 1e-3, f"{values}: the drawn contact should change the step"
        for name in NAMES:
            assert PARAMETERS[name].nominal(applied).item() == pytest.approx(values[name], rel=1e-12)


def test_contact_parameter_gradients_match_finite_differences(quadruped):
    rng, sys0, state, action = _drawn_case(quadruped, "contact parameter gradients", 8)
    values = _draw(rng)
    x0 = torch.tensor([np.log(values[n]) for n in NAMES], dtype=F64)

    def loss(x):
        s = apply_values(sys0, {n: torch.exp(x[i]) for i, n in enumerate(NAMES)})
        st = state
        for _ in range(15):
            st, _ = physics.step(s, st, action)
        return (st.q[:, :3] ** 2).sum() + (st.v ** 2).sum() * 1e-2

    x = x0.clone().requires_grad_(True)
    grad, = torch.autograd.grad(loss(x), x)
    # Central differences at three steps: a small derivative (friction_smoothing's, ~0.03 beside
    # ~50 for the others) drowns in round-off at 1e-5 for some draws (seed 12077084: 7e-4 off
    # there, 5e-7 at 1e-4), a sharply curved one in truncation at 1e-4. Each component must agree
    # with the differences at one of the steps; a wrong gradient agrees at none.
    fds = {eps: torch.stack([(loss(x0 + eps * e) - loss(x0 - eps * e)) / (2 * eps)
                             for e in torch.eye(len(NAMES), dtype=F64)]) for eps in (1e-4, 1e-5, 1e-6)}
    print(f"{values}: grad {grad.tolist()}, finite differences {({k: v.tolist() for k, v in fds.items()})}")
    for i, name in enumerate(NAMES):
        errors = {eps: abs(float(grad[i] - fd[i])) / (2e-4 * abs(float(fd[i])) + 1e-8) for eps, fd in fds.items()}
        assert min(errors.values()) <= 1.0, (name, float(grad[i]), {k: float(v[i]) for k, v in fds.items()})
    assert bool((grad.abs() > 1e-6).all()), "every contact parameter should change the rollout"


def test_ground_friction_scale_of_the_stand_in_maps_onto_the_registry(quadruped):
    model, cfg = quadruped
    sys = physics.build_system(model, cfg)
    out = from_perturbation(sys, {"ground_friction_scale": 0.5, "mass_scale": 1.1})
    assert out["ground_friction"].item() == pytest.approx(0.5 * cfg.friction)
    assert out["mass_scale"].item() == pytest.approx(1.1)
    # The stand-in's MuJoCo model gets the same coefficient on every geom (MuJoCo takes the larger).
    from diffsim_ros.plant.mujoco_plant import MujocoPlant
    params = config.load_yaml(CONFIG)
    plain = MujocoPlant(params, perturbation={})
    slippery = MujocoPlant(params, perturbation={"ground_friction_scale": 0.5})
    np.testing.assert_allclose(slippery.model.geom_friction[:, 0], 0.5 * plain.model.geom_friction[:, 0])
    assert np.allclose(plain.model.geom_friction[:, 0], cfg.friction)


def test_contact_parameters_need_ground_contact():
    params = config.load_yaml("config/reach_arm.yaml")
    model = config.load_model(params, dtype=F64)
    cfg = dataclasses.replace(config.simulator_config(params), ground=False)
    for name in NAMES:
        assert not PARAMETERS[name].applies(physics.build_system(model, cfg))
        with pytest.raises(AnalysisError, match=f"'{name}' needs a robot with ground"):
            check_names([name], model, cfg)
