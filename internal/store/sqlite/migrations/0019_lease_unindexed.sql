-- A heartbeat renews a job's lease and changes nothing else, so no index
-- should hold the lease: each renewal would write an entry into it. The
-- lease sweeper finds lapsed leases among the jobs in flight through
-- jobs_by_state (claimed, running): as many as the workers hold,
-- whatever the queue.
DROP INDEX jobs_by_lease;
