"""The job's data read, checked and counted before any rank starts (launch run) and at plan time (launch plan):
every row has what the job reads, the examples the ranks would drop are counted (and refused only when nothing
is left to train on), and the ranks get at least one step's worth of sequences. The count is a DataSummary
(launcher.records.datasummary), kept in the cache by the identity of the data and tokenizer files, so planning the same
data again reads neither."""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path

from launcher.config.job import InlineArch, Job
from launcher.config.jobfile import data_path
from launcher.errors import ConfigError
from launcher.inputs.cache import cache_dir, write_cache
from launcher.planner.duration import steps_per_epoch
from launcher.records.datasummary import DataSummary

SUMMARY_VERSION = 1
"""Bumped when what a summary counts changes, so older cached summaries are not read."""
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf", ".h5", ".msgpack", ".ckpt")
"""A model dir's files that do not decide the tokens (the others, tokenizer and templates, do)."""
LISTED_FILES = 10_000
"""Files of a data or model directory whose sizes and times make its identity; past it, no cache entry."""


def _stats(root: Path) -> list | None:
    """(name, size, mtime) of ``root`` or of every file under it; None when it cannot be listed or is too large."""
    try:
        if root.is_file():
            st = root.stat()
            return [str(root.resolve()), st.st_size, st.st_mtime_ns]
        if not root.is_dir():
            return None
        out = []
        for i, p in enumerate(sorted(root.rglob("*"))):
            if i >= LISTED_FILES:
                return None
            if p.is_file() and not p.name.endswith(WEIGHT_SUFFIXES):
                st = p.stat()
                out.append([str(p.relative_to(root)), st.st_size, st.st_mtime_ns])
        return [str(root.resolve()), out]
    except OSError:
        return None


def model_dir(job: Job) -> Path | None:
    """The job's local model dir (its tokenizer files), None for an inline architecture or a bundled config."""
    from launcher.model.build import resolve_model_dir

    return None if isinstance(job.model, InlineArch) else resolve_model_dir(job.model, job.base_dir)


def summary_key(job: Job, vocab_size: int) -> str | None:
    """The cache key of a job's data summary: the data's and the tokenizer's files (names, sizes, times) and every
    setting that changes the count; None when the data is no local file or directory (a hub id)."""
    data = _stats(data_path(job))
    if data is None:
        return None
    d = model_dir(job)
    tokenizer = _stats(d) if d is not None else None
    settings = [job.task, job.data.format, job.data.packing, job.data.text_field, job.data.label_field,
                job.data.pair_field, job.data.max_seq_len, job.data.eval_fraction, job.data.num_labels, vocab_size]
    key = json.dumps([SUMMARY_VERSION, data, tokenizer, settings], sort_keys=True, default=str)
    return hashlib.sha256(key.encode()).hexdigest()[:32]


def read_and_count(job: Job, vocab_size: int) -> DataSummary:
    """Read every row, check it (ConfigError naming the row and field), and count it as the ranks will encode it."""
    from launcher.worker.data import read_records
    from launcher.worker.formats import check_rows, fit_label_ids, row_format
    from launcher.worker.summary import summarize
    from launcher.worker.tokenizer import load_tokenizer

    rows = read_records(job.data.path)
    check_rows(rows, job.task, job.data, job.data.path)
    if job.task == "seq_cls":
        fit_label_ids(rows, job.data)  # a negative label or too few num_labels, before a rank finds it
    fmt = row_format(rows[0], job.data) if job.task == "causal_lm" else "text"
    tok = load_tokenizer(model_dir(job), vocab_size)
    return summarize(job.task, job.data, fmt, tok, rows, job.data.max_seq_len)


def data_summary(job: Job, vocab_size: int) -> DataSummary:
    """The job's data summary: from the cache when neither the data, the tokenizer nor a setting changed, else read
    and counted (read_and_count) and cached."""
    key = summary_key(job, vocab_size)
    path = cache_dir() / "data" / f"{key}.json" if key else None
    if path is not None and path.is_file():
        try:
            return DataSummary.from_json(json.loads(path.read_text()))
        except (OSError, ValueError, TypeError, KeyError):
            pass  # torn or older entry: count again
    summary = read_and_count(job, vocab_size)
    if path is not None:
        write_cache(path, summary.to_json())
    return summary


def summary_problems(job: Job, s: DataSummary) -> list[str]:
    """What the ranks could not train on: no example left after the drops, or fewer sequences than one step
    takes on every rank (the numbers, and what to change)."""
    if s.train_examples == 0:
        rows = sorted(r for d in s.dropped for r in d.rows)[:5]
        return [f"data.max_seq_len: {s.max_seq_len} tokens leave nothing to train on in any of the {s.rows} "
                f"example(s) (the prompt or the conversation before the reply fills them, or they are empty; rows "
                f"{', '.join(map(str, rows))}); raise data.max_seq_len or shorten the prompts"]
    world = (job.gpus or 1) * max(job.nodes, 1)
    per_step = job.train.global_batch_size // world
    if per_step >= 1 and steps_per_epoch(s.sequences, world_size=world, samples_per_step=per_step) < 1:
        what = "packed sequences" if s.packed else "training examples"
        return [f"data.path: {s.sequences} {what} over {world} rank(s) give {math.ceil(s.sequences / world)} per "
                f"rank, fewer than one step takes ({per_step}: train.global_batch_size "
                f"{job.train.global_batch_size} over {world} ranks); add data, lower train.global_batch_size"
                + (" or data.eval_fraction" if job.data.eval_fraction else "") + ", or use fewer ranks"]
    return []


def check_job_data(job: Job, vocab_size: int) -> DataSummary:
    """The data summary of a job the launcher's recipe will train, refused (ConfigError) when the ranks could not
    train on it."""
    summary = data_summary(job, vocab_size)
    problems = summary_problems(job, summary)
    if problems:
        raise ConfigError(problems)
    return summary
