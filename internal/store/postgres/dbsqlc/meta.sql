-- name: LockLog :exec
SELECT pg_advisory_xact_lock(hashtext(current_schema() || '/log'));

-- name: TryLockLog :one
SELECT pg_try_advisory_xact_lock(hashtext(current_schema() || '/log'));

-- Claims take the claims lock shared, a pause or resumption exclusive, so
-- a pause waits for the claims in flight and every claim after it sees it
-- (an advisory lock: no row is written to take it).
-- name: LockClaimsShared :exec
SELECT pg_advisory_xact_lock_shared(hashtext(current_schema() || '/claims'));

-- name: LockClaimsExclusive :exec
SELECT pg_advisory_xact_lock(hashtext(current_schema() || '/claims'));

-- An added tenant's count of the tenants, a tenant's allowance compared
-- before it is changed, and its weight read before it is changed, wait
-- for the adds and changes before them.
-- name: LockTenants :exec
SELECT pg_advisory_xact_lock(hashtext(current_schema() || '/tenants'));

-- name: SettingGet :one
SELECT value FROM settings WHERE name = sqlc.arg('name');

-- name: SettingList :many
SELECT name, value FROM settings;

-- name: SettingPut :exec
INSERT INTO settings (name, value) VALUES (sqlc.arg('name'), sqlc.arg('value'))
ON CONFLICT (name) DO UPDATE SET value = excluded.value;

-- name: HostGet :one
SELECT * FROM hosts WHERE id = sqlc.arg('id');

-- name: HostList :many
SELECT * FROM hosts ORDER BY id;

-- name: HostPut :exec
INSERT INTO hosts (id, instance, url, started_at_ms, seen_at_ms, serving)
VALUES (sqlc.arg('id'), sqlc.arg('instance'), sqlc.arg('url'), sqlc.arg('started_at_ms'), sqlc.arg('seen_at_ms'), sqlc.arg('serving'))
ON CONFLICT (id) DO UPDATE SET instance = excluded.instance, url = excluded.url,
    started_at_ms = excluded.started_at_ms, seen_at_ms = excluded.seen_at_ms, serving = excluded.serving;

-- name: HostSeen :one
UPDATE hosts SET seen_at_ms = sqlc.arg('seen_at_ms') WHERE id = sqlc.arg('id') AND instance = sqlc.arg('instance') RETURNING serving;

-- A record another transaction holds (its host renewing, or a peer
-- retiring it) is passed over rather than waited for.
-- name: HostRetire :many
UPDATE hosts SET serving = 0 WHERE id = (SELECT h.id FROM hosts h
    WHERE h.id = sqlc.arg('id') AND h.instance = sqlc.arg('instance') AND h.seen_at_ms = sqlc.arg('seen_at_ms') AND h.serving = 1 FOR UPDATE SKIP LOCKED)
RETURNING id;

-- name: KernelInsert :exec
INSERT INTO kernel (id, public_key, seed, created_at_ms) VALUES (1, sqlc.arg('public_key'), sqlc.arg('seed'), sqlc.arg('created_at_ms'));

-- name: KernelGet :one
SELECT public_key, seed, created_at_ms FROM kernel WHERE id = 1;

-- name: CredentialInsert :exec
INSERT INTO credentials (name, role, sha256, created_at_ms, allowance, tenants)
VALUES (sqlc.arg('name'), sqlc.arg('role'), sqlc.arg('sha256'), sqlc.arg('created_at_ms'), sqlc.narg('allowance')::bigint, sqlc.arg('tenants'));

-- A reservation of the fleet's cost per report at a credential with an
-- allowance of its own that covers it; no row when it has none, or it
-- does not cover it.
-- name: CredentialReserve :one
UPDATE credentials SET reserved = reserved + k.cost_per_report
FROM accounting_settings k
WHERE credentials.name = sqlc.arg('name') AND credentials.allowance IS NOT NULL
    AND credentials.allowance - credentials.spent - credentials.reserved >= k.cost_per_report
RETURNING credentials.*;

-- name: CredentialMove :one
UPDATE credentials SET reserved = reserved - sqlc.arg('from_reserved'), spent = spent + sqlc.arg('to_spent')
WHERE name = sqlc.arg('name') AND reserved >= sqlc.arg('from_reserved')
RETURNING *;

-- name: CredentialGet :one
SELECT * FROM credentials WHERE name = sqlc.arg('name');

-- name: CredentialGetForUpdate :one
SELECT * FROM credentials WHERE name = sqlc.arg('name') FOR UPDATE;

-- name: CredentialList :many
SELECT * FROM credentials ORDER BY name;

-- name: CredentialUpdate :many
UPDATE credentials SET sha256 = sqlc.arg('sha256'), revoked_at_ms = sqlc.arg('revoked_at_ms') WHERE name = sqlc.arg('name') RETURNING name;

-- The lock of the shared job counts (job_counts): the host that holds it
-- counts for every host; the others do not wait for it.
-- name: TryLockCounts :one
SELECT pg_try_advisory_xact_lock(hashtext(current_schema() || '/counts'));

-- name: JobCountsSaved :one
SELECT taken_ms, counts FROM job_counts WHERE id = 1;

-- name: JobCountsSave :exec
INSERT INTO job_counts (id, taken_ms, counts) VALUES (1, sqlc.arg('taken_ms'), sqlc.arg('counts'))
ON CONFLICT (id) DO UPDATE SET taken_ms = excluded.taken_ms, counts = excluded.counts;
