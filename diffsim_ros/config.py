"""ROS 2 parameter files (``config/*.yaml``) read without ROS.

The same file serves a node (``--ros-args --params-file``) and the library/CLI::

    /**:                       # or a node name: my_node, /ns/my_node
      ros__parameters:
        urdf: urdf/diffsim_quadrotor.urdf
        floating_base: true
        simulator: {dt: 0.002, actuator: ctbr, rotors: {...}}

    params = load_yaml("config/diffsim_quadrotor.yaml")   # the ros__parameters mapping
    model = load_model(params)                            # urdf + floating_base
    sim = physics.Simulator(model, simulator_config(params))

Files are parsed as ROS 2's own parser (rcl_yaml_param_parser) parses them:
``1e-3`` is a number (PyYAML alone would give the string "1e-3"). ROS
parameters cannot hold nested lists, so ``simulator.rotors.positions`` is a
flat list ``[x0, y0, z0, x1, y1, z1, ...]`` (a list of triples is accepted too).

``urdf`` is resolved as: an absolute path; ``package://<package>/<path>``
(ROS packages, example-robot-data's pip install, and this package's source
tree); ``file://<path>``; or a path relative to this package's share folder
(``urdf/...``, ``config/...``).

A *training file* (``config/<task>.yaml``, read by ``diffsim-ros train/baseline``)
adds ``dtype``, ``task`` (``tasks.make_task``), ``training`` (``TrainConfig``), ``ppo``
(``PPOConfig``) and ``sac`` (``SACConfig``) sections; :func:`load_training_file` reads one, refusing
unknown top-level keys, and builds its task.

Every error is a :class:`physics.ConfigError` naming the file and/or the key.
"""
from __future__ import annotations

import os
import re
import sys
from pathlib import Path
from typing import Any, Dict, Optional, Union

import yaml

from . import physics
from .physics import ConfigError
from .schema import unknown_key

PACKAGE = "diffsim_ros"
PathLike = Union[str, os.PathLike]

__all__ = ["ConfigError", "load_yaml", "simulator_config", "resolve_urdf", "load_model", "package_share",
           "unflatten", "TRAINING_FILE_KEYS", "check_keys", "torch_dtype", "section", "build_task",
           "load_training_file"]


# ---------------------------------------------------------------------------- YAML
class _RosLoader(yaml.SafeLoader):
    """SafeLoader whose floats follow rcl's parser: ``1e-3`` and ``1E5`` are numbers."""


_FLOAT = re.compile(r"""^(?:[-+]?[0-9][0-9_]*\.[0-9_]*(?:[eE][-+]?[0-9]+)?
                        |[-+]?\.[0-9][0-9_]*(?:[eE][-+]?[0-9]+)?
                        |[-+]?[0-9][0-9_]*[eE][-+]?[0-9]+
                        |[-+]?\.(?:inf|Inf|INF)
                        |\.(?:nan|NaN|NAN))$""", re.X)
_RosLoader.yaml_implicit_resolvers = {k: list(v) for k, v in yaml.SafeLoader.yaml_implicit_resolvers.items()}
for _first in list("-+0123456789."):
    _RosLoader.yaml_implicit_resolvers[_first] = [
        (tag, rx) for tag, rx in _RosLoader.yaml_implicit_resolvers.get(_first, [])
        if tag != "tag:yaml.org,2002:float"]
_RosLoader.add_implicit_resolver("tag:yaml.org,2002:float", _FLOAT, list("-+0123456789."))


def _is_wrapper_key(key: Any) -> bool:
    return isinstance(key, str) and key.startswith("/")


def load_yaml(path: PathLike, node: Optional[str] = None) -> Dict[str, Any]:
    """Return the ``ros__parameters`` mapping of a ROS 2 parameter file.

    Accepted forms: ``{/**: {ros__parameters: P}}``, ``{node_name: {ros__parameters: P}}``
    (several sections are merged in file order, later keys winning; with ``node``
    given, only ``/**`` and that node's sections: ``name``, ``/name`` or ``/ns/name``),
    or a plain mapping ``P`` without the wrapper.
    """
    path = Path(os.fspath(path))
    try:
        text = path.read_text()
    except OSError as e:
        raise ConfigError(f"{path}: cannot read parameter file ({e.strerror or e})") from None
    try:
        doc = yaml.load(text, Loader=_RosLoader)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(e, "problem", None) or str(e)
        raise ConfigError(f"{path}: malformed YAML{at}: {problem}") from None
    if doc is None:
        raise ConfigError(f"{path}: the file is empty (expected '/**: ros__parameters: {{...}}')")
    if not isinstance(doc, dict):
        raise ConfigError(f"{path}: the top level must be a mapping, got {type(doc).__name__}")
    wrapped = any(_is_wrapper_key(k) or (isinstance(v, dict) and "ros__parameters" in v) for k, v in doc.items())
    if not wrapped:
        return doc
    params: Dict[str, Any] = {}
    used = 0
    for key, section in doc.items():
        if not isinstance(section, dict) or "ros__parameters" not in section:
            raise ConfigError(f"{path}: section '{key}' has no 'ros__parameters' mapping "
                              f"(expected '{key}: ros__parameters: {{...}}')")
        extra = [k for k in section if k != "ros__parameters"]
        if extra:
            raise ConfigError(f"{path}: section '{key}' has keys beside 'ros__parameters': "
                              f"{', '.join(map(str, extra))}")
        if node is not None and not _matches(str(key), node):
            continue
        p = section["ros__parameters"]
        if not isinstance(p, dict):
            raise ConfigError(f"{path}: '{key}.ros__parameters' must be a mapping, got {type(p).__name__}")
        merge(params, p)
        used += 1
    if node is not None and used == 0:
        raise ConfigError(f"{path}: no parameters for node '{node}' (sections: {', '.join(map(str, doc))})")
    return params


def _matches(key: str, node: str) -> bool:
    if key in ("/**", "**"):
        return True
    name = node.rsplit("/", 1)[-1]
    return key.lstrip("/") == node.lstrip("/") or key.rsplit("/", 1)[-1] == name


def merge(dst: Dict[str, Any], src: Dict[str, Any]) -> None:
    """Merge the nested mapping ``src`` into ``dst`` in place: mappings key by key, the rest replaced."""
    for k, val in src.items():
        if isinstance(val, dict) and isinstance(dst.get(k), dict):
            merge(dst[k], val)
        else:
            dst[k] = val


def unflatten(flat: Dict[str, Any]) -> Dict[str, Any]:
    """Nest ROS's dotted parameter names (``simulator.rotors.directions``) into mappings."""
    out: Dict[str, Any] = {}
    for name, val in flat.items():
        node = out
        *parents, leaf = name.split(".")
        for p in parents:
            node = node.setdefault(p, {})
            if not isinstance(node, dict):
                raise ConfigError(f"parameter '{name}': '{p}' is both a value and a section")
        node[leaf] = val
    return out


# ---------------------------------------------------------------------------- simulator
def simulator_config(params: Dict[str, Any], source: str = "") -> "physics.SimConfig":
    """:class:`physics.SimConfig` from the ``simulator:`` section of ``params`` (defaults if absent).

    Unknown keys, wrong types and out-of-range values raise :class:`ConfigError`
    naming the key path (``source``, e.g. the file name, prefixes the message).
    ``simulator.rotors.positions`` may be the flat list ROS parameters hold or a list of triples.
    """
    section = params.get("simulator")
    try:
        return physics.SimConfig.from_mapping({} if section is None else section, "simulator")
    except ConfigError as e:
        raise e.at(source) from None


# ---------------------------------------------------------------------------- URDF
def package_share(package: str = PACKAGE) -> Optional[Path]:
    """Return this package's share folder, or None if none exists.

    The share folder is the source tree when run from it, else the ament index, else
    ``<sys.prefix>/share/<package>``.
    """
    if package == PACKAGE:
        src = Path(__file__).resolve().parent.parent
        xml = src / "package.xml"
        if xml.is_file() and re.search(r"<name>\s*%s\s*</name>" % PACKAGE, xml.read_text(errors="replace")):
            return src
    try:
        from ament_index_python.packages import PackageNotFoundError, get_package_share_directory
        try:
            return Path(get_package_share_directory(package))
        except (PackageNotFoundError, ValueError, KeyError, LookupError):
            pass
    except ImportError:
        pass
    cand = Path(sys.prefix) / "share" / package
    return cand if cand.is_dir() else None


def resolve_urdf(params: Dict[str, Any], source: str = "") -> Path:
    """Return the URDF file named by ``params['urdf']`` (see the module doc for the forms)."""
    from .physics.urdf import resolve_uri

    uri = params.get("urdf")
    if not isinstance(uri, str) or not uri.strip():
        raise ConfigError(f"must name a URDF file (absolute, package://pkg/path or relative to the {PACKAGE} "
                          f"share folder), got {uri!r}", "urdf", source)
    uri = uri.strip()
    share = package_share()
    found = resolve_uri(uri, base_dir=share, package_dirs=[share] if share is not None else None)
    if found is None:
        raise ConfigError(f"{{key}}: '{uri}' not found (relative paths are taken from the {PACKAGE} "
                          f"share folder {share})", "urdf", source)
    return found


def load_model(params: Dict[str, Any], source: str = "", dtype=None, device="cpu") -> "physics.Model":
    """``physics.load_urdf`` of ``params['urdf']`` with ``params['floating_base']`` (default false)."""
    import torch

    fb = params.get("floating_base", False)
    if not isinstance(fb, bool):
        raise ConfigError(f"must be true or false, got {fb!r}", "floating_base", source)
    return physics.load_urdf(str(resolve_urdf(params, source)), floating_base=fb,
                             dtype=dtype or torch.float64, device=device)


# ---------------------------------------------------------------------------- training files
#: Top-level keys of a training file (config/<task>.yaml) read by ``diffsim-ros train/baseline``.
TRAINING_FILE_KEYS = ("urdf", "floating_base", "dtype", "simulator", "task", "training", "ppo", "sac",
                      "excitation")
DTYPES = ("float32", "float64")


def check_keys(params: Dict[str, Any], known=TRAINING_FILE_KEYS, source: str = "", where: str = "") -> None:
    """Raise :class:`ConfigError` naming the first key of ``params`` not in ``known``.

    The error gives the nearest known names, and the section the key belongs to when it is one of
    another's.
    """
    for k in params:
        if k not in known:
            raise unknown_key(k, known, where).under(where).at(source)


def torch_dtype(params: Dict[str, Any], source: str = "", default: str = "float64"):
    """Return the torch dtype named by ``params['dtype']`` (float32 or float64; ``default`` if absent)."""
    import torch

    name = params.get("dtype", default)
    if name not in DTYPES:
        raise ConfigError(f"must be one of {', '.join(DTYPES)}, got {name!r}", "dtype", source)
    return {"float32": torch.float32, "float64": torch.float64}[name]


def section(params: Dict[str, Any], key: str, source: str = "") -> Dict[str, Any]:
    """``params[key]`` as a mapping ({} when absent or empty); anything else is a ConfigError."""
    val = params.get(key, {})
    if val is None:
        return {}
    if not isinstance(val, dict):
        raise ConfigError(f"must be a mapping, got {type(val).__name__}", key, source)
    return dict(val)


def build_task(params: Dict[str, Any], source: str = "", dtype=None, device="cpu"):
    """Return the task of a training file: ``(task, model)``.

    Both come from the file's urdf, floating_base, dtype, simulator and task sections
    (``tasks.make_task``). Errors are ConfigError naming the file.
    """
    from .tasks import make_task

    dtype = dtype or torch_dtype(params, source)
    model = load_model(params, source, dtype=dtype, device=device)
    sim_cfg = simulator_config(params, source)
    try:
        task = make_task(model, sim_cfg, params.get("task"), "task")
    except ConfigError as e:
        raise e.at(source) from None
    return task, model


def load_training_file(path: PathLike, dtype=None, device="cpu"):
    """Read a training file (``config/<task>.yaml``): ``(params, task, model)``.

    Unknown top-level keys (see :data:`TRAINING_FILE_KEYS`) are a ConfigError naming the key.
    """
    source = os.fspath(path)
    params = load_yaml(path)
    check_keys(params, TRAINING_FILE_KEYS, source)
    task, model = build_task(params, source, dtype=dtype, device=device)
    return params, task, model


def input_errors() -> tuple:
    """Return the exception types that mean bad input from the user's files rather than a bug.

    The files are a training file, URDF or checkpoint. The CLI reports these exceptions as
    ``error: ...`` (exit status 2), the main job as the step that failed. SimulationError is one:
    a simulation that diverges almost always does so from the file's dt, substeps or gains.
    """
    from .learning.checkpoint import CheckpointError

    return (ConfigError, physics.UrdfError, CheckpointError, physics.SimulationError)


def describe_input_error(exc: Exception, source: str) -> str:
    """One line for an :func:`input_errors` exception met reading ``source``."""
    if isinstance(exc, physics.SimulationError):
        return (f"{source}: the simulation diverged ({exc}); try a smaller simulator.dt, more "
                f"simulator.substeps or lower gains")
    return str(exc)
