"""The small error hierarchy; each class maps to one exit code of the CLI."""

from __future__ import annotations

EXIT_OK = 0
EXIT_TRAINING_FAILED = 1
EXIT_BAD_INPUT = 2
EXIT_OVER_BUDGET = 3
EXIT_OOM = 75
"""A rank that ran out of memory (or crossed the enforced cap) exits with this (EX_TEMPFAIL: a retry may fit)."""
EXIT_INTERRUPTED = 130
"""Ctrl-C or a signal stopped the run (128 + SIGINT), by the shell's convention."""
EXIT_BROKEN_PIPE = 141
"""stdout's reader went away (128 + SIGPIPE), by the shell's convention."""


class LauncherError(Exception):
    """Base class: the message is meant for the user, as is."""

    exit_code = EXIT_TRAINING_FAILED


class ConfigError(LauncherError):
    """Bad input: every problem found, one per line, each naming value, rule and fix."""

    exit_code = EXIT_BAD_INPUT

    def __init__(self, problems: list[str] | str):
        self.problems = [problems] if isinstance(problems, str) else list(problems)
        super().__init__("\n".join(self.problems))


class NoPlanError(LauncherError):
    """No candidate fits the budget; the message says what would.

    The message is the search's explanation (launcher.planner.search.explain_no_fit): the reason lines, then
    "what would fit:" and one "  - " line per suggestion (a caller may append more such lines).
    """

    exit_code = EXIT_BAD_INPUT

    @property
    def reasons(self) -> list[str]:
        lines = str(self).splitlines()
        head = lines[: lines.index("what would fit:")] if "what would fit:" in lines else lines
        return [ln.strip() for ln in head if ln.strip() and not ln.startswith("  - ")]

    @property
    def suggestions(self) -> list[str]:
        return [ln[4:] for ln in str(self).splitlines() if ln.startswith("  - ")]
