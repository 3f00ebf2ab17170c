"""Read a URDF (or xacro) file into a validated :class:`RobotDescription`.

``parse_urdf`` is the only entry point. It checks everything the model builder
relies on and raises :class:`~diffsim_ros.physics.description.UrdfError`, never
any other exception type, with a message that names the file and the link or
joint at fault. The pipeline, one stage per function:

    source ──► _read_source (file / string / xacro) ──► _parse_xml (lxml, safe)
           ──► _precheck (root tag, repeated elements) ──► _run_urdf_parser_py
           ──► _build_links / _build_joints (numbers, limits, inertias)
           ──► _check_tree (names, parents, cycles, root)
           ──► _check_bodies (mass and inertia per rigid body)
           ──► _build_collisions (primitives; meshes become bounding boxes)

Self-contained: NumPy, lxml, urdf_parser_py and xacro only (no torch).
"""
from __future__ import annotations

import contextlib
import functools
import io
import math
import os
import re
import struct
import sys
import warnings
from pathlib import Path
from typing import Container, Dict, Iterable, List, Optional, Sequence, Set, Tuple, Union, cast

import numpy as np

from .rotation import rpy_to_matrix
from .description import (Geometry, Inertial, Joint, Link, Mimic, Origin,
                          RobotDescription, UrdfError)

__all__ = ["parse_urdf", "UrdfWarning", "SUPPORTED_JOINT_TYPES", "resolve_uri", "read_mesh_vertices",
           "rpy_to_matrix"]

SUPPORTED_JOINT_TYPES = ("revolute", "continuous", "prismatic", "fixed")
MOVING_JOINT_TYPES = ("revolute", "continuous", "prismatic")
XACRO_NS = "http://www.ros.org/wiki/xacro"

# Relative tolerance of the inertia checks (eigenvalues >= 0, triangle
# inequality). Looser than MuJoCo's absolute 1e-15, so whatever MuJoCo
# compiles, this accepts.
_INERTIA_RTOL = 1e-6
# A moving body whose moment about its own joint axis is below this fraction
# of its total (trace) inertia about the joint origin makes M(q) singular.
_AXIS_MOMENT_RTOL = 1e-12

PathLike = Union[str, "os.PathLike[str]"]


class UrdfWarning(UserWarning):
    """Something in a URDF that was approximated (e.g. a mesh collision as a box)."""


# --------------------------------------------------------------------------
# entry point
# --------------------------------------------------------------------------

def parse_urdf(source: Union[PathLike, bytes], package_dirs: Optional[Sequence[PathLike]] = None,
               load_meshes: bool = True, xacro_args: Optional[Dict[str, str]] = None
               ) -> RobotDescription:
    """Read and validate a robot description.

    Args:
        source: path (str or ``pathlib.Path``) to a ``.urdf`` or ``.xacro``
            file, or URDF XML text (a string whose first non-blank character
            is ``<``, or bytes).
        package_dirs: folders searched first for ``package://`` URIs; each is
            either a folder that contains the package folder or the package
            folder itself. Then ``ROS_PACKAGE_PATH``, ``AMENT_PREFIX_PATH``
            (``<prefix>/share``), ``sys.prefix/share`` and any
            ``site-packages/cmeel.prefix/share`` on ``sys.path`` are tried.
        load_meshes: if True, a mesh collision is read and replaced by the box
            that bounds its vertices (with a :class:`UrdfWarning`); a mesh that
            cannot be found or read is an error. If False, mesh collisions are
            skipped silently.
        xacro_args: ``name:=value`` mappings for a ``.xacro`` file.

    Raises:
        UrdfError: anything wrong, naming the file and the link or joint.
    """
    label = _label(source)
    try:
        return _parse(source, label, package_dirs, load_meshes, xacro_args)
    except UrdfError:
        raise
    except RecursionError as e:
        raise UrdfError(f"{label}: too deeply nested to read ({e})") from None
    except Exception as e:  # anything a library throws becomes a UrdfError
        raise UrdfError(f"{label}: cannot read URDF: {type(e).__name__}: {e}") from e


def _parse(source, label, package_dirs, load_meshes, xacro_args) -> RobotDescription:
    text, base_dir = _read_source(source, label, xacro_args)
    root = _parse_xml(text, label)
    _precheck(root, label, from_string=base_dir is None)
    robot = _run_urdf_parser_py(root, label)

    problems: Dict[str, str] = {}
    links = _build_links(robot, label, problems)
    joints = _build_joints(robot, label)
    link_names = [l.name for l in robot.links]
    root_name, children = _check_tree(link_names, joints, label)
    _check_bodies(links, joints, children, root_name, problems, label)

    mesh_links: List[str] = []
    collisions = _build_collisions(robot, label, base_dir, package_dirs, load_meshes, mesh_links)
    if mesh_links:
        warnings.warn(
            f"{label}: {len(mesh_links)} mesh collision geometr{'y' if len(mesh_links) == 1 else 'ies'} "
            f"replaced by the bounding box of the mesh (links: {', '.join(_short_list(mesh_links))})",
            UrdfWarning, stacklevel=3)
    links = {name: Link(name, link.inertial, tuple(collisions.get(name, ())))
             for name, link in links.items()}

    return RobotDescription(name=str(robot.name), links=links, joints=joints, root=root_name,
                            source=label, xml=text, children=children)


# --------------------------------------------------------------------------
# source text: file, string, xacro
# --------------------------------------------------------------------------

def _label(source) -> str:
    if isinstance(source, bytes):
        return "<string>"
    if isinstance(source, str) and source.lstrip("\ufeff \t\r\n").startswith("<"):
        return "<string>"
    try:
        return os.fspath(source)
    except TypeError:
        return f"<{type(source).__name__}>"


def _read_source(source, label, xacro_args) -> Tuple[str, Optional[Path]]:
    """Return (URDF text exactly as read or expanded, folder for relative file names or None for a string)."""
    if isinstance(source, bytes):
        try:
            source = source.decode("utf-8")
        except UnicodeDecodeError as e:
            raise UrdfError(f"{label}: URDF bytes are not UTF-8 ({e})") from None
    if isinstance(source, str) and source.lstrip("\ufeff \t\r\n").startswith("<"):
        return source, None
    if not isinstance(source, (str, os.PathLike)):
        raise UrdfError(f"{label}: expected a file path or URDF XML text, got {type(source).__name__}")
    if isinstance(source, str) and not source.strip():
        raise UrdfError("<string>: empty URDF (neither XML text nor a file path)")
    path = Path(os.fspath(source)).expanduser()
    try:
        if not path.is_file():
            what = "is a folder, not a file" if path.is_dir() else "does not exist"
            raise UrdfError(f"{label}: URDF file {what}")
        if path.name.endswith(".xacro"):
            return _run_xacro(path, label, xacro_args), path.resolve().parent
        data = path.read_bytes()
    except OSError as e:
        raise UrdfError(f"{label}: cannot read URDF file: {e}") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        text = data.decode("latin-1")
    return text, path.resolve().parent


def _run_xacro(path: Path, label: str, xacro_args) -> str:
    try:
        import xacro
    except ImportError as e:  # pragma: no cover - xacro is a dependency
        raise UrdfError(f"{label}: xacro file but the xacro package is not installed ({e})") from None
    mappings = {str(k): str(v) for k, v in (xacro_args or {}).items()}
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            doc = xacro.process_file(str(path.resolve()), mappings=mappings)
            text = doc.toxml()
    except (Exception, SystemExit) as e:
        detail = str(e) or type(e).__name__
        extra = err.getvalue().strip()
        if extra:
            detail += f" [{extra.splitlines()[-1]}]"
        raise UrdfError(f"{label}: xacro failed: {detail}") from None
    return text


# --------------------------------------------------------------------------
# XML: well-formedness, structure checks urdf_parser_py does not make
# --------------------------------------------------------------------------

def _parse_xml(text: str, label: str):
    from lxml import etree
    parser = etree.XMLParser(resolve_entities=False, no_network=True, load_dtd=False,
                             remove_comments=True, remove_pis=True, huge_tree=False)
    # lxml refuses a str that carries an encoding declaration: drop it.
    body = re.sub(r"^\s*<\?xml[^>]*\?>", "", text.lstrip("\ufeff \t\r\n"), count=1)
    try:
        root = etree.fromstring(body, parser=parser)
    except etree.XMLSyntaxError as e:
        raise UrdfError(f"{label}: malformed XML: {e}") from None
    except ValueError as e:
        raise UrdfError(f"{label}: malformed XML: {e}") from None
    if root is None:
        raise UrdfError(f"{label}: malformed XML: empty document")
    return root


# Elements that must appear at most once inside their parent.
_SINGLE_CHILDREN = {
    "joint": ("origin", "axis", "parent", "child", "limit", "dynamics", "mimic"),
    "inertial": ("origin", "mass", "inertia"),
    "collision": ("origin", "geometry"),
    "link": ("inertial",),
}


def _precheck(root, label: str, from_string: bool) -> None:
    tag = root.tag if isinstance(root.tag, str) else ""
    if tag != "robot":
        local = tag.rsplit("}", 1)[-1]
        if local == "robot":
            raise UrdfError(f"{label}: the <robot> element is in an XML namespace ({tag}); "
                            "URDF elements have none")
        raise UrdfError(f"{label}: not a URDF: the root element is <{local or '?'}>, expected <robot>")
    for el in root.iter():
        if isinstance(el.tag, str) and el.tag.startswith("{" + XACRO_NS + "}"):
            hint = ("pass the .xacro file path instead of its text" if from_string
                    else "name the file *.xacro so that it is expanded")
            raise UrdfError(f"{label}: contains xacro element <xacro:{el.tag.rsplit('}', 1)[-1]}> "
                            f"that was not expanded; {hint}")
    for el in root:
        if el.tag not in ("link", "joint"):
            continue
        where = _where_el(el)
        _check_numbers(el, label, where)
        for sub in [el] + [c for c in el if c.tag in ("inertial", "collision")]:
            for child_tag in _SINGLE_CHILDREN.get(sub.tag, ()):
                n = sum(1 for c in sub if c.tag == child_tag)
                if n > 1:
                    inside = "" if sub is el else f" <{sub.tag}>"
                    raise UrdfError(f"{label}: {where}:{inside} has {n} <{child_tag}> elements, expected one")


_INERTIA_KEYS = ("ixx", "ixy", "ixz", "iyy", "iyz", "izz")
# (path below the <link>/<joint>, attribute, how many numbers)
_NUMERIC_ATTRS = {
    "link": [("inertial/mass", "value", 1), ("inertial/origin", "xyz", 3), ("inertial/origin", "rpy", 3)]
    + [("inertial/inertia", k, 1) for k in _INERTIA_KEYS]
    + [("collision/origin", "xyz", 3), ("collision/origin", "rpy", 3), ("collision/geometry/box", "size", 3),
       ("collision/geometry/sphere", "radius", 1), ("collision/geometry/cylinder", "radius", 1),
       ("collision/geometry/cylinder", "length", 1), ("collision/geometry/mesh", "scale", 3)],
    "joint": [("origin", "xyz", 3), ("origin", "rpy", 3), ("axis", "xyz", 3)]
    + [("limit", k, 1) for k in ("lower", "upper", "effort", "velocity")]
    + [("dynamics", k, 1) for k in ("damping", "friction")]
    + [("mimic", k, 1) for k in ("multiplier", "offset")],
}


def _check_numbers(el, label: str, where: str) -> None:
    """Every number urdf_parser_py will read parses, with the right count (names the element)."""
    for path, attr, count in _NUMERIC_ATTRS[el.tag]:
        for sub in el.findall(path):
            text = sub.get(attr)
            if text is None:
                continue
            parts = text.split()
            what = f"<{path.rsplit('/', 1)[-1]} {attr}=\"{text[:40]}\">"
            if len(parts) != count:
                raise _fail(label, where, f"{what} has {len(parts)} numbers, expected {count}")
            for part in parts:
                try:
                    float(part)
                except ValueError:
                    raise _fail(label, where, f"{what} is not a number") from None


def _where_el(el) -> str:
    name = el.get("name")
    return f"{el.tag} '{name}'" if name is not None else f"{el.tag} (no name, line {el.sourceline})"


def _run_urdf_parser_py(root, label: str):
    from lxml import etree
    from urdf_parser_py.urdf import URDF
    import urdf_parser_py.xml_reflection.core as xmlr_core

    # Only links (without visuals) and joints matter here: visuals, materials,
    # transmissions and <gazebo> blocks are dropped, so that a defect in them
    # (e.g. a <texture> without a filename) does not stop a model from loading.
    for el in list(root):
        if el.tag not in ("link", "joint"):
            root.remove(el)
        elif el.tag == "link":
            for v in [c for c in el if c.tag == "visual"]:
                el.remove(v)
    if root.get("name") is None:      # required by the URDF spec, but harmless
        root.set("name", Path(label).stem if not label.startswith("<") else "robot")

    messages: List[str] = []
    saved = xmlr_core.on_error
    xmlr_core.on_error = messages.append   # "Unknown tag ..." noise: tolerated
    try:
        path = xmlr_core.Path(URDF.XML_REFL.tag, tree=etree.ElementTree(root))
        with contextlib.redirect_stderr(io.StringIO()):
            robot = URDF.from_xml(root, path)
    except Exception as e:
        msg = " ".join(str(e).split())
        where = _where_from_xpath(msg)
        raise UrdfError(f"{label}: {where}{msg}") from None
    finally:
        xmlr_core.on_error = saved
    return robot


def _where_from_xpath(msg: str) -> str:
    m = re.search(r"/(link|joint)\[@name='([^']*)'\]", msg)
    return f"{m.group(1)} '{m.group(2)}': " if m else ""


# --------------------------------------------------------------------------
# numbers
# --------------------------------------------------------------------------

def _fail(label: str, where: str, problem: str) -> UrdfError:
    return UrdfError(f"{label}: {where}: {problem}")


def _num(value, what: str, label: str, where: str, default: Optional[float] = None) -> float:
    if value is None:
        if default is None:
            raise _fail(label, where, f"{what} is missing")
        return float(default)
    try:
        x = float(value)
    except (TypeError, ValueError):
        raise _fail(label, where, f"{what} is not a number ({value!r})") from None
    if not math.isfinite(x):
        raise _fail(label, where, f"{what} is not finite ({x})")
    return x


_Vec3 = Tuple[float, float, float]


def _vec3(values, what: str, label: str, where: str, default=(0.0, 0.0, 0.0)) -> _Vec3:
    if values is None:
        return cast(_Vec3, tuple(float(v) for v in default))         # the defaults are 3-vectors
    try:
        vals = list(values)
    except TypeError:
        raise _fail(label, where, f"{what} is not a 3-vector ({values!r})") from None
    if len(vals) != 3:
        raise _fail(label, where, f"{what} has {len(vals)} numbers, expected 3")
    return cast(_Vec3, tuple(_num(v, what, label, where) for v in vals))   # three: checked above


def _origin(pose, what: str, label: str, where: str) -> Origin:
    if pose is None:
        return Origin()
    return Origin(_vec3(getattr(pose, "xyz", None), f"{what} xyz", label, where),
                  _vec3(getattr(pose, "rpy", None), f"{what} rpy", label, where))


def _short_list(names: Iterable[str], n: int = 6) -> List[str]:
    names = list(names)
    return names if len(names) <= n else names[:n] + [f"... ({len(names) - n} more)"]


def _element_name(element, tag: str, label: str, seen: Container[str]) -> Tuple[str, str]:
    """(name, where) of a <link> or <joint> (``tag``).

    name: its name, neither empty nor one of ``seen``; where: the text that names it in errors
    ("link 'base'").
    """
    name = element.name
    if not isinstance(name, str) or not name.strip():
        raise UrdfError(f"{label}: a <{tag}> has an empty name")
    where = f"{tag} '{name}'"
    if name in seen:
        raise _fail(label, where, f"duplicate {tag} name")
    return name, where


# --------------------------------------------------------------------------
# links and inertias
# --------------------------------------------------------------------------

def _build_links(robot, label: str, problems: Dict[str, str]) -> Dict[str, Link]:
    """Links with their inertials; inertia defects go to ``problems`` (judged per body later)."""
    if not robot.links:
        raise UrdfError(f"{label}: the robot '{robot.name}' has no <link>")
    links: Dict[str, Link] = {}
    for link in robot.links:
        name, where = _element_name(link, "link", label, links)
        links[name] = Link(name, _inertial(link.inertial, label, where))
        if links[name].inertial is not None:
            problem = _inertia_problem(cast(Inertial, links[name].inertial).inertia)   # not None: tested
            if problem:
                problems[name] = problem
    return links


def _inertial(inertial, label: str, where: str) -> Optional[Inertial]:
    if inertial is None:
        return None
    mass = _num(inertial.mass, "mass", label, where)
    if mass < 0:
        raise _fail(label, where, f"mass is negative ({mass})")
    origin = _origin(inertial.origin, "inertial origin", label, where)
    i = inertial.inertia
    if i is None:
        I = np.zeros((3, 3))
    else:
        ixx, ixy, ixz, iyy, iyz, izz = (_num(getattr(i, k), f"inertia {k}", label, where)
                                        for k in ("ixx", "ixy", "ixz", "iyy", "iyz", "izz"))
        I = np.array([[ixx, ixy, ixz], [ixy, iyy, iyz], [ixz, iyz, izz]])
    I.setflags(write=False)
    return Inertial(mass=mass, origin=origin, inertia=I)


def _inertia_problem(I: np.ndarray) -> Optional[str]:
    """Why a 3x3 rotational inertia is not physical, or None."""
    ev = np.linalg.eigvalsh(I)
    tol = _INERTIA_RTOL * float(np.max(np.abs(ev))) + 1e-15
    if ev[0] < -tol:
        return f"inertia is not positive semi-definite (principal moments {_fmt(ev)})"
    if ev[2] > ev[0] + ev[1] + tol:
        return (f"inertia breaks the triangle inequality: principal moments {_fmt(ev)}, "
                "the largest exceeds the sum of the other two")
    return None


def _fmt(v) -> str:
    return "(" + ", ".join(f"{x:.6g}" for x in np.asarray(v).ravel()) + ")"


# --------------------------------------------------------------------------
# joints
# --------------------------------------------------------------------------

def _build_joints(robot, label: str) -> List[Joint]:
    joints: List[Joint] = []
    seen: Set[str] = set()
    for j in robot.joints:
        name, where = _element_name(j, "joint", label, seen)
        seen.add(name)
        jtype = j.type
        if jtype not in SUPPORTED_JOINT_TYPES:
            raise _fail(label, where, f"joint type {jtype!r} is not supported; supported types are "
                                      f"{', '.join(SUPPORTED_JOINT_TYPES)}")
        for end in ("parent", "child"):
            v = getattr(j, end)
            if not isinstance(v, str) or not v:
                raise _fail(label, where, f"<{end}> has no link name")
        origin = _origin(j.origin, "origin", label, where)

        axis = _vec3(j.axis, "axis", label, where, default=(1.0, 0.0, 0.0))
        norm = math.sqrt(sum(a * a for a in axis))
        if jtype in MOVING_JOINT_TYPES and norm < 1e-9:
            raise _fail(label, where, f"axis is zero ({axis})")
        axis = cast(_Vec3, tuple(a / norm for a in axis)) if norm >= 1e-9 else (1.0, 0.0, 0.0)

        lower, upper, velocity, effort = -np.inf, np.inf, np.inf, np.inf
        lim = j.limit
        if jtype in ("revolute", "prismatic") and lim is None:
            raise _fail(label, where, f"a {jtype} joint needs a <limit> (lower, upper, effort, velocity)")
        if lim is not None and jtype in MOVING_JOINT_TYPES:
            velocity = _num(lim.velocity, "limit velocity", label, where)
            effort = _num(lim.effort, "limit effort", label, where)
            if velocity < 0:
                raise _fail(label, where, f"limit velocity is negative ({velocity})")
            if effort < 0:
                raise _fail(label, where, f"limit effort is negative ({effort})")
            if jtype != "continuous":
                lower = _num(lim.lower, "limit lower", label, where, default=0.0)
                upper = _num(lim.upper, "limit upper", label, where, default=0.0)
                if lower > upper:
                    raise _fail(label, where, f"limit lower ({lower}) is greater than upper ({upper})")

        damping = friction = 0.0
        if j.dynamics is not None:
            damping = _num(j.dynamics.damping, "dynamics damping", label, where, default=0.0)
            friction = _num(j.dynamics.friction, "dynamics friction", label, where, default=0.0)
            if damping < 0:
                raise _fail(label, where, f"dynamics damping is negative ({damping})")
            if friction < 0:
                raise _fail(label, where, f"dynamics friction is negative ({friction})")

        mimic = None
        if j.mimic is not None:
            if not isinstance(j.mimic.joint, str) or not j.mimic.joint:
                raise _fail(label, where, "<mimic> names no joint")
            mimic = Mimic(j.mimic.joint,
                          _num(j.mimic.multiplier, "mimic multiplier", label, where, default=1.0),
                          _num(j.mimic.offset, "mimic offset", label, where, default=0.0))

        joints.append(Joint(name=name, type=jtype, parent=j.parent, child=j.child, origin=origin,
                            axis=axis, lower=float(lower), upper=float(upper), velocity=float(velocity),
                            effort=float(effort), damping=damping, friction=friction, mimic=mimic))

    by_name = {j.name: j for j in joints}
    for j in joints:
        if j.mimic is None:
            continue
        where = f"joint '{j.name}'"
        target = by_name.get(j.mimic.joint)
        if target is None:
            raise _fail(label, where, f"<mimic> names joint '{j.mimic.joint}', which does not exist")
        if target.name == j.name:
            raise _fail(label, where, "<mimic> names the joint itself")
    return joints


# --------------------------------------------------------------------------
# kinematic tree
# --------------------------------------------------------------------------

def _check_tree(link_names: List[str], joints: List[Joint], label: str):
    known = set(link_names)
    parent_joint: Dict[str, Joint] = {}
    children: Dict[str, List[Joint]] = {name: [] for name in link_names}
    for j in joints:
        where = f"joint '{j.name}'"
        for end in ("parent", "child"):
            ln = getattr(j, end)
            if ln not in known:
                raise _fail(label, where, f"{end} link '{ln}' does not exist")
        if j.parent == j.child:
            raise _fail(label, where, f"parent and child are the same link '{j.child}' (a cycle)")
        if j.child in parent_joint:
            other = parent_joint[j.child]
            raise _fail(label, f"link '{j.child}'",
                        f"has two parents: joint '{other.name}' (from '{other.parent}') and "
                        f"joint '{j.name}' (from '{j.parent}')")
        parent_joint[j.child] = j
        children[j.parent].append(j)

    roots = [n for n in link_names if n not in parent_joint]
    if not roots:
        raise UrdfError(f"{label}: no root link: every link has a parent, so the joints form a cycle "
                        f"(e.g. through joint '{joints[0].name}')")
    if len(roots) > 1:
        raise UrdfError(f"{label}: more than one root link (links without a parent joint): "
                        f"{', '.join(repr(r) for r in _short_list(roots))}; "
                        "a URDF is a single tree (connect them with fixed joints)")
    root = roots[0]
    reached = {root}
    stack = [root]
    while stack:
        for j in children[stack.pop()]:
            if j.child not in reached:
                reached.add(j.child)
                stack.append(j.child)
    lost = [n for n in link_names if n not in reached]
    if lost:
        j = parent_joint[lost[0]]
        raise _fail(label, f"joint '{j.name}'",
                    f"is part of a cycle: links {', '.join(repr(n) for n in _short_list(lost))} "
                    f"cannot be reached from the root '{root}'")
    return root, children


def _body_inertia(links: Dict[str, Link], children: Dict[str, List[Joint]], main: str):
    """Mass, COM and inertias of ``main`` plus every link welded to it by fixed joints.

    Returns (mass, com, I_com, I_origin, members), in the frame of ``main``.
    """
    m_tot, first = 0.0, np.zeros(3)
    I_o = np.zeros((3, 3))
    members = []
    stack = [(main, np.eye(3), np.zeros(3))]          # link, its pose in the body frame
    while stack:
        name, R, p = stack.pop()
        members.append(name)
        inert = links[name].inertial
        if inert is not None:                         # massless: rotational inertia only
            c, I_link = inert.placed(R, p)
            I_o += I_link
            m_tot += inert.mass
            first += inert.mass * c
        for cj in children[name]:
            if cj.type == "fixed":
                stack.append((cj.child, R @ rpy_to_matrix(cj.origin.rpy), p + R @ np.asarray(cj.origin.xyz)))
    com = first / m_tot if m_tot > 0 else np.zeros(3)
    I_com = I_o - m_tot * (com @ com * np.eye(3) - np.outer(com, com))
    return m_tot, com, I_com, I_o, members


def _subtree_inertias(links: Dict[str, Link], children: Dict[str, List[Joint]], root: str) -> Dict[str, np.ndarray]:
    """For every link, the inertia of it and all its descendants (joints at q = 0).

    Each is taken about the link's origin, in the link's frame. One pass, leaves first.
    """
    order, stack = [], [root]
    while stack:
        name = stack.pop()
        order.append(name)
        stack.extend(j.child for j in children[name])
    out: Dict[str, Tuple[float, np.ndarray, np.ndarray]] = {}     # link -> (mass, first moment, I_o)
    for name in reversed(order):
        m, h, I_o = 0.0, np.zeros(3), np.zeros((3, 3))
        inert = links[name].inertial
        if inert is not None:
            c, I_link = inert.placed(np.eye(3), np.zeros(3))
            I_o += I_link
            m += inert.mass
            h += inert.mass * c
        for j in children[name]:
            mc, hc, Ic = out[j.child]
            R, p = rpy_to_matrix(j.origin.rpy), np.asarray(j.origin.xyz)
            cr = R @ hc / mc if mc > 0 else np.zeros(3)          # child COM from the child origin
            d = p + cr
            I_o += R @ Ic @ R.T + mc * ((d @ d - cr @ cr) * np.eye(3) - (np.outer(d, d) - np.outer(cr, cr)))
            m += mc
            h += R @ hc + mc * p
        out[name] = (m, h, I_o)
    return {name: v[2] for name, v in out.items()}


def _check_bodies(links: Dict[str, Link], joints: List[Joint], children: Dict[str, List[Joint]],
                  root: str, problems: Dict[str, str], label: str) -> None:
    """Judge masses and inertias per rigid body.

    A rigid body is the root link, or the child of a moving joint, plus every
    link welded to it by fixed joints. The child of a moving joint needs a
    positive mass and a physical inertia of its own; a link attached by a
    fixed joint may be a massless frame, and an unphysical inertia of such a
    link (common in CAD exports: sensor frames, dummy links) is only warned
    about when the body it is welded to is physical as a whole. For a revolute
    or continuous joint the body's moment of inertia about the joint axis must
    be > 0, or the joint-space mass matrix is singular; as a link on the axis
    (e.g. the middle link of a 2-DOF wrist) may get its inertia from what it
    carries, this is checked on the whole subtree (at q = 0), a necessary
    condition; the model's ABA is the judge of the rest.
    """
    parent_joint = {j.child: j for j in joints}
    subtree = _subtree_inertias(links, children, root)
    for j in joints:
        if j.type not in MOVING_JOINT_TYPES:
            continue
        link = links[j.child]
        where = f"link '{j.child}' (child of {j.type} joint '{j.name}')"
        if link.inertial is None:
            raise _fail(label, where, "has no <inertial>; a link moved by a joint needs a positive mass")
        if not link.inertial.mass > 0:
            raise _fail(label, where, f"mass must be positive, got {link.inertial.mass}")
        if j.child in problems:
            raise _fail(label, where, problems[j.child])
        if j.type == "prismatic":
            continue
        I_o = subtree[j.child]
        a = np.asarray(j.axis)
        moment = float(a @ I_o @ a)
        if moment <= 0 or not moment > _AXIS_MOMENT_RTOL * float(np.trace(I_o)):
            raise _fail(label, where, f"nothing that joint '{j.name}' moves has a moment of inertia "
                                      f"about its axis ({moment:.3g} kg m^2): all mass lies on the axis "
                                      "with zero inertia about it, so the mass matrix is singular")

    for name, problem in problems.items():
        pj = parent_joint.get(name)
        if pj is not None and pj.type in MOVING_JOINT_TYPES:
            continue                                   # raised above
        main = name
        while main in parent_joint and parent_joint[main].type == "fixed":
            main = parent_joint[main].parent
        mass, _, I_com, _, members = _body_inertia(links, children, main)
        body_problem = _inertia_problem(I_com) if mass > 0 else None
        if body_problem or mass <= 0:
            raise _fail(label, f"link '{name}'", f"{problem}; the rigid body it belongs to (link '{main}' "
                                                 f"and its fixed links) is not physical either: "
                                                 f"{body_problem or 'no mass'}")
        warnings.warn(f"{label}: link '{name}': {problem}; accepted because the rigid body it is welded "
                      f"to (link '{main}' and its fixed links) has a physical inertia", UrdfWarning,
                      stacklevel=4)


# --------------------------------------------------------------------------
# collision geometry
# --------------------------------------------------------------------------

def _build_collisions(robot, label, base_dir, package_dirs, load_meshes, mesh_links) -> Dict[str, List[Geometry]]:
    from urdf_parser_py.urdf import Box, Cylinder, Mesh, Sphere
    out: Dict[str, List[Geometry]] = {}
    for link in robot.links:
        where = f"link '{link.name}'"
        geoms: List[Geometry] = []
        for k, col in enumerate(link.collisions):
            cwhere = f"{where} collision {k}"
            origin = _origin(col.origin, "collision origin", label, cwhere)
            g = col.geometry
            if isinstance(g, Sphere):
                r = _positive(g.radius, "sphere radius", label, cwhere)
                geoms.append(Geometry(link.name, "sphere", (r,), origin))
            elif isinstance(g, Box):
                size: Tuple[float, ...] = _vec3(g.size, "box size", label, cwhere, default=None)
                for s in size:
                    if s <= 0:
                        raise _fail(label, cwhere, f"box size must be positive, got {size}")
                geoms.append(Geometry(link.name, "box", size, origin))
            elif isinstance(g, Cylinder):
                geoms.append(Geometry(link.name, "cylinder",
                                      (_positive(g.radius, "cylinder radius", label, cwhere),
                                       _positive(g.length, "cylinder length", label, cwhere)), origin))
            elif isinstance(g, Mesh):
                if not isinstance(g.filename, str) or not g.filename.strip():
                    raise _fail(label, cwhere, "mesh has no filename")
                scale = _vec3(g.scale, "mesh scale", label, cwhere, default=(1.0, 1.0, 1.0))
                if any(s == 0 for s in scale):
                    raise _fail(label, cwhere, f"mesh scale has a zero component {scale}")
                if not load_meshes:
                    continue
                path = resolve_uri(g.filename, base_dir, package_dirs)
                if path is None:
                    raise _fail(label, cwhere, f"mesh '{g.filename}' not found (searched package_dirs, "
                                               "ROS_PACKAGE_PATH, AMENT_PREFIX_PATH, sys.prefix/share, "
                                               "cmeel.prefix/share)")
                try:
                    lo, hi = _mesh_bounds(str(path))
                except (OSError, ValueError, struct.error) as e:
                    raise _fail(label, cwhere, f"cannot read mesh '{path}': {e}") from None
                sc = np.asarray(scale)
                corners = np.stack([lo * sc, hi * sc])
                lo, hi = corners.min(axis=0), corners.max(axis=0)
                size = tuple(float(max(v, 1e-6)) for v in (hi - lo))
                centre = (lo + hi) / 2.0
                xyz = np.asarray(origin.xyz) + rpy_to_matrix(origin.rpy) @ centre
                if not (np.all(np.isfinite(xyz)) and all(math.isfinite(v) for v in size)):
                    raise _fail(label, cwhere, f"mesh '{path}' has non-finite bounds")
                geoms.append(Geometry(link.name, "box", size,
                                      Origin(cast(_Vec3, tuple(float(v) for v in xyz)), origin.rpy),
                                      mesh=str(path)))
                mesh_links.append(link.name)
            else:
                raise _fail(label, cwhere, f"unsupported collision geometry {type(g).__name__}")
        out[link.name] = geoms
    return out


def _positive(value, what, label, where) -> float:
    x = _num(value, what, label, where)
    if x <= 0:
        raise _fail(label, where, f"{what} must be positive, got {x}")
    return x


# --------------------------------------------------------------------------
# package:// and file:// resolution
# --------------------------------------------------------------------------

def _package_search_roots(package_dirs) -> List[Tuple[Path, bool]]:
    """(folder, may_be_the_package_itself) in search order."""
    roots: List[Tuple[Path, bool]] = []
    for d in package_dirs or ():
        roots.append((Path(os.fspath(d)).expanduser(), True))
    for d in os.environ.get("ROS_PACKAGE_PATH", "").split(os.pathsep):
        if d:
            roots.append((Path(d), True))
    for d in os.environ.get("AMENT_PREFIX_PATH", "").split(os.pathsep):
        if d:
            roots.append((Path(d) / "share", False))
    roots.append((Path(sys.prefix) / "share", False))
    for p in sys.path:
        if p:
            c = Path(p) / "cmeel.prefix" / "share"
            if c.is_dir():
                roots.append((c, False))
    return roots


def _is_package_folder(folder: Path, package: str) -> bool:
    if folder.name == package:
        return True
    xml = folder / "package.xml"
    try:
        return xml.is_file() and re.search(r"<name>\s*" + re.escape(package) + r"\s*</name>",
                                           xml.read_text(errors="replace")) is not None
    except OSError:
        return False


def resolve_uri(uri: str, base_dir: Optional[Path] = None,
                package_dirs: Optional[Sequence[PathLike]] = None) -> Optional[Path]:
    """Resolve a URDF file name (package://, file://, absolute or relative) to an existing file."""
    uri = uri.strip()
    if uri.startswith("package://"):
        rest = uri[len("package://"):].lstrip("/")
        package, _, rel = rest.partition("/")
        if not package or not rel:
            return None
        for folder, may_be_pkg in _package_search_roots(package_dirs):
            cand = folder / package / rel
            if cand.is_file():
                return cand
            if may_be_pkg and _is_package_folder(folder, package):
                cand = folder / rel
                if cand.is_file():
                    return cand
        return None
    if uri.startswith("file://"):
        uri = uri[len("file://"):]
    elif re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]+://", uri):
        return None
    p = Path(uri).expanduser()
    if not p.is_absolute():
        p = (base_dir or Path.cwd()) / p
    return p if p.is_file() else None


# --------------------------------------------------------------------------
# mesh readers (vertices only, for bounding boxes)
# --------------------------------------------------------------------------

def _mesh_bounds(path: str) -> Tuple[np.ndarray, np.ndarray]:
    st = os.stat(path)
    return _mesh_bounds_cached(path, st.st_mtime_ns, st.st_size)


@functools.lru_cache(maxsize=256)
def _mesh_bounds_cached(path: str, mtime_ns: int, size: int) -> Tuple[np.ndarray, np.ndarray]:
    v = read_mesh_vertices(path)
    if v.size == 0:
        raise ValueError("the mesh has no vertices")
    v = v.reshape(-1, 3)
    if not np.all(np.isfinite(v)):
        raise ValueError("the mesh has non-finite vertices")
    lo, hi = v.min(axis=0), v.max(axis=0)
    lo.setflags(write=False)
    hi.setflags(write=False)
    return lo, hi


def read_mesh_vertices(path: str) -> np.ndarray:
    """Vertices (N, 3) of an STL (binary or ASCII), OBJ or COLLADA (.dae) file, in metres."""
    ext = os.path.splitext(path)[1].lower()
    if ext == ".stl":
        return _read_stl(path)
    if ext == ".obj":
        return _read_obj(path)
    if ext == ".dae":
        return _read_dae(path)
    raise ValueError(f"unsupported mesh format '{ext}' (supported: .stl, .obj, .dae)")


def _read_stl(path: str) -> np.ndarray:
    with open(path, "rb") as f:
        data = f.read()
    if len(data) >= 84:
        n = struct.unpack_from("<I", data, 80)[0]
        if len(data) == 84 + 50 * n:
            rec = np.frombuffer(data, dtype=np.dtype([("n", "<f4", 3), ("v", "<f4", (3, 3)), ("a", "<u2")]),
                                count=n, offset=84)
            return rec["v"].reshape(-1, 3).astype(np.float64)
    text = data.decode("latin-1")
    if not text.lstrip().lower().startswith("solid"):
        raise ValueError("neither a binary STL (size does not match its triangle count) nor an ASCII STL")
    nums = re.findall(r"vertex\s+(\S+)\s+(\S+)\s+(\S+)", text)
    return np.array(nums, dtype=np.float64).reshape(-1, 3)


def _read_obj(path: str) -> np.ndarray:
    rows = []
    with open(path, "r", errors="replace") as f:
        for line in f:
            if line.startswith("v ") or line.startswith("v\t"):
                parts = line.split()
                if len(parts) < 4:
                    raise ValueError(f"bad vertex line {line.strip()!r}")
                rows.append(parts[1:4])
    return np.array(rows, dtype=np.float64).reshape(-1, 3)


def _read_dae(path: str) -> np.ndarray:
    from lxml import etree
    parser = etree.XMLParser(resolve_entities=False, no_network=True, huge_tree=True)
    try:
        root = etree.parse(path, parser).getroot()
    except etree.XMLSyntaxError as e:
        raise ValueError(f"malformed COLLADA XML: {e}") from None

    def local(el) -> str:
        return el.tag.rsplit("}", 1)[-1] if isinstance(el.tag, str) else ""

    unit = 1.0
    for el in root.iter():
        if local(el) == "unit" and el.get("meter") is not None:
            unit = float(el.get("meter"))
            break
    sources = {el.get("id"): el for el in root.iter() if local(el) == "source" and el.get("id")}
    chunks = []
    for vert in (el for el in root.iter() if local(el) == "vertices"):
        for inp in vert:
            if local(inp) == "input" and inp.get("semantic") == "POSITION":
                src = sources.get((inp.get("source") or "").lstrip("#"))
                if src is None:
                    raise ValueError(f"POSITION source {inp.get('source')!r} not found")
                arr = next((c for c in src.iter() if local(c) == "float_array"), None)
                if arr is None or not (arr.text or "").strip():
                    continue
                vals = np.array(arr.text.split(), dtype=np.float64)
                if vals.size % 3:
                    raise ValueError("POSITION float_array length is not a multiple of 3")
                chunks.append(vals.reshape(-1, 3))
    if not chunks:
        raise ValueError("no vertex positions found")
    return np.concatenate(chunks) * unit
