"""A model dir's config.json checked as plain JSON before transformers reads it, and the shape rules transformers'
model code would otherwise raise for in a traceback.

Each problem is one line naming the file, the key, the value, the rule and the fix: a config.json that is empty,
not JSON, not an object, without a model_type, with NaN or a float, a string or a non-positive number where a
size belongs, or past the bounds (launcher.config.bounds), is bad input (exit 2) before anything is built.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from launcher.config import bounds
from launcher.files.fsutil import not_a_file
from launcher.units import format_bytes

FIX = "fix config.json (is it the model's own?) or point model at a transformers model dir"
POSITIVE_KINDS = ("hidden", "layers", "heads", "vocab", "positions")
"""Sizes a model cannot have zero of; an MLP width or an expert count of 0 means "none" in some families."""


class _NonFinite(float):
    """NaN or an infinity as json.loads reads it with parse_constant: a float that remembers its spelling."""

    spelling = ""


def _constant(text: str) -> _NonFinite:
    value = _NonFinite(text.replace("Infinity", "inf"))
    value.spelling = text
    return value


def read_config_json(path: Path) -> tuple[dict | None, list[str]]:
    """(the config as a dict, []) or (None, the one problem with the file): its size, UTF-8, JSON, an object."""
    where = f"model: {str(path)!r}"
    kind = not_a_file(path)
    if kind:  # a FIFO or a device would block the read or never end it
        return None, [f"{where} is {kind}, not a file; point model at a transformers model dir"]
    try:
        with path.open("rb") as f:
            raw = f.read(bounds.MODEL_CONFIG_BYTES + 1)
    except OSError as e:
        return None, [f"{where} cannot be read ({e.strerror or e}); make it readable or fetch the model again"]
    if len(raw) > bounds.MODEL_CONFIG_BYTES:
        size = max(len(raw), path.stat().st_size)
        return None, [f"{where} is {format_bytes(size)}, over the {format_bytes(bounds.MODEL_CONFIG_BYTES)} a "
                      "model's config.json may be (real ones are a few KB); point model at a transformers model dir"]
    if not raw.strip():
        return None, [f"{where} is empty; a config.json is a JSON object with model_type and the sizes: fetch "
                      "the model again or point model at a transformers model dir"]
    try:
        data = json.loads(raw.decode("utf-8"), parse_constant=_constant)
    except UnicodeDecodeError as e:
        return None, [f"{where} is not UTF-8 text (byte {e.start}); fetch the model again"]
    except json.JSONDecodeError as e:
        return None, [f"{where} is not JSON (line {e.lineno}, column {e.colno}: {e.msg}); {FIX}"]
    except RecursionError:
        return None, [f"{where} nests too deeply to be a model config; {FIX}"]
    if not isinstance(data, dict):
        return None, [f"{where} holds a JSON {type(data).__name__}, not an object of settings; {FIX}"]
    return data, []


def _size_problem(key: str, value: Any, kind: str) -> str | None:
    """Why a size key's value is no size: NaN, a float, a string, a bool, or below its minimum; None when fine
    (null: transformers' default; a list: per-layer sizes, each checked)."""
    if value is None:
        return None
    items = value if isinstance(value, list) and len(value) <= bounds.LIST_ITEMS * 100 else [value]
    least = 1 if kind in POSITIVE_KINDS else 0
    for v in items:
        if isinstance(v, _NonFinite):
            return f"is {v.spelling}, not a number a size can be"
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            return f"is {json.dumps(v)[:40]} (a {type(v).__name__}), not a whole number"
        if isinstance(v, float):
            return f"is {v!r} (a float), not a whole number" if math.isfinite(v) else f"is {v}, not a size"
        if v < least:
            return f"is {v}; it must be at least {least}"
    return None


def _non_finite(data: Any, path: str, depth: int = 0) -> str | None:
    """The dotted key of the first NaN or infinity anywhere in the config (transformers would keep it)."""
    if isinstance(data, _NonFinite):
        return path
    if depth > 20:
        return None
    items = data.items() if isinstance(data, dict) else enumerate(data) if isinstance(data, list) else ()
    for k, v in items:
        found = _non_finite(v, f"{path}.{k}" if path else str(k), depth + 1)
        if found:
            return found
    return None


def config_data_problems(data: dict, path: Path) -> list[str]:
    """A config.json's plain data: model_type present and a string, each size key (top level and text_config) a
    whole number of at least 1 (0 for MLP widths and expert counts), no NaN or infinity, and the bounds."""
    where = f"model: {path.name} in {str(path.parent)!r}"
    problems: list[str] = []
    kind = data.get("model_type")
    if kind is None:
        problems.append(f"{where} has no model_type, so transformers cannot tell the architecture; add "
                        "\"model_type\": \"llama\" (or the model's family) or fetch the model again")
    elif not isinstance(kind, str) or not kind.strip():
        problems.append(f"{where}: model_type {json.dumps(kind)[:40]} is not a family name; write e.g. "
                        "\"model_type\": \"llama\"")
    configs = [("", data)]
    if isinstance(data.get("text_config"), dict):
        configs.append(("text_config.", data["text_config"]))
    for prefix, cfg in configs:
        for size_kind, keys in bounds.CONFIG_KEYS.items():
            for key in keys:
                if key in cfg:
                    bad = _size_problem(key, cfg[key], size_kind)
                    if bad:
                        problems.append(f"{where}: {prefix}{key} {bad}; {FIX}")
    if not problems:
        nan_at = _non_finite(data, "")
        if nan_at:
            problems.append(f"{where}: {nan_at} is NaN or infinite, which no setting means; {FIX}")
    if problems:
        return problems
    return bounds.config_problems(data)


def config_file_problems(path: Path) -> list[str]:
    """Every problem with a model dir's config.json, said before transformers is imported or reads it: its size,
    JSON, shape, model_type and sizes (as plain data), and the bounds. [] when the file is fine."""
    data, problems = read_config_json(path)
    return problems if data is None else config_data_problems(data, path)


def known_model_type(kind: str, path: Path) -> str | None:
    """The problem with a model_type transformers has no config class for (None when it has one), with the
    nearest known name; imports transformers' mapping of names, not its models."""
    import difflib

    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

    if kind in CONFIG_MAPPING_NAMES:
        return None
    near = difflib.get_close_matches(kind, list(CONFIG_MAPPING_NAMES), n=1, cutoff=0.8)
    hint = f"did you mean {near[0]!r}? " if near else ""
    import transformers

    return (f"model: {path.name} in {str(path.parent)!r}: model_type {kind!r} is no architecture transformers "
            f"{transformers.__version__} knows; {hint}fix model_type, or upgrade transformers if the model is newer")


def shape_problems(config, where: str) -> list[str]:
    """The attention shape transformers' model code asserts or silently bends: the hidden size a multiple of the
    heads (unless the config gives head_dim), the heads a multiple of the key/value heads."""
    hidden = getattr(config, "hidden_size", None)
    heads = getattr(config, "num_attention_heads", None)
    kv = getattr(config, "num_key_value_heads", None)
    ints = all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in (hidden, heads))
    if not ints:
        return []
    problems = []
    if hidden % heads and not getattr(config, "head_dim", None):
        problems.append(f"model: {where}: the hidden size {hidden} is not divisible by the {heads} attention heads "
                        f"(and no head_dim is given); {FIX}")
    if isinstance(kv, int) and not isinstance(kv, bool) and kv > 0 and heads % kv:
        problems.append(f"model: {where}: the {heads} attention heads are not a multiple of the {kv} key/value "
                        f"heads (grouped-query attention shares each evenly); {FIX}")
    return problems
