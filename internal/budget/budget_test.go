package budget_test

import (
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
	p := &budget.Prices{PromptPer1K: 2, CompletionPer1K: 10}
	u := &wire.Usage{PromptTokens: 1200, CompletionTokens: 300}
	for _, c := range []struct {
		prices                   *budget.Prices
		usage                    *wire.Usage
		reserved, settled, freed int64
	}{
		{nil, nil, 20, 20, 0},
		{p, nil, 20, 20, 0},
		{nil, u, 20, 20, 0},
		{p, u, 20, 6, 14},
		{p, u, 4, 4, 0}, // the usage cost more than was reserved: the reservation caps it
	} {
		settled, freed := budget.Settlement(c.reserved, c.prices, c.usage)
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
	for _, body := range []string{`{}`, `{"usage":{"prompt_tokens":-1,"completion_tokens":4}}`, `{"usage":"lots"}`, `[]`} {
		if u := budget.ReportedUsage([]byte(body)); u != nil {
			t.Errorf("%s gave usage %v", body, u)
		}
	}
}
