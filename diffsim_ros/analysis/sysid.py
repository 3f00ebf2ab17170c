"""System identification: calibrate simulator parameters on a bag by gradient descent
through the differentiable simulator, and write a training file that uses them.

    result = calibrate(data, setup, ["mass_scale", "joint_damping"])
    write_calibrated(result, setup, "out/")     # calibrated.yaml (+ calibrated URDF), sysid.json, sysid.md

Objective: the squared velocity discrepancy over short multi-step windows (``window``
control steps, the recorded commands replayed from each recorded state, every step of
the window counted), each degree of freedom divided by the standard deviation of its
recorded velocity so that no joint or axis dominates by its units. The windows of the
first ``fit_fraction`` of the bag fit; the rest is held out and only judged.

Differentiable parameters (masses, inertias, damping, friction, drag, thrust factor)
are bounded through a sigmoid, ``value = low + (high - low) sigmoid(z)``, and fitted
with L-BFGS (strong Wolfe line search) in float64. The actuator lag, motor time
constant and latency are plain numbers in the simulator config: they are fitted by a
derivative-free search (golden section; whole steps for the latency) around the
gradient fit.
"""
from __future__ import annotations

import copy
import math
import os
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

import numpy as np
import torch

from .. import config as _config
from .bag import BagData
from .errors import AnalysisError
from .params import SPECS, bounds, build_simulator, check_names, nominal_values
from .predict import Replay, SimSetup, error_stats, replaying


@dataclass
class SysIdResult:
    names: List[str]
    nominal: Dict[str, List[float]]
    fitted: Dict[str, List[float]]
    bounds: Dict[str, List[List[float]]]
    window: int
    fit_starts: int
    heldout_starts: int
    fit_loss_before: float
    fit_loss_after: float
    heldout: Dict[str, Any]                  # before/after RMSE (overall, per dof, per horizon)
    history: List[float] = field(default_factory=list)
    evaluations: int = 0
    seconds: float = 0.0
    notes: List[str] = field(default_factory=list)

    def as_dict(self) -> Dict[str, Any]:
        return dict(self.__dict__)


class _Objective:
    """Windowed velocity loss of a parameter set on a fixed set of starts."""

    def __init__(self, rp: Replay, starts: np.ndarray, window: int, scale: torch.Tensor):
        self.rp, self.starts, self.window = rp, starts, window
        hs = list(range(1, window + 1))
        self.horizons = hs
        tg = [rp.target_index(starts, k) for k in hs]
        self.targets = torch.stack([rp.v[torch.as_tensor(t)] for t in tg])        # (W, S, nv)
        self.scale = scale

    def predictions(self, values: Dict[str, torch.Tensor]) -> torch.Tensor:
        sim = build_simulator(self.rp.model, self.rp.setup.sim_config, values)
        out = self.rp.rollout(self.starts, self.horizons, sim)
        return torch.stack([out[k] for k in self.horizons])                      # (W, S, nv)

    def __call__(self, values: Dict[str, torch.Tensor]) -> torch.Tensor:
        err = (self.predictions(values) - self.targets) / self.scale
        return (err ** 2).mean()


def _split(rp: Replay, window: int, fit_fraction: float, max_starts: Optional[int]):
    starts = rp.valid_starts(window)
    # Every intermediate state of the window must be recorded too.
    for k in range(1, window):
        starts = starts[rp.target_index(starts, k) >= 0]
    n_cmd = len(rp.cmd_stamp)
    cut = int(round(fit_fraction * n_cmd))
    fit = starts[starts + window <= cut]
    held = starts[starts >= cut]
    if len(fit) < 3 or len(held) < 3:
        raise AnalysisError(f"{rp.data.path}: too few usable {window}-step windows to calibrate "
                            f"({len(fit)} to fit, {len(held)} held out, of {n_cmd} commands); record a longer bag "
                            f"or use a shorter --window")
    if max_starts is not None:
        if len(fit) > max_starts:
            fit = fit[np.unique(np.linspace(0, len(fit) - 1, max_starts).round().astype(np.int64))]
        if len(held) > max_starts:
            held = held[np.unique(np.linspace(0, len(held) - 1, max_starts).round().astype(np.int64))]
    return fit, held


def _golden(f, lo: float, hi: float, iters: int = 14) -> float:
    """Minimiser of a unimodal f on [lo, hi] by golden-section search."""
    r = (math.sqrt(5) - 1) / 2
    a, b = lo, hi
    c, d = b - r * (b - a), a + r * (b - a)
    fc, fd = f(c), f(d)
    for _ in range(iters):
        if fc < fd:
            b, d, fd = d, c, fc
            c = b - r * (b - a)
            fc = f(c)
        else:
            a, c, fc = c, d, fd
            d = a + r * (b - a)
            fd = f(d)
    return (a + b) / 2


def calibrate(data: BagData, setup: SimSetup, names: Sequence[str], window: int = 5, fit_fraction: float = 0.7,
              max_starts: Optional[int] = 256, max_iter: int = 60, replay: Optional[Replay] = None,
              progress=None) -> SysIdResult:
    """Fit ``names`` (see :data:`params.SPECS`) on the first ``fit_fraction`` of the bag; report
    the held-out velocity RMSE before and after. A diverging simulation is an AnalysisError
    naming the bag."""
    with replaying(data):
        return _calibrate(data, setup, names, window, fit_fraction, max_starts, max_iter, replay, progress)


def _calibrate(data, setup, names, window, fit_fraction, max_starts, max_iter, replay, progress) -> SysIdResult:
    t_start = time.perf_counter()
    names = list(dict.fromkeys(names))
    if not names:
        raise AnalysisError("--params: name at least one parameter (known: " + ", ".join(SPECS) + ")")
    if window < 1:
        raise AnalysisError(f"--window must be at least 1, got {window}")
    if not 0.1 <= fit_fraction <= 0.95:
        raise AnalysisError(f"--fit-fraction must be within [0.1, 0.95], got {fit_fraction}")
    if setup.model.dtype != torch.float64:
        setup = SimSetup(setup.params, setup.model.to(torch.float64), setup.sim_config, setup.source, setup.notes)
    rp = replay if replay is not None else Replay(data, setup)
    model, cfg = rp.model, setup.sim_config
    check_names(names, model, cfg)
    fit, held = _split(rp, window, fit_fraction, max_starts)
    scale = rp.v.std(0).clamp(min=1e-3)
    obj_fit = _Objective(rp, fit, window, scale)
    obj_held = _Objective(rp, held, window, scale)

    nominal = {n: nominal_values(n, model, cfg) for n in names}
    bnd = {n: bounds(n, nominal[n]) for n in names}
    diff = [n for n in names if SPECS[n].differentiable]
    discrete = [n for n in names if not SPECS[n].differentiable]
    z = {}
    for n in diff:
        lo, hi = bnd[n]
        u = ((nominal[n] - lo) / (hi - lo)).clamp(1e-4, 1 - 1e-4)
        z[n] = torch.log(u / (1 - u)).clone().requires_grad_(True)
    fixed: Dict[str, torch.Tensor] = {}       # current values of the non-differentiable ones

    def values(detach: bool = False) -> Dict[str, torch.Tensor]:
        out = dict(fixed)
        for n in diff:
            lo, hi = bnd[n]
            val = lo + (hi - lo) * torch.sigmoid(z[n])
            out[n] = val.detach() if detach else val
        return out

    history: List[float] = []
    evals = [0]
    with torch.no_grad():
        loss_before = float(obj_fit({}))

    def fit_gradient():
        if not diff:
            return
        opt = torch.optim.LBFGS(list(z.values()), lr=1.0, max_iter=max_iter, history_size=20,
                                line_search_fn="strong_wolfe", tolerance_grad=1e-10, tolerance_change=1e-14)

        def closure():
            opt.zero_grad()
            loss = obj_fit(values())
            loss.backward()
            evals[0] += 1
            history.append(float(loss.detach()))
            if progress:
                shown = {n: v.detach().reshape(-1).tolist() for n, v in values().items()}
                progress(evals[0], float(loss.detach()), shown)
            return loss
        opt.step(closure)

    def loss_with(name, val) -> float:
        with torch.no_grad():
            v = values(detach=True)
            v[name] = torch.tensor([val], dtype=torch.float64)
            evals[0] += 1
            return float(obj_fit(v))

    fit_gradient()
    if discrete:
        for n in discrete:
            lo, hi = (float(b.reshape(-1)[0]) for b in bnd[n])
            if n == "latency":
                cands = range(0, int(hi) + 1)
                losses = [loss_with(n, float(c)) for c in cands]
                fixed[n] = torch.tensor([float(int(np.argmin(losses)))], dtype=torch.float64)
            else:
                fixed[n] = torch.tensor([_golden(lambda x: loss_with(n, x), lo, hi)], dtype=torch.float64)
        fit_gradient()

    final = values(detach=True)
    with torch.no_grad():
        loss_after = float(obj_fit(final))
        pred_before = obj_held.predictions({})
        pred_after = obj_held.predictions(final)
    dofs = rp.dof_names
    tgt = obj_held.targets
    heldout = {"before": error_stats(pred_before.reshape(-1, len(dofs)), tgt.reshape(-1, len(dofs)), dofs),
               "after": error_stats(pred_after.reshape(-1, len(dofs)), tgt.reshape(-1, len(dofs)), dofs),
               "by_horizon": {}}
    for i, k in enumerate(obj_held.horizons):
        heldout["by_horizon"][k] = {"before": error_stats(pred_before[i], tgt[i], dofs)["rmse"],
                                    "after": error_stats(pred_after[i], tgt[i], dofs)["rmse"]}
    b, a = heldout["before"]["rmse"], heldout["after"]["rmse"]
    heldout["improvement"] = b / a if a > 0 else float("inf")
    return SysIdResult(
        names=names, nominal={n: nominal[n].tolist() for n in names},
        fitted={n: final[n].reshape(-1).tolist() for n in names},
        bounds={n: [bnd[n][0].tolist(), bnd[n][1].tolist()] for n in names}, window=window,
        fit_starts=int(len(fit)), heldout_starts=int(len(held)), fit_loss_before=loss_before,
        fit_loss_after=loss_after, heldout=heldout, history=history, evaluations=evals[0],
        seconds=time.perf_counter() - t_start, notes=list(setup.notes))


# ---------------------------------------------------------------------------- output
def _fmt_list(x: List[float]) -> str:
    return ", ".join(f"{v:.6g}" for v in x)


def calibrated_urdf(setup: SimSetup, result: SysIdResult) -> Optional[str]:
    """The URDF text with the calibrated masses, inertias, damping and friction; None when
    no URDF quantity was calibrated."""
    f = result.fitted
    if not any(n in f for n in ("mass_scale", "link_mass_scale", "inertia_scale", "joint_damping",
                                "joint_damping_scale", "joint_friction")):
        return None
    path = _config.resolve_urdf(setup.params, setup.source)
    if str(path).endswith(".xacro"):
        import xacro

        text = xacro.process_file(str(path)).toxml()
    else:
        text = Path(path).read_text()
    root = ET.fromstring(text)
    model = setup.model
    body_of_link = {ln: b for ln, b in zip(model.link_names, model.link_body)}
    for link in root.iter("link"):
        inert = link.find("inertial")
        if inert is None:
            continue
        s_m = s_i = 1.0
        if "mass_scale" in f:
            s_m = s_i = f["mass_scale"][0]
        if "link_mass_scale" in f:
            b = body_of_link.get(link.get("name"), -1)
            if b >= 0:
                s_m = s_i = f["link_mass_scale"][b]
        if "inertia_scale" in f:
            s_i *= f["inertia_scale"][0]
        m = inert.find("mass")
        if m is not None:
            m.set("value", f"{float(m.get('value')) * s_m:.9g}")
        it = inert.find("inertia")
        if it is not None:
            for k in ("ixx", "ixy", "ixz", "iyy", "iyz", "izz"):
                if it.get(k) is not None:
                    it.set(k, f"{float(it.get(k)) * s_i:.9g}")
    for joint in root.iter("joint"):
        name = joint.get("name")
        if name not in model.joint_names:
            continue
        j = model.joint_names.index(name)
        dyn = joint.find("dynamics")
        if dyn is None and any(n in f for n in ("joint_damping", "joint_damping_scale", "joint_friction")):
            dyn = ET.SubElement(joint, "dynamics")
        if dyn is None:
            continue
        if "joint_damping" in f:
            dyn.set("damping", f"{f['joint_damping'][j]:.9g}")
        if "joint_damping_scale" in f:
            dyn.set("damping", f"{float(dyn.get('damping', 0.0)) * f['joint_damping_scale'][0]:.9g}")
        if "joint_friction" in f:
            dyn.set("friction", f"{f['joint_friction'][j]:.9g}")
    # Relative mesh paths would break next to the new file: make them absolute.
    base = Path(path).parent
    for mesh in root.iter("mesh"):
        fn = mesh.get("filename", "")
        if fn and "://" not in fn and not os.path.isabs(fn):
            mesh.set("filename", str((base / fn).resolve()))
    comment = (f"calibrated by diffsim-ros sysid from {setup.source}: " +
               "; ".join(f"{n} = [{_fmt_list(v)}]" for n, v in f.items()))
    node = ET.Comment(comment.replace("--", "- -"))
    node.tail = "\n  "
    root.insert(0, node)
    return ET.tostring(root, encoding="unicode")


def calibrated_params(setup: SimSetup, result: SysIdResult, urdf_path: Optional[str]) -> Dict[str, Any]:
    """The training-file mapping with the calibrated values (see :func:`write_calibrated`)."""
    p = copy.deepcopy(setup.params)
    f = result.fitted
    if urdf_path is not None:
        p["urdf"] = str(urdf_path)
    sim = p.setdefault("simulator", {})
    if "actuator_lag" in f:
        sim["actuator_lag"] = float(f["actuator_lag"][0])
    if "latency" in f:
        sim["command_delay"] = int(round(f["latency"][0]))
    rot = sim.get("rotors")
    if isinstance(rot, dict):
        base = setup.sim_config.rotors
        dl, dq = list(base.drag_linear), list(base.drag_quadratic)
        if "drag_linear" in f:
            dl = f["drag_linear"]
        if "drag_quadratic" in f:
            dq = f["drag_quadratic"]
        if "drag_scale" in f:
            s = f["drag_scale"][0]
            dl, dq = [x * s for x in dl], [x * s for x in dq]
        if any(n in f for n in ("drag_linear", "drag_quadratic", "drag_scale")):
            rot["drag_linear"] = [float(x) for x in dl]
            rot["drag_quadratic"] = [float(x) for x in dq]
        if "motor_time_constant" in f:
            rot["motor_time_constant"] = float(f["motor_time_constant"][0])
        if "thrust_scale" in f:
            # The motors' real thrust against the mixer's model (the mixer keeps the nominal one).
            rot["thrust_scale"] = float(f["thrust_scale"][0]) * float(setup.sim_config.rotors.thrust_scale)
        s_inertia = _base_inertia_scale(f)
        if setup.sim_config.actuator == "ctbr" and s_inertia != 1.0:
            # The on-board rate loop computes torques from the nominal inertia; on a body s times
            # as inert it acts like a gain 1/s as large. The simulator's rate loop uses the model's
            # (calibrated) inertia, so the equivalent simulator gain is rate_gain / s.
            rot["rate_gain"] = [float(g) / s_inertia for g in setup.sim_config.rotors.rate_gain]
    return p


def _base_inertia_scale(f: Dict[str, List[float]]) -> float:
    s = 1.0
    if "mass_scale" in f:
        s *= f["mass_scale"][0]
    if "link_mass_scale" in f:
        s *= f["link_mass_scale"][0]
    if "inertia_scale" in f:
        s *= f["inertia_scale"][0]
    return s


def write_calibrated(result: SysIdResult, setup: SimSetup, out_dir, bag: str = "") -> Dict[str, str]:
    """Write ``calibrated.yaml`` (a training file in the ROS-parameter form that
    ``diffsim-ros train --config`` reads), ``calibrated.urdf`` when URDF quantities changed,
    ``sysid.json`` and ``sysid.md``. Returns the paths."""
    import json

    import yaml

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    files: Dict[str, str] = {}
    text = calibrated_urdf(setup, result)
    urdf_path = None
    if text is not None:
        urdf_path = (out / "calibrated.urdf").resolve()
        urdf_path.write_text('<?xml version="1.0"?>\n' + text + "\n")
        files["urdf"] = str(urdf_path)
    params = calibrated_params(setup, result, urdf_path)
    notes = []
    if setup.sim_config.gravity_compensation and any(n in result.fitted for n in ("mass_scale", "link_mass_scale")):
        notes.append("masses are written into the calibrated URDF, so the simulator's gravity compensation uses "
                     "them too, while the robot's controller compensates with the nominal model; the simulator has "
                     "no setting for a separate controller model")
    if setup.sim_config.actuator == "ctbr" and _base_inertia_scale(result.fitted) != 1.0:
        notes.append("rotors.rate_gain is divided by the calibrated inertia scale: the robot's rate loop, tuned "
                     "for the nominal inertia, is that much weaker on the calibrated body")
    header = ["# Calibrated by `diffsim-ros sysid` from " + (bag or "a bag") + f" (model from {setup.source}).",
              "# Fitted: " + "; ".join(f"{n} = [{_fmt_list(v)}]" for n, v in result.fitted.items()),
              f"# Held-out velocity RMSE {result.heldout['before']['rmse']:.4g} -> "
              f"{result.heldout['after']['rmse']:.4g} ({result.window}-step windows).",
              *[f"# Note: {n}" for n in notes],
              "#   diffsim-ros train --config <this file> --out DIR"]
    yml = yaml.safe_dump({"/**": {"ros__parameters": params}}, sort_keys=False, default_flow_style=None)
    (out / "calibrated.yaml").write_text("\n".join(header) + "\n" + yml)
    files["yaml"] = str(out / "calibrated.yaml")
    from ..learning.checkpoint import json_safe

    d = result.as_dict()
    d["notes"] = list(d["notes"]) + notes
    d["bag"] = bag
    d["model_source"] = setup.source
    (out / "sysid.json").write_text(json.dumps(json_safe(d), indent=2))
    files["json"] = str(out / "sysid.json")
    (out / "sysid.md").write_text(sysid_markdown(result, bag, setup.source, notes))
    files["markdown"] = str(out / "sysid.md")
    return files


def sysid_markdown(r: SysIdResult, bag: str, source: str, notes: Sequence[str] = ()) -> str:
    h = r.heldout
    lines = [f"# System identification: {bag}", "",
             f"Model and simulator from {source}. {r.window}-step windows: {r.fit_starts} to fit (first part of "
             f"the bag), {r.heldout_starts} held out (the rest). {r.evaluations} loss evaluations, "
             f"{r.seconds:.1f} s.", "",
             "| parameter | nominal | calibrated | bounds |", "|---|---|---|---|"]
    for n in r.names:
        lo, hi = r.bounds[n]
        lines.append(f"| {n} ({SPECS[n].unit}) | {_fmt_list(r.nominal[n])} | {_fmt_list(r.fitted[n])} | "
                     f"[{_fmt_list(lo)}] .. [{_fmt_list(hi)}] |")
    lines += ["", "## Held-out velocity error", "",
              f"RMSE over every step of the held-out windows: **{h['before']['rmse']:.4g} -> "
              f"{h['after']['rmse']:.4g}** ({h['improvement']:.1f} times smaller).", "",
              "| dof | RMSE before | RMSE after | bias before | bias after |", "|---|---|---|---|---|"]
    for dof, b in h["before"]["per_dof"].items():
        a = h["after"]["per_dof"][dof]
        lines.append(f"| {dof} | {b['rmse']:.4g} | {a['rmse']:.4g} | {b['bias']:.3g} | {a['bias']:.3g} |")
    lines += ["", "| horizon (steps) | RMSE before | RMSE after |", "|---|---|---|"]
    for k, v in h["by_horizon"].items():
        lines.append(f"| {k} | {v['before']:.4g} | {v['after']:.4g} |")
    lines += ["", f"Fit loss (normalised squared velocity error): {r.fit_loss_before:.4g} -> {r.fit_loss_after:.4g}."]
    for n in list(r.notes) + list(notes):
        lines.append(f"\nNote: {n}")
    return "\n".join(lines) + "\n"
