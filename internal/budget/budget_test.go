package budget_test

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"

	"github.com/fleet/fleet/internal/budget"
	"github.com/fleet/fleet/internal/wire"
)

// TestPricesCredits: usage converts to whole credits, rounded up, capped.
func TestPricesCredits(t *testing.T) {
	p := budget.Prices{PromptPer1K: 2, CompletionPer1K: 10}
	for _, c := range []struct {
		usage wire.Usage
		want  int64
	}{
		{wire.Usage{PromptTokens: 1200, CompletionTokens: 300}, 6}, // 2.4 + 3.0
		{wire.Usage{PromptTokens: 1000, CompletionTokens: 0}, 2},
		{wire.Usage{PromptTokens: 1, CompletionTokens: 0}, 1}, // a partial credit is a credit
		{wire.Usage{}, 0},
		{wire.Usage{PromptTokens: budget.MaxTokens, CompletionTokens: budget.MaxTokens}, budget.MaxCredits},
	} {
		if got := p.Credits(c.usage); got != c.want {
			t.Errorf("%+v: %d credits, want %d", c.usage, got, c.want)
		}
	}
	if budget.ValidUsage(wire.Usage{PromptTokens: -1}) || budget.ValidUsage(wire.Usage{CompletionTokens: budget.MaxTokens + 1}) {
		t.Error("an impossible usage passed as valid")
	}
}

// TestSettlement: without prices or usage a publication settles its whole
// reservation; with both it settles what the usage cost, never more than
// was reserved, and releases the rest.
func TestSettlement(t *testing.T) {
	p := budget.PriceTable{budget.AnyModel: {PromptPer1K: 2, CompletionPer1K: 10}}
	u := &wire.Usage{PromptTokens: 1200, CompletionTokens: 300}
	for _, c := range []struct {
		prices                   budget.PriceTable
		usage                    *wire.Usage
		reserved, settled, freed int64
	}{
		{nil, nil, 20, 20, 0},
		{p, nil, 20, 20, 0},
		{nil, u, 20, 20, 0},
		{p, u, 20, 6, 14},
		{p, u, 4, 4, 0}, // the usage cost more than was reserved: the reservation caps it
	} {
		settled, freed, _ := budget.Settlement(c.reserved, c.prices, c.usage)
		if settled != c.settled || freed != c.freed {
			t.Errorf("%+v: settled %d, released %d", c, settled, freed)
		}
	}
}

// TestReportedUsage reads a model worker's usage from a published body and
// ignores anything implausible.
func TestReportedUsage(t *testing.T) {
	if u := budget.ReportedUsage([]byte(`{"usage":{"prompt_tokens":3,"completion_tokens":4}}`)); u == nil || *u != (wire.Usage{PromptTokens: 3, CompletionTokens: 4}) {
		t.Fatalf("usage %v", u)
	}
	// The model is the usage's own, else the body's (what Fleet's workers
	// send); a name that is not a model's (too long, not plain text) is none.
	for body, model := range map[string]string{
		`{"model":"small","usage":{"prompt_tokens":3,"completion_tokens":4}}`:                            "small",
		`{"model":"small","usage":{"model":"large","prompt_tokens":3,"completion_tokens":4}}`:            "large",
		`{"model":"` + strings.Repeat("m", 200) + `","usage":{"prompt_tokens":3,"completion_tokens":4}}`: "",
		`{"model":"a\nb","usage":{"prompt_tokens":3,"completion_tokens":4}}`:                             "",
		`{"model":7,"usage":{"prompt_tokens":3,"completion_tokens":4}}`:                                  "",
	} {
		if u := budget.ReportedUsage([]byte(body)); u == nil || u.Model != model {
			t.Errorf("%.60s: usage %+v, want model %q", body, u, model)
		}
	}
	for _, body := range []string{`{}`, `{"usage":{"prompt_tokens":-1,"completion_tokens":4}}`, `{"usage":"lots"}`, `[]`} {
		if u := budget.ReportedUsage([]byte(body)); u != nil {
			t.Errorf("%s gave usage %v", body, u)
		}
	}
}

// TestPriceTable: usage is priced at its model's prices, or at "*"'s for a
// model the table does not name; a model neither prices settles the whole
// reservation, and the settlement says which model and whether it was
// priced. The flat form of model_prices (from before the table) is "*".
func TestPriceTable(t *testing.T) {
	var table budget.PriceTable
	if err := json.Unmarshal([]byte(`{"small":{"prompt_per_1k":1,"completion_per_1k":2},"large":{"prompt_per_1k":10,"completion_per_1k":30}}`), &table); err != nil {
		t.Fatal(err)
	}
	u := func(model string) *wire.Usage {
		return &wire.Usage{Model: model, PromptTokens: 1000, CompletionTokens: 1000}
	}
	for _, c := range []struct {
		table    budget.PriceTable
		usage    *wire.Usage
		settled  int64
		released int64
		pricing  *wire.Pricing
	}{
		{table, u("small"), 3, 47, &wire.Pricing{Model: "small", Priced: true}},
		{table, u("large"), 40, 10, &wire.Pricing{Model: "large", Priced: true}},
		{table, u("huge"), 50, 0, &wire.Pricing{Model: "huge", Priced: false}},
		{table, u(""), 50, 0, &wire.Pricing{Model: "", Priced: false}},
		{table, nil, 50, 0, nil},
		{nil, u("small"), 50, 0, nil},
	} {
		settled, released, pricing := budget.Settlement(50, c.table, c.usage)
		if settled != c.settled || released != c.released || !reflect.DeepEqual(pricing, c.pricing) {
			t.Errorf("%v at %v: settled %d, released %d, pricing %+v", c.usage, c.table, settled, released, pricing)
		}
	}
	var flat budget.PriceTable
	if err := json.Unmarshal([]byte(`{"prompt_per_1k":2,"completion_per_1k":10}`), &flat); err != nil {
		t.Fatal(err)
	}
	if settled, _, pricing := budget.Settlement(50, flat, u("anything")); settled != 12 || pricing == nil || !pricing.Priced {
		t.Errorf("the flat form priced %d (%+v), want 12 at its prices for any model", settled, pricing)
	}
	for _, bad := range []string{`{}`, `{"small":{"prompt_per_1k":1}}`, `{"small":{"prompt_per_1k":-1,"completion_per_1k":1}}`,
		`{"":{"prompt_per_1k":1,"completion_per_1k":1}}`, `{"a\u0007b":{"prompt_per_1k":1,"completion_per_1k":1}}`,
		`{"small":{"prompt_per_1k":1,"completion_per_1k":1e300}}`, `{"prompt_per_1k":1}`, `[]`,
		`{"small":{"prompt_per_1k":1,"completion_per_1k":1,"extra":1}}`} {
		var table budget.PriceTable
		if err := json.Unmarshal([]byte(bad), &table); err == nil {
			t.Errorf("%s was taken as a price table: %v", bad, table)
		}
	}
}
