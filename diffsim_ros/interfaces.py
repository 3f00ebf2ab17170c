"""The ROS 2 interfaces of diffsim_ros in one place.

They are the default topic names and the message types on them (doc/interfaces.md describes
each). The nodes, the loop, the excitation command and the bag analysis read them from here; a
node's ``*_topic`` parameter can still rename a topic. Plain strings only: importing this module
imports no ROS library.

Message types are written as rosbag2 and ``ros2 topic`` spell them (``pkg/msg/Name``).
"""
from __future__ import annotations

# ---- robot state (published by the robot, the MuJoCo stand-in or Gazebo)
JOINT_STATES = "/joint_states"
ODOM = "/odom"
IMU = "/imu"
TF = "/tf"
CLOCK = "/clock"
ROBOT_DESCRIPTION = "/robot_description"

# ---- diffsim_ros's own topics
COMMAND = "/diffsim/command"                 # the command in the simulator's interface (policy_controller)
PREDICTED_STATE = "/diffsim/predicted_state"  # the simulator's one-step prediction (policy_controller)
METADATA = "/diffsim/metadata"               # latched checkpoint metadata JSON (policy_controller)
TARGET = "/diffsim/target"                   # a new goal at run time (into policy_controller)
TRAIN_LOSS = "/diffsim/train/loss"           # the trainer's mean loss per iteration (train_node)

# ---- commands to robots
CMD_CTBR = "/cmd_ctbr"
CMD_ROTOR_THRUST = "/cmd_rotor_thrust"
CMD_VEL_LEGACY = "/cmd_vel_legacy"
CMD_VEL = "/cmd_vel"                         # velocity requests into policy_controller (teleop, Nav2)
ACTUATORS = "/command/motor_speed"
PX4_RATES_SETPOINT = "/fmu/in/vehicle_rates_setpoint"
PX4_OFFBOARD_MODE = "/fmu/in/offboard_control_mode"
JOINT_TRAJECTORY = "/joint_trajectory_controller/joint_trajectory"
CONTROLLER_COMMANDS = ("/position_controller/commands", "/velocity_controller/commands",
                       "/effort_controller/commands")
DIAGNOSTICS = "/diagnostics"

# ---- message types
JOINT_STATE_T = "sensor_msgs/msg/JointState"
ODOMETRY_T = "nav_msgs/msg/Odometry"
IMU_T = "sensor_msgs/msg/Imu"
FLOAT64_ARRAY_T = "std_msgs/msg/Float64MultiArray"
STRING_T = "std_msgs/msg/String"
TWIST_STAMPED_T = "geometry_msgs/msg/TwistStamped"
TWIST_T = "geometry_msgs/msg/Twist"
POINT_STAMPED_T = "geometry_msgs/msg/PointStamped"
FLOAT64_T = "std_msgs/msg/Float64"
TF_T = "tf2_msgs/msg/TFMessage"


def typed(topic: str, msgtype: str) -> str:
    """``topic:type``, the form of the recorder's and ``ros2 bag record``'s topic lists."""
    return f"{topic}:{msgtype}"
