// Package views is what the host shows without changing anything: the
// snapshot, the stats, a job and a page of jobs (with the jobs by state
// every page carries, read at most once a second), events, receipts and
// their verification, documents, and the workers view.
package views

import (
	"context"
	"encoding/json"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sync/singleflight"

	"github.com/fleet/fleet/internal/budget"
	"github.com/fleet/fleet/internal/fleet"
	"github.com/fleet/fleet/internal/host/access"
	"github.com/fleet/fleet/internal/host/ledger"
	"github.com/fleet/fleet/internal/host/pause"
	"github.com/fleet/fleet/internal/jobs"
	"github.com/fleet/fleet/internal/receipts"
	"github.com/fleet/fleet/internal/resource"
	"github.com/fleet/fleet/internal/store"
	"github.com/fleet/fleet/internal/wire"
)

// Views reads an open state.
type Views struct {
	db     *store.DB
	kernel *receipts.Kernel
	access *access.Credentials
	lease  time.Duration // a claim's lease: a worker seen within one is alive
	// counts is the jobs by state that pages carry (see StateCounts).
	counts struct {
		mu      sync.Mutex
		byState map[wire.JobState]int64
		at      time.Time
		read    singleflight.Group
	}
}

// New reads what l writes; a, for when each worker last called; lease,
// the lease a claim has now.
func New(l *ledger.Ledger, a *access.Credentials, lease time.Duration) *Views {
	return &Views{db: l.DB(), kernel: l.Kernel(), access: a, lease: lease}
}

// Snapshot reads every job and the accounting in one consistent read.
func (vs *Views) Snapshot(ctx context.Context) (wire.Snapshot, error) {
	s := wire.Snapshot{KernelKey: vs.kernel.PublicKey, Storage: vs.db.Stats()}
	err := vs.db.Read(ctx, func(tx *store.Tx) (err error) {
		all, err := tx.JobList(ctx)
		if err != nil {
			return err
		}
		s.Jobs = wireJobs(all)
		newest, err := tx.ReceiptNewestByOperation(ctx)
		if err != nil {
			return err
		}
		for i := range s.Jobs {
			s.Jobs[i].ReceiptID = newest[s.Jobs[i].OperationID]
		}
		s.NowMS = tx.NowMS()
		s.Accounting, s.Mutations, s.Events, err = readTotals(ctx, tx)
		return err
	})
	return s, err
}

// readTotals reads what the snapshot and the stats share: the accounting,
// how many mutations exist and the newest event's sequence.
func readTotals(ctx context.Context, tx *store.Tx) (acct wire.Accounting, mutations, lastEvent int64, err error) {
	if acct, err = tx.AccountingGet(ctx, store.NoLock); err != nil {
		return
	}
	if mutations, err = tx.MutationTotal(ctx); err != nil {
		return
	}
	lastEvent, err = tx.EventLast(ctx)
	return
}

// Stats counts jobs by state (reading the jobs not completed, so its cost
// grows with those, not with the completed jobs kept: BenchmarkStateCounts,
// BenchmarkJobPage's stats), and reads the accounting.
func (vs *Views) Stats(ctx context.Context) (wire.Stats, error) {
	s := wire.Stats{Storage: vs.db.Stats(), NowMS: vs.db.Now().UnixMilli()}
	err := vs.db.Read(ctx, func(tx *store.Tx) (err error) {
		if s.Jobs, err = tx.JobCountByState(ctx); err != nil {
			return err
		}
		if s.Claims, err = pause.Read(ctx, tx); err != nil {
			return err
		}
		s.Accounting, s.Mutations, s.Events, err = readTotals(ctx, tx)
		return err
	})
	return s, err
}

// Job reads one job's detail.
func (vs *Views) Job(ctx context.Context, op string) (wire.JobDetail, error) {
	var d wire.JobDetail
	err := vs.db.Read(ctx, func(tx *store.Tx) (err error) {
		j, err := jobs.Get(ctx, tx, op, store.NoLock)
		if err != nil {
			return err
		}
		d.Job, d.Claim = j.Wire(), j.CurrentClaim()
		batch, err := tx.BatchGet(ctx, d.Batch)
		if err != nil {
			return err
		}
		d.Input = jobs.InputOf(j, batch.Document)
		if d.Document, err = resource.GetDocument(ctx, tx, d.DocumentID, store.NoLock); err != nil {
			return err
		}
		if d.Operations, err = tx.OperationList(ctx, d.DocumentID); err != nil {
			return err
		}
		if d.Mutations, err = tx.MutationCount(ctx, d.DocumentID); err != nil {
			return err
		}
		attempts, err := tx.AttemptList(ctx, op)
		if err != nil {
			return err
		}
		if d.Dependencies, err = dependencies(ctx, tx, op); err != nil {
			return err
		}
		d.AttemptLog = make([]wire.Attempt, 0, len(attempts))
		for _, a := range attempts {
			d.AttemptLog = append(d.AttemptLog, a.Attempt)
		}
		stored, err := tx.ReceiptList(ctx, op)
		if err != nil {
			return err
		}
		d.Receipts = make([]wire.Receipt, 0, len(stored))
		for _, raw := range stored {
			r, err := receipts.Decode(raw)
			if err != nil {
				return err
			}
			d.Receipts = append(d.Receipts, r)
		}
		return nil
	})
	return d, err
}

// JobPage lists a page of jobs in queue order (keyset paging on their
// position: each page costs the same however many jobs there are, and jobs
// enqueued while a client pages never shift a page), with the count of
// jobs in each state, at most a second old (a count reads every job not
// completed, so it is shared by the pages of that second).
func (vs *Views) JobPage(ctx context.Context, q wire.JobPageQuery) (wire.JobPage, error) {
	f, after, limit, err := JobPageFilter(q)
	if err != nil {
		return wire.JobPage{}, err
	}
	var page wire.JobPage
	err = vs.db.Read(ctx, func(tx *store.Tx) (err error) {
		// One more than the page shows whether there is a next.
		jobs, err := tx.JobPage(ctx, &store.JobPageParams{Filter: f, After: after, Limit: limit + 1})
		if err != nil || len(jobs) == 0 {
			return err
		}
		page.Jobs = wireJobs(jobs)
		ops := make([]string, len(page.Jobs))
		for i, j := range page.Jobs {
			ops[i] = j.OperationID
		}
		newest, err := tx.ReceiptNewestFor(ctx, ops)
		for i := range page.Jobs {
			page.Jobs[i].ReceiptID = newest[page.Jobs[i].OperationID]
		}
		return err
	})
	if err == nil {
		page.Counts, err = vs.StateCounts(ctx)
	}
	if err != nil {
		return page, err
	}
	if len(page.Jobs) > limit {
		page.Jobs = page.Jobs[:limit]
		page.Next = strconv.FormatInt(page.Jobs[limit-1].Position, 10)
	}
	return page, nil
}

// JobPageFilter checks a page query (checkJobPage) and answers its
// filter, the cursor to read after and the page's size.
func JobPageFilter(q wire.JobPageQuery) (store.JobFilter, int64, int, error) {
	f := store.JobFilter{State: q.State, Section: q.Section, Owner: q.Owner, OperationPrefix: q.Q, Priority: q.Priority, Tenant: q.Tenant}
	var after int64
	if err := checkJobPage(q); err != nil {
		return f, 0, 0, err
	}
	if q.Tenant != "" {
		if err := budget.ValidateTenantName(q.Tenant); err != nil {
			return f, 0, 0, err
		}
	}
	if q.After != "" {
		n, err := strconv.ParseInt(q.After, 10, 64)
		if err != nil || n < 0 {
			return f, 0, 0, fleet.Errorf(wire.CodeInvalid, "after %.40q is not a cursor this host gave (next of an earlier page)", q.After)
		}
		after = n
	}
	limit := q.Limit
	if limit == 0 {
		limit = wire.DefaultJobPage
	}
	return f, after, limit, nil
}

// checkJobPage checks a page query's filters and limit: a known state,
// section and priority, bounded texts, a limit in range.
func checkJobPage(q wire.JobPageQuery) error {
	switch {
	case q.State != "" && !slices.Contains(wire.JobStates, q.State):
		return fleet.Errorf(wire.CodeInvalid, "state %.40q is not a job state", q.State)
	case q.Section != "" && !slices.Contains(jobs.Sections, q.Section):
		return fleet.Errorf(wire.CodeInvalid, "section %.40q is not one of %s", q.Section, strings.Join(jobs.Sections, ", "))
	case q.Priority != 0 && (q.Priority < wire.MinPriority || q.Priority > wire.MaxPriority):
		return fleet.Errorf(wire.CodeInvalid, "priority must be %d to %d, got %d", wire.MinPriority, wire.MaxPriority, q.Priority)
	case len(q.Owner) > 64 || len(q.Q) > 36:
		return fleet.Errorf(wire.CodeInvalid, "owner is at most 64 bytes and q (an operation id or its start) at most 36")
	case q.Limit < 0 || q.Limit > wire.MaxJobPage:
		return fleet.Errorf(wire.CodeInvalid, "limit must be 1 to %d, got %d", wire.MaxJobPage, q.Limit)
	}
	return nil
}

// Events lists up to limit events after sequence `after`.
func (vs *Views) Events(ctx context.Context, after int64, limit int) ([]wire.Event, error) {
	var out []wire.Event
	err := vs.db.Read(ctx, func(tx *store.Tx) (err error) {
		out, err = tx.EventList(ctx, after, limit)
		return err
	})
	return out, err
}

// FindEvents lists the newest q.Limit events in (q.After, q.Before) of
// q's kind and job, in sequence order; a job that does not exist is
// not_found.
func (vs *Views) FindEvents(ctx context.Context, q wire.EventQuery) ([]wire.Event, error) {
	var out []wire.Event
	err := vs.db.Read(ctx, func(tx *store.Tx) (err error) {
		if q.Job != "" {
			if _, err := jobs.Get(ctx, tx, q.Job, store.NoLock); err != nil {
				return err
			}
		}
		out, err = tx.EventListNewest(ctx, store.EventFilter{After: q.After, Before: q.Before, Kind: q.Kind,
			OperationID: q.Job, Limit: q.Limit})
		return err
	})
	return out, err
}

// EventHead is the newest event's sequence.
func (vs *Views) EventHead(ctx context.Context) (int64, error) {
	var head int64
	err := vs.db.Read(ctx, func(tx *store.Tx) (err error) {
		head, err = tx.EventLast(ctx)
		return err
	})
	return head, err
}

// readReceipt reads one stored receipt; an unknown id is not_found.
func readReceipt(ctx context.Context, tx *store.Tx, id string) ([]byte, error) {
	raw, err := tx.ReceiptGet(ctx, id)
	if store.IsNotFound(err) {
		return nil, fleet.Errorf(wire.CodeNotFound, "receipt %s not found", id)
	}
	return raw, err
}

// CheckReceipt verifies one receipt's id, signature and chain link against
// this host's kernel key.
func (vs *Views) CheckReceipt(ctx context.Context, id string) (wire.ReceiptCheck, error) {
	var c wire.ReceiptCheck
	err := vs.db.Read(ctx, func(tx *store.Tx) error {
		raw, err := readReceipt(ctx, tx, id)
		if err != nil {
			return err
		}
		r, err := receipts.Decode(raw)
		if err != nil {
			return err
		}
		var prev *wire.Receipt
		if r.Prev != nil {
			raw, err := tx.ReceiptGet(ctx, *r.Prev)
			switch {
			case err == nil:
				p, err := receipts.Decode(raw)
				if err != nil {
					return err
				}
				prev = &p
			case !store.IsNotFound(err):
				return err
			}
		}
		c, err = receipts.Check(r, prev, vs.kernel.PublicKey)
		return err
	})
	return c, err
}

// Receipt reads one receipt as stored.
func (vs *Views) Receipt(ctx context.Context, id string) (json.RawMessage, error) {
	var raw json.RawMessage
	err := vs.db.Read(ctx, func(tx *store.Tx) (err error) {
		raw, err = readReceipt(ctx, tx, id)
		return err
	})
	return raw, err
}

// Document reads a document for a worker. A worker limited to some
// tenants reads only their documents.
func (vs *Views) Document(ctx context.Context, caller fleet.Caller, id string) (wire.Document, error) {
	var d wire.Document
	err := vs.db.Read(ctx, func(tx *store.Tx) (err error) {
		if d, err = resource.GetDocument(ctx, tx, id, store.NoLock); err != nil || caller.Tenants == nil {
			return err
		}
		tenant, err := tx.JobTenantOfDocument(ctx, id)
		if err != nil && !store.IsNotFound(err) {
			return err
		}
		return jobs.CheckTenant(caller, tenant, "document "+id)
	})
	return d, err
}

// dependencies is the jobs op waits for, as they stand: what holds a
// blocked job, and why.
func dependencies(ctx context.Context, tx *store.Tx, op string) ([]wire.Dependency, error) {
	deps, err := tx.JobDependencyList(ctx, op)
	out := make([]wire.Dependency, 0, len(deps))
	for _, dep := range deps {
		if err != nil {
			break
		}
		var j store.Job
		if j, err = tx.JobGet(ctx, dep, store.NoLock); err == nil {
			d := wire.Dependency{OperationID: dep, Section: j.Section, State: j.State}
			if j.State != wire.Completed {
				d.Reason = j.Reason
			}
			out = append(out, d)
		}
	}
	return out, err
}

// wireJobs is what the API shows of jobs.
func wireJobs(all []store.Job) []wire.Job {
	out := make([]wire.Job, len(all))
	for i, j := range all {
		out[i] = j.Wire()
	}
	return out
}

// WorkersWindow is how far back the workers view counts completions and
// failures.
const WorkersWindow = time.Hour

// Workers is the workers view: every worker credential (revoked ones
// included) with what its jobs say of it (held now; completed and failed
// in the last hour, of the jobs it held last) and when it was last seen:
// the later of its last call to this host and the last time it moved a
// job (on any host). It counts as alive when seen within a lease, or while
// it holds a job whose lease is live.
func (vs *Views) Workers(ctx context.Context) (wire.Workers, error) {
	now := vs.db.Now()
	out := wire.Workers{NowMS: now.UnixMilli(), WindowS: int64(WorkersWindow / time.Second), Workers: []wire.WorkerView{}}
	err := vs.db.Read(ctx, func(tx *store.Tx) error {
		creds, err := tx.CredentialList(ctx)
		if err != nil {
			return err
		}
		activity, err := tx.WorkerActivity(ctx, now.Add(-WorkersWindow).UnixMilli())
		if err != nil {
			return err
		}
		byName := make(map[string]store.WorkerActivity, len(activity))
		for _, a := range activity {
			byName[a.Worker] = a
		}
		for _, c := range creds {
			if c.Role != access.RoleWorker {
				continue
			}
			a := byName[c.Name]
			v := wire.WorkerView{Name: c.Name, RevokedAtMS: c.RevokedMS, Held: a.Held, CompletedInWindow: a.Completed,
				FailedInWindow: a.Failed, LastSeenMS: a.LastSeenMS}
			if at, ok := vs.access.LastCall(c.Name); ok {
				v.LastSeenMS = max(v.LastSeenMS, at)
			}
			v.Alive = c.RevokedMS == 0 && (a.Held > 0 || (v.LastSeenMS > 0 && now.UnixMilli()-v.LastSeenMS <= vs.lease.Milliseconds()))
			out.Workers = append(out.Workers, v)
		}
		return nil
	})
	return out, err
}
