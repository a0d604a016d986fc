package sqlite

import (
	"cmp"
	"context"
	"database/sql"
	"errors"
	"slices"

	"github.com/fleet/fleet/internal/store"
	"github.com/fleet/fleet/internal/store/dbutil"
	"github.com/fleet/fleet/internal/store/sqlite/dbsqlc"
	"github.com/fleet/fleet/internal/wire"
)

// conn is one SQLite transaction: store.Executor over the queries in
// dbsqlc. Its one writer excludes every other, so nothing is locked
// (store.Lock asks nothing here) and the log needs no lock of its own.
type conn struct {
	q      *dbsqlc.Queries
	tx     *sql.Tx
	cached *cachedTx // nil on read transactions
	// ahead is what this transaction decided at tenants and the fleet's
	// allowance and has not written (ahead.go); saved holds a copy per
	// open savepoint, innermost last, so rolling back to one undoes the
	// decisions since, as it undoes rows.
	ahead *ahead
	saved []savedAhead
}

type savedAhead struct {
	savepoint string
	ahead     *ahead
}

// savedAt is the index in saved of the newest savepoint of that name
// (-1 for none), as SAVEPOINT, ROLLBACK TO and RELEASE name it.
func (c *conn) savedAt(name string) int {
	for i := len(c.saved) - 1; i >= 0; i-- {
		if c.saved[i].savepoint == name {
			return i
		}
	}
	return -1
}

var _ store.Conn = (*conn)(nil)

func (c *conn) Savepoint(ctx context.Context, name string) error {
	c.saved = append(c.saved, savedAhead{name, c.ahead.clone()})
	c.count()
	_, err := c.tx.ExecContext(ctx, "SAVEPOINT "+name)
	return wrap(err, "savepoint", name)
}

func (c *conn) RollbackTo(ctx context.Context, name string) error {
	// The savepoint stays open; those opened after it end.
	if i := c.savedAt(name); i >= 0 {
		c.ahead, c.saved = c.saved[i].ahead.clone(), c.saved[:i+1]
	}
	c.count()
	_, err := c.tx.ExecContext(ctx, "ROLLBACK TO "+name)
	return wrap(err, "roll back to savepoint", name)
}

func (c *conn) Release(ctx context.Context, name string) error {
	if i := c.savedAt(name); i >= 0 {
		c.saved = c.saved[:i]
	}
	c.count()
	_, err := c.tx.ExecContext(ctx, "RELEASE "+name)
	return wrap(err, "release savepoint", name)
}

func (c *conn) AccountingHold(context.Context, []string) error { return nil }

// One writer holds the allowance and the tenants: it decides reservations
// in the process (ahead.go), with no lock order to keep, so none is taken
// ahead.
func (c *conn) AccountingReserveAhead(context.Context, int) error          { return nil }
func (c *conn) TenantReserveAhead(context.Context, string, int) error      { return nil }
func (c *conn) LevelsReserveAhead(context.Context, string, int, int) error { return nil }

func (c *conn) LockLog(context.Context) error            { return nil }
func (c *conn) TryLockLog(context.Context) (bool, error) { return true, nil }

// TryLockCounts: the one writer holds every lock.
func (c *conn) TryLockCounts(context.Context) (bool, error) { return true, nil }

func (c *conn) LockClaims(context.Context, bool) error { return nil }

func (c *conn) LockTenants(context.Context) error { return nil }

func (c *conn) SettingGet(ctx context.Context, name string) (string, error) {
	v, err := c.q.SettingGet(ctx, name)
	return v, dbutil.One(err, "read setting", name)
}

func (c *conn) SettingList(ctx context.Context) (map[string]string, error) {
	rows, err := c.q.SettingList(ctx)
	if err != nil {
		return nil, dbutil.Failed(err, "read settings", "")
	}
	out := make(map[string]string, len(rows))
	for _, r := range rows {
		out[r.Name] = r.Value
	}
	return out, nil
}

func (c *conn) SettingPut(ctx context.Context, name, value string) error {
	return wrap(c.q.SettingPut(ctx, name, value), "write setting", name)
}

// wrap is dbutil.Failed for an error that may be nil.
func wrap(err error, what, subject string) error {
	if err == nil {
		return nil
	}
	return dbutil.Failed(err, what, subject)
}

func hostFrom(h dbsqlc.Host) store.Host {
	return store.Host{ID: h.ID, Instance: h.Instance, URL: h.Url, StartedAtMS: h.StartedAtMs, SeenAtMS: h.SeenAtMs, Serving: h.Serving == 1}
}

func (c *conn) HostGet(ctx context.Context, id string) (store.Host, error) {
	h, err := c.q.HostGet(ctx, id)
	return hostFrom(h), dbutil.One(err, "read host", id)
}

func (c *conn) HostList(ctx context.Context) ([]store.Host, error) {
	rows, err := c.q.HostList(ctx)
	out := make([]store.Host, 0, len(rows))
	for _, h := range rows {
		out = append(out, hostFrom(h))
	}
	return out, wrap(err, "list hosts", "")
}

func (c *conn) HostPut(ctx context.Context, h store.Host) error {
	return wrap(c.q.HostPut(ctx, &dbsqlc.HostPutParams{ID: h.ID, Instance: h.Instance, Url: h.URL,
		StartedAtMs: h.StartedAtMS, SeenAtMs: h.SeenAtMS, Serving: dbutil.Bool(h.Serving)}), "record host", h.ID)
}

func (c *conn) HostSeen(ctx context.Context, p *store.HostSeenParams) (store.HostSeenResult, error) {
	serving, err := c.q.HostSeen(ctx, &dbsqlc.HostSeenParams{SeenAtMs: p.AtMS, ID: p.ID, Instance: p.Instance})
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return store.HostSeenResult{}, nil
	case err != nil:
		return store.HostSeenResult{}, dbutil.Failed(err, "renew host", p.ID)
	}
	return store.HostSeenResult{Found: true, Serving: serving == 1}, nil
}

func (c *conn) HostRetire(ctx context.Context, h store.Host) (bool, error) {
	n, err := c.q.HostRetire(ctx, &dbsqlc.HostRetireParams{ID: h.ID, Instance: h.Instance, SeenAtMs: h.SeenAtMS})
	return n == 1, wrap(err, "retire host", h.ID)
}

func (c *conn) KernelInsert(ctx context.Context, k store.Kernel) error {
	return wrap(c.q.KernelInsert(ctx, &dbsqlc.KernelInsertParams{PublicKey: k.PublicKey, Seed: k.Seed, CreatedAtMs: k.CreatedAtMS}),
		"save kernel key", "")
}

func (c *conn) KernelGet(ctx context.Context) (store.Kernel, error) {
	k, err := c.q.KernelGet(ctx)
	return store.Kernel{PublicKey: k.PublicKey, Seed: k.Seed, CreatedAtMS: k.CreatedAtMs}, dbutil.One(err, "load kernel key", "")
}

func credentialFrom(c dbsqlc.Credential) store.Credential {
	out := store.Credential{Name: c.Name, Role: c.Role, SHA256: c.Sha256, CreatedMS: c.CreatedAtMs, RevokedMS: c.RevokedAtMs,
		Spent: c.Spent, Reserved: c.Reserved, Tenants: store.SplitTenants(c.Tenants)}
	if c.Allowance.Valid {
		out.Allowance = &c.Allowance.Int64
	}
	return out
}

func (c *conn) CredentialInsert(ctx context.Context, cr store.Credential) error {
	return wrap(c.q.CredentialInsert(ctx, &dbsqlc.CredentialInsertParams{Name: cr.Name, Role: cr.Role, Sha256: cr.SHA256,
		CreatedAtMs: cr.CreatedMS, Allowance: nullable(cr.Allowance), Tenants: store.JoinTenants(cr.Tenants)}), "record credential", cr.Name)
}

func (c *conn) CredentialGet(ctx context.Context, name string, _ store.Lock) (store.Credential, error) {
	cr, err := c.q.CredentialGet(ctx, name)
	return credentialFrom(cr), dbutil.One(err, "read credential", name)
}

func (c *conn) CredentialList(ctx context.Context) ([]store.Credential, error) {
	rows, err := c.q.CredentialList(ctx)
	out := make([]store.Credential, 0, len(rows))
	for _, r := range rows {
		out = append(out, credentialFrom(r))
	}
	return out, wrap(err, "list credentials", "")
}

func (c *conn) JobTenantOfDocument(ctx context.Context, documentID string) (string, error) {
	tenant, err := c.q.JobTenantOfDocument(ctx, documentID)
	return tenant, dbutil.One(err, "read the tenant of document", documentID)
}

func (c *conn) CredentialUpdate(ctx context.Context, cr store.Credential) error {
	n, err := c.q.CredentialUpdate(ctx, &dbsqlc.CredentialUpdateParams{Sha256: cr.SHA256, RevokedAtMs: cr.RevokedMS, Name: cr.Name})
	if err == nil && n != 1 {
		err = store.ErrNotFound
	}
	return wrap(err, "update credential", cr.Name)
}

func (c *conn) BatchInsert(ctx context.Context, b store.Batch) error {
	return wrap(c.q.BatchInsert(ctx, &dbsqlc.BatchInsertParams{IdempotencyKey: b.Key, RequestSha256: b.RequestSHA256,
		Document: b.Document, CreatedAtMs: b.CreatedMS}), "record batch", b.Key)
}

func (c *conn) BatchGet(ctx context.Context, key string) (store.Batch, error) {
	b, err := c.q.BatchGet(ctx, key)
	return store.Batch{Key: key, RequestSHA256: b.RequestSha256, Document: b.Document, CreatedMS: b.CreatedAtMs},
		dbutil.One(err, "read batch", key)
}

func (c *conn) JobMaxPosition(ctx context.Context) (int64, error) {
	n, err := c.q.JobMaxPosition(ctx)
	return n, dbutil.One(err, "read queue tail", "")
}

func (c *conn) JobInsert(ctx context.Context, p *store.JobInsertParams) error {
	return wrap(c.q.JobInsert(ctx, &dbsqlc.JobInsertParams{OperationID: p.OperationID, Position: p.Position,
		BatchKey: p.BatchKey, Section: p.Section, DocumentID: p.DocumentID, InputSha256: p.InputSHA256,
		CreatedAtMs: p.CreatedAtMS, UpdatedAtMs: p.CreatedAtMS, ClaimableAtMs: p.CreatedAtMS, MaxAttempts: p.MaxAttempts,
		BackoffBaseMs: p.BackoffBaseMS, BackoffCapMs: p.BackoffCapMS, ExpectedSha256: p.ExpectedSHA256,
		Priority: p.PriorityOrDefault(), Tenant: p.TenantOrDefault(), WaitingOn: p.WaitingOn, Dependents: p.Dependents}), "enqueue", p.Section)
}

func (c *conn) JobInsertMany(ctx context.Context, jobs []store.JobInsertParams) error {
	return wrap(c.q.JobInsertMany(ctx, dbutil.JobRows(jobs)), "enqueue jobs", "")
}

func (c *conn) DocumentInsertMany(ctx context.Context, ids []string, atMS int64) error {
	return wrap(c.q.DocumentInsertMany(ctx, atMS, dbutil.Strings(ids)), "create documents", "")
}

// jobRow is every job query's row: the job, its document's assignment and
// version, and its retained publication outcome.
type jobRow = struct {
	Job        dbsqlc.Job
	Generation int64
	Owner      string
	Version    int64
	Outcome    string
}

// claimRowJob reads a claim's row as its job's columns.
var claimRowJob = dbutil.Leading[dbsqlc.Job, dbsqlc.JobClaimManyRow]()

// pickRowJob reads a pick's row as its job's columns.
var pickRowJob = dbutil.Leading[dbsqlc.Job, dbsqlc.JobPickManyRow]()

// jobFrom is the one place a job row's columns are mapped to a store.Job.
func jobFrom(j dbsqlc.Job) store.Job {
	return store.Job{OperationID: j.OperationID, Position: j.Position, BatchKey: j.BatchKey, Section: j.Section,
		DocumentID: j.DocumentID, InputSHA256: j.InputSha256, State: wire.JobState(j.State), Worker: j.Worker,
		ClaimID: j.ClaimID, ClaimHost: j.ClaimHost, LeaseExpiresAtMS: j.LeaseExpiresAtMs, Reserved: j.Reserved,
		ReserveShard: j.ReserveShard, AdmissionClaimID: j.AdmissionClaimID, Admission: dbutil.Raw(j.Admission),
		Reason: j.Reason, CreatedAtMS: j.CreatedAtMs, UpdatedAtMS: j.UpdatedAtMs, Attempts: j.Attempts,
		MaxAttempts: j.MaxAttempts, BackoffBaseMS: j.BackoffBaseMs, BackoffCapMS: j.BackoffCapMs,
		ClaimableAtMS: j.ClaimableAtMs, LastError: j.LastError, ExpectedSHA256: j.ExpectedSha256,
		ClaimedAtMS: j.ClaimedAtMs, StartedAtMS: j.StartedAtMs, FinishedAtMS: j.FinishedAtMs,
		Priority: j.Priority, Tenant: j.Tenant, TenantShard: j.TenantShard, ReserveCredential: j.ReserveCredential,
		WaitingOn: j.WaitingOn, Dependents: j.Dependents, AfterJSON: j.AfterJson}
}

func rowFrom(r jobRow) store.Job {
	j := jobFrom(r.Job)
	j.Generation, j.Owner, j.DocumentVersion, j.Outcome = r.Generation, r.Owner, r.Version, dbutil.Raw(r.Outcome)
	return j
}

// jobsFrom converts the rows of any job query.
func jobsFrom[R ~struct {
	Job        dbsqlc.Job
	Generation int64
	Owner      string
	Version    int64
	Outcome    string
}](rows []R, err error, what string) ([]store.Job, error) {
	if err != nil {
		return nil, dbutil.Failed(err, what, "")
	}
	out := make([]store.Job, 0, len(rows))
	for _, r := range rows {
		out = append(out, rowFrom(jobRow(r)))
	}
	return out, nil
}

func (c *conn) JobGet(ctx context.Context, op string, _ store.Lock) (store.Job, error) {
	r, err := c.q.JobGet(ctx, op)
	return rowFrom(jobRow(r)), dbutil.One(err, "read job", op)
}

func (c *conn) JobGetMany(ctx context.Context, ops []string) ([]store.Job, error) {
	rows, err := c.q.JobGetMany(ctx, ops)
	return jobsFrom(rows, err, "read jobs")
}

func (c *conn) JobClaimMany(ctx context.Context, p *store.JobClaimManyParams) ([]store.ClaimedJob, error) {
	rows, err := c.q.JobClaimMany(ctx, &dbsqlc.JobClaimManyParams{Tenant: p.TenantOrDefault(), ClaimPrefix: p.ClaimPrefix, Worker: p.Worker,
		ClaimHost: p.ClaimHost, LeaseExpiresAtMs: p.LeaseExpiresAtMS, UpdatedAtMs: p.NowMS, ClaimableByMs: p.NowMS,
		Max: int64(p.Max), UnlessPaused: dbutil.Bool(p.UnlessPaused)})
	if err != nil || len(rows) == 0 {
		return nil, wrap(err, "claim", p.Worker)
	}
	claimed := make([]store.ClaimedJob, len(rows))
	docs := make([]string, len(rows))
	for i, r := range rows {
		claimed[i] = store.ClaimedJob{Job: jobFrom(claimRowJob(&r)), BatchDocument: r.Document}
		docs[i] = r.DocumentID
	}
	return claimed, c.assignClaimed(ctx, p, claimed, docs)
}

func (c *conn) JobPickMany(ctx context.Context, p *store.JobClaimManyParams, exclude []string) ([]store.ClaimedJob, error) {
	rows, err := c.q.JobPickMany(ctx, &dbsqlc.JobPickManyParams{Tenant: p.TenantOrDefault(), ClaimableByMs: p.NowMS,
		Exclude: dbutil.Strings(exclude), Max: int64(p.Max), UnlessPaused: dbutil.Bool(p.UnlessPaused)})
	if err != nil || len(rows) == 0 {
		return nil, wrap(err, "claim", p.Worker)
	}
	picked := make([]store.ClaimedJob, len(rows))
	docs := make([]string, len(rows))
	for i, r := range rows {
		picked[i] = store.ClaimedJob{Job: p.Claimed(jobFrom(pickRowJob(&r)), i+1), BatchDocument: r.BatchDocument}
		docs[i] = r.DocumentID
	}
	return picked, c.assignClaimed(ctx, p, picked, docs)
}

// assignClaimed assigns a claim's documents to their workers (each job's
// Worker: the claim's, or a pick's for several claims, its owner's) at
// their next generation, records the assignments and puts the jobs in
// claim order.
func (c *conn) assignClaimed(ctx context.Context, p *store.JobClaimManyParams, claimed []store.ClaimedJob, docs []string) error {
	byOwner := map[string][]string{}
	var owners []string
	for i, j := range claimed {
		if byOwner[j.Worker] == nil {
			owners = append(owners, j.Worker)
		}
		byOwner[j.Worker] = append(byOwner[j.Worker], docs[i])
	}
	byDoc := make(map[string]dbsqlc.DocumentAssignManyRow, len(claimed))
	for _, owner := range owners {
		assigned, err := c.q.DocumentAssignMany(ctx, &dbsqlc.DocumentAssignManyParams{Owner: owner, UpdatedAtMs: p.NowMS, Ids: dbutil.Strings(byOwner[owner])})
		if err != nil {
			return dbutil.Failed(err, "claim: assign documents to", owner)
		}
		for _, a := range assigned {
			byDoc[a.ID] = a
		}
	}
	for i := range claimed {
		a := byDoc[claimed[i].DocumentID]
		claimed[i].Generation, claimed[i].Owner, claimed[i].DocumentVersion = a.Generation, claimed[i].Worker, a.Version
	}
	if err := c.q.AssignmentInsertMany(ctx, &dbsqlc.AssignmentInsertManyParams{Reason: "claim", AtMs: p.NowMS, Ids: dbutil.Strings(docs)}); err != nil {
		return dbutil.Failed(err, "claim: record assignments to", p.Worker)
	}
	sortClaimed(claimed)
	return nil
}

// JobClaimWriteMany writes each picked job in a statement of its own: one
// writer runs them in process, so one per job costs no round trip.
func (c *conn) JobClaimWriteMany(ctx context.Context, jobs []store.Job) error {
	for _, j := range jobs {
		n, err := c.q.JobClaimWrite(ctx, &dbsqlc.JobClaimWriteParams{State: string(j.State), ClaimID: j.ClaimID, Worker: j.Worker,
			ClaimHost: j.ClaimHost, LeaseExpiresAtMs: j.LeaseExpiresAtMS, Reason: j.Reason, ClaimedAtMs: j.ClaimedAtMS,
			StartedAtMs: j.StartedAtMS, FinishedAtMs: j.FinishedAtMS, Reserved: j.Reserved, ReserveShard: j.ReserveShard,
			TenantShard: j.TenantShard, ReserveCredential: j.ReserveCredential, AdmissionClaimID: j.AdmissionClaimID,
			Admission: string(j.Admission), UpdatedAtMs: j.UpdatedAtMS, OperationID: j.OperationID})
		if err := dbutil.Guarded(n, err, "write a claim's job", j.OperationID); err != nil {
			return err
		}
	}
	return nil
}

// sortClaimed puts a claim's jobs in claim order (RETURNING has none).
func sortClaimed(jobs []store.ClaimedJob) {
	slices.SortFunc(jobs, func(a, b store.ClaimedJob) int {
		return cmp.Or(cmp.Compare(a.Priority, b.Priority), cmp.Compare(a.ClaimableAtMS, b.ClaimableAtMS), cmp.Compare(a.Position, b.Position))
	})
}

func (c *conn) JobSetRunning(ctx context.Context, p *store.JobSetRunningParams) error {
	n, err := c.q.JobSetRunning(ctx, &dbsqlc.JobSetRunningParams{Reserved: p.Reserved, ReserveShard: p.ReserveShard, TenantShard: p.TenantShard, ReserveCredential: p.ReserveCredential,
		Admission: string(p.Admission), LeaseExpiresAtMs: p.LeaseExpiresAtMS, Reason: p.Reason, UpdatedAtMs: p.NowMS,
		OperationID: p.OperationID, IfClaimID: p.IfClaimID})
	return dbutil.Guarded(n, err, "set running", p.OperationID)
}

func (c *conn) JobSetRefused(ctx context.Context, p *store.JobSetRefusedParams) error {
	n, err := c.q.JobSetRefused(ctx, &dbsqlc.JobSetRefusedParams{Admission: string(p.Admission), Reason: p.Reason,
		UpdatedAtMs: p.NowMS, OperationID: p.OperationID, IfClaimID: p.IfClaimID})
	return dbutil.Guarded(n, err, "set refused", p.OperationID)
}

// JobSetRunningMany is JobSetRunning for each: one writer runs each
// statement in process, so one per job costs no round trip.
func (c *conn) JobSetRunningMany(ctx context.Context, ps []store.JobSetRunningParams) error {
	for i := range ps {
		if err := c.JobSetRunning(ctx, &ps[i]); err != nil {
			return err
		}
	}
	return nil
}

// JobSetRefusedMany is JobSetRefused for each.
func (c *conn) JobSetRefusedMany(ctx context.Context, ps []store.JobSetRefusedParams) error {
	for i := range ps {
		if err := c.JobSetRefused(ctx, &ps[i]); err != nil {
			return err
		}
	}
	return nil
}

func (c *conn) JobRenewLease(ctx context.Context, p *store.JobRenewLeaseParams) error {
	n, err := c.q.JobRenewLease(ctx, &dbsqlc.JobRenewLeaseParams{LeaseExpiresAtMs: p.LeaseExpiresAtMS, UpdatedAtMs: p.NowMS,
		OperationID: p.OperationID, IfClaimID: p.IfClaimID})
	return dbutil.Guarded(n, err, "renew lease of", p.OperationID)
}

func (c *conn) JobComplete(ctx context.Context, p *store.JobCompleteParams) error {
	n, err := c.q.JobComplete(ctx, &dbsqlc.JobCompleteParams{Reason: p.Reason, UpdatedAtMs: p.NowMS,
		OperationID: p.OperationID, IfState: string(p.IfState)})
	return dbutil.Guarded(n, err, "complete", p.OperationID)
}

// JobCompleteMany is JobComplete for each.
func (c *conn) JobCompleteMany(ctx context.Context, ps []store.JobCompleteParams) error {
	for i := range ps {
		if err := c.JobComplete(ctx, &ps[i]); err != nil {
			return err
		}
	}
	return nil
}

func (c *conn) JobRequeue(ctx context.Context, p *store.JobRequeueParams) error {
	n, err := c.q.JobRequeue(ctx, &dbsqlc.JobRequeueParams{Worker: p.Worker, Attempts: p.Attempts,
		ClaimableAtMs: p.ClaimableAtMS, LastError: p.LastError, Reason: p.Reason, UpdatedAtMs: p.NowMS,
		OperationID: p.OperationID, IfState: string(p.IfState)})
	return dbutil.Guarded(n, err, "requeue", p.OperationID)
}

func (c *conn) JobFail(ctx context.Context, p *store.JobFailParams) error {
	n, err := c.q.JobFail(ctx, &dbsqlc.JobFailParams{Attempts: p.Attempts, LastError: p.LastError, Reason: p.Reason,
		UpdatedAtMs: p.NowMS, OperationID: p.OperationID, IfState: string(p.IfState)})
	return dbutil.Guarded(n, err, "fail", p.OperationID)
}

func (c *conn) JobSetUnresolved(ctx context.Context, p *store.JobSetUnresolvedParams) error {
	n, err := c.q.JobSetUnresolved(ctx, &dbsqlc.JobSetUnresolvedParams{Reason: p.Reason, UpdatedAtMs: p.NowMS,
		OperationID: p.OperationID})
	return dbutil.Guarded(n, err, "set unresolved", p.OperationID)
}

func (c *conn) JobCancel(ctx context.Context, p *store.JobCancelParams) error {
	n, err := c.q.JobCancel(ctx, &dbsqlc.JobCancelParams{ToState: string(p.To), Reason: p.Reason, UpdatedAtMs: p.NowMS,
		OperationID: p.OperationID, IfState: string(p.IfState)})
	return dbutil.Guarded(n, err, "cancel", p.OperationID)
}

func (c *conn) JobList(ctx context.Context) ([]store.Job, error) {
	rows, err := c.q.JobList(ctx)
	return jobsFrom(rows, err, "list jobs")
}

func (c *conn) JobListByBatch(ctx context.Context, key string) ([]string, error) {
	ops, err := c.q.JobListByBatch(ctx, key)
	return ops, wrap(err, "list batch", key)
}

func (c *conn) JobListExpired(ctx context.Context, p *store.JobListExpiredParams) ([]store.Job, error) {
	rows, err := c.q.JobListExpired(ctx, p.NowMS)
	return jobsFrom(rows, err, "list expired leases")
}

func (c *conn) JobListClaimedBy(ctx context.Context, hostIDs []string) ([]store.Job, error) {
	if len(hostIDs) == 0 {
		return []store.Job{}, nil
	}
	rows, err := c.q.JobListClaimedBy(ctx, dbutil.Strings(hostIDs))
	return jobsFrom(rows, err, "list claims of hosts")
}

func (c *conn) JobListClaimedUnder(ctx context.Context, p *store.JobListClaimedUnderParams) ([]store.ClaimedJob, error) {
	rows, err := c.q.JobListClaimedUnder(ctx, p.Worker, p.Prefix)
	if err != nil {
		return nil, dbutil.Failed(err, "list claims of", p.Worker)
	}
	out := make([]store.ClaimedJob, 0, len(rows))
	for _, r := range rows {
		j := jobFrom(r.Job)
		j.Generation, j.Owner, j.DocumentVersion = r.Generation, r.Owner, r.Version
		out = append(out, store.ClaimedJob{Job: j, BatchDocument: r.BatchDocument})
	}
	return out, nil
}

func (c *conn) JobPending(ctx context.Context) (bool, error) {
	pending, err := c.q.JobPending(ctx)
	return pending, wrap(err, "read queue status", "")
}

func (c *conn) WorkerActivity(ctx context.Context, sinceMS int64) ([]store.WorkerActivity, error) {
	rows, err := c.q.WorkerActivity(ctx, sinceMS)
	out := make([]store.WorkerActivity, 0, len(rows))
	for _, r := range rows {
		out = append(out, store.WorkerActivity{Worker: r.Worker, Held: r.Held, Completed: r.Completed, Failed: r.Failed, LastSeenMS: r.LastSeenMs})
	}
	return out, wrap(err, "read worker activity", "")
}

func (c *conn) JobCountByState(ctx context.Context) (map[wire.JobState]int64, error) {
	out := make(map[wire.JobState]int64, len(store.CountedStates)+1)
	for _, state := range store.CountedStates {
		n, err := c.q.JobCountInState(ctx, state)
		if err != nil {
			return nil, wrap(err, "count jobs", state)
		}
		if n > 0 {
			out[wire.JobState(state)] = n
		}
	}
	enqueued, err := c.q.JobMaxPosition(ctx)
	return store.WithCompleted(out, enqueued), wrap(err, "count jobs", "")
}

func (c *conn) JobCountsSaved(ctx context.Context) (store.SavedCounts, error) {
	r, err := c.q.JobCountsSaved(ctx)
	return dbutil.SavedCounts(r.TakenMs, r.Counts, err)
}

func (c *conn) JobCountsSave(ctx context.Context, sc store.SavedCounts) error {
	return wrap(c.q.JobCountsSave(ctx, sc.TakenMS, dbutil.JSON(sc.Counts)), "save the job counts", "")
}

// JobPage takes the query whose index serves the one filter given (any
// mix of filters, or a search by prefix, scans in queue order).
func (c *conn) JobPage(ctx context.Context, p *store.JobPageParams) ([]store.Job, error) {
	f, after, limit := p.Filter, p.After, int64(p.Limit)
	const what = "list a page of jobs"
	switch {
	case f == store.JobFilter{}:
		rows, err := c.q.JobPage(ctx, after, limit)
		return jobsFrom(rows, err, what)
	case f == store.JobFilter{State: f.State}:
		rows, err := c.q.JobPageByState(ctx, &dbsqlc.JobPageByStateParams{State: string(f.State), After: after, Max: limit})
		return jobsFrom(rows, err, what)
	case f == store.JobFilter{Section: f.Section}:
		rows, err := c.q.JobPageBySection(ctx, &dbsqlc.JobPageBySectionParams{Section: f.Section, After: after, Max: limit})
		return jobsFrom(rows, err, what)
	case f == store.JobFilter{Owner: f.Owner}:
		rows, err := c.q.JobPageByOwner(ctx, &dbsqlc.JobPageByOwnerParams{Owner: f.Owner, After: after, Max: limit})
		return jobsFrom(rows, err, what)
	}
	rows, err := c.q.JobPageFiltered(ctx, &dbsqlc.JobPageFilteredParams{After: after, State: string(f.State),
		Section: f.Section, Owner: f.Owner, Priority: f.Priority, Tenant: f.Tenant, Prefix: f.OperationPrefix, Max: limit})
	return jobsFrom(rows, err, what)
}

func (c *conn) AttemptInsert(ctx context.Context, a store.Attempt) error {
	return wrap(c.q.AttemptInsert(ctx, &dbsqlc.AttemptInsertParams{OperationID: a.OperationID, Attempt: a.Attempt.Attempt,
		ClaimID: a.ClaimID, Worker: a.Worker, Generation: a.Generation, Reason: a.Reason, Retryable: dbutil.Bool(a.Retryable),
		Outcome: a.Outcome, Cost: a.Cost, Answer: string(a.Answer), AtMs: a.AtMS}), "record attempt of", a.OperationID)
}

func (c *conn) AttemptList(ctx context.Context, op string) ([]store.Attempt, error) {
	rows, err := c.q.AttemptList(ctx, op)
	out := make([]store.Attempt, 0, len(rows))
	for _, r := range rows {
		out = append(out, store.Attempt{OperationID: op, ClaimID: r.ClaimID, Answer: dbutil.Raw(r.Answer),
			Attempt: wire.Attempt{Attempt: r.Attempt, Worker: r.Worker, Generation: r.Generation, Reason: r.Reason,
				Retryable: r.Retryable == 1, Outcome: r.Outcome, Cost: r.Cost, AtMS: r.AtMs}})
	}
	return out, wrap(err, "list attempts of", op)
}

func (c *conn) DocumentInsert(ctx context.Context, id string, atMS int64) error {
	return wrap(c.q.DocumentInsert(ctx, id, atMS), "create document", id)
}

func (c *conn) DocumentGet(ctx context.Context, id string, _ store.Lock) (wire.Document, error) {
	d, err := c.q.DocumentGet(ctx, id)
	return wire.Document{ID: d.ID, Version: d.Version, Generation: d.Generation, Owner: d.Owner, Body: []byte(d.Body)},
		dbutil.One(err, "read document", id)
}

func (c *conn) DocumentAssign(ctx context.Context, p *store.DocumentAssignParams) (store.Assigned, error) {
	ifGeneration := int64(-1)
	if p.IfGeneration != nil {
		ifGeneration = *p.IfGeneration
	}
	gen, err := c.q.DocumentAssign(ctx, &dbsqlc.DocumentAssignParams{Owner: p.Owner, UpdatedAtMs: p.AtMS, ID: p.ID,
		IfGeneration: ifGeneration})
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return store.Assigned{}, nil
	case err != nil:
		return store.Assigned{}, dbutil.Failed(err, "assign document", p.ID)
	}
	err = c.q.AssignmentInsert(ctx, &dbsqlc.AssignmentInsertParams{DocumentID: p.ID, Generation: gen, Owner: p.Owner,
		Reason: p.Reason, AtMs: p.AtMS})
	return store.Assigned{Generation: gen, OK: err == nil}, wrap(err, "record assignment of", p.ID)
}

func (c *conn) DocumentWrite(ctx context.Context, p *store.DocumentWriteParams) error {
	return wrap(c.q.DocumentWrite(ctx, &dbsqlc.DocumentWriteParams{Body: string(p.Body), Version: p.Version,
		UpdatedAtMs: p.AtMS, ID: p.ID}), "write document", p.ID)
}

// DocumentWriteMany is DocumentWrite for each.
func (c *conn) DocumentWriteMany(ctx context.Context, ps []store.DocumentWriteParams) error {
	for i := range ps {
		if err := c.DocumentWrite(ctx, &ps[i]); err != nil {
			return err
		}
	}
	return nil
}

func (c *conn) AssignmentList(ctx context.Context, documentID string) ([]store.Assignment, error) {
	rows, err := c.q.AssignmentList(ctx, documentID)
	out := make([]store.Assignment, 0, len(rows))
	for _, a := range rows {
		out = append(out, store.Assignment{DocumentID: a.DocumentID, Generation: a.Generation, Owner: a.Owner, Reason: a.Reason, AtMS: a.AtMs})
	}
	return out, wrap(err, "list assignments of", documentID)
}

func (c *conn) MutationInsert(ctx context.Context, ms ...store.Mutation) error {
	switch len(ms) {
	case 0:
		return nil
	case 1:
		m := ms[0]
		return wrap(c.q.MutationInsert(ctx, &dbsqlc.MutationInsertParams{DocumentID: m.DocumentID, Version: m.Version,
			OperationKey: m.OperationKey, Caller: m.Caller, AtMs: m.AtMS}), "record mutation of", m.DocumentID)
	}
	rows := dbutil.NewRows(len(ms), 120)
	for _, m := range ms {
		rows.Row().Str(m.DocumentID).Int(m.Version).Str(m.OperationKey).Str(m.Caller).Int(m.AtMS)
	}
	return wrap(c.q.MutationInsertMany(ctx, rows.String()), "record mutations", "")
}

func (c *conn) MutationList(ctx context.Context, documentID string) ([]store.Mutation, error) {
	rows, err := c.q.MutationList(ctx, documentID)
	out := make([]store.Mutation, 0, len(rows))
	for _, m := range rows {
		out = append(out, store.Mutation{DocumentID: m.DocumentID, Version: m.Version, OperationKey: m.OperationKey, Caller: m.Caller, AtMS: m.AtMs})
	}
	return out, wrap(err, "list mutations of", documentID)
}

func (c *conn) MutationCount(ctx context.Context, documentID string) (int64, error) {
	n, err := c.q.MutationCount(ctx, documentID)
	return n, wrap(err, "count mutations of", documentID)
}

func (c *conn) MutationTotal(ctx context.Context) (int64, error) {
	n, err := c.q.MutationTotal(ctx)
	return n, wrap(err, "count mutations", "")
}

func (c *conn) MutationCountByDocument(ctx context.Context) (map[string]int64, error) {
	rows, err := c.q.MutationCountByDocument(ctx)
	out := make(map[string]int64, len(rows))
	for _, r := range rows {
		out[r.DocumentID] = r.Mutations
	}
	return out, wrap(err, "count mutations by document", "")
}

func (c *conn) MutationRepeatedOperations(ctx context.Context) (int64, error) {
	n, err := c.q.MutationRepeatedOperations(ctx)
	return n, wrap(err, "count repeated mutations", "")
}

func (c *conn) OperationGet(ctx context.Context, documentID, key string) (store.StoredOperation, error) {
	o, err := c.q.OperationGet(ctx, documentID, key)
	return store.StoredOperation{Operation: operationFrom(o), Binding: []byte(o.Binding), CreatedMS: o.CreatedAtMs},
		dbutil.One(err, "look up operation", key)
}

func (c *conn) OperationGetMany(ctx context.Context, refs []store.OperationRef) ([]store.StoredOperation, error) {
	docs, keys := make([]string, len(refs)), make([]string, len(refs))
	for i, r := range refs {
		docs[i], keys[i] = r.DocumentID, r.Key
	}
	rows, err := c.q.OperationGetMany(ctx, docs, keys)
	if err != nil {
		return nil, dbutil.Failed(err, "look up operations", "")
	}
	out := make([]store.StoredOperation, len(rows))
	for i, o := range rows {
		out[i] = store.StoredOperation{Operation: operationFrom(o), Binding: []byte(o.Binding), CreatedMS: o.CreatedAtMs}
	}
	return out, nil
}

func operationFrom(o dbsqlc.Operation) wire.Operation {
	return wire.Operation{DocumentID: o.DocumentID, OperationKey: o.OperationKey, Caller: o.Caller,
		Status: wire.Status(o.Status), Outcome: []byte(o.Outcome), Deliveries: o.Deliveries}
}

func (c *conn) OperationCountDelivery(ctx context.Context, documentID, key string) error {
	return wrap(c.q.OperationCountDelivery(ctx, documentID, key), "count delivery of", key)
}

func (c *conn) OperationInsert(ctx context.Context, os ...store.StoredOperation) error {
	switch len(os) {
	case 0:
		return nil
	case 1:
		o := os[0]
		return wrap(c.q.OperationInsert(ctx, &dbsqlc.OperationInsertParams{DocumentID: o.DocumentID, OperationKey: o.OperationKey,
			Binding: string(o.Binding), Caller: o.Caller, Status: string(o.Status), Outcome: string(o.Outcome),
			Deliveries: o.Deliveries, CreatedAtMs: o.CreatedMS}), "record operation", o.OperationKey)
	}
	size := 0
	for _, o := range os {
		size += len(o.Binding) + len(o.Outcome)
	}
	rows := dbutil.NewRows(len(os), size/max(len(os), 1)+160)
	for _, o := range os {
		rows.Row().Str(o.DocumentID).Str(o.OperationKey).Str(string(o.Binding)).Str(o.Caller).Str(string(o.Status)).Str(string(o.Outcome)).
			Int(o.Deliveries).Int(o.CreatedMS)
	}
	return wrap(c.q.OperationInsertMany(ctx, rows.String()), "record operations", "")
}

func (c *conn) OperationList(ctx context.Context, documentID string) ([]wire.Operation, error) {
	rows, err := c.q.OperationList(ctx, documentID)
	out := make([]wire.Operation, 0, len(rows))
	for _, o := range rows {
		out = append(out, operationFrom(o))
	}
	return out, wrap(err, "list operations of", documentID)
}

func (c *conn) CredentialReserve(ctx context.Context, name string) (store.CredentialReservation, error) {
	cr, err := c.q.CredentialReserve(ctx, name)
	if errors.Is(err, sql.ErrNoRows) { // no allowance of its own, or not enough of it
		cr, err := c.CredentialGet(ctx, name, store.NoLock)
		return store.CredentialReservation{Credential: cr}, err
	}
	return store.CredentialReservation{Credential: credentialFrom(cr), OK: err == nil}, wrap(err, "reserve at credential", name)
}

func (c *conn) CredentialMove(ctx context.Context, p *store.CredentialMoveParams) (bool, error) {
	_, err := c.q.CredentialMove(ctx, &dbsqlc.CredentialMoveParams{FromReserved: p.FromReserved, ToSpent: p.ToSpent, Name: p.Name})
	if errors.Is(err, sql.ErrNoRows) {
		return false, nil
	}
	return err == nil, wrap(err, "settle credits at credential", p.Name)
}
