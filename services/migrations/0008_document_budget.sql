-- Uploads are budgeted (issue: a loop of 2 MiB uploads filled the database): each tenant has a
-- stored-bytes limit for its documents, checked in O(1) against counters a trigger keeps, and
-- documents no job references are deleted after a retention period.

ALTER TABLE tenants ADD COLUMN max_stored_bytes bigint NOT NULL DEFAULT 5368709120
    CHECK (max_stored_bytes >= 0);

-- Bytes and documents stored per tenant, sharded like admission_counters so concurrent uploads
-- rarely wait on one row; a check sums at most 16 rows.
CREATE TABLE document_usage (
    tenant_id  uuid NOT NULL,
    shard      smallint NOT NULL,
    bytes      bigint NOT NULL DEFAULT 0,
    documents  bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (tenant_id, shard)
);

INSERT INTO document_usage (tenant_id, shard, bytes, documents)
SELECT tenant_id, 0, sum(size_bytes), count(*) FROM documents GROUP BY tenant_id;

CREATE FUNCTION fatura_count_documents() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
DECLARE
    sign smallint := CASE WHEN TG_OP = 'INSERT' THEN 1 ELSE -1 END;
    doc  documents := CASE WHEN TG_OP = 'INSERT' THEN NEW ELSE OLD END;
BEGIN
    INSERT INTO document_usage AS u (tenant_id, shard, bytes, documents)
    VALUES (doc.tenant_id, pg_backend_pid() % 16, sign * doc.size_bytes, sign)
    ON CONFLICT (tenant_id, shard) DO UPDATE
        SET bytes = u.bytes + EXCLUDED.bytes, documents = u.documents + EXCLUDED.documents;
    RETURN NULL;
END $$;

CREATE TRIGGER documents_count AFTER INSERT OR DELETE ON documents
    FOR EACH ROW EXECUTE FUNCTION fatura_count_documents();

-- Which jobs reference a document: the retention sweep's anti-join, and the foreign key's own
-- check when a document is deleted.
CREATE INDEX extraction_jobs_document ON extraction_jobs (tenant_id, document_id, document_version);
CREATE INDEX documents_created ON documents (created_at);
