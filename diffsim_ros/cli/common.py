"""What the commands share.

Registering a command (:func:`_command`), the CLI's error, calling a workflow with its bad-input
errors turned into exit status 2 (:func:`_workflow_call`, :func:`_analysis_call`), the default
robot, devices and threads, the tables it prints, option parsing.
"""
from __future__ import annotations

import argparse
import os
from typing import Any, Callable, List, Optional, Sequence, Tuple

from diffsim_ros.robot_data import example_robot_data_dirs


DEFAULT_ROBOT = os.path.join("panda_description", "urdf", "panda.urdf")


class CliError(Exception):
    """Bad input detected by the CLI itself; reported as ``error: ...``, exit code 2."""


def _text(text: str) -> str:
    """Fold the white space of a long help text written as one indented triple-quoted string.

    The text is folded as the schema's ``option`` folds a field's documentation; argparse wraps it
    again when it prints it.
    """
    return " ".join(text.split())


def _command(sub, name: str, func: Callable[[argparse.Namespace], int], help: str,
             description: str) -> argparse.ArgumentParser:
    """Register the command ``name`` on ``sub`` (a subparsers action) and return its parser.

    ``help`` is its line in the list of commands, ``description`` its ``--help`` text (folded by
    :func:`_text`); :func:`cli.main` runs ``func(args)``. The parser returned is for the command's
    options.
    """
    p = sub.add_parser(name, help=help, description=_text(description))
    p.set_defaults(func=func)
    return p


def _workflow_call(fn: Callable[..., Any], *args, errors: Tuple[type, ...] = (), named: Tuple[type, ...] = (),
                   inputs: bool = False, source: Optional[str] = None, **kw) -> Any:
    """Call ``fn(*args, **kw)`` (a workflow or another library function), its bad-input errors turned into CliError.

    What it raises for bad input becomes a CliError (``error: ...``, exit status 2), in this order:
    an exception of ``named`` with ``source`` (the file it read) in front of its text unless the
    text names it already, one of ``errors`` with its text, and with ``inputs`` one of
    config.input_errors() described naming ``source`` (:func:`_describe`). Anything else
    propagates.
    """
    try:
        return fn(*args, **kw)
    except named as exc:
        raise CliError(str(exc) if str(source) in str(exc) else f"{source}: {exc}") from None
    except errors as exc:
        raise CliError(str(exc)) from None
    except (_input_errors() if inputs else ()) as exc:
        raise CliError(_describe(exc, source)) from None


def default_urdf() -> str:
    for robots in example_robot_data_dirs():
        path = os.path.join(robots, DEFAULT_ROBOT)
        if os.path.isfile(path):
            return path
    raise CliError(
        "the default robot (example-robot-data's panda) was not found on sys.path; "
        "install example-robot-data (scripts/bootstrap.sh does) or pass --urdf PATH")


def _device(name: str):
    import torch

    try:
        device = torch.device(name)
    except RuntimeError as exc:
        raise CliError(f"--device {name!r}: {exc}") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise CliError(f"--device {name!r}: CUDA is not available on this machine")
    return device


def _threads(n: int) -> None:
    """Apply --threads N: at least 1 (a CliError otherwise), then torch's intra-op threads.

    torch is imported here, so that ``--help`` stays fast.
    """
    _positive("--threads", n)
    import torch

    torch.set_num_threads(n)


def _sync(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _fmt(x: float, width: int = 10) -> str:
    return f"{x:>{width}.4g}"


def _table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h)
              for i, h in enumerate(headers)]
    lines = ["  ".join(h.ljust(w) if i == 0 else h.rjust(w)
                       for i, (h, w) in enumerate(zip(headers, widths)))]
    lines.append("  ".join("-" * w for w in widths))
    for r in rows:
        lines.append("  ".join(c.ljust(w) if i == 0 else c.rjust(w)
                               for i, (c, w) in enumerate(zip(r, widths))))
    return "\n".join(lines)


def _input_errors():
    """Exception types that mean bad input (reported as ``error: ...``, exit 2): config.input_errors."""
    from diffsim_ros.config import input_errors

    return input_errors()


def _describe(exc: Exception, source: str) -> str:
    from diffsim_ros.config import describe_input_error

    return describe_input_error(exc, source)


def _positive(name: str, value: Optional[int]) -> None:
    if value is not None and value < 1:
        raise CliError(f"{name} must be at least 1, got {value}")


def _one_line(text: str) -> str:
    return "; ".join(line.strip() for line in str(text).splitlines() if line.strip())


def _analysis_call(fn, *args, where=None, **kw):
    """Run an analysis function, turning its bad-input errors into CliError (exit 2, one line).

    ``where`` (the bag): any other exception is reported naming it, never as a traceback.
    """
    from diffsim_ros.analysis import AnalysisError

    errors = (AnalysisError,) + _input_errors()
    try:
        return fn(*args, **kw)
    except errors as exc:
        raise CliError(_one_line(exc)) from None
    except Exception as exc:
        if where is None:
            raise
        raise CliError(_one_line(f"{where}: {type(exc).__name__}: {exc} (unexpected: a damaged bag, or a bug to "
                                 f"report)")) from None


def _int_list(text: str, option: str) -> List[int]:
    try:
        vals = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise CliError(f"{option} must be comma-separated integers, got {text!r}") from None
    if not vals or min(vals) < 1:
        raise CliError(f"{option} must list positive integers, got {text!r}")
    return vals


def _perturbation(text: str) -> dict:
    """Return the mapping of a ``--perturb`` text (plant.perturbation.parse_perturbation).

    It holds a preset's name under ``preset`` (its values come with the robot's kind) and the fields
    given, checked by the schema; bad text is a CliError naming the entry.
    """
    from diffsim_ros.physics import ConfigError
    from diffsim_ros.plant.perturbation import parse_perturbation

    try:
        return parse_perturbation(text)
    except ConfigError as exc:
        raise CliError(str(exc)) from None
