#!/usr/bin/env python3
"""Steps per second of Simulator.step, beside MuJoCo stepping the same model in the same run.

    python bench/step.py [--quick] [--seconds 0.25] [--batches 1,256,4096] [--compile 1] [--mjx-python PY]

Three models, each at batch 1, 256 and 4096 (``--cases`` picks):

* **panda** (example-robot-data's panda.urdf, fixed base, the finger mimic removed on both sides,
  nq = nv = 9) with ground
  contact on: its collision meshes become their bounding boxes (16 boxes, 8 corner
  points each; the base link's box is fixed to the world and skipped), effort
  actuation with zero commands, dt = 1 ms, from a pose in which the hand rests
  1 mm into the ground (found by bisection on joint 2), so that contacts are live.
* **quadrotor** (urdf/diffsim_quadrotor.urdf with config/diffsim_quadrotor.yaml:
  free base, CTBR actuation with hover commands, motor lag, body drag, ground
  contact on, 1 substep), dt = 2 ms, hovering 1 m above the ground.
* **solo12** (example-robot-data's solo12 with config/locomotion_velocity_solo12.yaml: free base,
  position servos holding the stance, the walker's implicit contact, one substep per step),
  standing on its four feet after 0.5 s of settling; MuJoCo: the same boxes, position servos
  with the same gains, the stand-in's floor (elliptic cone, impratio 100).

Ours: float32, CPU, ``torch.set_num_threads(1)`` (stated in the output; batch-level
parallelism is torch's, not threads), default SimConfig otherwise (NaN guard on).
* fwd: ``Simulator.step`` under ``torch.no_grad()``, K steps per call;
* fwd+bwd: a K-step rollout from a state whose q and v require grad, loss = sum of
  the final q and v, ``loss.backward()``; the figure counts the K B forward steps.

MuJoCo (float64, one thread): the same URDF with <visual>/<collision> stripped (no
meshes; the finger mimic removed), then through MjSpec: the same boxes as geoms
(colliding with the ground plane only, as ours), one motor per joint, a plane; the
quadrotor as MJCF built from our model (free joint, mass/inertia, the hub box and
rotor cylinders as geoms, 4 thrust motors with the yaw-torque gear, hover controls;
no drag or CTBR loop, which MuJoCo lacks). Stepped by ``mujoco.rollout`` (the C++
batched rollout, one thread) when importable, else ``mj_step`` in a Python loop.
MuJoCo has no backward pass, so "fwd+bwd / MuJoCo" compares our gradient step
with its plain step; its finite-difference step Jacobian (``mjd_transitionFD``,
centred) is timed once per model as a second reference.

Each figure is the best of 3 windows of >= ``--seconds`` (0.25 s, so ~0.75 s a measurement;
0.05 s with --quick).
Ratios > 1 mean ours is faster. Nothing here is a test: no figure is asserted.
"""
from __future__ import annotations

import argparse
import os
import platform
import re
import sys
import time
import warnings

import numpy as np
import torch

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO_ROOT not in sys.path:
    sys.path.insert(0, REPO_ROOT)

from diffsim_ros import config, physics  # noqa: E402

ERD_SUFFIX = os.path.join("cmeel.prefix", "share", "example-robot-data", "robots")
PANDA = os.path.join("panda_description", "urdf", "panda.urdf")
QUADROTOR_YAML = os.path.join(REPO_ROOT, "config", "diffsim_quadrotor.yaml")


def find_panda() -> str:
    for entry in sys.path:
        path = os.path.join(entry, ERD_SUFFIX, PANDA)
        if os.path.isfile(path):
            return path
    sys.exit("bench/step.py: example-robot-data is not installed (pip install example-robot-data)")


def rate(fn, steps_per_call: int, seconds: float, windows: int = 3) -> float:
    """Best steps/s over ``windows`` timing windows of >= ``seconds`` each (after a warm-up call)."""
    fn()
    best = 0.0
    for _ in range(windows):
        calls, start = 0, time.perf_counter()
        while True:
            fn()
            calls += 1
            elapsed = time.perf_counter() - start
            if elapsed >= seconds:
                break
        best = max(best, calls * steps_per_call / elapsed)
    return best


def fmt(x: float) -> str:
    return "%.3g" % x if x < 100 else "{:,.0f}".format(x)


# ----------------------------------------------------------------------------- ours
class Case:
    """One benchmarked model: our simulator, its start state and action, and the MuJoCo twin."""

    def __init__(self, name, sim, q0, action, mj_model, mj_qpos, mj_qvel, mj_ctrl, note, mjcf=None):
        self.name, self.sim, self.q0, self.action = name, sim, q0, action
        self.mj_model, self.mj_qpos, self.mj_qvel, self.mj_ctrl, self.note = mj_model, mj_qpos, mj_qvel, mj_ctrl, note
        self.mjcf = mjcf          # the MuJoCo model as MJCF text (for the MJX peer)


def steps_for(batch: int, forward: bool) -> int:
    """Return the steps per timed call: enough to amortise the call, few enough to keep windows short."""
    if batch >= 4096:
        return 2
    return 10 if forward else 5


def bench_ours(case: Case, batch: int, seconds: float):
    sim = case.sim
    q0 = case.q0.expand(batch, -1).clone()
    action = case.action.expand(batch, -1).clone()
    state0 = sim.initial_state(q0)

    k_f = steps_for(batch, True)

    def forward():
        with torch.no_grad():
            s = state0
            for _ in range(k_f):
                s = sim.step(s, action)

    k_b = steps_for(batch, False)

    def forward_backward():
        q = state0.q.clone().requires_grad_(True)
        v = state0.v.clone().requires_grad_(True)
        s = state0.replace(q=q, v=v)
        for _ in range(k_b):
            s = sim.step(s, action)
        (s.q.sum() + s.v.sum()).backward()

    return rate(forward, k_f * batch, seconds), rate(forward_backward, k_b * batch, seconds)


def bench_compiled(case: Case, batch: int, seconds: float):
    """Fwd and fwd+bwd steps/s of the compiled step (physics.compiled.CompiledStep).

    And the seconds its first forward and first forward+backward calls took (compilation).
    """
    from diffsim_ros.physics.compiled import CompiledStep

    step = CompiledStep(case.sim.system)
    state0 = case.sim.initial_state(case.q0.expand(batch, -1).clone())
    action = case.action.expand(batch, -1).clone()
    k_f, k_b = steps_for(batch, True), steps_for(batch, False)

    def forward():
        with torch.no_grad():
            s = state0
            for _ in range(k_f):
                s = step(s, action)

    def forward_backward():
        s = state0.replace(q=state0.q.clone().requires_grad_(True), v=state0.v.clone().requires_grad_(True))
        for _ in range(k_b):
            s = step(s, action)
        (s.q.sum() + s.v.sum()).backward()
    t0 = time.perf_counter()
    forward()
    t_f = time.perf_counter() - t0
    t0 = time.perf_counter()
    forward_backward()
    t_b = time.perf_counter() - t0
    return rate(forward, k_f * batch, seconds), rate(forward_backward, k_b * batch, seconds), t_f, t_b


def bench_exported(case: Case, batch: int, seconds: float):
    """Fwd steps/s of the ahead-of-time compiled step (physics.compiled.ExportedStep).

    And the seconds its first call took (export, and the library's build or load from the cache).
    """
    from diffsim_ros.physics.compiled import ExportedStep

    step = ExportedStep(case.sim.system)
    state0 = case.sim.initial_state(case.q0.expand(batch, -1).clone())
    action = case.action.expand(batch, -1).clone()
    k_f = steps_for(batch, True)

    def forward():
        with torch.no_grad():
            s = state0
            for _ in range(k_f):
                s = step(s, action)
    t0 = time.perf_counter()
    forward()
    return rate(forward, k_f * batch, seconds), time.perf_counter() - t0


def mjx_python(choice):
    """Return an interpreter that imports mujoco.mjx and jax: --mjx-python, $DIFFSIM_MJX_PYTHON, or this one."""
    import subprocess

    for py in [choice, os.environ.get("DIFFSIM_MJX_PYTHON"), sys.executable]:
        if not py:
            continue
        try:
            ok = subprocess.run([py, "-c", "import jax, mujoco.mjx"], capture_output=True).returncode == 0
        except OSError:
            ok = False
        if ok:
            return py
    return None


def bench_mjx(py: str, case: Case, batches, seconds: float):
    """{batch: {"fwd", "grad"}} from bench/mjx_peer.py run by ``py`` on the case's MJCF."""
    import json
    import subprocess
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        xml, st = os.path.join(tmp, "model.xml"), os.path.join(tmp, "state.json")
        with open(xml, "w") as fh:
            fh.write(case.mjcf)
        with open(st, "w") as fh:
            json.dump({"qpos": list(map(float, case.mj_qpos)), "qvel": list(map(float, case.mj_qvel)),
                       "ctrl": list(map(float, case.mj_ctrl))}, fh)
        out = subprocess.run([py, os.path.join(REPO_ROOT, "bench", "mjx_peer.py"), xml, st, "--batches",
                              ",".join(map(str, batches)), "--seconds", str(seconds)],
                             capture_output=True, text=True, env=dict(os.environ, JAX_PLATFORMS="cpu"))
    if out.returncode != 0:
        raise RuntimeError("bench/mjx_peer.py failed: " + out.stderr[-2000:])
    return {int(k): v for k, v in json.loads(out.stdout.strip().splitlines()[-1]).items()}


# ----------------------------------------------------------------------------- MuJoCo
def mj_rollout_fn(case: Case, batch: int):
    """Return a callable stepping ``batch`` MuJoCo states K steps, and K."""
    import mujoco

    m = case.mj_model
    d = mujoco.MjData(m)
    d.qpos[:] = case.mj_qpos
    d.qvel[:] = case.mj_qvel
    d.ctrl[:] = case.mj_ctrl
    mujoco.mj_forward(m, d)
    spec = mujoco.mjtState.mjSTATE_FULLPHYSICS
    x0 = np.zeros(mujoco.mj_stateSize(m, spec))
    mujoco.mj_getState(m, d, x0, spec)
    k = steps_for(batch, True)
    try:
        from mujoco import rollout as mj_rollout
    except ImportError:
        mj_rollout = None
    if mj_rollout is not None:
        init = np.tile(x0, (batch, 1))
        ctrl = np.tile(case.mj_ctrl, (batch, k, 1))
        out = np.zeros((batch, k, x0.size))
        roller = mj_rollout.Rollout(nthread=0)

        def run():
            roller.rollout(m, d, init, ctrl, nstep=k, state=out)
        return run, k, "mujoco.rollout (one thread)"

    def loop():
        for _ in range(batch):
            mujoco.mj_setState(m, d, x0, spec)
            for _ in range(k):
                mujoco.mj_step(m, d)
    return loop, k, "mj_step in a Python loop"


def mj_fd_jacobian_rate(case: Case, seconds: float) -> float:
    """States/s of mjd_transitionFD (centred finite-difference A, B of one step)."""
    import mujoco

    m = case.mj_model
    d = mujoco.MjData(m)
    d.qpos[:] = case.mj_qpos
    d.ctrl[:] = case.mj_ctrl
    mujoco.mj_forward(m, d)
    nx = 2 * m.nv + m.na
    A, B = np.zeros((nx, nx)), np.zeros((nx, m.nu))

    def run():
        mujoco.mjd_transitionFD(m, d, 1e-6, 1, A, B, None, None)
    return rate(run, 1, seconds)


def _strip_urdf(path: str) -> str:
    xml = open(path).read()
    xml = re.sub(r"<visual\b.*?</visual>", "", xml, flags=re.S)
    xml = re.sub(r"<collision\b.*?</collision>", "", xml, flags=re.S)
    xml = re.sub(r"<mimic\b[^>]*/>", "", xml)
    return xml.replace("</robot>", '<mujoco><compiler discardvisual="true" fusestatic="false"/></mujoco></robot>')


def _quat_wxyz(R: np.ndarray) -> np.ndarray:
    import mujoco

    q = np.zeros(4)
    mujoco.mju_mat2Quat(q, np.ascontiguousarray(R, dtype=np.float64).reshape(9))
    return q


def _add_ground(spec):
    import mujoco

    spec.worldbody.add_geom(type=mujoco.mjtGeom.mjGEOM_PLANE, size=[0, 0, 1], contype=0, conaffinity=1)


def _add_box_geoms(spec, model: physics.Model):
    """Our collision boxes (body frame) as MuJoCo geoms that collide with the plane only."""
    import mujoco

    for c in model.collisions:
        if c.body < 0 or c.kind != "box":
            continue
        body = spec.body(model.body_names[c.body])
        body.add_geom(type=mujoco.mjtGeom.mjGEOM_BOX, size=(c.size.double().numpy() / 2).tolist(),
                      pos=c.p.double().numpy().tolist(), quat=_quat_wxyz(c.R.double().numpy()).tolist(),
                      contype=1, conaffinity=0, mass=0, density=0)


# ----------------------------------------------------------------------------- cases
def panda_case() -> Case:
    import mujoco

    path = find_panda()
    share = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(path)))))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")   # "mesh replaced by its bounding box"
        # Nine free joints on both sides: the finger <mimic> goes here as it goes for MuJoCo (whose
        # equality constraint for it would be soft), so both engines step the same 9-dof tree.
        with open(path) as f:
            xml = re.sub(r"<mimic\b[^>]*/>", "", f.read())
        model = physics.load_urdf(xml, dtype=torch.float32, package_dirs=[share])
        m64 = physics.load_urdf(xml, dtype=torch.float64, package_dirs=[share])
    cfg = physics.SimConfig(dt=1e-3, actuator="effort", ground=True)
    # A pose that reaches down; bisection on joint 2 until the lowest box corner is 1 mm deep.
    q = m64.neutral_configuration().clone()
    base = torch.tensor([0.0, 0.5, 0.0, -0.6, 0.0, 1.6, 0.8, 0.02, 0.02], dtype=torch.float64)
    q[:] = torch.minimum(torch.maximum(base, m64.lower), m64.upper)
    sim64 = physics.Simulator(m64, cfg)
    lo, hi = 0.0, float(m64.upper[1])

    def lowest(a):
        qq = q.clone()
        qq[1] = a
        _, gap, _ = sim64.contact_forces(qq, torch.zeros(m64.nv, dtype=torch.float64))
        return float(gap.min())
    if lowest(hi) > -1e-3:
        raise RuntimeError("panda: no pose of joint 2 reaches the ground")
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if lowest(mid) > -1e-3 else (lo, mid)
    q[1] = hi
    sim = physics.Simulator(model, cfg)
    spec = mujoco.MjSpec.from_string(_strip_urdf(path))
    spec.option.timestep = cfg.dt
    _add_ground(spec)
    _add_box_geoms(spec, model)
    for name in model.joint_names:
        spec.add_actuator(trntype=mujoco.mjtTrn.mjTRN_JOINT, target=name, gear=[1, 0, 0, 0, 0, 0])
    mm = spec.compile()
    qpos = np.zeros(mm.nq)
    for i, name in enumerate(model.joint_names):
        qpos[mm.jnt_qposadr[mujoco.mj_name2id(mm, mujoco.mjtObj.mjOBJ_JOINT, name)]] = float(q[i])
    d = mujoco.MjData(mm)
    d.qpos[:] = qpos
    mujoco.mj_forward(mm, d)
    n_boxes = sum(1 for c in model.collisions if c.body >= 0)
    note = ("panda: nv = %d, %d collision boxes (%d contact points), start pose with the lowest corner 1 mm deep; "
            "MuJoCo finds %d contacts there" % (model.nv, n_boxes, sim.pt_body.numel(), d.ncon))
    return Case("panda + ground", sim, q.float(), torch.zeros(sim.action_dim), mm, qpos, np.zeros(mm.nv),
                np.zeros(mm.nu), note, mjcf=spec.to_xml())


def quadrotor_case() -> Case:
    import mujoco

    params = config.load_yaml(QUADROTOR_YAML)
    params["simulator"]["substeps"] = 1
    model = config.load_model(params, QUADROTOR_YAML, dtype=torch.float32)
    cfg = config.simulator_config(params, QUADROTOR_YAML)
    sim = physics.Simulator(model, cfg)
    q0 = model.neutral_configuration()
    q0[2] = 1.0
    mg = float(model.mass.sum()) * 9.81
    action = torch.tensor([mg, 0.0, 0.0, 0.0])

    # MJCF built from our model (body 0 holds everything: rotors are fixed links).
    c = model.com[0].double().numpy()
    inertia = model.inertia[0].double().numpy()
    rot = sim.rotors
    km_kf = cfg.rotors.torque_coefficient / cfg.rotors.thrust_coefficient
    geoms, sites, motors = [], [], []
    for col in model.collisions:
        quat = " ".join("%.9g" % x for x in _quat_wxyz(col.R.double().numpy()))
        pos = " ".join("%.9g" % x for x in col.p.double().numpy())
        size = col.size.double().numpy()
        if col.kind == "box":
            geoms.append('<geom type="box" size="%s" pos="%s" quat="%s"/>'
                         % (" ".join("%.9g" % x for x in size / 2), pos, quat))
        elif col.kind == "cylinder":
            geoms.append('<geom type="cylinder" size="%.9g %.9g" pos="%s" quat="%s"/>'
                         % (size[0], size[1] / 2, pos, quat))
    for i in range(rot.n):
        sites.append('<site name="rotor_%d" pos="%s"/>'
                     % (i, " ".join("%.9g" % x for x in rot.positions[i].double().numpy())))
        motors.append('<motor site="rotor_%d" gear="0 0 1 0 0 %.9g"/>' % (i, float(rot.directions[i]) * km_kf))
    fullinertia = "%.9g %.9g %.9g %.9g %.9g %.9g" % (inertia[0, 0], inertia[1, 1], inertia[2, 2],
                                                    inertia[0, 1], inertia[0, 2], inertia[1, 2])
    xml = f"""<mujoco model="diffsim_quadrotor">
  <option timestep="{cfg.dt}"/>
  <default><geom contype="1" conaffinity="0" density="0"/></default>
  <worldbody>
    <geom type="plane" size="0 0 1" contype="0" conaffinity="1"/>
    <body name="base_link" pos="0 0 1">
      <freejoint/>
      <inertial pos="{c[0]:.9g} {c[1]:.9g} {c[2]:.9g}" mass="{float(model.mass[0]):.9g}" fullinertia="{fullinertia}"/>
      {" ".join(geoms)}
      {" ".join(sites)}
    </body>
  </worldbody>
  <actuator>{" ".join(motors)}</actuator>
</mujoco>"""
    mm = mujoco.MjModel.from_xml_string(xml)
    qpos = np.array([0, 0, 1.0, 1, 0, 0, 0])          # MuJoCo quaternion: w x y z
    ctrl = np.full(mm.nu, mg / rot.n)
    note = ("quadrotor: %d rotors, CTBR with motor lag and drag in ours (MuJoCo: 4 thrust motors at hover "
            "thrust, no drag); %d contact points, none touching at 1 m" % (rot.n, sim.pt_body.numel()))
    return Case("quadrotor (CTBR)", sim, q0, action, mm, qpos, np.zeros(mm.nv), ctrl, note, mjcf=xml)


SOLO12_YAML = os.path.join(REPO_ROOT, "config", "locomotion_velocity_solo12.yaml")


def solo12_case() -> Case:
    """Return example-robot-data's solo12 standing on its four feet.

    The walker's training file (its contact and servo settings), one physics substep per step, the
    stance commanded through the position servos. MuJoCo: the same URDF (meshes stripped) on a free
    joint, our collision boxes as geoms against a plane, one position servo per joint with the same
    kp and kd, the stand-in's floor (elliptic cone, impratio 100).
    """
    import mujoco

    from diffsim_ros.plant.mujoco_plant import FRICTION_IMPRATIO

    params = config.load_yaml(SOLO12_YAML)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")   # "mesh replaced by its bounding box"
        model = config.load_model(params, SOLO12_YAML, dtype=torch.float32)
        task = config.build_task(params, SOLO12_YAML)[0]
    cfg = config.simulator_config(params, SOLO12_YAML)
    h = cfg.dt / cfg.substeps
    import dataclasses

    cfg = dataclasses.replace(cfg, dt=h, substeps=1, nan_check=True)
    sim = physics.Simulator(model, cfg)
    stance = task.stance.float()
    q0 = model.neutral_configuration()
    q0[2] = float(params["task"].get("base_height", task.base_height))
    q0[7:] = q0[7:].index_copy(0, sim.act_index, stance)
    # Settle it on its feet first (0.5 s), so both engines start from a resting stance.
    state = sim.initial_state(q0[None])
    with torch.no_grad():
        for _ in range(int(0.5 / h)):
            state = sim.step(state, stance[None])
    q0 = state.q[0].clone()

    from diffsim_ros.config import resolve_urdf

    path = str(resolve_urdf(params, SOLO12_YAML))
    spec = mujoco.MjSpec.from_string(_strip_urdf(path))
    spec.option.timestep = h
    spec.option.cone = mujoco.mjtCone.mjCONE_ELLIPTIC
    spec.option.impratio = FRICTION_IMPRATIO
    # The servos' damping implicit (MuJoCo's implicitfast), as ours: explicitly the light shanks ring.
    spec.option.integrator = mujoco.mjtIntegrator.mjINT_IMPLICITFAST
    spec.worldbody.first_body().add_freejoint()
    _add_ground(spec)
    _add_box_geoms(spec, model)
    kp = [float(x) for x in np.broadcast_to(np.asarray(cfg.kp, dtype=float), (len(stance),))]
    kd = [float(x) for x in np.broadcast_to(np.asarray(cfg.kd, dtype=float), (len(stance),))]
    for i, name in enumerate(sim.actuated_joints):
        spec.add_actuator(name=name, trntype=mujoco.mjtTrn.mjTRN_JOINT, target=name, gainprm=[kp[i]] + [0] * 9,
                          biastype=mujoco.mjtBias.mjBIAS_AFFINE, biasprm=[0, -kp[i], -kd[i]] + [0] * 7)
    mm = spec.compile()
    qpos = np.zeros(mm.nq)
    qpos[0:3] = q0[0:3].double().numpy()
    qx, qy, qz, qw = q0[3:7].double().numpy()
    qpos[3:7] = [qw, qx, qy, qz]
    for i, name in enumerate(model.joint_names):
        qpos[mm.jnt_qposadr[mujoco.mj_name2id(mm, mujoco.mjtObj.mjOBJ_JOINT, name)]] = float(q0[7 + i])
    ctrl = np.zeros(mm.nu)
    for i, name in enumerate(sim.actuated_joints):
        ctrl[mujoco.mj_name2id(mm, mujoco.mjtObj.mjOBJ_ACTUATOR, name)] = float(stance[i])
    d = mujoco.MjData(mm)
    d.qpos[:] = qpos
    d.ctrl[:] = ctrl
    for _ in range(int(0.5 / h)):
        mujoco.mj_step(mm, d)
    qpos = d.qpos.copy()
    touching = int((sim.contact_forces(q0, torch.zeros(model.nv))[1] < 0).sum())
    note = ("solo12: nv = %d, %d contact points, position servos holding the stance (dt %.3g s, one substep), "
            "settled 0.5 s on its feet: %d points touching in ours, MuJoCo finds %d contacts"
            % (model.nv, sim.pt_body.numel(), h, touching, d.ncon))
    return Case("solo12 + ground", sim, q0, stance, mm, qpos, np.zeros(mm.nv), ctrl, note, mjcf=spec.to_xml())


# ----------------------------------------------------------------------------- main
def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="short timing windows (0.05 s)")
    parser.add_argument("--seconds", type=float, default=None, help="length of one timing window (default 0.25 s)")
    parser.add_argument("--batches", default="1,256,4096", help="comma-separated batch sizes (default 1,256,4096)")
    parser.add_argument("--compile", default="", metavar="BATCHES",
                        help="also time the compiled step (CompiledStep) at these batch sizes (e.g. 1); the first "
                             "compile of a model takes minutes, later ones come from the persistent cache")
    parser.add_argument("--mjx-python", default=None,
                        help="interpreter with mujoco.mjx and jax for the MJX peer (default: $DIFFSIM_MJX_PYTHON, "
                             "else this one; the peer is skipped with a message when none has them)")
    parser.add_argument("--mjx-batches", default=None,
                        help="batch sizes for the MJX peer (default: --batches; its CPU jit of a batch-4096 "
                             "gradient takes many minutes)")
    parser.add_argument("--cases", default="panda,quadrotor,solo12",
                        help="models to time (default: panda,quadrotor,solo12)")
    args = parser.parse_args(argv)
    seconds = args.seconds if args.seconds is not None else (0.05 if args.quick else 0.25)
    batches = [int(b) for b in args.batches.split(",")]
    log = print

    import mujoco

    torch.set_num_threads(1)
    try:
        import mujoco.rollout  # noqa: F401
        mj_how = "mujoco.rollout"
    except ImportError:
        mj_how = "mj_step loop"
    log("diffsim_ros Simulator.step benchmark: ours float32 CPU with torch.set_num_threads(1); "
        "MuJoCo %s float64, one thread (%s)" % (mujoco.__version__, mj_how))
    log("torch %s, %s %s, %s; os.cpu_count() = %s; timing window %.2g s, best of 3"
        % (torch.__version__, platform.python_implementation(), platform.python_version(),
           platform.processor() or platform.machine(), os.cpu_count(), seconds))
    log("load average (1, 5, 15 min) at the start: %.2f %.2f %.2f" % os.getloadavg())

    builders = {"panda": panda_case, "quadrotor": quadrotor_case, "solo12": solo12_case}
    unknown = [c for c in args.cases.split(",") if c not in builders]
    if unknown:
        parser.error(f"--cases: unknown {unknown} (known: {', '.join(builders)})")
    cases = [builders[c]() for c in args.cases.split(",")]
    for case in cases:
        log(case.note)
    fd_rates = {case.name: mj_fd_jacobian_rate(case, seconds) for case in cases}
    for case in cases:
        log("MuJoCo mjd_transitionFD (centred finite-difference step Jacobian), %s: %s states/s"
            % (case.name, fmt(fd_rates[case.name])))
    mjx_py = mjx_python(args.mjx_python)
    mjx = {}
    if mjx_py is None:
        log("MJX peer skipped: no interpreter with mujoco.mjx and jax (pip install mujoco-mjx jax into a venv "
            "and pass --mjx-python or set DIFFSIM_MJX_PYTHON)")
    else:
        mjx_batches = [int(b) for b in (args.mjx_batches or args.batches).split(",")]
        for case in cases:
            mjx[case.name] = bench_mjx(mjx_py, case, mjx_batches, seconds)
        log("MJX peer: %s (JAX on the CPU, float32, one XLA thread)" % mjx_py)
    compile_batches = [int(b) for b in args.compile.split(",") if b]
    log("")
    header = ("| model | batch | ours fwd steps/s | ours fwd+bwd steps/s | MuJoCo steps/s | fwd / MuJoCo "
              "| fwd+bwd / MuJoCo | fwd+bwd / MuJoCo FD Jacobian | MJX fwd / grad steps/s | fwd / MJX "
              "| fwd+bwd / MJX grad |")
    log(header)
    log("|" + "|".join("---" for _ in range(header.count("|") - 1)) + "|")
    compiled_rows = []
    for case in cases:
        for batch in batches:
            fwd, fwd_bwd = bench_ours(case, batch, seconds)
            run, k, _ = mj_rollout_fn(case, batch)
            mj = rate(run, k * batch, seconds)
            peer = mjx.get(case.name, {}).get(batch)
            mjx_txt = ("%s / %s | %.3g | %.3g" % (fmt(peer["fwd"]), fmt(peer["grad"]), fwd / peer["fwd"],
                                                  fwd_bwd / peer["grad"]) if peer else "- | - | -")
            log("| %s | %d | %s | %s | %s | %.3g | %.3g | %.3g | %s |" % (
                case.name, batch, fmt(fwd), fmt(fwd_bwd), fmt(mj), fwd / mj, fwd_bwd / mj,
                fwd_bwd / fd_rates[case.name], mjx_txt))
            sys.stdout.flush()
            if batch in compile_batches:
                compiled_rows.append((case.name, batch, fwd, fwd_bwd, mj) + bench_compiled(case, batch, seconds)
                                     + bench_exported(case, batch, seconds) + (mjx.get(case.name, {}).get(batch),))
    if compiled_rows:
        log("")
        log("compiled step (physics.compiled.CompiledStep: on the CPU its forward and backward graphs traced by "
            "AOTAutograd and compiled by Inductor, C++ wrapper, one autograd.Function) and the forward step compiled "
            "ahead of time (physics.compiled.ExportedStep, torch.export + AOTInductor):")
        log("| model | batch | compiled fwd steps/s | compiled fwd+bwd steps/s | per step fwd / fwd+bwd (ms) "
            "| vs eager fwd / fwd+bwd | compiled fwd / MuJoCo | compiled fwd+bwd / MuJoCo | exported fwd steps/s "
            "| exported per step (ms) | exported fwd / MuJoCo "
            "| exported fwd / MJX fwd | compiled fwd+bwd / MJX grad | first calls fwd / fwd+bwd / exported (s) |")
        log("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
        for name, batch, fwd, fwd_bwd, mj, cf, cb, tf, tb, xf, tx, peer in compiled_rows:
            vs_mjx = ("%.3g | %.3g" % (xf / peer["fwd"], cb / peer["grad"])) if peer else "- | -"
            log("| %s | %d | %s | %s | %.3f / %.3f | %.3gx / %.3gx | %.3g | %.3g | %s | %.3f | %.3g | %s "
                "| %.0f / %.0f / %.0f |" % (
                    name, batch, fmt(cf), fmt(cb), 1e3 * batch / cf, 1e3 * batch / cb, cf / fwd, cb / fwd_bwd,
                    cf / mj, cb / mj, fmt(xf), 1e3 * batch / xf, xf / mj, vs_mjx, tf, tb, tx))
    log("")
    log("load average (1, 5, 15 min) at the end: %.2f %.2f %.2f on %s CPUs (other processes distort the figures)"
        % (os.getloadavg() + (os.cpu_count(),)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
