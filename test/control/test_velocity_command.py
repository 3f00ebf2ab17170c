"""/cmd_vel requests mapped into a velocity policy's trained range, without DDS.

The mapping is control/velocity_command.py. Properties over drawn requests and ranges
(hypothesis), the timeout, and the supervisor driving a walker checkpoint with them (each
command compared with an independent PolicyRunner given the mapped command, or with the task's
stance when the walker stands).
"""
from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from builders import make_checkpoint

from diffsim_ros.control import ImuIn, JointStateIn, Supervisor, SupervisorConfig
from diffsim_ros.control.velocity_command import VelocityCommand
from diffsim_ros.learning.deploy import PolicyRunner

S = 1_000_000_000
speeds = st.floats(-5.0, 5.0, allow_nan=False)
axes = st.tuples(speeds, speeds, speeds)


@settings(max_examples=300, deadline=None)
@given(low=st.floats(0.0, 0.6), span=st.floats(0.05, 1.5), linear=axes, angular=axes)
def test_a_walker_request_is_the_trained_range_or_standing(low, span, linear, angular):
    """A walker request is in the trained range, or standing.

    Every accepted request gives a forward speed inside [low, high], or standing exactly where
    the walker cannot walk that slowly (below low / 2, when low > 0); what moved is named.
    """
    high = low + span
    vc = VelocityCommand("legged", [low], [high], timeout_s=0.5)
    up = vc.on_twist(linear, angular, 0)
    assert up.accepted
    x = linear[0]
    assert up.ignored == [n for n, v in zip(("linear.y", "linear.z", "angular.x", "angular.y", "angular.z"),
                                             (*linear[1:], *angular)) if v != 0.0]
    if low > 0 and x < low / 2:
        assert up.stand and up.target is None and up.clamped == []
        assert vc.goal(1).stand
    else:
        assert not up.stand and low <= up.target[0] <= high
        assert up.target[0] == min(max(x, low), high)
        assert up.clamped == ([] if low <= x <= high else ["linear.x"])
        np.testing.assert_array_equal(vc.goal(1).target, up.target)


@settings(max_examples=200, deadline=None)
@given(top=st.floats(0.1, 3.0), linear=axes, angular=axes)
def test_a_quadrotor_request_is_clamped_per_axis(top, linear, angular):
    vc = VelocityCommand("quadrotor", [-top] * 3, [top] * 3, timeout_s=0.5)
    up = vc.on_twist(linear, angular, 0)
    assert up.accepted and not up.stand
    np.testing.assert_array_equal(up.target, np.clip(linear, -top, top))
    assert up.clamped == [f"linear.{a}" for a, v in zip("xyz", linear) if abs(v) > top]
    assert up.ignored == [f"angular.{a}" for a, v in zip("xyz", angular) if v != 0.0]


def test_timeout_returns_to_the_zero_command_and_the_target_wins_back():
    walker = VelocityCommand("legged", [0.2], [0.8], timeout_s=0.5)
    assert walker.goal(0) is None                          # nothing received: the target is in force
    walker.on_twist((0.5, 0, 0), (0, 0, 0), 0)
    assert walker.goal(S // 2).target.tolist() == [0.5] and not walker.goal(S // 2).timed_out
    g = walker.goal(S // 2 + 1)
    assert g.stand and g.timed_out and g.target is None
    walker.goal(2 * S)
    assert walker.counts["cmd_vel_timeouts"] == 1          # one silence, one timeout
    walker.on_twist((0.3, 0, 0), (0, 0, 0), 3 * S)
    assert walker.goal(3 * S).target.tolist() == [0.3]
    walker.release()
    assert walker.goal(3 * S) is None
    # A range holding zero: the zero command is the policy's own.
    quad = VelocityCommand("quadrotor", [-1.5] * 3, [1.5] * 3, timeout_s=0.2)
    quad.on_twist((1.0, -1.0, 0.5), (0, 0, 0), 0)
    g = quad.goal(S)
    assert not g.stand and g.timed_out and g.target.tolist() == [0.0, 0.0, 0.0]


@pytest.mark.parametrize("bad", [(math.nan, 0, 0), (0, math.inf, 0), (0, 0)])
def test_a_malformed_request_is_rejected_and_changes_nothing(bad):
    vc = VelocityCommand("legged", [0.2], [0.8])
    vc.on_twist((0.4, 0, 0), (0, 0, 0), 0)
    up = vc.on_twist(bad, (0, 0, 0), 1)
    assert not up.accepted and "request" in up.reason
    assert vc.goal(2).target.tolist() == [0.4] and vc.counts["cmd_vel_rejected"] == 1


def test_settings_are_checked():
    with pytest.raises(ValueError, match="timeout"):
        VelocityCommand("legged", [0.2], [0.8], timeout_s=0.0)
    with pytest.raises(ValueError, match="low <= high"):
        VelocityCommand("legged", [0.8], [0.2])
    with pytest.raises(ValueError, match="arm"):
        VelocityCommand("arm", [0.0], [1.0])


def test_the_supervisor_walks_stands_and_walks_again_on_cmd_vel(tmp_path):
    """The supervisor walks, stands and walks again on /cmd_vel.

    A walker checkpoint (forward speeds 0.2-0.8 m/s) under /cmd_vel requests: 0.5 m/s is the
    policy's command for 0.5; 2.0 is its command for 0.8 (clamped); a stop is the stance; walking
    again starts a fresh episode (the gait clock and the previous action reset), as an independent
    runner reset at that moment says; silence past the timeout is the stance again.
    """
    make_checkpoint("locomotion_velocity_solo12", tmp_path, gain=2.0)
    runner, ref = PolicyRunner(tmp_path), PolicyRunner(tmp_path)
    vc = VelocityCommand.for_runner(runner, timeout_s=0.5)
    assert vc is not None and [vc.low[0], vc.high[0]] == list(runner.task.command_speed)
    sup = Supervisor(runner, SupervisorConfig(pair_tolerance_s=0.0), velocity=vc)
    names = list(runner.joint_names)
    qj = np.zeros(len(names))
    qj[runner.sim.act_index.numpy()] = runner.task.stance.double().numpy()
    stance = runner.task.stance.double().numpy()
    t = 1_764_000_000 * S

    def state(k):
        assert sup.on_joint_state(JointStateIn(names, list(qj), [0.0] * len(names), (), t + k), k, t + k).pending
        assert sup.on_imu(ImuIn([0.0, 0.0, 0.1], [0, 0, 0, 1], [0, 0, 9.81], t + k), k, t + k).accepted

    def want(speed):
        return ref.legged(names, qj, np.zeros(len(names)), [0, 0, 0], [0, 0, 0, 1], [0, 0, 0], [0.0, 0.0, 0.1],
                          target=[speed], predict=False).command

    state(1)
    vc.on_twist((0.5, 0, 0), (0, 0, 0), 1)
    np.testing.assert_allclose(sup.tick(2).command, want(0.5), atol=1e-12, rtol=0)
    state(3)
    vc.on_twist((2.0, 0, 0), (0, 0, 0.3), 3)
    np.testing.assert_allclose(sup.tick(4).command, want(0.8), atol=1e-12, rtol=0)
    state(5)
    vc.on_twist((0.0, 0, 0), (0, 0, 0), 5)
    tick = sup.tick(6)
    assert tick.policy and sup.counts["stand_commands"] == 1
    np.testing.assert_allclose(tick.command, np.clip(stance, runner.command_low, runner.command_high), rtol=0,
                               atol=1e-12)
    state(7)
    vc.on_twist((0.6, 0, 0), (0, 0, 0), 7)
    ref.reset()
    np.testing.assert_allclose(sup.tick(8).command, want(0.6), atol=1e-12, rtol=0)
    state(S // 2 + 8)                       # a fresh state, the request now older than the timeout
    assert sup.tick(S // 2 + 9).command.tolist() == np.clip(stance, runner.command_low,
                                                             runner.command_high).tolist()


def test_a_policy_without_a_velocity_command_takes_no_cmd_vel(tmp_path):
    make_checkpoint("hover", tmp_path)
    assert VelocityCommand.for_runner(PolicyRunner(tmp_path)) is None


def _walk_stop_walk(runner, perturbation, speeds, stand: bool, seed: int):
    """Drive the walker on the MuJoCo stand-in through the supervisor and /cmd_vel requests.

    speeds[0] for 2 s, a stop for 2 s, speeds[1] for 2 s, then silence for 3 s (standing after the
    timeout). ``stand`` False maps a stop as a plain clamp would (to the slowest trained speed), the
    behaviour standing replaces. Per phase (its last second): mean forward speed, its largest
    magnitude, the largest tilt.
    """
    import torch

    from diffsim_ros.workflows.evaluation import _standin_params
    from diffsim_ros.plant.mujoco_plant import MujocoPlant

    plant = MujocoPlant(_standin_params(runner.meta, "walker"), perturbation=perturbation)
    with torch.no_grad():
        ts = runner.task.reset(1, torch.Generator().manual_seed(seed))
    plant.reset(ts.sim.q[0].double().numpy(), ts.sim.v[0].double().numpy())
    runner.reset()
    vc = VelocityCommand.for_runner(runner, timeout_s=0.5)
    if not stand:
        vc.can_stand_by_policy = True           # zero is then clamped up to the slowest trained speed
    sup = Supervisor(runner, SupervisorConfig(pair_tolerance_s=0.0, max_stamp_skew_s=0.0), velocity=vc)
    plan = (speeds[0], 0.0, speeds[1], None)
    rows = []
    for k in range(int(round(9.0 / runner.dt))):
        t = k * runner.dt
        ns = int(round(t * 1e9)) + 1
        request = plan[min(int(t // 2.0), 3)]
        if request is not None:
            vc.on_twist((request, 0.0, 0.0), (0.0, 0.0, 0.0), ns)
        m = plant.measured()
        j = m.joints
        sup.on_joint_state(JointStateIn(list(j.names), list(j.position), list(j.velocity), (), ns), ns)
        sup.on_imu(ImuIn(list(m.angular_velocity), list(m.orientation), list(m.specific_force), ns), ns)
        tick = sup.tick(ns)
        assert tick.policy, tick.reason
        plant.step(tick.command)
        b = plant.true_base_state()
        rows.append((t, b.linear_velocity_world[0], 2.0 * np.arcsin(min(1.0, np.hypot(*b.orientation[:2])))))
    a = np.array(rows)
    out = []
    for end in (2.0, 4.0, 6.0, 9.0):
        w = (a[:, 0] >= end - 1.0) & (a[:, 0] < end)
        out.append((float(a[w, 1].mean()), float(np.abs(a[w, 1]).max()), float(a[w, 2].max())))
    return out


def test_the_shipped_walker_stops_and_walks_again_on_cmd_vel_on_the_standin():
    """The shipped walker stops and walks again on /cmd_vel on the stand-in.

    The shipped solo12 walker (trained at 0.2-0.8 m/s, never at zero) on the MuJoCo stand-in,
    plain or with a perturbation drawn within the hardware preset: a stop on /cmd_vel stands it (its
    speed below 0.05 m/s within a second, upright), a new request walks it again within 25 % of the
    request, and silence past the timeout stands it again. The same stop mapped as a clamp (to the
    slowest trained speed) keeps it walking: the check fails where standing is not done.
    """
    from conftest import REPO_ROOT, drawn_seed

    pytest.importorskip("mujoco")
    seed = drawn_seed("walker on cmd_vel", "DIFFSIM_CMD_VEL_SEED")
    rng = np.random.default_rng(seed)
    runner = PolicyRunner(REPO_ROOT / "policies" / "locomotion_velocity_solo12")
    speeds = [float(x) for x in rng.uniform(0.35, 0.75, 2)]
    perturbation = None
    if rng.random() < 0.5:
        perturbation = {"mass_scale": float(rng.uniform(0.9, 1.1)), "latency": float(rng.uniform(0.0, 0.01)),
                        "sensor_noise": [0.001, 0.01], "ground_friction_scale": float(rng.uniform(0.7, 1.3))}
    print("speeds", speeds, "perturbation", perturbation)
    phases = _walk_stop_walk(runner, perturbation, speeds, True, seed)
    print("per phase (mean speed, |speed| max, tilt max):", phases)
    for (mean, _, tilt), want in zip(phases[0::2], speeds):
        assert abs(mean - want) < 0.25 * want and tilt < 0.3
    for mean, fastest, tilt in phases[1::2]:
        assert fastest < 0.05 and tilt < 0.1, phases
    clamped = _walk_stop_walk(runner, perturbation, speeds, False, seed)
    print("a stop clamped to the slowest speed instead:", clamped)
    assert clamped[1][1] > 0.1
