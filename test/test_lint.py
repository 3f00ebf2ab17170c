"""The sources pass the lint a ``ros2 pkg create`` package starts with (ament_flake8: pycodestyle's
E and W, pyflakes' F), done with ruff under the repository's ruff.toml: ``ruff check .`` in the
repository root reports nothing.

ruff is a pinned test dependency (requirements.txt): where it is not installed the test fails,
telling to run scripts/bootstrap.sh; it is never skipped.
"""
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_ruff_check_reports_nothing():
    if importlib.util.find_spec("ruff") is None:
        pytest.fail(f"ruff is not installed in {sys.prefix}: run scripts/bootstrap.sh (requirements.txt pins it)")
    res = subprocess.run([sys.executable, "-m", "ruff", "check", "--output-format", "concise", "."],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, f"ruff check (ruff.toml) has findings:\n{res.stdout}{res.stderr}"
