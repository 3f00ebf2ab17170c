"""Analysis of a legged robot's bag: the gait and the locomotion verdict from /odom + /joint_states.

    rep = legged_report("bags/walk", out_dir="runs/walk/analysis")
    rep["gait"]["gait"], rep["gait"]["stride_frequency_hz"], rep["files"]["footfall"]

The robot and task come from the bag's /diffsim/metadata (the controller's checkpoint
metadata); the states are the /odom and /joint_states messages paired as read_bag pairs them
(nearest stamp within half the shorter period: a robot's drivers stamp them apart). Foot contact
is read from the recorded configuration alone: a foot touches when one of its contact spheres
reaches within ``contact_tolerance`` of the ground (forward kinematics of the model, independent
of the stand-in's own contact solver). Written to ``out_dir``: footfall.png, legged.json and
legged.md.

The sim-vs-real velocity comparison of a legged bag is :func:`diffsim_ros.analysis.analyze`'s
(the base's twist and the joint velocities, replayed from the same paired states); it writes
report.md, metrics.json and the plots beside these.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict, Optional

import numpy as np
import torch

from .. import interfaces as ifc
from .bag import describes_legged_robot, legged_in_model_order, read_legged_states
from .errors import AnalysisError

__all__ = ["legged_report", "is_legged_bag", "foot_contacts_from_states", "legged_states", "odometry_check"]


def _metadata(path: Path) -> Optional[Dict[str, Any]]:
    from rosbags.highlevel import AnyReader

    with AnyReader([path]) as reader:
        conns = [c for c in reader.connections if c.topic == ifc.METADATA]
        for conn, _, raw in reader.messages(connections=conns):
            return json.loads(reader.deserialize(raw, conn.msgtype).data)
    return None


def is_legged_bag(path) -> bool:
    """Return whether the bag's controller ran a legged checkpoint (floating base, no rotors in its simulator)."""
    try:
        meta = _metadata(Path(path))
    except Exception:  # noqa: BLE001 - an unreadable bag is read_bag's to report
        return False
    return isinstance((meta or {}).get("checkpoint"), dict) and describes_legged_robot(meta)


def legged_states(path: Path, model):
    """(stamps ns, q (T, nq), v (T, nv) in ``model``'s joint order) of a legged bag.

    The states are the /odom and /joint_states pairs of :func:`..bag.read_legged_states` (the
    pairing read_bag uses).
    """
    t, q, v, names, _ = read_legged_states(path)
    return (t, *legged_in_model_order(str(path), q, v, names, model))


#: s, the averaging window of the odometry comparison (a stride or two of a trot).
ODOMETRY_WINDOW_S = 0.5


def odometry_check(task, t_s: np.ndarray, q: np.ndarray, v: np.ndarray, skip: int = 0) -> Dict[str, Any]:
    """Check legged odometry against the recorded base velocity.

    The odometry is ``LocomotionTask.estimated_velocity`` (the joints, the base's orientation and
    body rates, nothing else); the recorded base velocity is ``v``'s body-frame linear part
    (/odom's twist). From step ``skip`` on: per axis the RMS error and the means (m/s), and the
    largest difference of the forward velocity's ``ODOMETRY_WINDOW_S`` moving means.
    """
    qt = torch.as_tensor(q, dtype=task.model.dtype).clone()
    vt = torch.as_tensor(v, dtype=task.model.dtype).clone()
    qt[:, 0:3], vt[:, 0:3] = 0.0, 0.0            # what the estimate must do without
    with torch.no_grad():
        est = task.estimated_velocity(qt, vt).cpu().numpy()[skip:]
    true = np.asarray(v, dtype=np.float64)[skip:, 0:3]
    n = max(1, min(len(true), int(round(ODOMETRY_WINDOW_S / float(np.median(np.diff(t_s)))))))
    mean = lambda x: np.convolve(x, np.ones(n) / n, mode="valid")      # noqa: E731
    return {"rms_error_m_s": [round(float(x), 4) for x in np.sqrt(((est - true) ** 2).mean(0))],
            "mean_estimate_m_s": [round(float(x), 4) for x in est.mean(0)],
            "mean_recorded_m_s": [round(float(x), 4) for x in true.mean(0)],
            "window_s": ODOMETRY_WINDOW_S,
            "forward_window_error_m_s": round(float(np.abs(mean(est[:, 0]) - mean(true[:, 0])).max()), 4)}


def foot_contacts_from_states(sim, q: torch.Tensor, feet, tolerance: float = 0.005,
                              points: Optional[list] = None) -> np.ndarray:
    """(T, F) bool: the foot bodies that touch the ground.

    A foot body touches when one of its contact spheres comes within ``tolerance`` (m) of the
    ground, by forward kinematics of ``q`` (T, nq) (or the given ``points``,
    :func:`..tasks.gait.foot_points` of ``q``).
    """
    from ..tasks.gait import foot_points

    sys = sim.system
    cs = sys.contact
    out = []
    for b, x in zip(feet, foot_points(sim, q, feet) if points is None else points):   # (P, 3, T) each
        gap = (x * sys.ground_normal[None, :, None]).sum(1) - sys.ground_height - cs.radius[cs.body == b][:, None]
        out.append((gap <= tolerance).any(0))
    return torch.stack(out, 1).cpu().numpy()


def legged_report(bag, out_dir=None, contact_tolerance: float = 0.005, command: Optional[float] = None
                  ) -> Dict[str, Any]:
    """Gait (tasks/gait.py) and locomotion verdict of a legged bag; see the module doc."""
    from ..learning.checkpoint import CheckpointError
    from ..learning.deploy import task_from_metadata
    from ..tasks.gait import analyze_gait, foot_bodies, foot_points, foot_slip, foot_xy, footfall_png
    from ..physics.spatial import roll_pitch
    from ..tasks.locomotion import strict_metric

    path = Path(bag)
    meta = _metadata(path)
    if not meta or not isinstance(meta.get("checkpoint"), dict):
        raise AnalysisError(f"{path}: no /diffsim/metadata with the checkpoint's metadata; a legged bag is "
                            "analysed with the robot and task the controller ran")
    try:
        model, task = task_from_metadata(meta["checkpoint"], str(path))
    except CheckpointError as e:
        raise AnalysisError(str(e)) from None
    stamps, q, v = legged_states(path, model)
    if len(stamps) < 10:
        raise AnalysisError(f"{path}: {len(stamps)} steps with both /odom and /joint_states (at least 10 needed)")
    qt = torch.as_tensor(q, dtype=model.dtype)
    t_s = (np.array(stamps) - stamps[0]) * 1e-9
    dt = float(np.median(np.diff(t_s)))
    feet = foot_bodies(task.sim)
    foot_names = [model.body_names[b] for b in feet]
    points = foot_points(task.sim, qt, feet)       # the kinematics once, for the contacts and the slip
    contacts = foot_contacts_from_states(task.sim, qt, feet, contact_tolerance, points)
    xy = foot_xy(task.sim, task.reset(1, torch.Generator().manual_seed(0)).sim.q[0])
    skip = len(stamps) // 4                      # the start transient
    gait = analyze_gait(contacts[skip:], dt, foot_names, xy) if len(feet) == 4 else None
    slip = foot_slip(task.sim, qt[skip:], feet, contacts[skip:], dt, [x[..., skip:] for x in points])
    roll, pitch = (a.numpy() for a in roll_pitch(qt[:, 3:7].double()))
    duration = t_s[-1]
    rep: Dict[str, Any] = {"bag": str(path), "robot": model.name, "steps": len(stamps), "duration_s": float(duration),
                           "dt_s": dt, "feet": foot_names,
                           "gait": gait.as_dict() if gait is not None else None,
                           "foot_slip_m_s": [None if x is None else round(x, 4) for x in slip],
                           "mean_forward_speed_m_s": float((q[-1, 0] - q[0, 0]) / duration) if duration > 0 else None,
                           "min_base_height_m": float(q[:, 2].min()),
                           "max_tilt_rad": float(max(np.abs(roll).max(), np.abs(pitch).max()))}
    if feet and hasattr(task, "estimated_velocity"):
        rep["odometry"] = odometry_check(task, t_s, q, v, skip)
    cmd = command                                # the commanded speed is not in the bag (yet): given here
    if cmd is not None:
        gait = {}
        if getattr(task, "command_speed", None):      # the gait rules, with the task's own contact and limits
            contact, step = task.foot_arrays(qt)
            gait = dict(feet_contact=contact, feet_step=step, min_touchdown_rate=task.min_touchdown_rate,
                        max_foot_slide=task.max_foot_slide, min_swing_s=task.min_swing_s)
        rep["strict_metric"] = strict_metric(t_s, q[:, 0], q[:, 2], roll, pitch, np.zeros(len(t_s), bool), cmd,
                                             task.base_height, getattr(task, "window_s", 3.0), **gait)
    if out_dir is not None:
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        files = {"footfall": footfall_png(contacts, dt, foot_names, out / "footfall.png",
                                          title=f"{model.name}: {gait.name if gait else 'n/a'}",
                                          roles=gait.roles if gait else None),
                 "json": str(out / "legged.json"), "report": str(out / "legged.md")}
        rep["files"] = files
        (out / "legged.json").write_text(json.dumps(rep, indent=1, default=str))
        g = rep["gait"] or {}
        lines = [f"# Legged run: {path.name}", "",
                 f"robot {model.name}, {rep['steps']} steps of {dt * 1e3:.1f} ms ({duration:.2f} s)", "",
                 f"- gait: **{g.get('gait', 'n/a')}**, stride frequency {g.get('stride_frequency_hz')} Hz, "
                 f"duty factors {g.get('duty_factor')} ({', '.join(foot_names)})",
                 f"- foot slip (mean horizontal speed while on the ground) {rep['foot_slip_m_s']} m/s",
                 f"- mean forward speed {rep['mean_forward_speed_m_s']:.3f} m/s, lowest base height "
                 f"{rep['min_base_height_m']:.3f} m, largest roll/pitch {rep['max_tilt_rad']:.3f} rad",
                 "- contacts from forward kinematics of the recorded states (foot spheres within "
                 f"{contact_tolerance * 1e3:g} mm of the ground)", "", "![footfall](footfall.png)", ""]
        if "strict_metric" in rep:
            lines.insert(-2, f"- strict metric at {cmd:g} m/s: {rep['strict_metric']}")
        if "odometry" in rep:
            od = rep["odometry"]
            lines.insert(-2, f"- legged odometry (joints, base orientation and rates) against /odom: forward "
                             f"velocity's {od['window_s']:g} s means within {od['forward_window_error_m_s']:.3f} m/s, "
                             f"RMS error {od['rms_error_m_s']} m/s (x, y, z)")
        (out / "legged.md").write_text("\n".join(lines))
    return rep
