package verify_test

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/fleet/fleet/internal/receipts"
	"github.com/fleet/fleet/internal/statedir"
	"github.com/fleet/fleet/internal/store"
	"github.com/fleet/fleet/internal/store/backend"
	"github.com/fleet/fleet/internal/storetest"
	"github.com/fleet/fleet/internal/verify"
	"github.com/fleet/fleet/internal/wire"
)

// TestVerifyNeverIdlesInItsTransaction: on PostgreSQL, a session left idle
// in a transaction past idle_in_transaction_session_timeout is ended by the
// server (the hosts' pool sets it for every session). verify checks a
// chain of 8,000 receipts, which takes about twice the 250 ms this test's
// session allows (longer on a loaded machine), and still reads the whole
// state: it reads first and checks after, and between its reads it does
// little but decode rows.
func TestVerifyNeverIdlesInItsTransaction(t *testing.T) {
	if storetest.PostgresURL() == "" {
		t.Skip("SKIPPED: needs PostgreSQL; set " + storetest.EnvPostgres)
	}
	ctx := context.Background()
	location := storetest.NewPostgresLocation(t)
	db, err := backend.Create(ctx, location)
	if err != nil {
		t.Fatal(err)
	}
	kernel, err := receipts.NewKernel()
	if err != nil {
		t.Fatal(err)
	}
	db.SetSealer(kernel)
	storetest.Write(t, db, func(ctx context.Context, tx *store.Tx) error {
		if err := tx.KernelInsert(ctx, store.Kernel{PublicKey: kernel.PublicKey, Seed: kernel.Seed(), CreatedAtMS: 1}); err != nil {
			return err
		}
		if err := tx.AccountingInsert(ctx, &store.AccountingInsertParams{Allowance: 100, CostPerReport: 20}); err != nil {
			return err
		}
		return tx.TenantInsert(ctx, store.Tenant{Name: wire.DefaultTenant, Weight: 1, CreatedAtMS: 1})
	})
	for range 80 {
		storetest.Write(t, db, func(ctx context.Context, tx *store.Tx) error {
			for range 100 {
				if _, err := tx.AppendReceipt(kernel.Prepare(receipts.Draft{Kind: wire.KindClaims, OperationID: "claims", Caller: "operator",
					Decision: wire.DecisionPaused}, tx.NowMS())); err != nil {
					return err
				}
			}
			return nil
		})
	}
	db.Close()
	state := t.TempDir()
	trusted, _ := json.Marshal(kernel.Trusted())
	if err := os.WriteFile(filepath.Join(state, statedir.TrustedKernelFile), trusted, 0o600); err != nil {
		t.Fatal(err)
	}
	ro, err := backend.OpenReadOnly(ctx, location+"&idle_in_transaction_session_timeout=250")
	if err != nil {
		t.Fatal(err)
	}
	defer ro.Close()
	rep, err := verify.State(ctx, state, ro)
	if err != nil || !rep.OK || rep.Receipts != 8000 {
		t.Fatalf("verify: %v, %d receipts, violations %v", err, rep.Receipts, rep.Violations)
	}
}
