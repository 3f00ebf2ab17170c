#!/usr/bin/env bash
# Run the main job: bootstrap the local .venv (pinned versions; a no-op when
# nothing changed), then `diffsim-ros demo`. Extra arguments go to the demo, e.g.
#   scripts/run.sh --urdf path/to/robot.urdf --batch 4096 --dtype float32
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${DIFFSIM_VENV:-$ROOT/.venv}"
"$ROOT/scripts/bootstrap.sh"
exec "$VENV/bin/diffsim-ros" demo "$@"
