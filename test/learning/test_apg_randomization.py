"""What the gradient trainer randomises per episode and per step.

The settings are training.randomize_latency and training.sensor_noise: the draws' ranges and
statistics against their definitions, the true state left alone, and a short run that steps
episodes of different latencies in one batch.
"""
from __future__ import annotations

import math

import pytest
import torch

from builders import hover_task
from conftest import REPO_ROOT, drawn_seed
from diffsim_ros import config
from diffsim_ros.learning import TrainConfig, train
from diffsim_ros.learning.apg import _draw_latency, _training_sim, measured
from diffsim_ros.physics.spatial import quat_mul


def test_sensor_noise_has_its_standard_deviations_and_leaves_the_truth():
    """Sensor noise has its standard deviations and leaves the truth.

    Measured minus true positions, velocities and the base orientation's rotation angle have the
    configured spreads over many drawn environments (seed printed); the true state is unchanged.
    """
    seed = drawn_seed("sensor noise", "DIFFSIM_NOISE_SEED")
    gen = torch.Generator().manual_seed(seed)
    task = hover_task()
    ts = task.reset(4000, torch.Generator().manual_seed(seed))
    q0, v0 = ts.sim.q.clone(), ts.sim.v.clone()
    pos, vel = 0.01, 0.05
    seen = measured(task, ts, (pos, vel), gen)
    assert torch.equal(ts.sim.q, q0) and torch.equal(ts.sim.v, v0)
    dp = (seen.sim.q[:, 0:3] - q0[:, 0:3]).double()
    dv = (seen.sim.v - v0).double()
    assert float(dp.std()) == pytest.approx(pos, rel=0.05)
    assert float(dv.std()) == pytest.approx(vel, rel=0.05)
    # The rotation between true and measured orientation: angle of a 3-D Gaussian vector of std pos,
    # whose mean square is 3 pos^2.
    conj = q0[:, 3:7] * torch.tensor([-1.0, -1.0, -1.0, 1.0])
    rel = quat_mul(conj, seen.sim.q[:, 3:7]).double()
    angle = 2 * torch.atan2(rel[:, 0:3].norm(dim=-1), rel[:, 3].abs())
    assert float((angle ** 2).mean()) == pytest.approx(3 * pos ** 2, rel=0.1)
    assert torch.allclose(seen.sim.q[:, 3:7].norm(dim=-1), torch.ones(4000), atol=1e-5)


def test_a_fixed_base_gets_noise_on_every_joint():
    params = config.load_yaml(REPO_ROOT / "config" / "reach_arm.yaml")
    task, _ = config.build_task(params, "reach_arm.yaml")
    ts = task.reset(3000, torch.Generator().manual_seed(1))
    seen = measured(task, ts, (0.002, 0.0), torch.Generator().manual_seed(2))
    d = (seen.sim.q - ts.sim.q).double()
    assert torch.allclose(d.std(0), torch.full((task.model.nq,), 0.002, dtype=torch.float64), rtol=0.08)
    assert torch.equal(seen.sim.v, ts.sim.v)


def test_latency_draws_are_whole_substeps_over_the_range():
    """Latency draws are whole substeps over the range.

    randomize_latency [low, high] s: whole substeps from round(low/h) to round(high/h), every value
    drawn, and the training simulator's max_latency covers the high end (the nominal one untouched).
    """
    task = hover_task()
    h = task.sim_config.dt / task.sim_config.substeps
    cfg = TrainConfig(randomize_latency=[0.004, 0.021])
    sim = _training_sim(task.sim, cfg)
    assert task.sim.config.max_latency == 0 and sim.config.max_latency == round(0.021 / h)
    drawn = _draw_latency(sim, cfg, 2000, torch.Generator().manual_seed(0))
    assert set(drawn.tolist()) == set(float(k) for k in range(round(0.004 / h), round(0.021 / h) + 1))
    assert _training_sim(task.sim, TrainConfig()) is task.sim


def test_training_file_refuses_a_bad_range_or_noise():
    with pytest.raises(config.ConfigError, match="randomize_latency"):
        TrainConfig(randomize_latency=[0.02, 0.01])
    with pytest.raises(config.ConfigError, match="sensor_noise"):
        TrainConfig(sensor_noise=[0.1, 0.2, 0.3])
    with pytest.raises(config.ConfigError, match="sensor_noise"):
        TrainConfig(sensor_noise=[-0.1, 0.2])
    assert TrainConfig(sensor_noise=0.01).sensor_noise == (0.01, 0.01)


def test_a_run_with_latency_and_noise_trains_and_keeps_the_nominal_simulator(tmp_path):
    """A run with latency and noise trains and keeps the nominal simulator.

    Two iterations with per-episode latency and sensor noise: finite losses, the task given back
    with its nominal simulator (the checkpoint's physics are the training file's).
    """
    task = hover_task(horizon=20)
    nominal = task.sim
    cfg = TrainConfig(iterations=2, num_envs=8, window=10, eval_every=1, eval_envs=8, stop_at_success=False,
                      randomize_latency=[0.0, 0.015], sensor_noise=[0.002, 0.02], randomize_mass=[0.9, 1.1])
    res = train(task, cfg, out_dir=tmp_path, progress=False)
    assert task.sim is nominal and task.sim.config.max_latency == 0
    assert all(math.isfinite(r["loss"]) for r in res.history) and len(res.history) == 2


def test_randomised_hover_transfers_where_the_nominally_trained_one_does_not():
    """The randomised hover transfers where the nominally trained one does not.

    The gate of the transfer rule on the quadrotor: on a stand-in perturbed within the hardware
    preset (each field drawn between no perturbation and the preset's value, latency at least one
    5 ms substep; seed printed), the shipped hover (trained with training.randomize_* and
    sensor_noise) keeps at least 0.8 of its simulator success, while the policy trained on the
    nominal model alone (test/data/hover_nominal, the hover shipped before) does not: a latency of
    a few ms turns its high-gain loop into a limit cycle 10-17 cm from the setpoint, the same in
    the simulator with that latency (tested with it below).
    """
    import random

    from diffsim_ros.workflows.evaluation import evaluate_on_standin
    from diffsim_ros.plant.perturbation import PRESETS

    seed = drawn_seed("hardware-like stand-in", "DIFFSIM_TRANSFER_SEED")
    rng = random.Random(seed)
    hw = PRESETS["hardware"]["multirotor"]
    between = lambda top, bottom: bottom + (top - bottom) * rng.random()  # noqa: E731
    pert = {"mass_scale": between(hw["mass_scale"], 1.0), "latency": between(hw["latency"], 0.005),
            "sensor_noise": [between(x, 0.0) for x in hw["sensor_noise"]],
            "actuator_lag": between(hw["actuator_lag"], 0.02), "seed": seed % 1000}
    print(f"perturbation {pert}")
    shipped = evaluate_on_standin(REPO_ROOT / "policies" / "hover", episodes=16, seed=seed % 1000, perturbation=pert)
    nominal = evaluate_on_standin(REPO_ROOT / "test" / "data" / "hover_nominal", episodes=16, seed=seed % 1000,
                                  perturbation=pert)
    print(f"shipped: stand-in {shipped['success_rate']:.2f} / simulator {shipped['simulator']['success_rate']:.2f}; "
          f"nominal: {nominal['success_rate']:.2f} / {nominal['simulator']['success_rate']:.2f}")
    assert shipped["ratio"] is not None and shipped["ratio"] >= 0.8
    assert nominal["simulator"]["success_rate"] >= 0.8        # it does fly in its own simulator
    assert nominal["ratio"] < 0.8


@pytest.mark.parametrize("name", ["jump_solo12", "jump"])
def test_the_randomised_jumps_transfer_under_drawn_imperfections(name):
    """The randomised jumps transfer under drawn imperfections.

    policies/jump_solo12 and policies/jump, trained on the robot observation with the physics
    drawn per episode (config/<name>.yaml), on the stand-in with a perturbation drawn within the
    legged hardware preset's envelope and past it where the issue names it (mass 0.9-1.1, latency
    0-15 ms, sensor noise up to the preset's, a joint torque lag up to its 5 ms, the floor 0.7-1.3 x
    as grippy; seed printed): at least 0.8 of its simulator success on the same 32 episodes
    (solo12's worst corner of the envelope measured 64 of 64; the quadruped's four corners tried 30
    to 32 of 32, draws 1-6 and 3628099353 32 of 32 each; its jump before the drift term and the
    longer training kept 27 of 32 on the plain stand-in). solo12's
    predecessor, trained without a torque lag, latency to 14 ms and a third of the tilt weight,
    jumped 0.2 m and tipped past max_tilt under seed 3628099353 (24 of 32); its privileged
    predecessor kept 18 of 32 under the preset alone. Not covered: a heavier robot
    on a slipperier floor than the preset together (mass 1.2 on a 0.6 floor tips solo12 in 16 of
    32; the quadruped keeps 32 of 32).
    """
    import random

    from conftest import example_robot_data_dir
    from diffsim_ros.workflows.evaluation import evaluate_on_standin
    from diffsim_ros.plant.perturbation import PRESETS

    if name == "jump_solo12" and example_robot_data_dir() is None:
        pytest.skip("example-robot-data (pip package 'example-robot-data') is not installed")
    seed = drawn_seed(f"{name}, drawn imperfections", "DIFFSIM_TRANSFER_SEED")
    rng = random.Random(seed)
    hw = PRESETS["hardware"]["legged"]
    pert = {"mass_scale": rng.uniform(2.0 - hw["mass_scale"], hw["mass_scale"]), "latency": rng.uniform(0.0, 0.015),
            "sensor_noise": [rng.uniform(0.0, x) for x in hw["sensor_noise"]],
            "ground_friction_scale": rng.uniform(hw["ground_friction_scale"], 1.3),
            "actuator_lag": rng.uniform(0.0, hw["actuator_lag"]), "seed": seed % 1000}
    print(f"perturbation {pert}")
    res = evaluate_on_standin(REPO_ROOT / "policies" / name, episodes=32, seed=seed % 1000, perturbation=pert)
    print(f"stand-in {res['success_rate']:.2f} / simulator {res['simulator']['success_rate']:.2f}")
    assert res["simulator"]["success_rate"] >= 0.8
    assert res["ratio"] is not None and res["ratio"] >= 0.8


def test_the_nominal_hover_fails_under_latency_in_the_simulator_too():
    """The nominal hover fails under latency in the simulator too.

    Where the 17 cm came from: the policy, not the stand-in. With 10 ms of latency (two 5 ms
    substeps, simulator.max_latency) the simulator puts the nominally trained hover as far from its
    setpoint as the stand-in does, while without latency it settles within a centimetre.
    """
    import dataclasses

    from diffsim_ros.workflows.evaluation import load_checkpoint_task
    from diffsim_ros.physics import Simulator
    from diffsim_ros.physics.registry import rebuild

    task, policy, _, _ = load_checkpoint_task(REPO_ROOT / "test" / "data" / "hover_nominal")
    task.sim = Simulator(rebuild(task.sim.system, dataclasses.replace(task.sim.config, max_latency=2)))
    final = {}
    for substeps in (0, 2):
        ts = task.reset(16, torch.Generator().manual_seed(3))
        ts.sim = ts.sim.replace(latency=torch.full((16,), float(substeps), dtype=ts.sim.q.dtype))
        with torch.no_grad():
            for _ in range(task.horizon + 50):
                ts = task.step(ts, policy(task.observe(ts)))
        final[substeps] = (ts.sim.q[:, 0:3] - ts.target).norm(dim=-1)
    assert float(final[0].max()) < 0.02
    assert float(final[2].min()) > 0.1


def test_pushes_change_the_base_velocity_horizontally_by_a_drawn_speed():
    """training.push_speed: pushes change the base velocity horizontally by a drawn speed.

    A pushed episode's base velocity, in the world frame, changes by a
    horizontal vector whose length lies in the range and whose direction covers the circle; at
    dt / push_interval_s of the steps on average; a rank's rows get what the whole batch gives
    them.
    """
    from diffsim_ros.learning.apg import pushed
    from diffsim_ros.physics.spatial import quat_rotate

    seed = drawn_seed("pushes", "DIFFSIM_PUSH_SEED")
    params, task, model = config.load_training_file(REPO_ROOT / "config" / "locomotion_velocity.yaml",
                                                    dtype=torch.float64)
    n = 4000
    ts = task.reset(n, torch.Generator().manual_seed(seed))
    q = ts.sim.q.clone()
    q[:, 3:7] = torch.nn.functional.normalize(torch.randn(n, 4, generator=torch.Generator().manual_seed(seed),
                                                          dtype=torch.float64), dim=-1)
    ts = type(ts)(ts.sim.replace(q=q), ts.target, ts.step, ts.extra)
    cfg = TrainConfig(push_speed=[0.2, 0.5], push_interval_s=0.04)     # dt 0.01: a quarter of the steps push
    after = pushed(task, ts, cfg, torch.Generator().manual_seed(seed), n)
    dv = quat_rotate(q[:, 3:7], after.sim.v[:, 0:3] - ts.sim.v[:, 0:3])  # world frame
    speed = dv.norm(dim=-1)
    hit = speed > 0
    assert float(hit.double().mean()) == pytest.approx(0.25, abs=0.03)
    assert torch.all(dv[:, 2].abs() < 1e-12)
    assert float(speed[hit].min()) >= 0.2 - 1e-12 and float(speed[hit].max()) <= 0.5 + 1e-12
    angle = torch.atan2(dv[hit, 1], dv[hit, 0])
    assert torch.histc(angle, bins=4, min=-math.pi, max=math.pi).min() > 0.2 * int(hit.sum())
    assert torch.equal(after.sim.v[:, 3:], ts.sim.v[:, 3:]) and torch.equal(after.sim.q, ts.sim.q)
    rows = slice(1000, 2000)
    part = type(ts)(ts.sim.replace(q=q[rows], v=ts.sim.v[rows]), ts.target[rows], ts.step, {})
    mine = pushed(task, part, cfg, torch.Generator().manual_seed(seed), n, rows)
    torch.testing.assert_close(mine.sim.v, after.sim.v[rows])
