"""Deploy a trained policy: robot (MuJoCo stand-in, Gazebo or hardware) + policy_controller + recorder.

    ros2 launch diffsim_ros deploy.launch.py                                  # hover on the MuJoCo stand-in
    ros2 launch diffsim_ros deploy.launch.py robot:=arm target_point:="[0.25, 0.1, 0.35]"
    ros2 launch diffsim_ros deploy.launch.py target:=gazebo robot:=arm        # ros_gz_sim + gz_ros2_control
    ros2 launch diffsim_ros deploy.launch.py target:=hardware robot:=quadrotor interface:=cmd_vel_legacy

target:=mujoco    mujoco_plant (this package) plays the robot: same URDF, an independent engine; it
                  publishes /tf and a latched /robot_description for RViz/Foxglove, or, where
                  robot_state_publisher is installed, that does (the stand-in adds world -> base).
target:=gazebo    robot_state_publisher + ros_gz_sim (gz sim, spawns the URDF from robot_description);
                  arms: gz_ros2_control's controller_manager with joint_state_broadcaster and a
                  forward_command controller (the URDF needs its <ros2_control> tag and the
                  gz_ros2_control plugin; config/controller_arm_gazebo.yaml lists the controllers);
                  quadrotors need the robot's own gz multicopter plugins (not in this package).
                  Not tested here: no Gazebo on the development machine.
target:=hardware  nothing but the controller and the recorder: the robot's own drivers must
                  publish /joint_states (or /odom and /imu) and take the selected command interface.

Recording is on by default (record:=false turns it off): trajectory_recorder writes a rosbag2
(MCAP) of states, commands, predictions, metadata and diagnostics into bag:=<folder>.
"""
import os

from launch import LaunchDescription
from launch.actions import DeclareLaunchArgument, IncludeLaunchDescription, OpaqueFunction
from launch.launch_description_sources import PythonLaunchDescriptionSource
from launch.substitutions import LaunchConfiguration
from launch_ros.actions import Node
from launch_ros.substitutions import FindPackageShare

PACKAGE = "diffsim_ros"

#: robot -> (training/robot config, default checkpoint, URDF) inside the package share folder.
ROBOTS = {
    "quadrotor": ("config/hover.yaml", "policies/hover", "urdf/diffsim_quadrotor.urdf"),
    "arm": ("config/reach_arm.yaml", "policies/reach_arm", "urdf/diffsim_arm.urdf"),
}
TARGETS = ("mujoco", "gazebo", "hardware")
#: robot -> the topics trajectory_recorder subscribes at its start (types known up front, so the first
#: states and commands are not lost to discovery); others are still found by discovery.
RECORDED = {
    "quadrotor": ["/odom:nav_msgs/msg/Odometry", "/imu:sensor_msgs/msg/Imu", "/cmd_ctbr:geometry_msgs/msg/TwistStamped",
                  "/diffsim/predicted_state:nav_msgs/msg/Odometry"],
    "arm": ["/joint_states:sensor_msgs/msg/JointState",
            "/position_controller/commands:std_msgs/msg/Float64MultiArray",
            "/diffsim/predicted_state:sensor_msgs/msg/JointState"],
}
RECORDED_COMMON = ["/diffsim/command:std_msgs/msg/Float64MultiArray", "/diffsim/metadata:std_msgs/msg/String",
                   "/diagnostics:diagnostic_msgs/msg/DiagnosticArray", "/clock:rosgraph_msgs/msg/Clock"]

ARGUMENTS = [
    ("target", "mujoco", "where the robot is: mujoco | gazebo | hardware"),
    ("robot", "quadrotor", "quadrotor (hover policy) or arm (reach policy)"),
    ("config", "", "robot/training config file (default: config/hover.yaml or config/reach_arm.yaml)"),
    ("checkpoint", "", "policy checkpoint folder (default: policies/hover or policies/reach_arm)"),
    ("interface", "auto", "policy_controller interface: forward_command | joint_trajectory | ctbr | rotor_thrust | "
                          "cmd_vel_legacy | auto"),
    ("target_point", "[]", "goal [x, y, z] (m); required for the arm"),
    ("rate_hz", "0.0", "control rate (0: the policy's own)"),
    ("lockstep", "false", "one command per state (mujoco target only: the plant steps per command)"),
    ("record", "true", "record a rosbag2 (MCAP) with trajectory_recorder"),
    ("bag", "bags/deploy", "output folder of the bag"),
    ("controller_params", "", "extra parameter file for policy_controller (e.g. config/controller_*.yaml)"),
]


def gazebo_description(robot: str, urdf_rel: str) -> str:
    """The robot_description Gazebo spawns: for the arm, its xacro with the <ros2_control> tag and
    the gz_ros2_control plugin (controllers from config/controller_arm_gazebo.yaml); the same
    physics as the plain URDF the policy was trained on."""
    if robot == "arm":
        import xacro

        doc = xacro.process_file(_share("urdf/diffsim_arm.urdf.xacro"),
                                 mappings={"ros2_control": "true",
                                           "controllers": _share("config/controller_arm_gazebo.yaml")})
        return doc.toxml()
    with open(_share(urdf_rel)) as f:
        return f.read()


def _share(rel: str) -> str:
    from ament_index_python.packages import get_package_share_directory

    return os.path.join(get_package_share_directory(PACKAGE), rel)


def _installed(package: str) -> bool:
    from ament_index_python.packages import PackageNotFoundError, get_package_prefix

    try:
        get_package_prefix(package)
        return True
    except PackageNotFoundError:
        return False


def _bool(text: str) -> bool:
    return text.strip().lower() in ("1", "true", "yes", "on")


def _setup(context, *args, **kwargs):
    get = lambda name: LaunchConfiguration(name).perform(context)  # noqa: E731
    target, robot = get("target"), get("robot")
    if target not in TARGETS:
        raise RuntimeError(f"deploy.launch.py: target:={target} is not one of {', '.join(TARGETS)}")
    if robot not in ROBOTS:
        raise RuntimeError(f"deploy.launch.py: robot:={robot} is not one of {', '.join(ROBOTS)}")
    cfg_rel, ckpt_rel, urdf_rel = ROBOTS[robot]
    config = get("config") or _share(cfg_rel)
    checkpoint = get("checkpoint") or _share(ckpt_rel)
    lockstep = _bool(get("lockstep")) and target == "mujoco"
    actions = []

    controller_params = {
        "checkpoint": checkpoint,
        "config": config,
        "interface": get("interface"),
        "rate_hz": float(get("rate_hz")),
        "lockstep": lockstep,
        # The stand-in and Gazebo stamp states with simulated time (and publish /clock): the
        # controller's stamp rule (max_stamp_skew_s) compares against that clock.
        "use_sim_time": target in ("mujoco", "gazebo"),
    }
    if _bool(get("record")):
        # Nothing the bag should hold is published before the recorder listens: the controller
        # answers no state until the recorder (and on the stand-in the plant too) has matched
        # its command topic and /diffsim/command, /diffsim/predicted_state, /diagnostics.
        controller_params["wait_for_recorders"] = 1
        controller_params["wait_for_subscribers"] = 2 if target == "mujoco" else 1
    point = [float(x) for x in get("target_point").strip("[] ").split(",") if x.strip()]
    if point:
        controller_params["target"] = point
    params = [controller_params]
    if get("controller_params"):
        params.append(get("controller_params"))
    actions.append(Node(package=PACKAGE, executable="policy_controller", name="policy_controller",
                        output="screen", parameters=params))

    if target == "mujoco":
        plant_params = {"config": config, "mode": "lockstep" if lockstep else "realtime"}
        if _installed("robot_state_publisher"):
            # RViz/Foxglove: robot_state_publisher gives /robot_description and the links' /tf from
            # the stand-in's /joint_states; the stand-in adds world -> base for a floating base.
            # Without it the stand-in publishes both itself.
            with open(_share(urdf_rel)) as f:
                description = f.read()
            actions.append(Node(package="robot_state_publisher", executable="robot_state_publisher",
                                output="screen", parameters=[{"robot_description": description,
                                                              "use_sim_time": True}]))
            plant_params.update({"publish_link_tf": False, "robot_description_topic": ""})
        actions.append(Node(package=PACKAGE, executable="mujoco_plant", name="mujoco_plant", output="screen",
                            parameters=[plant_params]))
    elif target == "gazebo":
        description = gazebo_description(robot, urdf_rel)
        actions.append(Node(package="robot_state_publisher", executable="robot_state_publisher", output="screen",
                            parameters=[{"robot_description": description, "use_sim_time": True}]))
        gz_launch = os.path.join(FindPackageShare("ros_gz_sim").perform(context), "launch", "gz_sim.launch.py")
        actions.append(IncludeLaunchDescription(PythonLaunchDescriptionSource(gz_launch),
                                                launch_arguments={"gz_args": "-r empty.sdf"}.items()))
        actions.append(Node(package="ros_gz_sim", executable="create", output="screen",
                            arguments=["-topic", "robot_description", "-name", robot, "-z", "0.1"]))
        actions.append(Node(package="ros_gz_bridge", executable="parameter_bridge", output="screen",
                            arguments=["/clock@rosgraph_msgs/msg/Clock[gz.msgs.Clock"]))
        if robot == "arm":
            # gz_ros2_control starts the controller_manager inside gz sim from the URDF's <ros2_control> tag.
            for ctrl in ("joint_state_broadcaster", "position_controller"):
                actions.append(Node(package="controller_manager", executable="spawner", output="screen",
                                    arguments=[ctrl, "--param-file", _share("config/controller_arm_gazebo.yaml")]))
    # hardware: the robot's own drivers publish the states and take the commands.

    if _bool(get("record")):
        actions.append(Node(package=PACKAGE, executable="trajectory_recorder", name="trajectory_recorder",
                            output="screen", parameters=[{
                                "output_dir": get("bag"), "types": RECORDED[robot] + RECORDED_COMMON,
                                # SIGINT reaches every process at once: take what is still queued.
                                "drain_s": 1.0}]))
    return actions


def generate_launch_description():
    return LaunchDescription(
        [DeclareLaunchArgument(name, default_value=default, description=desc) for name, default, desc in ARGUMENTS]
        + [OpaqueFunction(function=_setup)])
