-- SQLite's one writer holds the whole database, so the allowance is one
-- row and every guard is part of the UPDATE that applies it.

-- name: AccountingInsert :exec
INSERT INTO accounting (id, allowance, spent, reserved, calls, cost_per_report)
VALUES (1, @allowance, 0, 0, 0, @cost_per_report);

-- name: AccountingGet :one
SELECT allowance, spent, reserved, calls, cost_per_report FROM accounting WHERE id = 1;

-- name: AccountingReserve :one
UPDATE accounting SET reserved = reserved + cost_per_report, calls = calls + 1
WHERE id = 1 AND allowance - spent - reserved >= cost_per_report
RETURNING allowance, spent, reserved, calls, cost_per_report;

-- name: AccountingMove :one
UPDATE accounting SET reserved = reserved - @from_reserved, spent = spent + @to_spent
WHERE id = 1 AND reserved >= @from_reserved
RETURNING allowance, spent, reserved, calls, cost_per_report;

-- name: AccountingSetAllowance :one
UPDATE accounting SET allowance = @allowance WHERE id = 1
RETURNING allowance, spent, reserved, calls, cost_per_report;
