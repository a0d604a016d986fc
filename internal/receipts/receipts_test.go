package receipts_test

import (
	"context"
	"strings"
	"testing"

	"github.com/fleet/fleet/internal/budget"
	"github.com/fleet/fleet/internal/receipts"
	"github.com/fleet/fleet/internal/store"
	"github.com/fleet/fleet/internal/storetest"
)

func issueChain(t *testing.T, n int) (*receipts.Kernel, []receipts.Receipt) {
	t.Helper()
	ctx := context.Background()
	db, _ := storetest.MustCreate(t)
	k, err := receipts.NewKernel()
	if err != nil {
		t.Fatal(err)
	}
	var chain []receipts.Receipt
	err = db.WithTx(ctx, func(tx *store.Tx) error {
		if err := k.Save(ctx, tx); err != nil {
			return err
		}
		for i := range n {
			if _, err := receipts.Issue(ctx, tx, k, receipts.Draft{Kind: receipts.KindAdmission, OperationID: "op",
				Caller: "worker-1", Decision: "allow", Cost: int64(i), Accounting: budget.Accounting{Allowance: 50, Unit: "credits"}}); err != nil {
				return err
			}
		}
		loaded, err := receipts.LoadKernel(ctx, tx)
		if err != nil || loaded.PublicKey != k.PublicKey {
			t.Fatalf("reloaded kernel %v, %v", loaded, err)
		}
		chain, err = receipts.List(ctx, tx, "")
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return k, chain
}

func TestChain(t *testing.T) {
	storetest.Each(t, func(t *testing.T) {
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
		t.Run("ErrForgedSignature", func(t *testing.T) {
			k, chain := issueChain(t, 2)
			chain[1].Signature = chain[0].Signature
			if v := receipts.VerifyChain(chain, k.PublicKey); len(v) != 1 || !strings.Contains(v[0], "signature") {
				t.Fatal(v)
			}
		})
		t.Run("ErrOtherKernel", func(t *testing.T) {
			_, chain := issueChain(t, 1)
			other, _ := receipts.NewKernel()
			if v := receipts.VerifyChain(chain, other.PublicKey); len(v) == 0 {
				t.Fatal("a receipt verified against another kernel's key")
			}
		})
		t.Run("ErrDroppedReceipt", func(t *testing.T) {
			k, chain := issueChain(t, 3)
			v := receipts.VerifyChain([]receipts.Receipt{chain[0], chain[2]}, k.PublicKey)
			if len(v) != 2 {
				t.Fatalf("a gap in the chain gave %v", v)
			}
		})
	})
}

// TestCheckOne is the console's receipt view: a good receipt passes every
// check; a tampered body fails its id and signature; a missing predecessor
// fails the chain link.
func TestCheckOne(t *testing.T) {
	storetest.Each(t, func(t *testing.T) {
		ctx := context.Background()
		db, _ := storetest.MustCreate(t)
		k, err := receipts.NewKernel()
		if err != nil {
			t.Fatal(err)
		}
		var chain []receipts.Receipt
		err = db.WithTx(ctx, func(tx *store.Tx) error {
			for i := range 3 {
				r, err := receipts.Issue(ctx, tx, k, receipts.Draft{Kind: receipts.KindAdmission, OperationID: "op",
					Caller: "worker-1", Decision: "allow", Cost: int64(i + 1), Accounting: budget.Accounting{Allowance: 50, Unit: "credits"}})
				if err != nil {
					return err
				}
				chain = append(chain, r)
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		check := func(id, key string) receipts.Check {
			t.Helper()
			var c receipts.Check
			if err := db.WithTx(ctx, func(tx *store.Tx) (err error) {
				c, err = receipts.CheckOne(ctx, tx, id, key)
				return err
			}); err != nil {
				t.Fatal(err)
			}
			return c
		}
		exec := func(q string, args ...any) {
			t.Helper()
			if err := db.WithTx(ctx, func(tx *store.Tx) error { _, err := tx.ExecContext(ctx, q, args...); return err }); err != nil {
				t.Fatal(err)
			}
		}

		for i, r := range chain {
			c := check(r.ID, k.PublicKey)
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
		other, _ := receipts.NewKernel()
		if c := check(chain[0].ID, other.PublicKey); c.KernelTrusted || !c.SignatureValid || len(c.Problems) == 0 {
			t.Fatalf("checked against another kernel: %+v", c)
		}

		exec(`UPDATE receipts SET body = replace(body, '"cost":3', '"cost":30') WHERE id = $1`, chain[2].ID)
		if c := check(chain[2].ID, k.PublicKey); c.IDMatchesBody || c.SignatureValid || !c.Chain.Linked {
			t.Fatalf("tampered receipt: %+v", c)
		}
		exec(`DELETE FROM receipts WHERE id = $1`, chain[0].ID)
		if c := check(chain[1].ID, k.PublicKey); c.Chain.Linked || !c.SignatureValid || len(c.Problems) != 1 {
			t.Fatalf("receipt whose predecessor is gone: %+v", c)
		}
	})
}
