"""Our forward kinematics, rnea, crba and aba against Pinocchio.

For every robot (four from example-robot-data and the project's own URDFs),
100 seeded random states are pushed through *one* batched call of each of our
functions and compared, state by state and mapped by joint/link name, with
Pinocchio evaluated state by state:

* float64: relative error |ours - pin| / max(|pin|, 1) <= 1e-9 for the pose
  of every link (4x4, vs data.oMf), the linear Jacobian of every link origin
  (vs getFrameJacobian, LOCAL_WORLD_ALIGNED), M(q) (vs pin.crba, symmetrised), rnea and aba;
  our aba also equals M⁻¹(τ − rnea(q, v, 0)) built from our crba and rnea;
* float32: the same comparisons to looser tolerances (FLOAT32_TOL below);
* leading batch dimensions (4, 25, ·) and no batch dimension give the flat result;
* on CUDA (when torch sees a GPU) the float64 comparison holds there too.

States: q uniform within the joint limits ([-π, π] for continuous joints), a
uniformly random unit quaternion and a N(0, 1) position for a floating base,
v and a ~ N(0, 1). τ is Pinocchio's rnea(q, v, a') for an independent
a' ~ N(0, 1): torques of the size that produce accelerations of order 1 on
each robot, whatever its masses (a raw N(0, 1) τ would give the 15 g fingers of
the panda accelerations of ~1e3 and test nothing more).
"""
from __future__ import annotations

import functools

import numpy as np
import pytest
import torch

pin = pytest.importorskip("pinocchio", reason="Pinocchio (pip package 'pin') is the reference; not installed")

from diffsim_ros import physics  # noqa: E402
from pin_reference import (ROBOTS, ROBOTS_BY_NAME, PinReference, load_ours as load,  # noqa: E402
                           random_states, rel_err, robot_path)

N_STATES = 100
SEED = 20240607
FLOAT64_TOL = 1e-9
# float32 carries ~6e-8 relative rounding per operation; aba amplifies input
# rounding by cond(M) (up to ~3e4 for solo12 here, ~1e3 for the panda).
FLOAT32_TOL = {"fk": 1e-5, "crba": 1e-5, "rnea": 5e-5, "aba": 2e-3}

ROBOT_NAMES = [case.name for case in ROBOTS]


class Reference:
    """Our float64 model, Pinocchio's, 100 states and Pinocchio's answers."""

    def __init__(self, name: str):
        case = ROBOTS_BY_NAME[name]
        self.name = name
        self.path = robot_path(name)
        self.model = load(name)
        self.pin = PinReference(self.path, case.floating, self.model.joint_names, self.model.link_names)
        assert (self.model.nq, self.model.nv) == (self.pin.nq, self.pin.nv), \
            "%s: ours nq, nv = %s, expected %s" % (name, (self.model.nq, self.model.nv),
                                                   (self.pin.nq, self.pin.nv))
        q, v, a = random_states(self.model.lower.cpu().numpy(), self.model.upper.cpu().numpy(),
                                case.floating, N_STATES, SEED)
        a_tau = np.random.default_rng(SEED + 1).standard_normal(a.shape)
        p = self.pin
        self.q, self.v, self.a = q, v, a
        self.tau = p.batch(p.rnea, q, v, a_tau)
        self.fk = p.batch(p.fk, q)
        self.crba = p.batch(p.crba, q)
        self.rnea = p.batch(p.rnea, q, v, a)
        self.aba = p.batch(p.aba, q, v, self.tau)

    def tensors(self, dtype=torch.float64, device="cpu"):
        return [torch.as_tensor(x, dtype=dtype, device=device) for x in (self.q, self.v, self.a, self.tau)]


@functools.lru_cache(maxsize=None)
def reference(name: str) -> Reference:
    return Reference(name)


def check(name: str, what: str, ours, ref, tol: float, event_dims: int = 1, labels=None):
    ours = ours.detach().cpu().double().numpy() if torch.is_tensor(ours) else ours
    assert ours.shape == ref.shape, "%s %s: shape %s, expected %s" % (name, what, ours.shape, ref.shape)
    assert np.all(np.isfinite(ours)), "%s %s: non-finite values" % (name, what)
    err = rel_err(ours, ref, event_dims)
    worst = np.unravel_index(np.argmax(err), err.shape)
    where = "state %d" % worst[0]
    if labels is not None:
        where += ", link %r" % labels[worst[1]]
    assert err.max() <= tol, "%s %s: relative error %.3g > %.1g at %s (median %.3g)" % (
        name, what, err.max(), tol, where, np.median(err))
    return float(err.max())


@pytest.mark.parametrize("name", ROBOT_NAMES)
def test_model_matches_pinocchio_structure(name):
    ref = reference(name)  # PinReference checks joint and link names against Pinocchio's
    m = ref.model
    assert len(m.joint_names) == len(set(m.joint_names))
    assert m.nv == len(m.joint_names) + (6 if ROBOTS_BY_NAME[name].floating else 0)
    assert m.nq == len(m.joint_names) + (7 if ROBOTS_BY_NAME[name].floating else 0)
    np.testing.assert_allclose(m.gravity.cpu().numpy(), ref.pin.model.gravity.linear, rtol=0, atol=1e-12)
    pm = ref.pin.model
    for k, jname in enumerate(m.joint_names):
        idx_q = pm.joints[pm.getJointId(jname)].idx_q
        if pm.joints[pm.getJointId(jname)].nq == 1:  # Pinocchio: [-inf, inf] stands for "no limit"
            assert float(m.lower[k]) == pytest.approx(pm.lowerPositionLimit[idx_q]), jname
            assert float(m.upper[k]) == pytest.approx(pm.upperPositionLimit[idx_q]), jname
    # total mass of the moving bodies: Pinocchio's joint inertias, the fixed
    # base's (universe, index 0) left out as ours leaves it out
    total_pin = sum(pm.inertias[i].mass for i in range(1, pm.njoints))
    assert float(m.mass.sum()) == pytest.approx(total_pin, rel=1e-12)


@pytest.mark.parametrize("name", ROBOT_NAMES)
def test_forward_kinematics(name):
    ref = reference(name)
    q, _, _, _ = ref.tensors()
    check(name, "forward_kinematics", physics.forward_kinematics(ref.model, q), ref.fk,
          FLOAT64_TOL, event_dims=2, labels=ref.model.link_names)


@pytest.mark.parametrize("name", ROBOT_NAMES)
def test_link_jacobian(name):
    """Every link origin's world-frame Jacobian against Pinocchio's getFrameJacobian.

    LOCAL_WORLD_ALIGNED, linear rows, on 20 of the random states; link_kinematics's
    position (the pass link_jacobian is built on) against Pinocchio's placements.
    """
    ref = reference(name)
    q, _, _, _ = ref.tensors()
    n = 20
    want = ref.pin.batch(ref.pin.link_jacobians, ref.q[:n])                    # (n, links, 3, nv)
    ours = torch.stack([physics.link_jacobian(ref.model, q[:n], li) for li in range(len(ref.model.link_names))], 1)
    check(name, "link_jacobian", ours, want, FLOAT64_TOL, event_dims=2, labels=ref.model.link_names)
    pos = torch.stack([physics.link_kinematics(ref.model, q[:n], li)[0] for li in range(len(ref.model.link_names))], 1)
    check(name, "link_kinematics position", pos, ref.fk[:n, :, 0:3, 3], FLOAT64_TOL, event_dims=1,
          labels=ref.model.link_names)


@pytest.mark.parametrize("name", ROBOT_NAMES)
def test_mass_matrix(name):
    ref = reference(name)
    q, _, _, _ = ref.tensors()
    check(name, "crba", physics.crba(ref.model, q), ref.crba, FLOAT64_TOL, event_dims=2)


@pytest.mark.parametrize("name", ROBOT_NAMES)
def test_rnea(name):
    ref = reference(name)
    q, v, a, _ = ref.tensors()
    check(name, "rnea", physics.rnea(ref.model, q, v, a), ref.rnea, FLOAT64_TOL)


@pytest.mark.parametrize("name", ROBOT_NAMES)
def test_aba(name):
    ref = reference(name)
    q, v, _, tau = ref.tensors()
    check(name, "aba", physics.aba(ref.model, q, v, tau), ref.aba, FLOAT64_TOL)


@pytest.mark.parametrize("name", ROBOT_NAMES)
def test_aba_equals_crba_rnea_solve(name):
    """Ours against ours: aba(q, v, τ) = M(q)⁻¹ (τ − rnea(q, v, 0))."""
    ref = reference(name)
    q, v, _, tau = ref.tensors()
    m = ref.model
    bias = physics.rnea(m, q, v, torch.zeros_like(v))
    solved = torch.linalg.solve(physics.crba(m, q), (tau - bias).unsqueeze(-1)).squeeze(-1)
    check(name, "aba vs crba/rnea solve", physics.aba(m, q, v, tau), solved.numpy(), FLOAT64_TOL)


@pytest.mark.parametrize("name", ROBOT_NAMES)
def test_float32(name):
    ref = reference(name)
    m32 = load(name, dtype=torch.float32)
    assert m32.mass.dtype == torch.float32
    q, v, a, tau = ref.tensors(torch.float32)
    if ROBOTS_BY_NAME[name].floating:  # a unit quaternion in float32
        q = torch.cat([q[:, :3], q[:, 3:7] / q[:, 3:7].norm(dim=-1, keepdim=True), q[:, 7:]], dim=-1)
    results = {
        "fk": physics.forward_kinematics(m32, q),
        "crba": physics.crba(m32, q),
        "rnea": physics.rnea(m32, q, v, a),
        "aba": physics.aba(m32, q, v, tau),
    }
    for what, out in results.items():
        assert out.dtype == torch.float32, "%s %s: dtype %s" % (name, what, out.dtype)
    check(name, "float32 forward_kinematics", results["fk"], ref.fk, FLOAT32_TOL["fk"], 2, ref.model.link_names)
    check(name, "float32 crba", results["crba"], ref.crba, FLOAT32_TOL["crba"], 2)
    check(name, "float32 rnea", results["rnea"], ref.rnea, FLOAT32_TOL["rnea"])
    check(name, "float32 aba", results["aba"], ref.aba, FLOAT32_TOL["aba"])


@pytest.mark.parametrize("name", ["panda", "solo12", "diffsim_arm"])
def test_leading_batch_dimensions(name):
    """Leading batch dimensions: (4, 25, ·) inputs give the flat (100, ·) answers reshaped.

    A single unbatched state gives row 0.
    """
    ref = reference(name)
    m = ref.model
    q, v, a, tau = ref.tensors()
    flat = {
        "fk": physics.forward_kinematics(m, q),
        "crba": physics.crba(m, q),
        "rnea": physics.rnea(m, q, v, a),
        "aba": physics.aba(m, q, v, tau),
    }
    q4, v4, a4, tau4 = (x.reshape(4, 25, x.shape[-1]) for x in (q, v, a, tau))
    nested = {
        "fk": physics.forward_kinematics(m, q4),
        "crba": physics.crba(m, q4),
        "rnea": physics.rnea(m, q4, v4, a4),
        "aba": physics.aba(m, q4, v4, tau4),
    }
    single = {
        "fk": physics.forward_kinematics(m, q[0]),
        "crba": physics.crba(m, q[0]),
        "rnea": physics.rnea(m, q[0], v[0], a[0]),
        "aba": physics.aba(m, q[0], v[0], tau[0]),
    }
    for what in flat:
        expected = flat[what].reshape((4, 25) + flat[what].shape[1:])
        assert nested[what].shape == expected.shape, (what, nested[what].shape, expected.shape)
        torch.testing.assert_close(nested[what], expected, rtol=1e-12, atol=1e-12, msg=what)
        assert single[what].shape == flat[what].shape[1:], (what, single[what].shape)
        torch.testing.assert_close(single[what], flat[what][0], rtol=1e-12, atol=1e-12, msg=what)


FAR = (100.0, -100.0, 10.0)  # m: a quadruped that walked, or a quadrotor that flew, 100 m


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["float64", "float32"])
@pytest.mark.parametrize("name", ["solo12", "diffsim_quadruped", "diffsim_quadrotor"])
def test_floating_base_far_from_origin(name, dtype):
    """A floating base far from the origin is as accurate as near it.

    Under uniform gravity the dynamics do not depend on where the base is
    (v is in the body frame): with the base 100 m from the world origin, M(q),
    rnea and aba must be as accurate as near it (the same tolerances).
    Link poses are compared too (their translations are then ~100 m).
    """
    ref = reference(name)
    m = ref.model if dtype == torch.float64 else load(name, dtype=dtype)
    q = ref.q.copy()
    q[:, :3] += np.array(FAR)
    p = ref.pin
    expected = {
        "fk": p.batch(p.fk, q),
        "crba": ref.crba,   # translation-invariant: the same as at the original positions
        "rnea": ref.rnea,
        "aba": ref.aba,
    }
    np.testing.assert_allclose(p.batch(p.aba, q, ref.v, ref.tau), ref.aba, rtol=1e-9, atol=1e-9)
    qt, v, a, tau = (torch.as_tensor(x, dtype=dtype) for x in (q, ref.v, ref.a, ref.tau))
    if dtype == torch.float32:
        qt = torch.cat([qt[:, :3], qt[:, 3:7] / qt[:, 3:7].norm(dim=-1, keepdim=True), qt[:, 7:]], dim=-1)
    tol = FLOAT64_TOL if dtype == torch.float64 else None
    tag = "base at %s m, %s" % (FAR, str(dtype).replace("torch.", ""))
    check(name, "forward_kinematics, " + tag, physics.forward_kinematics(m, qt), expected["fk"],
          tol or FLOAT32_TOL["fk"], 2, ref.model.link_names)
    check(name, "crba, " + tag, physics.crba(m, qt), expected["crba"], tol or FLOAT32_TOL["crba"], 2)
    check(name, "rnea, " + tag, physics.rnea(m, qt, v, a), expected["rnea"], tol or FLOAT32_TOL["rnea"])
    check(name, "aba, " + tag, physics.aba(m, qt, v, tau), expected["aba"], tol or FLOAT32_TOL["aba"])


@pytest.mark.skipif(not torch.cuda.is_available(),
                    reason="torch sees no CUDA device (torch.cuda.is_available() is False)")
@pytest.mark.parametrize("name", ["panda", "solo12"])
def test_cuda_float64(name):
    ref = reference(name)
    m = load(name, device="cuda")
    q, v, a, tau = ref.tensors(device="cuda")
    fk = physics.forward_kinematics(m, q)
    assert fk.device.type == "cuda"
    check(name, "cuda forward_kinematics", fk, ref.fk, FLOAT64_TOL, 2, ref.model.link_names)
    check(name, "cuda crba", physics.crba(m, q), ref.crba, FLOAT64_TOL, 2)
    check(name, "cuda rnea", physics.rnea(m, q, v, a), ref.rnea, FLOAT64_TOL)
    check(name, "cuda aba", physics.aba(m, q, v, tau), ref.aba, FLOAT64_TOL)
