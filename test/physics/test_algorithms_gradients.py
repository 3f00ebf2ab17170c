"""Gradients of our aba.

They are checked against Pinocchio's analytical derivatives, gradcheck, and finite differences
in the model's physical parameters.

* ∂q̈/∂q, ∂q̈/∂v, ∂q̈/∂τ by autograd (one batched backward pass per output
  coordinate) vs pin.computeABADerivatives (ddq_dq, ddq_dv, Minv), relative
  error (Frobenius) under 1e-6 per state, on the panda, on solo12 and on a
  synthetic floating tree with continuous joints (pin_reference.TREE_URDF).
  Pinocchio's ddq_dq is with respect to the tangent perturbation
  q ⊕ δ = pin.integrate(q, δ); ours is with respect to the coordinates of q.
  By the chain rule ∂q̈/∂δ = ∂q̈/∂q · ∂q/∂δ, with ∂q/∂δ the coefficient-wise
  Jacobian of pin.integrate at δ = 0 (identity for revolute/prismatic joints;
  for the free flyer R for the position and ½ quat ⊗ (·, 0) for the
  quaternion). That Jacobian, and Pinocchio's base columns, are themselves
  checked against central differences of pin.integrate and pin.aba.
* torch.autograd.gradcheck of aba in q, v, τ (float64, batch 2) on the
  project's 4-DOF arm, the double pendulum and solo12.
* d/dθ Σ q̈² for θ = a link mass, one centre-of-mass coordinate and inertia
  entries (a diagonal one, and a symmetric off-diagonal pair) vs central
  finite differences through model.replace(...).
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

pin = pytest.importorskip("pinocchio", reason="Pinocchio (pip package 'pin') is the reference; not installed")

from diffsim_ros import physics  # noqa: E402
from pin_reference import (ROBOTS_BY_NAME, PinReference, free_flyer_integrate_jacobian,  # noqa: E402
                           load_ours, random_states, rel_err, robot_path)

SEED = 7
N_DERIV_STATES = 8
DERIV_TOL = 1e-6


def setup(name, n, seed=SEED):
    case = ROBOTS_BY_NAME[name]
    model = load_ours(name)
    ref = PinReference(robot_path(name), case.floating, model.joint_names, model.link_names)
    q, v, a = random_states(model.lower.numpy(), model.upper.numpy(), case.floating, n, seed)
    tau = ref.batch(ref.rnea, q, v, np.random.default_rng(seed + 1).standard_normal(a.shape))
    return model, ref, q, v, tau


def our_aba_jacobians(model, q, v, tau):
    """Per-state Jacobians of aba: (B, nv, nq), (B, nv, nv), (B, nv, nv)."""
    q, v, tau = (torch.tensor(x, dtype=torch.float64, requires_grad=True) for x in (q, v, tau))
    qdd = physics.aba(model, q, v, tau)
    rows = ([], [], [])
    for i in range(model.nv):
        grads = torch.autograd.grad(qdd[:, i].sum(), (q, v, tau), retain_graph=True, allow_unused=True)
        for store, g, x in zip(rows, grads, (q, v, tau)):
            store.append(torch.zeros_like(x) if g is None else g)
    return tuple(torch.stack(r, dim=1).numpy() for r in rows)


def tangent_jacobian(ref, q):
    """∂q/∂δ of q ⊕ δ at δ = 0 (nq, nv), our orderings."""
    jac = np.zeros((ref.nq, ref.nv))
    if ref.floating:
        jac[:7, :6] = free_flyer_integrate_jacobian(q)
    jac[ref.nqb:, ref.nvb:] = np.eye(ref.nq - ref.nqb)
    return jac


def assert_close_per_state(name, what, ours, ref, tol=DERIV_TOL):
    err = rel_err(ours, ref, event_dims=2)
    assert err.max() <= tol, "%s %s: relative error %.3g > %.0e at state %d (median %.3g)" % (
        name, what, err.max(), tol, int(np.argmax(err)), np.median(err))


@pytest.mark.parametrize("name", ["panda", "solo12", "tree_continuous_floating"])
def test_aba_derivatives_match_pinocchio(name):
    model, ref, q, v, tau = setup(name, N_DERIV_STATES)
    d_q, d_v, d_tau = our_aba_jacobians(model, q, v, tau)
    pin_dq, pin_dv, pin_minv = zip(*(ref.aba_derivatives(*s) for s in zip(q, v, tau)))
    ours_dq_tangent = np.stack([d_q[b] @ tangent_jacobian(ref, q[b]) for b in range(len(q))])
    assert_close_per_state(name, "d aba / d q (tangent)", ours_dq_tangent, np.stack(pin_dq))
    assert_close_per_state(name, "d aba / d v", d_v, np.stack(pin_dv))
    assert_close_per_state(name, "d aba / d tau vs Minv", d_tau, np.stack(pin_minv))


def test_pinocchio_free_flyer_tangent_convention():
    """What the comparison above assumes about Pinocchio's free-flyer tangent convention.

    Its ddq_dq is ∂ aba(q ⊕ δ) / ∂δ, and ∂(q ⊕ δ)/∂δ is free_flyer_integrate_jacobian.
    """
    model, ref, q, v, tau = setup("solo12", 3)
    h = 1e-6
    for b in range(len(q)):
        basis = np.eye(ref.nv)
        jac_fd = np.stack([(ref.integrate(q[b], h * e) - ref.integrate(q[b], -h * e)) / (2 * h)
                           for e in basis], axis=1)
        np.testing.assert_allclose(jac_fd, tangent_jacobian(ref, q[b]), rtol=0, atol=1e-8)
        dq_fd = np.stack([(ref.aba(ref.integrate(q[b], h * e), v[b], tau[b])
                           - ref.aba(ref.integrate(q[b], -h * e), v[b], tau[b])) / (2 * h)
                          for e in basis], axis=1)
        assert rel_err(dq_fd, ref.aba_derivatives(q[b], v[b], tau[b])[0], 2) < 1e-7


@pytest.mark.parametrize("name", ["diffsim_arm", "double_pendulum", "solo12"])
def test_aba_gradcheck(name):
    model, _, q, v, tau = setup(name, 2)
    # τ of order one acceleration, as produced by setup(). The tolerances
    # allow for the finite differences' rounding noise, ~ε|∂q̈/∂τ||τ|/eps ≈ 1e-6
    # on solo12, whose Minv has entries up to ~5e3.
    inputs = tuple(torch.tensor(x, dtype=torch.float64, requires_grad=True) for x in (q, v, tau))
    assert torch.autograd.gradcheck(lambda q_, v_, t_: physics.aba(model, q_, v_, t_), inputs,
                                    eps=1e-6, atol=1e-5, rtol=1e-5)


def _loss(model, q, v, tau):
    return (physics.aba(model, q, v, tau) ** 2).sum()


PARAMETER_CASES = [
    # (parameter, index into that tensor; the body index is chosen below)
    ("mass", ()),
    ("com", (1,)),
    ("inertia", (0, 0)),
    ("inertia", (0, 1)),  # perturbed together with (1, 0): the tensor stays symmetric
]


@pytest.mark.parametrize("name", ["panda", "solo12", "diffsim_arm"])
@pytest.mark.parametrize("param,index", PARAMETER_CASES, ids=["mass", "com_y", "inertia_xx", "inertia_xy"])
def test_aba_gradient_wrt_physical_parameter(name, param, index):
    model, _, q, v, tau = setup(name, 4, seed=SEED + 3)
    q, v, tau = (torch.tensor(x, dtype=torch.float64) for x in (q, v, tau))
    nb = len(model.body_names)
    body = nb // 2  # a body in the middle of the tree
    base = getattr(model, param).detach().clone()
    assert base.shape[0] == nb, (param, tuple(base.shape), nb)
    idx = (body,) + index
    sym_idx = (body, index[1], index[0]) if param == "inertia" and index[0] != index[1] else None

    theta = base.clone().requires_grad_(True)
    loss = _loss(model.replace(**{param: theta}), q, v, tau)
    (grad,) = torch.autograd.grad(loss, theta, allow_unused=True)
    assert grad is not None, "%s: aba does not depend on model.%s (no gradient path)" % (name, param)
    analytic = float(grad[idx]) + (float(grad[sym_idx]) if sym_idx else 0.0)

    scale = max(abs(float(base[idx])), 1e-3)
    h = 1e-5 * scale

    def perturbed(sign):
        value = base.clone()
        value[idx] += sign * h
        if sym_idx:
            value[sym_idx] += sign * h
        return float(_loss(model.replace(**{param: value}), q, v, tau))

    numeric = (perturbed(+1) - perturbed(-1)) / (2 * h)
    err = abs(analytic - numeric) / max(abs(numeric), 1e-6 * float(loss.detach()))
    assert err < 1e-5, "%s d loss / d %s%s of body %r: autograd %.10g, finite differences %.10g" % (
        name, param, list(idx[1:]), model.body_names[body], analytic, numeric)
