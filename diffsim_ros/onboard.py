"""Run an exported policy on a robot's onboard computer with numpy and onnxruntime alone (no torch).

    from diffsim_ros.onboard import OnnxPolicy
    policy = OnnxPolicy("policies/reach_arm")          # policy.onnx (diffsim-ros export --onnx) + policy.json
    action = policy.act(observation)                   # (obs_dim,) or (B, obs_dim) -> actions in [-1, 1]
    command = policy.command(action, joint_positions)  # the command the policy was trained to send

    python -m diffsim_ros.onboard policies/reach_arm [--observations obs.npy]

The observation is the checkpoint's (policy.json ``observation.names``, in that order and in SI
units; the normaliser is inside policy.onnx). The command is the checkpoint's own map from action
to the simulator's interface (policy.json ``command``): ``affine`` (``offset + scale * action``:
joint position targets about a stance, efforts, collective thrust and body rates) or ``delta``
(``clamp(q + scale * action, low, high)`` about the measured joint positions ``q``). Every action
is clamped to [-1, 1] first, as in training.

This module imports nothing of torch or of the rest of the package, so it can be copied next to a
policy.onnx and its policy.json onto a computer that has only numpy and onnxruntime.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Optional, Sequence, Union

import numpy as np

__all__ = ["OnnxPolicy", "ONNX_FILE", "INPUT", "OUTPUT", "METADATA_KEY", "SOURCE_SHA_KEY"]

ONNX_FILE = "policy.onnx"
INPUT, OUTPUT = "observation", "action"
METADATA_KEY = "diffsim_ros.policy_json"      # policy.json's text, inside policy.onnx's metadata_props
SOURCE_SHA_KEY = "diffsim_ros.policy_pt_sha256"   # sha256 of the policy.pt it was exported from, beside it


class OnnxPolicy:
    """A checkpoint's exported policy (``folder``/policy.onnx) run by onnxruntime on the CPU."""

    def __init__(self, folder: Union[str, os.PathLike], threads: int = 1):
        import onnxruntime as ort

        folder = Path(folder)
        path = folder / ONNX_FILE if folder.is_dir() else folder
        if not path.is_file():
            raise FileNotFoundError(f"{path}: no exported policy (write it with `diffsim-ros export "
                                    f"{path.parent} --onnx`)")
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = int(threads)
        opts.inter_op_num_threads = 1
        self.session = ort.InferenceSession(str(path), sess_options=opts, providers=["CPUExecutionProvider"])
        props = self.session.get_modelmeta().custom_metadata_map
        text = props.get(METADATA_KEY)
        if text is None and (path.parent / "policy.json").is_file():
            text = (path.parent / "policy.json").read_text()
        if text is None:
            raise ValueError(f"{path}: no metadata (neither '{METADATA_KEY}' inside nor a policy.json beside it)")
        self.meta = json.loads(text)
        self.obs_dim = int(self.meta["observation"]["dim"])
        self.action_dim = int(self.meta["action"]["dim"])
        self.observation_names = list(self.meta["observation"]["names"])
        self.map = self.meta["command"]
        self.path = path

    def act(self, observation) -> np.ndarray:
        """Actions in [-1, 1] for one observation (obs_dim,) or a batch (B, obs_dim)."""
        x = np.asarray(observation, dtype=np.float32)
        one = x.ndim == 1
        x = x.reshape(1, -1) if one else x
        if x.shape[-1] != self.obs_dim:
            raise ValueError(f"observation has {x.shape[-1]} values, the policy takes {self.obs_dim} "
                             f"({', '.join(self.observation_names[:4])}, ...)")
        if not np.all(np.isfinite(x)):
            raise ValueError("non-finite observation")
        a = self.session.run([OUTPUT], {INPUT: np.ascontiguousarray(x)})[0]
        a = np.clip(a.astype(np.float64), -1.0, 1.0)
        return a[0] if one else a

    def command(self, action, joint_positions: Optional[Sequence[float]] = None) -> np.ndarray:
        """Return the command (policy.json ``command.names``, ``command.units``) for ``action``.

        A ``delta`` map also needs ``joint_positions``, the measured positions of those joints.
        """
        a = np.clip(np.asarray(action, dtype=np.float64), -1.0, 1.0)
        scale = np.asarray(self.map["scale"], dtype=np.float64)
        if self.map["type"] == "affine":
            return np.asarray(self.map["offset"], dtype=np.float64) + scale * a
        if joint_positions is None:
            raise ValueError(f"a delta command moves the measured joints {self.map['names']}: give their positions")
        q = np.asarray(joint_positions, dtype=np.float64)
        return np.minimum(np.maximum(q + scale * a, self.map["low"]), self.map["high"])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m diffsim_ros.onboard",
                                 description="Run an exported policy (policy.onnx) with numpy and onnxruntime only: "
                                             "actions and commands for observations.")
    ap.add_argument("checkpoint", help="folder with policy.onnx (diffsim-ros export CHECKPOINT --onnx)")
    ap.add_argument("--observations", help=".npy file of observations (N, obs_dim); default: one zero observation")
    ap.add_argument("--joint-positions", help=".npy file (N, joints) of measured positions for a delta command map")
    args = ap.parse_args(argv)
    try:
        pol = OnnxPolicy(args.checkpoint)
        obs = np.load(args.observations) if args.observations else np.zeros((1, pol.obs_dim))
        obs = obs.reshape(-1, pol.obs_dim)
        q = np.load(args.joint_positions).reshape(len(obs), -1) if args.joint_positions else None
        if q is None and pol.map["type"] == "delta":
            q = np.zeros((len(obs), len(pol.map["names"])))
        for i, a in enumerate(pol.act(obs)):
            c = pol.command(a, None if q is None else q[i])
            print(json.dumps({"action": [round(float(x), 6) for x in a], "command": [round(float(x), 6) for x in c]}))
    except (OSError, ValueError, KeyError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
