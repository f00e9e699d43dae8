"""The port range of each pytest process (make test runs two, with pytest-xdist).

Each process hands out the ports of the processes its tests start from a range of its own
(``FATURA_PORT_RANGE``, read by ``services.common.procs.free_port``), below the kernel's ephemeral
ports (32768 and up): a port the kernel picks can be picked again by the other process, or taken by
an outgoing connection, before its server binds it.
"""

from __future__ import annotations

from collections.abc import MutableMapping


def claim_port_range(environ: MutableMapping[str, str]) -> str:
    """Set ``FATURA_PORT_RANGE`` in ``environ`` for this pytest process; returns it.

    The xdist controller loads the conftest too and, having no worker id, takes the first range for
    itself; the workers it then starts inherit its environment, so a worker sets its own range over
    the inherited one (both workers ran in the first range until this was seen: a chaos run's
    delivery worker found its metrics port held by a process of the other worker). A run without
    xdist keeps a range given in its environment.
    """
    worker_id = environ.get("PYTEST_XDIST_WORKER")
    index = int((worker_id or "gw0").removeprefix("gw") or 0) % 6
    span = f"{20000 + 2000 * index}-{21999 + 2000 * index}"
    if worker_id is None:
        return environ.setdefault("FATURA_PORT_RANGE", span)
    environ["FATURA_PORT_RANGE"] = span
    return span
