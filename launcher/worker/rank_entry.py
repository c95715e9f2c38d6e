"""The command torchrun starts on every rank: send output to the rank's log, then run the worker or script.

    python -m launcher.worker.rank_entry RUN_DIR [--script PATH -- ARGS...]
"""

from __future__ import annotations

import os
import sys
from pathlib import Path


def redirect_output(run_dir: Path, rank: int) -> None:
    """stdout and stderr to logs/rank-K.log, 0600 and redacted as written (launcher.files.ranklog)."""
    from launcher.files.ranklog import log_fd

    fd = log_fd(run_dir / "logs" / f"rank-{rank}.log")
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)


def bind_to_launcher() -> None:
    """Tie this rank's life to the process that started it: the kernel SIGKILLs it when torchrun's agent (the
    launch process, or torchrun on a node) dies, even by SIGKILL, so no rank outlives its launcher; and it adopts
    its orphaned descendants, so exit_rank finds every process it started (launcher.processes.procs)."""
    from launcher.processes.procs import become_subreaper, die_with_parent
    from launcher.processes.rankenv import agent_pid

    die_with_parent(expected_parent=agent_pid())
    become_subreaper()


def main(argv: list[str]) -> None:
    """One rank: output to its log, then the built-in worker or the user's --script; exits with its code."""
    bind_to_launcher()
    run_dir = Path(argv[0])
    rank = int(os.environ.get("RANK", "0"))
    redirect_output(run_dir, rank)
    from launcher.processes.rankenv import use_local_tools

    # On the node the rank runs on, before the worker or a script loads DeepSpeed's ops: the op cache's ninja.
    use_local_tools()
    try:
        if len(argv) > 2 and argv[1] == "--script":
            script, args = argv[2], argv[3:]
            if args[:1] == ["--"]:
                args = args[1:]
            from launcher.runtime.script import run_script

            code = run_script(script, args)
        else:
            from launcher.worker.main import main as worker_main

            code = worker_main([str(run_dir)])
    except BaseException:  # noqa: BLE001 - whatever escaped (a rank file that could not be written) still leaves here
        import traceback

        traceback.print_exc()
        code = 1
    exit_rank(code)


def exit_rank(code: int) -> None:
    """End a rank process with ``code``, never through the interpreter's own teardown.

    After a failure a peer may be gone, and teardown (process-group destructors, DeepSpeed's atexit hooks) can
    block on it until torchrun kills us; the rank report is already written, so a failed rank leaves at once.
    A finished rank runs the atexit handlers (a user script's among them: a tracker's final sync, a log flush),
    then leaves before C++ static destruction: a gloo rank whose process group was destroyed was seen to abort
    there ("terminate called without an active exception", SIGABRT after a clean run; seen once, on a 2-rank
    Slurm run of the suite), which turned a finished run into a failed one.

    Whatever the rank started and left behind (a --script's child, a daemonized helper) ends with it, so a finished
    run leaves no process; only the log's redactor is kept, which ends once it has written the last bytes."""
    sys.stdout.flush()
    sys.stderr.flush()
    if not code:
        import atexit
        import logging

        atexit._run_exitfuncs()
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
    from launcher.files.ranklog import redactor_pids
    from launcher.processes.procs import end_descendants

    end_descendants(keep=redactor_pids())
    os._exit(code)

if __name__ == "__main__":
    main(sys.argv[1:])
