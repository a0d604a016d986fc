// Package budget is the shared allowance's rules: the limits of allowance
// and cost, and what a model worker's reported usage costs. Reservation,
// settlement and release are guarded writes (store.Executor's Accounting
// operations) that the host runs in the transaction of the decision they
// belong to.
package budget

import (
	"encoding/json"
	"math"

	"github.com/fleet/fleet/internal/fleet"
	"github.com/fleet/fleet/internal/wire"
)

// MaxCredits bounds allowance and cost.
const MaxCredits = 1_000_000

// ValidateAllowance checks an allowance.
func ValidateAllowance(allowance int64) error {
	if allowance < 0 || allowance > MaxCredits {
		return fleet.Errorf(wire.CodeInvalid, "allowance must be 0 to %d, got %d", MaxCredits, allowance)
	}
	return nil
}

// ValidateCost checks a cost per report.
func ValidateCost(cost int64) error {
	if cost < 1 || cost > MaxCredits {
		return fleet.Errorf(wire.CodeInvalid, "cost_per_report must be 1 to %d, got %d", MaxCredits, cost)
	}
	return nil
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

// MaxTokens bounds a usage report.
const MaxTokens = 1 << 40

// ValidUsage reports whether u could be a real usage report.
func ValidUsage(u wire.Usage) bool {
	return u.PromptTokens >= 0 && u.CompletionTokens >= 0 && u.PromptTokens <= MaxTokens && u.CompletionTokens <= MaxTokens
}

// ReportedUsage reads {"usage":{"prompt_tokens":…,"completion_tokens":…}}
// from a published body. Anything else (no usage, or not a plausible one)
// is nil, and the publication settles its whole reservation.
func ReportedUsage(body json.RawMessage) *wire.Usage {
	var b struct {
		Usage *wire.Usage `json:"usage"`
	}
	if json.Unmarshal(body, &b) != nil || b.Usage == nil || !ValidUsage(*b.Usage) {
		return nil
	}
	return b.Usage
}

// Credits is what u costs at p, rounded up to whole credits (a partial
// credit is a credit: rounding never favours the spender) and capped at
// MaxCredits.
func (p Prices) Credits(u wire.Usage) int64 {
	c := math.Ceil((float64(u.PromptTokens)*p.PromptPer1K + float64(u.CompletionTokens)*p.CompletionPer1K) / 1000)
	if c >= MaxCredits {
		return MaxCredits
	}
	return int64(c)
}

// Settlement is what a publication settles of its reservation: all of it,
// or with model prices what the reported usage cost, never more than was
// reserved; the rest is released to available.
func Settlement(reserved int64, prices *Prices, usage *wire.Usage) (settled, released int64) {
	settled = reserved
	if prices != nil && usage != nil {
		settled = min(prices.Credits(*usage), reserved)
	}
	return settled, reserved - settled
}
