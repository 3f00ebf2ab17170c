"""The strict velocity-command locomotion metric (issue 17 item 2) must fail on the wrong behaviour.

A forward lunge (every thigh driven forward and held) passes the old forward-progress metric on
the project's quadruped (mean speed above 0.1 m/s over 1 s, base just above the fall height),
as the issue saw on solo12; the strict metric refuses it. The task's own verdict equals
``strict_metric`` computed from the recorded arrays, and the metric's rules are checked one by
one on synthetic trajectories.

The gait rules (issue 39 item 5: every foot steps, no foot slides in contact) are judged on the
simulator's tensors and on recorded q, v alike, part by part the same; drawn trajectories of a
rigidly carried robot whose feet step and stay put pass them, dragged and sliding feet fail them,
and today's shipped walkers, which track the command, fail them.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
import yaml

from builders import without_gait
from conftest import REPO_ROOT

from diffsim_ros import config
from diffsim_ros.tasks import make_task
from diffsim_ros.physics.spatial import roll_pitch
from diffsim_ros.tasks.locomotion import strict_metric


@pytest.fixture(scope="module")
def tasks(tmp_path_factory):
    doc = yaml.safe_load((REPO_ROOT / "config" / "locomotion.yaml").read_text())
    p = doc["/**"]["ros__parameters"]
    p["urdf"] = str(REPO_ROOT / "urdf" / "diffsim_quadruped.urdf")
    p["task"].update(command_speed=[0.2, 0.8], horizon=400, window_s=3.0)
    path = tmp_path_factory.mktemp("cfg") / "velocity.yaml"
    path.write_text(yaml.safe_dump(doc))
    params, strict, model = config.load_training_file(path, dtype=torch.float64)
    legacy = {k: v for k, v in params["task"].items() if k not in ("command_speed", "window_s")}
    legacy["horizon"] = 100
    return strict, make_task(model, strict.sim_config, legacy, "task")


def rollout(task, act, batch=1, seed=0):
    """Roll out ``batch`` episodes under ``act(obs) -> actions``.

    Returns (final task state, recorded arrays): per step (T = horizon + 1, the start included)
    time (T,), base x, height, roll, pitch and other bodies' contact (T, B), and the whole q, v
    (T, B, n).
    """
    ts = task.reset(batch, torch.Generator().manual_seed(seed))
    rec = {k: [] for k in ("x", "z", "roll", "pitch", "other", "q", "v")}

    def record(other):
        r, p = roll_pitch(ts.sim.q[:, 3:7])
        for k, v in (("x", ts.sim.q[:, 0]), ("z", ts.sim.q[:, 2]), ("roll", r), ("pitch", p), ("other", other),
                     ("q", ts.sim.q), ("v", ts.sim.v)):
            rec[k].append(v.clone())

    record(torch.zeros(batch, dtype=torch.bool))
    with torch.no_grad():
        for _ in range(task.horizon):
            ts = task.step(ts, torch.as_tensor(act(task.observe(ts)), dtype=ts.sim.q.dtype).reshape(batch, -1))
            other = task.other_contact()
            record(other if other is not None else torch.zeros(batch, dtype=torch.bool))
    arr = {k: torch.stack(v).double().numpy() for k, v in rec.items()}
    arr["other"] = arr["other"].astype(bool)
    arr["t"] = np.arange(task.horizon + 1) * task.dt
    return ts, arr


def hold(action):
    """``act`` for :func:`rollout`: the same action at every step."""
    return lambda obs: np.broadcast_to(action, (len(obs), len(action)))


def open_loop_trot(task, hz=2.0):
    """Return an open-loop trot's ``act`` for :func:`rollout`.

    Diagonal legs (FL+HR, FR+HL) lifted in turn at ``hz`` by thigh and knee targets about the
    stance (as test_gait's trot), one call per control step.
    """
    legs = [j.split("_")[0] for j in task.sim.actuated_joints[::3]]
    phase = {"FL": 0.0, "HR": 0.0, "FR": 0.5, "HL": 0.5}
    calls = [0]

    def act(obs):
        a = np.zeros((len(obs), task.action_dim))
        for i, leg in enumerate(legs):
            lift = max(0.0, float(np.sin(2 * np.pi * (hz * calls[0] * task.dt - phase[leg]))))
            a[:, 3 * i + 1], a[:, 3 * i + 2] = 0.8 * lift, -1.0 * lift
        calls[0] += 1
        return a
    return act


def assert_parts_agree(task, ts, rv, b=0, rtol=1e-9):
    """Check that the recorded verdict ``rv`` of episode ``b`` has the task's own parts on its tensors.

    The parts are :meth:`LocomotionTask.strict_parts`: speed, posture, each gait rule and its
    numbers.
    """
    parts = task.strict_parts(ts)
    assert rv["success"] == bool(parts["success"][b]), (rv, b)
    assert rv["speed_ok"] == bool(parts["speed_ok"][b])
    assert (rv["height_ok"] and rv["tilt_ok"] and rv["only_feet_touch"]) == bool(parts["posture_ok"][b])
    assert rv["steps_ok"] == bool(parts["steps_ok"][b]) and rv["no_slide_ok"] == bool(parts["no_slide_ok"][b]), rv
    np.testing.assert_allclose(rv["touchdowns_per_s"], parts["touchdowns_per_s"][b].double().numpy(), rtol=rtol)
    slide = [float("nan") if x is None else x for x in rv["foot_slide_m_s"]]
    np.testing.assert_allclose(slide, parts["foot_slide_m_s"][b].double().numpy(), rtol=rtol, atol=rtol)


def verdict(task, ts, rec, b=0):
    """strict_metric of episode ``b`` of a :func:`rollout`, with the task's own limits."""
    return strict_metric(rec["t"], rec["x"][:, b], rec["z"][:, b], rec["roll"][:, b], rec["pitch"][:, b],
                         rec["other"][:, b], float(ts.target[b, 0]), task.base_height, task.window_s,
                         task.speed_tolerance, task.min_height / task.base_height, task.max_tilt)


def test_a_lunge_passes_the_old_metric_and_fails_the_strict_one(tasks):
    strict, legacy = tasks
    lunge = np.tile([0.0, 0.9, 0.0], 4)               # thighs forward (0.45 rad past the stance), held
    ts_old, rec_old = rollout(legacy, hold(lunge))
    assert bool(legacy.success(ts_old)[0]), "the lunge no longer fools the old metric: revisit this test"
    assert rec_old["z"][:, 0].min() < 0.6 * legacy.base_height           # the base dropped
    ts, rec = rollout(strict, hold(lunge))
    assert not bool(strict.success(ts)[0])
    v = verdict(strict, ts, rec)
    assert not v["success"] and not v["height_ok"] and not v["speed_ok"], v


@pytest.mark.parametrize("action", ["stand", "knees", "thighs", "trot"])
def test_the_task_verdict_is_the_metric_on_the_recorded_arrays(tasks, action):
    """The task's verdict is the metric on the recorded arrays.

    Held actions (standing, knees bent, thighs back: no foot steps) and an open-loop trot
    (the fore feet step twice a second) on the project's quadruped: the task's verdict on its
    tensors, strict_metric on the recorded base arrays, and recorded_verdict on q, v alone agree
    part by part, the gait rules and their numbers included.
    """
    strict, _ = tasks
    act = {"stand": hold(np.zeros(12)), "knees": hold(np.tile([0.0, 0.0, 1.0], 4)),
           "thighs": hold(np.tile([0.0, -1.0, 0.0], 4)), "trot": open_loop_trot(strict)}[action]
    ts, rec = rollout(strict, act)
    v = verdict(strict, ts, rec)
    assert v["window_speed_m_s"] == pytest.approx(float(strict.window_speed(ts)[0]), abs=1e-9)
    assert (not (v["height_ok"] and v["tilt_ok"] and v["only_feet_touch"])) == bool(ts.extra["violation"][0])
    # From q, v alone (as the stand-in or a bag gives them), contact judged from each state:
    # the same verdict, part by part.
    rv = strict.recorded_verdict(rec["t"], rec["q"][:, 0], rec["v"][:, 0], ts.target[0].numpy())
    assert {k: rv[k] for k in v if k != "success"} == pytest.approx({k: x for k, x in v.items() if k != "success"})
    assert rv["success"] == (v["success"] and rv["steps_ok"] and rv["no_slide_ok"])
    assert_parts_agree(strict, ts, rv)
    rates = np.array(rv["touchdowns_per_s"])
    print(action, {k: rv[k] for k in ("touchdowns_per_s", "foot_slide_m_s", "steps_ok", "no_slide_ok")})
    if action == "trot":                 # the fore feet step at 2 Hz; the hind ones, under more weight, hardly lift
        assert rv["feet"][:2] == ["FL_shank", "FR_shank"] and (np.abs(rates[:2] - 2.0) <= 1 / 3 + 1e-9).all(), rv
        assert not rv["steps_ok"] and min(rates[2:]) < 1.0, rv
    else:
        assert not rv["steps_ok"] and (rates == 0).all(), rv


def test_metric_rules_one_by_one():
    t = np.arange(401) * 0.01
    cmd, h = 0.5, 0.3
    x = cmd * t + 0.01 * np.sin(2 * np.pi * 2 * t)     # a steady gait: speed with a stride ripple
    z = h + 0.01 * np.sin(2 * np.pi * 4 * t)
    zero, no = np.zeros_like(t), np.zeros_like(t, dtype=bool)
    ok = strict_metric(t, x, z, zero, zero, no, cmd, h)
    assert ok["success"], ok
    assert not strict_metric(t, 0.75 * x, z, zero, zero, no, cmd, h)["speed_ok"]        # 25 % slow
    assert strict_metric(t, 0.85 * x, z, zero, zero, no, cmd, h)["speed_ok"]            # 15 % slow: within 20 %
    dip = z.copy()
    dip[50] = 0.65 * h
    assert not strict_metric(t, x, dip, zero, zero, no, cmd, h)["success"]              # one step too low
    tilt = zero.copy()
    tilt[200] = 0.6
    assert not strict_metric(t, x, z, zero, tilt, no, cmd, h)["tilt_ok"]
    knee = no.copy()
    knee[300] = True
    assert not strict_metric(t, x, z, zero, zero, knee, cmd, h)["only_feet_touch"]
    short = strict_metric(t[:200], x[:200], z[:200], zero[:200], zero[:200], no[:200], cmd, h)
    assert not short["success"] and "shorter" in short["reason"]


def test_the_shipped_walking_policy_walks_by_the_metric_on_recorded_arrays():
    """The shipped walking policy walks by the metric on recorded arrays.

    policies/locomotion_velocity (config/locomotion_velocity.yaml) on 32 fresh 4 s episodes,
    each with its own drawn command, judged by ``strict_metric`` from the recorded base x, height,
    roll, pitch and other-body contact (not the task's flags) and, for 8 of them, by
    ``recorded_verdict`` from q, v alone: the verdicts equal the task's, part by part, the gait
    rules included. It walks by the whole metric (every foot steps, none slides in contact) in at
    least 0.8 of them; 8 of the same episodes standing all fail. The walker it replaced
    (test/data/quadruped_sliding) tracked the command upright, but its feet slid in contact at
    0.3-0.42 m/s against 0.1 allowed.
    """
    from diffsim_ros.workflows import evaluation
    from diffsim_ros.learning.checkpoint import load_checkpoint

    _, task, model = config.load_training_file(REPO_ROOT / "config" / "locomotion_velocity.yaml")
    rates = {}
    for label, folder, n in (("stand", None, 8), ("policy", REPO_ROOT / "policies" / "locomotion_velocity", 32),
                             ("sliding", REPO_ROOT / "test" / "data" / "quadruped_sliding", 32)):
        if folder is None:
            run, act = task, (lambda obs: torch.zeros(len(obs), task.action_dim))
        elif label == "policy":
            run, act = task, load_checkpoint(folder, model=model)[0]
        else:                            # the checkpoint's own task (its privileged observation)
            run, act = evaluation.load_checkpoint_task(str(folder))[:2]
        ts, rec = rollout(run, act, batch=n, seed=21)
        verdicts = [verdict(run, ts, rec, b) for b in range(n)]
        parts = run.strict_parts(ts)
        assert [v["success"] for v in verdicts] == (parts["speed_ok"] & parts["posture_ok"]).tolist(), label
        if label == "policy":
            for b in range(0, n, 4):     # a quarter of the policy's episodes, from q and v alone (float32: the task's)
                rv = run.recorded_verdict(rec["t"], rec["q"][:, b], rec["v"][:, b], ts.target[b].numpy())
                assert_parts_agree(run, ts, rv, b, rtol=1e-4)
        slide = parts["foot_slide_m_s"].numpy()
        rates[label] = {"upright_tracking": float(np.mean([v["success"] for v in verdicts])),
                        "strict": float(parts["success"].double().mean()),
                        "slide_m_s_largest": np.nanmax(slide, 0).round(3).tolist()}
    print(rates)
    assert rates["policy"]["strict"] >= 0.8 and rates["stand"]["upright_tracking"] == 0.0, rates
    # The metric fails the sliding walker on the same episodes, though it tracks the command upright.
    assert rates["sliding"]["upright_tracking"] >= 0.8 and rates["sliding"]["strict"] < 0.2, rates


def carried(task, t, x, z):
    """Return the robot carried rigidly in its exact stance: (T, nq) configurations and (T, nv) velocities.

    The configurations have no joint noise, level, its base at ``x(t)`` and height ``z(t)``; the
    (T, nv) velocities are zero (what a recording would pair with them; only the other bodies'
    contact reads them).
    """
    n = len(t)
    q = task.model.neutral_configuration((n,)).to(torch.float64)
    q[:, 7:] = q[:, 7:].index_copy(1, task.sim.act_index, task.stance.to(q).expand(n, -1))
    q[:, 0], q[:, 2] = torch.as_tensor(x), torch.as_tensor(z)
    return q.numpy(), np.zeros((n, task.model.nv))


def standing_height(task):
    """Find the base height at which the stance's lowest foot point is 0.5 mm into the ground.

    All feet are within ``contact_height`` of it: the stance is symmetric.
    """
    q, _ = carried(task, [0.0], [0.0], [task.base_height])
    h = task.foot_track(torch.as_tensor(q, dtype=task.model.dtype))["height"][0].double().numpy()
    assert h.max() - h.min() < 1e-6, h
    return task.base_height - float(h.max()) - 0.0005


def hops(t, period, flight, clearance, phase, stride, z0, slide=0.0):
    """Return the base x and z of a robot hopping in place of its feet.

    Every ``period`` s a flight of ``flight`` of it rising ``clearance`` m (a half sine), the base
    carried ``stride`` m forward only while it is more than half the clearance up (the feet leave
    and meet the ground vertically), and ``slide`` m/s forward while on the ground (0: the feet
    stay put).
    """
    u = t / period + phase
    s = u % 1.0
    up = s < flight
    z = z0 + np.where(up, clearance * np.sin(np.pi * np.minimum(s / flight, 1.0)), 0.0)
    w = np.clip((s / flight - 1 / 6) / (2 / 3), 0.0, 1.0)            # the middle two thirds of the flight
    progress = np.where(up, 0.5 - 0.5 * np.cos(np.pi * w), 1.0)
    x = stride * (np.floor(u) + progress) + slide * np.concatenate(([0.0], np.cumsum(~up[:-1] * np.diff(t))))
    return x, z


def window_speed(t, x, window_s=3.0):
    i0 = int(np.searchsorted(t, t[-1] - window_s - 1e-9))
    return float((x[-1] - x[i0]) / (t[-1] - t[i0]))


def test_drawn_gaits_of_a_carried_robot_pass_and_fail_the_gait_rules(tasks):
    """Drawn gaits of a carried robot pass and fail the gait rules.

    Drawn trajectories (seed printed) of the project's quadruped carried rigidly in its stance,
    judged by recorded_verdict (forward kinematics of q alone): hops at 1.25-4 Hz whose feet stay
    put on the ground and move only in the air pass the whole strict metric (the command its own
    mean speed: every part judged); the same hops sliding forward on the ground at 0.2-0.6 m/s
    step but fail no_slide_ok, each foot's slide read within 30 % below the drawn speed (the last
    millimetre of a landing, in the contact band, moves vertically); hops slower than 0.67 Hz
    fail steps_ok only; and a robot dragged along without lifting fails steps_ok (no touchdown)
    and no_slide_ok, its slide the drag speed.
    """
    from conftest import drawn_seed

    strict, _ = tasks
    seed = drawn_seed("drawn gaits", "DIFFSIM_GAIT_SEED")
    rng = np.random.default_rng(seed)
    t = np.arange(strict.horizon + 1) * strict.dt
    z0 = standing_height(strict)

    def judge(x, z):
        q, v = carried(strict, t, x, z)
        return strict.recorded_verdict(t, q, v, [window_speed(t, x)])

    for _ in range(3):
        period, flight = float(rng.uniform(0.25, 0.8)), float(rng.uniform(0.3, 0.6))
        clearance, phase, speed = float(rng.uniform(0.005, 0.03)), float(rng.uniform()), float(rng.uniform(0.2, 0.8))
        draw = dict(period=period, flight=flight, clearance=clearance, phase=phase, seed=seed)
        planted = judge(*hops(t, period, flight, clearance, phase, speed * period, z0))
        assert planted["success"] and planted["steps_ok"] and planted["no_slide_ok"], (draw, planted)
        assert max(planted["foot_slide_m_s"]) < 1e-9, (draw, planted)
        assert all(abs(r - 1 / period) <= 1 / 3 + 1e-9 for r in planted["touchdowns_per_s"]), (draw, planted)

        slide = float(rng.uniform(0.2, 0.6))
        sliding = judge(*hops(t, period, flight, clearance, phase, speed * period, z0, slide))
        assert sliding["steps_ok"] and not sliding["no_slide_ok"] and not sliding["success"], (draw, slide, sliding)
        assert sliding["speed_ok"] and sliding["height_ok"] and sliding["only_feet_touch"], (draw, sliding)
        assert all(0.7 * slide <= s <= slide + 1e-9 for s in sliding["foot_slide_m_s"]), (draw, slide, sliding)

        slow = float(rng.uniform(1.6, 3.0))
        rare = judge(*hops(t, slow, 0.3, clearance, phase, speed * slow, z0))
        assert not rare["steps_ok"] and rare["no_slide_ok"] and not rare["success"], (draw, slow, rare)
        assert max(rare["touchdowns_per_s"]) <= 2 / 3 + 1e-9, (draw, slow, rare)

        drag = float(rng.uniform(0.2, 0.8))
        dragged = judge(drag * t, np.full_like(t, z0))
        assert not dragged["steps_ok"] and not dragged["no_slide_ok"] and dragged["speed_ok"], (seed, drag, dragged)
        assert dragged["touchdowns_per_s"] == [0.0] * 4, dragged
        assert dragged["foot_slide_m_s"] == pytest.approx([drag] * 4, rel=1e-9), (seed, drag, dragged)


def test_the_gait_rules_one_foot_at_a_time():
    """The gait rules, one foot at a time.

    strict_metric's gait rules on drawn contact timelines (seed printed), a foot at a time: four
    feet stepping at 1.2-5 Hz with a drawn duty, barely moving in contact (below 0.05 m/s), pass;
    one drawn foot dragged (always in contact, moving at 0.15-0.8 m/s) fails steps_ok and
    no_slide_ok, its rate 0 and its slide the drag speed, the others unchanged; one drawn foot
    stepping but moving at 0.15-0.8 m/s in contact fails no_slide_ok alone; one foot whose contact
    flickers at every sample (a 0.01 s swing) makes no touchdown, and swings of two samples (the
    0.02 s ``min_swing_s``) count. Touchdowns before the window do not count.
    """
    from conftest import drawn_seed
    from diffsim_ros.tasks.locomotion import gait_rules

    seed = drawn_seed("gait rules", "DIFFSIM_GAIT_SEED")
    rng = np.random.default_rng(seed)
    dt, T = 0.01, 401
    t = np.arange(T) * dt
    i0 = 100                                                  # the last 3 s
    for _ in range(20):
        hz, duty = rng.uniform(1.2, 5.0, 4), rng.uniform(0.4, 0.8, 4)
        c = ((t[:, None] * hz + rng.uniform(0, 1, 4)) % 1.0) < duty
        step = rng.uniform(0.0, 0.05, (T, 4)) * dt
        g = gait_rules(t, i0, c, step)
        assert g["steps_ok"] and g["no_slide_ok"], (seed, hz, duty, g)
        downs = (c[i0 + 1:] & ~c[i0:-1]).sum(0)
        assert g["touchdowns_per_s"] == pytest.approx(downs / 3.0, rel=1e-9)
        f, v = int(rng.integers(4)), float(rng.uniform(0.15, 0.8))
        dragged_c, dragged_s = c.copy(), step.copy()
        dragged_c[:, f], dragged_s[:, f] = True, v * dt
        d = gait_rules(t, i0, dragged_c, dragged_s)
        assert not d["steps_ok"] and not d["no_slide_ok"] and d["touchdowns_per_s"][f] == 0.0, (seed, f, d)
        assert d["foot_slide_m_s"][f] == pytest.approx(v, rel=1e-9), (seed, f, v, d)
        others = [i for i in range(4) if i != f]
        assert [d["touchdowns_per_s"][i] for i in others] == [g["touchdowns_per_s"][i] for i in others]
        skating = step.copy()
        skating[:, f] = v * dt
        k = gait_rules(t, i0, c, skating)
        assert k["steps_ok"] and not k["no_slide_ok"] and k["foot_slide_m_s"][f] == pytest.approx(v, rel=1e-9), k
    flicker = np.ones((T, 4), bool)
    flicker[1::2, 0] = False                                  # off every other sample: 50 Hz of 0.01 s swings
    flicker[1::3, 1] = False
    flicker[2::3, 1] = False                                  # off two samples in three: 0.02 s swings at 33 Hz
    g = gait_rules(t, i0, flicker, np.zeros((T, 4)))
    assert g["touchdowns_per_s"][0] == 0.0 and g["touchdowns_per_s"][1] == pytest.approx(100 / 3.0), g
    early = np.ones((T, 4), bool)
    early[20:40] = False                                      # a step, before the window
    assert gait_rules(t, i0, early, np.zeros((T, 4)))["touchdowns_per_s"] == [0.0] * 4


def test_the_dragging_solo12_walker_fails_the_gait_rules_in_the_simulator():
    """The dragging solo12 walker fails the gait rules in the simulator.

    The solo12 walker shipped before the gait rules (test/data/solo12_dragging, trained on
    config/locomotion_velocity_solo12.yaml's physics without a gait clock) on 8 fresh episodes in
    its own simulator (seed 2024):
    it tracks the command upright in every one (speed, height, tilt, only feet touching: all that
    the strict metric asked before), and the gait rules fail every one. Its left hind foot never
    touches down in the window (0 touchdowns a second, 1 needed) and slides at 0.45-0.71 m/s in
    contact (0.1 allowed); the other feet step 4-5 times a second, the right hind sliding at
    0.42-0.60 m/s and the right fore at 0.15-0.34, the left fore within the limit (0.05-0.10).
    The rule can fail: it fails the walker the strict metric passed in 256 of 256 episodes
    (policies/README.md).
    """
    from conftest import example_robot_data_dir
    from diffsim_ros.workflows import evaluation

    if example_robot_data_dir() is None:
        pytest.skip("example-robot-data (pip package 'example-robot-data') is not installed")
    task, policy = evaluation.load_checkpoint_task(REPO_ROOT / "test" / "data" / "solo12_dragging")[:2]
    with torch.no_grad():
        ts = task.reset(8, torch.Generator().manual_seed(2024))
        for _ in range(task.horizon):
            ts = task.step(ts, policy(task.observe(ts)))
    parts = task.strict_parts(ts)
    feet = [task.model.body_names[b] for b in task.feet]
    rate, slide = parts["touchdowns_per_s"].double().numpy(), parts["foot_slide_m_s"].double().numpy()
    print(f"solo12 walker, 8 episodes: feet {feet}; touchdowns a second, mean {rate.mean(0).round(2).tolist()}, "
          f"least {rate.min(0).round(2).tolist()}; slide in contact (m/s), mean {slide.mean(0).round(3).tolist()}, "
          f"least {slide.min(0).round(3).tolist()}, largest {slide.max(0).round(3).tolist()}")
    assert bool(parts["speed_ok"].all()) and bool(parts["posture_ok"].all()), parts
    assert not parts["success"].any() and not parts["steps_ok"].any() and not parts["no_slide_ok"].any()
    hl = feet.index("HL_LOWER_LEG")
    assert (rate[:, hl] == 0).all() and (slide[:, hl] > 0.3).all(), (rate, slide)
    assert bool(task.success(ts).any()) is False


def test_a_standin_bag_of_the_dragging_solo12_walker_fails_the_gait_rules(tmp_path):
    """A stand-in bag of the dragging solo12 walker fails the gait rules.

    The dragging solo12 walker (test/data/solo12_dragging) on the MuJoCo stand-in (no ROS) for
    one 4 s episode at a drawn
    command (seed printed), recorded as a bag: the task's recorded_verdict on the bag's states
    (/odom and /joint_states read back, joints mapped by name) fails the gait rules, while it
    walks upright: every foot slides in contact (0.16-0.23 m/s the left fore, 0.50-0.63 the left
    hind, over 5 draws on the stand-in's Coulomb floor), and the left hind foot, which never
    touches down in the simulator, lifts past the 1 mm contact band 0-4 times in the window on
    MuJoCo's floor (so steps_ok passes or fails by the draw: printed). Its speed against the
    command is printed, not required. The bag report (analysis.legged_report, given the command)
    judges the same gait rules from the bag's configurations alone, to the same numbers.
    """
    from conftest import drawn_seed, example_robot_data_dir
    from diffsim_ros.analysis.bag import legged_in_model_order, read_legged_states
    from diffsim_ros.analysis.legged import legged_report
    from diffsim_ros.learning.deploy import PolicyRunner
    from diffsim_ros.testing.recordings import make_plant, record_bag

    if example_robot_data_dir() is None:
        pytest.skip("example-robot-data (pip package 'example-robot-data') is not installed")
    seed = drawn_seed("solo12 stand-in bag", "DIFFSIM_GAIT_SEED")
    speed = float(np.random.default_rng(seed).uniform(0.3, 0.7))
    name = "locomotion_velocity_solo12"
    runner = PolicyRunner(REPO_ROOT / "test" / "data" / "solo12_dragging")
    task = runner.task
    params = config.load_yaml(REPO_ROOT / "config" / f"{name}.yaml")
    with torch.no_grad():
        q0 = task.reset(1, torch.Generator().manual_seed(seed)).sim.q[0].double().numpy()
    plant = make_plant(params, {}, "mujoco", q0)
    names = list(plant.joint_names)

    def walk(k, q, v):
        return runner.legged(names, q[7:], v[6:], q[:3], q[3:7], v[:3], v[3:6], target=[speed], predict=False).command
    record_bag(tmp_path / "bag", plant, walk, task.horizon, params, extra_metadata={"checkpoint": runner.meta},
               predictions=False)
    stamps, q, v, bag_names, _ = read_legged_states(tmp_path / "bag")
    q, v = legged_in_model_order("bag", q, v, bag_names, task.model)
    t = (np.asarray(stamps) - stamps[0]) * 1e-9
    rv = task.recorded_verdict(t, q, v, [speed])
    print(f"solo12 on the stand-in at {speed:.3f} m/s: " + ", ".join(f"{k} {rv[k]}" for k in rv if k != "command_m_s"))
    # Upright on its feet; on the stand-in's Coulomb floor it may also outrun the command (0.49 m/s
    # for 0.40 in one draw), which the gait rules do not need to catch it.
    assert len(t) == task.horizon + 1 and rv["height_ok"] and rv["only_feet_touch"], rv
    assert not rv["success"] and not rv["no_slide_ok"] and min(rv["foot_slide_m_s"]) > 0.1, rv
    rep = legged_report(tmp_path / "bag", command=speed)["strict_metric"]
    for k in ("touchdowns_per_s", "foot_slide_m_s"):
        np.testing.assert_allclose(rep[k], rv[k], rtol=1e-5, err_msg=k)
    assert (rep["steps_ok"], rep["no_slide_ok"]) == (rv["steps_ok"], rv["no_slide_ok"])


def test_the_gait_rules_are_task_options():
    """The gait rules are task options.

    min_touchdown_rate, max_foot_slide, contact_height and min_swing_s come from the ``task:``
    section like the metric's other limits: read and converted by make_task, exported with the
    task (what a checkpoint stores) and rebuilt from that; a negative value is refused, naming the
    key. The defaults are the documented ones.
    """
    from diffsim_ros.physics import ConfigError

    params, file_task, model = config.load_training_file(REPO_ROOT / "config" / "locomotion_velocity.yaml")
    assert (file_task.min_touchdown_rate, file_task.max_foot_slide, file_task.contact_height,
            file_task.min_swing_s) == (1.0, 0.1, 0.001, 0.02)
    spec = dict(params["task"], min_touchdown_rate=2, max_foot_slide=0.05, contact_height=0.003, min_swing_s=0.05)
    task = make_task(model, file_task.sim_config, spec, "task")
    assert (task.min_touchdown_rate, task.max_foot_slide, task.contact_height, task.min_swing_s) == (2.0, 0.05,
                                                                                                   0.003, 0.05)
    again = make_task(model, file_task.sim_config, task.export_parameters(), "task")
    assert again.export_parameters() == task.export_parameters() and again.max_foot_slide == 0.05
    for key in ("min_touchdown_rate", "max_foot_slide", "contact_height", "min_swing_s"):
        with pytest.raises(ConfigError, match=f"task.*{key}.*>= 0"):
            make_task(model, file_task.sim_config, dict(params["task"], **{key: -0.1}), "task")


def test_the_height_barrier_costs_only_below_the_metric_floor():
    """The height barrier costs only below the metric's floor.

    ``height_weight``: the base's drop below min_height x base_height, as a fraction of the
    standing height, squared and weighted; nothing above the floor (it is a barrier at the
    metric's limit, not a posture target). Drawn drops, printed seed.
    """
    from conftest import drawn_seed

    seed = drawn_seed("height barrier", "DIFFSIM_HEIGHT_SEED", bits=16)
    rng = np.random.default_rng(seed)
    params, file_task, model = config.load_training_file(REPO_ROOT / "config" / "locomotion_velocity.yaml",
                                                         dtype=torch.float64)
    w = float(rng.uniform(1.0, 20.0))
    tasks = {weight: make_task(model, file_task.sim_config, dict(params["task"], height_weight=weight), "task")
             for weight in (0.0, w)}
    task = tasks[w]
    floor = task.min_height
    above = float(rng.uniform(0.0, task.base_height - floor))      # lowered, still above the floor
    below = float(rng.uniform(0.01, 0.1))                            # this far below the floor
    ts = task.reset(3, torch.Generator().manual_seed(seed))
    q = ts.sim.q.clone()
    q[1, 2] = task.base_height - above
    q[2, 2] = floor - below
    ts.sim = ts.sim.replace(q=q)
    a = torch.zeros(3, task.action_dim, dtype=torch.float64)
    extra = task.step_loss(ts, a) - tasks[0.0].step_loss(ts, a)
    assert float(extra[0]) == 0.0 and float(extra[1]) == 0.0, extra
    assert float(extra[2]) == pytest.approx(w * (below / task.base_height) ** 2, rel=1e-12), (seed, extra)


def test_the_averaged_relative_tracking_loss_is_the_moving_average_against_the_command():
    """The averaged relative tracking loss is the moving average against the command.

    ``speed_average_s`` and ``relative_tracking``: over a rollout of drawn actions from drawn
    starts (seed printed), the loss's tracking term is ((s_k - c) / c)^2, s the exponential moving
    average of the base's forward velocity computed here from the recorded world-frame velocity
    (s_0 = 0, s_k = s_{k-1} + dt / tau (v_k - s_{k-1})); with tau 0 and no division it is the old
    instantaneous (v_k - c)^2. A command range reaching 0 is refused with relative tracking.
    """
    from conftest import drawn_seed
    from diffsim_ros.physics.spatial import quat_rotate

    seed = drawn_seed("averaged tracking", "DIFFSIM_TRACKING_SEED", bits=16)
    rng = np.random.default_rng(seed)
    params, file_task, model = config.load_training_file(REPO_ROOT / "config" / "locomotion_velocity.yaml",
                                                         dtype=torch.float64)
    tau = float(rng.uniform(0.05, 1.0))
    base = dict(without_gait(params["task"]), horizon=40, window_s=0.3, upright_weight=0.0, action_weight=0.0,
                speed_average_s=0.0, relative_tracking=False)
    avg = make_task(model, file_task.sim_config, dict(base, speed_average_s=tau, relative_tracking=True), "task")
    now = make_task(model, file_task.sim_config, base, "task")
    ts_a = avg.reset(4, torch.Generator().manual_seed(seed))
    ts_n = now.reset(4, torch.Generator().manual_seed(seed))
    c = ts_a.target[:, 0].numpy()
    s = np.zeros(4)
    actions = torch.as_tensor(rng.uniform(-1, 1, (avg.horizon, 4, avg.action_dim)))
    with torch.no_grad():
        for k in range(avg.horizon):
            ts_a, ts_n = avg.step(ts_a, actions[k]), now.step(ts_n, actions[k])
            v = quat_rotate(ts_a.sim.q[:, 3:7], ts_a.sim.v[:, 0:3])[:, 0].numpy()
            s = s + min(avg.dt / tau, 1.0) * (v - s)
            np.testing.assert_allclose(avg.step_loss(ts_a, actions[k]).numpy(), ((s - c) / c) ** 2, rtol=1e-9,
                                       atol=1e-12, err_msg=f"step {k}, seed {seed}, tau {tau}")
            np.testing.assert_allclose(now.step_loss(ts_n, actions[k]).numpy(), (v - c) ** 2, rtol=1e-9, atol=1e-12)
    with pytest.raises(ValueError, match="relative_tracking"):
        make_task(model, file_task.sim_config, dict(base, command_speed=[0.0, 0.5], relative_tracking=True), "task")


def test_the_shipped_solo12_walker_steps_upright_at_the_command_on_the_standin():
    """The shipped solo12 walker steps upright at the command on the stand-in.

    policies/locomotion_velocity_solo12 (the trot reference and its network, trained on the robot
    observation with the physics drawn per episode) on the MuJoCo stand-in, plain and under the
    hardware preset, 4 episodes each (seed printed): every episode keeps the height and tilt, only
    the feet touching, and every foot steps at least once a second; on the plain stand-in it keeps
    the commanded speed too (under the preset 3 of 32 missed it, seed 99). What it does not yet do
    there is the no-slide rule: its stance feet creep on MuJoCo's soft floor at 0.09-0.12 m/s
    (0.1 allowed; 0.01-0.02 in the simulator), held here below 0.2 on the plain stand-in, where
    the dragging walker it replaced (test/data/solo12_dragging) slid 0.15-0.71.
    """
    from conftest import drawn_seed, example_robot_data_dir
    from diffsim_ros.workflows.evaluation import evaluate_on_standin

    if example_robot_data_dir() is None:
        pytest.skip("example-robot-data (pip package 'example-robot-data') is not installed")
    seed = drawn_seed("solo12 walker on the stand-in", "DIFFSIM_WALK_SEED") % 1000
    for pert in (None, "hardware"):
        res = evaluate_on_standin(REPO_ROOT / "policies" / "locomotion_velocity_solo12", episodes=4, seed=seed,
                                  perturbation=pert, simulator=False)
        for v in res["verdicts"]:
            print(pert, {k: v[k] for k in ("command_m_s", "window_speed_m_s", "touchdowns_per_s", "foot_slide_m_s")})
            assert v["height_ok"] and v["tilt_ok"] and v["only_feet_touch"] and v["steps_ok"], v
            if pert is None:
                assert v["speed_ok"] and max(v["foot_slide_m_s"]) < 0.2, v


def test_the_shipped_quadruped_walker_walks_on_the_standin_where_the_sliding_one_did_not():
    """The shipped quadruped walker walks on the stand-in where the sliding one did not.

    policies/locomotion_velocity on the MuJoCo stand-in, plain and under the hardware preset, 8
    episodes each (seed printed), judged by the strict metric with its gait rules from the recorded
    states: every episode upright, only feet touching, every foot stepping; the whole metric in at
    least 5 of 8 (measured 32 of 32 plain and under the preset at seed 99; the walker before it,
    trained without a torque lag, slipped under the preset's: 6 of 32). The sliding walker it
    replaced (test/data/quadruped_sliding) fails the plain stand-in's episodes.
    """
    from conftest import drawn_seed
    from diffsim_ros.workflows.evaluation import evaluate_on_standin

    seed = drawn_seed("quadruped walker on the stand-in", "DIFFSIM_WALK_SEED") % 1000
    for pert in (None, "hardware"):
        res = evaluate_on_standin(REPO_ROOT / "policies" / "locomotion_velocity", episodes=8, seed=seed,
                                  perturbation=pert, simulator=False)
        for v in res["verdicts"]:
            print(pert, {k: v[k] for k in ("command_m_s", "window_speed_m_s", "touchdowns_per_s", "foot_slide_m_s",
                                           "success")})
            assert v["height_ok"] and v["tilt_ok"] and v["only_feet_touch"] and v["steps_ok"], v
        assert sum(v["success"] for v in res["verdicts"]) >= 5, (pert, seed)
    old = evaluate_on_standin(REPO_ROOT / "test" / "data" / "quadruped_sliding", episodes=8, seed=seed,
                              simulator=False)
    assert sum(v["success"] for v in old["verdicts"]) <= 1, seed
