"""The small error hierarchy; each class maps to one exit code of the CLI."""

from __future__ import annotations

from launcher.config.problem import Problem

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

    def __init__(self, problems: list[str | Problem] | str | Problem):
        # As given: typed (launcher.config.problem.Problem) where a rule over the job's fields found them.
        self.found: list[str | Problem] = [problems] if isinstance(problems, (str, Problem)) else list(problems)
        self.problems = [str(p) for p in self.found]
        super().__init__("\n".join(self.problems))


class NoPlanError(LauncherError):
    """No candidate fits the budget: why (``reasons``), and what would (``suggestions``), kept as given.

    The search's answer (launcher.planner.advice.NoFit); ``short_of`` is the resource the smallest candidate
    overruns: device, host_ram or nvme. The message is the reasons, then "what would fit:" and one "  - " line
    per suggestion.
    """

    exit_code = EXIT_BAD_INPUT

    def __init__(self, reasons: list[str], suggestions: list[str], *, short_of: str = "device"):
        self.reasons = list(reasons)
        self.suggestions = list(suggestions)
        self.short_of = short_of
        super().__init__("\n".join([*self.reasons, "what would fit:", *(f"  - {s}" for s in self.suggestions)]))

    def with_suggestions(self, more: list[str]) -> NoPlanError:
        """The same answer with ``more`` suggestions after the search's own."""
        return NoPlanError(self.reasons, self.suggestions + more, short_of=self.short_of)
