"""plant/perturbation.py's text form, presets and conversions (issue 39 item 3 and 4).

``--perturb hardware`` takes the values of the robot's kind, fields after it replace them; the
text form reads numbers, lists and booleans as the schema does; a preset without a kind, an
unknown name and a bad value are errors naming them. The values a ROS parameter gets
(``ros_values``, mujoco_plant's ``perturbation_parameter``) are the declared types: one number
for sensor_noise is both entries, an integer is a double, null is the field's stand-in. The
preset is documented with its values in README.md and in the --perturb help.
"""
from __future__ import annotations

import array
import re

import pytest

from conftest import REPO_ROOT

from diffsim_ros.physics import ConfigError
from diffsim_ros.plant import PRESETS, Perturbation, parse_perturbation, resolve_perturbation
from diffsim_ros.plant.perturbation import KINDS, ros_values


def test_the_hardware_preset_per_kind_and_an_override():
    arm = resolve_perturbation("hardware", "arm")
    assert arm == {"mass_scale": 1.1, "latency": 0.01, "sensor_noise": [0.001, 0.01], "actuator_lag": 0.005}
    legged = resolve_perturbation("hardware", "legged")
    assert legged == dict(arm, ground_friction_scale=0.7)
    flying = resolve_perturbation("hardware", "multirotor")
    assert flying == {"mass_scale": 1.1, "latency": 0.01, "sensor_noise": [0.002, 0.02], "actuator_lag": 0.03}
    assert resolve_perturbation("hardware", "quadrotor") == flying          # the checkpoint's word for it
    over = resolve_perturbation("hardware,latency=0.015,sensor_noise=0.003", "multirotor")
    assert over == dict(flying, latency=0.015, sensor_noise=[0.003, 0.003])
    assert resolve_perturbation({"preset": "hardware", "mass_scale": 1.2}, "arm") == dict(arm, mass_scale=1.2)
    for kind in KINDS:                                                      # every preset is a valid perturbation
        Perturbation.from_mapping(resolve_perturbation("hardware", kind))
    assert set(PRESETS["hardware"]) == set(KINDS)


def test_the_main_jobs_default_is_a_preset_whose_actuator_is_the_hardware_ones():
    """The main job's default perturbation is a preset whose actuator is the hardware one's.

    The loop's default perturbation takes its values from the robot's kind: the hardware preset's
    mass error and slower actuator (a 5 ms joint torque lag for arms and legged robots, not the
    rotors' 30 ms), nothing of its latency, noise or floor; a multirotor also gets 50 % more drag.
    """
    from diffsim_ros.workflows.loop import DEFAULT_PERTURBATION

    assert set(PRESETS["default"]) == set(KINDS)
    for kind in KINDS:
        got = resolve_perturbation(DEFAULT_PERTURBATION, kind)
        Perturbation.from_mapping(got)
        hw = resolve_perturbation("hardware", kind)
        extra = {"drag_scale": 1.5} if kind == "multirotor" else {}
        assert got == dict({k: hw[k] for k in ("mass_scale", "actuator_lag")}, **extra), kind


def test_the_text_form_reads_numbers_lists_and_booleans():
    assert parse_perturbation("") == {} and resolve_perturbation("", "arm") == {} and resolve_perturbation(None) == {}
    assert parse_perturbation("hardware, latency=0.015") == {"preset": "hardware", "latency": 0.015}
    got = resolve_perturbation("sensor_noise=[0.001,0.01],wind_force=[0,0,1],constraint_friction=true,seed=3,"
                               "mass_scale=1,actuator_lag=null")
    assert got == {"sensor_noise": [0.001, 0.01], "wind_force": [0.0, 0.0, 1.0], "constraint_friction": True,
                   "seed": 3, "mass_scale": 1.0, "actuator_lag": None}
    assert isinstance(got["mass_scale"], float) and isinstance(got["seed"], int)
    # A Perturbation gives the fields it changes.
    assert resolve_perturbation(Perturbation(mass_scale=1.2, sensor_noise=0.01)) == {
        "mass_scale": 1.2, "sensor_noise": [0.01, 0.01]}


@pytest.mark.parametrize("text, kind, words", [
    ("hardwar", "arm", "'hardwar' is not a preset (presets: hardware, default) nor KEY=NUMBER"),
    ("mass_scale:1.2", "arm", "KEY=NUMBER"),
    ("mass_scal=1.2", "arm", "did you mean 'mass_scale'"),
    ("latency=fast", "arm", "KEY=NUMBER"),
    ("latency=-0.01", "arm", "'--perturb.latency' must be >= 0 s"),
    ("wind_force=1", "multirotor", "'--perturb.wind_force' must be a list of 3 numbers"),
    ("sensor_noise=[1,2,3]", "arm", "'--perturb.sensor_noise' must have 2 entries"),
    ("hardware,hardware", "arm", "one preset at most"),
    ("hardware", None, "the preset 'hardware' has values per robot kind"),
    ("hardware", "boat", "unknown robot kind 'boat'"),
])
def test_bad_text_is_an_error_naming_it(text, kind, words):
    with pytest.raises(ConfigError, match=re.escape(words)):
        resolve_perturbation(text, kind)


def test_ros_values_are_the_declared_types():
    """ROS values are the declared types.

    What the loop and excite hand mujoco_plant, and what the node makes of an override: the
    schema's value in the declared type (nodes/mujoco_plant.py declares perturbation.* from the
    schema's defaults: double arrays, doubles, an integer seed, -1.0 for null).
    """
    from diffsim_ros.nodes.mujoco_plant import PARAMETERS, perturbation_parameter

    declared = {name.split(".", 1)[1]: default for name, default, _ in PARAMETERS if name.startswith("perturbation.")}
    got = ros_values({"sensor_noise": 0.001, "latency": 0, "mass_scale": 1, "seed": 3.0, "actuator_lag": None,
                      "wind_force": (0, 0, 1), "constraint_friction": False})
    assert got == {"sensor_noise": [0.001, 0.001], "latency": 0.0, "mass_scale": 1.0, "seed": 3,
                   "actuator_lag": -1.0, "wind_force": [0.0, 0.0, 1.0], "constraint_friction": False}
    for key, val in got.items():
        d = declared[key]
        assert type(val) is type(d) and (not isinstance(d, list) or all(type(x) is float for x in val)), (key, val, d)
    # rclpy hands an override over as a number, a list or an array.array.
    assert perturbation_parameter("sensor_noise", 0.002) == [0.002, 0.002]
    assert perturbation_parameter("payload_offset", array.array("q", [0, 0, 1])) == [0.0, 0.0, 1.0]
    assert perturbation_parameter("latency", 0) == 0.0 and perturbation_parameter("seed", 4.0) == 4
    assert perturbation_parameter("contact_time_constant", -1) == -1.0
    with pytest.raises(ConfigError, match=re.escape("'perturbation.sensor_noise' must be a number or a list of 2")):
        perturbation_parameter("sensor_noise", "abc")
    with pytest.raises(ConfigError, match=re.escape("'perturbation.payload_offset' must be a list of 3 numbers")):
        perturbation_parameter("payload_offset", 0.1)


def test_coerce_value_converts_what_loses_nothing():
    """nodes.common.coerce_value: what every node's declare does to an override first."""
    from diffsim_ros.nodes.common import coerce_value

    assert coerce_value(1.0, 2) == 2.0 and type(coerce_value(1.0, 2)) is float
    assert coerce_value(0, 3.0) == 3 and type(coerce_value(0, 3.0)) is int
    assert coerce_value(0, 3.5) == 3.5                                     # left for declare to refuse
    assert coerce_value([0.0], [0, 0, 1]) == [0.0, 0.0, 1.0]
    assert coerce_value([0.0], array.array("q", [1, 2])) == [1.0, 2.0]
    assert coerce_value([0.0, 0.0], 0.5) == [0.5]
    assert coerce_value(1.0, "fast") == "fast" and coerce_value(True, 1) == 1 and coerce_value([""], ["a"]) == ["a"]


def test_the_preset_is_documented_with_its_values():
    """The preset is documented with its values.

    README.md (Evaluating a checkpoint) and the --perturb help of eval and loop give every
    value of the preset for every kind.
    """
    from diffsim_ros.workflows.evaluation import PERTURB_HELP

    readme = (REPO_ROOT / "README.md").read_text()
    section = readme[readme.index("### Evaluating a checkpoint"):]
    section = section[:section.index("\n### ", 5)]
    for kind, values in PRESETS["hardware"].items():
        assert f"| {kind}" in section or f"{kind}:" in section, kind
        for key, val in values.items():
            shown = f"[{val[0]:g},{val[1]:g}]" if isinstance(val, list) else f"{val:g}"
            assert f"{key}={shown}" in PERTURB_HELP.replace(" ", ""), (kind, key, shown)
            assert key in section and (shown.replace(",", ", ") in section or shown in section), (kind, key, shown)
