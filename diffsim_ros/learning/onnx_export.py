"""ONNX export of a checkpoint: ``policy.onnx`` beside ``policy.pt``, checked against it.

    report = export_onnx("policies/reach_arm")      # writes policies/reach_arm/policy.onnx
    report["max_abs_diff"]                          # onnxruntime against TorchScript, per kind of input

The exported graph is the TorchScript policy's own (the observation normaliser is inside it, as
in policy.pt): input ``observation`` float32 (B, obs_dim), output ``action`` float32 (B,
action_dim), B free. policy.json is not changed; its text travels inside the ONNX file too
(metadata_props ``diffsim_ros.policy_json``, with ``diffsim_ros.policy_pt_sha256``), so the
file alone says what it observes and commands (:mod:`diffsim_ros.onboard` reads it).

Before the file is written in place, onnxruntime runs it beside TorchScript on observations drawn
around the normaliser's statistics (mean +- 3 standard deviations, and far outside them) and on
the observations of simulator episodes of the checkpoint's own task; any action differing by more
than ``tolerance`` refuses the export (OnnxExportError) and leaves no policy.onnx behind.
"""
from __future__ import annotations

import hashlib
import json
import os
import tempfile
import warnings
from pathlib import Path
from typing import Any, Dict, Union

import numpy as np
import torch

from ..onboard import INPUT, METADATA_KEY, ONNX_FILE, OUTPUT, SOURCE_SHA_KEY
from .checkpoint import CheckpointError

__all__ = ["export_onnx", "OnnxExportError", "OPSET"]

OPSET = 17


class OnnxExportError(CheckpointError):
    """The export failed or its graph does not compute the TorchScript policy's actions."""


def _observations(folder: Path, meta: Dict[str, Any], module, episodes: int, seed: int) -> Dict[str, np.ndarray]:
    """Draw the inputs to compare on.

    They are drawn around the normaliser's statistics, far outside them, and met in ``episodes``
    simulator episodes of the checkpoint's task (the TorchScript policy acting).
    """
    from .deploy import task_from_metadata

    n = int(meta["observation"]["dim"])
    gen = np.random.default_rng(seed)
    norm = meta.get("normalization") or {}
    mean = np.asarray(norm.get("mean", np.zeros(n)), dtype=np.float64).reshape(-1)
    std = np.sqrt(np.asarray(norm.get("var", np.ones(n)), dtype=np.float64).reshape(-1))
    if mean.shape != (n,) or std.shape != (n,):
        mean, std = np.zeros(n), np.ones(n)
    out = {"drawn": mean + std * gen.standard_normal((256, n)) * gen.uniform(0.0, 3.0, (256, 1)),
           "far": mean + std * gen.standard_normal((64, n)) * 100.0}
    if episodes > 0:
        # The checkpoint's task (its robot, simulator and task from policy.json; the NaN guard off,
        # as evaluation has it), acted on by the TorchScript policy itself.
        judged = dict(meta, simulator=dict(meta["simulator"], nan_check=False))
        _, task = task_from_metadata(judged, str(folder), dtype=torch.float32)
        seen = []
        with torch.no_grad():
            ts = task.reset(int(episodes), torch.Generator().manual_seed(int(seed)))
            for _ in range(int(task.horizon)):
                obs = task.observe(ts)
                seen.append(obs.double().cpu().numpy())
                ts = task.step(ts, module(obs.to(torch.float32)).to(obs.dtype))
        out["episodes"] = np.concatenate(seen)
    return {k: v.astype(np.float32) for k, v in out.items()}


def export_onnx(folder: Union[str, os.PathLike], episodes: int = 8, seed: int = 0,
                tolerance: float = 1e-5) -> Dict[str, Any]:
    """Write ``folder``/policy.onnx from ``folder``/policy.pt (module doc).

    Returns the path, the opset, the largest |action difference| per kind of input
    (``max_abs_diff``) and how many observations were compared.
    """
    import onnx
    import onnxruntime as ort

    folder = Path(os.fspath(folder))
    pt, js = folder / "policy.pt", folder / "policy.json"
    for f in (pt, js):
        if not f.is_file():
            raise OnnxExportError(f"{folder}: no {f.name} (a checkpoint folder written by diffsim-ros train)")
    text = js.read_text()
    meta = json.loads(text)
    module = torch.jit.load(str(pt), map_location="cpu").eval()
    n = int(meta["observation"]["dim"])
    example = torch.zeros(1, n, dtype=torch.float32)
    with tempfile.TemporaryDirectory(dir=folder) as tmp:
        raw = Path(tmp) / ONNX_FILE
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")          # the exporter's notes on TorchScript input
                torch.onnx.export(module, (example,), str(raw), dynamo=False, opset_version=OPSET,
                                  input_names=[INPUT], output_names=[OUTPUT],
                                  dynamic_axes={INPUT: {0: "batch"}, OUTPUT: {0: "batch"}})
        except Exception as e:  # noqa: BLE001 - whatever the exporter raises, named
            raise OnnxExportError(f"{pt}: torch.onnx.export failed: {type(e).__name__}: {e}") from None
        model = onnx.load(str(raw))
        props = {METADATA_KEY: text, SOURCE_SHA_KEY: hashlib.sha256(pt.read_bytes()).hexdigest()}
        for key, value in props.items():
            entry = model.metadata_props.add()
            entry.key, entry.value = key, value
        model.producer_name = "diffsim_ros"
        onnx.checker.check_model(model)
        final = Path(tmp) / "checked.onnx"
        onnx.save(model, str(final))
        session = ort.InferenceSession(str(final), providers=["CPUExecutionProvider"])
        diffs, count = {}, 0
        with torch.no_grad():
            for kind, x in _observations(folder, meta, module, episodes, seed).items():
                ref = module(torch.from_numpy(x)).numpy()
                got = session.run([OUTPUT], {INPUT: x})[0]
                if got.shape != ref.shape:
                    raise OnnxExportError(f"{pt}: the ONNX graph gives actions of shape {got.shape}, "
                                          f"TorchScript {ref.shape}")
                diffs[kind] = float(np.abs(got.astype(np.float64) - ref.astype(np.float64)).max())
                count += len(x)
        worst = max(diffs.values())
        if not worst <= tolerance:
            raise OnnxExportError(f"{pt}: the ONNX graph's actions differ from TorchScript's by up to {worst:.3g} "
                                  f"(tolerance {tolerance:g}; per input: {diffs})")
        os.replace(final, folder / ONNX_FILE)
    return {"path": str(folder / ONNX_FILE), "opset": OPSET, "max_abs_diff": diffs, "observations": count,
            "tolerance": tolerance}
