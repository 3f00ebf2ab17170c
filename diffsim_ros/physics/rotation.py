"""Rotations in NumPy float64, for the code that runs beside the differentiable physics.

That code is the URDF parser, the MuJoCo stand-in and its flight controller, the excitation,
the recordings and the message conversions.

Quaternions are stored x, y, z, w (ROS order) as everywhere in diffsim_ros; roll-pitch-yaw
is URDF's and ROS's fixed-axis x, y, z convention, R = Rz(yaw) Ry(pitch) Rx(roll). The
arithmetic is transforms3d's (which stores w first). The batched, differentiable torch
counterparts are in :mod:`diffsim_ros.physics.spatial` (quat_to_matrix, quat_mul,
quat_exp, roll_pitch); test_spatial_maps checks that the two agree.
"""
from __future__ import annotations

from typing import Sequence, Tuple, Union

import numpy as np
from transforms3d import euler, quaternions

__all__ = ["quat_to_matrix", "quat_mul", "quat_exp", "rpy_to_matrix", "quat_to_rpy"]


def _wxyz(q) -> np.ndarray:
    x, y, z, w = np.asarray(q, dtype=np.float64)
    return np.array([w, x, y, z])


def _xyzw(q) -> np.ndarray:
    w, x, y, z = q
    return np.array([x, y, z, w], dtype=np.float64)


def quat_to_matrix(quat: Sequence[float]) -> np.ndarray:
    """Rotation matrix of a quaternion x, y, z, w (of any non-zero length: normalised here)."""
    return quaternions.quat2mat(_wxyz(quat))


def quat_mul(a: Sequence[float], b: Sequence[float]) -> np.ndarray:
    """Hamilton product a b of quaternions x, y, z, w (the rotation b, then a)."""
    return _xyzw(quaternions.qmult(_wxyz(a), _wxyz(b)))


def quat_exp(phi: Union[Sequence[float], np.ndarray]) -> np.ndarray:
    """Return the unit quaternion x, y, z, w of the rotation vector ``phi`` (axis times angle, rad)."""
    phi = np.asarray(phi, dtype=np.float64)
    angle = float(np.linalg.norm(phi))
    if angle < 1e-12:
        return np.array([0.5 * phi[0], 0.5 * phi[1], 0.5 * phi[2], 1.0])
    return _xyzw(quaternions.axangle2quat(phi / angle, angle, is_normalized=True))


def rpy_to_matrix(rpy: Sequence[float]) -> np.ndarray:
    """R = Rz(yaw) Ry(pitch) Rx(roll) of URDF's roll, pitch, yaw (fixed axes x, y, z)."""
    r, p, y = (float(a) for a in rpy)
    return euler.euler2mat(r, p, y, axes="sxyz")


def quat_to_rpy(x: float, y: float, z: float, w: float) -> Tuple[float, float, float]:
    """Roll, pitch, yaw (rad; R = Rz(yaw) Ry(pitch) Rx(roll)) of a unit quaternion x y z w."""
    roll, pitch, yaw = euler.quat2euler((w, x, y, z), axes="sxyz")
    return float(roll), float(pitch), float(yaw)
