package store_test

import (
	"encoding/json"
	"math/rand/v2"
	"reflect"
	"testing"

	"github.com/fleet/fleet/internal/store"
	"github.com/fleet/fleet/internal/wire"
)

// randomReceipt fills every field, each pointer nil or not, the strings
// with what JSON escapes.
func randomReceipt(rng *rand.Rand) wire.Receipt {
	texts := []string{"", "a", "worker-17", `"q"`, `b\s`, "\n\t", "<&>", "\u2028", "é世😀", "rcpt-0123abcd"}
	text := func() string { return texts[rng.IntN(len(texts))] + texts[rng.IntN(len(texts))] }
	n := func() int64 { return rng.Int64N(1<<53) - 1<<52 }
	r := wire.Receipt{ID: text(), Signature: text(), ReceiptBody: wire.ReceiptBody{Sequence: n(), Kind: wire.ReceiptKind(text()),
		OperationID: text(), Caller: text(), Decision: wire.Decision(text()), Cost: n(),
		Accounting: wire.Accounting{Allowance: n(), Spent: n(), Reserved: n(), Available: n(), Calls: n(), Unit: text(), CostPerReport: n()},
		Tenant:     text(), Level: text(), Credential: text(), IssuedAtMS: n(), KernelKey: text(), Nonce: text()}}
	if rng.IntN(2) == 0 {
		prev := text()
		r.Prev = &prev
	}
	if rng.IntN(2) == 0 {
		reserved := n()
		r.Reserved = &reserved
	}
	if rng.IntN(2) == 0 {
		r.Pricing = &wire.Pricing{Model: text(), Priced: rng.IntN(2) == 0}
	}
	return r
}

// TestDecodeReceiptAsUnmarshal: a receipt as the host writes it
// (json.Marshal) reads back the same through DecodeReceipt as through
// encoding/json, for 2,000 random receipts.
func TestDecodeReceiptAsUnmarshal(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for range 2000 {
		want := randomReceipt(rng)
		stored, err := json.Marshal(want)
		if err != nil {
			t.Fatal(err)
		}
		var old wire.Receipt
		if err := json.Unmarshal(stored, &old); err != nil {
			t.Fatal(err)
		}
		got, err := store.DecodeReceipt(stored)
		if err != nil {
			t.Fatalf("decode %s: %v", stored, err)
		}
		if !reflect.DeepEqual(got, old) || !reflect.DeepEqual(got, want) {
			t.Fatalf("%s read back as %+v; encoding/json reads %+v", stored, got, old)
		}
	}
}

// BenchmarkDecodeReceipt: a receipt as the host writes it, read by
// encoding/json and by DecodeReceipt.
//
//	go test ./internal/store -run '^$' -bench DecodeReceipt -benchmem
func BenchmarkDecodeReceipt(b *testing.B) {
	reserved := int64(20)
	stored, err := json.Marshal(wire.Receipt{ID: "rcpt-0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
		ReceiptBody: wire.ReceiptBody{Sequence: 1234, Kind: "publication", OperationID: "0193a3b2-7c4e-7000-8000-000000000001",
			Caller: "worker-17", Decision: "allowed", Cost: 12, Reserved: &reserved,
			Accounting: wire.Accounting{Allowance: 1000000, Spent: 1234, Reserved: 640, Available: 998126, Calls: 99, Unit: "credits", CostPerReport: 20},
			Tenant:     "default", IssuedAtMS: 1700000000000, KernelKey: "abcdef0123456789abcdef0123456789abcdef0123456789abcdef0123456789",
			Nonce: "0123456789abcdef0123456789abcdef"}, Signature: "ab"})
	if err != nil {
		b.Fatal(err)
	}
	b.Run("encoding-json", func(b *testing.B) {
		for b.Loop() {
			var r wire.Receipt
			if err := json.Unmarshal(stored, &r); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("DecodeReceipt", func(b *testing.B) {
		for b.Loop() {
			if _, err := store.DecodeReceipt(stored); err != nil {
				b.Fatal(err)
			}
		}
	})
}
