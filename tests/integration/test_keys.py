"""`fatura keys` as an operator uses it, and what each key scope opens on the live edge."""

from __future__ import annotations

import json
import uuid

import httpx

from fix_db import SyncPool, TenantHandle
from fix_ops import fatura
from fix_processes import SpawnFn, start_edge
from services.common.api import apikeys


def _bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def test_keys_create_prints_each_scope_once_and_stores_only_a_hash(
    base_env: dict[str, str], pool: SyncPool, tenant: TenantHandle
) -> None:
    reviewer = json.loads(
        fatura(
            "keys",
            "create",
            "--tenant",
            str(tenant.id),
            "--scope",
            "reviewer",
            "--label",
            "desk",
            env=base_env,
        ).stdout
    )
    operator = json.loads(fatura("keys", "create", "--operator", "--label", "on call", env=base_env).stdout)

    assert reviewer["scope"] == "reviewer" and reviewer["tenant_id"] == str(tenant.id)
    assert reviewer["label"] == "desk" and reviewer["revoked_at"] is None
    assert operator["scope"] == "operator" and operator["tenant_id"] is None
    with pool.connection() as conn:
        rows = conn.execute(
            "SELECT prefix, scope, tenant_id, secret_hash FROM api_keys WHERE prefix = ANY (%s)",
            ([reviewer["prefix"], operator["prefix"]],),
        ).fetchall()
    stored = {r["prefix"]: r for r in rows}
    for created in (reviewer, operator):
        assert apikeys.parse(created["api_key"]) == created["prefix"]
        assert bytes(stored[created["prefix"]]["secret_hash"]) == apikeys.digest(created["api_key"])
    assert stored[operator["prefix"]]["tenant_id"] is None


def test_keys_list_shows_prefix_scope_label_and_dates_but_never_a_secret(
    base_env: dict[str, str], tenant: TenantHandle
) -> None:
    extra = json.loads(
        fatura("keys", "create", "--tenant", str(tenant.id), "--label", "erp sync", env=base_env).stdout
    )

    listed = fatura("keys", "list", "--tenant", str(tenant.id), "--json", env=base_env).stdout
    table = fatura("keys", "list", "--tenant", str(tenant.id), env=base_env).stdout
    operators = fatura("keys", "list", "--operator", "--json", env=base_env).stdout

    keys = [json.loads(line) for line in listed.splitlines()]
    assert [k["scope"] for k in keys] == ["tenant", "tenant"]  # the first key and this one
    assert keys[1]["prefix"] == extra["prefix"] and keys[1]["label"] == "erp sync"
    assert set(keys[1]) == {"prefix", "scope", "label", "tenant_id", "created_at", "revoked_at"}
    for output in (listed, table, operators):
        assert tenant.api_key not in output and extra["api_key"] not in output
        assert extra["api_key"].split("_", 2)[2] not in output
    assert extra["prefix"] in table and "erp sync" in table
    assert all(json.loads(line)["scope"] == "operator" for line in operators.splitlines())


def test_keys_refuse_bad_requests_with_a_clear_message(
    base_env: dict[str, str], tenant: TenantHandle
) -> None:
    unknown_tenant = fatura("keys", "create", "--tenant", str(uuid.uuid4()), env=base_env, check=False)
    not_a_uuid = fatura("keys", "create", "--tenant", "acme", env=base_env, check=False)
    operator_with_scope = fatura(
        "keys", "create", "--operator", "--scope", "reviewer", env=base_env, check=False
    )
    neither = fatura("keys", "create", env=base_env, check=False)
    unknown_prefix = fatura("keys", "revoke", "zzzzzzzzzzzz", env=base_env, check=False)

    assert unknown_tenant.returncode == 2 and "there is no tenant" in unknown_tenant.stderr
    assert not_a_uuid.returncode == 2 and "not a tenant id" in not_a_uuid.stderr
    assert operator_with_scope.returncode == 2 and "--scope goes with --tenant" in operator_with_scope.stderr
    assert neither.returncode == 2 and "--tenant" in neither.stderr
    assert unknown_prefix.returncode == 2 and "no key with the prefix" in unknown_prefix.stderr


def test_each_scope_opens_only_its_own_routes_and_a_revoked_key_opens_none(
    base_env: dict[str, str], client: httpx.Client, tenant: TenantHandle
) -> None:
    operator = json.loads(fatura("keys", "create", "--operator", env=base_env).stdout)["api_key"]
    reviewer = json.loads(
        fatura("keys", "create", "--tenant", str(tenant.id), "--scope", "reviewer", env=base_env).stdout
    )["api_key"]

    answers = {
        (who, route): client.get(route, headers=_bearer(key)) if key else client.get(route)
        for who, key in (
            ("tenant", tenant.api_key),
            ("operator", operator),
            ("reviewer", reviewer),
            ("none", ""),
        )
        for route in ("/v1/extraction-jobs", "/v1/webhook-endpoints", "/v1/ops/dead-letters")
    }

    statuses = {k: r.status_code for k, r in answers.items()}
    assert statuses == {
        ("tenant", "/v1/extraction-jobs"): 200,
        ("tenant", "/v1/webhook-endpoints"): 200,
        ("tenant", "/v1/ops/dead-letters"): 403,
        ("operator", "/v1/extraction-jobs"): 403,
        ("operator", "/v1/webhook-endpoints"): 403,
        ("operator", "/v1/ops/dead-letters"): 200,
        ("reviewer", "/v1/extraction-jobs"): 403,
        ("reviewer", "/v1/webhook-endpoints"): 403,
        ("reviewer", "/v1/ops/dead-letters"): 403,
        ("none", "/v1/extraction-jobs"): 401,
        ("none", "/v1/webhook-endpoints"): 401,
        ("none", "/v1/ops/dead-letters"): 401,
    }
    wrong_scope = answers[("operator", "/v1/extraction-jobs")].json()["error"]
    assert wrong_scope["code"] == "wrong_key_scope" and wrong_scope["key_scope"] == "operator"
    assert answers[("tenant", "/v1/ops/dead-letters")].json()["error"]["required_scope"] == "operator"

    fatura("keys", "revoke", apikeys.parse(operator) or "", env=base_env)
    again = fatura("keys", "revoke", operator, env=base_env)  # the whole key works too; twice is a no-op

    assert json.loads(again.stdout)["revoked_at"] is not None
    revoked = client.get("/v1/ops/dead-letters", headers=_bearer(operator))
    assert revoked.status_code == 401 and revoked.json()["error"]["code"] == "unauthorized"


def test_a_command_that_takes_a_tenant_key_refuses_an_operator_key_with_a_message(
    base_env: dict[str, str],
) -> None:
    operator = json.loads(fatura("keys", "create", "--operator", env=base_env).stdout)["api_key"]

    result = fatura(
        "endpoints", "add", "https://erp.example/hooks", "--tenant-key", operator, env=base_env, check=False
    )

    assert result.returncode == 2 and "takes a tenant's key" in result.stderr


def test_a_rotated_key_keeps_working_through_its_grace_and_the_new_one_works_at_once(
    base_env: dict[str, str], client: httpx.Client, tenant: TenantHandle
) -> None:
    # Given a tenant key in use, rotated with a grace period
    old = tenant.api_key
    rotated = json.loads(fatura("keys", "rotate", old, "--grace", "3600", env=base_env).stdout)
    new = rotated["api_key"]
    # Then both work for now, the new key keeps the old one's scope and tenant, and the old one's
    # revocation is scheduled
    assert client.get("/v1/extraction-jobs", headers=_bearer(old)).status_code == 200
    assert client.get("/v1/extraction-jobs", headers=_bearer(new)).status_code == 200
    assert (rotated["scope"], rotated["tenant_id"]) == ("tenant", str(tenant.id))
    assert rotated["replaces"]["prefix"] == apikeys.parse(old) and rotated["replaces"]["revoked_at"]
    # And revoking the old key ends its grace at once; rotating a revoked key is refused
    fatura("keys", "revoke", old, env=base_env)
    assert client.get("/v1/extraction-jobs", headers=_bearer(old)).status_code == 401
    assert client.get("/v1/extraction-jobs", headers=_bearer(new)).status_code == 200
    refused = fatura("keys", "rotate", old, env=base_env, check=False)
    assert refused.returncode == 2 and "still valid" in refused.stderr


def test_rotating_with_no_grace_ends_the_old_key_at_once(
    base_env: dict[str, str], client: httpx.Client, tenant: TenantHandle
) -> None:
    new = json.loads(fatura("keys", "rotate", tenant.api_key, "--grace", "0", env=base_env).stdout)["api_key"]
    assert client.get("/v1/extraction-jobs", headers=_bearer(tenant.api_key)).status_code == 401
    assert client.get("/v1/extraction-jobs", headers=_bearer(new)).status_code == 200


def test_an_address_that_keeps_presenting_invalid_keys_is_blocked_for_a_while(
    spawn: SpawnFn, tenant: TenantHandle
) -> None:
    # Given an edge that blocks an address after 5 invalid keys in a minute
    edge = start_edge(spawn, workers=1, FATURA_AUTH_FAILURE_LIMIT="5", FATURA_AUTH_BLOCK_SECONDS="120")
    try:
        with httpx.Client(base_url=edge.base_url or "", timeout=10) as c:
            guesses = [
                c.get("/v1/extraction-jobs", headers=_bearer(f"fat_{'a' * 12}_{'b' * 43}")).status_code
                for _ in range(5)
            ]
            # When the same address then presents a valid key
            blocked = c.get("/v1/extraction-jobs", headers=tenant.headers)
        # Then the guesses were 401, and the address is refused for a while, valid key or not
        assert guesses == [401] * 5
        assert blocked.status_code == 429
        assert blocked.json()["error"]["code"] == "too_many_failed_authentications"
        assert 1 <= int(blocked.headers["Retry-After"]) <= 120
    finally:
        edge.stop()
