package claims

import (
	"encoding/json"
	"testing"
)

// TestClaimedEventDataAsMapWas: a claim's event data, written from a
// struct, is byte for byte what it was when written from a map.
func TestClaimedEventDataAsMapWas(t *testing.T) {
	want, err := json.Marshal(map[string]any{"operation_id": "op-<1>", "section": "summary & more", "claim_id": "c-1", "generation": int64(3), "host": "h"})
	if err != nil {
		t.Fatal(err)
	}
	got, err := json.Marshal(claimedData{OperationID: "op-<1>", Section: "summary & more", ClaimID: "c-1", Generation: 3, Host: "h"})
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != string(want) {
		t.Fatalf("%s\nas a map it was %s", got, want)
	}
}
