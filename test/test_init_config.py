"""diffsim-ros init (issue 18 item 1): a commented training file for a URDF and a task.

For the project's robots (arm, quadrotor, quadruped) and example-robot-data's UR5, Panda,
solo12 and hector quadrotor: the file loads through the project's own loader and rcl's
parser; the actuated joints leave the Panda's fingers out (one by its name, the mimic one
because it mimics); the gains are the servo formula on the joint-space inertia, checked
against Pinocchio's CRBA and a hand computation; the base height puts the lowest foot point
on the ground, checked against Pinocchio's forward kinematics and the URDF's own geometry;
the rotor template comes from the rotor links or the base's box; bad requests are refused
with exit code 2. The slow tests train a small instance of each generated file to the
task's own success threshold.
"""
from __future__ import annotations

import math
import xml.etree.ElementTree as ET

import numpy as np
import pytest
import torch

from conftest import PROJECT_URDFS, REPO_ROOT
from diffsim_ros import cli, config
from diffsim_ros.workflows import init_config

ROBOTS = {   # name: (URDF, relative to example-robot-data's robots folder unless a project robot; task)
    "arm": ("project:arm", "reach"),
    "quadrotor": ("project:quadrotor", "hover"),
    "quadruped": ("project:quadruped", "locomotion"),
    "ur5": ("ur_description/urdf/ur5_robot.urdf", "reach"),
    "panda": ("panda_description/urdf/panda.urdf", "reach"),
    "solo12": ("solo_description/robots/solo12.urdf", "locomotion"),
    "hector": ("hector_description/robots/quadrotor_base.urdf", "hover"),
}
_CACHE = {}
_GENERATED = {}     # name -> (file, printed text) of `init`, once per process


def _urdf(name, robots_dir) -> str:
    where = ROBOTS[name][0]
    if where.startswith("project:"):
        return str(PROJECT_URDFS[where.split(":")[1]])
    return str(robots_dir / where)


def _generate(name, robots_dir, tmp_path_factory, *extra):
    """(exit code, printed text, file path) of ``diffsim-ros init`` for robot ``name`` (cached)."""
    key = (name,) + extra
    if key not in _CACHE:
        out = tmp_path_factory.mktemp("init") / f"{name}.yaml"
        argv = ["init", "--urdf", _urdf(name, robots_dir), "--task", ROBOTS[name][1], "--out", str(out), *extra]
        _CACHE[key] = (argv, out)
    return _CACHE[key]


def _run(capsys, argv):
    rc = cli.main(argv)
    cap = capsys.readouterr()
    return rc, cap.out, cap.err


@pytest.fixture(scope="module")
def generated(robots_dir, tmp_path_factory):
    """Every robot's generated file, through the command line once: name -> (path, stdout)."""
    import contextlib
    import io

    # Kept for the process: with work stealing a worker may set this module fixture up twice,
    # and a second `init` to the same (cached) path is refused, as it should be, without --force.
    for name in ROBOTS:
        if name in _GENERATED:
            continue
        argv, out = _generate(name, robots_dir, tmp_path_factory)
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            rc = cli.main(argv)
        assert rc == 0, (name, buf.getvalue())
        _GENERATED[name] = (out, buf.getvalue())
    return dict(_GENERATED)


def _load(path):
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return config.load_training_file(path)


@pytest.mark.parametrize("name", list(ROBOTS))
def test_generated_file_loads_and_is_commented(generated, name):
    path, printed = generated[name]
    params, task, model = _load(path)
    kind = {"reach": "reach", "hover": "quadrotor", "locomotion": "locomotion"}[ROBOTS[name][1]]
    assert params["task"]["type"] == kind and task.horizon > 0
    assert params["floating_base"] == (kind != "reach") == model.floating_base
    text = path.read_text()
    assert text.startswith("# ") and "/**:\n  ros__parameters:\n" in text
    assert f"wrote {path}" in printed
    # a ROS 2 parameter file: no nulls, no nested lists, lists of one type
    def walk(x):
        if isinstance(x, dict):
            for v in x.values():
                walk(v)
        elif isinstance(x, list):
            assert x and len({type(v) for v in x}) == 1 and not isinstance(x[0], (list, dict)), x
        else:
            assert x is not None
    walk(params)
    if kind != "quadrotor":
        assert "kp = M_ii w^2" in text and "kd = 2 zeta sqrt(kp M_ii)" in text


@pytest.mark.ros
def test_generated_files_pass_rcl_parser(generated):
    """Parsed by rcl's own parser (through rclpy), every generated file reads as config.load_yaml does."""
    pytest.importorskip("rclpy", reason="rclpy (ROS 2) is not installed")
    from conftest import rcl_parameters

    for name, (path, _) in generated.items():
        assert rcl_parameters(path) == config.load_yaml(path), name


# ------------------------------------------------------------------ joints
def _mimic_joints(urdf: str):
    """Joint names carrying <mimic>, read from the URDF's XML directly."""
    return {j.get("name") for j in ET.parse(urdf).getroot().findall("joint") if j.find("mimic") is not None}


def test_panda_leaves_the_fingers_out(generated, robots_dir, tmp_path, capsys):
    path, printed = generated["panda"]
    params = config.load_yaml(path)
    urdf = _urdf("panda", robots_dir)
    assert _mimic_joints(urdf) == {"panda_finger_joint2"}
    assert params["simulator"]["actuated_joints"] == [f"panda_joint{i}" for i in range(1, 8)]
    lines = {ln.split(":")[0]: ln for ln in printed.splitlines() if ln.startswith("joint ")}
    assert "left out" in lines["joint panda_finger_joint1"] and "'finger'" in lines["joint panda_finger_joint1"]
    assert "left out: mimics 'panda_finger_joint1'" in lines["joint panda_finger_joint2"]
    for i in range(1, 8):
        assert lines[f"joint panda_joint{i}"].endswith("actuated")
    # the tool centre point, not a finger, is the end effector
    assert params["task"]["ee_link"] == "panda_hand_tcp"
    # asked for, the leading finger is driven; the mimic one never is
    out = tmp_path / "with_finger.yaml"
    rc, text, _ = _run(capsys, ["init", "--urdf", urdf, "--task", "reach", "--out", str(out),
                                "--include-joints", "panda_finger_joint1"])
    assert rc == 0, text
    assert config.load_yaml(out)["simulator"]["actuated_joints"][-1] == "panda_finger_joint1"
    rc, _, err = _run(capsys, ["init", "--urdf", urdf, "--task", "reach", "--out", str(tmp_path / "x.yaml"),
                               "--include-joints", "panda_finger_joint2"])
    assert rc == 2 and "mimics 'panda_finger_joint1'" in err


def test_every_moving_joint_of_the_others_is_actuated(generated, robots_dir):
    for name in ("arm", "ur5", "quadruped", "solo12"):
        path, printed = generated[name]
        root = ET.parse(_urdf(name, robots_dir)).getroot()
        moving = {j.get("name") for j in root.findall("joint")
                  if j.get("type") in ("revolute", "continuous", "prismatic")}
        assert set(config.load_yaml(path)["simulator"]["actuated_joints"]) == moving, name
        assert "left out" not in printed


def test_gripper_jaws_by_their_place(tmp_path):
    """Two prismatic joints at the end of a chain, named like nothing, are a gripper's jaws."""
    jaw = """
      <joint name="slide_{i}" type="prismatic"><parent link="l2"/><child link="j{i}"/>
        <axis xyz="0 {s} 0"/><limit lower="0" upper="0.04" effort="20" velocity="0.2"/></joint>
      <link name="j{i}"><inertial><mass value="0.05"/><inertia ixx="1e-5" iyy="1e-5" izz="1e-5" ixy="0" ixz="0"
        iyz="0"/></inertial></link>"""
    urdf = tmp_path / "arm_with_jaws.urdf"
    urdf.write_text(f"""<robot name="jawed"><link name="base"/>
      <joint name="a1" type="revolute"><parent link="base"/><child link="l1"/><axis xyz="0 0 1"/>
        <limit lower="-2" upper="2" effort="10" velocity="2"/></joint>
      <link name="l1"><inertial><origin xyz="0 0 0.1"/><mass value="1"/><inertia ixx="0.01" iyy="0.01" izz="0.01"
        ixy="0" ixz="0" iyz="0"/></inertial></link>
      <joint name="a2" type="revolute"><parent link="l1"/><child link="l2"/><origin xyz="0 0 0.2"/>
        <axis xyz="0 1 0"/><limit lower="-2" upper="2" effort="10" velocity="2"/></joint>
      <link name="l2"><inertial><origin xyz="0 0 0.1"/><mass value="0.5"/><inertia ixx="0.005" iyy="0.005"
        izz="0.005" ixy="0" ixz="0" iyz="0"/></inertial></link>
      {jaw.format(i=1, s=1)}{jaw.format(i=2, s=-1)}</robot>""")
    p = init_config.plan(str(urdf), "reach")
    chosen = {j.name: j for j in p.joints}
    assert [n for n, j in chosen.items() if j.actuated] == ["a1", "a2"]
    assert "gripper's jaws" in chosen["slide_1"].reason and "gripper's jaws" in chosen["slide_2"].reason
    assert p.params["task"]["ee_link"] == "l2"


# ------------------------------------------------------------------ gains
def _pin(name, robots_dir, model):
    pr = pytest.importorskip("pin_reference", reason="test helper")
    pytest.importorskip("pinocchio", reason="pinocchio (pip package 'pin') is not installed")
    return pr.PinReference(_urdf(name, robots_dir), model.floating_base, model.joint_names, model.link_names)


@pytest.mark.parametrize("name,bandwidth,zeta", [("ur5", None, None), ("arm", None, None), ("panda", 2.0, 0.7),
                                                 ("quadruped", None, None)])
def test_gains_are_the_servo_formula_on_pinocchios_mass_matrix(name, bandwidth, zeta, robots_dir, generated,
                                                               tmp_path, capsys):
    """The gains are the servo formula on Pinocchio's mass matrix.

    kp = M_ii w^2 raised to friction / 0.01 rad (and, legged, to the standing torque / 0.1 rad),
    capped at effort / (largest commanded error); kd = 2 zeta sqrt(kp M_ii) - URDF damping; M_ii
    from Pinocchio's CRBA at the configuration the plan names, and no smaller than at the nominal
    configuration. The file holds the same numbers.
    """
    if bandwidth is None:
        path = generated[name][0]
        bandwidth, zeta = init_config.DEFAULT_BANDWIDTH_HZ, init_config.DEFAULT_DAMPING_RATIO
    else:
        path = tmp_path / f"{name}.yaml"
        rc, out, err = _run(capsys, ["init", "--urdf", _urdf(name, robots_dir), "--task", ROBOTS[name][1], "--out",
                                     str(path), "--bandwidth", str(bandwidth), "--damping-ratio", str(zeta)])
        assert rc == 0, err
    p = init_config.plan(_urdf(name, robots_dir), ROBOTS[name][1], bandwidth=bandwidth, damping_ratio=zeta)
    model = p.info["model"]
    ref = _pin(name, robots_dir, model)
    params = config.load_yaml(path)
    sim, task = params["simulator"], params["task"]
    error = task["delta_scale"] if task["type"] == "reach" else task["action_scale"]
    w = 2 * math.pi * bandwidth
    nominal = model.neutral_configuration().numpy()
    if model.floating_base:
        nominal[2] = task["base_height"]
        for n, v in zip(sim["actuated_joints"], task["stance"]):
            nominal[7 + model.joint_names.index(n)] = v
    M0 = np.diag(ref.crba(nominal))
    nb = model.nv - model.nj
    urdf_joints = {j.get("name"): j for j in ET.parse(_urdf(name, robots_dir)).getroot().findall("joint")}
    bounds = set()
    for k, g in enumerate(p.gains):
        i = model.joint_names.index(g.joint)
        M = float(np.diag(ref.crba(np.asarray(g.at)))[nb + i])
        assert g.inertia == pytest.approx(M, rel=1e-9)
        assert M >= M0[nb + i] * (1 - 1e-9)
        el = urdf_joints[g.joint]
        effort = float(el.find("limit").get("effort"))
        dyn = el.find("dynamics")
        damping = float(dyn.get("damping", 0)) if dyn is not None else 0.0
        friction = float(dyn.get("friction", 0)) if dyn is not None else 0.0
        kp = max(M * w * w, friction / 0.01)
        if model.floating_base:
            kp = max(kp, abs(p.info["hold_torque"][g.joint]) / 0.1)
        kp = min(kp, effort / error)
        kd = max(0.0, 2 * zeta * math.sqrt(kp * M) - damping)
        assert sim["kp"][k] == pytest.approx(kp, rel=1e-3), g.joint
        assert sim["kd"][k] == pytest.approx(kd, rel=1e-3, abs=1e-4), g.joint
        assert g.kp * error <= effort * (1 + 1e-9)
        bounds.add(g.bound)
    if name == "ur5":
        assert {"effort cap", ""} <= bounds          # both cases are exercised


def test_standing_torque_against_pinocchio(generated, robots_dir):
    """The standing torque against Pinocchio.

    The torque the legged gains hold (the weight shared by the feet through each foot's
    Jacobian) is the static joint torque of Pinocchio's model: J^T f = g(q) for the joints
    when the feet carry the whole weight, checked on the base's own balance.
    """
    for name in ("quadruped", "solo12"):
        p = init_config.plan(_urdf(name, robots_dir), "locomotion")
        model = p.info["model"]
        ref = _pin(name, robots_dir, model)
        q = model.neutral_configuration().numpy()
        q[2] = p.info["base_height"]
        for n, v in zip(p.params["simulator"]["actuated_joints"], p.params["task"]["stance"]):
            q[7 + model.joint_names.index(n)] = v
        g = ref.rnea(q, np.zeros(model.nv), np.zeros(model.nv))
        hold = np.array([p.info["hold_torque"][n] for n in model.joint_names])
        # vertical force balance of the base: the feet push up with the whole weight
        assert g[2] == pytest.approx(float(model.mass.sum()) * 9.81, rel=1e-6)
        # the feet's forces, through Pinocchio's own Jacobians, give the same joint torques
        J = ref.link_jacobians(q)
        feet = init_config.foot_bodies(model)
        tau = np.zeros(model.nv)
        for f in feet:
            lk = min((z, ln) for z, ln, b in init_config.lowest_points(model, torch.tensor(q)) if b == f)[1]
            tau += J[model.link_names.index(lk)][2] * float(model.mass.sum()) * 9.81 / len(feet)
        np.testing.assert_allclose(hold, tau[6:], rtol=1e-6, atol=1e-9)


def test_jump_is_the_legged_plan_with_the_jump_task(robots_dir, tmp_path):
    """The jump is the legged plan with the jump task.

    `--task jump` on the project's quadruped and solo12: the robot, stance, base height, gains
    and contact of the locomotion plan, the drives' velocity limits on, and a task section that
    builds tasks.jump.JumpTask through the project's loader.
    """
    from diffsim_ros.tasks import JumpTask

    for name in ("quadruped", "solo12"):
        loco = init_config.plan(_urdf(name, robots_dir), "locomotion")
        jump = init_config.plan(_urdf(name, robots_dir), "jump")
        assert jump.params["task"]["type"] == "jump"
        for k in ("stance", "base_height", "action_scale"):
            assert jump.params["task"][k] == loco.params["task"][k], k
        sim_l, sim_j = loco.params["simulator"], jump.params["simulator"]
        assert {k: v for k, v in sim_j.items() if k != "velocity_limits"} == sim_l and sim_j["velocity_limits"]
        out = tmp_path / f"{name}_jump.yaml"
        assert cli.main(["init", "--urdf", _urdf(name, robots_dir), "--task", "jump", "--out", str(out)]) == 0
        _, task, _ = config.load_training_file(out)
        assert (isinstance(task, JumpTask)
                and task.base_height == pytest.approx(loco.params["task"]["base_height"], abs=1e-6))


# ------------------------------------------------------------------ legged geometry
def _box_corners(size, R, p):
    h = 0.5 * np.asarray(size)
    corners = np.array([[sx, sy, sz] for sx in (-1, 1) for sy in (-1, 1) for sz in (-1, 1)]) * h
    return corners @ R.T + p


def test_base_height_puts_the_feet_on_the_ground(generated, robots_dir):
    """base_height puts the feet on the ground.

    Pinocchio's link placements at the stance, with the URDF's own collision elements (the
    quadruped's foot spheres; solo12's foot meshes bounded by their vertices' box, as the loader
    approximates them): the lowest foot point lies base_height below the base; the project's
    quadruped also matches the hand computation in config/locomotion.yaml (0.298683 m).
    """
    from diffsim_ros.physics.urdf import read_mesh_vertices, resolve_uri
    from diffsim_ros.physics.rotation import rpy_to_matrix

    for name in ("quadruped", "solo12"):
        path = generated[name][0]
        params, task, model = _load(path)
        ref = _pin(name, robots_dir, model)
        q = model.neutral_configuration().numpy()
        for n, v in zip(params["simulator"]["actuated_joints"], params["task"]["stance"]):
            q[7 + model.joint_names.index(n)] = v
        poses = ref.fk(q)
        urdf = _urdf(name, robots_dir)
        lowest = np.inf
        for link in ET.parse(urdf).getroot().iter("link"):
            if "foot" not in link.get("name").lower():
                continue
            T = poses[model.link_names.index(link.get("name"))]
            for col in link.iter("collision"):
                o = col.find("origin")
                xyz = np.array([float(x) for x in (o.get("xyz", "0 0 0") if o is not None else "0 0 0").split()])
                rpy = [float(x) for x in (o.get("rpy", "0 0 0") if o is not None else "0 0 0").split()]
                Rg = T[:3, :3] @ rpy_to_matrix(rpy)
                pg = T[:3, :3] @ xyz + T[:3, 3]
                geo = col.find("geometry")[0]
                if geo.tag == "sphere":
                    lowest = min(lowest, pg[2] - float(geo.get("radius")))
                elif geo.tag == "mesh":
                    mesh = resolve_uri(geo.get("filename"), base_dir=None)
                    scale = np.array([float(x) for x in geo.get("scale", "1 1 1").split()])
                    v = read_mesh_vertices(str(mesh)) * scale
                    lo, hi = v.min(0), v.max(0)
                    pts = _box_corners(hi - lo, Rg, pg + Rg @ (0.5 * (lo + hi)))
                    lowest = min(lowest, pts[:, 2].min())
        assert np.isfinite(lowest), name
        assert params["task"]["base_height"] == pytest.approx(-lowest, abs=1e-6), name
        if name == "quadruped":
            assert params["task"]["base_height"] == pytest.approx(0.298683, abs=1e-6)
            assert params["task"]["stance"] == pytest.approx([0.0, 0.8, -1.6] * 4)


def test_legged_stance_holds_under_its_gains(generated):
    """The legged stance holds under its gains.

    Zero actions (the stance targets) for 0.5 s: the robot stays on its feet at about the
    base height, only the feet touching, under the generated gains.
    """
    for name in ("quadruped", "solo12"):
        params, task, model = _load(generated[name][0])
        task = config.build_task(dict(params, task=dict(params["task"], horizon=50)), name)[0]
        ts = task.reset(4, torch.Generator().manual_seed(0))
        zero = torch.zeros(4, task.action_dim, dtype=model.dtype)
        bad = torch.zeros(4, dtype=torch.bool)
        with torch.no_grad():
            for _ in range(task.horizon):
                ts = task.step(ts, zero)
                other = task.other_contact()
                if other is not None:
                    bad |= other
        z = ts.sim.q[:, 2]
        h = params["task"]["base_height"]
        assert bool(((z > 0.85 * h) & (z < 1.02 * h)).all()), (name, z.tolist(), h)
        assert not bool(bad.any()) and not bool(ts.extra["fallen"].any()), name


def _urdf_mass(root, links):
    total = 0.0
    for link in root.findall("link"):
        if link.get("name") in links and link.find("inertial/mass") is not None:
            total += float(link.find("inertial/mass").get("value"))
    return total


def test_legged_substeps_from_the_foot_contact(generated, robots_dir):
    """Legged substeps follow from the foot contact.

    substeps = 5 ceil(dt w / 0.8 / 5), w = sqrt(2 sqrt(k m g / feet) / m_foot), the foot body's
    mass summed from the URDF's lower-leg and foot links by hand: 5 for the project's quadruped
    (0.15 kg feet, as config/locomotion.yaml), 10 for solo12's 38 g lower legs.
    """
    want = {"quadruped": (("FL_shank", "FL_foot"), 5), "solo12": (("FL_LOWER_LEG", "FL_FOOT"), 10)}
    for name, (links, expected) in want.items():
        root = ET.parse(_urdf(name, robots_dir)).getroot()
        mass = _urdf_mass(root, {ln.get("name") for ln in root.findall("link")})
        m_foot = _urdf_mass(root, set(links))
        sim = config.load_yaml(generated[name][0])["simulator"]
        w = math.sqrt(2 * math.sqrt(sim["contact_stiffness"] * mass * 9.81 / 4) / m_foot)
        assert sim["substeps"] == 5 * math.ceil(sim["dt"] * w / 0.8 / 5) == expected, name


@pytest.mark.slow
def test_solo12_substeps_keep_flailing_legs_finite(generated):
    """solo12's substeps keep flailing legs finite.

    Random full-scale actions (a new one every 5 steps) on solo12 for 0.6 s: finite with the
    generated substeps. With 5 (config/locomotion.yaml's, right for the heavier quadruped) the
    explicit contact penalty on its 38 g lower legs diverges; the linearly implicit contact (the
    default, README "Contact in the implicit step") stays finite there too.
    """
    from diffsim_ros import physics

    params = config.load_yaml(generated["solo12"][0])
    params["task"]["horizon"] = 60
    outcomes = {}
    for substeps, implicit in ((params["simulator"]["substeps"], True), (5, True), (5, False)):
        params["simulator"]["substeps"] = substeps
        params["simulator"]["implicit_contact"] = implicit
        task, model = config.build_task(params, "solo12")
        g = torch.Generator().manual_seed(0)
        ts = task.reset(64, g)
        try:
            with torch.no_grad():
                for k in range(task.horizon):
                    if k % 5 == 0:
                        a = torch.sign(torch.randn(64, task.action_dim, generator=g, dtype=model.dtype))
                    ts = task.step(ts, a)
            outcomes[substeps, implicit] = "finite"
        except physics.SimulationError:
            outcomes[substeps, implicit] = "diverged"
    assert outcomes == {(10, True): "finite", (5, True): "finite", (5, False): "diverged"}


# ------------------------------------------------------------------ multirotors
def test_rotor_templates(generated, robots_dir):
    """The rotor templates.

    The project's quadrotor keeps its rotor links (X layout, alternating spin); hector has
    none, so an X layout inside its collision box is guessed and the file says to check it.
    Either way full thrust is twice the weight (Pinocchio's total mass).
    """
    pin = pytest.importorskip("pinocchio", reason="pinocchio (pip package 'pin') is not installed")
    for name in ("quadrotor", "hector"):
        path = generated[name][0]
        params, task, model = _load(path)
        rot = params["simulator"]["rotors"]
        n = len(rot["directions"])
        assert n == 4 and sorted(rot["directions"]) == [-1, -1, 1, 1]
        assert [rot["directions"][i] * rot["directions"][(i + 1) % n] for i in range(n)] == [-1] * n
        pm = pin.buildModelFromUrdf(_urdf(name, robots_dir), pin.JointModelFreeFlyer())
        mass = sum(pm.inertias[i].mass for i in range(pm.njoints))
        assert n * rot["thrust_coefficient"] * rot["max_rotor_speed"] ** 2 == pytest.approx(2 * mass * 9.81, rel=1e-3)
        if name == "quadrotor":
            assert sorted(rot["rotor_links"]) == ["rotor_0", "rotor_1", "rotor_2", "rotor_3"]
            assert "positions" not in rot
        else:
            assert "rotor_links" not in rot
            pos = np.array(rot["positions"]).reshape(4, 3)
            half = 0.7911338806152344 / 2          # the hector mesh's bounding box (the loader's warning)
            assert np.linalg.norm(pos[:, :2], axis=1) == pytest.approx([2 * half / 3] * 4, rel=1e-3)
            assert "CHECK" in path.read_text()


# ------------------------------------------------------------------ end effector, refusals
def test_end_effector_choice(generated, robots_dir, tmp_path, capsys):
    """The end effector's choice.

    The tip of the longest chain (the demo's choice) where an actuated joint moves it; the
    ee link's targets span the workspace (sampled forward kinematics in the comments).
    """
    assert config.load_yaml(generated["arm"][0])["task"]["ee_link"] == "ee_link"
    assert config.load_yaml(generated["ur5"][0])["task"]["ee_link"] == "tool0"
    assert "Sampled workspace of the targets" in generated["ur5"][0].read_text()
    out = tmp_path / "ur5_wrist.yaml"
    rc, _, err = _run(capsys, ["init", "--urdf", _urdf("ur5", robots_dir), "--task", "reach", "--ee-link",
                               "wrist_3_link", "--out", str(out)])
    assert rc == 0, err
    assert config.load_yaml(out)["task"]["ee_link"] == "wrist_3_link"


def test_reach_targets_fit_the_velocity_limits(generated):
    """The reach targets fit the velocity limits.

    Each joint's target range is coverable in half the 2 s episode at its URDF speed limit,
    and a held full action (w delta / 2 zeta) does not exceed the slowest limit.
    """
    params, task, model = _load(generated["ur5"][0])
    t = params["task"]
    span = (task.q_high - task.q_low)
    drawn = task.t_high - task.t_low
    vlim = model.velocity_limit
    budget = 0.5 * t["horizon"] * params["simulator"]["dt"] * vlim
    assert 0.15 <= t["target_margin"] <= 0.45
    assert bool((drawn <= budget * (1 + 1e-6)).all()) or t["target_margin"] == 0.45
    assert drawn == pytest.approx((1 - 2 * t["target_margin"]) * span)
    w = 2 * math.pi * init_config.DEFAULT_BANDWIDTH_HZ
    assert w * t["delta_scale"] / 2 <= float(vlim.min()) * 1.001


@pytest.mark.parametrize("argv,message", [
    (["--task", "fly"], "unknown (available: reach, hover"),
    (["--task", "reach", "--floating-base"], "drop --floating-base"),
    (["--task", "hover"], "moving joints"),
    (["--task", "reach", "--include-joints", "nope"], "'nope' is not a moving joint"),
    (["--task", "reach", "--ee-link", "nope"], "--ee-link nope: not a link"),
    (["--task", "reach", "--bandwidth", "0"], "--bandwidth must be > 0"),
])
def test_refusals(argv, message, tmp_path, capsys):
    out = tmp_path / "x.yaml"
    rc, _, err = _run(capsys, ["init", "--urdf", str(PROJECT_URDFS["arm"]), *argv, "--out", str(out)])
    assert rc == 2 and message in err, err
    assert not out.exists()


def test_refuses_to_overwrite_without_force(tmp_path, capsys):
    out = tmp_path / "arm.yaml"
    out.write_text("keep me\n")
    argv = ["init", "--urdf", str(PROJECT_URDFS["arm"]), "--task", "reach", "--out", str(out)]
    rc, _, err = _run(capsys, argv)
    assert rc == 2 and "--force" in err and out.read_text() == "keep me\n"
    assert _run(capsys, argv + ["--force"])[0] == 0 and out.read_text() != "keep me\n"


def test_urdf_reference_is_portable(generated):
    assert config.load_yaml(generated["arm"][0])["urdf"] == "urdf/diffsim_arm.urdf"
    assert config.load_yaml(generated["ur5"][0])["urdf"] == \
        "package://example-robot-data/robots/ur_description/urdf/ur5_robot.urdf"
    assert (REPO_ROOT / "urdf" / "diffsim_arm.urdf").is_file()


# ------------------------------------------------------------------ training (slow)
SMALL = {   # small instances: task overrides, trainer settings
    # reach: starts and targets from the central 20 % of each joint range (target_margin 0.4), but
    # at most 1 rad wide (small_reach_margin): the UR5's joints turn +-2 pi, where 20 % is 2.5 rad,
    # end-effector paths up to 1.6 m in the 2 s episode (the Panda's are 0.6-1.2 rad wide).
    "reach": (dict(target_margin=0.4),
              dict(iterations=40, num_envs=16, window=10, learning_rate=3e-3, lr_schedule="cosine",
                   final_learning_rate=1e-4, eval_every=5, eval_envs=64)),
    "quadrotor": (dict(horizon=50, settle_time=0.8, start_radius=0.1, start_speed=0.1),
                  dict(iterations=40, num_envs=16, window=25, learning_rate=1e-2, eval_every=2, eval_envs=32)),
    "locomotion": (dict(horizon=30),
                   dict(iterations=12, num_envs=8, window=30, learning_rate=1e-2, eval_every=2, eval_envs=16)),
}


def small_reach_margin(task) -> float:
    """Return the target_margin of the small reach instance.

    The central 20 % of each joint range, narrowed so that the widest actuated joint's window is
    at most 1 rad.
    """
    from diffsim_ros.tasks.base import actuated_limits

    lo, hi, _ = actuated_limits(task)
    span = hi - lo
    span = span[torch.isfinite(span)]
    return max(0.4, 0.5 - 0.5 / float(span.max())) if span.numel() else 0.4


@pytest.mark.slow
@pytest.mark.parametrize("name", list(ROBOTS))
def test_generated_file_trains_a_small_instance(generated, name):
    """The generated file trains a small instance.

    The generated file, with a smaller instance of its task (shorter episodes, a narrower
    start distribution: SMALL) and a small trainer budget, trains to the task's own success
    threshold: the trainer's evaluation reaches it, and fresh episodes the trainer never saw
    hold at least 0.8 of it; the untrained policy does not.
    """
    from diffsim_ros.learning import MLPPolicy, TrainConfig, train

    params = config.load_yaml(generated[name][0])
    kind = params["task"]["type"]
    small_task, small_train = SMALL[kind]
    params["task"].update(small_task)
    task, _ = config.build_task(params, name)
    if kind == "reach":
        params["task"]["target_margin"] = small_reach_margin(task)
        task, _ = config.build_task(params, name)
    cfg = TrainConfig(hidden=tuple(params["training"]["hidden"]), stop_at_success=True, seed=0, **small_train)
    torch.manual_seed(cfg.seed)
    untrained = MLPPolicy(task.obs_dim, task.action_dim, cfg.hidden, normalize=cfg.normalize_obs).to(task.model.dtype)
    before = task.rollout_success(untrained, 32, torch.Generator().manual_seed(99))
    res = train(task, cfg, progress=False)
    assert res.solved_env_steps is not None, f"not solved; last rows {res.history[-3:]}"
    after = task.rollout_success(res.policy, 64, torch.Generator().manual_seed(99))
    assert before < 0.5 and after >= 0.8 * task.success_threshold, (before, after)


@pytest.mark.ros
def test_ros2_controllers_beside_each_file_follow_the_checkpoints_joint_order(generated, tmp_path):
    """The ros2_controllers.yaml beside each file follows the checkpoint's joint order.

    Beside each generated arm and legged file, its ros2_controllers.yaml: rcl's parser reads, for
    the controller_manager, the broadcaster and the command controller policy_controller publishes
    to by default (/<interface>_controller/commands); that controller's joints are the actuated
    joints of a checkpoint saved from the file, in its order (PolicyRunner reads them back), which
    is not always the order init lists them in (solo12). A multirotor gets none.
    """
    pytest.importorskip("rclpy", reason="rclpy (ROS 2) is not installed")
    from conftest import rcl_parameters
    from diffsim_ros.learning.checkpoint import save_checkpoint
    from diffsim_ros.learning.deploy import PolicyRunner
    from diffsim_ros.learning.policy import MLPPolicy

    for name, (path, printed) in generated.items():
        cpath = init_config.controllers_path(str(path))
        if ROBOTS[name][1] == "hover":
            assert not (tmp_path / cpath).exists() and "no ros2_controllers.yaml" in printed, name
            continue
        assert f"wrote {cpath}" in printed, (name, printed)
        params, task, model = _load(path)
        iface = params["simulator"]["actuator"]
        manager = rcl_parameters(cpath, "controller_manager")
        assert manager["update_rate"] == 500
        assert manager["joint_state_broadcaster"]["type"] == "joint_state_broadcaster/JointStateBroadcaster"
        assert manager[f"{iface}_controller"]["type"] == "forward_command_controller/ForwardCommandController"
        command = rcl_parameters(cpath, f"{iface}_controller")
        ckpt = tmp_path / name
        save_checkpoint(MLPPolicy(task.obs_dim, task.action_dim, (8,)).to(model.dtype), task, ckpt,
                        extra={"config": params})
        runner = PolicyRunner(ckpt)
        assert command == {"joints": runner.actuated_joints, "interface_name": iface}, name
        if iface == "position":
            jtc = rcl_parameters(cpath, "joint_trajectory_controller")
            assert jtc["joints"] == runner.actuated_joints and jtc["command_interfaces"] == ["position"]
        if model.floating_base:
            assert manager["imu_sensor_broadcaster"]["type"] == "imu_sensor_broadcaster/IMUSensorBroadcaster"
            assert rcl_parameters(cpath, "imu_sensor_broadcaster")["frame_id"] == model.link_names[0]
