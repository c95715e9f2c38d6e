"""The rule every Slurm test module follows (tests.conftest.require_cluster): skip outside CI, fail in it."""

import pytest

from tests.conftest import require_cluster


def test_a_reachable_cluster_lets_the_test_run(monkeypatch):
    monkeypatch.setenv("CI", "true")
    require_cluster(None)


def test_outside_ci_an_unreachable_cluster_skips_with_its_reason(monkeypatch):
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match="sinfo did not answer"):
        require_cluster("sinfo did not answer")


@pytest.mark.parametrize("value", ["true", "TRUE", "1"])
def test_in_ci_an_unreachable_cluster_fails(monkeypatch, value):
    monkeypatch.setenv("CI", value)
    with pytest.raises(pytest.fail.Exception, match="CI=true.*sinfo did not answer"):
        require_cluster("sinfo did not answer")
