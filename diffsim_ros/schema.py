"""Configuration sections declared once: dataclass fields carrying their documentation, unit, default and range.

The sections are read from mappings (YAML sections, ROS parameters) with the key path in every
error.

    @schema.section("simulator")
    @dataclass(frozen=True)
    class SimConfig:
        dt: float = schema.option(1e-3, "control step (one step call)", "s", above=0)
        ...
        def __post_init__(self):
            schema.normalise(self)          # types, ranges, lists -> tuples, nested sections, check()

        def check(self):                    # optional: rules between fields, relative keys
            if ...: raise ConfigError("needs 'a' or 'b'", key="")

    SimConfig.from_mapping({"dt": "fast"}, "simulator")
    # ConfigError: 'simulator.dt' must be a number, got 'fast'

The field's type annotation says what a value may be: ``bool``, ``int``, ``float`` (finite),
``str``, ``Tuple[X, ...]`` (a list of any length), ``Tuple[X, Y, Z]`` (exactly three),
``Tuple[Tuple[float, float, float], ...]`` (a list of triples, or the flat list ROS parameters
must use), ``Optional[X]``, ``Union[float, Tuple[float, ...]]`` (a number or a list) and a
nested section (a dataclass, given as a mapping). The metadata of :func:`option` adds the
range (``low``/``high`` inclusive, ``above`` exclusive), ``choices`` and ``broadcast`` (one
number for all three entries).

A key that is not a field is an error with the nearest known names ("did you mean") and,
when the key is a field of another registered section, that section's name. Errors carry
the key path relative to where they were raised (:attr:`ConfigError.key`); each enclosing
section prefixes its own name (:meth:`ConfigError.under`) and the file reader the file name
(:meth:`ConfigError.at`), so no function threads a prefix by hand.

:func:`entries` lists every field of a section with its dotted name, recursively: the ROS
nodes declare their parameter descriptors from it and doc/parameters.md is generated from it.
"""
from __future__ import annotations

import collections.abc
import dataclasses
import difflib
import math
import numbers
import typing
from dataclasses import MISSING, dataclass, fields
from typing import Any, Dict, Iterator, List, Mapping, Optional, Tuple

__all__ = ["ConfigError", "option", "section", "normalise", "from_mapping", "convert_value", "unknown_key",
           "entries", "Entry", "sections", "describe", "ros_parameters", "ros_constraints", "ros_array_types",
           "type_name", "show"]


class ConfigError(ValueError):
    """A configuration (YAML, ROS parameters or a dict) with a wrong key, type or value.

    ``ConfigError(text)``: a finished message. ``ConfigError(text, key="dt")``: a message about
    the key ``dt``; the text may hold ``{key}`` where the quoted key path goes, else the key
    leads (``'simulator.dt' must be > 0 s, got -1``). :meth:`under` prefixes a section,
    :meth:`at` the source (a file name).
    """

    def __init__(self, message: str, key: Optional[str] = None, source: str = ""):
        self.message, self.key, self.source = message, key, source
        super().__init__(self._text())

    def _text(self) -> str:
        body = self.message
        if self.key:
            quoted = f"'{self.key}'"
            body = body.replace("{key}", quoted) if "{key}" in body else f"{quoted} {body}"
        else:
            body = body.replace("{key}: ", "").replace("{key}", "")
        return f"{self.source}: {body}" if self.source else body

    def __str__(self) -> str:
        return self._text()

    def __reduce__(self):
        return (type(self), (self.message, self.key, self.source))

    def under(self, prefix: str) -> "ConfigError":
        """Return the same error one section down: key ``prefix.key``.

        The key is ``prefix`` when the error is about the section itself.
        """
        if not prefix or self.key is None:
            return self
        return type(self)(self.message, f"{prefix}.{self.key}" if self.key else prefix, self.source)

    def at(self, source: str) -> "ConfigError":
        """Return the same error read from ``source`` (e.g. the file name), which prefixes the message."""
        if not source or self.source:
            return self
        return type(self)(self.message, self.key, source)


# ---------------------------------------------------------------------------- declaring
def option(default: Any = MISSING, doc: str = "", unit: str = "", *, low: Optional[float] = None,
           high: Optional[float] = None, above: Optional[float] = None, choices: Optional[tuple] = None,
           broadcast: bool = False, ros: bool = True, ros_null: Any = None) -> Any:
    """Return a dataclass field with its documentation, unit and allowed values.

    ``low``/``high``: inclusive bounds; ``above``: exclusive lower bound (each entry of a list);
    ``choices``: the allowed values (of each entry of a list); ``broadcast``: a single number
    stands for all entries of a fixed-length list; ``ros``: declared as a ROS parameter;
    ``ros_null``: the value that stands for null (None) as a ROS parameter, which cannot be null.
    """
    meta = {"doc": " ".join(doc.split()), "unit": unit, "low": low, "high": high, "above": above,
            "choices": tuple(choices) if choices is not None else None, "broadcast": broadcast, "ros": ros,
            "ros_null": ros_null}
    return dataclasses.field(default=default, metadata=meta)


_SECTIONS: Dict[str, type] = {}


def section(name: str, node: bool = False):
    """Class decorator: registers the dataclass as the section ``name``.

    ``name`` is a dotted key path, e.g. ``simulator.rotors``. The decorator gives the class
    ``from_mapping(mapping, where=name)`` and appends its fields' documentation to its docstring.
    ``node``: the section holds a ROS node's own parameters, not keys of a training file; it is
    not registered, so neither :func:`sections` lists it nor :func:`unknown_key` offers it as the
    home of a training file's key.
    """

    def register(cls):
        if not node:
            _SECTIONS[name] = cls
        cls.section_name = name
        if "from_mapping" not in cls.__dict__:
            def build(c, d, where: str = name):
                """Build from a mapping (a YAML section or node parameters).

                Unknown keys, wrong types and values out of range are a :class:`ConfigError`
                naming the key path.
                """
                return from_mapping(c, d, where)
            cls.from_mapping = classmethod(build)
        lines = [f"    {e.name}: {describe(e)}" for e in entries(cls)]
        cls.__doc__ = (cls.__doc__ or "").rstrip() + "\n\n    Fields (schema):\n" + "\n".join(lines) + "\n"
        return cls
    return register


def sections() -> Dict[str, type]:
    """Return the registered sections, by key path (those whose modules were imported)."""
    return dict(_SECTIONS)


# ---------------------------------------------------------------------------- reading
def _hints(cls) -> Dict[str, Any]:
    cached = cls.__dict__.get("_schema_hints")
    if cached is None:
        cached = typing.get_type_hints(cls)
        setattr(cls, "_schema_hints", cached)
    return cached


def unknown_key(key: str, known, owner: str = "") -> ConfigError:
    """Return the error for ``key``, not one of ``known``: the nearest names, and the section that does have it.

    ``owner``: the section's own path, not suggested as the right one.
    """
    known = list(known)
    text = "unknown key {key}"
    homes = [name for name, cls in _SECTIONS.items()
             if name != owner and key in {f.name for f in fields(cls)}]
    near = difflib.get_close_matches(str(key), known, n=2, cutoff=0.6)
    if homes:
        names = [f"'{h}'" for h in homes]
        text += "; it is a key of " + (", ".join(names[:-1]) + " and " if len(names) > 1 else "") + names[-1]
    elif near:
        text += "; did you mean " + " or ".join(f"'{n}'" for n in near) + "?"
    text += f" (known: {', '.join(sorted(map(str, known)))})"
    return ConfigError(text, str(key))


def from_mapping(cls, data: Any, path: str = ""):
    """Return an instance of the section ``cls`` from a mapping (an instance passes through).

    Every error names the key path under ``path``; it is of the class's ``config_error`` type when
    it names one (a ConfigError subclass), else a ConfigError.
    """
    if isinstance(data, cls):
        return data
    try:
        if not isinstance(data, Mapping):
            raise ConfigError(f"must be a mapping, got {type(data).__name__}", "")
        known = [f.name for f in fields(cls) if f.init]
        for k in data:
            if k not in known:
                raise unknown_key(k, known, getattr(cls, "section_name", ""))
        obj = cls(**dict(data))
        if getattr(cls, "check_when_read", False):
            obj.check()
        return obj
    except ConfigError as e:
        kind = getattr(cls, "config_error", type(e))
        raise kind(e.message, e.key, e.source).under(path) from None


def normalise(obj) -> None:
    """Check and convert every field of the frozen dataclass ``obj`` in place (its ``__post_init__``).

    Lists become tuples, ints floats where the field is a float, nested mappings sections; then
    the rules between fields (``obj.check()``, unless the class sets ``check_when_read``: then only
    :func:`from_mapping` runs them). A wrong type, a value out of range or a broken rule raises the
    class's ``config_error`` (default ConfigError) naming the field.
    """
    cls = type(obj)
    try:
        hints = _hints(cls)
        for f in fields(obj):
            val = _convert(hints[f.name], getattr(obj, f.name), f.metadata, f.name)
            object.__setattr__(obj, f.name, val)
        if hasattr(obj, "check") and not getattr(cls, "check_when_read", False):
            obj.check()
    except ConfigError as e:
        kind = getattr(cls, "config_error", type(e))
        raise kind(e.message, e.key, e.source) from None


def convert_value(tp, val, key: str, meta: Optional[Mapping[str, Any]] = None):
    """``val`` checked and converted to the annotation ``tp`` as a field of that type would be.

    ``Sequence[X]`` reads as ``Tuple[X, ...]``; ConfigError names ``key``.
    """
    return _convert(tp, val, meta or {}, key)


def _is_number(val) -> bool:
    return isinstance(val, numbers.Real) and not isinstance(val, bool) and type(val).__name__ != "bool_"


def _list(val) -> Optional[list]:
    if hasattr(val, "tolist") and not isinstance(val, (str, bytes)):
        val = val.tolist()
    return list(val) if isinstance(val, (list, tuple)) else None


def _convert(tp, val, meta: Mapping[str, Any], key: str):
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is typing.Union:
        if val is None and type(None) in args:
            return None
        options = [a for a in args if a is not type(None)]
        if len(options) == 1:
            return _convert(options[0], val, meta, key)
        # A number or a list of them (per-joint gains).
        seq = [a for a in options if typing.get_origin(a) in (tuple, Tuple)]
        if seq and _list(val) is not None:
            return _convert(seq[0], val, meta, key)
        scalar = [a for a in options if a not in seq]
        try:
            return _convert(scalar[0], val, meta, key)
        except ConfigError:
            if seq:
                raise ConfigError(f"must be a number or a list of numbers, got {val!r}", key) from None
            raise
    if dataclasses.is_dataclass(tp):
        return from_mapping(tp, val, key)   # with its own check()
    if origin in (tuple, Tuple):
        return _convert_tuple(args, val, meta, key)
    if origin is collections.abc.Sequence:
        return _convert_tuple((args[0] if args else Any, Ellipsis), val, meta, key)
    out = _scalar(tp, val, key, "", meta)
    _check_value(out, meta, key)
    return out


def _scalar(tp, val, key: str, what: str = "", meta: Optional[Mapping[str, Any]] = None):
    if tp is bool:
        if not isinstance(val, bool) and type(val).__name__ != "bool_":
            raise ConfigError(f"{what}must be true or false, got {val!r}", key)
        return bool(val)
    if tp is int:
        if _is_number(val) and float(val).is_integer():
            return int(val)
        raise ConfigError(f"{what}must be an integer, got {val!r}", key)
    if tp is float:
        if not _is_number(val):
            raise ConfigError(f"{what}must be a number, got {val!r}", key)
        if not math.isfinite(float(val)):
            within = _bounds(meta or {})
            raise ConfigError(f"{what}must be a finite number{' ' + within if within else ''}, got {val!r}", key)
        return float(val)
    if tp is str:
        if not isinstance(val, str):
            raise ConfigError(f"{what}must be a string, got {val!r}", key)
        return val
    if tp is Any:
        return val
    raise TypeError(f"schema: field '{key}' has an unsupported type {tp!r}")


def _convert_tuple(args, val, meta, key: str):
    if len(args) == 2 and args[1] is Ellipsis:
        elem = args[0]
        items = _list(val)
        if items is None:
            raise ConfigError(f"must be a list, got {val!r}", key)
        if typing.get_origin(elem) in (tuple, Tuple):
            # A list of fixed-length entries, or the flat list ROS parameters hold.
            n = len(typing.get_args(elem))
            if items and not any(isinstance(_list(x), list) for x in items):
                if len(items) % n:
                    raise ConfigError(f"has {len(items)} numbers, not a multiple of {n}", key)
                items = [items[i:i + n] for i in range(0, len(items), n)]
            out = []
            for i, x in enumerate(items):
                sub = _list(x)
                if sub is None or len(sub) != n:
                    raise ConfigError(f"every entry needs {n} numbers, got {x!r}", key)
                out.append(tuple(_element(typing.get_args(elem)[j], y, meta, key) for j, y in enumerate(sub)))
            return tuple(out)
        return tuple(_element(elem, x, meta, key) for x in items)
    items = _list(val)
    if items is None:
        if meta.get("broadcast") and _is_number(val):
            items = [val] * len(args)
        else:
            many = "a number or " if meta.get("broadcast") else ""
            raise ConfigError(f"must be {many}a list of {len(args)} numbers, got {val!r}", key)
    if len(items) != len(args):
        raise ConfigError(f"must have {len(args)} entries, got {len(items)}", key)
    return tuple(_element(a, x, meta, key) for a, x in zip(args, items))


def _element(tp, val, meta, key: str):
    out = _scalar(tp, val, key, "entries ", meta)
    _check_value(out, meta, key, "entries ")
    return out


def _bounds(meta: Mapping[str, Any]) -> str:
    """Return the allowed range as text: "> 0", ">= 1", "<= 1", "in (0, 1]", "in [0, 1]", "" when none."""
    lo, above, hi = meta.get("low"), meta.get("above"), meta.get("high")
    if hi is not None and (lo is not None or above is not None):
        return f"in {'(' if above is not None else '['}{(above if above is not None else lo):g}, {hi:g}]"
    if above is not None:
        return f"> {above:g}"
    if lo is not None:
        return f">= {lo:g}"
    if hi is not None:
        return f"<= {hi:g}"
    return ""


def _check_value(val, meta: Mapping[str, Any], key: str, what: str = "") -> None:
    if val is None:
        return
    choices = meta.get("choices")
    if choices is not None and val not in choices:
        raise ConfigError(f"{what}must be one of {choices}, got {val!r}", key)
    lo, above, hi = meta.get("low"), meta.get("above"), meta.get("high")
    if ((above is not None and not val > above) or (lo is not None and not val >= lo)
            or (hi is not None and not val <= hi)):
        unit = f" {meta['unit']}" if meta.get("unit") else ""
        raise ConfigError(f"{what}must be {_bounds(meta)}{unit}, got {val!r}", key)


# ---------------------------------------------------------------------------- describing
@dataclass(frozen=True)
class Entry:
    """One field of a section, for ROS parameter descriptors and the parameter reference."""

    name: str                  # dotted path under the section, e.g. "rotors.drag_linear"
    type: Any
    default: Any
    doc: str
    unit: str
    constraints: str           # "> 0", ">= 1", "one of ('a', 'b')", "" when none
    ros: bool
    ros_null: Any = None       # what stands for null as a ROS parameter


def _constraints(meta: Mapping[str, Any]) -> str:
    parts = []
    if meta.get("choices") is not None:
        parts.append(f"one of {', '.join(map(str, meta['choices']))}")
    if _bounds(meta):
        parts.append(_bounds(meta))
    return ", ".join(parts)


def type_name(tp) -> str:
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is typing.Union:
        return " or ".join("null" if a is type(None) else type_name(a) for a in args)
    if origin in (tuple, Tuple):
        if len(args) == 2 and args[1] is Ellipsis:
            return f"list of {type_name(args[0])}"
        return f"[{', '.join(type_name(a) for a in args)}]"
    if origin is collections.abc.Sequence:
        return f"list of {type_name(args[0]) if args else 'values'}"
    if dataclasses.is_dataclass(tp):
        return "mapping"
    return {bool: "bool", int: "int", float: "float", str: "string"}.get(tp, getattr(tp, "__name__", str(tp)))


def entries(cls, prefix: str = "") -> Iterator[Entry]:
    """Every field of the section ``cls``, nested sections expanded, with dotted names under ``prefix``.

    A nested section's own entry is not listed.
    """
    hints = _hints(cls)
    for f in fields(cls):
        name = f"{prefix}.{f.name}" if prefix else f.name
        tp = hints[f.name]
        inner = [a for a in typing.get_args(tp) if dataclasses.is_dataclass(a)] if typing.get_origin(
            tp) is typing.Union else ([tp] if dataclasses.is_dataclass(tp) else [])
        if inner:
            yield from entries(inner[0], name)
            continue
        default = f.default if f.default is not MISSING else (
            f.default_factory() if f.default_factory is not MISSING else None)
        meta = f.metadata
        yield Entry(name, tp, default, meta.get("doc", ""), meta.get("unit", ""), _constraints(meta),
                    meta.get("ros", True), meta.get("ros_null"))


def describe(entry: Entry, with_default: bool = True) -> str:
    """One line for a field: its documentation, type, unit, allowed values and default."""
    parts = [entry.doc.rstrip(".") + "." if entry.doc else ""]
    kind = type_name(entry.type)
    if entry.unit:
        kind += f", {entry.unit}"
    parts.append(f"[{kind}]")
    if entry.constraints:
        parts.append(f"({entry.constraints})")
    if with_default:
        parts.append(f"default: {show(entry.default)}")
    return " ".join(p for p in parts if p)


def show(val) -> str:
    if isinstance(val, tuple):
        return "[" + ", ".join(show(v) for v in val) + "]"
    if isinstance(val, bool):
        return "true" if val else "false"
    if val is None:
        return "null"
    if isinstance(val, float):
        return f"{val:g}"
    if isinstance(val, str):
        return val if val else '""'
    return str(val)


def ros_parameters(cls, prefix: str) -> List[Tuple[str, Any, str]]:
    """``(name, default, description)`` of every field of the section ``cls`` that is a ROS parameter.

    Each is named ``prefix.field``; defaults are as ROS holds them (lists for tuples, the field's
    ``ros_null`` for None) and the description is that of :func:`describe`.
    """
    out = []
    for e in entries(cls, prefix):
        if not e.ros:
            continue
        default = e.default
        if default is None:
            default = e.ros_null
        elif isinstance(default, tuple):
            default = [list(x) if isinstance(x, tuple) else x for x in default]
            if default and isinstance(default[0], list):           # ROS holds no nested lists
                default = [y for x in default for y in x]
        out.append((e.name, default, describe(e)))
    return out


def ros_constraints(cls, prefix: str) -> Dict[str, str]:
    """``{prefix.field: constraints}`` of the section ``cls``'s ROS parameters that have a range or a set of values.

    They are the ParameterDescriptor's additional_constraints (``ros2 param describe``).
    """
    return {e.name: e.constraints for e in entries(cls, prefix) if e.ros and e.constraints}


_ROS_ELEMENT_TYPES = {bool: "bool", int: "integer", float: "double", str: "string"}


def ros_array_types(cls, prefix: str) -> Dict[str, str]:
    """``{prefix.field: element type}`` of the section ``cls``'s list parameters (``"double"``, ``"string"``, ...).

    An empty list default does not say what its entries are; nodes.common.declare takes the type
    from here.
    """
    out = {}
    for e in entries(cls, prefix):
        args = typing.get_args(e.type)
        if not e.ros or typing.get_origin(e.type) not in (tuple, Tuple) or not args:
            continue
        if args[0] in _ROS_ELEMENT_TYPES and all(a is args[0] or a is Ellipsis for a in args):
            out[e.name] = _ROS_ELEMENT_TYPES[args[0]]
    return out
