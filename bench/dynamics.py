#!/usr/bin/env python3
"""Steps per second of our batched aba on the Franka panda, beside two peers.

    python bench/dynamics.py [--quick] [--batches 1,64,4096]

Measured in one run, on the same URDF (example-robot-data's panda, nq = nv = 9):

* ours: ``physics.aba`` on a batch of B random states, float32, CPU, once
  forward only (``torch.no_grad()``) and once forward + backward
  (loss = q̈.sum(), gradients to q, v and τ). Once with
  ``torch.set_num_threads(1)`` and once with torch's default thread count.
* Pinocchio: ``pin.aba`` called in a Python loop, one state per call (float64,
  its only scalar type in Python); for the forward + backward rows its
  analytical derivatives ``pin.computeABADerivatives``, likewise.
* MuJoCo: ``mj_forward`` in a loop, one state per call (single-threaded,
  float64), on the URDF with <visual>/<collision> removed (no meshes needed,
  no contacts), the mimic constraint of the second finger removed and joint
  damping zeroed, so that it solves the same problem as ours and Pinocchio's
  (it is checked to: its qacc must equal pin.aba before anything is timed).

A "step" is one state's forward dynamics. Each figure is the best of three
timing windows of at least ``--seconds`` (0.5 s, or 0.1 s with --quick) after a
warm-up. Ratios > 1 mean ours is faster. Nothing here is a test: no figure is
asserted.
"""
from __future__ import annotations

import argparse
import os
import platform
import re
import sys
import time

import numpy as np
import torch

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO_ROOT not in sys.path:
    sys.path.insert(0, REPO_ROOT)

from diffsim_ros import physics  # noqa: E402

ERD_SUFFIX = os.path.join("cmeel.prefix", "share", "example-robot-data", "robots")
PANDA = os.path.join("panda_description", "urdf", "panda.urdf")


def find_panda() -> str:
    for entry in sys.path:
        path = os.path.join(entry, ERD_SUFFIX, PANDA)
        if os.path.isfile(path):
            return path
    sys.exit("bench/dynamics.py: example-robot-data is not installed (pip install example-robot-data); "
             "no %s on sys.path" % os.path.join(ERD_SUFFIX, PANDA))


def rate(fn, states_per_call: int, seconds: float, windows: int = 3) -> float:
    """Best states/s over ``windows`` timing windows of >= ``seconds`` each."""
    deadline = time.perf_counter() + min(0.2, seconds)  # warm-up
    fn()
    while time.perf_counter() < deadline:
        fn()
    best = 0.0
    for _ in range(windows):
        calls = 0
        start = time.perf_counter()
        while True:
            fn()
            calls += 1
            elapsed = time.perf_counter() - start
            if elapsed >= seconds:
                break
        best = max(best, calls * states_per_call / elapsed)
    return best


def random_states(lower, upper, nv, n, rng):
    q = lower + (upper - lower) * rng.random((n, len(lower)))
    return q, rng.standard_normal((n, nv)), rng.standard_normal((n, nv))


# ----------------------------------------------------------------------- peers
def mujoco_model(urdf_path: str):
    import mujoco
    xml = open(urdf_path).read()
    xml = re.sub(r"<visual\b.*?</visual>", "", xml, flags=re.S)
    xml = re.sub(r"<collision\b.*?</collision>", "", xml, flags=re.S)
    xml = re.sub(r"<mimic\b[^>]*/>", "", xml)
    xml = xml.replace("</robot>", '<mujoco><compiler discardvisual="true" fusestatic="false"/></mujoco></robot>')
    model = mujoco.MjModel.from_xml_string(xml)
    model.dof_damping[:] = 0.0
    model.dof_frictionloss[:] = 0.0
    model.dof_armature[:] = 0.0
    return model


def bench_peers(path, joint_names, states, seconds, log):
    import mujoco
    import pinocchio as pin
    q, v, tau = states
    n = len(q)

    pm = pin.buildModelFromUrdf(path)
    pd = pm.createData()
    assert [pm.names[i] for i in range(1, pm.njoints)] == joint_names, "joint order differs from Pinocchio's"

    mm = mujoco_model(path)
    md = mujoco.MjData(mm)
    mj_names = [mm.joint(i).name for i in range(mm.njnt)]
    assert mm.nv == len(joint_names) and mj_names == joint_names, (mm.nv, mj_names)
    assert mm.neq == 0 and mm.ngeom == 0
    for i in range(min(n, 16)):  # the same dynamics before anything is timed
        md.qpos[:], md.qvel[:], md.qfrc_applied[:] = q[i], v[i], tau[i]
        mujoco.mj_forward(mm, md)
        ref = pin.aba(pm, pd, q[i], v[i], tau[i])
        err = np.linalg.norm(md.qacc - ref) / max(np.linalg.norm(ref), 1.0)
        assert err < 1e-9, "MuJoCo's qacc differs from pin.aba by %.3g (relative)" % err
    log("MuJoCo %s: nq = nv = %d, qacc checked equal to pin.aba" % (mujoco.__version__, mm.nv))

    counter = [0]

    def pin_aba():
        i = counter[0] = (counter[0] + 1) % n
        pin.aba(pm, pd, q[i], v[i], tau[i])

    def pin_derivatives():
        i = counter[0] = (counter[0] + 1) % n
        pin.computeABADerivatives(pm, pd, q[i], v[i], tau[i])

    def mj_forward():
        i = counter[0] = (counter[0] + 1) % n
        md.qpos[:] = q[i]
        md.qvel[:] = v[i]
        md.qfrc_applied[:] = tau[i]
        mujoco.mj_forward(mm, md)

    return {
        "pin_aba": rate(pin_aba, 1, seconds),
        "pin_derivs": rate(pin_derivatives, 1, seconds),
        "mujoco": rate(mj_forward, 1, seconds),
        "pin_version": pin.__version__,
    }


# ------------------------------------------------------------------------ ours
def bench_ours(model, states, batch, seconds):
    q, v, tau = (torch.as_tensor(np.resize(x, (batch, x.shape[1])), dtype=torch.float32) for x in states)

    def forward():
        with torch.no_grad():
            physics.aba(model, q, v, tau)

    qg, vg, tg = (x.clone().requires_grad_(True) for x in (q, v, tau))

    def forward_backward():
        qg.grad = vg.grad = tg.grad = None
        physics.aba(model, qg, vg, tg).sum().backward()

    return rate(forward, batch, seconds), rate(forward_backward, batch, seconds)


def fmt(x: float) -> str:
    return "%.3g" % x if x < 100 else "{:,.0f}".format(x)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="short timing windows (0.1 s) and batches 1, 64, 4096")
    parser.add_argument("--seconds", type=float, default=None, help="length of one timing window (default 0.5 s)")
    parser.add_argument("--batches", default="1,64,4096", help="comma-separated batch sizes (default 1,64,4096)")
    args = parser.parse_args(argv)
    seconds = args.seconds if args.seconds is not None else (0.1 if args.quick else 0.5)
    batches = [int(b) for b in args.batches.split(",")]
    log = print

    path = find_panda()
    share = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(path)))))
    # The finger <mimic> removed (a coupled coordinate in ours): the same 9 free joints as the peers,
    # which load the file without their mimic options.
    with open(path) as f:
        xml = re.sub(r"<mimic\b[^>]*/>", "", f.read())
    model = physics.load_urdf(xml, dtype=torch.float32, package_dirs=[share], collision=False)
    default_threads = torch.get_num_threads()
    log("diffsim_ros aba benchmark: panda (%s), nq = nv = %d, float32 ours / float64 peers" % (path, model.nv))
    log("torch %s, %s, %s; os.cpu_count() = %s, torch default threads = %d, timing window %.2g s (best of 3)"
        % (torch.__version__, platform.python_implementation() + " " + platform.python_version(),
           platform.processor() or platform.machine(), os.cpu_count(), default_threads, seconds))

    log("load average (1, 5, 15 min) at the start: %.2f %.2f %.2f" % os.getloadavg())

    rng = np.random.default_rng(0)
    states = random_states(model.lower.double().numpy(), model.upper.double().numpy(), model.nv, 4096, rng)
    # τ = rnea(q, v, a): torques that give accelerations of order one.
    m64 = physics.load_urdf(xml, dtype=torch.float64, package_dirs=[share], collision=False)
    with torch.no_grad():
        tau = physics.rnea(m64, *(torch.as_tensor(x) for x in states)).numpy()
    states = (states[0], states[1], tau)

    peers = bench_peers(path, model.joint_names, states, seconds, log)
    log("Pinocchio %s: pin.aba %s steps/s, pin.computeABADerivatives %s steps/s (Python loop, one state per call)"
        % (peers["pin_version"], fmt(peers["pin_aba"]), fmt(peers["pin_derivs"])))
    log("MuJoCo mj_forward: %s steps/s (Python loop, one state per call, single-threaded)" % fmt(peers["mujoco"]))
    log("")

    header = ("| torch threads | batch | ours fwd steps/s | ours fwd+bwd steps/s | fwd / MuJoCo | fwd / pin.aba "
              "| fwd+bwd / pin ABA derivatives |")
    log(header)
    log("|" + "|".join("---" for _ in range(header.count("|") - 1)) + "|")
    for threads in (1, default_threads) if default_threads != 1 else (1,):
        torch.set_num_threads(threads)
        label = "1" if threads == 1 else "%d (default)" % threads
        for batch in batches:
            fwd, fwd_bwd = bench_ours(model, states, batch, seconds)
            log("| %s | %d | %s | %s | %.2f | %.2f | %.2f |" % (
                label, batch, fmt(fwd), fmt(fwd_bwd), fwd / peers["mujoco"], fwd / peers["pin_aba"],
                fwd_bwd / peers["pin_derivs"]))
    torch.set_num_threads(default_threads)
    log("")
    log("load average (1, 5, 15 min) at the end: %.2f %.2f %.2f on %s CPUs: other processes on the machine "
        "distort the multi-threaded rows most" % (os.getloadavg() + (os.cpu_count(),)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
