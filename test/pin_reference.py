"""Pinocchio side of the dynamics cross-checks (not a test module itself).

Pinocchio (``pin`` on PyPI) is the reference nobody in this project wrote.
Its joint order may differ from ours and its continuous joints use two
coordinates (cos θ, sin θ), so everything here maps by joint *name*:

* our ``q`` -> Pinocchio's ``q`` (continuous joints become (cos, sin));
* our ``v`` order <-> Pinocchio's ``v`` order (a permutation, ``v_index``);
* link poses are Pinocchio's BODY frames of the same names.

For a floating base both sides use the free-flyer convention: q starts with
``x y z qx qy qz qw`` and v with ``v_lin v_ang`` in the body frame, so the
first 7 / 6 entries are copied unchanged.

A URDF with ``<mimic>`` joints (the panda's second finger) is read with
Pinocchio's ``mimic=True`` (JointModelMimic: the mimic joint is no coordinate), as
ours couples them. Pinocchio 4 runs FK, rnea and crba on such a model but not aba
or the ABA derivatives; there the reference is M⁻¹(τ − nle) from Pinocchio's crba
and rnea, and its central finite differences. (Its crba there needs a fresh Data
per call: see ``_crba_pin``.)
"""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from typing import List, Optional, Sequence

import numpy as np

try:  # the tests import this module; they skip cleanly when pin is absent
    import pinocchio as pin
except ImportError:  # pragma: no cover - exercised only without the peer
    pin = None

ERD_SUFFIX = os.path.join("cmeel.prefix", "share", "example-robot-data", "robots")
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def example_robot_data_dir() -> Optional[str]:
    """Find the example-robot-data ``robots`` folder on sys.path, or return None."""
    for entry in sys.path:
        candidate = os.path.join(entry, ERD_SUFFIX)
        if os.path.isdir(candidate):
            return candidate
    return None


def example_robot_data_share() -> Optional[str]:
    """``.../cmeel.prefix/share``: where package:// URIs of those URDFs resolve."""
    robots = example_robot_data_dir()
    return None if robots is None else os.path.dirname(os.path.dirname(robots))


# A small synthetic tree that the robots above lack: continuous joints
# (Pinocchio's two-coordinate RUB joints), axes off the coordinate axes, a
# prismatic joint, two branches, a fixed child with its own inertia, rotated
# joint origins and off-diagonal inertias with offset centres of mass.
def _inertial(m, xyz, rpy, ixx, iyy, izz, ixy, ixz, iyz):
    return ('<inertial><origin xyz="%s" rpy="%s"/><mass value="%g"/>'
            '<inertia ixx="%g" iyy="%g" izz="%g" ixy="%g" ixz="%g" iyz="%g"/></inertial>'
            % (xyz, rpy, m, ixx, iyy, izz, ixy, ixz, iyz))


TREE_URDF = """<?xml version="1.0"?>
<robot name="continuous_tree">
  <link name="base">%s</link>
  <link name="l1">%s</link>
  <link name="l2">%s</link>
  <link name="l3">%s</link>
  <link name="l4">%s</link>
  <link name="l4_tip">%s</link>
  <link name="marker"/>
  <joint name="c1" type="continuous">
    <parent link="base"/><child link="l1"/>
    <origin xyz="0.1 0 0.2" rpy="0.3 -0.2 0.5"/><axis xyz="0 0 1"/>
  </joint>
  <joint name="c2" type="continuous">
    <parent link="l1"/><child link="l2"/>
    <origin xyz="0 0.3 0.05" rpy="0 0.4 0"/><axis xyz="0.6 0 0.8"/>
  </joint>
  <joint name="p3" type="prismatic">
    <parent link="base"/><child link="l3"/>
    <origin xyz="-0.1 0.05 0" rpy="0.1 0.2 0.3"/><axis xyz="0 0.8 -0.6"/>
    <limit lower="-0.2" upper="0.3" effort="50" velocity="1"/>
  </joint>
  <joint name="r4" type="revolute">
    <parent link="l3"/><child link="l4"/>
    <origin xyz="0.2 0 -0.1" rpy="-0.5 0 0.2"/><axis xyz="1 0 0"/>
    <limit lower="-2" upper="1.5" effort="20" velocity="3"/>
  </joint>
  <joint name="f5" type="fixed">
    <parent link="l4"/><child link="l4_tip"/>
    <origin xyz="0.25 0.02 0" rpy="0 0 1.2"/>
  </joint>
  <joint name="f6" type="fixed">
    <parent link="l2"/><child link="marker"/>
    <origin xyz="0 0 0.3" rpy="0.7 0 0"/>
  </joint>
</robot>
""" % (
    _inertial(2.0, "0.01 0.02 0.03", "0 0 0", 0.02, 0.03, 0.04, 0.001, -0.002, 0.0015),
    _inertial(1.2, "0.05 0.1 0", "0.2 0.1 0", 0.01, 0.012, 0.008, 0.0005, 0.0, -0.001),
    _inertial(0.7, "0 0 0.15", "0 0 0.3", 0.005, 0.006, 0.002, 0.0, 0.0004, 0.0),
    _inertial(0.9, "0.1 0 0", "0 0 0", 0.003, 0.009, 0.009, 0.0, 0.0, 0.0),
    _inertial(0.5, "0.1 0.01 -0.02", "0.3 0 0", 0.001, 0.004, 0.004, 0.0002, 0.0, 0.0),
    _inertial(0.3, "0 0 0.02", "0 0.5 0", 0.0008, 0.0008, 0.0005, 0.0, 0.0, 0.0001),
)


def tree_urdf_path() -> str:
    """TREE_URDF written to a file once (Pinocchio's URDF reader wants a path)."""
    import tempfile
    path = os.path.join(tempfile.gettempdir(), "diffsim_ros_test_continuous_tree_%d.urdf" % os.getpid())
    if not os.path.isfile(path):
        import atexit
        with open(path, "w") as fh:
            fh.write(TREE_URDF)
        atexit.register(lambda: os.path.exists(path) and os.remove(path))
    return path


@dataclass(frozen=True)
class RobotCase:
    name: str
    relpath: str          # under example-robot-data/robots, or under the repo root
    floating: bool
    project: bool = False  # one of the project's own URDFs (urdf/*.urdf)

    def path(self) -> Optional[str]:
        if self.relpath == "<tree>":
            return tree_urdf_path()
        if self.project:
            return os.path.join(REPO_ROOT, self.relpath)
        robots = example_robot_data_dir()
        return None if robots is None else os.path.join(robots, self.relpath)


ROBOTS: List[RobotCase] = [
    RobotCase("panda", "panda_description/urdf/panda.urdf", floating=False),
    RobotCase("ur5", "ur_description/urdf/ur5_robot.urdf", floating=False),
    RobotCase("solo12", "solo_description/robots/solo12.urdf", floating=True),
    RobotCase("double_pendulum", "double_pendulum_description/urdf/double_pendulum.urdf", floating=False),
    RobotCase("diffsim_arm", "urdf/diffsim_arm.urdf", floating=False, project=True),
    RobotCase("diffsim_quadruped", "urdf/diffsim_quadruped.urdf", floating=True, project=True),
    RobotCase("diffsim_quadrotor", "urdf/diffsim_quadrotor.urdf", floating=True, project=True),
    RobotCase("tree_continuous", "<tree>", floating=False, project=True),
    RobotCase("tree_continuous_floating", "<tree>", floating=True, project=True),
]
ROBOTS_BY_NAME = {case.name: case for case in ROBOTS}


def robot_path(name: str) -> str:
    """Return the URDF of a robot of ROBOTS, for a test.

    Skips when example-robot-data is not installed; fails when a project URDF is missing (they
    are part of the package).
    """
    import pytest
    case = ROBOTS_BY_NAME[name]
    if not case.project and example_robot_data_dir() is None:
        pytest.skip("example-robot-data (pip package 'example-robot-data') is not installed: "
                    "no %s on sys.path" % ERD_SUFFIX)
    path = case.path()
    if not os.path.isfile(path):
        pytest.fail("%s: %s is missing" % (name, path))
    return path


def load_ours(name: str, dtype=None, device="cpu"):
    """Our model of a robot of ROBOTS (float64 unless dtype says otherwise)."""
    import torch
    from diffsim_ros import physics
    share = example_robot_data_share()
    return physics.load_urdf(robot_path(name), floating_base=ROBOTS_BY_NAME[name].floating,
                             dtype=torch.float64 if dtype is None else dtype, device=device,
                             package_dirs=[share] if share else None,
                             collision=False)  # dynamics needs no collision meshes


def rel_err(ours: np.ndarray, ref: np.ndarray, event_dims: int = 1) -> np.ndarray:
    """Per-sample relative error ``|ours - ref| / max(|ref|, 1)``.

    The Frobenius norm is over the last ``event_dims`` dimensions.
    """
    ours = np.asarray(ours, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    assert ours.shape == ref.shape, (ours.shape, ref.shape)
    axes = tuple(range(ref.ndim - event_dims, ref.ndim))
    diff = np.sqrt(np.sum((ours - ref) ** 2, axis=axes))
    scale = np.maximum(np.sqrt(np.sum(ref ** 2, axis=axes)), 1.0)
    return diff / scale


def symmetrised(upper: np.ndarray) -> np.ndarray:
    """Pinocchio's crba fills only the upper triangle; mirror it."""
    return np.triu(upper) + np.triu(upper, 1).T


def free_flyer_integrate_jacobian(q_base: np.ndarray) -> np.ndarray:
    """Compute d q(δ) / d δ at δ = 0 for Pinocchio's free flyer, q(δ) = pin.integrate(q, δ).

    q = (p, quat xyzw), δ = (δ_lin, δ_ang) in the body frame:
    p(δ) = p + R δ_lin + O(δ²), quat(δ) = quat ⊗ (δ_ang / 2, 1) + O(δ²).
    Returns the (7, 6) coefficient-wise Jacobian.
    """
    x, y, z, w = q_base[3:7]
    rot = pin.Quaternion(w, x, y, z).toRotationMatrix()  # pin.Quaternion takes (w, x, y, z)
    jac = np.zeros((7, 6))
    jac[0:3, 0:3] = rot
    jac[3:7, 3:6] = 0.5 * np.array([
        [w, -z, y],
        [z, w, -x],
        [-y, x, w],
        [-x, -y, -z],
    ])
    return jac


class PinReference:
    """A Pinocchio model of one URDF with the name-based map to our ordering.

    ``joint_names`` and ``link_names`` are ours (model.joint_names,
    model.link_names); ``nq``/``nv`` are ours as well.
    """

    def __init__(self, urdf_path: str, floating: bool, joint_names: Sequence[str],
                 link_names: Sequence[str]):
        if pin is None:  # pragma: no cover
            raise RuntimeError("pinocchio (pip package 'pin') is not installed")
        with open(urdf_path, encoding="utf-8") as fh:
            self.mimic = "<mimic" in fh.read()
        if floating:
            self.model = pin.buildModelFromUrdf(urdf_path, pin.JointModelFreeFlyer(), mimic=self.mimic)
        else:
            self.model = pin.buildModelFromUrdf(urdf_path, mimic=self.mimic)
        self.data = self.model.createData()
        self.floating = floating
        self.joint_names = list(joint_names)
        self.link_names = list(link_names)
        self.nqb = 7 if floating else 0
        self.nvb = 6 if floating else 0
        self.nq = self.nqb + len(self.joint_names)
        self.nv = self.nvb + len(self.joint_names)

        pm = self.model
        pin_joint_names = [pm.names[i] for i in range(1, pm.njoints)
                           if pm.joints[i].shortname() != "JointModelMimic"]
        if floating:
            assert pm.joints[1].shortname() == "JointModelFreeFlyer", pm.joints[1].shortname()
            assert pm.joints[1].idx_q == 0 and pm.joints[1].idx_v == 0
            pin_joint_names = pin_joint_names[1:]
        if sorted(pin_joint_names) != sorted(self.joint_names):
            raise AssertionError(
                "moving joints differ from Pinocchio's: ours only %s, Pinocchio only %s" % (
                    sorted(set(self.joint_names) - set(pin_joint_names)),
                    sorted(set(pin_joint_names) - set(self.joint_names))))
        assert pm.nv == self.nv, (pm.nv, self.nv)

        # our v index -> Pinocchio's v index; our joint k -> (Pinocchio idx_q, nq)
        self.v_index = np.arange(self.nv)
        self.q_slots = []
        for k, name in enumerate(self.joint_names):
            joint = pm.joints[pm.getJointId(name)]
            assert joint.nv == 1, (name, joint.shortname())
            assert joint.nq in (1, 2), (name, joint.shortname())
            self.q_slots.append((joint.idx_q, joint.nq))
            self.v_index[self.nvb + k] = joint.idx_v
        assert sorted(self.v_index.tolist()) == list(range(self.nv))

        self.frame_ids = []
        for link in self.link_names:
            if not pm.existFrame(link, pin.BODY):
                raise AssertionError("link %r has no Pinocchio BODY frame" % link)
            self.frame_ids.append(pm.getFrameId(link, pin.BODY))
        pin_links = sorted(f.name for f in pm.frames if f.type == pin.BODY)
        if pin_links != sorted(self.link_names):
            raise AssertionError("links differ from Pinocchio's: ours only %s, Pinocchio only %s" % (
                sorted(set(self.link_names) - set(pin_links)),
                sorted(set(pin_links) - set(self.link_names))))

    # ---- conversions (one state, numpy float64) -------------------------
    def q_to_pin(self, q: np.ndarray) -> np.ndarray:
        q = np.asarray(q, dtype=np.float64)
        out = np.zeros(self.model.nq)
        out[: self.nqb] = q[: self.nqb]
        for k, (idx, nq) in enumerate(self.q_slots):
            theta = q[self.nqb + k]
            if nq == 1:
                out[idx] = theta
            else:  # continuous joint: Pinocchio's RUBX/RUBY/RUBZ stores (cos θ, sin θ)
                out[idx], out[idx + 1] = np.cos(theta), np.sin(theta)
        return out

    def v_to_pin(self, v: np.ndarray) -> np.ndarray:
        out = np.zeros(self.nv)
        out[self.v_index] = np.asarray(v, dtype=np.float64)
        return out

    def v_from_pin(self, v_pin: np.ndarray) -> np.ndarray:
        return np.asarray(v_pin)[self.v_index]

    def mat_from_pin(self, mat: np.ndarray) -> np.ndarray:
        """Map an (nv, nv) matrix in Pinocchio's v order (rows and columns) to ours."""
        return np.asarray(mat)[np.ix_(self.v_index, self.v_index)]

    # ---- algorithms (one state) ------------------------------------------
    def fk(self, q):
        pin.framesForwardKinematics(self.model, self.data, self.q_to_pin(q))
        return np.stack([self.data.oMf[i].homogeneous for i in self.frame_ids])

    def link_jacobians(self, q):
        """Linear part of every link's frame Jacobian in world-aligned axes at the link origin.

        LOCAL_WORLD_ALIGNED, (n_links, 3, nv) with columns in our v order.
        """
        qp = self.q_to_pin(q)
        pin.computeJointJacobians(self.model, self.data, qp)
        pin.framesForwardKinematics(self.model, self.data, qp)
        return np.stack([pin.getFrameJacobian(self.model, self.data, i, pin.LOCAL_WORLD_ALIGNED)[0:3][:, self.v_index]
                         for i in self.frame_ids])

    def rnea(self, q, v, a):
        return self.v_from_pin(pin.rnea(self.model, self.data, self.q_to_pin(q),
                                        self.v_to_pin(v), self.v_to_pin(a)))

    def _crba_pin(self, qp):
        # Pinocchio 4.1's crba with mimic joints leaves entries of an earlier call in a
        # reused Data (seen on test_mimic's tree): a fresh Data each time there.
        data = self.model.createData() if self.mimic else self.data
        return symmetrised(pin.crba(self.model, data, qp))

    def crba(self, q):
        return self.mat_from_pin(self._crba_pin(self.q_to_pin(q)))

    def aba(self, q, v, tau):
        qp, vp, tp = self.q_to_pin(q), self.v_to_pin(v), self.v_to_pin(tau)
        if self.mimic:  # Pinocchio's aba has no mimic joints: solve its own M and nle
            M = self._crba_pin(qp)
            return self.v_from_pin(np.linalg.solve(M, tp - pin.nonLinearEffects(self.model, self.data, qp, vp)))
        return self.v_from_pin(pin.aba(self.model, self.data, qp, vp, tp))

    def aba_derivatives(self, q, v, tau):
        """(ddq_dq, ddq_dv, Minv) in our v order, rows and columns.

        ddq_dq is Pinocchio's: with respect to the tangent perturbation
        q ⊕ δ (pin.integrate), δ in our v order.
        """
        if self.mimic:  # no ABA derivatives with mimic joints: central differences of aba
            h, eye = 1e-6, np.eye(self.nv)
            dq = np.stack([(self.aba(self.integrate(q, h * e), v, tau)
                            - self.aba(self.integrate(q, -h * e), v, tau)) / (2 * h) for e in eye], 1)
            dv = np.stack([(self.aba(q, v + h * e, tau) - self.aba(q, v - h * e, tau)) / (2 * h) for e in eye], 1)
            return dq, dv, np.linalg.inv(self.crba(q))
        ddq_dq, ddq_dv, minv = pin.computeABADerivatives(
            self.model, self.data, self.q_to_pin(q), self.v_to_pin(v), self.v_to_pin(tau))
        return (self.mat_from_pin(ddq_dq), self.mat_from_pin(ddq_dv),
                self.mat_from_pin(symmetrised(minv)))

    def integrate(self, q, delta):
        """Pinocchio's q ⊕ δ for the free-flyer part, joints added plainly (our q order).

        Only for models without continuous joints (where q_to_pin is not invertible
        by slicing).
        """
        assert all(nq == 1 for _, nq in self.q_slots)
        qp = pin.integrate(self.model, self.q_to_pin(q), self.v_to_pin(delta))
        out = np.array(q, dtype=np.float64)
        out[: self.nqb] = qp[: self.nqb]
        for k, (idx, _) in enumerate(self.q_slots):
            out[self.nqb + k] = qp[idx]
        return out

    # ---- batched helpers --------------------------------------------------
    def batch(self, fn, *arrays):
        return np.stack([fn(*row) for row in zip(*arrays)])


def random_states(lower: np.ndarray, upper: np.ndarray, floating: bool, n: int, seed: int):
    """Draw n random states in our ordering (numpy float64).

    q: joint positions uniform within [lower, upper], or [-π, π] where a limit
    is infinite (continuous joints); for a floating base a position ~ N(0, 1)
    and a uniformly random unit quaternion (x, y, z, w).
    v, a: ~ N(0, 1) (rad/s, m/s; rad/s², m/s²).
    """
    rng = np.random.default_rng(seed)
    lower = np.asarray(lower, dtype=np.float64)
    upper = np.asarray(upper, dtype=np.float64)
    nj = lower.shape[0]
    lo = np.where(np.isfinite(lower), lower, -np.pi)
    hi = np.where(np.isfinite(upper), upper, np.pi)
    qj = lo + (hi - lo) * rng.random((n, nj))
    if floating:
        pos = rng.standard_normal((n, 3))
        quat = rng.standard_normal((n, 4))
        quat /= np.linalg.norm(quat, axis=1, keepdims=True)
        q = np.concatenate([pos, quat, qj], axis=1)
    else:
        q = qj
    nv = nj + (6 if floating else 0)
    v = rng.standard_normal((n, nv))
    a = rng.standard_normal((n, nv))
    return q, v, a
