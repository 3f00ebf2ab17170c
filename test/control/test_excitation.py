"""The identification motions of control/excitation.py.

Bounds that hold for any seed, amplitude, duration and state (hypothesis), the multisine's
design checked by an FFT, the URDF limits read independently (urdf_parser_py), a closed-loop
flight in the simulator, the supervisor over an excitation, and the refusals of `diffsim-ros
excite` (bad amplitude, a joint without limits).
"""
from __future__ import annotations

import math
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import PROJECT_URDFS, REPO_ROOT

from diffsim_ros import cli
from diffsim_ros import config as cfgmod
from diffsim_ros.control import JointStateIn, Supervisor, SupervisorConfig
from diffsim_ros.control.excitation import (ArmExcitation, ExcitationConfig, ExcitationError, ExcitationRunner,
                                            QuadrotorExcitation)

HYP = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


# ------------------------------------------------------------------------------------ arms
@st.composite
def arm_cases(draw):
    n = draw(st.integers(1, 6))
    lo = np.array([draw(st.floats(-3.0, 0.0)) for _ in range(n)])
    hi = lo + np.array([draw(st.floats(0.1, 6.0)) for _ in range(n)])
    vl = np.array([draw(st.floats(0.2, 8.0)) for _ in range(n)])
    dt = draw(st.sampled_from([0.004, 0.01, 0.02, 0.05]))
    f_min = draw(st.floats(0.05, 1.0))
    cfg = ExcitationConfig(amplitude=draw(st.floats(1e-3, 1.0)), duration=draw(st.floats(0.05, 10.0)),
                           seed=draw(st.integers(0, 2 ** 31)), signal=draw(st.sampled_from(["multisine", "chirp"])),
                           margin=draw(st.floats(0.0, 0.45)), f_min=f_min,
                           f_max=f_min * draw(st.floats(n + 0.5, 40.0)), ramp=draw(st.floats(0.0, 1.0)),
                           velocity_fraction=draw(st.floats(0.1, 1.0)))
    start = lo + (hi - lo) * np.array([draw(st.floats(0.0, 1.0)) for _ in range(n)])
    return lo, hi, vl, dt, cfg, start


@HYP
@given(arm_cases())
def test_arm_targets_never_leave_the_limits_nor_the_speed_bound(case):
    lo, hi, vl, dt, cfg, start = case
    ex = ArmExcitation(lo, hi, vl, dt, cfg)
    rng = hi - lo
    safe_lo, safe_hi = lo + cfg.margin * rng, hi - cfg.margin * rng
    max_step = cfg.velocity_fraction * vl * dt * (1 + 1e-9) + 1e-12
    # The signal itself: inside the margin, within the speed bound.
    assert (ex.targets >= safe_lo - 1e-12).all() and (ex.targets <= safe_hi + 1e-12).all()
    assert (np.abs(np.diff(ex.targets, axis=0)) <= max_step).all()
    # Its peak excursion is at most the amplitude of the safe half range.
    assert (np.abs(ex.targets - (lo + hi) / 2).max(axis=0) <= cfg.amplitude * (safe_hi - safe_lo) / 2 + 1e-9).all()
    # What is sent, from any start inside the limits: the lead-in, then the signal, then the centre.
    ex.start(start)
    n = ex.total_steps() + 5
    out = np.array([ex.command(k) for k in range(n)])
    prev = np.vstack([start[None], out[:-1]])
    assert (out >= lo).all() and (out <= hi).all()
    assert (np.abs(out - prev) <= max_step).all()
    lead = ex.lead_steps(start)
    assert (out[lead:] >= safe_lo - 1e-9).all() and (out[lead:] <= safe_hi + 1e-9).all()
    if cfg.ramp > 0:
        np.testing.assert_allclose(out[-1], (lo + hi) / 2, atol=1e-9)      # faded out to the centre


def test_multisine_puts_each_joint_on_its_own_harmonics():
    """The multisine puts each joint on its own harmonics.

    An FFT over whole periods (no fade): every joint's power lies on harmonics of f_min between
    f_min and f_max, no two joints share one, and each joint gets its share of the band.
    """
    n, dt, f_min, f_max = 4, 0.01, 0.25, 5.0
    lo, hi, vl = -np.ones(n), np.ones(n), np.full(n, 50.0)
    periods = 3
    for seed in (0, 1, 12345):
        cfg = ExcitationConfig(amplitude=1.0, duration=periods / f_min, seed=seed, f_min=f_min, f_max=f_max, ramp=0.0,
                               margin=0.0, velocity_fraction=1.0)
        ex = ArmExcitation(lo, hi, vl, dt, cfg)
        x = ex.targets[:-1] - ex.centre                      # exactly `periods` periods of samples
        spec = np.abs(np.fft.rfft(x, axis=0)) ** 2
        freqs = np.fft.rfftfreq(len(x), dt)
        owners = []
        for j in range(n):
            strong = freqs[spec[:, j] > 1e-9 * spec[:, j].max()]
            k = np.round(strong / f_min).astype(int)
            assert np.allclose(strong, k * f_min, atol=1e-9), (seed, j, strong)
            assert strong.min() >= f_min - 1e-9 and strong.max() <= f_max + 1e-9
            assert len(k) >= int(f_max / f_min) // n
            owners.append(set(k.tolist()))
        for a in range(n):
            for b in range(a + 1, n):
                assert not owners[a] & owners[b], (seed, a, b)
        assert set().union(*owners) == set(range(1, int(round(f_max / f_min)) + 1))
        # Joint signals are uncorrelated over whole periods (orthogonal harmonics).
        c = np.corrcoef(x.T)
        assert np.abs(c[np.triu_indices(n, 1)]).max() < 1e-9


def test_the_same_seed_gives_the_same_motion_and_another_seed_another():
    lo, hi, vl = -np.ones(3), np.ones(3), np.full(3, 3.0)
    a = ArmExcitation(lo, hi, vl, 0.02, ExcitationConfig(seed=7)).targets
    b = ArmExcitation(lo, hi, vl, 0.02, ExcitationConfig(seed=7)).targets
    c = ArmExcitation(lo, hi, vl, 0.02, ExcitationConfig(seed=8)).targets
    np.testing.assert_array_equal(a, b)
    assert np.abs(a - c).max() > 0.05


def _urdf_limits(path):
    from urdf_parser_py.urdf import URDF

    robot = URDF.from_xml_string(Path(path).read_text())
    return {j.name: j.limit for j in robot.joints if j.type in ("revolute", "prismatic")}


@pytest.mark.parametrize("config", ["config/reach_arm.yaml", "config/reach_panda.yaml"])
def test_arm_excitation_respects_the_urdf_limits_read_by_urdf_parser_py(config, robots_dir):
    """The arm excitation respects the URDF limits read by urdf_parser_py.

    The project's arm and example-robot-data's Panda: every target inside the URDF's own
    limits (read with urdf_parser_py, not our loader) with the margin, and no faster than the
    URDF velocity limit x velocity_fraction, for a full run from the neutral pose.
    """
    params = cfgmod.load_yaml(REPO_ROOT / config)
    urdf = cfgmod.resolve_urdf(params, str(REPO_ROOT / config))
    cfg = ExcitationConfig(amplitude=1.0, duration=6.0, seed=3)
    runner = ExcitationRunner(params, cfg, source=config)
    limits = _urdf_limits(urdf)
    names = runner.actuated_joints
    lo = np.array([limits[n].lower for n in names])
    hi = np.array([limits[n].upper for n in names])
    vl = np.array([limits[n].velocity for n in names])
    ex = runner.signal
    ex.start(np.clip(np.zeros(len(names)), lo, hi))
    out = np.array([ex.command(k) for k in range(ex.total_steps())])
    lead = ex.lead_steps(np.clip(np.zeros(len(names)), lo, hi))
    m = cfg.margin * (hi - lo)
    assert (out[lead:] >= lo + m - 1e-9).all() and (out[lead:] <= hi - m + 1e-9).all()
    speed = np.abs(np.diff(out, axis=0)) / runner.dt
    assert (speed <= cfg.velocity_fraction * vl + 1e-9).all()
    # It uses the budget: every joint reaches its amplitude or half its speed bound.
    swing = np.abs(out[lead:] - (lo + hi) / 2).max(0)
    uses = (swing >= 0.99 * cfg.amplitude * (hi - lo - 2 * m) / 2) | (speed.max(0) >= 0.5 * cfg.velocity_fraction * vl)
    assert uses.all(), dict(zip(names, zip(swing, speed.max(0))))


# ------------------------------------------------------------------------------------ multirotors
def _random_quat(draw):
    q = np.array([draw(st.floats(-1, 1)) for _ in range(4)])
    n = np.linalg.norm(q)
    return q / n if n > 1e-3 else np.array([0.0, 0.0, 0.0, 1.0])


@HYP
@given(st.data())
def test_quadrotor_commands_stay_within_their_bounds_in_any_state(data):
    draw = data.draw
    cfg = ExcitationConfig(amplitude=draw(st.floats(1e-3, 1.0)), duration=draw(st.floats(0.05, 20.0)),
                           seed=draw(st.integers(0, 2 ** 31)), tilt_max=draw(st.floats(0.05, 1.0)),
                           thrust_fraction=draw(st.floats(0.05, 0.3)), thrust_limit=draw(st.floats(0.3, 0.7)),
                           rate_max=draw(st.floats(0.2, 5.0)))
    mass = draw(st.floats(0.2, 5.0))
    ex = QuadrotorExcitation(mass, 0.02, cfg, max_rate=draw(st.floats(0.5, 6.0)))
    hover = mass * 9.81
    a = cfg.amplitude
    for s, e, kind, val in ex.schedule:
        assert 0 <= s < e <= cfg.duration + 1e-12
        if kind == "attitude":
            assert np.linalg.norm(val[:2]) <= a * cfg.tilt_max + 1e-12
        elif kind == "thrust":
            assert abs(val[0]) <= a * cfg.thrust_fraction * hover + 1e-9
        else:
            assert np.abs(val).max() <= a * ex.rate_bound + 1e-12
    lim = 0.4 * 9.81 / cfg.integral_gain
    for _ in range(5):
        ex.integral = np.array([draw(st.floats(-lim, lim)) for _ in range(3)])
        k = draw(st.integers(0, ex.steps + 50))
        q = np.concatenate([np.array(cfg.home) + np.array([draw(st.floats(-3, 3)) for _ in range(3)]),
                            _random_quat(draw)])
        v = np.array([draw(st.floats(-5, 5)) for _ in range(6)])
        tilt = ex.tilt_setpoint(k, q, v)
        c = ex.command(k, q, v)
        assert c.shape == (4,) and np.isfinite(c).all()
        assert hover * (1 - cfg.thrust_limit) - 1e-9 <= c[0] <= hover * (1 + cfg.thrust_limit) + 1e-9
        assert np.abs(c[1:]).max() <= min(cfg.rate_max, ex.rate_bound) + 1e-12
        assert tilt <= cfg.tilt_max + 1e-9


def test_quadrotor_excitation_flies_and_stays_in_the_arena():
    """The quadrotor excitation flies and stays in the arena.

    Closed loop on the differentiable simulator, the vehicle 30 % heavier than the controller
    believes, at full amplitude: the body never tilts far past tilt_max, never leaves the arena by
    more than half a metre, and moves fast enough (above 0.8 m/s) to show its drag.
    """
    from diffsim_ros.testing.recordings import SimulatorPlant, standard_params

    params = standard_params("quadrotor")
    cfg = ExcitationConfig(amplitude=1.0, duration=10.0, seed=11)
    runner = ExcitationRunner(params, cfg)
    plant = SimulatorPlant(params, {"mass_scale": 1.3})
    tilts, dists, speeds = [], [], []
    for k in range(runner.signal.steps):
        t, q, v = plant.state()
        st_ = runner.sim.initial_state(torch.as_tensor(q)[None], torch.as_tensor(v)[None])
        plant.step(runner.decide(st_, None, predict=False).command)
        zb = 1 - 2 * (q[3] ** 2 + q[4] ** 2)
        tilts.append(math.acos(max(-1.0, min(1.0, zb))))
        dists.append(float(np.linalg.norm(q[0:3] - np.array(cfg.home))))
        speeds.append(float(np.linalg.norm(v[0:3])))
    print(f"max tilt {max(tilts):.3f} rad, max distance {max(dists):.3f} m, max speed {max(speeds):.3f} m/s")
    assert max(tilts) <= cfg.tilt_max + 0.15
    assert max(dists) <= cfg.arena_radius + 0.5
    assert max(speeds) > 0.8
    assert runner.finished


# ------------------------------------------------------------------------------------ the supervisor
def test_the_supervisor_rules_apply_to_the_excitation():
    """The supervisor rules apply to the excitation.

    The excitation goes through the supervisor unchanged while all is well; a rejected state,
    the e-stop and a stale state give the safe command (hold), as for a policy.
    """
    params = cfgmod.load_yaml(REPO_ROOT / "config/reach_arm.yaml")
    runner = ExcitationRunner(params, ExcitationConfig(duration=2.0, seed=5))
    reference = ArmExcitation(runner.signal.lower, runner.signal.upper, runner.signal.velocity_limit, runner.dt,
                              ExcitationConfig(duration=2.0, seed=5))
    reference.start(np.zeros(4))
    sup = Supervisor(runner, SupervisorConfig(max_stamp_skew_s=0.0))
    names = runner.joint_names
    now = 1_000_000_000
    sent = []
    for k in range(20):
        q = reference.command(k - 1) if k else np.zeros(4)     # the robot follows its targets exactly
        sup.on_joint_state(JointStateIn(names, list(q), [0.0] * 4, [], now + k * 20_000_000), now + k * 20_000_000)
        tick = sup.tick(now + k * 20_000_000)
        assert tick.policy, tick.reason
        sent.append(tick.command)
    ref = ArmExcitation(runner.signal.lower, runner.signal.upper, runner.signal.velocity_limit, runner.dt,
                        ExcitationConfig(duration=2.0, seed=5))
    ref.start(np.zeros(4))
    np.testing.assert_allclose(np.array(sent), np.array([ref.command(k) for k in range(20)]), atol=1e-12)
    t = now + 20 * 20_000_000
    v = sup.on_joint_state(JointStateIn(names, [float("nan")] * 4, [0.0] * 4, [], t), t)
    assert not v.accepted
    tick = sup.tick(t)
    assert not tick.policy and np.allclose(tick.command, sup.hold_q)
    sup.reset(t)
    sup.on_estop(True, t)
    tick = sup.tick(t + 1)
    assert not tick.policy and "emergency" in tick.reason
    sup.on_estop(False, t)
    tick = sup.tick(t + int(1e9))                     # a second without states: the watchdog
    assert not tick.policy and "watchdog" in tick.reason


# ------------------------------------------------------------------------------------ bad input
@pytest.mark.parametrize("amplitude", ["0", "-0.2", "1.5", "nan"])
def test_excite_refuses_an_amplitude_outside_0_1(amplitude, tmp_path, capsys):
    rc = cli.main(["excite", "--config", str(REPO_ROOT / "config/reach_arm.yaml"), "--amplitude", amplitude,
                   "--out", str(tmp_path / "run")])
    err = capsys.readouterr().err
    assert rc == 2, err
    assert "excitation.amplitude" in err and "(0, 1]" in err, err
    assert not (tmp_path / "run").exists()                  # refused before anything started


def _arm_copy(tmp_path, edit):
    text = PROJECT_URDFS["arm"].read_text()
    urdf = tmp_path / "arm.urdf"
    urdf.write_text(edit(text))
    cfg = tmp_path / "arm.yaml"
    body = (REPO_ROOT / "config/reach_arm.yaml").read_text().replace("urdf: urdf/diffsim_arm.urdf", f"urdf: {urdf}")
    cfg.write_text(body)
    return cfg


@pytest.mark.parametrize("what, edit, words", [
    ("continuous joint", lambda t: t.replace('<joint name="arm_joint2" type="revolute">',
                                             '<joint name="arm_joint2" type="continuous">'), ["arm_joint2", "limit"]),
    ("no velocity limit", lambda t: t.replace('<limit lower="-2.5" upper="2.5" effort="8" velocity="4"/>',
                                              '<limit lower="-2.5" upper="2.5" effort="8" velocity="0"/>'),
     ["arm_joint3", "velocity"]),
])
def test_excite_refuses_a_robot_without_limits(tmp_path, capsys, what, edit, words):
    cfg = _arm_copy(tmp_path, edit)
    rc = cli.main(["excite", "--config", str(cfg), "--out", str(tmp_path / "run")])
    err = capsys.readouterr().err
    assert rc == 2, err
    for w in words:
        assert w in err, (what, err)


def test_excite_names_a_bad_key_of_the_config_excitation_section(tmp_path, capsys):
    base = (REPO_ROOT / "config/hover.yaml").read_text()
    for section, key in (("      thrust_limit: 0.95\n", "excitation.thrust_limit"),
                         ("      bogus: 1.0\n", "excitation.bogus"),
                         ("      tilt_max: -0.1\n", "excitation.tilt_max")):
        cfg = tmp_path / "hover.yaml"
        cfg.write_text(base.replace("    task:\n", "    excitation:\n" + section + "    task:\n", 1))
        rc = cli.main(["excite", "--config", str(cfg), "--out", str(tmp_path / "run")])
        err = capsys.readouterr().err
        assert rc == 2 and key in err, (key, err)


def test_excitation_config_errors_name_the_key():
    for kw, key in (({"amplitude": 0.0}, "excitation.amplitude"), ({"f_min": 2.0, "f_max": 1.0}, "excitation.f_max"),
                    ({"signal": "square"}, "excitation.signal"), ({"steps": ["flip"]}, "excitation.steps"),
                    ({"margin": 0.6}, "excitation.margin"), ({"home": [0, 0]}, "excitation.home")):
        with pytest.raises(ExcitationError, match=key.replace(".", r"\.")):
            ExcitationConfig.from_mapping(kw)
    with pytest.raises(ExcitationError, match="f_max"):          # too few harmonics for the joints
        ArmExcitation(-np.ones(4), np.ones(4), np.ones(4), 0.02, ExcitationConfig(f_min=1.0, f_max=2.5))


def test_policy_controller_in_excite_mode_needs_a_config():
    from diffsim_ros.workflows.loop import console_script

    r = subprocess.run([console_script("policy_controller"), "--ros-args", "-p", "mode:=excite"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r.stderr
    assert "config" in r.stderr and "excite" in r.stderr, r.stderr
