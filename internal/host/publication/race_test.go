package publication_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"

	"github.com/fleet/fleet/internal/fleet"
	"github.com/fleet/fleet/internal/host/publication"
	"github.com/fleet/fleet/internal/store"
	"github.com/fleet/fleet/internal/storetest"
	"github.com/fleet/fleet/internal/testkit"
	"github.com/fleet/fleet/internal/wire"
)

// TestConcurrentPublishAndAssign races publications and reassignments from
// many goroutines over several independent connections to one file. Whatever
// the interleaving: mutations equal published outcomes, versions are
// contiguous, every write came from the owner of the generation it presented,
// and no write used a generation older than one already written.
func TestConcurrentPublishAndAssign(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T) {
		ctx := context.Background()
		first, path := setup(t)
		handles := []*publication.Resource{first}
		for range 3 {
			s, err := open(ctx, path)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { s.Close() })
			handles = append(handles, s)
		}
		callers := make([]fleet.Caller, 4)
		for i := range callers {
			callers[i] = fleet.Caller{ID: fmt.Sprintf("worker-%d", i), CredentialSHA256: fleet.DigestHex([]byte(fmt.Sprint("token-", i)))}
		}
		callers[0] = workerA // the initial owner

		type attempt struct {
			caller string
			gen    int64
			status wire.Status
		}
		var mu sync.Mutex
		attempts := map[string]attempt{}
		var wg sync.WaitGroup
		for g := range 16 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				rng := rand.New(rand.NewPCG(uint64(g), 7))
				s := handles[g%len(handles)]
				for i := range 25 {
					d, err := s.Get(ctx, doc)
					if err != nil {
						t.Error(err)
						return
					}
					if rng.IntN(4) == 0 {
						// Operator transfer; losing the compare-and-swap race is expected.
						_, err := s.Assign(ctx, doc, d.Generation, callers[rng.IntN(len(callers))].ID)
						if err != nil && fleet.ErrorCode(err) != wire.CodeAssignmentConflict {
							t.Error(err)
						}
						continue
					}
					c := callers[rng.IntN(len(callers))]
					key := fmt.Sprintf("g%d-i%d", g, i)
					res, err := s.Publish(ctx, doc, c, request(key, d.Generation, d.Version, fmt.Sprintf(`{"by":%q}`, key)))
					if err != nil {
						t.Error(err)
						return
					}
					mu.Lock()
					attempts[key] = attempt{caller: c.ID, gen: d.Generation, status: res.Outcome.Status}
					mu.Unlock()
				}
			}()
		}
		wg.Wait()

		published := 0
		for _, a := range attempts {
			if a.status == wire.StatusPublished {
				published++
			}
		}
		type mutation struct {
			version int64
			key     string
			caller  string
		}
		var muts []mutation
		owners := map[int64]string{}
		err := first.DB.Read(ctx, func(tx *store.Tx) error {
			stored, err := tx.MutationList(ctx, doc)
			for _, m := range stored {
				muts = append(muts, mutation{version: m.Version, key: m.OperationKey, caller: m.Caller})
			}
			if err != nil {
				return err
			}
			assignments, err := tx.AssignmentList(ctx, doc)
			for _, a := range assignments {
				owners[a.Generation] = a.Owner
			}
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		if published == 0 || len(muts) != published {
			t.Fatalf("%d mutations for %d published outcomes", len(muts), published)
		}
		var lastGen int64
		for i, m := range muts {
			if m.version != int64(i+1) {
				t.Fatalf("versions not contiguous: mutation %d has version %d", i, m.version)
			}
			a := attempts[m.key]
			if a.status != wire.StatusPublished || a.caller != m.caller {
				t.Fatalf("mutation %+v does not match its outcome %+v", m, a)
			}
			if owners[a.gen] != m.caller {
				t.Fatalf("mutation %+v by %s at generation %d owned by %s", m, m.caller, a.gen, owners[a.gen])
			}
			if a.gen < lastGen {
				t.Fatalf("mutation %+v used generation %d after a write at %d: a superseded caller wrote", m, a.gen, lastGen)
			}
			lastGen = a.gen
		}
		d, _ := first.Get(ctx, doc)
		if d.Version != int64(len(muts)) {
			t.Fatalf("document version %d, %d mutations", d.Version, len(muts))
		}
		var last map[string]string
		testkit.MustDecode(t, d.Body, &last)
		if last["by"] != muts[len(muts)-1].key {
			t.Fatalf("document body %s is not the last mutation's", d.Body)
		}
		t.Logf("%d attempts, %d published, %d generations", len(attempts), published, len(owners))
	})
}
