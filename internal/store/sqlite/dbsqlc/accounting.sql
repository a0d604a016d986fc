-- SQLite's one writer holds the whole database, so the allowance is one
-- row. A write transaction decides its reservations and settlements on it
-- in the process, with the guards, and applies them once
-- (AccountingApply, allowance.go); the CHECKs guard what is written.

-- name: AccountingInsert :exec
INSERT INTO accounting (id, allowance, spent, reserved, calls, cost_per_report)
VALUES (1, @allowance, 0, 0, 0, @cost_per_report);

-- name: AccountingGet :one
SELECT allowance, spent, reserved, calls, cost_per_report FROM accounting WHERE id = 1;

-- name: AccountingSetAllowance :one
UPDATE accounting SET allowance = @allowance WHERE id = 1
RETURNING allowance, spent, reserved, calls, cost_per_report;

-- name: AccountingApply :exec
UPDATE accounting SET reserved = reserved + @reserved, spent = spent + @spent, calls = calls + @calls WHERE id = 1;
