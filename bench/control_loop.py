#!/usr/bin/env python3
"""Control-loop latency: policy inference, and state-to-command over DDS beside an echo peer.

    python bench/control_loop.py [--checkpoint policies/hover] [--seconds 4] [--rates 100,250,500]

1. **Inference**: ``PolicyRunner.quadrotor`` (observation, TorchScript policy, command,
   clamp) without and with the prediction (one ``Simulator.step``), batch 1, float64,
   one torch thread; p50 and p99 over repeated calls.
2. **State to command over DDS**: this process publishes ``nav_msgs/Odometry`` on
   ``/odom`` at 100, 250 and 500 Hz (a wall timer), with the send time (wall-clock ns; the
   controller refuses stamps far from its clock) in ``header.stamp`` and the frames it
   requires (world, base_link). ``policy_controller`` (the console script, a separate process,
   ``lockstep: true``, ``predict_every: 0``) computes one command per state and
   publishes ``/diffsim/command`` whose label is that stamp; the latency is receive time
   minus send time. A deadline is missed when a command arrives later than one period
   after its state, or never (counted as lost).
3. **Peer**: the same measurement against a trivial echo node (``--echo``: a separate
   process that copies the stamp into a Float64MultiArray at once), over the same DDS
   path, QoS and message types; the ratio controller / echo isolates what the policy
   adds to the transport.

Both processes run on an isolated random ROS_DOMAIN_ID. Nothing here is a test: no
figure is asserted. Figures depend on the machine and its load (stated in the output).
"""
from __future__ import annotations

import argparse
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent


def _pct(x, q):
    return float(np.percentile(np.asarray(x), q)) if len(x) else float("nan")


# ------------------------------------------------------------------------ echo peer
def run_echo(executor: str) -> int:
    """Run a node that answers each /odom with /diffsim/command carrying the same stamp label.

    The node is spun by the same kind of executor as the controller.
    """
    import rclpy
    from nav_msgs.msg import Odometry
    from rclpy.qos import QoSProfile
    from std_msgs.msg import Float64MultiArray, MultiArrayDimension

    from diffsim_ros.nodes.common import make_executor

    rclpy.init()
    node = rclpy.create_node("echo_peer")
    pub = node.create_publisher(Float64MultiArray, "/diffsim/command", QoSProfile(depth=10))

    def on_odom(m):
        out = Float64MultiArray()
        ns = int(m.header.stamp.sec) * 1_000_000_000 + int(m.header.stamp.nanosec)
        out.layout.dim = [MultiArrayDimension(label=str(ns), size=4, stride=4)]
        out.data = [m.pose.pose.position.z, 0.0, 0.0, 0.0]
        pub.publish(out)
    node.create_subscription(Odometry, "/odom", on_odom, QoSProfile(depth=10))
    try:
        ex = make_executor(executor)
        ex.add_node(node)
        while rclpy.ok():
            ex.spin_once(timeout_sec=0.05)
    except BaseException:  # noqa: BLE001 - SIGINT/SIGTERM end the peer
        pass
    finally:
        rclpy.try_shutdown()
    return 0


# ------------------------------------------------------------------------ inference
def bench_inference(ckpt: Path, n: int = 400):
    import torch

    from diffsim_ros.learning.deploy import PolicyRunner

    torch.set_num_threads(1)
    rows = []
    for compiled in (False, True):
        r = PolicyRunner(ckpt, compile_prediction=compiled)
        for predict in ((False, True) if not compiled else (True,)):
            if compiled:   # the first call compiles (or loads the persistent cache): not timed
                t0 = time.perf_counter()
                r.quadrotor([0.0, 0.0, 1.0], [0, 0, 0, 1], [0.1, 0, 0], [0, 0.1, 0], predict=True)
                print("compiled prediction ready after %.1f s" % (time.perf_counter() - t0))
            times = []
            for i in range(n if not predict else max(50, n // 8)):
                x = 0.01 * (i % 10)
                t0 = time.perf_counter()
                r.quadrotor([x, 0.0, 1.0], [0, 0, 0, 1], [0.1, 0, 0], [0, 0.1, 0], predict=predict)
                times.append((time.perf_counter() - t0) * 1e3)
            times = times[5:]
            name = ("PolicyRunner command" + (" + prediction" if predict else "")
                    + (" (compiled step)" if compiled else ""))
            rows.append((name, _pct(times, 50), _pct(times, 99), len(times)))
    return rows


# ------------------------------------------------------------------------ DDS loop
def measure(rate: float, seconds: float, domain: int):
    """Publish /odom at ``rate`` for ``seconds``; latencies (ms) of the answers on /diffsim/command."""
    import rclpy
    from nav_msgs.msg import Odometry
    from rclpy.executors import SingleThreadedExecutor
    from rclpy.qos import QoSProfile
    from std_msgs.msg import Float64MultiArray

    ctx = rclpy.context.Context()
    rclpy.init(context=ctx, domain_id=domain)
    node = rclpy.create_node(f"bench_source_{int(rate)}", context=ctx)
    pub = node.create_publisher(Odometry, "/odom", QoSProfile(depth=10))
    sent = {}
    got = {}

    def on_cmd(m):
        t = time.time_ns()
        try:
            got[int(m.layout.dim[0].label)] = t
        except (IndexError, ValueError):
            pass
    node.create_subscription(Float64MultiArray, "/diffsim/command", on_cmd, QoSProfile(depth=100))
    ex = SingleThreadedExecutor(context=ctx)
    ex.add_node(node)
    # Wait for both directions to match, then for the responder to answer a few warm-up states.
    end = time.monotonic() + 30
    while (pub.get_subscription_count() == 0 or node.count_publishers("/diffsim/command") == 0) \
            and time.monotonic() < end:
        ex.spin_once(timeout_sec=0.05)
    msg = Odometry()
    msg.header.frame_id, msg.child_frame_id = "world", "base_link"   # the frames the controller requires
    msg.pose.pose.position.z = 1.0
    msg.pose.pose.orientation.w = 1.0

    def send():
        ns = time.time_ns()
        msg.header.stamp.sec, msg.header.stamp.nanosec = divmod(ns, 1_000_000_000)
        sent[ns] = True
        pub.publish(msg)
    for _ in range(20):                          # warm-up (first calls compile/allocate)
        send()
        t_end = time.monotonic() + 0.05
        while time.monotonic() < t_end:
            ex.spin_once(timeout_sec=0.005)
    sent.clear()
    got.clear()
    timer = node.create_timer(1.0 / rate, send)
    t_end = time.monotonic() + seconds
    while time.monotonic() < t_end:
        ex.spin_once(timeout_sec=0.001)
    timer.cancel()
    t_end = time.monotonic() + 0.5                # drain
    while time.monotonic() < t_end:
        ex.spin_once(timeout_sec=0.01)
    ex.shutdown()
    node.destroy_node()
    rclpy.shutdown(context=ctx)
    lat = [(got[k] - k) / 1e6 for k in sent if k in got]
    period_ms = 1e3 / rate
    lost = sum(1 for k in sent if k not in got)
    missed = sum(1 for x in lat if x > period_ms) + lost
    return {"sent": len(sent), "answered": len(lat), "p50": _pct(lat, 50), "p99": _pct(lat, 99),
            "missed": missed, "lost": lost}


def start(cmd, domain):
    env = dict(os.environ, ROS_DOMAIN_ID=str(domain), PYTHONUNBUFFERED="1")
    return subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def stop(proc):
    import signal

    proc.send_signal(signal.SIGINT)
    try:
        _, err = proc.communicate(timeout=15)
    except subprocess.TimeoutExpired:
        proc.kill()
        _, err = proc.communicate()
    return err


def default_checkpoint(tmp: Path) -> Path:
    for cand in (REPO / "policies" / "hover",):
        if (cand / "policy.json").is_file():
            return cand
    # No pretrained policy yet: an untrained one (latency does not depend on the weights).
    import torch

    from diffsim_ros import config
    from diffsim_ros.learning import MLPPolicy
    from diffsim_ros.learning.checkpoint import save_checkpoint

    params, task, _ = config.load_training_file(REPO / "config" / "hover.yaml")
    torch.manual_seed(0)
    save_checkpoint(MLPPolicy(task.obs_dim, task.action_dim, (64, 64)), task, tmp / "hover",
                    extra={"config": params})
    return tmp / "hover"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--checkpoint", default=None, help="hover checkpoint (default: policies/hover, else untrained)")
    ap.add_argument("--seconds", type=float, default=4.0, help="measurement per rate and responder, s")
    ap.add_argument("--rates", default="100,250,500", help="state rates, Hz")
    ap.add_argument("--predict-every", type=int, default=1,
                    help="the controller's predict_every: 1 publishes a prediction per state, 0 none")
    ap.add_argument("--eager", dest="compiled", action="store_false",
                    help="predict through the eager step (default: the compiled one, compile_prediction)")
    ap.add_argument("--executor", default="events", help="the controller's executor: events or single_threaded")
    ap.add_argument("--echo", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.echo:
        return run_echo(args.executor)
    import torch

    torch.set_num_threads(1)
    rates = [float(x) for x in args.rates.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        ckpt = Path(args.checkpoint) if args.checkpoint else default_checkpoint(Path(tmp))
        print(f"checkpoint: {ckpt}")
        print(f"machine: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f}; torch threads 1; "
              f"float64 simulator, float32 policy")
        print("\n## Policy inference (batch 1, in-process)\n")
        print("| call | p50 (ms) | p99 (ms) | calls |\n|---|---:|---:|---:|")
        for name, p50, p99, n in bench_inference(ckpt):
            print(f"| {name} | {p50:.3f} | {p99:.3f} | {n} |")

        exe = Path(sys.executable).with_name("policy_controller")
        responders = {
            "policy_controller": [str(exe), "--ros-args", "-p", f"checkpoint:={ckpt}", "-p", "lockstep:=true",
                                  "-p", f"predict_every:={args.predict_every}",
                                  "-p", f"compile_prediction:={'true' if args.compiled else 'false'}",
                                  "-p", f"executor:={args.executor}", "-p", "state_timeout_s:=5.0",
                                  # Nothing here subscribes the quadrotor's /cmd_ctbr: the start-up
                                  # preflight would (rightly) hold the safe command, not the policy.
                                  "-p", "preflight:=false"],
            "echo peer": [sys.executable, str(Path(__file__).resolve()), "--echo", "--executor", args.executor],
        }
        results = {}
        for name, cmd in responders.items():
            domain = random.randint(1, 100)
            proc = start(cmd, domain)
            try:
                for rate in rates:
                    results[(name, rate)] = measure(rate, args.seconds, domain)
            finally:
                err = stop(proc)
            if proc.returncode not in (0, -2, 130):
                print(f"{name} exited {proc.returncode}: {err[-2000:]}", file=sys.stderr)
        print("\n## State to command over DDS (separate processes, lockstep: one command per state)\n")
        print("| rate (Hz) | responder | states | answered | p50 (ms) | p99 (ms) | missed deadlines | "
              "p50 / echo p50 | p99 / echo p99 |")
        print("|---:|---|---:|---:|---:|---:|---:|---:|---:|")
        for rate in rates:
            echo = results.get(("echo peer", rate))
            for name in responders:
                r = results[(name, rate)]
                ratio = r["p50"] / echo["p50"] if echo and echo["p50"] > 0 else float("nan")
                ratio99 = r["p99"] / echo["p99"] if echo and echo["p99"] > 0 else float("nan")
                print(f"| {rate:g} | {name} | {r['sent']} | {r['answered']} | {r['p50']:.3f} | {r['p99']:.3f} | "
                      f"{r['missed']} ({100 * r['missed'] / max(r['sent'], 1):.2f} %; lost {r['lost']}) | "
                      f"{ratio:.2f} | {ratio99:.2f} |")
        pred = ("off (predict_every 0)" if args.predict_every <= 0 else
                f"on (every {args.predict_every} states, the {'compiled' if args.compiled else 'eager'} step)")
        print(f"\nA deadline is missed when the command arrives more than one period after its state (or "
              f"never: lost).\npolicy_controller: executor {args.executor}, prediction {pred}.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
