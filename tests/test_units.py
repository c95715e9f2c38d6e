import pytest

from launcher.units import GB, KB, MB, TB, GiB, format_bytes, parse_bytes


@pytest.mark.parametrize(
    "text,expected",
    [("16GB", 16 * GB), ("16GiB", 16 * GiB), ("16000MB", 16 * GB), ("0.5TB", TB // 2), ("17179869184", 16 * GiB),
     (17179869184, 16 * GiB), ("16 GB", 16 * GB), ("1.5GB", int(1.5 * GB)), ("512MiB", 512 * 2**20),
     ("4kB", 4 * KB), ("4KB", 4 * KB), ("100B", 100)],
)
def test_parse_bytes_accepts_units(text, expected):
    assert parse_bytes(text) == expected


@pytest.mark.parametrize("text", ["sixteen", "16XB", "", "-4GB", "0", True, None, "16 G B"])
def test_parse_bytes_rejects_with_the_rule(text):
    with pytest.raises(ValueError, match="GB is 1e9 bytes, GiB is 2\\^30"):
        parse_bytes(text)


@pytest.mark.parametrize("text,question,fix", [
    ("16G", "GB (10^9) or GiB (2^30)?", "write 16GB or 16GiB"),
    ("16Gb", "GB (10^9) or GiB (2^30)?", "write 16GB or 16GiB"),
    ("16g", "GB (10^9) or GiB (2^30)?", "write 16GB or 16GiB"),
    ("16 gb", "GB (10^9) or GiB (2^30)?", "write 16GB or 16GiB"),
    ("1.5gib", "GB (10^9) or GiB (2^30)?", "write 1.5GB or 1.5GiB"),
    ("512M", "MB (10^6) or MiB (2^20)?", "write 512MB or 512MiB"),
    ("2T", "TB (10^12) or TiB (2^40)?", "write 2TB or 2TiB"),
    ("64k", "kB (10^3) or KiB (2^10)?", "write 64kB or 64KiB"),
])
def test_an_ambiguous_unit_asks_which_one(text, question, fix):
    with pytest.raises(ValueError) as e:
        parse_bytes(text)
    msg = str(e.value)
    assert msg.startswith(f"{text!r} is ambiguous: ") and question in msg and fix in msg


def test_gb_and_gib_differ():
    assert GB == 10**9 and GiB == 2**30
    assert format_bytes(16 * GB) == "16.00 GB"
    assert format_bytes(1500 * MB) == "1.50 GB"
