"""One problem with a job's values, typed: the field it is about, the rest of its line, and what else it read."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Problem:
    """A rule's verdict on the job: ``field: text`` is the line the user reads (value, rule and fix).

    The loader drops a rule's problem when a field it judged was itself refused for its type (its default stood
    in): it asks ``judges``, which reads the fields named here, never the words of the line.
    """

    field: str
    """The job field, dotted as in the job file (train.lr, model.hidden_size, slurm.setup[0]); the line starts
    with it."""
    text: str
    """The rest of the line after "field: ": the value, the rule and the fix."""
    reads: tuple[str, ...] = ()
    """The other fields whose values the rule compared this one with (model.num_heads for model.hidden_size)."""

    def __str__(self) -> str:
        return f"{self.field}: {self.text}"

    def judges(self, failed: Iterable[str]) -> bool:
        """Whether the rule read a refused field, or a field inside one (``failed``: dotted paths)."""
        names = (self.field, *self.reads)
        return any(n == f or n.startswith((f + ".", f + "[")) for f in failed for n in names)
