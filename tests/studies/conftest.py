"""The study's scripts live in studies/ (outside the installed package) and import each other as scripts do."""

from __future__ import annotations

import sys
from pathlib import Path

STUDIES = Path(__file__).resolve().parents[2] / "studies"
if str(STUDIES) not in sys.path:
    sys.path.insert(0, str(STUDIES))
