"""What the job's data holds once read and tokenized as the ranks will: the format, the examples kept and dropped
(and why), the tokens trained and masked, the packed sequences and the chat template. The launcher makes it before
the launch (launcher.worker.summary); `launch plan` prints it and RUN/data.json keeps it for report.json."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path

DATA_SCHEMA = 1
"""Layout version of data.json and of report.json's ``data``."""
DATA_JSON = "data.json"
"""The run dir's copy of the summary, written before the launch (report.json takes it in at the end)."""


@dataclass(kw_only=True, slots=True)
class DroppedExamples:
    """Examples left out of training for one reason."""

    reason: str
    """prompt_fills_max_seq_len (truncation cut every trained token) or too_short (a text of fewer than 2 tokens)."""
    count: int
    """Examples dropped for it (train and eval split together)."""
    rows: list[int] = field(default_factory=list)
    """The first of them by row number in the data (1-based), at most a few."""


@dataclass(kw_only=True, slots=True)
class DataSummary:
    """The data as the ranks will train on it (counts of examples, sequences and tokens)."""

    format: str
    """text, messages or prompt_completion (seq_cls and sentence_embedding read text)."""
    task: str
    """causal_lm, seq_cls or sentence_embedding."""
    rows: int
    """Rows read."""
    train_examples: int
    """Examples kept for training (after the eval split and the drops)."""
    eval_examples: int
    """Examples kept for evaluation."""
    dropped: list[DroppedExamples] = field(default_factory=list)
    """What was left out, by reason."""
    truncated: int = 0
    """Kept training examples cut at max_seq_len."""
    tokens: int = 0
    """Tokens of the kept training examples, after truncation (both texts of a sentence_embedding pair)."""
    trained_tokens: int = 0
    """Of those, the tokens a causal-LM loss is on; 0 for seq_cls and sentence_embedding (their loss is on the
    label or the pair, not on tokens)."""
    sequences: int = 0
    """Training sequences one epoch runs: the kept examples, or fewer when packed."""
    packed: bool = False
    """data.packing: several examples per sequence."""
    chat_template: str = ""
    """The template conversations were rendered with: tokenizer (its own chat_template), chatml (the launcher's
    default), or "" for text."""
    max_seq_len: int = 0
    """Tokens per sequence, as truncated and padded."""
    schema: int = DATA_SCHEMA
    """Layout version."""

    @property
    def masked_tokens(self) -> int:
        """Tokens the model reads but the loss skips: prompts, system and user turns, template markup."""
        return self.tokens - self.trained_tokens if self.task == "causal_lm" else 0

    @property
    def dropped_count(self) -> int:
        """Examples dropped, all reasons."""
        return sum(d.count for d in self.dropped)

    def to_json(self) -> dict:
        """The summary as plain data (data.json, report.json's ``data``, `launch plan --json`)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, d: dict) -> DataSummary:
        """A summary written by this or an older launcher (a missing field takes its default); ValueError for a
        newer schema."""
        if int(d.get("schema", 1)) > DATA_SCHEMA:
            raise ValueError(f"data summary schema {d['schema']} is newer than this launcher reads ({DATA_SCHEMA})")
        known = {f.name: d[f.name] for f in dataclasses.fields(cls) if f.name in d}
        known["dropped"] = [DroppedExamples(**{k: v for k, v in x.items() if k in ("reason", "count", "rows")})
                            for x in d.get("dropped") or []]
        return cls(**known)


def read_data_summary(run_dir: Path) -> DataSummary | None:
    """RUN_DIR/data.json, or None where there is none (a --script run) or it cannot be read."""
    try:
        return DataSummary.from_json(json.loads((Path(run_dir) / DATA_JSON).read_text()))
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return None


DROP_WORDS = {
    "prompt_fills_max_seq_len": "the prompt (or the conversation before the reply) fills data.max_seq_len",
    "too_short": "fewer than 2 tokens, nothing to predict",
}
"""Why examples were dropped, in words (DroppedExamples.reason)."""
MASKED_WORDS = {"text": "the first token of each example", "messages": "system and user turns, template markup",
                "prompt_completion": "the prompts"}
"""What the masked tokens of each format are."""


def summary_lines(s: DataSummary) -> list[str]:
    """The summary in a few lines, as `launch plan` prints it (and `launch run` its drops): in words here, beside
    the type, because the session says the drops too and may not import the CLI (as launcher.planner.plan_words)."""
    template = {"tokenizer": " (chat template: the tokenizer's own)", "chatml": " (chat template: ChatML, the "
                "launcher's default: the tokenizer has none)"}.get(s.chat_template, "")
    drops = f", {s.dropped_count} dropped" if s.dropped else ""
    lines = [f"data: {s.rows} row(s) of {s.format.replace('_', '-')}{template}; {s.train_examples} training and "
             f"{s.eval_examples} eval example(s){drops}"]
    seqs = f"; {s.sequences} packed sequence(s)" if s.packed else ""
    cut = f"; {s.truncated} cut at {s.max_seq_len} tokens" if s.truncated else ""
    if s.task == "causal_lm":
        lines.append(f"  tokens: {s.trained_tokens:,} trained, {s.masked_tokens:,} masked "
                     f"({MASKED_WORDS.get(s.format, 'not trained')}){cut}{seqs}")
    else:
        lines.append(f"  tokens: {s.tokens:,} read (the loss is on the {'labels' if s.task == 'seq_cls' else 'pairs'})"
                     f"{cut}")
    lines += [f"  {dropped_words(d, s.max_seq_len)}" for d in s.dropped]
    return lines


def dropped_words(d: DroppedExamples, max_seq_len: int) -> str:
    """One reason's drops: how many, why, and the first rows."""
    why = DROP_WORDS.get(d.reason, d.reason)
    if d.reason == "prompt_fills_max_seq_len":
        why += f" {max_seq_len}"
    more = ", ..." if d.count > len(d.rows) else ""
    return f"dropped {d.count} example(s): {why} (row {', '.join(map(str, d.rows))}{more})"
