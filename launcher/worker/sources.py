"""Where a job's rows come from: a local file, a ``save_to_disk`` directory, or a hub dataset in the local cache.

JSON Lines and CSV keep the launcher's own reader: it names the line of a malformed record, which pyarrow's
JSON reader does not. Everything else goes through the ``datasets`` library, read in place (memory-mapped Arrow,
parquet tables) so that checking a file before launch writes nothing. A hub id is loaded offline from the local
Hugging Face cache; a dataset that is not there is refused with the command that downloads it.
"""

from __future__ import annotations

import csv
import json
import os
from pathlib import Path

from launcher.config.bounds import ROW_BYTES
from launcher.config.datasource import download_line, looks_like_hub_id
from launcher.errors import ConfigError
from launcher.files.fsutil import not_a_file
from launcher.model.offline import hub_offline
from launcher.units import format_bytes


def _datasets():
    """The ``datasets`` library, imported only by the readers that need it (a JSON Lines or CSV job never
    imports it: ~1 s per process), with its progress bars off: the launcher's stderr holds the plan and errors."""
    import datasets

    datasets.disable_progress_bars()
    return datasets


class DataNotFound(ConfigError):
    """The data is not on this machine: no such local path, and no hub dataset of that name in the local cache.
    `launch plan` plans without it (launch run refuses, as for any bad input)."""


def read_records(path: str | Path) -> list[dict]:
    """Every row of the job's data as a dict: local file, save_to_disk dir, or a cached hub dataset id."""
    raw = str(path)
    p = Path(raw).expanduser()
    if p.is_dir():
        return _from_disk(p)
    if not p.exists():
        if looks_like_hub_id(raw):
            return _from_hub(raw)
        raise DataNotFound(f"data.path: {raw!r} does not exist; point it at a local .jsonl, .csv or .parquet file, "
                          "a save_to_disk directory, or a hub dataset id in the local cache")
    kind = not_a_file(p)
    if kind:  # a FIFO or a device: reading it could block or never end
        raise ConfigError(f"data.path: {raw!r} is {kind}, not a data file; give the path of a regular file")
    suffix = p.suffix.lower()
    if suffix in (".jsonl", ".ndjson") or (suffix == ".json" and not _json_document(p)):
        return _read_jsonl(p)
    if suffix in (".csv", ".tsv"):
        try:
            with open(p, newline="", encoding="utf-8") as f:
                return list(csv.DictReader(f, delimiter="\t" if suffix == ".tsv" else ","))
        except UnicodeDecodeError as e:
            raise ConfigError(f"data.path: {str(p)!r} is not UTF-8 text (byte {e.start} of a chunk); save it as "
                              "UTF-8") from None
        except csv.Error as e:
            raise ConfigError(f"data.path: {str(p)!r} is not a CSV file the reader takes ({e}); fix the row it "
                              "names") from None
    if suffix == ".json":
        return _read_json_document(p)
    if suffix == ".parquet":
        return _read_parquet(p)
    if suffix == ".arrow":
        return _read_arrow(p)
    raise ConfigError(f"data.path: {raw!r} has extension {suffix!r}; use .jsonl, .json, .csv, .parquet or .arrow, "
                      "or a directory written by save_to_disk")


def _read_jsonl(p: Path) -> list[dict]:
    """One object per line; a line past bounds.ROW_BYTES is refused before it is read whole, a line that is not
    UTF-8 or not a JSON object is named by its number."""
    rows = []
    with p.open("rb") as f:
        n = 0
        while raw := f.readline(ROW_BYTES + 2):
            n += 1
            if len(raw) > ROW_BYTES:
                raise ConfigError(f"data.path: {p}:{n}: the row is over the {format_bytes(ROW_BYTES)} one row may "
                                  "hold (4M tokens of text); split the document into several rows")
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise ConfigError(f"data.path: {p}:{n}: not UTF-8 text (byte {e.start} of the line); save the file "
                                  "as UTF-8") from None
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise ConfigError(f"data.path: {p}:{n}: not JSON ({e.msg}); write one JSON object per line") from None
            except RecursionError:
                raise ConfigError(f"data.path: {p}:{n}: nests too deeply to be a row; write one flat JSON object "
                                  "per line") from None
            if not isinstance(row, dict):
                raise ConfigError(f"data.path: {p}:{n}: a JSON {type(row).__name__}, not an object; write {{...}}")
            rows.append(row)
    return rows


def _json_document(p: Path) -> bool:
    """A .json file holding one document (a list of rows) rather than JSON Lines."""
    with p.open("rb") as f:
        head = f.read(4096).lstrip()
    return head.startswith(b"[")


def _read_json_document(p: Path) -> list[dict]:
    try:
        doc = json.loads(p.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, RecursionError) as e:
        why = f"not UTF-8 text (byte {e.start})" if isinstance(e, UnicodeDecodeError) else "nests too deeply"
        raise ConfigError(f"data.path: {p}: {why}; write a UTF-8 list of objects or JSON Lines") from None
    except json.JSONDecodeError as e:
        raise ConfigError(f"data.path: {p}:{e.lineno}: not JSON ({e.msg}); write a list of objects or JSON Lines") \
            from None
    if not isinstance(doc, list):
        raise ConfigError(f"data.path: {p}: a JSON {type(doc).__name__}, not a list of rows; write [{{...}}, ...] "
                          "or JSON Lines")
    bad = next((i for i, r in enumerate(doc) if not isinstance(r, dict)), None)
    if bad is not None:
        raise ConfigError(f"data.path: {p}: row {bad + 1} is a JSON {type(doc[bad]).__name__}, not an object; "
                          "write a list of {...} objects")
    return doc


def _rows(ds) -> list[dict]:
    return [dict(r) for r in ds]


def _read_parquet(p: Path) -> list[dict]:
    import pyarrow.parquet as pq

    Dataset = _datasets().Dataset

    try:
        table = pq.read_table(p)
    except Exception as e:  # noqa: BLE001 - pyarrow raises several types for a damaged file
        raise ConfigError(f"data.path: {str(p)!r} is not a readable parquet file ({_first_line(e)}); "
                          "write it again with pandas.to_parquet or Dataset.to_parquet") from None
    return _rows(Dataset(table))


def _read_arrow(p: Path) -> list[dict]:
    Dataset = _datasets().Dataset

    try:
        return _rows(Dataset.from_file(str(p), in_memory=False))
    except Exception as e:  # noqa: BLE001 - not an Arrow stream (Dataset.from_file reads the stream format)
        raise ConfigError(f"data.path: {str(p)!r} is not an Arrow stream file datasets can read ({_first_line(e)}); "
                          "give the data-*.arrow file of a saved dataset, or its save_to_disk directory") from None


def _from_disk(p: Path) -> list[dict]:
    """A ``save_to_disk`` directory: a Dataset (state.json) or a DatasetDict (dataset_dict.json, its train split)."""
    datasets = _datasets()
    DatasetDict, load_from_disk = datasets.DatasetDict, datasets.load_from_disk

    if not ((p / "state.json").is_file() or (p / "dataset_dict.json").is_file()):
        raise ConfigError(f"data.path: {str(p)!r} is a directory without state.json or dataset_dict.json, so not "
                          "one written by Dataset.save_to_disk; save it again, or point data.path at a file")
    try:
        ds = load_from_disk(str(p))
    except Exception as e:  # noqa: BLE001 - a damaged save raises FileNotFoundError, ValueError, ArrowInvalid...
        raise ConfigError(f"data.path: {str(p)!r} cannot be loaded by datasets.load_from_disk ({_first_line(e)}); "
                          "save the dataset again") from None
    if isinstance(ds, DatasetDict):
        ds = _train_split(ds, str(p))
    return _rows(ds)


def _train_split(dd, where: str):
    if "train" in dd:
        return dd["train"]
    if len(dd) == 1:
        return next(iter(dd.values()))
    raise ConfigError(f"data.path: {where!r} holds splits {', '.join(dd)} and none is 'train'; save the split to "
                      "train on alone, or name it train")


def _from_hub(repo_id: str) -> list[dict]:
    """A hub dataset, offline: the snapshot ``huggingface-cli download --repo-type dataset ID`` left in the hub
    cache (read as a local folder: its data files, split by name), else a copy ``load_dataset`` prepared before."""
    hub_offline()  # before datasets' import reads HF_DATASETS_OFFLINE
    datasets = _datasets()
    DatasetDict, load_dataset = datasets.DatasetDict, datasets.load_dataset
    from huggingface_hub import snapshot_download

    try:
        try:
            snapshot = snapshot_download(repo_id, repo_type="dataset", local_files_only=True,
                                         cache_dir=_hf_cache("HF_HUB_CACHE", "hub"))
        except Exception:  # noqa: BLE001 - not in the hub cache: datasets' own cache may still hold it
            ds = load_dataset(repo_id, cache_dir=_hf_cache("HF_DATASETS_CACHE", "datasets"))
        else:
            ds = load_dataset(snapshot, cache_dir=_hf_cache("HF_DATASETS_CACHE", "datasets"))
    except Exception as e:  # noqa: BLE001 - offline misses surface as ConnectionError, FileNotFoundError, ...
        raise DataNotFound(f"data.path: {repo_id!r} is no local path and no dataset in the local Hugging Face cache "
                          f"({_first_line(e)}); download it first: {download_line(repo_id)}") from None
    if isinstance(ds, DatasetDict):
        ds = _train_split(ds, repo_id)
    return _rows(ds)


def _hf_cache(var: str, sub: str) -> str:
    """The cache dir as the environment names it now (huggingface_hub reads it once, at import)."""
    if os.environ.get(var):
        return os.environ[var]
    home = os.environ.get("HF_HOME") or os.path.join(os.environ.get("XDG_CACHE_HOME", "~/.cache"), "huggingface")
    return os.path.join(os.path.expanduser(home), sub)


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return (text[0][:200] if text else type(e).__name__)
