"""Policy checkpoints: a TorchScript policy plus a JSON metadata file.

    paths = save_checkpoint(policy, task, "out/", extra={"training": {...}})
    # out/policy.pt    TorchScript, float32, CPU: obs (B, obs_dim) -> action (B, action_dim) in [-1, 1]
    # out/policy.json  what a controller needs to use it without the task code

    policy, meta = load_checkpoint("out/", model=model)   # refuses another robot
    action = policy(obs.float())
    command = offset + scale * action                      # meta["command"] (type affine), per entry

``policy.json`` (``format: diffsim_ros.policy``, ``format_version: 1``) holds:

- ``task``, ``observation`` {dim, names}, ``action`` {dim, names, low, high,
  interface}, ``dt`` (s, one control step), ``horizon`` (control steps);
- ``robot``: {name, urdf_sha256, urdf (where it was loaded from), floating_base,
  joint_names (the model's joints, in q/v order), actuated_joints (the joints the
  action drives, in action order)};
- ``simulator``: the simulator parameters (``SimConfig.to_dict()``; non-finite
  numbers written as the strings "inf", "-inf", "nan");
- ``normalization``: the running observation mean/var inside the policy (for
  information: the TorchScript module applies it itself), or null;
- ``command``: the map from action to the simulator's command interface, with names
  and units: ``affine``, ``command[i] = offset[i] + scale[i] * action[i]``, or ``delta``,
  ``command[i] = clamp(q[i] + scale[i] * action[i], low[i], high[i])`` on the measured
  joint positions ``q`` (see :func:`command_mapping`); plus the
  task's own parameters (reach position: ``q_mid``/``q_half``; effort: ``effort_limit``;
  quadrotor CTBR: ``hover_thrust``, ``thrust_range``, ``max_rate``; locomotion:
  ``stance``, ``action_scale``);
- ``policy``: {file, sha256, dtype, export (script or trace), module};
- ``created`` (UTC, ISO 8601), ``diffsim_ros_version``, and whatever ``extra``
  adds (the CLI adds ``training``: env steps, success, ...; ``config``).

Loading never unpickles: the module goes through ``torch.jit.load`` (TorchScript's
own archive reader) and the metadata through ``json``. Every problem with a
checkpoint is a :class:`CheckpointError` that names the file and the field.
"""
from __future__ import annotations

import contextlib
import copy
import datetime as _dt
import hashlib
import json
import math
import os
import warnings
from pathlib import Path
from typing import Any, Dict, Mapping, Optional, Sequence, Tuple, Union

import torch
from torch import nn

FORMAT = "diffsim_ros.policy"
FORMAT_VERSION = 1
POLICY_FILE = "policy.pt"
META_FILE = "policy.json"

PathLike = Union[str, os.PathLike]

__all__ = ["CheckpointError", "FORMAT", "FORMAT_VERSION", "POLICY_FILE", "META_FILE", "save_checkpoint",
           "robot_kind", "load_checkpoint", "load_metadata", "check_compatible", "export_policy", "command_mapping",
           "training_summary", "json_safe", "package_version"]

#: Top-level fields written by :func:`save_checkpoint`; ``extra`` may not replace them.
RESERVED = ("format", "format_version", "created", "diffsim_ros_version", "task", "observation", "action", "dt",
            "horizon", "robot", "simulator", "normalization", "command", "policy")


class CheckpointError(ValueError):
    """A checkpoint that cannot be used: unreadable, malformed, or made for another robot."""


# ---------------------------------------------------------------------------- helpers
def json_safe(x: Any) -> Any:
    """``x`` as plain JSON values.

    Tuples/tensors/arrays -> lists, dataclass-likes via ``to_dict``/``asdict``, non-finite floats
    -> "inf"/"-inf"/"nan", other objects -> str.
    """
    import dataclasses

    if x is None or isinstance(x, (bool, str)):
        return x
    if isinstance(x, int):
        return int(x)
    if isinstance(x, float):
        if math.isfinite(x):
            return x
        return "nan" if math.isnan(x) else ("inf" if x > 0 else "-inf")
    if isinstance(x, torch.Tensor):
        if x.dtype in (torch.float32, torch.float16, torch.bfloat16):
            # The shortest decimal that reads back as the same float32 (2.9, not 2.9000000953674316).
            import numpy as np
            flat = [float(str(np.float32(v))) for v in x.detach().cpu().to(torch.float32).reshape(-1).tolist()]
            return json_safe(torch.tensor(flat, dtype=torch.float64).reshape(x.shape).tolist()) if x.dim() else \
                json_safe(flat[0])
        return json_safe(x.detach().cpu().tolist())
    if hasattr(x, "tolist") and hasattr(x, "dtype"):          # numpy arrays and scalars
        return json_safe(x.tolist())
    if isinstance(x, Mapping):
        return {str(k): json_safe(v) for k, v in x.items()}
    if isinstance(x, (list, tuple, set, frozenset)):
        return [json_safe(v) for v in x]
    if isinstance(x, (torch.dtype, torch.device, Path)):
        return str(x)
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        return json_safe(dataclasses.asdict(x))
    return str(x)


def package_version() -> str:
    """diffsim_ros's version: the installed distribution's, else package.xml's, else "unknown"."""
    try:
        from importlib.metadata import PackageNotFoundError, version
        try:
            return version("diffsim_ros")
        except PackageNotFoundError:
            pass
    except ImportError:        # pragma: no cover
        pass
    import re
    xml = Path(__file__).resolve().parents[2] / "package.xml"
    try:
        m = re.search(r"<version>\s*([^<\s]+)\s*</version>", xml.read_text(errors="replace"))
        if m:
            return m.group(1)
    except OSError:
        pass
    return "unknown"


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


@contextlib.contextmanager
def _quiet_jit():
    """Keep torch's deprecation note on torch.jit out of the CLI.

    TorchScript is the deployment format here (C++/ROS controllers load it without Python);
    recent torch releases flag torch.jit as deprecated.
    """
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r".*torch\.jit\.\w+` is deprecated", category=DeprecationWarning)
        warnings.filterwarnings("ignore", message=r".*is deprecated.*torch\.(compile|export)",
                                category=DeprecationWarning)
        yield


def _find_norm(policy: nn.Module):
    from .policy import RunningNorm

    norm = getattr(policy, "norm", None)
    if isinstance(norm, RunningNorm):
        return norm
    for mod in policy.modules():
        if isinstance(mod, RunningNorm):
            return mod
    return None


def _normalization(policy: nn.Module) -> Optional[Dict[str, Any]]:
    norm = _find_norm(policy)
    if norm is None:
        return None
    return {"type": "running_mean_var", "applied_inside_policy": True,
            "formula": "clamp((obs - mean) / sqrt(var + eps), -clip, clip)",
            "mean": json_safe(norm.mean), "var": json_safe(norm.var), "count": float(norm.count),
            "eps": float(norm.eps), "clip": float(norm.clip)}


# ---------------------------------------------------------------------------- command mapping
_UNITS = {"position": ("rad", "m"), "velocity": ("rad/s", "m/s"), "effort": ("N m", "N")}  # revolute, prismatic


def command_mapping(task) -> Dict[str, Any]:
    """How an action in [-1, 1] becomes the simulator's command, without the task code.

    Two forms, each checked against ``task.command`` itself on random states and
    actions, so the mapping written is the one the policy was trained with:

    - ``affine``: ``command[i] = offset[i] + scale[i] * action[i]`` (reach absolute
      position targets, effort, quadrotor CTBR, locomotion);
    - ``delta``: ``command[i] = clamp(q[i] + scale[i] * action[i], low[i], high[i])`` with
      ``q`` the measured position of joint ``names[i]`` (reach ``command_mode: delta``).

    Task parameters are added by name (``q_mid``/``q_half``, ``effort_limit``,
    ``hover_thrust``/``thrust_range``/``max_rate``, ``stance``/``action_scale``, ...).
    A task whose map is neither is refused with a CheckpointError.
    """
    interface = task.sim_config.actuator
    n = task.action_dim
    dtype, device = task.model.dtype, task.model.device
    delta = getattr(task, "command_mode", "absolute") == "delta" and interface == "position"
    with torch.no_grad():
        probe = 2 * torch.rand(8, n, generator=torch.Generator().manual_seed(1), dtype=dtype).to(device) - 1
        actions = torch.cat((torch.zeros(1, n, dtype=dtype, device=device),
                             torch.eye(n, dtype=dtype, device=device), probe))
        ts = task.reset(actions.shape[0], torch.Generator().manual_seed(0))
        cmd = task.command(actions, ts)
        if cmd.shape != actions.shape:
            raise CheckpointError(f"task '{task.name}': command has shape {tuple(cmd.shape)} for actions "
                                  f"{tuple(actions.shape)}; only one-to-one action-to-command maps can be exported")
        if delta:
            idx = task.sim.act_index
            q = task.sim.joint_positions(ts.sim.q)[..., idx]
            scale = torch.full((n,), float(task.delta_scale), dtype=dtype, device=device)
            low, high = task.q_low, task.q_high
            want = torch.minimum(torch.maximum(q + scale * actions, low), high)
            offset = None
        else:
            offset = cmd[0]
            scale = cmd[1:1 + n].diagonal() - offset
            want = offset + scale * actions
        tol = 1e-5 * (1.0 + float(want.abs().max()))
        matches = bool((cmd - want).abs().max() <= tol)
    if not matches:
        raise CheckpointError(f"task '{task.name}': its action-to-command map is neither affine per entry nor a "
                              "clamped delta on the measured joint positions; the checkpoint format cannot describe "
                              "it (extend diffsim_ros.learning.checkpoint.command_mapping)")
    if interface == "ctbr":
        names = ["collective_thrust", "body_rate/x", "body_rate/y", "body_rate/z"]
        units = ["N", "rad/s", "rad/s", "rad/s"]
    elif interface in ("position", "velocity", "effort"):
        names = list(task.sim.actuated_joints)
        types = [t for t in task.model.joint_type if t != "free"]
        if len(types) == len(task.model.joint_names):
            kinds = [types[task.model.joint_names.index(j)] for j in names]
            units = [_UNITS[interface][1] if k == "prismatic" else _UNITS[interface][0] for k in kinds]
        else:
            units = [" or ".join(_UNITS[interface])] * n
    else:
        names = [f"rotor_{i}" for i in range(n)]
        units = ["N"] * n
    if delta:
        out: Dict[str, Any] = {
            "type": "delta", "interface": interface, "names": names, "units": units,
            "formula": "command[i] = clamp(q[i] + scale[i] * clamp(action[i], -1, 1), low[i], high[i]), "
                       "q[i]: the measured position of joint names[i]",
            "scale": json_safe(scale), "low": json_safe(low), "high": json_safe(high)}
    else:
        out = {"type": "affine", "formula": "command[i] = offset[i] + scale[i] * clamp(action[i], -1, 1)",
               "interface": interface, "names": names, "units": units,
               "offset": json_safe(offset), "scale": json_safe(scale)}
    # The task's own parameters (Task.export_parameters): the mapping that rebuilds it on deployment.
    out["task_parameters"] = json_safe(task.export_parameters())
    return out


# ---------------------------------------------------------------------------- export
def export_policy(policy: nn.Module, obs_dim: int) -> Tuple[torch.jit.ScriptModule, str]:
    """Return a float32, CPU, eval-mode TorchScript copy of ``policy`` (script, else trace)."""
    module = copy.deepcopy(policy).to(device="cpu", dtype=torch.float32).eval()
    for p in module.parameters():
        p.requires_grad_(False)
    example = torch.zeros(2, obs_dim, dtype=torch.float32)
    try:
        with _quiet_jit():
            scripted = torch.jit.script(module)
        how = "script"
    except Exception as script_error:  # noqa: BLE001 - fall back to tracing, report both if that fails too
        try:
            with torch.no_grad(), _quiet_jit():
                scripted = torch.jit.trace(module, example, check_trace=False)
            how = "trace"
        except Exception as trace_error:  # noqa: BLE001
            raise CheckpointError(f"cannot export {type(policy).__name__} to TorchScript: script failed "
                                  f"({script_error}); trace failed ({trace_error})") from None
    return scripted, how


def _last_finite(history, key: str) -> Optional[float]:
    vals = [h.get(key) for h in history if isinstance(h.get(key), (int, float)) and math.isfinite(h.get(key))]
    return float(vals[-1]) if vals else None


def training_summary(result, cfg=None) -> Dict[str, Any]:
    """JSON-safe summary of a ``TrainResult`` (and its config) for ``extra={"training": ...}``."""
    history = list(getattr(result, "history", []) or [])
    last = history[-1] if history else {}
    evals = [h.get("eval_success") for h in history
             if isinstance(h.get("eval_success"), (int, float)) and not math.isnan(h.get("eval_success"))]
    out = {"iterations": int(last.get("iteration", len(history))) if history else 0,
           "env_steps": int(last.get("env_steps", 0)) if history else 0,
           "wall_time": float(last.get("wall_time", 0.0)) if history else 0.0,
           "final_eval_success": float(evals[-1]) if evals else None,
           "final_train_success": float(last["train_success"]) if "train_success" in last else None,
           # The last evaluation's fractions of episodes at a joint limit / over a velocity limit.
           **{f"final_{k}": _last_finite(history, k) for k in ("eval_at_limit", "eval_over_speed")},
           "solved_env_steps": getattr(result, "solved_env_steps", None),
           "solved_time": getattr(result, "solved_time", None)}
    out["success"] = out["solved_env_steps"] is not None
    if cfg is not None:
        out["config"] = json_safe(cfg)
    return json_safe(out)


def save_checkpoint(policy: nn.Module, task, out_dir: PathLike, extra: Optional[Mapping[str, Any]] = None
                    ) -> Dict[str, Path]:
    """Write ``policy.pt`` (TorchScript) and ``policy.json`` (metadata) into ``out_dir``.

    ``extra``: more JSON-safe top-level fields (e.g. ``{"training": training_summary(result)}``);
    it may not replace the fields listed in :data:`RESERVED`. Returns ``{"policy": path, "metadata": path}``.
    """
    out = Path(os.fspath(out_dir))
    extra = dict(extra or {})
    clash = sorted(set(extra) & set(RESERVED))
    if clash:
        raise ValueError(f"save_checkpoint: extra may not replace the reserved field(s) {', '.join(clash)}")
    spec = task.spec()
    obs_dim, act_dim = int(spec["observation"]["dim"]), int(spec["action"]["dim"])
    scripted, how = export_policy(policy, obs_dim)
    with torch.no_grad():
        probe = scripted(torch.zeros(1, obs_dim, dtype=torch.float32))
    if tuple(probe.shape) != (1, act_dim):
        raise CheckpointError(f"the policy maps (1, {obs_dim}) observations to {tuple(probe.shape)}, "
                              f"but task '{task.name}' has {act_dim} actions")

    model = task.model
    meta: Dict[str, Any] = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "diffsim_ros_version": package_version(),
        "task": str(spec["task"]),
        "observation": spec["observation"],
        "action": spec["action"],
        "dt": float(spec["dt"]),
        "horizon": int(spec["horizon"]),
        "robot": {"name": model.name, "urdf_sha256": model.urdf_sha256, "urdf": str(model.source),
                  "floating_base": bool(model.floating_base), "joint_names": list(model.joint_names),
                  "actuated_joints": list(task.sim.actuated_joints)},
        "simulator": task.sim_config.to_dict(),
        "normalization": _normalization(policy),
        "command": command_mapping(task),
        "policy": {"file": POLICY_FILE, "sha256": None, "dtype": "float32", "device": "cpu", "export": how,
                   "module": type(policy).__name__,
                   "input": f"observation, float32 tensor (B, {obs_dim})",
                   "output": f"action in [-1, 1], float32 tensor (B, {act_dim})"},
    }
    meta.update(extra)
    meta = json_safe(meta)

    out.mkdir(parents=True, exist_ok=True)
    pt, js = out / POLICY_FILE, out / META_FILE
    tmp_pt, tmp_js = out / (POLICY_FILE + ".tmp"), out / (META_FILE + ".tmp")
    scripted.save(str(tmp_pt))
    meta["policy"]["sha256"] = _sha256(tmp_pt)
    text = json.dumps(meta, indent=2, allow_nan=False) + "\n"
    tmp_js.write_text(text)
    os.replace(tmp_pt, pt)
    os.replace(tmp_js, js)
    return {"policy": pt, "metadata": js}


# ---------------------------------------------------------------------------- validation
_NUMBER = (int, float)
#: Per-action lists each form of ``command`` carries.
COMMAND_FIELDS = {"affine": ("offset", "scale"), "delta": ("scale", "low", "high")}


def _kind(x: Any) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "true/false", type(None): "null"}.get(
        type(x), "a number" if isinstance(x, _NUMBER) else type(x).__name__)


def _get(meta: Dict[str, Any], path: str, want, where: str):
    node: Any = meta
    parts = path.split(".")
    for i, p in enumerate(parts):
        if not isinstance(node, dict):
            raise CheckpointError(f"{where}: field '{'.'.join(parts[:i])}' must be an object, got {_kind(node)}")
        if p not in node:
            raise CheckpointError(f"{where}: missing field '{path}'")
        node = node[p]
    ok = {
        "int": lambda v: isinstance(v, int) and not isinstance(v, bool),
        "pos_int": lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 1,
        "number": lambda v: isinstance(v, _NUMBER) and not isinstance(v, bool),
        "pos_number": lambda v: isinstance(v, _NUMBER) and not isinstance(v, bool) and v > 0,
        "str": lambda v: isinstance(v, str),
        "bool": lambda v: isinstance(v, bool),
        "dict": lambda v: isinstance(v, dict),
        "str_list": lambda v: isinstance(v, list) and all(isinstance(s, str) for s in v),
        "num_list": lambda v: isinstance(v, list) and all(isinstance(s, _NUMBER) and not isinstance(s, bool)
                                                          for s in v),
    }[want]
    if not ok(node):
        desc = {"int": "an integer", "pos_int": "an integer >= 1", "number": "a number",
                "pos_number": "a number > 0", "str": "a string", "bool": "true or false", "dict": "an object",
                "str_list": "a list of strings", "num_list": "a list of numbers"}[want]
        shown = repr(node) if len(repr(node)) < 80 else _kind(node)
        raise CheckpointError(f"{where}: field '{path}' must be {desc}, got {shown}")
    return node


def validate_metadata(meta: Any, where: str = META_FILE) -> Dict[str, Any]:
    """Check the fields a consumer relies on; raise :class:`CheckpointError` naming the first bad one."""
    if not isinstance(meta, dict):
        raise CheckpointError(f"{where}: the top level must be a JSON object, got {_kind(meta)}")
    fmt = _get(meta, "format", "str", where)
    if fmt != FORMAT:
        raise CheckpointError(f"{where}: field 'format' is '{fmt}', expected '{FORMAT}'")
    version = _get(meta, "format_version", "int", where)
    if version != FORMAT_VERSION:
        raise CheckpointError(f"{where}: format_version {version} is not supported (this diffsim_ros reads "
                              f"version {FORMAT_VERSION})")
    _get(meta, "task", "str", where)
    od = _get(meta, "observation.dim", "pos_int", where)
    on = _get(meta, "observation.names", "str_list", where)
    ad = _get(meta, "action.dim", "pos_int", where)
    an = _get(meta, "action.names", "str_list", where)
    _get(meta, "action.interface", "str", where)
    for field, names, dim in (("observation.names", on, od), ("action.names", an, ad)):
        if len(names) != dim:
            raise CheckpointError(f"{where}: field '{field}' has {len(names)} names for dim {dim}")
    _get(meta, "dt", "pos_number", where)
    _get(meta, "horizon", "pos_int", where)
    _get(meta, "robot.name", "str", where)
    sha = _get(meta, "robot.urdf_sha256", "str", where)
    if len(sha) != 64 or any(c not in "0123456789abcdef" for c in sha):
        raise CheckpointError(f"{where}: field 'robot.urdf_sha256' is not a sha256 hex digest: {sha!r}")
    _get(meta, "robot.floating_base", "bool", where)
    joints = _get(meta, "robot.joint_names", "str_list", where)
    act = _get(meta, "robot.actuated_joints", "str_list", where)
    stray = [j for j in act if j not in joints]
    if stray:
        raise CheckpointError(f"{where}: field 'robot.actuated_joints' names joints not in 'robot.joint_names': "
                              f"{', '.join(stray)}")
    _get(meta, "simulator", "dict", where)
    if meta.get("normalization") is not None:
        _get(meta, "normalization", "dict", where)
        for key in ("mean", "var"):
            vals = _get(meta, f"normalization.{key}", "num_list", where)
            if len(vals) != od:
                raise CheckpointError(f"{where}: field 'normalization.{key}' has {len(vals)} entries for "
                                      f"observation dim {od}")
    elif "normalization" not in meta:
        raise CheckpointError(f"{where}: missing field 'normalization' (null when the policy has none)")
    kind = _get(meta, "command.type", "str", where)
    if kind not in COMMAND_FIELDS:
        raise CheckpointError(f"{where}: field 'command.type' must be one of {', '.join(COMMAND_FIELDS)}, got {kind!r}")
    _get(meta, "command.interface", "str", where)
    for key in COMMAND_FIELDS[kind] + ("names",):
        vals = _get(meta, f"command.{key}", "str_list" if key == "names" else "num_list", where)
        if len(vals) != ad:
            raise CheckpointError(f"{where}: field 'command.{key}' has {len(vals)} entries for action dim {ad}")
    _get(meta, "policy.file", "str", where)
    return meta


def load_metadata(path_or_dir: PathLike) -> Dict[str, Any]:
    """Read the validated ``policy.json`` of a checkpoint (a folder, its policy.json, or its policy.pt)."""
    meta, _, _ = _read_meta(path_or_dir)
    return meta


def robot_kind(meta: Mapping[str, Any]) -> str:
    """'arm', 'quadrotor' or 'legged' from validated metadata alone.

    'arm': fixed base; 'quadrotor': floating base with rotors; 'legged': floating base, joints and
    no rotors. This is what ``PolicyRunner.kind`` finds by building the robot, for callers that only
    need to know which topics the robot speaks (launch files).
    """
    if not meta["robot"]["floating_base"]:
        return "arm"
    return "quadrotor" if meta.get("simulator", {}).get("rotors") else "legged"


def _paths(path_or_dir: PathLike) -> Tuple[Path, Optional[Path]]:
    p = Path(os.fspath(path_or_dir))
    if p.is_dir():
        return p / META_FILE, None
    if p.suffix == ".json":
        return p, None
    if p.suffix == ".pt":
        return p.with_name(META_FILE), p
    if not p.exists():
        raise CheckpointError(f"{p}: no such checkpoint (expected a folder with {POLICY_FILE} and {META_FILE})")
    raise CheckpointError(f"{p}: not a checkpoint (give its folder, its {META_FILE} or its {POLICY_FILE})")


def _read_meta(path_or_dir: PathLike) -> Tuple[Dict[str, Any], Path, Path]:
    meta_path, pt_path = _paths(path_or_dir)
    try:
        text = meta_path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise CheckpointError(f"{meta_path}: checkpoint metadata not found") from None
    except (OSError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{meta_path}: cannot read checkpoint metadata ({e})") from None

    def no_constants(name):
        raise CheckpointError(f"{meta_path}: malformed JSON: '{name}' is not a JSON value")
    try:
        meta = json.loads(text, parse_constant=no_constants)
    except json.JSONDecodeError as e:
        raise CheckpointError(f"{meta_path}: malformed JSON at line {e.lineno}, column {e.colno}: {e.msg}") from None
    except RecursionError:
        raise CheckpointError(f"{meta_path}: malformed JSON: nested too deeply") from None
    validate_metadata(meta, str(meta_path))
    if pt_path is None:
        name = meta["policy"]["file"]
        if Path(name).name != name or name in ("", ".", ".."):
            raise CheckpointError(f"{meta_path}: field 'policy.file' must be a file name in the checkpoint folder, "
                                  f"got {name!r}")
        pt_path = meta_path.with_name(name)
    return meta, meta_path, pt_path


# ---------------------------------------------------------------------------- loading
def check_compatible(meta: Dict[str, Any], model=None, expect_joints: Optional[Sequence[str]] = None,
                     where: str = "checkpoint", same_urdf: bool = True) -> None:
    """Refuse (``CheckpointError``) a checkpoint made for another robot than ``model``.

    Refuse too one whose actuated joints are not exactly ``expect_joints`` (the joints the caller
    commands; compared as sets: the action order is the checkpoint's ``robot.actuated_joints``).
    ``same_urdf=False``: the same tree (joints, floating base) is enough, the URDF's values may
    differ (a calibrated copy to fine-tune on).
    """
    robot = meta["robot"]
    if model is not None:
        theirs, ours = list(robot["joint_names"]), list(model.joint_names)
        # A checkpoint written before <mimic> joints became coupled coordinates lists them
        # among the joints (the model's full tree): the same robot, accepted.
        if theirs != ours and model.mimic_joints and theirs == list(model.full_joint_names):
            theirs = ours
        if theirs != ours:
            missing = [j for j in theirs if j not in ours]
            extra = [j for j in ours if j not in theirs]
            if missing or extra:
                detail = "; ".join(s for s in (
                    f"joints in the checkpoint but not in the model: {', '.join(missing)}" if missing else "",
                    f"joints in the model but not in the checkpoint: {', '.join(extra)}" if extra else "") if s)
            else:
                detail = f"same joints in another order: checkpoint {theirs}, model {ours}"
            raise CheckpointError(f"{where}: made for robot '{robot['name']}' with other joints than model "
                                  f"'{model.name}' ({detail})")
        if bool(robot["floating_base"]) != bool(model.floating_base):
            raise CheckpointError(f"{where}: floating_base is {robot['floating_base']} in the checkpoint but "
                                  f"{model.floating_base} in model '{model.name}'")
        if same_urdf and robot["urdf_sha256"] != model.urdf_sha256:
            raise CheckpointError(f"{where}: the URDF differs: the checkpoint was trained on '{robot['name']}' with "
                                  f"URDF sha256 {robot['urdf_sha256'][:16]}... ({robot.get('urdf', '?')}); the model "
                                  f"'{model.name}' has URDF sha256 {model.urdf_sha256[:16]}... ({model.source})")
    if expect_joints is not None:
        want, act = list(expect_joints), list(robot["actuated_joints"])
        if set(want) != set(act) or len(want) != len(act):
            missing = [j for j in act if j not in want]
            extra = [j for j in want if j not in act]
            raise CheckpointError(
                f"{where}: actuated joints do not match: the checkpoint drives [{', '.join(act)}], expected "
                f"[{', '.join(want)}]" + (f"; not expected: {', '.join(missing)}" if missing else "")
                + (f"; not driven by the checkpoint: {', '.join(extra)}" if extra else ""))


def load_checkpoint(path_or_dir: PathLike, model=None, expect_joints: Optional[Sequence[str]] = None
                    ) -> Tuple[torch.jit.ScriptModule, Dict[str, Any]]:
    """Load ``(policy, metadata)`` from a checkpoint folder (or its policy.json / policy.pt).

    The policy is a float32 CPU TorchScript module in eval mode: obs (B, obs_dim) -> action
    (B, action_dim) in [-1, 1]. With ``model`` (a :class:`~diffsim_ros.physics.Model`) the
    checkpoint must be for the same robot: same joint names in the same order, same
    floating base, same URDF sha256. With ``expect_joints``, its actuated joints must be
    exactly those. Any problem raises :class:`CheckpointError`; nothing is unpickled.
    """
    meta, meta_path, pt_path = _read_meta(path_or_dir)
    check_compatible(meta, model, expect_joints, where=str(meta_path.parent))
    try:
        exists = pt_path.is_file()
    except OSError:
        exists = False
    if not exists:
        raise CheckpointError(f"{pt_path}: policy file not found (named by {meta_path.name})")
    want_sha = meta["policy"].get("sha256")
    if want_sha is not None:
        got_sha = _sha256(pt_path)
        if got_sha != want_sha:
            raise CheckpointError(f"{pt_path}: the file is corrupted or was replaced: its sha256 is {got_sha[:16]}..., "
                                  f"{meta_path.name} records {str(want_sha)[:16]}...")
    try:
        with _quiet_jit():
            policy = torch.jit.load(str(pt_path), map_location="cpu")
    except Exception as e:  # noqa: BLE001 - any failure of the TorchScript reader is a bad checkpoint
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise CheckpointError(f"{pt_path}: not a readable TorchScript policy ({first})") from None
    policy.eval()
    od, ad = meta["observation"]["dim"], meta["action"]["dim"]
    try:
        with torch.no_grad():
            out = policy(torch.zeros(2, od, dtype=torch.float32))
    except Exception as e:  # noqa: BLE001
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise CheckpointError(f"{pt_path}: the policy fails on a (2, {od}) observation as "
                              f"{meta_path.name} declares ('observation.dim' = {od}): {first}") from None
    if not isinstance(out, torch.Tensor) or tuple(out.shape) != (2, ad):
        shape = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
        raise CheckpointError(f"{pt_path}: the policy outputs {shape} for a (2, {od}) observation, but "
                              f"{meta_path.name} declares 'action.dim' = {ad}")
    return policy, meta


# ---------------------------------------------------------------------------- fine-tuning
def initial_weights(path_or_dir: PathLike, task, hidden: Sequence[int], normalize: bool
                    ) -> Tuple[Dict[str, torch.Tensor], Dict[str, Any]]:
    """Return the weights of a trained policy to start a new training run of ``task`` from: ``(state_dict, info)``.

    That is fine-tuning: on a calibrated simulator, another ground, a longer schedule.

    The checkpoint must drive the same joints in the same action order, on the same tree (joint
    names, floating base), and observe the same quantities in the same order (``observation.names``);
    its network must have the ``hidden`` layer sizes and, when ``normalize``, an observation
    normaliser (which is carried over with its statistics). The URDF may differ in its inertial
    and geometric values (a calibrated copy from ``diffsim-ros sysid``): ``info`` records both
    sha256 sums. Anything else raises :class:`CheckpointError` naming the difference.
    """
    policy, meta = load_checkpoint(path_or_dir)
    where = str(Path(os.fspath(path_or_dir)))
    spec = task.spec()
    model, robot = task.model, meta["robot"]
    check_compatible(meta, model, where=where, same_urdf=False)
    act = list(task.sim.actuated_joints)
    if list(robot["actuated_joints"]) != act:
        raise CheckpointError(f"{where}: its actions drive {list(robot['actuated_joints'])}; this run's drive {act} "
                              f"(the same joints in the same order are needed)")
    if meta["task"] != spec["task"]:
        raise CheckpointError(f"{where}: trained for task '{meta['task']}', this run's task is '{spec['task']}'")
    theirs, ours = list(meta["observation"].get("names") or []), list(spec["observation"].get("names") or [])
    if int(meta["observation"]["dim"]) != int(spec["observation"]["dim"]) or theirs != ours:
        diff = [f"{i}: {a} / {b}" for i, (a, b) in enumerate(zip(theirs, ours)) if a != b][:3]
        raise CheckpointError(f"{where}: observes {meta['observation']['dim']} quantities, this run's task "
                              f"{spec['observation']['dim']}" + (f" (first differences, checkpoint / run: "
                                                                  f"{'; '.join(diff)})" if diff else ""))
    state = {k: v.detach().clone() for k, v in policy.state_dict().items()}
    body = sorted((int(k.split(".")[1]), v) for k, v in state.items()
                  if k.startswith("body.") and k.endswith(".weight"))
    layers = [int(v.shape[0]) for _, v in body]
    if layers != [int(h) for h in hidden]:
        raise CheckpointError(f"{where}: its hidden layers are {layers}, this run's training.hidden is "
                              f"{[int(h) for h in hidden]}")
    has_norm = any(k.startswith("norm.") for k in state)
    if has_norm != bool(normalize):
        raise CheckpointError(f"{where}: {'has' if has_norm else 'has no'} observation normaliser, but this run's "
                              f"training.normalize_obs is {bool(normalize)}")
    info = {"checkpoint": os.path.abspath(where), "policy_sha256": meta["policy"]["sha256"],
            "urdf_sha256": robot["urdf_sha256"], "same_urdf": robot["urdf_sha256"] == model.urdf_sha256,
            "iterations": (meta.get("training") or {}).get("iterations")}
    return state, info
