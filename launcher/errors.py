"""The small error hierarchy; each class maps to one exit code of the CLI."""

from __future__ import annotations

EXIT_OK = 0
EXIT_TRAINING_FAILED = 1
EXIT_BAD_INPUT = 2
EXIT_OVER_BUDGET = 3


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
    """No candidate fits the budget; the message says what would."""

    exit_code = EXIT_BAD_INPUT


class TrainingFailed(LauncherError):
    exit_code = EXIT_TRAINING_FAILED


class OverBudget(LauncherError):
    exit_code = EXIT_OVER_BUDGET
