"""The rotation helpers written as constant maps, against transforms3d.

The helpers are the Hamilton product through a 16 x 4 table, the rotation matrix of a
quaternion through a 9 x 16 one, and the cross-product matrix by gather and sign; they are
checked against transforms3d and the plain cross product, for all inputs (hypothesis).
"""
from __future__ import annotations

import numpy as np
import torch
import transforms3d.quaternions as tq
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from diffsim_ros.physics import spatial
from diffsim_ros.physics.algorithms import _cross, _quat_to_matrix, _skew

finite = st.floats(-10.0, 10.0, allow_nan=False, allow_infinity=False)
quat = arrays(np.float64, 4, elements=finite).filter(lambda q: np.linalg.norm(q) > 1e-3)


def _wxyz(q):
    return np.asarray(q)[[3, 0, 1, 2]]


@settings(max_examples=200, deadline=None)
@given(quat, quat)
def test_hamilton_product_matches_transforms3d(a, b):
    got = spatial.quat_mul(torch.from_numpy(a), torch.from_numpy(b)).numpy()
    np.testing.assert_allclose(_wxyz(got), tq.qmult(_wxyz(a), _wxyz(b)), rtol=1e-12, atol=1e-12)


@settings(max_examples=200, deadline=None)
@given(st.lists(quat, min_size=1, max_size=5))
def test_rotation_matrix_of_a_quaternion_matches_transforms3d(qs):
    q = torch.from_numpy(np.stack(qs).T)                     # (4, B), not normalised
    R = _quat_to_matrix(q).numpy()
    for i, qi in enumerate(qs):
        np.testing.assert_allclose(R[..., i], tq.quat2mat(_wxyz(qi) / np.linalg.norm(qi)), atol=1e-12)


@settings(max_examples=200, deadline=None)
@given(arrays(np.float64, (2, 3, 4), elements=finite), arrays(np.float64, (2, 3, 4), elements=finite))
def test_cross_product_matrix_times_a_vector_is_the_cross_product(w, x):
    w, x = torch.from_numpy(w), torch.from_numpy(x)            # (2, 3, B=4) batch-last
    K = _skew(w)
    got = (K * x.unsqueeze(-3)).sum(-2)
    np.testing.assert_allclose(got.numpy(), _cross(w, x).numpy(), rtol=1e-12, atol=1e-10)
    np.testing.assert_allclose(got.numpy(), np.cross(w.numpy(), x.numpy(), axis=1), rtol=1e-12, atol=1e-10)
    np.testing.assert_array_equal(K.numpy(), -K.transpose(1, 2).numpy())


# ---- the NumPy rotation module (physics.rotation) beside the torch helpers it mirrors
from diffsim_ros.physics import rotation  # noqa: E402

angle = st.floats(-3.0, 3.0, allow_nan=False, allow_infinity=False)


@settings(max_examples=200, deadline=None)
@given(quat, quat)
def test_numpy_and_torch_quaternions_agree(a, b):
    np.testing.assert_allclose(rotation.quat_to_matrix(a), spatial.quat_to_matrix(torch.from_numpy(a)).numpy(),
                               atol=1e-12)
    np.testing.assert_allclose(rotation.quat_mul(a, b),
                               spatial.quat_mul(torch.from_numpy(a), torch.from_numpy(b)).numpy(), rtol=1e-12,
                               atol=1e-12)


@settings(max_examples=200, deadline=None)
@given(arrays(np.float64, 3, elements=st.floats(-6.0, 6.0, allow_nan=False, allow_infinity=False)))
def test_rotation_vector_exponential_is_the_matrix_exponential(phi):
    S = np.array([[0, -phi[2], phi[1]], [phi[2], 0, -phi[0]], [-phi[1], phi[0], 0]])
    expm = lambda A: torch.linalg.matrix_exp(torch.from_numpy(A)).numpy()      # noqa: E731
    q = rotation.quat_exp(phi)
    np.testing.assert_allclose(np.linalg.norm(q), 1.0, atol=1e-12)
    np.testing.assert_allclose(rotation.quat_to_matrix(q), expm(S), atol=1e-9)
    np.testing.assert_allclose(spatial.quat_exp(torch.from_numpy(phi)).numpy(), q, atol=1e-12)


@settings(max_examples=200, deadline=None)
@given(angle, st.floats(-1.5, 1.5, allow_nan=False, allow_infinity=False), angle)
def test_roll_pitch_yaw_round_trip(r, p, y):
    def axis(i, a):
        c, s = np.cos(a), np.sin(a)
        j, k = (i + 1) % 3, (i + 2) % 3
        R = np.eye(3)
        R[j, j], R[j, k], R[k, j], R[k, k] = c, -s, s, c
        return R
    R = rotation.rpy_to_matrix((r, p, y))
    np.testing.assert_allclose(R, axis(2, y) @ axis(1, p) @ axis(0, r), atol=1e-12)   # URDF: fixed x, y, z
    w, x, yy, z = tq.mat2quat(R)
    np.testing.assert_allclose(rotation.quat_to_rpy(x, yy, z, w), (r, p, y), atol=1e-9)
    roll, pitch = spatial.roll_pitch(torch.tensor([x, yy, z, w], dtype=torch.float64))
    np.testing.assert_allclose((float(roll), float(pitch)), (r, p), atol=1e-9)
