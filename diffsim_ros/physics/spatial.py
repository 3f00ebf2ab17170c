"""Spatial algebra on batched tensors (Featherstone's notation, Pinocchio's ordering).

Spatial motion vectors are ``[v; w]`` (linear first, then angular) and spatial
force vectors ``[f; n]``, as in Pinocchio. All functions take tensors with any
leading batch dimensions and are differentiable.

Naming follows *Rigid Body Dynamics Algorithms*: ``X`` a 6x6 motion transform,
``I`` a 6x6 spatial inertia, ``S`` a motion subspace, ``v``/``a`` motion and
``f`` force vectors.
"""
from __future__ import annotations

import contextlib

import torch


def skew(w: torch.Tensor) -> torch.Tensor:
    """(..., 3) w -> (..., 3, 3) matrix [w]x with [w]x @ x == cross(w, x)."""
    x, y, z = w.unbind(-1)
    o = torch.zeros_like(x)
    return torch.stack(
        (torch.stack((o, -z, y), -1), torch.stack((z, o, -x), -1), torch.stack((-y, x, o), -1)), -2
    )


def cross(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Cross product of (..., 3) vectors, written out.

    Elementwise products and differences round the same at every batch size (a fused kernel's
    vectorised and scalar paths may not), so an observation is bitwise the same for one
    environment or many.
    """
    ax, ay, az = a.unbind(-1)
    bx, by, bz = b.unbind(-1)
    return torch.stack((ay * bz - az * by, az * bx - ax * bz, ax * by - ay * bx), -1)


def fast_cross(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Cross product of (..., 3) vectors in one kernel (the physics' choice: few ops)."""
    return torch.linalg.cross(a, b, dim=-1)


def quat_to_matrix(quat: torch.Tensor) -> torch.Tensor:
    """Quaternion stored x, y, z, w (ROS order) -> rotation matrix.

    The quaternion is normalised first, so the map is smooth near (but not at)
    zero and an integrator's drift off the unit sphere does not scale the body.
    """
    quat = quat / torch.linalg.vector_norm(quat, dim=-1, keepdim=True)
    x, y, z, w = quat.unbind(-1)
    xx, yy, zz = x * x, y * y, z * z
    xy, xz, yz = x * y, x * z, y * z
    wx, wy, wz = w * x, w * y, w * z
    return torch.stack(
        (
            torch.stack((1 - 2 * (yy + zz), 2 * (xy - wz), 2 * (xz + wy)), -1),
            torch.stack((2 * (xy + wz), 1 - 2 * (xx + zz), 2 * (yz - wx)), -1),
            torch.stack((2 * (xz - wy), 2 * (yz + wx), 1 - 2 * (xx + yy)), -1),
        ),
        -2,
    )


_CONSTANTS: dict = {}


def kept_in(store: dict, key, make):
    """``store[key]``, made by ``make()`` the first time, outside inference mode.

    A first caller under torch.inference_mode must not leave inference tensors for a later one
    that trains. A plain dict rather than functools.lru_cache: torch.compile reads an entry that
    exists as a constant of the graph, whereas it traces through an lru_cache'd function,
    building the table again inside every graph.
    """
    value = store.get(key)
    if value is None:
        with torch.inference_mode(False), _real_tensors():
            value = store[key] = make()
    return value


_TRACING = [0]      # depth of tracing() blocks


@contextlib.contextmanager
def tracing():
    """Mark a trace of the step made by the project itself as :func:`traced`.

    Such a trace is one of compiled.py's forward and backward graphs, traced by AOTAutograd
    without Dynamo.
    """
    _TRACING[0] += 1
    try:
        yield
    finally:
        _TRACING[0] -= 1


def traced() -> bool:
    """Whether the step is being traced into one graph (torch.compile, torch.export or :func:`tracing`).

    torch.export traces the ahead-of-time compiled step. While tracing, the branches that suit
    eager execution (host-side selection, small-batch kernels) give way to ones without host
    synchronisation.
    """
    return bool(_TRACING[0]) or torch.compiler.is_compiling() or torch.compiler.is_exporting()


def _real_tensors():
    """Return a context in which a table made for the store is a real tensor, even while tracing.

    Under torch.export's tracing (non-strict: Python runs with fake tensors) or :func:`tracing`,
    a table made for the store must still be a real tensor: the export takes it as a constant,
    and a later eager caller reads the same entry. Outside an export this does nothing.
    """
    if _TRACING[0] or torch.compiler.is_exporting():
        from torch.utils._python_dispatch import _disable_current_modes
        return _disable_current_modes()
    return contextlib.nullcontext()


def process_constant(key: tuple, make):
    """``make()``, computed once per process under ``key`` (python scalars and strings)."""
    return kept_in(_CONSTANTS, key, make)


def homogeneous(R: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """(..., 3, 3), (..., 3) -> (..., 4, 4) homogeneous transform."""
    top = torch.cat((R, p[..., None]), -1)
    bottom = torch.zeros(R.shape[:-2] + (1, 4), dtype=R.dtype, device=R.device)
    bottom[..., 0, 3] = 1.0
    return torch.cat((top, bottom), -2)


def _hamilton_table(dtype: torch.dtype, device: str) -> torch.Tensor:
    """(16, 4): the Hamilton product as a bilinear map, (a b)_k = sum_ij T[4 i + j, k] a_i b_j."""
    def make():
        t = torch.zeros(4, 4, 4, dtype=dtype)
        x, y, z, w = range(4)
        for k, terms in enumerate((((w, x, 1), (x, w, 1), (y, z, 1), (z, y, -1)),
                                   ((w, y, 1), (x, z, -1), (y, w, 1), (z, x, 1)),
                                   ((w, z, 1), (x, y, 1), (y, x, -1), (z, w, 1)),
                                   ((w, w, 1), (x, x, -1), (y, y, -1), (z, z, -1)))):
            for i, j, sign in terms:
                t[i, j, k] = sign
        return t.reshape(16, 4).to(device)
    return process_constant(("hamilton", str(dtype), device), make)


def quat_mul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Hamilton product of quaternions stored x, y, z, w.

    It is the outer product of the two through a constant table, a few operations instead of
    sixteen products.
    """
    outer = (a.unsqueeze(-1) * b.unsqueeze(-2)).flatten(-2)
    return outer @ _hamilton_table(outer.dtype, str(outer.device))


def quat_rotate(quat: torch.Tensor, x: torch.Tensor, cross_fn=cross) -> torch.Tensor:
    """Rotate vectors x (..., 3) by unit quaternions (..., 4) stored x, y, z, w."""
    u, w = quat[..., 0:3], quat[..., 3:4]
    t = 2.0 * cross_fn(u, x)
    return x + w * t + cross_fn(u, t)


def quat_exp(phi: torch.Tensor) -> torch.Tensor:
    """Return the unit quaternion (x, y, z, w) of the rotation vector ``phi`` (..., 3), smooth at zero."""
    theta2 = (phi ** 2).sum(-1, keepdim=True)
    theta = torch.sqrt(theta2 + 1e-24)
    half = 0.5 * theta
    # sin(theta/2)/theta with its Taylor series near zero (no 0/0 in value or gradient).
    small = theta2 < 1e-8
    k = torch.where(small, 0.5 - theta2 / 48.0, torch.sin(half) / torch.where(small, torch.ones_like(theta), theta))
    return torch.cat((phi * k, torch.cos(half)), -1)



def roll_pitch(quat: torch.Tensor):
    """Roll and pitch (rad; R = Rz(yaw) Ry(pitch) Rx(roll)) of orientations (..., 4) x y z w."""
    x, y, z, w = quat.unbind(-1)
    roll = torch.atan2(2 * (w * x + y * z), 1 - 2 * (x * x + y * y))
    pitch = torch.asin(torch.clamp(2 * (w * y - z * x), -1.0, 1.0))
    return roll, pitch
