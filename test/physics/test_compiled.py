"""The compiled step (its graphs traced here, or torch.compile) against the eager step it compiles.

States over a rollout and gradients through it, on the quadrotor (free flight, CTBR, motor lag,
drag, ground contact) and on the project's arm with ground contact and implicit PD; the step
compiled ahead of time (ExportedStep) against the eager one, and its library cache.
Compiling takes a minute or two per model the first time (cached after).
"""
from __future__ import annotations

import dataclasses
import os
import random
import warnings

import pytest
import torch

from diffsim_ros import config, physics
from diffsim_ros.physics.compiled import CompiledStep, ExportedStep

from conftest import PROJECT_URDFS, REPO_ROOT

pytest.importorskip("torch._inductor")


def _cases():
    params = config.load_yaml(REPO_ROOT / "config" / "hover.yaml")
    quad = config.load_model(params, REPO_ROOT / "config" / "hover.yaml", dtype=torch.float64)
    qcfg = config.simulator_config(params, REPO_ROOT / "config" / "hover.yaml")
    # One substep per control step: the graph holds the substep once instead of four times
    # (the same operations repeated), which quarters the compile time of this test.
    qcfg = dataclasses.replace(qcfg, dt=qcfg.dt / qcfg.substeps, substeps=1)
    q0 = quad.neutral_configuration((3,))
    q0[:, 2] = torch.tensor([1.0, 0.02, 0.5], dtype=torch.float64)         # one of them on the ground
    hover = float(quad.mass.sum()) * 9.81
    qact = torch.tensor([[hover * 1.1, 0.2, -0.1, 0.3]], dtype=torch.float64).expand(3, 4)
    arm = physics.load_urdf(str(PROJECT_URDFS["arm"]), dtype=torch.float64)
    acfg = physics.SimConfig(dt=5e-3, actuator="position", kp=30.0, kd=2.0, gravity_compensation=True)
    a0 = arm.neutral_configuration((2,)) + torch.tensor([[0.3], [1.4]], dtype=torch.float64)
    a0 = torch.minimum(torch.maximum(a0, arm.lower), arm.upper)
    aact = torch.full((2, arm.nj), 0.8, dtype=torch.float64)
    return [("quadrotor", quad, qcfg, q0, qact), ("arm", arm, acfg, a0, aact)]


@pytest.mark.slow
@pytest.mark.parametrize("case", _cases(), ids=lambda c: c[0])
def test_compiled_step_matches_eager(case):
    _, model, cfg, q0, action = case
    # Compiled with two threads (the suite runs one per worker): Inductor's parallel CPU
    # kernels are another code path, one that failed to generate the scatter-adds of the
    # step's backward before they became products with one-hot maps.
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        _compare(model, cfg, q0, action)
    finally:
        torch.set_num_threads(threads)


def _compare(model, cfg, q0, action):
    with warnings.catch_warnings():      # the graphs traced here must build, not fall back to torch.compile
        warnings.filterwarnings("error", message=".*tracing the step's graphs directly failed")
        _compare_steps(model, cfg, q0, action)


def _compare_steps(model, cfg, q0, action):
    eager = physics.Simulator(model, cfg)
    compiled = physics.Simulator(model, cfg, compile=True)

    def run(sim):
        # Every input requires grad from the first step on: one graph signature, one compile.
        q = q0.clone().requires_grad_(True)
        v = torch.zeros(q0.shape[0], model.nv, dtype=torch.float64).requires_grad_(True)
        a = action.clone().requires_grad_(True)
        s = sim.initial_state(q, v)
        for _ in range(8):
            s = sim.step(s, a)
        loss = s.q.square().sum() + s.v.square().sum()
        return s, torch.autograd.grad(loss, (v, a))
    se, ge = run(eager)
    sc, gc = run(compiled)
    # The compiled solve is Gauss-Jordan, the eager one at this batch Cholesky: round-off
    # apart, amplified by the stiff implicit PD (1e-8 seen on v after one arm step).
    torch.testing.assert_close(sc.q, se.q, rtol=1e-8, atol=1e-8)
    torch.testing.assert_close(sc.v, se.v, rtol=1e-6, atol=1e-6)
    for x, y in zip(gc, ge):
        torch.testing.assert_close(x, y, rtol=1e-6, atol=1e-6)
    assert float(ge[1].abs().max()) > 0
    with pytest.raises(ValueError, match="expects"):
        compiled.step(sc, action[:, :2])
    # The graph's finiteness flag: a NaN command in one environment is named by the guard.
    bad = action.clone()
    bad[1, 0] = float("nan")
    with pytest.raises(physics.SimulationError, match=r"non-finite action in environment 1 \(entries \[0\]\)"):
        compiled.step(sc, bad.requires_grad_(True))


PENDULUM = """<robot name="pendulum">
  <link name="base"/>
  <link name="rod"><inertial><origin xyz="0 0 -0.5"/><mass value="1"/>
    <inertia ixx="0.01" iyy="0.01" izz="0.01" ixy="0" ixz="0" iyz="0"/></inertial></link>
  <joint name="hinge" type="revolute"><parent link="base"/><child link="rod"/><axis xyz="0 1 0"/>
    <limit lower="-3" upper="3" effort="10" velocity="10"/></joint>
</robot>"""


@pytest.mark.parametrize("direct", [True, False], ids=["direct", "torch.compile"])
def test_two_compiled_systems_of_one_shape_keep_their_own_graphs(tmp_path, direct):
    """Two compiled systems of one shape keep their own graphs.

    Two systems that differ only in values (a link mass; the gravity and the step, which the
    graph holds as constants) compile to graphs of the same signature; each CompiledStep keeps
    its own (it guards on its inputs only), so each must follow its own eager step, whichever
    compiled first, forward and through the gradient; with the graphs traced here (direct) and
    through torch.compile (the fallback, and the path off the CPU).
    """
    path = tmp_path / "pendulum.urdf"
    path.write_text(PENDULUM)
    model = physics.load_urdf(str(path), dtype=torch.float64)
    cfg = physics.SimConfig(dt=1e-2, ground=False, actuator="effort")
    heavy = physics.Simulator(model, cfg).system
    heavy = heavy.replace(model=heavy.model.replace(mass=heavy.model.mass * 3.0))
    # (the light one with a command delay line: another input and output of the graphs)
    light = physics.Simulator(model, dataclasses.replace(cfg, gravity=(0.0, 0.0, -1.62), dt=2e-2,
                                                         command_delay=1)).system
    q0 = torch.tensor([[0.7], [-0.3]], dtype=torch.float64)
    tau = torch.tensor([[0.5], [-0.2]], dtype=torch.float64)
    finals = []
    for sys in (heavy, light):
        compiled, eager = CompiledStep(sys, direct=direct), physics.Simulator(sys)
        grads = []
        for step in (compiled, eager.step):
            q = q0.clone().requires_grad_(True)
            a = tau.clone().requires_grad_(True)
            s = eager.initial_state(q)
            for _ in range(5):
                s = step(s, a)
            loss = s.v.square().sum() + s.q.sum()
            # A kept graph runs backward twice (torch.compile's refuses: its buffers are donated).
            again = torch.autograd.grad(loss, (q, a), retain_graph=True) if direct else ()
            grads.append(torch.autograd.grad(loss, (q, a)) + (s.q, s.v) + again)
        for x, y in zip(*grads):
            torch.testing.assert_close(x, y, rtol=1e-9, atol=1e-12)
        with torch.no_grad():
            sc = se = eager.initial_state(q0)
            for _ in range(5):
                sc, se = compiled(sc, tau), eager.step(se, tau)
        torch.testing.assert_close(sc.q, se.q, rtol=1e-9, atol=1e-12)
        torch.testing.assert_close(sc.v, se.v, rtol=1e-9, atol=1e-12)
        # The direct graphs (one trained, one inference) did build: nothing fell back.
        assert (sorted(k[0] for k, g in compiled._graphs.items() if g) == [False, True]) == direct
        finals.append(se.v)
    assert float((finals[0] - finals[1]).abs().max()) > 1e-3      # the two systems do differ


def _pendulum_systems(tmp_path, rng):
    path = tmp_path / "pendulum.urdf"
    path.write_text(PENDULUM)
    model = physics.load_urdf(str(path), dtype=torch.float64)
    cfg = physics.SimConfig(dt=rng.uniform(5e-3, 2e-2), ground=False, actuator="effort")
    first = physics.Simulator(model, cfg).system
    other = first.replace(model=first.model.replace(mass=first.model.mass * rng.uniform(1.5, 4.0)))
    return first, other


def _follow(step, sys, q0, tau, steps=5):
    """Run ``step`` and the eager step side by side from q0; the eager final state."""
    eager = physics.Simulator(sys)
    sx = se = eager.initial_state(q0)
    with torch.no_grad():
        for _ in range(steps):
            sx, se = step(sx, tau), eager.step(se, tau)
    torch.testing.assert_close(sx.q, se.q, rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(sx.v, se.v, rtol=1e-9, atol=1e-12)
    return se


def test_exported_step_keeps_one_library_per_system(tmp_path):
    """ExportedStep keeps one library per system.

    ExportedStep's libraries are cached on disk by the exported graph and its constants'
    values: two systems that differ in a drawn mass build two libraries, each following its
    own eager step; a new ExportedStep of the first system loads its library (builds none) and
    still follows it. Drawn: the step, the mass factor, the start and the torque.
    """
    seed = int(os.environ.get("DIFFSIM_EXPORT_SEED", random.randrange(2 ** 31)))
    print("DIFFSIM_EXPORT_SEED=%d" % seed)
    rng = random.Random(seed)
    first, other = _pendulum_systems(tmp_path, rng)
    q0 = torch.tensor([[rng.uniform(-2, 2)]], dtype=torch.float64)
    tau = torch.tensor([[rng.uniform(-3, 3)]], dtype=torch.float64)
    cache = str(tmp_path / "aoti")
    finals = []
    for sys in (first, other):
        step = ExportedStep(sys, cache_dir=cache)
        finals.append(_follow(step, sys, q0, tau).v)
        assert step.built == 1
    assert len([f for f in os.listdir(cache) if f.endswith(".pt2")]) == 2
    assert float((finals[0] - finals[1]).abs().max()) > 1e-6            # the two systems do differ
    again = ExportedStep(first, cache_dir=cache)
    _follow(again, first, q0, tau)
    assert again.built == 0
    # A damaged library (a truncated copy) is built again, with a warning naming it.
    for name in os.listdir(cache):
        with open(os.path.join(cache, name), "r+b") as f:
            f.truncate(1000)
    damaged = ExportedStep(first, cache_dir=cache)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _follow(damaged, first, q0, tau, steps=1)
    assert damaged.built == 1
    assert any("could not be loaded" in str(w.message) for w in caught)


@pytest.mark.slow
def test_exported_step_matches_eager(tmp_path):
    """The exported step matches the eager one.

    The ahead-of-time compiled forward step follows the eager one over a rollout at one
    environment (the controller's prediction) on the quadrotor (CTBR, motor lag, drag, contact
    groups); it refuses inputs that need a gradient, and its NaN flag lets the guard name a
    non-finite command. (The arm's implicit PD goes through the same traced branches as its
    compiled step, above; the contact groups' choice is tested on the carriage below.)
    """
    name, model, cfg, q0, action = _cases()[0]
    sim = physics.Simulator(model, cfg)
    step = ExportedStep(sim.system, cache_dir=str(tmp_path))
    q, a = q0[-1:].clone(), action[-1:].clone()
    eager = physics.Simulator(model, cfg)
    se = sx = eager.initial_state(q)
    with torch.no_grad():
        for _ in range(8):
            sx, se = step(sx, a), eager.step(se, a)
    torch.testing.assert_close(sx.q, se.q, rtol=1e-8, atol=1e-8)
    torch.testing.assert_close(sx.v, se.v, rtol=1e-6, atol=1e-6)
    if se.actuator is not None:
        torch.testing.assert_close(sx.actuator, se.actuator, rtol=1e-8, atol=1e-8)
    assert float((se.q - q).abs().max()) > 1e-4                         # it moved
    with pytest.raises(RuntimeError, match="no gradient"):
        step(se, a.clone().requires_grad_(True))
    bad = a.clone()
    bad[0, 0] = float("nan")
    with pytest.raises(physics.SimulationError, match=r"non-finite action in environment 0 \(entries \[0\]\)"):
        with torch.no_grad():
            step(se, bad)


LIFT = """<robot name="lift">
  <link name="base"/>
  <link name="carriage"><inertial><mass value="1"/>
      <inertia ixx="0.01" iyy="0.01" izz="0.01" ixy="0" ixz="0" iyz="0"/></inertial>
    <collision><geometry><box size="0.04 0.04 0.04"/></geometry></collision></link>
  <link name="rod"><inertial><origin xyz="0 0 -0.5"/><mass value="0.5"/>
      <inertia ixx="0.04" iyy="0.04" izz="0.001" ixy="0" ixz="0" iyz="0"/></inertial>
    <collision><origin xyz="0 0 -1"/><geometry><box size="0.04 0.04 0.04"/></geometry></collision></link>
  <joint name="lift" type="prismatic"><parent link="base"/><child link="carriage"/><axis xyz="0 0 1"/>
    <limit lower="0" upper="2" effort="100" velocity="5"/></joint>
  <joint name="swing" type="revolute"><parent link="carriage"/><child link="rod"/><axis xyz="0 1 0"/>
    <limit lower="-3" upper="3" effort="100" velocity="10"/></joint>
</robot>"""


@pytest.mark.slow
def test_compiled_steps_evaluate_the_near_groups_and_rerun_when_another_comes_near(tmp_path):
    """Compiled steps evaluate the near contact groups, and rerun when another comes near.

    The compiled step evaluates only the contact groups seen near the ground: a carriage on
    a vertical slide with a pendulum rod, each with a box (two groups). High on its slide, the
    rod's tip box touches in some environments (drawn swing angles; the first hangs straight,
    5 mm deep) and the graph over that group alone follows the eager step, states and
    gradients; lowered, the carriage's box comes near too, the step is run again with every
    group and still follows the eager step. The exported step likewise, at one environment.
    """
    seed = int(os.environ.get("DIFFSIM_EXPORT_SEED", random.randrange(2 ** 31)))
    print("DIFFSIM_EXPORT_SEED=%d" % seed)
    g = torch.Generator().manual_seed(seed)
    path = tmp_path / "lift.urdf"
    path.write_text(LIFT)
    model = physics.load_urdf(str(path), dtype=torch.float64)
    cfg = physics.SimConfig(dt=1e-3, actuator="effort", ground=True)
    eager, compiled = physics.Simulator(model, cfg), physics.Simulator(model, cfg, compile=True)
    step = compiled._compiled
    batch = 3              # below VECTOR_BATCH: scalar kernels, the quicker compile
    tau = torch.zeros(batch, 2, dtype=torch.float64)

    def run(sim, q0):
        q = q0.clone().requires_grad_(True)
        v = torch.zeros_like(q0).requires_grad_(True)
        s = sim.initial_state(q, v)
        for _ in range(4):
            s = sim.step(s, tau)
        return s, torch.autograd.grad(s.q.square().sum() + s.v.square().sum(), (q, v))

    def compare(q0):
        (sc, gc), (se, ge) = run(compiled, q0), run(eager, q0)
        torch.testing.assert_close(sc.q, se.q, rtol=1e-9, atol=1e-10)
        torch.testing.assert_close(sc.v, se.v, rtol=1e-7, atol=1e-8)
        for x, y in zip(gc, ge):
            torch.testing.assert_close(x, y, rtol=1e-6, atol=1e-6)
        return se

    # High: the tip box 0-5 mm deep where the rod hangs within a few degrees of vertical.
    high = torch.stack([torch.full((batch,), 1.015, dtype=torch.float64),
                        0.15 * (2 * torch.rand(batch, generator=g, dtype=torch.float64) - 1)], -1)
    high[0, 1] = 0.0
    compare(high)
    assert set(step._near.values()) == {(1,)} and step.reruns == 0       # the rod's group alone
    assert (1,) in step._by_groups
    # Low, the rod near horizontal: both boxes about a centimetre deep.
    low = torch.stack([torch.full((batch,), 0.01, dtype=torch.float64),
                       1.55 + 0.03 * torch.rand(batch, generator=g, dtype=torch.float64)], -1)
    se = compare(low)
    assert step.reruns >= 1 and set(step._near.values()) == {None}          # every group: the full graph
    assert set(step._by_groups) == {None, (1,)}
    assert float(se.v[:, 0].abs().max()) > 1e-3                           # the carriage's contact acted
    # The exported (forward) step chooses its groups from the first state it sees: the rod's,
    # whose library is built at once; the carriage coming near switches it to every group.
    ex = ExportedStep(compiled.system, cache_dir=str(tmp_path / "aoti"))
    one = tau[:1]

    def follow(q0):
        se = sx = eager.initial_state(q0, torch.zeros_like(q0))
        with torch.no_grad():
            for _ in range(3):
                sx, se = ex(sx, one), eager.step(se, one)
        torch.testing.assert_close(sx.q, se.q, rtol=1e-9, atol=1e-10)
        torch.testing.assert_close(sx.v, se.v, rtol=1e-7, atol=1e-8)
        return se
    follow(high[:1])                                                      # hanging: 5 mm deep
    assert list(ex._groups.values()) == [(1,)] and ex.built == 2 and ex.reruns == 0
    se = follow(low[:1])
    assert ex.reruns == 1 and list(ex._groups.values()) == [None] and ex.built == 2
    assert float(se.v[:, 0].abs().max()) > 1e-3


def test_varying_parameters_are_refused_by_name_before_compiling():
    """Varying parameters are refused by name before compiling.

    ``Simulator(..., compile=True, varying=...)`` refuses, before any graph is traced, a name
    the registry does not have, one it cannot take as an input, and one the system lacks (a
    rotor's drag or motor lag on the arm, the ground's stiffness without a ground), each named
    with what it needs; without compile=True varying is refused as well. It raised a bare
    AttributeError from inside the registry for a parameter of another kind of robot.
    """
    arm = physics.load_urdf(str(PROJECT_URDFS["arm"]), dtype=torch.float64)
    cfg = physics.SimConfig(dt=5e-3, actuator="position", kp=30.0, kd=2.0, ground=False)
    for names, words in ((["no_such_parameter"], ["no_such_parameter", "compiled step"]),
                         (["drag_linear", "mass_scale"], ["'drag_linear' (needs rotors)"]),
                         (["motor_time_constant"], ["'motor_time_constant' (needs rotors)"]),
                         (["contact_stiffness"], ["'contact_stiffness' (needs ground)"])):
        with pytest.raises(ValueError) as err:
            physics.Simulator(arm, cfg, compile=True, varying=names)
        for w in words:
            assert w in str(err.value), (names, str(err.value))
        assert "mass_scale" not in str(err.value)
    with pytest.raises(ValueError, match="compile=True"):
        physics.Simulator(arm, cfg, varying=["mass_scale"])
