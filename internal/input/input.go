// Package input reads input.json, refusing unknown fields,
// wrong types and out-of-range values with a message naming the field.
package input

import (
	"encoding/json"
	"fmt"

	"github.com/fleet/fleet/internal/budget"
	"github.com/fleet/fleet/internal/fleet"
	"github.com/fleet/fleet/internal/jobs"
	"github.com/fleet/fleet/internal/resource"
	"github.com/fleet/fleet/internal/wire"
)

// Input is a validated input.json with defaults applied.
type Input struct {
	Document      string   `json:"document"`
	Sections      []string `json:"sections"`
	Concurrency   int      `json:"concurrency"`
	Allowance     int64    `json:"allowance"`
	CostPerReport int64    `json:"cost_per_report"`
	CancelIndex   *int     `json:"cancel_index"`
	LoseAckIndex  *int64   `json:"lose_ack_index"`
	Restart       bool     `json:"restart"`
	Mode          string   `json:"mode"`
	// ModelPrices, in model mode, settles each publication by the usage
	// its worker reports instead of the full cost_per_report.
	ModelPrices *budget.Prices `json:"model_prices"`
	// Retry is the state's default retry policy (max_attempts,
	// backoff_base_ms, backoff_cap_ms; jobs.DefaultPolicy for what is
	// left out).
	Retry jobs.Policy `json:"-"`
}

// Limits.
const (
	MaxConcurrency = 64
	MaxLoseAck     = 1 << 20
)

// Parse decodes and validates input.json.
func Parse(data []byte) (Input, error) {
	var raw struct {
		Document      *string  `json:"document"`
		Sections      []string `json:"sections"`
		Concurrency   *int     `json:"concurrency"`
		Allowance     *int64   `json:"allowance"`
		CostPerReport *int64   `json:"cost_per_report"`
		CancelIndex   *int     `json:"cancel_index"`
		LoseAckIndex  *int64   `json:"lose_ack_index"`
		Restart       *bool    `json:"restart"`
		Mode          *string  `json:"mode"`
		ModelPrices   *struct {
			PromptPer1K     *float64 `json:"prompt_per_1k"`
			CompletionPer1K *float64 `json:"completion_per_1k"`
		} `json:"model_prices"`
		wire.RetryPolicy
	}
	if err := resource.DecodeStrict(data, &raw); err != nil {
		return Input{}, fmt.Errorf("input.json: %w", err)
	}
	in := Input{Concurrency: 3, Allowance: 50, CostPerReport: 20, Mode: "deterministic",
		CancelIndex: raw.CancelIndex, LoseAckIndex: raw.LoseAckIndex}
	if raw.Document == nil {
		return in, invalid("document is required")
	}
	if raw.Sections == nil {
		return in, invalid("sections is required")
	}
	in.Document, in.Sections = *raw.Document, raw.Sections
	if err := jobs.ValidateBatch(in.Document, in.Sections); err != nil {
		return in, fmt.Errorf("input.json: %w", err)
	}
	if raw.Concurrency != nil {
		in.Concurrency = *raw.Concurrency
	}
	if in.Concurrency < 1 || in.Concurrency > MaxConcurrency {
		return in, invalid("concurrency must be 1 to %d, got %d", MaxConcurrency, in.Concurrency)
	}
	if raw.Allowance != nil {
		in.Allowance = *raw.Allowance
	}
	if in.Allowance < 0 || in.Allowance > budget.MaxCredits {
		return in, invalid("allowance must be 0 to %d, got %d", budget.MaxCredits, in.Allowance)
	}
	if raw.CostPerReport != nil {
		in.CostPerReport = *raw.CostPerReport
	}
	if in.CostPerReport < 1 || in.CostPerReport > budget.MaxCredits {
		return in, invalid("cost_per_report must be 1 to %d, got %d", budget.MaxCredits, in.CostPerReport)
	}
	if in.CancelIndex != nil && (*in.CancelIndex < 0 || *in.CancelIndex >= len(in.Sections)) {
		return in, invalid("cancel_index must be null or 0 to %d (an index into sections), got %d", len(in.Sections)-1, *in.CancelIndex)
	}
	if in.LoseAckIndex != nil && (*in.LoseAckIndex < 0 || *in.LoseAckIndex > MaxLoseAck) {
		return in, invalid("lose_ack_index must be null or 0 to %d, got %d", MaxLoseAck, *in.LoseAckIndex)
	}
	if raw.Restart != nil {
		in.Restart = *raw.Restart
	}
	retry, err := jobs.DefaultPolicy.With(raw.RetryPolicy)
	if err != nil {
		return in, fmt.Errorf("input.json: %w", err)
	}
	in.Retry = retry
	if raw.Mode != nil {
		in.Mode = *raw.Mode
	}
	if in.Mode != "deterministic" && in.Mode != "model" {
		return in, invalid("mode must be \"deterministic\" or \"model\", got %q", in.Mode)
	}
	if mp := raw.ModelPrices; mp != nil {
		if in.Mode != "model" {
			return in, invalid("model_prices needs \"mode\": \"model\" (a deterministic worker reports no usage)")
		}
		if mp.PromptPer1K == nil || mp.CompletionPer1K == nil {
			return in, invalid("model_prices needs prompt_per_1k and completion_per_1k (credits per 1,000 tokens)")
		}
		for name, v := range map[string]float64{"prompt_per_1k": *mp.PromptPer1K, "completion_per_1k": *mp.CompletionPer1K} {
			if !(v >= 0 && v <= budget.MaxPrice) { // also refuses NaN
				return in, invalid("model_prices.%s must be 0 to %g credits, got %v", name, budget.MaxPrice, v)
			}
		}
		in.ModelPrices = &budget.Prices{PromptPer1K: *mp.PromptPer1K, CompletionPer1K: *mp.CompletionPer1K}
	}
	return in, nil
}

func invalid(format string, args ...any) error {
	return fmt.Errorf("input.json: %w", fleet.Errorf(wire.CodeInvalid, format, args...))
}

// Marshal is the input as JSON, e.g. to copy it into a run directory.
func (in Input) Marshal() []byte {
	data, _ := json.MarshalIndent(in, "", "  ")
	return data
}
