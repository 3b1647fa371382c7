import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # `benchmarks` is a top-level directory of the repository, not an installed package
    sys.path.insert(0, str(ROOT))
