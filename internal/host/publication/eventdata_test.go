package publication

import (
	"encoding/json"
	"testing"

	"github.com/fleet/fleet/internal/wire"
)

// TestPublicationEventDataAsMapWas: a publication's event data, written
// from a struct, is byte for byte what it was when written from a map:
// the same members, present in the same cases, in the same order.
func TestPublicationEventDataAsMapWas(t *testing.T) {
	held := int64(7)
	acct := wire.Accounting{Allowance: 100, Spent: 7, Available: 93, Unit: "credits", CostPerReport: 7}
	usage := &wire.Usage{Model: "m", PromptTokens: 3, CompletionTokens: 4}
	asMap := func(eff publicationEffect, op, section string, outcome wire.Outcome, priced bool) map[string]any {
		data := map[string]any{"operation_id": op, "section": section, "status": outcome.Status,
			"version": outcome.Version, "receipt_id": outcome.ReceiptID, "accounting": eff.acct}
		if outcome.Reason != "" {
			data["reason"] = outcome.Reason
		}
		if eff.ackLost {
			data["fault"] = wire.FaultLoseAck
		}
		if eff.reserved != nil {
			data["reserved"], data["settled"], data["released"] = *eff.reserved, eff.settled, eff.released
			if eff.usage != nil && priced {
				data["usage"], data["pricing"] = eff.usage, eff.pricing
			}
		}
		return data
	}
	published := wire.Outcome{Status: wire.StatusPublished, Version: 2, ReceiptID: "rcpt-1"}
	for name, c := range map[string]struct {
		eff     publicationEffect
		outcome wire.Outcome
		priced  bool
	}{
		"refused":            {publicationEffect{acct: acct}, wire.Outcome{Status: wire.StatusRejected, Version: 1, ReceiptID: "rcpt-2", Reason: "not <yours> & more"}, false},
		"published":          {publicationEffect{acct: acct, reserved: &held, settled: 7}, published, false},
		"published, nothing": {publicationEffect{acct: acct, reserved: new(int64)}, published, false},
		"usage, unpriced":    {publicationEffect{acct: acct, reserved: &held, settled: 7, usage: usage}, published, false},
		"usage, priced":      {publicationEffect{acct: acct, reserved: &held, settled: 3, released: 4, usage: usage, pricing: &wire.Pricing{Model: "m", Priced: true}}, published, true},
		"priced, no usage":   {publicationEffect{acct: acct, reserved: &held, settled: 7}, published, true},
		"ack lost":           {publicationEffect{acct: acct, reserved: &held, settled: 7, ackLost: true}, published, false},
	} {
		want, err := json.Marshal(asMap(c.eff, "op-1", "summary", c.outcome, c.priced))
		if err != nil {
			t.Fatal(err)
		}
		got, err := json.Marshal(c.eff.eventData("op-1", "summary", c.outcome, c.priced))
		if err != nil {
			t.Fatal(err)
		}
		if string(got) != string(want) {
			t.Errorf("%s: %s\nas a map it was %s", name, got, want)
		}
	}
}
