"""mujoco_plant as a ROS 2 node over real DDS, on an isolated ROS_DOMAIN_ID (issue 5).

* quadrotor: the console script runs as a separate process in lockstep; each CTBR
  command is answered by exactly one /odom, one /imu and one /clock, stamped k dt, and
  the states equal an in-process MujocoPlant fed the same commands (determinism); a NaN
  command and a wrong-length rotor-thrust command are rejected (the plant steps with the
  last valid command, the process stays up); ~/reset returns to t = 0.
* arm: the node in this process (same code, faster start): position commands in a
  reordered ``controller_joints`` order and JointTrajectory commands by joint name map to
  the right joints (compared with MujocoPlant), and every joint is published by name.
"""
from __future__ import annotations

import os
import re
import signal
import subprocess

import numpy as np
import pytest

rclpy = pytest.importorskip("rclpy", reason="rclpy not installed (ROS 2 client library)")
pytest.importorskip("mujoco", reason="the plant runs on MuJoCo (pip package 'mujoco')")
pytestmark = pytest.mark.ros

from conftest import REPO_ROOT, console_script, interrupt, ros_context, ros_domain, spin_until  # noqa: E402

from diffsim_ros import config  # noqa: E402
from diffsim_ros.plant import MujocoPlant  # noqa: E402

DOMAIN = ros_domain()




@pytest.fixture(scope="module")
def ros():
    yield from ros_context(DOMAIN)


def _ns(stamp) -> int:
    return stamp.sec * 10**9 + stamp.nanosec


_interrupt = interrupt
_spin_until = spin_until


def test_quadrotor_lockstep_process_one_state_per_command(ros, tmp_path):
    from geometry_msgs.msg import TwistStamped
    from nav_msgs.msg import Odometry
    from rclpy.executors import SingleThreadedExecutor
    from rosgraph_msgs.msg import Clock
    from sensor_msgs.msg import Imu
    from std_msgs.msg import Float64MultiArray
    from std_srvs.srv import Trigger

    env = dict(os.environ, ROS_DOMAIN_ID=str(DOMAIN), PYTHONUNBUFFERED="1")
    log = open(tmp_path / "plant.log", "w")
    proc = subprocess.Popen([console_script("mujoco_plant"), "--ros-args",
                             "--params-file", str(REPO_ROOT / "config/hover.yaml"),
                             "-p", "mode:=lockstep", "-p", "initial_positions:=[0.0, 0.0, 1.0]",
                             "-p", "lockstep_republish_s:=0.2"], env=env, stdout=log, stderr=subprocess.STDOUT)
    node = rclpy.create_node("plant_tester", context=ros)
    ex = SingleThreadedExecutor(context=ros)
    ex.add_node(node)
    # Answers (stamp > 0) apart from the initial state, which is republished (stamp 0) until
    # the first command arrives and again after ~/reset.
    got = {"odom": [], "imu": [], "clock": []}
    initial = {"odom": [], "imu": [], "clock": []}

    def keep(key, stamp_of):
        def cb(m):
            (got if _ns(stamp_of(m)) > 0 else initial)[key].append(m)
        return cb
    node.create_subscription(Odometry, "/odom", keep("odom", lambda m: m.header.stamp), 50)
    node.create_subscription(Imu, "/imu", keep("imu", lambda m: m.header.stamp), 50)
    node.create_subscription(Clock, "/clock", keep("clock", lambda m: m.clock), 50)
    pub = node.create_publisher(TwistStamped, "/cmd_ctbr", 10)
    pub_thrust = node.create_publisher(Float64MultiArray, "/cmd_rotor_thrust", 10)
    reset = node.create_client(Trigger, "/mujoco_plant/reset")
    try:
        # The initial state is republished until the first command: wait for it and the match.
        assert _spin_until(ex, lambda: initial["odom"] and pub.get_subscription_count() > 0
                           and pub_thrust.get_subscription_count() > 0, 40), open(tmp_path / "plant.log").read()
        assert not any(got.values())
        ref = MujocoPlant(config.load_yaml(REPO_ROOT / "config/hover.yaml"), initial_q=[0, 0, 1.0, 0, 0, 0, 1])
        cmds = [[9.81, 0.0, 0.0, 0.0]] * 3 + [[10.2, 0.4, -0.2, 0.1]] * 7
        for k, c in enumerate(cmds, start=1):
            msg = TwistStamped()
            msg.twist.linear.z, msg.twist.angular.x, msg.twist.angular.y, msg.twist.angular.z = c
            pub.publish(msg)
            assert _spin_until(ex, lambda: len(got["odom"]) >= k and len(got["imu"]) >= k
                               and len(got["clock"]) >= k, 5), f"no answer to command {k}"
            s = ref.step(c)
            o = got["odom"][-1]
            p = o.pose.pose.position
            np.testing.assert_allclose([p.x, p.y, p.z], s.position, atol=1e-12)
            q = o.pose.pose.orientation
            np.testing.assert_allclose([q.x, q.y, q.z, q.w], s.orientation, atol=1e-12)
            w = o.twist.twist.angular
            np.testing.assert_allclose([w.x, w.y, w.z], s.angular_velocity, atol=1e-12)
            a = got["imu"][-1].linear_acceleration
            np.testing.assert_allclose([a.x, a.y, a.z], s.specific_force, atol=1e-9)
            assert _ns(o.header.stamp) == round(k * ref.dt * 1e9)
        _spin_until(ex, lambda: False, 0.3)
        assert len(got["odom"]) == len(cmds) and len(got["imu"]) == len(cmds) and len(got["clock"]) == len(cmds)
        # Bad commands: NaN thrust, 3 entries for 4 rotors. Each is rejected, answered by one
        # step with the last valid command, and the node stays up.
        bad = TwistStamped()
        bad.twist.linear.z = float("nan")
        pub.publish(bad)
        assert _spin_until(ex, lambda: len(got["odom"]) == len(cmds) + 1, 5)
        pub_thrust.publish(Float64MultiArray(data=[1.0, 2.0, 3.0]))
        assert _spin_until(ex, lambda: len(got["odom"]) == len(cmds) + 2, 5)
        ref.step(None)
        s = ref.step(None)
        p = got["odom"][-1].pose.pose.position
        np.testing.assert_allclose([p.x, p.y, p.z], s.position, atol=1e-12)
        assert proc.poll() is None, "the plant process died on a bad command"
        # ~/reset: back to t = 0 at the initial state, one state published.
        assert reset.wait_for_service(timeout_sec=5)
        n0 = len(initial["odom"])
        fut = reset.call_async(Trigger.Request())
        assert _spin_until(ex, lambda: fut.done(), 5) and fut.result().success
        assert _spin_until(ex, lambda: len(initial["odom"]) > n0, 5)
        assert initial["odom"][-1].pose.pose.position.z == pytest.approx(1.0, abs=1e-15)
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            rc = proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            rc = None
        node.destroy_node()
        log.close()
    text = (tmp_path / "plant.log").read_text()
    assert "rejected command" in text and "non-finite" in text, text
    assert rc == 0, text


def test_quadrotor_realtime_process_steps_on_its_own_timer(ros, tmp_path):
    """The quadrotor's realtime process steps on its own timer.

    Realtime mode: states come without any command (the hold command, hover thrust, keeps the
    accelerometer at about g); a zero-thrust command makes the quadrotor fall, and the
    accelerometer then reads the body drag alone.
    """
    from geometry_msgs.msg import TwistStamped
    from nav_msgs.msg import Odometry
    from rclpy.executors import SingleThreadedExecutor
    from sensor_msgs.msg import Imu

    env = dict(os.environ, ROS_DOMAIN_ID=str(DOMAIN), PYTHONUNBUFFERED="1")
    log = open(tmp_path / "plant.log", "w")
    proc = subprocess.Popen([console_script("mujoco_plant"), "--ros-args", "--params-file",
                             str(REPO_ROOT / "config/hover.yaml"), "-p", "mode:=realtime",
                             "-p", "initial_positions:=[0.0, 0.0, 5.0]"], env=env, stdout=log, stderr=subprocess.STDOUT)
    node = rclpy.create_node("plant_realtime_tester", context=ros)
    ex = SingleThreadedExecutor(context=ros)
    ex.add_node(node)
    odom, imu = [], []
    node.create_subscription(Odometry, "/odom", odom.append, 100)
    node.create_subscription(Imu, "/imu", imu.append, 100)
    pub = node.create_publisher(TwistStamped, "/cmd_ctbr", 10)
    try:
        assert _spin_until(ex, lambda: len(imu) >= 20 and pub.get_subscription_count() > 0, 40), \
            open(tmp_path / "plant.log").read()
        stamps = [_ns(m.header.stamp) for m in odom]
        assert all(b > a for a, b in zip(stamps, stamps[1:])), "simulated time must advance on its own"
        hover_f = imu[-1].linear_acceleration.z
        assert abs(hover_f - 9.81) < 0.2, hover_f
        z0 = odom[-1].pose.pose.position.z
        n = len(imu)
        pub.publish(TwistStamped())                       # 0 N, zero rates: motors off
        # The motors spin down within a few time constants (0.02 s); 30 states later it falls freely.
        assert _spin_until(ex, lambda: len(imu) >= n + 30, 40)
        # In free fall the accelerometer reads only the body drag: (D1 v + D2 v |v|) / m per body axis,
        # with the config's coefficients and the velocity of the state published with it.
        params = config.load_yaml(REPO_ROOT / "config/hover.yaml")
        rot = params["simulator"]["rotors"]
        mass = float(MujocoPlant(params).physics_model.mass.sum())
        by_stamp = {_ns(m.header.stamp): m for m in odom}
        last = next(m for m in reversed(imu) if _ns(m.header.stamp) in by_stamp)
        tw = by_stamp[_ns(last.header.stamp)].twist.twist.linear
        v = np.array([tw.x, tw.y, tw.z])
        drag = -(np.array(rot["drag_linear"]) * v + np.array(rot["drag_quadratic"]) * v * np.abs(v)) / mass
        f = np.array([last.linear_acceleration.x, last.linear_acceleration.y, last.linear_acceleration.z])
        assert np.linalg.norm(v) > 1.0, v                  # it is falling
        np.testing.assert_allclose(f, drag, atol=0.05)
        assert odom[-1].pose.pose.position.z < z0 - 0.05
        assert proc.poll() is None
    finally:
        node.destroy_node()
        _interrupt(proc)


def test_arm_node_maps_commands_by_joint_name(ros):
    from rclpy.executors import SingleThreadedExecutor
    from rclpy.parameter import Parameter
    from sensor_msgs.msg import JointState
    from std_msgs.msg import Float64MultiArray
    from trajectory_msgs.msg import JointTrajectory, JointTrajectoryPoint

    from diffsim_ros.nodes import mujoco_plant as node_mod

    joints = ["arm_joint1", "arm_joint2", "arm_joint3", "arm_joint4"]
    order = ["arm_joint4", "arm_joint2", "arm_joint1", "arm_joint3"]
    cls = node_mod._build_node_class()
    plant_node = cls(context=ros, parameter_overrides=[
        Parameter("config", value=str(REPO_ROOT / "config/reach_arm.yaml")),
        Parameter("mode", value="lockstep"), Parameter("controller_joints", value=order),
        Parameter("initial_positions", value=[0.0, 0.2, -0.3, 0.1])])
    tester = rclpy.create_node("arm_tester", context=ros)
    ex = SingleThreadedExecutor(context=ros)
    ex.add_node(plant_node)
    ex.add_node(tester)
    states = []
    tester.create_subscription(JointState, "/joint_states", states.append, 50)
    pos_pub = tester.create_publisher(Float64MultiArray, "/position_controller/commands", 10)
    traj_pub = tester.create_publisher(JointTrajectory, "/joint_trajectory_controller/joint_trajectory", 10)
    try:
        assert _spin_until(ex, lambda: pos_pub.get_subscription_count() > 0 and traj_pub.get_subscription_count() > 0
                           and states, 10)
        _spin_until(ex, lambda: False, 0.2)
        states.clear()
        ref = MujocoPlant(config.load_yaml(REPO_ROOT / "config/reach_arm.yaml"), initial_q=[0.0, 0.2, -0.3, 0.1])
        target = {"arm_joint1": 0.3, "arm_joint2": 0.5, "arm_joint3": -0.4, "arm_joint4": 0.2}
        for k in range(5):
            pos_pub.publish(Float64MultiArray(data=[target[j] for j in order]))
            assert _spin_until(ex, lambda: len(states) == k + 1, 5)
            s = ref.step([target[j] for j in joints])
            m = states[-1]
            assert list(m.name) == joints
            np.testing.assert_allclose(m.position, s.position, atol=1e-12)
            np.testing.assert_allclose(m.velocity, s.velocity, atol=1e-12)
            np.testing.assert_allclose(m.effort, s.effort, atol=1e-12)
        # A JointTrajectory naming the joints in yet another order.
        names = ["arm_joint3", "arm_joint1", "arm_joint4", "arm_joint2"]
        traj = JointTrajectory(joint_names=names,
                               points=[JointTrajectoryPoint(positions=[-0.2, 0.1, 0.0, 0.3])])
        traj_pub.publish(traj)
        assert _spin_until(ex, lambda: len(states) == 6, 5)
        s = ref.step([0.1, 0.3, -0.2, 0.0])
        np.testing.assert_allclose(states[-1].position, s.position, atol=1e-12)
        # A trajectory missing a joint: rejected, one step with the last valid command.
        traj_pub.publish(JointTrajectory(joint_names=names[:3],
                                         points=[JointTrajectoryPoint(positions=[0.0, 0.0, 0.0])]))
        assert _spin_until(ex, lambda: len(states) == 7, 5)
        s = ref.step(None)
        np.testing.assert_allclose(states[-1].position, s.position, atol=1e-12)
        assert plant_node.rejected == 1
    finally:
        plant_node.destroy_node()
        tester.destroy_node()


@pytest.mark.parametrize("name, val, err", [
    ("perturbation.mass_scale", -1.0, "'perturbation.mass_scale' must be > 0"),
    ("mode", "fast", "parameter 'mode' must be one of ('realtime', 'lockstep'), got 'fast'"),
    ("controller_joints", ["arm_joint1", "arm_joint2"], "parameter 'controller_joints'"),
    ("initial_positions", [0.1, 0.2], "parameter 'initial_positions' has 2 entries"),
    ("simulator.kp", [1.0, 2.0], "'simulator.kp' has 2 entries for 4 actuated joints"),
    ("perturbation.sensor_noise", "abc", "'perturbation.sensor_noise' must be a number or a list of 2 numbers"),
    ("perturbation.wind_force", 1.0, "'perturbation.wind_force' must be a list of 3 numbers"),
    ("perturbation.latency", "0.01", "'perturbation.latency' must be a number"),
    ("real_time_factor", "fast", "parameter 'real_time_factor' must be a number (default 1.0), got 'fast'"),
    ("initial_positions", ["a"], "parameter 'initial_positions' must be a list of numbers"),
])
def test_plant_node_bad_parameter_names_it(ros, name, val, err):
    """A bad parameter stops the plant node at start with an error naming it.

    The console script prints it and exits with status 2: see common.run_node.
    """
    from rclpy.parameter import Parameter

    from diffsim_ros.nodes import mujoco_plant as node_mod
    from diffsim_ros.nodes.common import StartupError
    from diffsim_ros.physics import ConfigError

    cls = node_mod._build_node_class()
    with pytest.raises((StartupError, ConfigError), match=re.escape(err)):
        cls(context=ros, parameter_overrides=[Parameter("config", value=str(REPO_ROOT / "config/reach_arm.yaml")),
                                              Parameter(name, value=val)])


def test_common_message_helpers_map_by_name():
    """nodes.common: JointState <-> arrays by joint name, and the errors name the field."""
    from std_msgs.msg import Float64MultiArray

    from diffsim_ros.nodes import common

    msg = common.joint_state_msg(["b", "a", "c"], [2.0, 1.0, 3.0], [20.0, 10.0, 30.0], t=1.5)
    assert common.stamp_to_ns(msg.header.stamp) == 1_500_000_000
    pos, vel, eff = common.joint_state_arrays(msg, ["a", "b"])
    assert pos.tolist() == [1.0, 2.0] and vel.tolist() == [10.0, 20.0] and eff is None
    with pytest.raises(common.MessageError, match=r"lacks joints \['d'\]"):
        common.joint_state_arrays(msg, ["a", "d"])
    msg.velocity[1] = float("nan")
    with pytest.raises(common.MessageError, match=r"velocity is not finite for \['a'\]"):
        common.joint_state_arrays(msg, ["a", "b"])
    with pytest.raises(common.MessageError, match="has 2 entries, expected 3"):
        common.float64_array(Float64MultiArray(data=[1.0, 2.0]), 3)
    with pytest.raises(common.MessageError, match=r"data\[1\] is inf"):
        common.float64_array(Float64MultiArray(data=[1.0, float("inf")]))


def test_plant_node_friction_perturbation_parameters_reach_the_plant(ros):
    """The plant node's friction perturbation parameters reach the plant.

    perturbation.joint_friction_scale and perturbation.constraint_friction (ROS parameters) set
    the stand-in's friction: the smoothed law scaled by default, MuJoCo's frictionloss (the URDF's
    0.02 N m on arm_joint1, scaled) with the constraint.
    """
    from rclpy.parameter import Parameter

    from diffsim_ros.nodes import mujoco_plant as node_mod

    cls = node_mod._build_node_class()
    arm = Parameter("config", value=str(REPO_ROOT / "config/reach_arm.yaml"))
    for constraint in (False, True):
        node = cls(context=ros, parameter_overrides=[arm, Parameter("perturbation.joint_friction_scale", value=1.5),
                                                     Parameter("perturbation.constraint_friction", value=constraint)])
        try:
            plant = node.plant
            dof = plant.model.joint("arm_joint1").dofadr[0]
            assert plant.perturbation.constraint_friction is constraint
            if constraint:
                assert plant.model.dof_frictionloss[dof] == pytest.approx(0.03) and plant._friction is None
            else:
                assert plant.model.dof_frictionloss[dof] == 0.0 and plant._friction[0] == pytest.approx(0.03)
        finally:
            node.destroy_node()


def test_plant_node_takes_a_number_wherever_the_schema_does(ros):
    """The plant node takes a number wherever the schema does.

    Parameters given as the schema reads them: one number for perturbation.sensor_noise (both
    entries), integers for doubles (perturbation.latency 0, mass_scale 1, wind_force [0, 0, 1],
    real_time_factor 2, initial_positions of integers) and a whole double for the integer seed.
    The node starts, declares each in its own type and hands the values to the plant.
    """
    from rclpy.parameter import Parameter

    from diffsim_ros.nodes import mujoco_plant as node_mod

    cls = node_mod._build_node_class()
    given = {"perturbation.sensor_noise": 0.001, "perturbation.latency": 0, "perturbation.mass_scale": 1,
             "perturbation.wind_force": [0, 0, 1], "perturbation.seed": 3.0, "perturbation.actuator_lag": -1,
             "real_time_factor": 2, "initial_positions": [0, 1, 0, 0]}
    node = cls(context=ros, parameter_overrides=[Parameter("config", value=str(REPO_ROOT / "config/reach_arm.yaml"))]
               + [Parameter(k, value=v) for k, v in given.items()])
    try:
        got = {k: node.get_parameter(k).value for k in given}
        assert list(got["perturbation.sensor_noise"]) == [0.001, 0.001]
        assert (list(got["perturbation.wind_force"]) == [0.0, 0.0, 1.0]
                and list(got["initial_positions"]) == [0, 1, 0, 0])
        assert got["perturbation.latency"] == 0.0 and isinstance(got["perturbation.latency"], float)
        assert got["perturbation.seed"] == 3 and isinstance(got["perturbation.seed"], int)
        assert got["real_time_factor"] == 2.0 and isinstance(got["real_time_factor"], float)
        pert = node.plant.perturbation
        assert pert.sensor_noise == (0.001, 0.001) and pert.latency == 0.0 and pert.mass_scale == 1.0
        assert pert.seed == 3 and pert.actuator_lag is None and pert.wind_force == (0.0, 0.0, 1.0)
        np.testing.assert_allclose(node.plant.true_joint_state().position, [0.0, 1.0, 0.0, 0.0])
    finally:
        node.destroy_node()


def test_plant_process_reads_numbers_from_a_params_file_and_names_a_string(ros, tmp_path):
    """The plant process reads numbers from a params file and names a string.

    The console script as the loop and deploy.launch.py's plant_params start it: a params file
    with perturbation.sensor_noise as one number and latency as the integer 0 runs (it publishes
    its state); -p perturbation.sensor_noise:=abc stops it with status 2 and one line naming the
    parameter, no traceback.
    """
    from rclpy.executors import SingleThreadedExecutor
    from sensor_msgs.msg import JointState

    env = dict(os.environ, ROS_DOMAIN_ID=str(DOMAIN), PYTHONUNBUFFERED="1")
    params = tmp_path / "plant.yaml"
    params.write_text("mujoco_plant:\n  ros__parameters:\n    perturbation:\n      sensor_noise: 0.001\n"
                      "      latency: 0\n      mass_scale: 1\n")
    base = [console_script("mujoco_plant"), "--ros-args", "-p", f"config:={REPO_ROOT / 'config/reach_arm.yaml'}",
            "-p", "mode:=lockstep", "-p", "lockstep_republish_s:=0.2"]
    bad = subprocess.run(base + ["-p", "perturbation.sensor_noise:=abc"], env=env, capture_output=True, text=True,
                         timeout=120)
    assert bad.returncode == 2, bad.stderr
    assert "perturbation.sensor_noise' must be a number or a list of 2 numbers, got 'abc'" in bad.stderr, bad.stderr
    assert "Traceback" not in bad.stderr + bad.stdout, bad.stderr
    log = open(tmp_path / "plant.log", "w")
    proc = subprocess.Popen(base + ["--params-file", str(params)], env=env, stdout=log, stderr=subprocess.STDOUT)
    node = rclpy.create_node("plant_numbers_tester", context=ros)
    ex = SingleThreadedExecutor(context=ros)
    ex.add_node(node)
    states = []
    node.create_subscription(JointState, "/joint_states", states.append, 10)
    try:
        assert _spin_until(ex, lambda: states, 40), open(tmp_path / "plant.log").read()
        assert proc.poll() is None
    finally:
        node.destroy_node()
        _interrupt(proc)
