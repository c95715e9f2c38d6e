"""What the run dir's typed JSON records (rank-K.json, state.json) share: a schema they refuse when newer, and
fields another writer added kept as they are in ``extra``."""

from __future__ import annotations

import dataclasses


def known_and_extra(cls, d: dict, *, newest: int, what: str) -> tuple[dict, dict]:
    """(the fields of ``cls`` that ``d`` sets to something, every other key of ``d``); ValueError when ``d``'s
    schema is newer than ``newest``, rather than misread a layout this launcher does not know."""
    if int(d.get("schema", 1)) > newest:
        raise ValueError(f"{what} schema {d['schema']} is newer than this launcher reads ({newest}); upgrade launcher")
    names = {f.name for f in dataclasses.fields(cls)} - {"extra"}
    return {k: v for k, v in d.items() if k in names and v is not None}, {k: v for k, v in d.items() if k not in names}


def set_fields(record, fields: dict[str, object], *, skip: tuple[str, ...] = ("extra", "schema")) -> None:
    """Set ``fields`` on a record by name: a field it lists takes its value, any other key goes to its ``extra``."""
    names = {f.name for f in dataclasses.fields(record)} - set(skip)
    for key, value in fields.items():
        if key in names:
            setattr(record, key, value)
        else:
            record.extra[key] = value
