"""replay: play a bag's recorded and simulated velocities onto topics for PlotJuggler or Foxglove.

    ros2 run diffsim_ros replay --ros-args -p bag:=runs/arm_bag -p rate:=0.5 -p horizon:=5

Reads the bag with the analysis layer (``diffsim_ros.analysis``, no ROS install needed
for the bag itself), replays its commands through the simulator from every recorded
state ``horizon`` control steps ahead (``source: simulator``) or takes the controller's
own predictions from ``/diffsim/predicted_state`` (``source: bag``), then publishes, in
the bag's time at ``rate`` times real time:

- ``actual_topic``    (default /replay/actual_velocity): the recorded velocity;
- ``predicted_topic`` (default /replay/predicted_velocity): the prediction made for the
  same instant;
- ``error_topic``     (default /replay/velocity_error): predicted minus recorded.

Arms publish sensor_msgs/JointState (``velocity`` by joint name, ``position`` the
recorded positions on the actual topic); quadrotors geometry_msgs/TwistStamped (body
frame, as nav_msgs/Odometry's twist). Header stamps are the bag's stamps (or the wall
clock with ``use_bag_stamps: false``). A bag that cannot be used stops the node at start
with ``replay: error: ...`` naming the problem (exit status 2).
"""
from __future__ import annotations

import importlib
import sys
import time
from dataclasses import dataclass
from types import SimpleNamespace
from typing import List, Optional

import numpy as np

from ..schema import normalise, option, ros_constraints, ros_parameters, section
from . import common

__all__ = ["NODE_NAME", "ReplayParameters", "PARAMETERS", "CONSTRAINTS", "Playback", "make_node_class",
           "main"]

NODE_NAME = "replay"

#: What the node uses of rclpy, imported into ``ros`` by make_node_class(): importing this module
#: needs no rclpy. The message class (sensor_msgs/JointState for an arm, geometry_msgs/TwistStamped
#: otherwise) is imported once the bag's robot is known.
_ROS = {"rclpy": "try_shutdown", "rclpy.node": "Node"}
ros = SimpleNamespace()

@section("replay", node=True)
@dataclass(frozen=True)
class ReplayParameters:
    """replay's parameters."""

    bag: str = option("", "rosbag2 directory to play (MCAP or sqlite3; layout of doc/interfaces.md). Required.")
    config: str = option("", "training file (config/*.yaml) giving the robot and simulator; empty: the bag's "
                         "/diffsim/metadata")
    source: str = option("simulator", "where predictions come from: 'simulator' (the recorded commands replayed "
                         "from each recorded state, 'horizon' steps ahead) or 'bag' (/diffsim/predicted_state)",
                         choices=("simulator", "bag"))
    horizon: int = option(1, "prediction horizon in control steps (source 'simulator')", low=1)
    rate: float = option(1.0, "playback speed as a multiple of real time (1.0: real time; 0.5: half speed)",
                         above=0)
    loop: bool = option(False, "start again from the beginning at the end of the bag")
    exit_at_end: bool = option(True, "shut the node down after the last sample (ignored with loop)")
    start_delay: float = option(0.5, "time to wait before the first sample, so subscribers can connect", "s", low=0)
    use_bag_stamps: bool = option(True, "header stamps from the bag (true) or the wall clock at publication (false)")
    actual_topic: str = option("/replay/actual_velocity", "topic of the recorded velocity")
    predicted_topic: str = option("/replay/predicted_velocity", "topic of the predicted velocity")
    error_topic: str = option("/replay/velocity_error", "topic of the velocity error (predicted - recorded)")
    state_topic: str = option("", "state topic in the bag; empty: /joint_states, else /odom")
    command_topic: str = option("", "command topic in the bag; empty: /diffsim/command, else the interface topics")

    def __post_init__(self):
        normalise(self)

#: (name, default, description), from the section above.
PARAMETERS = ros_parameters(ReplayParameters, "")
CONSTRAINTS = ros_constraints(ReplayParameters, "")


class Playback:
    """The samples to publish, without ROS.

    Times (ns, bag clock), recorded and predicted velocities (NaN where no prediction exists for
    that instant).
    """

    def __init__(self, bag: str, config: str = "", source: str = "simulator", horizon: int = 1,
                 state_topic: str = "", command_topic: str = ""):
        import torch

        from ..analysis import AnalysisError, Replay, read_bag, sim_setup
        from ..analysis.predict import recorded_predictions

        if source not in ("simulator", "bag"):
            raise AnalysisError(f"parameter 'source' must be 'simulator' or 'bag', got {source!r}")
        if int(horizon) < 1:
            raise AnalysisError(f"parameter 'horizon' must be >= 1, got {horizon}")
        torch.set_num_threads(1)
        data = read_bag(bag, state_topic=state_topic or None, command_topic=command_topic or None)
        self.kind = data.kind
        self.t = data.t_state
        self.positions = data.q
        if source == "bag":
            if data.pred_t is None:
                raise AnalysisError(f"{bag}: source 'bag' needs /diffsim/predicted_state, which the bag lacks")
            self.names = data.joint_names if data.kind == "arm" else []
            pv = recorded_predictions(data, self.names)
            self.actual = data.v
            self.predicted = np.full_like(self.actual, np.nan)
            j = np.clip(np.searchsorted(self.t, data.pred_t), 0, len(self.t) - 1)
            ok = self.t[j] == data.pred_t
            self.predicted[j[ok]] = pv[ok]
        else:
            rp = Replay(data, sim_setup(data, config or None))
            pred = rp.predict([int(horizon)])[int(horizon)]
            self.names = rp.dof_names if data.kind == "arm" else []
            self.actual = rp.v.cpu().numpy()
            if data.kind == "arm":
                self.positions = rp.q.cpu().numpy()
            self.predicted = np.full_like(self.actual, np.nan)
            idx = np.searchsorted(self.t, pred.t)
            self.predicted[idx] = pred.v_pred.cpu().numpy()
        self.count = len(self.t)


def make_node_class():
    """Build the rclpy Node subclass (built lazily so that importing this module needs no rclpy)."""
    for module, names in _ROS.items():
        ros.__dict__.update((n, getattr(importlib.import_module(module), n)) for n in names.split())
    return type("ReplayNode", (_ReplayLogic, ros.Node), {"__module__": __name__})


class _ReplayLogic:
    """Publishes a :class:`Playback` on a wall timer at ``rate`` times real time.

    It is mixed into rclpy's Node by make_node_class().
    """

    def __init__(self, **kw):
        super().__init__(NODE_NAME, **kw)          # rclpy.node.Node, next in the class built by make_node_class
        p = common.declare_all(self, PARAMETERS, CONSTRAINTS, section=ReplayParameters)
        self.p = p
        self._check_parameters()
        self._load()
        self._advertise()
        self._start_timer()
        self.get_logger().info(
            f"playing {self.play.count} samples of {p['bag']} ({self.play.kind}, predictions from "
            f"{p['source']}{'' if p['source'] == 'bag' else ', %d step(s) ahead' % p['horizon']}) at "
            f"{p['rate']:g}x real time on {p['actual_topic']}, {p['predicted_topic']}, {p['error_topic']}")

    # -------------------------------------------------------------- start-up
    def _check_parameters(self):
        p = self.p
        if not p["bag"]:
            raise common.StartupError("parameter 'bag' is required (-p bag:=PATH)")

    def _load(self):
        """Read the bag and make its predictions (a Playback); a bag that cannot be used is a StartupError."""
        from ..analysis import AnalysisError
        from ..physics import ConfigError

        p = self.p
        try:
            self.play = Playback(p["bag"], p["config"], p["source"], p["horizon"], p["state_topic"],
                                 p["command_topic"])
        except (AnalysisError, ConfigError) as e:
            raise common.StartupError(str(e)) from None

    def _advertise(self):
        if self.play.kind == "arm":
            from sensor_msgs.msg import JointState as Msg
        else:
            from geometry_msgs.msg import TwistStamped as Msg
        self._Msg = Msg
        qos = common.state_qos(100)
        self.pubs = {k: self.create_publisher(Msg, self.p[f"{k}_topic"], qos) for k in ("actual", "predicted", "error")}

    def _start_timer(self):
        self.index = 0
        self.published = 0
        self.done = False
        self._t0_wall = time.monotonic() + float(self.p["start_delay"])
        period = float(np.median(np.diff(self.play.t))) * 1e-9 / self.p["rate"] if self.play.count > 1 else 0.01
        self.timer = self.create_timer(min(max(period, 1e-3), 0.02), self._tick)

    # -------------------------------------------------------------- playback
    def _msg(self, t_ns: int, v: np.ndarray, q: Optional[np.ndarray] = None):
        m = self._Msg()
        m.header.stamp = common.stamp_from_ns(t_ns) if self.p["use_bag_stamps"] else self.get_clock().now().to_msg()
        if self.play.kind == "arm":
            m.header.frame_id = ""
            m.name = list(self.play.names)
            m.velocity = [float(x) for x in v]
            m.position = [] if q is None else [float(x) for x in q]
        else:
            m.header.frame_id = "base_link"
            lin, ang = m.twist.linear, m.twist.angular
            lin.x, lin.y, lin.z, ang.x, ang.y, ang.z = (float(x) for x in v)
        return m

    def _tick(self):
        if self.done:
            return
        pl = self.play
        now = time.monotonic()
        # Publish every sample whose time (bag clock / rate, from the start) has come.
        due_ns = (now - self._t0_wall) * self.p["rate"] * 1e9 + pl.t[0]
        while self.index < pl.count and pl.t[self.index] <= due_ns:
            i = self.index
            self.pubs["actual"].publish(self._msg(pl.t[i], pl.actual[i], pl.positions[i] if pl.kind == "arm"
                                                  else None))
            if np.isfinite(pl.predicted[i]).all():
                self.pubs["predicted"].publish(self._msg(pl.t[i], pl.predicted[i]))
                self.pubs["error"].publish(self._msg(pl.t[i], pl.predicted[i] - pl.actual[i]))
            self.index += 1
            self.published += 1
        if self.index >= pl.count:
            if self.p["loop"]:
                self.index = 0
                self._t0_wall = time.monotonic()
            else:
                self.done = True
                self.get_logger().info(f"end of the bag: {self.published} samples published")
                if self.p["exit_at_end"]:
                    ros.try_shutdown(context=self.context)


def main(args: Optional[List[str]] = None) -> int:
    cls = make_node_class()
    return common.run_node(cls, args=args if args is not None else sys.argv, name=NODE_NAME)


if __name__ == "__main__":
    sys.exit(main())
