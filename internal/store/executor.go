package store

import (
	"context"
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
// them, holding its own SQL, and may shape any operation its own best way;
// internal/store/storetest exercises each one on both backends.
type Executor interface {
	// LockLog takes the log lock (event log, receipt chain and job positions,
	// which must stay contiguous) until the transaction ends: the log's
	// sequencer takes it, and so does an enqueue numbering positions. A
	// backend with one writer already holds it.
	LockLog(ctx context.Context) error
	// TryLockLog takes the log lock if no other transaction holds it, and
	// reports whether it did (true with one writer).
	TryLockLog(ctx context.Context) (bool, error)

	SettingList(ctx context.Context) (map[string]string, error)
	SettingPut(ctx context.Context, name, value string) error

	HostGet(ctx context.Context, id string) (Host, error)
	HostList(ctx context.Context) ([]Host, error)
	HostPut(ctx context.Context, h Host) error // insert or replace
	// HostSeen renews a host's liveness if instance still holds its id, and
	// says whether its record still says serving (false once a peer retired
	// it); found is false when another process has taken the id over.
	HostSeen(ctx context.Context, id, instance string, atMS int64) (found, serving bool, err error)
	// HostRetire marks a serving host not serving if its record is still
	// exactly h's (instance and last seen): true for the one caller that
	// retires it, false when it renewed, was retired already, or (on a
	// backend with row locks) another transaction holds its record.
	HostRetire(ctx context.Context, h Host) (bool, error)

	KernelInsert(ctx context.Context, publicKey string, seed []byte, atMS int64) error
	KernelGet(ctx context.Context) (publicKey string, seed []byte, err error)

	CredentialInsert(ctx context.Context, c Credential) error
	CredentialGet(ctx context.Context, name string) (Credential, error)
	CredentialList(ctx context.Context) ([]Credential, error)
	// CredentialUpdate sets a credential's digest and revocation time by
	// name (ErrNotFound when there is none).
	CredentialUpdate(ctx context.Context, c Credential) error

	AccountingInsert(ctx context.Context, allowance, costPerReport int64) error
	// AccountingGet reads the allowance's figures. With ForUpdate nothing
	// else can change them until the transaction ends (on PostgreSQL every
	// shard is locked, so a transaction that already holds one of them must
	// not ask: read NoLock for figures that only inform a receipt or event).
	AccountingGet(ctx context.Context, lock Lock) (wire.Accounting, error)
	// AccountingReserve reserves cost_per_report and counts the call if
	// available covers it (the guard is part of the write); otherwise ok is
	// false and nothing changed. The figures returned are the allowance's
	// as they stand after it (on PostgreSQL other hosts' concurrent
	// decisions included).
	// shard names where the reservation is held, for AccountingMove.
	AccountingReserve(ctx context.Context) (acct wire.Accounting, shard int64, ok bool, err error)
	// AccountingMove takes fromReserved out of reserved and adds toSpent to
	// spent, from the shard the reservation is held on when shard is one
	// (AccountingReserve's; -1 for any); ok is false, and nothing changed,
	// when fewer are reserved.
	AccountingMove(ctx context.Context, shard, fromReserved, toSpent int64) (acct wire.Accounting, ok bool, err error)
	AccountingSetAllowance(ctx context.Context, allowance int64) (wire.Accounting, error)

	BatchInsert(ctx context.Context, b Batch) error
	BatchGet(ctx context.Context, key string) (Batch, error)

	// JobMaxPosition is the queue's tail (0 when empty).
	JobMaxPosition(ctx context.Context) (int64, error)
	JobInsert(ctx context.Context, j wire.Job) error
	JobGet(ctx context.Context, operationID string, lock Lock) (wire.Job, error)
	// JobNextQueued is the queued job claimable at nowMS that became
	// claimable first (then the oldest), locked, passing over any that
	// another transaction holds, with the input it computes from;
	// ErrNotFound when there is none. A job backing off is not scanned.
	JobNextQueued(ctx context.Context, nowMS int64) (wire.Job, wire.Input, error)
	// JobUpdate saves a job's own fields (not its document's).
	JobUpdate(ctx context.Context, j wire.Job) error
	JobList(ctx context.Context) ([]wire.Job, error)
	JobListByBatch(ctx context.Context, batchKey string) ([]string, error)
	// JobListExpired lists claimed and running jobs whose lease ended
	// before nowMS; with ForUpdate, locked, passing over any another
	// transaction holds.
	JobListExpired(ctx context.Context, nowMS int64, lock Lock) ([]wire.Job, error)
	// JobListClaimedBy lists, locked, the claimed jobs whose claims these
	// hosts issued; a job another transaction holds is passed over, not
	// waited for (its lease still ends it).
	JobListClaimedBy(ctx context.Context, hostIDs []string) ([]wire.Job, error)
	// JobListClaimedUnder lists, locked, the jobs worker holds claimed
	// under claim ids that begin with prefix (a keyed claim's), found
	// through the documents it owns.
	JobListClaimedUnder(ctx context.Context, worker, prefix string) ([]wire.Job, error)
	// JobPending reports whether any job may still be claimed: queued (a
	// retry backing off, when none is claimable), claimed or running.
	JobPending(ctx context.Context) (bool, error)
	JobCountByState(ctx context.Context) (map[wire.JobState]int64, error)
	// JobPage is up to limit jobs after position `after` in queue order,
	// those f selects (keyset paging: a page costs the same however long
	// the queue, and rows inserted meanwhile never shift a page).
	JobPage(ctx context.Context, f JobFilter, after int64, limit int) ([]wire.Job, error)

	// AttemptInsert records a failed attempt; AttemptList is a job's, in
	// order.
	AttemptInsert(ctx context.Context, a Attempt) error
	AttemptList(ctx context.Context, operationID string) ([]Attempt, error)

	DocumentInsert(ctx context.Context, id string, atMS int64) error
	DocumentGet(ctx context.Context, id string, lock Lock) (wire.Document, error)
	// DocumentSetOwner gives the document to owner at the next generation if
	// its generation is *expected (any generation when nil); ok is false when
	// no row matched.
	DocumentSetOwner(ctx context.Context, id string, expected *int64, owner string, atMS int64) (generation int64, ok bool, err error)
	DocumentWrite(ctx context.Context, id string, body []byte, version, atMS int64) error
	AssignmentInsert(ctx context.Context, a Assignment) error
	AssignmentList(ctx context.Context, documentID string) ([]Assignment, error) // oldest first

	MutationInsert(ctx context.Context, m Mutation) error
	MutationList(ctx context.Context, documentID string) ([]Mutation, error) // by version
	MutationCount(ctx context.Context, documentID string) (int64, error)
	MutationTotal(ctx context.Context) (int64, error)
	MutationCountByDocument(ctx context.Context) (map[string]int64, error)
	// MutationRepeatedOperations counts operation keys that mutated a
	// document more than once (always 0 in a sound state).
	MutationRepeatedOperations(ctx context.Context) (int64, error)

	OperationGet(ctx context.Context, documentID, key string) (StoredOperation, error)
	OperationCountDelivery(ctx context.Context, documentID, key string) error
	OperationInsert(ctx context.Context, o StoredOperation) error
	OperationList(ctx context.Context, documentID string) ([]wire.Operation, error)

	// ReceiptHead is the chain's newest receipt (0 and "" when empty).
	ReceiptHead(ctx context.Context) (sequence int64, id string, err error)
	// ReceiptInsert writes receipts, in one statement where it can.
	ReceiptInsert(ctx context.Context, receipts []StoredReceipt) error
	ReceiptGet(ctx context.Context, id string) ([]byte, error)
	// ReceiptGetMany reads the stored receipts with these ids, in chain
	// order within each 500 ids; ids not (yet) in the chain are left out.
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
	// one statement where it can.
	EventInsert(ctx context.Context, events []wire.Event) error
	// EventLast is the newest event's sequence (0 when there is none).
	EventLast(ctx context.Context) (int64, error)
	EventList(ctx context.Context, after int64, limit int) ([]wire.Event, error)
	EventHead(ctx context.Context) (count, last int64, err error)

	// PendingLogInsert writes events and prepared receipts (no sequence,
	// link or signature yet) for the log's sequencer to place, in one
	// statement each where it can. Entries are taken oldest first.
	// It returns their pending ids.
	PendingLogInsert(ctx context.Context, events []wire.Event, receipts []wire.Receipt) (eventIDs, receiptIDs []int64, err error)
	// PendingLogLeft returns which of the given pending ids are still
	// pending (not yet placed by any sequencer that committed).
	PendingLogLeft(ctx context.Context, events, receipts []int64) (leftEvents, leftReceipts []int64, err error)
	// PendingLogList reads up to limit pending events and limit pending
	// receipts, each oldest first, and the heads of the placed log (in one
	// statement where it can: the sequencer holds the log lock while it
	// runs).
	PendingLogList(ctx context.Context, limit int) (PendingLog, error)
	// PendingLogPlace writes placed events and sealed receipts and removes
	// the pending entries they were (in one statement where it can).
	// Where hosts wait for each other's sequencers (PostgreSQL) it also
	// tells them, when the transaction commits (see Driver.Placed).
	PendingLogPlace(ctx context.Context, events []wire.Event, receipts []StoredReceipt, pendingEvents, pendingReceipts []int64) error
}

// JobFilter selects jobs for JobPage; an empty field selects all.
type JobFilter struct {
	State   wire.JobState
	Section string
	Owner   string // the document's current assignee
	// OperationPrefix selects operation ids that start with it.
	OperationPrefix string
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

// IsNotFound reports whether err is (or wraps) ErrNotFound.
func IsNotFound(err error) bool { return errors.Is(err, ErrNotFound) }

// PendingLog is what waits for the sequencer, and where the log it will
// be placed after ends.
type PendingLog struct {
	Events    []PendingEvent
	Receipts  []PendingReceipt
	LastEvent int64     // the newest placed event's sequence (0 when none)
	Head      ChainHead // the receipt chain's newest link
}

// PendingEvent is an event waiting for its sequence number; Pending orders
// it among the others.
type PendingEvent struct {
	Pending int64
	Event   wire.Event
}

// PendingReceipt is a prepared receipt waiting for its place in the chain.
type PendingReceipt struct {
	Pending int64
	Receipt wire.Receipt
}
