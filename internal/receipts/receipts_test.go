package receipts_test

import (
	"strings"
	"testing"

	"github.com/fleet/fleet/internal/receipts"
	"github.com/fleet/fleet/internal/wire"
)

// issueChain signs n receipts, each linked to the one before, and decodes
// them back from what would be stored.
func issueChain(t *testing.T, n int) (*receipts.Kernel, []wire.Receipt) {
	t.Helper()
	k, err := receipts.NewKernel()
	if err != nil {
		t.Fatal(err)
	}
	var chain []wire.Receipt
	var seq int64
	var prev string
	for i := range n {
		r := k.Prepare(receipts.Draft{Kind: wire.KindAdmission, OperationID: "op", Caller: "worker-1",
			Decision: wire.DecisionAllow, Cost: int64(i + 1), Accounting: wire.Accounting{Allowance: 50, Unit: "credits"}}, 1000)
		stored, err := k.Seal(&r, seq, prev)
		if err != nil {
			t.Fatal(err)
		}
		decoded, err := receipts.Decode(stored)
		if err != nil {
			t.Fatal(err)
		}
		if decoded.ID != r.ID || decoded.Signature != r.Signature {
			t.Fatalf("stored receipt decodes to %+v, signed %+v", decoded, r)
		}
		chain = append(chain, decoded)
		seq, prev = r.Sequence, r.ID
	}
	loaded, err := receipts.LoadKernel(k.PublicKey, k.Seed())
	if err != nil || loaded.PublicKey != k.PublicKey {
		t.Fatalf("reloaded kernel %v, %v", loaded, err)
	}
	return k, chain
}

func TestChain(t *testing.T) {
	t.Run("OK", func(t *testing.T) {
		k, chain := issueChain(t, 3)
		if v := receipts.VerifyChain(chain, k.PublicKey); len(v) != 0 {
			t.Fatal(v)
		}
		if chain[0].Prev != nil || *chain[2].Prev != chain[1].ID || !strings.HasPrefix(chain[0].ID, "rcpt-") {
			t.Fatalf("chain links %+v", chain)
		}
	})
	t.Run("ErrTamperedBody", func(t *testing.T) {
		k, chain := issueChain(t, 3)
		chain[1].Cost = 999
		v := receipts.VerifyChain(chain, k.PublicKey)
		if len(v) == 0 || !strings.Contains(v[0], "id does not match") {
			t.Fatal(v)
		}
	})
	t.Run("ErrMovedInChain", func(t *testing.T) {
		// The id names the decision; the signature covers its place too, so
		// a receipt moved to another sequence keeps its id and fails.
		k, chain := issueChain(t, 3)
		chain[1].Sequence = 7
		v := receipts.VerifyChain(chain, k.PublicKey)
		if len(v) != 2 || !strings.Contains(v[0], "signature does not verify") || !strings.Contains(v[1], "sequence 7") {
			t.Fatal(v)
		}
	})
	t.Run("ErrForgedSignature", func(t *testing.T) {
		k, chain := issueChain(t, 2)
		chain[1].Signature = chain[0].Signature
		if v := receipts.VerifyChain(chain, k.PublicKey); len(v) != 1 || !strings.Contains(v[0], "signature") {
			t.Fatal(v)
		}
	})
	t.Run("ErrOtherKernel", func(t *testing.T) {
		_, chain := issueChain(t, 1)
		other, err := receipts.NewKernel()
		if err != nil {
			t.Fatal(err)
		}
		if v := receipts.VerifyChain(chain, other.PublicKey); len(v) == 0 {
			t.Fatal("a receipt verified against another kernel's key")
		}
	})
	t.Run("ErrDroppedReceipt", func(t *testing.T) {
		k, chain := issueChain(t, 3)
		if v := receipts.VerifyChain([]wire.Receipt{chain[0], chain[2]}, k.PublicKey); len(v) != 2 {
			t.Fatalf("a gap in the chain gave %v", v)
		}
	})
	t.Run("ErrWrongSeed", func(t *testing.T) {
		k, _ := issueChain(t, 1)
		other, err := receipts.NewKernel()
		if err != nil {
			t.Fatal(err)
		}
		if _, err := receipts.LoadKernel(k.PublicKey, other.Seed()); err == nil {
			t.Fatal("a seed that does not give the stored key was loaded")
		}
		if _, err := receipts.LoadKernel(k.PublicKey, k.Seed()[:5]); err == nil {
			t.Fatal("a short seed was loaded")
		}
	})
}

// TestPrepareThenSeal: a receipt's id is fixed when it is decided and does
// not change when the log places it, and two identical decisions in one
// millisecond get two ids.
func TestPrepareThenSeal(t *testing.T) {
	k, err := receipts.NewKernel()
	if err != nil {
		t.Fatal(err)
	}
	d := receipts.Draft{Kind: wire.KindReconciliation, OperationID: "op", Caller: "operator", Decision: wire.DecisionAllow}
	a, b := k.Prepare(d, 1000), k.Prepare(d, 1000)
	if a.ID == b.ID || !strings.HasPrefix(a.ID, "rcpt-") || a.Signature != "" || a.Sequence != 0 {
		t.Fatalf("prepared %+v and %+v", a, b)
	}
	id := a.ID
	stored, err := k.Seal(&a, 41, "rcpt-before")
	if err != nil {
		t.Fatal(err)
	}
	decoded, err := receipts.Decode(stored)
	if err != nil || decoded.ID != id || decoded.Sequence != 42 || *decoded.Prev != "rcpt-before" {
		t.Fatalf("sealed %+v, %v", decoded, err)
	}
	if err := receipts.Verify(decoded, k.PublicKey); err != nil {
		t.Fatal(err)
	}
}

// TestCheck is the console's receipt view: a good receipt passes every
// check; a tampered body fails its id and signature; a missing predecessor
// fails the chain link.
func TestCheck(t *testing.T) {
	k, chain := issueChain(t, 3)
	for i, r := range chain {
		var prev *wire.Receipt
		if i > 0 {
			prev = &chain[i-1]
		}
		c, err := receipts.Check(r, prev, k.PublicKey)
		if err != nil {
			t.Fatal(err)
		}
		if !c.IDMatchesBody || !c.SignatureValid || !c.KernelTrusted || !c.Chain.Linked || len(c.Problems) != 0 {
			t.Fatalf("receipt %d: %+v", i+1, c)
		}
		if i > 0 && c.Chain.PrevSequence != int64(i) {
			t.Fatalf("receipt %d links to sequence %d", i+1, c.Chain.PrevSequence)
		}
		if !strings.HasPrefix(c.CanonicalBody, `{"accounting":{"allowance":50,`) {
			t.Fatalf("canonical body %s", c.CanonicalBody)
		}
	}
	other, err := receipts.NewKernel()
	if err != nil {
		t.Fatal(err)
	}
	if c, err := receipts.Check(chain[0], nil, other.PublicKey); err != nil || c.KernelTrusted || !c.SignatureValid || len(c.Problems) == 0 {
		t.Fatalf("checked against another kernel: %+v, %v", c, err)
	}
	tampered := chain[2]
	tampered.Cost = 30
	if c, err := receipts.Check(tampered, &chain[1], k.PublicKey); err != nil || c.IDMatchesBody || c.SignatureValid || !c.Chain.Linked {
		t.Fatalf("tampered receipt: %+v, %v", c, err)
	}
	if c, err := receipts.Check(chain[1], nil, k.PublicKey); err != nil || c.Chain.Linked || !c.SignatureValid || len(c.Problems) != 1 {
		t.Fatalf("receipt whose predecessor is gone: %+v, %v", c, err)
	}
}
