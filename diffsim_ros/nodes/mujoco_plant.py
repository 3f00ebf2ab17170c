"""mujoco_plant: the MuJoCo stand-in robot as a ROS 2 node (doc/interfaces.md).

    ros2 run diffsim_ros mujoco_plant --ros-args --params-file config/hover.yaml
    ros2 run diffsim_ros mujoco_plant --ros-args -p config:=config/reach_arm.yaml \
        -p mode:=lockstep -p perturbation.mass_scale:=1.2

A thin adapter over :class:`diffsim_ros.plant.MujocoPlant`: the robot comes from the
training/robot YAML (``config`` parameter, and/or its ``urdf``, ``floating_base``,
``simulator.*`` keys given directly, as with ``--params-file``).

Commands in (every topic a parameter; an empty name turns a topic off):
  arms        /position_controller/commands, /velocity_controller/commands,
              /effort_controller/commands (std_msgs/Float64MultiArray, entries in the
              order of ``controller_joints``), /joint_trajectory_controller/joint_trajectory
              (first point's positions, by joint name, as a position command);
  quadrotors  /cmd_ctbr (geometry_msgs/TwistStamped: linear.z thrust N, angular p q r
              rad/s), /cmd_rotor_thrust (Float64MultiArray, N, in rotors.rotor_links order).
The latest valid command is applied until the next one. A bad command (wrong length,
NaN/Inf, missing joints) is rejected with a log; the plant keeps the last valid command
(at start: the hold command, i.e. hold position or hover thrust).

State out: /joint_states (arms; every joint, header.stamp = simulated time), or /odom
and /imu (floating base), and /clock (simulated time).

For RViz and Foxglove: /tf (tf2_msgs/TFMessage, with every state: each link's pose in its
parent link's frame, from MuJoCo's kinematics of the true state, and for a floating base
world -> base link; ``publish_link_tf`` false leaves the links to robot_state_publisher and
publishes only world -> base) and a latched /robot_description (std_msgs/String, transient
local: the URDF text). /tf needs tf2_msgs (a ROS 2 install has it; the PyPI ROS wheels do not,
scripts/bootstrap.sh builds it into the venv): without it the node says so once and publishes
/robot_description only.

Modes: ``lockstep``: every command received (valid or rejected) advances exactly one
control step and then the state is published once, so a lockstep controller and this
plant alternate deterministically; until the first command arrives the initial state is
republished every ``lockstep_republish_s`` so that a controller started later gets one.
``realtime``: a wall timer steps the plant every dt / real_time_factor with the latest
command and publishes at ``publish_rate_hz`` (0: every step).

``~/reset`` (std_srvs/Trigger): back to the initial state and time 0 (the state is
published at once).

The node owns the ROS side; its parameters and their start-up checks are plant/plant_settings.py.
"""
from __future__ import annotations

import importlib
import sys
from types import SimpleNamespace
from typing import List, Optional

import numpy as np

from ..plant import JOINT_INTERFACES, MujocoPlant
from ..plant import plant_settings as ps
from ..plant.plant_settings import CONSTRAINTS, PARAMETERS, PERTURBATION_KEYS, SetupError, perturbation_parameter
from . import common

__all__ = ["NODE_NAME", "DISCOVERY_SETTLE_S", "PARAMETERS", "CONSTRAINTS", "PERTURBATION_KEYS",
           "perturbation_parameter", "link_transforms", "make_node_class", "main"]

NODE_NAME = "mujoco_plant"
#: s from the wait_for_subscribers gate opening to the first state (see _check_gate).
DISCOVERY_SETTLE_S = 0.25

#: What the node uses of rclpy and the message packages (module: names), imported into ``ros`` by
#: make_node_class(): importing this module needs no rclpy.
_ROS = {"rclpy.node": "Node", "geometry_msgs.msg": "TwistStamped", "nav_msgs.msg": "Odometry",
        "rosgraph_msgs.msg": "Clock", "sensor_msgs.msg": "Imu JointState", "std_msgs.msg": "Float64MultiArray",
        "std_srvs.srv": "Trigger", "trajectory_msgs.msg": "JointTrajectory"}
ros = SimpleNamespace()


def link_transforms(model, qpos, scratch, links, world_frame: str = "world"):
    """Return (parent, child, xyz, quaternion xyzw) of every MuJoCo body named in ``links``.

    Each is relative to its parent body (the world body is ``world_frame``), from MuJoCo's
    kinematics at ``qpos`` computed in ``scratch`` (an MjData of ``model``; the plant's own data is
    not touched). Bodies not in ``links`` (the payload perturbation) and their children are left
    out. A URDF link named ``world`` is MuJoCo's world body: it is the root frame (hung from
    ``world_frame`` when that is another name).
    """
    import mujoco

    scratch.qpos[:] = qpos
    mujoco.mj_kinematics(model, scratch)
    out = []
    root = world_frame
    if "world" in links and world_frame != "world":
        out.append((world_frame, "world", np.zeros(3), (0.0, 0.0, 0.0, 1.0)))
        root = "world"
    quat = np.empty(4)
    for b in range(1, model.nbody):
        child = model.body(b).name
        parent_id = int(model.body_parentid[b])
        parent = root if parent_id == 0 else model.body(parent_id).name
        if child not in links or (parent_id != 0 and parent not in links):
            continue
        Rp, pp = scratch.xmat[parent_id].reshape(3, 3), scratch.xpos[parent_id]
        Rc, pc = scratch.xmat[b].reshape(3, 3), scratch.xpos[b]
        mujoco.mju_mat2Quat(quat, (Rp.T @ Rc).reshape(-1))
        w, x, y, z = quat
        out.append((parent, child, Rp.T @ (pc - pp), (x, y, z, w)))
    return out


def make_node_class():
    """Build the rclpy Node subclass (built lazily so that importing this module needs no rclpy)."""
    for module, names in _ROS.items():
        ros.__dict__.update((n, getattr(importlib.import_module(module), n)) for n in names.split())
    return type("MujocoPlantNode", (_MujocoPlantLogic, ros.Node), {"__module__": __name__})


_build_node_class = make_node_class     # the name the tests build the node by


class _MujocoPlantLogic:
    """The node's side of mujoco_plant (parameters, publishers, subscriptions, timers).

    It is mixed into rclpy's Node by make_node_class(); the robot is plant.MujocoPlant, the
    parameters' table and checks plant/plant_settings.py.
    """

    def __init__(self, **kw):
        super().__init__(NODE_NAME, **kw)          # rclpy.node.Node, next in the class built by make_node_class
        try:
            params = self._declare()
            self._make_plant(params)
            self._map_joints()
            self._advertise()
            self._setup_visualisation(self.p)
            topics = self._subscribe()
            self._read_timing()
        except SetupError as e:
            raise common.StartupError(str(e)) from None
        plant = self.plant
        self.get_logger().info(
            f"{plant.physics_model.name}: {self.p['mode']}, dt {plant.dt:g} s in {plant.substeps} substeps, "
            f"interfaces {', '.join(plant.interfaces)} (start: {plant.interface}), joints {plant.joint_names}; "
            f"commands on {', '.join(topics)}; perturbation {plant.perturbation.to_dict()}")
        self._open_gate()

    # ------------------------------------------------------------------ start-up
    def _declare(self):
        """Every parameter, into ``self.p``; returns the robot's configuration (config_parameters)."""
        # perturbation.*: what the schema accepts (a number for sensor_noise, an integer for a
        # double) is converted to the declared type first; anything else stops the node naming it.
        for key in PERTURBATION_KEYS:
            common.coerce_override(self, f"perturbation.{key}",
                                   lambda val, key=key: perturbation_parameter(key, val))
        self.p = common.declare_all(self, PARAMETERS, CONSTRAINTS, section=ps.MujocoPlantParameters)
        params = common.config_parameters(self)
        ps.check_robot(params)
        return params

    def _make_plant(self, params):
        p = self.p
        pert = {k: p[f"perturbation.{k}"] for k in PERTURBATION_KEYS}
        self.lockstep = p["mode"] == "lockstep"      # realtime or lockstep (its section checked which)
        source = common.value(self, "config") or "parameters"
        self.plant = MujocoPlant(params, source=source, interface=p["interface"] or None, perturbation=pert)
        self._set_initial_state(p["initial_positions"], p["initial_velocities"])

    def _map_joints(self):
        """Map the controller joint order -> plant order."""
        self.controller_joints, self._to_plant = ps.controller_order(self.p["controller_joints"],
                                                                     self.plant.actuated_joints)
        self.rejected = 0
        self.commands = 0

    def _advertise(self):
        """Create the state publishers."""
        p, plant = self.p, self.plant
        qos = common.state_qos()
        self.pub_js = self.pub_odom = self.pub_imu = self.pub_clock = None
        if plant.joint_names and p["joint_states_topic"]:
            self.pub_js = self.create_publisher(ros.JointState, p["joint_states_topic"], qos)
        if plant.floating_base:
            if p["odom_topic"]:
                self.pub_odom = self.create_publisher(ros.Odometry, p["odom_topic"], qos)
            if p["imu_topic"]:
                self.pub_imu = self.create_publisher(ros.Imu, p["imu_topic"], qos)
        if p["clock_topic"]:
            self.pub_clock = self.create_publisher(ros.Clock, p["clock_topic"], qos)

    def _subscribe(self) -> List[str]:
        """Create the command subscriptions (only the interfaces this robot accepts) and ~/reset; their topics."""
        p, plant = self.p, self.plant
        cq = common.command_qos()
        topics = []
        for iface, key in (("position", "position_command_topic"), ("velocity", "velocity_command_topic"),
                           ("effort", "effort_command_topic"), ("rotor_thrust", "rotor_thrust_topic")):
            if iface in plant.interfaces and p[key]:
                self.create_subscription(ros.Float64MultiArray, p[key],
                                         lambda msg, i=iface: self._on_array(msg, i), cq)
                topics.append(p[key])
        if "position" in plant.interfaces and p["trajectory_topic"]:
            self.create_subscription(ros.JointTrajectory, p["trajectory_topic"], self._on_trajectory, cq)
            topics.append(p["trajectory_topic"])
        if "ctbr" in plant.interfaces and p["ctbr_topic"]:
            self.create_subscription(ros.TwistStamped, p["ctbr_topic"], self._on_ctbr, cq)
            topics.append(p["ctbr_topic"])
        self.create_service(ros.Trigger, "~/reset", self._on_reset)
        return topics

    def _read_timing(self):
        p = self.p
        self._got_command = False
        self.idle_timer = self.timer = None
        if not self.lockstep:
            self.publish_every, self._period = ps.realtime_timing(self.plant.dt, p["real_time_factor"],
                                                                  p["publish_rate_hz"])
        self.wait_subs = ps.subscriber_count(p["wait_for_subscribers"])

    def _open_gate(self):
        """Start now, or once every state topic has wait_for_subscribers matched subscriptions."""
        self.gate_timer = None
        if self._subscribers_matched():
            self._start()
        else:
            self.gate_timer = self.create_timer(0.02, self._check_gate)

    def _subscribers_matched(self) -> bool:
        """wait_for_subscribers: every state publisher has that many matched subscriptions."""
        pubs = [pub for pub in (self.pub_js, self.pub_odom) if pub is not None]
        return all(pub.get_subscription_count() >= self.wait_subs for pub in pubs)

    def _check_gate(self):
        if self._subscribers_matched():
            self.gate_timer.cancel()
            self.get_logger().info(f"state subscribers matched ({self.wait_subs} each): starting")
            # The count is the writer's view: a subscriber's reader may match this writer a
            # moment later, and a volatile reader drops what was sent before (a CI run's
            # recorder lost one lockstep state of 150 that the controller got). So the first
            # state waits DISCOVERY_SETTLE_S more.
            self.settle_timer = self.create_timer(DISCOVERY_SETTLE_S, self._settled)

    def _settled(self):
        self.settle_timer.cancel()
        self._start()

    def _start(self):
        """Send the first state out; then the clock runs (realtime) or waits for commands (lockstep)."""
        if self.lockstep:
            period = float(self.p["lockstep_republish_s"])
            self.idle_timer = self.create_timer(period, self._republish_idle) if period > 0 else None
        else:
            self.timer = self.create_timer(self._period, self._tick)
        self._publish()

    # ------------------------------------------------------------------ state
    def _set_initial_state(self, positions, velocities):
        q, v = ps.initial_state(self.plant, positions, velocities)
        self.plant.set_initial_state(q, v)
        self.plant.reset()

    def _setup_visualisation(self, p):
        """/tf and the latched /robot_description (RViz, Foxglove)."""
        import mujoco

        from ..physics.urdf import _read_source

        plant = self.plant
        self.pub_tf = None
        if p["tf_topic"]:
            if common.have_tf2_msgs():
                from tf2_msgs.msg import TFMessage

                self.pub_tf = self.create_publisher(TFMessage, p["tf_topic"], common.state_qos())
                self._tf_scratch = mujoco.MjData(plant.model)
                names = set(plant.physics_model.link_names)
                if not p["publish_link_tf"]:       # only world -> base (robot_state_publisher does the rest)
                    names = {plant.physics_model.body_names[0]} if plant.floating_base else set()
                self._tf_links = names
            else:
                self.get_logger().warning(
                    f"tf2_msgs is not installed (it comes with a ROS 2 install; the PyPI ROS wheels have no "
                    f"ros-tf2-msgs, scripts/bootstrap.sh builds it where cmake and c++ exist): "
                    f"{p['tf_topic']} is not published")
        if p["robot_description_topic"]:
            text, _ = _read_source(str(plant.urdf_path), str(plant.urdf_path), None)
            self.pub_description = self.create_publisher(type(common.string_msg("")),
                                                         p["robot_description_topic"], common.latched_qos())
            self.pub_description.publish(common.string_msg(text))

    def _publish(self):
        plant = self.plant
        s = plant.measured()
        t = plant.time
        if self.pub_tf is not None and self._tf_links:
            self.pub_tf.publish(common.tf_message(t, link_transforms(
                plant.model, plant.data.qpos, self._tf_scratch, self._tf_links, self.p["world_frame"])))
        if plant.floating_base:
            if self.pub_odom is not None:
                self.pub_odom.publish(common.odometry_msg(t, s.position, s.orientation, s.linear_velocity_body,
                                                          s.angular_velocity, self.p["world_frame"],
                                                          self.p["base_frame"]))
            if self.pub_imu is not None:
                self.pub_imu.publish(common.imu_msg(t, s.orientation, s.angular_velocity, s.specific_force,
                                                    self.p["base_frame"]))
            js = s.joints
        else:
            js = s
        if self.pub_js is not None and js is not None:
            self.pub_js.publish(common.joint_state_msg(js.names, js.position, js.velocity, js.effort, t))
        if self.pub_clock is not None:
            self.pub_clock.publish(common.clock_msg(t))

    def _advance(self, command=None, interface=None):
        """One control step (with the last valid command when ``command`` is None)."""
        try:
            self.plant.step(command, interface)
        except FloatingPointError as e:
            self.get_logger().error(f"{e}; resetting to the initial state")
            self.plant.reset()

    # ------------------------------------------------------------------ commands
    def _reject(self, why: str):
        self.rejected += 1
        self.get_logger().warning(f"rejected command ({self.rejected} so far): {why}; keeping the last valid "
                                  f"command", throttle_duration_sec=1.0)

    def _accept(self, interface: str, command):
        """Check a command; lockstep: step once (with it, or the last valid one) and publish."""
        self.commands += 1
        self._got_command = True
        try:
            cmd = self.plant.check_command(command, interface)
        except ValueError as e:
            self._reject(str(e))
            cmd = None
        if cmd is not None:
            self.plant.last_command = (interface, cmd)
        if self.lockstep:
            self._advance()
            self._publish()

    def _on_array(self, msg, interface: str):
        try:
            n = len(self.plant.command_names(interface))
            data = common.float64_array(msg, n, f"{interface} command")
        except (ValueError, TypeError) as e:
            return self._accept_bad(str(e))
        if interface in JOINT_INTERFACES:
            data = data[self._to_plant]
        self._accept(interface, data)

    def _accept_bad(self, why: str):
        self.commands += 1
        self._got_command = True
        self._reject(why)
        if self.lockstep:
            self._advance()
            self._publish()

    def _on_trajectory(self, msg):
        try:
            pos, _ = common.trajectory_point(msg, self.plant.actuated_joints)
        except (ValueError, TypeError) as e:
            return self._accept_bad(str(e))
        self._accept("position", pos)

    def _on_ctbr(self, msg):
        t = msg.twist
        self._accept("ctbr", [t.linear.z, t.angular.x, t.angular.y, t.angular.z])

    # ------------------------------------------------------------------ timers and services
    def _tick(self):
        self._advance()
        if self.plant._steps % self.publish_every == 0:
            self._publish()

    def _republish_idle(self):
        if self._got_command:
            self.idle_timer.cancel()
            return
        self._publish()

    def _on_reset(self, request, response):
        self.plant.reset()
        self._publish()
        response.success = True
        response.message = "reset to the initial state, t = 0"
        return response

    def close(self):
        """Finish at shutdown, called once by run_node: a recorder gets the last states before the exit."""
        for t in (self.timer, self.idle_timer):
            if t is not None:
                t.cancel()
        late = common.flush_publishers((self.pub_js, self.pub_odom, self.pub_imu, self.pub_clock))
        if late:
            self.get_logger().warning(f"shutting down with states a subscriber has not acknowledged on {late}")


def main(args: Optional[List[str]] = None) -> int:
    def factory():
        return make_node_class()()
    status = common.run_node(factory, args=args, name=NODE_NAME)
    sys.exit(status)


if __name__ == "__main__":
    main()
