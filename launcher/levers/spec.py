"""What a memory lever tells the planner: the LeverSpec interface every lever's module fills.

A lever's plan side is pure and sits at the bottom of the core layer: it imports nothing of the planner or the job
schema (they import it), and reads the request, the job and the strategy it is handed by their attributes. Its
rank side (the loss, the checkpoint wrappers, the hooks, the optimizers) lives in launcher.worker and launcher.model
and reads the plan's field. Nothing else names a lever's field: tests/test_layers.py fails on it.
"""

from __future__ import annotations

import operator
from typing import NamedTuple

from launcher.config.problem import Problem

LEVER_COUNT_MAX = 4096
"""Most loss chunks or blocks between checkpoints a job may pin (no model has more blocks; a chunk per token of a
4k sequence is already far past any saving)."""


def count_problems(spec: LeverSpec, value: int | None, low: int, words: str, example: int) -> list[Problem]:
    """A pinned count outside ``low`` to LEVER_COUNT_MAX as the job's problem: ``words`` say what the bounds mean,
    ``example`` is a value to pin instead."""
    if value is None or low <= value <= LEVER_COUNT_MAX:
        return []
    return [Problem(f"strategy.{spec.field}", f"{value!r} must be {words}; use e.g. {example}, or leave it out")]


class Shape(NamedTuple):
    """What a plan's micro-batch and checkpointing leave open to a lever: the values some levers take depend on it."""

    grad_accum_steps: int
    """Micro-batches per optimizer step."""
    activation_checkpointing: bool
    """Whether blocks are recomputed in backward (the checkpointing refinements need it on)."""


class LeverSpec:
    """One lever's plan side: its field and off value, whether it needs the job's permission, the values the search
    tries and where it applies, its words, and the pins it refuses. Subclasses set the attributes and override the
    rules that differ from the defaults; launcher.levers.LEVERS registers one instance per lever.

    The values the search tries (``values``) are also where the lever applies: the lever decision of a plan
    (launcher.planner.lever_choice) scores a lever only with a value the search could have tried for that plan, so
    a plan never lists an alternative the ranks would refuse.
    """

    field: str
    """The Strategy field, the strategy: pin and plan.json's key, all by the same name."""
    off: object
    """The value that means "off": Strategy's default, what a plan.json from before the lever means."""
    type: object
    """The field's type (a Literal for choices); its strategy: pin is ``type | None``."""
    doc: str
    """What the Strategy field holds, with its unit."""
    pin_doc: str
    """What the strategy: pin sets (the job file's documentation of the key)."""
    title: str
    """The lever in `launch plan`'s words."""
    exact: bool = True
    """True: the training math is the same with it; False: train.allow_levers must list it (``permits``)."""
    permits: tuple[str, ...] = ()
    """The train.allow_levers words that permit its non-off values (a math lever's)."""
    script: bool = False
    """A user's own script (launch --script) receives it without a change: the engine's config carries it. The
    others live in the launcher's recipes, so a script plan leaves them off unless the job pins them."""
    refines_checkpointing: bool = False
    """It chooses how activation checkpointing checkpoints: tried only with checkpointing on, off without it."""
    plan_lacks: str = ""
    """Why the chosen plan's shape excludes it where another plan of the job could use it (its values depend on the
    Shape); "" for a lever whose values do not."""

    def __init__(self) -> None:
        # C-level getters in place of the methods below: the memory and cost models read levers for every
        # candidate the search scores. A lever whose off value is False or 0 is on exactly when its value is truthy.
        self._get = self.of = operator.attrgetter(self.field)
        if self.off is False or self.off == 0:
            self.on = self._get

    def of(self, x) -> object:
        """The lever's value in ``x``: a Strategy, a LeverSetting or the strategy: pins (None there: not pinned)."""
        return self._get(x)

    def on(self, x) -> object:
        """Whether ``x`` (a Strategy or a LeverSetting) uses the lever: truthy exactly when its value is not the off
        one (the value itself where off is False or 0; ``bool()`` it for a flag)."""
        return self._get(x) != self.off

    # -- search ----------------------------------------------------------------------------------------------------
    def values(self, req, shape: Shape | None = None) -> tuple:
        """The values the search tries for this request (launcher.planner.request.PlanRequest) at a plan's
        ``shape``, off first, before the engine's support, the layout's limits, the pins and the permissions; with
        ``shape`` None, at the most permissive shape (what some plan of the job could use). Off alone: the lever
        does not apply."""
        return (self.off,)

    def pin_refused(self, req, shape: Shape, pin: object) -> bool:
        """A pinned value this shape cannot run (the search then offers nothing for it)."""
        return False

    def forces_checkpointing(self, pin: object) -> bool:
        """A pinned value that needs activation checkpointing on, where the job left checkpointing to the search."""
        return False

    def excludes(self, setting, pure_bf16_optimizers: frozenset[str]) -> bool:
        """Whether a combination of levers (a LeverSetting) is one the search leaves out because of this lever: not
        modelled together, or not paired by the engine (``pure_bf16_optimizers``, EngineSpec's)."""
        return False

    def switched_on(self, req, s, values: tuple) -> object:
        """The value the lever decision compares the chosen plan ``s`` with, among ``values``: the first other than
        ``s``'s that the job permits, else the first other one; None when ``values`` holds no other."""
        current = self.of(s)
        others = [v for v in values if v != current]
        return next((v for v in others if self.permitted(req, v)), others[0] if others else None)

    # -- permission ------------------------------------------------------------------------------------------------
    def permit_word(self, value: object) -> str | None:
        """The train.allow_levers word that permits ``value``; None where none is needed (exact, or off)."""
        if self.exact or value == self.off:
            return None
        return self.permits[0]

    def permitted(self, req, value: object) -> bool:
        """Whether the job's train.allow_levers (req.allow_levers) permits ``value``."""
        word = self.permit_word(value)
        return word is None or word in req.allow_levers

    def departure(self, value: object) -> int:
        """How far ``value`` departs from the job's training math (launcher.planner.levers.math_departure): each
        unit must buy MATH_LEVER_MARGIN of step time, and breaks ties; 0 for an exact lever or off, else 1."""
        return 0 if self.exact or value == self.off else 1

    def math_note(self, req) -> str:
        """What using the lever turns off in the job's training math, a sentence for the plan's reasons and the
        report (Plan.math_notes); "" for none."""
        return ""

    def strategy_note(self, req, s) -> str:
        """math_note for the plan's strategy ``s``, where the other levers change what this one does to the math."""
        return self.math_note(req)

    # -- words -----------------------------------------------------------------------------------------------------
    def offload_words(self, value: object) -> str:
        """What the lever at ``value`` keeps off the device, for `launch plan`'s offload line ("" for nothing)."""
        return ""

    def word(self, value: object) -> str:
        """The lever in use, a short word for Strategy.label and `launch plan`'s lever line ("" when off)."""
        return ""

    def checkpointing_words(self, value: object) -> tuple[str, str]:
        """A checkpointing refinement's words: (what Strategy.label adds after "AC", what `launch plan`'s strategy
        line adds after "activation checkpointing on"); ("", "") for the default value."""
        return "", ""

    def change_words(self, old: object, new: object, checkpointing_turned_on: bool) -> str:
        """A checkpointing refinement's change between two strategies, as the fallback ladder says it ("" for none)."""
        return ""

    # -- the job ---------------------------------------------------------------------------------------------------
    def pin_problems(self, job) -> list:
        """The problems (launcher.config.problem.Problem) of the job's pin of this lever with the rest of the job:
        a value out of range, or one the job's other settings exclude."""
        return []

    def request_problem(self, req) -> str:
        """Why the request's pin cannot be planned at all (a ConfigError's line), "" when it can."""
        return ""
