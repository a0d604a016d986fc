package store

import (
	"context"
	"encoding/json"
	"errors"

	"github.com/fleet/fleet/internal/wire"
)

// ErrNotFound is what an operation returns when the row it reads does not
// exist; callers turn it into a not_found error that names what was missing.
var ErrNotFound = errors.New("not found")

// Lock says whether a read inside a write transaction locks the rows it
// returns until the transaction ends (FOR UPDATE on PostgreSQL, where other
// hosts write concurrently; nothing on SQLite, whose one writer excludes
// every other).
type Lock bool

const (
	NoLock    Lock = false
	ForUpdate Lock = true
)

// Executor is every named operation Fleet runs against its database. Each
// backend (internal/store/sqlite, internal/store/postgres) implements all of
// them from its own SQL (sqlc-generated, beside it), shaping each operation
// its own best way; storetest.Exercise runs one subtest per operation on
// every backend. An operation that takes more than two values takes a
// params struct; a job's state changes are named transitions, each guarded
// by the state (and, where a claim matters, the claim) its caller read.
type Executor interface {
	Dependencies // dependencies.go
	Schedules    // schedules.go

	// LockLog takes the log lock (event log, receipt chain and job positions,
	// which must stay contiguous) until the transaction ends: the log's
	// sequencer takes it, and so does an enqueue numbering positions. A
	// backend with one writer already holds it.
	LockLog(ctx context.Context) error
	// TryLockLog takes the log lock if no other transaction holds it, and
	// reports whether it did (true with one writer).
	TryLockLog(ctx context.Context) (bool, error)
	// TryLockCounts takes the lock of the shared job counts
	// (JobCountsSave) if no other transaction holds it, and reports
	// whether it did (true with one writer).
	TryLockCounts(ctx context.Context) (bool, error)

	// LockClaims takes the claims lock until the transaction ends: shared
	// by a claim, exclusive by a pause or resumption of claims, so that a
	// pause waits for the claims in flight and no claim after it misses
	// it. A backend with one writer already holds it.
	LockClaims(ctx context.Context, exclusive bool) error
	// LockTenants takes the tenants lock until the transaction ends, so
	// that adding a tenant counts the tenants, changing a tenant's
	// allowance compares it, and changing its weight reads the one it
	// replaces, after every add and change before it committed: hosts
	// adding at once never pass the fleet's most tenants, two changes
	// expecting one allowance are not both made, and each weight change
	// is logged from the weight the one before set. A backend with one
	// writer already holds it.
	LockTenants(ctx context.Context) error

	// SettingGet reads one setting (ErrNotFound when it is not set).
	SettingGet(ctx context.Context, name string) (string, error)
	SettingList(ctx context.Context) (map[string]string, error)
	SettingPut(ctx context.Context, name, value string) error

	HostGet(ctx context.Context, id string) (Host, error)
	HostList(ctx context.Context) ([]Host, error)
	HostPut(ctx context.Context, h Host) error // insert or replace
	// HostSeen renews a host's liveness if its instance still holds its
	// id, and says whether its record still says serving (false once a
	// peer retired it); Found is false when another process has taken the
	// id over.
	HostSeen(ctx context.Context, p *HostSeenParams) (HostSeenResult, error)
	// HostRetire marks a serving host not serving if its record is still
	// exactly h's (instance and last seen): true for the one caller that
	// retires it, false when it renewed, was retired already, or (on a
	// backend with row locks) another transaction holds its record.
	HostRetire(ctx context.Context, h Host) (bool, error)

	KernelInsert(ctx context.Context, k Kernel) error
	KernelGet(ctx context.Context) (Kernel, error)

	CredentialInsert(ctx context.Context, c Credential) error
	// CredentialGet reads a credential; with ForUpdate it locks it until
	// the transaction ends, for a change that reads it first.
	CredentialGet(ctx context.Context, name string, lock Lock) (Credential, error)
	CredentialList(ctx context.Context) ([]Credential, error)
	// CredentialUpdate sets a credential's digest and revocation time by
	// name (ErrNotFound when there is none).
	CredentialUpdate(ctx context.Context, c Credential) error
	// CredentialReserve reserves the fleet's cost per report at a
	// credential with an allowance of its own, if it covers it (the guard
	// is part of the write); otherwise OK is false and nothing changed.
	// The credential comes back as it stands after it.
	CredentialReserve(ctx context.Context, name string) (CredentialReservation, error)
	// CredentialMove is AccountingMove at a credential: false, and nothing
	// changed, when fewer are reserved.
	CredentialMove(ctx context.Context, p *CredentialMoveParams) (bool, error)

	AccountingInsert(ctx context.Context, p *AccountingInsertParams) error
	// AccountingGet reads the allowance's figures. With ForUpdate nothing
	// else can change them until the transaction ends (on PostgreSQL every
	// shard is locked, so a transaction that already holds one of them must
	// not ask: read NoLock for figures that only inform a receipt or event).
	AccountingGet(ctx context.Context, lock Lock) (wire.Accounting, error)
	// AccountingReserve reserves cost_per_report and counts the call if
	// available covers it (the guard is part of the write); otherwise OK
	// is false and nothing changed. The figures returned are the
	// allowance's as they stand after it (on PostgreSQL other hosts'
	// concurrent decisions included); Shard names where the reservation is
	// held, for AccountingMove.
	AccountingReserve(ctx context.Context) (Reservation, error)
	// AccountingReserveAhead takes up to n reservations in one statement
	// for the ones this transaction is about to make (a batch's), where
	// each would otherwise be a statement, a round trip and a shard
	// locked in an order no other transaction shares. AccountingReserve
	// then hands them out one at a time, each with the figures it would
	// have had alone; those not handed out go back when the transaction
	// next touches the allowance otherwise, or commits. It may take
	// fewer, or none (every shard with room held elsewhere; one writer,
	// where a reservation is cheap), and AccountingReserve reserves as
	// usual once they are gone.
	AccountingReserveAhead(ctx context.Context, n int) error
	// TenantReserveAhead is AccountingReserveAhead at a tenant: up to n
	// reservations in one statement, handed out by TenantReserve with the
	// figures each would have had alone, those not handed out given back
	// when the transaction next touches a tenant otherwise, or commits. A
	// no-op where nothing is sharded (SQLite's one writer).
	TenantReserveAhead(ctx context.Context, tenant string, n int) error
	// LevelsReserveAhead is TenantReserveAhead(tenant, atTenant) then
	// AccountingReserveAhead(atFleet) in one statement: one round trip on
	// PostgreSQL where the two take two. A no-op where nothing is sharded
	// (SQLite's one writer), as they are.
	LevelsReserveAhead(ctx context.Context, tenant string, atTenant, atFleet int) error
	// AccountingMove takes FromReserved out of reserved and adds ToSpent
	// to spent, from the shard the reservation is held on when Shard is
	// one (-1 for any); OK is false, and nothing changed, when fewer are
	// reserved.
	AccountingMove(ctx context.Context, p *AccountingMoveParams) (Settlement, error)
	AccountingSetAllowance(ctx context.Context, allowance int64) (wire.Accounting, error)
	// AccountingHold locks the allowance shards holding these jobs'
	// reservations, in ascending order, until the transaction ends, so
	// that a transaction about to settle several (a batch) takes them in
	// the one order every such transaction does, and none waits on another
	// that waits on it. Settlements on those shards (AccountingMove) are
	// then decided on the held figures, with the same guard, and written
	// in one statement when the transaction next touches the allowance
	// otherwise, or commits; AccountingGet without a lock reads the
	// figures they left. The tenants' shards holding the jobs' parts are
	// locked first, the same way (TenantMove on them waits for no one). A
	// no-op where nothing is sharded (SQLite's one writer).
	AccountingHold(ctx context.Context, operationIDs []string) error

	// TenantInsert adds a tenant holding nothing; TenantGet and TenantList
	// read tenants with their figures (TenantList by name).
	TenantInsert(ctx context.Context, t Tenant) error
	TenantGet(ctx context.Context, name string) (Tenant, error)
	TenantList(ctx context.Context) ([]Tenant, error)
	// TenantSetAllowance sets a tenant's own allowance (nil: none), unless
	// it would be below what the tenant holds (spent + reserved): then OK
	// is false and nothing changed.
	TenantSetAllowance(ctx context.Context, name string, allowance *int64) (TenantChange, error)
	// TenantSetWeight sets a tenant's weight in claims and answers the
	// tenant as it then stands; no such tenant is a not-found error.
	TenantSetWeight(ctx context.Context, name string, weight int64) (Tenant, error)
	// TenantReserve reserves the fleet's cost per report at the tenant if
	// its own allowance covers it (always, with none; the guard is part of
	// the write); otherwise OK is false and nothing changed. Shard names
	// where it is held, for TenantMove.
	TenantReserve(ctx context.Context, name string) (TenantReservation, error)
	// TenantMove is AccountingMove at a tenant: FromReserved out of its
	// reserved, ToSpent added to its spent; false, and nothing changed,
	// when fewer are reserved. Given the Shard a job's part was reserved
	// on, fewer reserved there may instead be a guard that no longer holds
	// (ErrGuard, which may surface at the next statement or the commit):
	// either way the caller's transaction does not survive it.
	TenantMove(ctx context.Context, p *TenantMoveParams) (bool, error)
	// TenantRollover starts the tenant's period anew at PeriodStartMS if
	// it still starts at IfPeriodStartMS: spent back to 0, reservations
	// kept. OK is true for the one transaction that does it; EndedSpent is
	// what the period it ended spent.
	TenantRollover(ctx context.Context, p *TenantRolloverParams) (TenantRolled, error)

	BatchInsert(ctx context.Context, b Batch) error
	BatchGet(ctx context.Context, key string) (Batch, error)

	// JobMaxPosition is the queue's tail (0 when empty).
	JobMaxPosition(ctx context.Context) (int64, error)
	// JobInsert queues a new job (its document must exist).
	JobInsert(ctx context.Context, p *JobInsertParams) error
	// JobInsertMany queues new jobs in one statement, all or none.
	JobInsertMany(ctx context.Context, jobs []JobInsertParams) error
	JobGet(ctx context.Context, operationID string, lock Lock) (Job, error)
	// JobGetMany reads the jobs of these operation ids that exist, in one
	// statement, each as JobGet reads it, in operation id order and (on
	// PostgreSQL) locked in that order until the transaction ends: a
	// batch reads its items' jobs ahead of them (Tx.ReadAhead).
	JobGetMany(ctx context.Context, operationIDs []string) ([]Job, error)
	// JobClaimMany moves up to Max queued jobs claimable at NowMS, those
	// that became claimable first (then the oldest), to claimed under
	// Worker: each claim id is ClaimPrefix and the job's position (unique,
	// since the prefix is new for each claim), each document goes to Worker at
	// its next generation and the assignment is recorded. A job another
	// transaction holds is passed over. The jobs come back in claim order,
	// as they now stand, with the document their batch computes from. The
	// statements it takes do not grow with Max. With UnlessPaused it takes
	// nothing while claims are paused.
	JobClaimMany(ctx context.Context, p *JobClaimManyParams) ([]ClaimedJob, error)
	// JobPickMany is JobClaimMany without writing the jobs: the jobs it
	// picks (passing over those in exclude, which this transaction picked
	// before) are locked, their documents assigned and the assignments
	// recorded, and they come back as JobClaimMany would have left them
	// (Claimed); the rows stay queued until JobClaimWriteMany writes them,
	// each once, with whatever the transaction decided for them since (a
	// claim that admits: held.go). With Owners, the picked jobs go to
	// several claims' workers, one each.
	JobPickMany(ctx context.Context, p *JobClaimManyParams, exclude []string) ([]ClaimedJob, error)
	// JobClaimWriteMany writes jobs JobPickMany picked, each still queued,
	// as they now stand: the claim's columns and the admission's (state,
	// claim, lease, reservation, admission, reason and times). The
	// transaction fails (ErrGuard) unless every one was still queued.
	JobClaimWriteMany(ctx context.Context, jobs []Job) error
	// JobTenantsQueued names the tenants with queued jobs (claimable or
	// backing off), in name order, at a seek a tenant.
	JobTenantsQueued(ctx context.Context) ([]string, error)
	// JobInFlightByTenant counts claimed and running jobs by tenant.
	JobInFlightByTenant(ctx context.Context) (map[string]int64, error)
	// JobTenantOfDocument is the tenant of the document's job
	// (ErrNotFound: no job has it).
	JobTenantOfDocument(ctx context.Context, documentID string) (string, error)
	// The named transitions below each change one job if it is still in
	// IfState (and, where named, under IfClaimID): what the caller read,
	// locked, in this transaction. A guard that no longer holds is a bug
	// the transaction does not survive: ErrGuard (on PostgreSQL the error
	// may surface at the next statement or the commit).
	//
	// JobSetRunning admits a claimed job: running, holding its
	// reservation, with the admission retained for repeats.
	JobSetRunning(ctx context.Context, p *JobSetRunningParams) error
	// JobSetRefused records a claimed job's denied admission: refused,
	// holding nothing.
	JobSetRefused(ctx context.Context, p *JobSetRefusedParams) error
	// JobSetRunningMany and JobSetRefusedMany are those transitions for
	// several jobs, each guarded as alone, in one statement where the
	// backend has one (a batch's admissions, held to its end: held.go).
	JobSetRunningMany(ctx context.Context, ps []JobSetRunningParams) error
	JobSetRefusedMany(ctx context.Context, ps []JobSetRefusedParams) error
	// JobRenewLease extends the lease of a claimed or running job.
	JobRenewLease(ctx context.Context, p *JobRenewLeaseParams) error
	// JobComplete completes a job whose reservation has settled.
	JobComplete(ctx context.Context, p *JobCompleteParams) error
	// JobCompleteMany is JobComplete for several jobs, each guarded as
	// alone, in one statement where the backend has one (a batch's
	// publications, held to its end: held.go).
	JobCompleteMany(ctx context.Context, ps []JobCompleteParams) error
	// JobRequeue puts a job back in the queue, claimable at ClaimableAtMS:
	// its claim, reservation and admission dropped, its attempts and last
	// error as given.
	JobRequeue(ctx context.Context, p *JobRequeueParams) error
	// JobFail ends a job failed: its claim and reservation dropped.
	JobFail(ctx context.Context, p *JobFailParams) error
	// JobSetUnresolved marks a running job whose lease lapsed unresolved;
	// it keeps its claim and reservation.
	JobSetUnresolved(ctx context.Context, p *JobSetUnresolvedParams) error
	// JobCancel cancels a job (To: cancelled or cancelled_before_dispatch).
	// It keeps its claim id, so the holder learns of it, but not its
	// lease or reservation.
	JobCancel(ctx context.Context, p *JobCancelParams) error
	JobList(ctx context.Context) ([]Job, error)
	JobListByBatch(ctx context.Context, batchKey string) ([]string, error)
	// JobListExpired lists claimed and running jobs whose lease ended
	// before NowMS; with ForUpdate, locked, passing over any another
	// transaction holds.
	JobListExpired(ctx context.Context, p *JobListExpiredParams) ([]Job, error)
	// JobListClaimedBy lists, locked, the claimed jobs whose claims these
	// hosts issued; a job another transaction holds is passed over, not
	// waited for (its lease still ends it).
	JobListClaimedBy(ctx context.Context, hostIDs []string) ([]Job, error)
	// JobListClaimedUnder lists, locked, the jobs Worker holds under
	// claim ids that begin with Prefix (a keyed claim's), with the
	// document their batch computes from, in queue order: claimed, or
	// running, refused or unresolved with their admission made under that
	// claim (a claim that admitted them).
	JobListClaimedUnder(ctx context.Context, p *JobListClaimedUnderParams) ([]ClaimedJob, error)
	// JobPending reports whether any job may still be claimed: queued (a
	// retry backing off, when none is claimable), claimed or running.
	JobPending(ctx context.Context) (bool, error)
	// JobCountByState counts the jobs in each state (states with none
	// left out). It reads the jobs in CountedStates, and takes the
	// completed ones as the rest of those enqueued, so what it costs grows
	// with the jobs not completed, not with the fleet's history.
	JobCountByState(ctx context.Context) (map[wire.JobState]int64, error)
	// JobCountsSaved is the count of jobs by state that a host last saved
	// for every host (ErrNotFound when none has been).
	JobCountsSaved(ctx context.Context) (SavedCounts, error)
	// JobCountsSave replaces the saved count.
	JobCountsSave(ctx context.Context, c SavedCounts) error
	// JobCountByTenant counts jobs by tenant, then state.
	JobCountByTenant(ctx context.Context) (map[string]map[wire.JobState]int64, error)
	// WorkerActivity is, for each worker that has held a job (its last
	// holder), the jobs it holds now, those of its jobs that completed or
	// failed at or after SinceMS, and when it last moved one, by name. It
	// reads every job.
	WorkerActivity(ctx context.Context, sinceMS int64) ([]WorkerActivity, error)
	// JobPage is up to Limit jobs after position After in queue order,
	// those the filter selects (keyset paging: a page costs the same
	// however long the queue, and rows inserted meanwhile never shift a
	// page).
	JobPage(ctx context.Context, p *JobPageParams) ([]Job, error)

	// AttemptInsert records a failed attempt; AttemptList is a job's, in
	// order.
	AttemptInsert(ctx context.Context, a Attempt) error
	AttemptList(ctx context.Context, operationID string) ([]Attempt, error)

	DocumentInsert(ctx context.Context, id string, atMS int64) error
	// DocumentInsertMany adds unassigned documents in one statement, all
	// or none.
	DocumentInsertMany(ctx context.Context, ids []string, atMS int64) error
	DocumentGet(ctx context.Context, id string, lock Lock) (wire.Document, error)
	// DocumentAssign gives the document to Owner at the next generation,
	// if its generation is *IfGeneration (any when nil), and records the
	// assignment; OK is false, and nothing changed, when it is not.
	DocumentAssign(ctx context.Context, p *DocumentAssignParams) (Assigned, error)
	DocumentWrite(ctx context.Context, p *DocumentWriteParams) error
	// DocumentWriteMany is DocumentWrite for several documents, in one
	// statement where the backend has one (a batch's publications, held
	// to its end: held.go).
	DocumentWriteMany(ctx context.Context, ps []DocumentWriteParams) error
	AssignmentList(ctx context.Context, documentID string) ([]Assignment, error) // oldest first

	// MutationInsert writes mutations in one statement (a batch's, held
	// to its end: Tx.MutationInsert).
	MutationInsert(ctx context.Context, ms ...Mutation) error
	MutationList(ctx context.Context, documentID string) ([]Mutation, error) // by version
	MutationCount(ctx context.Context, documentID string) (int64, error)
	MutationTotal(ctx context.Context) (int64, error)
	MutationCountByDocument(ctx context.Context) (map[string]int64, error)
	// MutationRepeatedOperations counts operation keys that mutated a
	// document more than once (always 0 in a sound state).
	MutationRepeatedOperations(ctx context.Context) (int64, error)

	OperationGet(ctx context.Context, documentID, key string) (StoredOperation, error)
	// OperationGetMany reads the retained operations of these (document,
	// key) pairs that exist, in one statement; it may return others of
	// the same documents and keys, which the caller ignores.
	OperationGetMany(ctx context.Context, refs []OperationRef) ([]StoredOperation, error)
	OperationCountDelivery(ctx context.Context, documentID, key string) error
	// OperationInsert writes operation records in one statement (a
	// batch's, held to its end: Tx.OperationInsert).
	OperationInsert(ctx context.Context, os ...StoredOperation) error
	OperationList(ctx context.Context, documentID string) ([]wire.Operation, error)

	// ReceiptHead is the chain's newest link (0 and "" when empty).
	ReceiptHead(ctx context.Context) (ChainHead, error)
	// ReceiptInsert writes receipts, in one statement.
	ReceiptInsert(ctx context.Context, receipts []StoredReceipt) error
	ReceiptGet(ctx context.Context, id string) ([]byte, error)
	// ReceiptGetMany reads the stored receipts with these ids, in chain
	// order; ids not (yet) in the chain are left out.
	ReceiptGetMany(ctx context.Context, ids []string) ([][]byte, error)
	// ReceiptList is the stored receipts in chain order, all of them or one
	// operation's.
	ReceiptList(ctx context.Context, operationID string) ([][]byte, error)
	ReceiptNewestByOperation(ctx context.Context) (map[string]string, error)
	// ReceiptNewestFor is the newest receipt id of each of these
	// operations that has one (a page's worth, through the operation
	// index).
	ReceiptNewestFor(ctx context.Context, operationIDs []string) (map[string]string, error)

	// EventInsert writes events with the sequence numbers they carry, in
	// one statement.
	EventInsert(ctx context.Context, events []wire.Event) error
	// EventLast is the newest event's sequence (0 when there is none).
	EventLast(ctx context.Context) (int64, error)
	EventList(ctx context.Context, after int64, limit int) ([]wire.Event, error)
	// EventListNewest is the newest f.Limit events in (f.After, f.Before)
	// of f's kind and job (each when set), in sequence order, read
	// backwards through an index.
	EventListNewest(ctx context.Context, f EventFilter) ([]wire.Event, error)
	EventHead(ctx context.Context) (count, last int64, err error)

	// PendingLogInsert writes events and prepared receipts (no sequence,
	// link or signature yet) for the log's sequencer to place, and returns
	// their pending ids, in order. Entries are taken oldest first.
	PendingLogInsert(ctx context.Context, events []wire.Event, receipts []wire.Receipt) (PendingIDs, error)
	// PendingLogLeft returns which of the given pending ids are still
	// pending (not yet placed by any sequencer that committed) and, read
	// with them, the stored bodies of those of receipts (by receipt id)
	// already placed: a sequencer answers another host's round in one read.
	PendingLogLeft(ctx context.Context, ids PendingIDs, receipts []string) (PendingLeft, error)
	// PendingLogList reads up to limit pending events and limit pending
	// receipts, each oldest first, and the heads of the placed log.
	PendingLogList(ctx context.Context, limit int) (PendingLog, error)
	// PendingLogPlace writes placed events and sealed receipts and removes
	// the pending entries they were: of each kind, the oldest pending, as
	// PendingLogList gave them (PostgreSQL counts a transaction's entries
	// placed up to the last one placed). Where hosts wait for each other's
	// sequencers (PostgreSQL) it also tells them, when the transaction
	// commits (see Driver.Placed).
	PendingLogPlace(ctx context.Context, p *PendingLogPlaceParams) error
	// PendingLogExpect fails the transaction (ErrGuard; on PostgreSQL at
	// the latest at its commit) unless it takes the log lock at once, the
	// placed log still ends at lastEvent and head, and every entry of
	// placed is still pending (on PostgreSQL, each of its transactions'
	// entries all), and nothing else is pending before the last of them:
	// a round that knows what is pending places it without listing it
	// first, and never before what became visible ahead of it.
	PendingLogExpect(ctx context.Context, lastEvent int64, head ChainHead, placed PendingIDs) error
}

// ErrGuard is what a guarded transition returns when the row is no longer
// as its caller read it, locked, in the same transaction: a bug, never a
// race, so the transaction is abandoned.
var ErrGuard = errors.New("the row is no longer as this transaction read it")

// HostSeenParams renews host ID's liveness at AtMS while Instance holds it.
type HostSeenParams struct {
	ID       string
	Instance string
	AtMS     int64
}

// HostSeenResult is what HostSeen found.
type HostSeenResult struct {
	Found   bool // the instance still holds the id
	Serving bool // its record still says serving
}

// Kernel is the host's signing identity.
type Kernel struct {
	PublicKey   string // hex Ed25519 public key
	Seed        []byte // Ed25519 private seed
	CreatedAtMS int64
}

// JobInsertParams is a new queued job.
type JobInsertParams struct {
	OperationID   string
	Position      int64
	BatchKey      string
	Section       string
	DocumentID    string
	InputSHA256   string
	CreatedAtMS   int64
	MaxAttempts   int64
	BackoffBaseMS int64
	BackoffCapMS  int64
	// ExpectedSHA256 is the SHA-256 of the canonical body a deterministic
	// worker publishes for the job, computed at enqueue so a publication
	// is checked without recomputing it ("" when not known).
	ExpectedSHA256 string
	// Priority is 1 (claimed first) to 4; 0 is wire.DefaultPriority.
	Priority int64
	// Tenant is the tenant the job is in; "" is wire.DefaultTenant.
	Tenant string
	// WaitingOn is how many jobs it waits for (blocked until they have
	// completed; 0: queued); Dependents how many wait for it.
	WaitingOn, Dependents int64
}

// TenantOrDefault is the tenant the job is in.
func (p *JobInsertParams) TenantOrDefault() string {
	if p.Tenant == "" {
		return wire.DefaultTenant
	}
	return p.Tenant
}

// PriorityOrDefault is the priority the job is queued at.
func (p *JobInsertParams) PriorityOrDefault() int64 {
	if p.Priority == 0 {
		return wire.DefaultPriority
	}
	return p.Priority
}

// ClaimsSetting is the setting that holds the claims' state: a JSON
// object (wire.ClaimsState) whose paused member is true while claims are
// paused. host/pause writes it; a claim UnlessPaused reads it.
const ClaimsSetting = "claims"

// ClaimedJob is a job as its claim left it, with the document its batch
// computes from.
type ClaimedJob struct {
	Job
	BatchDocument string
}

// JobSetRunningParams admits the job claimed under IfClaimID.
type JobSetRunningParams struct {
	OperationID  string
	IfClaimID    string
	Reserved     int64
	ReserveShard int64
	TenantShard  int64 // where the tenant's part is held (-1: any)
	// ReserveCredential names the credential whose own allowance holds a
	// part ("" for none).
	ReserveCredential string
	Admission         []byte // the retained answer, for repeats
	LeaseExpiresAtMS  int64
	Reason            string
	NowMS             int64
}

// JobSetRefusedParams refuses the job claimed under IfClaimID.
type JobSetRefusedParams struct {
	OperationID string
	IfClaimID   string
	Admission   []byte
	Reason      string
	NowMS       int64
}

// JobRenewLeaseParams renews the lease of the job claimed under IfClaimID.
type JobRenewLeaseParams struct {
	OperationID      string
	IfClaimID        string
	LeaseExpiresAtMS int64
	NowMS            int64
}

// JobCompleteParams completes a job in IfState.
type JobCompleteParams struct {
	OperationID string
	IfState     wire.JobState
	Reason      string
	NowMS       int64
}

// JobRequeueParams queues a job in IfState again.
type JobRequeueParams struct {
	OperationID   string
	IfState       wire.JobState
	Worker        string // who last held it ("" once the operator starts it over)
	Attempts      int64
	ClaimableAtMS int64
	LastError     string
	Reason        string
	NowMS         int64
}

// JobFailParams fails a job in IfState.
type JobFailParams struct {
	OperationID string
	IfState     wire.JobState
	Attempts    int64
	LastError   string
	Reason      string
	NowMS       int64
}

// JobSetUnresolvedParams marks a running job unresolved.
type JobSetUnresolvedParams struct {
	OperationID string
	Reason      string
	NowMS       int64
}

// JobCancelParams cancels a job in IfState.
type JobCancelParams struct {
	OperationID string
	IfState     wire.JobState
	To          wire.JobState // cancelled or cancelled_before_dispatch
	Reason      string
	NowMS       int64
}

// JobListExpiredParams selects leases that ended before NowMS.
type JobListExpiredParams struct {
	NowMS int64
	Lock  Lock
}

// JobListClaimedUnderParams selects a keyed claim's jobs.
type JobListClaimedUnderParams struct {
	Worker string
	Prefix string
}

// JobPageParams is a page of jobs.
type JobPageParams struct {
	Filter JobFilter
	After  int64 // position
	Limit  int
}

// DocumentAssignParams assigns a document.
type DocumentAssignParams struct {
	ID           string
	IfGeneration *int64 // nil: whatever the generation
	Owner        string // "" revokes
	Reason       string
	AtMS         int64
}

// Assigned is DocumentAssign's outcome.
type Assigned struct {
	Generation int64
	OK         bool
}

// DocumentWriteParams writes a document's body at a version.
type DocumentWriteParams struct {
	ID      string
	Body    []byte // canonical JSON
	Version int64
	AtMS    int64
}

// Job is a job as stored, joined with its document's assignment and
// version and its retained publication outcome. wire.Job is what the API
// shows of it.
type Job struct {
	OperationID      string
	Position         int64
	BatchKey         string
	Section          string
	DocumentID       string
	InputSHA256      string
	State            wire.JobState
	Generation       int64  // the document's assignment generation
	Owner            string // the document's current assignee
	DocumentVersion  int64
	Worker           string // who holds (or last held) the claim
	ClaimID          string
	ClaimHost        string // the host that issued the claim
	LeaseExpiresAtMS int64
	Reserved         int64
	// ReserveShard is the allowance shard holding Reserved, where the
	// backend splits the allowance (PostgreSQL); -1 when none is known.
	ReserveShard     int64
	AdmissionClaimID string // the claim whose dispatch was decided
	Admission        []byte // that decision's answer, for repeats
	Outcome          []byte // the retained publication outcome
	Reason           string
	CreatedAtMS      int64
	UpdatedAtMS      int64
	Attempts         int64
	MaxAttempts      int64
	BackoffBaseMS    int64
	BackoffCapMS     int64
	ClaimableAtMS    int64
	LastError        string
	ExpectedSHA256   string
	// When the job was last claimed, started (its dispatch allowed) and
	// finished; 0 when it has not been since it was last queued.
	ClaimedAtMS, StartedAtMS, FinishedAtMS int64
	Priority                               int64 // 1 (claimed first) to 4
	Tenant                                 string
	// TenantShard is the tenant's shard holding its part of Reserved,
	// where the backend splits a tenant's figures; -1 when none is known.
	TenantShard int64
	// ReserveCredential is the credential whose own allowance holds a
	// part of Reserved ("" for none).
	ReserveCredential string
	// WaitingOn is how many of the jobs it waits for have not completed;
	// Dependents how many jobs wait for it; AfterJSON its dependencies'
	// outputs, as its input names them once it is queued ("" for none).
	WaitingOn, Dependents int64
	AfterJSON             string
}

// CurrentClaim is the job's live claim, or nil.
func (j Job) CurrentClaim() *wire.Claim {
	if j.ClaimID == "" || !j.State.Active() {
		return nil
	}
	return &wire.Claim{ClaimID: j.ClaimID, Generation: j.Generation, LeaseExpiresAtMS: j.LeaseExpiresAtMS}
}

// Wire is what the API shows of the job.
func (j Job) Wire() wire.Job {
	w := wire.Job{OperationID: j.OperationID, Position: j.Position, Batch: j.BatchKey, Section: j.Section,
		DocumentID: j.DocumentID, InputSHA256: j.InputSHA256, State: j.State, Generation: j.Generation,
		Owner: j.Owner, DocumentVersion: j.DocumentVersion, Worker: j.Worker, ClaimHost: j.ClaimHost,
		LeaseExpiresAtMS: j.LeaseExpiresAtMS, Reserved: j.Reserved, Reason: j.Reason,
		CreatedAtMS: j.CreatedAtMS, UpdatedAtMS: j.UpdatedAtMS, Attempts: j.Attempts, MaxAttempts: j.MaxAttempts,
		BackoffBaseMS: j.BackoffBaseMS, BackoffCapMS: j.BackoffCapMS, ClaimableAtMS: j.ClaimableAtMS, LastError: j.LastError,
		ClaimedAtMS: j.ClaimedAtMS, StartedAtMS: j.StartedAtMS, FinishedAtMS: j.FinishedAtMS, Priority: j.Priority,
		Tenant: j.Tenant, WaitingOn: j.WaitingOn}
	if len(j.Outcome) > 0 {
		w.Outcome = json.RawMessage(j.Outcome)
	}
	return w
}

// WorkerActivity is one worker's jobs, as WorkerActivity counts them.
type WorkerActivity struct {
	Worker                  string
	Held, Completed, Failed int64
	LastSeenMS              int64
}

// JobFilter selects jobs for JobPage; an empty field selects all.
type JobFilter struct {
	State   wire.JobState
	Section string
	Owner   string // the document's current assignee
	// OperationPrefix selects operation ids that start with it.
	OperationPrefix string
	Priority        int64  // 0 for any
	Tenant          string // "" for any
}

// Host is a host that serves, or served, the state.
type Host struct {
	ID          string
	Instance    string
	URL         string
	StartedAtMS int64
	SeenAtMS    int64
	Serving     bool
}

// Credential is a stored credential: its name, role and the hex SHA-256 of
// the token (the token itself is only in its file), and when it was
// revoked (0 while it is in force).
type Credential struct {
	Name      string
	Role      string
	SHA256    string
	CreatedMS int64
	RevokedMS int64
	// Allowance is the credential's own cap, fixed when it is added; nil
	// when it has none. Spent and Reserved are what the jobs it admitted
	// under it settled and hold.
	Allowance *int64
	Spent     int64
	Reserved  int64
	// Tenants are the only tenants whose jobs it claims, in name order,
	// fixed when it is added; nil for every tenant.
	Tenants []string
}

// Batch is one submitted report request.
type Batch struct {
	Key           string
	RequestSHA256 string
	Document      string
	CreatedMS     int64
}

// Attempt is a failed attempt as stored: the record, the claim it ran
// under, and the fail call's answer (a repeat of the call gets it again).
type Attempt struct {
	OperationID string
	ClaimID     string
	Answer      []byte
	wire.Attempt
}

// Assignment records who a document was given to at which generation.
type Assignment struct {
	DocumentID string
	Generation int64
	Owner      string
	Reason     string
	AtMS       int64
}

// Mutation records one write of a document.
type Mutation struct {
	DocumentID   string
	Version      int64
	OperationKey string
	Caller       string
	AtMS         int64
}

// StoredOperation is a retained publication with the binding its key is
// compared against.
type StoredOperation struct {
	wire.Operation
	Binding   []byte
	CreatedMS int64
}

// OperationRef names a retained operation: its document and key.
type OperationRef struct {
	DocumentID, Key string
}

// IsNotFound reports whether err is (or wraps) ErrNotFound.
func IsNotFound(err error) bool { return errors.Is(err, ErrNotFound) }

// EventFilter picks the events EventListNewest reads. Before is always a
// bound (math.MaxInt64 for none); Kind and OperationID are "" for any.
type EventFilter struct {
	After, Before int64
	Kind          wire.EventKind
	OperationID   string
	Limit         int
}
