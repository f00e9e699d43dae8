"""The acceptance service's named SQL, loaded once from ``sql/acceptance.sql``.

``accept_job`` embeds the unit of work's own job-event and outbox-event inserts
(``uow.change_ctes``), so the fast single-statement acceptance and every other state change are
written by one definition.
"""

from __future__ import annotations

from pathlib import Path

from services.common.queries import load_queries
from services.common.uow import change_ctes

Q = load_queries(Path(__file__).with_name("sql") / "acceptance.sql")
Q["accept_job"] = Q["accept_job"].replace("{change_ctes}", change_ctes("job"))
