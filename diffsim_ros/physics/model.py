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

A URDF ``<mimic>`` joint is not a degree of freedom: its position is
``multiplier * q_leader + offset`` and its velocity and acceleration are
``multiplier`` times the leader's. The tree keeps a body for it (``parent``,
``joint_type``, ``q_start``/``v_start`` and the inertias describe the *full* tree,
with ``nq_full``/``nv_full`` coordinates), while ``q``, ``v``, ``nq``, ``nv`` and
``joint_names`` are the reduced, independent coordinates. The map between them is
constant: ``v_full = G v`` and ``q_full = G q + c`` (``mimic_G``, ``mimic_offset``;
for a floating base the base block of G is the identity on q's seven and v's six
entries). The algorithms compute on the full tree and project, ``tau = G^T tau_full``,
``M = G^T M_full G``. A model without mimic joints has no map and takes the plain
code path.
"""
from __future__ import annotations

import dataclasses
import hashlib
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple, TypedDict, cast

import numpy as np
import torch

from .description import Joint, RobotDescription, UrdfError
from .rotation import rpy_to_matrix

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

    Mimic joints (see the module doc): ``mimic_joints`` their names, ``mimic_leader``
    the independent joint each follows (a mimic of a mimic is resolved to the
    independent joint at the end of the chain, multipliers and offsets composed),
    ``full_joint_names`` the moving joints of the full tree in body order (the same
    list as ``joint_names`` without mimic joints), ``mimic_G`` (nv_full, nv) and
    ``mimic_offset`` (nq_full,) the coordinate map (None without mimic joints). A
    mimic joint's URDF damping and Coulomb friction act through the coupling: they
    are folded into its leader's ``damping`` (+ multiplier^2 d) and ``friction``
    (+ |multiplier| f), which is exact for viscous damping and for unsmoothed Coulomb
    friction; its limits, velocity and effort limits are not used (the leader's are).
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
    full_joint_names: Tuple[str, ...] = ()
    mimic_joints: Tuple[str, ...] = ()
    mimic_leader: Tuple[str, ...] = ()
    mimic_G: Optional[torch.Tensor] = None        # (nv_full, nv): v_full = G v
    mimic_offset: Optional[torch.Tensor] = None   # (nq_full,): q_full = G q + offset
    link_com: Optional[torch.Tensor] = None       # (n_links, 3): each link's own centre of mass in its body's
                                                  # frame (its origin when massless), before the merge

    # ------------------------------------------------------------------ helpers
    @property
    def nb(self) -> int:
        return len(self.body_names)

    @property
    def nj(self) -> int:
        """Number of actuated joints (``nv`` minus the 6 of a floating base)."""
        return len(self.joint_names)

    @property
    def has_mimic(self) -> bool:
        """True when some joint is a ``<mimic>`` of another (coordinates reduced)."""
        return bool(self.mimic_joints)

    @property
    def nq_full(self) -> int:
        """Coordinates of the full tree, mimic joints included (``nq`` without them)."""
        return self.nq + len(self.mimic_joints)

    @property
    def nv_full(self) -> int:
        """Velocities of the full tree, mimic joints included (``nv`` without them)."""
        return self.nv + len(self.mimic_joints)

    def full_configuration(self, q: torch.Tensor) -> torch.Tensor:
        """Reduced q (..., nq) -> full-tree coordinates (..., nq_full).

        Mimic joints are at ``multiplier * q_leader + offset`` (q itself without mimic joints).
        """
        if not self.mimic_joints:
            return q
        G, c = cast(torch.Tensor, self.mimic_G), cast(torch.Tensor, self.mimic_offset)   # set with mimic joints
        if self.floating_base:
            return torch.cat((q[..., 0:7], q[..., 7:] @ G[6:, 6:].T), -1) + c
        return q @ G.T + c

    def full_velocity(self, v: torch.Tensor) -> torch.Tensor:
        """Reduced v (or an acceleration) (..., nv) -> full tree (..., nv_full): ``G v``."""
        if not self.mimic_joints:
            return v
        return v @ cast(torch.Tensor, self.mimic_G).T              # set with mimic joints

    @property
    def dtype(self) -> torch.dtype:
        return self.mass.dtype

    @property
    def device(self) -> torch.device:
        return self.mass.device

    def replace(self, **changes) -> "Model":
        """Return a copy with some fields replaced (e.g. a ``mass`` tensor that requires grad)."""
        return dataclasses.replace(self, **changes)

    def to(self, dtype: Optional[torch.dtype] = None, device=None) -> "Model":
        """Return the same model with every tensor moved to ``dtype`` and/or ``device``."""
        changes: Dict[str, Any] = {}                                # field name -> the moved tensor
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
            if name in self.mimic_joints:
                lead = self.mimic_leader[self.mimic_joints.index(name)]
                raise KeyError(f"joint '{name}' of model '{self.name}' is a <mimic> of '{lead}': it follows "
                               f"its leader and is not a coordinate of q/v") from None
            raise KeyError(f"joint '{name}' is not an actuated joint of model '{self.name}' "
                           f"(joints: {', '.join(self.joint_names)})") from None

    def link_index(self, name: str) -> int:
        try:
            return self.link_names.index(name)
        except ValueError:
            raise KeyError(f"link '{name}' is not in model '{self.name}'") from None

    def neutral_configuration(self, batch_shape=()) -> torch.Tensor:
        """Return q with all joints at zero (clamped into their limits) and an identity base at the origin."""
        qj = torch.zeros(self.nj, dtype=self.dtype, device=self.device)
        qj = torch.minimum(torch.maximum(qj, self.lower), self.upper)
        if self.floating_base:
            base = torch.tensor([0, 0, 0, 0, 0, 0, 1.0], dtype=self.dtype, device=self.device)
            qj = torch.cat((base, qj))
        return qj.expand(tuple(batch_shape) + (self.nq,)).clone()


# ---------------------------------------------------------------------- building
class _MimicFields(TypedDict, total=False):
    """The mimic fields of a :class:`Model` as :func:`build_model` passes them.

    There are none without mimic joints.
    """

    mimic_G: torch.Tensor
    mimic_offset: torch.Tensor
    mimic_joints: Tuple[str, ...]
    mimic_leader: Tuple[str, ...]


class _MimicMap(TypedDict):
    """The constant coordinate map of :func:`_mimic_map`: v_full = G v, q_full = G q + offset."""

    G: np.ndarray           # (nv_full, nv)
    offset: np.ndarray      # (nq_full,)


def _origin_np(origin) -> Tuple[np.ndarray, np.ndarray]:
    return rpy_to_matrix(origin.rpy), np.asarray(origin.xyz, dtype=np.float64)


@dataclass
class _Tree:
    """The bodies and links of a description as :func:`_traverse` finds them, depth-first.

    Per body its name, parent, joint type, joint frame in the parent body (``tree_R``, ``tree_p``)
    and unit axis; the moving joints in body order; per link its body and its constant frame in
    that body (``link_R``, ``link_p``).
    """

    body_names: List[str] = dataclasses.field(default_factory=list)
    parent: List[int] = dataclasses.field(default_factory=list)
    jtype: List[str] = dataclasses.field(default_factory=list)
    tree_R: List[np.ndarray] = dataclasses.field(default_factory=list)
    tree_p: List[np.ndarray] = dataclasses.field(default_factory=list)
    axis: List[np.ndarray] = dataclasses.field(default_factory=list)
    joints: List[Joint] = dataclasses.field(default_factory=list)
    link_names: List[str] = dataclasses.field(default_factory=list)
    link_body: List[int] = dataclasses.field(default_factory=list)
    link_R: List[np.ndarray] = dataclasses.field(default_factory=list)
    link_p: List[np.ndarray] = dataclasses.field(default_factory=list)

    def add_body(self, name: str, parent: int, jtype: str, R: np.ndarray, p: np.ndarray, axis: np.ndarray) -> int:
        """Append a body moved by a joint of type ``jtype`` (frame ``R``, ``p`` in the parent body).

        Returns its index.
        """
        self.body_names.append(name)
        self.parent.append(parent)
        self.jtype.append(jtype)
        self.tree_R.append(R)
        self.tree_p.append(p)
        self.axis.append(axis)
        return len(self.body_names) - 1


def _children(desc: RobotDescription) -> Dict[str, List[Joint]]:
    """Parent link name -> the joints hanging from it, in file order.

    The description's own map is used when it has one.
    """
    children: Dict[str, List[Joint]] = desc.children or {}
    if not children:
        for j in desc.joints:
            children.setdefault(j.parent, []).append(j)
    return children


def _traverse(desc: RobotDescription, floating_base: bool) -> _Tree:
    """Return the tree of ``desc``.

    It has a free-flyer body for the root link of a floating base, then a body per moving joint,
    depth-first in file order among siblings; links on fixed joints are kept as frames of the body
    they hang from. Raises UrdfError for a link reached twice or an unsupported joint.
    """
    children = _children(desc)
    tree = _Tree()
    eye, zero = np.eye(3), np.zeros(3)
    root_body = tree.add_body(desc.root, -1, "free", eye, zero, zero) if floating_base else -1

    # Depth-first traversal with an explicit stack (no recursion limit on long chains).
    stack = [(desc.root, root_body, eye, zero)]
    visited = set()
    while stack:
        link, body, R_lb, p_lb = stack.pop()
        if link in visited:  # the reader rejects cycles; this keeps the builder safe regardless
            raise UrdfError(f"{desc.source}: link '{link}' is reached twice (cycle or two parents)")
        visited.add(link)
        tree.link_names.append(link)
        tree.link_body.append(body)
        tree.link_R.append(R_lb)
        tree.link_p.append(p_lb)
        pushed = []
        for j in children.get(link, []):
            R_o, p_o = _origin_np(j.origin)
            R_c, p_c = R_lb @ R_o, p_lb + R_lb @ p_o   # joint frame in the body frame
            if j.type == "fixed":
                pushed.append((j.child, body, R_c, p_c))
            elif j.type in MOVING_JOINTS:
                a = np.asarray(j.axis, dtype=np.float64)
                b = tree.add_body(j.child, body, j.type, R_c, p_c, a / np.linalg.norm(a))
                tree.joints.append(j)
                pushed.append((j.child, b, eye, zero))
            else:
                raise UrdfError(f"{desc.source}: joint '{j.name}' has unsupported type '{j.type}'")
        stack.extend(reversed(pushed))  # keep file order among siblings
    return tree


def _body_inertias(desc: RobotDescription, tree: _Tree) -> Tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Each body's mass (nb,), centre of mass (nb, 3) and rotational inertia about it (nb, 3, 3).

    Also each link's own centre of mass in its body's frame (n_links, 3; the link's origin when
    it has no mass).

    The inertias of the links fixed to it are merged in (parallel-axis theorem, in the body frame).
    Raises UrdfError for a body without mass and for a floating root whose inertia is not positive
    definite.
    """
    nb = len(tree.body_names)
    eye = np.eye(3)
    mass = np.zeros(nb)
    first = np.zeros((nb, 3))
    second = np.zeros((nb, 3, 3))   # sum of R I R^T + m (|c|^2 1 - c c^T) about the body origin
    link_com = np.array(tree.link_p, dtype=float).reshape(-1, 3)
    for i, (name, b, R_lb, p_lb) in enumerate(zip(tree.link_names, tree.link_body, tree.link_R, tree.link_p)):
        inertial = desc.links[name].inertial
        if b < 0 or inertial is None or inertial.mass == 0.0:
            continue
        c, I_origin = inertial.placed(R_lb, p_lb)
        link_com[i] = c
        mass[b] += float(inertial.mass)
        first[b] += float(inertial.mass) * c
        second[b] += I_origin
    com = np.zeros((nb, 3))
    inertia = np.zeros((nb, 3, 3))
    for b in range(nb):
        if mass[b] <= 0.0:
            raise UrdfError(f"{desc.source}: link '{tree.body_names[b]}' moves but has no mass "
                            "(neither it nor any link fixed to it has a positive <mass>)")
        c = first[b] / mass[b]
        com[b] = c
        inertia[b] = second[b] - mass[b] * (c @ c * eye - np.outer(c, c))
        inertia[b] = 0.5 * (inertia[b] + inertia[b].T)
        if tree.jtype[b] == "free" and not np.all(np.linalg.eigvalsh(inertia[b]) > 0):
            raise UrdfError(f"{desc.source}: floating root link '{tree.body_names[b]}' (with the links fixed to it) "
                            f"has a rotational inertia that is not positive definite")
    return mass, com, inertia, link_com


def _coordinate_starts(jtype: List[str]) -> Tuple[List[int], List[int], int, int]:
    """Each body's first index in q and in v, and the full tree's nq and nv.

    A free-flyer takes 7 and 6, a moving joint 1 and 1.
    """
    q_start, v_start = [], []
    nq = nv = 0
    for typ in jtype:
        q_start.append(nq)
        v_start.append(nv)
        nq += 7 if typ == "free" else 1
        nv += 6 if typ == "free" else 1
    return q_start, v_start, nq, nv


def _collisions(desc: RobotDescription, tree: _Tree, dtype, device) -> Tuple[Collision, ...]:
    """Every link's collision primitives, placed in the frame of the body the link belongs to."""
    link_index = {n: i for i, n in enumerate(tree.link_names)}
    collisions = []
    for name in tree.link_names:
        i = link_index[name]
        for g in desc.links[name].collisions:
            R_g, p_g = _origin_np(g.origin)
            collisions.append(Collision(
                link=name, body=tree.link_body[i], kind=g.kind,
                size=torch.tensor(g.size, dtype=dtype, device=device),
                R=torch.tensor(tree.link_R[i] @ R_g, dtype=dtype, device=device),
                p=torch.tensor(tree.link_p[i] + tree.link_R[i] @ p_g, dtype=dtype, device=device),
                mesh=g.mesh))
    return tuple(collisions)


def _tensor(x, dtype, device) -> torch.Tensor:
    """``x`` (array-like) as a tensor of the model's ``dtype`` on its ``device``, through float64."""
    return torch.tensor(np.asarray(x, dtype=np.float64), dtype=dtype, device=device)


def _joint_tensor(indep: List[Joint], attr: str, dtype, device) -> torch.Tensor:
    """Return the attribute ``attr`` of each independent joint, as a (len(indep),) tensor."""
    return _tensor([getattr(j, attr) for j in indep], dtype, device).reshape(len(indep))


def _mimic_fields(joints: List[Joint], indep: List[Joint], mimic_of: Dict[str, Tuple[str, float, float]],
                  floating_base: bool, nq: int, nv: int, dtype, device
                  ) -> Tuple[_MimicFields, torch.Tensor, torch.Tensor]:
    """For a tree with mimic joints: the Model's mimic fields, and what each mimic joint adds to its leader.

    That is the damping and Coulomb friction each mimic joint adds to its leader through the
    coupling ((len(indep),) each).
    """
    coupling = _mimic_map(joints, indep, mimic_of, floating_base, nq, nv)
    # A mimic joint's viscous damping d and Coulomb friction f act on the leader through
    # the coupling: G^T (-d G v) adds multiplier^2 d, G^T (-f sign(G v)) adds |multiplier| f.
    col = {j.name: k for k, j in enumerate(indep)}
    extra_d, extra_f = np.zeros(len(indep)), np.zeros(len(indep))
    for j in joints:
        if j.name in mimic_of:
            lead, mult, _ = mimic_of[j.name]
            extra_d[col[lead]] += mult * mult * j.damping
            extra_f[col[lead]] += abs(mult) * j.friction
    mimic = _MimicFields(mimic_G=_tensor(coupling["G"], dtype, device),
                         mimic_offset=_tensor(coupling["offset"], dtype, device),
                         mimic_joints=tuple(j.name for j in joints if j.name in mimic_of),
                         mimic_leader=tuple(mimic_of[j.name][0] for j in joints if j.name in mimic_of))
    return mimic, _tensor(extra_d, dtype, device), _tensor(extra_f, dtype, device)


def build_model(desc: RobotDescription, floating_base: bool = False, dtype=torch.float64,
                device="cpu") -> Model:
    """Turn a validated :class:`RobotDescription` into a :class:`Model`."""
    tree = _traverse(desc, floating_base)
    nb = len(tree.body_names)
    if nb == 0:
        raise UrdfError(f"{desc.source}: robot '{desc.name}' has no moving joint; load it with "
                        "floating_base=True to simulate it as a free body")
    mass, com, inertia, link_com = _body_inertias(desc, tree)
    q_start, v_start, nq, nv = _coordinate_starts(tree.jtype)
    collisions = _collisions(desc, tree, dtype, device)

    def t(x):
        return _tensor(x, dtype, device)

    joints = tree.joints
    mimic_of = _resolve_mimic(desc, joints)
    indep = [j for j in joints if j.name not in mimic_of]   # the degrees of freedom, body order

    def jt(attr):
        return _joint_tensor(indep, attr, dtype, device)

    lower, upper = jt("lower"), jt("upper")
    cont = torch.tensor([j.type == "continuous" for j in indep], dtype=torch.bool, device=device)
    lower = torch.where(cont, torch.full_like(lower, -np.inf), lower)
    upper = torch.where(cont, torch.full_like(upper, np.inf), upper)
    damping, friction = jt("damping"), jt("friction")
    mimic: _MimicFields = {}
    if mimic_of:
        mimic, extra_d, extra_f = _mimic_fields(joints, indep, mimic_of, floating_base, nq, nv, dtype, device)
        damping, friction = damping + extra_d, friction + extra_f
        nq, nv = nq - len(mimic_of), nv - len(mimic_of)

    return Model(
        name=desc.name,
        floating_base=floating_base,
        joint_names=[j.name for j in indep],
        body_names=tree.body_names,
        parent=tuple(tree.parent),
        joint_type=tuple(tree.jtype),
        q_start=tuple(q_start),
        v_start=tuple(v_start),
        nq=nq,
        nv=nv,
        tree_R=t(np.stack(tree.tree_R)).reshape(nb, 3, 3),
        tree_p=t(np.stack(tree.tree_p)).reshape(nb, 3),
        axis=t(np.stack(tree.axis)).reshape(nb, 3),
        mass=t(mass),
        com=t(com),
        inertia=t(inertia),
        lower=lower,
        upper=upper,
        velocity_limit=jt("velocity"),
        effort_limit=jt("effort"),
        damping=damping,
        friction=friction,
        gravity=t([0.0, 0.0, -9.81]),
        link_names=tree.link_names,
        link_body=tuple(tree.link_body),
        link_R=t(np.stack(tree.link_R)),
        link_p=t(np.stack(tree.link_p)),
        collisions=collisions,
        urdf_sha256=hashlib.sha256(desc.xml.encode("utf-8")).hexdigest(),
        source=desc.source,
        full_joint_names=tuple(j.name for j in joints),
        link_com=t(link_com),
        **mimic,
    )


def _resolve_mimic(desc: RobotDescription, joints: List[Joint]) -> Dict[str, Tuple[str, float, float]]:
    """Mimic joint name -> (independent leader, multiplier, offset), a chain of mimics composed.

    Then q = multiplier * q_leader + offset. Raises UrdfError for a leader that is not a moving
    joint and for a cycle of mimics.
    """
    moving = {j.name: j for j in joints}
    out: Dict[str, Tuple[str, float, float]] = {}
    for j in joints:
        if j.mimic is None:
            continue
        mult, off, seen, cur = 1.0, 0.0, [j.name], j
        while cur.mimic is not None:
            lead = moving.get(cur.mimic.joint)
            if lead is None:
                raise UrdfError(f"{desc.source}: joint '{cur.name}': <mimic> names joint '{cur.mimic.joint}', "
                                "which is not a moving (revolute, continuous or prismatic) joint of the tree")
            # q_cur = m q_lead + o, so q_j = mult q_cur + off = (mult m) q_lead + (mult o + off).
            off = mult * cur.mimic.offset + off
            mult = mult * cur.mimic.multiplier
            if lead.name in seen:
                raise UrdfError(f"{desc.source}: joint '{j.name}': the <mimic> chain "
                                f"{' -> '.join(seen + [lead.name])} is a cycle")
            seen.append(lead.name)
            cur = lead
        out[j.name] = (cur.name, mult, off)
    return out


def _mimic_map(joints: List[Joint], indep: List[Joint], mimic_of: Dict[str, Tuple[str, float, float]],
               floating_base: bool, nq_full: int, nv_full: int) -> _MimicMap:
    """Return the constant map from reduced to full coordinates.

    It is G (nv_full, nv) with v_full = G v, and the offsets (nq_full,) with q_full = G q + offset
    (base block: identity).
    """
    nb_v, nb_q = (6, 7) if floating_base else (0, 0)
    col = {j.name: k for k, j in enumerate(indep)}
    G = np.zeros((nv_full, nb_v + len(indep)))
    G[:nb_v, :nb_v] = np.eye(nb_v)
    offset = np.zeros(nq_full)
    for k, j in enumerate(joints):
        if j.name in mimic_of:
            lead, mult, off = mimic_of[j.name]
            G[nb_v + k, nb_v + col[lead]] = mult
            offset[nb_q + k] = off
        else:
            G[nb_v + k, nb_v + col[j.name]] = 1.0
    return {"G": G, "offset": offset}


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
