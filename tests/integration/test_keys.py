"""`fatura keys` as an operator uses it, and what each key scope opens on the live edge."""

from __future__ import annotations

import json
import uuid

import httpx

from fix_db import SyncPool, TenantHandle
from fix_ops import fatura
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
