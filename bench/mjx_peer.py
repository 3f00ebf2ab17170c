#!/usr/bin/env python3
"""MJX (MuJoCo on JAX) as a peer of bench/step.py: steps/s of a model given as MJCF.

    python bench/mjx_peer.py MODEL.xml STATE.json --batches 1,256,4096 --seconds 0.25

Run by bench/step.py in an interpreter that has ``mujoco.mjx`` and ``jax`` (the project
does not depend on them); prints one JSON object: {"batch": {"fwd": steps/s, "grad": steps/s}}.
fwd: ``jax.jit(jax.vmap(mjx.step))`` over the batch, K steps per call; grad: the gradient
of the sum of the final qpos and qvel of a K-step rollout with respect to the initial
qpos and qvel (``jax.grad`` through ``lax.scan``, with one constraint-solver iteration:
the only setting reverse mode passes in this MJX), the same loss as ours. float32 on the
CPU, as JAX's default. Timing: best of 3 windows of >= --seconds after a compile call.
"""
from __future__ import annotations

import argparse
import json
import sys
import time


def main(argv=None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("xml")
    parser.add_argument("state")
    parser.add_argument("--batches", default="1,256,4096")
    parser.add_argument("--seconds", type=float, default=0.25)
    parser.add_argument("--iterations", type=int, default=None, help="constraint-solver iterations (forward)")
    parser.add_argument("--ls-iterations", type=int, default=None, help="line-search iterations")
    args = parser.parse_args(argv)
    import os
    os.environ.setdefault("XLA_FLAGS", "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1")
    import jax
    import jax.numpy as jnp
    import mujoco
    from mujoco import mjx

    model = mujoco.MjModel.from_xml_path(args.xml)
    st = json.load(open(args.state))
    if args.iterations is not None:
        model.opt.iterations = args.iterations
    if args.ls_iterations is not None:
        model.opt.ls_iterations = args.ls_iterations
    mx = mjx.put_model(model)
    # Reverse mode cannot pass MJX's constraint-solver while_loop; one solver iteration is
    # the setting under which jax.grad runs (MuJoCo issue #2259), so the gradient uses it.
    model.opt.iterations = 1
    mx_grad = mjx.put_model(model)
    d0 = mjx.make_data(mx)
    d0 = d0.replace(qpos=jnp.asarray(st["qpos"], jnp.float32), qvel=jnp.asarray(st["qvel"], jnp.float32),
                    ctrl=jnp.asarray(st["ctrl"], jnp.float32))

    def rate(fn, steps):
        jax.block_until_ready(fn())
        best = 0.0
        for _ in range(3):
            calls, start = 0, time.perf_counter()
            while True:
                jax.block_until_ready(fn())
                calls += 1
                el = time.perf_counter() - start
                if el >= args.seconds:
                    break
            best = max(best, calls * steps / el)
        return best

    out = {}
    for batch in [int(b) for b in args.batches.split(",")]:
        k = 2 if batch >= 4096 else 10
        kb = 2 if batch >= 4096 else 5
        batched = jax.tree_util.tree_map(lambda x: jnp.broadcast_to(x, (batch,) + jnp.shape(x)), d0)

        @jax.jit
        def fwd(d):
            def body(d, _):
                return jax.vmap(mjx.step, in_axes=(None, 0))(mx, d), None
            return jax.lax.scan(body, d, None, length=k)[0]

        def loss(qpos, qvel):
            d = batched.replace(qpos=qpos, qvel=qvel)

            def body(d, _):
                return jax.vmap(mjx.step, in_axes=(None, 0))(mx_grad, d), None
            d = jax.lax.scan(body, d, None, length=kb)[0]
            return d.qpos.sum() + d.qvel.sum()
        grad = jax.jit(jax.grad(loss, argnums=(0, 1)))
        out[batch] = {"fwd": rate(lambda: fwd(batched).qpos, k * batch),
                      "grad": rate(lambda: grad(batched.qpos, batched.qvel), kb * batch)}
        print(json.dumps({"progress": batch}), file=sys.stderr, flush=True)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
