"""policy_controller's own parameters are checked against their section before anything starts.

Every parameter of control/controller_settings.py's PolicyControllerParameters with a range or a
set of values, given a value outside it (drawn by hypothesis), is refused with a SetupError that
names the parameter; the defaults pass and read back unchanged.
"""
from __future__ import annotations

import dataclasses
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from diffsim_ros.control import controller_settings as cs
from diffsim_ros.errors import SetupError

DEFAULTS = {name: default for name, (default, _) in cs.PARAMETERS.items()}
#: (name, lower bound, whether the bound itself is allowed, choices) of every parameter of the section
#: with a lower bound or a set of values
CHECKED = [(f.name, f.metadata["low"] if f.metadata["low"] is not None else f.metadata["above"],
            f.metadata["low"] is not None, f.metadata["choices"])
           for f in dataclasses.fields(cs.PolicyControllerParameters)
           if f.metadata["low"] is not None or f.metadata["above"] is not None or f.metadata["choices"]]


def _values(**changed):
    values = dict(DEFAULTS, **changed)
    return lambda name: values[name]


def test_the_defaults_pass_and_read_back():
    got = cs.check_parameters(_values())
    for f in dataclasses.fields(cs.PolicyControllerParameters):
        want = DEFAULTS[f.name]
        assert getattr(got, f.name) == (tuple(want) if isinstance(want, list) else want), f.name
    assert {"watchdog_hz", "diagnostics_period_s", "predict_every", "executor"} <= {c[0] for c in CHECKED}


@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_a_value_outside_its_range_or_choices_is_refused_by_name(data):
    name, low, inclusive, choices = data.draw(st.sampled_from(CHECKED))
    default = DEFAULTS[name]
    if choices:
        bad = data.draw(st.text(min_size=1, max_size=12).filter(lambda s: s not in choices))
    else:
        # Below the bound, or on it where the bound itself is excluded.
        below = data.draw(st.floats(min_value=1e-6, max_value=1e6, allow_nan=False))
        bad = low - below if inclusive else low - below * data.draw(st.sampled_from([0.0, 1.0]))
        if isinstance(default, int) and not isinstance(default, bool):
            bad = int(math.floor(bad))
        else:
            bad = float(bad)
    with pytest.raises(SetupError, match=f"parameter '{name}'"):
        cs.check_parameters(_values(**{name: bad}))
