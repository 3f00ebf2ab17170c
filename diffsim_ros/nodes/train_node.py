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

import math
import sys
import time
from pathlib import Path
from typing import Any, Dict, List

from .. import interfaces as ifc
from ..training import occupied, resume_source, train_from_params  # the CLI's training path, shared
from .common import StartupError, resolve_path

NODE_NAME = "train_node"

PARAMETERS: Dict[str, Any] = {
    "config": ("config/hover.yaml", "training file (config/<task>.yaml: urdf, simulator, task, training): absolute, "
                                    "relative to the working directory, or to the diffsim_ros share folder"),
    "out": ("runs/train_node", "output folder: policy.pt, policy.json, training.csv, learning_curve.png, "
                               "TensorBoard event files, checkpoints/ (one holding an earlier run is refused "
                               "unless force or resume)"),
    "force": (False, "replace the policy or the unfinished run an earlier run left in out"),
    "resume": (False, "continue the unfinished run in out where it stopped (out/checkpoints/latest), with the "
                      "configuration it started with: 'config' is not read; iterations, num_envs and seed "
                      "must be left at their defaults or equal the run's"),
    "urdf": ("", "URDF file to train on instead of the config's 'urdf' (empty: the config's)"),
    "robot_description": ("", "URDF XML to train on (as robot_state_publisher's parameter); empty: not used"),
    "robot_description_topic": ("", "take the URDF from this latched std_msgs/String topic (e.g. /robot_description); "
                                    "empty: do not wait for it"),
    "robot_description_timeout_s": (30.0, "s, how long to wait for robot_description_topic"),
    "iterations": (0, "training iterations (0: the config's training.iterations)"),
    "num_envs": (0, "parallel episodes per iteration (0: the config's training.num_envs)"),
    "seed": (-1, "random seed (-1: the config's training.seed)"),
    "threads": (1, "torch CPU threads (1 is fastest on a shared machine)"),
    "loss_topic": (ifc.TRAIN_LOSS, "std_msgs/Float64: the mean per-step training loss of each iteration"),
    "diagnostics_topic": (ifc.DIAGNOSTICS, "diagnostic_msgs/DiagnosticArray: progress of each iteration"),
}


def main(argv=None) -> int:
    import rclpy
    from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus, KeyValue
    from rcl_interfaces.msg import ParameterDescriptor
    from rclpy.executors import ExternalShutdownException
    from rclpy.qos import DurabilityPolicy, QoSProfile
    from std_msgs.msg import Float64, String

    rclpy.init(args=argv)
    node = rclpy.create_node(NODE_NAME)
    for name, (default, desc) in PARAMETERS.items():
        node.declare_parameter(name, default, ParameterDescriptor(description=desc))
    p = lambda name: node.get_parameter(name).value  # noqa: E731
    log = node.get_logger()
    pub_loss = node.create_publisher(Float64, p("loss_topic"), 10)
    pub_diag = node.create_publisher(DiagnosticArray, p("diagnostics_topic"), 10)
    code = 0
    try:
        import torch

        from .. import config
        from ..learning.checkpoint import CheckpointError
        from ..physics import ConfigError, SimulationError, UrdfError

        torch.set_num_threads(max(1, int(p("threads"))))
        out = Path(p("out"))
        resume = bool(p("resume"))
        if resume and bool(p("force")):
            raise StartupError("parameters 'force' and 'resume' exclude each other: force starts afresh in out, "
                               "resume continues the run there")
        if resume:
            try:
                params, source, done = resume_source(out)
            except ConfigError as e:      # no resume state there, or a finished run
                raise StartupError(f"parameter 'resume': {e}") from None
            cfg_path = Path(source)
            log.info(f"resuming {out} after iteration {done} (configuration {source})")
        else:
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
                params = config.load_yaml(cfg_path)
            except ConfigError as e:
                raise StartupError(str(e)) from None
        # Where the URDF comes from: topic > XML parameter > file parameter > the config's.
        xml = None
        if p("robot_description_topic"):
            got: List[str] = []
            qos = QoSProfile(depth=1, durability=DurabilityPolicy.TRANSIENT_LOCAL)
            node.create_subscription(String, p("robot_description_topic"), lambda m: got.append(m.data), qos)
            end = time.monotonic() + float(p("robot_description_timeout_s"))
            log.info(f"waiting for the URDF on {p('robot_description_topic')}")
            while not got and time.monotonic() < end:
                rclpy.spin_once(node, timeout_sec=0.1)
            if not got:
                raise StartupError(f"no URDF on {p('robot_description_topic')} within "
                                   f"{p('robot_description_timeout_s'):g} s")
            xml = got[-1]
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

        overrides = {"iterations": int(p("iterations")) or None, "num_envs": int(p("num_envs")) or None,
                     "seed": None if int(p("seed")) < 0 else int(p("seed"))}
        t0 = time.monotonic()

        def progress(row: Dict[str, float]) -> None:
            # Called by the trainer after every iteration, on this thread.
            loss = float(row["loss"])
            pub_loss.publish(Float64(data=loss))
            st = DiagnosticStatus(name=f"{NODE_NAME}: {node.get_fully_qualified_name()}",
                                  hardware_id=str(params.get("urdf", "")),
                                  message=f"iteration {int(row['iteration'])}: loss {loss:.5g}")
            st.level = DiagnosticStatus.OK if math.isfinite(loss) else DiagnosticStatus.ERROR
            st.values = [KeyValue(key=k, value=f"{v:.6g}" if isinstance(v, float) else str(v)) for k, v in row.items()]
            arr = DiagnosticArray(status=[st])
            arr.header.stamp = node.get_clock().now().to_msg()
            pub_diag.publish(arr)
            log.info(st.message + (f", eval success {row['eval_success']:.3f}"
                                   if not math.isnan(row.get("eval_success", float("nan"))) else ""))

        try:
            task, result, files = train_from_params(params, str(cfg_path), out, overrides, progress, resume=resume)
        except (ConfigError, UrdfError, CheckpointError, SimulationError) as e:
            raise StartupError(str(e)) from None
        hist = result.history
        solved = result.solved_env_steps
        log.info(f"trained {task.name}: {len(hist)} iterations in {time.monotonic() - t0:.1f} s, "
                 f"{'solved after %d env steps' % solved if solved is not None else 'not solved'}; "
                 f"checkpoint {files['policy'].parent}")
        st = DiagnosticStatus(name=f"{NODE_NAME}: {node.get_fully_qualified_name()}", level=DiagnosticStatus.OK,
                              message=f"done: checkpoint in {files['policy'].parent}")
        st.values = [KeyValue(key="iterations", value=str(len(hist))),
                     KeyValue(key="solved", value=str(solved is not None).lower()),
                     KeyValue(key="checkpoint", value=str(files["policy"].parent))]
        pub_diag.publish(DiagnosticArray(status=[st]))
        print(f"{NODE_NAME}: published {len(hist)} loss messages; checkpoint {files['policy'].parent}",
              file=sys.stderr, flush=True)
        # Give reliable subscribers a moment to take the last messages before the process ends.
        end = time.monotonic() + 0.3
        while time.monotonic() < end:
            rclpy.spin_once(node, timeout_sec=0.05)
    except StartupError as e:
        print(f"{NODE_NAME}: error: {e}", file=sys.stderr, flush=True)
        code = 2
    except (KeyboardInterrupt, ExternalShutdownException):
        print(f"{NODE_NAME}: interrupted; no final checkpoint written (where the run wrote "
              f"checkpoints/latest, resume:=true continues it)", file=sys.stderr, flush=True)
        code = 130
    finally:
        node.destroy_node()
        rclpy.try_shutdown()
    return code


if __name__ == "__main__":
    sys.exit(main())
