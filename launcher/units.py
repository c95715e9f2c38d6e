"""Byte units, defined once for the whole package.

NOTE: GB (gigabyte) is 1000**3 and GiB (gibibyte) is 1024**3. GPU vendors sell
"80GB" cards that hold 80 GiB-ish of addressable memory; we never guess: the
suffix the user types is the unit we use.
"""

from __future__ import annotations

import re

KB = 1000
MB = 1000**2
GB = 1000**3
TB = 1000**4
KiB = 1024
MiB = 1024**2
GiB = 1024**3
TiB = 1024**4

_SUFFIX_BYTES = {
    "": 1,
    "B": 1,
    "kB": KB,
    "KB": KB,
    "MB": MB,
    "GB": GB,
    "TB": TB,
    "KiB": KiB,
    "MiB": MiB,
    "GiB": GiB,
    "TiB": TiB,
}
"""The units a size may carry, spelled exactly: the byte is a capital B, the binary ones carry an i."""

_BYTES_RE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([A-Za-z]*)\s*$")

BYTES_HELP = (
    "sizes take a unit: 16GB, 16GiB, 16000MB, 0.5TB or plain bytes; GB is 1e9 bytes, GiB is 2^30 bytes"
)


_POWERS = {"K": (3, 10), "M": (6, 20), "G": (9, 30), "T": (12, 40)}
"""Unit letter to its decimal and binary exponents: kB = 10^3 against KiB = 2^10, and so on."""


def _ambiguous(number: str, suffix: str) -> str | None:
    """Why a unit such as G, Gb, g or gib is refused: Slurm reads 16G as GiB, disk vendors as GB, and a
    lowercase b is a bit. None when the suffix is no unit at all (the generic message applies then)."""
    letter = suffix[:1].upper()
    if letter not in _POWERS or suffix[1:].lower() not in ("", "b", "i", "ib"):
        return None
    dec, binary = ("kB" if letter == "K" else f"{letter}B"), f"{letter}iB"
    ten, two = _POWERS[letter]
    return f"{dec} (10^{ten}) or {binary} (2^{two})? write {number}{dec} or {number}{binary}"


def parse_bytes(value: object) -> int:
    """Parse '16GB', '16GiB', '0.5TB', 17179869184 into a byte count.

    Raises ValueError with the rule and an example when the text is not a size, and asks "GB (10^9) or
    GiB (2^30)?" for a unit that could be either (16G, 16Gb, 16g).
    """
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is not a size; {BYTES_HELP}")
    if isinstance(value, int):
        n = value
    elif isinstance(value, float):
        n = int(value)
    elif isinstance(value, str):
        m = _BYTES_RE.match(value)
        if m and m.group(2) not in _SUFFIX_BYTES:
            why = _ambiguous(m.group(1), m.group(2))
            if why:
                raise ValueError(f"{value!r} is ambiguous: {why}")
        if not m or m.group(2) not in _SUFFIX_BYTES:
            raise ValueError(f"{value!r} is not a size; {BYTES_HELP}")
        n = int(float(m.group(1)) * _SUFFIX_BYTES[m.group(2)])
    else:
        raise ValueError(f"{value!r} is not a size; {BYTES_HELP}")
    if n <= 0:
        raise ValueError(f"{value!r} must be a positive size; {BYTES_HELP}")
    return n


def decimal_unit(n: float) -> tuple[str, float]:
    """The largest decimal unit (TB, GB, MB, KB) that ``n`` bytes reach, or ("B", 1) below a KB."""
    for unit, size in (("TB", TB), ("GB", GB), ("MB", MB), ("KB", KB)):
        if abs(n) >= size:
            return unit, size
    return "B", 1


def format_bytes(n: float) -> str:
    """Human-readable bytes in decimal units (GB = 1e9), matching what users type."""
    unit, size = decimal_unit(n)
    if unit == "B":
        return f"{int(n)} B"
    return f"{n / size:.2f} {unit}"


def format_bytes_apart(a: float, b: float) -> tuple[str, str]:
    """format_bytes of two sizes a message compares; where both would read the same (42.95 GB against 42.95 GB),
    each also gives its exact bytes, so the message never says one is more than an equal-looking other."""
    sa, sb = format_bytes(a), format_bytes(b)
    if sa == sb and a != b:
        return f"{sa} ({int(a)} bytes)", f"{sb} ({int(b)} bytes)"
    return sa, sb


def article(name: str) -> str:
    """'a' or 'an' before a hardware name as it is read aloud, letter by letter: an A100, an H100, an L4, an MI300X,
    an RTX 4090, but a B200, a V100, a CPU (the letters whose names start with a vowel sound take 'an')."""
    return "an" if name[:1].lower() in "aefhilmnorsx" else "a"


def format_duration(seconds: float) -> str:
    """Seconds as a person reads a wait: 45 s, 12 min, 3.5 h, 30.1 days (one unit, the largest that reads well)."""
    s = max(0.0, float(seconds))
    if s < 90:
        return f"{s:.0f} s"
    if s < 90 * 60:
        return f"{s / 60:.0f} min"
    if s < 48 * 3600:
        return f"{s / 3600:.1f} h"
    return f"{s / 86400:.1f} days"
