-- name: ScheduleInsert :exec
INSERT INTO schedules (name, spec, request, paused, next_at_ms, created_at_ms)
VALUES (sqlc.arg('name'), sqlc.arg('spec'), sqlc.arg('request'), 0, sqlc.arg('next_at_ms'), sqlc.arg('created_at_ms'));

-- name: ScheduleGet :one
SELECT * FROM schedules WHERE name = sqlc.arg('name');

-- name: ScheduleGetForUpdate :one
SELECT * FROM schedules WHERE name = sqlc.arg('name') FOR UPDATE;

-- name: ScheduleList :many
SELECT * FROM schedules ORDER BY name;

-- The schedules due at now_ms (not paused), soonest first, locked; one
-- another host's firing holds is passed over (it is firing it).
-- name: ScheduleDue :many
SELECT * FROM schedules WHERE paused = 0 AND next_at_ms <= sqlc.arg('now_ms')
ORDER BY next_at_ms, name LIMIT sqlc.arg('max') FOR UPDATE SKIP LOCKED;

-- A firing moves a schedule on, if it is still at the slot the firing
-- read; the rows it names say whether it did (a write transaction's
-- statements are pipelined, so a row count would not come back).
-- name: ScheduleAdvance :many
UPDATE schedules SET next_at_ms = sqlc.arg('next_at_ms'), last_slot_ms = sqlc.arg('last_slot_ms'), fired = fired + 1
WHERE name = sqlc.arg('name') AND next_at_ms = sqlc.arg('if_next_at_ms') AND paused = 0
RETURNING name;

-- name: ScheduleSetPaused :many
UPDATE schedules SET paused = sqlc.arg('paused'), next_at_ms = sqlc.arg('next_at_ms') WHERE name = sqlc.arg('name')
RETURNING name;

-- name: ScheduleDelete :many
DELETE FROM schedules WHERE name = sqlc.arg('name') RETURNING name;

-- Whether any schedule not paused is due at now_ms, read without a lock
-- (a host asks every second; most seconds none is).
-- name: ScheduleAnyDue :one
SELECT EXISTS (SELECT 1 FROM schedules WHERE paused = 0 AND next_at_ms <= sqlc.arg('now_ms')) AS due;
