"""The main job, `diffsim-ros loop`, on the pretrained hover policy.

Training is covered by learning/test_apg.py / cli/test_train.py. Here: the nodes as separate
processes over DDS, the bag, and the sim-vs-real summary checked against an analytic value of
the gap.
"""
from __future__ import annotations

import json
import os

import pytest

pytest.importorskip("rclpy", reason="rclpy not installed (ROS 2 client library)")
pytest.importorskip("mujoco", reason="the stand-in runs on MuJoCo (pip package 'mujoco')")
pytest.importorskip("rosbags", reason="bags are written and read with rosbags")
pytestmark = pytest.mark.ros

from conftest import REPO_ROOT, ros_domain  # noqa: E402

from diffsim_ros import cli  # noqa: E402
from diffsim_ros.workflows.loop import LoopError, launch_unavailable, run_loop  # noqa: E402


def deploy_path(path: str) -> bool:
    """Return use_launch for run_loop: 'launch' or 'nodes'.

    'launch' is deploy.launch.py (required in CI, where bootstrap installs the tooling); 'nodes'
    is the nodes started one by one, the path of machines without launch.
    """
    if path == "launch":
        reason = launch_unavailable()
        if reason is not None:
            if os.environ.get("CI", "").lower() == "true":
                pytest.fail(f"CI must deploy through deploy.launch.py: {reason}")
            pytest.skip(reason)
    return path == "launch"


@pytest.mark.parametrize("path", ["launch", "nodes"])
def test_loop_on_the_perturbed_stand_in(tmp_path, path):
    out = tmp_path / "loop"
    summary = run_loop(str(REPO_ROOT / "config" / "hover.yaml"), str(out),
                       checkpoint=str(REPO_ROOT / "policies" / "hover"), duration=2.5,
                       perturbation={"mass_scale": 1.1}, log=lambda *_: None, domain=ros_domain(),
                       use_launch=deploy_path(path))
    assert summary["deployment"].startswith("nodes") != (path == "launch"), summary["deployment"]
    # The hover holds on a 10 % heavier quadrotor, and nothing the controller published is missing.
    assert summary["task"]["success"], summary["task"]
    assert summary["lost"] == {}
    assert summary["controller"]["published"]["/cmd_ctbr"] == summary["bag_counts"]["/cmd_ctbr"] > 100
    # Lockstep: one state per command, from t = 0 on (distinct stamps; none lost to discovery).
    assert summary["states_recorded"] >= summary["controller"]["published"]["/cmd_ctbr"]
    # The simulator believes the nominal mass: in one 20 ms step at hover thrust m g, the heavier
    # robot falls behind the prediction by g (1 - 1/1.1) dt in vertical speed (body z ~ world z at hover).
    dt, g = 0.02, 9.81
    expected = g * (1 - 1 / 1.1) * dt
    vz = summary["velocity_error"]["1"]["per_dof_rmse"]["vz"]
    assert 0.7 * expected < vz < 1.3 * expected, (vz, expected)
    # Lateral axes barely differ: the gap is the mass, not noise in the pipeline.
    assert summary["velocity_error"]["1"]["per_dof_rmse"]["vx"] < 0.1 * expected
    for name in ("summary.json", "analysis/report.md", "analysis/metrics.json", "analysis/velocity.png"):
        assert (out / name).is_file(), name
    assert json.loads((out / "summary.json").read_text())["bag"] == summary["bag"]
    # A recorded bag is never overwritten.
    with pytest.raises(LoopError, match="already exists"):
        run_loop(str(REPO_ROOT / "config" / "hover.yaml"), str(out), checkpoint=str(REPO_ROOT / "policies" / "hover"),
                 duration=0.5, log=lambda *_: None)


@pytest.mark.parametrize("path", ["launch", "nodes"])
def test_loop_names_the_node_that_ended_the_deployment(tmp_path, path):
    """The loop names the node that ended the deployment.

    A node that exits (here the stand-in refusing, at start, a contact time constant below twice
    its MuJoCo step: a value the schema admits, which only the plant can judge) ends the run at
    once with its name and what it printed, on both deployment paths; every log is kept. A value
    the schema refuses (a negative mass scale) is refused before any node starts.
    """
    use_launch = deploy_path(path)
    with pytest.raises(LoopError) as err:
        run_loop(None, str(tmp_path / "loop"), checkpoint=str(REPO_ROOT / "policies" / "hover"), duration=1.0,
                 perturbation={"contact_time_constant": 0.001}, log=lambda *_: None, domain=ros_domain(),
                 use_launch=use_launch)
    msg = str(err.value)
    assert "mujoco_plant exited with status 2" in msg and "below twice the stand-in's MuJoCo step" in msg, msg
    assert "below twice the stand-in's MuJoCo step" in (tmp_path / "loop" / "logs" / "plant.log").read_text()
    with pytest.raises(LoopError, match="'--perturb.mass_scale' must be > 0"):
        run_loop(None, str(tmp_path / "early"), checkpoint=str(REPO_ROOT / "policies" / "hover"), duration=1.0,
                 perturbation={"mass_scale": -1.0}, log=lambda *_: None, domain=ros_domain(), use_launch=use_launch)
    assert not (tmp_path / "early" / "logs" / "plant.log").exists()


def test_loop_deploys_an_old_checkpoint_from_the_training_file_it_names(tmp_path):
    """The loop deploys an old checkpoint from the training file it names.

    test/data/hover_nominal (the hover shipped before 2026-12-04) records only its training file and
    task ({file, task}): the loop finds that file (or the package's file of the same name) and refuses
    one whose task section differs.
    """
    from diffsim_ros.workflows.loop import checkpoint_config

    old_hover = REPO_ROOT / "test" / "data" / "hover_nominal"
    path = checkpoint_config(old_hover, tmp_path)
    import yaml

    params = yaml.safe_load(open(path))["/**"]["ros__parameters"]
    assert params["task"] == yaml.safe_load(open(REPO_ROOT / "config" / "hover.yaml"))["/**"]["ros__parameters"]["task"]
    assert params["urdf"].endswith("diffsim_quadrotor.urdf")
    # The same checkpoint recording another task: refused, naming the file.
    import shutil

    ckpt = tmp_path / "old"
    shutil.copytree(old_hover, ckpt)
    meta = json.loads((ckpt / "policy.json").read_text())
    assert sorted(meta["config"]) == ["file", "task"]
    meta["config"]["task"] = dict(meta["config"]["task"], settle_time=0.25)
    (ckpt / "policy.json").write_text(json.dumps(meta))
    with pytest.raises(LoopError, match="another task section"):
        checkpoint_config(ckpt, tmp_path)


def test_loop_cli_rejects_bad_perturbation(capsys):
    assert cli.main(["loop", "--perturb", "mass_scale:1.2"]) == 2
    assert "KEY=NUMBER" in capsys.readouterr().err
    assert cli.main(["loop", "--checkpoint", str(REPO_ROOT / "policies" / "reach_arm"), "--perturb", "hardwar"]) == 2
    assert "'hardwar' is not a preset" in capsys.readouterr().err
    assert cli.main(["loop", "--checkpoint", str(REPO_ROOT / "policies" / "reach_arm"), "--perturb",
                     "sensor_noise=abc"]) == 2
    err = capsys.readouterr().err
    assert "KEY=NUMBER" in err and "Traceback" not in err, err


@pytest.mark.parametrize("path", ["launch", "nodes"])
def test_loop_takes_the_hardware_preset_and_numbers_for_lists(tmp_path, path):
    """The loop takes the hardware preset, and numbers for lists.

    --perturb hardware,sensor_noise=0.001,latency=0 on the arm (issue 39: a number for
    sensor_noise made mujoco_plant die with rclpy's InvalidParameterTypeException): the arm's preset,
    the noise one number for both entries and the latency an integer, reach mujoco_plant (through a
    params file with launch, as -p arguments without) and the run completes with every message.
    """
    from diffsim_ros.plant import resolve_perturbation

    ckpt = REPO_ROOT / "policies" / "reach_arm"
    summary = run_loop(None, str(tmp_path / "loop"), checkpoint=str(ckpt), duration=0.5, n_targets=1,
                       perturbation="hardware,sensor_noise=0.001,latency=0", log=lambda *_: None,
                       domain=ros_domain(), use_launch=deploy_path(path))
    want = dict(resolve_perturbation("hardware", "arm"), sensor_noise=[0.001, 0.001], latency=0.0)
    assert summary["perturbation"] == want and summary["lost"] == {}
    assert summary["controller"]["published"]["/position_controller/commands"] >= 20
    assert len(summary["task"]["targets"]) == 1


def odom_positions(bag):
    """Read {header stamp (ns): position} of the bag's /odom.

    Read with the rosbags reader (the first message of each stamp).
    """
    from rosbags.highlevel import AnyReader

    with AnyReader([bag]) as reader:
        conns = [c for c in reader.connections if c.topic == "/odom"]
        odom = {}
        for conn, _, raw in reader.messages(connections=conns):
            msg = reader.deserialize(raw, conn.msgtype)
            odom.setdefault(msg.header.stamp.sec * 10 ** 9 + msg.header.stamp.nanosec, msg.pose.pose.position)
    return odom


def test_loop_deploys_a_legged_checkpoint_from_its_own_metadata(tmp_path):
    """The loop deploys a legged checkpoint from its own metadata.

    No --config: the robot, simulator and task come from the checkpoint. A legged robot (the
    project's quadruped) runs over DDS on the stand-in with ground contact: joint position commands
    out, /joint_states + /odom in; the verdict is the task's own metric on the recorded episode.
    """
    from builders import make_checkpoint

    make_checkpoint("locomotion", tmp_path / "ckpt", gain=1.0)
    summary = run_loop(None, str(tmp_path / "loop"), checkpoint=str(tmp_path / "ckpt"), duration=1.2,
                       perturbation={}, log=lambda *_: None, domain=ros_domain())
    res = summary["task"]
    assert summary["kind"] == "legged" and summary["lost"] == {}
    sent = summary["controller"]["published"]["/position_controller/commands"]
    assert sent == summary["bag_counts"]["/position_controller/commands"] > 100
    assert summary["controller"]["states_rejected"] == 0 and summary["controller"]["safe_commands"] == 0
    # The verdict read independently from the bag: /odom's x over the first episode.
    odom = odom_positions(tmp_path / "loop" / "bag")
    t = sorted(odom)
    k = res["episode_steps"]
    speed = (odom[t[k]].x - odom[t[0]].x) / ((t[k] - t[0]) * 1e-9)
    assert res["episode_mean_forward_speed_m_s"] == pytest.approx(speed, abs=0.02)
    assert res["min_base_height_m"] == pytest.approx(min(p.z for p in odom.values()), abs=1e-9)
    # An untrained policy does not walk: the metric says so.
    assert res["success"] == (speed > res["success_speed_m_s"] and res["min_base_height_m"] > res["fall_height_m"])
    # The gait of the run and its footfall diagram; `diffsim-ros analyze` gives the same on the bag.
    assert summary["gait"]["gait"] in ("walk", "trot", "pace", "bound", "pronk", "stand", "irregular")
    assert (tmp_path / "loop" / "analysis" / "footfall.png").stat().st_size > 5000
    rc = cli.main(["analyze", str(tmp_path / "loop" / "bag"), "--out", str(tmp_path / "again")])
    assert rc == 0
    again = json.loads((tmp_path / "again" / "legged.json").read_text())
    assert again["gait"] == summary["gait"] and again["steps"] == res["steps_recorded"]


def test_loop_runs_a_robot_observation_walker_on_the_imu_and_joint_states(tmp_path):
    """The loop runs a robot-observation walker on the IMU and joint states.

    A legged policy on the robot observation (an untrained one: the point is the path) over DDS
    on the stand-in: the controller pairs /joint_states with /imu and ignores /odom; every state is
    answered by the policy (none rejected, no safe command), and each recorded command equals an
    independent PolicyRunner's fed the recorded states in order (which carries the policy's previous
    action from one to the next as the controller must); with the previous action withheld the
    commands differ.
    """
    import glob

    import numpy as np

    from builders import make_checkpoint
    from diffsim_ros import analysis
    from diffsim_ros.learning.deploy import PolicyRunner

    make_checkpoint("locomotion_velocity", tmp_path / "ckpt", gain=1.0, task_options={"observation": "robot"})
    summary = run_loop(None, str(tmp_path / "loop"), checkpoint=str(tmp_path / "ckpt"), duration=1.0,
                       perturbation={}, log=lambda *_: None, domain=ros_domain())
    assert summary["kind"] == "legged" and summary["lost"] == {}
    assert summary["controller"]["states_rejected"] == 0 and summary["controller"]["safe_commands"] == 0
    stats = json.loads(open(glob.glob(str(tmp_path / "loop" / "**" / "controller_stats.json"),
                                      recursive=True)[0]).read())
    assert stats["states_ignored"] > 90 and stats["imu_received"] > 90      # every /odom ignored, /imu used
    data = analysis.read_bag(summary["bag"])
    index = {int(s): i for i, s in enumerate(data.t_state)}
    rows = [(k, index[int(s)]) for k, s in enumerate(data.cmd_state_stamp) if int(s) in index]
    assert len(rows) > 90
    ref, forgetful = PolicyRunner(tmp_path / "ckpt"), PolicyRunner(tmp_path / "ckpt")
    m = summary["task"]["strict_metric"]
    assert not m["success"] and "shorter than the 3.0 s window" in m["reason"]    # 1 s: not judged, not a crash
    names, differs = data.joint_names, 0
    nb = 7
    for k, i in rows:
        q, v = data.q[i], data.v[i]
        args = (names, q[nb:], v[nb - 1:], q[0:3], q[3:7], v[0:3], v[3:6])
        want = ref.legged(*args, predict=False).command   # the default command, as the loop's
        np.testing.assert_allclose(data.cmd[k], want, atol=1e-9)
        forgetful.reset()
        differs += not np.allclose(forgetful.legged(*args, predict=False).command, want, atol=1e-6)
    assert differs > len(rows) // 2


def test_loop_judges_a_velocity_command_checkpoint_by_the_strict_metric_on_its_bag(tmp_path):
    """The loop judges a velocity-command checkpoint by the strict metric on its bag.

    The shipped walking policy (a commanded forward speed) on the stand-in with a drawn mass and
    floor friction: the summary carries the strict metric of the bag's first 4 s episode, its
    verdict is the task's, and its speed and height read again from the bag's /odom with the
    rosbags reader agree; the contact-free estimate gives the drawn mass back from the bag.
    """
    import numpy as np

    from conftest import drawn_seed
    from diffsim_ros import analysis
    from diffsim_ros.analysis.contact_free import contact_free_mass

    seed = drawn_seed("legged loop", "DIFFSIM_SYSID_SEED")
    rng = np.random.default_rng(seed)
    pert = {"mass_scale": float(rng.uniform(0.85, 1.2)), "ground_friction_scale": float(rng.uniform(0.6, 1.2))}
    summary = run_loop(None, str(tmp_path / "loop"), checkpoint=str(REPO_ROOT / "policies" / "locomotion_velocity"),
                       duration=4.2, perturbation=pert, log=lambda *_: None, domain=ros_domain())
    res = summary["task"]
    m = res["strict_metric"]
    assert summary["lost"] == {} and m["success"] == res["success"]
    assert 0.2 <= m["command_m_s"] <= 0.8
    odom = odom_positions(tmp_path / "loop" / "bag")
    t = sorted(odom)[:res["episode_steps"] + 1]
    i0 = len(t) - 1 - 300                                   # the last 3 s of 0.01 s steps
    speed = (odom[t[-1]].x - odom[t[i0]].x) / ((t[-1] - t[i0]) * 1e-9)
    assert m["window_speed_m_s"] == pytest.approx(speed, abs=1e-6)
    assert m["min_height_m"] == pytest.approx(min(odom[k].z for k in t), abs=1e-9)
    assert m["speed_ok"] == (abs(speed - m["command_m_s"]) <= 0.2 * m["command_m_s"])
    # The drawn mass from the ROS 2 bag, by the contact-free estimate (the stand-in's ground is MuJoCo's).
    data = analysis.read_bag(summary["bag"])
    r = contact_free_mass(data, analysis.sim_setup(data))
    print(f"{pert}: contact-free mass_scale {r.mass_scale:.4f}, {r.verdict} {r.reasons}")
    assert r.accepted and r.mass_scale == pytest.approx(pert["mass_scale"], rel=0.02), (seed, r.mass_scale)
    assert summary["mass_contact_free"]["mass_scale"] == pytest.approx(r.mass_scale, rel=1e-12)


def test_the_main_jobs_default_perturbation_lets_solo12_walk(tmp_path):
    """The main job's default perturbation lets solo12 walk.

    The main job as a user runs it on a walker (no --perturb): policies/locomotion_velocity_solo12
    on the stand-in with the legged kind's default perturbation (10 % more mass, a 5 ms joint torque
    lag) walks its first 4 s episode within the strict metric, every foot stepping and none sliding,
    judged from the bag. Under the default before it, whose rotor lag became a 30 ms joint torque lag,
    it stood still (0.006 m/s for a 0.41 m/s command).
    """
    from conftest import example_robot_data_dir
    from diffsim_ros.plant import resolve_perturbation

    if example_robot_data_dir() is None:
        pytest.skip("example-robot-data (pip package 'example-robot-data') is not installed")
    walker = REPO_ROOT / "policies" / "locomotion_velocity_solo12"
    summary = run_loop(None, str(tmp_path / "loop"), checkpoint=str(walker), duration=4.2, log=lambda *_: None,
                       domain=ros_domain())
    assert summary["perturbation"] == resolve_perturbation("default", "legged") and summary["lost"] == {}
    m = summary["task"]["strict_metric"]
    print({k: m[k] for k in ("command_m_s", "window_speed_m_s", "success")})
    assert m["success"] and m["steps_ok"] and m["no_slide_ok"], m


def test_loop_refuses_a_config_for_another_robot(tmp_path):
    """A checkpoint for the arm with hover.yaml's quadrotor: refused before anything starts."""
    from builders import make_checkpoint

    make_checkpoint("reach_arm", tmp_path / "arm")
    with pytest.raises(LoopError,
                       match="floating-base robot .* the checkpoint is for 'diffsim_arm'.*Leave --config out"):
        run_loop(str(REPO_ROOT / "config" / "hover.yaml"), str(tmp_path / "loop"), checkpoint=str(tmp_path / "arm"),
                 duration=0.5, log=lambda *_: None, domain=ros_domain())


def test_loop_reaches_arm_targets_in_sequence(tmp_path):
    """The loop reaches arm targets in sequence.

    The pretrained arm, no --config, two targets held one after the other: the controller gets the
    second through /diffsim/target (its recorded commands equal an independent PolicyRunner's for
    that target), and the verdict names each target's result and the joint speeds against the URDF
    velocity limits (read here with urdf_parser_py).
    """
    import numpy as np
    from urdf_parser_py.urdf import URDF

    from diffsim_ros import analysis
    from diffsim_ros.learning.deploy import PolicyRunner

    targets = [[0.15, -0.1, 0.7], [-0.2, 0.1, 0.65]]
    ckpt = REPO_ROOT / "policies" / "reach_arm"
    summary = run_loop(None, str(tmp_path / "loop"), checkpoint=str(ckpt), duration=1.2, perturbation={},
                       targets=targets, log=lambda *_: None, domain=ros_domain())
    res = summary["task"]
    assert [r["target"] for r in res["targets"]] == targets and summary["lost"] == {}
    data = analysis.read_bag(summary["bag"])
    ref = PolicyRunner(ckpt)
    t = (data.t_state - data.t_state[0]) * 1e-9
    label = {int(s): i for i, s in enumerate(data.cmd_state_stamp)}
    late = [i for i in np.nonzero((t > 1.2 + 0.2) & (t < 2.4))[0] if int(data.t_state[i]) in label][-5:]
    assert late
    for i in late:
        want = ref.arm(data.joint_names, data.q[i], data.v[i], target=targets[1], predict=False).command
        np.testing.assert_allclose(data.cmd[label[int(data.t_state[i])]], want, atol=1e-9)
    robot = URDF.from_xml_string((REPO_ROOT / "urdf" / "diffsim_arm.urdf").read_text())
    vlim = {j.name: j.limit.velocity for j in robot.joints if j.limit is not None}
    for k, r in enumerate(res["targets"]):
        seg = (t >= 1.2 * k) & (t < 1.2 * (k + 1))
        ratio = max(np.abs(data.v[seg, c]).max() / vlim[n] for c, n in enumerate(data.joint_names))
        assert r["max_speed_over_velocity_limit"] == pytest.approx(ratio, rel=1e-9)
        assert r["within_velocity_limits"] == (ratio <= 1.0)
    assert res["success"] == all(r["success"] for r in res["targets"])


def test_loop_deploys_an_example_robot_data_arm(tmp_path):
    """The loop deploys an example-robot-data arm.

    A robot the project does not ship: example-robot-data's UR5 with a reach task (an untrained
    policy: the point is the path, not the skill). No --config: everything from the checkpoint;
    the stand-in loads the UR5, the supervisor accepts its states, every command reaches the bag.
    """
    import yaml

    from conftest import example_robot_data_dir

    from diffsim_ros import config
    from diffsim_ros.learning import MLPPolicy
    from diffsim_ros.learning.checkpoint import save_checkpoint

    robots = example_robot_data_dir()
    if robots is None:
        pytest.skip("example-robot-data is not installed")
    doc = yaml.safe_load((REPO_ROOT / "config" / "reach_arm.yaml").read_text())
    p = doc["/**"]["ros__parameters"]
    p["urdf"] = str(robots / "ur_description" / "urdf" / "ur5_robot.urdf")
    p["simulator"].update(kp=[400.0, 400.0, 200.0, 40.0, 40.0, 20.0], kd=[40.0, 40.0, 20.0, 2.0, 2.0, 1.0],
                          substeps=4)
    p["task"]["ee_link"] = "tool0"
    cfg = tmp_path / "ur5.yaml"
    cfg.write_text(yaml.safe_dump(doc))
    params, task, model = config.load_training_file(cfg)
    import torch

    torch.manual_seed(0)
    pol = MLPPolicy(task.obs_dim, task.action_dim, (32, 32)).to(model.dtype)
    with torch.no_grad():
        pol.norm.update(task.observe(task.reset(32, torch.Generator().manual_seed(0))))
    save_checkpoint(pol, task, tmp_path / "ckpt", extra={"config": params})
    summary = run_loop(None, str(tmp_path / "loop"), checkpoint=str(tmp_path / "ckpt"), duration=0.6,
                       perturbation={}, n_targets=2, log=lambda *_: None, domain=ros_domain())
    assert summary["lost"] == {} and len(summary["task"]["targets"]) == 2
    c = summary["controller"]
    assert c["states_rejected"] == 0 and c["safe_commands"] == 0, c
    assert (c["published"]["/position_controller/commands"]
            == summary["bag_counts"]["/position_controller/commands"] > 50)
    assert set(summary["velocity_error"]["1"]["per_dof_rmse"]) == set(model.joint_names)


def test_nodes_die_with_a_killed_loop(tmp_path):
    """Nodes die with a killed loop.

    The loop's children get SIGTERM when the loop's process is killed (SIGKILL included), so no
    node is left running on its ROS domain (seen: nodes of timed-out runs alive an hour later).
    """
    import os
    import signal
    import subprocess
    import sys
    import time

    pid_file = tmp_path / "child.pid"
    parent = subprocess.Popen([sys.executable, "-c", (
        "import subprocess, sys, time\n"
        "from diffsim_ros.workflows.loop import die_with_parent\n"
        f"p = subprocess.Popen(['sleep', '60'], start_new_session=True, preexec_fn=die_with_parent)\n"
        f"open({str(pid_file)!r}, 'w').write(str(p.pid))\n"
        "time.sleep(60)\n")])
    end = time.monotonic() + 30
    while not pid_file.exists() or not pid_file.read_text():
        assert time.monotonic() < end and parent.poll() is None
        time.sleep(0.05)
    child = int(pid_file.read_text())
    os.kill(child, 0)                                   # running
    parent.send_signal(signal.SIGKILL)
    parent.wait()
    end = time.monotonic() + 10
    while time.monotonic() < end:
        try:
            os.kill(child, 0)
        except ProcessLookupError:
            return
        # a zombie (dead, not yet reaped by init) counts as gone
        with open(f"/proc/{child}/stat") as f:
            if f.read().split()[2] == "Z":
                return
        time.sleep(0.05)
    os.kill(child, signal.SIGKILL)
    raise AssertionError("the child outlived its killed parent")
