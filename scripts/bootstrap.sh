#!/usr/bin/env bash
# Create or update the project's local virtual environment (.venv) with pinned
# versions. Idempotent: a stamp file records the hash of the requirement files,
# so a second run with nothing changed returns at once.
#
# Environment:
#   DIFFSIM_VENV  where the venv lives (default: <repo>/.venv)
#   PYTHON        interpreter that creates it. Default: python3 when it can
#                 import rclpy (a sourced ROS 2 install, whose rclpy is built
#                 for that interpreter), else python3.11 if present (the ROS 2
#                 wheels are built for CPython 3.11), else python3.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${DIFFSIM_VENV:-$ROOT/.venv}"
STAMP="$VENV/.diffsim_ros_stamp"

if [ ! -x "$VENV/bin/python" ]; then
    if [ -n "${PYTHON:-}" ]; then
        PY="$PYTHON"
    elif python3 -c "import rclpy" >/dev/null 2>&1; then
        PY=python3
    elif command -v python3.11 >/dev/null 2>&1; then
        PY=python3.11
    else
        PY=python3
    fi
    echo "[bootstrap] creating $VENV with $("$PY" --version 2>&1)" >&2
    "$PY" -m venv "$VENV"
    rm -f "$STAMP"   # a re-created venv is never trusted to hold the packages
fi
WANT="$(cat "$ROOT/requirements.txt" "$ROOT/requirements-ros.txt" "$ROOT/setup.py" | sha256sum | cut -d' ' -f1)"
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$WANT" ]; then
    exit 0
fi
echo "[bootstrap] installing pinned dependencies into $VENV (first run: a few minutes, ~2 GB)" >&2
"$VENV/bin/python" -m pip install --quiet --disable-pip-version-check -r "$ROOT/requirements.txt"
# ROS 2 client libraries: only when no rclpy is importable (a sourced ROS 2
# install provides its own, which must win).
if ! "$VENV/bin/python" -c "import rclpy" >/dev/null 2>&1; then
    echo "[bootstrap] rclpy not importable: installing the ROS 2 wheels" >&2
    "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check -r "$ROOT/requirements-ros.txt"
fi
"$VENV/bin/python" -m pip install --quiet --disable-pip-version-check --no-deps --no-build-isolation -e "$ROOT"
echo "$WANT" > "$STAMP"
echo "[bootstrap] done" >&2
