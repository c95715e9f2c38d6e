import pytest


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    """Calibration writes profiles into the cache: give every test its own and ignore the user's profile file."""
    monkeypatch.setenv("LAUNCHER_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("LAUNCHER_PROFILE_FILE", raising=False)
    return tmp_path / "cache"
