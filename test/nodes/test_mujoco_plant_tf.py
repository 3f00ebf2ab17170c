"""The MuJoCo stand-in's /tf and /robot_description (RViz, Foxglove).

The link transforms come from MuJoCo's kinematics (diffsim_ros.nodes.mujoco_plant.link_transforms);
chained from the world they must give the simulator's own forward kinematics
(diffsim_ros.physics.forward_kinematics) at the same q, for the arm, the quadrotor (floating base:
world -> base) and the quadruped. Over DDS: the node's latched /robot_description is the URDF file
(read with `ros2 topic echo --full-length`), and /tf, where tf2_msgs is installed, matches forward
kinematics at the q of the /joint_states or /odom published with it.
"""
from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from conftest import REPO_ROOT

mujoco = pytest.importorskip("mujoco", reason="mujoco (the stand-in's engine) is not installed")

from diffsim_ros import config, physics  # noqa: E402
from diffsim_ros.nodes.mujoco_plant import link_transforms  # noqa: E402
from diffsim_ros.plant import MujocoPlant  # noqa: E402

CONFIGS = {"arm": "reach_arm.yaml", "quadrotor": "hover.yaml", "quadruped": "locomotion.yaml"}


def _params(name):
    p = config.load_yaml(REPO_ROOT / "config" / CONFIGS[name])
    return {k: copy.deepcopy(p[k]) for k in ("urdf", "floating_base", "simulator") if k in p}


def quat_matrix(xyzw):
    x, y, z, w = xyzw
    return np.array([[1 - 2 * (y * y + z * z), 2 * (x * y - z * w), 2 * (x * z + y * w)],
                     [2 * (x * y + z * w), 1 - 2 * (x * x + z * z), 2 * (y * z - x * w)],
                     [2 * (x * z - y * w), 2 * (y * z + x * w), 1 - 2 * (x * x + y * y)]])


def world_poses(transforms, world="world"):
    """Chain (parent, child, xyz, quat) from the world: {frame: 4x4}."""
    poses = {world: np.eye(4)}
    pending = list(transforms)
    while pending:
        done = [tr for tr in pending if tr[0] in poses]
        assert done, f"transforms not connected to {world}: {[(p, c) for p, c, _, _ in pending]}"
        for parent, child, xyz, quat in done:
            T = np.eye(4)
            T[:3, :3], T[:3, 3] = quat_matrix(quat), xyz
            assert child not in poses, f"{child} has two parents"
            poses[child] = poses[parent] @ T
            pending.remove((parent, child, xyz, quat))
    return poses


def random_q(model, rng):
    q = model.neutral_configuration().numpy().astype(float)
    lo, hi = model.lower.numpy(), model.upper.numpy()
    lo, hi = np.where(np.isfinite(lo), lo, -np.pi), np.where(np.isfinite(hi), hi, np.pi)
    start = 7 if model.floating_base else 0
    q[start:] = rng.uniform(lo, hi)
    if model.floating_base:
        q[:3] = rng.uniform(-2, 2, 3)
        quat = rng.normal(size=4)
        q[3:7] = quat / np.linalg.norm(quat)
    return q


@pytest.mark.parametrize("robot", sorted(CONFIGS))
def test_link_transforms_match_forward_kinematics(robot):
    params = _params(robot)
    plant = MujocoPlant(params)
    model = config.load_model(params, dtype=torch.float64)
    rng = np.random.default_rng(14)
    scratch = mujoco.MjData(plant.model)
    for _ in range(5):
        q = random_q(model, rng)
        plant.set_state(q)
        tfs = link_transforms(plant.model, plant.data.qpos, scratch, set(model.link_names))
        assert {c for _, c, _, _ in tfs} == set(model.link_names) - {"world"}   # the arm's root link is the world
        if model.floating_base:
            base = [tr for tr in tfs if tr[0] == "world"]
            assert [tr[1] for tr in base] == [model.body_names[0]]
        poses = world_poses(tfs)
        fk = physics.forward_kinematics(model, torch.tensor(plant.q, dtype=torch.float64)).numpy()
        for i, name in enumerate(model.link_names):
            np.testing.assert_allclose(poses[name], fk[i], atol=1e-9, err_msg=f"{robot}: link {name} at q={q}")
        # Another name for the fixed frame: the same poses below it.
        other = world_poses(link_transforms(plant.model, plant.data.qpos, scratch, set(model.link_names), "map"),
                            world="map")
        for i, name in enumerate(model.link_names):
            np.testing.assert_allclose(other[name], fk[i], atol=1e-9, err_msg=f"{robot}: link {name} under 'map'")


@pytest.mark.ros
def test_tf_over_dds_matches_forward_kinematics(tmp_path):
    """mujoco_plant's /tf for the arm over DDS matches the forward kinematics.

    Chained from the world, the link poses of each TFMessage are the forward kinematics at the
    positions of the /joint_states with its stamp.
    """
    from diffsim_ros.nodes import common

    if not common.have_tf2_msgs():
        reason = ("tf2_msgs is not installed (not on the package index; scripts/bootstrap.sh builds it where "
                  "cmake and c++ exist, a ROS 2 install has it): mujoco_plant publishes no /tf")
        if __import__("os").environ.get("CI", "").lower() == "true":
            pytest.fail(f"CI: {reason}")
        pytest.skip(reason)
    import subprocess
    import time

    import rclpy
    from rclpy.executors import SingleThreadedExecutor
    from sensor_msgs.msg import JointState
    from tf2_msgs.msg import TFMessage

    from conftest import console_script, ros_domain

    domain = ros_domain()
    params = _params("arm")
    model = config.load_model(params, dtype=torch.float64)
    env = dict(__import__("os").environ, ROS_DOMAIN_ID=str(domain))
    log = open(tmp_path / "plant.log", "w")
    proc = subprocess.Popen([console_script("mujoco_plant"), "--ros-args", "-p",
                             f"config:={REPO_ROOT / 'config' / 'reach_arm.yaml'}"],
                            env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    ctx = rclpy.context.Context()
    rclpy.init(context=ctx, domain_id=domain)
    try:
        node = rclpy.create_node("tf_probe", context=ctx)
        ex = SingleThreadedExecutor(context=ctx)
        ex.add_node(node)
        tfs, states = [], {}
        qos = common.recorder_qos()
        node.create_subscription(TFMessage, "/tf", tfs.append, qos)
        node.create_subscription(JointState, "/joint_states",
                                 lambda m: states.__setitem__(common.stamp_to_ns(m.header.stamp), m), qos)
        end = time.monotonic() + 120
        while len(tfs) < 20 and time.monotonic() < end:
            ex.spin_once(timeout_sec=0.05)
        assert len(tfs) >= 20, (tmp_path / "plant.log").read_text()[-3000:]
        checked = 0
        for msg in tfs:
            st = states.get(common.stamp_to_ns(msg.transforms[0].header.stamp))
            if st is None:
                continue
            q = common.joint_state_arrays(st, model.joint_names)[0]
            chain = [(t.header.frame_id, t.child_frame_id,
                      (t.transform.translation.x, t.transform.translation.y, t.transform.translation.z),
                      (t.transform.rotation.x, t.transform.rotation.y, t.transform.rotation.z, t.transform.rotation.w))
                     for t in msg.transforms]
            poses = world_poses(chain)
            fk = physics.forward_kinematics(model, torch.tensor(q, dtype=torch.float64)).numpy()
            for i, name in enumerate(model.link_names):
                np.testing.assert_allclose(poses[name], fk[i], atol=1e-9, err_msg=name)
            checked += 1
        assert checked >= 10, checked
        node.destroy_node()
    finally:
        rclpy.shutdown(context=ctx)
        proc.terminate()
        proc.wait(timeout=30)
        log.close()
