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

Any checkpoint: checkpoint:=<folder> without robot:= deploys the robot the checkpoint was trained
on (arm, quadrotor or legged, read from its policy.json), with the robot, simulator and task of its
stored training configuration unless config:= names another file:

    ros2 launch diffsim_ros deploy.launch.py checkpoint:=runs/ur5 target_point:="[0.4, 0.1, 0.4]"
    ros2 launch diffsim_ros deploy.launch.py checkpoint:=runs/solo12 lockstep:=true

Recording is on by default (record:=false turns it off): trajectory_recorder writes a rosbag2
(MCAP) of states, commands, predictions, metadata and diagnostics into bag:=<folder>. When any
node exits, the whole deployment shuts down (shutdown_on_exit:=false keeps the others running).
`diffsim-ros loop` (scripts/run.sh) deploys through this file whenever launch is installed.

mode:=excite runs policy_controller's identification motion instead of a policy (the robot from
config:=; a recording for `diffsim-ros sysid`; settings excitation.* in controller_params:=):

    ros2 launch diffsim_ros deploy.launch.py mode:=excite config:=config/reach_arm.yaml lockstep:=true bag:=bags/excite
    ros2 launch diffsim_ros deploy.launch.py mode:=excite target:=hardware config:=my_robot.yaml \
controller_params:=excite.yaml
"""
import os
from pathlib import Path

from launch import LaunchDescription
from launch.actions import DeclareLaunchArgument, IncludeLaunchDescription, OpaqueFunction, Shutdown
from launch.launch_description_sources import PythonLaunchDescriptionSource
from launch.substitutions import LaunchConfiguration
from launch_ros.actions import Node
from launch_ros.substitutions import FindPackageShare

PACKAGE = "diffsim_ros"

#: robot -> (training/robot config, default checkpoint) inside the package share folder; the URDF is
#: the config's.
ROBOTS = {
    "quadrotor": ("config/hover.yaml", "policies/hover"),
    "arm": ("config/reach_arm.yaml", "policies/reach_arm"),
}
TARGETS = ("mujoco", "gazebo", "hardware")
ARGUMENTS = [
    ("target", "mujoco", "where the robot is. mujoco: mujoco_plant plays the robot; gazebo: robot_state_publisher, "
                         "ros_gz_sim (gz sim, spawns the URDF from robot_description), a /clock bridge and, for "
                         "arms, gz_ros2_control controllers from config/controller_arm_gazebo.yaml; hardware: only "
                         "the controller and the recorder (the robot's drivers publish the states and take the "
                         "commands)"),
    ("robot", "auto", "quadrotor (config/hover.yaml, policies/hover), arm (config/reach_arm.yaml, "
                      "policies/reach_arm), or auto: the robot of checkpoint:= (arm, quadrotor or legged, from its "
                      "policy.json; a checkpoint for another robot than a named robot is refused), else the "
                      "quadrotor"),
    ("config", "", "robot/training config file (default: the checkpoint's own training configuration; "
                   "config/hover.yaml or config/reach_arm.yaml for the shipped policies)"),
    ("checkpoint", "", "policy checkpoint folder (default: policies/hover or policies/reach_arm)"),
    ("interface", "auto", "policy_controller interface: forward_command | joint_trajectory | ctbr | rotor_thrust | "
                          "cmd_vel_legacy | auto"),
    ("target_point", "[]", "goal [x, y, z] (m); required for the arm"),
    ("mode", "policy", "policy_controller mode: policy, or excite (an identification motion for diffsim-ros sysid: "
                       "the robot from config:=, no checkpoint; excitation.* settings in controller_params:=)"),
    ("rate_hz", "0.0", "control rate (0: the policy's own)"),
    ("lockstep", "false", "one command per state (mujoco target only: the plant steps per command)"),
    ("record", "true", "record a rosbag2 (MCAP) with trajectory_recorder"),
    ("bag", "bags/deploy", "output folder of the bag"),
    ("controller_params", "", "extra parameter file for policy_controller (e.g. config/controller_*.yaml)"),
    ("plant_params", "", "extra parameter file for mujoco_plant (e.g. perturbation.mass_scale, initial_positions)"),
    ("shutdown_on_exit", "true", "end the whole deployment when any node exits (the others get SIGINT; the bag is "
                                 "closed)"),
]


def gazebo_description(robot: str, urdf: str) -> str:
    """Return the robot_description Gazebo spawns.

    For the arm, its xacro with the <ros2_control> tag and the gz_ros2_control plugin (controllers
    from config/controller_arm_gazebo.yaml); the same physics as the plain URDF the policy was
    trained on.
    """
    if robot == "arm":
        import xacro

        doc = xacro.process_file(_share("urdf/diffsim_arm.urdf.xacro"),
                                 mappings={"ros2_control": "true",
                                           "controllers": _share("config/controller_arm_gazebo.yaml")})
        return doc.toxml()
    with open(urdf) as f:
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


def _robot(get):
    """(kind, config file, checkpoint folder, URDF file) of the robot:= / checkpoint:= / config:= arguments."""
    robot, checkpoint, config = get("robot"), get("checkpoint"), get("config")
    if robot not in ROBOTS and robot != "auto":
        raise RuntimeError(f"deploy.launch.py: robot:={robot} is not one of {', '.join(ROBOTS)}, auto")
    if robot == "auto" and not checkpoint:
        robot = "quadrotor"
    if robot in ROBOTS:
        cfg_rel, ckpt_rel = ROBOTS[robot]
        checkpoint = checkpoint or _share(ckpt_rel)
        config = config or _share(cfg_rel)
    from diffsim_ros.learning.checkpoint import CheckpointError, load_metadata, robot_kind
    from diffsim_ros.workflows.loop import LoopError, checkpoint_config

    try:
        meta = load_metadata(checkpoint)
        kind = robot_kind(meta)
        if robot in ROBOTS and kind != robot:
            raise RuntimeError(f"deploy.launch.py: checkpoint:={checkpoint} is a policy for the {kind} kind of "
                               f"robot, not for robot:={robot} (leave robot:= out to deploy the checkpoint's "
                               "own robot)")
        if not config:
            import tempfile

            config = checkpoint_config(Path(checkpoint).resolve(), Path(tempfile.mkdtemp(prefix="diffsim_deploy_")))
    except (CheckpointError, LoopError) as e:
        raise RuntimeError(f"deploy.launch.py: {e}") from None
    return kind, config, checkpoint, _config_urdf(config)


def _excite_robot(get):
    """mode:=excite: (kind, config, checkpoint, URDF) from config:= (or robot:='s shipped config); no checkpoint."""
    from diffsim_ros import config as cfgmod

    config, robot = get("config"), get("robot")
    if not config:
        if robot not in ROBOTS:
            raise RuntimeError("deploy.launch.py: mode:=excite needs config:= (the robot's training/robot file) or "
                               f"robot:= one of {', '.join(ROBOTS)}")
        config = _share(ROBOTS[robot][0])
    params = cfgmod.load_yaml(config)
    kind = "quadrotor" if params.get("floating_base", False) else "arm"
    return kind, config, "", _config_urdf(config)


def _config_urdf(config: str) -> str:
    from diffsim_ros import config as cfgmod

    return str(cfgmod.resolve_urdf(cfgmod.load_yaml(config), config))


def _setup(context, *args, **kwargs):
    get = lambda name: LaunchConfiguration(name).perform(context)  # noqa: E731
    target = get("target")
    if target not in TARGETS:
        raise RuntimeError(f"deploy.launch.py: target:={target} is not one of {', '.join(TARGETS)}")
    if get("mode") not in ("policy", "excite"):
        raise RuntimeError(f"deploy.launch.py: mode:={get('mode')} is not one of policy, excite")
    if get("mode") == "excite":
        kind, config, checkpoint, urdf = _excite_robot(get)
    else:
        kind, config, checkpoint, urdf = _robot(get)
    # Any node ending ends the deployment: a controller without its plant (or a plant without its
    # controller) is not a deployment, and the recorder must close its bag.
    on_exit = [Shutdown(reason="a deployment node exited")] if _bool(get("shutdown_on_exit")) else None
    lockstep = _bool(get("lockstep")) and target == "mujoco"
    actions = []

    controller_params = {
        "mode": get("mode"),
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
                        output="screen", parameters=params, on_exit=on_exit))

    if target == "mujoco":
        plant_params = {"config": config, "mode": "lockstep" if lockstep else "realtime",
                        # No state before the controller (and the recorder) listen: none is lost, and the
                        # robot does not fall or drift while the controller is still starting.
                        "wait_for_subscribers": 2 if _bool(get("record")) else 1}
        plant_files = [get("plant_params")] if get("plant_params") else []
        if _installed("robot_state_publisher"):
            # RViz/Foxglove: robot_state_publisher gives /robot_description and the links' /tf from
            # the stand-in's /joint_states; the stand-in adds world -> base for a floating base.
            # Without it the stand-in publishes both itself.
            with open(urdf) as f:
                description = f.read()
            actions.append(Node(package="robot_state_publisher", executable="robot_state_publisher",
                                output="screen", parameters=[{"robot_description": description,
                                                              "use_sim_time": True}]))
            plant_params.update({"publish_link_tf": False, "robot_description_topic": ""})
        actions.append(Node(package=PACKAGE, executable="mujoco_plant", name="mujoco_plant", output="screen",
                            parameters=[plant_params] + plant_files, on_exit=on_exit))
    elif target == "gazebo":
        if kind == "legged":
            raise RuntimeError("deploy.launch.py: target:=gazebo deploys the arm and the quadrotor only")
        description = gazebo_description(kind, urdf)
        actions.append(Node(package="robot_state_publisher", executable="robot_state_publisher", output="screen",
                            parameters=[{"robot_description": description, "use_sim_time": True}]))
        gz_launch = os.path.join(FindPackageShare("ros_gz_sim").perform(context), "launch", "gz_sim.launch.py")
        actions.append(IncludeLaunchDescription(PythonLaunchDescriptionSource(gz_launch),
                                                launch_arguments={"gz_args": "-r empty.sdf"}.items()))
        actions.append(Node(package="ros_gz_sim", executable="create", output="screen",
                            arguments=["-topic", "robot_description", "-name", kind, "-z", "0.1"]))
        actions.append(Node(package="ros_gz_bridge", executable="parameter_bridge", output="screen",
                            arguments=["/clock@rosgraph_msgs/msg/Clock[gz.msgs.Clock"]))
        if kind == "arm":
            # gz_ros2_control starts the controller_manager inside gz sim from the URDF's <ros2_control> tag.
            for ctrl in ("joint_state_broadcaster", "position_controller"):
                actions.append(Node(package="controller_manager", executable="spawner", output="screen",
                                    arguments=[ctrl, "--param-file", _share("config/controller_arm_gazebo.yaml")]))
    # hardware: the robot's own drivers publish the states and take the commands.

    if _bool(get("record")):
        from diffsim_ros.workflows.loop import recorded_types

        actions.append(Node(package=PACKAGE, executable="trajectory_recorder", name="trajectory_recorder",
                            output="screen", on_exit=on_exit, parameters=[{
                                "output_dir": get("bag"), "types": recorded_types(kind != "arm", kind),
                                # SIGINT reaches every process at once: take what is still queued.
                                "drain_s": 1.0}]))
    return actions


def generate_launch_description():
    return LaunchDescription(
        [DeclareLaunchArgument(name, default_value=default, description=desc) for name, default, desc in ARGUMENTS]
        + [OpaqueFunction(function=_setup)])
