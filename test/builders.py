"""What several test files build, defined once.

URDF text of the simple bodies they drop on the ground, checkpoints of untrained policies for
the shipped training files, and the small hover task the trainer's tests train.
"""
from __future__ import annotations

import dataclasses

import torch

from conftest import REPO_ROOT
from diffsim_ros import config, physics
from diffsim_ros.learning import MLPPolicy
from diffsim_ros.learning.checkpoint import save_checkpoint
from diffsim_ros.tasks import QuadrotorTask


#: The task keys of the gait clock, the feet's slip loss and the legged odometry, which
#: config/locomotion_velocity.yaml's walker trains with; tests of other parts of the task build it
#: without them.
GAIT_KEYS = ("gait_period", "gait_offsets", "gait_duty", "swing_height", "gait_weight", "slip_weight", "slip_height",
             "velocity_estimate")


def without_gait(spec: dict) -> dict:
    """Return a task section without the gait clock, the slip loss and the odometry (:data:`GAIT_KEYS`)."""
    return {k: v for k, v in spec.items() if k not in GAIT_KEYS}


def box_urdf(mass: float, size) -> str:
    """Return the URDF of a free box of ``mass`` kg and edge lengths ``size`` (x, y, z) m.

    It has its inertia about the centre and its collision box.
    """
    sx, sy, sz = size
    return f"""<robot name="box"><link name="box">
  <inertial><mass value="{mass}"/><inertia ixx="{mass * (sy**2 + sz**2) / 12}" iyy="{mass * (sx**2 + sz**2) / 12}"
     izz="{mass * (sx**2 + sy**2) / 12}" ixy="0" ixz="0" iyz="0"/></inertial>
  <collision><geometry><box size="{sx} {sy} {sz}"/></geometry></collision>
</link></robot>"""


def ball_urdf(mass: float, radius: float) -> str:
    """Return the URDF of a free solid ball of ``mass`` kg and ``radius`` m."""
    i = 0.4 * mass * radius ** 2
    return f"""<robot name="ball"><link name="ball">
  <inertial><mass value="{mass}"/><inertia ixx="{i}" iyy="{i}" izz="{i}" ixy="0" ixz="0" iyz="0"/></inertial>
  <collision><geometry><sphere radius="{radius}"/></geometry></collision>
</link></robot>"""


def make_checkpoint(cfg_name: str, out, seed: int = 0, gain: float = 8.0, task_options=None):
    """Write a checkpoint of an untrained policy for config/<cfg_name>.yaml.

    Its output weights are scaled up, so that actions spread over [-1, 1] (and some commands hit
    the limits); ``task_options`` override keys of the file's task section.
    """
    params, task, model = config.load_training_file(REPO_ROOT / "config" / f"{cfg_name}.yaml")
    if task_options:
        params["task"] = {**params["task"], **task_options}
        if params["task"].get("observation") == "privileged":      # the estimate is the robot observation's
            params["task"].pop("velocity_estimate", None)
        task, model = config.build_task(params, cfg_name)
    torch.manual_seed(seed)
    pol = MLPPolicy(task.obs_dim, task.action_dim, (32, 32)).to(model.dtype)
    with torch.no_grad():
        pol.head.weight.mul_(gain)
        pol.head.bias.uniform_(-0.5, 0.5)
        ts = task.reset(64, torch.Generator().manual_seed(seed))
        pol.norm.update(task.observe(ts))
    save_checkpoint(pol, task, out, extra={"config": params})
    return pol, task


def hover_task(horizon=50, settle_time=0.6, start_radius=0.2, mode="hover", **kw):
    """Build a small quadrotor task (``mode`` hover, waypoint or velocity) on the project quadrotor.

    float32, 0.02 s control steps of 4 substeps, no ground.
    """
    m = physics.load_urdf(str(REPO_ROOT / "urdf" / "diffsim_quadrotor.urdf"), floating_base=True,
                          dtype=torch.float32)
    sc = config.simulator_config(config.load_yaml(REPO_ROOT / "config" / "diffsim_quadrotor.yaml"))
    sc = dataclasses.replace(sc, dt=0.02, substeps=4, ground=False)
    return QuadrotorTask(m, sc, mode=mode, horizon=horizon, settle_time=settle_time, start_radius=start_radius,
                         start_speed=0.1, **kw)
