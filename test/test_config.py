"""Configuration files: config/*.yaml load (as ROS 2 reads them too) and fly.

Bad keys, types and values are errors that name the file and the key.
"""
from __future__ import annotations

import textwrap
import warnings
from pathlib import Path

import pytest
import torch

from diffsim_ros import config, physics
from diffsim_ros.physics import ConfigError, RotorConfig

REPO = Path(__file__).resolve().parent.parent
QUADROTOR_YAMLS = {
    "diffsim_quadrotor": REPO / "config" / "diffsim_quadrotor.yaml",
    "hector_quadrotor": REPO / "config" / "hector_quadrotor.yaml",
}
G = 9.81


def write(tmp_path: Path, text: str, name: str = "params.yaml") -> Path:
    p = tmp_path / name
    p.write_text(textwrap.dedent(text))
    return p


def sim_from(params: dict, source: str = ""):
    model = config.load_model(params, source)
    return model, physics.Simulator(model, config.simulator_config(params, source))


# ------------------------------------------------------------------------ the shipped files
@pytest.mark.parametrize("name", sorted(QUADROTOR_YAMLS))
def test_quadrotor_yaml_hovers_at_mg(name):
    """Each quadrotor YAML hovers at m g.

    Each quadrotor YAML loads, hover needs 50-60 % of full thrust, and a constant
    CTBR command of (m g, 0, 0, 0) keeps it in place for 1 s.
    """
    path = QUADROTOR_YAMLS[name]
    params = config.load_yaml(path)
    assert params["floating_base"] is True
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")          # hector: "mesh replaced by its bounding box"
        model, sim = sim_from(params, str(path))
    cfg = sim.config
    assert cfg.actuator == "ctbr" and sim.rotors.n == 4
    mg = float(model.mass.sum()) * G
    hover = mg / (sim.rotors.n * cfg.rotors.max_thrust)
    assert 0.5 <= hover <= 0.6, f"{name}: hover takes {hover:.0%} of full thrust"
    # Yaw torques cancel and the allocation can produce any body torque.
    assert abs(sum(cfg.rotors.directions)) == 0
    assert torch.linalg.matrix_rank(sim.rotors.allocation) == 4

    q = model.neutral_configuration()
    q[2] = 1.0
    state = sim.initial_state(q)
    action = torch.tensor([mg, 0.0, 0.0, 0.0], dtype=model.dtype)
    steps = round(1.0 / cfg.dt)
    with torch.no_grad():
        for _ in range(steps):
            state = sim.step(state, action)
    assert float(state.t) == pytest.approx(1.0)
    drift = torch.linalg.vector_norm(state.q[0:3] - q[0:3])
    assert drift < 1e-4, f"{name}: drifted {float(drift):.2e} m in 1 s of hover"
    assert torch.linalg.vector_norm(state.v) < 1e-4
    assert torch.allclose(state.q[3:7], q[3:7], atol=1e-9)


def test_quadrotor_yaml_climbs_and_turns():
    """A quadrotor YAML climbs and turns.

    The CTBR interface responds in the right sense: more thrust climbs, a yaw-rate
    command yaws (rotor directions and torque coefficient have the right sign).
    """
    params = config.load_yaml(QUADROTOR_YAMLS["diffsim_quadrotor"])
    model, sim = sim_from(params)
    mg = float(model.mass.sum()) * G
    q = model.neutral_configuration((2,))
    q[:, 2] = 1.0
    state = sim.initial_state(q)
    action = torch.tensor([[1.2 * mg, 0.0, 0.0, 0.0], [mg, 0.0, 0.0, 1.0]], dtype=model.dtype)
    with torch.no_grad():
        for _ in range(100):
            state = sim.step(state, action)
    assert state.q[0, 2] > 1.01                      # climbing
    assert state.v[1, 5] > 0.5                       # yaw rate towards the commanded 1 rad/s
    assert abs(float(state.q[1, 2]) - 1.0) < 5e-3    # near hover while yawing (motor lag: w^2 sum dips)


@pytest.mark.ros
def test_yaml_is_a_valid_ros2_parameter_file():
    """Each shipped file is a valid ROS 2 parameter file.

    rcl's own parser (through rclpy) accepts each shipped file and reads the same
    values as config.load_yaml: no nested lists, no mixed-type lists, no nulls.
    """
    pytest.importorskip("rclpy", reason="rclpy (ROS 2) is not installed")
    import yaml

    from conftest import rcl_parameters

    for path in sorted((REPO / "config").glob("*.yaml")):
        if "/**" not in (yaml.safe_load(path.read_text()) or {}):
            continue        # another node's file (e.g. ros2_control's controller_manager parameters)
        assert _plain(rcl_parameters(path)) == _plain(config.load_yaml(path)), path.name


def _plain(x):
    if isinstance(x, dict):
        return {k: _plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)) or hasattr(x, "tolist"):
        return [_plain(v) for v in (x.tolist() if hasattr(x, "tolist") else x)]
    return x


def test_urdf_resolution_schemes(tmp_path):
    share = config.package_share()
    assert share is not None and (share / "urdf" / "diffsim_quadrotor.urdf").is_file()
    rel = config.resolve_urdf({"urdf": "urdf/diffsim_quadrotor.urdf"})
    pkg = config.resolve_urdf({"urdf": "package://diffsim_ros/urdf/diffsim_quadrotor.urdf"})
    absolute = config.resolve_urdf({"urdf": str(rel.resolve())})
    assert rel.resolve() == pkg.resolve() == absolute.resolve()
    with pytest.raises(ConfigError, match=r"f\.yaml: 'urdf': 'urdf/nope\.urdf' not found"):
        config.resolve_urdf({"urdf": "urdf/nope.urdf"}, "f.yaml")
    with pytest.raises(ConfigError, match="'urdf' must name a URDF file"):
        config.resolve_urdf({}, "f.yaml")
    with pytest.raises(ConfigError, match="'floating_base' must be true or false"):
        config.load_model({"urdf": "urdf/diffsim_quadrotor.urdf", "floating_base": "yes"})


# ------------------------------------------------------------------------ load_yaml forms
def test_load_yaml_forms(tmp_path):
    body = "urdf: urdf/diffsim_arm.urdf\nsimulator:\n  dt: 1e-3\n  gravity: [0.0, 0.0, -1.62]\n"
    wild = write(tmp_path, "/**:\n  ros__parameters:\n" + textwrap.indent(body, "    "), "wild.yaml")
    named = write(tmp_path, "diffsim_sim:\n  ros__parameters:\n" + textwrap.indent(body, "    "), "named.yaml")
    plain = write(tmp_path, body, "plain.yaml")
    ref = {"urdf": "urdf/diffsim_arm.urdf", "simulator": {"dt": 1e-3, "gravity": [0.0, 0.0, -1.62]}}
    for p in (wild, named, plain):
        params = config.load_yaml(p)
        assert params == ref, p.name
        assert isinstance(params["simulator"]["dt"], float)          # 1e-3 is a number, as in rcl
        cfg = config.simulator_config(params)
        assert cfg.dt == 1e-3 and cfg.gravity == (0.0, 0.0, -1.62)
    assert config.simulator_config({}) == physics.SimConfig()       # no section: defaults


def test_load_yaml_merges_sections_and_selects_a_node(tmp_path):
    p = write(tmp_path, """\
        /**:
          ros__parameters:
            simulator: {dt: 0.002, friction: 0.5}
        /robot/trainer:
          ros__parameters:
            simulator: {friction: 0.9}
        other_node:
          ros__parameters:
            simulator: {dt: 0.01}
        """)
    assert config.load_yaml(p, node="trainer")["simulator"] == {"dt": 0.002, "friction": 0.9}
    assert config.load_yaml(p, node="/robot/trainer")["simulator"] == {"dt": 0.002, "friction": 0.9}
    assert config.load_yaml(p)["simulator"] == {"dt": 0.01, "friction": 0.9}   # all, file order
    q = write(tmp_path, "a_node:\n  ros__parameters: {x: 1}\n", "q.yaml")
    with pytest.raises(ConfigError, match=r"q\.yaml: no parameters for node 'b_node'"):
        config.load_yaml(q, node="b_node")


@pytest.mark.parametrize("text, message", [
    ("/**:\n  ros__parameters:\n    simulator: {dt: 0.001\n", r"malformed YAML at line \d+, column \d+"),
    ("/**:\n  ros__parameters:\n\tsimulator: 1\n", r"malformed YAML"),
    ("/**:\n  urdf: x.urdf\n", r"section '/\*\*' has no 'ros__parameters'"),
    ("/**:\n  ros__parameters: {a: 1}\n  urdf: x.urdf\n", r"keys beside 'ros__parameters': urdf"),
    ("/**:\n  ros__parameters: [1, 2]\n", r"'/\*\*\.ros__parameters' must be a mapping, got list"),
    ("- 1\n- 2\n", r"the top level must be a mapping, got list"),
    ("", r"the file is empty"),
])
def test_load_yaml_errors_name_the_file(tmp_path, text, message):
    p = write(tmp_path, text, "broken_params.yaml")
    with pytest.raises(ConfigError, match=r"broken_params\.yaml: .*" + message):
        config.load_yaml(p)


def test_load_yaml_missing_file(tmp_path):
    with pytest.raises(ConfigError, match=r"absent\.yaml: cannot read parameter file"):
        config.load_yaml(tmp_path / "absent.yaml")


# ------------------------------------------------------------------------ SimConfig from YAML
def test_unknown_key_in_yaml_is_named(tmp_path):
    text = QUADROTOR_YAMLS["diffsim_quadrotor"].read_text().replace("      dt: 0.002", "      dtt: 0.002")
    assert "dtt:" in text
    p = write(tmp_path, text, "typo.yaml")
    params = config.load_yaml(p)
    with pytest.raises(ConfigError,
                       match=r"typo\.yaml: unknown key 'simulator\.dtt'; did you mean 'dt'\? \(known: .*\bdt\b"):
        config.simulator_config(params, str(p))
    text = QUADROTOR_YAMLS["diffsim_quadrotor"].read_text().replace("thrust_coefficient:", "thrust_coef:")
    params = config.load_yaml(write(tmp_path, text, "typo2.yaml"))
    with pytest.raises(ConfigError, match=r"unknown key 'simulator\.rotors\.thrust_coef'"):
        config.simulator_config(params)


@pytest.mark.parametrize("section, message", [
    ({"dt": "fast"}, r"'simulator\.dt' must be a number, got 'fast'"),
    ({"dt": -0.001}, r"'simulator\.dt' must be > 0 s, got -0\.001"),
    ({"dt": float("nan")}, r"'simulator\.dt' must be a finite number > 0, got nan"),
    ({"substeps": 0}, r"'simulator\.substeps' must be >= 1, got 0"),
    ({"substeps": 1.5}, r"'simulator\.substeps' must be an integer, got 1\.5"),
    ({"ground": 1}, r"'simulator\.ground' must be true or false"),
    ({"nan_check": "yes"}, r"'simulator\.nan_check' must be true or false"),
    ({"integrator": "euler"}, r"'simulator\.integrator' must be one of \('semi_implicit', 'rk4'\), got 'euler'"),
    ({"actuator": "thrust"}, r"'simulator\.actuator' must be one of"),
    ({"actuator": "ctbr"}, r"'simulator\.actuator' is 'ctbr', which needs a 'rotors' section"),
    ({"friction": -0.1}, r"'simulator\.friction' must be >= 0"),
    ({"friction_smoothing": 0.0}, r"'simulator\.friction_smoothing' must be > 0 m/s"),
    ({"command_delay": 2.5}, r"'simulator\.command_delay' must be an integer"),
    ({"command_delay": -1}, r"'simulator\.command_delay' must be >= 0"),
    ({"ground_normal": [0, 0, 0]}, r"'simulator\.ground_normal' must be a non-zero vector"),
    ({"kp": [1.0, -2.0]}, r"'simulator\.kp' entries must be >= 0 N m/rad"),
    ({"kp": "stiff"}, r"'simulator\.kp' must be a number"),
    ({"kp": [1.0, "a"]}, r"'simulator\.kp' entries must be a number, got 'a'"),
    ({"gravity": "down"}, r"'simulator\.gravity'"),
    ({"gravity": 9.81}, r"'simulator\.gravity'"),
    ({"rotors": [1, 2]}, r"'simulator\.rotors' must be a mapping, got list"),
])
def test_wrong_types_and_values_are_named(section, message):
    with pytest.raises(ConfigError, match=r"^cfg\.yaml: .*" + message):
        config.simulator_config({"simulator": section}, "cfg.yaml")


# ------------------------------------------------------------------------ rotors
ROTOR_OK = {"positions": [0.2, 0.0, 0.0, 0.0, 0.2, 0.0, -0.2, 0.0, 0.0, 0.0, -0.2, 0.0],
            "directions": [-1, 1, -1, 1]}


@pytest.mark.parametrize("change, message", [
    ({"directions": [-1, 1, -1]}, r"'simulator\.rotors\.directions' has 3 entries for 4 rotors"),
    ({"directions": [-1, 1, -1, 1, 1]}, r"has 5 entries for 4 rotors"),
    ({"directions": [-1, 2, -1, 1]}, r"'simulator\.rotors\.directions' entries must be one of \(-1\.0, 1\.0\)"),
    ({"directions": [-1, 0, -1, 1]}, r"entries must be one of \(-1\.0, 1\.0\), got 0"),
    ({"directions": [-1, "cw", -1, 1]}, r"'simulator\.rotors\.directions' entries must be a number, got 'cw'"),
    ({"positions": None}, r"'simulator\.rotors' needs 'rotor_links' or 'positions'"),
    ({"positions": [0.2, 0.0, 0.0, 0.0, 0.2]}, r"'simulator\.rotors\.positions' has 5 numbers, not a multiple of 3"),
    ({"positions": [[0.2, 0.0], [0.0, 0.2, 0.0]]}, r"'simulator\.rotors\.positions' every entry needs 3 numbers"),
    ({"positions": "front"}, r"'simulator\.rotors\.positions' must be a list"),
    ({"rotor_links": ["a", "b", "c", "d"]},
     r"'simulator\.rotors' has both 'rotor_links' and 'positions'; give one of them"),
    ({"thrust_coefficient": 0.0}, r"'simulator\.rotors\.thrust_coefficient' must be > 0"),
    ({"max_rotor_speed": -5.0}, r"'simulator\.rotors\.max_rotor_speed' must be > 0"),
    ({"motor_time_constant": -0.01}, r"'simulator\.rotors\.motor_time_constant' must be >= 0"),
    ({"drag_linear": [0.1, 0.1]}, r"'simulator\.rotors\.drag_linear' must have 3 entries"),
    ({"drag_quadratic": [0.1, -0.1, 0.1]}, r"'simulator\.rotors\.drag_quadratic' entries must be >= 0"),
    ({"rate_gain": "fast"}, r"'simulator\.rotors\.rate_gain' must be a number or a list of 3"),
    ({"spin": [1, 1, 1, 1]}, r"unknown key 'simulator\.rotors\.spin'"),
])
def test_rotor_config_validation(change, message):
    rotors = {k: v for k, v in {**ROTOR_OK, **change}.items() if v is not None}
    with pytest.raises(ConfigError, match=message):
        config.simulator_config({"simulator": {"actuator": "ctbr", "rotors": rotors}})


def test_rotor_config_direct_and_against_the_model():
    cfg = RotorConfig(positions=((0.1, 0.0, 0.0), (-0.1, 0.0, 0.0)), directions=(1.0, -1.0))
    cfg.validate()
    assert cfg.n == 2 and cfg.max_thrust == pytest.approx(1.0e-5 * 1500.0 ** 2)
    with pytest.raises(ConfigError, match="needs 'rotor_links' or 'positions'"):
        RotorConfig(directions=(1.0,)).validate()
    with pytest.raises(ConfigError, match=r"'rotors\.directions' has 1 entries for 2 rotors"):
        RotorConfig(positions=((0.1, 0.0, 0.0), (-0.1, 0.0, 0.0)), directions=(1.0,)).validate()
    # Links are checked against the URDF when the simulator is built.
    quad = physics.load_urdf(str(REPO / "urdf" / "diffsim_quadrotor.urdf"), floating_base=True)
    bad = {"rotor_links": ["rotor_0", "rotor_1", "rotor_2", "rotor_9"], "directions": [-1, 1, -1, 1]}
    with pytest.raises(ConfigError,
                       match=r"'simulator\.rotors\.rotor_links' names link 'rotor_9', which is not in the URDF"):
        physics.Simulator(quad, config.simulator_config({"simulator": {"actuator": "ctbr", "rotors": bad}}))
    arm = physics.load_urdf(str(REPO / "urdf" / "diffsim_arm.urdf"))
    with pytest.raises(ConfigError, match="rotors need a floating-base model"):
        physics.Simulator(arm, config.simulator_config({"simulator": {"actuator": "ctbr", "rotors": ROTOR_OK}}))
    # Rotor link positions are those of the URDF (X configuration, 0.17 m arms).
    sim = physics.Simulator(quad, config.simulator_config(config.load_yaml(QUADROTOR_YAMLS["diffsim_quadrotor"])))
    r = torch.linalg.vector_norm(sim.rotors.positions[:, :2], dim=-1)
    assert torch.allclose(r, torch.full_like(r, 0.17), atol=1e-4)


# ------------------------------------------------------------------------ values rejected up front
@pytest.mark.parametrize("section", [
    {"gravity": [0.0, -9.81]},                                            # 2 entries: RuntimeError at step
    {"ground_normal": [0.0, 0.0, 0.0]},                                   # only caught by Simulator()
    {"cylinder_rim_points": 0},                                          # ZeroDivisionError in Simulator()
    {"actuated_joints": "arm_joint1"},                                    # a string becomes its letters
    {"actuator": "ctbr", "rotors": {"rotor_links": "rotor_0", "directions": [1, -1, 1, -1, 1, -1, 1]}},
    {"actuator": "ctbr", "rotors": {"positions": [[0.1, 0.0, 0.0]], "directions": [1],
                                    "thrust_coefficient": True}},        # a bool taken as 1.0
])
def test_simconfig_rejects_bad_values_up_front(section):
    with pytest.raises(ConfigError):
        physics.SimConfig.from_mapping(section)
