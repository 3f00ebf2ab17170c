"""System identification on truths it was not tuned to.

Every run draws the stand-in's perturbation from ranges with a fresh seed (printed; replay one
with ``DIFFSIM_SYSID_SEED=<seed>``), records the MuJoCo stand-in under exciting commands, and
calibrates. Each parameter the verdict calls identifiable must come back within 5 % of the
drawn truth (latency within 0.15 control steps) and the held-out RMSE must fall at least 5x;
unmodelled physics (a wind force, a payload at an offset) must end in "fit rejected".

The truths are the registry's reading of the perturbation (``physics.registry.
from_perturbation``), an independent statement of what the plant was given.
"""
from __future__ import annotations



import numpy as np
import pytest
import torch

from conftest import drawn_away, drawn_seed

pytest.importorskip("rosbags")
pytest.importorskip("mujoco")

from diffsim_ros import cli, config, physics  # noqa: E402
from diffsim_ros.analysis import calibrate, read_bag, sim_setup  # noqa: E402
from diffsim_ros.testing.recordings import exciter, make_plant, record_bag, standard_params  # noqa: E402
from diffsim_ros.physics.registry import from_perturbation  # noqa: E402
from diffsim_ros.analysis.sysid import convergence_line  # noqa: E402

FAST = dict(window=3, max_starts=32, max_iter=12)
STEPS = 300


def record_standard(kind, path, pert, steps, seed, predictions=False, joint_friction=True):
    """Make the standard recording.

    The arm keeps its URDF joint friction (the stand-in applies it as the simulator does:
    doc/friction.md) and runs without the drives' velocity limits, which config/reach_arm.yaml
    turns on: with them a drawn torque lag (applied after the torque-speed window) made the
    four-parameter arm fit fail (seed 2388841268: rejected, passing without them; exact with them
    too since the lag's share of the PD gains became implicit). And with the tangent-only servo
    step (servo_iterations 0), as before config/reach_arm.yaml turned 4 on.
    """
    params = standard_params(kind)
    if kind == "arm":
        params["simulator"].update(velocity_limits=False, servo_iterations=0, joint_friction=joint_friction)
    record_bag(path, make_plant(params, pert), exciter(params, seed), steps, params, predictions=predictions)


def _seed(name: str) -> int:
    return drawn_seed(name, "DIFFSIM_SYSID_SEED")



def _log_away(rng, lo, hi):
    """Draw a factor log-uniformly in [lo, hi], away from 1.

    Within e^0.3 of 1 it becomes the nearer end (a perturbation to find).
    """
    x = float(np.exp(rng.uniform(np.log(lo), np.log(hi))))
    if abs(np.log(x)) < 0.3:
        x = hi if x > 1 else lo
    return x


def _draw(rng, kind: str, names):
    pert = {}
    for n in names:
        if n == "mass_scale":
            pert[n] = drawn_away(rng, 0.7, 1.3, 1.0, 0.08)
        elif n == "joint_friction":
            pert["joint_friction_scale"] = _log_away(rng, 0.4, 2.5)
        elif n == "drag_scale":
            pert[n] = drawn_away(rng, 0.5, 2.5, 1.0, 0.3)
        elif n == "joint_damping_scale":
            pert[n] = _log_away(rng, 0.3, 3.0)
        elif n == "motor_time_constant":
            pert["actuator_lag"] = drawn_away(rng, 0.02, 0.08, 0.02, 0.01)
        elif n == "actuator_lag":
            # Up to 0.06 s. It was 0.018 s while the replay's estimate of the lagged torque at a
            # window's start diverged from about 0.017 s with a low damping (the true values then
            # left 3 % of the velocity change unexplained: seed 3646889006, damping 0.320 for 0.302).
            pert["actuator_lag"] = float(rng.uniform(0.008, 0.06))
        elif n == "thrust_scale":
            pert[n] = drawn_away(rng, 0.85, 1.1, 1.0, 0.04)
        elif n == "latency":
            # 0-3 control steps of 20 ms among other parameters, 1-3 alone (0 alone is no
            # perturbation). (The arm's were 1-2 while 3 steps with a 0.025 s lag landed at 2.9,
            # before the lagged-torque estimate was fixed.)
            pert["latency"] = 0.02 * int(rng.integers(0 if len(names) > 1 else 1, 4))
    return pert


def _fit(tmp_path, kind, pert, names, seed, joint_friction=True, **options):
    """Fit ``names`` on a recording of ``pert`` with the tests' settings.

    Returns (result, truth) of ``names`` fitted with the tests' settings (``options``:
    calibrate's others) on a recording of ``pert``.
    """
    record_standard(kind, tmp_path / "bag", pert, steps=STEPS, seed=seed % 1000, predictions=False,
                    joint_friction=joint_friction)
    data = read_bag(tmp_path / "bag")
    setup = sim_setup(data)
    r = calibrate(data, setup, names, **FAST, **options)
    truth = from_perturbation(physics.build_system(setup.model, setup.sim_config), pert)
    print(f"perturbation {pert}")
    print("| parameter | truth | recovered | std | identifiable |")
    for n in names:
        print(f"| {n} | {[round(x, 4) for x in truth[n].tolist()]} | {[round(x, 4) for x in r.fitted[n]]} | "
              f"{[float(f'{x:.2g}') for x in r.std[n]]} | {n not in r.unidentifiable} |")
    print(f"held-out RMSE {r.heldout['before']['rmse']:.4g} -> {r.heldout['after']['rmse']:.4g} "
          f"({r.heldout['improvement']:.1f}x), verdict {r.verdict} {r.reasons}, {r.seconds:.1f} s")
    return r, truth


def _check(r, truth, names):
    assert r.accepted, r.reasons
    checked = 0
    for n in names:
        if n in r.unidentifiable:
            continue
        for fitted, true in zip(r.fitted[n], truth[n].tolist()):
            if n == "latency":
                assert abs(fitted - true) < 0.15, (n, fitted, true)
            else:
                assert fitted == pytest.approx(true, rel=0.05), (n, fitted, true)
        checked += 1
    assert checked >= max(1, len(names) - 1), r.unidentifiable       # the excitation identifies the rest
    assert r.heldout["improvement"] >= 5.0, r.heldout


@pytest.mark.parametrize("kind, pool", [
    ("quadrotor", ["mass_scale", "drag_scale", "thrust_scale", "motor_time_constant", "latency"]),
    ("arm", ["mass_scale", "joint_damping_scale", "joint_friction", "latency"]),
])
def test_sysid_recovers_one_drawn_parameter(tmp_path, kind, pool):
    seed = _seed(f"one {kind} parameter")
    rng = np.random.default_rng(seed)
    name = pool[int(rng.integers(len(pool)))]
    r, truth = _fit(tmp_path, kind, _draw(rng, kind, [name]), [name], seed)
    _check(r, truth, [name])


@pytest.mark.parametrize("kind, names", [
    ("quadrotor", ["latency", "drag_scale", "motor_time_constant", "mass_scale"]),
    ("arm", ["latency", "actuator_lag", "joint_damping_scale", "mass_scale"]),
])
def test_sysid_recovers_four_drawn_parameters_at_once(tmp_path, kind, names):
    """Sysid recovers four drawn arm parameters at once.

    The arm with its URDF joint friction on (off on both sides while the lagged servo was
    explicit: two of eight draws then ended 3-10 % off, accepted; a fixed draw with the friction on,
    seed 18, was an expected failure 3-18 % off, and is exact now).
    """
    seed = _seed(f"four {kind} parameters")
    rng = np.random.default_rng(seed)
    r, truth = _fit(tmp_path, kind, _draw(rng, kind, names), names, seed)
    _check(r, truth, names)


def _quadrotor_bag(tmp_path, label: str, names):
    """(seed, perturbation, bag data): the quadrotor's standard recording with ``names`` drawn."""
    seed = _seed(label)
    pert = _draw(np.random.default_rng(seed), "quadrotor", names)
    record_standard("quadrotor", tmp_path / "bag", pert, steps=STEPS, seed=seed % 1000, predictions=False)
    return seed, pert, read_bag(tmp_path / "bag")


def test_sysid_result_does_not_depend_on_the_order_of_params(tmp_path):
    names = ["latency", "mass_scale"]
    _, _, data = _quadrotor_bag(tmp_path, "order", names)
    a = calibrate(data, sim_setup(data), names, **FAST)
    b = calibrate(data, sim_setup(data), names[::-1], **FAST)
    for n in names:
        assert a.fitted[n] == pytest.approx(b.fitted[n], rel=1e-9), (n, a.fitted, b.fitted)


def test_sysid_rejects_a_wind_force_it_cannot_model(tmp_path, capsys):
    """Sysid rejects a wind force it cannot model.

    A constant horizontal wind on the stand-in: no drag, mass or thrust value explains it.
    The CLI says "fit rejected", exits 3, writes no calibrated.yaml; the same recording without
    wind is accepted (the rejection is about the wind, not the recording). The wind is drawn in
    0.5-1.5 N. The residual's size alone did not tell (seed 1901474182, 1.28 N: 9 % of the
    velocity change, under the 10 % limit, accepted with drag at its lower bound); its bias of
    one sign does (sysid.MAX_SYSTEMATIC): ``python bench/sysid_wind.py --forces 0.3,0.5,0.7,0.85,1.0``
    rejected every draw from 0.5 N, two of three at 0.3 N.
    """
    seed = _seed("wind")
    rng = np.random.default_rng(seed)
    ang = rng.uniform(0, 2 * np.pi)
    force = float(rng.uniform(0.5, 1.5))
    wind = [force * float(np.cos(ang)), force * float(np.sin(ang)), 0.0]
    mass = drawn_away(rng, 0.8, 1.2, 1.0, 0.05)
    for label, pert in (("wind", {"wind_force": wind, "mass_scale": mass}), ("calm", {"mass_scale": mass})):
        bag, out = tmp_path / f"bag_{label}", tmp_path / f"out_{label}"
        record_standard("quadrotor", bag, pert, steps=STEPS, seed=seed % 1000, predictions=False)
        rc = cli.main(["sysid", str(bag), "--params", "mass_scale,drag_scale", "--out", str(out), "--window", "3",
                       "--max-starts", "48", "--quiet"])
        err = capsys.readouterr().err
        md = (out / "sysid.md").read_text()
        print(label, pert, "exit", rc, md.splitlines()[2][:300])
        if label == "wind":
            assert rc == 3, (f"seed {seed} (DIFFSIM_SYSID_SEED)", pert, err)
            assert "fit rejected" in md and "Reason:" in md
            assert not (out / "calibrated.yaml").exists()
        else:
            assert rc == 0, err
            assert (out / "calibrated.yaml").exists()
    # Asked for, the rejected calibration is written anyway.
    rc = cli.main(["sysid", str(tmp_path / "bag_wind"), "--params", "mass_scale,drag_scale", "--out",
                   str(tmp_path / "forced"), "--window", "3", "--max-starts", "48", "--quiet", "--write-rejected"])
    assert rc == 3 and (tmp_path / "forced" / "calibrated.yaml").exists()


def test_sysid_rejects_or_flags_an_unmodelled_payload(tmp_path):
    """Sysid rejects or flags an unmodelled payload.

    A point mass at an offset on the arm's last link: the masses can only be scaled, the
    centre of mass does not move, so the fit cannot explain the data.
    """
    seed = _seed("payload")
    rng = np.random.default_rng(seed)
    pert = {"payload_mass": float(rng.uniform(0.15, 0.3)),
            "payload_offset": [float(rng.uniform(0.05, 0.1)), float(rng.uniform(-0.05, 0.05)), 0.0]}
    record_standard("arm", tmp_path / "bag", pert, steps=STEPS, seed=seed % 1000, predictions=False)
    data = read_bag(tmp_path / "bag")
    r = calibrate(data, sim_setup(data), ["mass_scale", "joint_damping_scale"], **FAST)
    print(pert, r.verdict, r.reasons, r.fitted, r.heldout["improvement"], r.unexplained)
    assert not r.accepted or r.at_bound, (r.fitted, r.heldout)
    torch.set_num_threads(torch.get_num_threads())


def test_sysid_leaves_out_windows_past_a_joint_limit(tmp_path, monkeypatch):
    """Windows where a joint is past its position limit are left out.

    There the simulator's limit penalty and the robot's end stop are different laws, not a
    parameter. The arm's
    recording with drawn mass and damping; the model sysid uses gets a drawn joint's upper limit
    lowered to a drawn 80-92nd percentile of what the recording reached, so the simulator's
    penalty acts where the stand-in had none. With the windows left out the fit is accepted,
    exact (1e-6; measured 1e-11 or better over 23 draws), and says how many it left out; the
    peer that keeps them is not: more than 1e-4 off (over those draws 0.18-102 % off, 18
    rejected; a "rejected or 1 % off" check failed CI on seed 4070029628, where the limit lowered
    on the heavy base joint moved the peer's fit only 0.18 % and it was accepted). (Seen
    on a real draw: the four-parameter arm with friction on, seed 1962970610, passed the base
    joint's limit at 59 rad/s in the held-out part only; the truth, found exactly, was rejected
    at 13 % unexplained.)
    """
    from diffsim_ros.analysis import sysid

    seed = _seed("limit")
    rng = np.random.default_rng(seed)
    names = ["mass_scale", "joint_damping_scale"]
    pert = _draw(rng, "arm", names)
    record_standard("arm", tmp_path / "bag", pert, steps=STEPS, seed=seed % 1000, joint_friction=False)
    data = read_bag(tmp_path / "bag")
    setup = sim_setup(data)
    j = int(rng.integers(setup.model.nj))
    qj = data.q[:, data.joint_names.index(setup.model.joint_names[j])]
    setup.model.upper[j] = float(np.quantile(qj, rng.uniform(0.80, 0.92)))
    truth = from_perturbation(physics.build_system(setup.model, setup.sim_config), pert)
    r = calibrate(data, setup, names, **FAST)
    print(f"seed {seed}: joint {j} upper limit {float(setup.model.upper[j]):.3f}", pert, r.verdict, r.fitted, r.notes)
    assert any("passed its position limit" in n for n in r.notes), r.notes
    _check(r, truth, names)
    off = lambda res: max(abs(res.fitted[n][0] / float(truth[n].reshape(-1)[0]) - 1.0) for n in names)  # noqa: E731
    assert off(r) < 1e-6, (seed, r.fitted)
    monkeypatch.setattr(sysid, "_clear_of_limits", lambda rp, starts, window: (starts, 0))
    peer = calibrate(data, setup, names, **FAST)
    print("peer keeping them:", peer.verdict, peer.fitted, f"{off(peer):.1%} off")
    # Keeping them is never an accepted exact fit: the fit is pulled off the truth, or, where the
    # limit is passed in the held-out part only (seed 1476830973: the fit exact, 40 windows past the
    # limit), the validation rejects it.
    assert off(peer) > 1e-4 or peer.verdict == "rejected", (seed, peer.verdict, peer.fitted)


@pytest.mark.slow
def test_slow_arm_actuator_among_four_with_joint_friction(tmp_path):
    """A slow arm actuator among four parameters with joint friction is fitted exactly.

    A slow arm actuator (0.04 s) with three other parameters and the URDF's joint friction on:
    accepted 9 % off (a strict xfail) until the replay solved the lagged-torque chain with its
    Jacobian and sysid differentiated that estimate by the parameters (the lag's gradient had
    the wrong sign where the fit stopped): then within 2 %, and exact (1e-7) since sysid tries
    further starts while more than 0.5 % of the velocity change is unexplained.
    """
    names = ["latency", "actuator_lag", "joint_damping_scale", "mass_scale"]
    seed = 1029555022                                   # the failing run's draws (the old ranges)
    pert = {"latency": 0.02, "actuator_lag": 0.03984566665726231, "joint_damping_scale": 0.40920307498291936,
            "mass_scale": 0.7472369294268085}
    r, truth = _fit(tmp_path, "arm", pert, names, seed)
    _check(r, truth, names)


FRICTION_AND_LAG = ["joint_friction", "actuator_lag"]


def record_friction_and_lag(path, seed: int, velocity_limits: bool = False):
    """Record the arm with drawn joint friction and actuator lag on the stand-in.

    Returns (bag data, its setup, perturbation): the arm's joint friction (x0.4-2.5) and actuator
    lag (0.008-0.025 s) drawn from ``seed``, recorded on the stand-in with config/reach_arm.yaml's
    own drive.
    """
    rng = np.random.default_rng(seed)
    pert = {"joint_friction_scale": _log_away(rng, 0.4, 2.5), "actuator_lag": float(rng.uniform(0.008, 0.025))}
    params = config.load_yaml(config.package_share() / "config" / "reach_arm.yaml")
    params["simulator"]["velocity_limits"] = velocity_limits
    record_bag(path, make_plant(params, pert), exciter(params, seed % 1000), STEPS, params)
    data = read_bag(path)
    return data, sim_setup(data), pert


def fit_friction_and_lag(path, seed: int, velocity_limits: bool = False, continuation: bool = True):
    """Fit :func:`record_friction_and_lag`'s recording with the tests' settings.

    Returns (result, truth, perturbation): :func:`record_friction_and_lag` fitted with the tests'
    settings (also bench/sysid_draws.py --kind arm_friction_lag).
    """
    data, setup, pert = record_friction_and_lag(path, seed, velocity_limits)
    r = calibrate(data, setup, FRICTION_AND_LAG, continuation=continuation, **FAST)
    truth = from_perturbation(physics.build_system(setup.model, setup.sim_config), pert)
    print(f"perturbation {pert}: fitted {r.fitted}, verdict {r.verdict} {r.reasons}, {r.seconds:.1f} s")
    return r, truth, pert


def test_joint_friction_with_actuator_lag(tmp_path):
    """Issue 44 item 1: joint friction with an actuator lag is fitted within 5 %.

    The arm's joint friction together with an actuator lag (friction x0.4-2.5,
    lag 0.008-0.025 s, drawn), recorded with config/reach_arm.yaml's own drive (its stiff servo at
    10 ms substeps, the servo iterations) without its velocity limits, fitted within 5 %. It was
    rejected ("a bias of one sign") while the lagged servo was explicit: unstable at those
    substeps, the wrist chattering at tens of rad/s between the samples. Fitted on the 3-step
    windows directly from the grid starts, seed 2993291882 (friction x2.5, lag 0.0220 s) stopped
    on its iteration limit in a narrow valley of the friction and seed 3 (x0.468, 0.0120 s) was
    accepted 95 % off; the horizon continuation (one-step windows first) finds both exactly.
    """
    r, truth, _ = fit_friction_and_lag(tmp_path / "bag", _seed("friction and lag"))
    _check(r, truth, FRICTION_AND_LAG)


def test_the_friction_and_lag_jacobian_matches_central_differences(tmp_path):
    """Issue 44 item 1: the friction and lag Jacobian matches central differences.

    The residual's Jacobian under joint friction and a torque lag (the friction
    law's derivative, the lagged-torque chain's sensitivity, the warm-up) against central
    differences of the residual itself, at the drawn truth and at a point drawn around it (each
    coordinate x0.8-1.25), on the fit windows calibrate uses. Without the lagged torque's
    sensitivity along the chain (the warm-up steps alone carrying the parameters' effect) the
    friction's columns were 1.3e-5 to 2e-4 off. The difference's step suits each column: on the
    lag's strongly curved column the fourth-order difference's own error goes as step^4 (seed
    4182627851: 2.5e-4 at step 1e-3, once read as a mismatch left to find; 2.1e-6 at 3e-4, 2.6e-8
    at 1e-4, 2e-9 at 3e-5), while on the friction's columns the residual's round-off over the
    step dominates below 1e-3 (seed 1: 1.5e-7 at 1e-3, 3.6e-6 at 1e-4). So step 1e-4 for the lag,
    1e-3 for the friction, and every column within 5e-6.
    """
    from diffsim_ros.analysis import sysid as S
    from diffsim_ros.analysis.predict import Replay

    seed = _seed("friction and lag jacobian")
    data, setup, pert = record_friction_and_lag(tmp_path / "bag", seed)
    rng = np.random.default_rng(seed + 1)
    setup = type(setup)(setup.params, setup.model.to(torch.float64), setup.sim_config, setup.source, setup.notes)
    with S.replaying(data):
        rp = Replay(data, setup)
        cfg = setup.sim_config
        fp = S._fit_problems(rp, cfg, FRICTION_AND_LAG, 3, 0.7, 32)
        assert fp.names == FRICTION_AND_LAG
        prob, coords = fp.fit, fp.coords
        truth = from_perturbation(physics.build_system(setup.model, cfg), pert)
        zt = torch.log(torch.cat([truth[n].double().reshape(-1) for n in FRICTION_AND_LAG]))
        near = zt + torch.as_tensor(rng.uniform(np.log(0.8), np.log(1.25), zt.numel()))
        for label, z in (("truth", zt), ("near", near)):
            r, J = S._jacobian(prob, coords, z)
            for i in range(z.numel()):
                h = 1e-4 if coords.label(i) == "actuator_lag" else 1e-3
                e = h * torch.eye(z.numel(), dtype=z.dtype)[i]
                with torch.no_grad():       # the fourth-order central difference
                    f = [prob.residual(coords.values(z + k * e)) for k in (-2, -1, 1, 2)]
                fd = (f[0] - 8 * f[1] + 8 * f[2] - f[3]) / (12 * h)
                err = float((J[:, i] - fd).norm() / fd.norm())
                print(f"seed {seed} {label} {coords.label(i)}: |J| {float(fd.norm()):.3g}, relative error {err:.2e}")
                assert err < 5e-6, (seed, label, coords.label(i), err)


def test_four_arm_parameters_leave_a_wrong_start(tmp_path):
    """Four arm parameters leave a wrong start for the next grid point.

    Four arm parameters with the joint friction on, where the best grid point's fit on the
    3-step windows alone ends in a local minimum (normalised loss 2.5e-5, the true values 1e-17 or
    less): sysid goes on to the next grid point while the fit windows stay unexplained, which
    finds the truth, and the first fit stays in the record. (With the horizon continuation, the
    default, every start reaches the truth at once: this runs without it, for the escalation.)
    (The first such case, seed 2207095073 with friction off, lag 0.0041 s for 0.0134 s, stopped
    being one when sysid differentiated the lagged-torque estimate.)
    """
    names = ["latency", "actuator_lag", "joint_damping_scale", "mass_scale"]
    pert = {"latency": 0.04, "actuator_lag": 0.027050039602467955, "joint_damping_scale": 0.6630221120091808,
            "mass_scale": 0.7269029054142513}
    r, truth = _fit(tmp_path, "arm", pert, names, 15, continuation=False)
    _check(r, truth, names)
    losses = [t["loss"] for t in r.starts_tried]
    assert len(losses) >= 2 and max(losses) > 1e3 * min(losses), r.starts_tried


def test_the_one_step_fit_first_avoids_a_friction_local_minimum(tmp_path):
    """The one-step fit first avoids a friction local minimum.

    Issue 44 item 1's failure at its depth: seed 3 of the friction-and-lag draw (friction x0.468,
    lag 0.0120 s), fitted on the 3-step windows directly from the grid starts, ends in a local
    minimum with a joint's friction far off and is accepted so (95 % low), although the Jacobian
    there matches central differences to 1e-5 and the truth's loss is 1e-29: the smoothed Coulomb
    friction makes the multi-step residual a landscape of narrow valleys. Fitted on one-step windows
    first (the default), every start reaches the truth.
    """
    r, truth, _ = fit_friction_and_lag(tmp_path / "direct", 3, continuation=False)
    errors = [abs(f / t - 1.0) for f, t in zip(r.fitted["joint_friction"], truth["joint_friction"].tolist())]
    assert r.accepted and max(errors) > 0.5, (r.reasons, errors)
    r, truth, _ = fit_friction_and_lag(tmp_path / "continued", 3)
    _check(r, truth, FRICTION_AND_LAG)
    assert max(t["loss"] for t in r.starts_tried) < 1e-20, r.starts_tried


def test_a_fit_cut_short_by_the_iteration_limit_is_rejected(tmp_path):
    """A fit cut short by the iteration limit is rejected.

    LM that runs out of iterations while the loss still falls has not reached the data's
    optimum: sysid goes on once for as many iterations again, and rejects the fit if that ends on
    the limit too (one iteration, then one more, is not enough for two drawn parameters); the same
    recording with sysid's own limit is accepted with the truth.
    """
    names = ["mass_scale", "drag_scale"]
    seed, pert, data = _quadrotor_bag(tmp_path, "iteration limit", names)
    setup = sim_setup(data)
    short = calibrate(data, setup, names, window=3, max_starts=32, max_iter=1)
    print(f"seed {seed} (DIFFSIM_SYSID_SEED)", pert, short.fitted, short.reasons, short.starts_tried)
    assert not short.accepted and any("not converged" in x for x in short.reasons), short.reasons
    assert short.starts_tried[0]["moving"] > 1e-3
    # The report says how the kept fit ended: on its limit here, after the one continuation.
    assert short.convergence["converged"] is False and short.convergence["reason"] == "iteration limit"
    assert short.convergence["iterations"] == 2, short.convergence
    # Whatever the limit, a fit that ends on it is never accepted, however little its loss still
    # falls, and one that stops by a rule of convergence carries no such reason.
    for max_iter in (2, 3):
        r = calibrate(data, setup, names, window=3, max_starts=32, max_iter=max_iter)
        print(max_iter, convergence_line(r.convergence), r.starts_tried[0].get("moving"))
        on_limit = r.convergence["reason"] == "iteration limit"
        assert on_limit == any("not converged" in x for x in r.reasons), (max_iter, r.convergence, r.reasons)
        assert not (on_limit and r.accepted)
    full = calibrate(data, setup, names, window=3, max_starts=32)
    truth = from_perturbation(physics.build_system(setup.model, setup.sim_config), pert)
    _check(full, truth, names)
    assert not any("not converged" in x for x in full.reasons)
    c = full.convergence
    print("full fit:", convergence_line(c))
    assert c["converged"] and c["reason"] != "iteration limit" and 0 < c["iterations"] < 2 * FAST["max_iter"], c
    print("short fit:", convergence_line(short.convergence))
    # The report tells them apart by the step (the short fit still moving) and the gradient, both
    # relative to the same start's: after two Levenberg-Marquardt iterations the short fit's can
    # already be 1e-7 of it (seed 207783955), the converged fit's is smaller still.
    assert short.convergence["step"] > 1e-5, short.convergence
    assert c["gradient"] < 1e-3 and c["gradient"] < short.convergence["gradient"], (c, short.convergence)
