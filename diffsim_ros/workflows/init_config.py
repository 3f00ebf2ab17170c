"""``diffsim-ros init``: a commented training file for a robot the project does not ship.

    diffsim-ros init --urdf my_arm.urdf --task reach --out config/my_arm.yaml
    diffsim-ros train --config config/my_arm.yaml --out runs/my_arm

Everything the file holds is derived from the URDF and says where it came from:

- **Actuated joints**: every moving joint except the ones a gripper is made of (a joint or
  child link named like finger, gripper, hand, claw, jaw, thumb or knuckle, or a pair of
  prismatic jaws at the end of a chain) unless ``--include-joints`` names them; a joint with
  ``<mimic>`` follows its leader and is never actuated. Each joint left out is printed with
  its reason.
- **PD gains**: a servo of ``--bandwidth`` Hz (default 4) and ``--damping-ratio`` (default 1)
  on the joint-space inertia: kp = M_ii w^2, kd = 2 zeta sqrt(kp M_ii) (= 2 zeta M_ii w),
  with M_ii the largest diagonal entry of ``physics.crba`` over the configurations the task
  visits; kp is capped so that the largest commanded position error asks for no more than
  the URDF effort limit, and (legged robots) raised so that standing sags by at most 0.1 rad.
- **Reach**: the end effector (the tip of the longest actuated chain, or ``--ee-link``), the
  range targets are drawn from (joint travel the URDF velocity limits can cover in half an
  episode) and the workspace it spans (sampled forward kinematics), written as comments.
- **Legged robots**: a standing configuration (an SRDF ``group_state`` beside the URDF, else
  the hip and knee pitch joints of each leg bent 0.8 / -1.6 rad) and the base height at which
  its lowest collision point, a foot, touches the ground.
- **Multirotors** (a floating base without joints): a rotor layout template, from links named
  rotor/prop/motor if there are such, else an X layout sized from the base's collision box;
  thrust and drag coefficients scaled from the propeller size and the mass (check them).

Training and PPO sections are the project's own files' (config/reach_panda.yaml,
hover.yaml, waypoint.yaml, velocity.yaml, locomotion.yaml).
"""
from __future__ import annotations

import math
import os
import re
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

#: --task values and the task section they become (type, quadrotor mode)
TASK_CHOICES = {"reach": ("reach", None), "hover": ("quadrotor", "hover"), "waypoint": ("quadrotor", "waypoint"),
                "velocity": ("quadrotor", "velocity"), "locomotion": ("locomotion", None), "jump": ("jump", None)}
#: tasks asked for that diffsim_ros.tasks has no implementation of (refused, not invented)
UNAVAILABLE_TASKS: Tuple[str, ...] = ()
GRIPPER_WORDS = ("finger", "gripper", "hand", "claw", "jaw", "thumb", "knuckle")
ROTOR_WORDS = ("rotor", "prop", "motor")
#: Default servo bandwidth, Hz. A 4 Hz critically damped servo (w = 25 rad/s) settles a step in
#: about 5.8 / w = 0.23 s, a small part of a 1-2 s episode, and stays 12-25 times slower than the
#: 50-100 Hz policy that moves its target, so the policy never drives it near its own frequency.
DEFAULT_BANDWIDTH_HZ = 4.0
DEFAULT_DAMPING_RATIO = 1.0
STANCE_BEND = 0.8          # rad, hip pitch of the heuristic stance (the knee bends twice as far back)
STAND_SAG = 0.1            # rad, largest joint deflection under the standing load a legged servo allows
FRICTION_ERROR = 0.01     # rad, largest static error the URDF's Coulomb friction may leave against kp
CONTACT_STEP = 0.8        # largest product of a substep and the foot contact's frequency (legged robots)
GAIN_SAMPLES = 64          # configurations M_ii is maximised over (besides the nominal one)
SRDF_STATES = ("standing", "stand", "straight_standing", "home", "default", "ready", "init")


class InitError(ValueError):
    """A robot or option ``diffsim-ros init`` cannot write a training file for."""


@dataclass
class JointChoice:
    name: str
    actuated: bool
    reason: str = ""


@dataclass
class Gain:
    joint: str
    inertia: float             # M_ii, kg m^2 (kg for a prismatic joint)
    effort: float              # URDF effort limit (inf: none)
    kp: float
    kd: float
    bound: str = ""            # "", "effort cap" or "stand load"
    at: List[float] = field(default_factory=list)   # the configuration q where M_ii is largest
    damping: float = 0.0       # URDF <dynamics damping>, counted in kd's damping ratio
    friction: float = 0.0      # URDF <dynamics friction>


@dataclass
class Plan:
    """What ``init`` derived.

    The parameter mapping (``params``, as the file holds it) and the evidence behind it (joints
    with reasons, gains with their inputs, notes printed).
    """

    params: Dict[str, Any]
    urdf_path: Path
    task: str
    joints: List[JointChoice] = field(default_factory=list)
    gains: List[Gain] = field(default_factory=list)
    notes: List[str] = field(default_factory=list)
    info: Dict[str, Any] = field(default_factory=dict)
    comments: Dict[str, List[str]] = field(default_factory=dict)   # dotted key -> lines above it
    inline: Dict[str, str] = field(default_factory=dict)           # dotted key -> end-of-line comment
    header: List[str] = field(default_factory=list)


# ---------------------------------------------------------------------------- URDF
def urdf_reference(path: Path) -> str:
    """How the training file names ``path``.

    Relative to this package's share folder, as ``package://example-robot-data/...``, or absolute.
    """
    from ..config import package_share

    path = path.resolve()
    parts = path.parts
    if "example-robot-data" in parts:
        i = len(parts) - 1 - parts[::-1].index("example-robot-data")
        if i > 0 and parts[i - 1] == "share":
            return "package://" + "/".join(parts[i:])
    share = package_share()
    if share is not None:
        try:
            rel = path.relative_to(share.resolve())
            if not any(part.startswith(".") for part in rel.parts):     # not inside a venv or cache
                return rel.as_posix()
        except ValueError:
            pass
    return str(path)


def _find_urdf(arg: str) -> Path:
    from .. import config

    if os.path.isfile(arg):
        return Path(arg).resolve()
    try:
        return config.resolve_urdf({"urdf": arg})
    except config.ConfigError:
        raise InitError(f"--urdf {arg}: no such file (a path, package://<package>/<path>, or a path in the "
                        f"diffsim_ros share folder)") from None


def srdf_states(urdf: Path, robot: str) -> Dict[str, Dict[str, float]]:
    """Joint values of the ``<group_state>``s of an SRDF for ``robot`` beside the URDF.

    The SRDF is looked for in the same folder or ../srdf (the layout of ROS description packages).
    """
    import xml.etree.ElementTree as ET

    found: Dict[str, Dict[str, float]] = {}
    for folder in (urdf.parent, urdf.parent.parent / "srdf"):
        if not folder.is_dir():
            continue
        for f in sorted(folder.glob("*.srdf")):
            try:
                root = ET.parse(f).getroot()
            except (ET.ParseError, OSError):
                continue
            if root.get("name") != robot and f.stem != urdf.stem:
                continue
            for gs in root.iter("group_state"):
                state = gs.get("name")
                if state is None:
                    continue         # nameless (the SRDF requires a name): no stance can ask for it
                vals = {}
                for j in gs.iter("joint"):
                    joint, value = j.get("name"), j.get("value")
                    if joint is None or value is None:
                        continue     # the SRDF requires both: a joint without them sets nothing
                    try:
                        vals[joint] = float(value)
                    except ValueError:
                        pass         # a root joint's 7 numbers: not a joint angle
                found.setdefault(state, vals)
            if found:
                found["__file__"] = {str(f): 0.0}
                return found
    return found


# ---------------------------------------------------------------------------- joints
def _gripper_word(*names: str) -> Optional[str]:
    for n in names:
        low = n.lower()
        for w in GRIPPER_WORDS:
            if w in low:
                return w
    return None


def choose_joints(desc, model, include: Sequence[str] = ()) -> List[JointChoice]:
    """Actuated or not, with the reason, for every moving joint of ``model``.

    The joints come in the full tree's order (``model.full_joint_names``), mimic joints included.
    """
    by_name = {j.name: j for j in desc.joints}
    include = list(include)
    for name in include:
        if name not in model.full_joint_names:
            raise InitError(f"--include-joints: '{name}' is not a moving joint of '{model.name}' "
                            f"(moving joints: {', '.join(model.full_joint_names)})")
        mim = by_name[name].mimic
        if mim is not None:
            raise InitError(f"--include-joints: '{name}' mimics '{mim.joint}' and follows it; a mimic joint "
                            f"is never actuated (include '{mim.joint}' instead)")
    # Bodies with a moving joint below them; prismatic leaves per parent body (a gripper's jaws).
    has_child = set(p for p in model.parent if p >= 0)
    body_of = {n: i + (1 if model.floating_base else 0) for i, n in enumerate(model.full_joint_names)}
    jaws: Dict[int, List[str]] = {}
    for name in model.full_joint_names:
        b = body_of[name]
        if model.joint_type[b] == "prismatic" and b not in has_child:
            jaws.setdefault(model.parent[b], []).append(name)
    out = []
    for name in model.full_joint_names:
        j = by_name[name]
        if j.mimic is not None:
            out.append(JointChoice(name, False, f"mimics '{j.mimic.joint}' (x {j.mimic.multiplier:g}, offset "
                                                f"{j.mimic.offset:g}): it follows its leader and is never actuated "
                                                f"(the simulator couples it: it is no coordinate of q/v)"))
            continue
        if name in include:
            out.append(JointChoice(name, True, "asked for by --include-joints"))
            continue
        word = _gripper_word(name, j.child)
        if word is not None:
            out.append(JointChoice(name, False, f"a gripper joint by its name ('{word}' in "
                                                f"'{name if word in name.lower() else j.child}'); "
                                                f"--include-joints {name} drives it"))
            continue
        pair = jaws.get(model.parent[body_of[name]], [])
        if len(pair) >= 2 and name in pair:
            out.append(JointChoice(name, False, f"prismatic at the end of a chain beside {len(pair) - 1} other(s) "
                                                f"({', '.join(p for p in pair if p != name)}): a gripper's jaws; "
                                                f"--include-joints {name} drives it"))
            continue
        out.append(JointChoice(name, True))
    return out


# ---------------------------------------------------------------------------- geometry
def lowest_points(model, q) -> List[Tuple[float, str, int]]:
    """(height of the lowest point, link, body) of every collision primitive at configuration ``q``.

    ``q`` is one state; the heights come from the simulator's forward kinematics: sphere centre
    minus radius, the lowest box corner, the lowest point of a cylinder's rim.
    """
    import torch

    from .. import physics

    R, p = physics.body_placements(model, torch.as_tensor(q, dtype=model.dtype).reshape(1, -1))
    R, p = R[0].double(), p[0].double()
    out = []
    for c in model.collisions:
        if c.body < 0:
            continue
        Rc = R[c.body] @ c.R.double()
        pc = p[c.body] + R[c.body] @ c.p.double()
        size = c.size.double()
        if c.kind == "sphere":
            z = float(pc[2] - size[0])
        elif c.kind == "box":
            z = float(pc[2] - 0.5 * (Rc[2, :].abs() * size).sum())
        else:   # cylinder, axis local z
            az = float(Rc[2, 2])
            z = float(pc[2]) - abs(az) * 0.5 * float(size[1]) - float(size[0]) * math.sqrt(max(0.0, 1 - az * az))
        out.append((z, c.link, c.body))
    return out


def foot_bodies(model) -> List[int]:
    """Bodies at the ends of the kinematic chains that carry collision geometry."""
    parents = set(model.parent)
    with_geometry = set(c.body for c in model.collisions)
    return [b for b in range(model.nb) if b not in parents and b in with_geometry and model.joint_type[b] != "free"]


def _chain(model, body: int) -> List[int]:
    out = []
    while body >= 0:
        out.append(body)
        body = model.parent[body]
    return out[::-1]


def heuristic_stance(model, actuated: Sequence[str]) -> Tuple[List[float], str]:
    """Joint positions (model joint order) of a crouched stance.

    On every leg the last two joints whose axis is the body's lateral (y) axis bend +STANCE_BEND
    and -2 STANCE_BEND (the foot back under the hip for equal segments), the sign chosen so both
    stay within their limits.
    """
    import torch

    from .. import physics

    q = model.neutral_configuration()
    qj = q[7:].clone()
    Rw, _ = physics.body_placements(model, q[None])
    Rw = Rw[0]
    legs = 0
    for foot in foot_bodies(model):
        pitch = []
        for b in _chain(model, foot):
            if model.joint_type[b] in ("revolute", "continuous"):
                name = model.full_joint_names[b - 1]
                s = float((Rw[b] @ model.axis[b])[1])      # joint axis, world y component
                if abs(s) > 0.9 and name in actuated:
                    pitch.append((model.joint_names.index(name), math.copysign(1.0, s)))
        if len(pitch) < 2:
            continue
        (i, si), (k, sk) = pitch[-2], pitch[-1]
        for sign in (1.0, -1.0):
            a, c = sign * STANCE_BEND / si, -sign * 2 * STANCE_BEND / sk
            if (model.lower[i] <= a <= model.upper[i]) and (model.lower[k] <= c <= model.upper[k]):
                break
        qj[i], qj[k] = a, c
        legs += 1
    qj = torch.minimum(torch.maximum(qj, model.lower), model.upper)
    how = (f"the last two lateral-axis joints of each of {legs} legs bent {STANCE_BEND:g} and "
           f"{-2 * STANCE_BEND:g} rad (diffsim-ros init's heuristic; check it)") if legs else \
        "the URDF's zero configuration (no leg with two lateral-axis joints found; check it)"
    return qj.tolist(), how


# ---------------------------------------------------------------------------- gains
def inertia_diagonal(model, qs):
    """(N, nj) diagonal joint-space inertia of the joints at configurations ``qs`` (N, nq)."""
    from .. import physics

    M = physics.crba(model, qs).diagonal(dim1=-2, dim2=-1)
    return M[:, model.nv - model.nj:]


def servo_gains(model, actuated: Sequence[str], qs, bandwidth_hz: float, zeta: float, error: float,
                hold_torque=None) -> List[Gain]:
    """Return the servo gains (kp, kd) of the ``actuated`` joints.

    kp = M_ii w^2 (w = 2 pi bandwidth), raised to |hold_torque| / STAND_SAG where given and to
    friction / FRICTION_ERROR, capped at effort_limit / error; kd = 2 zeta sqrt(kp M_ii) less the
    joint's URDF damping (at least 0); M_ii the largest over the configurations ``qs``.
    """
    w = 2 * math.pi * bandwidth_hz
    M = inertia_diagonal(model, qs)
    gains = []
    for name in actuated:
        i = model.joint_names.index(name)
        k = int(M[:, i].argmax())
        m = float(M[k, i])
        effort = float(model.effort_limit[i])
        kp, bound = m * w * w, ""
        if hold_torque is not None and abs(hold_torque[i]) / STAND_SAG > kp:
            kp, bound = abs(hold_torque[i]) / STAND_SAG, "stand load"
        friction = float(model.friction[i])
        if friction / FRICTION_ERROR > kp:
            kp, bound = friction / FRICTION_ERROR, "friction"
        if math.isfinite(effort) and kp * error > effort:
            kp, bound = effort / error, "effort cap"
        # The joint's own URDF damping counts towards the damping ratio.
        kd = max(0.0, 2 * zeta * math.sqrt(kp * m) - float(model.damping[i]))
        gains.append(Gain(name, m, effort, kp, kd, bound, qs[k].tolist(), float(model.damping[i]), friction))
    return gains


def _uniform(model, n: int, lo, hi, seed: int = 0):
    import torch

    g = torch.Generator().manual_seed(seed)
    u = torch.rand(n, len(lo), generator=g, dtype=torch.float64).to(model.dtype)
    return lo + (hi - lo) * u


# ---------------------------------------------------------------------------- the plan
def plan(urdf: str, task: str, floating_base: Optional[bool] = None, ee_link: Optional[str] = None,
         include_joints: Sequence[str] = (), bandwidth: float = DEFAULT_BANDWIDTH_HZ,
         damping_ratio: float = DEFAULT_DAMPING_RATIO) -> Plan:
    """Derive a training file for ``urdf`` and ``task`` (see the module doc).

    InitError on a robot or option it cannot serve.
    """
    import torch

    from .. import physics
    from ..physics.urdf import parse_urdf

    if task in UNAVAILABLE_TASKS:
        raise InitError(f"--task {task}: diffsim_ros.tasks has no '{task}' task (available: "
                        f"{', '.join(TASK_CHOICES)}); write the task first (diffsim_ros/tasks)")
    if task not in TASK_CHOICES:
        raise InitError(f"--task {task}: unknown (available: {', '.join(TASK_CHOICES)})")
    if not bandwidth > 0:
        raise InitError(f"--bandwidth must be > 0 Hz, got {bandwidth}")
    if not damping_ratio > 0:
        raise InitError(f"--damping-ratio must be > 0, got {damping_ratio}")
    kind, mode = TASK_CHOICES[task]
    needs_base = kind in ("quadrotor", "locomotion", "jump")
    if kind == "reach" and floating_base:
        raise InitError("--task reach drives an arm bolted to the world: drop --floating-base")
    path = _find_urdf(urdf)
    notes: List[str] = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        desc = parse_urdf(str(path))
        model = physics.build_model(desc, floating_base=needs_base, dtype=torch.float64)
    notes += [f"warning: {w.message}" for w in caught]
    if needs_base and not floating_base:
        notes.append(f"note: --task {task} needs a floating base: floating_base: true")
    p = Plan(params={}, urdf_path=path, task=task, notes=notes)
    p.params["urdf"] = urdf_reference(path)
    p.params["floating_base"] = needs_base
    p.params["dtype"] = "float32"
    p.info["model"] = model
    if kind == "quadrotor":
        assert mode is not None      # every quadrotor task of TASK_CHOICES names its mode
        _plan_multirotor(p, model, mode)
    else:
        p.joints = choose_joints(desc, model, include_joints)
        actuated = [j.name for j in p.joints if j.actuated]
        if not actuated:
            raise InitError(f"{path}: no joint left to actuate "
                            f"({'; '.join(j.name + ': ' + j.reason for j in p.joints)})")
        if kind == "reach":
            _plan_reach(p, model, actuated, ee_link, bandwidth, damping_ratio)
        else:
            _plan_locomotion(p, model, desc, actuated, bandwidth, damping_ratio)
            if kind == "jump":
                _as_jump(p)
    return p


def _gain_comment(p: Plan, error: float, error_name: str, samples: str, bandwidth: float, zeta: float,
                  legged: bool) -> List[str]:
    w = 2 * math.pi * bandwidth
    lines = [f"Gains (diffsim-ros init): a servo of {bandwidth:g} Hz bandwidth (w = 2 pi {bandwidth:g} = {w:.2f} "
             f"rad/s), damping ratio zeta = {zeta:g}:",
             "  kp = M_ii w^2, kd = 2 zeta sqrt(kp M_ii) - d (= 2 zeta M_ii w - d where kp is not bounded),",
             "  d: the joint's URDF <dynamics damping>, which counts towards zeta;",
             f"  M_ii: the joint's largest diagonal entry of the joint-space inertia (physics.crba) over {samples};",
             f"  effort cap: kp x {error_name} ({error:.3g}) <= the URDF effort limit (the largest commanded error "
             f"asks for at most the limit)"]
    lines.append(f"  friction: kp >= URDF <dynamics friction> / {FRICTION_ERROR:g} rad (the friction leaves at most "
                 f"{FRICTION_ERROR:g} rad of static error)")
    if legged:
        lines.append(f"  stand load: kp >= |joint torque holding the robot on its feet| / {STAND_SAG:g} rad (at most "
                     f"{STAND_SAG:g} rad of sag when standing)")
    lines.append(f"  {'joint':<22}{'M_ii':>11}{'effort':>9}{'d':>7}{'friction':>9}{'kp':>10}{'kd':>9}  bound")
    for g in p.gains:
        eff = f"{g.effort:g}" if math.isfinite(g.effort) else "none"
        lines.append(f"  {g.joint:<22}{g.inertia:>11.4g}{eff:>9}{g.damping:>7.3g}{g.friction:>9.3g}{g.kp:>10.4g}"
                     f"{g.kd:>9.4g}  {g.bound or '-'}")
    return lines


def _reach_ee_link(model, actuated: List[str], ee_link: Optional[str]) -> Tuple[str, str]:
    """Choose the reach task's end effector, and say why it was chosen.

    ``ee_link`` when given (checked: a link of the model that an actuated joint moves), else the
    tip of the longest chain (the demo's choice), unless no actuated joint moves that tip (a
    finger): then the link fixed to the deepest actuated body farthest from its origin.
    """
    from .. import physics
    from ..dynamics_demo import tip_position

    poses = physics.forward_kinematics(model, model.neutral_configuration()[None])[0]
    act_bodies = set(model.full_joint_names.index(n) for n in actuated)   # fixed base: body = full joint index
    if ee_link is None:
        tip, _ = tip_position(model, poses)
        body = model.link_body[model.link_names.index(tip)]
        if body in act_bodies:
            ee_link, why = tip, "the tip of the longest kinematic chain"
        else:
            deepest = max(act_bodies, key=lambda b: (len(_chain(model, b)), b))
            cands = [i for i, b in enumerate(model.link_body) if b == deepest]
            k = max(cands, key=lambda i: (float(model.link_p[i].norm()), i))
            ee_link = model.link_names[k]
            why = (f"the link farthest out on the deepest actuated body (the longest chain ends at '{tip}', "
                   f"which no actuated joint moves)")
    else:
        if ee_link not in model.link_names:
            raise InitError(f"--ee-link {ee_link}: not a link of '{model.name}' (links: {', '.join(model.link_names)})")
        why = "--ee-link"
        body = model.link_body[model.link_names.index(ee_link)]
        if body >= 0 and body not in act_bodies and not any(b in act_bodies for b in _chain(model, body)):
            raise InitError(f"--ee-link {ee_link}: no actuated joint moves it")
    return ee_link, why


def _plan_reach(p: Plan, model, actuated: List[str], ee_link: Optional[str], bandwidth: float, zeta: float) -> None:
    import torch

    from .. import physics

    if model.floating_base:
        raise InitError("reach: the arm must have a fixed base")
    idx = torch.tensor([model.joint_names.index(n) for n in actuated])
    ee_link, why = _reach_ee_link(model, actuated, ee_link)
    p.info["ee_link"], p.info["ee_reason"] = ee_link, why

    horizon, dt = 100, 0.02
    w = 2 * math.pi * bandwidth
    lo, hi = model.lower[idx], model.upper[idx]
    lo = torch.where(torch.isfinite(lo), lo, torch.full_like(lo, -math.pi))
    hi = torch.where(torch.isfinite(hi), hi, torch.full_like(hi, math.pi))
    span = hi - lo
    vlim = model.velocity_limit[idx]
    vlim = torch.where(torch.isfinite(vlim) & (vlim > 0), vlim, torch.full_like(vlim, 2.0))
    # delta_scale: a full action held moves a joint at kp delta / kd = w delta / (2 zeta): the URDF speed limit
    # of the slowest joint at most.
    delta = math.floor(1000 * min(0.6, max(0.05, float((2 * zeta * vlim / w).min())))) / 1000   # 3 decimals, down
    # target range: the travel half an episode at the URDF speed limit covers, per joint; the most limited
    # joint sets the fraction of each range kept clear.
    budget = 0.5 * horizon * dt * vlim
    margin = float(torch.clamp(0.5 * (1 - budget / span), min=0.0).max())
    margin = math.ceil(1000 * min(0.45, max(0.15, margin))) / 1000      # 3 decimals, up
    t_lo, t_hi = lo + margin * span, hi - margin * span
    q0 = model.neutral_configuration((GAIN_SAMPLES + 1,))
    q0[1:, idx] = _uniform(model, GAIN_SAMPLES, t_lo, t_hi)
    p.gains = servo_gains(model, actuated, q0, bandwidth, zeta, delta)
    # Workspace of the targets: forward kinematics of the task's own target draws.
    qt = model.neutral_configuration((512,))
    qt[:, idx] = _uniform(model, 512, t_lo, t_hi, seed=1)
    qs = model.neutral_configuration((512,))
    qs[:, idx] = _uniform(model, 512, t_lo, t_hi, seed=2)
    k = model.link_names.index(ee_link)
    et = physics.forward_kinematics(model, qt)[:, k, :3, 3]
    es = physics.forward_kinematics(model, qs)[:, k, :3, 3]
    travel = (et - es).norm(dim=-1)
    lo3, hi3 = et.min(0).values.tolist(), et.max(0).values.tolist()
    radius = et.norm(dim=-1)
    p.info.update(delta_scale=delta, target_margin=margin, workspace=(lo3, hi3),
                  travel_median=float(travel.median()))
    if float(travel.median()) < 0.1:
        p.notes.append(f"warning: the end effector '{ee_link}' moves only {float(travel.median()) * 100:.1f} cm "
                       f"between a start and a target (median): is it the right link?")

    sim = p.params.setdefault("simulator", {})
    sim.update(dt=dt, substeps=2, integrator="semi_implicit", gravity=[0.0, 0.0, -9.81], ground=False,
               joint_limits=True, actuator="position", actuated_joints=list(actuated),
               kp=[g.kp for g in p.gains], kd=[g.kd for g in p.gains], effort_saturation=True,
               velocity_limits=True, servo_iterations=4, gravity_compensation=True)
    p.params["task"] = dict(type="reach", ee_link=ee_link, horizon=horizon, target_margin=margin,
                            success_distance=0.02, success_speed=0.05, velocity_weight=0.0, speed_weight=0.05,
                            speed_limit_weight=1.0, command_mode="delta", delta_scale=delta,
                            jacobian_observation=True)
    p.params["training"] = dict(iterations=200, num_envs=32, window=10, learning_rate=0.003, lr_schedule="cosine",
                                final_learning_rate=0.0001, grad_clip=1.0, hidden=[128, 128], eval_every=5,
                                eval_envs=64, stop_at_success=True, seed=0)
    p.params["ppo"] = _ppo(horizon, gamma=0.99)
    c, il = p.comments, p.inline
    left = [j for j in p.joints if not j.actuated]
    p.header = [f"{model.name}: reach with link '{ee_link}' ({why}) to random reachable targets and stop there,",
                "commanding joint positions through a PD servo with gravity compensation; each action moves the",
                "targets by up to delta_scale from the measured joints. Success: within 2 cm of the target and",
                "slower than 5 cm/s at the end of the episode (tasks/reach.py)."]
    if left:
        p.header.append("Joints not driven: " + "; ".join(f"{j.name} ({j.reason.split(':')[0].split(';')[0]})"
                                                          for j in left) + ".")
    c["simulator.kp"] = _gain_comment(p, delta, "delta_scale", f"{GAIN_SAMPLES} configurations drawn from the "
                                      f"targets' joint ranges and the zero configuration", bandwidth, zeta, False)
    il["simulator.actuated_joints"] = "action order"
    il["simulator.kp"] = "N m/rad (N/m prismatic), per actuated joint"
    il["simulator.kd"] = "N m s/rad (N s/m prismatic), per actuated joint"
    il["simulator.ground"] = "bool: no ground contact (the arm works above its base)"
    il["simulator.gravity_compensation"] = "bool: the actuator adds the gravity torques rnea(q, 0, 0)"
    il["simulator.velocity_limits"] = ("bool: the drives honour the URDF velocity limits (a torque-speed "
                                       "envelope), as a real arm's do")
    il["simulator.servo_iterations"] = ("saturated servos re-linearised per substep, so a light link behind "
                                        "a strong servo stays stable at 10 ms substeps")
    il["task.ee_link"] = f"URDF link brought to the target ({why})"
    il["task.horizon"] = f"control steps per episode ({horizon} x {dt} s = {horizon * dt:g} s)"
    c["task.target_margin"] = [
        "Targets: forward kinematics of joint configurations drawn inside each range less target_margin of it",
        "at both ends; the margin is the largest that lets every joint cover its draw in half the episode at",
        f"its URDF velocity limit. Sampled workspace of the targets ({model.link_names[0]} frame, m): x "
        f"[{lo3[0]:.3f}, {hi3[0]:.3f}], y [{lo3[1]:.3f}, {hi3[1]:.3f}], z [{lo3[2]:.3f}, {hi3[2]:.3f}],",
        f"distance from the origin {float(radius.min()):.3f}-{float(radius.max()):.3f}; start-to-target distance "
        f"median {float(travel.median()):.3f}, 90th percentile {float(travel.quantile(0.9)):.3f}."]
    il["task.target_margin"] = "fraction of each joint range kept clear when drawing targets and starts"
    il["task.delta_scale"] = (f"rad, largest target offset: a held full action moves at w delta / (2 zeta) <= the "
                              f"slowest URDF velocity limit ({float(vlim.min()):g} rad/s)")
    il["task.success_distance"] = "m, end-effector distance to the target counted as reached"
    il["task.success_speed"] = "m/s, end-effector speed counted as at rest"
    il["task.speed_weight"] = "s, loss weight on the end effector's speed |J v| next to its distance"
    il["task.jacobian_observation"] = "bool: the observation also holds J(q)^T (target - ee) per joint"
    il["task.speed_limit_weight"] = ("loss weight on each joint's speed beyond its URDF velocity limit, "
                                     "(|v| / v_max - 1)^2 per step: at its effort limit a drive cannot always "
                                     "brake a heavy link that its neighbours swing")


def _as_jump(p: Plan) -> None:
    """Turn the legged plan into the jump task (tasks/jump.py).

    The same robot, stance, gains and contact, 1 s episodes, the apex objective with the tilt term,
    25-step windows.
    """
    t = p.params["task"]
    p.params["task"] = dict(type="jump", stance=t["stance"], base_height=t["base_height"], horizon=100,
                            action_scale=t["action_scale"], action_weight=0.001, upright_weight=4.0, min_apex=0.05,
                            max_tilt=0.5, fall_height=0.5)
    p.params["training"].update(iterations=60, window=25, learning_rate=0.002)
    p.params["simulator"]["velocity_limits"] = True
    il = p.inline
    il["simulator.velocity_limits"] = "bool: the drives honour the URDF velocity limits: a push-off is fast"
    il["task.upright_weight"] = "loss weight on the base's tilt, 1 - cos(angle of its z axis from vertical), per step"
    il["task.min_apex"] = "m, the base's apex above base_height that counts as a jump (feet off the ground)"
    il["task.max_tilt"] = "rad, largest roll and pitch at every step"
    il["task.fall_height"] = "fraction of base_height the base stays above at every step"
    il["task.action_weight"] = "loss weight on the action squared, per step"
    p.header[:3] = [p.header[0].split(":")[0] + ": on a floating base, learns to jump as high as it can through "
                    "ground contact;", "the loss is minus the base's ballistic apex above standing, plus the action "
                    "and the tilt (no gait shaping). Success:", "the base min_apex above standing with every foot off "
                    "the ground there, upright, only feet touching (tasks/jump.py)."]


def _plan_locomotion(p: Plan, model, desc, actuated: List[str], bandwidth: float, zeta: float) -> None:
    import torch

    from .. import physics

    feet = foot_bodies(model)
    if not feet:
        raise InitError(f"locomotion: '{model.name}' has no chain ending in collision geometry (no feet)")
    # Leg by leg (the order of the links along the tree), as config/locomotion.yaml.
    child_link = {j.name: j.child for j in desc.joints}
    actuated = sorted(actuated, key=lambda n: model.link_names.index(child_link[n]))
    states = srdf_states(p.urdf_path, desc.name)
    qj = None
    for name in SRDF_STATES:
        vals = states.get(name)
        if vals and all(n in vals for n in actuated):
            qj = model.neutral_configuration()[7:]
            for n, v in vals.items():
                if n in model.joint_names:
                    qj[model.joint_names.index(n)] = v
            qj = qj.tolist()
            how = f"the SRDF group_state '{name}' ({next(iter(states['__file__']))})"
            break
    if qj is None:
        qj, how = heuristic_stance(model, actuated)
    q = model.neutral_configuration()
    q[7:] = torch.tensor(qj, dtype=q.dtype)
    low = lowest_points(model, q)
    z, link, body = min(low)
    base_height = -z
    if body not in feet:
        p.notes.append(f"warning: at the stance the lowest collision point is on link '{link}', not on a foot")
    q[2] = base_height
    # The torque each joint needs to hold the robot on its feet: the weight shared by the feet, through
    # each foot's Jacobian (at the foot body's lowest link origin).
    weight = float(model.mass.sum()) * 9.81
    tau = torch.zeros(model.nv, dtype=q.dtype)
    for f in feet:
        lk = min((zz, ll) for zz, ll, bb in low if bb == f)[1]
        J = physics.link_jacobian(model, q[None], model.link_index(lk))[0]
        tau += J[2] * (weight / len(feet))
    hold = tau[6:].tolist()
    action_scale = 0.5
    idx = torch.tensor([model.joint_names.index(n) for n in actuated])
    qs = q.expand(GAIN_SAMPLES + 1, -1).clone()
    st = q[7:][idx]
    qs[1:, 7 + idx] = _uniform(model, GAIN_SAMPLES, st - action_scale, st + action_scale)
    p.gains = servo_gains(model, actuated, qs, bandwidth, zeta, action_scale, hold_torque=hold)
    stance = [float(q[7 + i]) for i in idx.tolist()]
    p.info.update(stance=stance, base_height=base_height, stance_source=how, lowest_link=link,
                  hold_torque=dict(zip(model.joint_names, hold)))
    # Substeps: the penalty contact k gap^2 under a foot's share of the weight F is a spring of stiffness
    # 2 sqrt(k F) on the foot body; its frequency on the lightest foot body times the substep stays below
    # CONTACT_STEP (explicit contact forces), substeps rounded up to a multiple of 5.
    stiffness, dt = 1.0e7, 0.01
    m_foot = min(float(model.mass[f]) for f in feet)
    w_contact = math.sqrt(2 * math.sqrt(stiffness * weight / len(feet)) / m_foot)
    substeps = 5 * math.ceil(dt * w_contact / CONTACT_STEP / 5)
    sim = p.params.setdefault("simulator", {})
    sim.update(dt=dt, substeps=substeps, integrator="semi_implicit", gravity=[0.0, 0.0, -9.81], ground=True,
               ground_height=0.0, contact_stiffness=stiffness, contact_damping=3.0e4, friction=0.8,
               friction_smoothing=0.01, joint_limits=True, actuator="position", actuated_joints=list(actuated),
               kp=[g.kp for g in p.gains], kd=[g.kd for g in p.gains], effort_saturation=True)
    p.params["task"] = dict(type="locomotion", stance=stance, base_height=base_height, horizon=100,
                            action_scale=action_scale, success_speed=0.1, fall_height=0.5, action_weight=0.001)
    p.params["training"] = dict(iterations=200, num_envs=16, window=20, learning_rate=0.003, grad_clip=1.0,
                                hidden=[128, 128], eval_every=5, eval_envs=64, stop_at_success=True, seed=0)
    p.params["ppo"] = _ppo(100, gamma=0.99)
    left = [j for j in p.joints if not j.actuated]
    p.header = [f"{model.name}: on a floating base, learns to move forward (world +x) through ground contact;",
                "the loss is the negative forward speed plus a small action penalty (no gait shaping). Success:",
                "mean forward speed over the episode above success_speed without falling (tasks/locomotion.py).",
                f"Stance: {how}.",
                f"At it, with the base at the origin, the lowest collision point (link '{link}') lies "
                f"{base_height:.6f} m below the base origin: the base_height that puts the feet on the ground."]
    if left:
        p.header.append("Joints not driven: " + "; ".join(f"{j.name} ({j.reason.split(':')[0]})" for j in left) + ".")
    c, il = p.comments, p.inline
    c["simulator.kp"] = _gain_comment(p, action_scale, "action_scale", f"the stance and {GAIN_SAMPLES} "
                                      f"configurations within action_scale of it", bandwidth, zeta, True)
    il["simulator.actuated_joints"] = "action order (leg by leg)"
    il["simulator.kp"] = "N m/rad, per actuated joint"
    il["simulator.kd"] = "N m s/rad, per actuated joint"
    c["simulator.substeps"] = [
        f"substeps: the contact under a foot's share of the weight ({weight / len(feet):.3g} N) is a spring of "
        f"2 sqrt(k F) = {2 * math.sqrt(stiffness * weight / len(feet)):.4g} N/m on the lightest foot body "
        f"({m_foot:.4g} kg): {w_contact:.0f} rad/s; each substep (dt / substeps) times it stays below "
        f"{CONTACT_STEP:g}, substeps rounded up to a multiple of 5"]
    il["simulator.dt"] = "s, control step (100 Hz policy)"
    il["simulator.contact_stiffness"] = "N/m^2, k in lambda_n = k max(0, -gap)^2"
    il["simulator.contact_damping"] = "N s/m^2, c in lambda_d = -c max(0, -gap) dgap/dt"
    il["task.stance"] = "rad, standing pose in actuated_joints order"
    il["task.base_height"] = "m, base height of the stance with the lowest point on the ground"
    il["task.horizon"] = "control steps per episode (100 x 0.01 s = 1 s)"
    il["task.action_scale"] = "rad, joint target = stance + action_scale a, a in [-1, 1]"
    il["task.success_speed"] = "m/s, mean forward speed counted as moving forward"
    il["task.fall_height"] = "fraction of base_height below which the robot has fallen"
    il["task.action_weight"] = "loss weight on the action squared, per step"


def _base_half_width(model, mass: float) -> Tuple[float, str]:
    """Half the width of a multirotor's base (m), and the words that say how the guessed layout's arm was sized.

    The half width comes from its collision geometry (the largest x or y reach of a box, sphere or
    cylinder of the base body), or 0.25 m x mass^(1/3) without any; the guessed layout's arm is 2/3
    of it.
    """
    import torch

    ext = []
    for c in model.collisions:
        if c.body != 0:
            continue
        half = 0.5 * c.size.double() if c.kind == "box" else None
        if c.kind == "sphere":
            half = c.size.double().repeat(3)
        if c.kind == "cylinder":
            half = torch.stack([c.size[0], c.size[0], 0.5 * c.size[1]]).double()
        e = (c.R.double().abs() @ half)
        ext.append(max(abs(float(c.p[0])) + float(e[0]), abs(float(c.p[1])) + float(e[1])))
    if ext:
        half_width = max(ext)
        basis = f"2/3 of the base collision geometry's half width {half_width:.3f} m"
    else:
        half_width = 0.25 * mass ** (1 / 3)
        basis = f"0.25 m x mass^(1/3) ({half_width:.3f} m: no collision geometry to size it from)"
    return half_width, basis


def _plan_multirotor(p: Plan, model, mode: str) -> None:
    from .. import physics

    if model.nj:
        raise InitError(f"--task {mode}: the quadrotor tasks fly a rigid multirotor; '{model.name}' has moving "
                        f"joints ({', '.join(model.joint_names)})")
    mass = float(model.mass.sum())
    poses = physics.forward_kinematics(model, model.neutral_configuration()[None])[0]
    rotor_links = [n for n in model.link_names[1:] if any(w in n.lower() for w in ROTOR_WORDS)]
    rotors: Dict[str, Any] = {}
    prop_radius = None
    if len(rotor_links) >= 3:
        xy = {n: poses[model.link_index(n), :2, 3].tolist() for n in rotor_links}
        rotor_links.sort(key=lambda n: math.atan2(xy[n][1], xy[n][0]) % (2 * math.pi))
        arm = sum(math.hypot(*xy[n]) for n in rotor_links) / len(rotor_links)
        radii = [float(c.size[0]) for c in model.collisions if c.link in rotor_links and c.kind == "cylinder"]
        prop_radius = sum(radii) / len(radii) if radii else None
        radii_known = bool(radii)
        rotors["rotor_links"] = rotor_links
        where = (f"the links named like a rotor ({', '.join(rotor_links)}), by angle about the base z axis; their "
                 f"origins are the hubs (mean arm {arm:.3f} m)")
        layout = "rotor_links"
    else:
        # No rotor links: an X layout inside the base's collision footprint (2/3 of its half width, the
        # propeller's radius 1/3 of it), or sized from the mass.
        half_width, basis = _base_half_width(model, mass)
        arm = 2 * half_width / 3
        prop_radius = half_width / 3
        radii_known = False
        d = arm / math.sqrt(2)
        pos = [[d, d, 0.0], [-d, d, 0.0], [-d, -d, 0.0], [d, -d, 0.0]]
        rotors["positions"] = [round(x, 4) for xyz in pos for x in xyz]
        where = (f"a guessed X layout, hubs {arm:.3f} m from the centre ({basis}), in the base plane: front left, "
                 f"rear left, rear right, front right. CHECK THEM against the real airframe")
        layout = "positions"
    n = len(rotor_links) if layout == "rotor_links" else 4
    if prop_radius is None:
        prop_radius = 0.5 * arm * math.sin(math.pi / n)
    D = 2 * prop_radius
    # Momentum-theory scaling: thrust = C_T rho n^2 D^4 with C_T ~ 0.1, rho = 1.225 kg/m^3, n = w / (2 pi).
    kf = 0.1 * 1.225 * D ** 4 / (4 * math.pi ** 2)
    t_max = 2.0 * mass * 9.81 / n           # thrust-to-weight 2
    w_max = math.sqrt(t_max / kf)
    tau_m = min(0.08, max(0.01, 0.16 * D))
    rg = 20.0 * math.sqrt(min(1.0, 0.127 / D))
    rotors.update(directions=[(-1 if i % 2 == 0 else 1) for i in range(n)], thrust_coefficient=kf,
                  torque_coefficient=0.016 * kf, motor_time_constant=tau_m, max_rotor_speed=w_max,
                  drag_linear=[0.1 * mass, 0.1 * mass, 0.15 * mass],
                  drag_quadratic=[0.02 * mass, 0.02 * mass, 0.04 * mass], rate_gain=[rg, rg, 0.4 * rg])
    p.info.update(rotor_layout=layout, rotors=rotors, arm=arm, prop_radius=prop_radius, mass=mass)
    sim = p.params.setdefault("simulator", {})
    sim.update(dt=0.02, substeps=4, integrator="semi_implicit", gravity=[0.0, 0.0, -9.81], ground=False,
               actuator="ctbr", rotors=rotors)
    task = dict(type="quadrotor", mode=mode, horizon=100, settle_time=1.5, start_radius=0.5, start_speed=0.3,
                waypoint_radius=1.0, max_speed_command=1.5, max_rate=3.0, thrust_range=0.8, success_distance=0.1,
                success_speed=0.2)
    if mode != "velocity":
        task.update(position_loss="distance", speed_weight=0.1)
    task["rate_weight"] = 0.01
    p.params["task"] = task
    if mode == "velocity":
        p.params["training"] = dict(iterations=200, num_envs=64, window=20, learning_rate=0.003, grad_clip=1.0,
                                    hidden=[64, 64], eval_every=5, eval_envs=64, stop_at_success=True, seed=0)
    else:
        p.params["training"] = dict(iterations=100 if mode == "hover" else 150, num_envs=32, window=25,
                                    learning_rate=0.005, lr_schedule="cosine", final_learning_rate=0.0003,
                                    grad_clip=1.0, hidden=[64, 64], eval_every=5, eval_envs=64, stop_at_success=True,
                                    seed=0)
    p.params["ppo"] = _ppo(100, gamma=0.99)
    goal = {"hover": "reaches and holds the point (0, 0, 1) m from a start perturbed by up to 0.5 m and 0.3 m/s",
            "waypoint": "flies to a random waypoint within 1 m (per axis) of (0, 0, 1) m and holds it",
            "velocity": "tracks a random commanded world velocity (up to 1.5 m/s per axis)"}[mode]
    ok = ("within 0.2 m/s of the command" if mode == "velocity" else "within 10 cm of it and slower than 0.2 m/s")
    p.header = [f"{model.name} ({mass:.3f} kg): {goal}, through collective thrust and body rates (CTBR).",
                f"Success: {ok} on every step after the settling time (tasks/quadrotor.py).",
                f"Rotors: {where}."]
    c, il = p.comments, p.inline
    source_d = "the rotor links' collision cylinders" if layout == "rotor_links" and radii_known else "guessed"
    c["simulator.rotors"] = [
        "Rotor template (diffsim-ros init; replace with the airframe's data where known):",
        f"  propeller diameter D = {D:.3f} m ({source_d});",
        f"  thrust_coefficient = C_T rho D^4 / (4 pi^2) = 0.1 x 1.225 x {D:.3f}^4 / 39.48 (C_T ~ 0.1);",
        f"  max_rotor_speed for a thrust-to-weight of 2: sqrt(2 m g / {n} / k_f) "
        f"= sqrt(2 x {mass:.3f} x 9.81 / {n} / {kf:.3g});",
        "  torque_coefficient = 0.016 m x thrust_coefficient; motor_time_constant = 0.16 s/m x D;",
        "  drag = 0.1 m (linear, N s/m) and 0.02 m (quadratic) per kg of mass; rate_gain 20/s for 5 inch props,",
        "  falling with the square root of the propeller size."]
    il["simulator.ground"] = "bool: free flight (the tasks never need the ground)"
    il["simulator.rotors.directions"] = "yaw reaction torque sign per rotor, alternating around the frame"
    il["simulator.rotors.thrust_coefficient"] = "N s^2/rad^2, thrust = k_f w^2 per rotor"
    il["simulator.rotors.torque_coefficient"] = "N m s^2/rad^2, yaw torque = k_m w^2 per rotor"
    il["simulator.rotors.motor_time_constant"] = "s, first-order lag of the rotor speed"
    il["simulator.rotors.max_rotor_speed"] = "rad/s"
    il["simulator.rotors.drag_linear"] = "N s/m, body-frame linear drag per axis"
    il["simulator.rotors.drag_quadratic"] = "N s^2/m^2, body-frame quadratic drag per axis"
    il["simulator.rotors.rate_gain"] = "1/s, CTBR body-rate loop gain (roll, pitch, yaw)"
    if layout == "positions":
        il["simulator.rotors.positions"] = "m, base frame, x y z per rotor (a template: check it)"
    il["task.horizon"] = "control steps per episode (100 x 0.02 s = 2 s)"
    il["task.settle_time"] = "s, success is judged on every step after this time"
    il["task.thrust_range"] = "thrust = hover_thrust (1 + thrust_range a), a in [-1, 1]"
    il["task.success_distance"] = "m, position tolerance (hover, waypoint)"
    il["task.success_speed"] = "m/s, speed (hover, waypoint) or velocity-error (velocity) tolerance"


def _ppo(horizon: int, gamma: float) -> Dict[str, Any]:
    return dict(total_timesteps=5000000, num_envs=256, n_steps=horizon, batch_size=64 * horizon, n_epochs=10,
                learning_rate=0.0003, gamma=gamma, gae_lambda=0.95, clip_range=0.2, ent_coef=0.0,
                log_std_init=-0.5, seed=0)


# ---------------------------------------------------------------------------- writing
_PLAIN = re.compile(r"^[A-Za-z_/][A-Za-z0-9_./:+-]*$")
_COMMENT_COL = 41


def _scalar(x: Any) -> str:
    if isinstance(x, bool):
        return "true" if x else "false"
    if isinstance(x, int):
        return str(x)
    if isinstance(x, float):
        if x == 0:
            return "0.0"
        s = f"{x:.6g}" if abs(x) < 1e5 and abs(x) >= 1e-3 else f"{x:.4g}"
        if "e" in s:
            mant, exp = s.split("e")
            if "." not in mant:
                mant += ".0"
            return f"{mant}e{exp}"
        return s if "." in s else s + ".0"
    s = str(x)
    if _PLAIN.match(s) and s.lower() not in ("true", "false", "yes", "no", "on", "off", "null", "~"):
        return s
    return "'" + s.replace("'", "''") + "'"


def _value(x: Any) -> str:
    if isinstance(x, (list, tuple)):
        # ROS lists must not mix integers and floats: a list holding a float is all floats.
        if any(isinstance(v, float) for v in x):
            x = [float(v) for v in x]
        return "[" + ", ".join(_scalar(v) for v in x) + "]"
    return _scalar(x)


def _gain_value(x: float) -> float:
    """Gains written to 4 significant digits (the comments show the same numbers)."""
    return float(f"{x:.4g}")


#: End-of-line comments of the keys every file shares (a plan's own ``inline`` entries win).
COMMON_COMMENTS = {
    "urdf": "path relative to the diffsim_ros share folder (or absolute, or package://)",
    "floating_base": "bool: the root link gets a free-flyer joint (q: x y z qx qy qz qw, joints)",
    "dtype": "float32 or float64: precision of simulation and training",
    "simulator.dt": "s, control step",
    "simulator.substeps": "physics substeps per control step",
    "simulator.integrator": "semi_implicit (symplectic Euler) or rk4",
    "simulator.gravity": "m/s^2, world frame",
    "simulator.ground_height": "m",
    "simulator.friction": "Coulomb coefficient, dimensionless",
    "simulator.friction_smoothing": "m/s, slip speed of the regularised Coulomb friction",
    "simulator.joint_limits": "bool: URDF position limits as a smooth penalty",
    "simulator.actuator": "command interface",
    "simulator.effort_saturation": "bool: smooth saturation at the URDF effort limit",
    "task.type": "reach | quadrotor | locomotion | jump",
    "task.mode": "hover | waypoint | velocity",
    "task.start_radius": "m, start drawn within +-start_radius per axis of (0, 0, 1) m",
    "task.start_speed": "m/s, start velocity drawn within +-start_speed per axis",
    "task.waypoint_radius": "m, waypoint drawn within +-waypoint_radius per axis of (0, 0, 1) m",
    "task.max_speed_command": "m/s, commanded velocity drawn within +-max_speed_command per axis",
    "task.max_rate": "rad/s, body rate commanded by an action of +-1",
    "task.position_loss": "squared or distance",
    "task.rate_weight": "loss weight on body rates squared, s^2/rad^2 per step",
    "task.velocity_weight": "loss weight on joint speed squared, s^2/rad^2 per step",
    "task.command_mode": "targets = measured q + delta_scale * action",
    "training": "gradient trainer (diffsim_ros.learning.apg.TrainConfig)",
    "training.iterations": "policy updates, each over num_envs full episodes",
    "training.num_envs": "parallel episodes per iteration",
    "training.window": "control steps per truncated back-propagation window",
    "training.learning_rate": "Adam step size at the start",
    "training.lr_schedule": "constant or cosine",
    "training.final_learning_rate": "Adam step size at the last iteration (cosine)",
    "training.grad_clip": "maximum gradient norm",
    "training.hidden": "hidden layer sizes of the policy MLP",
    "training.eval_every": "iterations between evaluations on fresh episodes",
    "training.eval_envs": "episodes per evaluation",
    "training.stop_at_success": "bool: stop once the evaluation reaches the task's success threshold",
    "training.seed": "random seed",
    "ppo": "PPO baseline (Stable-Baselines3, diffsim_ros.learning.ppo.PPOConfig), the project's settings",
    "ppo.total_timesteps": "environment steps",
    "ppo.n_steps": "control steps per environment per rollout (one episode)",
    "ppo.batch_size": "minibatch size, transitions (a quarter of the rollout)",
    "ppo.gamma": "discount per control step",
    "ppo.log_std_init": "initial log standard deviation of the Gaussian policy",
}


def _wrap(text: str, width: int = 100) -> List[str]:
    import textwrap

    return textwrap.wrap(text, width, break_on_hyphens=False) or [""]


def render(p: Plan, out_name: str = "") -> str:
    """Render the training file's text: the project's layout (``/**: ros__parameters:``), commented."""
    lines = [f"# {out_name or 'training file'}: written by diffsim-ros init --task {p.task} for",
             f"# {p.urdf_path}"]
    lines += [f"# {w}" for h in p.header for w in _wrap(h)]
    lines += ["#",
              f"#   diffsim-ros train    --config {out_name or 'FILE'} --out runs/<name>",
              f"#   diffsim-ros baseline --config {out_name or 'FILE'} --out runs/<name>_ppo",
              "#",
              "# A ROS 2 parameter file: no nested lists, no nulls, 0.0 (not 0) inside float lists.",
              "/**:", "  ros__parameters:"]

    def emit(mapping: Dict[str, Any], indent: int, prefix: str) -> None:
        pad = " " * indent
        for key, val in mapping.items():
            dotted = f"{prefix}{key}"
            for c in p.comments.get(dotted, []):
                lead = " " * (len(c) - len(c.lstrip(" ")))
                for k, w in enumerate(_wrap(c.strip(), 104 - indent - len(lead))):
                    lines.append(f"{pad}# {lead}{'  ' if k else ''}{w}")
            note = p.inline.get(dotted, COMMON_COMMENTS.get(dotted, ""))
            if isinstance(val, dict):
                lines.append(f"{pad}{key}:" + (f"  # {note}" if note else ""))
                emit(val, indent + 2, dotted + ".")
                continue
            if key in ("kp", "kd") and isinstance(val, list):
                val = [_gain_value(v) for v in val]
            text = f"{pad}{key}: {_value(val)}"
            if note:
                text = text.ljust(_COMMENT_COL - 1) + f" # {note}"
            lines.append(text)

    emit(p.params, 4, "")
    return "\n".join(lines) + "\n"


def write(p: Plan, out: str, force: bool = False) -> str:
    if os.path.exists(out) and not force:
        raise InitError(f"--out {out}: the file exists; pass --force to overwrite it")
    text = render(p, os.path.basename(out))
    folder = os.path.dirname(os.path.abspath(out))
    os.makedirs(folder, exist_ok=True)
    tmp = out + ".tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, out)
    return text


def controllers_path(out: str) -> str:
    """Where ``init`` writes the ros2_control controllers beside the training file ``out``."""
    root, _ = os.path.splitext(out)
    return root + "_ros2_controllers.yaml"


def ros2_controllers(p: Plan, joints: Sequence[str], out: str = "") -> Optional[str]:
    """Return the robot's ros2_controllers.yaml (a ROS 2 parameter file for the controller_manager).

    It holds the joint_state_broadcaster, the forward_command controller policy_controller
    publishes to by default (``/<interface>_controller/commands``) with the actuated joints in the
    training file's order (the checkpoint's), a joint_trajectory_controller for position robots
    (policy_controller ``interface:=joint_trajectory``) and, for a legged robot, the IMU
    broadcaster. None for a multirotor (PX4 or a Crazyflie take its commands, not ros2_control).
    ``joints``: the actuated joints in the simulator's order (``task.sim.actuated_joints`` of the
    loaded file), which the checkpoint's commands follow.
    """
    sim = p.params.get("simulator", {})
    if "rotors" in sim:
        return None
    iface = sim.get("actuator", "position")
    legged = bool(p.params.get("floating_base"))
    name = f"{iface}_controller"
    stem = Path(out).stem if out else "ROBOT"
    policy_hz = 1.0 / float(sim.get("dt", 0.02))
    listed = "[" + ", ".join(joints) + "]"
    lines = [
        f"# ros2_control controllers for {p.urdf_path.name}, written by `diffsim-ros init` beside {stem}.yaml:",
        "# the joint states policy_controller reads and the controller it commands, the joints in the",
        "# order of the training file's actuated joints (the checkpoint's). Load it with the",
        "# controller_manager of the robot's ros2_control hardware (ros2_control_node, or gz_ros2_control",
        "# in Gazebo), spawn the broadcaster(s) and ONE command controller, then the policy:",
        f"#   ros2 run controller_manager spawner joint_state_broadcaster {name}"
        + (" imu_sensor_broadcaster" if legged else ""),
        f"#   diffsim-ros preflight runs/{stem}            # GO before the policy goes active",
        f"#   ros2 run diffsim_ros policy_controller --ros-args -p checkpoint:=runs/{stem}"
        + (" -p imu_topic:=/imu_sensor_broadcaster/imu" if legged else ""),
        f"# The policy runs at {policy_hz:g} Hz; the controller_manager below at 500 Hz.",
        "controller_manager:",
        "  ros__parameters:",
        "    update_rate: 500",
        "    joint_state_broadcaster:",
        "      type: joint_state_broadcaster/JointStateBroadcaster",
        f"    {name}:",
        "      type: forward_command_controller/ForwardCommandController",
    ]
    if iface == "position":
        lines += ["    joint_trajectory_controller:     # for policy_controller interface:=joint_trajectory",
                  "      type: joint_trajectory_controller/JointTrajectoryController"]
    if legged:
        lines += ["    imu_sensor_broadcaster:",
                  "      type: imu_sensor_broadcaster/IMUSensorBroadcaster"]
    lines += ["", f"{name}:", "  ros__parameters:", f"    joints: {listed}",
              f"    interface_name: {iface}"]
    if iface == "position":
        lines += ["", "joint_trajectory_controller:", "  ros__parameters:", f"    joints: {listed}",
                  "    command_interfaces: [position]", "    state_interfaces: [position, velocity]"]
    if legged:
        model = p.info.get("model")
        base = model.link_names[0] if model is not None and model.link_names else "base_link"
        lines += ["", "imu_sensor_broadcaster:", "  ros__parameters:",
                  "    sensor_name: imu_sensor           # the <sensor> of the URDF's <ros2_control> tag",
                  f"    frame_id: {base}"]
    return "\n".join(lines) + "\n"


def report(p: Plan) -> List[str]:
    """Return the lines ``diffsim-ros init`` prints: what was chosen and why."""
    out = list(p.notes)
    if p.joints:
        for j in p.joints:
            if j.actuated:
                out.append(f"joint {j.name}: actuated" + (f" ({j.reason})" if j.reason else ""))
            else:
                out.append(f"joint {j.name}: left out: {j.reason}")
    if "ee_link" in p.info:
        out.append(f"end effector: {p.info['ee_link']} ({p.info['ee_reason']})")
        out.append(f"targets: target_margin {p.info['target_margin']}, delta_scale {p.info['delta_scale']:.3g} rad, "
                   f"median start-target distance {p.info['travel_median']:.3f} m")
    if "base_height" in p.info:
        out.append(f"stance: {p.info['stance_source']}")
        out.append(f"base height: {p.info['base_height']:.6f} m (lowest point on link {p.info['lowest_link']})")
    if "rotors" in p.info:
        out.append(f"rotors: {p.info['rotor_layout']}, arm {p.info['arm']:.3f} m, propeller radius "
                   f"{p.info['prop_radius']:.3f} m: check the template against the airframe")
    for g in p.gains:
        out.append(f"gain {g.joint}: M_ii {g.inertia:.4g}, kp {g.kp:.4g}, kd {g.kd:.4g}"
                   + (f" ({g.bound})" if g.bound else ""))
    return out
