"""The command torchrun starts on every rank: send output to the rank's log, then run the worker or script.

    python -m launcher.rank_entry RUN_DIR [--script PATH -- ARGS...]
"""

from __future__ import annotations

import os
import sys
from pathlib import Path


def redirect_output(run_dir: Path, rank: int) -> None:
    """stdout and stderr to logs/rank-K.log, 0600 and redacted as written (launcher.ranklog)."""
    from launcher.ranklog import log_fd

    fd = log_fd(run_dir / "logs" / f"rank-{rank}.log")
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)


def main(argv: list[str]) -> None:
    run_dir = Path(argv[0])
    rank = int(os.environ.get("RANK", "0"))
    redirect_output(run_dir, rank)
    if len(argv) > 2 and argv[1] == "--script":
        script, args = argv[2], argv[3:]
        if args[:1] == ["--"]:
            args = args[1:]
        from launcher.runtime.script import run_script

        code = run_script(script, args)
        if code:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
        return
    from launcher.worker.main import main as worker_main

    code = worker_main([str(run_dir)])
    if code:
        # A failed rank must not block in interpreter teardown on a peer that is gone (see launcher.worker).
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


if __name__ == "__main__":
    main(sys.argv[1:])
