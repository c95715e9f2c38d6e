"""The one way the launcher changes its own process's environment for a while and puts it back (as accelerate's
``patch_environment``): a variable set, or one a library sets inside the block, returns to its old value after, and
one that was unset is removed again."""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager


def saved_environ(names: Iterable[str]) -> dict[str, str | None]:
    """The current values of ``names`` (None: unset), for restore_environ."""
    return {name: os.environ.get(name) for name in names}


def restore_environ(saved: Mapping[str, str | None]) -> None:
    """Put each saved variable back: its old value, or unset where it was unset."""
    for name, value in saved.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


@contextmanager
def patched_environ(values: Mapping[str, str], *, also: Iterable[str] = ()) -> Iterator[None]:
    """Set ``values`` in this process's environment for the block; on leaving, those and the names in ``also``
    (variables a library sets inside the block, such as torchrun's signal list) are as they were before it."""
    saved = saved_environ([*values, *also])
    os.environ.update(values)
    try:
        yield
    finally:
        restore_environ(saved)
