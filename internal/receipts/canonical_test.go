package receipts

import (
	"bytes"
	"math/rand/v2"
	"testing"

	"github.com/fleet/fleet/internal/wire"
)

// oddStrings are the strings whose escaping RFC 8785 pins down: quotes,
// backslashes, every control character, DEL, non-ASCII, the line and
// paragraph separators (JSON.stringify leaves them as they are; Go's
// encoder escapes them), and characters Go escapes for HTML.
var oddStrings = []string{"", "worker-1", `a"b`, `back\slash`, "\x00\x01\x1f", "\b\f\n\r\t", "\x7f", "é ü 中文 🚀",
	"\u2028\u2029", "<&>", "rcpt-" + "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"}

func randomBody(rng *rand.Rand) wire.ReceiptBody {
	str := func() string {
		if rng.IntN(3) == 0 {
			b := make([]byte, rng.IntN(12))
			for i := range b {
				b[i] = byte(rng.IntN(128))
			}
			return string(b)
		}
		return oddStrings[rng.IntN(len(oddStrings))]
	}
	num := func() int64 {
		switch rng.IntN(4) {
		case 0:
			return 0
		case 1:
			return -rng.Int64N(maxExactInteger)
		case 2:
			return rng.Int64N(1_000_000)
		}
		return rng.Int64N(maxExactInteger + 1)
	}
	b := wire.ReceiptBody{Sequence: num(), Kind: wire.ReceiptKind(str()), OperationID: str(), Caller: str(),
		Decision: wire.Decision(str()), Cost: num(), IssuedAtMS: num(), KernelKey: str(), Nonce: str(),
		Accounting: wire.Accounting{Allowance: num(), Spent: num(), Reserved: num(), Available: num(), Calls: num(),
			Unit: str(), CostPerReport: num()}}
	if rng.IntN(2) == 0 {
		p := str()
		b.Prev = &p
	}
	if rng.IntN(2) == 0 {
		r := num()
		b.Reserved = &r
	}
	if rng.IntN(2) == 0 {
		b.Pricing = &wire.Pricing{Model: str(), Priced: rng.IntN(2) == 0}
	}
	if rng.IntN(2) == 0 {
		b.Tenant, b.Level, b.Credential = str(), str(), str()
	}
	return b
}

// TestCanonicalBodyMatchesJCS: the encoder Seal uses writes byte for byte
// what the generic RFC 8785 pass (which Verify uses) makes of the same
// body, for bodies full of the strings and numbers that differ between
// encoders.
func TestCanonicalBodyMatchesJCS(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range 20_000 {
		b := randomBody(rng)
		got, ok := canonicalBody(b)
		want, err := canonical(b)
		if err != nil {
			t.Fatalf("body %d: generic canonicalization failed: %v", i, err)
		}
		if !ok || !bytes.Equal(got, want) {
			t.Fatalf("body %d (%+v):\nby construction %s\ngeneric         %s", i, b, got, want)
		}
	}
	// Past 2^53 the generic pass rounds; the encoder declines rather than differ.
	if _, ok := canonicalBody(wire.ReceiptBody{Sequence: maxExactInteger + 1}); ok {
		t.Fatal("encoded an integer a double cannot hold")
	}
	if _, ok := canonicalBody(wire.ReceiptBody{Caller: "\xff"}); ok {
		t.Fatal("encoded a string that is not UTF-8")
	}
}

func FuzzCanonicalBody(f *testing.F) {
	f.Add("worker-1", "op", "allow", int64(20), int64(1700000000000))
	f.Add("a\"\\\u2028", "\x00", "é", int64(-1), int64(maxExactInteger))
	f.Fuzz(func(t *testing.T, caller, op, decision string, cost, at int64) {
		b := wire.ReceiptBody{Caller: caller, OperationID: op, Decision: wire.Decision(decision), Cost: cost, IssuedAtMS: at,
			Accounting: wire.Accounting{Unit: "credits", Allowance: cost}}
		got, ok := canonicalBody(b)
		if !ok {
			return
		}
		want, err := canonical(b)
		if err != nil || !bytes.Equal(got, want) {
			t.Fatalf("by construction %s, generic %s (%v)", got, want, err)
		}
	})
}
