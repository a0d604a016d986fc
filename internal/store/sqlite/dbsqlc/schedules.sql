-- name: ScheduleInsert :exec
INSERT INTO schedules (name, spec, request, paused, next_at_ms, created_at_ms)
VALUES (@name, @spec, @request, 0, @next_at_ms, @created_at_ms);

-- name: ScheduleGet :one
SELECT * FROM schedules WHERE name = @name;

-- name: ScheduleList :many
SELECT * FROM schedules ORDER BY name;

-- The schedules due at now_ms (not paused), soonest first.
-- name: ScheduleDue :many
SELECT * FROM schedules WHERE paused = 0 AND next_at_ms <= @now_ms ORDER BY next_at_ms, name LIMIT @max;

-- A firing moves a schedule on, if it is still at the slot the firing read.
-- name: ScheduleAdvance :execrows
UPDATE schedules SET next_at_ms = @next_at_ms, last_slot_ms = @last_slot_ms, fired = fired + 1
WHERE name = @name AND next_at_ms = @if_next_at_ms AND paused = 0;

-- name: ScheduleSetPaused :execrows
UPDATE schedules SET paused = @paused, next_at_ms = @next_at_ms WHERE name = @name;

-- name: ScheduleDelete :execrows
DELETE FROM schedules WHERE name = @name;

-- Whether any schedule not paused is due at now_ms, read without a lock
-- (a host asks every second; most seconds none is).
-- name: ScheduleAnyDue :one
SELECT EXISTS (SELECT 1 FROM schedules WHERE paused = 0 AND next_at_ms <= @now_ms) AS due;
