"""Where promtool is (Debian's ``prometheus`` package; ``FATURA_PROMTOOL`` overrides): `make test`
and .ci/run install it when missing. Tests that need it skip, saying why, only when it is absent."""

from __future__ import annotations

import os
import shutil

import pytest


def promtool_or_skip() -> str:
    found = os.environ.get("FATURA_PROMTOOL") or shutil.which("promtool")
    if not found:
        pytest.skip(
            "promtool is not installed: `apt-get install -y prometheus` provides /usr/bin/promtool "
            "(make test installs it when it can)"
        )
    return found
