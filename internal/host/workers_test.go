package host_test

import (
	"context"
	"testing"
	"time"

	"github.com/fleet/fleet/internal/storetest"
	"github.com/fleet/fleet/internal/wire"
)

// TestWorkersView: each worker credential with what it holds, what it
// completed in the last hour, when it was last seen, and whether it is
// alive (seen within a lease, or holding a job); a revoked one is never
// alive; an hour later its completions are out of the window.
func TestWorkersView(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T) {
		t.Parallel()
		ctx := context.Background()
		f := newState(t, 100, 20, 3)
		clock := storetest.NewClock(time.Now())
		h := f.openAs(t, "", clock)
		w1, w2 := caller("worker-1"), caller("worker-2")
		done := claim(t, h, w1)
		dispatch(t, h, w1, done)
		if pub, err := h.Publications().Publish(ctx, w1, done.OperationID, canon(t, publishReq(t, h, done, "k"))); err != nil || pub.Outcome.Status != wire.StatusPublished {
			t.Fatalf("publish: %+v, %v", pub, err)
		}
		clock.Advance(time.Second)
		held := claim(t, h, w2)
		if _, err := h.Access().Revoke(ctx, "worker-3"); err != nil {
			t.Fatal(err)
		}
		view := func() map[string]wire.WorkerView {
			t.Helper()
			ws, err := h.Views().Workers(ctx)
			if err != nil {
				t.Fatal(err)
			}
			out := map[string]wire.WorkerView{}
			for _, w := range ws.Workers {
				out[w.Name] = w
			}
			if len(out) != 3 || ws.WindowS != 3600 {
				t.Fatalf("workers view %+v", ws)
			}
			return out
		}
		v := view()
		if a := v["worker-1"]; !a.Alive || a.Held != 0 || a.CompletedInWindow != 1 || a.LastSeenMS != clock.Now().Add(-time.Second).UnixMilli() {
			t.Fatalf("worker-1: %+v", a)
		}
		if b := v["worker-2"]; !b.Alive || b.Held != 1 || b.LastSeenMS != clock.Now().UnixMilli() {
			t.Fatalf("worker-2, holding %s: %+v", held.OperationID, b)
		}
		if c := v["worker-3"]; c.Alive || c.RevokedAtMS == 0 || c.LastSeenMS != 0 {
			t.Fatalf("worker-3, revoked, never seen: %+v", c)
		}
		clock.Advance(time.Hour)
		v = view()
		if a := v["worker-1"]; a.Alive || a.CompletedInWindow != 0 {
			t.Fatalf("worker-1 an hour later: %+v", a)
		}
		if b := v["worker-2"]; !b.Alive || b.Held != 1 {
			t.Fatalf("worker-2 still holding a job: %+v", b)
		}
	})
}
