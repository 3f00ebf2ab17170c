"""Plain, validated description of a robot as read from URDF.

This is the boundary between the URDF reader (``urdf.py``), which checks
everything and names what is wrong, and the model builder (``model.py``), which
turns a description into the tensors of a :class:`~diffsim_ros.physics.Model`.
Everything here is plain Python / NumPy; nothing is a tensor yet.

All poses are URDF origins: ``xyz`` in metres and ``rpy`` in radians (fixed-axis
roll, pitch, yaw, i.e. R = Rz(yaw) Ry(pitch) Rx(roll)).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

import numpy as np


class UrdfError(ValueError):
    """A URDF (or xacro) that cannot be turned into a model.

    The message names the file and the link or joint at fault.
    """


@dataclass(frozen=True)
class Origin:
    xyz: Tuple[float, float, float] = (0.0, 0.0, 0.0)
    rpy: Tuple[float, float, float] = (0.0, 0.0, 0.0)


@dataclass(frozen=True)
class Inertial:
    mass: float                      # kg, finite, >= 0
    origin: Origin                   # centre of mass frame in the link frame
    inertia: np.ndarray              # (3, 3) about the COM, in the inertial origin's frame

    def placed(self, R: np.ndarray, p: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
        """Return this link's centre of mass and rotational inertia about the origin of another frame.

        In that frame the link frame sits at rotation ``R``, position ``p``, both in that frame (the
        parallel-axis theorem: R_c I R_c^T + m (|c|^2 1 - c c^T)).
        """
        from .rotation import rpy_to_matrix
        Rc = R @ rpy_to_matrix(self.origin.rpy)
        c = p + R @ np.asarray(self.origin.xyz, dtype=np.float64)
        m = float(self.mass)
        return c, Rc @ np.asarray(self.inertia, dtype=np.float64) @ Rc.T + m * (c @ c * np.eye(3) - np.outer(c, c))


@dataclass(frozen=True)
class Geometry:
    """A collision primitive attached to a link.

    kind: "sphere" (size = (radius,)), "box" (size = (sx, sy, sz), full edge
    lengths), "cylinder" (size = (radius, length), axis along the local z).
    A mesh in the URDF becomes the box that bounds its vertices (after scale),
    with ``origin`` moved to the box centre and ``mesh`` set to the resolved file.
    """

    link: str
    kind: str
    size: Tuple[float, ...]
    origin: Origin
    mesh: Optional[str] = None


@dataclass(frozen=True)
class Link:
    name: str
    inertial: Optional[Inertial]
    collisions: Tuple[Geometry, ...] = ()


@dataclass(frozen=True)
class Mimic:
    joint: str
    multiplier: float = 1.0
    offset: float = 0.0


@dataclass(frozen=True)
class Joint:
    name: str
    type: str                        # "revolute" | "continuous" | "prismatic" | "fixed"
    parent: str
    child: str
    origin: Origin                   # child (joint) frame in the parent link frame at q = 0
    axis: Tuple[float, float, float] = (1.0, 0.0, 0.0)   # unit vector, joint frame
    lower: float = -np.inf           # rad or m (-inf for continuous)
    upper: float = np.inf
    velocity: float = np.inf         # rad/s or m/s
    effort: float = np.inf           # N m or N
    damping: float = 0.0             # N m s/rad or N s/m
    friction: float = 0.0            # N m or N (Coulomb)
    mimic: Optional[Mimic] = None    # q = multiplier * q_leader + offset: not a DOF (see model.py)


@dataclass
class RobotDescription:
    name: str
    links: Dict[str, Link]           # in file order
    joints: List[Joint]              # in file order
    root: str                        # the one link without a parent
    source: str                      # file path, or "<string>"
    xml: str                         # the expanded URDF text (after xacro), for hashing
    children: Dict[str, List[Joint]] = field(default_factory=dict)  # link -> joints, file order
