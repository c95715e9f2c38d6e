import pytest

PROBES = ("introspect", "activations")
"""The cache's probe results (launcher.inputs.plan_inputs): keyed by the model's shape, the same whoever probed it."""


@pytest.fixture(scope="session")
def shared_probes(tmp_path_factory):
    """One probe cache for the session: every test plans the same few shapes, each probed once (seconds of CPU)."""
    root = tmp_path_factory.mktemp("calibrate-probes")
    for name in PROBES:
        (root / name).mkdir()
    return root


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch, shared_probes):
    """Calibration writes profiles into the cache: give every test its own (its probes shared, since no test here
    asserts on probing) and ignore the user's profile file."""
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700)
    for name in PROBES:
        (cache / name).symlink_to(shared_probes / name)
    monkeypatch.setenv("LAUNCHER_CACHE", str(cache))
    monkeypatch.delenv("LAUNCHER_PROFILE_FILE", raising=False)
    return cache
