"""URDF reader: real robots, the project's own URDFs, xacro, package://, meshes, errors.

Every error case asserts that ``parse_urdf`` raises ``UrdfError`` (and no other
type) with a message that names the source and the link or joint at fault.
"""
from __future__ import annotations

import math
import re
import struct
import warnings
from pathlib import Path

import numpy as np
import pytest

from conftest import PROJECT_URDFS
from diffsim_ros.physics.description import UrdfError
from diffsim_ros.physics.urdf import UrdfWarning, parse_urdf, read_mesh_vertices, rpy_to_matrix


def parse_quietly(source, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UrdfWarning)
        return parse_urdf(source, **kw)


def moving(desc):
    return [j for j in desc.joints if j.type != "fixed"]


def total_mass(desc):
    return sum(l.inertial.mass for l in desc.links.values() if l.inertial is not None)


# ---------------------------------------------------------------------------
# example-robot-data
# ---------------------------------------------------------------------------

REAL = {
    # relpath: (links, joints, moving joints, root)
    "panda_description/urdf/panda.urdf": (13, 12, 9, "panda_link0"),
    "ur_description/urdf/ur5_robot.urdf": (11, 10, 6, "world"),
    "solo_description/robots/solo12.urdf": (17, 16, 12, "base_link"),
    "double_pendulum_description/urdf/double_pendulum.urdf": (3, 2, 2, "base_link"),
    "hector_description/robots/quadrotor_base.urdf": (1, 0, 0, "base_link"),
}


@pytest.mark.parametrize("relpath", sorted(REAL))
def test_example_robot_data_loads(robots_dir, relpath):
    n_links, n_joints, n_moving, root = REAL[relpath]
    desc = parse_quietly(robots_dir / relpath)
    assert len(desc.links) == n_links
    assert len(desc.joints) == n_joints
    assert len(moving(desc)) == n_moving
    assert desc.root == root
    assert desc.source == str(robots_dir / relpath)
    # children map: every joint once, under its parent, in file order
    listed = [j.name for js in desc.children.values() for j in js]
    assert sorted(listed) == sorted(j.name for j in desc.joints)
    for link, js in desc.children.items():
        assert all(j.parent == link for j in js)
        order = [desc.joints.index(j) for j in js]
        assert order == sorted(order)
    for j in desc.joints:
        assert math.isclose(np.linalg.norm(j.axis), 1.0)


def test_example_robot_data_matches_pinocchio(robots_dir):
    pin = pytest.importorskip("pinocchio")
    for relpath in sorted(REAL):
        desc = parse_quietly(robots_dir / relpath)
        model = pin.buildModelFromUrdf(str(robots_dir / relpath))
        assert sorted(j.name for j in moving(desc)) == sorted(list(model.names)[1:]), relpath
        assert total_mass(desc) == pytest.approx(sum(i.mass for i in model.inertias), rel=1e-9), relpath
        for j in moving(desc):
            jid = model.getJointId(j.name)
            if j.type != "continuous":
                assert j.lower == pytest.approx(model.lowerPositionLimit[model.idx_qs[jid]])
                assert j.upper == pytest.approx(model.upperPositionLimit[model.idx_qs[jid]])
            assert j.effort == pytest.approx(model.effortLimit[model.idx_vs[jid]])


def test_panda_details(robots_dir):
    desc = parse_quietly(robots_dir / "panda_description/urdf/panda.urdf")
    j4 = next(j for j in desc.joints if j.name == "panda_joint4")
    assert (j4.type, j4.lower, j4.upper, j4.velocity, j4.effort) == ("revolute", -3.0718, -0.0698, 2.175, 87.0)
    assert j4.damping == 0.003 and j4.friction == 0.0
    f2 = next(j for j in desc.joints if j.name == "panda_finger_joint2")
    assert f2.type == "prismatic" and f2.axis == (0.0, -1.0, 0.0)
    assert f2.mimic is not None and f2.mimic.joint == "panda_finger_joint1" and f2.mimic.multiplier == 1.0
    # panda_link8 and panda_hand_tcp: massless frames attached by fixed joints
    assert desc.links["panda_link8"].inertial.mass == 0.0
    assert desc.links["panda_link1"].inertial.mass == pytest.approx(4.970684)
    assert desc.links["panda_link1"].inertial.inertia.shape == (3, 3)


def test_panda_mesh_collisions_become_boxes_with_a_warning(robots_dir):
    path = robots_dir / "panda_description/urdf/panda.urdf"
    with pytest.warns(UrdfWarning, match="bounding box"):
        desc = parse_urdf(path)
    link0 = desc.links["panda_link0"].collisions
    assert len(link0) == 1 and link0[0].kind == "box"
    assert link0[0].mesh.endswith("panda_description/meshes/collision/link0.stl")
    lo_hi = read_mesh_vertices(link0[0].mesh)
    lo, hi = lo_hi.min(axis=0), lo_hi.max(axis=0)
    np.testing.assert_allclose(link0[0].size, hi - lo)
    np.testing.assert_allclose(link0[0].origin.xyz, (lo + hi) / 2)      # collision origin is identity
    meshes = [g for l in desc.links.values() for g in l.collisions if g.mesh]
    assert len(meshes) == 9
    for g in meshes:
        assert g.kind == "box" and all(0 < s < 0.5 for s in g.size)
    # the finger pads are primitive boxes in the URDF and stay so
    boxes = [g for g in desc.links["panda_leftfinger"].collisions if g.mesh is None]
    assert len(boxes) == 4 and all(g.kind == "box" for g in boxes)


def test_load_meshes_false_skips_meshes_silently(robots_dir):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        desc = parse_urdf(robots_dir / "panda_description/urdf/panda.urdf", load_meshes=False)
    assert all(g.mesh is None for l in desc.links.values() for g in l.collisions)
    assert len(desc.links["panda_leftfinger"].collisions) == 4
    assert desc.links["panda_link0"].collisions == ()


def test_hector_mesh_box(robots_dir):
    with pytest.warns(UrdfWarning):
        desc = parse_urdf(robots_dir / "hector_description/robots/quadrotor_base.urdf")
    (g,) = desc.links["base_link"].collisions
    assert g.kind == "box" and g.mesh.endswith("quadrotor_base.stl")
    assert 0.5 < g.size[0] < 1.0 and g.size[0] == pytest.approx(g.size[1])


def test_double_pendulum_limits_kept_as_written(robots_dir):
    # The file really says lower = upper = effort = velocity = 0; the reader keeps it.
    desc = parse_quietly(robots_dir / "double_pendulum_description/urdf/double_pendulum.urdf")
    j1 = desc.joints[0]
    assert (j1.lower, j1.upper, j1.effort, j1.velocity, j1.damping) == (0.0, 0.0, 0.0, 0.0, 0.05)


# ---------------------------------------------------------------------------
# the project's own URDFs
# ---------------------------------------------------------------------------

def primitive_inertia(g, mass):
    """Inertia of a uniform primitive about its centre, in its link frame."""
    if g.kind == "box":
        a, b, c = g.size
        I = mass / 12 * np.diag([b * b + c * c, a * a + c * c, a * a + b * b])
    elif g.kind == "cylinder":
        r, h = g.size
        t = mass * (3 * r * r + h * h) / 12
        I = np.diag([t, t, mass * r * r / 2])
    else:
        I = np.eye(3) * 0.4 * mass * g.size[0] ** 2
    R = rpy_to_matrix(g.origin.rpy)
    return R @ I @ R.T


@pytest.mark.parametrize("name", ["arm", "quadrotor", "quadruped"])
def test_project_urdfs_are_primitive_and_physical(name):
    with warnings.catch_warnings():
        warnings.simplefilter("error")          # no mesh, no inertia warnings
        desc = parse_urdf(PROJECT_URDFS[name])
    for link in desc.links.values():
        for g in link.collisions:
            assert g.mesh is None and g.kind in ("box", "cylinder", "sphere")
        if link.inertial is None or (name == "quadrotor" and link.name == "base_link"):
            continue            # massless frame; the quadrotor body is a box plus arms (see file)
        (g,) = link.collisions
        # the inertial is the collision primitive's own: same centre, textbook inertia
        assert link.inertial.origin.rpy == (0.0, 0.0, 0.0)
        np.testing.assert_allclose(link.inertial.origin.xyz, g.origin.xyz, atol=1e-12)
        np.testing.assert_allclose(link.inertial.inertia, primitive_inertia(g, link.inertial.mass),
                                   rtol=1e-5, atol=1e-12, err_msg=f"{name}: link {link.name}")
    for j in moving(desc):
        assert j.effort > 0 and j.velocity > 0 and j.lower < 0 < j.upper
        assert j.damping > 0 and j.friction > 0


def test_arm():
    desc = parse_urdf(PROJECT_URDFS["arm"])
    assert desc.name == "diffsim_arm" and desc.root == "world"
    assert [j.name for j in moving(desc)] == ["arm_joint1", "arm_joint2", "arm_joint3", "arm_joint4"]
    assert all(j.type == "revolute" for j in moving(desc))
    assert desc.joints[0].type == "fixed" and desc.joints[0].parent == "world"
    ee = next(j for j in desc.joints if j.child == "ee_link")
    assert ee.type == "fixed" and desc.links["ee_link"].inertial is None
    assert 2.0 < total_mass(desc) < 5.0
    # reach from the shoulder (arm_joint2) to the end effector, all links along z
    names = [j.name for j in desc.joints]
    reach = sum(j.origin.xyz[2] for j in desc.joints[names.index("arm_joint3"):])
    assert reach == pytest.approx(0.61)


def test_arm_holds_itself_against_gravity_with_margin():
    pin = pytest.importorskip("pinocchio")
    desc = parse_urdf(PROJECT_URDFS["arm"])
    model = pin.buildModelFromUrdf(str(PROJECT_URDFS["arm"]))
    data = model.createData()
    effort = np.array([next(j.effort for j in desc.joints if j.name == n) for n in list(model.names)[1:]])
    for q in ([0, math.pi / 2, 0, 0], [0, -math.pi / 2, 0, 0], [1, 1.2, 0.5, -0.3]):
        g = pin.computeGeneralizedGravity(model, data, np.array(q, dtype=float))
        assert np.all(np.abs(g) * 2 < effort), (q, g, effort)


def test_quadrotor():
    desc = parse_urdf(PROJECT_URDFS["quadrotor"])
    assert desc.root == "base_link" and not moving(desc)
    assert total_mass(desc) == pytest.approx(1.0, rel=0.1)
    (body,) = desc.links["base_link"].collisions
    assert body.kind == "box"
    rotors = [j for j in desc.joints if j.child.startswith("rotor_")]
    assert sorted(j.child for j in rotors) == ["rotor_0", "rotor_1", "rotor_2", "rotor_3"]
    quadrants = set()
    for j in rotors:
        x, y, z = j.origin.xyz
        assert j.type == "fixed" and j.parent == "base_link"
        assert math.hypot(x, y) == pytest.approx(0.17, abs=0.01)
        assert abs(x) == pytest.approx(abs(y))            # X configuration
        quadrants.add((x > 0, y > 0))
        (g,) = desc.links[j.child].collisions
        assert g.kind == "cylinder" and g.size[0] < 0.1 and g.size[1] < 0.02
    assert len(quadrants) == 4


def test_quadruped():
    desc = parse_urdf(PROJECT_URDFS["quadruped"])
    assert desc.root == "trunk"
    assert total_mass(desc) == pytest.approx(5.0, rel=0.1)
    assert len(moving(desc)) == 12
    by_name = {j.name: j for j in desc.joints}
    for leg in ("FL", "FR", "HL", "HR"):
        assert by_name[f"{leg}_hip_joint"].axis == (1.0, 0.0, 0.0)
        assert by_name[f"{leg}_thigh_joint"].axis == (0.0, 1.0, 0.0)
        assert by_name[f"{leg}_knee_joint"].axis == (0.0, 1.0, 0.0)
        foot = next(j for j in desc.joints if j.child == f"{leg}_foot")
        assert foot.type == "fixed" and foot.parent == f"{leg}_shank"
        (g,) = desc.links[f"{leg}_foot"].collisions
        assert g.kind == "sphere"
        hx, hy, _ = by_name[f"{leg}_hip_joint"].origin.xyz
        assert (hx > 0) == leg.startswith("F") and (hy > 0) == leg.endswith("L")


def test_xacro_expands_to_the_same_arm():
    a = parse_urdf(PROJECT_URDFS["arm"])
    b = parse_urdf(PROJECT_URDFS["arm_xacro"])
    assert b.source == str(PROJECT_URDFS["arm_xacro"])
    assert "<xacro:" not in b.xml and "<robot" in b.xml
    assert (a.name, a.root, list(a.links)) == (b.name, b.root, list(b.links))
    for ja, jb in zip(a.joints, b.joints):
        assert (ja.name, ja.type, ja.parent, ja.child, ja.mimic) == (jb.name, jb.type, jb.parent, jb.child, jb.mimic)
        np.testing.assert_allclose([*ja.origin.xyz, *ja.origin.rpy, *ja.axis, ja.lower, ja.upper, ja.velocity,
                                    ja.effort, ja.damping, ja.friction],
                                   [*jb.origin.xyz, *jb.origin.rpy, *jb.axis, jb.lower, jb.upper, jb.velocity,
                                    jb.effort, jb.damping, jb.friction])
    for la, lb in zip(a.links.values(), b.links.values()):
        assert (la.inertial is None) == (lb.inertial is None)
        if la.inertial is not None:
            assert la.inertial.mass == pytest.approx(lb.inertial.mass)
            np.testing.assert_allclose(la.inertial.origin.xyz, lb.inertial.origin.xyz)
            np.testing.assert_allclose(la.inertial.inertia, lb.inertial.inertia, rtol=1e-5, atol=1e-12)
        assert [(g.kind, g.origin) for g in la.collisions] == [(g.kind, g.origin) for g in lb.collisions]
        for ga, gb in zip(la.collisions, lb.collisions):
            np.testing.assert_allclose(ga.size, gb.size)


def test_broken_xacro_is_a_urdf_error(tmp_path):
    f = tmp_path / "broken.urdf.xacro"
    f.write_text('<robot name="r" xmlns:xacro="http://www.ros.org/wiki/xacro">'
                 '<xacro:no_such_macro/></robot>')
    with pytest.raises(UrdfError, match="xacro") as e:
        parse_urdf(f)
    assert str(f) in str(e.value)


def test_xacro_args(tmp_path):
    f = tmp_path / "arg.xacro"
    f.write_text('<robot name="r" xmlns:xacro="http://www.ros.org/wiki/xacro">'
                 '<xacro:arg name="m" default="1.0"/>'
                 '<link name="a"><inertial><mass value="$(arg m)"/>'
                 '<inertia ixx="1" ixy="0" ixz="0" iyy="1" iyz="0" izz="1"/></inertial></link></robot>')
    assert parse_urdf(f).links["a"].inertial.mass == 1.0
    assert parse_urdf(f, xacro_args={"m": "2.5"}).links["a"].inertial.mass == 2.5


# ---------------------------------------------------------------------------
# sources: string, bytes, Path
# ---------------------------------------------------------------------------

def test_urdf_as_string_bytes_and_path():
    text = PROJECT_URDFS["quadruped"].read_text()
    from_file = parse_urdf(PROJECT_URDFS["quadruped"])
    from_str = parse_urdf("\ufeff\n  " + text)
    from_bytes = parse_urdf(text.encode())
    from_strpath = parse_urdf(str(PROJECT_URDFS["quadruped"]))
    assert from_str.source == from_bytes.source == "<string>"
    assert from_strpath.source == from_file.source == str(PROJECT_URDFS["quadruped"])
    for d in (from_str, from_bytes, from_strpath):
        assert [j.name for j in d.joints] == [j.name for j in from_file.joints]
        assert list(d.links) == list(from_file.links)
    assert from_file.xml == text


def test_missing_file_and_bad_source_types(tmp_path):
    with pytest.raises(UrdfError, match="does not exist"):
        parse_urdf(tmp_path / "nope.urdf")
    with pytest.raises(UrdfError, match="folder"):
        parse_urdf(tmp_path)
    with pytest.raises(UrdfError):
        parse_urdf("")
    with pytest.raises(UrdfError):
        parse_urdf(42)


# ---------------------------------------------------------------------------
# meshes and package:// resolution
# ---------------------------------------------------------------------------

# A cuboid spanning x in [0, 0.2], y in [-0.05, 0.05], z in [0.1, 0.4]
LO, HI = np.array([0.0, -0.05, 0.1]), np.array([0.2, 0.05, 0.4])


def cuboid_triangles():
    c = np.array([[x, y, z] for x in (LO[0], HI[0]) for y in (LO[1], HI[1]) for z in (LO[2], HI[2])])
    return [(c[0], c[1], c[3]), (c[4], c[6], c[7]), (c[0], c[4], c[5]), (c[2], c[3], c[7])]


def write_binary_stl(path, tris):
    with open(path, "wb") as f:
        f.write(b"solid but actually binary".ljust(80, b" "))
        f.write(struct.pack("<I", len(tris)))
        for t in tris:
            f.write(struct.pack("<3f", 0, 0, 1))
            for v in t:
                f.write(struct.pack("<3f", *v))
            f.write(b"\0\0")


def write_ascii_stl(path, tris):
    lines = ["solid cube"]
    for t in tris:
        lines += ["  facet normal 0 0 1", "    outer loop"]
        lines += [f"      vertex {v[0]:.9g} {v[1]:.9g} {v[2]:.9g}" for v in t]
        lines += ["    endloop", "  endfacet"]
    Path(path).write_text("\n".join(lines + ["endsolid cube"]))


def write_obj(path, tris):
    verts = [v for t in tris for v in t]
    Path(path).write_text("# cube\n" + "".join(f"v {v[0]} {v[1]} {v[2]}\n" for v in verts)
                          + "vn 0 0 1\nf 1 2 3\n")


def write_dae(path, tris, unit=1.0):
    verts = np.array([v for t in tris for v in t]) / unit
    floats = " ".join(f"{x:.9g}" for x in verts.ravel())
    Path(path).write_text(f"""<?xml version="1.0" encoding="utf-8"?>
<COLLADA xmlns="http://www.collada.org/2005/11/COLLADASchema" version="1.4.1">
  <asset><unit name="scaled" meter="{unit}"/><up_axis>Z_UP</up_axis></asset>
  <library_geometries><geometry id="g"><mesh>
    <source id="g-pos"><float_array id="g-pos-a" count="{verts.size}">{floats}</float_array>
      <technique_common><accessor source="#g-pos-a" count="{len(verts)}" stride="3"/></technique_common></source>
    <source id="g-nrm"><float_array id="g-nrm-a" count="3">0 0 100</float_array></source>
    <vertices id="g-vtx"><input semantic="POSITION" source="#g-pos"/></vertices>
    <triangles count="1"><input semantic="VERTEX" source="#g-vtx" offset="0"/><p>0 1 2</p></triangles>
  </mesh></geometry></library_geometries>
</COLLADA>""")


@pytest.mark.parametrize("fmt", ["binary.stl", "ascii.stl", "cube.obj", "metres.dae", "millimetres.dae"])
def test_mesh_readers(tmp_path, fmt):
    path = tmp_path / fmt
    tris = cuboid_triangles()
    {"binary.stl": write_binary_stl, "ascii.stl": write_ascii_stl, "cube.obj": write_obj,
     "metres.dae": write_dae, "millimetres.dae": lambda p, t: write_dae(p, t, unit=0.001)}[fmt](path, tris)
    v = read_mesh_vertices(str(path))
    np.testing.assert_allclose(v.min(axis=0), LO, atol=1e-6)
    np.testing.assert_allclose(v.max(axis=0), HI, atol=1e-6)


def mesh_robot(filename, scale=None, origin='xyz="1 0 0" rpy="0 0 1.5707963267948966"'):
    s = f' scale="{scale}"' if scale else ""
    return f"""<robot name="m">
  <link name="body">
    <inertial><mass value="1"/><inertia ixx="1" ixy="0" ixz="0" iyy="1" iyz="0" izz="1"/></inertial>
    <collision><origin {origin}/><geometry><mesh filename="{filename}"{s}/></geometry></collision>
  </link>
</robot>"""


@pytest.fixture
def pkg(tmp_path):
    """Write tmp_path/ws/my_pkg/meshes/cube.stl."""
    d = tmp_path / "ws" / "my_pkg" / "meshes"
    d.mkdir(parents=True)
    write_binary_stl(d / "cube.stl", cuboid_triangles())
    return tmp_path / "ws"


def check_cube_box(desc, scale=(1.0, 1.0, 1.0)):
    (g,) = desc.links["body"].collisions
    s = np.asarray(scale)
    lo, hi = np.minimum(LO * s, HI * s), np.maximum(LO * s, HI * s)
    assert g.kind == "box" and g.mesh.endswith("cube.stl")
    np.testing.assert_allclose(g.size, hi - lo, rtol=1e-6)
    centre = (lo + hi) / 2        # rotated by yaw 90 degrees: (x, y) -> (-y, x), then shifted by x = 1
    np.testing.assert_allclose(g.origin.xyz, (1 - centre[1], centre[0], centre[2]), atol=1e-6)
    np.testing.assert_allclose(g.origin.rpy, (0, 0, math.pi / 2))


def test_package_dirs_parent_folder(pkg):
    with pytest.warns(UrdfWarning, match="1 mesh collision geometry"):
        desc = parse_urdf(mesh_robot("package://my_pkg/meshes/cube.stl"), package_dirs=[pkg])
    check_cube_box(desc)


def test_package_dirs_package_folder_itself_and_scale(pkg):
    with pytest.warns(UrdfWarning):
        desc = parse_urdf(mesh_robot("package://my_pkg/meshes/cube.stl", scale="2 -1 0.5"),
                          package_dirs=[str(pkg / "my_pkg")])
    check_cube_box(desc, scale=(2.0, -1.0, 0.5))


def test_package_from_ros_package_path_and_ament_prefix(pkg, tmp_path, monkeypatch):
    monkeypatch.setenv("ROS_PACKAGE_PATH", str(pkg))
    check_cube_box(parse_quietly(mesh_robot("package://my_pkg/meshes/cube.stl")))
    monkeypatch.delenv("ROS_PACKAGE_PATH")
    share = tmp_path / "prefix" / "share"
    share.mkdir(parents=True)
    (pkg / "my_pkg").rename(share / "my_pkg")
    monkeypatch.setenv("AMENT_PREFIX_PATH", str(tmp_path / "prefix"))
    check_cube_box(parse_quietly(mesh_robot("package://my_pkg/meshes/cube.stl")))


def test_package_not_found_names_link_and_mesh(pkg, monkeypatch):
    monkeypatch.delenv("ROS_PACKAGE_PATH", raising=False)
    with pytest.raises(UrdfError, match=r"link 'body'.*package://my_pkg/meshes/cube.stl.*not found"):
        parse_urdf(mesh_robot("package://my_pkg/meshes/cube.stl"))
    # load_meshes=False: the mesh is not looked for at all
    assert parse_urdf(mesh_robot("package://my_pkg/meshes/cube.stl"), load_meshes=False) \
        .links["body"].collisions == ()


def test_relative_and_file_uris_resolve_from_the_urdf_folder(pkg):
    urdf_dir = pkg / "my_pkg" / "urdf"
    urdf_dir.mkdir()
    rel = urdf_dir / "rel.urdf"
    rel.write_text(mesh_robot("../meshes/cube.stl"))
    check_cube_box(parse_quietly(rel))
    absolute = urdf_dir / "abs.urdf"
    absolute.write_text(mesh_robot(f"file://{pkg / 'my_pkg' / 'meshes' / 'cube.stl'}"))
    check_cube_box(parse_quietly(absolute))


def test_unreadable_mesh_is_an_error(tmp_path):
    (tmp_path / "junk.stl").write_bytes(b"\x00\x01 this is not a mesh")
    (tmp_path / "junk.ply").write_text("ply")
    for name in ("junk.stl", "junk.ply"):
        f = tmp_path / f"{name}.urdf"
        f.write_text(mesh_robot(name))
        with pytest.raises(UrdfError, match=r"link 'body'.*cannot read mesh") as e:
            parse_urdf(f)
        assert str(f) in str(e.value)


# ---------------------------------------------------------------------------
# errors: one targeted case each
# ---------------------------------------------------------------------------

MINI = """<?xml version="1.0"?>
<robot name="mini">
  <link name="base"/>
  <joint name="j1" type="revolute">
    <parent link="base"/>
    <child link="arm"/>
    <origin xyz="0 0 0.1" rpy="0 0 0"/>
    <axis xyz="0 1 0"/>
    <limit lower="-1" upper="1" effort="10" velocity="2"/>
    <dynamics damping="0.1" friction="0.05"/>
  </joint>
  <link name="arm">
    <inertial>
      <origin xyz="0 0 0.1" rpy="0 0 0"/>
      <mass value="1"/>
      <inertia ixx="0.004" ixy="0" ixz="0" iyy="0.004" iyz="0" izz="0.001"/>
    </inertial>
    <collision>
      <origin xyz="0 0 0.1" rpy="0 0 0"/>
      <geometry><box size="0.05 0.05 0.2"/></geometry>
    </collision>
  </link>
  <joint name="j_tip" type="fixed">
    <parent link="arm"/>
    <child link="tip"/>
    <origin xyz="0 0 0.2" rpy="0 0 0"/>
  </joint>
  <link name="tip">
    <collision><geometry><sphere radius="0.02"/></geometry></collision>
  </link>
</robot>
"""
INERTIA = '<inertia ixx="0.004" ixy="0" ixz="0" iyy="0.004" iyz="0" izz="0.001"/>'
LIMIT = '<limit lower="-1" upper="1" effort="10" velocity="2"/>'
END = "</robot>"


def test_mini_is_valid():
    d = parse_urdf(MINI)
    assert [j.name for j in d.joints] == ["j1", "j_tip"] and d.root == "base"
    assert d.links["tip"].inertial is None


# (id, old, new, regex the message must match: it names the element at fault)
ERROR_CASES = [
    ("malformed-xml", "</robot>", "</robo>", r"malformed XML"),
    ("truncated", "  </link>\n</robot>\n", "  </li", r"malformed XML"),
    ("not-a-robot", (('<robot name="mini">', '<model name="mini">'), (END, "</model>")), None, r"expected <robot>"),
    ("no-inertial-on-moving-child", (("<inertial>", "<!--"), ("</inertial>", "-->")), None,
     r"link 'arm'.*joint 'j1'.*no <inertial>"),
    ("zero-mass-moving-child", '<mass value="1"/>', '<mass value="0"/>', r"link 'arm'.*mass must be positive"),
    ("negative-mass", '<mass value="1"/>', '<mass value="-2"/>', r"link 'arm'.*mass is negative"),
    ("negative-mass-on-fixed-link", '<link name="tip">',
     '<link name="tip"><inertial><mass value="-1"/>' + INERTIA + "</inertial>", r"link 'tip'.*negative"),
    ("nan-mass", '<mass value="1"/>', '<mass value="nan"/>', r"link 'arm'.*mass is not finite"),
    ("inf-mass", '<mass value="1"/>', '<mass value="inf"/>', r"link 'arm'.*not finite"),
    ("garbage-mass", '<mass value="1"/>', '<mass value="heavy"/>', r"link 'arm'.*heavy"),
    ("inertia-not-psd", 'ixx="0.004"', 'ixx="-0.004"', r"link 'arm'.*positive semi-definite"),
    ("inertia-off-diagonal-not-psd", 'ixy="0"', 'ixy="0.01"', r"link 'arm'.*positive semi-definite"),
    ("inertia-triangle", 'izz="0.001"', 'izz="0.01"', r"link 'arm'.*triangle inequality"),
    ("inertia-nan", 'iyy="0.004"', 'iyy="nan"', r"link 'arm'.*inertia iyy is not finite"),
    ("inertia-on-axis-only", '<origin xyz="0 0 0.1" rpy="0 0 0"/>\n      <mass',
     '<origin xyz="0 0 0" rpy="0 0 0"/>\n      <mass', None),   # valid: the box still has iyy > 0
    ("no-moment-about-axis", (('<origin xyz="0 0 0.1" rpy="0 0 0"/>\n      <mass', '<origin xyz="0 0 0"/><mass'),
                              (INERTIA, '<inertia ixx="0.001" ixy="0" ixz="0" iyy="0" iyz="0" izz="0.001"/>')),
     None, r"link 'arm'.*j1.*axis"),
    ("inertial-origin-nan", '<origin xyz="0 0 0.1" rpy="0 0 0"/>\n      <mass',
     '<origin xyz="0 nan 0.1" rpy="0 0 0"/>\n      <mass', r"link 'arm'.*inertial origin xyz.*not finite"),
    ("joint-origin-inf", '<origin xyz="0 0 0.1" rpy="0 0 0"/>\n    <axis',
     '<origin xyz="0 0 0.1" rpy="0 -inf 0"/>\n    <axis', r"joint 'j1'.*origin rpy.*not finite"),
    ("joint-origin-two-numbers", '<origin xyz="0 0 0.1" rpy="0 0 0"/>\n    <axis',
     '<origin xyz="0 0.1" rpy="0 0 0"/>\n    <axis', r"joint 'j1'"),
    ("axis-nan", '<axis xyz="0 1 0"/>', '<axis xyz="0 nan 0"/>', r"joint 'j1'.*axis.*not finite"),
    ("axis-zero", '<axis xyz="0 1 0"/>', '<axis xyz="0 0 0"/>', r"joint 'j1'.*axis is zero"),
    ("limit-inf", 'effort="10"', 'effort="inf"', r"joint 'j1'.*limit effort is not finite"),
    ("limit-nan-lower", 'lower="-1"', 'lower="nan"', r"joint 'j1'.*limit lower is not finite"),
    ("damping-nan", 'damping="0.1"', 'damping="nan"', r"joint 'j1'.*damping is not finite"),
    ("friction-inf", 'friction="0.05"', 'friction="inf"', r"joint 'j1'.*friction is not finite"),
    ("collision-origin-nan", '<origin xyz="0 0 0.1" rpy="0 0 0"/>\n      <geometry>',
     '<origin xyz="0 0 0.1" rpy="nan 0 0"/>\n      <geometry>', r"link 'arm'.*collision origin rpy"),
    ("box-size-nan", '<box size="0.05 0.05 0.2"/>', '<box size="0.05 nan 0.2"/>', r"link 'arm'.*box size"),
    ("box-size-zero", '<box size="0.05 0.05 0.2"/>', '<box size="0.05 0 0.2"/>',
     r"link 'arm'.*box size must be positive"),
    ("box-size-negative", '<box size="0.05 0.05 0.2"/>', '<box size="-0.05 0.05 0.2"/>', r"link 'arm'.*positive"),
    ("sphere-radius-zero", '<sphere radius="0.02"/>', '<sphere radius="0"/>',
     r"link 'tip'.*sphere radius must be positive"),
    ("sphere-radius-inf", '<sphere radius="0.02"/>', '<sphere radius="inf"/>',
     r"link 'tip'.*sphere radius is not finite"),
    ("cylinder-length-negative", '<sphere radius="0.02"/>', '<cylinder radius="0.02" length="-1"/>',
     r"link 'tip'.*cylinder length must be positive"),
    ("mesh-scale-zero", '<sphere radius="0.02"/>', '<mesh filename="x.stl" scale="1 0 1"/>', r"link 'tip'.*mesh scale"),
    ("joint-type-planar", 'type="revolute"', 'type="planar"',
     r"joint 'j1'.*'planar' is not supported.*revolute, continuous, prismatic, fixed"),
    ("joint-type-floating", 'type="revolute"', 'type="floating"', r"joint 'j1'.*'floating' is not supported"),
    ("joint-type-garbage", 'type="revolute"', 'type="hinge"', r"joint 'j1'.*hinge"),
    ("missing-limit-revolute", LIMIT, "", r"joint 'j1'.*revolute joint needs a <limit>"),
    ("missing-limit-prismatic", 'type="revolute"', 'type="prismatic"', None),   # valid with its limit
    ("missing-limit-prismatic-2", (('type="revolute"', 'type="prismatic"'), (LIMIT, "")),
     None, r"joint 'j1'.*prismatic joint needs a <limit>"),
    ("continuous-needs-no-limit", (('type="revolute"', 'type="continuous"'), (LIMIT, "")), None, None),
    ("limit-lower-above-upper", 'lower="-1" upper="1"', 'lower="1" upper="-1"',
     r"joint 'j1'.*lower .* greater than upper"),
    ("limit-velocity-negative", 'velocity="2"', 'velocity="-2"', r"joint 'j1'.*velocity is negative"),
    ("limit-effort-negative", 'effort="10"', 'effort="-10"', r"joint 'j1'.*effort is negative"),
    ("limit-effort-missing", 'effort="10" ', "", r"joint 'j1'.*effort"),
    ("damping-negative", 'damping="0.1"', 'damping="-0.1"', r"joint 'j1'.*damping is negative"),
    ("friction-negative", 'friction="0.05"', 'friction="-0.05"', r"joint 'j1'.*friction is negative"),
    ("dangling-parent", '<parent link="base"/>', '<parent link="nowhere"/>',
     r"joint 'j1'.*parent link 'nowhere' does not exist"),
    ("dangling-child", '<child link="tip"/>', '<child link="nowhere"/>',
     r"joint 'j_tip'.*child link 'nowhere' does not exist"),
    ("two-parents", END, '<joint name="j2" type="fixed"><parent link="base"/><child link="tip"/></joint>' + END,
     r"link 'tip'.*two parents.*'j_tip'.*'j2'"),
    ("self-loop", '<child link="tip"/>', '<child link="arm"/>', r"joint 'j_tip'.*same link 'arm'"),
    ("cycle-beside-the-tree", END, '<link name="c1"/><link name="c2"/>'
     '<joint name="c12" type="fixed"><parent link="c1"/><child link="c2"/></joint>'
     '<joint name="c21" type="fixed"><parent link="c2"/><child link="c1"/></joint>' + END,
     r"joint 'c(12|21)'.*cycle.*'c1'"),
    ("no-root", END, '<joint name="back" type="fixed"><parent link="tip"/><child link="base"/></joint>' + END,
     r"no root link.*cycle"),
    ("two-roots", END, '<link name="orphan"/>' + END, r"more than one root.*'base'.*'orphan'"),
    ("duplicate-link", END, '<link name="tip"/>' + END, r"link 'tip'.*duplicate link name"),
    ("duplicate-joint", END, '<link name="x"/><joint name="j_tip" type="fixed"><parent link="tip"/>'
     '<child link="x"/></joint>' + END, r"joint 'j_tip'.*duplicate joint name"),
    ("mimic-dangling", '<dynamics', '<mimic joint="ghost" multiplier="2"/><dynamics',
     r"joint 'j1'.*mimic.*'ghost'.*does not exist"),
    ("mimic-itself", '<dynamics', '<mimic joint="j1"/><dynamics', r"joint 'j1'.*mimic.*itself"),
    ("mimic-nan", '<dynamics', '<mimic joint="j_tip" multiplier="nan"/><dynamics', r"joint 'j1'.*mimic multiplier"),
    ("two-origins", '<axis xyz="0 1 0"/>', '<axis xyz="0 1 0"/><origin xyz="1 0 0"/>', r"joint 'j1'.*2 <origin>"),
    ("two-parents-elements", '<child link="arm"/>', '<child link="arm"/><parent link="tip"/>',
     r"joint 'j1'.*2 <parent>"),
    ("missing-parent-element", '<parent link="base"/>', "", r"joint 'j1'.*parent"),
    ("no-links", None, '<robot name="empty"></robot>', r"no <link>"),
    ("xacro-in-a-string", END, '<xacro:property xmlns:xacro="http://www.ros.org/wiki/xacro" name="a" value="1"/>'
     + END, r"xacro"),
    ("unsupported-version", '<robot name="mini">', '<robot name="mini" version="2.0">', r"version"),
]


def mutate(old, new):
    if old is None:
        return new
    pairs = old if isinstance(old, tuple) else ((old, new),)
    text = MINI
    for a, b in pairs:
        assert a in text, a
        text = text.replace(a, b, 1)
    return text


@pytest.mark.parametrize("case", ERROR_CASES, ids=[c[0] for c in ERROR_CASES])
def test_error_cases(case):
    name, old, new, pattern = case
    text = mutate(old, new)
    if pattern is None:
        parse_quietly(text)                     # a control: this variant is valid
        return
    with pytest.raises(UrdfError) as e:
        parse_quietly(text)
    msg = str(e.value)
    assert msg.startswith("<string>: "), msg
    assert re.search(pattern, msg, re.S), msg


def test_error_names_the_file(tmp_path):
    f = tmp_path / "bad.urdf"
    f.write_text(mutate('<axis xyz="0 1 0"/>', '<axis xyz="0 0 0"/>'))
    with pytest.raises(UrdfError) as e:
        parse_urdf(f)
    assert str(e.value).startswith(f"{f}: joint 'j1'")


def test_massless_fixed_frames_are_fine_and_welded_bad_inertia_only_warns():
    # tip: an <inertial> with an unphysical inertia on a fixed link whose body (arm + tip) is physical
    text = mutate('<link name="tip">', '<link name="tip"><inertial><mass value="0.001"/>'
                  '<inertia ixx="0" ixy="0" ixz="0" iyy="0" iyz="0" izz="1e-6"/></inertial>')
    with pytest.warns(UrdfWarning, match=r"link 'tip'.*triangle.*'arm'"):
        parse_urdf(text)
    # ... but not when the body is the tip alone, on a massless root
    text = """<robot name="r"><link name="base"><inertial><mass value="0"/>
      <inertia ixx="0" ixy="0" ixz="0" iyy="0" iyz="0" izz="1"/></inertial></link></robot>"""
    with pytest.raises(UrdfError, match=r"link 'base'.*triangle"):
        parse_urdf(text)


def test_urdf_parser_py_noise_is_silenced(capsys):
    text = mutate("<link name=\"base\"/>", '<link name="base"><sensor_thing a="1"/></link>')
    text = text.replace('<robot name="mini">', '<robot name="mini"><gazebo><plugin/></gazebo>')
    parse_urdf(text)
    captured = capsys.readouterr()
    assert captured.err == "" and captured.out == ""


def test_only_urdf_errors_for_non_urdf_inputs():
    for text in ("<", "<robot", "<robot/>", "<?xml version='1.0'?><robot name='x'/>",
                 "<!DOCTYPE r [<!ENTITY a 'aaaa'>]><robot name='&a;'/>", "<robot name='r'>" * 300,
                 '<robot name="r"><link name="a"><collision><geometry/></collision></link></robot>',
                 '<robot name="r"><link name="a"><collision><geometry><capsule radius="1" length="1"/>'
                 '</geometry></collision></link></robot>'):
        with pytest.raises(UrdfError):
            parse_urdf(text)
