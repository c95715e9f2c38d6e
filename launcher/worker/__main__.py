import sys

from launcher.rank_entry import exit_rank
from launcher.worker.main import main

if __name__ == "__main__":
    exit_rank(main(sys.argv[1:]))
