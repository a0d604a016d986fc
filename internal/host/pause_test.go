package host_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/fleet/fleet/internal/fleet"
	"github.com/fleet/fleet/internal/host"
	"github.com/fleet/fleet/internal/host/claims"
	"github.com/fleet/fleet/internal/storetest"
	"github.com/fleet/fleet/internal/wire"
)

// TestPauseClaims: a pause through one host stops every host's claims at
// once (no job, the queue "paused"), leaves what is in flight alone (a
// job claimed before it is dispatched and published), is signed and
// logged once (pausing again changes nothing), shows in the stats, and
// holds until a resumption, after which claims go on.
func TestPauseClaims(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T) {
		t.Parallel()
		ctx := context.Background()
		f := newState(t, 100, 20, 2)
		clock := storetest.NewClock(time.Now())
		a, b := f.openAs(t, "a", clock), f.openAs(t, "b", clock)
		w := caller("worker-1")
		held := claim(t, a, w)

		paused, err := b.ClaimsSwitch().Pause(ctx, "incident 42: the model endpoint is down")
		if err != nil || !paused.Paused || !paused.Changed || paused.ReceiptID == "" || paused.By != "operator" {
			t.Fatalf("pause: %+v, %v", paused, err)
		}
		for name, h := range map[string]*host.Host{"a": a, "b": b} {
			res, err := h.Claims().Claim(ctx, w, 0, 2)
			if err != nil || len(res.Jobs) != 0 || res.Queue != wire.QueuePaused {
				t.Fatalf("a claim on host %s while paused: %+v, %v", name, res, err)
			}
			// A claim that admits reads the pause the same way, and
			// reserves nothing.
			res, err = h.Claims().Take(ctx, w, claims.Ask{Max: 1, Admit: true})
			if err != nil || len(res.Jobs) != 0 || res.Queue != wire.QueuePaused {
				t.Fatalf("a claim that admits on host %s while paused: %+v, %v", name, res, err)
			}
		}
		// In flight goes on: the job claimed before the pause runs.
		if adm := dispatch(t, a, w, held); adm.Decision != wire.DecisionAllow {
			t.Fatalf("dispatching a job claimed before the pause: %+v", adm)
		}
		if pub, err := a.Publications().Publish(ctx, w, held.OperationID, canon(t, publishReq(t, a, held, "k"))); err != nil || pub.Outcome.Status != wire.StatusPublished {
			t.Fatalf("publishing a job claimed before the pause: %+v, %v", pub, err)
		}
		again, err := a.ClaimsSwitch().Pause(ctx, "twice")
		if err != nil || !again.Paused || again.Changed || again.ReceiptID != "" || again.Reason != paused.Reason {
			t.Fatalf("pausing again: %+v, %v; want the first pause, unchanged", again, err)
		}
		st, err := a.Views().Stats(ctx)
		if err != nil || !st.Claims.Paused || st.Claims.Reason != paused.Reason || st.Claims.AtMS == 0 {
			t.Fatalf("stats while paused: %+v, %v", st.Claims, err)
		}
		if _, err := a.ClaimsSwitch().Pause(ctx, "two\nlines"); fleet.ErrorCode(err) != wire.CodeInvalid {
			t.Fatalf("a reason of two lines: %v", err)
		}

		resumed, err := a.ClaimsSwitch().Resume(ctx)
		if err != nil || resumed.Paused || !resumed.Changed || resumed.ReceiptID == "" {
			t.Fatalf("resume: %+v, %v", resumed, err)
		}
		if again, err := b.ClaimsSwitch().Resume(ctx); err != nil || again.Changed {
			t.Fatalf("resuming again: %+v, %v", again, err)
		}
		claim(t, b, w)

		evs, err := a.Views().Events(ctx, 0, 1000)
		if err != nil {
			t.Fatal(err)
		}
		var changes []string
		for _, e := range evs {
			if e.Kind == wire.EventClaimsPaused || e.Kind == wire.EventClaimsResumed {
				changes = append(changes, e.Title)
			}
		}
		if len(changes) != 2 || !strings.Contains(changes[0], "incident 42") || !strings.Contains(changes[1], "resumed") {
			t.Fatalf("claims events %q, want one pause and one resumption", changes)
		}
		f.verify(t)
	})
}
