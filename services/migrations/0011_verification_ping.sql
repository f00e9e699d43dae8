-- The verification ping of a newly registered endpoint is an ordinary delivery, written by the
-- edge in the registration's transaction and sent by the delivery service: the edge inserts it.

GRANT INSERT ON deliveries TO fatura_edge;
