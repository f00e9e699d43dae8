-- The grants 0008 (document budget) needs under the service roles of 0007, which it came too late
-- to know: the edge reads a tenant's stored bytes; the relay's housekeeping deletes documents no
-- job references. The counters themselves are written by 0008's SECURITY DEFINER trigger.

GRANT SELECT ON document_usage TO fatura_edge;
GRANT SELECT, DELETE ON documents TO fatura_relay;
GRANT SELECT ON extraction_jobs TO fatura_relay;
