"""The browser tests' fixtures: Chromium (fix_browser.py) and the delivery tests' reference ERP."""

from __future__ import annotations

import sys
from pathlib import Path

# fix_delivery.py (the reference ERP fixture, the delivery settings) lives beside the delivery tests.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "delivery"))

from fix_browser import browser, page  # noqa: F401  (imported to register the fixtures)
from fix_delivery import erp, erp_secret  # noqa: F401
