#!/usr/bin/env bash
# Create or update the project's local virtual environment (.venv) with pinned
# versions. Idempotent: a stamp file records the hash of the requirement files,
# so a second run with nothing changed returns at once.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${DIFFSIM_VENV:-$ROOT/.venv}"
PY="${PYTHON:-python3}"

if [ ! -x "$VENV/bin/python" ]; then
    echo "[bootstrap] creating $VENV" >&2
    "$PY" -m venv "$VENV"
fi
STAMP="$VENV/.diffsim_ros_stamp"
WANT="$(cat "$ROOT/requirements.txt" "$ROOT/requirements-ros.txt" "$ROOT/setup.py" | sha256sum | cut -d' ' -f1)"
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$WANT" ]; then
    exit 0
fi
echo "[bootstrap] installing pinned dependencies into $VENV" >&2
"$VENV/bin/python" -m pip install --quiet --disable-pip-version-check -r "$ROOT/requirements.txt"
# ROS 2 client libraries: only when no rclpy is importable (a sourced ROS 2
# install provides its own, which must win).
if ! "$VENV/bin/python" -c "import rclpy" >/dev/null 2>&1; then
    echo "[bootstrap] rclpy not importable: installing the ROS 2 wheels" >&2
    "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check -r "$ROOT/requirements-ros.txt"
fi
"$VENV/bin/python" -m pip install --quiet --disable-pip-version-check --no-deps --no-build-isolation -e "$ROOT"
echo "$WANT" > "$STAMP"
