"""The compiled step (torch.compile) against the eager step it compiles: states over a
rollout and gradients through it, on the quadrotor (free flight, CTBR, motor lag, drag,
ground contact) and on the project's arm with ground contact and implicit PD.
Compiling takes a minute or two per model the first time (cached after)."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from diffsim_ros import config, physics

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


def test_two_compiled_systems_of_one_shape_keep_their_own_graphs(tmp_path):
    """Two systems that differ only in values (a link mass; the gravity and the step, which the
    graph holds as constants) compile to graphs of the same signature; each CompiledStep keeps
    its own (it guards on its inputs only), so each must follow its own eager step, whichever
    compiled first."""
    path = tmp_path / "pendulum.urdf"
    path.write_text(PENDULUM)
    model = physics.load_urdf(str(path), dtype=torch.float64)
    cfg = physics.SimConfig(dt=1e-2, ground=False, actuator="effort")
    heavy = physics.Simulator(model, cfg).system
    heavy = heavy.replace(model=heavy.model.replace(mass=heavy.model.mass * 3.0))
    light = physics.Simulator(model, dataclasses.replace(cfg, gravity=(0.0, 0.0, -1.62), dt=2e-2)).system
    q0 = torch.tensor([[0.7], [-0.3]], dtype=torch.float64)
    tau = torch.tensor([[0.5], [-0.2]], dtype=torch.float64)
    finals = []
    for sys in (heavy, light):
        compiled, eager = physics.Simulator(sys, compile=True), physics.Simulator(sys)
        sc = se = eager.initial_state(q0)
        for _ in range(5):
            sc, se = compiled.step(sc, tau), eager.step(se, tau)
        torch.testing.assert_close(sc.q, se.q, rtol=1e-9, atol=1e-12)
        torch.testing.assert_close(sc.v, se.v, rtol=1e-9, atol=1e-12)
        finals.append(se.v)
    assert float((finals[0] - finals[1]).abs().max()) > 1e-3      # the two systems do differ
