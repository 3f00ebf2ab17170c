"""Every node refuses a parameter outside its section's range or choices, by name, before it starts.

The nodes declare their parameters from schema sections (nodes.common.declare_all with
``section=``); nodes.common.check_section builds the section from the declared values. Drawn by
hypothesis: a node, one of its parameters with a lower bound or a set of values, and a value
outside it, which must be a StartupError naming that parameter; each node's defaults pass.
"""
from __future__ import annotations

import dataclasses
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from diffsim_ros.control import controller_settings
from diffsim_ros.nodes import common, replay, train_node, trajectory_recorder
from diffsim_ros.plant import plant_settings

SECTIONS = {"policy_controller": (controller_settings.PolicyControllerParameters, controller_settings.PARAMETERS),
            "mujoco_plant": (plant_settings.MujocoPlantParameters, plant_settings.PARAMETERS),
            "train_node": (train_node.TrainNodeParameters, train_node.PARAMETERS),
            "trajectory_recorder": (trajectory_recorder.TrajectoryRecorderParameters, trajectory_recorder.PARAMETERS),
            "replay": (replay.ReplayParameters, replay.PARAMETERS)}


def _defaults(table):
    return {k: v[0] for k, v in table.items()} if isinstance(table, dict) else {n: d for n, d, _ in table}


def _checked(cls):
    """(name, lower bound, bound allowed, choices) of the section's fields with a lower bound or choices."""
    out = []
    for f in dataclasses.fields(cls):
        m = f.metadata
        if m["low"] is not None or m["above"] is not None or m["choices"]:
            out.append((f.name, m["low"] if m["low"] is not None else m["above"], m["low"] is not None, m["choices"]))
    return out


@pytest.mark.parametrize("node", sorted(SECTIONS))
def test_the_defaults_pass(node):
    cls, table = SECTIONS[node]
    common.check_section(cls, _defaults(table))
    assert _checked(cls), f"{node}: no parameter with a range or choices"


@settings(max_examples=80, deadline=None)
@given(data=st.data())
def test_a_value_outside_its_range_or_choices_is_refused_by_name(data):
    node = data.draw(st.sampled_from(sorted(SECTIONS)))
    cls, table = SECTIONS[node]
    values = _defaults(table)
    name, low, inclusive, choices = data.draw(st.sampled_from(_checked(cls)))
    if choices:
        bad = data.draw(st.text(min_size=1, max_size=12).filter(lambda s: s not in choices))
    else:
        # Below the bound, or on it where the bound itself is excluded.
        below = data.draw(st.floats(min_value=1e-6, max_value=1e6, allow_nan=False))
        bad = low - below if inclusive else low - below * data.draw(st.sampled_from([0.0, 1.0]))
        default = values[name]
        bad = int(math.floor(bad)) if isinstance(default, int) and not isinstance(default, bool) else float(bad)
    values[name] = bad
    with pytest.raises(common.StartupError, match=f"parameter '{name}'"):
        common.check_section(cls, values)
