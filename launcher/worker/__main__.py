import os
import sys

from launcher.worker.main import main

if __name__ == "__main__":
    code = main(sys.argv[1:])
    if code != 0:
        # After a failure a peer may be gone; interpreter teardown (process-group destructors, DeepSpeed's
        # atexit hooks) can then block on it until torchrun kills us. The rank report is already written.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(0)
