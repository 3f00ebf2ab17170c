"""``diffsim-ros analyze``, ``diffsim-ros sysid`` and ``diffsim-ros bag repair``: the commands on a bag.

``analyze`` is the sim-vs-real velocity comparison of a bag, ``sysid`` the calibration on a bag and
``bag repair`` rebuilds the index of a bag whose recorder was killed.
"""
from __future__ import annotations

import argparse
import os
import sys

from .common import CliError, _analysis_call, _command, _fmt, _int_list, _positive, _table, _text, _threads


def cmd_analyze(args: argparse.Namespace) -> int:
    horizons = _int_list(args.horizons, "--horizons")
    _threads(args.threads)
    from diffsim_ros.analysis import analyze
    from diffsim_ros.analysis.legged import is_legged_bag, legged_report

    legged_files = []
    if is_legged_bag(args.bag) and not args.state_topic:
        rep = _analysis_call(legged_report, args.bag, where=args.bag, out_dir=args.out)
        g = rep["gait"] or {}
        print(f"analyze: {rep['bag']} (legged '{rep['robot']}', {rep['duration_s']:.2f} s, {rep['steps']} steps)")
        print(f"  gait {g.get('gait', 'n/a')}, stride frequency {g.get('stride_frequency_hz')} Hz, duty factors "
              f"{g.get('duty_factor')} ({', '.join(rep['feet'])})")
        print(f"  mean forward speed {rep['mean_forward_speed_m_s']:.3f} m/s, lowest base height "
              f"{rep['min_base_height_m']:.3f} m, largest roll/pitch {rep['max_tilt_rad']:.3f} rad")
        od = rep.get("odometry")
        if od is not None:
            print(f"  legged odometry against /odom: forward velocity's {od['window_s']:g} s means within "
                  f"{od['forward_window_error_m_s']:.3f} m/s, RMS error {od['rms_error_m_s']} m/s (x, y, z)")
        legged_files = list(rep.get("files", {}).values())
    m = _analysis_call(analyze, args.bag, where=args.bag, out_dir=args.out, config_path=args.config, horizons=horizons,
                       max_starts=args.max_starts, plots=not args.no_plots, state_topic=args.state_topic,
                       command_topic=args.command_topic)
    byh = m["prediction"]["by_horizon"]
    print(f"analyze: {m['bag']} ({m['kind']} '{m['model']['name']}', {m['duration_s']:.2f} s, {m['storage']}; "
          f"model from {m['model']['source']})")
    for t, s in m["topics"].items():
        print(f"  {t:<28} {s['count']:>7} msgs {s['rate_hz']:>9.4g} Hz  jitter {s['jitter_std_s'] * 1e3:.3g} ms  "
              f"drops {s['drops']}  duplicates {s['duplicates']}  out-of-order {s['out_of_order']}")
    hs = m["prediction"]["horizons"]
    rows = [[dof] + [_fmt(byh[str(k)]["per_dof"][dof]["rmse"]) for k in hs]
            + [_fmt(byh[str(hs[0])]["per_dof"][dof]["bias"])] for dof in m["model"]["dofs"]]
    rows.append(["all"] + [_fmt(byh[str(k)]["rmse"]) for k in hs] + [""])
    print("velocity error, predicted - recorded (rad/s or m/s):")
    print(_table(["dof"] + [f"rmse@{k}" for k in hs] + [f"bias@{hs[0]}"], rows))
    for w in m["warnings"] + m["notes"]:
        print(f"warning: {w}", file=sys.stderr)
    tm = m["timing"]
    print(f"time {tm['analysis_s']:.2f} s ({tm['faster_than_real_time']:.1f}x faster than the bag's duration)")
    if args.out:
        print(f"files in {args.out}: " + ", ".join(os.path.basename(f) for f in
                                                   legged_files + list(m.get("files", {}).values())))
    return 0


def cmd_sysid(args: argparse.Namespace) -> int:
    names = [n.strip() for n in args.params.split(",") if n.strip()]
    if not names:
        raise CliError("--params must name at least one parameter")
    _positive("--window", args.window)
    _threads(args.threads)
    from diffsim_ros.analysis import calibrate, read_bag, sim_setup, write_calibrated
    from diffsim_ros.analysis.sysid import convergence_line

    data = _analysis_call(read_bag, args.bag, where=args.bag, state_topic=args.state_topic,
                          command_topic=args.command_topic)
    setup = _analysis_call(sim_setup, data, args.config, where=args.bag)
    if args.method == "contact-free":
        return _sysid_contact_free(args, names, data, setup)

    def progress(n, loss, vals, stage=""):
        if not args.quiet:
            shown = "  ".join(f"{k}=[{', '.join(f'{x:.4g}' for x in v)}]" for k, v in vals.items())
            print(f"  eval {n:>3}  {stage + '  ' if stage else ''}loss {loss:.5g}  {shown}", flush=True)

    r = _analysis_call(calibrate, data, setup, names, where=args.bag, window=args.window,
                       fit_fraction=args.fit_fraction, max_starts=args.max_starts, max_iter=args.max_iter,
                       progress=progress, velocity_noise=args.velocity_noise)
    files = _analysis_call(write_calibrated, r, setup, args.out, bag=str(args.bag), force=args.write_rejected)
    print(f"sysid: {args.bag} ({r.fit_starts} windows of {r.window} steps to fit, {r.heldout_starts} held out; "
          f"{r.evaluations} evaluations, {r.seconds:.1f} s)")
    rows = [[n, ", ".join(f"{x:.5g}" for x in r.nominal[n]), ", ".join(f"{x:.5g}" for x in r.fitted[n]),
             ", ".join(f"{x:.2g}" for x in r.std.get(n, []))] for n in r.names]
    print(_table(["parameter", "nominal", "calibrated", "std"], rows))
    h = r.heldout
    print(f"held-out velocity RMSE {h['before']['rmse']:.4g} -> {h['after']['rmse']:.4g} "
          f"({h['improvement']:.2f}x smaller)")
    print(convergence_line(r.convergence))
    for n in r.notes:
        print(f"warning: {n}", file=sys.stderr)
    return _sysid_verdict(args, r, files)


def _sysid_verdict(args: argparse.Namespace, r, files) -> int:
    """Print the files written and return the exit status of a fit: 0 accepted, 3 rejected (with the reasons)."""
    print(f"files in {args.out}: " + ", ".join(os.path.basename(f) for f in files.values()))
    if not r.accepted:
        print("sysid: fit rejected: " + "; ".join(r.reasons), file=sys.stderr)
        return 3
    print(f"retrain: diffsim-ros train --config {files['yaml']} --out DIR   (or fine-tune the deployed "
          f"policy: add --init-from ITS_CHECKPOINT_DIR)")
    return 0


def _sysid_contact_free(args: argparse.Namespace, names, data, setup) -> int:
    from diffsim_ros.analysis.contact_free import contact_free_mass, write_contact_free

    if not args.contact_tolerance > 0:
        raise CliError(f"--contact-tolerance must be positive (m), got {args.contact_tolerance}")
    if names == ["ground_friction"]:
        return _sysid_ground_friction(args, data, setup)
    if names != ["mass_scale"]:
        raise CliError(f"--method contact-free identifies mass_scale or ground_friction, one at a time "
                       f"(--params mass_scale or --params ground_friction), not {names}")
    r = _analysis_call(contact_free_mass, data, setup, where=args.bag, contact_tolerance=args.contact_tolerance,
                       fit_fraction=args.fit_fraction)
    files = _analysis_call(write_contact_free, r, setup, args.out, bag=str(args.bag), force=args.write_rejected)
    print(f"sysid (contact-free): {args.bag} ({r.fit_intervals} intervals to fit, {r.heldout_intervals} held out, "
          f"{r.equations} equations; {r.seconds:.1f} s)")
    print(_table(["parameter", "nominal", "calibrated", "std", "held-out end alone"],
                 [["mass_scale", "1", f"{r.mass_scale:.5g}", f"{r.std:.2g}", f"{r.heldout_mass_scale:.5g}"]]))
    print(f"explained: {r.explained:.2%} of the projected applied impulse (fit), {r.explained_heldout:.2%} (held out)")
    return _sysid_verdict(args, r, files)


def _sysid_ground_friction(args: argparse.Namespace, data, setup) -> int:
    from diffsim_ros.analysis.ground_friction import ground_friction, write_ground_friction

    if not args.slide_speed > 0:
        raise CliError(f"--slide-speed must be positive (m/s), got {args.slide_speed}")
    r = _analysis_call(ground_friction, data, setup, where=args.bag, contact_tolerance=args.contact_tolerance,
                       slide_speed=args.slide_speed)
    files = _analysis_call(write_ground_friction, r, setup, args.out, bag=str(args.bag), force=args.write_rejected)
    print(f"sysid (contact-free ground friction): {args.bag} ({r.solved} of {r.intervals} intervals with every "
          f"touching foot steady; {r.loaded} loaded foot-intervals, {r.sliding} sliding at the friction cone; mass "
          f"{r.mass_note}; {r.seconds:.1f} s)")
    print(_table(["parameter", "nominal", "calibrated", "sliding feet's quartiles", "lower bound"],
                 [["ground_friction", f"{setup.sim_config.friction:.4g}", f"{r.friction:.4g}",
                   ", ".join(f"{x:.4g}" for x in r.quartiles), f"{r.lower_bound:.4g}"]]))
    return _sysid_verdict(args, r, files)


def _add_bag_args(p) -> None:
    p.add_argument("bag", metavar="BAG", help="rosbag2 directory (MCAP or sqlite3 storage)")
    p.add_argument("--config", metavar="YAML", default=None,
                   help="training file giving the robot and simulator (default: the bag's /diffsim/metadata)")
    p.add_argument("--state-topic", default=None, metavar="TOPIC",
                   help="state topic (default: /joint_states, else /odom)")
    p.add_argument("--command-topic", default=None, metavar="TOPIC",
                   help="command topic (default: /diffsim/command, else /cmd_ctbr, /cmd_rotor_thrust, "
                        "/<controller>/commands)")
    p.add_argument("--threads", type=int, default=1, metavar="N", help="torch intra-op threads (default: 1)")


def _add_analyze(sub) -> None:
    p = _command(sub, "analyze", cmd_analyze,
                 help="compare a bag's recorded velocities with the simulator's, 1 and k steps ahead",
                 description="""Read a rosbag2 bag (layout of doc/interfaces.md), report the topics' timing (jitter,
                 drops, duplicates, out-of-order), replay the recorded commands through the simulator from every
                 recorded state 1 and k steps ahead, and report the velocity error per joint or axis (RMSE, bias,
                 maximum, growth with the horizon); with --out, write metrics.json, velocity.png, error_vs_horizon.png
                 and report.md. A legged robot's bag (/odom and /joint_states paired by nearest stamp, a floating base
                 with joints) is replayed whole, the base's twist and the joints; its gait (footfall.png, legged.json,
                 legged.md) is reported as well.""")
    _add_bag_args(p)
    p.add_argument("--out", default=None, metavar="DIR", help="output folder (default: print only)")
    p.add_argument("--horizons", default="1,5,10", metavar="K,K,...",
                   help="prediction horizons in control steps (default: 1,5,10)")
    p.add_argument("--max-starts", type=int, default=4096, metavar="N",
                   help="start states of the k > 1 step predictions, evenly spread (default: 4096; one-step "
                        "predictions use every state)")
    p.add_argument("--no-plots", action="store_true", help="skip the PNG plots")


def _add_sysid(sub) -> None:
    from diffsim_ros.physics.registry import help_text

    from_params = help_text()
    p = _command(sub, "sysid", cmd_sysid,
                 help="calibrate simulator parameters on a bag by gradient descent through the simulator",
                 description="""Fit simulator parameters to a bag through the differentiable simulator, on the
                 velocity error over short multi-step windows of the first part of the bag, judged on the rest, all
                 parameters jointly (projected Levenberg-Marquardt in log coordinates, a few starts for latency and
                 lags); report uncertainties, unidentifiable parameters and a verdict; write sysid.json and sysid.md,
                 and for an accepted fit calibrated.yaml (a training file for `diffsim-ros train --config`) and
                 calibrated.urdf when masses, damping or friction change. Exit status: 0 accepted, 3 fit rejected (the
                 held-out RMSE did not improve clearly, or the residual stays far above the noise floor, or the fit
                 ended on its iteration limit after twice --max-iter iterations; reasons in sysid.md), 2 bad
                 input.""")
    _add_bag_args(p)
    p.add_argument("--params", required=True, metavar="NAME,...", help=f"parameters to fit: {from_params}")
    p.add_argument("--out", required=True, metavar="DIR", help="output folder")
    p.add_argument("--window", type=int, default=5, metavar="STEPS",
                   help="control steps per fitting window (default: 5)")
    p.add_argument("--fit-fraction", type=float, default=0.7, metavar="F",
                   help="fraction of the bag (from its start) used to fit; the rest is held out (default: 0.7)")
    p.add_argument("--max-starts", type=int, default=256, metavar="N",
                   help="windows used to fit (and to judge), evenly spread (default: 256)")
    p.add_argument("--max-iter", type=int, default=30, metavar="N",
                   help="Levenberg-Marquardt iterations per start (default: 30)")
    p.add_argument("--velocity-noise", type=float, default=0.0, metavar="STD",
                   help="the sensor's velocity noise (standard deviation, rad/s or m/s) for the verdict's noise "
                        "floor (default: 0)")
    p.add_argument("--write-rejected", action="store_true",
                   help="write calibrated.yaml even for a rejected fit")
    p.add_argument("--method", choices=("replay", "contact-free"), default="replay",
                   help=_text("""replay: the fit through the simulator described above (default); contact-free,
                   for a legged robot's bag whose ground differs from the simulator's, without the simulator's
                   contact model: --params mass_scale from the equations of motion projected away from the touching
                   contact points (analysis/contact_free.py), or --params ground_friction from the feet's impulses
                   where they slide (analysis/ground_friction.py; the calibrated file re-centres
                   training.randomize_ground_friction on the estimate)"""))
    p.add_argument("--contact-tolerance", type=float, default=0.005, metavar="M",
                   help="contact-free: a contact point within this distance of the ground counts as touching "
                        "(default: 0.005 m)")
    p.add_argument("--slide-speed", type=float, default=0.03, metavar="M/S",
                   help="contact-free ground_friction: a foot slides when its contact point moves faster than this "
                        "along the ground, against its friction, throughout a control interval (default: 0.03 m/s)")
    p.add_argument("--quiet", action="store_true", help="no per-evaluation progress")


def cmd_bag_repair(args: argparse.Namespace) -> int:
    from diffsim_ros.analysis.bagfile import repair

    report = _analysis_call(repair, args.bag, where=args.bag)
    print(report.summary())
    return 0


def _add_bag(sub) -> None:
    p = sub.add_parser("bag", help="bag maintenance (repair)",
                       description="Maintenance of rosbag2 bags (MCAP storage).")
    bag_sub = p.add_subparsers(dest="bag_command", metavar="SUBCOMMAND", required=True)
    r = _command(bag_sub, "repair", cmd_bag_repair,
                 help="rebuild the index, summary and metadata.yaml of a bag whose recorder was killed",
                 description="""The equivalent of `ros2 bag reindex`: scan the MCAP file of BAG, keep every complete
                 chunk whose CRC holds, write its summary, chunk index and footer, and rewrite metadata.yaml (topics,
                 message counts, start, duration) from what the file holds. A complete file is left unchanged
                 (metadata.yaml is still rewritten).""")
    r.add_argument("bag", metavar="BAG", help="rosbag2 directory (MCAP storage) or .mcap file")
