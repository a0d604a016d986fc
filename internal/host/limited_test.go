package host_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/fleet/fleet/internal/fleet"
	"github.com/fleet/fleet/internal/host/access"
	"github.com/fleet/fleet/internal/storetest"
	"github.com/fleet/fleet/internal/wire"
)

// TestCredentialLimitedToTenants, on both backends: a credential added
// for some tenants claims only their jobs, is forbidden another tenant's
// job and document, and cannot be made the owner of one; a credential
// naming a tenant that does not exist is refused with nothing written.
func TestCredentialLimitedToTenants(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T) {
		t.Parallel()
		ctx := context.Background()
		f := newState(t, 1_000_000, 1, 2)
		h := f.open(t)
		claimTenants(t, h, 4) // the sample's jobs, default's
		addTenant(t, h, "team-a", 1)
		addTenant(t, h, "team-b", 1)
		submit(t, h, "team-b", 3, wire.DefaultPriority)
		submit(t, h, "team-a", 3, wire.DefaultPriority)

		for _, tenants := range [][]string{{"team-a", "team-c"}, {"Team A"}} {
			_, err := h.Access().Add(ctx, "agent-x", access.Terms{Tenants: tenants})
			want := map[bool]wire.Code{true: wire.CodeNotFound, false: wire.CodeInvalid}[tenants[0] == "team-a"]
			if fleet.ErrorCode(err) != want || !strings.Contains(fleet.ErrorMessage(err), tenants[len(tenants)-1]) {
				t.Fatalf("a credential for %v: %v; want %s naming the tenant", tenants, err, want)
			}
		}
		if list, err := h.Access().List(ctx); err != nil || len(list) != 3 {
			t.Fatalf("credentials after the refusals: %+v, %v", list, err)
		}
		if _, err := os.Stat(filepath.Join(f.state, "credentials", "agent-x")); !os.IsNotExist(err) {
			t.Fatalf("a refused credential's file: %v", err)
		}

		added, err := h.Access().Add(ctx, "agent-a", access.Terms{Tenants: []string{"team-a", "team-a"}})
		if err != nil || strings.Join(added.Credential.Tenants, ",") != "team-a" {
			t.Fatalf("a credential for team-a: %+v, %v", added.Credential, err)
		}
		agent, _, err := h.Access().Authenticate(ctx, added.Token)
		if err != nil {
			t.Fatal(err)
		}
		res, err := h.Claims().Claim(ctx, agent, 0, 10)
		if err != nil || len(res.Jobs) != 3 {
			t.Fatalf("agent-a's claim of 10: %+v, %v", res, err)
		}
		for _, j := range res.Jobs {
			if d, err := h.Views().Job(ctx, j.OperationID); err != nil || d.Tenant != "team-a" {
				t.Fatalf("agent-a claimed %s of %s (%v)", j.OperationID, d.Tenant, err)
			}
		}
		// Its own three in flight: it may yet have work, team-b's backlog aside.
		if again, err := h.Claims().Claim(ctx, agent, 0, 10); err != nil || len(again.Jobs) != 0 || again.Queue != wire.QueueWaiting {
			t.Fatalf("agent-a's claim with only team-b's queued: %+v, %v", again, err)
		}
		if _, err := h.Views().Document(ctx, agent, res.Jobs[0].DocumentID); err != nil {
			t.Fatalf("agent-a reading its own document: %v", err)
		}

		other := claim(t, h, caller("worker-1"))
		if d := jobState(t, h, other.OperationID); d.State != wire.Claimed {
			t.Fatalf("worker-1's claim: %+v", d)
		}
		_, err = h.Admission().Dispatch(ctx, agent, other.OperationID, refOf(other))
		wantCode(t, err, wire.CodeForbidden)
		_, err = h.Views().Document(ctx, agent, other.DocumentID)
		wantCode(t, err, wire.CodeForbidden)
		doc, err := h.Views().Document(ctx, caller("worker-1"), other.DocumentID)
		if err != nil {
			t.Fatal(err)
		}
		owner, gen := "agent-a", doc.Generation
		_, err = h.Operator().Assign(ctx, doc.ID, wire.AssignRequest{ExpectedGeneration: &gen, Owner: &owner})
		if fleet.ErrorCode(err) != wire.CodeInvalid || !strings.Contains(fleet.ErrorMessage(err), "team-b") {
			t.Fatalf("assigning team-b's document to agent-a: %v", err)
		}
		if d := jobState(t, h, other.OperationID); d.State != wire.Claimed || d.Worker != "worker-1" {
			t.Fatalf("worker-1's job after agent-a's attempts: %+v", d)
		}
		if after, err := h.Views().Document(ctx, caller("worker-1"), doc.ID); err != nil || after.Owner != "worker-1" || after.Generation != gen {
			t.Fatalf("team-b's document after a refused assignment: %+v, %v", after, err)
		}
		// An unlimited worker still claims from every tenant.
		if res, err := h.Claims().Claim(ctx, caller("worker-2"), 0, 10); err != nil || len(res.Jobs) != 2 {
			t.Fatalf("worker-2's claim: %+v, %v", res, err)
		}
	})
}
