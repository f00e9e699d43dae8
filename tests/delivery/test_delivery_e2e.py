"""Deliveries end to end: the edge, the delivery worker and scheduler, and the reference ERP as real
processes, on real PostgreSQL and RabbitMQ. Faults are armed on the ERP at run time."""

from __future__ import annotations

import json
import time
import uuid
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest
import standardwebhooks

from fix_db import SyncPool
from fix_delivery import (
    Erp,
    Jobs,
    Receiver,
    RegisterFn,
    StartProcess,
    count_extraction_work,
    deliveries,
    settled,
    wait_for,
)
from fix_processes import ServiceProcess
from services.common import events


@pytest.fixture(autouse=True)
def _clean_erp(erp: Erp) -> Any:
    erp.clear()
    yield
    erp.clear()


def _applied(erp: Erp, job_id: uuid.UUID) -> dict[str, Any]:
    entry: dict[str, Any] = wait_for(lambda: erp.ledger(job_id), 20, f"job {job_id} in the ERP ledger")
    return entry


def test_a_finished_job_reaches_the_erp_once_signed_and_every_attempt_is_recorded(
    worker: ServiceProcess, erp: Erp, register: RegisterFn, jobs: Jobs, dclient: httpx.Client
) -> None:
    # Given a tenant whose endpoint is the ERP (the registration ping verified it)
    endpoint = register(erp.webhook_url)
    assert endpoint.body["verified"] is True
    assert endpoint.body["verification"] == {"delivered": True, "http_status": 200, "error": None}
    # When one of its jobs completes
    job_id = jobs.submit(endpoint.tenant)
    jobs.complete(endpoint.tenant, job_id)
    # Then the ERP applies it once, and the delivery shows one 2xx attempt
    entry = _applied(erp, job_id)
    assert entry["state"] == "SUCCEEDED" and entry["effects"] == 1
    delivery = settled(dclient, endpoint.tenant, job_id)
    assert delivery["state"] == "delivered"
    assert entry["webhook_ids"] == [delivery["delivery_id"]]
    assert [(a["attempt"], a["outcome"], a["http_status"]) for a in delivery["attempts"]] == [(1, "delivered", 200)]
