package postgres

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"

	"slices"

	"github.com/jackc/pgx/v5"

	"github.com/fleet/fleet/internal/store"
	"github.com/fleet/fleet/internal/store/dbutil"
	"github.com/fleet/fleet/internal/store/postgres/dbsqlc"
	"github.com/fleet/fleet/internal/wire"
)

// conn is one PostgreSQL transaction: store.Executor over the queries in
// dbsqlc, run through the pipeline (pipeline.go), with the allowance over
// shards (accounting.go) and the log's statements joined (log.go).
type conn struct {
	q        *dbsqlc.Queries
	pipe     *pipeline
	channel  string // where placing the log is announced (LISTEN/NOTIFY)
	instance string // who announces
	// ahead is what the transaction holds and changed of the allowance
	// without statements yet (accounting.go; nil when nothing), and
	// aheadAt what it was at each open savepoint, so that rolling back to
	// one undoes what was changed after it.
	ahead   *allowanceAhead
	aheadAt map[string]*allowanceAhead
	// tenantHeld is the shard of each tenant this transaction reserved on
	// (tenants.go), and tenantHeldAt what it was at each open savepoint.
	tenantHeld   map[string]int64
	tenantHeldAt map[string]map[string]int64
	// tenantsAhead is what the transaction took ahead at each tenant
	// (tenants_ahead.go), and tenantsAheadAt what it was at each savepoint.
	tenantsAhead   map[string]*tenantAhead
	tenantsAheadAt map[string]map[string]*tenantAhead
	// tenantsHeld are the tenant shards AccountingHold locked, with the
	// settlements on them not yet written (tenants_held.go), and
	// tenantsHeldAt what they were at each savepoint.
	tenantsHeld   *heldTenantShards
	tenantsHeldAt map[string]*heldTenantShards
}

var _ store.Conn = (*conn)(nil)

func (c *conn) Savepoint(ctx context.Context, name string) error {
	if c.aheadAt == nil {
		c.aheadAt = map[string]*allowanceAhead{}
	}
	c.aheadAt[name] = c.ahead.clone()
	if c.tenantHeldAt == nil {
		c.tenantHeldAt = map[string]map[string]int64{}
	}
	c.tenantHeldAt[name] = maps.Clone(c.tenantHeld)
	if c.tenantsAheadAt == nil {
		c.tenantsAheadAt = map[string]map[string]*tenantAhead{}
	}
	c.tenantsAheadAt[name] = cloneTenantsAhead(c.tenantsAhead)
	if c.tenantsHeldAt == nil {
		c.tenantsHeldAt = map[string]*heldTenantShards{}
	}
	c.tenantsHeldAt[name] = c.tenantsHeld.clone()
	return wrap(c.pipe.savepoint(name), "savepoint", name)
}

func (c *conn) RollbackTo(ctx context.Context, name string) error {
	if at, ok := c.aheadAt[name]; ok {
		c.ahead = at.clone() // the savepoint stays open: keep its copy
	}
	if at, ok := c.tenantHeldAt[name]; ok {
		c.tenantHeld = maps.Clone(at) // rolled back: its locks went with it
	}
	if at, ok := c.tenantsAheadAt[name]; ok {
		c.tenantsAhead = cloneTenantsAhead(at)
	}
	if at, ok := c.tenantsHeldAt[name]; ok {
		c.tenantsHeld = at.clone()
	}
	return wrap(c.pipe.rollbackTo(name), "roll back to savepoint", name)
}

func (c *conn) Release(ctx context.Context, name string) error {
	delete(c.aheadAt, name)
	delete(c.tenantHeldAt, name)
	delete(c.tenantsAheadAt, name)
	delete(c.tenantsHeldAt, name)
	return wrap(c.pipe.releaseSavepoint(name), "release savepoint", name)
}

func (c *conn) Statements() int64 { return c.pipe.statements }
func (c *conn) Rollback() error   { return c.pipe.Rollback() }

func (c *conn) Commit() error {
	if err := c.writeTenantsAhead(c.pipe.ctx); err != nil {
		return err
	}
	if err := c.writeAhead(c.pipe.ctx); err != nil {
		return err
	}
	return c.pipe.Commit()
}

func (c *conn) LockLog(ctx context.Context) error { return wrap(c.q.LockLog(ctx), "lock the log", "") }

func (c *conn) TryLockLog(ctx context.Context) (bool, error) {
	ok, err := c.q.TryLockLog(ctx)
	return ok, wrap(err, "try the log lock", "")
}

func (c *conn) TryLockCounts(ctx context.Context) (bool, error) {
	ok, err := c.q.TryLockCounts(ctx)
	return ok, wrap(err, "try the counts lock", "")
}

func (c *conn) LockClaims(ctx context.Context, exclusive bool) error {
	if exclusive {
		return wrap(c.q.LockClaimsExclusive(ctx), "lock claims", "")
	}
	return wrap(c.q.LockClaimsShared(ctx), "lock claims", "")
}

func (c *conn) LockTenants(ctx context.Context) error {
	return wrap(c.q.LockTenants(ctx), "lock tenants", "")
}

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
	case errors.Is(err, pgx.ErrNoRows):
		return store.HostSeenResult{}, nil
	case err != nil:
		return store.HostSeenResult{}, dbutil.Failed(err, "renew host", p.ID)
	}
	return store.HostSeenResult{Found: true, Serving: serving == 1}, nil
}

func (c *conn) HostRetire(ctx context.Context, h store.Host) (bool, error) {
	retired, err := c.q.HostRetire(ctx, &dbsqlc.HostRetireParams{ID: h.ID, Instance: h.Instance, SeenAtMs: h.SeenAtMS})
	return len(retired) == 1, wrap(err, "retire host", h.ID)
}

func (c *conn) KernelInsert(ctx context.Context, k store.Kernel) error {
	return wrap(c.q.KernelInsert(ctx, &dbsqlc.KernelInsertParams{PublicKey: k.PublicKey, Seed: k.Seed, CreatedAtMs: k.CreatedAtMS}),
		"save kernel key", "")
}

func (c *conn) KernelGet(ctx context.Context) (store.Kernel, error) {
	k, err := c.q.KernelGet(ctx)
	return store.Kernel{PublicKey: k.PublicKey, Seed: k.Seed, CreatedAtMS: k.CreatedAtMs}, dbutil.One(err, "load kernel key", "")
}

func (c *conn) JobTenantOfDocument(ctx context.Context, documentID string) (string, error) {
	tenant, err := c.q.JobTenantOfDocument(ctx, documentID)
	return tenant, dbutil.One(err, "read the tenant of document", documentID)
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
		CreatedAtMs: p.CreatedAtMS, MaxAttempts: p.MaxAttempts,
		BackoffBaseMs: p.BackoffBaseMS, BackoffCapMs: p.BackoffCapMS, ExpectedSha256: p.ExpectedSHA256,
		Priority: p.PriorityOrDefault(), Tenant: p.TenantOrDefault(), WaitingOn: p.WaitingOn, Dependents: p.Dependents}), "enqueue", p.Section)
}

func (c *conn) JobInsertMany(ctx context.Context, jobs []store.JobInsertParams) error {
	return wrap(c.q.JobInsertMany(ctx, []byte(dbutil.JobRows(jobs))), "enqueue jobs", "")
}

func (c *conn) DocumentInsertMany(ctx context.Context, ids []string, atMS int64) error {
	return wrap(c.q.DocumentInsertMany(ctx, atMS, ids), "create documents", "")
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

// Rows that lead with a job's columns where sqlc cannot embed the table
// (the claim's RETURNING, the locked batch read's common table
// expression), read as the job's.
var (
	claimRowJob = dbutil.Leading[dbsqlc.Job, dbsqlc.JobClaimManyRow]()
	pickRowJob  = dbutil.Leading[dbsqlc.Job, dbsqlc.JobPickManyRow]()
	manyRowJob  = dbutil.Leading[dbsqlc.Job, dbsqlc.JobGetManyRow]()
)

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

func (c *conn) JobGet(ctx context.Context, op string, lock store.Lock) (store.Job, error) {
	if lock {
		r, err := c.q.JobGetForUpdate(ctx, op)
		return rowFrom(jobRow(r)), dbutil.One(err, "read job", op)
	}
	r, err := c.q.JobGet(ctx, op)
	return rowFrom(jobRow(r)), dbutil.One(err, "read job", op)
}

func (c *conn) JobGetMany(ctx context.Context, ops []string) ([]store.Job, error) {
	rows, err := c.q.JobGetMany(ctx, ops)
	if err != nil {
		return nil, dbutil.Failed(err, "read jobs", "")
	}
	out := make([]store.Job, len(rows))
	for i, r := range rows {
		out[i] = rowFrom(jobRow{Job: manyRowJob(&r), Generation: r.Generation, Owner: r.Owner, Version: r.Version, Outcome: r.Outcome})
	}
	return out, nil
}

func (c *conn) JobClaimMany(ctx context.Context, p *store.JobClaimManyParams) ([]store.ClaimedJob, error) {
	// The claim reads jobs_claimable in its order up to the limit. On a
	// queue the planner has no statistics for yet (a burst of jobs before
	// autovacuum analyzes them) it would rather sort every queued job, at
	// tens of milliseconds a claim, so sorting is off for this statement.
	if err := c.plannerSort(ctx, false); err != nil {
		return nil, err
	}
	rows, err := c.q.JobClaimMany(ctx, &dbsqlc.JobClaimManyParams{Tenant: p.TenantOrDefault(), NowMs: p.NowMS, Max: int32(p.Max), ClaimPrefix: p.ClaimPrefix,
		Worker: p.Worker, ClaimHost: p.ClaimHost, LeaseExpiresAtMs: p.LeaseExpiresAtMS, UnlessPaused: p.UnlessPaused})
	if err == nil {
		err = c.plannerSort(ctx, true)
	}
	if err != nil {
		return nil, dbutil.Failed(err, "claim", p.Worker)
	}
	claimed := make([]store.ClaimedJob, len(rows))
	for i, r := range rows {
		j := jobFrom(claimRowJob(&r))
		j.Generation, j.Owner, j.DocumentVersion = r.Generation, p.Worker, r.Version
		claimed[i] = store.ClaimedJob{Job: j, BatchDocument: r.BatchDocument}
	}
	sortClaimed(claimed)
	return claimed, nil
}

func (c *conn) JobPickMany(ctx context.Context, p *store.JobClaimManyParams, exclude []string) ([]store.ClaimedJob, error) {
	// As JobClaimMany: the pick reads jobs_claimable in its order.
	if err := c.pickPlans(ctx, false); err != nil {
		return nil, err
	}
	rows, err := c.q.JobPickMany(ctx, &dbsqlc.JobPickManyParams{Tenant: p.TenantOrDefault(), NowMs: p.NowMS, Max: int32(p.Max),
		Exclude: orEmpty(exclude), Worker: p.Worker, UnlessPaused: p.UnlessPaused, Owners: p.OwnerNames()})
	if err == nil {
		err = c.pickPlans(ctx, true)
	}
	if err != nil {
		return nil, dbutil.Failed(err, "claim", p.Worker)
	}
	picked := make([]store.ClaimedJob, len(rows))
	for i, r := range rows {
		j := p.Claimed(jobFrom(pickRowJob(&r)), int(r.Slot))
		j.Generation, j.DocumentVersion = r.Generation, r.Version
		picked[i] = store.ClaimedJob{Job: j, BatchDocument: r.BatchDocument}
	}
	sortClaimed(picked)
	return picked, nil
}

func (c *conn) JobClaimWriteMany(ctx context.Context, jobs []store.Job) error {
	if len(jobs) == 1 {
		j := jobs[0]
		return wrap(c.q.JobClaimWrite(ctx, &dbsqlc.JobClaimWriteParams{State: string(j.State), ClaimID: j.ClaimID, Worker: j.Worker,
			ClaimHost: j.ClaimHost, LeaseExpiresAtMs: j.LeaseExpiresAtMS, Reason: j.Reason, ClaimedAtMs: j.ClaimedAtMS,
			StartedAtMs: j.StartedAtMS, FinishedAtMs: j.FinishedAtMS, Reserved: j.Reserved, ReserveShard: j.ReserveShard,
			TenantShard: j.TenantShard, ReserveCredential: j.ReserveCredential, AdmissionClaimID: j.AdmissionClaimID,
			Admission: string(j.Admission), UpdatedAtMs: j.UpdatedAtMS, OperationID: j.OperationID}), "write a claim's job", j.OperationID)
	}
	var a dbsqlc.JobClaimWriteManyParams
	for _, j := range jobs {
		a.OperationIds, a.States, a.ClaimIds = append(a.OperationIds, j.OperationID), append(a.States, string(j.State)), append(a.ClaimIds, j.ClaimID)
		a.Workers, a.ClaimHosts, a.LeaseExpiresAtMs = append(a.Workers, j.Worker), append(a.ClaimHosts, j.ClaimHost), append(a.LeaseExpiresAtMs, j.LeaseExpiresAtMS)
		a.Reasons, a.ClaimedAtMs, a.StartedAtMs = append(a.Reasons, j.Reason), append(a.ClaimedAtMs, j.ClaimedAtMS), append(a.StartedAtMs, j.StartedAtMS)
		a.FinishedAtMs, a.Reserved, a.ReserveShards = append(a.FinishedAtMs, j.FinishedAtMS), append(a.Reserved, j.Reserved), append(a.ReserveShards, j.ReserveShard)
		a.TenantShards, a.ReserveCredentials = append(a.TenantShards, j.TenantShard), append(a.ReserveCredentials, j.ReserveCredential)
		a.AdmissionClaimIds, a.Admissions = append(a.AdmissionClaimIds, j.AdmissionClaimID), append(a.Admissions, string(j.Admission))
		a.UpdatedAtMs = append(a.UpdatedAtMs, j.UpdatedAtMS)
	}
	return wrap(c.q.JobClaimWriteMany(ctx, &a), "write a claim's jobs", "")
}

// plannerSort turns the planner's sorts off or on again for the rest of
// the transaction (SET LOCAL; held with the next statement).
func (c *conn) plannerSort(ctx context.Context, on bool) error {
	_, err := c.pipe.Exec(ctx, fmt.Sprintf("SET LOCAL enable_sort = %t", on))
	return wrap(err, "set the planner's sorts", "")
}

// pickPlans is plannerSort for the claim's pick, which runs with a
// generic plan (statementPlans): the statements that turn its sorts off
// and on again switch its plans too, at no statement more. After the
// pick the plans stay generic, as the claim's reservations and writes
// want them, a single job's as a batch's.
func (c *conn) pickPlans(ctx context.Context, sort bool) error {
	_, err := c.pipe.Exec(ctx, fmt.Sprintf("SELECT set_config('enable_sort', '%t', true), %s", sort, planSetting(planGeneric)))
	c.pipe.plans = planGeneric
	return wrap(err, "set the planner's sorts", "")
}

// sortClaimed puts a claim's jobs in claim order (RETURNING has none).
func sortClaimed(jobs []store.ClaimedJob) {
	slices.SortFunc(jobs, func(a, b store.ClaimedJob) int {
		return cmp.Or(cmp.Compare(a.Priority, b.Priority), cmp.Compare(a.ClaimableAtMS, b.ClaimableAtMS), cmp.Compare(a.Position, b.Position))
	})
}

func (c *conn) JobSetRunning(ctx context.Context, p *store.JobSetRunningParams) error {
	err := c.q.JobSetRunning(ctx, &dbsqlc.JobSetRunningParams{Reserved: p.Reserved, ReserveShard: p.ReserveShard, TenantShard: p.TenantShard, ReserveCredential: p.ReserveCredential,
		Admission: string(p.Admission), LeaseExpiresAtMs: p.LeaseExpiresAtMS, Reason: p.Reason, UpdatedAtMs: p.NowMS,
		OperationID: p.OperationID, IfClaimID: p.IfClaimID})
	return wrap(err, "set running", p.OperationID)
}

func (c *conn) JobSetRefused(ctx context.Context, p *store.JobSetRefusedParams) error {
	err := c.q.JobSetRefused(ctx, &dbsqlc.JobSetRefusedParams{Admission: string(p.Admission), Reason: p.Reason,
		UpdatedAtMs: p.NowMS, OperationID: p.OperationID, IfClaimID: p.IfClaimID})
	return wrap(err, "set refused", p.OperationID)
}

func (c *conn) JobRenewLease(ctx context.Context, p *store.JobRenewLeaseParams) error {
	err := c.q.JobRenewLease(ctx, &dbsqlc.JobRenewLeaseParams{LeaseExpiresAtMs: p.LeaseExpiresAtMS, UpdatedAtMs: p.NowMS,
		OperationID: p.OperationID, IfClaimID: p.IfClaimID})
	return wrap(err, "renew lease of", p.OperationID)
}

func (c *conn) JobComplete(ctx context.Context, p *store.JobCompleteParams) error {
	err := c.q.JobComplete(ctx, &dbsqlc.JobCompleteParams{Reason: p.Reason, UpdatedAtMs: p.NowMS,
		OperationID: p.OperationID, IfState: string(p.IfState)})
	return wrap(err, "complete", p.OperationID)
}

func (c *conn) JobRequeue(ctx context.Context, p *store.JobRequeueParams) error {
	err := c.q.JobRequeue(ctx, &dbsqlc.JobRequeueParams{Worker: p.Worker, Attempts: p.Attempts,
		ClaimableAtMs: p.ClaimableAtMS, LastError: p.LastError, Reason: p.Reason, UpdatedAtMs: p.NowMS,
		OperationID: p.OperationID, IfState: string(p.IfState)})
	return wrap(err, "requeue", p.OperationID)
}

func (c *conn) JobFail(ctx context.Context, p *store.JobFailParams) error {
	err := c.q.JobFail(ctx, &dbsqlc.JobFailParams{Attempts: p.Attempts, LastError: p.LastError, Reason: p.Reason,
		UpdatedAtMs: p.NowMS, OperationID: p.OperationID, IfState: string(p.IfState)})
	return wrap(err, "fail", p.OperationID)
}

func (c *conn) JobSetUnresolved(ctx context.Context, p *store.JobSetUnresolvedParams) error {
	err := c.q.JobSetUnresolved(ctx, &dbsqlc.JobSetUnresolvedParams{Reason: p.Reason, UpdatedAtMs: p.NowMS,
		OperationID: p.OperationID})
	return wrap(err, "set unresolved", p.OperationID)
}

func (c *conn) JobCancel(ctx context.Context, p *store.JobCancelParams) error {
	err := c.q.JobCancel(ctx, &dbsqlc.JobCancelParams{ToState: string(p.To), Reason: p.Reason, UpdatedAtMs: p.NowMS,
		OperationID: p.OperationID, IfState: string(p.IfState)})
	return wrap(err, "cancel", p.OperationID)
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
	if p.Lock {
		rows, err := c.q.JobListExpiredForUpdate(ctx, p.NowMS)
		return jobsFrom(rows, err, "list expired leases")
	}
	rows, err := c.q.JobListExpired(ctx, p.NowMS)
	return jobsFrom(rows, err, "list expired leases")
}

func (c *conn) JobListClaimedBy(ctx context.Context, hostIDs []string) ([]store.Job, error) {
	if len(hostIDs) == 0 {
		return []store.Job{}, nil
	}
	rows, err := c.q.JobListClaimedBy(ctx, hostIDs)
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
	rows, err := c.q.JobCountByState(ctx, store.CountedStates)
	out := make(map[wire.JobState]int64, len(rows))
	var enqueued int64
	for _, r := range rows {
		if r.State == "" { // the jobs enqueued
			enqueued = r.Jobs
			continue
		}
		out[wire.JobState(r.State)] = r.Jobs
	}
	return store.WithCompleted(out, enqueued), wrap(err, "count jobs", "")
}

func (c *conn) JobCountsSaved(ctx context.Context) (store.SavedCounts, error) {
	r, err := c.q.JobCountsSaved(ctx)
	return dbutil.SavedCounts(r.TakenMs, r.Counts, err)
}

func (c *conn) JobCountsSave(ctx context.Context, sc store.SavedCounts) error {
	return wrap(c.q.JobCountsSave(ctx, sc.TakenMS, dbutil.JSON(sc.Counts)), "save the job counts", "")
}

// JobPage: the planner picks the index the filters allow, from
// jobs_by_state when the page has a state, else from job_keys.
func (c *conn) JobPage(ctx context.Context, p *store.JobPageParams) ([]store.Job, error) {
	f := p.Filter
	if f.State != "" {
		rows, err := c.q.JobPageByState(ctx, &dbsqlc.JobPageByStateParams{After: p.After, State: string(f.State), Section: f.Section,
			Owner: f.Owner, Priority: f.Priority, Tenant: f.Tenant, Prefix: f.OperationPrefix, Max: int32(p.Limit)})
		return jobsFrom(rows, err, "list a page of jobs")
	}
	rows, err := c.q.JobPage(ctx, &dbsqlc.JobPageParams{After: p.After, Section: f.Section,
		Owner: f.Owner, Priority: f.Priority, Tenant: f.Tenant, Prefix: f.OperationPrefix, Max: int32(p.Limit)})
	return jobsFrom(rows, err, "list a page of jobs")
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

func (c *conn) DocumentGet(ctx context.Context, id string, lock store.Lock) (wire.Document, error) {
	if lock {
		d, err := c.q.DocumentGetForUpdate(ctx, id)
		return wire.Document{ID: d.ID, Version: d.Version, Generation: d.Generation, Owner: d.Owner, Body: []byte(d.Body)},
			dbutil.One(err, "read document", id)
	}
	d, err := c.q.DocumentGet(ctx, id)
	return wire.Document{ID: d.ID, Version: d.Version, Generation: d.Generation, Owner: d.Owner, Body: []byte(d.Body)},
		dbutil.One(err, "read document", id)
}

func (c *conn) DocumentAssign(ctx context.Context, p *store.DocumentAssignParams) (store.Assigned, error) {
	ifGeneration := int64(-1)
	if p.IfGeneration != nil {
		ifGeneration = *p.IfGeneration
	}
	gens, err := c.q.DocumentAssign(ctx, &dbsqlc.DocumentAssignParams{Owner: p.Owner, AtMs: p.AtMS, ID: p.ID,
		IfGeneration: ifGeneration, Reason: p.Reason})
	if err != nil || len(gens) == 0 {
		return store.Assigned{}, wrap(err, "assign document", p.ID)
	}
	return store.Assigned{Generation: gens[0], OK: true}, nil
}

func (c *conn) DocumentWrite(ctx context.Context, p *store.DocumentWriteParams) error {
	return wrap(c.q.DocumentWrite(ctx, &dbsqlc.DocumentWriteParams{Body: string(p.Body), Version: p.Version,
		UpdatedAtMs: p.AtMS, ID: p.ID}), "write document", p.ID)
}

func (c *conn) DocumentWriteMany(ctx context.Context, ps []store.DocumentWriteParams) error {
	if len(ps) == 0 {
		return nil
	}
	var q dbsqlc.DocumentWriteManyParams
	for _, p := range ps {
		q.Ids, q.Bodies = append(q.Ids, p.ID), append(q.Bodies, string(p.Body))
		q.Versions, q.UpdatedAtMs = append(q.Versions, p.Version), append(q.UpdatedAtMs, p.AtMS)
	}
	return wrap(c.q.DocumentWriteMany(ctx, &q), "write documents", fmt.Sprintf("%d documents", len(ps)))
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
	p := &dbsqlc.MutationInsertManyParams{}
	for _, m := range ms {
		p.DocumentIds = append(p.DocumentIds, m.DocumentID)
		p.Versions = append(p.Versions, m.Version)
		p.OperationKeys = append(p.OperationKeys, m.OperationKey)
		p.Callers = append(p.Callers, m.Caller)
		p.AtMs = append(p.AtMs, m.AtMS)
	}
	return wrap(c.q.MutationInsertMany(ctx, p), "record mutations", "")
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
	p := &dbsqlc.OperationInsertManyParams{}
	for _, o := range os {
		p.DocumentIds = append(p.DocumentIds, o.DocumentID)
		p.OperationKeys = append(p.OperationKeys, o.OperationKey)
		p.Bindings = append(p.Bindings, string(o.Binding))
		p.Callers = append(p.Callers, o.Caller)
		p.Statuses = append(p.Statuses, string(o.Status))
		p.Outcomes = append(p.Outcomes, string(o.Outcome))
		p.Deliveries = append(p.Deliveries, o.Deliveries)
		p.CreatedAtMs = append(p.CreatedAtMs, o.CreatedMS)
	}
	return wrap(c.q.OperationInsertMany(ctx, p), "record operations", "")
}

func (c *conn) OperationList(ctx context.Context, documentID string) ([]wire.Operation, error) {
	rows, err := c.q.OperationList(ctx, documentID)
	out := make([]wire.Operation, 0, len(rows))
	for _, o := range rows {
		out = append(out, operationFrom(o))
	}
	return out, wrap(err, "list operations of", documentID)
}

func isNoRows(err error) bool { return errors.Is(err, pgx.ErrNoRows) }
