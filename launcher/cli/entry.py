"""The `launch` console script and `python -m launcher`: run the CLI, then leave without interpreter teardown.

By the time main() returns, every file the launcher writes is written atomically and closed, and no thread of
ours is left. What interpreter teardown would still do is finalize torch, matplotlib and DeepSpeed's modules:
0.7 s measured on the 2-core dev VM, all of it between the verdict and the shell prompt
(benchmarks/results/overhead.md). In-process callers (the tests) use launcher.cli.main.main and keep teardown.
"""

from __future__ import annotations

import logging
import os
import sys


def main() -> None:
    """The `launch` console script: run the CLI and exit with its code, quietly on a closed pipe (141) and with
    argparse's codes for --help and usage errors."""
    from launcher.cli.main import main as launch_main
    from launcher.errors import EXIT_BROKEN_PIPE

    broken_pipe = EXIT_BROKEN_PIPE  # 128 + SIGPIPE: what a shell reports for a writer whose reader left
    try:
        code = launch_main()
    except SystemExit as e:  # argparse's --help and usage errors
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        if isinstance(e.code, str):
            print(e.code, file=sys.stderr)
    except BrokenPipeError:
        # The reader went away (launch plan | head): say so the way a shell would, not with a traceback.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        code = broken_pipe
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BrokenPipeError:
            # Output still buffered could not be delivered: not a success, but a real failure's code wins.
            code = code or broken_pipe
        except (OSError, ValueError):  # a closed stream: nothing more can reach it
            pass
    os._exit(code)


if __name__ == "__main__":
    main()
