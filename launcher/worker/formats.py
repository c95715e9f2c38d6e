"""Row formats (TRL's SFTTrainer conventions) and the check that every row has what the job reads.

- ``text``: the ``data.text_field`` of each row; the loss is on every real token (today's behaviour).
- ``messages``: a list of ``{role, content}``; rendered with the tokenizer's chat template (ChatML when it has
  none) and trained on the assistant turns only.
- ``prompt_completion``: ``prompt`` and ``completion``, both strings or both message lists; trained on the
  completion only.

``data.format: auto`` takes the first row's shape: ``messages`` wins, then ``prompt`` + ``completion``, then text.
"""

from __future__ import annotations

from launcher.config.bounds import ROW_BYTES
from launcher.config.job import DataConfig
from launcher.errors import ConfigError
from launcher.units import format_bytes

FORMATS = ("text", "messages", "prompt_completion")
ROLES = ("system", "user", "assistant", "tool")

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
"""The chat template of a tokenizer that has none (and of the byte tokenizer): ChatML, as Qwen and TRL's
``clone_chat_template`` use. ``<|im_start|>role\\ncontent<|im_end|>\\n`` per message."""


def row_format(row: dict, data: DataConfig) -> str:
    """The format of ``row`` under ``data.format`` (auto: by the row's fields)."""
    if data.format != "auto":
        return data.format
    if "messages" in row:
        return "messages"
    if "prompt" in row and "completion" in row:
        return "prompt_completion"
    return "text"


def check_rows(rows: list[dict], task: str, data: DataConfig, where: str) -> None:
    """Raise one ConfigError for the first row that lacks what the job reads, or whose text is no text or past
    bounds.ROW_BYTES (1-based row number, the field)."""
    if not rows:
        raise ConfigError(f"data.path: {where!r} holds no examples; add at least one record")
    if data.packing and task != "causal_lm":
        raise ConfigError(f"data.packing: true packs causal_lm examples only, and this job is {task}; "
                          "remove data.packing")
    fmt = row_format(rows[0], data) if task == "causal_lm" else "text"
    if fmt == "text" and task == "causal_lm" and data.format == "auto" and data.text_field not in rows[0]:
        fields = ", ".join(map(str, rows[0])) or "none"
        raise ConfigError(f"data.path: row 1 of {where} has neither {data.text_field!r} (data.text_field) nor "
                          f"'messages' nor 'prompt'/'completion' (fields: {fields}); rename the field or set "
                          "data.text_field")
    for n, row in enumerate(rows, 1):
        problem = _row_problem(row, fmt, task, data) or text_problem(row, _read_fields(fmt, task, data))
        if problem:
            raise ConfigError(f"data.path: row {n} of {where}: {problem}")


def _read_fields(fmt: str, task: str, data: DataConfig) -> tuple[str, ...]:
    """The fields of a row the job reads (and tokenizes)."""
    if fmt == "messages":
        return ("messages",)
    if fmt == "prompt_completion":
        return ("prompt", "completion")
    return {"seq_cls": (data.text_field, data.label_field),
            "sentence_embedding": (data.text_field, data.pair_field)}.get(task, (data.text_field,))


def _strings(value, path: str, depth: int = 0):
    """(path, string) of every string inside a field's value (message lists hold them in dicts)."""
    if isinstance(value, str):
        yield path, value
    elif depth < 4 and isinstance(value, list):
        for i, v in enumerate(value):
            yield from _strings(v, f"{path}[{i}]", depth + 1)
    elif depth < 4 and isinstance(value, dict):
        for k, v in value.items():
            yield from _strings(v, f"{path}.{k}", depth + 1)


def text_problem(row: dict, fields: tuple[str, ...]) -> str | None:
    """Text no tokenizer takes, or too much of it: a lone UTF-16 surrogate (a JSON escape such as \\ud83d without
    its other half, which no UTF-8 holds), or the fields' strings together past bounds.ROW_BYTES."""
    size = 0
    for name in fields:
        for path, text in _strings(row.get(name), name):
            try:
                size += len(text.encode("utf-8"))
            except UnicodeEncodeError as e:
                return (f"{path} holds a lone surrogate {text[e.start]!r} at character {e.start}, which is no text "
                        "(a \\ud800-\\udfff escape without its pair); fix the escape or drop the character")
            if size > ROW_BYTES:
                return (f"the text is over the {format_bytes(ROW_BYTES)} one row may hold (4M tokens); split the "
                        "document into several rows")
    return None


def _row_problem(row: dict, fmt: str, task: str, data: DataConfig) -> str | None:
    if fmt == "messages":
        return _messages_problem(row.get("messages"), "messages", need_assistant=True)
    if fmt == "prompt_completion":
        return _prompt_completion_problem(row)
    needed = [("data.text_field", data.text_field)]
    if task == "seq_cls":
        needed.append(("data.label_field", data.label_field))
    elif task == "sentence_embedding":
        needed.append(("data.pair_field", data.pair_field))
    for key, name in needed:
        if row.get(name) is None:
            return (f"no field {name!r} ({key}; fields: {', '.join(map(str, row)) or 'none'}); fix the row or "
                    f"set {key} to the field holding it")
    return None


def _messages_problem(msgs, field: str, *, need_assistant: bool) -> str | None:
    if msgs is None:
        return f"no field {field!r}; every row of a conversational dataset needs one"
    if not isinstance(msgs, list) or not msgs:
        kind = "an empty list" if isinstance(msgs, list) else f"a {type(msgs).__name__}"
        return f"{field} is {kind}, not a list of {{role, content}} messages; write [{{\"role\": \"user\", ...}}]"
    for i, m in enumerate(msgs):
        if not isinstance(m, dict) or "role" not in m or "content" not in m:
            return f"{field}[{i}] is not a {{role, content}} object; write {{\"role\": ..., \"content\": ...}}"
        if m["role"] not in ROLES:
            return f"{field}[{i}].role {m['role']!r} is not one of {', '.join(ROLES)}; use one of them"
        if not isinstance(m["content"], str):
            return f"{field}[{i}].content is a {type(m['content']).__name__}, not a string; write the text"
    if need_assistant and not any(m["role"] == "assistant" for m in msgs):
        return f"{field} has no assistant message, so nothing to train on; add the assistant's reply"
    return None


def _prompt_completion_problem(row: dict) -> str | None:
    for name in ("prompt", "completion"):
        if row.get(name) is None:
            return f"no field {name!r}; a prompt-completion dataset needs both 'prompt' and 'completion'"
    prompt, completion = row["prompt"], row["completion"]
    if isinstance(prompt, list) or isinstance(completion, list):
        if not (isinstance(prompt, list) and isinstance(completion, list)):
            return "prompt and completion must both be strings or both be message lists; make them the same kind"
        return (_messages_problem(prompt, "prompt", need_assistant=False)
                or _messages_problem(completion, "completion", need_assistant=True))
    if not isinstance(prompt, str) or not isinstance(completion, str):
        return "prompt and completion must be strings (or message lists); write the text"
    if not completion.strip():
        return "completion is empty, so nothing to train on; write the completion or drop the row"
    return None


def is_int_label(v: object) -> bool:
    """A class label written as a whole number (an int, or a string of digits), not a bool."""
    if isinstance(v, bool):
        return False
    if isinstance(v, int):
        return True
    return isinstance(v, str) and v.strip().lstrip("-").isdigit()


def fit_label_ids(rows: list[dict], data: DataConfig) -> tuple[dict[str, int], int]:
    """seq_cls: (label text to class id, sorted so every rank agrees; num_labels) from every row's label. Integer
    labels keep their number; names are numbered in sorted order. ConfigError for a negative label or a
    data.num_labels below the classes found."""
    from launcher.worker.data import column

    raw = column(rows, data.label_field, data.path, "data.label_field")
    if all(is_int_label(v) for v in raw):
        ids = sorted({int(v) for v in raw})
        if ids[0] < 0:
            raise ConfigError(f"data.label_field: label {ids[0]} is negative; use class ids 0..n-1 or names")
        label_ids = {str(i): i for i in ids}
        found = ids[-1] + 1
    else:
        names = sorted({str(v) for v in raw})
        label_ids = {name: i for i, name in enumerate(names)}
        found = len(names)
    if data.num_labels is not None and data.num_labels < found:
        raise ConfigError(f"data.num_labels: {data.num_labels} but the data has {found} classes "
                          f"({', '.join(list(label_ids)[:10])}); raise data.num_labels or leave it out")
    return label_ids, data.num_labels or found
