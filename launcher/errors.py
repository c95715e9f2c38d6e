"""The small error hierarchy; each class maps to one exit code of the CLI."""

from __future__ import annotations

from typing import Any

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
    """No candidate fits the budget: the search's typed answer and the job fields behind it, worded only by the
    CLI (launcher.cli.render.no_fit_lines); ``str()`` is the first words alone.

    ``no_fit`` is a launcher.planner.advice.NoFit (not imported here: the planner imports this module);
    ``hints`` are the job fields behind a host-RAM or NVMe refusal (launcher.session.checks.cluster_hints).
    """

    exit_code = EXIT_BAD_INPUT

    def __init__(self, no_fit: Any, hints: list[Problem] | tuple[Problem, ...] = ()):
        self.no_fit = no_fit
        self.hints = list(hints)
        super().__init__("no plan fits the budget")

    @property
    def short_of(self) -> str:
        """The resource the smallest candidate overruns: device, host_ram or nvme."""
        return self.no_fit.short_of

    def with_hints(self, more: list[Problem]) -> NoPlanError:
        """The same answer with ``more`` hints after the ones it has."""
        return NoPlanError(self.no_fit, self.hints + list(more))
