"""One request's memo of the engine specs' terms, keyed by the Strategy fields each call actually reads.

A search scores thousands of strategies that differ only in the micro-batch and the levers, while an engine's
states, weight load and communication read a few layout fields. Rather than list those fields (and go stale the
day an engine's term starts reading a lever), each call is run once with the strategy behind a recorder: the
fields it reads, in order, with their values, key its answer, and a later strategy with the same values at
those fields gets the same answer. This is exact for terms that are pure functions
of (inputs, strategy fields, buckets), which every EngineSpec term is (launcher.engines.spec): the same values
read in the same order take the same branch, so they read the same next field and return the same number.
A term that does anything but read attributes of the strategy (passes it on whole, replaces it) is not cached.
"""

from __future__ import annotations

import copy
import dataclasses
import operator
from collections.abc import Callable

from launcher.engines import engine_spec
from launcher.engines.spec import EngineSpec
from launcher.planner.plan import Buckets, Strategy
from launcher.planner.terms import MemoryInputs

CACHED = ("states", "init_bytes", "load_bytes_per_node", "communication", "offload_s")
"""The EngineSpec terms memoized per request: those of the memory and cost models' hot loop."""

_MISS = object()


class _Recorder:
    """The strategy as a term sees it, noting each field it reads (name, value) the first time. Its layout is read
    through a recorder too, field by field ("layout.zero_stage"): a term keys on the layout fields it reads, as on
    the strategy's own, and the keys stay plain values (operator.attrgetter reads dotted names)."""

    __slots__ = ("_strategy", "_reads", "_seen", "_prefix")

    def __init__(self, strategy, reads: list | None = None, seen: set | None = None, prefix: str = "") -> None:
        self._strategy, self._reads = strategy, [] if reads is None else reads
        self._seen = set() if seen is None else seen
        self._prefix = prefix

    def __getattr__(self, name: str):
        value = getattr(self._strategy, name)
        if name == "layout" and not self._prefix:
            return _Recorder(value, self._reads, self._seen, "layout.")
        key = self._prefix + name
        if key not in self._seen:
            self._seen.add(key)
            self._reads.append((key, value))
        return value


class TracedMemo:
    """``fn(strategy, *rest)`` answers keyed by the strategy fields ``fn`` read. One memo serves one MemoryInputs
    (it lives on it: MemoryInputs.memo); ``key`` carries every other argument's value (the buckets).

    Each distinct read sequence (its field names, in order) is a signature; an answer is stored under its
    signature and the values read. A strategy whose values at a signature's fields equal a stored answer's
    takes the same path through ``fn`` (the same values read in the same order), so it gets that answer.
    """

    def __init__(self) -> None:
        self._tables: dict[tuple, list[tuple[tuple[str, ...], Callable, dict]]] = {}
        self.hits = 0
        self.misses = 0

    def call(self, key: tuple, fn: Callable, s: Strategy, *rest):
        """``fn(s, *rest)``, from the memo when an earlier strategy read the same values (mutable answers copied)."""
        tables = self._tables.get(key)
        if tables is not None:
            for _, values_of, answers in tables:
                found = answers.get(values_of(s), _MISS)
                if found is not _MISS:
                    self.hits += 1
                    return _fresh(found)
        self.misses += 1
        rec = _Recorder(s)
        try:
            answer = fn(rec, *rest)
        except Exception:  # the term did more than read fields (e.g. replaced the strategy): run it plainly
            return fn(s, *rest)
        self._insert(key, rec._reads, answer)
        return _fresh(answer)

    def _insert(self, key: tuple, reads: list[tuple[str, object]], answer) -> None:
        names = tuple(name for name, _ in reads)
        values = tuple(value for _, value in reads)
        try:
            hash(values)
        except TypeError:
            return  # not values an answer can be keyed on: left uncached
        tables = self._tables.setdefault(key, [])
        for table_names, _, answers in tables:
            if table_names == names:
                answers[values] = answer
                return
        tables.append((names, _values_of(names), {values: answer}))


def _values_of(names: tuple[str, ...]) -> Callable:
    """A strategy's values at ``names``, as a tuple (operator.attrgetter returns a lone value bare)."""
    if len(names) > 1:
        return operator.attrgetter(*names)
    if names:
        one = operator.attrgetter(names[0])
        return lambda s: (one(s),)
    return lambda s: ()


_COPIERS: dict[type, Callable | None] = {}
"""A record type -> how to copy one (None: immutable, returned as it is)."""


def _fresh(answer):
    """A mutable record (States) is copied, so a caller that adjusts its copy cannot change the memo."""
    kind = type(answer)
    try:
        copier = _COPIERS[kind]
    except KeyError:
        copier = _COPIERS[kind] = _copier(kind)
    return answer if copier is None else copier(answer)


def _copier(kind: type) -> Callable | None:
    """A shallow copier for a mutable dataclass; None for any other type."""
    if not dataclasses.is_dataclass(kind) or kind.__dataclass_params__.frozen:
        return None
    fields = dataclasses.fields(kind)
    names = tuple(f.name for f in fields)
    if (getattr(kind, "__slots__", None) == names and len(names) > 1 and not hasattr(kind, "__post_init__")
            and all(f.init and not f.kw_only for f in fields)):
        # Every field through __init__, positionally, read by one C-level getter: a quarter of shallow_copy's cost
        # (the memory model copies a memoized States per candidate it estimates).
        values = operator.attrgetter(*names)
        return lambda record: kind(*values(record))
    return shallow_copy


def shallow_copy(record):
    """copy.copy of a slots dataclass, at a tenth of its cost (its fields are set again, not reduced)."""
    cls = type(record)
    slots = getattr(cls, "__slots__", None)
    if not slots:
        return copy.copy(record)
    new = object.__new__(cls)
    for name in slots:
        object.__setattr__(new, name, getattr(record, name))
    return new


_bucket_sizes = operator.attrgetter(*Buckets.__slots__)
"""A Buckets' sizes, as a tuple (keying the memoized states)."""


class MemoSpec:
    """An engine spec whose hot terms (CACHED) are memoized for one request's MemoryInputs; the rest delegated."""

    def __init__(self, spec: EngineSpec, memo: TracedMemo) -> None:
        self._spec, self._memo = spec, memo

    def __getattr__(self, name: str):
        # Kept on the instance once read (one request's spec does not change): the cost model reads the
        # delegated terms (dequant_s, optimizer_on_host, ...) once per candidate and bucket size.
        value = self.__dict__[name] = getattr(self._spec, name)
        return value

    def states(self, inp: MemoryInputs, s: Strategy, buckets):
        """The engine's per-rank memory states (EngineSpec.states), memoized per bucket sizes."""
        key = ("states", self._spec.name, *_bucket_sizes(buckets))
        return self._memo.call(key, self._states, s, inp, buckets)

    def init_bytes(self, inp: MemoryInputs, s: Strategy) -> float:
        """The engine's device bytes while the model is built and loaded (EngineSpec.init_bytes), memoized."""
        return self._memo.call(("init", self._spec.name), self._init, s, inp)

    def load_bytes_per_node(self, inp: MemoryInputs, s: Strategy) -> float:
        """The engine's host bytes per node while loading the weights (EngineSpec.load_bytes_per_node), memoized."""
        return self._memo.call(("load", self._spec.name), self._load, s, inp)

    def communication(self, inp: MemoryInputs, s: Strategy, bucket_elems: int):
        """The engine's collectives per step (EngineSpec.communication), memoized per bucket size in elements."""
        return self._memo.call(("comm", self._spec.name, bucket_elems), self._comm, s, inp, bucket_elems)

    def offload_s(self, inp: MemoryInputs, s: Strategy) -> float:
        """The engine's offload seconds per step (EngineSpec.offload_s), memoized."""
        return self._memo.call(("offload", self._spec.name), self._offload, s, inp)

    # The strategy first, as TracedMemo.call passes it.
    def _states(self, s, inp, buckets):
        return self._spec.states(inp, s, buckets)

    def _init(self, s, inp):
        return self._spec.init_bytes(inp, s)

    def _load(self, s, inp):
        return self._spec.load_bytes_per_node(inp, s)

    def _comm(self, s, inp, bucket_elems):
        return self._spec.communication(inp, s, bucket_elems)

    def _offload(self, s, inp):
        return self._spec.offload_s(inp, s)


def spec_for(inp: MemoryInputs, s: Strategy) -> EngineSpec:
    """The engine spec of ``s``, memoized when ``inp`` carries a request's memo (launcher.planner.scoring)."""
    memo = getattr(inp, "memo", None)
    if memo is None:
        return engine_spec(s.layout.engine)
    engine = s.layout.engine
    try:
        return memo["specs"][engine]
    except KeyError:
        specs = memo.setdefault("specs", {})
        spec = specs[engine] = MemoSpec(engine_spec(engine), memo.setdefault("traced", TracedMemo()))
        return spec
