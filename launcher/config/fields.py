"""Dataclass fields that come from a registry: a class decorator, applied under @dataclass, that inserts them.

The levers (launcher.levers) and the engines' layouts (launcher.engines) each define their own fields once; the
types that carry them (Strategy, the strategy: pins, a lever setting) get them here, in the registry's order, so
no field is written twice. Imports nothing of the launcher: the registries use it at the bottom of the core layer.
"""

from __future__ import annotations


def with_fields(fields: dict[str, tuple[object, object]], *, after: str | None = None):
    """A class decorator, under @dataclass: adds ``fields`` (name -> (type, default)), in their order, after the
    field ``after`` (else after the class's own)."""

    def add(cls: type) -> type:
        own = dict(cls.__dict__.get("__annotations__", {}))
        names = list(own)
        at = names.index(after) + 1 if after is not None else len(names)
        added = {name: kind for name, (kind, _) in fields.items()}
        cls.__annotations__ = {**{n: own[n] for n in names[:at]}, **added, **{n: own[n] for n in names[at:]}}
        for name, (_, default) in fields.items():
            setattr(cls, name, default)
        return cls

    return add
