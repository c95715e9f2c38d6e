import pytest

from launcher.units import GB, MB, TB, GiB, format_bytes, parse_bytes


@pytest.mark.parametrize(
    "text,expected",
    [("16GB", 16 * GB), ("16GiB", 16 * GiB), ("16000MB", 16 * GB), ("0.5TB", TB // 2), ("17179869184", 16 * GiB),
     (17179869184, 16 * GiB), ("16 gb", 16 * GB), ("1.5G", int(1.5 * GB)), ("512MiB", 512 * 2**20)],
)
def test_parse_bytes_accepts_units(text, expected):
    assert parse_bytes(text) == expected


@pytest.mark.parametrize("text", ["sixteen", "16XB", "", "-4GB", "0", True, None, "16 G B"])
def test_parse_bytes_rejects_with_the_rule(text):
    with pytest.raises(ValueError, match="GB is 1e9 bytes, GiB is 2\\^30"):
        parse_bytes(text)


def test_gb_and_gib_differ():
    assert GB == 10**9 and GiB == 2**30
    assert format_bytes(16 * GB) == "16.00 GB"
    assert format_bytes(1500 * MB) == "1.50 GB"
