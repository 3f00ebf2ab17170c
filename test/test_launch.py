"""Launch files (launch/*.launch.py).

Here (no ``launch``/``launch_ros``/``launch_pytest`` installable): each launch file
parses as Python, defines ``generate_launch_description``, and names only
console scripts that setup.py declares and config files that exist; its launch
arguments all have a description.

With the ROS 2 tooling (scripts/bootstrap.sh installs it into the venv and registers the
package in the venv's ament index; in CI none of these skip): the real `ros2 launch diffsim_ros
deploy.launch.py target:=mujoco` for the arm and the quadrotor (commands flow, `ros2 param get`,
`ros2 topic echo --once`, `ros2 service call` of the e-stop, Ctrl-C shuts every process down cleanly
and the bag holds every command), and train.launch.py under launch_pytest until it exits 0.
Each deployment runs on a ROS domain of its own with its own `ros2 daemon`, stopped afterwards.
"""
from __future__ import annotations

import ast
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, Optional

import numpy as np

import pytest

from conftest import REPO_ROOT, ros_domain

from diffsim_ros.workflows.loop import launch_unavailable, ros2_executable

LAUNCH_DIR = REPO_ROOT / "launch"
LAUNCH_FILES = sorted(LAUNCH_DIR.glob("*.launch.py"))
PACKAGE = "diffsim_ros"


def console_scripts():
    tree = ast.parse((REPO_ROOT / "setup.py").read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Dict):
            for k, v in zip(node.keys, node.values):
                if isinstance(k, ast.Constant) and k.value == "console_scripts":
                    return {ast.literal_eval(e).split("=")[0].strip() for e in v.elts}
    raise AssertionError("setup.py declares no console_scripts")


def test_launch_files_exist():
    names = {p.name for p in LAUNCH_FILES}
    assert {"train.launch.py", "deploy.launch.py"} <= names


@pytest.mark.parametrize("path", LAUNCH_FILES, ids=lambda p: p.name)
def test_launch_file_parses_and_references_existing_things(path):
    src = path.read_text()
    tree = ast.parse(src, filename=str(path))
    funcs = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
    assert "generate_launch_description" in funcs
    scripts = console_scripts()
    # Every Node(package="diffsim_ros", executable=...) names a declared console script.
    ours = 0
    for call in ast.walk(tree):
        if isinstance(call, ast.Call) and getattr(call.func, "id", getattr(call.func, "attr", "")) == "Node":
            kw = {k.arg: k.value for k in call.keywords}
            pkg = kw.get("package")
            if isinstance(pkg, ast.Name) and pkg.id == "PACKAGE" or \
                    isinstance(pkg, ast.Constant) and pkg.value == PACKAGE:
                exe = kw["executable"]
                assert isinstance(exe, ast.Constant), f"{path.name}: executable must be a literal"
                assert exe.value in scripts, f"{path.name}: '{exe.value}' is not a console script in setup.py"
                ours += 1
    assert ours >= 1
    # Every config/*.yaml and urdf/* named exists in the source tree (installed to share/ by setup.py).
    for rel in set(re.findall(r"""["']((?:config|urdf)/[\w./-]+\.(?:yaml|urdf|xacro))["']""", src)):
        assert (REPO_ROOT / rel).is_file(), f"{path.name}: {rel} does not exist"
    # policies/<name> are pretrained checkpoints written by `diffsim-ros train` (may not exist yet).
    # Launch arguments: each has a description.
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "ARGUMENTS" for t in node.targets):
            for elt in ast.literal_eval(node.value):
                name, default, desc = elt
                assert desc.strip(), f"{path.name}: launch argument {name} has no description"


def declared_parameters(executable: str):
    """Return the parameters a console script's node declares (its PARAMETERS table), or None if unknown."""
    import importlib

    mod = importlib.import_module(f"diffsim_ros.nodes.{executable}")
    table = getattr(mod, "PARAMETERS", None)
    if table is None:
        return None
    names = set(table) if isinstance(table, dict) else {entry[0] for entry in table}
    if executable == "mujoco_plant":
        names |= {"config", "urdf", "floating_base"}          # common.config_parameters
    return names


def _dict_keys(node, assigns):
    """Return the string keys of a dict literal, or of the dict literal a name was assigned (in the same file)."""
    if isinstance(node, ast.Name) and node.id in assigns:
        node = assigns[node.id]
    if isinstance(node, ast.Dict):
        return [k.value for k in node.keys if isinstance(k, ast.Constant)]
    return []


@pytest.mark.parametrize("path", LAUNCH_FILES, ids=lambda p: p.name)
def test_launch_parameters_are_declared_by_the_nodes(path):
    """Every parameter a launch file passes to one of our nodes is one that node declares."""
    tree = ast.parse(path.read_text())
    assigns = {t.id: n.value for n in ast.walk(tree) if isinstance(n, ast.Assign) for t in n.targets
               if isinstance(t, ast.Name) and isinstance(n.value, (ast.Dict, ast.List))}
    checked = 0
    for call in ast.walk(tree):
        if not (isinstance(call, ast.Call) and getattr(call.func, "id", "") == "Node"):
            continue
        kw = {k.arg: k.value for k in call.keywords}
        exe = kw.get("executable")
        if not (isinstance(exe, ast.Constant) and exe.value in console_scripts()) or "parameters" not in kw:
            continue
        declared = declared_parameters(exe.value)
        if declared is None:
            continue
        declared = set(declared) | {"use_sim_time"}        # rclpy declares it on every node
        params = kw["parameters"]
        if isinstance(params, ast.Name) and params.id in assigns:
            params = assigns[params.id]
        elts = params.elts if isinstance(params, (ast.List, ast.Tuple)) else [params]
        for elt in elts:
            for key in _dict_keys(elt, assigns):
                assert key in declared, f"{path.name}: {exe.value} does not declare parameter '{key}'"
                checked += 1
    assert checked >= (8 if path.name == "deploy.launch.py" else 5), checked


def test_deploy_launch_targets_documented():
    src = (LAUNCH_DIR / "deploy.launch.py").read_text()
    for target in ("mujoco", "gazebo", "hardware"):
        assert f"target:={target}" in src
    assert "ros_gz_sim" in src and "gz_ros2_control" in src
    assert re.search(r'\("record", "true"', src), "recording must be on by default"


# ---------------------------------------------------------------------------- the real ROS 2 tooling
# scripts/bootstrap.sh installs launch, launch_ros, launch_pytest and the ros2 CLI into the venv
# (from ../shared/vendor when they are not on the package index) and registers this package in the
# venv's ament index; scripts/test.sh puts the venv on AMENT_PREFIX_PATH. Run directly with the
# venv's pytest, the venv is put there below. Where the tooling is truly absent (a user machine
# without ROS), the tests below skip with the reason; in CI (CI=true) that is a failure.
def _venv_is_an_ament_prefix() -> None:
    marker = Path(sys.prefix) / "share" / "ament_index" / "resource_index" / "packages" / PACKAGE
    paths = [p for p in os.environ.get("AMENT_PREFIX_PATH", "").split(os.pathsep) if p]
    if marker.exists() and sys.prefix not in paths:
        os.environ["AMENT_PREFIX_PATH"] = os.pathsep.join([sys.prefix] + paths)


_venv_is_an_ament_prefix()

try:  # launch.actions: the repository's own launch/ folder imports as an empty namespace package
    import launch.actions  # noqa: F401
    import launch_pytest  # noqa: F401
    import launch_ros.actions  # noqa: F401
    HAVE_LAUNCH = True
except ImportError:
    HAVE_LAUNCH = False

#: Every wait below is bounded by one of these (s); none is asserted on.
START_TIMEOUT = 120.0        # first commands after `ros2 launch` (three processes import torch)
CLI_TIMEOUT = 60.0           # one `ros2 ...` command, retried within this while discovery settles
STOP_TIMEOUT = 60.0          # SIGINT to every process gone (launch escalates to SIGTERM after 5 s)
TRAIN_TIMEOUT = 300.0        # train.launch.py on a tiny config, then the launch shuts down

TARGET_POINT = "[0.25, 0.1, 0.35]"
ROBOTS = {  # robot -> (command topic, its message type, state topic, its message type, checkpoint)
    "arm": ("/position_controller/commands", "std_msgs/msg/Float64MultiArray",
            "/joint_states", "sensor_msgs/msg/JointState", "policies/reach_arm"),
    "quadrotor": ("/cmd_ctbr", "geometry_msgs/msg/TwistStamped", "/odom", "nav_msgs/msg/Odometry",
                  "policies/hover"),
}


def tooling_missing() -> Optional[str]:
    """Say why `ros2 launch diffsim_ros ...` cannot run here, or return None.

    The loop's own check, plus launch_pytest and every console script in the index.
    """
    if not HAVE_LAUNCH:
        return ("launch, launch_ros and launch_pytest are not importable (not on the package index here: "
                "scripts/bootstrap.sh installs them from ../shared/vendor/install-ros-launch.sh when that "
                "exists; on a ROS 2 machine source its setup.bash)")
    reason = launch_unavailable()
    if reason is not None:
        return reason
    from ament_index_python.packages import get_package_prefix

    prefix = Path(get_package_prefix(PACKAGE))
    missing = [s for s in sorted(console_scripts()) if not os.access(prefix / "lib" / PACKAGE / s, os.X_OK)]
    if missing:
        return f"{prefix}/lib/{PACKAGE}/ lacks the executables {missing}: run scripts/bootstrap.sh"
    return None


@pytest.fixture(scope="module")
def ros_tooling():
    reason = tooling_missing()
    if reason is not None:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"CI must run the launch tests: {reason}")
        pytest.skip(reason)


def test_ros_tooling_is_there_in_ci():
    """CI installs everything through scripts/bootstrap.sh: none of the tests below may skip there."""
    reason = tooling_missing()
    if os.environ.get("CI", "").lower() != "true":
        pytest.skip(f"not CI; tooling here: {reason or 'complete'}")
    assert reason is None, reason


def test_ros2_pkg_and_ros2_run_find_the_package(ros_tooling, tmp_path):
    """`ros2 pkg` and `ros2 run` find the package.

    The ament index layout colcon would give: `ros2 pkg prefix/executables` list every console
    script, and `ros2 run diffsim_ros <script>` runs it (from another folder than the checkout).
    """
    cli = Ros2Cli(_env(ros_domain(), tmp_path))
    res = cli.run("pkg", "executables", PACKAGE)
    assert res.returncode == 0, res
    assert {line.split()[1] for line in res.stdout.splitlines() if line.strip()} == console_scripts(), res.stdout
    res = cli.run("pkg", "xml", PACKAGE, "--tag", "name")
    assert res.returncode == 0 and res.stdout.strip() == PACKAGE, res
    share = _share()
    for rel in ("launch/deploy.launch.py", "launch/train.launch.py", "config/hover.yaml", "urdf/diffsim_arm.urdf"):
        assert (share / rel).read_bytes() == (REPO_ROOT / rel).read_bytes(), rel
    res = subprocess.run([ros2_executable(), "run", PACKAGE, "diffsim-ros", "--help"], env=cli.env, cwd=tmp_path,
                         capture_output=True, text=True, timeout=CLI_TIMEOUT, stdin=subprocess.DEVNULL)
    assert res.returncode == 0 and "usage" in res.stdout.lower(), res


def _env(domain: int, tmp: Path) -> Dict[str, str]:
    env = dict(os.environ, ROS_DOMAIN_ID=str(domain), ROS_LOG_DIR=str(tmp / "ros_log"),
               PYTHONUNBUFFERED="1", RCUTILS_COLORIZED_OUTPUT="0")
    env.pop("ROS_LOCALHOST_ONLY", None)
    return env


class Ros2Cli:
    """The real `ros2` command on one ROS domain, every call bounded."""

    def __init__(self, env: Dict[str, str]):
        self.exe, self.env = ros2_executable(), env

    def run(self, *args: str, timeout: float = CLI_TIMEOUT) -> subprocess.CompletedProcess:
        try:
            return subprocess.run([self.exe, *args], env=self.env, capture_output=True, text=True,
                                  timeout=timeout, stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired as e:
            raise AssertionError(f"`ros2 {' '.join(args)}` did not finish within {timeout:.0f} s; "
                                 f"output: {e.stdout!r} {e.stderr!r}") from None

    def until(self, ok, *args: str, timeout: float = CLI_TIMEOUT) -> subprocess.CompletedProcess:
        """Repeat `ros2 args` until ok(result) (the daemon answers before discovery has settled)."""
        end = time.monotonic() + timeout
        while True:
            left = end - time.monotonic()
            res = self.run(*args, timeout=max(5.0, left))
            if ok(res):
                return res
            if time.monotonic() >= end:
                raise AssertionError(f"`ros2 {' '.join(args)}` never gave the expected answer within "
                                     f"{timeout:.0f} s; last exit {res.returncode}, stdout {res.stdout[-2000:]!r}, "
                                     f"stderr {res.stderr[-2000:]!r}")
            time.sleep(0.5)


class Probe:
    """An rclpy node of its own (own context, the test's domain) that collects messages."""

    def __init__(self, domain: int):
        import rclpy
        from rclpy.executors import SingleThreadedExecutor

        self.ctx = rclpy.context.Context()
        rclpy.init(context=self.ctx, domain_id=domain)
        self.node = rclpy.create_node("launch_test_probe", context=self.ctx)
        self.executor = SingleThreadedExecutor(context=self.ctx)
        self.executor.add_node(self.node)
        self.got: Dict[str, list] = {}
        self.subs = {}

    def subscribe(self, topic: str, type_name: str):
        from rosidl_runtime_py.utilities import get_message

        from diffsim_ros.nodes.common import recorder_qos

        if topic not in self.subs:
            self.got[topic] = []
            self.subs[topic] = self.node.create_subscription(
                get_message(type_name), topic, self.got[topic].append, recorder_qos())

    def wait_for(self, topic: str, n: int, timeout: float, log=None) -> list:
        """At least n messages on topic (bounded by timeout)."""
        end = time.monotonic() + timeout
        while len(self.got[topic]) < n and time.monotonic() < end:
            self.executor.spin_once(timeout_sec=0.05)
        if len(self.got[topic]) < n:
            raise AssertionError(f"{len(self.got[topic])} of {n} messages on {topic} within {timeout:.0f} s"
                                 + (f"; launch output:\n{log()[-4000:]}" if log else ""))
        return self.got[topic]

    def spin_until(self, cond, timeout: float) -> bool:
        end = time.monotonic() + timeout
        while not cond() and time.monotonic() < end:
            self.executor.spin_once(timeout_sec=0.05)
        return cond()

    def fresh(self, topic: str, type_name: str) -> None:
        """Subscribe anew: what waits in the old queue is dropped, only later messages come."""
        if topic in self.subs:
            self.node.destroy_subscription(self.subs.pop(topic))
        self.subscribe(topic, type_name)

    def close(self):
        import rclpy

        self.executor.shutdown()
        self.node.destroy_node()
        rclpy.shutdown(context=self.ctx)


class Deployment:
    """`ros2 launch diffsim_ros deploy.launch.py target:=mujoco robot:=ROBOT` as a user starts it."""

    def __init__(self, robot: str, tmp: Path):
        self.robot, self.tmp = robot, tmp
        self.domain = ros_domain()
        self.env = _env(self.domain, tmp)
        self.bag = tmp / "bag"
        self.log_path = tmp / "launch.log"
        self.cmd_topic, self.cmd_type, self.state_topic, self.state_type, self.checkpoint = ROBOTS[robot]
        self.cli = Ros2Cli(self.env)
        self.cli.run("daemon", "stop")                        # a daemon of an earlier run on this domain
        res = self.cli.run("daemon", "start")
        assert res.returncode == 0, res
        args = ["target:=mujoco", f"robot:={robot}", f"bag:={self.bag}"]
        if robot == "arm":
            args.append(f"target_point:={TARGET_POINT}")
        self._log = open(self.log_path, "w")
        # Through a wrapper that sets SIGINT to its default before exec: a process that starts with
        # SIGINT ignored (inherited) never sees Ctrl-C, since launch's handler rides on Python's.
        wrapper = ("import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); "
                   "signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT}); os.execv(sys.argv[1], sys.argv[1:])")
        self.proc = subprocess.Popen([sys.executable, "-c", wrapper, ros2_executable(), "launch", PACKAGE,
                                      "deploy.launch.py", *args],
                                     env=self.env, stdout=self._log, stderr=subprocess.STDOUT, cwd=tmp,
                                     stdin=subprocess.DEVNULL, start_new_session=True)
        self.probe = Probe(self.domain)
        self.probe.subscribe(self.cmd_topic, self.cmd_type)
        self.probe.subscribe(self.state_topic, self.state_type)
        self.returncode: Optional[int] = None

    def log(self) -> str:
        self._log.flush()
        return self.log_path.read_text(errors="replace")

    def commands(self, n: int, timeout: float = START_TIMEOUT) -> list:
        if self.proc.poll() is not None:
            raise AssertionError(f"ros2 launch exited ({self.proc.returncode}):\n{self.log()[-4000:]}")
        return self.probe.wait_for(self.cmd_topic, n, timeout, self.log)

    def interrupt(self) -> int:
        """SIGINT to `ros2 launch` (what Ctrl-C does), then wait for it (bounded)."""
        if self.returncode is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.returncode = self.proc.wait(timeout=STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                try:
                    status = Path(f"/proc/{self.proc.pid}/status").read_text()
                    masks = " ".join(ln for ln in status.splitlines() if ln.startswith(("SigBlk", "SigIgn", "SigCgt")))
                except OSError:
                    masks = "?"
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)
                acknowledged = "user interrupted" in self.log()
                raise AssertionError(f"ros2 launch still running {STOP_TIMEOUT:.0f} s after SIGINT (launch "
                                     f"{'did' if acknowledged else 'did not'} acknowledge it; its signal masks: "
                                     f"{masks}):\n{self.log()[-4000:]}") from None
        return self.returncode

    def close(self):
        try:
            if self.proc.poll() is None:
                try:
                    self.interrupt()
                except AssertionError:
                    pass
            self.probe.close()
        finally:
            self.cli.run("daemon", "stop")
            self._log.close()


@pytest.fixture(scope="module", params=sorted(ROBOTS))
def deployment(request, ros_tooling, tmp_path_factory):
    d = Deployment(request.param, tmp_path_factory.mktemp(f"deploy_{request.param}"))
    try:
        yield d
    finally:
        d.close()


def _share() -> Path:
    from ament_index_python.packages import get_package_share_directory

    return Path(get_package_share_directory(PACKAGE))


def _checkpoint_meta(deployment) -> dict:
    return json.loads((REPO_ROOT / deployment.checkpoint / "policy.json").read_text())


def test_deploy_launch_commands_flow(deployment):
    """The deploy launch's commands flow.

    The controller commands the stand-in through the launch file's wiring: commands of the
    robot's size, and the stand-in's states name the URDF's joints.
    """
    from diffsim_ros import physics

    cmds = deployment.commands(25)
    states = deployment.probe.wait_for(deployment.state_topic, 5, CLI_TIMEOUT, deployment.log)
    if deployment.robot == "arm":
        joints = physics.load_urdf(REPO_ROOT / "urdf" / "diffsim_arm.urdf").joint_names
        assert all(len(m.data) == len(joints) for m in cmds), [list(m.data) for m in cmds[:3]]
        assert all(list(m.name) == joints for m in states), states[0].name
        assert all(np.isfinite(m.data).all() for m in cmds)
    else:
        thrust = [m.twist.linear.z for m in cmds]
        # On failure the launch log's preflight and supervisor lines say why the controller held
        # its safe command (zero thrust) instead of flying.
        why = [ln for ln in deployment.log().splitlines() if re.search(r"preflight|NO-GO|safe|stale|watchdog", ln)]
        assert all(np.isfinite(thrust)) and max(thrust) > 0, (thrust[:10], why[-20:])
        assert all(m.header.frame_id or m.child_frame_id for m in states)


def test_deploy_launch_parameters_through_ros2_param(deployment):
    """The deploy launch's parameters, through `ros2 param`.

    `ros2 param get` reads what deploy.launch.py set: the share folder's checkpoint, sim time on
    the MuJoCo target, the stand-in in realtime mode.
    """
    deployment.commands(1)
    cli = deployment.cli

    def value(node, name):
        res = cli.until(lambda r: r.returncode == 0 and "value is" in r.stdout, "param", "get", node, name)
        return res.stdout.strip()

    assert value("/policy_controller", "checkpoint") == f"String value is: {_share() / deployment.checkpoint}"
    assert value("/policy_controller", "use_sim_time") == "Boolean value is: True"
    assert value("/policy_controller", "lockstep") == "Boolean value is: False"
    assert value("/mujoco_plant", "mode") == "String value is: realtime"
    # `ros2 param describe`: the description and constraints of a perturbation key are the schema's.
    from diffsim_ros.schema import entries
    from diffsim_ros.plant.perturbation import Perturbation

    res = cli.until(lambda r: r.returncode == 0 and "Description" in r.stdout,
                    "param", "describe", "/mujoco_plant", "perturbation.mass_scale")
    entry = next(e for e in entries(Perturbation, "perturbation") if e.name == "perturbation.mass_scale")
    assert entry.doc in res.stdout and "(> 0) default: 1" in res.stdout, res.stdout
    assert f"Additional constraints: {entry.constraints}" in res.stdout, res.stdout


def test_deploy_launch_topics_through_ros2_topic_echo(deployment):
    """The deploy launch's topics, through `ros2 topic echo`.

    `ros2 topic echo --once`: the latched metadata is the checkpoint's own policy.json, and the
    stand-in's state message is well formed.
    """
    import yaml

    deployment.commands(1)
    cli = deployment.cli
    res = cli.until(lambda r: r.returncode == 0 and "data:" in r.stdout,
                    "topic", "echo", "--once", "--full-length", "/diffsim/metadata", "std_msgs/msg/String")
    meta = json.loads(yaml.safe_load(res.stdout.split("\n---")[0])["data"])
    ckpt = _checkpoint_meta(deployment)
    assert meta["checkpoint"]["robot"] == ckpt["robot"] and meta["checkpoint"]["dt"] == ckpt["dt"]
    assert meta["command_topic"] == deployment.cmd_topic and meta["lockstep"] is False
    res = cli.until(lambda r: r.returncode == 0 and "header:" in r.stdout,
                    "topic", "echo", "--once", deployment.state_topic, deployment.state_type)
    msg = yaml.safe_load(res.stdout.split("\n---")[0])
    if deployment.robot == "arm":
        assert msg["name"] == ckpt["robot"]["joint_names"]
        assert len(msg["position"]) == len(ckpt["robot"]["joint_names"])
    else:
        pos = msg["pose"]["pose"]["position"]
        assert all(np.isfinite([pos["x"], pos["y"], pos["z"]]))
    res = cli.until(lambda r: r.returncode == 0 and deployment.cmd_topic in r.stdout, "topic", "list")
    for topic in (deployment.cmd_topic, deployment.state_topic, "/clock", "/diffsim/predicted_state"):
        assert topic in res.stdout.split(), (topic, res.stdout)


def test_deploy_launch_emergency_stop_through_ros2_service_call(deployment):
    """The deploy launch's emergency stop, through `ros2 service call`.

    `ros2 service call .../emergency_stop std_srvs/srv/SetBool "{data: true}"` latches the safe
    command: the arm holds the last accepted measured position (every command is exactly the
    position of a /joint_states message the stand-in published), the quadrotor commands
    safe_thrust (read back with `ros2 param get`) with zero body rates. `{data: false}` releases.
    """
    deployment.commands(1)
    cli = deployment.cli
    res = cli.until(lambda r: r.returncode == 0 and "success=True" in r.stdout,
                    "service", "call", "/policy_controller/emergency_stop", "std_srvs/srv/SetBool", "{data: true}")
    # New subscriptions: what waits in the probe's queues was published before the answer.
    # States first, so that the state behind each later command is among those received.
    deployment.probe.fresh(deployment.state_topic, deployment.state_type)
    deployment.probe.wait_for(deployment.state_topic, 3, CLI_TIMEOUT, deployment.log)
    deployment.probe.fresh(deployment.cmd_topic, deployment.cmd_type)
    after = deployment.commands(20, timeout=CLI_TIMEOUT)
    if deployment.robot == "arm":
        # The last 10 of the 20: under load the controller can still be working through states
        # published before the probe's state subscription when the first commands arrive. (The arm
        # now settles slowly under the hold, the stand-in's friction being the simulator's smoothed
        # law, so each command names its own state; under MuJoCo's frictionloss it stood still.)
        held = [tuple(m.data) for m in after][-10:]
        states = deployment.probe.got[deployment.state_topic]

        def measured():
            return {tuple(m.position) for m in states}
        # The states behind the last commands may still be in the probe's queue.
        deployment.probe.spin_until(lambda: set(held) <= measured(), CLI_TIMEOUT)
        assert set(held) <= measured(), (held[-3:], [list(m.position) for m in states[-3:]])
    else:
        res = cli.until(lambda r: r.returncode == 0 and "value is" in r.stdout,
                        "param", "get", "/policy_controller", "safe_thrust")
        safe_thrust = float(res.stdout.split(":")[-1])
        for m in after:
            rates = (m.twist.angular.x, m.twist.angular.y, m.twist.angular.z)
            assert rates == (0.0, 0.0, 0.0) and m.twist.linear.z == pytest.approx(safe_thrust), m
    res = cli.run("service", "call", "/policy_controller/emergency_stop", "std_srvs/srv/SetBool", "{data: false}")
    assert res.returncode == 0 and "success=True" in res.stdout, res


def test_deploy_launch_robot_description_through_ros2_topic_echo(deployment):
    """The stand-in's latched /robot_description (for RViz and Foxglove) is the robot's URDF file."""
    import xml.etree.ElementTree as ET

    import yaml

    deployment.commands(1)
    urdf = {"arm": "diffsim_arm.urdf", "quadrotor": "diffsim_quadrotor.urdf"}[deployment.robot]
    res = deployment.cli.until(lambda r: r.returncode == 0 and "data:" in r.stdout, "topic", "echo", "--once",
                               "--full-length", "/robot_description", "std_msgs/msg/String")
    text = yaml.safe_load(res.stdout.split("\n---")[0])["data"]
    want = (REPO_ROOT / "urdf" / urdf).read_text()
    assert ET.canonicalize(text, strip_text=True) == ET.canonicalize(want, strip_text=True)


def test_deploy_launch_tf_through_ros2_topic_echo(deployment):
    """The deploy launch's /tf, through `ros2 topic echo`.

    `ros2 topic echo --once /tf`: the stand-in's transforms name every link of the URDF below
    `world` (for the quadrotor world -> base_link), each with a unit quaternion.
    """
    import yaml

    from diffsim_ros import physics
    from diffsim_ros.nodes.common import have_tf2_msgs

    if not have_tf2_msgs():
        reason = "tf2_msgs is not importable (scripts/bootstrap.sh builds it where cmake and c++ exist)"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"CI: {reason}")
        pytest.skip(reason)
    deployment.commands(1)
    urdf = {"arm": "diffsim_arm.urdf", "quadrotor": "diffsim_quadrotor.urdf"}[deployment.robot]
    model = physics.load_urdf(REPO_ROOT / "urdf" / urdf, floating_base=deployment.robot == "quadrotor")
    res = deployment.cli.until(lambda r: r.returncode == 0 and "transforms:" in r.stdout, "topic", "echo", "--once",
                               "--full-length", "/tf", "tf2_msgs/msg/TFMessage")
    msg = yaml.safe_load(res.stdout.split("\n---")[0])
    frames = {(t["header"]["frame_id"], t["child_frame_id"]) for t in msg["transforms"]}
    assert {c for _, c in frames} == set(model.link_names) - {"world"}, frames
    assert {p for p, _ in frames} <= set(model.link_names) | {"world"}, frames
    for t in msg["transforms"]:
        r = t["transform"]["rotation"]
        assert abs(np.linalg.norm([r["x"], r["y"], r["z"], r["w"]]) - 1) < 1e-9, t


def _published_counts(log: str) -> dict:
    m = re.findall(r"policy_controller: published (\{.*\})", log)
    assert m, "policy_controller printed no 'published {...}' summary at shutdown"
    return json.loads(m[-1])["published"]


def test_deploy_launch_sigint_shuts_down_cleanly_and_the_bag_holds_every_command(deployment):
    """SIGINT shuts the deploy launch down cleanly, and the bag holds every command.

    Ctrl-C on `ros2 launch`: every process ends by itself (exit 0, no SIGTERM/SIGKILL
    escalation), and the bag, read with rosbags and with the mcap reader, holds every command and
    prediction the controller says it published.
    """
    from mcap import reader as mcap_reader
    from rosbags.highlevel import AnyReader

    deployment.commands(25)
    rc = deployment.interrupt()
    log = deployment.log()
    assert rc == 0, log[-4000:]
    for proc in ("policy_controller", "mujoco_plant", "trajectory_recorder"):
        assert re.search(rf"\[{proc}-\d+\]: process has finished cleanly", log), (proc, log[-4000:])
    assert "SIGTERM" not in log and "SIGKILL" not in log, log[-4000:]
    published = _published_counts(log)
    with AnyReader([deployment.bag]) as reader:
        counts: Dict[str, int] = {}
        for conn, _t, _raw in reader.messages():
            counts[conn.topic] = counts.get(conn.topic, 0) + 1
    mcaps = sorted(deployment.bag.glob("*.mcap"))
    assert len(mcaps) == 1, mcaps
    with open(mcaps[0], "rb") as f:
        summary = mcap_reader.make_reader(f, validate_crcs=True).get_summary()
    by_channel = {ch.topic: summary.statistics.channel_message_counts.get(cid, 0)
                  for cid, ch in summary.channels.items()}
    for topic in (deployment.cmd_topic, "/diffsim/predicted_state", "/diffsim/command"):
        assert published[topic] >= 25, (published, [ln for ln in log.splitlines()
                                                     if re.search(r"preflight|NO-GO|safe|stale|watchdog", ln)][-20:])
        assert counts.get(topic) == published[topic] == by_channel.get(topic), (topic, counts, published, by_channel)
    assert counts.get(deployment.state_topic, 0) > 0, counts


def test_deploy_launch_refuses_a_checkpoint_for_another_robot(ros_tooling, tmp_path):
    """The deploy launch refuses a checkpoint for another robot.

    robot:=quadrotor with the arm's checkpoint: the launch stops before starting any node, naming
    both (the topics and interface would be the quadrotor's, the policy the arm's).
    """
    env = _env(ros_domain(), tmp_path)
    res = subprocess.run([ros2_executable(), "launch", PACKAGE, "deploy.launch.py", "robot:=quadrotor",
                          f"checkpoint:={_share() / 'policies' / 'reach_arm'}", "record:=false"],
                         env=env, cwd=tmp_path, capture_output=True, text=True, timeout=CLI_TIMEOUT,
                         stdin=subprocess.DEVNULL)
    out = res.stdout + res.stderr
    assert res.returncode != 0, out
    assert "policy for the arm kind of robot, not for robot:=quadrotor" in out, out
    assert "process started" not in out, out


# ---------------------------------------------------------------------------- launch_pytest: train.launch.py
@pytest.fixture
def train_run(ros_tooling, tmp_path):
    """Report what train_tiny's launch did: process exits, and whether the bounding timer fired."""
    return {"out": tmp_path / "train", "exits": [], "timed_out": [], "domain": ros_domain()}


if HAVE_LAUNCH:
    from launch.actions import (EmitEvent, IncludeLaunchDescription, OpaqueFunction, RegisterEventHandler,
                                SetEnvironmentVariable, TimerAction)
    from launch.event_handlers import OnProcessExit
    from launch.events import Shutdown
    from launch.launch_description_sources import PythonLaunchDescriptionSource

    @launch_pytest.fixture(auto_shutdown=False)
    def train_tiny(train_run):
        """Launch train.launch.py from the package's share folder (through the ament index).

        A fresh output folder, one iteration on two environments. ReadyToTest comes first, so a launch
        that fails (a missing file, executable or package) ends the test instead of leaving
        launch_pytest waiting for it; a timer bounds the whole run.
        """
        exits, timed_out = train_run["exits"], train_run["timed_out"]

        def on_timeout(context):
            timed_out.append(True)

        return launch.LaunchDescription([
            SetEnvironmentVariable("ROS_DOMAIN_ID", str(train_run["domain"])),
            launch_pytest.actions.ReadyToTest(),
            RegisterEventHandler(OnProcessExit(on_exit=lambda ev, ctx: exits.append((ev.action.name, ev.returncode)))),
            TimerAction(period=TRAIN_TIMEOUT, actions=[OpaqueFunction(function=on_timeout),
                                                       EmitEvent(event=Shutdown(reason="test timeout"))]),
            IncludeLaunchDescription(
                PythonLaunchDescriptionSource(str(_share() / "launch" / "train.launch.py")),
                launch_arguments={"iterations": "1", "num_envs": "2", "out": str(train_run["out"])}.items()),
        ])

    @pytest.mark.launch(fixture=train_tiny, shutdown=True)
    def test_train_launch_writes_checkpoint(train_run):
        """The train launch writes a checkpoint.

        With auto_shutdown=False the shutdown test waits for the launch to end by itself: train_node
        exits 0 and the launch's OnProcessExit shuts it down, before the timer.
        """
        assert not train_run["timed_out"], f"train.launch.py still running after {TRAIN_TIMEOUT:.0f} s"
        assert len(train_run["exits"]) == 1 and train_run["exits"][0][0].startswith("train_node"), train_run
        assert train_run["exits"][0][1] == 0, train_run
        meta = json.loads((train_run["out"] / "policy.json").read_text())
        assert meta, meta
        import torch

        torch.jit.load(str(train_run["out"] / "policy.pt"))
else:
    def test_train_launch_writes_checkpoint(ros_tooling):
        raise AssertionError("unreachable: ros_tooling skips without launch")


def test_gazebo_arm_description_carries_ros2_control_for_the_policys_joints():
    """The Gazebo arm description carries ros2_control for the policy's joints.

    target:=gazebo spawns the arm's xacro with <ros2_control>: exactly the actuated joints, each
    with a position command interface and position/velocity state, the controllers file's joints,
    and the same physics as the plain URDF the policy was trained on.
    """
    import xml.etree.ElementTree as ET

    import torch
    import xacro
    import yaml

    from diffsim_ros import physics

    controllers = REPO_ROOT / "config" / "controller_arm_gazebo.yaml"
    xml = xacro.process_file(str(REPO_ROOT / "urdf" / "diffsim_arm.urdf.xacro"),
                             mappings={"ros2_control": "true", "controllers": str(controllers)}).toxml()
    root = ET.fromstring(xml)
    rc = root.findall("ros2_control")
    assert len(rc) == 1 and rc[0].find("hardware/plugin").text == "gz_ros2_control/GazeboSimSystem"
    joints = {j.get("name"): j for j in rc[0].findall("joint")}
    plain = physics.load_urdf(REPO_ROOT / "urdf" / "diffsim_arm.urdf")
    assert list(joints) == plain.joint_names
    for j in joints.values():
        assert [c.get("name") for c in j.findall("command_interface")] == ["position"]
        assert [c.get("name") for c in j.findall("state_interface")] == ["position", "velocity"]
    assert root.find("gazebo/plugin/parameters").text == str(controllers)
    ctrl = yaml.safe_load(controllers.read_text())
    assert ctrl["position_controller"]["ros__parameters"]["joints"] == plain.joint_names
    spawned = physics.load_urdf(xml)
    for name in ("mass", "com", "inertia", "damping", "lower", "upper", "effort_limit"):
        a, b = getattr(plain, name, None), getattr(spawned, name, None)
        if isinstance(a, torch.Tensor):
            assert torch.allclose(a, b, rtol=1e-5, atol=1e-12), name      # the plain file rounds to 5 digits
    # The launch file builds Gazebo's description this way.
    text = (REPO_ROOT / "launch" / "deploy.launch.py").read_text()
    assert '"ros2_control": "true"' in text and "controller_arm_gazebo.yaml" in text


def test_deploy_launch_excite_mode_records_a_bag_sysid_reads(ros_tooling, tmp_path):
    """The deploy launch's excite mode records a bag that sysid reads.

    `ros2 launch diffsim_ros deploy.launch.py mode:=excite`: no checkpoint, the arm of config:=,
    lockstep on the stand-in; the motion runs to its end, Ctrl-C closes the bag, and the bag holds
    every command the controller sent and the metadata `diffsim-ros sysid` rebuilds the robot from.
    """
    from diffsim_ros.analysis import read_bag, sim_setup
    from diffsim_ros.workflows.loop import _launch_preexec, bag_counts

    exc = tmp_path / "excite.yaml"
    exc.write_text("policy_controller:\n  ros__parameters:\n    state_timeout_s: 5.0\n    stats_file: "
                   f"{tmp_path / 'stats.json'}\n    excitation:\n      duration: 2.0\n      seed: 3\n")
    bag = tmp_path / "bag"
    log = tmp_path / "launch.log"
    cmd = [ros2_executable(), "launch", PACKAGE, "deploy.launch.py", "mode:=excite",
           f"config:={REPO_ROOT / 'config/reach_arm.yaml'}", "lockstep:=true", f"bag:={bag}",
           f"controller_params:={exc}"]
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env=_env(ros_domain(), tmp_path), start_new_session=True, preexec_fn=_launch_preexec)
    try:
        end = time.monotonic() + 120
        while "excitation finished" not in log.read_text(errors="replace"):
            assert proc.poll() is None and time.monotonic() < end, log.read_text(errors="replace")[-3000:]
            time.sleep(0.2)
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    stats = json.loads((tmp_path / "stats.json").read_text())
    counts = bag_counts(bag)
    for topic, n in stats["published"].items():
        assert counts.get(topic, 0) == n, (topic, counts, stats["published"])
    assert stats["policy_commands"] >= 100 and stats["states_rejected"] == 0, stats
    data = read_bag(str(bag))
    assert data.metadata["mode"] == "excite" and data.metadata["checkpoint"] is None
    setup = sim_setup(data)
    assert setup.model.joint_names == ["arm_joint1", "arm_joint2", "arm_joint3", "arm_joint4"]
