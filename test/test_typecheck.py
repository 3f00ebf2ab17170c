"""The physics core (diffsim_ros/physics) passes a static type check: ``mypy`` in the repository
root, under the repository's mypy.ini (which names the files, the Python version and the
third-party modules without types), reports nothing. Every ``# type: ignore[code]`` in the
checked files names its error code and says why; an ignore or a cast that is no longer needed
is itself a finding.

mypy is a pinned test dependency (requirements.txt): where it is not installed the test fails,
telling to run scripts/bootstrap.sh; it is never skipped.
"""
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_mypy_reports_nothing():
    if importlib.util.find_spec("mypy") is None:
        pytest.fail(f"mypy is not installed in {sys.prefix}: run scripts/bootstrap.sh (requirements.txt pins it)")
    res = subprocess.run([sys.executable, "-m", "mypy"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, f"mypy (mypy.ini) has findings:\n{res.stdout}{res.stderr}"
