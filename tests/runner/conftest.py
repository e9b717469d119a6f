"""Make the repository's packages importable without an editable install."""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
for sub in ("crds", "runners", "."):
    path = str(REPO / sub)
    if path not in sys.path:
        sys.path.insert(0, path)
