"""The configuration schema (diffsim_ros/schema.py), for every section it declares.

Every wrong value names its full key path, a typo gets the nearest key, a key of another
section names that section, the ROS form of the defaults reads back as the defaults, and
doc/parameters.md is what the schema generates.

Sections, fields and bad values are drawn by hypothesis over all registered sections (its
seed is printed on failure and replays with --hypothesis-seed).
"""
from __future__ import annotations

import dataclasses
import math
import typing
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from diffsim_ros import config, reference
from diffsim_ros.physics import ConfigError
from diffsim_ros import schema

REPO = Path(__file__).resolve().parents[1]
SECTIONS = reference._sections()
TOP = {name: cls for name, cls in SECTIONS.items() if "." not in name}


def _fields():
    """(section path, section class, field name, type, metadata) of every field of every section."""
    out = []
    for name, cls in SECTIONS.items():
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            out.append((name, cls, f.name, hints[f.name], f.metadata))
    return out


FIELDS = _fields()


def _top_mapping(path: str, key: str, value):
    """Build the mapping for the top-level section of ``path`` that puts ``value`` at ``path.key``.

    Nested sections get a minimal valid parent: a quadrotor's rotors need a layout.
    """
    parts = path.split(".")
    inner = {key: value}
    if parts[1:] == ["rotors"]:
        base = {"positions": [0.1, 0, 0, -0.1, 0, 0], "directions": [1, -1]}
        inner = {**base, key: value}
        return parts[0], {"actuator": "ctbr", "rotors": inner}
    return parts[0], inner


def _wrong_values(tp) -> list:
    """Values that are not of type ``tp`` (as a YAML file could hold them)."""
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin is typing.Union:
        if any(dataclasses.is_dataclass(a) for a in args):
            return [[1, 2], "text", 3.0]
        if type(None) in args:                       # None is fine; a mapping never is
            return [{"a": 1}]
        return [{"a": 1}, "text"]
    if dataclasses.is_dataclass(tp):
        return [[1, 2], "text", 3.0]
    if origin in (tuple, typing.Tuple):
        return [{"a": 1}, "text", [{"a": 1}]]
    if tp is bool:
        return [1, "yes", 0.0]
    if tp is int:
        return ["3", 1.5, True, [1]]
    if tp is float:
        return ["fast", True, [1.0], math.nan, math.inf]
    if tp is str:
        return [3, True, ["a"]]
    raise AssertionError(f"no wrong values for {tp}")


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_every_wrong_value_names_its_key_path(data):
    path, cls, key, tp, _ = data.draw(st.sampled_from(FIELDS), label="field")
    bad = data.draw(st.sampled_from(_wrong_values(tp)), label="value")
    top, mapping = _top_mapping(path, key, bad)
    with pytest.raises(ConfigError) as err:
        TOP[top].from_mapping(mapping)
    assert f"'{path}.{key}'" in str(err.value), str(err.value)
    assert err.value.key.startswith(f"{path}.{key}")
    # Read from a file, the file's name leads.
    source_named = err.value.at("robot.yaml")
    assert str(source_named).startswith("robot.yaml: ") and f"'{path}.{key}'" in str(source_named)


@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_out_of_range_values_name_the_key_and_the_range(data):
    ranged = [f for f in FIELDS if schema._bounds(f[4]) and f[3] in (int, float)]
    path, cls, key, tp, meta = data.draw(st.sampled_from(ranged), label="field")
    lo = meta.get("above") if meta.get("above") is not None else meta.get("low")
    hi = meta.get("high")
    choices = []
    if lo is not None:
        choices.append(lo - data.draw(st.sampled_from([1, 2, 10]), label="below") if tp is int
                       else (lo if meta.get("above") is not None else lo - data.draw(
                           st.floats(1e-6, 1e6), label="below")))
    if hi is not None:
        choices.append(hi + (1 if tp is int else data.draw(st.floats(1e-6, 1e6), label="above")))
    bad = data.draw(st.sampled_from(choices), label="value")
    top, mapping = _top_mapping(path, key, bad)
    with pytest.raises(ConfigError) as err:
        TOP[top].from_mapping(mapping)
    text = str(err.value)
    assert f"'{path}.{key}' must be {schema._bounds(meta)}" in text, text


@settings(max_examples=100, deadline=None)
@given(data=st.data())
def test_a_typo_gets_the_nearest_key(data):
    path, cls, key, _, _ = data.draw(st.sampled_from([f for f in FIELDS if len(f[2]) >= 5]), label="field")
    i = data.draw(st.integers(0, len(key) - 1), label="dropped")
    typo = key[:i] + key[i + 1:]
    known = [f.name for f in dataclasses.fields(cls)]
    if typo in known:
        return
    top, mapping = _top_mapping(path, typo, 1)
    with pytest.raises(ConfigError) as err:
        TOP[top].from_mapping(mapping)
    text = str(err.value)
    assert f"unknown key '{path}.{typo}'" in text and "did you mean" in text, text
    suggested = text.split("did you mean ", 1)[1].split("?")[0]
    # The key itself, or another one just as close (a tie, e.g. 'kp' and 'kd' for 'k').
    import difflib

    best = max(difflib.SequenceMatcher(None, typo, k).ratio() for k in known)
    assert f"'{key}'" in suggested or difflib.SequenceMatcher(None, typo, key).ratio() < best, text


def test_a_key_of_another_section_names_that_section():
    with pytest.raises(ConfigError, match=r"unknown key 'simulator\.learning_rate'; it is a key of 'training', "
                                          r"'ppo' and 'sac'"):
        config.simulator_config({"simulator": {"learning_rate": 1e-3}}, "hover.yaml")
    with pytest.raises(ConfigError, match=r"unknown key 'training\.dt'; it is a key of 'simulator'"):
        SECTIONS["training"].from_mapping({"dt": 0.01})
    with pytest.raises(ConfigError, match=r"hover\.yaml: unknown key 'learning_rate'; it is a key of 'training'"):
        config.check_keys({"learning_rate": 1e-3}, source="hover.yaml")


@pytest.mark.parametrize("name", sorted(TOP))
def test_the_ros_form_of_the_defaults_reads_back_as_the_defaults(name):
    """The ROS form of the defaults reads back as the defaults.

    What a node declares (schema.ros_parameters: lists for tuples, ros_null for None), given
    back as a mapping, is the section's default, so a node started with no override runs the
    defaults; the description of each names its type and default.
    """
    cls = TOP[name]
    params = [p for p in schema.ros_parameters(cls, name) if not p[0].startswith(f"{name}.rotors.")]
    flat = {p[0]: p[1] for p in params}
    mapping = config.unflatten(flat)[name]
    if name == "perturbation":
        read = cls.from_mapping(mapping)
    else:
        read = cls.from_mapping(mapping, name)
    assert read == cls()
    for pname, default, text in params:
        assert "default: " in text and "[" in text, (pname, text)


def test_a_nested_rotor_layout_reads_from_the_flat_ros_list_and_from_triples():
    flat = {"actuator": "ctbr", "rotors": {"positions": [0.1, 0, 0, -0.1, 0, 0], "directions": [1, -1]}}
    triples = {"actuator": "ctbr", "rotors": {"positions": [[0.1, 0, 0], [-0.1, 0, 0]], "directions": [1, -1]}}
    a, b = SECTIONS["simulator"].from_mapping(flat), SECTIONS["simulator"].from_mapping(triples)
    assert a == b and a.rotors.positions == ((0.1, 0.0, 0.0), (-0.1, 0.0, 0.0))


def test_errors_keep_their_type_and_pickle():
    import pickle

    from diffsim_ros.control.excitation import ExcitationError

    with pytest.raises(ExcitationError) as err:
        SECTIONS["excitation"].from_mapping({"amplitude": 2.0})
    assert str(err.value) == "'excitation.amplitude' must be in (0, 1], got 2.0"
    back = pickle.loads(pickle.dumps(err.value.at("f.yaml")))
    assert type(back) is ExcitationError and str(back) == "f.yaml: 'excitation.amplitude' must be in (0, 1], got 2.0"


def test_the_parameter_reference_is_current():
    """The parameter reference is current.

    doc/parameters.md is generated from the schema; regenerate with
    `python -m diffsim_ros.reference > doc/parameters.md`.
    """
    want = reference.parameter_reference()
    have = (REPO / "doc" / "parameters.md").read_text()
    assert have == want, "doc/parameters.md is stale: run `python -m diffsim_ros.reference > doc/parameters.md`"
    for name, cls in TOP.items():
        for e in schema.entries(cls, name):
            assert f"| `{e.name}` |" in have


@pytest.mark.parametrize("kind", ["reach", "quadrotor", "locomotion"])
def test_task_parameters_export_and_rebuild(kind):
    """A task rebuilt from its own export has the same parameters; a wrong value names its key."""
    from diffsim_ros.tasks import make_task

    path = {"reach": "config/reach_arm.yaml", "quadrotor": "config/hover.yaml",
            "locomotion": "config/locomotion.yaml"}[kind]
    params, task, model = config.load_training_file(REPO / path)
    exported = task.export_parameters()
    assert exported["type"] == kind and set(exported) - {"type"} == set(type(task).parameter_names())
    again = make_task(model, task.sim_config, exported)
    assert again.export_parameters() == exported
    with pytest.raises(ConfigError, match=r"'task\.horizon' must be an integer, got 'long'"):
        make_task(model, task.sim_config, {**exported, "horizon": "long"})
    with pytest.raises(ConfigError, match=r"unknown key 'task\.horizn'; did you mean 'horizon'\?"):
        make_task(model, task.sim_config, {**exported, "horizn": 10})


@pytest.mark.parametrize("launch_file", ["train.launch.py", "deploy.launch.py"])
def test_the_launch_argument_tables_are_current(launch_file):
    """The launch argument tables are current.

    launch/README.md's argument tables are the launch files' ARGUMENTS (what
    `ros2 launch --show-args` prints); regenerate with `python -m diffsim_ros.reference --update`.
    """
    readme = REPO / "launch" / "README.md"
    have = readme.read_text()
    assert f"<!-- arguments: {launch_file} -->" in have
    assert have == reference.update_launch_readme(readme), "launch/README.md is stale: run " \
        "`python -m diffsim_ros.reference --update`"
    for name, default, _ in reference.launch_arguments(REPO / "launch" / launch_file):
        assert f"| `{name}` | `{default or chr(34) * 2}` |" in have


def test_node_sections_stay_out_of_the_training_file():
    """A node's parameter section is no home for a training file's key, and its list types reach ROS.

    ``seed`` is a key of the training file's ``training`` section and a parameter of train_node: a
    stray ``seed`` in a task section names ``training`` only. The list parameters' element types
    come from the sections' field types.
    """
    from diffsim_ros.control import controller_settings
    from diffsim_ros.nodes import train_node  # noqa: F401 - registers its section, if it registered one

    assert "train_node" not in schema.sections() and "policy_controller" not in schema.sections()
    message = str(schema.unknown_key("seed", ["mode", "speed"], "task"))
    assert "'training'" in message and "train_node" not in message, message
    assert controller_settings.ARRAY_TYPES == {"controller_joints": "string", "target": "double",
                                               "workspace_min": "double", "workspace_max": "double"}
