// Package jobs is the job queue and its state machine (SPEC section 4). A
// claim is a lease whose fence is the job document's assignment generation,
// so claim, assignment and publication agree on one number. Every function
// runs inside the caller's transaction.
package jobs

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"
	"github.com/gowebpki/jcs"

	"github.com/fleet/fleet/internal/fleet"
	"github.com/fleet/fleet/internal/resource"
	"github.com/fleet/fleet/internal/store"
)

// State is a job's state.
type State string

const (
	Queued                  State = "queued"
	Claimed                 State = "claimed"
	Running                 State = "running"
	Completed               State = "completed"
	Refused                 State = "refused"
	CancelledBeforeDispatch State = "cancelled_before_dispatch"
	Cancelled               State = "cancelled"
	Unresolved              State = "unresolved"
)

// transitions is SPEC section 4's table.
var transitions = map[State][]State{
	Queued:     {Claimed, CancelledBeforeDispatch},
	Claimed:    {Running, Refused, Queued, CancelledBeforeDispatch},
	Running:    {Completed, Cancelled, Unresolved},
	Refused:    {Queued},
	Unresolved: {Completed, Queued},
}

// Settled reports whether nothing more will happen to the job without an
// operator: it is terminal, or unresolved.
func (s State) Settled() bool {
	return s != Queued && s != Claimed && s != Running
}

// Sections a job can compute.
var Sections = []string{"summary", "terms", "actions", "links"}

// Limits of a batch.
const (
	MaxDocumentBytes = 64_000
	MaxSections      = 64
)

// Job is one report section's job, joined with its document's assignment.
type Job struct {
	OperationID      string          `json:"operation_id"`
	Position         int64           `json:"position"`
	Batch            string          `json:"batch"`
	Section          string          `json:"section"`
	DocumentID       string          `json:"document_id"`
	InputSHA256      string          `json:"input_sha256"`
	State            State           `json:"state"`
	Generation       int64           `json:"generation"` // the document's assignment generation
	Owner            string          `json:"owner"`      // the document's current assignee
	Worker           string          `json:"worker"`     // who holds (or last held) the claim
	ClaimID          string          `json:"-"`
	LeaseExpiresAtMS int64           `json:"lease_expires_at_ms"`
	Reserved         int64           `json:"reserved"`
	AdmissionClaimID string          `json:"-"`
	Admission        json.RawMessage `json:"-"`
	Outcome          json.RawMessage `json:"outcome"` // the retained publication outcome, read from the resource
	Reason           string          `json:"reason"`
	ReceiptID        string          `json:"receipt_id,omitempty"` // the newest receipt; filled by listings that ask
	CreatedAtMS      int64           `json:"created_at_ms"`
	UpdatedAtMS      int64           `json:"updated_at_ms"`
}

// Claim is a worker's lease on a job.
type Claim struct {
	ClaimID          string `json:"claim_id"`
	Generation       int64  `json:"generation"`
	LeaseExpiresAtMS int64  `json:"lease_expires_at_ms"`
}

// CurrentClaim is the job's live claim, or nil.
func (j Job) CurrentClaim() *Claim {
	if j.ClaimID == "" || (j.State != Claimed && j.State != Running) {
		return nil
	}
	return &Claim{ClaimID: j.ClaimID, Generation: j.Generation, LeaseExpiresAtMS: j.LeaseExpiresAtMS}
}

// Input is what a worker computes from.
type Input struct {
	Document string `json:"document"`
	Section  string `json:"section"`
}

// SHA256 is the hex SHA-256 of the input's canonical JSON.
func (in Input) SHA256() (string, error) {
	data, err := json.Marshal(in)
	if err != nil {
		return "", err
	}
	canonical, err := jcs.Transform(data)
	if err != nil {
		return "", err
	}
	return fleet.DigestHex(canonical), nil
}

// ValidateBatch checks a document and its sections (SPEC section 2).
func ValidateBatch(document string, sections []string) error {
	switch {
	case len(document) == 0 || strings.TrimSpace(document) == "":
		return fleet.Errorf(fleet.CodeInvalid, "document must not be blank")
	case len(document) > MaxDocumentBytes:
		return fleet.Errorf(fleet.CodeInvalid, "document is %d bytes; the limit is %d", len(document), MaxDocumentBytes)
	case !isUTF8(document):
		return fleet.Errorf(fleet.CodeInvalid, "document is not valid UTF-8")
	case len(sections) == 0 || len(sections) > MaxSections:
		return fleet.Errorf(fleet.CodeInvalid, "sections must hold 1 to %d entries, got %d", MaxSections, len(sections))
	}
	for i, s := range sections {
		if !slices.Contains(Sections, s) {
			return fleet.Errorf(fleet.CodeInvalid, "sections[%d] is %q; it must be one of %s", i, s, strings.Join(Sections, ", "))
		}
	}
	return nil
}

// isUTF8 also refuses NUL, which no report text needs.
func isUTF8(s string) bool { return utf8.ValidString(s) && !strings.ContainsRune(s, 0) }

// Enqueue records a batch and one queued job per section, each with its own
// unassigned document, and returns them in order.
func Enqueue(ctx context.Context, tx *store.Tx, batchKey, requestSHA256, document string, sections []string) ([]Job, error) {
	if err := ValidateBatch(document, sections); err != nil {
		return nil, err
	}
	if _, err := tx.ExecContext(ctx,
		`INSERT INTO batches (idempotency_key, request_sha256, document, created_at_ms) VALUES ($1, $2, $3, $4)`,
		batchKey, requestSHA256, document, tx.NowMS()); err != nil {
		return nil, fmt.Errorf("record batch %s: %w", batchKey, err)
	}
	var position int64
	if err := tx.LockChain(ctx, "jobs"); err != nil {
		return nil, err
	}
	if err := tx.QueryRowContext(ctx, `SELECT COALESCE(MAX(position), 0) FROM jobs`).Scan(&position); err != nil {
		return nil, fmt.Errorf("read queue tail: %w", err)
	}
	out := make([]Job, 0, len(sections))
	for _, section := range sections {
		id, err := uuid.NewV7()
		if err != nil {
			return nil, fmt.Errorf("operation id: %w", err)
		}
		op := id.String()
		sum, err := Input{Document: document, Section: section}.SHA256()
		if err != nil {
			return nil, err
		}
		position++
		docID := "doc-" + op
		if err := resource.CreateDocument(ctx, tx, docID); err != nil {
			return nil, err
		}
		if _, err := tx.ExecContext(ctx,
			`INSERT INTO jobs (operation_id, position, batch_key, section, document_id, input_sha256, state, created_at_ms, updated_at_ms)
			 VALUES ($1, $2, $3, $4, $5, $6, 'queued', $7, $7)`,
			op, position, batchKey, section, docID, sum, tx.NowMS()); err != nil {
			return nil, fmt.Errorf("enqueue %s: %w", section, err)
		}
		out = append(out, Job{OperationID: op, Position: position, Batch: batchKey, Section: section, DocumentID: docID,
			InputSHA256: sum, State: Queued, CreatedAtMS: tx.NowMS(), UpdatedAtMS: tx.NowMS()})
	}
	return out, nil
}

// BatchJobs returns a batch's request digest and its operation ids in order,
// or found=false.
func BatchJobs(ctx context.Context, tx *store.Tx, batchKey string) (requestSHA256 string, ops []string, found bool, err error) {
	err = tx.QueryRowContext(ctx, `SELECT request_sha256 FROM batches WHERE idempotency_key = $1`, batchKey).Scan(&requestSHA256)
	if errors.Is(err, sql.ErrNoRows) {
		return "", nil, false, nil
	}
	if err != nil {
		return "", nil, false, fmt.Errorf("read batch %s: %w", batchKey, err)
	}
	rows, err := tx.QueryContext(ctx, `SELECT operation_id FROM jobs WHERE batch_key = $1 ORDER BY position`, batchKey)
	if err != nil {
		return "", nil, false, err
	}
	defer rows.Close()
	for rows.Next() {
		var op string
		if err := rows.Scan(&op); err != nil {
			return "", nil, false, err
		}
		ops = append(ops, op)
	}
	return requestSHA256, ops, true, rows.Err()
}

const selectJob = `SELECT j.operation_id, j.position, j.batch_key, j.section, j.document_id, j.input_sha256, j.state,
	d.generation, d.owner, j.worker, j.claim_id, j.lease_expires_at_ms, j.reserved, j.admission_claim_id,
	j.admission, COALESCE((SELECT o.outcome FROM operations o WHERE o.document_id = j.document_id AND o.status = 'published' LIMIT 1), ''),
	j.reason, j.created_at_ms, j.updated_at_ms
	FROM jobs j JOIN documents d ON d.id = j.document_id`

func scanJob(row interface{ Scan(...any) error }) (Job, error) {
	var j Job
	var admission, outcome string
	err := row.Scan(&j.OperationID, &j.Position, &j.Batch, &j.Section, &j.DocumentID, &j.InputSHA256, &j.State,
		&j.Generation, &j.Owner, &j.Worker, &j.ClaimID, &j.LeaseExpiresAtMS, &j.Reserved, &j.AdmissionClaimID,
		&admission, &outcome, &j.Reason, &j.CreatedAtMS, &j.UpdatedAtMS)
	if admission != "" {
		j.Admission = json.RawMessage(admission)
	}
	if outcome != "" {
		j.Outcome = json.RawMessage(outcome)
	}
	return j, err
}

// Get reads one job; an unknown operation id is not_found.
func Get(ctx context.Context, tx *store.Tx, op string) (Job, error) {
	j, err := scanJob(tx.QueryRowContext(ctx, selectJob+` WHERE j.operation_id = $1`+tx.ForUpdate("j", "d"), op))
	if errors.Is(err, sql.ErrNoRows) {
		return j, fleet.Errorf(fleet.CodeNotFound, "job %s not found", op)
	}
	if err != nil {
		return j, fmt.Errorf("read job %s: %w", op, err)
	}
	return j, nil
}

// List reads every job in queue order.
func List(ctx context.Context, tx *store.Tx) ([]Job, error) {
	return query(ctx, tx, selectJob+` ORDER BY j.position`)
}

func query(ctx context.Context, tx *store.Tx, q string, args ...any) ([]Job, error) {
	rows, err := tx.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, fmt.Errorf("list jobs: %w", err)
	}
	defer rows.Close()
	out := []Job{}
	for rows.Next() {
		j, err := scanJob(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, j)
	}
	return out, rows.Err()
}

// InputOf reads what a job computes from.
func InputOf(ctx context.Context, tx *store.Tx, j Job) (Input, error) {
	in := Input{Section: j.Section}
	err := tx.QueryRowContext(ctx, `SELECT document FROM batches WHERE idempotency_key = $1`, j.Batch).Scan(&in.Document)
	if err != nil {
		return in, fmt.Errorf("read input of %s: %w", j.OperationID, err)
	}
	return in, nil
}

// QueueStatus says why no job was claimable: "waiting" while claimed or
// running jobs may still come back to the queue, else "empty".
func QueueStatus(ctx context.Context, tx *store.Tx) (string, error) {
	var active int
	err := tx.QueryRowContext(ctx, `SELECT COUNT(*) FROM jobs WHERE state IN ('claimed', 'running')`).Scan(&active)
	if err != nil {
		return "", fmt.Errorf("read queue status: %w", err)
	}
	if active > 0 {
		return "waiting", nil
	}
	return "empty", nil
}

// ClaimNext leases the oldest queued job to worker: a new claim id, and the
// job's document assigned to the worker at the next generation.
func ClaimNext(ctx context.Context, tx *store.Tx, worker string, lease time.Duration) (Job, bool, error) {
	// Another host's claimer may hold the first queued job: skip it, take the next.
	j, err := scanJob(tx.QueryRowContext(ctx, selectJob+` WHERE j.state = 'queued' ORDER BY j.position LIMIT 1`+tx.SkipLocked("j", "d")))
	if errors.Is(err, sql.ErrNoRows) {
		return j, false, nil
	}
	if err != nil {
		return j, false, fmt.Errorf("find queued job: %w", err)
	}
	id, err := uuid.NewV7()
	if err != nil {
		return j, false, err
	}
	if j.Generation, err = resource.Assign(ctx, tx, j.DocumentID, j.Generation, worker, "claim"); err != nil {
		return j, false, fmt.Errorf("claim %s: %w", j.OperationID, err)
	}
	j.Owner, j.Worker, j.ClaimID = worker, worker, id.String()
	j.LeaseExpiresAtMS = tx.Now.Add(lease).UnixMilli()
	if err := Transition(ctx, tx, &j, Claimed, ""); err != nil {
		return j, false, err
	}
	return j, true, nil
}

// CheckClaim returns stale_claim unless (claimID, generation) is the job's
// current claim, held by caller, and the job is in one of the states.
func CheckClaim(j Job, caller, claimID string, generation int64, states ...State) error {
	c := j.CurrentClaim()
	if c == nil || c.ClaimID != claimID || c.Generation != generation || j.Worker != caller || !slices.Contains(states, j.State) {
		return fleet.Errorf(fleet.CodeStaleClaim, "claim %s at generation %d is not the current claim of job %s (%s)",
			claimID, generation, j.OperationID, j.State)
	}
	return nil
}

// Renew extends the job's lease from now.
func Renew(ctx context.Context, tx *store.Tx, j *Job, lease time.Duration) error {
	j.LeaseExpiresAtMS = tx.Now.Add(lease).UnixMilli()
	return save(ctx, tx, j)
}

// RevokeAssignment takes the job's document away from its holder at the
// next generation, so every claim and publication fenced by the old one is
// stale, and drops the claim.
func RevokeAssignment(ctx context.Context, tx *store.Tx, j *Job, reason string) error {
	gen, err := resource.Revoke(ctx, tx, j.DocumentID, reason)
	if err != nil {
		return fmt.Errorf("revoke %s: %w", j.OperationID, err)
	}
	j.Generation, j.Owner, j.ClaimID, j.LeaseExpiresAtMS = gen, "", "", 0
	return nil
}

// Transition moves the job to state `to` if SPEC section 4 allows it, and
// saves every field of j.
func Transition(ctx context.Context, tx *store.Tx, j *Job, to State, reason string) error {
	if !slices.Contains(transitions[j.State], to) {
		return fleet.Errorf(fleet.CodeStateConflict, "job %s is %s; it cannot become %s", j.OperationID, j.State, to)
	}
	j.State, j.Reason = to, reason
	return save(ctx, tx, j)
}

func save(ctx context.Context, tx *store.Tx, j *Job) error {
	j.UpdatedAtMS = tx.NowMS()
	_, err := tx.ExecContext(ctx,
		`UPDATE jobs SET state = $1, claim_id = $2, worker = $3, lease_expires_at_ms = $4, reserved = $5,
		 admission_claim_id = $6, admission = $7, reason = $8, updated_at_ms = $9
		 WHERE operation_id = $10`,
		string(j.State), j.ClaimID, j.Worker, j.LeaseExpiresAtMS, j.Reserved, j.AdmissionClaimID,
		string(j.Admission), j.Reason, j.UpdatedAtMS, j.OperationID)
	if err != nil {
		return fmt.Errorf("save job %s: %w", j.OperationID, err)
	}
	return nil
}

// Expired lists claimed and running jobs whose lease ended before now.
func Expired(ctx context.Context, tx *store.Tx) ([]Job, error) {
	return query(ctx, tx, selectJob+` WHERE j.state IN ('claimed', 'running') AND j.lease_expires_at_ms < $1 ORDER BY j.position`+tx.ForUpdate("j", "d"), tx.NowMS())
}

// InState lists the jobs in one state.
func InState(ctx context.Context, tx *store.Tx, s State) ([]Job, error) {
	return query(ctx, tx, selectJob+` WHERE j.state = $1 ORDER BY j.position`+tx.ForUpdate("j", "d"), string(s))
}
