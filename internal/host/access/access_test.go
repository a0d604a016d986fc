package access_test

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fleet/fleet/internal/fleet"
	"github.com/fleet/fleet/internal/host/access"
	"github.com/fleet/fleet/internal/host/ledger"
	"github.com/fleet/fleet/internal/receipts"
	"github.com/fleet/fleet/internal/statedir"
	"github.com/fleet/fleet/internal/store"
	"github.com/fleet/fleet/internal/storetest"
	"github.com/fleet/fleet/internal/wire"
)

// newState makes a state with an allowance and the credentials named (a
// worker's each, the operator's for its name), and answers its
// directory, database, location and kernel.
func newState(t *testing.T, names ...string) (string, *store.DB, string, *receipts.Kernel) {
	t.Helper()
	stateDir := t.TempDir()
	db, location := storetest.MustCreate(t)
	kernel, err := receipts.NewKernel()
	if err != nil {
		t.Fatal(err)
	}
	storetest.Write(t, db, func(ctx context.Context, tx *store.Tx) error {
		if err := tx.AccountingInsert(ctx, &store.AccountingInsertParams{Allowance: 100, CostPerReport: 20}); err != nil {
			return err
		}
		for _, name := range names {
			role := access.RoleWorker
			if name == access.OperatorName {
				role = access.RoleOperator
			}
			if err := access.Insert(ctx, tx, stateDir, name, role); err != nil {
				return err
			}
		}
		return nil
	})
	return stateDir, db, location, kernel
}

// TestCredentials, on both backends: two hosts' views of one state's
// credentials. A token is its caller and role; a change made through one
// host counts there at once and on the other within a second (the
// injectable clock moves it on), is signed and logged, and a session's
// credential stops being in force with it; a worker's calls are noted for
// the workers view.
func TestCredentials(t *testing.T) {
	storetest.Each(t, func(t *testing.T) {
		ctx := context.Background()
		stateDir, db, location, kernel := newState(t, access.OperatorName, "worker-1")
		clock := storetest.NewClock(time.Now())
		view := func(db *store.DB) *access.Credentials {
			db.Now = clock.Now
			db.SetSealer(kernel)
			return access.New(ledger.New(db, kernel), stateDir)
		}
		a, b := view(db), view(storetest.MustOpen(t, location))
		token := func(name string) string {
			t.Helper()
			tok, err := statedir.ReadCredential(filepath.Join(stateDir, "credentials", name))
			if err != nil {
				t.Fatal(err)
			}
			return tok
		}

		caller, role, err := b.Authenticate(ctx, token("worker-1"))
		if err != nil || caller.ID != "worker-1" || role != access.RoleWorker {
			t.Fatalf("worker-1's token: %+v %s (%v)", caller, role, err)
		}
		if at, ok := b.LastCall("worker-1"); !ok || at != clock.Now().UnixMilli() {
			t.Fatalf("worker-1's last call: %d %v", at, ok)
		}
		if _, ok := a.LastCall("worker-1"); ok {
			t.Fatal("a host worker-1 never called noted a call")
		}
		if _, role, err := a.Authenticate(ctx, token(access.OperatorName)); err != nil || role != access.RoleOperator {
			t.Fatalf("the operator's token: %s (%v)", role, err)
		}

		changed, err := a.Revoke(ctx, "worker-1")
		if err != nil || !changed.Changed || changed.ReceiptID == "" {
			t.Fatalf("revoke: %+v (%v)", changed, err)
		}
		if _, _, err := a.Authenticate(ctx, token("worker-1")); err == nil || !strings.Contains(err.Error(), "was revoked at") {
			t.Fatalf("the revoking host, at once: %v", err)
		}
		if _, err := b.InForce(ctx, caller); err != nil {
			t.Fatalf("the other host before a second has passed: %v (its copy is fresh for a second)", err)
		}
		clock.Advance(time.Second)
		if _, err := b.InForce(ctx, caller); fleet.ErrorCode(err) != wire.CodeUnauthorized {
			t.Fatalf("the other host a second later: %v", err)
		}
		var kinds []wire.EventKind
		storetest.Read(t, db, func(ctx context.Context, tx *store.Tx) error {
			evs, err := tx.EventList(ctx, 0, 10)
			for _, e := range evs {
				kinds = append(kinds, e.Kind)
			}
			return err
		})
		if len(kinds) != 1 || kinds[0] != wire.EventCredential {
			t.Fatalf("the log after the revocation: %v", kinds)
		}
	})
}

// TestRevokeRacingRotate, on both backends: a revocation racing a
// rotation of the same credential from another host leaves it revoked,
// whichever commits first (a rotation after it is refused), and two
// revocations racing are one change and one that finds it revoked. Eight
// rounds, each on a credential of its own, since one may not run the
// race.
func TestRevokeRacingRotate(t *testing.T) {
	storetest.Each(t, func(t *testing.T) {
		ctx := context.Background()
		const rounds = 8
		var names []string
		for i := range rounds {
			names = append(names, fmt.Sprintf("worker-%d", i))
		}
		stateDir, db, location, kernel := newState(t, names...)
		view := func(db *store.DB) *access.Credentials {
			db.SetSealer(kernel)
			return access.New(ledger.New(db, kernel), stateDir)
		}
		a, b := view(db), view(storetest.MustOpen(t, location))
		for i := range rounds {
			name := fmt.Sprintf("worker-%d", i)
			var revoked, rotated, again wire.CredentialChange
			var revokeErr, rotateErr, againErr error
			var wg sync.WaitGroup
			start := make(chan struct{})
			wg.Add(3)
			go func() { defer wg.Done(); <-start; revoked, revokeErr = a.Revoke(ctx, name) }()
			go func() { defer wg.Done(); <-start; rotated, rotateErr = b.Rotate(ctx, name) }()
			go func() { defer wg.Done(); <-start; again, againErr = b.Revoke(ctx, name) }()
			close(start)
			wg.Wait()
			if revokeErr != nil || againErr != nil || revoked.Changed == again.Changed {
				t.Fatalf("%s: two revocations racing: %+v (%v) and %+v (%v), want one change", name, revoked, revokeErr, again, againErr)
			}
			if rotateErr != nil && fleet.ErrorCode(rotateErr) != wire.CodeStateConflict {
				t.Fatalf("%s: the rotation: %v, want made or state_conflict", name, rotateErr)
			}
			list, err := a.List(ctx)
			if err != nil {
				t.Fatal(err)
			}
			for _, c := range list {
				if c.Name == name && c.RevokedAtMS == 0 {
					t.Fatalf("%s is in force after a revocation racing a rotation (%+v, %v)", name, rotated, rotateErr)
				}
			}
		}
	})
}
