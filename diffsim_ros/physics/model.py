"""The immutable physics ``Model`` and its construction from a URDF description.

A model is a tree of *bodies*. Each body is moved by one joint (revolute,
continuous, prismatic, or the free-flyer of a floating base); links attached by
fixed joints are merged into the body they hang from: their inertia is added
to it and their frame is kept (for kinematics and collision geometry) as a
constant placement in the body frame. Bodies are numbered depth-first, so a
parent always comes before its children, and the order of ``q``/``v`` is the
order of the bodies.

Physical parameters (``mass``, ``com``, ``inertia``, ``damping``, ``friction``,
...) are ordinary tensors: ``model.replace(mass=m)`` with ``m.requires_grad``
makes every algorithm differentiable in them.
"""
from __future__ import annotations

import dataclasses
import hashlib
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

import numpy as np
import torch

from .description import Joint, RobotDescription, UrdfError
from .spatial import rpy_to_matrix_np

MOVING_JOINTS = ("revolute", "continuous", "prismatic")


@dataclass(frozen=True)
class Collision:
    """A collision primitive in the frame of a body (``body == -1``: the world)."""
    link: str
    body: int
    kind: str                    # "sphere" | "box" | "cylinder"
    size: torch.Tensor           # (1,) radius | (3,) full box edges | (2,) radius, length
    R: torch.Tensor              # (3, 3) orientation in the body frame
    p: torch.Tensor              # (3,) position in the body frame
    mesh: Optional[str] = None   # the mesh this primitive bounds, if any


@dataclass(frozen=True)
class Model:
    """Constant description of an articulated rigid-body system.

    Per body ``i`` (``nb`` bodies): ``parent[i]`` (-1 for the world),
    ``joint_type[i]`` ("free", "revolute", "continuous", "prismatic"), the joint
    frame at zero configuration in the parent body frame (``tree_R[i]``,
    ``tree_p[i]``), the joint ``axis[i]`` (unit, joint frame), its first indices
    ``q_start[i]``/``v_start[i]`` and its inertia in the body frame: ``mass[i]``
    (kg), ``com[i]`` (m) and ``inertia[i]`` (kg m^2, about the centre of mass).

    Per actuated joint (``len(joint_names)``, in q/v order after the floating
    base): limits ``lower``/``upper`` (rad or m), ``velocity_limit``,
    ``effort_limit``, and ``<dynamics>`` ``damping`` and ``friction``.
    """
    name: str
    floating_base: bool
    joint_names: List[str]
    body_names: List[str]
    parent: Tuple[int, ...]
    joint_type: Tuple[str, ...]
    q_start: Tuple[int, ...]
    v_start: Tuple[int, ...]
    nq: int
    nv: int
    tree_R: torch.Tensor
    tree_p: torch.Tensor
    axis: torch.Tensor
    mass: torch.Tensor
    com: torch.Tensor
    inertia: torch.Tensor
    lower: torch.Tensor
    upper: torch.Tensor
    velocity_limit: torch.Tensor
    effort_limit: torch.Tensor
    damping: torch.Tensor
    friction: torch.Tensor
    gravity: torch.Tensor
    link_names: List[str]
    link_body: Tuple[int, ...]
    link_R: torch.Tensor
    link_p: torch.Tensor
    collisions: Tuple[Collision, ...]
    urdf_sha256: str
    source: str

    # ------------------------------------------------------------------ helpers
    @property
    def nb(self) -> int:
        return len(self.body_names)

    @property
    def nj(self) -> int:
        """Number of actuated joints (``nv`` minus the 6 of a floating base)."""
        return len(self.joint_names)

    @property
    def dtype(self) -> torch.dtype:
        return self.mass.dtype

    @property
    def device(self) -> torch.device:
        return self.mass.device

    def replace(self, **changes) -> "Model":
        """A copy with some fields replaced (e.g. a ``mass`` tensor that requires grad)."""
        return dataclasses.replace(self, **changes)

    def to(self, dtype: Optional[torch.dtype] = None, device=None) -> "Model":
        """The same model with every tensor moved to ``dtype`` and/or ``device``."""
        changes = {}
        for f in dataclasses.fields(self):
            val = getattr(self, f.name)
            if isinstance(val, torch.Tensor):
                changes[f.name] = val.to(dtype=dtype if val.is_floating_point() else None, device=device)
        cols = tuple(
            dataclasses.replace(c, size=c.size.to(dtype=dtype, device=device), R=c.R.to(dtype=dtype, device=device),
                                p=c.p.to(dtype=dtype, device=device))
            for c in self.collisions
        )
        return dataclasses.replace(self, collisions=cols, **changes)

    def joint_index(self, name: str) -> int:
        """Index of an actuated joint in the joint part of q/v (add 7/6 for a floating base)."""
        try:
            return self.joint_names.index(name)
        except ValueError:
            raise KeyError(f"joint '{name}' is not an actuated joint of model '{self.name}' "
                           f"(joints: {', '.join(self.joint_names)})") from None

    def link_index(self, name: str) -> int:
        try:
            return self.link_names.index(name)
        except ValueError:
            raise KeyError(f"link '{name}' is not in model '{self.name}'") from None

    def neutral_configuration(self, batch_shape=()) -> torch.Tensor:
        """q with all joints at zero (clamped into their limits) and an identity base at the origin."""
        qj = torch.zeros(self.nj, dtype=self.dtype, device=self.device)
        qj = torch.minimum(torch.maximum(qj, self.lower), self.upper)
        if self.floating_base:
            base = torch.tensor([0, 0, 0, 0, 0, 0, 1.0], dtype=self.dtype, device=self.device)
            qj = torch.cat((base, qj))
        return qj.expand(tuple(batch_shape) + (self.nq,)).clone()


# ---------------------------------------------------------------------- building
def _origin_np(origin) -> Tuple[np.ndarray, np.ndarray]:
    return rpy_to_matrix_np(origin.rpy), np.asarray(origin.xyz, dtype=np.float64)


def build_model(desc: RobotDescription, floating_base: bool = False, dtype=torch.float64,
                device="cpu") -> Model:
    """Turn a validated :class:`RobotDescription` into a :class:`Model`."""
    children: Dict[str, List[Joint]] = desc.children or {}
    if not children:
        for j in desc.joints:
            children.setdefault(j.parent, []).append(j)

    body_names: List[str] = []
    parent: List[int] = []
    jtype: List[str] = []
    tree_R: List[np.ndarray] = []
    tree_p: List[np.ndarray] = []
    axis: List[np.ndarray] = []
    joints: List[Joint] = []
    link_names: List[str] = []
    link_body: List[int] = []
    link_R: List[np.ndarray] = []
    link_p: List[np.ndarray] = []

    eye, zero = np.eye(3), np.zeros(3)
    root_body = -1
    if floating_base:
        body_names.append(desc.root)
        parent.append(-1)
        jtype.append("free")
        tree_R.append(eye)
        tree_p.append(zero)
        axis.append(zero)
        root_body = 0

    # Depth-first traversal with an explicit stack (no recursion limit on long chains).
    stack = [(desc.root, root_body, eye, zero)]
    visited = set()
    while stack:
        link, body, R_lb, p_lb = stack.pop()
        if link in visited:  # the reader rejects cycles; this keeps the builder safe regardless
            raise UrdfError(f"{desc.source}: link '{link}' is reached twice (cycle or two parents)")
        visited.add(link)
        link_names.append(link)
        link_body.append(body)
        link_R.append(R_lb)
        link_p.append(p_lb)
        pushed = []
        for j in children.get(link, []):
            R_o, p_o = _origin_np(j.origin)
            R_c, p_c = R_lb @ R_o, p_lb + R_lb @ p_o   # joint frame in the body frame
            if j.type == "fixed":
                pushed.append((j.child, body, R_c, p_c))
            elif j.type in MOVING_JOINTS:
                b = len(body_names)
                body_names.append(j.child)
                parent.append(body)
                jtype.append(j.type)
                tree_R.append(R_c)
                tree_p.append(p_c)
                a = np.asarray(j.axis, dtype=np.float64)
                axis.append(a / np.linalg.norm(a))
                joints.append(j)
                pushed.append((j.child, b, eye, zero))
            else:
                raise UrdfError(f"{desc.source}: joint '{j.name}' has unsupported type '{j.type}'")
        stack.extend(reversed(pushed))  # keep file order among siblings

    nb = len(body_names)
    if nb == 0:
        raise UrdfError(f"{desc.source}: robot '{desc.name}' has no moving joint; load it with "
                        "floating_base=True to simulate it as a free body")
    # Merge link inertias into their bodies (parallel-axis theorem, in the body frame).
    mass = np.zeros(nb)
    first = np.zeros((nb, 3))
    second = np.zeros((nb, 3, 3))   # sum of R I R^T + m (|c|^2 1 - c c^T) about the body origin
    for name, b, R_lb, p_lb in zip(link_names, link_body, link_R, link_p):
        inertial = desc.links[name].inertial
        if b < 0 or inertial is None or inertial.mass == 0.0:
            continue
        R_i, p_i = _origin_np(inertial.origin)
        R = R_lb @ R_i
        c = p_lb + R_lb @ p_i
        m = float(inertial.mass)
        mass[b] += m
        first[b] += m * c
        second[b] += R @ np.asarray(inertial.inertia, dtype=np.float64) @ R.T + m * (c @ c * eye - np.outer(c, c))
    com = np.zeros((nb, 3))
    inertia = np.zeros((nb, 3, 3))
    for b in range(nb):
        if mass[b] <= 0.0:
            raise UrdfError(f"{desc.source}: link '{body_names[b]}' moves but has no mass "
                            "(neither it nor any link fixed to it has a positive <mass>)")
        c = first[b] / mass[b]
        com[b] = c
        inertia[b] = second[b] - mass[b] * (c @ c * eye - np.outer(c, c))
        inertia[b] = 0.5 * (inertia[b] + inertia[b].T)
        if jtype[b] == "free" and not np.all(np.linalg.eigvalsh(inertia[b]) > 0):
            raise UrdfError(f"{desc.source}: floating root link '{body_names[b]}' (with the links fixed to it) "
                            f"has a rotational inertia that is not positive definite")

    q_start, v_start = [], []
    nq = nv = 0
    for t in jtype:
        q_start.append(nq)
        v_start.append(nv)
        nq += 7 if t == "free" else 1
        nv += 6 if t == "free" else 1

    link_index = {n: i for i, n in enumerate(link_names)}
    collisions = []
    for name in link_names:
        i = link_index[name]
        for g in desc.links[name].collisions:
            R_g, p_g = _origin_np(g.origin)
            collisions.append(Collision(
                link=name, body=link_body[i], kind=g.kind,
                size=torch.tensor(g.size, dtype=dtype, device=device),
                R=torch.tensor(link_R[i] @ R_g, dtype=dtype, device=device),
                p=torch.tensor(link_p[i] + link_R[i] @ p_g, dtype=dtype, device=device),
                mesh=g.mesh))

    def t(x):
        return torch.tensor(np.asarray(x, dtype=np.float64), dtype=dtype, device=device)

    def jt(attr):
        return t([getattr(j, attr) for j in joints]).reshape(len(joints))

    lower, upper = jt("lower"), jt("upper")
    cont = torch.tensor([j.type == "continuous" for j in joints], dtype=torch.bool, device=device)
    lower = torch.where(cont, torch.full_like(lower, -np.inf), lower)
    upper = torch.where(cont, torch.full_like(upper, np.inf), upper)

    return Model(
        name=desc.name,
        floating_base=floating_base,
        joint_names=[j.name for j in joints],
        body_names=body_names,
        parent=tuple(parent),
        joint_type=tuple(jtype),
        q_start=tuple(q_start),
        v_start=tuple(v_start),
        nq=nq,
        nv=nv,
        tree_R=t(np.stack(tree_R)).reshape(nb, 3, 3),
        tree_p=t(np.stack(tree_p)).reshape(nb, 3),
        axis=t(np.stack(axis)).reshape(nb, 3),
        mass=t(mass),
        com=t(com),
        inertia=t(inertia),
        lower=lower,
        upper=upper,
        velocity_limit=jt("velocity"),
        effort_limit=jt("effort"),
        damping=jt("damping"),
        friction=jt("friction"),
        gravity=t([0.0, 0.0, -9.81]),
        link_names=link_names,
        link_body=tuple(link_body),
        link_R=t(np.stack(link_R)),
        link_p=t(np.stack(link_p)),
        collisions=tuple(collisions),
        urdf_sha256=hashlib.sha256(desc.xml.encode("utf-8")).hexdigest(),
        source=desc.source,
    )


def load_urdf(source, floating_base: bool = False, dtype: torch.dtype = torch.float64, device="cpu",
              package_dirs=None, collision: bool = True) -> Model:
    """Load a URDF (path, ``.xacro`` path, or XML string) into a :class:`Model`.

    floating_base: give the root link a free-flyer joint (q gains x y z qx qy qz qw,
        v gains the body-frame linear and angular velocity), as Pinocchio's
        ``JointModelFreeFlyer``.
    dtype, device: of every tensor in the model.
    package_dirs: extra folders in which ``package://`` URIs are resolved.
    collision: read collision geometry (a mesh becomes its bounding box; a mesh
        that cannot be found is an error). ``False`` skips meshes.

    Raises :class:`UrdfError` naming the file and the element at fault.
    """
    from .urdf import parse_urdf

    desc = parse_urdf(source, package_dirs=package_dirs, load_meshes=collision)
    return build_model(desc, floating_base=floating_base, dtype=dtype, device=device)
