// Package budget is the shared allowance's rules: the limits of allowance
// and cost, and what a model worker's reported usage costs. Reservation,
// settlement and release are guarded writes (store.Executor's Accounting
// operations) that the host runs in the transaction of the decision they
// belong to.
package budget

import (
	"bytes"
	"encoding/json"
	"math"
	"strings"

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

// MaxModelBytes bounds a model's name, in a price table and in a usage
// report.
const MaxModelBytes = 128

// MaxModels bounds a price table.
const MaxModels = 256

// AnyModel is the price table's entry for a model it does not name.
const AnyModel = "*"

// PriceTable prices a model worker's usage by model (input.json
// model_prices): each model named, and AnyModel for any model the table
// does not name. The form from before tables, one price for every model,
// reads as a table of AnyModel alone.
type PriceTable map[string]Prices

// UnmarshalJSON reads a table, or the flat form, checking every name and
// price: a table that would misprice is refused whole.
func (t *PriceTable) UnmarshalJSON(data []byte) error {
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(data, &fields); err != nil {
		return fleet.Errorf(wire.CodeInvalid, "model_prices must be an object of models, each {\"prompt_per_1k\",\"completion_per_1k\"}")
	}
	if _, flat := fields["prompt_per_1k"]; flat {
		p, err := readPrices("model_prices", data)
		if err != nil {
			return err
		}
		*t = PriceTable{AnyModel: p}
		return nil
	}
	if len(fields) == 0 || len(fields) > MaxModels {
		return fleet.Errorf(wire.CodeInvalid, "model_prices names 1 to %d models, got %d", MaxModels, len(fields))
	}
	table := make(PriceTable, len(fields))
	for model, raw := range fields {
		if !validModel(model) {
			return fleet.Errorf(wire.CodeInvalid, "model_prices: a model's name is 1 to %d bytes of plain text, got %.40q", MaxModelBytes, model)
		}
		p, err := readPrices("model_prices."+model, raw)
		if err != nil {
			return err
		}
		table[model] = p
	}
	*t = table
	return nil
}

// readPrices reads one model's prices, both required, each 0 to MaxPrice.
func readPrices(name string, data []byte) (Prices, error) {
	var raw struct {
		PromptPer1K     *float64 `json:"prompt_per_1k"`
		CompletionPer1K *float64 `json:"completion_per_1k"`
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&raw); err != nil {
		return Prices{}, fleet.Errorf(wire.CodeInvalid, "%s: %s", name, strings.TrimPrefix(err.Error(), "json: "))
	}
	if raw.PromptPer1K == nil || raw.CompletionPer1K == nil {
		return Prices{}, fleet.Errorf(wire.CodeInvalid, "%s needs prompt_per_1k and completion_per_1k (credits per 1,000 tokens)", name)
	}
	for field, v := range map[string]float64{"prompt_per_1k": *raw.PromptPer1K, "completion_per_1k": *raw.CompletionPer1K} {
		if !(v >= 0 && v <= MaxPrice) { // also refuses NaN
			return Prices{}, fleet.Errorf(wire.CodeInvalid, "%s.%s must be 0 to %g credits, got %v", name, field, MaxPrice, v)
		}
	}
	return Prices{PromptPer1K: *raw.PromptPer1K, CompletionPer1K: *raw.CompletionPer1K}, nil
}

// validModel reports whether name can be a model's: 1 to MaxModelBytes
// bytes of plain text.
func validModel(name string) bool {
	return name != "" && len(name) <= MaxModelBytes && wire.IsPlainText(name)
}

// Lookup is model's prices: its own, else AnyModel's; false when neither.
func (t PriceTable) Lookup(model string) (Prices, bool) {
	if p, ok := t[model]; ok && model != "" {
		return p, true
	}
	p, ok := t[AnyModel]
	return p, ok
}

// ReportedUsage reads a model worker's usage from a published body:
// {"model":…,"usage":{"prompt_tokens":…,"completion_tokens":…,"model"?}},
// the model being the usage's own, else the body's. Anything else (no
// usage, or not a plausible one) is nil, and the publication settles its
// whole reservation; a name that cannot be a model's is no model.
func ReportedUsage(body json.RawMessage) *wire.Usage {
	var b struct {
		Model json.RawMessage `json:"model"`
		Usage *struct {
			wire.Usage
			Model json.RawMessage `json:"model"`
		} `json:"usage"`
	}
	if json.Unmarshal(body, &b) != nil || b.Usage == nil || !ValidUsage(b.Usage.Usage) {
		return nil
	}
	u := b.Usage.Usage
	for _, named := range []json.RawMessage{b.Usage.Model, b.Model} {
		var model string
		if json.Unmarshal(named, &model) == nil && model != "" {
			if validModel(model) {
				u.Model = model
			}
			break
		}
	}
	return &u
}

// CheckUsage refuses a usage report that names something that cannot be a
// model (a failure's, whose fields the host reads itself).
func CheckUsage(u *wire.Usage) error {
	if u == nil {
		return nil
	}
	if !ValidUsage(*u) {
		return fleet.Errorf(wire.CodeInvalid, "usage: token counts must be 0 to %d", MaxTokens)
	}
	if u.Model != "" && !validModel(u.Model) {
		return fleet.Errorf(wire.CodeInvalid, "usage.model is 1 to %d bytes of plain text", MaxModelBytes)
	}
	return nil
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

// Settlement is what a publication or failure settles of its
// reservation, and how: with a price table and a usage report, what the
// usage cost at its model's prices, never more than was reserved, the
// rest released to available; a model the table does not price settles
// the whole reservation. pricing says which model and whether it was
// priced (nil without a table or a report: the whole reservation).
func Settlement(reserved int64, table PriceTable, usage *wire.Usage) (settled, released int64, pricing *wire.Pricing) {
	if table == nil || usage == nil {
		return reserved, 0, nil
	}
	p, ok := table.Lookup(usage.Model)
	if !ok {
		return reserved, 0, &wire.Pricing{Model: usage.Model}
	}
	settled = min(p.Credits(*usage), reserved)
	return settled, reserved - settled, &wire.Pricing{Model: usage.Model, Priced: true}
}
