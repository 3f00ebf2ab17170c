"""The whole loop on the embedded default robot: train, deploy, record, compare.

    diffsim-ros loop --config config/hover.yaml --out runs/loop

1. trains a policy by gradients through the simulator (``diffsim-ros train``), unless
   ``--checkpoint`` names one;
2. starts the nodes' own console scripts as separate processes on one isolated
   ROS_DOMAIN_ID, talking over DDS: ``trajectory_recorder`` (rosbag2, MCAP),
   ``mujoco_plant`` (the MuJoCo stand-in, perturbed to stand in for the reality gap)
   and ``policy_controller`` (the exported TorchScript policy);
3. runs them for a stated simulated time, then stops the controller and the plant and
   sends SIGINT to the recorder, which closes the bag (Ctrl-C does the same: nothing
   recorded is lost);
4. analyses the bag (``diffsim-ros analyze``): the task's result on the stand-in and the
   velocity the simulator predicted against the one the stand-in produced.

Everything is written under ``--out``: ``policy/`` (checkpoint and learning curve),
``bag/``, ``logs/`` (one log per process) and ``analysis/`` (metrics.json, plots,
report.md). The plant and controller run in lockstep (one control step per command),
so a run is deterministic whatever the machine's load.
"""
from __future__ import annotations

import json
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union, cast

from .. import interfaces

#: The stand-in's default deviation from the simulator: the preset ``default`` of the robot's
#: kind (10 % heavier and a slower actuator; a multirotor also 50 % more drag). Enough for the
#: analysis to have something to find.
DEFAULT_PERTURBATION = {"preset": "default"}


class LoopError(RuntimeError):
    """A step of the loop that failed; the message names the step and its log."""


def console_script(name: str) -> str:
    """Return the console script ``name`` installed next to this interpreter (a venv), else on PATH."""
    import shutil

    here = Path(sys.executable).parent / name
    return str(here) if here.exists() else (shutil.which(name) or name)


def die_with_parent() -> None:
    """Make a node die with the process that started it (preexec_fn of the nodes the loop starts).

    On Linux they get SIGTERM when the process that started them dies, even by SIGKILL (they then
    close their bags as on Ctrl-C), so a killed loop or test leaves no node running on its ROS
    domain. Elsewhere a no-op.
    """
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, int(signal.SIGTERM))   # PR_SET_PDEATHSIG
    except OSError:
        pass


def _ros_value(val: Any) -> str:
    """Return a value as the text of a ROS command line (``-p key:=value``, ``arg:=value``)."""
    if isinstance(val, bool):
        return "true" if val else "false"
    if isinstance(val, (list, tuple)):
        return json.dumps(list(val))
    return str(val)


class _Processes:
    """Child processes on one ROS domain, each with its own log file."""

    def __init__(self, log_dir: Path, domain: int):
        self.log_dir, self.domain = log_dir, domain
        self.procs: Dict[str, subprocess.Popen] = {}

    def start(self, name: str, script: str, params: Dict[str, Any]) -> None:
        args = [console_script(script), "--ros-args"]
        for key, val in params.items():
            args += ["-p", f"{key}:={_ros_value(val)}"]
        env = dict(os.environ, ROS_DOMAIN_ID=str(self.domain), PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
        log = open(self.log_dir / f"{name}.log", "w")
        # A new session: a Ctrl-C in the terminal reaches this process only, which then
        # stops the children in the right order (producers first, the recorder last).
        self.procs[name] = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env=env,
                                            start_new_session=True, preexec_fn=die_with_parent)
        log.close()

    def log(self, name: str, tail: int = 4000) -> str:
        path = self.log_dir / f"{name}.log"
        return path.read_text(errors="replace")[-tail:] if path.exists() else ""

    def check_alive(self, what: str) -> None:
        for name, p in self.procs.items():
            if p.poll() is not None:
                raise LoopError(f"{NODES.get(name, name)} exited with status {p.returncode} while {what}; its log "
                                f"({self.log_dir / (name + '.log')}) ends with:\n{self.log(name)}")

    def stop(self, name: str, timeout: float = 20.0) -> Optional[int]:
        p = self.procs.get(name)
        if p is None:
            return None
        if p.poll() is None:
            p.send_signal(signal.SIGINT)
            try:
                p.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        return p.returncode

    def kill_all(self) -> None:
        for p in self.procs.values():
            if p.poll() is None:
                p.kill()
                p.wait()


#: The loop's names of the deployment's nodes and their executables (launch prefixes output with them).
NODES = {"controller": "policy_controller", "plant": "mujoco_plant", "recorder": "trajectory_recorder"}


def ros2_executable() -> Optional[str]:
    """Return the ``ros2`` command next to this interpreter (a venv), else on PATH, else None."""
    import shutil

    here = Path(sys.executable).parent / "ros2"
    return str(here) if here.is_file() else shutil.which("ros2")


def launch_unavailable() -> Optional[str]:
    """Why ``ros2 launch diffsim_ros deploy.launch.py`` cannot run here, or None when it can.

    It can when launch and launch_ros are importable, the ``ros2`` command is installed, and this
    package is in the ament index with its executables (scripts/bootstrap.sh; on a ROS 2 machine,
    colcon and install/setup.bash).
    """
    import importlib.util

    for module in ("launch", "launch_ros"):
        try:
            spec = importlib.util.find_spec(module)
        except (ImportError, ValueError):
            spec = None
        # A folder named launch/ without __init__ (this repository's own) is a namespace, not launch.
        if spec is None or spec.origin is None:
            return (f"{module} is not importable (scripts/bootstrap.sh installs launch, launch_ros and the ros2 "
                    f"command from ../shared/vendor when it exists; on a ROS 2 machine source its setup.bash)")
    if ros2_executable() is None:
        return "the ros2 command (ros2cli) is not installed next to this interpreter nor on PATH"
    try:
        from ament_index_python.packages import PackageNotFoundError, get_package_prefix
    except ImportError:
        return "ament_index_python is not importable"
    venv_on_ament_path()
    try:
        prefix = Path(get_package_prefix("diffsim_ros"))
    except (PackageNotFoundError, OSError):     # OSError: AMENT_PREFIX_PATH unset or empty
        return ("diffsim_ros is not in the ament index "
                f"(AMENT_PREFIX_PATH={os.environ.get('AMENT_PREFIX_PATH', '')!r}): "
                "run scripts/bootstrap.sh, which registers it in the venv, and put the venv on AMENT_PREFIX_PATH "
                "(scripts/run.sh and scripts/test.sh do), or colcon build and source install/setup.bash")
    missing = [exe for exe in sorted(NODES.values()) if not os.access(prefix / "lib" / "diffsim_ros" / exe, os.X_OK)]
    if missing:
        return f"{prefix}/lib/diffsim_ros/ lacks the executables {missing}: run scripts/bootstrap.sh"
    return None


def venv_on_ament_path() -> bool:
    """Put this interpreter's prefix on AMENT_PREFIX_PATH (for this process and what it starts) where needed.

    It does so when the package is registered there (scripts/bootstrap.sh registers it in the venv)
    and it is not on the path yet, as scripts/run.sh does; so `.venv/bin/diffsim-ros loop` run by
    hand finds the launch file and the nodes. Returns whether it changed the path.
    """
    prefix = Path(sys.prefix)
    if not (prefix / "share" / "ament_index" / "resource_index" / "packages" / "diffsim_ros").exists():
        return False
    paths = [p for p in os.environ.get("AMENT_PREFIX_PATH", "").split(os.pathsep) if p]
    if any(Path(p).resolve() == prefix.resolve() for p in paths if os.path.isdir(p)):
        return False
    os.environ["AMENT_PREFIX_PATH"] = os.pathsep.join([str(prefix)] + paths)
    return True


def stop_nodes(procs) -> Dict[str, Optional[int]]:
    """Stop a deployment and return each node's exit status.

    Producers first, then the recorder, which drains what is queued and closes the bag (through
    launch: launch stops them).
    """
    if isinstance(procs, _Launch):
        statuses = procs.stop()
    else:
        statuses = {"controller": procs.stop("controller"), "plant": procs.stop("plant")}
        time.sleep(0.5)
        statuses["recorder"] = procs.stop("recorder", timeout=60.0)
    procs.kill_all()
    return statuses


def check_exits(statuses: Dict[str, Optional[int]], logs) -> None:
    """Raise a LoopError naming the first node that ended with an error status (0, None and SIGINT are fine)."""
    for name, rc in statuses.items():
        if rc not in (0, None, -signal.SIGINT):
            raise LoopError(f"{NODES[name]} ended with status {rc}; see {logs}")


def _launch_preexec() -> None:
    """Make ``ros2 launch`` die with the loop and see Ctrl-C (its preexec_fn).

    Launch dies with the loop (its nodes then get SIGINT from launch, and SIGTERM from their own
    death signal if launch is killed), and SIGINT is default and unblocked: a process that starts
    with SIGINT ignored (inherited, as in some test runners) never sees Ctrl-C, since Python then
    installs no handler and launch's rides on Python's.
    """
    die_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


class _Launch:
    """The deployment as a user starts it, through ``ros2 launch``.

    ``ros2 launch diffsim_ros deploy.launch.py ARG:=VALUE ...`` on one ROS domain, its output in
    ``logs/launch.log`` (split per node into ``logs/<node>.log`` at the end). The same interface as
    ``_Processes`` where the loop needs it.
    """

    def __init__(self, log_dir: Path, domain: int):
        self.log_dir, self.domain = log_dir, domain
        self.path = log_dir / "launch.log"
        self.proc: Optional[subprocess.Popen] = None
        self.command: List[str] = []

    def start(self, arguments: Dict[str, Any]) -> None:
        args = [f"{key}:={_ros_value(val)}" for key, val in arguments.items()]
        self.command = [ros2_executable() or "ros2", "launch", "diffsim_ros", "deploy.launch.py", *args]
        env = dict(os.environ, ROS_DOMAIN_ID=str(self.domain), PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1",
                   RCUTILS_COLORIZED_OUTPUT="0", ROS_LOG_DIR=str(self.log_dir / "ros"),
                   # The nodes set their own death signal (nodes/common.run_node): launch killed, they end.
                   DIFFSIM_DIE_WITH_PARENT="1")
        log = open(self.path, "w")
        self.proc = subprocess.Popen(self.command, stdout=log, stderr=subprocess.STDOUT, env=env,
                                     stdin=subprocess.DEVNULL, start_new_session=True, preexec_fn=_launch_preexec)
        log.close()

    def _text(self) -> str:
        return self.path.read_text(errors="replace") if self.path.exists() else ""

    def log(self, name: str, tail: int = 4000) -> str:
        """Return what node ``name`` (controller, plant, recorder) printed, from launch's output."""
        prefix = f"[{NODES[name]}-"
        lines = [ln.split("] ", 1)[1] if "] " in ln else ln for ln in self._text().splitlines()
                 if ln.startswith(prefix)]
        return "\n".join(lines)[-tail:]

    def started(self, name: str) -> bool:
        """Return whether launch has started node ``name``'s process."""
        return re.search(rf"\[INFO\] \[{NODES[name]}-\d+\]: process started", self._text()) is not None

    def exit_statuses(self) -> Dict[str, Optional[int]]:
        """Exit status of each node as launch reported it (None: not reported)."""
        text = self._text()
        out: Dict[str, Optional[int]] = {}
        for name, exe in NODES.items():
            if re.search(rf"\[{exe}-\d+\]: process has finished cleanly", text):
                out[name] = 0
            else:
                m = re.search(rf"\[{exe}-\d+\]: process has died \[pid \d+, exit code (-?\d+)", text)
                out[name] = int(m.group(1)) if m else None
        return out

    def check_alive(self, what: str) -> None:
        if self.proc is None or self.proc.poll() is None:
            return
        died = {n: rc for n, rc in self.exit_statuses().items() if rc is not None}
        if died:
            # The one that failed (the others were stopped by the shutdown it caused), else the first.
            name, rc = sorted(died.items(), key=lambda item: item[1] == 0)[0]
            raise LoopError(f"{NODES[name]} exited with status {rc} while {what}, which ended the deployment "
                            f"({' '.join(self.command[:4])}; its log {self.path}); {NODES[name]} printed:\n"
                            f"{self.log(name)}")
        raise LoopError(f"ros2 launch exited with status {self.proc.returncode} while {what}; its log "
                        f"({self.path}) ends with:\n{self._text()[-4000:]}")

    def stop(self, timeout: float = 60.0) -> Dict[str, Optional[int]]:
        """Send SIGINT to launch, bounded; return the nodes' exit statuses and write their logs.

        SIGINT is what Ctrl-C does: launch passes it to every node; the recorder drains what is
        queued and closes the bag.
        """
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        for name in NODES:
            (self.log_dir / f"{name}.log").write_text(self.log(name, tail=1 << 30) + "\n")
        return self.exit_statuses()

    def kill_all(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


class _Clock:
    """Follows the plant's /clock from this process (progress of the lockstep run)."""

    def __init__(self, domain: int, state_topic: str = "", state_type=None):
        import rclpy
        from rclpy.executors import SingleThreadedExecutor
        from rosgraph_msgs.msg import Clock

        self.ctx = rclpy.context.Context()
        rclpy.init(context=self.ctx, domain_id=domain)
        self.node = rclpy.create_node(f"diffsim_loop_{random.randint(0, 1 << 30)}", context=self.ctx)
        self.t = -1.0
        self.states = 0
        self.node.create_subscription(Clock, "/clock", self._on, 10)
        from geometry_msgs.msg import PointStamped
        self._point = PointStamped
        self.pub_target = self.node.create_publisher(PointStamped, interfaces.TARGET, 10)
        if state_topic:
            self.follow_states(state_topic, state_type)
        self.ex = SingleThreadedExecutor(context=self.ctx)
        self.ex.add_node(self.node)
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._spin, daemon=True)
        self.thread.start()

    def _on(self, msg) -> None:
        self.t = max(self.t, msg.clock.sec + 1e-9 * msg.clock.nanosec)

    def _on_state(self, msg) -> None:
        self.states += 1

    def follow_states(self, state_topic: str, state_type) -> None:
        """Count the plant's states.

        The launch path's plant gate counts this subscription, so the lockstep run starts only once
        it exists (the spinning executor picks it up).
        """
        self.node.create_subscription(state_type, state_topic, self._on_state, 10)

    def target_listeners(self) -> int:
        """Subscriptions matched to /diffsim/target (the controller's, once discovered)."""
        return self.pub_target.get_subscription_count()

    def send_target(self, point) -> None:
        """Send a new goal to the controller (/diffsim/target, geometry_msgs/PointStamped, world frame)."""
        m = self._point()
        m.header.frame_id = "world"
        m.point.x, m.point.y, m.point.z = (float(x) for x in point)
        self.pub_target.publish(m)

    def _spin(self) -> None:
        while not self.done.is_set():
            try:
                self.ex.spin_once(timeout_sec=0.05)
            except Exception:  # noqa: BLE001 - the context is shut down at close()
                return

    def close(self) -> None:
        import rclpy

        self.done.set()
        self.thread.join(timeout=2)
        self.ex.shutdown()
        self.node.destroy_node()
        rclpy.shutdown(context=self.ctx)


def state_topic_and_type(floating_base: bool):
    """Return the topic the stand-in publishes its states on and its message type.

    /odom (Odometry) for a floating base, /joint_states (JointState) for a fixed one.
    """
    if floating_base:
        from nav_msgs.msg import Odometry as state_type
        return interfaces.ODOM, state_type
    from sensor_msgs.msg import JointState as state_type
    return interfaces.JOINT_STATES, state_type


class _NodeRun:
    """What :func:`run_deployment`'s body opened: the clock that follows the plant (None until then)."""

    def __init__(self) -> None:
        self.clock: Optional[_Clock] = None


def run_deployment(procs, logs: Path, tag: str, body: Callable[[_NodeRun], None], log=print) -> float:
    """Run ``body(run)``, then, whatever happened, close the clock and stop the nodes.

    ``body`` starts the nodes of ``procs``, opens the clock that follows them as ``run.clock`` and
    follows the run. The nodes are stopped by :func:`stop_nodes` (the recorder last, which closes
    the bag). A Ctrl-C is logged (``[tag]``) and raised again once the nodes are stopped; a node
    that ended with an error status is a LoopError (:func:`check_exits`). Returns the seconds it
    took (the nodes stopped included).
    """
    run = _NodeRun()
    interrupted = False
    t0 = time.perf_counter()
    try:
        body(run)
    except KeyboardInterrupt:
        interrupted = True
        log(f"[{tag}] interrupted: stopping the nodes and closing the bag")
    finally:
        if run.clock is not None:
            run.clock.close()
        statuses = stop_nodes(procs)
    wall = time.perf_counter() - t0
    if interrupted:
        raise KeyboardInterrupt
    check_exits(statuses, logs)
    return wall


def follow_run(clock: "_Clock", procs, total_s: float, deadline: float, what: str, too_slow: str, logs: Path,
               tag: str, log=print, each: Optional[Callable[[], None]] = None) -> None:
    """Wait, in steps of 50 ms, until the plant's clock reaches ``total_s`` of simulated time.

    Each whole second it reaches is logged (``[tag]``); ``each()`` runs first in every step. A
    LoopError when a node has exited (``procs.check_alive(what)``) or the wall clock passes
    ``deadline`` (``too_slow``, then how far it got and where the logs are).
    """
    shown = -1
    while clock.t < total_s:
        if each is not None:
            each()
        procs.check_alive(what)
        if time.monotonic() > deadline:
            raise LoopError(f"{too_slow} (reached {max(clock.t, 0):.2f} s); see the logs in {logs}")
        if int(clock.t) > shown and clock.t >= 0:
            shown = int(clock.t)
            log(f"[{tag}]     simulated time {clock.t:.2f} s")
        time.sleep(0.05)


def _write_params(path: Path, node: str, params: Dict[str, Any]) -> None:
    """Write a ROS 2 parameter file for one node (dotted names nested, as ROS reads them)."""
    import yaml

    nested: Dict[str, Any] = {}
    for key, val in params.items():
        *parents, leaf = key.split(".")
        d = nested
        for part in parents:
            d = d.setdefault(part, {})
        d[leaf] = val
    path.write_text(yaml.safe_dump({node: {"ros__parameters": nested}}, sort_keys=False))


def recorded_types(floating_base: bool, kind: Optional[str] = None) -> List[str]:
    """'topic:type' of everything the loop records (doc/interfaces.md).

    ``kind`` 'legged': odometry, IMU and joint states in, joint position commands out.
    """
    ifc = interfaces
    common = [ifc.typed(ifc.COMMAND, ifc.FLOAT64_ARRAY_T), ifc.typed(ifc.METADATA, ifc.STRING_T),
              ifc.typed(ifc.DIAGNOSTICS, "diagnostic_msgs/msg/DiagnosticArray"),
              ifc.typed(ifc.CLOCK, "rosgraph_msgs/msg/Clock")]
    position_commands = ifc.typed(ifc.CONTROLLER_COMMANDS[0], ifc.FLOAT64_ARRAY_T)
    if kind == "legged":
        return common + [ifc.typed(ifc.ODOM, ifc.ODOMETRY_T), ifc.typed(ifc.IMU, ifc.IMU_T),
                         ifc.typed(ifc.JOINT_STATES, ifc.JOINT_STATE_T), position_commands]
    if floating_base:
        return common + [ifc.typed(ifc.ODOM, ifc.ODOMETRY_T), ifc.typed(ifc.IMU, ifc.IMU_T),
                         ifc.typed(ifc.CMD_CTBR, ifc.TWIST_STAMPED_T), ifc.typed(ifc.PREDICTED_STATE, ifc.ODOMETRY_T)]
    return common + [ifc.typed(ifc.JOINT_STATES, ifc.JOINT_STATE_T), position_commands,
                     ifc.typed(ifc.PREDICTED_STATE, ifc.JOINT_STATE_T)]


def bag_counts(bag: Path) -> Dict[str, int]:
    """Messages per topic in a rosbag2 directory."""
    from rosbags.highlevel import AnyReader

    counts: Dict[str, int] = {}
    with AnyReader([bag]) as reader:
        for conn in reader.connections:
            counts[conn.topic] = counts.get(conn.topic, 0) + conn.msgcount
    return counts


def _recorded_training_file(ckpt: Path, recorded: Dict[str, Any]) -> Dict[str, Any]:
    """Return the parameters of the training file an older checkpoint names (``config: {file, task}``).

    That path, else the file of the same name in this package's config/, accepted only when its
    task section is the one recorded (another task's file would deploy the policy on the wrong
    task).
    """
    from .. import config as cfgmod

    name = Path(recorded["file"])
    share = cfgmod.package_share()
    for path in [name] + ([share / "config" / name.name] if share is not None else []):
        if not path.is_file():
            continue
        params = cfgmod.load_yaml(str(path))
        if "task" in recorded and params.get("task") != recorded["task"]:
            raise LoopError(f"{ckpt}: the checkpoint was trained with {name}; {path} has another task section "
                            "now; pass --config with the robot's training YAML")
        return dict(params, urdf=str(cfgmod.resolve_urdf(params, str(path))))
    raise LoopError(f"{ckpt}: the checkpoint names its training file {name}, which is not there (nor in "
                    "the package's config/); pass --config with the robot's training YAML")


def checkpoint_config(ckpt: Path, out: Path) -> str:
    """Write a ROS parameter file for the stand-in from the checkpoint's own training configuration.

    The configuration gives robot, simulator and task, with the URDF the checkpoint names resolved
    to a path.
    """
    import yaml

    from ..learning.checkpoint import CheckpointError, load_metadata
    from ..learning.deploy import resolve_urdf_source

    meta = load_metadata(ckpt)
    params = meta.get("config")
    if isinstance(params, dict) and "urdf" not in params and isinstance(params.get("file"), str):
        params = _recorded_training_file(ckpt, params)
    if not isinstance(params, dict) or "urdf" not in params:
        raise LoopError(f"{ckpt}: the checkpoint does not carry its training configuration ('config' in "
                        "policy.json); pass --config with the robot's training YAML")
    try:
        params = dict(params, urdf=resolve_urdf_source(meta, str(ckpt)))
    except CheckpointError as e:
        raise LoopError(str(e)) from None
    path = out / "robot_from_checkpoint.yaml"
    path.write_text("# written by diffsim-ros loop from " + str(ckpt) + "\n"
                    + yaml.safe_dump({"/**": {"ros__parameters": params}}, sort_keys=False))
    return str(path)


def _legged_result(bag: Path, runner) -> Dict[str, Any]:
    """Judge the stand-in's recorded episode by the locomotion task's own verdict.

    /odom and /joint_states are paired by stamp into simulator states; the result holds the task's
    success over its first episode (horizon steps), and the mean forward speed and lowest base
    height of the run. A jump's verdict is its metric on the recorded episode (``jump_metric``,
    Task.recorded_verdict).
    """
    import numpy as np
    import torch

    from ..analysis.bag import read_legged_states
    from ..tasks.base import TaskState

    stamps, qb, vb, names, _ = read_legged_states(Path(bag))      # at least two pairs, or AnalysisError
    states = [runner.legged_state(names, qb[i, 7:].tolist(), vb[i, 6:].tolist(), qb[i, 0:3].tolist(),
                                  qb[i, 3:7].tolist(), vb[i, 0:3].tolist(), vb[i, 3:6].tolist())
              for i in range(len(stamps))]
    task = runner.task
    horizon = min(int(task.horizon), len(states) - 1)
    target = runner.target_tensor(None)
    with torch.no_grad():
        ts = TaskState(states[0], target)
        ts.extra = {k: v.clone() for k, v in task.reset(1, torch.Generator().manual_seed(0)).extra.items()}
        ts.extra["x0"] = states[0].q[:, 0].clone()
        # Contact is judged from each recorded state (no simulator step produced these states).
        ts.extra["replayed"] = torch.ones(1, dtype=torch.bool)
        for k in range(1, horizon + 1):
            ts = TaskState(states[k], target, k, dict(ts.extra))
            task.update_extra(ts, torch.zeros(1, task.action_dim, dtype=states[k].q.dtype))
        ok = bool(task.success(ts)[0])
        mean_speed = float(task.mean_speed(ts)[0])
    x = np.array([float(s.q[0, 0]) for s in states])
    z = np.array([float(s.q[0, 2]) for s in states])
    duration = (stamps[-1] - stamps[0]) * 1e-9
    res: Dict[str, Any] = {
        "episode_steps": horizon, "success": ok, "episode_mean_forward_speed_m_s": mean_speed,
        "success_speed_m_s": float(task.success_speed), "run_mean_forward_speed_m_s":
        float((x[-1] - x[0]) / duration) if duration > 0 else float("nan"),
        "min_base_height_m": float(z.min()), "fall_height_m": float(task.fall_height),
        "steps_recorded": len(states)}
    from ..tasks.jump import JumpTask

    if isinstance(task, JumpTask):
        # The jump's metric on the recorded arrays of the first episode (base pose, contact from
        # each recorded state): the same parts the task's flags above judge.
        t = (np.array(stamps[:horizon + 1], dtype=np.float64) - stamps[0]) * 1e-9
        q = np.array([s.q[0].double().numpy() for s in states[:horizon + 1]])
        v = np.array([s.v[0].double().numpy() for s in states[:horizon + 1]])
        res["jump_metric"] = task.recorded_verdict(t, q, v, None)
        res["success"] = res["jump_metric"]["success"]
    if getattr(task, "command_speed", None):
        # The strict metric on the recorded arrays of the first episode, gait rules included (the
        # task's verdict above comes from its own flags; both must agree).
        t = (np.array(stamps[:horizon + 1], dtype=np.float64) - stamps[0]) * 1e-9
        q = np.array([s.q[0].double().numpy() for s in states[:horizon + 1]])
        v = np.array([s.v[0].double().numpy() for s in states[:horizon + 1]])
        res["strict_metric"] = task.recorded_verdict(t, q, v, target[0].double().numpy())
    return res


def _rounded(values) -> str:
    """Per-foot numbers of the strict metric, two decimals (None where a foot has none)."""
    if values is None:
        return ""
    return "[" + ", ".join("-" if x is None else f"{float(x):.2f}" for x in values) + "]"


def _arm_result(data, runner, targets, hold_s: float) -> Dict[str, Any]:
    """Per target (each held ``hold_s`` of simulated time, in sequence): success, distance and joint speed.

    The reach task's own success at the end of its segment, the end effector's distance, and the
    largest joint speed measured in the segment as a multiple of the joint's URDF velocity limit.
    """
    import numpy as np
    import torch

    from ..tasks.base import TaskState

    task = runner.task
    t = (data.t_state - data.t_state[0]) * 1e-9
    vlim = runner.model.velocity_limit.double().numpy()
    out = []
    for k, tgt in enumerate(targets):
        seg = np.nonzero((t >= k * hold_s) & (t < (k + 1) * hold_s))[0]
        if seg.size == 0:
            out.append({"target": list(tgt), "success": False, "reason": "no state recorded in its segment"})
            continue
        i = seg[-1]
        state = runner.arm_state(data.joint_names, data.q[i].tolist(), data.v[i].tolist())
        idx = runner.joint_index(data.joint_names)
        speed = np.abs(data.v[seg][:, idx]) / np.where(vlim > 0, vlim, np.inf)
        with torch.no_grad():
            ts = TaskState(state, runner.target_tensor(tgt))
            ok, dist = bool(task.success(ts)[0]), float(task.distance(ts)[0])
        out.append({"target": [float(x) for x in tgt], "success": ok, "final_distance_m": dist,
                    "max_speed_over_velocity_limit": float(speed.max()),
                    "within_velocity_limits": bool(speed.max() <= 1.0)})
    return {"targets": out, "hold_s": hold_s, "success": all(r["success"] for r in out),
            "tolerance": {"distance_m": float(task.success_distance), "ee_speed_m_s": float(task.success_speed)}}


def train_policy(config: str, out: Path, threads: int, iterations: Optional[int] = None) -> Path:
    """Train with the training file ``config`` into ``out`` in this process and print its summary.

    This is the training path of ``diffsim-ros train``
    (:func:`diffsim_ros.workflows.training.train_from_params`); returns the checkpoint folder.
    ``out`` is the loop's own policy/ folder: a rerun into the same --out retrains it from the
    start (a fresh run, as ``diffsim-ros train --force``).
    """
    import warnings

    import torch

    from .. import config as _config
    from .training import print_summary, train_from_params, written_files

    torch.set_num_threads(threads)
    out = Path(out)
    before = set(os.listdir(out)) if out.is_dir() else set()
    t0 = time.perf_counter()
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            params, task, model = _config.load_training_file(config)
        for w in caught:
            if issubclass(w.category, UserWarning):
                print(f"warning: {w.message}", file=sys.stderr)
        task, result, _ = train_from_params(params, config, out, {"iterations": iterations}, progress=True,
                                            task=task)
    except _config.input_errors() as exc:
        raise LoopError(f"training failed: {_config.describe_input_error(exc, config)}") from None
    print_summary("train", task, model, result, str(out), written_files(str(out), before), time.perf_counter() - t0)
    sys.stdout.flush()
    return out


@dataclass
class _Deployment:
    """What :func:`run_loop` deploys and how.

    The checkpoint and its runner, the robot's parameter file, the bag and logs folders, the ROS
    domain, the parameters of mujoco_plant and policy_controller, an arm's targets each held
    ``hold_s`` of simulated time (``total`` in all), the state topic the loop follows, and the time
    limits (seconds).
    """

    runner: Any
    ckpt: Path
    config: str
    bag: Path
    logs: Path
    domain: int
    plant: Dict[str, Any]
    controller: Dict[str, Any]
    targets: Optional[List[List[float]]]
    hold_s: float
    total: float
    state_topic: str
    state_type: Any
    timeout: float
    first_state_timeout: float

    @property
    def arm(self) -> bool:
        """The checkpoint drives an arm (targets sent over /diffsim/target)."""
        return self.runner.kind == "arm"


class _TargetSequence:
    """An arm's targets switched by simulated time (each held ``hold_s``) and streamed to the controller."""

    def __init__(self, clock: "_Clock", targets: List[List[float]], hold_s: float, log):
        self.clock, self.targets, self.hold_s, self.log = clock, targets, hold_s, log
        self.next = 1

    def __call__(self) -> None:
        """Switch to the next target when its time has come; stream the current one after the first."""
        clock, targets = self.clock, self.targets
        if self.next < len(targets) and clock.t >= self.next * self.hold_s:
            self.log(f"[loop]     target {self.next + 1}/{len(targets)}: {targets[self.next]}")
            self.next += 1
        if self.next > 1:
            # Streamed, as a setpoint is (the controller takes an unchanged target silently): one
            # message lost to a late discovery or a full queue does not leave the old goal in place.
            clock.send_target(targets[self.next - 1])


def _run_folders(out: str) -> Tuple[Path, Path, Path]:
    """``out`` resolved and created, its ``logs/`` (created) and its ``bag/``.

    A LoopError when the bag is there already (a recorded bag is never overwritten).
    """
    out_dir = Path(out).resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    logs = out_dir / "logs"
    logs.mkdir(exist_ok=True)
    bag = out_dir / "bag"
    if bag.exists():
        raise LoopError(f"{bag} already exists: choose another --out (a recorded bag is never overwritten)")
    return out_dir, logs, bag


def _perturbation_request(perturbation: Union[str, Dict[str, Any], None]) -> Dict[str, Any]:
    """Return the stand-in's perturbation as asked (DEFAULT_PERTURBATION for None), checked before anything runs.

    A preset's values follow the robot's kind later (:func:`_standin_perturbation`).
    """
    from ..physics import ConfigError
    from ..plant.perturbation import perturbation_spec

    try:
        return perturbation_spec(DEFAULT_PERTURBATION if perturbation is None else perturbation)
    except ConfigError as e:
        raise LoopError(str(e)) from None


def _loop_config(config: Optional[str], checkpoint: Optional[str], out_dir: Path, log) -> str:
    """Return the robot's parameter file, resolved.

    ``config``, else one written from the checkpoint's own training configuration; a LoopError
    with neither.
    """
    if config is None:
        if checkpoint is None:
            raise LoopError("neither a training configuration nor a checkpoint to deploy")
        config = checkpoint_config(Path(checkpoint).resolve(), out_dir)
        log(f"[loop] robot, simulator and task from the checkpoint: {config}")
    return str(Path(config).resolve())


def _loop_checkpoint(config: str, checkpoint: Optional[str], out_dir: Path, threads: int,
                     iterations: Optional[int], log) -> Tuple[Path, float]:
    """Step 1: the checkpoint to deploy and the seconds it took.

    The checkpoint is ``checkpoint``, else a policy trained with ``config`` into ``out_dir/policy``.
    """
    t0 = time.perf_counter()
    if checkpoint is None:
        log(f"[loop] 1/4 training a policy with {config}")
        ckpt = train_policy(config, out_dir / "policy", threads, iterations)
    else:
        ckpt = Path(checkpoint).resolve()
        log(f"[loop] 1/4 using the checkpoint {ckpt}")
    return ckpt, time.perf_counter() - t0


def _standin_perturbation(spec: Dict[str, Any], runner) -> Tuple[Dict[str, Any], Dict[str, Any]]:
    """Resolve the perturbation ``spec`` for the checkpoint's robot kind.

    Returns it resolved, and as mujoco_plant's ``perturbation.*`` parameter values.
    """
    from ..physics import ConfigError
    from ..plant.perturbation import resolve_perturbation, robot_kind, ros_values

    try:
        perturbation = resolve_perturbation(spec, robot_kind(runner.kind))
        return perturbation, ros_values(perturbation, "--perturb")
    except ConfigError as e:
        raise LoopError(str(e)) from None


def _start_pose(start: Optional[Sequence[float]], runner):
    """Return the stand-in's initial positions.

    ``start``, else a legged task's standing pose at its base height (the stand-in's neutral
    configuration would put the trunk into the ground), else the task's own.
    """
    import torch

    task = runner.task
    if start is None and runner.kind == "legged":
        with torch.no_grad():
            start = task.reset(1, torch.Generator().manual_seed(0)).sim.q[0].double().tolist()
    if start is None:
        start = task.deployment_start()
    return start


def _arm_targets(targets: Optional[Sequence[Sequence[float]]], n_targets: int, runner) -> List[List[float]]:
    """Return an arm's targets as points [x, y, z] (m).

    ``targets``, else ``n_targets`` drawn from the task's reset distribution; a LoopError for
    anything but points.
    """
    import torch

    if targets is None:
        with torch.no_grad():
            drawn = runner.task.reset(int(n_targets), torch.Generator().manual_seed(0)).target
        targets = drawn.double().tolist()
    points = [[float(x) for x in tg] for tg in targets]
    if not points or any(len(tg) != 3 for tg in points):
        raise LoopError(f"targets must be points [x, y, z] (m), got {points}")
    return points


def _deployment_path(use_launch: Optional[bool]) -> Optional[str]:
    """Why the nodes are started one by one rather than through deploy.launch.py (None: through launch).

    A LoopError when launch was asked for and cannot run here.
    """
    why_not = launch_unavailable() if use_launch is not False else "the subprocess path was asked for"
    if use_launch and why_not:
        raise LoopError(f"cannot deploy through deploy.launch.py: {why_not}")
    return why_not


def _start_through_launch(procs: "_Launch", dep: _Deployment, log) -> None:
    """Start the nodes the user's way: deploy.launch.py starts controller, plant and recorder together.

    The controller holds its first command until the plant and the recorder listen.
    """
    logs = dep.logs
    _write_params(logs / "controller_params.yaml", "policy_controller", dep.controller)
    # The plant's start gate counts each state topic's subscribers: deploy.launch.py's two (the
    # controller and the recorder) and, on the one state topic it follows, this process (_Clock).
    # With two, the gate could open on the controller and this process before the recorder's
    # reader had matched, and the bag lost the states published until then (test_loop's arm
    # run, about one run in six; once all but the last 22 of 128). A legged robot has a second
    # state topic (/joint_states beside /odom) that only the controller and the recorder read,
    # whose gate of two already waits for the recorder.
    gate = 2 if dep.runner.kind == "legged" else 3
    _write_params(logs / "plant_params.yaml", "mujoco_plant", dict(dep.plant, wait_for_subscribers=gate))
    arguments: Dict[str, Any] = {
        "target": "mujoco", "checkpoint": str(dep.ckpt), "config": dep.config, "lockstep": True, "record": True,
        "bag": str(dep.bag), "controller_params": str(logs / "controller_params.yaml"),
        "plant_params": str(logs / "plant_params.yaml")}
    if dep.arm:
        arguments["target_point"] = cast(List[List[float]], dep.targets)[0]
    procs.start(arguments)
    log(f"[loop]     {' '.join(procs.command)}")


def _start_recorder_and_plant(procs: "_Processes", dep: _Deployment) -> None:
    """Start the nodes one by one: the recorder, then the lockstep plant.

    The controller follows once the plant's states arrive (:func:`_start_controller`).
    """
    # Types given up front: the recorder subscribes at once instead of discovering the
    # publishers, so the first states are not lost to discovery.
    floating = dep.runner.model.floating_base
    procs.start("recorder", "trajectory_recorder", {
        "output_dir": str(dep.bag), "drain_s": 1.0, "types": json.dumps(recorded_types(floating, dep.runner.kind))})
    procs.start("plant", "mujoco_plant", dict(dep.plant, config=dep.config, mode="lockstep"))


def _open_clock(procs, dep: _Deployment, run: _NodeRun, log) -> "_Clock":
    """Open the clock that follows the plant's states, kept in ``run`` as soon as it exists.

    Keeping it there means it is closed whatever follows. Through launch with several arm targets,
    it follows the states only once the controller listens to /diffsim/target (or after
    first_state_timeout).
    """
    if isinstance(procs, _Launch) and dep.arm and len(cast(List[List[float]], dep.targets)) > 1:
        # A target sent before the controller's subscription is matched is lost, and a lockstep run
        # reaches the switch in a fraction of a second (test_loop: the second target never arrived,
        # one CI run). The plant's start gate counts this process's state subscription, so following
        # the states only once the controller listens to /diffsim/target holds the run until then.
        run.clock = clock = _Clock(dep.domain)
        listen = time.monotonic() + dep.first_state_timeout
        while clock.target_listeners() < 1 and time.monotonic() < listen:
            procs.check_alive("waiting for the controller's /diffsim/target subscription")
            time.sleep(0.05)
        if clock.target_listeners() < 1:
            log(f"[loop]     the controller's /diffsim/target subscription was not matched within "
                f"{dep.first_state_timeout:g} s: the later targets may arrive late")
        clock.follow_states(dep.state_topic, dep.state_type)
        return clock
    run.clock = _Clock(dep.domain, dep.state_topic, dep.state_type)
    return run.clock


def _wait_first_states(clock: "_Clock", procs, dep: _Deployment, end: float) -> None:
    """Wait until two of the plant's states have arrived.

    A LoopError naming the likely causes when none came within first_state_timeout (through launch,
    counted from the plant's start) or by ``end``.
    """
    # Until its first command the lockstep plant republishes its initial state every second.
    # Two of them seen here mean the plant's publishers are discovered, so the recorder
    # (subscribed since its start) does not miss the first states once the controller runs.
    first_state_timeout = dep.first_state_timeout
    first = None if isinstance(procs, _Launch) else time.monotonic() + min(first_state_timeout, dep.timeout)
    while clock.states < 2:
        procs.check_alive("waiting for the stand-in's first states")
        if first is None and procs.started("plant"):
            # Counted from the plant's start: launch itself takes a while to import and start it.
            first = time.monotonic() + first_state_timeout
        if time.monotonic() > (end if first is None else min(first, end)):
            raise LoopError(
                f"mujoco_plant published no state on {dep.state_topic} within {first_state_timeout:g} s. Likely "
                f"causes: the stand-in is still starting on a loaded machine, or its robot is not the "
                f"checkpoint's ({dep.runner.kind}: {dep.state_topic} expected); mujoco_plant's log "
                f"({dep.logs / 'plant.log'}) ends with:\n{procs.log('plant', 1500)}")
        time.sleep(0.05)


def _start_controller(procs: "_Processes", dep: _Deployment) -> None:
    """policy_controller started on its own (the nodes-one-by-one path), in lockstep with the plant."""
    procs.start("controller", "policy_controller", dict(dep.controller, **{
        "checkpoint": str(dep.ckpt), "config": dep.config, "lockstep": True,
        # The plant stamps its states with simulated time and publishes it on /clock: the
        # controller's stamp rule compares against that clock.
        "use_sim_time": True,
        # The plant and the recorder listen to the command; the recorder to the bookkeeping topics.
        "wait_for_subscribers": 2, "wait_for_recorders": 1,
        **({"target": cast(List[List[float]], dep.targets)[0]} if dep.arm else {})}))


def _deploy(procs, dep: _Deployment, run: _NodeRun, log) -> None:
    """Step 2's body (:func:`run_deployment`): start the nodes and run until ``dep.total`` simulated seconds.

    Follow the plant's states from the first two on, and stream an arm's targets.
    """
    if isinstance(procs, _Launch):
        _start_through_launch(procs, dep, log)
    else:
        _start_recorder_and_plant(procs, dep)
    clock = _open_clock(procs, dep, run, log)
    end = time.monotonic() + dep.timeout
    _wait_first_states(clock, procs, dep, end)
    if not isinstance(procs, _Launch):
        _start_controller(procs, dep)
    stream = _TargetSequence(clock, cast(List[List[float]], dep.targets), dep.hold_s, log) if dep.arm else None
    follow_run(clock, procs, dep.total, end, "the loop ran",
               f"the loop did not reach {dep.total} s of simulated time within {dep.timeout} s", dep.logs, "loop",
               log, each=stream)


def _standin_summary(out_dir: Path, dep: _Deployment, summary: Dict[str, Any], log) -> Dict[str, Any]:
    """Step 4 for an arm or a multirotor: the bag analysed, the verdict and the velocity errors.

    The bag is analysed (analysis/); the task's verdict on the recording is a multirotor's, or each
    arm target's; with the velocity errors, this is written to summary.json and logged.
    """
    from .. import analysis

    runner, bag = dep.runner, dep.bag
    data = analysis.read_bag(str(bag))
    metrics = analysis.analyze(str(bag), out_dir=str(out_dir / "analysis"), data=data)
    summary.update({"simulated_s": data.duration_s, "states_recorded": int(len(data.t_state))})
    if data.kind == "quadrotor":
        target = runner.target_tensor(None)[0].numpy()
        verdict = runner.task.recorded_verdict(data.t_state * 1e-9, data.q, data.v, target)
        if verdict is not None:
            summary["task"] = dict(verdict, target=target.tolist())
    if dep.arm:
        summary["task"] = _arm_result(data, runner, dep.targets, dep.hold_s)
    summary["velocity_error"] = _velocity_error(metrics)
    summary["online_prediction"] = metrics.get("online_prediction")
    summary["analysis_files"] = metrics.get("files", {})
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=2, default=str))
    log("[loop] 4/4 sim-vs-real summary")
    for line in format_summary(summary, metrics):
        log(line)
    return summary


def run_loop(config: Optional[str], out: str, checkpoint: Optional[str] = None, duration: float = 4.0,
             perturbation: Union[str, Dict[str, Any], None] = None, start: Optional[Sequence[float]] = None,
             threads: int = 1, iterations: Optional[int] = None, domain: Optional[int] = None,
             timeout: float = 600.0, first_state_timeout: float = 30.0,
             targets: Optional[Sequence[Sequence[float]]] = None, n_targets: int = 3,
             use_launch: Optional[bool] = None, log=print) -> Dict[str, Any]:
    """Train (or take ``checkpoint``), deploy on the MuJoCo stand-in, record, analyse.

    ``config`` None with a ``checkpoint``: the robot, simulator and task the checkpoint was
    trained with (its stored configuration). ``first_state_timeout``: seconds the stand-in has
    to publish its first states before the loop stops with the likely cause. Arms: ``targets``
    (points, m; default ``n_targets`` drawn from the task's reset distribution) are reached in
    sequence, each for ``duration`` simulated seconds. ``perturbation``: the stand-in's, a mapping
    of ``plant.Perturbation`` fields (a ``preset`` name among them) or the text form of
    ``--perturb`` (``hardware,latency=0.015``), a preset taking the values of the checkpoint's robot
    kind (``plant.resolve_perturbation``); None: DEFAULT_PERTURBATION. ``use_launch``: deploy through
    ``ros2 launch diffsim_ros deploy.launch.py`` (True), start the nodes one by one (False), or the
    first where launch is installed and the package is in the ament index (None).
    Returns a summary dict (also written to ``out/summary.json``).
    """
    import torch

    torch.set_num_threads(threads)
    out_dir, logs, bag = _run_folders(out)
    spec = _perturbation_request(perturbation)
    config = _loop_config(config, checkpoint, out_dir, log)
    ckpt, t_train = _loop_checkpoint(config, checkpoint, out_dir, threads, iterations, log)

    from ..learning.deploy import PolicyRunner

    runner = PolicyRunner(str(ckpt))
    _check_same_robot(config, runner)
    perturbation, plant_perturbation = _standin_perturbation(spec, runner)
    start = _start_pose(start, runner)
    arm_targets = _arm_targets(targets, n_targets, runner) if runner.kind == "arm" else None
    hold_s = float(duration)
    total = hold_s * (len(arm_targets) if arm_targets is not None else 1)
    domain = random.randint(101, 232) if domain is None else int(domain)
    why_not = _deployment_path(use_launch)
    log(f"[loop] 2/4 deploying on the MuJoCo stand-in (ROS_DOMAIN_ID={domain}, perturbation "
        f"{json.dumps(perturbation)}), recording to {bag}")
    if why_not:
        log(f"[loop]     nodes started one by one ({why_not})")
        procs: Any = _Processes(logs, domain)
    else:
        procs = _Launch(logs, domain)
    state_topic, state_type = state_topic_and_type(runner.model.floating_base)
    controller = {"state_timeout_s": 5.0, "stats_file": str(logs / "controller_stats.json")}
    # As mujoco_plant declares them: vectors as lists of floats, floats as floats, null as its stand-in.
    plant: Dict[str, Any] = {f"perturbation.{k}": v for k, v in plant_perturbation.items()}
    if start is not None:
        plant["initial_positions"] = [float(x) for x in start]
    dep = _Deployment(runner, ckpt, config, bag, logs, domain, plant, controller, arm_targets, hold_s, total,
                      state_topic, state_type, timeout, first_state_timeout)
    t_deploy = run_deployment(procs, logs, "loop", lambda run: _deploy(procs, dep, run, log), log)

    log(f"[loop] 3/4 analysing {bag}")
    summary = _run_summary(ckpt, bag, perturbation, logs, {"train": t_train, "deploy": t_deploy},
                           " ".join(procs.command) if isinstance(procs, _Launch) else "nodes started one by one")
    if runner.kind == "legged":
        return _legged_summary(out_dir, bag, runner, summary, log)
    return _standin_summary(out_dir, dep, summary, log)


def _check_same_robot(config: str, runner) -> None:
    """Refuse a configuration whose robot is not the checkpoint's before anything starts."""
    from .. import config as cfgmod

    try:
        params = cfgmod.load_yaml(config)
        urdf = cfgmod.resolve_urdf(params, config)
    except cfgmod.ConfigError as e:
        raise LoopError(str(e)) from None
    floating = bool(params.get("floating_base", False))
    if floating != bool(runner.model.floating_base):
        raise LoopError(f"{config} describes a {'floating' if floating else 'fixed'}-base robot ({urdf}); the "
                        f"checkpoint is for '{runner.model.name}' ({runner.kind}). Leave --config out to deploy "
                        "the checkpoint's own robot")


def _run_summary(ckpt: Path, bag: Path, perturbation: Dict[str, Any], logs: Path, wall_s: Dict[str, float],
                 deployment: str) -> Dict[str, Any]:
    """Return what every run reports.

    Its inputs, how it was deployed, what the controller published and whether the bag holds every
    message of it (``lost``: topic -> messages missing).
    """
    summary: Dict[str, Any] = {"checkpoint": str(ckpt), "bag": str(bag), "perturbation": perturbation,
                               "deployment": deployment, "wall_s": wall_s}
    stats_file = logs / "controller_stats.json"
    if stats_file.exists():
        stats = json.loads(stats_file.read_text())
        summary["controller"] = {k: stats[k] for k in ("published", "states_rejected", "safe_commands")
                                 if k in stats}
        counts = bag_counts(bag)
        summary["bag_counts"] = counts
        summary["lost"] = {t: n - counts.get(t, 0) for t, n in stats.get("published", {}).items()
                           if counts.get(t, 0) != n}
    return summary


def _legged_summary(out_dir, bag, runner, summary, log) -> Dict[str, Any]:
    """Summary of a legged run.

    The task's verdict from the bag, its gait, the sim-vs-real velocity comparison (base twist and
    joints) and the bag's completeness.
    """
    from .. import analysis
    from ..analysis.legged import legged_report

    res = _legged_result(bag, runner)
    rep = legged_report(bag, out_dir / "analysis")
    metrics = analysis.analyze(str(bag), out_dir=str(out_dir / "analysis"))
    summary.update({"kind": "legged", "task": res, "gait": rep["gait"],
                    "analysis_files": {**rep["files"], **metrics.get("files", {})},
                    "velocity_error": _velocity_error(metrics), "mass_contact_free": _contact_free_mass(bag),
                    "odometry": rep.get("odometry")})
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=2, default=str))
    log("[loop] 4/4 summary (legged)")
    log(f"  bag: {bag} ({res['steps_recorded']} steps with odometry and joint states)")
    m = res.get("strict_metric")
    jump = res.get("jump_metric")
    if jump is not None:
        task = runner.task
        log(f"  jump on the stand-in: first episode ({res['episode_steps']} steps), apex {jump['apex_m']:.3f} m above "
            f"standing ({task.min_apex:g} needed), feet off the ground there: {jump['airborne_at_apex']}; lowest "
            f"base {jump['min_height_m']:.3f} m (above {task.fall_height:.3f}); largest roll/pitch "
            f"{jump['max_tilt_rad']:.2f} rad (within {task.max_tilt:g}); only feet touching: "
            f"{jump['only_feet_touch']} -> {'SUCCESS' if jump['success'] else 'not a success'}")
    elif m is not None and "reason" in m:         # too short to judge (a run shorter than the window)
        log(f"  velocity command on the stand-in: {m['reason']} -> not a success")
    elif m is not None:
        log(f"  velocity command on the stand-in: first episode ({res['episode_steps']} steps), command "
            f"{m['command_m_s']:.3f} m/s, mean speed over its last {runner.task.window_s:g} s "
            f"{m['window_speed_m_s']:.3f} m/s (within {100 * runner.task.speed_tolerance:g} % needed); lowest base "
            f"{m['min_height_m']:.3f} m (above {runner.task.min_height:.3f}); largest roll/pitch "
            f"{m['max_tilt_rad']:.2f} rad (within {runner.task.max_tilt:g}); only feet touching: "
            f"{m['only_feet_touch']}; every foot stepping (>= {runner.task.min_touchdown_rate:g}/s): "
            f"{m.get('steps_ok')} {_rounded(m.get('touchdowns_per_s'))}; no foot sliding (< "
            f"{runner.task.max_foot_slide:g} m/s): {m.get('no_slide_ok')} {_rounded(m.get('foot_slide_m_s'))} -> "
            f"{'SUCCESS' if res['success'] else 'not a success'}")
    else:
        log(f"  locomotion on the stand-in: first episode ({res['episode_steps']} steps) mean forward speed "
            f"{res['episode_mean_forward_speed_m_s']:.3f} m/s (success above {res['success_speed_m_s']:g}); lowest "
            f"base height {res['min_base_height_m']:.3f} m (fall below {res['fall_height_m']:.3f}) -> "
            f"{'SUCCESS' if res['success'] else 'not a success'}")
    log(f"  whole run: mean forward speed {res['run_mean_forward_speed_m_s']:.3f} m/s")
    g = rep["gait"] or {}
    log(f"  gait: {g.get('gait', 'n/a')} (stride frequency {g.get('stride_frequency_hz')} Hz, duty factors "
        f"{g.get('duty_factor')}); foot slip {rep.get('foot_slip_m_s')} m/s; "
        f"footfall diagram {rep['files']['footfall']}")
    od = rep.get("odometry")
    if od is not None:
        log(f"  legged odometry (joints, IMU orientation and rates) against the stand-in's /odom: forward velocity's "
            f"{od['window_s']:g} s means within {od['forward_window_error_m_s']:.3f} m/s")
    byh = metrics["prediction"]["by_horizon"]
    log("  sim-vs-real velocity RMSE (base twist and joints, 1/5/10 steps ahead): "
        + " / ".join(f"{byh[k]['rmse']:.3g}" for k in byh) + f"; plots {out_dir / 'analysis'}")
    cf = summary["mass_contact_free"]
    if "mass_scale" in cf:
        truth = summary.get("perturbation", {}).get("mass_scale", 1.0)
        log(f"  mass from the bag without the contact model (sysid --method contact-free): mass_scale "
            f"{cf['mass_scale']:.4f}, {cf['verdict']} (the stand-in's mass_scale {truth:g})")
    else:
        log(f"  mass from the bag without the contact model: not estimated ({cf['error']})")
    lost = summary.get("lost")
    log("  bag: every published message recorded" if not lost else f"  bag: MISSING messages {lost}")
    return summary


def _contact_free_mass(bag) -> Dict[str, Any]:
    """Estimate the mass of a legged bag contact-free (analysis/contact_free.py), or say why not."""
    from .. import analysis
    from ..analysis.contact_free import contact_free_mass

    try:
        data = analysis.read_bag(str(bag))
        r = contact_free_mass(data, analysis.sim_setup(data))
    except analysis.AnalysisError as exc:
        return {"error": str(exc)}
    return {"mass_scale": r.mass_scale, "std": r.std, "heldout_mass_scale": r.heldout_mass_scale,
            "explained": r.explained, "verdict": r.verdict, "reasons": r.reasons}


def _velocity_error(metrics: Dict[str, Any]) -> Dict[str, Any]:
    """Per horizon: the velocity RMSE over every dof and per dof (the summary's velocity_error)."""
    return {k: {"rmse": v["rmse"], "per_dof_rmse": {d: s["rmse"] for d, s in v["per_dof"].items()}}
            for k, v in metrics["prediction"]["by_horizon"].items()}


def format_summary(summary: Dict[str, Any], metrics: Dict[str, Any]) -> List[str]:
    lines = [f"  bag: {summary['bag']} ({summary['simulated_s']:.2f} s simulated, "
             f"{metrics['alignment']['states']} states, {metrics['alignment']['commands']} commands)"]
    c = summary.get("controller")
    if c:
        pub = ", ".join(f"{t} {n}" for t, n in c.get("published", {}).items())
        lines.append(f"  controller published: {pub}; states rejected {c.get('states_rejected', 0)}, "
                     f"safe commands {c.get('safe_commands', 0)}")
        lost = summary.get("lost")
        lines.append("  bag: every published message recorded" if not lost else f"  bag: MISSING messages {lost}")
    t = summary.get("task")
    if t and "settle_time_s" in t:
        lines.append(f"  hover on the stand-in: final distance {t['final_distance_m'] * 100:.1f} cm, final speed "
                     f"{t['final_speed_m_s']:.3f} m/s; after {t['settle_time_s']:.1f} s within "
                     f"{t['tolerance']['distance_m'] * 100:.0f} cm and {t['tolerance']['speed_m_s']} m/s on "
                     f"{t['fraction_within_tolerance_after_settling'] * 100:.0f} % of the steps -> "
                     f"{'SUCCESS' if t['success'] else 'not within tolerance'}")
    if t and "targets" in t:
        tol = t["tolerance"]
        for k, r in enumerate(t["targets"]):
            if "final_distance_m" not in r:
                lines.append(f"  reach target {k + 1} {r['target']}: {r.get('reason')}")
                continue
            lines.append(f"  reach target {k + 1} {[round(x, 3) for x in r['target']]}: final distance "
                         f"{r['final_distance_m'] * 100:.1f} cm (tolerance {tol['distance_m'] * 100:.0f} cm, ee speed "
                         f"< {tol['ee_speed_m_s']} m/s) -> {'SUCCESS' if r['success'] else 'not reached'}; fastest "
                         f"joint {r['max_speed_over_velocity_limit']:.2f}x its URDF velocity limit"
                         f"{'' if r['within_velocity_limits'] else ' (ABOVE the limit)'}")
    lines.append(f"  perturbation of the stand-in: {json.dumps(summary['perturbation'])}")
    lines.append("  velocity error, simulator replay from recorded states vs the stand-in (RMSE):")
    for k, v in summary["velocity_error"].items():
        dofs = "  ".join(f"{d} {r:.4f}" for d, r in v["per_dof_rmse"].items())
        lines.append(f"    {k:>3} step(s) ahead: all {v['rmse']:.4f}   {dofs}")
    files = summary.get("analysis_files", {})
    if files:
        lines.append("  report: " + files.get("report", ""))
    return lines
