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
	Document string   `json:"document"`
	Sections []string `json:"sections"`
	// After names, for a section, the sections it waits for (POST
	// /admin/reports' after).
	After         map[string][]string `json:"after,omitempty"`
	Concurrency   int                 `json:"concurrency"`
	Allowance     int64               `json:"allowance"`
	CostPerReport int64               `json:"cost_per_report"`
	CancelIndex   *int                `json:"cancel_index"`
	LoseAckIndex  *int64              `json:"lose_ack_index"`
	Restart       bool                `json:"restart"`
	Mode          string              `json:"mode"`
	// ModelPrices, in model mode, settles each publication by the usage
	// its worker reports instead of the full cost_per_report.
	// A table by model name ("*" for any model it does not name), or one
	// price for every model.
	ModelPrices budget.PriceTable `json:"model_prices"`
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

// rawInput is input.json as sent: nil is a field left out.
type rawInput struct {
	Document      *string             `json:"document"`
	Sections      []string            `json:"sections"`
	After         map[string][]string `json:"after"`
	Concurrency   *int                `json:"concurrency"`
	Allowance     *int64              `json:"allowance"`
	CostPerReport *int64              `json:"cost_per_report"`
	CancelIndex   *int                `json:"cancel_index"`
	LoseAckIndex  *int64              `json:"lose_ack_index"`
	Restart       *bool               `json:"restart"`
	Mode          *string             `json:"mode"`
	ModelPrices   json.RawMessage     `json:"model_prices"`
	wire.RetryPolicy
}

// Parse decodes and validates input.json. The first problem found is the
// error, in the order the fields are documented.
func Parse(data []byte) (Input, error) {
	var raw rawInput
	if err := resource.DecodeStrict(data, &raw); err != nil {
		return Input{}, fmt.Errorf("input.json: %w", err)
	}
	in := Input{Concurrency: 3, Allowance: 50, CostPerReport: 20, Mode: "deterministic",
		CancelIndex: raw.CancelIndex, LoseAckIndex: raw.LoseAckIndex}
	for _, step := range []func(*rawInput) error{in.parseReport, in.parseAmounts, in.parseFaults, in.parseRetry, in.parseMode} {
		if err := step(&raw); err != nil {
			return in, err
		}
	}
	return in, nil
}

// parseReport reads the document and its sections.
func (in *Input) parseReport(raw *rawInput) error {
	if raw.Document == nil {
		return invalid("document is required")
	}
	if raw.Sections == nil {
		return invalid("sections is required")
	}
	in.Document, in.Sections, in.After = *raw.Document, raw.Sections, raw.After
	if err := jobs.ValidateBatch(in.Document, in.Sections); err != nil {
		return fmt.Errorf("input.json: %w", err)
	}
	if err := jobs.ValidateAfter(in.Sections, in.After); err != nil {
		return fmt.Errorf("input.json: %w", err)
	}
	return nil
}

// parseAmounts reads the concurrency, the allowance and a report's cost.
func (in *Input) parseAmounts(raw *rawInput) error {
	setIf(&in.Concurrency, raw.Concurrency)
	if in.Concurrency < 1 || in.Concurrency > MaxConcurrency {
		return invalid("concurrency must be 1 to %d, got %d", MaxConcurrency, in.Concurrency)
	}
	setIf(&in.Allowance, raw.Allowance)
	if in.Allowance < 0 || in.Allowance > budget.MaxCredits {
		return invalid("allowance must be 0 to %d, got %d", budget.MaxCredits, in.Allowance)
	}
	setIf(&in.CostPerReport, raw.CostPerReport)
	if in.CostPerReport < 1 || in.CostPerReport > budget.MaxCredits {
		return invalid("cost_per_report must be 1 to %d, got %d", budget.MaxCredits, in.CostPerReport)
	}
	return nil
}

// parseFaults checks the injected faults and reads restart.
func (in *Input) parseFaults(raw *rawInput) error {
	if in.CancelIndex != nil && (*in.CancelIndex < 0 || *in.CancelIndex >= len(in.Sections)) {
		return invalid("cancel_index must be null or 0 to %d (an index into sections), got %d", len(in.Sections)-1, *in.CancelIndex)
	}
	if in.LoseAckIndex != nil && (*in.LoseAckIndex < 0 || *in.LoseAckIndex > MaxLoseAck) {
		return invalid("lose_ack_index must be null or 0 to %d, got %d", MaxLoseAck, *in.LoseAckIndex)
	}
	setIf(&in.Restart, raw.Restart)
	return nil
}

// parseRetry reads the retry policy over the default.
func (in *Input) parseRetry(raw *rawInput) error {
	retry, err := jobs.DefaultPolicy.With(raw.RetryPolicy)
	if err != nil {
		return fmt.Errorf("input.json: %w", err)
	}
	in.Retry = retry
	return nil
}

// parseMode reads the workers' mode and, in model mode, the prices.
func (in *Input) parseMode(raw *rawInput) error {
	setIf(&in.Mode, raw.Mode)
	if in.Mode != "deterministic" && in.Mode != "model" {
		return invalid("mode must be \"deterministic\" or \"model\", got %q", in.Mode)
	}
	if raw.ModelPrices == nil || string(raw.ModelPrices) == "null" {
		return nil
	}
	if in.Mode != "model" {
		return invalid("model_prices needs \"mode\": \"model\" (a deterministic worker reports no usage)")
	}
	if err := json.Unmarshal(raw.ModelPrices, &in.ModelPrices); err != nil {
		return fmt.Errorf("input.json: %w", err)
	}
	return nil
}

// setIf sets *dst to *v when the field was given.
func setIf[T any](dst *T, v *T) {
	if v != nil {
		*dst = *v
	}
}

func invalid(format string, args ...any) error {
	return fmt.Errorf("input.json: %w", fleet.Errorf(wire.CodeInvalid, format, args...))
}

// Marshal is the input as JSON, e.g. to copy it into a run directory.
func (in Input) Marshal() []byte {
	data, _ := json.MarshalIndent(in, "", "  ")
	return data
}
