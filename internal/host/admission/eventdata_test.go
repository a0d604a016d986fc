package admission

import (
	"encoding/json"
	"testing"

	"github.com/fleet/fleet/internal/wire"
)

// TestAdmittedEventDataAsMapWas: an admission's event data, written from
// a struct, is byte for byte what it was when written from a map.
func TestAdmittedEventDataAsMapWas(t *testing.T) {
	acct := wire.Accounting{Allowance: 100, Reserved: 7, Available: 93, Calls: 1, Unit: "credits", CostPerReport: 7}
	want, err := json.Marshal(map[string]any{"operation_id": "op-1", "section": "a <b>", "receipt_id": "rcpt-1", "accounting": acct, "tenant": ""})
	if err != nil {
		t.Fatal(err)
	}
	got, err := json.Marshal(admittedData{OperationID: "op-1", Section: "a <b>", ReceiptID: "rcpt-1", Accounting: acct})
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != string(want) {
		t.Fatalf("%s\nas a map it was %s", got, want)
	}
}
