"""The set-up script (scripts/bootstrap.sh) and the pins it installs.

The bootstrap tests use a stub interpreter in a temporary folder, so they check
the script's decisions (what it installs, and when it does nothing) without
installing anything.
"""
import hashlib
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BOOTSTRAP = ROOT / "scripts" / "bootstrap.sh"


STUB_PYTHON = textwrap.dedent("""\
    #!/usr/bin/env bash
    # Stand-in interpreter: records how it was called; "import rclpy" succeeds
    # only when the file HAS_RCLPY exists next to the log.
    echo "$*" >> "$STUB_LOG"
    if [ "$1" = "-c" ]; then
        [ -f "$(dirname "$STUB_LOG")/HAS_RCLPY" ]
        exit $?
    fi
    exit 0
    """)


def _stub_venv(tmp_path, has_rclpy):
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    py = venv / "bin" / "python"
    py.write_text(STUB_PYTHON)
    py.chmod(0o755)
    if has_rclpy:
        (tmp_path / "HAS_RCLPY").touch()
    env = dict(os.environ, DIFFSIM_VENV=str(venv), STUB_LOG=str(tmp_path / "calls.log"))
    return venv, env


def _bootstrap(env):
    return subprocess.run(["bash", str(BOOTSTRAP)], env=env, capture_output=True,
                          text=True, timeout=60)


def _calls(tmp_path):
    log = tmp_path / "calls.log"
    return log.read_text().splitlines() if log.exists() else []


@pytest.mark.parametrize("has_rclpy", [False, True])
def test_bootstrap_installs_ros_wheels_only_without_rclpy(tmp_path, has_rclpy):
    venv, env = _stub_venv(tmp_path, has_rclpy)
    res = _bootstrap(env)
    assert res.returncode == 0, res.stderr
    calls = _calls(tmp_path)
    installs = [c for c in calls if c.startswith("-m pip install")]
    assert any(c.endswith("requirements.txt") for c in installs), calls
    assert any(c.endswith("-e " + str(ROOT)) for c in installs), calls
    ros = [c for c in installs if c.endswith("requirements-ros.txt")]
    assert (len(ros) == 0) if has_rclpy else (len(ros) == 1), calls
    assert (venv / ".diffsim_ros_stamp").is_file()


def test_bootstrap_second_run_does_nothing(tmp_path):
    venv, env = _stub_venv(tmp_path, has_rclpy=False)
    assert _bootstrap(env).returncode == 0
    n_first = len(_calls(tmp_path))
    res = _bootstrap(env)
    assert res.returncode == 0, res.stderr
    assert len(_calls(tmp_path)) == n_first, "second run called the interpreter again"
    assert res.stderr == ""


def test_bootstrap_reinstalls_when_requirements_change(tmp_path):
    venv, env = _stub_venv(tmp_path, has_rclpy=True)
    assert _bootstrap(env).returncode == 0
    (venv / ".diffsim_ros_stamp").write_text("stale\n")
    n_first = len(_calls(tmp_path))
    assert _bootstrap(env).returncode == 0
    assert len(_calls(tmp_path)) > n_first


def test_torch_is_pinned():
    reqs = (ROOT / "requirements.txt").read_text().splitlines()
    torch_lines = [r.strip() for r in reqs if re.match(r"\s*torch\b", r)]
    assert torch_lines == ["torch==2.13.0"]


def test_bootstrap_fast_path_on_this_venv():
    """Bootstrap's fast path on this venv installs nothing.

    The real venv running these tests: with its stamp current, a second
    bootstrap returns at once and installs nothing.
    """
    venv = Path(sys.prefix)
    stamp = venv / ".diffsim_ros_stamp"
    want = hashlib.sha256(b"".join((ROOT / f).read_bytes() for f in
                                   ("requirements.txt", "requirements-ros.txt", "setup.py"))
                          ).hexdigest()
    if not stamp.is_file() or stamp.read_text().strip() != want:
        pytest.skip(f"{venv} was not made (or is not current) by scripts/bootstrap.sh")
    before = stamp.stat().st_mtime_ns
    res = _bootstrap(dict(os.environ, DIFFSIM_VENV=str(venv)))
    assert res.returncode == 0, res.stderr
    assert res.stderr == "", res.stderr
    assert stamp.stat().st_mtime_ns == before
