import pytest

from launcher.units import GB, KB, MB, TB, GiB, format_bytes, parse_bytes


@pytest.mark.parametrize(
    "text,expected",
    # Literal byte counts, not the module's own constants: 16 GiB = 16 * 2^30 = 17_179_869_184;
    # 512 MiB = 512 * 2^20 = 536_870_912; kB and KB are both taken as 10^3 (SI, as GB is 10^9).
    [("16GB", 16_000_000_000), ("16GiB", 17_179_869_184), ("16000MB", 16_000_000_000), ("0.5TB", 500_000_000_000),
     ("17179869184", 17_179_869_184), (17179869184, 17_179_869_184), ("16 GB", 16_000_000_000),
     ("1.5GB", 1_500_000_000), ("512MiB", 536_870_912), ("4kB", 4_000), ("4KB", 4_000), ("100B", 100)],
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
    assert (KB, MB, GB, TB) == (1_000, 1_000_000, 1_000_000_000, 1_000_000_000_000)
    assert GiB == 1_073_741_824
    assert format_bytes(16 * GB) == "16.00 GB"
    assert format_bytes(1500 * MB) == "1.50 GB"


def test_two_sizes_that_would_read_the_same_give_their_bytes():
    from launcher.units import GiB, article, format_bytes_apart

    assert format_bytes_apart(80 * GB, 40 * GiB) == ("80.00 GB", "42.95 GB")
    assert format_bytes_apart(42_950_000_000, 40 * GiB) == ("42.95 GB (42950000000 bytes)",
                                                            "42.95 GB (42949672960 bytes)")
    assert [article(n) for n in ("a100-40gb", "h100-80gb", "l4", "mi300x", "rtx4090", "b200", "v100-16gb", "cpu")] == [
        "an", "an", "an", "an", "an", "a", "a", "a"]
