import os
import signal

import pytest

from launcher.runtime import CheckpointRequests


def test_control_file_requests_and_is_consumed(tmp_path):
    req = CheckpointRequests(tmp_path)
    assert req.local() is None and req.agreed() is None
    (tmp_path / "control").mkdir()
    (tmp_path / "control" / "checkpoint").touch()
    assert req.local() == "control file" and req.agreed() == "control file"
    req.consume()
    assert req.local() is None and not (tmp_path / "control" / "checkpoint").exists()


def test_signals_set_a_flag_and_handlers_are_restored(tmp_path):
    before = signal.getsignal(signal.SIGUSR2)
    req = CheckpointRequests(tmp_path)
    req.install()
    try:
        os.kill(os.getpid(), signal.SIGUSR2)
        assert req.local() == "SIGUSR2"
    finally:
        req.restore()
    assert signal.getsignal(signal.SIGUSR2) == before


def test_second_sigterm_exits_now(tmp_path):
    req = CheckpointRequests(tmp_path)
    req._on_signal(signal.SIGTERM, None)
    assert req.local() == "SIGTERM"
    with pytest.raises(SystemExit):
        req._on_signal(signal.SIGTERM, None)
