"""``analyze``: a bag's sim-vs-real velocity comparison.

It is written as metrics JSON, PNG plots and a markdown report.

    metrics = analyze("run1", out_dir="analysis/", horizons=(1, 5, 10))

Steps: read the bag (timing report per topic), rebuild the model and simulator (bag
metadata or ``config_path``), replay the recorded commands from every recorded state
1 and k steps ahead in one batch, and compare the predicted velocities with the
recorded ones per joint (arms) or per body axis (quadrotors): RMSE, bias (mean of
predicted - actual), maximum |error|, and how they grow with the horizon.
"""
from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Dict, Optional, Sequence

import numpy as np
import torch

from .bag import BagData, read_bag
from .errors import AnalysisError
from .predict import Replay, error_stats, online_prediction_stats, replaying, sim_setup

DEFAULT_HORIZONS = (1, 5, 10)


def analyze(bag, out_dir=None, config_path: Optional[str] = None, horizons: Sequence[int] = DEFAULT_HORIZONS,
            max_starts: Optional[int] = 4096, plots: bool = True, dtype=torch.float64,
            state_topic: Optional[str] = None, command_topic: Optional[str] = None,
            data: Optional[BagData] = None) -> Dict[str, Any]:
    """Analyse ``bag`` and return the metrics.

    With ``out_dir``, write metrics.json, velocity.png, error_vs_horizon.png and report.md there.
    ``max_starts`` bounds the start states of the k > 1 step predictions (evenly spread; one-step
    predictions use every state). ``data``: an already read bag (then ``bag`` only names it).
    """
    t0 = time.perf_counter()
    horizons = sorted({int(k) for k in horizons})
    if not horizons or horizons[0] < 1:
        raise AnalysisError(f"--horizons must be positive integers, got {list(horizons)}")
    if data is None:
        data = read_bag(bag, state_topic=state_topic, command_topic=command_topic)
    t_read = time.perf_counter() - t0
    setup = sim_setup(data, config_path, dtype=dtype)
    with replaying(data):
        rp = Replay(data, setup)
        t1 = time.perf_counter()
        preds = rp.predict(horizons, max_starts=max_starts)
        t_pred = time.perf_counter() - t1
        online = online_prediction_stats(rp)
    if all(len(p.start) == 0 for p in preds.values()):
        raise AnalysisError(f"{data.path}: no command is followed by a state one control step "
                            f"({setup.sim_config.dt} s) later; states and commands do not overlap in time, or the "
                            f"control step is wrong")
    by_h = {k: error_stats(p.v_pred, p.v_true, rp.dof_names) for k, p in preds.items()}
    growth = {dof: [by_h[k]["per_dof"].get(dof, {}).get("rmse", float("nan")) for k in horizons]
              for dof in rp.dof_names}
    v_std = rp.v.std(0).tolist()
    cfg = setup.sim_config
    metrics: Dict[str, Any] = {
        "bag": str(data.path), "storage": data.storage, "kind": data.kind, "duration_s": data.duration_s,
        "model": {"name": setup.model.name, "source": setup.source, "dofs": rp.dof_names},
        "simulator": {"dt": cfg.dt, "substeps": cfg.substeps, "actuator": cfg.actuator,
                      "command_delay": cfg.command_delay, "warmup_steps": rp.warmup},
        "topics": {t: s.as_dict() for t, s in data.topics.items()},
        "alignment": {"state_topic": data.state_topic, "command_topic": data.command_topic,
                      "command_stamps": data.cmd_stamp_source, "states": int(len(data.t_state)),
                      "commands": int(len(data.cmd))},
        "velocity_std": dict(zip(rp.dof_names, v_std)),
        "prediction": {"horizons": horizons, "by_horizon": {str(k): v for k, v in by_h.items()},
                       "rmse_growth": growth},
        "online_prediction": online,
        "warnings": list(data.warnings), "notes": list(setup.notes),
    }
    t_total = time.perf_counter() - t0
    metrics["timing"] = {"read_s": t_read, "predict_s": t_pred, "analysis_s": t_total,
                         "faster_than_real_time": data.duration_s / t_total if t_total > 0 else None}
    if out_dir is not None:
        out = Path(out_dir)
        try:
            out.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise AnalysisError(f"--out {out}: {exc.strerror or exc}") from None
        files = {}
        if plots:
            files["velocity_plot"] = str(out / "velocity.png")
            files["horizon_plot"] = str(out / "error_vs_horizon.png")
            plot_velocity(rp, preds, out / "velocity.png")
            plot_horizon(metrics, out / "error_vs_horizon.png")
        files["report"] = str(out / "report.md")
        files["metrics"] = str(out / "metrics.json")
        metrics["files"] = files
        metrics["timing"]["with_output_s"] = time.perf_counter() - t0
        (out / "report.md").write_text(markdown(metrics))
        (out / "metrics.json").write_text(json.dumps(_json(metrics), indent=2))
    return metrics


def _json(x):
    if isinstance(x, dict):
        return {str(k): _json(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_json(v) for v in x]
    if isinstance(x, float) and not np.isfinite(x):
        return str(x)
    if isinstance(x, (np.floating, np.integer)):
        return _json(x.item())
    return x


# ---------------------------------------------------------------------------- plots
def _thin(n: int, most: int = 3000) -> np.ndarray:
    return np.arange(n) if n <= most else np.linspace(0, n - 1, most).round().astype(np.int64)


def plot_velocity(rp: Replay, preds, path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = rp.dof_names
    t0 = rp.t_state[0]
    ts = (rp.t_state - t0) * 1e-9
    v = rp.v.cpu().numpy()
    # Left: the velocities; right: the error (predicted - recorded), which stays readable
    # when the velocities of a long bag blur into one band.
    fig, axes = plt.subplots(len(names), 2, figsize=(15, 1.9 * len(names) + 0.6), sharex=True, squeeze=False,
                             gridspec_kw={"width_ratios": [3, 2]})
    ks = sorted(preds)
    show = [ks[0]] + ([ks[-1]] if len(ks) > 1 else [])
    colours = {ks[0]: "tab:blue", ks[-1]: "tab:orange"}
    d = rp.data
    for i, (ax, name) in enumerate(zip(axes[:, 0], names)):
        sel = _thin(len(ts))
        ax.plot(ts[sel], v[sel, i], color="black", lw=1.0, label="recorded")
        for k in show:
            p = preds[k]
            if len(p.start) == 0:
                continue
            s = _thin(len(p.t))
            ax.plot((p.t[s] - t0) * 1e-9, p.v_pred[s, i].cpu().numpy(), ".", ms=2, color=colours[k],
                    label=f"simulated, {k} step{'s' if k > 1 else ''} ahead")
        if d.pred_v is not None and d.kind == "quadrotor":
            s = _thin(len(d.pred_t))
            ax.plot((d.pred_t[s] - t0) * 1e-9, d.pred_v[s, i], "--", lw=0.8, color="tab:green",
                    label="controller's prediction")
        elif d.pred_v is not None and name in d.pred_joint_names:
            s = _thin(len(d.pred_t))
            ax.plot((d.pred_t[s] - t0) * 1e-9, d.pred_v[s, d.pred_joint_names.index(name)], "--", lw=0.8,
                    color="tab:green", label="controller's prediction")
        unit = "rad/s" if (d.kind == "arm" or name.startswith("w") or name in d.joint_names) else "m/s"
        ax.set_ylabel(f"{name}\n[{unit}]")
        ax.grid(alpha=0.3)
        ax_e = axes[i, 1]
        for k in show:
            p = preds[k]
            if len(p.start) == 0:
                continue
            s = _thin(len(p.t))
            err = (p.v_pred[s, i] - p.v_true[s, i]).cpu().numpy()
            ax_e.plot((p.t[s] - t0) * 1e-9, err, ".", ms=2, color=colours[k], label=f"{k} step{'s' if k > 1 else ''}")
        ax_e.axhline(0.0, color="black", lw=0.6)
        ax_e.grid(alpha=0.3)
    axes[0, 0].legend(loc="upper right", fontsize=7, ncol=4)
    axes[0, 1].legend(loc="upper right", fontsize=7, ncol=2)
    axes[0, 0].set_title("velocity", fontsize=9)
    axes[0, 1].set_title("predicted - recorded", fontsize=9)
    axes[-1, 0].set_xlabel("time since the first state [s]")
    axes[-1, 1].set_xlabel("time since the first state [s]")
    fig.suptitle(f"{Path(d.path).name}: recorded vs simulated velocity")
    # Fixed margins: tight_layout measures every label and costs more than the drawing.
    fig.subplots_adjust(left=0.07, right=0.99, top=1 - 0.55 / fig.get_figheight(), bottom=0.45 / fig.get_figheight(),
                        hspace=0.12, wspace=0.15)
    fig.savefig(path, dpi=90)
    plt.close(fig)


def plot_horizon(metrics: Dict[str, Any], path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    hs = metrics["prediction"]["horizons"]
    fig, ax = plt.subplots(figsize=(6, 4))
    for dof, vals in metrics["prediction"]["rmse_growth"].items():
        ax.plot(hs, vals, "o-", label=dof)
    ax.set_xlabel("prediction horizon [control steps]")
    ax.set_ylabel("velocity RMSE [rad/s or m/s]")
    ax.set_title("velocity error against horizon")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


# ---------------------------------------------------------------------------- markdown
def markdown(m: Dict[str, Any]) -> str:
    hs = m["prediction"]["horizons"]
    byh = m["prediction"]["by_horizon"]
    k1, kn = str(hs[0]), str(hs[-1])
    L = [f"# Sim-vs-real analysis: {m['bag']}", "",
         f"{m['kind']} '{m['model']['name']}' (model and simulator from {m['model']['source']}), "
         f"{m['duration_s']:.2f} s of {m['storage']} bag; simulator dt {m['simulator']['dt']:g} s, "
         f"{m['simulator']['substeps']} substeps, '{m['simulator']['actuator']}' commands from "
         f"'{m['alignment']['command_topic']}' (aligned by {m['alignment']['command_stamps']} stamps).", "",
         f"**Velocity RMSE {byh[k1]['rmse']:.4g} at {k1} step(s), {byh[kn]['rmse']:.4g} at {kn} steps** "
         f"(recorded velocity standard deviation: "
         + ", ".join(f"{d} {s:.3g}" for d, s in m["velocity_std"].items()) + ").", ""]
    on = m.get("online_prediction")
    if on and on.get("count"):
        L += [f"The controller's own one-step predictions (/diffsim/predicted_state): RMSE {on['rmse']:.4g} over "
              f"{on['count']} states.", ""]
    L += ["## Timing of the topics", "",
          "| topic | type | messages | rate (Hz) | jitter std (ms) | jitter max (ms) | drops | duplicates | "
          "out of order | latency mean (ms) |", "|---|---|---|---|---|---|---|---|---|---|"]
    for t, s in m["topics"].items():
        lat = "-" if s["latency_mean_s"] is None else f"{s['latency_mean_s'] * 1e3:.3g}"
        L.append(f"| {t} ({s['stamp_source']} stamps) | {s['msgtype']} | {s['count']} | {s['rate_hz']:.4g} | "
                 f"{s['jitter_std_s'] * 1e3:.3g} | {s['jitter_max_s'] * 1e3:.3g} | {s['drops']} | "
                 f"{s['duplicates']} | {s['out_of_order']} | {lat} |")
    other = [t for t, s in m["topics"].items() if s.get("latency_note")]
    if other:
        L += ["", "Latency: header stamps are on another clock (simulated time) than the receive times on "
              + ", ".join(other) + "; not computed."]
    L += ["", "## Velocity error per degree of freedom", "",
          "Predicted minus recorded velocity, the recorded commands replayed from each recorded state.", "",
          "| dof | " + " | ".join(f"RMSE {k}" for k in hs) + f" | bias {k1} | bias {kn} | max {k1} | max {kn} |",
          "|---|" + "---|" * (len(hs) + 4)]
    for dof in m["model"]["dofs"]:
        row = [f"{byh[str(k)]['per_dof'].get(dof, {}).get('rmse', float('nan')):.4g}" for k in hs]
        p1, pn = byh[k1]["per_dof"].get(dof, {}), byh[kn]["per_dof"].get(dof, {})
        row += [f"{p1.get('bias', float('nan')):.3g}", f"{pn.get('bias', float('nan')):.3g}",
                f"{p1.get('max_abs', float('nan')):.3g}", f"{pn.get('max_abs', float('nan')):.3g}"]
        L.append(f"| {dof} | " + " | ".join(row) + " |")
    L += ["", "Predictions per horizon: " + ", ".join(f"{k}: {byh[str(k)]['count']}" for k in hs) + ".", ""]
    if "files" in m:
        if "velocity_plot" in m["files"]:
            L += ["![velocity](velocity.png)", "", "![error against horizon](error_vs_horizon.png)", ""]
    for w in m["warnings"]:
        L.append(f"- warning: {w}")
    for n in m["notes"]:
        L.append(f"- note: {n}")
    tm = m["timing"]
    L += ["", f"Analysis took {tm['analysis_s']:.2f} s ({tm['faster_than_real_time']:.1f} times faster than the "
              f"bag's duration; reading {tm['read_s']:.2f} s, prediction {tm['predict_s']:.2f} s)."]
    return "\n".join(L) + "\n"
