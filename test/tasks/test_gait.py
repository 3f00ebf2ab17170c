"""Gait analysis (diffsim_ros/tasks/gait.py).

Names, duty factors and stride frequencies of contact timelines built from the gaits'
definitions (hypothesis: any period, duty factor, phase jitter, start offset and foot order), a
pattern without a gait, and an open-loop trot on the project's quadruped in the simulator
(contacts from the contact forces).
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import REPO_ROOT

from diffsim_ros import config
from diffsim_ros.tasks.gait import (TEMPLATES, analyze_gait, foot_bodies, foot_contacts, foot_xy, footfall_png,
                                    leg_roles)

ROLE_XY = {"LF": (0.2, 0.1), "RF": (0.2, -0.1), "LH": (-0.2, 0.1), "RH": (-0.2, -0.1)}


def timeline(phases, period, duty, dt, T, jitter, offset):
    """(T, 4) contacts: foot i is down during [phase_i, phase_i + duty) of every stride (+ jitter)."""
    t = np.arange(T) * dt / period + offset
    return np.stack([((t - p - j) % 1.0) < duty for p, j in zip(phases, jitter)], axis=1)


@settings(max_examples=200, deadline=None)
@given(gait=st.sampled_from(sorted(TEMPLATES)), which=st.integers(0, 1), period=st.floats(0.25, 1.0),
       duty=st.floats(0.3, 0.75), jitter=st.lists(st.floats(-0.04, 0.04), min_size=4, max_size=4),
       offset=st.floats(0.0, 1.0), order=st.permutations([0, 1, 2, 3]))
def test_named_gaits_are_recognised(gait, which, period, duty, jitter, offset, order):
    tmpl = TEMPLATES[gait][min(which, len(TEMPLATES[gait]) - 1)]
    roles = ["LF", "RF", "LH", "RH"]
    dt = 0.005
    c = timeline(tmpl, period, duty, dt, int(6 * period / dt), jitter, offset)
    # The feet in any order, told apart only by their positions.
    c = c[:, order]
    feet = [f"foot_{roles[i]}" for i in order]
    xy = [ROLE_XY[roles[i]] for i in order]
    g = analyze_gait(c, dt, feet, xy)
    assert g.name == gait, (g.name, g.phase, g.template_distance)
    assert g.frequency_hz == pytest.approx(1.0 / period, rel=0.05)
    np.testing.assert_allclose(g.duty_factor, duty, atol=0.05)
    assert [r for r in g.roles] == [roles[i] for i in order]


def uneven_timeline(phases, periods, duty, dt, jitter):
    """Build the (T, 4) contacts of strides of the given lengths.

    In stride k (start s_k, length T_k) foot i
    is down from s_k + (phase_i + jitter_i) T_k for duty T_k, a foot's late part running into
    the next stride, and lifted at least 0.1 of the next stride before its next touchdown (after
    a long stride a short one could otherwise begin before the long stance ended, two stances
    merging into one without a touchdown between them).
    """
    starts = np.concatenate(([0.0], np.cumsum(periods)))
    T = int(starts[-1] / dt)
    t = np.arange(T) * dt
    c = np.zeros((T, 4), bool)
    for i, (p, j) in enumerate(zip(phases, jitter)):
        ons = [starts[k] + ((p + j) % 1.0) * Tk for k, Tk in enumerate(periods)]
        for k, Tk in enumerate(periods):
            off = ons[k] + duty * Tk
            if k + 1 < len(periods):
                off = min(off, ons[k + 1] - 0.1 * periods[k + 1])
            c[(t >= ons[k]) & (t < off), i] = True
    return c


@settings(max_examples=100, deadline=None)
@given(gait=st.sampled_from(sorted(TEMPLATES)), base=st.floats(0.25, 0.6), spread=st.floats(0.0, 0.35),
       duty=st.floats(0.3, 0.6), jitter=st.lists(st.floats(-0.03, 0.03), min_size=4, max_size=4),
       seed=st.integers(0, 2 ** 31 - 1), strides=st.integers(3, 7))
def test_gaits_of_uneven_strides_are_named(gait, base, spread, duty, jitter, seed, strides):
    """Gaits of uneven strides are named.

    Strides of uneven length (each drawn within +-spread of a base period, up to 35 %: hops
    of different heights, a robot speeding up) keep their gait, down to three strides: the
    jump's pronk of hops 0.17-0.3 s long was called irregular while the phases came from one
    median period.
    """
    tmpl = TEMPLATES[gait][0]
    rng = np.random.default_rng(seed)
    periods = base * (1.0 + rng.uniform(-spread, spread, strides))
    c = uneven_timeline(tmpl, periods, duty, 0.005, jitter)
    g = analyze_gait(c, 0.005, [f"foot_{r}" for r in ROLE_XY], list(ROLE_XY.values()))
    assert g.name == gait, (g.name, g.phase, g.template_distance, g.touchdowns)


def test_no_gait_is_not_named():
    dt = 0.01
    assert analyze_gait(np.ones((300, 4), bool), dt, list("abcd"), list(ROLE_XY.values())).name == "stand"
    c = np.ones((300, 4), bool)
    c[100:110, 0] = False                       # one step of one foot: no stride
    assert analyze_gait(c, dt, list("abcd"), list(ROLE_XY.values())).name == "irregular"
    # Three feet stepping at a drawn rate and one dragged (never lifted): no gait, the rate of
    # the three.
    rate = float(np.random.default_rng().uniform(1.0, 5.0))
    print("stepping rate", rate, "Hz")
    c = ((np.arange(300)[:, None] * dt * rate + np.array([0.0, 0.5, 0.5, 0.0])) % 1.0) < 0.5
    c[:, 2] = True
    g = analyze_gait(c, dt, list("abcd"), list(ROLE_XY.values()))
    assert g.name == "irregular" and abs(1.0 / g.frequency_hz - 1.0 / rate) <= dt + 1e-9, (rate, g)   # a step
    # Feet that touch down at unrelated frequencies match no template.
    rng = np.random.default_rng(0)
    named = 0
    for _ in range(50):
        periods = rng.uniform(0.2, 1.0, 4)
        c = np.stack([((np.arange(600) * dt / p + rng.uniform()) % 1.0) < 0.5 for p in periods], axis=1)
        named += analyze_gait(c, dt, list("abcd"), list(ROLE_XY.values())).name != "irregular"
    assert named == 0, named


def test_leg_roles_need_four_distinct_legs():
    assert leg_roles([ROLE_XY[r] for r in ("RH", "LF", "LH", "RF")]) == ["RH", "LF", "LH", "RF"]
    with pytest.raises(ValueError, match="four feet"):
        leg_roles([(0, 0)] * 3)


def open_loop_trot(task, state, feet, steps, hz=2.0):
    """Lift diagonal legs (FL+HR, FR+HL) in turn by joint targets around the stance.

    Returns the final state, the simulator's foot contacts and the configurations, per step.
    """
    sim = task.sim
    legs = [j.split("_")[0] for j in sim.actuated_joints[::3]]        # leg order of the actuated joints
    phase = {"FL": 0.0, "HR": 0.0, "FR": 0.5, "HL": 0.5}
    contacts, qs = [], []
    for k in range(steps):
        tgt = task.stance.clone()
        for li, leg in enumerate(legs):
            lift = max(0.0, float(np.sin(2 * np.pi * (hz * k * task.dt - phase[leg]))))
            tgt[3 * li + 1] += 0.4 * lift
            tgt[3 * li + 2] -= 0.8 * lift
        state = sim.step(state, tgt[None])
        contacts.append(foot_contacts(sim, feet)[0])
        qs.append(state.q[0])
    return state, contacts, qs


def test_open_loop_trot_on_the_quadruped(tmp_path):
    """An open-loop trot on the quadruped.

    Diagonal legs lifted together by an open-loop joint pattern: the simulator's contact forces
    give diagonal pairs that land together, half a stride apart, at the commanded 2 Hz, and the
    footfall diagram is drawn. The hind feet land 0.13-0.15 of a stride before their diagonal
    fore feet (phases 0, 0.52, 0.37, 0.87 for LF, RF, LH, RH), half way between the trot's
    template and the walk's: the name is one of those two (it was trot by 0.001 of template
    distance, walk since each touchdown is phased within its own stride).
    """
    _, task, model = config.load_training_file(REPO_ROOT / "config" / "locomotion.yaml", dtype=torch.float64)
    sim = task.sim
    feet = foot_bodies(sim)
    names = [model.body_names[b] for b in feet]
    assert len(feet) == 4, names
    ts = task.reset(1, torch.Generator().manual_seed(0))
    xy = foot_xy(sim, ts.sim.q[0])
    state, contacts, _ = open_loop_trot(task, ts.sim, feet, 300)
    c = np.array(contacts[100:])
    g = analyze_gait(c, task.dt, names, xy)
    print(g.as_dict())
    assert g.name in ("trot", "walk"), g.as_dict()
    lf, rf, lh, rh = (g.phase[g.roles.index(r)] for r in ("LF", "RF", "LH", "RH"))
    circ = lambda a, b: abs((a - b + 0.5) % 1.0 - 0.5)                  # noqa: E731
    assert circ(lf, rh) < 0.2 and circ(rf, lh) < 0.2, g.as_dict()       # diagonal pairs together
    assert abs(circ(lf, rf) - 0.5) < 0.1, g.as_dict()                     # the pairs alternate
    assert g.frequency_hz == pytest.approx(2.0, rel=0.1)
    assert float(state.q[0, 2]) > 0.7 * task.base_height        # still standing
    png = footfall_png(np.array(contacts), task.dt, names, tmp_path / "footfall.png", "open-loop trot", g.roles)
    assert (tmp_path / "footfall.png").stat().st_size > 5000 and png.endswith("footfall.png")


def test_contacts_from_kinematics_agree_with_contact_forces():
    """Contacts from the kinematics agree with the contact forces.

    The bag analysis reads contact from the recorded configuration (foot spheres within 5 mm of
    the ground); on a simulated open-loop trot it agrees with the simulator's contact forces.
    """
    from diffsim_ros.analysis.legged import foot_contacts_from_states

    _, task, model = config.load_training_file(REPO_ROOT / "config" / "locomotion.yaml", dtype=torch.float64)
    sim = task.sim
    feet = foot_bodies(sim)
    ts = task.reset(1, torch.Generator().manual_seed(0))
    _, force, qs = open_loop_trot(task, ts.sim, feet, 200)
    geo = foot_contacts_from_states(sim, torch.stack(qs), feet)
    agree = (geo == np.array(force)).mean()
    assert agree > 0.9, agree


def test_foot_slip_is_the_speed_a_foot_is_dragged_at():
    """foot_slip is the speed a foot is dragged at.

    foot_slip against the kinematics it measures: the robot carried rigidly (joints fixed)
    at a drawn horizontal velocity, with a drawn vertical bob, reads that horizontal speed for
    every foot counted as touching; carried on the spot, 0; a foot counted as touching only at
    isolated steps gives no pair of steps (None).
    """
    from diffsim_ros.tasks.gait import foot_points, foot_slip

    seed = int(np.random.SeedSequence().entropy % 2**32)
    print("seed", seed)
    rng = np.random.default_rng(seed)
    _, task, model = config.load_training_file(REPO_ROOT / "config" / "locomotion.yaml", dtype=torch.float64)
    sim = task.sim
    feet = foot_bodies(sim)
    q0 = task.reset(1, torch.Generator().manual_seed(seed)).sim.q[0]
    steps, dt = 40, task.dt
    u = rng.uniform(-1.0, 1.0, 2)
    t = np.arange(steps) * dt
    q = q0.repeat(steps, 1)
    q[:, 0] += torch.as_tensor(u[0] * t)
    q[:, 1] += torch.as_tensor(u[1] * t)
    q[:, 2] += torch.as_tensor(0.02 * np.sin(2 * np.pi * 3.0 * t))
    touching = np.ones((steps, 4), bool)
    assert foot_slip(sim, q, feet, touching, dt) == pytest.approx([np.hypot(*u)] * 4, rel=1e-9)
    # The feet's points handed in (as the bag report does) give the same, sliced with the states.
    pts = [x[..., 5:] for x in foot_points(sim, q, feet)]
    assert foot_slip(sim, q[5:], feet, touching[5:], dt, pts) == pytest.approx([np.hypot(*u)] * 4, rel=1e-9)
    assert foot_slip(sim, q0.repeat(steps, 1), feet, touching, dt) == pytest.approx([0.0] * 4, abs=1e-12)
    lone = np.zeros((steps, 4), bool)
    lone[::2, 1] = True
    assert foot_slip(sim, q, feet, lone, dt)[1] is None


def test_the_gait_report_makes_its_folder_and_reports_each_commanded_speed(tmp_path):
    """The gait report makes its folder and reports each commanded speed.

    write_gait_report into a folder that does not exist yet (it failed there on its first PNG):
    the shipped quadruped walker at one commanded speed gives gait.json with that episode, the
    duty factors of the contact timeline it drew, and the footfall diagram.
    """
    import json

    from diffsim_ros.workflows import evaluation
    from diffsim_ros.tasks.gait import rollout_contacts, write_gait_report

    task, policy = evaluation.load_checkpoint_task(str(REPO_ROOT / "policies" / "locomotion_velocity"))[:2]
    out = tmp_path / "new" / "gait"
    rep = write_gait_report(task, policy, out, speeds=(0.5,))
    saved = json.loads((out / "gait.json").read_text())
    assert [e["command_m_s"] for e in saved["episodes"]] == [0.5] and saved["feet"] == rep["feet"]
    contacts, _, _ = rollout_contacts(task, policy, [0.5])          # the same episode (seed 0)
    duty = contacts[len(contacts) // 4:].mean(0)
    assert saved["episodes"][0]["duty_factor"] == pytest.approx(duty.tolist(), abs=1e-3)
    assert list(out.glob("footfall*.png")) and all(p.stat().st_size > 5000 for p in out.glob("footfall*.png"))


def test_the_gait_report_of_a_task_on_a_compiled_step_runs_the_eager_step(tmp_path):
    """The gait report of a task on a compiled step runs the eager step.

    A training run with compile_step ends in write_gait_report on a task whose simulator
    keeps no contact data (it failed there after the last iteration, exporting nothing): the
    report runs the episode on the eager step of the same system, the same contacts as the
    eager task's, and gives the task its compiled simulator back.
    """
    from diffsim_ros import physics
    from diffsim_ros.workflows import evaluation
    from diffsim_ros.tasks.gait import rollout_contacts, write_gait_report

    class NoContactData(physics.Simulator):        # what a compiled step looks like to the report
        compiled = True

        def step(self, state, action):
            out = super().step(state, action)
            self.last_data = None
            return out

    task, policy = evaluation.load_checkpoint_task(str(REPO_ROOT / "policies" / "locomotion_velocity"))[:2]
    eager, _, _ = rollout_contacts(task, policy, [0.5])
    stand_in = NoContactData(task.sim.system)
    task.sim = stand_in
    contacts, _, _ = rollout_contacts(task, policy, [0.5])
    np.testing.assert_array_equal(contacts, eager)
    assert task.sim is stand_in
    write_gait_report(task, policy, tmp_path, speeds=(0.5,))
    assert (tmp_path / "gait.json").exists() and task.sim is stand_in
