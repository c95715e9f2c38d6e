"""Syntax of every value that reaches a shell script, an #SBATCH line or a submitit parameter (pure).

``shlex.quote`` keeps a value one shell word, but not one line: a newline inside the quotes ends an ``#SBATCH``
or comment line, and the rest runs as a command. sbatch's own directive parser stops at the newline too. So
every value bound for a script is checked here, when the job is loaded and again when a script is emitted:
no control characters at all, and each Slurm option's own syntax. ``slurm.setup`` is the one field that is raw
shell by design (one line per item, written into the script as given).
"""

from __future__ import annotations

import math
import re
import unicodedata

from launcher.config import bounds
from launcher.config.job import ClusterConfig, SlurmConfig
from launcher.config.load import show
from launcher.config.problem import Problem

NAME_MAX_CHARS = 256
"""Longest partition, account or QOS name taken (sinfo / sacctmgr names are short words)."""
VALUE_MAX_CHARS = 4096
"""Longest constraint expression or additional_parameters value taken; sbatch reads a directive line whole."""
KEY_MAX_CHARS = 64
"""Longest additional_parameters key (sbatch's longest long option is under 30 characters)."""
TIMEOUT_MAX_MIN = 366 * 24 * 60
"""Longest time limit taken, minutes (a year): a larger one is a unit slip (seconds, or a step count)."""

# Slurm names (PartitionName, sacctmgr account and QOS names): letters, digits, '_', '-', '.'.
_WORD = r"[A-Za-z0-9_.-]+"
NAME_RULES = {
    "partition": (re.compile(rf"{_WORD}(,{_WORD})*"), "a partition name, or several joined by commas (gpu,debug)"),
    "account": (re.compile(_WORD), "one account name: letters, digits, '_', '-' or '.'"),
    "qos": (re.compile(_WORD), "one QOS name: letters, digits, '_', '-' or '.'"),
}
# --constraint: features joined by & (and), | (or), [] (matching or), () grouping, *N counts, ! (not).
CONSTRAINT = re.compile(r"[A-Za-z0-9_.:&|,*!\[\]()-]+")
KEY = re.compile(r"[A-Za-z][A-Za-z0-9_-]*")
# sbatch's time format: minutes, minutes:seconds, hours:minutes:seconds, days-hours[:minutes[:seconds]].
SLURM_TIME = re.compile(r"(\d+(:\d+){0,2}|\d+-\d+(:\d+){0,2}|UNLIMITED|INFINITE)", re.IGNORECASE)
SLURM_MEM = re.compile(r"\d+[KMGT]?B?", re.IGNORECASE)
TIME_KEYS = ("time_min",)
"""additional_parameters keys whose value is a Slurm time."""
MEM_KEYS = ("mem_per_cpu", "mem_per_gpu")
"""additional_parameters keys whose value is a Slurm memory size."""
# Bidirectional overrides reorder what a reader sees of a line ("trojan source"); no Slurm value needs them.
_BIDI = set("\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")


def control_char(text: str) -> str | None:
    """How the first character that could break a line or hide text is described, or None when there is none."""
    for i, ch in enumerate(text):
        cat = unicodedata.category(ch)
        if cat in ("Cc", "Zl", "Zp") or ch in _BIDI:
            what = {"\n": "a newline", "\r": "a carriage return", "\t": "a tab", "\x00": "a NUL byte",
                    "\x1b": "an escape character"}.get(ch, "a control character")
            return f"{what} ({ch!r}) at character {i + 1}"
    return None


def one_line_problem(where: str, value: str, fix: str) -> Problem | None:
    """A problem when ``value`` holds a control character (newline, CR, tab, NUL, escape, ...)."""
    bad = control_char(value)
    if bad is None:
        return None
    return Problem(where, f"{show(value)} holds {bad}, and a value that reaches an #SBATCH line or a shell script "
                   f"must be one line of printable text; {fix}")


def check_shell_path(path: object, where: str) -> list[Problem]:
    """A directory path that an emitted script names (the run dir, --out): one line of printable text."""
    bad = one_line_problem(where, str(path), "choose a path without control characters")
    return [bad] if bad else []


def check_job_name(name: str) -> list[Problem]:
    """The job name reaches the script's header and Slurm's job name (slugged): no control characters."""
    bad = one_line_problem("name", name, "give the job a one-line name, e.g. name: my-finetune")
    return [bad] if bad else []


def _setup_problems(lines: list) -> list[Problem]:
    p = []
    for i, line in enumerate(lines):
        if not isinstance(line, str):
            p.append(Problem(f"slurm.setup[{i}]", f"{show(line)} must be one shell line (a string); quote it"))
            continue
        bad = control_char(line.replace("\t", " "))  # raw shell by design: only line breaks and hidden text are refused
        if bad:
            p.append(Problem(f"slurm.setup[{i}]", f"{show(line)} holds {bad}; each item is one shell line, so split "
                             "it into several items"))
    return p


def check_sizes(cfg: SlurmConfig, cluster: ClusterConfig | None = None) -> list[Problem]:
    """slurm.mem_gb and slurm.cpus_per_task within what a node can be (launcher.config.bounds) and, where the job
    gives the node's size (cluster.host_ram_per_node, cluster.cpus_per_node), within it."""
    p: list[Problem] = []
    mem, cpus = cfg.mem_gb, cfg.cpus_per_task
    node_ram = cluster.host_ram_per_node_bytes if cluster else None
    node_cpus = cluster.cpus_per_node if cluster else None
    if mem is not None and not (isinstance(mem, (int, float)) and math.isfinite(mem)
                                and bounds.HOST_RAM_GB_MIN <= mem <= bounds.HOST_RAM_GB):
        p.append(Problem("slurm.mem_gb", f"{mem!r} must be from {bounds.HOST_RAM_GB_MIN:g} to {bounds.HOST_RAM_GB} "
                         "(Slurm's GB per node; below 1 MB Slurm reads --mem=0 as the whole node, and a rank's process "
                         "alone takes ~0.5 GB); e.g. 64, or leave it out to derive it from the plan"))
    elif mem is not None and node_ram is not None and mem * 2**30 > node_ram:
        p.append(Problem("slurm.mem_gb", f"{mem!r} GB is more than cluster.host_ram_per_node ({node_ram / 2**30:.1f} "
                         "GiB), which no node could give; lower it, or leave it out to derive it from the plan",
                         reads=("cluster.host_ram_per_node",)))
    if cpus is not None and not 1 <= cpus <= bounds.CPUS_PER_NODE:
        p.append(Problem("slurm.cpus_per_task", f"{cpus!r} must be from 1 to {bounds.CPUS_PER_NODE} (CPUs on one "
                         "node); leave it out to derive it from the plan"))
    elif cpus is not None and node_cpus is not None and cpus > node_cpus:
        p.append(Problem("slurm.cpus_per_task", f"{cpus!r} is more than cluster.cpus_per_node ({node_cpus}), which "
                         "no node could give; lower it, or leave it out to derive it from the node",
                         reads=("cluster.cpus_per_node",)))
    return p


def check_slurm_values(cfg: SlurmConfig, cluster: ClusterConfig | None = None) -> list[Problem]:
    """Every value of the slurm: section that reaches a script or submitit, checked for its syntax and size (against
    the node's, given ``cluster``); one problem each."""
    p: list[Problem] = check_sizes(cfg, cluster)
    for name, (pattern, rule) in NAME_RULES.items():
        value = getattr(cfg, name)
        if value is None:
            continue
        where = f"slurm.{name}"
        bad = one_line_problem(where, value, f"give {rule}")
        if bad:
            p.append(bad)
        elif len(value) > NAME_MAX_CHARS:
            p.append(Problem(where, f"{show(value)} is {len(value)} characters, over {NAME_MAX_CHARS}; give {rule}"))
        elif not pattern.fullmatch(value):
            p.append(Problem(where, f"{show(value)} is not {rule}; use the name `sinfo -s` or `sacctmgr show "
                             f"{'assoc' if name == 'account' else name}` lists"))
    if cfg.constraint is not None:
        c = cfg.constraint
        bad = one_line_problem("slurm.constraint", c, "write the features on one line, e.g. a100&ib")
        if bad:
            p.append(bad)
        elif len(c) > VALUE_MAX_CHARS:
            p.append(Problem("slurm.constraint", f"{show(c)} is {len(c)} characters, over {VALUE_MAX_CHARS}; "
                             "name fewer features"))
        elif not CONSTRAINT.fullmatch(c) or not _balanced(c):
            p.append(Problem("slurm.constraint", f"{show(c)} is not a Slurm constraint (features of letters, digits, "
                             "'_', '-', '.', ':' joined by & | , with [] () *N !, no spaces); e.g. a100&ib or "
                             "[rack1|rack2]"))
    if cfg.timeout_min is not None and cfg.timeout_min > TIMEOUT_MAX_MIN:
        p.append(Problem("slurm.timeout_min", f"{cfg.timeout_min!r} minutes is over a year ({TIMEOUT_MAX_MIN}); "
                         "give minutes (e.g. 240), or leave it out to derive it from the plan"))
    p += _setup_problems(cfg.setup)
    for raw, value in cfg.additional_parameters.items():
        p += _extra_problems(str(raw), value)
    return p


def _extra_problems(raw: str, value: object) -> list[Problem]:
    where = f"slurm.additional_parameters.{raw}"
    bad_key = control_char(raw)
    if bad_key or len(raw) > KEY_MAX_CHARS or not KEY.fullmatch(raw):
        why = f"holds {bad_key}" if bad_key else (f"is {len(raw)} characters, over {KEY_MAX_CHARS}"
                                                   if len(raw) > KEY_MAX_CHARS else "is not an option name")
        return [Problem("slurm.additional_parameters", f"key {show(raw)} {why}; a key is an sbatch long option "
                        "without the dashes (letters, digits, '_', '-'), e.g. reservation")]
    if isinstance(value, float) and not math.isfinite(value):
        return [Problem(where, f"{value!r} must be a finite number; give the value Slurm expects")]
    if not isinstance(value, str):
        return []  # numbers, true, and the wrong types check_additional names
    bad = one_line_problem(where, value, "give the value on one line")
    if bad:
        return [bad]
    if len(value) > VALUE_MAX_CHARS:
        return [Problem(where, f"{show(value)} is {len(value)} characters, over {VALUE_MAX_CHARS}; shorten it")]
    key = raw.replace("-", "_")
    if key in TIME_KEYS and not SLURM_TIME.fullmatch(value):
        return [Problem(where, f"{show(value)} is not a Slurm time (minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM or "
                        "D-HH:MM:SS); e.g. 90 or 1-12:00:00")]
    if key in MEM_KEYS and not SLURM_MEM.fullmatch(value):
        return [Problem(where, f"{show(value)} is not a Slurm memory size (a whole number with K, M, G or T); "
                        "e.g. 8G")]
    return []


def _balanced(text: str) -> bool:
    stack: list[str] = []
    pairs = {")": "(", "]": "["}
    for ch in text:
        if ch in "([":
            stack.append(ch)
        elif ch in pairs and (not stack or stack.pop() != pairs[ch]):
            return False
    return not stack
