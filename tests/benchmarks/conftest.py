import sys
from pathlib import Path

# benchmarks/ is not an installed package: import it from the checkout, however pytest was started.
REPO = str(Path(__file__).resolve().parents[2])
if REPO not in sys.path:
    sys.path.insert(0, REPO)
