-- name: SettingList :many
SELECT name, value FROM settings;

-- name: SettingGet :one
SELECT value FROM settings WHERE name = @name;

-- name: SettingPut :exec
INSERT INTO settings (name, value) VALUES (@name, @value)
ON CONFLICT (name) DO UPDATE SET value = excluded.value;

-- name: HostGet :one
SELECT * FROM hosts WHERE id = @id;

-- name: HostList :many
SELECT * FROM hosts ORDER BY id;

-- name: HostPut :exec
INSERT INTO hosts (id, instance, url, started_at_ms, seen_at_ms, serving)
VALUES (@id, @instance, @url, @started_at_ms, @seen_at_ms, @serving)
ON CONFLICT (id) DO UPDATE SET instance = excluded.instance, url = excluded.url,
    started_at_ms = excluded.started_at_ms, seen_at_ms = excluded.seen_at_ms, serving = excluded.serving;

-- name: HostSeen :one
UPDATE hosts SET seen_at_ms = @seen_at_ms WHERE id = @id AND instance = @instance RETURNING serving;

-- name: HostRetire :execrows
UPDATE hosts SET serving = 0
WHERE id = @id AND instance = @instance AND seen_at_ms = @seen_at_ms AND serving = 1;

-- name: KernelInsert :exec
INSERT INTO kernel (id, public_key, seed, created_at_ms) VALUES (1, @public_key, @seed, @created_at_ms);

-- name: KernelGet :one
SELECT public_key, seed, created_at_ms FROM kernel WHERE id = 1;

-- name: CredentialInsert :exec
INSERT INTO credentials (name, role, sha256, created_at_ms, allowance, tenants)
VALUES (@name, @role, @sha256, @created_at_ms, @allowance, @tenants);

-- A reservation of the fleet's cost per report at a credential with an
-- allowance of its own that covers it; no row when it has none, or it
-- does not cover it.
-- name: CredentialReserve :one
UPDATE credentials SET reserved = reserved + (SELECT a.cost_per_report FROM accounting a WHERE a.id = 1)
WHERE name = @name AND allowance IS NOT NULL
    AND allowance - spent - reserved >= (SELECT a.cost_per_report FROM accounting a WHERE a.id = 1)
RETURNING *;

-- name: CredentialMove :one
UPDATE credentials SET reserved = reserved - @from_reserved, spent = spent + @to_spent
WHERE name = @name AND reserved >= @from_reserved
RETURNING *;

-- name: CredentialGet :one
SELECT * FROM credentials WHERE name = @name;

-- name: CredentialList :many
SELECT * FROM credentials ORDER BY name;

-- name: CredentialUpdate :execrows
UPDATE credentials SET sha256 = @sha256, revoked_at_ms = @revoked_at_ms WHERE name = @name;

-- name: JobCountsSaved :one
SELECT taken_ms, counts FROM job_counts WHERE id = 1;

-- name: JobCountsSave :exec
INSERT INTO job_counts (id, taken_ms, counts) VALUES (1, @taken_ms, @counts)
ON CONFLICT (id) DO UPDATE SET taken_ms = excluded.taken_ms, counts = excluded.counts;
