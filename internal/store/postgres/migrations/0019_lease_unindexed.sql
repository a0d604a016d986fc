-- The PostgreSQL form of sqlite/0019_lease_unindexed.sql. With no index
-- holding the lease, a heartbeat changes nothing any index holds, so
-- PostgreSQL writes it as a HOT update: no entry in any of the jobs
-- table's indexes, the new version on the old one's page. The fill
-- factor keeps room on new pages for those versions.
DROP INDEX jobs_by_lease;
ALTER TABLE jobs SET (fillfactor = 90);
