"""doc/parameters.md, generated from the schema, the tasks and the nodes' parameter tables.

It holds every configuration section's keys from the schema (diffsim_ros/schema.py), the tasks'
parameters, and every node's ROS parameters from the tables the nodes declare them from, so the
reference and ``ros2 param describe`` say the same.

    python -m diffsim_ros.reference --update     # doc/parameters.md and launch/README.md's tables

The launch files' argument tables in launch/README.md come from their ``ARGUMENTS`` lists the
same way (``ros2 launch ... --show-args`` prints the same text).
"""
from __future__ import annotations

import inspect
from typing import Any, Iterable, List, Tuple

from .config import TRAINING_FILE_KEYS

NODES = ("policy_controller", "mujoco_plant", "train_node", "trajectory_recorder", "replay")

def _sections():
    """Every configuration section, by key path (importing the modules that declare them)."""
    from .control import excitation, supervisor  # noqa: F401  (register their sections)
    from .learning import apg, ppo, sac  # noqa: F401
    from . import schema
    from .plant import perturbation  # noqa: F401

    return schema.sections()


def parameter_reference() -> str:
    """doc/parameters.md: every section's keys, the tasks' parameters and the nodes' ROS parameters.

    Each key comes with type, unit, allowed values, default and documentation, from the schema
    (test_schema checks that the file is current).
    """
    from . import schema
    from .tasks import TASKS

    out = ["# Configuration keys", "",
           "Generated from the schema (`diffsim_ros/schema.py`) by "
           "`python -m diffsim_ros.reference > doc/parameters.md`; do not edit by hand.", "",
           "A training file (`config/<task>.yaml`, under `/**: ros__parameters:`) has the top-level keys "
           + ", ".join(f"`{k}`" for k in TRAINING_FILE_KEYS) + ". The same keys are ROS parameters of the "
           "nodes that read them (`ros2 param describe` shows these descriptions); a wrong key or value is an "
           "error naming its key path, with the nearest known names.", ""]
    order = ["simulator", "training", "ppo", "sac", "perturbation", "excitation", "supervisor"]
    found = _sections()
    for name in order + sorted(set(found) - set(order)):
        cls = found.get(name)
        if cls is None or "." in name:        # nested sections are listed inside their parent's table
            continue
        out += [f"## `{name}`", "", " ".join((cls.__doc__ or "").split("Fields (schema):")[0].split()), "",
                "| key | type | unit | allowed | default | meaning |", "|---|---|---|---|---|---|"]
        for e in schema.entries(cls, name):
            out.append(f"| `{e.name}` | {_cell(schema.type_name(e.type))} | {_cell(e.unit)} | {_cell(e.constraints)} "
                       f"| `{_cell(schema.show(e.default))}` | {_cell(e.doc)} |")
        out.append("")
    for kind, cls in TASKS.items():
        out += [f"## `task` with `type: {kind}`", "", " ".join((cls.__doc__ or "").split()), "",
                "| key | type | default |", "|---|---|---|"]
        for p, hint, default in cls.parameter_spec():
            shown = "required" if default is inspect.Parameter.empty else f"`{schema.show(default)}`"
            out.append(f"| `task.{p}` | {_cell(schema.type_name(hint))} | {shown} |")
        out.append("")
    out += ["# Node parameters", "",
            "Each node's ROS parameters as it declares them (`ros2 param describe <node> <name>` gives the same "
            "text); `config_parameters` nodes also take the keys above, under their section names.", ""]
    for node in NODES:
        out += [f"## `{node}`", "", "| parameter | default | meaning |", "|---|---|---|"]
        for name, default, text in node_parameters(node):
            out.append(f"| `{name}` | `{_cell(schema.show(_as_tuple(default)))}` | {_cell(' '.join(text.split()))} |")
        out.append("")
    return "\n".join(out)


def launch_arguments(path) -> List[Tuple[str, str, str]]:
    """``(name, default, description)`` of a launch file's ``ARGUMENTS`` table.

    It is read without importing launch (the file's literal list).
    """
    import ast
    from pathlib import Path

    tree = ast.parse(Path(path).read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "ARGUMENTS" for t in node.targets):
            return [tuple(row) for row in ast.literal_eval(node.value)]
    raise ValueError(f"{path}: no ARGUMENTS table")


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def launch_table(path) -> str:
    """Return the markdown table of a launch file's arguments (launch/README.md holds one per file)."""
    rows = ["| argument | default | meaning |", "|---|---|---|"]
    for name, default, text in launch_arguments(path):
        rows.append(f"| `{name}` | `{default or chr(34) * 2}` | {_cell(text)} |")
    return "\n".join(rows)


def update_launch_readme(readme) -> str:
    """Return the text of launch/README.md with each arguments block replaced by FILE's argument table.

    An arguments block runs from ``<!-- arguments: FILE -->`` to ``<!-- end -->``; FILE is
    beside the README.
    """
    import re
    from pathlib import Path

    readme = Path(readme)
    text = readme.read_text()

    def table(m):
        return f"{m.group(1)}\n{launch_table(readme.parent / m.group(2))}\n{m.group(3)}"
    return re.sub(r"(<!-- arguments: (\S+) -->)\n(?:(?!<!-- ).*\n)*?(<!-- end -->)", table, text)


def _as_tuple(val: Any) -> Any:
    return tuple(_as_tuple(v) for v in val) if isinstance(val, list) else val


def node_parameters(node: str) -> List[Tuple[str, Any, str]]:
    """``(name, default, description)`` of the parameters the node ``node`` declares at start."""
    import importlib

    table = importlib.import_module(f"diffsim_ros.nodes.{node}").PARAMETERS
    rows: Iterable = ((k, v[0], v[1]) for k, v in table.items()) if isinstance(table, dict) else table
    return [(str(n), d, str(t)) for n, d, t in rows]


if __name__ == "__main__":
    import sys
    from pathlib import Path

    if sys.argv[1:] == ["--update"]:
        # Rewrite doc/parameters.md and launch/README.md's argument tables in this source tree.
        root = Path(__file__).resolve().parent.parent
        (root / "doc" / "parameters.md").write_text(parameter_reference())
        (root / "launch" / "README.md").write_text(update_launch_readme(root / "launch" / "README.md"))
    else:
        print(parameter_reference(), end="")
