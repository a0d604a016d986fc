-- Claims fair across tenants take each tenant's claimable jobs by
-- priority, then in the order they became claimable: one short range of
-- this index per tenant and priority, so a tenant's ten jobs behind
-- another's hundred thousand cost a claim what they would alone. It
-- replaces 0012's index, which only the claim read.
DROP INDEX jobs_claimable;
CREATE INDEX jobs_claimable ON jobs (state, tenant, priority, claimable_at_ms, position);
