package admission_test

import (
	"context"
	"encoding/json"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/fleet/fleet/internal/fleet"
	"github.com/fleet/fleet/internal/host/access"
	"github.com/fleet/fleet/internal/host/admission"
	"github.com/fleet/fleet/internal/host/ledger"
	"github.com/fleet/fleet/internal/host/views"
	"github.com/fleet/fleet/internal/jobs"
	"github.com/fleet/fleet/internal/metrics"
	"github.com/fleet/fleet/internal/receipts"
	"github.com/fleet/fleet/internal/series"
	"github.com/fleet/fleet/internal/store"
	"github.com/fleet/fleet/internal/storetest"
	"github.com/fleet/fleet/internal/wire"
)

// TestAdmission, on both backends: with room for one report, the first
// claimed job is allowed (reserved, running, a signed receipt) and the
// second denied (refused); a repeat of the first answers its retained
// admission with the receipt as placed; a claim the job does not hold is
// stale, an unknown job not_found.
func TestAdmission(t *testing.T) {
	storetest.Each(t, func(t *testing.T) {
		ctx := context.Background()
		db, a, claimed := setup(t, 20, map[string]string{"op-1": wire.DefaultTenant, "op-2": wire.DefaultTenant}, nil)
		w := fleet.Caller{ID: "worker-1"}
		ref := func(j store.ClaimedJob) wire.ClaimRef {
			c := j.CurrentClaim()
			return wire.ClaimRef{ClaimID: c.ClaimID, Generation: c.Generation}
		}
		admit := func(j store.ClaimedJob) wire.Admission {
			t.Helper()
			raw, err := a.Dispatch(ctx, w, j.OperationID, ref(j))
			if err != nil {
				t.Fatal(err)
			}
			var adm wire.Admission
			json.Unmarshal(raw, &adm)
			return adm
		}
		first := admit(claimed[0])
		if first.Decision != wire.DecisionAllow || first.Receipt.Signature == "" || first.Accounting.Reserved != 20 {
			t.Fatalf("the first: %+v", first)
		}
		if second := admit(claimed[1]); second.Decision != wire.DecisionDeny || second.Accounting.Reserved != 20 {
			t.Fatalf("the second: %+v", second)
		}
		if again := admit(claimed[0]); again.Decision != wire.DecisionAllow || again.Receipt != first.Receipt {
			t.Fatalf("the first again: %+v, want its retained admission", again)
		}
		if _, err := a.Dispatch(ctx, w, "op-1", wire.ClaimRef{ClaimID: "another", Generation: 1}); fleet.ErrorCode(err) != wire.CodeStaleClaim {
			t.Fatalf("another claim: %v", err)
		}
		if _, err := a.Dispatch(ctx, w, "op-9", ref(claimed[0])); fleet.ErrorCode(err) != wire.CodeNotFound {
			t.Fatalf("an unknown job: %v", err)
		}
		for _, want := range []struct {
			op    string
			state wire.JobState
		}{{"op-1", wire.Running}, {"op-2", wire.Refused}} {
			storetest.Read(t, db, func(ctx context.Context, tx *store.Tx) error {
				j, err := tx.JobGet(ctx, want.op, store.NoLock)
				if err != nil || j.State != want.state {
					t.Fatalf("%s is %s (%v), want %s", want.op, j.State, err, want.state)
				}
				// The admission it keeps names its receipt, and no more of it.
				var kept struct {
					Receipt map[string]any `json:"receipt"`
				}
				if err := json.Unmarshal(j.Admission, &kept); err != nil || len(kept.Receipt) != 1 || kept.Receipt["id"] == nil {
					t.Fatalf("%s keeps the admission %s (%v)", want.op, j.Admission, err)
				}
				return nil
			})
		}
	})
}

// setup makes a state with allowance (at 20 a report), the tenants given
// (name to allowance, nil for none; default too), the credentials given
// and one job per operation id in its tenant, in id order, claims them
// all for worker-1 and answers the admission room.
func setup(t *testing.T, allowance int64, jobsIn map[string]string, capped map[string]*int64, credentials ...store.Credential) (*store.DB, *admission.Admission, []store.ClaimedJob) {
	t.Helper()
	db, _ := storetest.MustCreate(t)
	kernel, err := receipts.NewKernel()
	if err != nil {
		t.Fatal(err)
	}
	db.SetSealer(kernel)
	ops := slices.Sorted(maps.Keys(jobsIn))
	var claimed []store.ClaimedJob
	storetest.Write(t, db, func(ctx context.Context, tx *store.Tx) error {
		if err := tx.AccountingInsert(ctx, &store.AccountingInsertParams{Allowance: allowance, CostPerReport: 20}); err != nil {
			return err
		}
		if _, ok := capped[wire.DefaultTenant]; !ok {
			capped = maps.Clone(capped)
			if capped == nil {
				capped = map[string]*int64{}
			}
			capped[wire.DefaultTenant] = nil
		}
		for name, cap := range capped {
			if err := tx.TenantInsert(ctx, store.Tenant{Name: name, Allowance: cap, Weight: 1, CreatedAtMS: 1}); err != nil {
				return err
			}
		}
		for _, c := range credentials {
			if err := tx.CredentialInsert(ctx, c); err != nil {
				return err
			}
		}
		if err := tx.BatchInsert(ctx, store.Batch{Key: "b", RequestSHA256: "sha", Document: "text", CreatedMS: 1}); err != nil {
			return err
		}
		for i, op := range ops {
			if err := tx.DocumentInsert(ctx, "doc-"+op, 1); err != nil {
				return err
			}
			if err := tx.JobInsert(ctx, &store.JobInsertParams{OperationID: op, Position: int64(i + 1), BatchKey: "b",
				Section: "summary", DocumentID: "doc-" + op, InputSHA256: "in", CreatedAtMS: 1, MaxAttempts: 3,
				BackoffBaseMS: 1000, BackoffCapMS: 60000, ExpectedSHA256: "want", Tenant: jobsIn[op]}); err != nil {
				return err
			}
		}
		for _, tenant := range slices.Sorted(maps.Keys(capped)) {
			got, err := tx.JobClaimMany(ctx, &store.JobClaimManyParams{Tenant: tenant, Max: len(ops), ClaimPrefix: "c.", Worker: "worker-1",
				ClaimHost: "h", LeaseExpiresAtMS: tx.NowMS() + 60_000, NowMS: tx.NowMS()})
			if err != nil {
				return err
			}
			claimed = append(claimed, got...)
		}
		return nil
	})
	if len(claimed) != len(ops) {
		t.Fatalf("%d jobs claimed for the test", len(claimed))
	}
	slices.SortFunc(claimed, func(x, y store.ClaimedJob) int { return strings.Compare(x.OperationID, y.OperationID) })
	l := ledger.New(db, kernel)
	m := metrics.New(func(context.Context) (metrics.Snapshot, error) { return metrics.Snapshot{}, nil })
	return db, admission.New(l, m, series.New(), views.New(l, access.New(l, t.TempDir()), time.Minute), time.Minute), claimed
}

// TestAdmissionAtEveryLevel, on both backends: a job is admitted only if
// its tenant's allowance and the fleet's both cover it, reserved at both
// in one transaction; a denial names the level that was short, in the
// answer and the signed receipt, and leaves nothing reserved at any level
// (the tenant's part goes back when the fleet is short).
func TestAdmissionAtEveryLevel(t *testing.T) {
	storetest.Each(t, func(t *testing.T) {
		twenty := int64(20)
		db, a, claimed := setup(t, 60, map[string]string{"a1": "team-a", "a2": "team-a", "b1": "team-b", "b2": "team-b", "b3": "team-b"},
			map[string]*int64{"team-a": &twenty, "team-b": nil})
		w := fleet.Caller{ID: "worker-1"}
		byOp := map[string]store.ClaimedJob{}
		for _, j := range claimed {
			byOp[j.OperationID] = j
		}
		admit := func(op string) wire.Admission { t.Helper(); return dispatch(t, a, w, byOp[op]) }
		for _, step := range []struct {
			op, level       string
			allowed         bool
			fleetAvailable  int64
			tenantReserved  int64
			tenantAvailable int64
		}{
			{"a1", "", true, 40, 20, 0},
			{"a2", wire.LevelTenant, false, 40, 20, 0}, // the fleet has room; the tenant has none
			{"b1", "", true, 20, 20, 20},
			{"b2", "", true, 0, 40, 0},
			{"b3", wire.LevelFleet, false, 0, 40, 0}, // team-b has no cap; the fleet is out
		} {
			adm := admit(step.op)
			if (adm.Decision == wire.DecisionAllow) != step.allowed || adm.Level != step.level || adm.Receipt.Level != step.level ||
				adm.Receipt.Tenant != byOp[step.op].Tenant || adm.Accounting.Available != step.fleetAvailable ||
				adm.Tenant == nil || adm.Tenant.Reserved != step.tenantReserved || adm.Tenant.Available != step.tenantAvailable {
				t.Fatalf("%s: %+v (tenant %+v), want allowed %v at level %q, fleet available %d, tenant reserved %d available %d",
					step.op, adm, adm.Tenant, step.allowed, step.level, step.fleetAvailable, step.tenantReserved, step.tenantAvailable)
			}
			// The reason names the allowance that was short, as the level
			// does: a tenant's job denied for the fleet's allowance must not
			// read as its tenant's.
			short := map[string]string{wire.LevelTenant: "tenant team-a's allowance exhausted", wire.LevelFleet: "the fleet's allowance exhausted"}
			if !step.allowed && !strings.Contains(adm.Reason, short[step.level]) {
				t.Fatalf("%s: the reason %q does not say what was short (%q)", step.op, adm.Reason, short[step.level])
			}
		}
		storetest.Read(t, db, func(ctx context.Context, tx *store.Tx) error {
			for name, want := range map[string]int64{"team-a": 20, "team-b": 40, wire.DefaultTenant: 0} {
				if got, err := tx.TenantGet(ctx, name); err != nil || got.Reserved != want || got.Spent != 0 {
					t.Fatalf("tenant %s: %+v (%v), want %d reserved", name, got, err, want)
				}
			}
			if acct, err := tx.AccountingGet(ctx, store.NoLock); err != nil || acct.Reserved != 60 || acct.Calls != 3 {
				t.Fatalf("fleet: %+v (%v)", acct, err)
			}
			return nil
		})
	})
}

// TestAdmissionAtTheCredential, on both backends: a credential with an
// allowance of its own (an agent's cap) reserves at it too, in the same
// transaction; past it a job is refused naming the credential, with
// nothing held at the tenant or the fleet; settlement moves it; a caller
// with no cap of its own reserves nothing there.
func TestAdmissionAtTheCredential(t *testing.T) {
	storetest.Each(t, func(t *testing.T) {
		twenty := int64(20)
		db, a, claimed := setup(t, 100, map[string]string{"op-1": wire.DefaultTenant, "op-2": wire.DefaultTenant, "op-3": wire.DefaultTenant}, nil,
			store.Credential{Name: "worker-1", Role: "worker", SHA256: "w1", CreatedMS: 1, Allowance: &twenty})
		capped := fleet.Caller{ID: "worker-1", Capped: true}
		admit := func(caller fleet.Caller, j store.ClaimedJob) wire.Admission {
			t.Helper()
			return dispatch(t, a, caller, j)
		}
		first := admit(capped, claimed[0])
		if first.Decision != wire.DecisionAllow || first.Credential == nil || first.Credential.Reserved != 20 || first.Credential.Available != 0 ||
			first.Receipt.Credential != "worker-1" {
			t.Fatalf("the first, within the credential's 20: %+v (credential %+v)", first, first.Credential)
		}
		second := admit(capped, claimed[1])
		if second.Decision != wire.DecisionDeny || second.Level != wire.LevelCredential || second.Receipt.Level != wire.LevelCredential ||
			!strings.Contains(second.Reason, "credential worker-1") || second.Accounting.Reserved != 20 || second.Tenant.Reserved != 20 {
			t.Fatalf("the second, past the credential's 20: %+v (tenant %+v)", second, second.Tenant)
		}
		// The same worker, uncapped (an older host's copy could not say
		// otherwise: a credential's allowance is fixed when it is added).
		third := admit(fleet.Caller{ID: "worker-1"}, claimed[2])
		if third.Decision != wire.DecisionAllow || third.Credential != nil || third.Receipt.Credential != "" {
			t.Fatalf("a caller with no cap of its own: %+v", third)
		}
		storetest.Write(t, db, func(ctx context.Context, tx *store.Tx) error {
			j, err := tx.JobGet(ctx, "op-1", store.ForUpdate)
			if err != nil || j.ReserveCredential != "worker-1" {
				t.Fatalf("the admitted job holds its part at %q (%v)", j.ReserveCredential, err)
			}
			_, err = jobs.Spend(ctx, tx, &j, 15)
			return err
		})
		storetest.Read(t, db, func(ctx context.Context, tx *store.Tx) error {
			c, err := tx.CredentialGet(ctx, "worker-1", store.NoLock)
			if err != nil || c.Spent != 15 || c.Reserved != 0 {
				t.Fatalf("the credential after its job settled 15: %+v (%v)", c, err)
			}
			return nil
		})
	})
}

// dispatch admits a claimed job under its current claim as caller.
func dispatch(t *testing.T, a *admission.Admission, caller fleet.Caller, j store.ClaimedJob) wire.Admission {
	t.Helper()
	c := j.CurrentClaim()
	raw, err := a.Dispatch(context.Background(), caller, j.OperationID, wire.ClaimRef{ClaimID: c.ClaimID, Generation: c.Generation})
	if err != nil {
		t.Fatal(err)
	}
	var adm wire.Admission
	if err := json.Unmarshal(raw, &adm); err != nil {
		t.Fatal(err)
	}
	return adm
}
