#!/usr/bin/env bash
# Run the main job: bootstrap the local .venv (pinned versions; a no-op when
# nothing changed), then `diffsim-ros loop`: train a quadrotor hover policy by
# gradients through the simulator, deploy it on the MuJoCo stand-in over ROS 2
# (separate processes, DDS), record a rosbag2 (MCAP), and print the sim-vs-real
# summary. Extra arguments go to `diffsim-ros loop`, e.g.
#   scripts/run.sh --out runs/first --perturb mass_scale=1.2,drag_scale=2
#   scripts/run.sh --checkpoint policies/hover      # skip training
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${DIFFSIM_VENV:-$ROOT/.venv}"
"$ROOT/scripts/bootstrap.sh"
# The venv is an ament prefix (ROS wheels, the launch tooling, this package: see bootstrap.sh).
case ":${AMENT_PREFIX_PATH:-}:" in
    *":$VENV:"*) ;;
    *) export AMENT_PREFIX_PATH="$VENV${AMENT_PREFIX_PATH:+:$AMENT_PREFIX_PATH}" ;;
esac
cd "$ROOT"
exec "$VENV/bin/diffsim-ros" loop "$@"
