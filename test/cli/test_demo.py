"""The command line's entry point and ``diffsim-ros demo`` (cli/demo.py, dynamics_demo.py).

The demo runs as a separate process, exactly as a user would start it.
"""
import re
import subprocess
import sys
from pathlib import Path

import pytest

from diffsim_ros.cli import main

ROOT = Path(__file__).resolve().parents[2]


def run_cli(*args, timeout=300):
    return subprocess.run([sys.executable, "-m", "diffsim_ros.cli", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout)


# ----------------------------------------------------------------------------- demo


@pytest.fixture(scope="module")
def demo():
    return run_cli("demo", "--batch", "8", "--time-budget", "0.05")


def test_demo_runs_on_default_robot(demo):
    assert demo.returncode == 0, demo.stdout + demo.stderr
    for word in ("panda.urdf", "forward kinematics", "condition number", "steps/s"):
        assert word in demo.stdout, demo.stdout


def test_demo_aba_inverts_rnea(demo):
    assert demo.returncode == 0, demo.stdout + demo.stderr
    m = re.search(r"max \|aba\(q, v, rnea\(q, v, a\)\) - a\| = (\S+)", demo.stdout)
    assert m, demo.stdout
    assert float(m.group(1)) < 1e-8


def test_demo_prints_every_joint(demo):
    assert demo.returncode == 0, demo.stdout + demo.stderr
    for i in range(1, 8):
        assert f"panda_joint{i} " in demo.stdout, demo.stdout


def test_demo_floating_base_float32(capsys):
    rc = main(["demo", "--batch", "4", "--floating-base", "--dtype", "float32",
               "--time-budget", "0.05"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "floating base" in out and "base_wz" in out
    m = re.search(r"max \|aba\(q, v, rnea\(q, v, a\)\) - a\| = (\S+)", out)
    assert m and float(m.group(1)) < 1e-2, out


def test_demo_missing_file_exit_code_2(tmp_path):
    missing = tmp_path / "no_such_robot.urdf"
    res = run_cli("demo", "--urdf", str(missing), "--batch", "2")
    assert res.returncode == 2, res.stdout + res.stderr
    assert res.stderr.startswith("error: ")
    assert str(missing) in res.stderr
    assert "Traceback" not in res.stderr


@pytest.mark.parametrize("text", [
    "<robot name='r'><link name='a'>",                               # malformed XML
    "<robot name='r'><link name='a'/><joint name='j' type='hinge'>"  # unknown joint type
    "<parent link='a'/><child link='b'/></joint><link name='b'/></robot>",
    "this is not a URDF at all",
])
def test_demo_bad_urdf_exit_code_2(tmp_path, capsys, text):
    bad = tmp_path / "broken_robot.urdf"
    bad.write_text(text)
    rc = main(["demo", "--urdf", str(bad), "--batch", "2"])
    err = capsys.readouterr().err
    assert rc == 2, err
    assert err.startswith("error: ")
    assert "broken_robot.urdf" in err


def test_no_subcommand_is_a_usage_error():
    res = run_cli()
    assert res.returncode == 2
    assert "usage:" in res.stderr


@pytest.mark.parametrize("robot", ["panda_description/urdf/panda.urdf", "ur_description/urdf/ur5_robot.urdf",
                                   "diffsim_arm"])
def test_demo_reports_the_tip_of_the_longest_chain_where_pinocchio_puts_it(robot, robots_dir):
    """The demo reports the tip of the longest chain where Pinocchio puts it.

    The demo's forward-kinematics line: the link at the end of the longest chain (Panda's finger,
    UR5's tool0, the project arm's ee_link, not the base), at Pinocchio's frame placement of it for
    a random configuration.
    """
    import numpy as np
    import pinocchio as pin
    import torch

    from conftest import REPO_ROOT
    from diffsim_ros import physics
    from diffsim_ros.dynamics_demo import tip_position

    path = str(REPO_ROOT / "urdf" / "diffsim_arm.urdf") if robot == "diffsim_arm" else str(robots_dir / robot)
    model = physics.load_urdf(path, dtype=torch.float64)
    q = torch.rand(model.nq, dtype=torch.float64, generator=torch.Generator().manual_seed(3)) - 0.5
    name, p = tip_position(model, physics.forward_kinematics(model, q[None])[0])
    assert name == {"diffsim_arm": "ee_link", "panda_description/urdf/panda.urdf": "panda_rightfinger",
                    "ur_description/urdf/ur5_robot.urdf": "tool0"}[robot]
    pm = pin.buildModelFromUrdf(path)          # without its mimic option: every joint set from q_full
    data = pm.createData()
    qp = pin.neutral(pm)
    q_full = model.full_configuration(q)       # the Panda's second finger follows the first (mimic)
    for j, jn in enumerate(model.full_joint_names):
        qp[pm.idx_qs[pm.getJointId(jn)]] = float(q_full[j])
    pin.framesForwardKinematics(pm, data, qp)
    np.testing.assert_allclose(p, data.oMf[pm.getFrameId(name)].translation, atol=1e-9)
