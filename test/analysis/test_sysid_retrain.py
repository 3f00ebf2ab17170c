"""Closing the loop: a policy retrained on the calibrated parameters flies better.

A hover policy retrained on the calibrated parameters flies the perturbed MuJoCo quadrotor
better than one trained on the nominal parameters.

Slow (two short trainings, about a minute and a half on one core), and part of the suite: it is the
proof that calibration pays off. Steps: record the perturbed stand-in (mass +20 %, drag x2), calibrate
mass_scale and drag_scale on the bag, write calibrated.yaml; train the same small policy
(same seed, same settings) on config/hover.yaml and on calibrated.yaml; fly both on the
perturbed stand-in through PolicyRunner (the deployment path of policy_controller) from the
same starts; compare the mean distance to the hover point over the second half of the episodes.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

pytest.importorskip("rosbags")
pytest.importorskip("mujoco")

ITERATIONS = 8


def _train(path, out):
    from diffsim_ros import config
    from diffsim_ros.learning.apg import TrainConfig, train
    from diffsim_ros.learning.checkpoint import save_checkpoint

    params, task, model = config.load_training_file(path)
    # Calibration against the nominal model alone: the training file's randomisation (which draws
    # the physics around either model) is left out of both runs.
    tr = {k: v for k, v in params["training"].items() if not k.startswith("randomize_") and k != "sensor_noise"}
    tr.update(iterations=ITERATIONS, num_envs=32, stop_at_success=False, eval_every=ITERATIONS, eval_envs=32, seed=0)
    res = train(task, TrainConfig.from_mapping(tr, "training"), progress=False)
    save_checkpoint(res.policy, task, out, extra={"config": {"task": params.get("task")}})
    return task


def _fly(ckpt, starts, perturbation):
    from diffsim_ros import config
    from diffsim_ros.learning.deploy import PolicyRunner
    from diffsim_ros.plant.mujoco_plant import MujocoPlant

    runner = PolicyRunner(ckpt)
    params = config.load_yaml(config.package_share() / "config" / "hover.yaml")
    errors = []
    for q0, v0 in starts:
        plant = MujocoPlant(params, perturbation=perturbation)
        s = plant.reset(q0, v0)
        runner.reset()
        dist = []
        for k in range(runner.task.horizon):
            d = runner.quadrotor(s.position, s.orientation, s.linear_velocity_body, s.angular_velocity, predict=False)
            s = plant.step(d.command)
            dist.append(float(np.linalg.norm(s.position - np.array([0.0, 0.0, 1.0]))))
        errors.append(np.mean(dist[len(dist) // 2:]))
    return float(np.mean(errors))


@pytest.mark.slow
def test_policy_retrained_on_calibrated_parameters_flies_the_perturbed_plant_better(tmp_path):
    from diffsim_ros import config
    from diffsim_ros.analysis import calibrate, read_bag, sim_setup, write_calibrated
    from diffsim_ros.testing.recordings import PERTURBATIONS, record_standard

    pert = PERTURBATIONS["quadrotor"]
    record_standard("quadrotor", tmp_path / "bag", pert, steps=300, seed=3, predictions=False)
    data = read_bag(tmp_path / "bag")
    setup = sim_setup(data)
    r = calibrate(data, setup, ["mass_scale", "drag_scale"], window=3, max_starts=64)
    files = write_calibrated(r, setup, tmp_path / "cal")

    nominal_yaml = config.package_share() / "config" / "hover.yaml"
    task = _train(nominal_yaml, tmp_path / "nominal")
    _train(files["yaml"], tmp_path / "calibrated")

    gen = torch.Generator().manual_seed(123)
    ts = task.reset(8, gen)
    starts = [(ts.sim.q[i].numpy(), ts.sim.v[i].numpy()) for i in range(8)]
    err_nominal = _fly(tmp_path / "nominal", starts, pert)
    err_calibrated = _fly(tmp_path / "calibrated", starts, pert)
    print(f"mean distance to the hover point, second half of the episodes: nominal-trained {err_nominal:.4f} m, "
          f"calibrated-trained {err_calibrated:.4f} m")
    assert err_calibrated < err_nominal
