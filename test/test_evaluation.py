"""``diffsim-ros eval``: the task's own success on fresh episodes, and the failure modes.

The success comes with a Wilson interval, and the failure modes are counted per episode.

The interval is checked against published values; every failure counter is shown to fire
on a policy that does that thing (and only in the episodes where it does it) and to stay at
zero on a benign policy, its count compared with one computed here from the raw recorded
states and limits read from the URDF file itself.
"""
from __future__ import annotations

import json
import shutil
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import torch

from diffsim_ros import config
from diffsim_ros.workflows import evaluation
from diffsim_ros.cli import main

REPO = Path(__file__).resolve().parent.parent


def urdf_limits(path: Path, joints):
    """(lower, upper, velocity) of ``joints`` straight from the URDF XML."""
    root = ET.parse(path).getroot()
    by_name = {j.get("name"): j.find("limit") for j in root.iter("joint")}
    lo = torch.tensor([float(by_name[j].get("lower")) for j in joints], dtype=torch.float64)
    hi = torch.tensor([float(by_name[j].get("upper")) for j in joints], dtype=torch.float64)
    vel = torch.tensor([float(by_name[j].get("velocity")) for j in joints], dtype=torch.float64)
    return lo, hi, vel


def arm_task(actuator="effort", horizon=25, **simulator):
    params = config.load_yaml(REPO / "config" / "reach_arm.yaml")
    params["task"]["horizon"] = horizon
    params["simulator"].update(simulator)
    params["simulator"]["nan_check"] = False          # a diverging episode is counted, not raised
    if actuator == "effort":
        params["simulator"]["actuator"] = "effort"
        params["task"]["command_mode"] = "absolute"
    task, _ = config.build_task(params, "reach_arm.yaml")
    return task


def first_call_mask(rule):
    """Make a policy helper: ``rule(obs)`` decided on the first (reset) observation, then kept."""
    state = {}

    def mask(obs):
        if "m" not in state:
            state["m"] = rule(obs).clone()
        return state["m"]
    return mask


# ------------------------------------------------------------------------ the interval
@pytest.mark.parametrize("k, n, low, high", [
    # Newcombe (1998), Statistics in Medicine 17:857, Table I, method 3 (Wilson score, no correction).
    (81, 263, 0.2553, 0.3662), (15, 148, 0.0624, 0.1605), (0, 20, 0.0, 0.1611), (1, 29, 0.0061, 0.1718),
])
def test_wilson_interval_matches_published_values(k, n, low, high):
    lo, hi = evaluation.wilson_interval(k, n)
    assert lo == pytest.approx(low, abs=6e-5) and hi == pytest.approx(high, abs=6e-5)


def test_wilson_interval_edges_and_bad_input():
    lo, hi = evaluation.wilson_interval(20, 20)
    assert hi == 1.0 and 1 - lo == pytest.approx(0.1611, abs=6e-5)       # mirror of 0 of 20
    assert evaluation.wilson_interval(5, 10, 0.99)[0] < evaluation.wilson_interval(5, 10, 0.95)[0]
    for args in ((0, 0), (3, 2), (-1, 4)):
        with pytest.raises(evaluation.EvalError):
            evaluation.wilson_interval(*args)


# ------------------------------------------------------------------------ failure counters
def test_joint_limit_and_speed_counters_fire_only_on_the_episodes_that_push():
    """The joint limit and speed counters fire only on the episodes that push.

    Full effort on every joint in the episodes whose target lies at x > 0, none in the others:
    the pushing episodes, and only they, reach a joint limit and exceed the URDF speed limit.
    """
    task = arm_task("effort")
    n = task.action_dim
    pushes = first_call_mask(lambda obs: obs[:, 2 * n + 3] > 0)              # obs: q, v, ee error, target

    def policy(obs):
        return pushes(obs).to(obs.dtype)[:, None].expand(-1, n).clone()
    report, roll = evaluation.evaluate_task(task, policy, 16, seed=3)
    mask = pushes(None)
    assert 0 < int(mask.sum()) < 16
    # Independent count: the raw states against the URDF's own numbers.
    lo, hi, vel = urdf_limits(REPO / "urdf" / "diffsim_arm.urdf", task.sim.actuated_joints)
    q, v = roll.q, roll.v
    at_limit = ((q <= lo + 0.01) | (q >= hi - 0.01)).any(-1).any(0)
    too_fast = (v.abs() > vel).any(-1).any(0)
    assert torch.equal(at_limit, mask) and torch.equal(too_fast, mask)
    assert report.failures["joint_at_limit"] == int(at_limit.sum()) == int(mask.sum())
    assert report.failures["over_speed_limit"] == int(too_fast.sum())
    assert report.failures["fall"] is None and report.failures["non_finite"] == 0
    flags = [e["joint_at_limit"] for e in report.per_episode]
    assert flags == mask.tolist()
    assert max(report.failure_details["max_speed_ratio"].values()) > 1.0

    still, _ = evaluation.evaluate_task(task, lambda obs: torch.zeros(obs.shape[0], n, dtype=obs.dtype), 16, seed=3)
    assert still.failures == {"joint_at_limit": 0, "over_speed_limit": 0, "fall": None, "non_finite": 0}
    assert max(still.failure_details["max_speed_ratio"].values()) < 1.0


def test_the_limit_margin_decides_how_close_counts():
    """The limit margin decides how close counts.

    Position targets held at the upper limits: the servo brings the joints to within a few mm
    of them, or a little past; each margin counts exactly the episodes whose closest approach
    (computed here from the raw states) lies within it.
    """
    # Without the drives' velocity limits (config/reach_arm.yaml has them): the joints then arrive
    # within the 0.6 s at different distances from their stops, which is what the margins sort.
    task = arm_task("position", horizon=30, velocity_limits=False, servo_iterations=0)
    n = task.action_dim
    report, roll = evaluation.evaluate_task(task, lambda obs: torch.ones(obs.shape[0], n, dtype=obs.dtype), 8,
                                            seed=5, limit_margin=0.0)
    _, hi, _ = urdf_limits(REPO / "urdf" / "diffsim_arm.urdf", task.sim.actuated_joints)
    closest = (hi - roll.q).min(0).values.min(-1).values                    # (B,) m or rad, < 0: past it
    counts = []
    for margin in (0.0, 0.002, 0.004, 0.01, 0.05):
        r = evaluation.failure_modes(task, roll, limit_margin=margin)
        counts.append(int(r["flags"]["joint_at_limit"].sum()))
        assert counts[-1] == int((closest <= margin).sum()), margin
    assert counts[0] == report.failures["joint_at_limit"]
    assert len(set(counts)) >= 3 and counts[-1] == 8


def test_non_finite_counter_fires_on_the_diverging_episodes_only():
    task = arm_task("position")
    n = task.action_dim
    bad = first_call_mask(lambda obs: obs[:, 2 * n + 3] > 0)

    def policy(obs):
        a = torch.zeros(obs.shape[0], n, dtype=obs.dtype)
        a[bad(obs)] = float("nan")
        return a
    report, roll = evaluation.evaluate_task(task, policy, 12, seed=4)
    mask = bad(None)
    assert 0 < int(mask.sum()) < 12
    raw = ~(torch.isfinite(roll.q).all(-1) & torch.isfinite(roll.v).all(-1)).all(0)
    assert torch.equal(raw, mask) and report.failures["non_finite"] == int(mask.sum())
    assert report.successes <= 12 - int(mask.sum())


def test_quadrotor_crash_counter_fires_when_the_thrust_is_cut():
    params = config.load_yaml(REPO / "config" / "hover.yaml")
    params["task"]["horizon"] = 45          # 0.9 s: enough to fall from 1.5 m, not to drift 0.4 m down
    task, _ = config.build_task(params, "hover.yaml")
    cut = first_call_mask(lambda obs: obs[:, 0] > 0)

    def policy(obs):
        a = torch.zeros(obs.shape[0], 4, dtype=obs.dtype)
        a[cut(obs), 0] = -1.0                  # 20 % of the hover thrust
        return a
    report, roll = evaluation.evaluate_task(task, policy, 16, seed=3)
    mask = cut(None)
    assert 0 < int(mask.sum()) < 16
    crashed = (roll.q[..., 2] < 0.1).any(0)
    assert torch.equal(crashed, mask) and report.failures["fall"] == int(mask.sum())
    assert report.failures["joint_at_limit"] is None and report.failures["over_speed_limit"] is None
    assert not any(report.per_episode[b]["success"] for b in range(16) if mask[b])


def test_legged_fall_is_the_locomotion_tasks_own():
    """A legged fall is the locomotion task's own.

    Servos too weak to stand: the trunk sinks below fall_height x base_height (the task's fall);
    with the file's gains the same zero action stands.
    """
    rows = {}
    for kp, kd in ((20.0, 0.5), (1.0, 0.05)):
        params = config.load_yaml(REPO / "config" / "locomotion.yaml")
        params["task"]["horizon"] = 40
        params["simulator"].update(kp=kp, kd=kd)
        task, _ = config.build_task(params, "locomotion.yaml")
        report, roll = evaluation.evaluate_task(task, lambda o: torch.zeros(o.shape[0], task.action_dim,
                                                                            dtype=o.dtype), 4, seed=3)
        low = (roll.q[1:, :, 2] < 0.5 * params["task"]["base_height"]).any(0)
        rows[kp] = (report.failures["fall"], int(low.sum()))
    assert rows[20.0] == (0, 0)
    assert rows[1.0] == (4, 4)


# ------------------------------------------------------------------------ checkpoints
def test_success_is_the_tasks_own_metric_on_a_shipped_checkpoint():
    from diffsim_ros.learning import apg

    task, policy, meta, params = evaluation.load_checkpoint_task(REPO / "policies" / "hover")
    report, _ = evaluation.evaluate_task(task, policy, 32, seed=11)
    assert report.success_rate == apg.evaluate(task, policy, 32, seed=11)
    assert report.failures["fall"] == 0 and report.failures["non_finite"] == 0
    assert task.sim_config.nan_check is False and meta["task"] == "quadrotor_hover"
    assert Path(params["urdf"]).is_file() and params["floating_base"] is True


def test_cli_eval_prints_and_writes_json(tmp_path, capsys):
    out = tmp_path / "eval.json"
    rc = main(["eval", str(REPO / "policies" / "reach_arm"), "--episodes", "24", "--seed", "5", "--json", str(out)])
    text = capsys.readouterr().out
    assert rc == 0, text
    data = json.loads(out.read_text())
    k, n = data["successes"], data["episodes"]
    assert n == 24 and data["seed"] == 5 and data["success_rate"] == k / n
    lo, hi = evaluation.wilson_interval(k, n)
    assert data["confidence_interval"] == {"level": 0.95, "method": "wilson", "low": lo, "high": hi}
    assert set(data["failures"]) == {"joint_at_limit", "over_speed_limit", "fall", "non_finite"}
    assert data["failures"]["fall"] is None and len(data["per_episode"]) == 24
    assert sum(e["success"] for e in data["per_episode"]) == k
    assert sum(e["over_speed_limit"] for e in data["per_episode"]) == data["failures"]["over_speed_limit"]
    assert f"({k} of 24)" in text and f"[{lo:.3f}, {hi:.3f}]" in text
    for row in ("joint at limit", "over speed limit", "fall", "non finite"):
        assert row in text


def test_cli_eval_bad_input_is_exit_2(tmp_path, capsys):
    def run(*argv):
        rc = main(["eval", *argv])
        err = capsys.readouterr().err
        assert rc == 2 and err.startswith("error: ") and "Traceback" not in err, err
        return err
    assert "no such checkpoint" in run(str(tmp_path / "missing"))
    broken = tmp_path / "broken"
    shutil.copytree(REPO / "policies" / "hover", broken)
    (broken / "policy.json").write_text("{ not json")
    assert "malformed JSON" in run(str(broken))
    assert "--episodes must be at least 1" in run(str(REPO / "policies" / "hover"), "--episodes", "0")
    assert "unknown video type '.avi'" in run(str(REPO / "policies" / "hover"), "--video", str(tmp_path / "v.avi"))
    assert "--size" in run(str(REPO / "policies" / "hover"), "--size", "big")
    assert not (tmp_path / "v.avi").exists()


def test_on_the_stand_in_each_episode_is_judged_by_the_tasks_recorded_verdict(tmp_path, capsys):
    """On the stand-in, each episode is judged by the task's recorded verdict.

    --plant mujoco: the shipped hover policy on the MuJoCo stand-in succeeds; an untrained
    velocity-command quadruped stands or stumbles and fails its metric on every episode (the
    speed); a heavier stand-in is what --perturb gives; tasks without a recorded verdict and a
    misspelt perturbation are refused by name.
    """
    from builders import make_checkpoint

    hover = evaluation.evaluate_on_standin(REPO / "policies" / "hover", episodes=6, seed=3)
    assert hover["successes"] >= 5 and len(hover["verdicts"]) == 6, hover["verdicts"]
    assert all(v["success"] == (v["fraction_within_tolerance_after_settling"] == 1.0) for v in hover["verdicts"])
    make_checkpoint("locomotion_velocity", tmp_path / "walk", gain=0.3)
    rc = main(["eval", str(tmp_path / "walk"), "--plant", "mujoco", "--episodes", "4", "--perturb", "mass_scale=1.2",
               "--json", str(tmp_path / "w.json")])
    text = capsys.readouterr().out
    assert rc == 0, text
    data = json.loads((tmp_path / "w.json").read_text())
    assert data["successes"] == 0 and data["failed"]["speed_ok"] == 4, data["failed"]
    assert data["perturbation"] == {"mass_scale": 1.2} and "0 of 4" in text
    for v in data["verdicts"]:
        assert 0.2 <= v["command_m_s"] <= 0.8 and abs(v["window_speed_m_s"] - v["command_m_s"]) > 0.2 * v["command_m_s"]

    def refused(*argv):
        rc = main(["eval", *argv])
        err = capsys.readouterr().err
        assert rc == 2 and "Traceback" not in err, err
        return err
    make_checkpoint("locomotion", tmp_path / "forward", gain=0.3)
    assert "no verdict on a recorded episode" in refused(str(tmp_path / "forward"), "--plant", "mujoco")
    assert "did you mean 'mass_scale'" in refused(str(REPO / "policies" / "hover"), "--plant", "mujoco", "--perturb",
                                                  "mass_scal=1.2")
    assert "with --plant mujoco" in refused(str(REPO / "policies" / "hover"), "--perturb", "mass_scale=1.2")
    assert "is not a preset" in refused(str(REPO / "policies" / "hover"), "--plant", "mujoco", "--perturb", "hardwar")


@pytest.mark.parametrize("name", ["reach_arm", "jump"])
def test_on_the_stand_in_reach_and_jump_beside_the_simulator(tmp_path, capsys, name):
    """On the stand-in, reach and jump are evaluated beside the simulator.

    --plant mujoco on the shipped reach and jump policies: the stand-in's episodes are the
    simulator evaluation's (the same starts and goals), printed and written side by side with the
    ratio; --perturb hardware,latency=0.015 is the preset of the checkpoint's kind with the latency
    replaced, and the policy then sees the stand-in's noisy measurement.
    """
    out = tmp_path / "e.json"
    rc = main(["eval", str(REPO / "policies" / name), "--plant", "mujoco", "--episodes", "3", "--seed", "5",
               "--json", str(out)])
    text = capsys.readouterr().out
    assert rc == 0, text
    data = json.loads(out.read_text())
    sim = evaluation.evaluate_checkpoint(REPO / "policies" / name, episodes=3, seed=5)
    assert data["simulator"]["successes"] == sim.successes and data["kind"] in ("arm", "legged")
    assert data["ratio"] == (pytest.approx(data["success_rate"] / sim.success_rate) if sim.successes else None)
    assert "simulator" in text and "stand-in" in text and "ratio" in text
    part = "distance_ok" if name.startswith("reach") else "apex_ok"
    assert part in data["failed"] and all(part in v for v in data["verdicts"])
    rc = main(["eval", str(REPO / "policies" / name), "--plant", "mujoco", "--episodes", "1", "--seed", "5",
               "--perturb", "hardware,latency=0.015", "--json", str(out)])
    assert rc == 0, capsys.readouterr().out
    data = json.loads(out.read_text())
    from diffsim_ros.plant import resolve_perturbation

    assert data["preset"] == "hardware"
    assert data["perturbation"] == dict(resolve_perturbation("hardware", data["kind"]), latency=0.015)


def test_on_the_stand_in_the_episodes_start_where_the_simulators_do(monkeypatch):
    """On the stand-in, the episodes start where the simulator's do.

    Each stand-in episode starts from the simulator evaluation's start state and goal (an arm's
    joint positions and its target), and the policy is given that target.
    """
    import numpy as np

    from diffsim_ros.learning.deploy import PolicyRunner
    from diffsim_ros.plant.mujoco_plant import MujocoPlant

    starts, goals = [], []
    reset, decide = MujocoPlant.reset, PolicyRunner.decide
    monkeypatch.setattr(MujocoPlant, "reset", lambda self, q=None, v=None: (starts.append(np.array(q)),
                                                                            reset(self, q, v))[1])
    monkeypatch.setattr(PolicyRunner, "decide", lambda self, state, target=None, predict=True: (
        goals.append(np.asarray(target, dtype=float).reshape(-1)), decide(self, state, target, predict))[1])
    evaluation.evaluate_on_standin(REPO / "policies" / "reach_arm", episodes=2, seed=7)
    task, policy, _, _ = evaluation.load_checkpoint_task(REPO / "policies" / "reach_arm")
    roll = evaluation.rollout(task, policy, 2, 7)
    starts = [q for q in starts if q.ndim]                # MujocoPlant's own reset at construction: None
    np.testing.assert_array_equal(np.stack(starts), roll.q[0].numpy())
    for g in goals[:task.horizon]:
        np.testing.assert_array_equal(g, roll.target[0].numpy())
    np.testing.assert_array_equal(goals[-1], roll.target[1].numpy())


def test_python_dash_m_reports_bad_input_as_exit_2(tmp_path):
    """Under ``python -m`` bad input is reported as exit 2.

    Under ``python -m diffsim_ros.cli`` the CLI module is __main__: eval's errors must still be
    the CliError its main catches (one line, exit 2), not a traceback.
    """
    import subprocess
    import sys

    for argv, words in ((["--episodes", "0"], "--episodes must be at least 1"),
                        (["--video", str(tmp_path / "v.webm")], "unknown video type")):
        proc = subprocess.run([sys.executable, "-m", "diffsim_ros.cli", "eval", str(REPO / "policies" / "hover"),
                               *argv], cwd=REPO, capture_output=True, text=True, timeout=120)
        assert proc.returncode == 2 and words in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
