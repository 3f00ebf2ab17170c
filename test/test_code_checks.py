"""The sources pass the code checks of a ``ros2 pkg create`` package and a static type check.

Each check runs in the repository root under the repository's own configuration and reports
nothing:

- lint: ``ruff check .`` under ruff.toml (ament_flake8's set: pycodestyle's E and W, pyflakes'
  F, at 120 columns; ament_pep257's: pydocstyle's D rules under the pep257 convention, no
  docstring required);
- types: ``mypy`` under mypy.ini (the physics core, the schema and the workflows layer,
  diffsim_ros/workflows; every ``# type: ignore[code]`` there names its code and says why, and an
  ignore or a cast no longer needed is itself a finding).

Both tools are pinned test dependencies (requirements.txt): where one is not installed its test
fails, telling to run scripts/bootstrap.sh; it is never skipped.
"""
import importlib.util
import subprocess
import sys

import pytest

from conftest import REPO_ROOT


@pytest.mark.parametrize("tool, args, config", [
    ("ruff", ["check", "--output-format", "concise", "."], "ruff.toml"),
    ("mypy", [], "mypy.ini"),
])
def test_the_code_check_reports_nothing(tool, args, config):
    if importlib.util.find_spec(tool) is None:
        pytest.fail(f"{tool} is not installed in {sys.prefix}: run scripts/bootstrap.sh (requirements.txt pins it)")
    res = subprocess.run([sys.executable, "-m", tool, *args], cwd=REPO_ROOT, capture_output=True, text=True,
                         timeout=600)
    assert res.returncode == 0, f"{tool} ({config}) has findings:\n{res.stdout}{res.stderr}"
