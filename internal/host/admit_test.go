package host_test

import (
	"context"
	"database/sql"
	"fmt"
	"reflect"
	"strings"
	"testing"

	"github.com/fleet/fleet/internal/host/claims"
	"github.com/fleet/fleet/internal/host/tenants"
	"github.com/fleet/fleet/internal/storetest"
	"github.com/fleet/fleet/internal/wire"
)

// TestClaimAndAdmit: a claim that admits takes its jobs and decides each
// one's admission in its one transaction, exactly as dispatch would
// (allowed while the allowance covers it, then denied naming the level,
// each with its signed receipt and event); the jobs are running or
// refused; a repeat under its key answers the same jobs and decisions
// and decides nothing again; a dispatch of an admitted job is its repeat.
func TestClaimAndAdmit(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T) {
		t.Parallel()
		ctx := context.Background()
		f := newState(t, 50, 20, 1) // two of the four funded
		h := f.open(t)
		w := caller("worker-1")
		const key = "5f0c6a9e-2b1d-4c3e-8f7a-6b5c4d3e2f1a"
		ask := claims.Ask{Max: 3, Key: key, Admit: true}
		first, err := h.Claims().Take(ctx, w, ask)
		if err != nil || len(first.Jobs) != 3 {
			t.Fatalf("claim and admit: %+v, %v", first, err)
		}
		for i, j := range first.Jobs {
			adm := j.Admission
			want := wire.DecisionAllow
			if i == 2 {
				want = wire.DecisionDeny
			}
			if adm == nil || adm.Decision != want || adm.Receipt.Signature == "" || adm.Receipt.OperationID != j.OperationID ||
				adm.Receipt.Decision != want {
				t.Fatalf("job %d's admission %+v; want %s with its signed receipt", i, adm, want)
			}
			if st := jobState(t, h, j.OperationID).State; st != map[wire.Decision]wire.JobState{wire.DecisionAllow: wire.Running, wire.DecisionDeny: wire.Refused}[want] {
				t.Fatalf("job %d is %s after its %s", i, st, want)
			}
		}
		if deny := first.Jobs[2].Admission; deny.Level != wire.LevelFleet || deny.Accounting.Available != 10 || deny.Accounting.Reserved != 40 {
			t.Fatalf("the denial %+v; want the fleet short, 10 available, 40 reserved", deny)
		}
		if first.Job == nil || !reflect.DeepEqual(*first.Job, first.Jobs[0]) {
			t.Fatalf("job %+v is not jobs[0]", first.Job)
		}
		snap, _ := h.Views().Snapshot(ctx)
		events := snap.Events

		again, err := h.Claims().Take(ctx, w, claims.Ask{Max: 3, Key: key, Admit: true, Repeat: true})
		if err != nil || !reflect.DeepEqual(again.Jobs, first.Jobs) {
			t.Fatalf("the repeat:\n%+v, %v\nwant the first answer\n%+v", again.Jobs, err, first.Jobs)
		}
		if snap, _ = h.Views().Snapshot(ctx); snap.Events != events || snap.Accounting.Reserved != 40 {
			t.Fatalf("the repeat wrote %d events, %d reserved; want none, 40", snap.Events-events, snap.Accounting.Reserved)
		}
		if adm := dispatch(t, h, w, first.Jobs[0]); !reflect.DeepEqual(adm, *first.Jobs[0].Admission) {
			t.Fatalf("the admitted job's dispatch %+v; want its admission %+v", adm, *first.Jobs[0].Admission)
		}
		// The plain repeat of the same key leaves the decided jobs to
		// the claim that admitted them, and claims the last job afresh.
		plain, err := h.Claims().ClaimKeyed(ctx, w, 0, 1, key, true)
		if err != nil || len(plain.Jobs) != 1 || plain.Jobs[0].Admission != nil || plain.Jobs[0].OperationID == first.Jobs[0].OperationID {
			t.Fatalf("a plain repeat of the key: %+v, %v", plain.Jobs, err)
		}
		for _, j := range first.Jobs[:2] {
			if _, err := h.Publications().Publish(ctx, w, j.OperationID, canon(t, publishReq(t, h, j, "pub-"+j.Section))); err != nil {
				t.Fatalf("publish %s: %v", j.Section, err)
			}
		}
		f.verify(t)
	})
}

// TestClaimAndAdmitDecidesAsDispatch: twin states, one whose claim
// admits and one that claims and then dispatches each job, take the same
// decisions, a tenant's own allowance short included (its level named),
// and leave the fleet's and the tenant's figures the same.
func TestClaimAndAdmitDecidesAsDispatch(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T) {
		t.Parallel()
		ctx := context.Background()
		run := func(admit bool) (decisions []string, fleet wire.Accounting, tenant wire.Tenant) {
			f := newState(t, 1000, 20, 1, func(m map[string]any) { m["sections"] = []string{"summary"} })
			h := f.open(t)
			name, allowance := "team-a", int64(40) // two reports' worth
			if _, err := h.Tenants().Create(ctx, wire.TenantRequest{Name: &name, Allowance: &allowance}); err != nil {
				t.Fatal(err)
			}
			doc, key := document, "team-a-report"
			if _, err := h.Operator().SubmitReports(ctx, wire.ReportsRequest{Document: &doc, Sections: []string{"summary", "terms", "actions"},
				IdempotencyKey: &key, Tenant: &name}); err != nil {
				t.Fatal(err)
			}
			w := caller("worker-1")
			res, err := h.Claims().Take(ctx, w, claims.Ask{Max: 4, Admit: admit})
			if err != nil || len(res.Jobs) != 4 {
				t.Fatalf("claim of 4: %+v, %v", res, err)
			}
			for _, j := range res.Jobs {
				adm := j.Admission
				if !admit {
					a := dispatch(t, h, w, j)
					adm = &a
				}
				tenantName := ""
				if adm.Tenant != nil {
					tenantName = adm.Tenant.Name
				}
				decisions = append(decisions, fmt.Sprintf("%s %s %s %s", j.Section, tenantName, adm.Decision, adm.Level))
			}
			snap, _ := h.Views().Snapshot(ctx)
			list, err := tenants.List(ctx, h.DB())
			if err != nil {
				t.Fatal(err)
			}
			for _, tn := range list.Tenants {
				if tn.Name == name {
					tenant = tn
				}
			}
			f.verify(t)
			return decisions, snap.Accounting, tenant
		}
		gotD, gotF, gotT := run(true)
		wantD, wantF, wantT := run(false)
		if !reflect.DeepEqual(gotD, wantD) || gotF != wantF || gotT.Spent != wantT.Spent || gotT.Reserved != wantT.Reserved {
			t.Fatalf("claims that admit:\n%v %+v %+v\nclaims then dispatches:\n%v %+v %+v", gotD, gotF, gotT, wantD, wantF, wantT)
		}
		if refused := strings.Count(strings.Join(gotD, "\n"), "deny tenant"); refused != 1 {
			t.Fatalf("decisions %v: want team-a's third section refused at its own level", gotD)
		}
	})
}

// TestClaimAndAdmitWritesEachRowOnce: on PostgreSQL, a claim that admits
// writes one new version of each job's row (claimed and running
// together), not two. A new version takes the next line pointer on the
// row's page, and nothing on these pages is dead before the claim
// commits, so the highest line pointer a live job row holds rises by
// one a job: by two a job when the claim writes the rows and the
// admissions write them again.
func TestClaimAndAdmitWritesEachRowOnce(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T) {
		f := newState(t, 1000, 20, 1)
		if f.database == "" {
			t.Skip("row versions are PostgreSQL's")
		}
		db, err := sql.Open("pgx", f.database)
		if err != nil {
			t.Fatal(err)
		}
		defer db.Close()
		ctx := context.Background()
		highest := func() (jobs, pointer int) {
			t.Helper()
			if err := db.QueryRowContext(ctx, `SELECT COUNT(*), MAX((ctid::text::point)[1])::int FROM jobs`).Scan(&jobs, &pointer); err != nil {
				t.Fatal(err)
			}
			return jobs, pointer
		}
		jobs, before := highest()
		h := f.open(t)
		res, err := h.Claims().Take(ctx, caller("worker-1"), claims.Ask{Max: jobs, Admit: true})
		if err != nil || len(res.Jobs) != jobs {
			t.Fatalf("claim and admit %d: %d jobs, %v", jobs, len(res.Jobs), err)
		}
		for _, j := range res.Jobs {
			if j.Admission == nil || j.Admission.Decision != wire.DecisionAllow {
				t.Fatalf("job %s's admission %+v", j.OperationID, j.Admission)
			}
		}
		if _, after := highest(); after-before != jobs {
			t.Fatalf("%d jobs claimed and admitted wrote %d row versions, want one each", jobs, after-before)
		}
	})
}
