"""Train a policy with train_node (the same code path as ``diffsim-ros train``).

    ros2 launch diffsim_ros train.launch.py config:=config/hover.yaml out:=runs/hover
    ros2 launch diffsim_ros train.launch.py config:=config/reach_arm.yaml \
        robot_description_topic:=/robot_description out:=runs/reach
    ros2 launch diffsim_ros train.launch.py out:=runs/reach resume:=true     # continue a stopped run

train_node publishes its loss (std_msgs/Float64 on /diffsim/train/loss) and diagnostics per
iteration, writes the checkpoint into ``out`` and exits; the launch then shuts down.
"""
from launch import LaunchDescription
from launch.actions import DeclareLaunchArgument, EmitEvent, RegisterEventHandler
from launch.event_handlers import OnProcessExit
from launch.events import Shutdown
from launch.substitutions import LaunchConfiguration
from launch_ros.actions import Node

PACKAGE = "diffsim_ros"

ARGUMENTS = [
    ("config", "config/hover.yaml", "training file (config/<task>.yaml), relative to the package share folder "
                                    "or absolute"),
    ("out", "runs/train", "output folder of the checkpoint (one holding an earlier run is refused unless "
                          "force or resume)"),
    ("force", "false", "replace the policy or the unfinished run an earlier run left in out"),
    ("resume", "false", "continue the unfinished run in out where it stopped, with its own configuration"),
    ("urdf", "", "URDF file to train on instead of the config's"),
    ("robot_description_topic", "", "take the URDF from this latched topic (e.g. /robot_description)"),
    ("iterations", "0", "training iterations (0: the config's)"),
    ("num_envs", "0", "parallel episodes per iteration (0: the config's)"),
    ("seed", "-1", "random seed (-1: the config's)"),
]


def generate_launch_description():
    trainer = Node(
        package=PACKAGE, executable="train_node", name="train_node", output="screen",
        parameters=[{
            "config": LaunchConfiguration("config"),
            "out": LaunchConfiguration("out"),
            "force": LaunchConfiguration("force"),
            "resume": LaunchConfiguration("resume"),
            "urdf": LaunchConfiguration("urdf"),
            "robot_description_topic": LaunchConfiguration("robot_description_topic"),
            "iterations": LaunchConfiguration("iterations"),
            "num_envs": LaunchConfiguration("num_envs"),
            "seed": LaunchConfiguration("seed"),
        }])
    return LaunchDescription(
        [DeclareLaunchArgument(name, default_value=default, description=desc) for name, default, desc in ARGUMENTS]
        + [trainer,
           # Training ends on its own: shut the launch down with it.
           RegisterEventHandler(OnProcessExit(target_action=trainer, on_exit=[EmitEvent(event=Shutdown())]))])
