-- The claim read every master supplier of the job's tenant with every job (a json_agg in the start
-- statement), although validation looks up one: with 5,000 suppliers that is 5,000 rows built into
-- JSON, sent and parsed per job. Now each tenant has a suppliers_version, changed by every
-- transaction that writes its suppliers; the start reads only the version, and a worker keeps each
-- tenant's suppliers under the version it loaded them at (services/inference/suppliers.py),
-- reading them again only when the version moved.
--
-- The version is the writing transaction's id (64 bits, never reused), set once per transaction and
-- tenant however many rows it writes. A TRUNCATE cannot say whose rows went: it moves every tenant's.
ALTER TABLE tenants ADD COLUMN suppliers_version bigint NOT NULL DEFAULT 0;

CREATE FUNCTION fatura_suppliers_changed() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    version bigint := pg_current_xact_id()::text::bigint;
BEGIN
    IF TG_OP = 'TRUNCATE' THEN
        UPDATE tenants SET suppliers_version = version WHERE suppliers_version <> version;
        RETURN NULL;
    END IF;
    IF TG_OP IN ('INSERT', 'UPDATE') THEN
        UPDATE tenants SET suppliers_version = version WHERE id = NEW.tenant_id AND suppliers_version <> version;
    END IF;
    IF TG_OP = 'DELETE' OR (TG_OP = 'UPDATE' AND OLD.tenant_id <> NEW.tenant_id) THEN
        UPDATE tenants SET suppliers_version = version WHERE id = OLD.tenant_id AND suppliers_version <> version;
    END IF;
    RETURN NULL;
END $$;

CREATE TRIGGER suppliers_changed AFTER INSERT OR UPDATE OR DELETE ON suppliers
    FOR EACH ROW EXECUTE FUNCTION fatura_suppliers_changed();
CREATE TRIGGER suppliers_truncated AFTER TRUNCATE ON suppliers
    FOR EACH STATEMENT EXECUTE FUNCTION fatura_suppliers_changed();

-- As the counter triggers (0007): it runs as its owner, so a role that may write suppliers needs no
-- grant on tenants.
DO $$
BEGIN
    EXECUTE format('ALTER FUNCTION fatura_suppliers_changed() SECURITY DEFINER SET search_path = %I, pg_temp',
                   current_schema());
END $$;
