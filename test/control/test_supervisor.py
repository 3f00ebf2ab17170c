"""The safety supervisor (diffsim_ros/control/supervisor.py) against hostile state sequences, without DDS.

A property-based test (hypothesis) draws sequences of events: valid states (joints in any
order, extra joints with NaN as joint_state_broadcaster publishes them), hostile ones (NaN,
inf, 1e30, out of limits, too fast, wrong array lengths, repeated or missing names, bad
frames, non-unit quaternions, the default Odometry message, stamps backwards, in 1970 or in
the future), bursts, silences longer than the watchdog timeout, IMU faults, a policy that
raises or returns NaN, failed predictions, emergency stops and resets at random times. After
every event the supervisor ticks once (one control period) and the tick is checked against:

- the limits of the robot read independently from its URDF (urdf_parser_py): every command
  finite and within them;
- a reference model of the rules written here from the issue's statement: after a bad state
  (or an exception, a stale state, an e-stop) the very next tick is the safe command, and it
  stays latched until ``recover_states`` new valid states or a reset / e-stop release (after a
  restart, the node's clock jumping back, until a reset or e-stop release alone); valid
  states are never refused;
- the safe command of an arm holds exactly the last *valid* measured position (clamped);
- a policy command equals an independent PolicyRunner's command on the same state given in
  the robot's own joint order (so a reordered message gives the ordered message's command).

Hypothesis prints the failing sequence and a reproduction blob (print_blob).
"""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from urdf_parser_py.urdf import URDF

from builders import make_checkpoint
from conftest import REPO_ROOT

from diffsim_ros.control import (ImuIn, JointStateIn, OdometryIn, Supervisor, SupervisorConfig,
                                 SupervisorConfigError)
from diffsim_ros.learning.deploy import PolicyRunner


EXAMPLES = 500          # per robot: 1,000 hostile sequences in all
RECOVER = 3
TIMEOUT_S = 0.1
CLOCK0 = 1_764_000_000 * 10 ** 9      # the node's clock at the start of a sequence (a 2025 wall time)
TARGET = [0.2, 0.1, 0.35]
SKEW_S = SupervisorConfig().max_stamp_skew_s


@pytest.fixture(scope="module")
def arm(tmp_path_factory):
    d = tmp_path_factory.mktemp("arm")
    make_checkpoint("reach_arm", d)
    return PolicyRunner(d), PolicyRunner(d)


@pytest.fixture(scope="module")
def quad(tmp_path_factory):
    d = tmp_path_factory.mktemp("quad")
    make_checkpoint("hover", d)
    return PolicyRunner(d), PolicyRunner(d)


def urdf_limits(path: Path, joints):
    """(lower, upper, velocity) of ``joints`` straight from the URDF file."""
    robot = URDF.from_xml_string(Path(path).read_text())
    by = {j.name: j for j in robot.joints}
    lo, hi, vel = [], [], []
    for n in joints:
        j = by[n]
        if j.type == "continuous" or j.limit is None:
            lo.append(-math.inf), hi.append(math.inf)
        else:
            lo.append(j.limit.lower), hi.append(j.limit.upper)
        vel.append(j.limit.velocity if j.limit is not None else 0.0)
    return np.array(lo), np.array(hi), np.array(vel)


# ---------------------------------------------------------------------- events
ARM_BAD = ["nan_pos", "inf_vel", "huge_pos", "out_of_limits", "too_fast", "len_pos", "len_vel", "len_eff",
           "dup_name", "stamp_back", "stamp_future", "stamp_1970"]
QUAD_BAD = ["nan_pos", "inf_vel", "huge_pos", "huge_vel", "huge_rate", "quat_norm", "quat_zero", "default_msg",
            "frame_empty", "frame_wrong", "child_wrong", "len_pos", "stamp_back", "stamp_future", "stamp_1970"]
OTHER = ["silence", "estop_on", "estop_off", "reset", "policy_nan", "policy_raise", "predict_fail", "restart"]


def events(bad, extra=()):
    # About 40 % valid states, so that the policy recovers often and its commands are checked too.
    hostile = list(bad) + list(extra) + OTHER
    kind = st.sampled_from(["valid"] * (2 * len(hostile) // 3) + ["burst", "repeat"] + hostile)
    unit = st.lists(st.floats(0.0, 1.0), min_size=16, max_size=16)
    dt = st.floats(0.001, 0.02)
    return st.lists(st.tuples(kind, unit, dt), min_size=8, max_size=32)


class Reference:
    """The supervisor's rules restated from the issue (not from the code): what each tick must be."""

    def __init__(self, timeout_s=TIMEOUT_S, recover=RECOVER):
        self.timeout_s, self.recover = timeout_s, recover
        self.latched = False
        self.good = 0
        self.until_reset = False        # the robot restarted (its clock jumped back): only a reset clears
        self.estop = False
        self.last_stamp = None
        self.last_time = None
        self.hold = None

    def bad(self):
        self.latched, self.good = True, 0

    def accepted(self, stamp, now, q, new):
        if new and self.latched:
            self.good += 1
            if self.good >= self.recover and not self.until_reset:
                self.latched, self.good = False, 0
        self.last_stamp, self.last_time, self.hold = stamp, now, q

    def expect(self, now):
        """'policy', 'safe' or 'none' (no state yet: nothing sent)."""
        if self.estop or self.latched:
            return "safe"
        if self.last_time is None:
            return "none"
        if now - self.last_time > self.timeout_s * 1e9:
            self.bad()
            return "safe"
        return "policy"


class Harness:
    """A supervisor with a policy that can be made to fail, its clocks, and the checks."""

    def __init__(self, runners, kind, timeout_s=TIMEOUT_S, recover=RECOVER):
        self.runner, self.ref = runners
        self.kind = kind
        self.fail = None
        cfg = SupervisorConfig(state_timeout_s=timeout_s, recover_states=recover, safe_thrust=3.0)
        self.sup = Supervisor(self.runner, cfg, policy=self._policy)
        if kind == "arm":
            self.sup.set_target(TARGET)
        self.model = Reference(timeout_s, recover)
        self.now = 10 ** 9
        self.clock = CLOCK0
        r = self.runner
        if kind == "arm":
            lo, hi, vel = urdf_limits(REPO_ROOT / "urdf" / "diffsim_arm.urdf", r.joint_names)
            self.q_lo, self.q_hi, self.v_lim = lo, hi, vel
            act = [r.joint_names.index(j) for j in r.actuated_joints]
            self.cmd_lo, self.cmd_hi = lo[act], hi[act]
        else:
            n_rot = r.sim.rotors.n
            t_max = r.sim.rotors.cfg.max_thrust
            rate = r.task.max_rate
            self.cmd_lo = np.array([0.0, -rate, -rate, -rate])
            self.cmd_hi = np.array([n_rot * t_max, rate, rate, rate])
        self.ticks = 0

    def _policy(self, state, target):
        d = self.runner.decide(state, target, predict=False)
        if self.fail == "policy_nan":
            d.command = np.full_like(d.command, np.nan)
        elif self.fail == "policy_raise":
            raise RuntimeError("the policy failed")
        return d

    # ---------------------------------------------------------------- messages
    def valid_arm(self, u, stamp):
        r = self.runner
        n = len(r.joint_names)
        lo = np.where(np.isfinite(self.q_lo), self.q_lo, -3.0)
        hi = np.where(np.isfinite(self.q_hi), self.q_hi, 3.0)
        q = lo + (0.05 + 0.9 * np.array(u[:n])) * (hi - lo)
        vb = np.where(self.v_lim > 0, self.v_lim, 1.0)
        v = (2 * np.array(u[n:2 * n]) - 1) * 5.0 * vb     # the stand-in exceeds URDF limits (see SupervisorConfig)
        perm = np.argsort(np.array(u[2 * n:3 * n]))        # any order
        names = [r.joint_names[i] for i in perm] + ["gripper_finger"]
        pos = list(q[perm]) + [float("nan")]                # an extra joint the robot does not have
        vel = list(v[perm]) + [float("nan")]
        eff = [] if u[15] < 0.5 else list(np.zeros(n + 1))
        return JointStateIn(names, pos, vel, eff, stamp), q, v

    def valid_quad(self, u, stamp):
        p = np.array([4 * u[0] - 2, 4 * u[1] - 2, 0.2 + 2.8 * u[2]])
        quat = np.array(u[3:7]) - 0.5
        quat = quat / np.linalg.norm(quat) if np.linalg.norm(quat) > 1e-3 else np.array([0, 0, 0, 1.0])
        vl = (np.array(u[7:10]) - 0.5) * 4
        w = (np.array(u[10:13]) - 0.5) * 4
        return OdometryIn(list(p), list(quat), list(vl), list(w), stamp, "world", "base_link"), (p, quat, vl, w)

    def hostile(self, kind, u, stamp):
        """Build a bad message of ``kind`` (from a valid one)."""
        if self.kind == "arm":
            js, q, v = self.valid_arm(u, stamp)
            pos, vel, eff, names = list(js.position), list(js.velocity), list(js.effort), list(js.names)
            i = int(u[14] * (len(q) - 1e-9))
            j = names.index(self.runner.joint_names[i])
            if kind == "nan_pos":
                pos[j] = float("nan")
            elif kind == "inf_vel":
                vel[j] = float("inf") if u[13] < 0.5 else -float("inf")
            elif kind == "huge_pos":
                pos[j] = 1e30
            elif kind == "out_of_limits":
                hi = self.q_hi[i] if np.isfinite(self.q_hi[i]) else None
                if hi is None:            # a continuous joint: use the velocity rule instead
                    vel[j] = 1e6
                else:
                    pos[j] = hi + 0.1 + 0.05 + u[13]
            elif kind == "too_fast":
                vel[j] = 10.0 * max(self.v_lim[i], 20.0) * (1 if u[13] < 0.5 else -1)
            elif kind == "len_pos":
                pos = pos[:-2]
            elif kind == "len_vel":
                vel = vel + [0.0]
            elif kind == "len_eff":
                eff = [0.0] * (len(names) + 1)
            elif kind == "dup_name":
                names[-1] = names[0]
            return JointStateIn(names, pos, vel, eff, stamp)
        od, _ = self.valid_quad(u, stamp)
        p, o, vl, w = list(od.position), list(od.orientation), list(od.linear), list(od.angular)
        k = int(u[14] * 2.999)
        if kind == "nan_pos":
            p[k] = float("nan")
        elif kind == "inf_vel":
            vl[k] = float("inf")
        elif kind == "huge_pos":
            p[k] = 1e30 if u[13] < 0.5 else -1e30
        elif kind == "huge_vel":
            vl[k] = 1e30
        elif kind == "huge_rate":
            w[k] = 1e30
        elif kind == "quat_norm":
            o = [x * (0.5 if u[13] < 0.5 else 2.0) for x in o]
        elif kind == "quat_zero":
            o = [0.0, 0.0, 0.0, 0.0]
        elif kind == "default_msg":
            return OdometryIn([0.0] * 3, [0.0, 0.0, 0.0, 1.0], [0.0] * 3, [0.0] * 3, 0, "", "")
        elif kind == "frame_empty":
            return OdometryIn(p, o, vl, w, stamp, "", "base_link")
        elif kind == "frame_wrong":
            return OdometryIn(p, o, vl, w, stamp, "map", "base_link")
        elif kind == "child_wrong":
            return OdometryIn(p, o, vl, w, stamp, "world", "imu_link")
        elif kind == "len_pos":
            p = p[:2]
        return OdometryIn(p, o, vl, w, stamp, "world", "base_link")

    def send(self, msg):
        if self.kind == "arm":
            return self.sup.on_joint_state(msg, self.now, self.clock)
        return self.sup.on_odometry(msg, self.now, self.clock)

    # ---------------------------------------------------------------- one event
    def event(self, kind, u, dt):
        m = self.model
        self.fail = None
        if kind == "silence":
            dt = TIMEOUT_S + 0.05 + 0.3 * u[0]
        self.now += int(dt * 1e9)
        self.clock += int(dt * 1e9)
        fresh = self.clock - int(0.0005e9 * u[12])          # a stamp a little before the clock
        if m.last_stamp is not None:
            fresh = max(fresh, m.last_stamp + 1)
        if kind in ("valid", "burst"):
            for k in range(1 if kind == "valid" else 2 + int(u[11] * 4)):
                stamp = fresh + k
                msg, *vals = (self.valid_arm(u, stamp) if self.kind == "arm" else self.valid_quad(u, stamp))
                v = self.send(msg)
                assert v.accepted and not v.repeat, v.reason
                m.accepted(stamp, self.now, vals[0] if self.kind == "arm" else None, True)
            self.expect_reference(u)
        elif kind == "repeat":
            if m.last_stamp is None:
                return self.tick_and_check()
            msg, *vals = (self.valid_arm(u, m.last_stamp) if self.kind == "arm" else self.valid_quad(u, m.last_stamp))
            v = self.send(msg)
            if self.clock - m.last_stamp > SKEW_S * 1e9:       # a re-publication too old for the clock
                assert not v.accepted and v.fault, v
                m.bad()
                return self.tick_and_check()
            assert v.accepted and v.repeat, v.reason
            m.accepted(m.last_stamp, self.now, vals[0] if self.kind == "arm" else None, False)
            self.expect_reference(u)
        elif kind in ARM_BAD or kind in QUAD_BAD:
            stamp = fresh
            if kind == "stamp_back":
                stamp = m.last_stamp - 1_000_000 if m.last_stamp is not None else self.clock - 2 * 10 ** 9
            elif kind == "stamp_future":
                stamp = self.clock + 10 * 10 ** 9
            elif kind == "stamp_1970":
                stamp = 10 ** 9
            msg = self.hostile(kind if not kind.startswith("stamp") else "none", u, stamp)
            v = self.send(msg)
            assert not v.accepted and v.fault and v.reason, (kind, v)
            m.bad()
        elif kind == "imu_bad":
            w = [float("nan"), 0.0, 0.0] if u[0] < 0.5 else [1e30, 0.0, 0.0]
            assert not self.sup.on_imu(ImuIn(w), self.now).accepted
            m.bad()
        elif kind == "partial":
            msg, *_ = self.valid_arm(u, fresh)
            drop = self.runner.joint_names[int(u[14] * (len(self.runner.joint_names) - 1e-9))]
            keep = [i for i, n in enumerate(msg.names) if n != drop]
            v = self.send(JointStateIn([msg.names[i] for i in keep], [msg.position[i] for i in keep],
                                       [msg.velocity[i] for i in keep], [], fresh))
            assert not v.accepted and not v.fault
        elif kind == "estop_on":
            self.sup.on_estop(True, self.now)
            m.estop = True
        elif kind == "estop_off":
            self.sup.on_estop(False, self.now)
            m.estop, m.latched, m.good, m.until_reset = False, False, 0, False
        elif kind == "reset":
            self.sup.reset(self.now)
            m.latched, m.good, m.last_stamp, m.until_reset = False, 0, None, False
        elif kind in ("policy_nan", "policy_raise"):
            self.fail = kind
            exp = m.expect(self.now)
            t = self.tick()
            if exp == "policy":                # the failing policy ran: safe now, latched
                assert not t.policy and "control path" in t.reason, t.reason
                m.bad()
            else:
                self.check(t, exp)
            return
        elif kind == "predict_fail":
            self.sup.fault("prediction: FloatingPointError: non-finite acceleration", self.now)
            m.bad()
        elif kind == "restart":                # what policy_controller raises when its clock jumps back
            self.sup.fault("the clock jumped back 1.000 s", self.now, until_reset=True)
            m.bad()
            m.until_reset = True
        self.tick_and_check()

    def expect_reference(self, u):
        """After valid states: the tick, and for a policy command the independent runner's."""
        t = self.tick_and_check()
        if t is not None and t.policy:
            if self.kind == "arm":
                js, q, v = self.valid_arm(u, 0)
                want = self.ref.arm(self.ref.joint_names, q, v, target=TARGET, predict=False).command
            else:
                od, (p, quat, vl, w) = self.valid_quad(u, 0)
                want = self.ref.quadrotor(p, quat, vl, w, predict=False).command
            np.testing.assert_allclose(t.command, want, rtol=0, atol=1e-12)

    def tick(self):
        self.ticks += 1
        return self.sup.tick(self.now)

    def tick_and_check(self):
        exp = self.model.expect(self.now)
        t = self.tick()
        self.check(t, exp)
        return t

    def check(self, t, exp):
        if t.command is not None:
            c = t.command
            assert c.shape == self.cmd_lo.shape and np.isfinite(c).all(), c
            assert (c >= self.cmd_lo).all() and (c <= self.cmd_hi).all(), (c, self.cmd_lo, self.cmd_hi)
        if exp == "none":
            assert t.command is None and not t.policy, t
            return
        if exp == "policy":
            assert t.policy, f"a valid, fresh state was not answered by the policy: {t.reason}"
            return
        assert not t.policy, f"expected the safe command, got the policy's ({self.model.__dict__})"
        if self.kind == "arm":
            if self.model.hold is None:
                assert t.command is None
            else:
                r = self.runner
                act = [r.joint_names.index(j) for j in r.actuated_joints]
                want = np.clip(self.model.hold[act], self.cmd_lo, self.cmd_hi)
                np.testing.assert_array_equal(t.command, want)
        else:
            np.testing.assert_allclose(t.command, [3.0, 0.0, 0.0, 0.0])


SETTINGS = settings(max_examples=EXAMPLES, deadline=None, print_blob=True,
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


@SETTINGS
@given(seq=events(ARM_BAD, extra=["partial"]))
def test_arm_supervisor_invariants(arm, seq):
    h = Harness(arm, "arm")
    for kind, u, dt in seq:
        h.event(kind, u, dt)


@SETTINGS
@given(seq=events(QUAD_BAD, extra=["imu_bad"]))
def test_quadrotor_supervisor_invariants(quad, seq):
    h = Harness(quad, "quadrotor")
    for kind, u, dt in seq:
        h.event(kind, u, dt)


def test_a_permissive_supervisor_fails_these_checks(arm):
    """The checks can fail: a permissive supervisor accepts a 1e30 joint position.

    With the plausibility rules effectively off (huge margins and bounds), a 1e30 joint position
    is accepted and becomes the hold position; the reference model sees it.
    """
    runner, _ = arm
    loose = SupervisorConfig(position_margin=1e300, velocity_limit_factor=1e300, max_stamp_skew_s=0.0)
    sup = Supervisor(runner, loose)
    sup.set_target([0.2, 0.1, 0.35])
    n = len(runner.joint_names)
    q = np.full(n, 1e30)
    v = sup.on_joint_state(JointStateIn(runner.joint_names, q, np.zeros(n), (), CLOCK0), 0, CLOCK0)
    assert v.accepted
    # ... and with the default rules the same message is refused, naming the joint and the value.
    strict = Supervisor(runner, SupervisorConfig())
    v = strict.on_joint_state(JointStateIn(runner.joint_names, q, np.zeros(n), (), CLOCK0), 0, CLOCK0)
    assert not v.accepted and v.fault and runner.joint_names[0] in v.reason and "1e+30" in v.reason


def test_diagnostics_name_field_and_value(quad):
    runner, _ = quad
    sup = Supervisor(runner, SupervisorConfig())
    good = OdometryIn([0, 0, 1], [0, 0, 0, 1], [0, 0, 0], [0, 0, 0], CLOCK0, "world", "base_link")
    assert sup.on_odometry(good, 0, CLOCK0).accepted
    cases = [
        (OdometryIn([0, 0, 1e30], [0, 0, 0, 1], [0] * 3, [0] * 3, CLOCK0 + 1, "world", "base_link"),
         "pose.position.z is 1e+30"),
        (OdometryIn([0, 0, 1], [0, 0, 0, 0.5], [0] * 3, [0] * 3, CLOCK0 + 2, "world", "base_link"),
         "pose.orientation has norm 0.5"),
        (OdometryIn([0, 0, 1], [0, 0, 0, 1], [0] * 3, [0] * 3, CLOCK0 + 3, "odom", "base_link"),
         "header.frame_id is 'odom', expected 'world'"),
        (OdometryIn([0, 0, 1], [0, 0, 0, 1], [0] * 3, [0] * 3, CLOCK0 - 5, "world", "base_link"),
         "header.stamp went backwards"),
        (OdometryIn([0, 0, 1], [0, 0, 0, 1], [0] * 3, [0] * 3, 0, "", ""), "empty header.frame_id"),
        (OdometryIn([0, 0, 1], [0, 0, 0, 1], [0] * 3, [0] * 3, CLOCK0 + 3 * 10 ** 9, "world", "base_link"),
         "+3.000 s from the node's clock"),
    ]
    for msg, text in cases:
        v = sup.on_odometry(msg, 0, CLOCK0)
        assert not v.accepted and text in v.reason, (text, v.reason)
        assert text in sup.status(0)["last_rejection"]
    assert "latched after" in sup.status(0)["watchdog"]


def test_settings_are_checked():
    with pytest.raises(SupervisorConfigError, match="recover_states"):
        SupervisorConfig(recover_states=0)
    with pytest.raises(SupervisorConfigError, match="workspace_min"):
        SupervisorConfig(workspace_min=(0, 0, 0), workspace_max=(1, 1, -1))
    with pytest.raises(SupervisorConfigError, match=r"unknown key 'recover_state'; did you mean 'recover_states'\?"):
        SupervisorConfig.from_mapping({"recover_state": 3}, "")   # as the node reads its parameters


def test_output_converters_against_transforms3d():
    """control.outputs' converters against transforms3d.

    Roll/pitch/yaw of a quaternion built by transforms3d, and the cmd_vel_legacy setpoints
    derived from them; PX4 thrust saturates at the total maximum.
    """
    from transforms3d.euler import euler2quat

    from diffsim_ros.control import cmd_vel_legacy, px4_rates_setpoint, quat_to_rpy, rotor_speeds

    rng = np.random.default_rng(5)
    for _ in range(50):
        roll, pitch, yaw = rng.uniform(-1.2, 1.2), rng.uniform(-1.2, 1.2), rng.uniform(-3, 3)
        w, x, y, z = euler2quat(roll, pitch, yaw, "sxyz")
        np.testing.assert_allclose(quat_to_rpy(x, y, z, w), (roll, pitch, yaw), atol=1e-12)
        cmd = [rng.uniform(0, 40), *rng.uniform(-2, 2, 3)]
        r_deg, p_deg, yaw_rate, pwm = cmd_vel_legacy(cmd, (x, y, z, w), 0.1, 32.0)
        np.testing.assert_allclose([r_deg, p_deg, yaw_rate],
                                   np.degrees([roll + 0.1 * cmd[1], pitch + 0.1 * cmd[2], cmd[3]]), atol=1e-9)
        assert pwm == pytest.approx(min(cmd[0] / 32.0, 1.0) * 65535.0)
    assert px4_rates_setpoint([100.0, 0, 0, 0], 32.0)[3] == [0.0, 0.0, -1.0]
    speeds, norm = rotor_speeds([4.0, 0.0, -1.0], 1e-5, 8.0)
    np.testing.assert_allclose(speeds, [np.sqrt(4.0 / 1e-5), 0.0, 0.0])
    np.testing.assert_allclose(norm, [0.5, 0.0, 0.0])


def test_legged_pairs_joint_states_and_odometry(tmp_path):
    """A legged robot's state pairs a joint state with an odometry message.

    A legged robot's state is a joint state and an odometry message with (nearly) the same stamp;
    each half is checked by its own rules, a bad half latches, and the command is the policy's on
    the pair (an independent runner's legged()).
    """
    make_checkpoint("locomotion", tmp_path, task_options={"observation": "privileged"})
    runner, ref = PolicyRunner(tmp_path), PolicyRunner(tmp_path)
    sup = Supervisor(runner, SupervisorConfig(recover_states=2, pair_tolerance_s=0.0))
    assert not sup.base_from_imu
    names = list(runner.joint_names)
    stance = runner.task.stance.double().numpy()
    qj = np.zeros(len(names))
    qj[runner.sim.act_index.numpy()] = stance
    t = CLOCK0

    def odom(stamp, z=0.3, frame="world"):
        return OdometryIn([0.1, 0.0, z], [0, 0, 0, 1], [0.2, 0, 0], [0, 0, 0.1], stamp, frame, "base_link")

    def joints(stamp, q=qj):
        return JointStateIn(list(reversed(names)), list(q[::-1]), [0.0] * len(names), (), stamp)

    v = sup.on_odometry(odom(t), 0, t)
    assert v.pending and not v.accepted and not v.fault
    assert sup.tick(0).command is None                   # no complete state yet: nothing sent
    v = sup.on_joint_state(joints(t), 1, t)
    assert v.accepted and not v.pending
    tick = sup.tick(2)
    want = ref.legged(names, qj, np.zeros(len(names)), [0.1, 0, 0.3], [0, 0, 0, 1], [0.2, 0, 0], [0, 0, 0.1],
                      predict=False).command
    assert tick.policy
    np.testing.assert_allclose(tick.command, want, atol=1e-12, rtol=0)
    # Joints of a later step, the odometry of an earlier one: not a pair (exact stamps here).
    assert sup.on_joint_state(joints(t + 10), 3, t).pending
    # A bad half latches the safe command: hold the last accepted joint positions.
    bad = qj.copy()
    bad[0] = 1e30
    v = sup.on_joint_state(joints(t + 20, bad), 4, t)
    assert v.fault and "1e+30" in v.reason
    tick = sup.tick(5)
    assert not tick.policy
    np.testing.assert_allclose(tick.command, np.clip(stance, runner.command_low, runner.command_high))
    v = sup.on_odometry(odom(t + 30, frame="odom"), 6, t)
    assert v.fault and "frame_id" in v.reason
    # Two new good pairs recover it.
    for k in (40, 50):
        sup.on_odometry(odom(t + k), 7, t)
        assert sup.on_joint_state(joints(t + k), 7, t).accepted
    assert sup.tick(8).policy


def test_position_rate_limit_moves_commands_at_most_the_velocity_limit_per_step(arm):
    """position_rate_limit moves commands at most the velocity limit per step.

    A policy asking for a far goal at once gets commands that move each joint at most its URDF
    velocity limit (read with urdf_parser_py) x dt from the previous one, starting from the
    measured position and again after a safe command; without the setting the jump goes through.
    """
    runner, _ = arm
    n = len(runner.joint_names)
    _, _, vel = urdf_limits(REPO_ROOT / "urdf" / "diffsim_arm.urdf", runner.actuated_joints)
    step = vel * runner.dt
    far = np.clip(np.full(n, 2.0), runner.command_low, runner.command_high)

    class Far:
        command, clamped = far, False

    def run(cfg, events):
        sup = Supervisor(runner, cfg, policy=lambda state, target: Far())
        sup.set_target(TARGET)
        q, out, t = np.zeros(n), [], CLOCK0
        for e in events:
            t += int(runner.dt * 1e9)
            if e == "state":
                assert sup.on_joint_state(JointStateIn(runner.joint_names, q, np.zeros(n), (), t), t, t).accepted
            tick = sup.tick(t if e == "state" else t + 10 ** 9)       # "stale": a second without states
            out.append((tick.policy, tick.command))
        return out

    limited = run(SupervisorConfig(position_rate_limit=True, recover_states=1),
                  ["state"] * 5 + ["stale"] + ["state"] * 3)
    prev = np.zeros(n)                       # the measured position
    for policy, cmd in limited:
        if not policy:
            prev = np.zeros(n)               # after a safe command: from the measured position again
            continue
        assert np.all(np.abs(cmd - prev) <= step + 1e-12), (cmd, prev, step)
        assert np.allclose(np.abs(cmd - prev), np.minimum(np.abs(far - prev), step))
        prev = cmd
    assert not limited[5][0] and limited[6][0]
    free = run(SupervisorConfig(), ["state"] * 2)
    np.testing.assert_array_equal(free[0][1], far)           # the check can fail: unlimited, the jump is sent
    assert np.abs(far).max() > 2 * step.max()


def test_a_legged_robot_observation_pairs_joint_states_with_the_imu(tmp_path):
    """A legged robot observation pairs joint states with the IMU.

    A legged policy on the robot observation runs on /joint_states and /imu alone: odometry is
    neither needed nor used, the IMU's orientation and rates make the base, and the command is the
    policy's on that pair whatever base position and linear velocity an independent runner is given;
    a broken IMU (not a unit quaternion, a stamp going backwards) latches the safe command.
    """
    make_checkpoint("locomotion_velocity", tmp_path, gain=2.0, task_options={"observation": "robot"})
    runner, ref = PolicyRunner(tmp_path), PolicyRunner(tmp_path)
    sup = Supervisor(runner, SupervisorConfig(recover_states=2, pair_tolerance_s=0.0))
    assert sup.base_from_imu and not runner.needs_odometry
    names = list(runner.joint_names)
    qj = np.zeros(len(names))
    qj[runner.sim.act_index.numpy()] = runner.task.stance.double().numpy()
    t = CLOCK0
    tilt = [0.05, -0.02, 0.0, float(np.sqrt(1 - 0.05 ** 2 - 0.02 ** 2))]

    def imu(stamp, quat=tilt):
        return ImuIn([0.1, -0.2, 0.3], quat, [0.0, 0.0, 9.81], stamp)

    def joints(stamp):
        return JointStateIn(names, list(qj), [0.0] * len(names), (), stamp)

    v = sup.on_odometry(OdometryIn([5.0, 0, 0.3], [0, 0, 0, 1], [0.2, 0, 0], [0, 0, 0], t, "world", "base_link"),
                        0, t)
    assert v.pending and not v.fault
    assert sup.on_joint_state(joints(t), 1, t).pending       # no IMU yet: half a state
    assert sup.on_imu(imu(t), 2, t).accepted
    tick = sup.tick(3)
    assert tick.policy
    for pos, lin in (([0.0, 0.0, 0.0], [0.0, 0.0, 0.0]), ([3.0, -2.0, 0.7], [0.4, 0.1, 0.0])):
        ref.reset()
        want = ref.legged(names, qj, np.zeros(len(names)), pos, tilt, lin, [0.1, -0.2, 0.3], predict=False).command
        np.testing.assert_allclose(tick.command, want, atol=1e-12, rtol=0)
    v = sup.on_imu(imu(t + 10, [0, 0, 0, 0.5]), 4, t)
    assert v.fault and "unit quaternion" in v.reason
    assert not sup.tick(5).policy
    v = sup.on_imu(imu(t - 10), 6, t)
    assert v.fault and "backwards" in v.reason
    for k in (40, 50):
        sup.on_joint_state(joints(t + k), 7, t)
        assert sup.on_imu(imu(t + k), 7, t).accepted
    assert sup.tick(8).policy
