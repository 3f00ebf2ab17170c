#!/usr/bin/env bash
# Run the test suite: bootstrap the local .venv (pinned versions; a no-op when
# nothing changed), then pytest over test/. Extra arguments go to pytest, e.g.
#   scripts/test.sh -k urdf -x
#   scripts/test.sh test/plant/test_mujoco_plant.py::test_arm_position_commands_match_simulator   # only that file or test
# When an argument names a test file or folder (test/..., *.py), pytest runs only that; test/
# is laid out like the package, so e.g. `scripts/test.sh test/nodes` runs the nodes' tests.
# The tests run in DIFFSIM_TEST_WORKERS pytest-xdist worker processes (default 2, one per
# core of the CI machine; 0 runs them in this process, as plain pytest does).
# Exit status is pytest's; "no tests collected" (pytest's 5) is a failure too. The 25 slowest
# tests are listed at the end (the suite is meant to stay under 20 minutes on 2 cores).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${DIFFSIM_VENV:-$ROOT/.venv}"
cd "$ROOT"
"$ROOT/scripts/bootstrap.sh"
# The venv is an ament prefix (ROS wheels, the launch tooling, this package: see bootstrap.sh).
case ":${AMENT_PREFIX_PATH:-}:" in
    *":$VENV:"*) ;;
    *) export AMENT_PREFIX_PATH="$VENV${AMENT_PREFIX_PATH:+:$AMENT_PREFIX_PATH}" ;;
esac
targets=(test)
for arg in "$@"; do
    path="${arg%%::*}"
    if [[ "$path" == test || "$path" == test/* || "$path" == *.py ]] && [ -e "$path" ]; then
        targets=()
        break
    fi
done
workers="${DIFFSIM_TEST_WORKERS:-2}"
rc=0
"$VENV/bin/python" -m pytest -n "$workers" --dist worksteal --durations=25 ${targets[@]+"${targets[@]}"} -q "$@" \
    || rc=$?
if [ "$rc" -eq 5 ]; then
    echo "[test] pytest collected no tests: treating this as a failure" >&2
fi
exit "$rc"
