"""Shared test helpers (keep this file small and additive).

Plain functions are importable as ``from conftest import ...``; the fixtures
wrap them and skip with a stated reason when something is not installed.
"""
from __future__ import annotations

import os
import random
from pathlib import Path
from typing import Dict, Optional

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
URDF_DIR = REPO_ROOT / "urdf"

# The project's own robot descriptions (primitive collision geometry only).
PROJECT_URDFS: Dict[str, Path] = {
    "arm": URDF_DIR / "diffsim_arm.urdf",
    "arm_xacro": URDF_DIR / "diffsim_arm.urdf.xacro",
    "quadrotor": URDF_DIR / "diffsim_quadrotor.urdf",
    "quadruped": URDF_DIR / "diffsim_quadruped.urdf",
}


def drawn_seed(name: str, env: str, bits: int = 32) -> int:
    """Draw a seed afresh for each run (``bits`` random bits), or take the one in ``env``.

    The environment variable ``env`` holds a replay's seed; the seed is printed with the line
    that replays it.
    """
    given = os.environ.get(env)
    seed = int(given) if given else int.from_bytes(os.urandom(bits // 8), "little")
    print(f"{name}: seed {seed} (replay: {env}={seed})")
    return seed


def drawn_away(rng, lo: float, hi: float, nominal: float, gap: float) -> float:
    """Draw ``rng`` uniform in [lo, hi] at least ``gap`` from ``nominal``.

    A perturbation the identification must find, not one it could miss by staying put.
    """
    while True:
        x = float(rng.uniform(lo, hi))
        if abs(x - nominal) >= gap:
            return x


def example_robot_data_dir() -> Optional[Path]:
    """Find the ``example-robot-data/robots`` folder of the pip package, or None.

    Its URDFs name meshes ``package://example-robot-data/robots/...``; the
    package folder is ``<...>/cmeel.prefix/share/example-robot-data``.
    """
    from diffsim_ros.robot_data import example_robot_data_dirs

    found = example_robot_data_dirs()
    return Path(found[0]) if found else None


@pytest.fixture(scope="session")
def robots_dir() -> Path:
    """example-robot-data's robots folder; skips the test when it is not installed."""
    d = example_robot_data_dir()
    if d is None:
        pytest.skip("example-robot-data (pip package 'example-robot-data') is not installed")
    return d


@pytest.fixture(scope="session")
def project_urdfs() -> Dict[str, Path]:
    """Paths of the project's own URDFs (see PROJECT_URDFS)."""
    return dict(PROJECT_URDFS)


# One torch thread for the whole suite: the machines running it have two shared
# cores, and torch's intra-op threads then contend badly (see bench/dynamics.py).
# Inductor compiles in one process too: its default pool (one compile process per core)
# held both cores during a cold compile while the other worker's timed ROS tests starved.
os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")
import torch as _torch  # noqa: E402

_torch.set_num_threads(1)


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """Every test module runs on one intra-op thread.

    Small batches are faster without OpenMP barriers on a busy machine; this holds whatever a
    test before it set (test_compiled compiles with two).
    """
    n = _torch.get_num_threads()
    _torch.set_num_threads(1)
    yield
    _torch.set_num_threads(n)


def console_script(name: str) -> str:
    """Find the console script ``name`` next to this interpreter, else on PATH (the loop's lookup)."""
    from diffsim_ros.workflows.loop import console_script as lookup

    return lookup(name)


def interrupt(proc, timeout: float = 20.0) -> None:
    """Stop a node process as Ctrl-C does (SIGINT), killing it if it has not ended ``timeout`` s later."""
    import signal
    import subprocess

    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def spin_until(ex, cond, timeout: float) -> bool:
    """Spin the executor ``ex`` until ``cond()`` holds (True) or ``timeout`` s have passed (False)."""
    import time

    end = time.monotonic() + timeout
    while time.monotonic() < end:
        ex.spin_once(timeout_sec=0.01)
        if cond():
            return True
    return False


def ros_context(domain: int):
    """Yield an rclpy context of its own on ``domain``, shut down after: a generator for a module fixture."""
    import rclpy

    ctx = rclpy.context.Context()
    rclpy.init(context=ctx, domain_id=domain)
    try:
        yield ctx
    finally:
        rclpy.shutdown(context=ctx)


def ros_domain(span: int = 1) -> int:
    """Draw a random ROS_DOMAIN_ID d with d .. d + span - 1 used by this pytest process alone.

    The suite runs in pytest-xdist workers (scripts/test.sh): each worker draws from its
    own slice of 1..200, so tests running at the same time never share a DDS domain;
    within one worker the tests run one after another.
    """
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")[2:]
    count = max(1, int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")))
    size = 200 // count
    if size < span:
        raise RuntimeError(f"{count} pytest workers leave {size} ROS domains each, fewer than the {span} asked for")
    lo = 1 + (int(worker) if worker.isdigit() else 0) * size
    return random.randint(lo, lo + size - span)


def rcl_parameters(path, node: str = "diffsim_param_file_check") -> dict:
    """Read the parameters rcl's own parser reads from the ROS 2 parameter file ``path``.

    The parameters are for a node named ``node`` (read through rclpy, the node declaring its
    overrides), nested as config.load_yaml gives them, arrays as lists.
    """
    import rclpy
    from rclpy.node import Node

    from diffsim_ros import config

    ctx = rclpy.Context()
    rclpy.init(args=["--ros-args", "--params-file", str(path)], context=ctx)
    try:
        node = Node(node, context=ctx, start_parameter_services=False,
                    automatically_declare_parameters_from_overrides=True)
        try:
            flat = {n: p.value for n, p in node._parameters.items()
                    if n not in ("use_sim_time", "start_type_description_service")}
        finally:
            node.destroy_node()
    finally:
        rclpy.shutdown(context=ctx)
    return config.unflatten({k: (list(v) if hasattr(v, "__len__") and not isinstance(v, str) else v)
                             for k, v in flat.items()})


def write_params(path, params: dict) -> Path:
    """``params`` as a ROS 2 parameter file (``/**: ros__parameters:``) at ``path``."""
    import yaml

    path = Path(path)
    path.write_text(yaml.safe_dump({"/**": {"ros__parameters": params}}, sort_keys=False))
    return path


def run_main(capsys, *argv):
    """``diffsim-ros ARGV`` in this process: (exit status, stdout, stderr)."""
    from diffsim_ros.cli import main

    rc = main([str(a) for a in argv])
    cap = capsys.readouterr()
    return rc, cap.out, cap.err


def csv_rows(path) -> list:
    """Read the rows of a training.csv, as written (strings)."""
    import csv

    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def without_time(rows) -> list:
    """Return the rows as written, less wall_time (the one column two runs cannot share)."""
    return [{k: v for k, v in r.items() if k != "wall_time"} for r in rows]


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: a test of more than about 30 s (training runs); "
                                       "deselect with -m 'not slow' for a quick pass")
    config.addinivalue_line("markers", "ros: starts ROS 2 nodes, DDS or the ros2 CLI (rclpy, launch); "
                                       "-m 'not ros' runs the rest")


#: Fixtures that bring up the ROS 2 tooling: a test using one is a ``ros`` test.
ROS_FIXTURES = frozenset({"ros_tooling", "deployment"})


def pytest_collection_modifyitems(config, items):
    for item in items:
        if ROS_FIXTURES.intersection(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.ros)
    # The slow tests first (a stable sort: each keeps its place among its kind): pytest-xdist's
    # worksteal hands each worker a contiguous share and lets an idle one take from the end of
    # another's, so with the long tests at the front both workers end on short ones instead of
    # one waiting out a training run that started last.
    items[:] = sorted(items, key=lambda item: item.get_closest_marker("slow") is None)
