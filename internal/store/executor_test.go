package store_test

// The driver conformance suite, after River's riverdrivertest: subtests
// grouped by table over store.Executor's operations (not yet one per
// operation), each run unchanged on SQLite and on PostgreSQL through
// storetest.Each. The host's own suite
// (internal/host/conformance_test.go) runs on top of it.

import (
	"context"
	"encoding/json"
	"fmt"
	"reflect"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fleet/fleet/internal/store"
	"github.com/fleet/fleet/internal/storetest"
	"github.com/fleet/fleet/internal/wire"
)

// exerciseSetup is a fresh database with an accounting row (allowance 100,
// cost 20) and one batch "b" of three queued jobs op-1..op-3 on documents
// doc-1..doc-3, at positions 1..3.
func exerciseSetup(t *testing.T) *store.DB {
	t.Helper()
	db, _ := exerciseSetupAt(t)
	return db
}

// exerciseSetupAt is exerciseSetup, with the database's location.
func exerciseSetupAt(t *testing.T) (*store.DB, string) {
	t.Helper()
	db, location := storetest.MustCreate(t)
	storetest.Write(t, db, func(ctx context.Context, tx *store.Tx) error {
		if err := tx.AccountingInsert(ctx, 100, 20); err != nil {
			return err
		}
		if err := tx.BatchInsert(ctx, store.Batch{Key: "b", RequestSHA256: "sha", Document: "text", CreatedMS: 1}); err != nil {
			return err
		}
		for i := 1; i <= 3; i++ {
			doc := fmt.Sprint("doc-", i)
			if err := tx.DocumentInsert(ctx, doc, 1); err != nil {
				return err
			}
			if err := tx.JobInsert(ctx, wire.Job{OperationID: fmt.Sprint("op-", i), Position: int64(i), Batch: "b",
				Section: "summary", DocumentID: doc, InputSHA256: "in", State: wire.Queued, CreatedAtMS: 1,
				MaxAttempts: 3, BackoffBaseMS: 1000, BackoffCapMS: 60000}); err != nil {
				return err
			}
		}
		return nil
	})
	return db, location
}

// write runs fn in a write transaction and returns its error.
func write(db *store.DB, fn func(ctx context.Context, tx *store.Tx) error) error {
	ctx := context.Background()
	return db.WithTx(ctx, func(tx *store.Tx) error { return fn(ctx, tx) })
}

// testSealer places receipts with a stand-in signature naming the place.
type testSealer struct{}

func (testSealer) Seal(r *wire.Receipt, prevSequence int64, prevID string) ([]byte, error) {
	r.Sequence, r.Prev, r.Signature = prevSequence+1, nil, fmt.Sprint("sig-", prevSequence+1)
	if prevID != "" {
		r.Prev = &prevID
	}
	return json.Marshal(r)
}

// must returns v, or panics with err: inside a transaction the panic fails
// the test (WithTx returns it as the request's error).
func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

func TestExecutor(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T) {
		t.Run("Settings", func(t *testing.T) {
			db := exerciseSetup(t)
			storetest.Write(t, db, func(ctx context.Context, tx *store.Tx) error {
				if err := tx.SettingPut(ctx, "a", "1"); err != nil {
					return err
				}
				return tx.SettingPut(ctx, "a", "2") // an upsert
			})
			storetest.Read(t, db, func(ctx context.Context, tx *store.Tx) error {
				if got := must(tx.SettingList(ctx)); !reflect.DeepEqual(got, map[string]string{"a": "2"}) {
					t.Fatalf("settings %v", got)
				}
				return nil
			})
		})

		t.Run("Kernel", func(t *testing.T) {
			db := exerciseSetup(t)
			storetest.Write(t, db, func(ctx context.Context, tx *store.Tx) error { return tx.KernelInsert(ctx, "pub", []byte{1, 2, 3}, 5) })
			if err := write(db, func(ctx context.Context, tx *store.Tx) error { return tx.KernelInsert(ctx, "other", []byte{4}, 6) }); err == nil {
				t.Fatal("a second kernel key was stored")
			}
			storetest.Read(t, db, func(ctx context.Context, tx *store.Tx) error {
				pub, seed, err := tx.KernelGet(ctx)
				if err != nil || pub != "pub" || !reflect.DeepEqual(seed, []byte{1, 2, 3}) {
					t.Fatalf("kernel %q %v %v", pub, seed, err)
				}
				return nil
			})
		})

		t.Run("Hosts", func(t *testing.T) {
			db := exerciseSetup(t)
			a := store.Host{ID: "a", Instance: "i1", URL: "http://a", StartedAtMS: 1, SeenAtMS: 1, Serving: true}
			storetest.Write(t, db, func(ctx context.Context, tx *store.Tx) error {
				if _, err := tx.HostGet(ctx, "a"); !store.IsNotFound(err) {
					t.Fatalf("an absent host: %v", err)
				}
				if err := tx.HostPut(ctx, a); err != nil {
					return err
				}
				if found, serving, err := tx.HostSeen(ctx, "a", "i1", 5); err != nil || !found || !serving {
					t.Fatalf("renewing its own record: %v %v %v", found, serving, err)
				}
				if found, _, err := tx.HostSeen(ctx, "a", "other", 9); err != nil || found {
					t.Fatalf("another instance renewed a's record: %v %v", found, err)
				}
				// Retiring takes the record as it was read: a renewal since, or
				// a retirement by another, leaves nothing to retire.
				a.SeenAtMS = 5
				if ok, err := tx.HostRetire(ctx, store.Host{ID: "a", Instance: "i1", SeenAtMS: 1}); err != nil || ok {
					t.Fatalf("retired a host that renewed since: %v %v", ok, err)
				}
				if ok, err := tx.HostRetire(ctx, a); err != nil || !ok {
					t.Fatalf("retiring a host unseen since it was read: %v %v", ok, err)
				}
				if ok, err := tx.HostRetire(ctx, a); err != nil || ok {
					t.Fatalf("retired a host twice: %v %v", ok, err)
				}
				if found, serving, err := tx.HostSeen(ctx, "a", "i1", 6); err != nil || !found || serving {
					t.Fatalf("a retired host renewing: found %v, serving %v, %v; want found, not serving", found, serving, err)
				}
				a.Instance, a.Serving, a.SeenAtMS = "i2", false, 7 // a replace, not a second row
				return tx.HostPut(ctx, a)
			})
			storetest.Read(t, db, func(ctx context.Context, tx *store.Tx) error {
				got := must(tx.HostGet(ctx, "a"))
				all := must(tx.HostList(ctx))
				if got != a || len(all) != 1 || all[0] != a {
					t.Fatalf("host %+v, list %+v", got, all)
				}
				return nil
			})
		})

		t.Run("Credentials", func(t *testing.T) {
			db := exerciseSetup(t)
			storetest.Write(t, db, func(ctx context.Context, tx *store.Tx) error {
				if _, err := tx.CredentialGet(ctx, "worker-1"); !store.IsNotFound(err) {
					t.Fatalf("an absent credential: %v", err)
				}
				return tx.CredentialInsert(ctx, store.Credential{Name: "worker-1", Role: "worker", SHA256: "ab", CreatedMS: 7})
			})
			if err := write(db, func(ctx context.Context, tx *store.Tx) error {
				return tx.CredentialInsert(ctx, store.Credential{Name: "worker-2", Role: "worker", SHA256: "ab", CreatedMS: 7})
			}); err == nil {
				t.Fatal("two credentials with one digest")
			}
			storetest.Read(t, db, func(ctx context.Context, tx *store.Tx) error {
				c := must(tx.CredentialGet(ctx, "worker-1"))
				all := must(tx.CredentialList(ctx))
				if c.Role != "worker" || c.SHA256 != "ab" || c.RevokedMS != 0 || len(all) != 1 || all[0] != c {
					t.Fatalf("credential %+v, list %+v", c, all)
				}
				return nil
			})
			storetest.Write(t, db, func(ctx context.Context, tx *store.Tx) error {
				if err := tx.CredentialUpdate(ctx, store.Credential{Name: "nobody", SHA256: "cd", RevokedMS: 9}); !store.IsNotFound(err) {
					t.Fatalf("updating an absent credential: %v", err)
				}
				return tx.CredentialUpdate(ctx, store.Credential{Name: "worker-1", SHA256: "cd", RevokedMS: 9})
			})
			storetest.Read(t, db, func(ctx context.Context, tx *store.Tx) error {
				c := must(tx.CredentialGet(ctx, "worker-1"))
				if c.SHA256 != "cd" || c.RevokedMS != 9 || c.Role != "worker" || c.CreatedMS != 7 {
					t.Fatalf("after update: %+v", c)
				}
				return nil
			})
		})

		t.Run("AccountingReserveMove", func(t *testing.T) {
			db := exerciseSetup(t)
			storetest.Write(t, db, func(ctx context.Context, tx *store.Tx) error {
				var shards []int64
				for i := range 6 {
					a, shard, ok, err := tx.AccountingReserve(ctx)
					if err != nil {
						return err
					}
					if ok != (i < 5) || a.Reserved != int64(min(i+1, 5))*20 || a.Available < 0 || ok && shard < 0 {
						t.Fatalf("reservation %d: ok %v, shard %d, %+v", i, ok, shard, a)
					}
					shards = append(shards, shard)
				}
				// Settle 20 of one reservation as spent, release another's 20
				// (from any shard).
				a, ok, err := tx.AccountingMove(ctx, -1, 40, 20)
				if err != nil || !ok || a.Spent != 20 || a.Reserved != 60 || a.Available != 20 || a.Calls != 5 {
					t.Fatalf("move: %v %+v %v", ok, a, err)
				}
				// Settling where a reservation was made.
				if a, ok, err = tx.AccountingMove(ctx, shards[4], 20, 20); err != nil || !ok || a.Spent != 40 || a.Reserved != 40 {
					t.Fatalf("move on the reserving shard %d: %v %+v %v", shards[4], ok, a, err)
				}
				// Moving more than is reserved is refused and changes nothing.
				if a, ok, err := tx.AccountingMove(ctx, -1, 41, 41); err != nil || ok || a.Reserved != 40 {
					t.Fatalf("over-move: %v %+v %v", ok, a, err)
				}
				return nil
			})
		})

		t.Run("AccountingReserveRace", func(t *testing.T) {
			// 48 goroutines on three handles (their own connections) reserve
			// 20 credits each from 100: exactly 5 succeed, never negative.
			db := exerciseSetup(t)
			handles := []*store.DB{db, storetest.MustOpen(t, db.Location()), storetest.MustOpen(t, db.Location())}
			if storetest.OnPostgres(t) {
				handles = []*store.DB{db, db, db} // Location is redacted; the one pool already has many connections
			}
			var granted atomic.Int64
			var wg sync.WaitGroup
			for i := range 48 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					err := write(handles[i%3], func(ctx context.Context, tx *store.Tx) error {
						a, _, ok, err := tx.AccountingReserve(ctx)
						if a.Available < 0 {
							t.Errorf("available went negative: %+v", a)
						}
						if ok {
							granted.Add(1)
						}
						return err
					})
					if err != nil {
						t.Error(err)
					}
				}()
			}
			wg.Wait()
			storetest.Read(t, db, func(ctx context.Context, tx *store.Tx) error {
				a := must(tx.AccountingGet(ctx, store.NoLock))
				if granted.Load() != 5 || a.Reserved != 100 || a.Available != 0 || a.Calls != 5 {
					t.Fatalf("granted %d, accounting %+v", granted.Load(), a)
				}
				return nil
			})
		})

		t.Run("AccountingSetAllowance", func(t *testing.T) {
			db := exerciseSetup(t)
			storetest.Write(t, db, func(ctx context.Context, tx *store.Tx) error {
				a := must(tx.AccountingSetAllowance(ctx, 150))
				if a.Allowance != 150 || a.Available != 150 || a.CostPerReport != 20 || a.Unit != "credits" {
					t.Fatalf("%+v", a)
				}
				return nil
			})
			// The database's own check refuses an allowance below what is held.
			if err := write(db, func(ctx context.Context, tx *store.Tx) error {
				if _, _, _, err := tx.AccountingReserve(ctx); err != nil {
					return err
				}
				_, err := tx.AccountingSetAllowance(ctx, 10)
				return err
			}); err == nil {
				t.Fatal("allowance set below reserved")
			}
		})

		t.Run("Batches", func(t *testing.T) {
			db := exerciseSetup(t)
			storetest.Read(t, db, func(ctx context.Context, tx *store.Tx) error {
				b := must(tx.BatchGet(ctx, "b"))
				ops := must(tx.JobListByBatch(ctx, "b"))
				if b.Document != "text" || b.RequestSHA256 != "sha" || !reflect.DeepEqual(ops, []string{"op-1", "op-2", "op-3"}) {
					t.Fatalf("batch %+v, jobs %v", b, ops)
				}
				if _, err := tx.BatchGet(ctx, "nope"); !store.IsNotFound(err) {
					t.Fatalf("an absent batch: %v", err)
				}
				return nil
			})
		})

		t.Run("JobGetUpdate", func(t *testing.T) {
			db := exerciseSetup(t)
			storetest.Write(t, db, func(ctx context.Context, tx *store.Tx) error {
				j := must(tx.JobGet(ctx, "op-2", store.ForUpdate))
				if j.State != wire.Queued || j.Position != 2 || j.DocumentID != "doc-2" || j.Generation != 0 || j.DocumentVersion != 0 || j.Outcome != nil {
					t.Fatalf("job %+v", j)
				}
				j.State, j.ClaimID, j.Worker, j.LeaseExpiresAtMS, j.Reserved = wire.Running, "c", "w", 99, 20
				j.AdmissionClaimID, j.Admission, j.Reason, j.UpdatedAtMS, j.ClaimHost = "c", json.RawMessage(`{"decision":"allow"}`), "why", 5, "host-a"
				if err := tx.JobUpdate(ctx, j); err != nil {
					return err
				}
				got := must(tx.JobGet(ctx, "op-2", store.NoLock))
				if !reflect.DeepEqual(got, j) {
					t.Fatalf("saved %+v, read %+v", j, got)
				}
				if _, err := tx.JobGet(ctx, "nope", store.ForUpdate); !store.IsNotFound(err) {
					t.Fatalf("an absent job: %v", err)
				}
				return nil
			})
		})

		t.Run("JobNextQueued", func(t *testing.T) {
			db := exerciseSetup(t)
			storetest.Write(t, db, func(ctx context.Context, tx *store.Tx) error {
				// op-1 backs off until 100: it is passed over before then,
				// and the first to take after.
				op1 := must(tx.JobGet(ctx, "op-1", store.ForUpdate))
				op1.ClaimableAtMS, op1.Attempts, op1.LastError = 100, 1, "boom"
				if err := tx.JobUpdate(ctx, op1); err != nil {
					return err
				}
				for _, step := range []struct {
					want  string
					nowMS int64
				}{{"op-2", 50}, {"op-3", 50}, {"", 99}, {"op-1", 100}} {
					j, in, err := tx.JobNextQueued(ctx, step.nowMS)
					if step.want == "" {
						if !store.IsNotFound(err) {
							t.Fatalf("at %d only a job backing off is queued: %+v, %v", step.nowMS, j, err)
						}
						continue
					}
					if err != nil {
						return err
					}
					want := step.want
					if err != nil {
						return err
					}
					if j.OperationID != want || in != (wire.Input{Document: "text", Section: "summary"}) ||
						(want == "op-1" && (j.Attempts != 1 || j.LastError != "boom" || j.MaxAttempts != 3)) {
						t.Fatalf("claimed %s with input %+v, want %s (queue order) and the batch's document", j.OperationID, in, want)
					}
					j.State = wire.Claimed
					if err := tx.JobUpdate(ctx, j); err != nil {
						return err
					}
				}
				if _, _, err := tx.JobNextQueued(ctx, 1000); !store.IsNotFound(err) {
					t.Fatalf("an empty queue: %v", err)
				}
				return nil
			})
		})

		t.Run("Attempts", func(t *testing.T) {
			db := exerciseSetup(t)
			mk := func(n int64, retryable bool) store.Attempt {
				return store.Attempt{OperationID: "op-1", ClaimID: fmt.Sprint("c-", n), Answer: []byte(`{"state":"queued"}`),
					Attempt: wire.Attempt{Attempt: n, Worker: "w", Generation: n, Reason: fmt.Sprint("reason ", n),
						Retryable: retryable, Outcome: "retry", Cost: 20 * n, AtMS: 100 + n}}
			}
			storetest.Write(t, db, func(ctx context.Context, tx *store.Tx) error {
				if err := tx.AttemptInsert(ctx, mk(2, false)); err != nil {
					return err
				}
				return tx.AttemptInsert(ctx, mk(1, true))
			})
			if err := write(db, func(ctx context.Context, tx *store.Tx) error { return tx.AttemptInsert(ctx, mk(1, true)) }); err == nil {
				t.Fatal("one attempt number recorded twice")
			}
			storetest.Read(t, db, func(ctx context.Context, tx *store.Tx) error {
				got := must(tx.AttemptList(ctx, "op-1"))
				if len(got) != 2 || !reflect.DeepEqual(got[0], mk(1, true)) || !reflect.DeepEqual(got[1], mk(2, false)) {
					t.Fatalf("attempts %+v", got)
				}
				if none := must(tx.AttemptList(ctx, "op-2")); len(none) != 0 {
					t.Fatalf("another job's attempts: %+v", none)
				}
				return nil
			})
		})

		t.Run("JobNextQueuedConcurrent", func(t *testing.T) {
			// Two write transactions open at once never take the same job:
			// PostgreSQL passes over the row the first holds; SQLite's one
			// writer does not let the second begin until the first ends.
			db := exerciseSetup(t)
			ctx := context.Background()
			first := must(db.Driver().BeginWrite(ctx))
			defer first.Rollback()
			j1, _, err := first.JobNextQueued(ctx, 10)
			if err != nil {
				t.Fatal(err)
			}
			waitCtx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
			defer cancel()
			second, err := db.Driver().BeginWrite(waitCtx)
			if err == nil {
				defer second.Rollback()
				var j2 wire.Job
				if j2, _, err = second.JobNextQueued(waitCtx, 10); err == nil && j2.OperationID == j1.OperationID {
					t.Fatalf("two open transactions both took %s", j1.OperationID)
				}
			}
			if storetest.OnPostgres(t) && err != nil {
				t.Fatalf("the second claimer was blocked instead of passing over: %v", err)
			}
			if !storetest.OnPostgres(t) && err == nil {
				t.Fatal("a second SQLite writer began while the first was open")
			}
		})

		t.Run("TryLockLog", func(t *testing.T) {
			// The first transaction takes the log lock; on PostgreSQL a second
			// open at once is told it is held, without waiting, and takes it
			// once the first has ended. (SQLite's one writer always holds it.)
			db := exerciseSetup(t)
			ctx := context.Background()
			first := must(db.Driver().BeginWrite(ctx))
			if ok, err := first.TryLockLog(ctx); err != nil || !ok {
				t.Fatalf("first: %v %v", ok, err)
			}
			if storetest.OnPostgres(t) {
				second := must(db.Driver().BeginWrite(ctx))
				defer second.Rollback()
				if ok, err := second.TryLockLog(ctx); err != nil || ok {
					t.Fatalf("second while the first holds it: %v %v", ok, err)
				}
				second.Rollback()
				first.Rollback()
				third := must(db.Driver().BeginWrite(ctx))
				defer third.Rollback()
				if ok, err := third.TryLockLog(ctx); err != nil || !ok {
					t.Fatalf("after the first ended: %v %v", ok, err)
				}
			}
			first.Rollback()
		})

		t.Run("JobLists", func(t *testing.T) {
			db := exerciseSetup(t)
			storetest.Write(t, db, func(ctx context.Context, tx *store.Tx) error {
				for op, lease := range map[string]int64{"op-1": 50, "op-3": 500} {
					j := must(tx.JobGet(ctx, op, store.ForUpdate))
					j.State, j.LeaseExpiresAtMS, j.ClaimHost = wire.Claimed, lease, "host-"+op
					if err := tx.JobUpdate(ctx, j); err != nil {
						return err
					}
				}
				all := must(tx.JobList(ctx))
				claimed := must(tx.JobListClaimedBy(ctx, []string{"host-op-1", "host-op-3", "host-op-2"}))
				if byOne := must(tx.JobListClaimedBy(ctx, []string{"host-op-3", "elsewhere"})); len(byOne) != 1 || byOne[0].OperationID != "op-3" {
					t.Fatalf("claimed by host-op-3: %+v", byOne)
				}
				if none := must(tx.JobListClaimedBy(ctx, nil)); len(none) != 0 {
					t.Fatalf("claimed by no host: %+v", none)
				}
				expired := must(tx.JobListExpired(ctx, 100, store.ForUpdate))
				pending := must(tx.JobPending(ctx))
				byState := must(tx.JobCountByState(ctx))
				if len(all) != 3 || all[0].OperationID != "op-1" || all[2].OperationID != "op-3" ||
					len(claimed) != 2 || len(expired) != 1 || expired[0].OperationID != "op-1" || !pending ||
					!reflect.DeepEqual(byState, map[wire.JobState]int64{wire.Queued: 1, wire.Claimed: 2}) {
					t.Fatalf("all %d, claimed %d, expired %+v, pending %v, by state %v", len(all), len(claimed), expired, pending, byState)
				}
				if tail := must(tx.JobMaxPosition(ctx)); tail != 3 {
					t.Fatalf("queue tail %d", tail)
				}
				return nil
			})
		})

		t.Run("JobListClaimedUnder", func(t *testing.T) {
			db := exerciseSetup(t)
			storetest.Write(t, db, func(ctx context.Context, tx *store.Tx) error {
				for op, claim := range map[string]string{"op-1": "key-a.0", "op-2": "key-a.1", "op-3": "key-b.0"} {
					j := must(tx.JobGet(ctx, op, store.ForUpdate))
					d := must(tx.DocumentGet(ctx, j.DocumentID, store.ForUpdate))
					if _, ok, err := tx.DocumentSetOwner(ctx, d.ID, &d.Generation, "w1", 1); err != nil || !ok {
						t.Fatalf("own %s: %v %v", d.ID, ok, err)
					}
					j.State, j.Worker, j.ClaimID = wire.Claimed, "w1", claim
					if err := tx.JobUpdate(ctx, j); err != nil {
						return err
					}
				}
				got := must(tx.JobListClaimedUnder(ctx, "w1", "key-a."))
				if len(got) != 2 || got[0].OperationID != "op-1" || got[1].OperationID != "op-2" {
					t.Fatalf("claimed under key-a: %+v", got)
				}
				if other := must(tx.JobListClaimedUnder(ctx, "w2", "key-a.")); len(other) != 0 {
					t.Fatalf("another worker's claims: %+v", other)
				}
				return nil
			})
		})

		t.Run("JobPage", func(t *testing.T) {
			db := exerciseSetup(t)
			storetest.Write(t, db, func(ctx context.Context, tx *store.Tx) error {
				j := must(tx.JobGet(ctx, "op-2", store.ForUpdate))
				j.State = wire.Claimed
				if err := tx.JobUpdate(ctx, j); err != nil {
					return err
				}
				_, _, err := tx.DocumentSetOwner(ctx, "doc-2", nil, "worker-9", 5)
				return err
			})
			ids := func(jobs []wire.Job) []string {
				out := []string{}
				for _, j := range jobs {
					out = append(out, j.OperationID)
				}
				return out
			}
			storetest.Read(t, db, func(ctx context.Context, tx *store.Tx) error {
				for _, c := range []struct {
					f     store.JobFilter
					after int64
					limit int
					want  []string
				}{
					{store.JobFilter{}, 0, 10, []string{"op-1", "op-2", "op-3"}},
					{store.JobFilter{}, 0, 2, []string{"op-1", "op-2"}},
					{store.JobFilter{}, 2, 2, []string{"op-3"}},
					{store.JobFilter{}, 3, 2, []string{}},
					{store.JobFilter{State: wire.Queued}, 0, 10, []string{"op-1", "op-3"}},
					{store.JobFilter{State: wire.Queued}, 1, 10, []string{"op-3"}},
					{store.JobFilter{Section: "summary"}, 0, 10, []string{"op-1", "op-2", "op-3"}},
					{store.JobFilter{Section: "links"}, 0, 10, []string{}},
					{store.JobFilter{Owner: "worker-9"}, 0, 10, []string{"op-2"}},
					{store.JobFilter{OperationPrefix: "op-"}, 1, 10, []string{"op-2", "op-3"}},
					{store.JobFilter{OperationPrefix: "op-3"}, 0, 10, []string{"op-3"}},
					{store.JobFilter{OperationPrefix: "OP-3"}, 0, 10, []string{}},
					{store.JobFilter{State: wire.Claimed, Owner: "worker-9", Section: "summary"}, 0, 10, []string{"op-2"}},
				} {
					if got := ids(must(tx.JobPage(ctx, c.f, c.after, c.limit))); !reflect.DeepEqual(got, c.want) {
						t.Errorf("%+v after %d, limit %d: %v, want %v", c.f, c.after, c.limit, got, c.want)
					}
				}
				return nil
			})
		})

		t.Run("ReadsWithoutLocks", func(t *testing.T) {
			// Every read that can lock also runs unlocked in a read-only
			// transaction (PostgreSQL refuses FOR UPDATE there).
			db := exerciseSetup(t)
			storetest.Read(t, db, func(ctx context.Context, tx *store.Tx) error {
				_ = must(tx.JobGet(ctx, "op-1", store.NoLock))
				_ = must(tx.JobListExpired(ctx, 100, store.NoLock))
				_ = must(tx.DocumentGet(ctx, "doc-1", store.NoLock))
				_ = must(tx.AccountingGet(ctx, store.NoLock))
				return nil
			})
		})

		t.Run("DocumentSetOwner", func(t *testing.T) {
			db := exerciseSetup(t)
			storetest.Write(t, db, func(ctx context.Context, tx *store.Tx) error {
				zero, stale := int64(0), int64(5)
				gen, ok, err := tx.DocumentSetOwner(ctx, "doc-1", &zero, "w1", 9)
				if err != nil || !ok || gen != 1 {
					t.Fatalf("compare-and-swap at 0: %d %v %v", gen, ok, err)
				}
				if gen, ok, err := tx.DocumentSetOwner(ctx, "doc-1", &stale, "w2", 9); err != nil || ok || gen != 0 {
					t.Fatalf("a stale expectation matched: %d %v %v", gen, ok, err)
				}
				if gen, ok, err := tx.DocumentSetOwner(ctx, "doc-1", nil, "", 9); err != nil || !ok || gen != 2 {
					t.Fatalf("revoke: %d %v %v", gen, ok, err)
				}
				if _, ok, err := tx.DocumentSetOwner(ctx, "nope", nil, "", 9); err != nil || ok {
					t.Fatalf("an absent document matched: %v %v", ok, err)
				}
				if err := tx.AssignmentInsert(ctx, store.Assignment{DocumentID: "doc-1", Generation: 1, Owner: "w1", Reason: "claim", AtMS: 9}); err != nil {
					return err
				}
				d := must(tx.DocumentGet(ctx, "doc-1", store.ForUpdate))
				j := must(tx.JobGet(ctx, "op-1", store.NoLock))
				if d.Generation != 2 || d.Owner != "" || j.Generation != 2 || string(d.Body) != "null" {
					t.Fatalf("document %+v, job sees generation %d", d, j.Generation)
				}
				if _, err := tx.DocumentGet(ctx, "nope", store.NoLock); !store.IsNotFound(err) {
					t.Fatalf("an absent document: %v", err)
				}
				return nil
			})
			if err := write(db, func(ctx context.Context, tx *store.Tx) error {
				return tx.AssignmentInsert(ctx, store.Assignment{DocumentID: "doc-1", Generation: 1, Owner: "w1", Reason: "again", AtMS: 9})
			}); err == nil {
				t.Fatal("one generation was recorded twice")
			}
		})

		t.Run("DocumentWriteMutations", func(t *testing.T) {
			db := exerciseSetup(t)
			storetest.Write(t, db, func(ctx context.Context, tx *store.Tx) error {
				if err := tx.DocumentWrite(ctx, "doc-1", []byte(`{"a":1}`), 1, 9); err != nil {
					return err
				}
				return tx.MutationInsert(ctx, store.Mutation{DocumentID: "doc-1", Version: 1, OperationKey: "k", Caller: "w", AtMS: 9})
			})
			// One operation key mutates its document at most once, whatever
			// the code above the database does.
			if err := write(db, func(ctx context.Context, tx *store.Tx) error {
				return tx.MutationInsert(ctx, store.Mutation{DocumentID: "doc-1", Version: 2, OperationKey: "k", Caller: "w", AtMS: 9})
			}); err == nil {
				t.Fatal("an operation key mutated its document twice")
			}
			storetest.Read(t, db, func(ctx context.Context, tx *store.Tx) error {
				d := must(tx.DocumentGet(ctx, "doc-1", store.NoLock))
				n := must(tx.MutationCount(ctx, "doc-1"))
				total := must(tx.MutationTotal(ctx))
				byDoc := must(tx.MutationCountByDocument(ctx))
				twice := must(tx.MutationRepeatedOperations(ctx))
				if j := must(tx.JobGet(ctx, "op-1", store.NoLock)); j.DocumentVersion != 1 {
					t.Fatalf("the job reads its document at version %d", j.DocumentVersion)
				}
				if string(d.Body) != `{"a":1}` || d.Version != 1 || n != 1 || total != 1 || !reflect.DeepEqual(byDoc, map[string]int64{"doc-1": 1}) || twice != 0 {
					t.Fatalf("document %+v, mutations %d/%d %v, repeated %d", d, n, total, byDoc, twice)
				}
				return nil
			})
		})

		t.Run("Operations", func(t *testing.T) {
			db := exerciseSetup(t)
			op := store.StoredOperation{Binding: []byte(`{"tool":"x"}`), CreatedMS: 9, Operation: wire.Operation{DocumentID: "doc-1",
				OperationKey: "k", Caller: "w", Status: wire.StatusPublished, Outcome: json.RawMessage(`{"status":"published","version":1}`), Deliveries: 1}}
			storetest.Write(t, db, func(ctx context.Context, tx *store.Tx) error {
				if _, err := tx.OperationGet(ctx, "doc-1", "k"); !store.IsNotFound(err) {
					t.Fatalf("an absent operation: %v", err)
				}
				if err := tx.OperationInsert(ctx, op); err != nil {
					return err
				}
				return tx.OperationCountDelivery(ctx, "doc-1", "k")
			})
			if err := write(db, func(ctx context.Context, tx *store.Tx) error { return tx.OperationInsert(ctx, op) }); err == nil {
				t.Fatal("one operation key was retained twice")
			}
			storetest.Read(t, db, func(ctx context.Context, tx *store.Tx) error {
				got := must(tx.OperationGet(ctx, "doc-1", "k"))
				list := must(tx.OperationList(ctx, "doc-1"))
				j := must(tx.JobGet(ctx, "op-1", store.NoLock))
				op.Deliveries = 2
				if !reflect.DeepEqual(got, op) || len(list) != 1 || !reflect.DeepEqual(list[0], op.Operation) ||
					string(j.Outcome) != string(op.Outcome) {
					t.Fatalf("operation %+v, list %+v, job outcome %s", got, list, j.Outcome)
				}
				if empty := must(tx.OperationList(ctx, "doc-2")); empty == nil || len(empty) != 0 {
					t.Fatalf("no operations listed as %v", empty)
				}
				return nil
			})
		})

		t.Run("Receipts", func(t *testing.T) {
			db := exerciseSetup(t)
			storetest.Write(t, db, func(ctx context.Context, tx *store.Tx) error {
				if seq, id, err := tx.ReceiptHead(ctx); err != nil || seq != 0 || id != "" {
					t.Fatalf("head of an empty chain: %d %q %v", seq, id, err)
				}
				var rs []store.StoredReceipt
				for i, op := range []string{"op-1", "op-2", "op-1"} {
					r := wire.Receipt{ID: fmt.Sprint("rcpt-", i+1), ReceiptBody: wire.ReceiptBody{Sequence: int64(i + 1), Kind: wire.KindAdmission, OperationID: op}}
					rs = append(rs, store.StoredReceipt{Receipt: r, Stored: []byte(fmt.Sprintf(`{"id":"%s"}`, r.ID))})
				}
				return tx.ReceiptInsert(ctx, rs) // three rows, one statement
			})
			if err := write(db, func(ctx context.Context, tx *store.Tx) error {
				return tx.ReceiptInsert(ctx, []store.StoredReceipt{{Receipt: wire.Receipt{ID: "rcpt-9", ReceiptBody: wire.ReceiptBody{Sequence: 3}}, Stored: []byte("{}")}})
			}); err == nil {
				t.Fatal("two receipts at one sequence")
			}
			storetest.Read(t, db, func(ctx context.Context, tx *store.Tx) error {
				seq, id, err := tx.ReceiptHead(ctx)
				all := must(tx.ReceiptList(ctx, ""))
				mine := must(tx.ReceiptList(ctx, "op-1"))
				newest := must(tx.ReceiptNewestByOperation(ctx))
				body := must(tx.ReceiptGet(ctx, "rcpt-2"))
				if err != nil || seq != 3 || id != "rcpt-3" || len(all) != 3 || len(mine) != 2 || string(mine[1]) != `{"id":"rcpt-3"}` ||
					!reflect.DeepEqual(newest, map[string]string{"op-1": "rcpt-3", "op-2": "rcpt-2"}) || string(body) != `{"id":"rcpt-2"}` {
					t.Fatalf("head %d %s, %d receipts, %d of op-1, newest %v, body %s", seq, id, len(all), len(mine), newest, body)
				}
				if _, err := tx.ReceiptGet(ctx, "nope"); !store.IsNotFound(err) {
					t.Fatalf("an absent receipt: %v", err)
				}
				many := must(tx.ReceiptGetMany(ctx, []string{"rcpt-3", "nope", "rcpt-1"}))
				if len(many) != 2 || string(many[0]) != `{"id":"rcpt-1"}` || string(many[1]) != `{"id":"rcpt-3"}` {
					t.Fatalf("read many: %q", many)
				}
				if some := must(tx.ReceiptNewestFor(ctx, []string{"op-1", "op-3"})); !reflect.DeepEqual(some, map[string]string{"op-1": "rcpt-3"}) {
					t.Fatalf("newest receipts of op-1 and op-3: %v", some)
				}
				return nil
			})
		})

		t.Run("EventInsertMany", func(t *testing.T) {
			// More rows than one statement takes are split, in order.
			db := exerciseSetup(t)
			storetest.Write(t, db, func(ctx context.Context, tx *store.Tx) error {
				evs := make([]wire.Event, 1234)
				for i := range evs {
					evs[i] = wire.Event{Sequence: int64(i + 1), TimestampMS: 1, Kind: wire.EventClaimed, Actor: "w", Title: fmt.Sprint(i), Data: json.RawMessage(`{}`)}
				}
				return tx.EventInsert(ctx, evs)
			})
			storetest.Read(t, db, func(ctx context.Context, tx *store.Tx) error {
				count, last, err := tx.EventHead(ctx)
				tail := must(tx.EventLast(ctx))
				page := must(tx.EventList(ctx, 1000, 5))
				if err != nil || count != 1234 || last != 1234 || tail != 1234 || len(page) != 5 || page[0].Title != "1000" {
					t.Fatalf("head %d/%d/%d, page %+v (%v)", count, last, tail, page, err)
				}
				return nil
			})
		})

		t.Run("LogAppendsContiguous", func(t *testing.T) {
			// Concurrent requests from two handles on one database (two
			// hosts) append events and receipts; a third of them roll back.
			// The log is numbered 1..n without a gap, every receipt links
			// to the one placed before it, and each request's receipt is
			// placed and sealed by the time its write returns, whichever
			// handle's sequencer placed it.
			db, location := exerciseSetupAt(t)
			db.SetSealer(testSealer{})
			other := storetest.MustOpen(t, location)
			other.SetSealer(testSealer{})
			var wg sync.WaitGroup
			errs := make(chan error, 30)
			for i := range 30 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					var placed *wire.Receipt
					err := write([]*store.DB{db, other}[i%2], func(ctx context.Context, tx *store.Tx) error {
						if err := tx.AppendEvent(wire.Event{TimestampMS: 1, Kind: wire.EventClaimed, Actor: "w", Title: fmt.Sprint(i),
							Data: json.RawMessage(fmt.Sprintf(`{"i":%d}`, i))}); err != nil {
							return err
						}
						var err error
						if placed, err = tx.AppendReceipt(wire.Receipt{ID: fmt.Sprint("rcpt-", i), ReceiptBody: wire.ReceiptBody{OperationID: "op-1"}}); err != nil {
							return err
						}
						if i%3 == 0 {
							return fmt.Errorf("roll back request %d", i)
						}
						return nil
					})
					switch {
					case i%3 == 0 && err == nil:
						errs <- fmt.Errorf("request %d committed", i)
					case i%3 != 0 && err != nil:
						errs <- err
					case i%3 != 0 && (placed.Sequence == 0 || placed.Signature != fmt.Sprint("sig-", placed.Sequence)):
						errs <- fmt.Errorf("request %d's receipt was answered unplaced: %+v", i, *placed)
					}
				}()
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Error(err)
			}
			storetest.Read(t, db, func(ctx context.Context, tx *store.Tx) error {
				count, last, err := tx.EventHead(ctx)
				if err != nil || count != 20 || last != 20 {
					t.Fatalf("event head %d/%d (%v)", count, last, err)
				}
				all := must(tx.ReceiptList(ctx, ""))
				if len(all) != 20 {
					t.Fatalf("%d receipts kept, want 20", len(all))
				}
				var prevID string
				for k, raw := range all {
					var r wire.Receipt
					if err := json.Unmarshal(raw, &r); err != nil {
						return err
					}
					if r.Sequence != int64(k+1) || (k == 0) != (r.Prev == nil) || (k > 0 && *r.Prev != prevID) {
						t.Fatalf("receipt %d: sequence %d, prev %v, want a link to %q", k, r.Sequence, r.Prev, prevID)
					}
					prevID = r.ID
				}
				p, err := tx.PendingLogList(ctx, 10)
				if err != nil || len(p.Events)+len(p.Receipts) != 0 || p.LastEvent != 20 || p.Head.Sequence != 20 || p.Head.ID != prevID {
					t.Fatalf("pending after the writes: %+v (%v)", p, err)
				}
				return nil
			})
			// Only a prepared receipt can be appended.
			if err := write(db, func(ctx context.Context, tx *store.Tx) error {
				_, err := tx.AppendReceipt(wire.Receipt{ID: "x", ReceiptBody: wire.ReceiptBody{Sequence: 99}})
				return err
			}); err == nil {
				t.Fatal("a receipt already placed was appended")
			}
		})

		t.Run("PendingLog", func(t *testing.T) {
			// Entries written for the sequencer come back oldest first, up
			// to the limit, with the placed log's heads; placing writes them
			// where readers look and removes them from pending.
			db := exerciseSetup(t)
			var eventIDs, receiptIDs []int64
			storetest.Write(t, db, func(ctx context.Context, tx *store.Tx) (err error) {
				evs := make([]wire.Event, 600)
				for i := range evs {
					evs[i] = wire.Event{TimestampMS: int64(i), Kind: wire.EventClaimed, Actor: "w", Title: fmt.Sprint(i), Data: json.RawMessage(`{}`)}
				}
				eventIDs, receiptIDs, err = tx.PendingLogInsert(ctx, evs, []wire.Receipt{{ID: "rcpt-a", ReceiptBody: wire.ReceiptBody{OperationID: "op-1", Nonce: "n"}}, {ID: "rcpt-b"}})
				return err
			})
			if len(eventIDs) != 600 || len(receiptIDs) != 2 || receiptIDs[0] == receiptIDs[1] {
				t.Fatalf("pending ids: %d events, receipts %v", len(eventIDs), receiptIDs)
			}
			storetest.Write(t, db, func(ctx context.Context, tx *store.Tx) error {
				return tx.PendingLogPlace(ctx, []wire.Event{{Sequence: 1, TimestampMS: 1, Kind: wire.EventStarted, Actor: "h", Title: "t", Data: json.RawMessage(`{}`)}},
					[]store.StoredReceipt{{Receipt: wire.Receipt{ID: "rcpt-0", ReceiptBody: wire.ReceiptBody{Sequence: 1}}, Stored: []byte(`{"id":"rcpt-0"}`)}}, nil, nil)
			})
			storetest.Write(t, db, func(ctx context.Context, tx *store.Tx) error {
				p, err := tx.PendingLogList(ctx, 550)
				if err != nil || len(p.Events) != 550 || p.Events[0].Event.Title != "0" || p.Events[549].Event.Title != "549" ||
					string(p.Events[3].Event.Data) != `{}` || p.Events[3].Event.Kind != wire.EventClaimed ||
					len(p.Receipts) != 2 || p.Receipts[0].Receipt.ID != "rcpt-a" || p.Receipts[0].Receipt.Nonce != "n" || p.Receipts[1].Receipt.ID != "rcpt-b" ||
					p.LastEvent != 1 || p.Head != (store.ChainHead{Sequence: 1, ID: "rcpt-0"}) {
					t.Fatalf("%d events, receipts %+v, heads %d %+v (%v)", len(p.Events), p.Receipts, p.LastEvent, p.Head, err)
				}
				var ids []int64
				placed := make([]wire.Event, len(p.Events))
				for i, e := range p.Events {
					ids = append(ids, e.Pending)
					placed[i] = e.Event
					placed[i].Sequence = int64(i + 2)
				}
				return tx.PendingLogPlace(ctx, placed, []store.StoredReceipt{{Receipt: wire.Receipt{ID: "rcpt-a", ReceiptBody: wire.ReceiptBody{Sequence: 2, Kind: wire.KindAdmission, OperationID: "op-1"}},
					Stored: []byte(`{"id":"rcpt-a"}`)}}, ids, []int64{p.Receipts[0].Pending})
			})
			storetest.Read(t, db, func(ctx context.Context, tx *store.Tx) error {
				p, err := tx.PendingLogList(ctx, 550)
				if err != nil || len(p.Events) != 50 || p.Events[0].Event.Title != "550" || len(p.Receipts) != 1 || p.Receipts[0].Receipt.ID != "rcpt-b" ||
					p.LastEvent != 551 || p.Head != (store.ChainHead{Sequence: 2, ID: "rcpt-a"}) {
					t.Fatalf("after placing: %d events, receipts %+v, heads %d %+v (%v)", len(p.Events), p.Receipts, p.LastEvent, p.Head, err)
				}
				page := must(tx.EventList(ctx, 1, 2))
				if len(page) != 2 || page[0].Title != "0" || page[0].Sequence != 2 || string(must(tx.ReceiptGet(ctx, "rcpt-a"))) != `{"id":"rcpt-a"}` {
					t.Fatalf("placed events %+v", page)
				}
				// What is left pending, of the ids the insert returned.
				leftEvents, leftReceipts, err := tx.PendingLogLeft(ctx, eventIDs, receiptIDs)
				if err != nil || len(leftEvents) != 50 || len(leftReceipts) != 1 || leftReceipts[0] != p.Receipts[0].Pending {
					t.Fatalf("left pending: %d events, receipts %v (%v)", len(leftEvents), leftReceipts, err)
				}
				return nil
			})
		})
	})
}
