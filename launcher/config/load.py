"""Turn YAML documents into typed config objects, collecting every problem.

Each problem is one line: the dotted key, the value, the rule, and the fix.
"""

from __future__ import annotations

import dataclasses
import difflib
import types
import typing
from pathlib import Path
from typing import Any, Literal, TypeVar, Union

import yaml

from launcher.errors import ConfigError
from launcher.units import parse_bytes

T = TypeVar("T")


def yaml_key(f: dataclasses.Field) -> str:
    return f.metadata.get("yaml", f.name)


def public_fields(cls: type) -> list[dataclasses.Field]:
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
    def add(self, where: str, value: Any, rule: str, fix: str) -> None:
        self.append(f"{where}: {value!r} {rule}; {fix}")


def _convert(tp: Any, value: Any, where: str, problems: _Problems, *, is_bytes: bool = False) -> Any:
    origin = typing.get_origin(tp)
    if origin in (Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        non_none = [a for a in args if a is not type(None)]
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
        if value in choices and type(value) is type(choices[0]) or value in choices and not isinstance(value, bool):
            return value
        near = difflib.get_close_matches(str(value), [str(c) for c in choices], n=1)
        hint = f"did you mean {near[0]!r}?" if near else f"use one of {', '.join(repr(c) for c in choices)}"
        problems.add(where, value, f"is not one of {', '.join(repr(c) for c in choices)}", hint)
        return None
    if dataclasses.is_dataclass(tp):
        return _build(tp, value, where, problems)
    if origin is list:
        (item_tp,) = typing.get_args(tp)
        if not isinstance(value, list):
            problems.add(where, value, "must be a list", f"write {where} as [a, b, ...]")
            return None
        return [_convert(item_tp, v, f"{where}[{i}]", problems) for i, v in enumerate(value)]
    if origin is dict:
        key_tp, val_tp = typing.get_args(tp)
        if not isinstance(value, dict):
            problems.add(where, value, "must be a mapping", f"write {where} as {{key: value}}")
            return None
        return {str(k): _convert(val_tp, v, f"{where}.{k}", problems) for k, v in value.items()}
    if tp is int and is_bytes:
        try:
            return parse_bytes(value)
        except ValueError as e:
            problems.append(f"{where}: {e}")
            return None
    if tp is bool:
        if isinstance(value, bool):
            return value
        problems.add(where, value, "must be true or false", f"write {where}: true or {where}: false")
        return None
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        problems.add(where, value, "must be an integer", f"write {where} as a whole number, e.g. 8")
        return None
    if tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        problems.add(where, value, "must be a number", f"write {where} as a number, e.g. 2.0e-5")
        return None
    if tp is str:
        if isinstance(value, str):
            return value
        problems.add(where, value, "must be a string", f"quote {where}")
        return None
    if tp is object:
        return value
    raise TypeError(f"unsupported config type {tp!r} at {where}")


def _build(cls: type[T], data: Any, where: str, problems: _Problems) -> T | None:
    if not isinstance(data, dict):
        problems.add(where or "document", data, "must be a mapping of keys", f"write {where or 'the job'} as key: value lines")
        return None
    hints = typing.get_type_hints(cls)
    fields = {yaml_key(f): f for f in public_fields(cls)}
    kwargs: dict[str, Any] = {}
    for key, value in data.items():
        path = f"{where}.{key}" if where else str(key)
        f = fields.get(key)
        if f is None:
            near = difflib.get_close_matches(str(key), list(fields), n=1, cutoff=0.6)
            hint = f"did you mean {near[0]!r}?" if near else f"valid keys: {', '.join(fields)}"
            problems.append(f"{path}: unknown key; {hint}")
            continue
        kwargs[f.name] = _convert(hints[f.name], value, path, problems, is_bytes=f.name.endswith("_bytes"))
    for key, f in fields.items():
        if f.name not in kwargs and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            path = f"{where}.{key}" if where else key
            problems.append(f"{path}: missing; add {path}: <{_type_name(hints[f.name])}> to the job file")
    if problems:
        return None
    return cls(**kwargs)


def from_dict(cls: type[T], data: Any, where: str = "") -> T:
    """Build ``cls`` from plain data or raise one ConfigError listing every problem."""
    problems = _Problems()
    out = _build(cls, data, where, problems)
    if problems:
        raise ConfigError(list(problems))
    return out  # type: ignore[return-value]


def load_yaml(path: str | Path) -> Any:
    """safe_load a file; syntax errors name the line and column."""
    p = Path(path)
    try:
        text = p.read_text()
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such job file; check the path") from None
    except (IsADirectoryError, PermissionError, UnicodeDecodeError) as e:
        raise ConfigError(f"{path}: cannot read the job file ({e.__class__.__name__}); pass a readable YAML file") from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        at = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "unknown position"
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise ConfigError(f"{path}: YAML syntax error at {at}: {problem}; fix the YAML there") from None


def to_dict(obj: Any) -> Any:
    """Inverse of from_dict: a dataclass back to YAML-keyed plain data."""
    if dataclasses.is_dataclass(obj):
        return {yaml_key(f): to_dict(getattr(obj, f.name)) for f in public_fields(type(obj))}
    if isinstance(obj, list):
        return [to_dict(v) for v in obj]
    if isinstance(obj, dict):
        return {k: to_dict(v) for k, v in obj.items()}
    return obj
