// Package budget is the shared allowance (SPEC section 5): reservation at
// admission, settlement into spent at publication (or cancellation, or
// requeue from unresolved), refusal when short. Every function runs inside
// the caller's transaction, so a reservation commits with the job state,
// receipt and event that go with it.
package budget

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math"

	"github.com/fleet/fleet/internal/fleet"
	"github.com/fleet/fleet/internal/store"
)

// MaxCredits bounds allowance and cost (SPEC section 2).
const MaxCredits = 1_000_000

// Accounting is the allowance's state. Available is derived:
// allowance - spent - reserved, never negative.
type Accounting struct {
	Allowance     int64  `json:"allowance"`
	Spent         int64  `json:"spent"`
	Reserved      int64  `json:"reserved"`
	Available     int64  `json:"available"`
	Calls         int64  `json:"calls"`
	Unit          string `json:"unit"`
	CostPerReport int64  `json:"cost_per_report"`
}

// Init creates the accounting row.
func Init(ctx context.Context, tx *store.Tx, allowance, costPerReport int64) error {
	if allowance < 0 || allowance > MaxCredits {
		return fleet.Errorf(fleet.CodeInvalid, "allowance must be 0 to %d, got %d", MaxCredits, allowance)
	}
	if costPerReport < 1 || costPerReport > MaxCredits {
		return fleet.Errorf(fleet.CodeInvalid, "cost_per_report must be 1 to %d, got %d", MaxCredits, costPerReport)
	}
	_, err := tx.ExecContext(ctx,
		`INSERT INTO accounting (id, allowance, spent, reserved, calls, cost_per_report) VALUES (1, $1, 0, 0, 0, $2)`,
		allowance, costPerReport)
	if err != nil {
		return fmt.Errorf("init accounting: %w", err)
	}
	return nil
}

const columns = `allowance, spent, reserved, calls, cost_per_report`

func scan(row *sql.Row) (Accounting, error) {
	a := Accounting{Unit: "credits"}
	err := row.Scan(&a.Allowance, &a.Spent, &a.Reserved, &a.Calls, &a.CostPerReport)
	a.Available = a.Allowance - a.Spent - a.Reserved
	return a, err
}

// Get reads the accounting.
func Get(ctx context.Context, tx *store.Tx) (Accounting, error) {
	a, err := scan(tx.QueryRowContext(ctx, `SELECT `+columns+` FROM accounting WHERE id = 1`+tx.ForUpdate()))
	if err != nil {
		return a, fmt.Errorf("read accounting: %w", err)
	}
	return a, nil
}

// ReserveReport reserves cost_per_report if available covers it and counts
// the admitted call. It reports whether it did and the accounting after the
// decision.
func ReserveReport(ctx context.Context, tx *store.Tx) (bool, Accounting, error) {
	// The guard is in the UPDATE itself, so no read-then-write gap exists
	// even on a backend without a single writer.
	a, err := scan(tx.QueryRowContext(ctx,
		`UPDATE accounting SET reserved = reserved + cost_per_report, calls = calls + 1
		 WHERE id = 1 AND allowance - spent - reserved >= cost_per_report RETURNING `+columns))
	if errors.Is(err, sql.ErrNoRows) {
		a, err = Get(ctx, tx)
		return false, a, err
	}
	if err != nil {
		return false, a, fmt.Errorf("reserve: %w", err)
	}
	return true, a, nil
}

// Settle moves amount from reserved to spent: the admitted work happened, or
// may have.
func Settle(ctx context.Context, tx *store.Tx, amount int64) (Accounting, error) {
	return move(ctx, tx, amount, amount)
}

// Release returns amount from reserved to available, unspent.
func Release(ctx context.Context, tx *store.Tx, amount int64) (Accounting, error) {
	return move(ctx, tx, amount, 0)
}

func move(ctx context.Context, tx *store.Tx, fromReserved, toSpent int64) (Accounting, error) {
	a, err := scan(tx.QueryRowContext(ctx,
		`UPDATE accounting SET reserved = reserved - $1, spent = spent + $2 WHERE id = 1 AND reserved >= $1 RETURNING `+columns,
		fromReserved, toSpent))
	if errors.Is(err, sql.ErrNoRows) {
		return a, fmt.Errorf("settle %d credits: fewer credits reserved than the job holds", fromReserved)
	}
	if err != nil {
		return a, fmt.Errorf("settle %d credits: %w", fromReserved, err)
	}
	return a, nil
}

// SetAllowance changes the allowance if it is still expected (compare-and-
// swap). The new allowance may not fall below what is spent and reserved.
func SetAllowance(ctx context.Context, tx *store.Tx, expected, allowance int64) (Accounting, error) {
	if allowance < 0 || allowance > MaxCredits {
		return Accounting{}, fleet.Errorf(fleet.CodeInvalid, "allowance must be 0 to %d, got %d", MaxCredits, allowance)
	}
	a, err := Get(ctx, tx)
	if err != nil {
		return a, err
	}
	if a.Allowance != expected {
		return a, fleet.Errorf(fleet.CodeAllowanceConflict, "allowance is %d, not the expected %d", a.Allowance, expected)
	}
	if allowance < a.Spent+a.Reserved {
		return a, fleet.Errorf(fleet.CodeInvalid, "allowance %d is below spent + reserved (%d)", allowance, a.Spent+a.Reserved)
	}
	if _, err := tx.ExecContext(ctx, `UPDATE accounting SET allowance = $1 WHERE id = 1`, allowance); err != nil {
		return a, fmt.Errorf("set allowance: %w", err)
	}
	return Get(ctx, tx)
}

// Prices convert a model worker's reported usage into credits (input.json
// model_prices): credits per 1,000 prompt tokens and per 1,000 completion
// tokens.
type Prices struct {
	PromptPer1K     float64 `json:"prompt_per_1k"`
	CompletionPer1K float64 `json:"completion_per_1k"`
}

// MaxPrice bounds a price, so a cost can never overflow.
const MaxPrice = 1e6

// Usage is what a model call used, as the worker reports it.
type Usage struct {
	PromptTokens     int64 `json:"prompt_tokens"`
	CompletionTokens int64 `json:"completion_tokens"`
}

// MaxTokens bounds a usage report.
const MaxTokens = 1 << 40

// Valid reports whether u could be a real usage report.
func (u Usage) Valid() bool {
	return u.PromptTokens >= 0 && u.CompletionTokens >= 0 && u.PromptTokens <= MaxTokens && u.CompletionTokens <= MaxTokens
}

// Credits is what u costs at p, rounded up to whole credits (a partial
// credit is a credit: rounding never favours the spender) and capped at
// MaxCredits.
func (p Prices) Credits(u Usage) int64 {
	c := math.Ceil((float64(u.PromptTokens)*p.PromptPer1K + float64(u.CompletionTokens)*p.CompletionPer1K) / 1000)
	if c >= MaxCredits {
		return MaxCredits
	}
	return int64(c)
}
