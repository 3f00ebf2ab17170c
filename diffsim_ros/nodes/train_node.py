"""train_node: trains a policy by gradients through the simulator, as a ROS 2 node.

    ros2 run diffsim_ros train_node --ros-args -p config:=config/hover.yaml -p out:=runs/hover
    ros2 run diffsim_ros train_node --ros-args -p config:=config/reach_arm.yaml \
        -p robot_description_topic:=/robot_description -p out:=runs/reach

The same code path as ``diffsim-ros train`` (``config.build_task``,
``TrainConfig.from_mapping``, ``learning.apg.train``, ``save_checkpoint`` with
``training_summary``); the node only adds where the URDF comes from (a file
parameter, the ``robot_description`` parameter, or the latched robot_description
topic) and progress on ROS topics: one std_msgs/Float64 on ``loss_topic`` and one
diagnostic_msgs/DiagnosticArray on ``diagnostics_topic`` per iteration. It writes
the checkpoint (policy.pt, policy.json, training.csv, learning_curve.png) into
``out`` and exits 0; bad input (config, URDF) exits 2 with the reason. On the way,
as ``diffsim-ros train`` does: training.csv row by row, TensorBoard event files,
checkpoints/latest and checkpoints/best. An ``out`` that holds an earlier run is
refused (exit 2) as ``diffsim-ros train --out`` refuses it: ``force:=true`` replaces
it, and ``resume:=true`` continues a run left unfinished (stopped, killed, or lost
with its machine) where it stopped, bit for bit, with the run's own configuration:

    ros2 run diffsim_ros train_node --ros-args -p out:=runs/reach -p resume:=true

A URDF taken from robot_description is written to ``<out>/robot_description.urdf``
and trained on; the checkpoint records its sha256, so the controller refuses it
for any other robot.
"""
from __future__ import annotations

import importlib
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Dict, List, Optional, Tuple

from .. import interfaces as ifc
from ..schema import normalise, option, ros_constraints, ros_parameters, section
from ..workflows.training import occupied, resume_source, train_from_params  # the CLI's training path, shared
from . import common
from .common import StartupError, resolve_path

__all__ = ["NODE_NAME", "TrainNodeParameters", "PARAMETERS", "CONSTRAINTS", "make_node_class", "main"]

NODE_NAME = "train_node"

#: What the node uses of rclpy and the message packages (module: names), imported into ``ros`` by
#: make_node_class(): importing this module needs no rclpy.
_ROS = {"rclpy": "init spin_once try_shutdown", "rclpy.node": "Node", "rclpy.executors": "ExternalShutdownException",
        "rclpy.qos": "DurabilityPolicy QoSProfile",
        "diagnostic_msgs.msg": "DiagnosticArray DiagnosticStatus KeyValue", "std_msgs.msg": "Float64 String"}
ros = SimpleNamespace()

@section("train_node", node=True)
@dataclass(frozen=True)
class TrainNodeParameters:
    """train_node's parameters."""

    config: str = option("config/hover.yaml", "training file (config/<task>.yaml: urdf, simulator, task, training): "
                         "absolute, relative to the working directory, or to the diffsim_ros share folder")
    out: str = option("runs/train_node", "output folder: policy.pt, policy.json, training.csv, learning_curve.png, "
                      "TensorBoard event files, checkpoints/ (one holding an earlier run is refused unless force or "
                      "resume)")
    force: bool = option(False, "replace the policy or the unfinished run an earlier run left in out")
    resume: bool = option(False, "continue the unfinished run in out where it stopped (out/checkpoints/latest), with "
                          "the configuration it started with: 'config' is not read; iterations, num_envs and seed "
                          "must be left at their defaults or equal the run's")
    urdf: str = option("", "URDF file to train on instead of the config's 'urdf' (empty: the config's)")
    robot_description: str = option("", "URDF XML to train on (as robot_state_publisher's parameter); empty: not "
                                    "used")
    robot_description_topic: str = option("", "take the URDF from this latched std_msgs/String topic (e.g. "
                                          "/robot_description); empty: do not wait for it")
    robot_description_timeout_s: float = option(30.0, "how long to wait for robot_description_topic", "s", above=0)
    iterations: int = option(0, "training iterations (0: the config's training.iterations)", low=0)
    num_envs: int = option(0, "parallel episodes per iteration (0: the config's training.num_envs)", low=0)
    seed: int = option(-1, "random seed (-1: the config's training.seed)", low=-1)
    threads: int = option(1, "torch CPU threads (1 is fastest on a shared machine)", low=1)
    loss_topic: str = option(ifc.TRAIN_LOSS, "std_msgs/Float64: the mean per-step training loss of each iteration")
    diagnostics_topic: str = option(ifc.DIAGNOSTICS, "diagnostic_msgs/DiagnosticArray: progress of each iteration")

    def __post_init__(self):
        normalise(self)

#: name -> (default, description), from the section above.
PARAMETERS: Dict[str, Any] = {name: (default, text) for name, default, text in ros_parameters(TrainNodeParameters, "")}
CONSTRAINTS: Dict[str, str] = ros_constraints(TrainNodeParameters, "")


def make_node_class():
    """Build the rclpy Node subclass (built lazily so that importing this module needs no rclpy)."""
    for module, names in _ROS.items():
        ros.__dict__.update((n, getattr(importlib.import_module(module), n)) for n in names.split())
    return type("TrainNode", (_TrainNodeLogic, ros.Node), {"__module__": __name__})


class _TrainNodeLogic:
    """The node's side of train_node (parameters, the URDF topic, progress topics).

    It is mixed into rclpy's Node by make_node_class(); the training is the CLI's
    (workflows.training.train_from_params).
    """

    def __init__(self, **kw):
        super().__init__(NODE_NAME, **kw)          # rclpy.node.Node, next in the class built by make_node_class
        common.declare_all(self, ((name, default, desc) for name, (default, desc) in PARAMETERS.items()),
                           CONSTRAINTS, section=TrainNodeParameters)
        self.pub_loss = self.create_publisher(ros.Float64, self._p("loss_topic"), 10)
        self.pub_diag = self.create_publisher(ros.DiagnosticArray, self._p("diagnostics_topic"), 10)
        self._params: Dict[str, Any] = {}

    def _p(self, name: str):
        return self.get_parameter(name).value

    def train(self) -> None:
        """Run the whole training: the checkpoint written into ``out``; bad input is a StartupError."""
        import torch

        from ..learning.checkpoint import CheckpointError
        from ..physics import ConfigError, SimulationError, UrdfError

        p = self._p
        torch.set_num_threads(int(p("threads")))
        out = Path(p("out"))
        resume = bool(p("resume"))
        params, cfg_path = self._configuration(out, resume)
        self._params = params
        self._place_urdf(params, out, resume)
        overrides = {"iterations": int(p("iterations")) or None, "num_envs": int(p("num_envs")) or None,
                     "seed": None if int(p("seed")) < 0 else int(p("seed"))}
        t0 = time.monotonic()
        try:
            task, result, files = train_from_params(params, str(cfg_path), out, overrides, self._progress,
                                                    resume=resume)
        except (ConfigError, UrdfError, CheckpointError, SimulationError) as e:
            raise StartupError(str(e)) from None
        self._report(task, result, files, t0)
        # Give reliable subscribers a moment to take the last messages before the process ends.
        end = time.monotonic() + 0.3
        while time.monotonic() < end:
            ros.spin_once(self, timeout_sec=0.05)

    # -------------------------------------------------------------- what is trained
    def _configuration(self, out: Path, resume: bool) -> Tuple[Dict[str, Any], Path]:
        """Return (the configuration, its file).

        The unfinished run's own in ``out`` (resume), else parameter 'config' (an ``out`` holding an
        earlier run refused unless force).
        """
        from .. import config
        from ..physics import ConfigError

        p = self._p
        if resume and bool(p("force")):
            raise StartupError("parameters 'force' and 'resume' exclude each other: force starts afresh in out, "
                               "resume continues the run there")
        if resume:
            try:
                params, source, done = resume_source(out)
            except ConfigError as e:      # no resume state there, or a finished run
                raise StartupError(f"parameter 'resume': {e}") from None
            self.get_logger().info(f"resuming {out} after iteration {done} (configuration {source})")
            return params, Path(source)
        left = occupied(out)
        if left is not None and not bool(p("force")):
            what = ("a trained policy (policy.pt);" if left == "policy" else
                    "an unfinished training run (checkpoints/latest); continue it with resume:=true, or")
            raise StartupError(f"parameter 'out': {out} holds {what} pass force:=true to replace it, or "
                               f"choose another folder")
        cfg_path = resolve_path(p("config"))
        if not cfg_path.is_file():
            raise StartupError(f"parameter 'config': no such file {p('config')}")
        try:
            return config.load_yaml(cfg_path), cfg_path
        except ConfigError as e:
            raise StartupError(str(e)) from None

    def _place_urdf(self, params: Dict[str, Any], out: Path, resume: bool) -> None:
        """Where the URDF comes from: topic > XML parameter > file parameter > the config's.

        A URDF received is written to ``out``/robot_description.urdf and trained on.
        """
        p = self._p
        xml: Optional[str] = None
        if p("robot_description_topic"):
            xml = self._wait_urdf()
        elif p("robot_description"):
            xml = p("robot_description")
        if xml is not None:
            out.mkdir(parents=True, exist_ok=True)
            dest = out / "robot_description.urdf"
            if resume and dest.is_file() and dest.read_text() != xml:
                # The run's own copy stays: the robot it trained on is not replaced by another.
                raise StartupError(f"parameter 'resume': the robot description received differs from the one "
                                   f"the run in {out} trained on ({dest}); resume with the same robot, or "
                                   f"train afresh into another folder")
            dest.write_text(xml)
            params["urdf"] = str(dest.resolve())
        elif p("urdf"):
            params["urdf"] = str(resolve_path(p("urdf")).resolve())

    def _wait_urdf(self) -> str:
        """Return the URDF on the latched robot_description_topic, waited for robot_description_timeout_s."""
        p = self._p
        got: List[str] = []
        qos = ros.QoSProfile(depth=1, durability=ros.DurabilityPolicy.TRANSIENT_LOCAL)
        self.create_subscription(ros.String, p("robot_description_topic"), lambda m: got.append(m.data), qos)
        end = time.monotonic() + float(p("robot_description_timeout_s"))
        self.get_logger().info(f"waiting for the URDF on {p('robot_description_topic')}")
        while not got and time.monotonic() < end:
            ros.spin_once(self, timeout_sec=0.1)
        if not got:
            raise StartupError(f"no URDF on {p('robot_description_topic')} within "
                               f"{p('robot_description_timeout_s'):g} s")
        return got[-1]

    # -------------------------------------------------------------- progress
    def _progress(self, row: Dict[str, float]) -> None:
        """Report progress, called by the trainer after every iteration on this thread: the loss and a diagnostic."""
        loss = float(row["loss"])
        self.pub_loss.publish(ros.Float64(data=loss))
        st = ros.DiagnosticStatus(name=f"{NODE_NAME}: {self.get_fully_qualified_name()}",
                                  hardware_id=str(self._params.get("urdf", "")),
                                  message=f"iteration {int(row['iteration'])}: loss {loss:.5g}")
        st.level = ros.DiagnosticStatus.OK if math.isfinite(loss) else ros.DiagnosticStatus.ERROR
        st.values = [ros.KeyValue(key=k, value=f"{v:.6g}" if isinstance(v, float) else str(v)) for k, v in row.items()]
        arr = ros.DiagnosticArray(status=[st])
        arr.header.stamp = self.get_clock().now().to_msg()
        self.pub_diag.publish(arr)
        self.get_logger().info(st.message + (f", eval success {row['eval_success']:.3f}"
                                             if not math.isnan(row.get("eval_success", float("nan"))) else ""))

    def _report(self, task, result, files, t0: float) -> None:
        """Report the end of the run: the log, a last diagnostic, a line on stderr."""
        hist = result.history
        solved = result.solved_env_steps
        self.get_logger().info(f"trained {task.name}: {len(hist)} iterations in {time.monotonic() - t0:.1f} s, "
                               f"{'solved after %d env steps' % solved if solved is not None else 'not solved'}; "
                               f"checkpoint {files['policy'].parent}")
        st = ros.DiagnosticStatus(name=f"{NODE_NAME}: {self.get_fully_qualified_name()}", level=ros.DiagnosticStatus.OK,
                                  message=f"done: checkpoint in {files['policy'].parent}")
        st.values = [ros.KeyValue(key="iterations", value=str(len(hist))),
                     ros.KeyValue(key="solved", value=str(solved is not None).lower()),
                     ros.KeyValue(key="checkpoint", value=str(files["policy"].parent))]
        self.pub_diag.publish(ros.DiagnosticArray(status=[st]))
        print(f"{NODE_NAME}: published {len(hist)} loss messages; checkpoint {files['policy'].parent}",
              file=sys.stderr, flush=True)


def main(argv=None) -> int:
    """Console script: trains, writes the checkpoint and exits 0.

    Bad input prints ``train_node: error: ...`` and exits 2; SIGINT exits 130.
    """
    cls = make_node_class()
    ros.init(args=argv)
    node = cls()
    code = 0
    try:
        node.train()
    except StartupError as e:
        print(f"{NODE_NAME}: error: {e}", file=sys.stderr, flush=True)
        code = 2
    except (KeyboardInterrupt, ros.ExternalShutdownException):
        print(f"{NODE_NAME}: interrupted; no final checkpoint written (where the run wrote "
              f"checkpoints/latest, resume:=true continues it)", file=sys.stderr, flush=True)
        code = 130
    finally:
        node.destroy_node()
        ros.try_shutdown()
    return code


if __name__ == "__main__":
    sys.exit(main())
