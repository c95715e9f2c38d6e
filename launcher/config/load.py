"""Turn YAML documents into typed config objects, collecting every problem.

Each problem is one line: the dotted key, the value, the rule, and the fix.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import re
import reprlib
import types
import typing
from pathlib import Path
from typing import Any, Literal, TypeVar, Union

import yaml

from launcher.config import bounds
from launcher.engines import LAYOUT_ALIASES
from launcher.errors import ConfigError
from launcher.files.fsutil import not_a_file
from launcher.units import format_bytes, parse_bytes

T = TypeVar("T")

INT_LIMIT = 2**63 - 1
"""Largest integer a config field takes: what torch, numpy and JSON readers elsewhere hold without overflow."""
PLAIN_NODES_LIMIT = 100_000
"""Most scalars a free-form value (sweep grids, Slurm extras) may expand to: YAML aliases can nest a
"billion laughs" into a few lines, and every later walk (messages, job.yaml) would expand it."""

# Names other tools use for our keys: spelling is close enough for difflib, meaning is not.
KEY_ALIASES = {
    "learning_rate": "lr", "batch_size": "global_batch_size", "train_batch_size": "global_batch_size",
    "steps": "max_steps", "num_steps": "max_steps", "num_train_epochs": "epochs", "seq_len": "max_seq_len",
    "max_length": "max_seq_len", "sequence_length": "max_seq_len", "dtype": "precision", "mixed_precision": "precision",
    "gradient_checkpointing": "activation_checkpointing", **LAYOUT_ALIASES,
    "num_gpus": "gpus", "num_nodes": "nodes", "memory_budget": "budget", "mem_budget": "budget",
}

_shown = reprlib.Repr()
# Messages quote the value, but a value can be a huge or aliased structure; a path must still show in full.
_shown.maxstring, _shown.maxother, _shown.maxlevel, _shown.maxlist, _shown.maxdict = 160, 160, 3, 6, 6


SHOWN_CHARS = 200
"""Most characters a quoted value takes in a message: a path (160) shows whole, a nested structure its start."""


def show(value: Any) -> str:
    """repr() bounded in size, for quoting a user's value in a message."""
    text = _shown.repr(value)
    return text if len(text) <= SHOWN_CHARS else text[: SHOWN_CHARS - 4] + " ..."


def yaml_key(f: dataclasses.Field) -> str:
    """The field's key in the job file (its "yaml" metadata, else its name)."""
    return f.metadata.get("yaml", f.name)


def public_fields(cls: type) -> list[dataclasses.Field]:
    """The dataclass fields a job file may set: all but those marked internal (e.g. base_dir)."""
    return [f for f in dataclasses.fields(cls) if not f.metadata.get("internal")]


def _type_name(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin is Literal:
        return " | ".join(repr(a) for a in typing.get_args(tp))
    if origin in (Union, types.UnionType):
        return " or ".join(_type_name(a) for a in typing.get_args(tp))
    if dataclasses.is_dataclass(tp):
        return "a mapping"
    if origin is list:
        return "a list"
    if origin is dict:
        return "a mapping"
    return {int: "an integer", float: "a number", str: "a string", bool: "true or false", type(None): "null"}.get(
        tp, getattr(tp, "__name__", str(tp))
    )


class _Problems(list):
    """Problem lines, plus the dotted paths whose values were refused (so later rules leave them alone)."""

    def __init__(self) -> None:
        super().__init__()
        self.failed: list[str] = []

    def add(self, where: str, value: Any, rule: str, fix: str) -> None:
        self.append(f"{where}: {show(value)} {rule}; {fix}")


class _NotPlain(ValueError):
    """Why a free-form value is not plain data (the message), and its fix."""

    def __init__(self, why: str, fix: str):
        super().__init__(why)
        self.fix = fix


def _plain_problem(value: Any, where: str) -> tuple[str, str] | None:
    """Why a free-form value is not plain finite YAML data (a cycle, or too large once aliases expand), and the
    fix; None when it is."""
    sizes: dict[int, int] = {}
    on_path: set[int] = set()
    aliases = "write the value out without aliases"

    def size(v: Any, depth: int) -> int:
        if isinstance(v, str) and len(v) > bounds.STRING_CHARS:
            raise _NotPlain(f"holds a string of {len(v)} characters, over the {bounds.STRING_CHARS} a job's "
                            "strings may hold", f"shorten the string in {where}")
        if not isinstance(v, (list, dict)):
            return 1
        key = id(v)
        if key in on_path or depth > 50:
            raise _NotPlain("refers to itself (a YAML alias inside its own anchor) or nests over 50 levels", aliases)
        if key in sizes:  # a shared alias: counted again, walked once
            return sizes[key]
        on_path.add(key)
        items = list(v.values()) if isinstance(v, dict) else v
        n = 1 + sum(size(c, depth + 1) for c in items)
        on_path.discard(key)
        sizes[key] = n
        if n > PLAIN_NODES_LIMIT:
            raise _NotPlain(f"expands to over {PLAIN_NODES_LIMIT} values (YAML aliases)", aliases)
        return n

    try:
        size(value, 0)
    except _NotPlain as e:
        return str(e), e.fix
    return None


def _convert(tp: Any, value: Any, where: str, problems: _Problems, *, is_bytes: bool = False) -> Any:
    origin = typing.get_origin(tp)
    if origin in (Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        non_none = [a for a in args if a is not type(None)]
        shapes = [a for a in non_none if dataclasses.is_dataclass(a)]
        if isinstance(value, dict) and len(shapes) == 1:
            # A mapping can only mean the one structured member: name its bad fields, not "string or mapping".
            return _convert(shapes[0], value, where, problems, is_bytes=is_bytes)
        # Try each member quietly; report once with all alternatives.
        for arg in non_none:
            trial = _Problems()
            out = _convert(arg, value, where, trial, is_bytes=is_bytes)
            if not trial:
                return out
        if len(non_none) == 1:
            return _convert(non_none[0], value, where, problems, is_bytes=is_bytes)
        problems.add(where, value, f"must be {_type_name(tp)}", f"write {where} as {_type_name(tp)}")
        return None
    if origin is Literal:
        choices = typing.get_args(tp)
        # Exact type too: True == 1 and 1.0 == 1, but zero_stage: true or 1.0 is a typo, not stage 1.
        if any(value == c and type(value) is type(c) for c in choices):
            return value
        same = [c for c in choices if not isinstance(value, (list, dict)) and value == c]  # 1.0 for 1, true for 1
        near = [repr(c) for c in same] or [repr(c) for c in choices if str(c) in
                                           difflib.get_close_matches(str(value), [str(c) for c in choices], n=1)]
        hint = f"did you mean {near[0]}?" if near else f"use one of {', '.join(repr(c) for c in choices)}"
        problems.add(where, value, f"is not one of {', '.join(repr(c) for c in choices)}", hint)
        return None
    if dataclasses.is_dataclass(tp):
        return _build(tp, value, where, problems)
    if origin is list:
        (item_tp,) = typing.get_args(tp)
        if not isinstance(value, list):
            problems.add(where, value, "must be a list", f"write {where} as [a, b, ...]")
            return None
        if len(value) > bounds.LIST_ITEMS:  # before each item is converted (and each refusal quoted)
            problems.add(where, value, f"has {len(value)} items, over the {bounds.LIST_ITEMS} a job's lists may hold",
                         f"give {where} at most {bounds.LIST_ITEMS} items")
            return None
        found = _plain_problem(value, where) if item_tp is object else None
        if found:  # said once for the list, not once per item that shares the alias
            problems.add(where, value, *found)
            return None
        return [_convert(item_tp, v, f"{where}[{i}]", problems) for i, v in enumerate(value)]
    if origin is dict:
        key_tp, val_tp = typing.get_args(tp)
        if not isinstance(value, dict):
            problems.add(where, value, "must be a mapping", f"write {where} as {{key: value}}")
            return None
        if len(value) > bounds.LIST_ITEMS:
            problems.add(where, value, f"has {len(value)} keys, over the {bounds.LIST_ITEMS} a job's mappings may "
                         "hold", f"give {where} at most {bounds.LIST_ITEMS} keys")
            return None
        long_key = next((k for k in value if len(str(k)) > bounds.STRING_CHARS), None)
        if long_key is not None:
            problems.add(f"{where} key", long_key, f"is {len(str(long_key))} characters, over the "
                         f"{bounds.STRING_CHARS} a job's strings may hold", "shorten the key")
            return None
        return {str(k): _convert(val_tp, v, f"{where}.{k}", problems) for k, v in value.items()}
    if tp is int and is_bytes:
        if isinstance(value, float) and not math.isfinite(value):
            problems.add(where, value, "is not a size", "give a size with a unit, e.g. 16GB")
            return None
        try:
            n = parse_bytes(value)
        except OverflowError:  # '1e400GB' parses to an infinite float, which int() refuses
            problems.add(where, value, "is too large to be a size", "give a realistic size, e.g. 16GB")
            return None
        except ValueError as e:
            problems.append(f"{where}: {e}")
            return None
        if n > INT_LIMIT:
            problems.add(where, value, f"is over {INT_LIMIT} bytes", "give a realistic size, e.g. 16GB")
            return None
        return n
    if tp is bool:
        if isinstance(value, bool):
            return value
        problems.add(where, value, "must be true or false", f"write {where}: true or {where}: false")
        return None
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            if abs(value) > INT_LIMIT:
                problems.add(where, value, "is out of range (over 2^63)", f"give {where} a realistic whole number")
                return None
            return value
        problems.add(where, value, "must be an integer", f"write {where} as a whole number, e.g. 8")
        return None
    if tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            if not math.isfinite(float(value)):  # .nan / .inf in YAML, or an int too big for a float
                problems.add(where, value, "must be a finite number", f"write {where} as a number, e.g. 2.0e-5")
                return None
            return float(value)
        problems.add(where, value, "must be a number", f"write {where} as a number, e.g. 2.0e-5")
        return None
    if tp is str:
        if isinstance(value, str) and len(value) > bounds.STRING_CHARS:
            problems.add(where, value, f"is {len(value)} characters, over the {bounds.STRING_CHARS} a job's strings "
                         "may hold (the longest path Linux takes)", f"shorten {where}")
            return None
        if isinstance(value, str):
            return value
        problems.add(where, value, "must be a string", f"quote {where}")
        return None
    if tp is object:
        if isinstance(value, str):  # a free-form value that is a plain string: the string rule, said the same way
            return _convert(str, value, where, problems)
        found = _plain_problem(value, where)
        if found:
            problems.add(where, value, *found)
            return None
        return value
    raise TypeError(f"unsupported config type {tp!r} at {where}")


def _build(cls: type[T], data: Any, where: str, problems: _Problems) -> T | None:
    """``cls`` from ``data``; a refused field falls back to its default so the rest can still be checked.

    None only when a required field is refused or missing: then nothing of ``cls`` can be checked further.
    """
    if not isinstance(data, dict):
        problems.add(where or "document", data, "must be a mapping of keys",
                     f"write {where or 'the job'} as key: value lines")
        return None
    hints = typing.get_type_hints(cls)
    fields = {yaml_key(f): f for f in public_fields(cls)}
    kwargs: dict[str, Any] = {}
    complete = True
    strays: list[str] = []  # unknown keys nothing is near: one line for all of them
    for key, value in data.items():
        path = f"{where}.{key}" if where else str(key)
        f = fields.get(key)
        if f is None:
            near = difflib.get_close_matches(str(key), list(fields), n=1, cutoff=0.6)
            alias = KEY_ALIASES.get(str(key).lower().replace("-", "_"))
            if alias in fields:
                near = [alias]
            valid = f"valid keys: {', '.join(fields)}"
            if near:
                problems.append(f"{path}: unknown key; did you mean {near[0]!r}? {valid}")
                if near[0] not in data:  # its default stands in for what the user meant: no rule may judge it
                    problems.failed.append(f"{where}.{near[0]}" if where else near[0])
            else:
                strays.append(path)
            continue
        before = len(problems)
        out = _convert(hints[f.name], value, path, problems, is_bytes=f.name.endswith("_bytes"))
        # A nested mapping with a bad field inside still comes back built (it marked its own paths).
        if len(problems) > before and not dataclasses.is_dataclass(out):
            problems.failed.append(path)
            if _required(f):
                complete = False
            continue
        kwargs[f.name] = out
    if strays:
        names = ", ".join(strays[:8]) + (f" and {len(strays) - 8} more" if len(strays) > 8 else "")
        problems.append(f"{names}: unknown key{'s' if len(strays) > 1 else ''}; valid keys: {', '.join(fields)}")
    for key, f in fields.items():
        if f.name not in kwargs and _required(f) and key in data:
            continue  # refused above, already reported
        if f.name not in kwargs and _required(f):
            path = f"{where}.{key}" if where else key
            problems.append(f"{path}: missing; add {path}: <{_type_name(hints[f.name])}> to the job file")
            problems.failed.append(path)
            complete = False
    if not complete:
        return None
    return cls(**kwargs)


def _required(f: dataclasses.Field) -> bool:
    return f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING


@dataclasses.dataclass(kw_only=True, slots=True)
class Partial:
    """What from_dict_partial built, with the problems it found on the way."""

    value: Any
    """The built object (refused fields at their defaults), or None when a required field was refused."""
    problems: list[str]
    """Every type and key problem, one line each."""
    failed: list[str]
    """Dotted paths whose values were refused or left out; rules over values must not judge them."""


def from_dict_partial(cls: type[T], data: Any, where: str = "") -> Partial:
    """Build ``cls`` as far as the data allows, so value rules can run beside the type problems."""
    problems = _Problems()
    out = _build(cls, data, where, problems)
    return Partial(value=out, problems=list(problems), failed=list(problems.failed))


def from_dict(cls: type[T], data: Any, where: str = "") -> T:
    """Build ``cls`` from plain data or raise one ConfigError listing every problem."""
    built = from_dict_partial(cls, data, where)
    if built.problems:
        raise ConfigError(built.problems)
    return built.value


class JobLoader(yaml.SafeLoader):
    """SafeLoader that also reads 1e-4 as a number: PyYAML follows YAML 1.1, whose floats need a dot
    (1.0e-4), so `lr: 1e-4` was a string that the float check refused. YAML 1.2 (and every JSON reader)
    takes it as a float."""


JobLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
    list("-+0123456789"),
)


def parse_yaml_value(text: str) -> Any:
    """One YAML value from the command line (``1e-4``, ``3``, ``true``, ``[q_proj, v_proj]``, ``null``).

    An empty text is the empty string, not null: ``name=`` must not delete a key by accident.
    """
    if text.strip() == "":
        return text
    try:
        return yaml.load(text, Loader=JobLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as e:
        raise ValueError(getattr(e, "problem", None) or str(e).splitlines()[0]) from None
    except ValueError as e:
        raise ValueError(value_error(e)) from None


def load_yaml(path: str | Path) -> Any:
    """safe_load a file; syntax errors and duplicate keys name the line and column. A file over
    bounds.JOB_FILE_BYTES is refused before YAML reads it."""
    p = Path(path)
    try:
        kind = not_a_file(p)
        if kind not in (None, "missing"):  # a directory, FIFO or device: reading could block or never end
            raise ConfigError(f"{path}: not a regular file ({kind}); pass the path of a YAML job file")
        with p.open("rb") as f:  # read one byte past the bound: /proc files say size 0, a file may grow
            raw = f.read(bounds.JOB_FILE_BYTES + 1)
        if len(raw) > bounds.JOB_FILE_BYTES:
            size = max(p.stat().st_size, len(raw))
            raise ConfigError(f"{path}: the job file is {format_bytes(size)}, over the "
                              f"{format_bytes(bounds.JOB_FILE_BYTES)} a job file may be (real ones are a few KB); "
                              "keep data in data.path and variants in sweep:, not in the job file")
        text = raw.decode()
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such job file; check the path") from None
    except (OSError, ValueError) as e:  # permissions, a name too long, a NUL byte, not UTF-8
        why = e.strerror if isinstance(e, OSError) and e.strerror else e.__class__.__name__
        raise ConfigError(f"{path}: cannot read the job file ({why}); pass a readable UTF-8 YAML file") from None
    try:
        duplicate = _first_duplicate_key(text)
        if duplicate:
            raise ConfigError(f"{path}: {duplicate}")
        return yaml.load(text, Loader=JobLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        at = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "unknown position"
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise ConfigError(f"{path}: YAML syntax error at {at}: {problem}; fix the YAML there") from None
    except RecursionError:
        raise ConfigError(f"{path}: the YAML nests too deeply to read; a job file is a few levels of key: "
                          "value") from None
    except ValueError as e:  # a constructor refused a value: an integer of 4300+ digits, a date like 2024-13-45
        raise ConfigError(f"{path}: a value in the job file cannot be read ({value_error(e)}); fix that "
                          "value") from None


def value_error(e: ValueError) -> str:
    """What a YAML constructor's ValueError says, in the user's terms."""
    if "integer string conversion" in str(e):  # Python's guard against quadratic int(): no job field needs one
        return "a whole number of over 4300 digits"
    return show(str(e).splitlines()[0] if str(e) else type(e).__name__)


def _first_duplicate_key(text: str) -> str | None:
    """YAML keeps the last of two equal keys without a word; a job file that says lr twice is a mistake.

    Walks the composed node tree (yaml.compose with SafeLoader builds no Python objects, so it is as safe as
    safe_load) and names the first repeated key with both lines.
    """
    root = yaml.compose(text, Loader=yaml.SafeLoader)
    stack = [(root, "")] if root is not None else []
    seen_nodes: set[int] = set()
    while stack:
        node, where = stack.pop()
        if id(node) in seen_nodes:  # aliases share nodes
            continue
        seen_nodes.add(id(node))
        if isinstance(node, yaml.MappingNode):
            first: dict[str, yaml.Node] = {}
            for key, value in node.value:
                name = key.value if isinstance(key, yaml.ScalarNode) else None
                path = f"{where}.{name}" if where else str(name)
                if name is not None and name in first and name != "<<":
                    a, b = first[name].start_mark, key.start_mark
                    return (f"{path}: duplicate key at line {b.line + 1}, column {b.column + 1} (first at line "
                            f"{a.line + 1}); YAML keeps only the last one, so delete the one you do not mean")
                if name is not None:
                    first[name] = key
                stack.append((value, path))
        elif isinstance(node, yaml.SequenceNode):
            stack.extend((v, f"{where}[{i}]") for i, v in enumerate(node.value))
    return None


def to_dict(obj: Any) -> Any:
    """Inverse of from_dict: a dataclass back to YAML-keyed plain data."""
    if dataclasses.is_dataclass(obj):
        return {yaml_key(f): to_dict(getattr(obj, f.name)) for f in public_fields(type(obj))}
    if isinstance(obj, list):
        return [to_dict(v) for v in obj]
    if isinstance(obj, dict):
        return {k: to_dict(v) for k, v in obj.items()}
    return obj
