"""policy_controller: runs a trained checkpoint on a robot through ROS 2.

    ros2 run diffsim_ros policy_controller --ros-args -p checkpoint:=policies/hover
    ros2 run diffsim_ros policy_controller --ros-args -p checkpoint:=policies/reach_arm \
        -p target:="[0.25, 0.1, 0.35]" -p interface:=joint_trajectory

A thin adapter over :class:`diffsim_ros.learning.deploy.PolicyRunner`: messages in
(``/joint_states`` matched by joint name, or ``/odom`` [+ ``/imu``]), commands out
on the selected interface (doc/interfaces.md), plus the bookkeeping topics the
recorder and the analysis rely on: ``/diffsim/command``, ``/diffsim/predicted_state``,
latched ``/diffsim/metadata`` and ``/diagnostics``.

Velocity policies (a legged walker, the quadrotor velocity task) also take requests on
``/cmd_vel`` (geometry_msgs/Twist, or TwistStamped with ``cmd_vel_stamped``), as a teleop
node, a joystick or Nav2 publish them: mapped into the range the policy was trained on, the
diagnostics saying what was clamped or ignored; without a request for ``cmd_vel_timeout_s``
the zero command (a walker trained above 0 m/s stands on its stance joint positions, a
quadrotor hovers). The latest of /cmd_vel and the ``target`` topic is in force
(diffsim_ros/control/velocity_command.py).

Timing: ``lockstep: false`` runs the policy on a wall timer at ``rate_hz`` on the
latest state; ``lockstep: true`` computes exactly one command per received state
(deterministic runs against mujoco_plant's lockstep mode). The command is published
before the prediction is computed, so the simulator step never delays it; at 250-500 Hz
the next state would wait for it, so ``compile_prediction`` predicts through the step
compiled ahead of time (built before the first state) and ``predict_every`` thins
predictions out. The node is spun by rclpy's EventsExecutor (``executor``), and what
start-up allocated is frozen out of the garbage collector's scans (bench/control_loop.py).

Safety: every rule lives in the ROS-free supervisor (diffsim_ros/control/supervisor.py);
this node converts messages for it and publishes what it decides. In short:

- a state is accepted only when it is plausible: finite, joint positions within the URDF
  limits (+ ``position_margin``), speeds within bounds derived from the URDF velocity limits,
  a base inside ``workspace_min``/``workspace_max``, a unit quaternion, the expected
  ``frame_id``/``child_frame_id``, message arrays of consistent lengths, stamps that never go
  backwards and lie within ``max_stamp_skew_s`` of the node's clock (set use_sim_time against
  a simulator's /clock). The hold position is only ever taken from an accepted state;
- a rejected state, a stale one (older than ``state_timeout_s``, steady clock), a bad IMU
  reading or any exception in the control path (the policy, the prediction, publishing) latches
  the safe command until ``recover_states`` consecutive new accepted states, or a call of
  ``~/reset`` (std_srvs/Trigger; it also forgets the stamp history, e.g. after a simulator
  restart). The diagnostics name the field and its value;
- safe command: arms hold the last accepted position (position / joint_trajectory interfaces)
  or command zero (effort, velocity); quadrotors ``safe_thrust`` N collective with zero body
  rates (0 = motors off). Every command is clamped to the URDF limits of the checkpoint's robot;
- ``~/emergency_stop`` (std_srvs/SetBool): true latches the safe command until a call with
  false (releasing is an explicit operator action and clears the fault latch as ~/reset does);
- a checkpoint for another robot (``urdf``, ``config`` or ``robot_description_topic``)
  is refused at start: the node prints the reason and exits with status 2;
- a dead driver is noticed in every mode: the watchdog and the diagnostics run on the steady
  clock, so under use_sim_time a simulator that stops (its /clock with it) still gets the safe
  command and a diagnostic saying the control timer's clock stopped; a clock that jumps back (a
  driver restarted at time 0) latches the safe command, its earlier-stamped states refused
  until ``~/reset``, and the control timer starts afresh on the new time;
- preflight (``preflight``, on by default): before the policy goes active the robot's topics
  are checked against the checkpoint as ``diffsim-ros preflight`` does (control/preflight.py):
  in timer mode over the first ``preflight_s`` of states, nothing sent meanwhile; in lockstep on
  the first state. A NO-GO holds the safe command, its reasons in the log and the diagnostics,
  until ``~/reset`` (``preflight_required: false``: logged, and the policy runs).

A message that names too few joints is ignored but does not trip the safe command by itself
(robots often publish a gripper's joint state separately); the watchdog trips once no
complete state has arrived for ``state_timeout_s``.

The node converts messages and owns the ROS side; its parameters and their start-up checks are
control/controller_settings.py, what it decides control/controller_loop.py (its reports
control/controller_status.py, its preflight control/startup_preflight.py), its command outputs
the table of nodes/outputs.py.
"""
from __future__ import annotations

import importlib
import sys
import time
from types import SimpleNamespace
from typing import Dict, List

import numpy as np
import torch

from ..control import ImuIn, JointStateIn, OdometryIn
from ..control import controller_settings as cs
from ..control import controller_status as status
from ..control.controller_loop import ControlLoop
from ..control.controller_settings import ARRAY_TYPES, CONSTRAINTS, PARAMETERS, SetupError
from . import common, outputs
from .common import StartupError, resolve_path, stamp_to_ns

__all__ = ["NODE_NAME", "PARAMETERS", "make_node_class", "main"]

NODE_NAME = "policy_controller"

#: What the node uses of rclpy and the message packages (module: names), imported into ``ros`` by
#: make_node_class(): importing this module needs no rclpy.
_ROS = {"rclpy": "spin_once", "rclpy.node": "Node", "rclpy.clock": "Clock ClockType JumpThreshold",
        "rclpy.duration": "Duration", "rclpy.exceptions": "ParameterUninitializedException",
        "rclpy.qos": "ReliabilityPolicy",
        "geometry_msgs.msg": "PointStamped Twist TwistStamped", "nav_msgs.msg": "Odometry",
        "sensor_msgs.msg": "Imu JointState", "std_msgs.msg": "String", "std_srvs.srv": "SetBool Trigger"}
ros = SimpleNamespace()


def make_node_class():
    """Build the rclpy Node subclass (built lazily so that importing this module needs no rclpy)."""
    for module, names in _ROS.items():
        ros.__dict__.update((n, getattr(importlib.import_module(module), n)) for n in names.split())
    return type("PolicyController", (_PolicyControllerLogic, ros.Node), {"__module__": __name__})


class _PolicyControllerLogic:
    """The node's side of policy_controller (parameters, messages, publishers, timers).

    It is mixed into rclpy's Node by make_node_class(); what it decides is
    control/controller_loop.py's.
    """

    def __init__(self, **kw):
        super().__init__(NODE_NAME, **kw)          # rclpy.node.Node, next in the class built by make_node_class
        self._declare()
        torch.set_num_threads(1)        # batch-1 inference: a second thread only adds contention
        log = self.get_logger()
        try:
            s = cs.read_runner(self._p, log, resolve=resolve_path,
                               robot_description=self._wait_robot_description)
            self.output = outputs.OUTPUTS[s.iface]
            outputs.load_messages(self.output)     # a message package some installs lack: refused here
            cs.read_loop(self._p, log, s)
        except SetupError as e:
            raise StartupError(str(e)) from None
        self.settings, self.executor_kind, self.iface, self.lockstep = s, s.executor_kind, s.iface, s.lockstep
        self.runner, self.sup, self.velocity, self.mode = s.runner, s.sup, s.velocity, s.mode
        self.out_ctx = outputs.OutputContext(s.runner, s.out_index, s.controller_joints, s.runner.dt, s.legacy_tau)
        self._subscribe()
        self._advertise()
        self.loop = ControlLoop(s, log, clock_ns=lambda: int(self.get_clock().now().nanoseconds),
                                publish=self._publish, publish_prediction=self._publish_prediction,
                                command_subscribers=self.pub_out.get_subscription_count,
                                recorder_subscribers=lambda: [pub.get_subscription_count() for pub in (
                                    self.pub_cmd, self.pub_pred, self.pub_diag)], command_topic=self.out_topic)
        self._start_timers()
        self._publish_metadata()
        log.info(self.loop.describe())

    # -------------------------------------------------------------- parameters
    def _declare(self):
        common.declare_all(self, ((name, default, desc) for name, (default, desc) in PARAMETERS.items()),
                           CONSTRAINTS, ARRAY_TYPES, section=cs.PolicyControllerParameters)

    def _p(self, name):
        try:
            val = self.get_parameter(name).value
        except ros.ParameterUninitializedException:     # a list parameter left unset
            return []
        if val is None:                    # array parameters without a value
            return []
        if isinstance(val, (list, tuple)) or hasattr(val, "tolist"):
            return list(val)
        return val

    def _wait_robot_description(self, topic: str, timeout: float) -> str:
        got: List[str] = []
        sub = self.create_subscription(ros.String, topic, lambda m: got.append(m.data), common.latched_qos())
        end = time.monotonic() + timeout
        while not got and time.monotonic() < end:
            ros.spin_once(self, timeout_sec=0.1)
        self.destroy_subscription(sub)
        if not got:
            raise StartupError(f"no URDF on {topic} within {timeout:g} s (robot_description_topic)")
        return got[-1]

    # -------------------------------------------------------------- ROS interfaces
    def _subscribe(self):
        p, kind = self._p, self.runner.kind
        # doc/interfaces.md QoS: publishers of recorded topics keep a deep reliable history (a
        # recorder stall must not drop samples); the metadata is latched.
        self.qos = common.state_qos()
        state_qos = common.state_qos(10)
        if self.settings.reliability == "best_effort":
            state_qos.reliability = ros.ReliabilityPolicy.BEST_EFFORT
        if kind != "quadrotor":
            self.create_subscription(ros.JointState, p("joint_states_topic"), self._on_joint_state, state_qos)
        if kind != "arm":
            self.create_subscription(ros.Odometry, p("odom_topic"), self._on_odom, state_qos)
            self.create_subscription(ros.Imu, p("imu_topic"), self._on_imu, state_qos)
        self.create_subscription(ros.PointStamped, p("target_topic"), lambda m: self.loop.on_target(
            [m.point.x, m.point.y, m.point.z]), self.qos)
        if self.velocity is not None:
            stamped = bool(p("cmd_vel_stamped"))
            self.create_subscription(ros.TwistStamped if stamped else ros.Twist, p("cmd_vel_topic"),
                                     self._on_cmd_vel, self.qos)
            self.get_logger().info(f"velocity requests on {p('cmd_vel_topic')} "
                                   f"({'TwistStamped' if stamped else 'Twist'}): {self.velocity.describe()}")

    def _advertise(self):
        """Create the output's publishers from its row of the table (nodes/outputs.py), the others, the services."""
        p = self._p
        qos = outputs.qos_profile(self.output, self.qos)
        self._out_pubs = []
        for ch in self.output.channels:             # the last one carries the command
            self.out_topic = p(ch.topic_param) if ch.topic_param else f"/{self.settings.controller.strip('/')}/commands"
            pub = self.create_publisher(getattr(outputs.msgs, ch.name), self.out_topic, qos)
            self._out_pubs.append((pub, ch.convert))
        self.pub_out = self._out_pubs[-1][0]
        self.pub_cmd = self.create_publisher(outputs.msgs.Float64MultiArray, p("command_topic"), self.qos)
        self.pub_pred = self.create_publisher(outputs.prediction_type(self.runner.kind), p("predicted_state_topic"),
                                              self.qos)
        self.pub_meta = self.create_publisher(outputs.msgs.String, p("metadata_topic"), common.latched_qos())
        self.pub_diag = self.create_publisher(outputs.msgs.DiagnosticArray, p("diagnostics_topic"), self.qos)
        self.create_service(ros.SetBool, "~/emergency_stop", self._on_estop)
        self.create_service(ros.Trigger, "~/reset", self._on_reset)

    def _start_timers(self):
        # The watchdog and the diagnostics run on the steady clock in every mode: under use_sim_time a dead
        # driver stops the simulated clock, and with it every timer on that clock, which is when they are needed.
        steady = ros.Clock(clock_type=ros.ClockType.STEADY_TIME)
        watchdog_period = 1.0 / max(float(self._p("watchdog_hz")), 1e-3)
        self.watchdog = None                  # timer mode's own watchdog (lockstep: self.timer is it)
        if self.lockstep:
            self.timer = self.create_timer(watchdog_period, self.loop.watchdog_tick, clock=steady)
        else:
            self.timer = self.create_timer(1.0 / self.settings.rate, self.loop.control_tick)
            self.watchdog = self.create_timer(watchdog_period, self.loop.watchdog_tick, clock=steady)
        self.create_timer(float(self._p("diagnostics_period_s")), self._publish_diagnostics, clock=steady)
        # A driver or simulator that restarts starts its clock again at 0: a jump back (see
        # ControlLoop.on_clock_jump) restarts the control timer on that clock.
        self._jump_handle = self.get_clock().create_jump_callback(
            ros.JumpThreshold(min_forward=None, min_backward=ros.Duration(nanoseconds=-1), on_clock_change=False),
            post_callback=self._on_clock_jump)

    # -------------------------------------------------------------- inputs: messages to the loop's records
    def _on_joint_state(self, msg):
        js = JointStateIn(list(msg.name), list(msg.position), list(msg.velocity), list(msg.effort),
                          stamp_to_ns(msg.header.stamp))
        self.loop.on_joint_state(js)

    def _on_odom(self, msg):
        pp, o, tw = msg.pose.pose.position, msg.pose.pose.orientation, msg.twist.twist
        od = OdometryIn([pp.x, pp.y, pp.z], [o.x, o.y, o.z, o.w], [tw.linear.x, tw.linear.y, tw.linear.z],
                        [tw.angular.x, tw.angular.y, tw.angular.z], stamp_to_ns(msg.header.stamp), msg.header.frame_id,
                        msg.child_frame_id)
        self.loop.on_odometry(od)

    def _on_imu(self, msg):
        w, o, a = msg.angular_velocity, msg.orientation, msg.linear_acceleration
        imu = ImuIn([w.x, w.y, w.z], [o.x, o.y, o.z, o.w], [a.x, a.y, a.z], stamp_to_ns(msg.header.stamp))
        self.loop.on_imu(imu, msg.header.frame_id)

    def _on_cmd_vel(self, msg):
        tw = getattr(msg, "twist", msg)             # TwistStamped or Twist
        self.loop.on_cmd_vel((tw.linear.x, tw.linear.y, tw.linear.z), (tw.angular.x, tw.angular.y, tw.angular.z))

    def _on_estop(self, req, resp):
        resp.message, resp.success = self.loop.on_estop(bool(req.data)), True
        return resp

    def _on_reset(self, req, resp):
        resp.message, resp.success = self.loop.on_reset(), True
        return resp

    def _on_clock_jump(self, jump):
        back = -jump.delta.nanoseconds / 1e9
        if back <= 0:
            return
        if self.loop.on_clock_jump(back):       # timer mode: the control timer starts afresh
            self.timer.cancel()
            self.destroy_timer(self.timer)
            self.timer = self.create_timer(1.0 / self.settings.rate, self.loop.control_tick)

    # -------------------------------------------------------------- outputs
    def _publish(self, cmd, stamp: int, state):
        """``cmd`` (simulator interface, clamped) on the selected interface and on /diffsim/command."""
        cmd = np.asarray(cmd, dtype=np.float64)
        now_ns = self.get_clock().now().nanoseconds
        for pub, convert in self._out_pubs:
            pub.publish(convert(cmd, stamp, now_ns, state, self.out_ctx))
        self.pub_cmd.publish(outputs.command_msg(cmd, stamp))

    def _publish_prediction(self, pred, stamp: int):
        self.pub_pred.publish(outputs.prediction_msg(pred, stamp, self.runner, self._p))

    def _publish_metadata(self):
        self.pub_meta.publish(outputs.msgs.String(data=self.loop.metadata_json(self.get_fully_qualified_name())))
        self.loop.node_counts["metadata_sent"] += 1

    def _publish_diagnostics(self):
        try:
            diag = self.loop.diagnostics()           # None before the gates open: nothing published before
            if diag is not None:                     # the recorders listen (wait_for_recorders)
                self.pub_diag.publish(outputs.diagnostics_msg(f"{NODE_NAME}: {self.get_fully_qualified_name()}",
                                                              self.runner.model.name, *diag,
                                                              self.get_clock().now().nanoseconds))
        except Exception as e:  # noqa: BLE001
            self.get_logger().error(f"diagnostics failed: {e}", throttle_duration_sec=5.0)

    counts = property(lambda self: self.loop.counts, doc="The supervisor's counters and the node's (errors summed).")
    last_reject = property(lambda self: self.sup.last_rejection)
    clock_jumps_back = property(lambda self: self.loop.clock_jumps_back)

    def diagnostics_values(self) -> Dict[str, str]:
        return self.loop.diagnostics_values()

    def close(self):
        """Finish at shutdown (SIGINT/SIGTERM), called once by run_node: the counters to stderr and stats_file."""
        self.timer.cancel()
        if self.watchdog is not None:
            self.watchdog.cancel()
        # Reliable subscribers (a recorder) get every message published before the process exits.
        late = common.flush_publishers((self.pub_out, self.pub_cmd, self.pub_pred, self.pub_meta, self.pub_diag))
        if late:
            self.get_logger().warning(f"shutting down with messages a subscriber has not acknowledged on {late}")
        self.finish(unacknowledged=late)

    def finish(self, unacknowledged=()):
        """Counters to the log (and stats_file) at shutdown.

        ``unacknowledged``: the topics a reliable subscriber had not acknowledged when the process
        gave up waiting.
        """
        stats = status.shutdown_stats(self.counts, self.loop.timing, unacknowledged, self.out_topic, *map(self._p, (
            "command_topic", "predicted_state_topic", "metadata_topic", "diagnostics_topic")))
        status.report_stats(stats, self._p("stats_file"), NODE_NAME)


def main(argv=None) -> int:
    """Console script: runs until SIGINT/SIGTERM (exit 0).

    A refused checkpoint or a bad parameter prints ``policy_controller: error: ...`` and exits 2.
    """
    from .common import run_node

    def factory():
        try:
            return make_node_class()()
        except StartupError:
            raise
        except Exception as e:  # noqa: BLE001 - e.g. a parameter of the wrong type: say so, exit 2
            raise StartupError(f"{type(e).__name__}: {e}") from None

    return run_node(factory, argv, NODE_NAME)


if __name__ == "__main__":
    sys.exit(main())
