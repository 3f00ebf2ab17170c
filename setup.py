import os
from glob import glob

from setuptools import find_packages, setup

package_name = "diffsim_ros"

setup(
    name=package_name,
    version="0.1.0",
    packages=find_packages(exclude=["test", "test.*", "bench"]),
    data_files=[
        ("share/ament_index/resource_index/packages", ["resource/" + package_name]),
        ("share/" + package_name, ["package.xml"]),
        (os.path.join("share", package_name, "launch"), glob("launch/*.py")),
        (os.path.join("share", package_name, "config"), glob("config/*.yaml")),
        (os.path.join("share", package_name, "urdf"), glob("urdf/*.urdf") + glob("urdf/*.xacro")),
        (os.path.join("share", package_name, "doc"), glob("doc/*.md")),
    ] + [
        # Pretrained checkpoints, one folder each (policy.pt + policy.json + training log).
        (os.path.join("share", package_name, d), [f for f in glob(os.path.join(d, "*")) if os.path.isfile(f)])
        for d in sorted(glob("policies/*")) if os.path.isdir(d)
    ],
    install_requires=["setuptools"],
    zip_safe=True,
    maintainer="diffsim_ros developers",
    maintainer_email="diffsim-ros@example.org",
    description="Differentiable rigid-body simulation in PyTorch for training and deploying robot policies with ROS 2.",
    license="Apache-2.0",
    tests_require=["pytest"],
    entry_points={
        "console_scripts": [
            "diffsim-ros = diffsim_ros.cli:main",
            # ROS 2 nodes (ros2 run diffsim_ros <name>)
            "train_node = diffsim_ros.nodes.train_node:main",
            "policy_controller = diffsim_ros.nodes.policy_controller:main",
            "mujoco_plant = diffsim_ros.nodes.mujoco_plant:main",
            "trajectory_recorder = diffsim_ros.nodes.trajectory_recorder:main",
            "replay = diffsim_ros.nodes.replay:main",
        ],
    },
)
