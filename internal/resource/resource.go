// Package resource is the report resource: documents with a version, an
// owner and an assignment generation, published only by their current owner
// inside one transaction that also retains the outcome under its operation key
// (SPEC section 6).
//
// The functions here take a *store.Tx so that the fleet can run them inside
// its own larger transactions; Store wraps them for standalone use.
package resource

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/fleet/fleet/internal/fleet"
	"github.com/fleet/fleet/internal/store"
)

// PublishTool names the publication in operation bindings, so a key reused
// for another kind of call can never match.
const PublishTool = "report.publish"

// Status is a publication outcome's status.
type Status string

const (
	StatusPublished       Status = "published"
	StatusSuperseded      Status = "superseded"
	StatusVersionConflict Status = "version_conflict"
)

// Outcome is a publication's retained result. ReceiptID is filled in by the
// fleet, which signs a receipt for every decision.
type Outcome struct {
	Status    Status `json:"status"`
	Version   int64  `json:"version"`
	ReceiptID string `json:"receipt_id,omitempty"`
}

// Document is one report document as a worker sees it.
type Document struct {
	ID         string          `json:"id"`
	Version    int64           `json:"version"`
	Generation int64           `json:"generation"`
	Body       json.RawMessage `json:"body"`
	// Owner is the current assignee ("" when unassigned or revoked); it is
	// not part of the worker-facing JSON.
	Owner string `json:"-"`
}

// CreateDocument adds an unassigned document at version 0 with a null body.
func CreateDocument(ctx context.Context, tx *store.Tx, id string) error {
	if err := ValidateDocumentID(id); err != nil {
		return err
	}
	_, err := tx.ExecContext(ctx,
		`INSERT INTO documents (id, version, body, owner, generation, updated_at_ms)
		 VALUES ($1, 0, 'null', '', 0, $2)`, id, tx.NowMS())
	if err != nil {
		return fmt.Errorf("create document %s: %w", id, err)
	}
	return nil
}

// Get reads a document. Returns not_found for an unknown id. In a write
// transaction on PostgreSQL the row stays locked until it ends.
func Get(ctx context.Context, tx *store.Tx, id string) (Document, error) {
	var d Document
	var body string
	err := tx.QueryRowContext(ctx,
		`SELECT id, version, generation, owner, body FROM documents WHERE id = $1`+tx.ForUpdate(), id,
	).Scan(&d.ID, &d.Version, &d.Generation, &d.Owner, &body)
	if errors.Is(err, sql.ErrNoRows) {
		return d, fleet.Errorf(fleet.CodeNotFound, "document %s not found", id)
	}
	if err != nil {
		return d, fmt.Errorf("get document %s: %w", id, err)
	}
	d.Body = json.RawMessage(body)
	return d, nil
}

// Assign transfers a document to owner at the next generation if its
// generation is still expectedGeneration (compare-and-swap). A stale
// expectation is assignment_conflict and changes nothing. It returns the new
// generation. Assignment is an operator's act, never a worker tool.
func Assign(ctx context.Context, tx *store.Tx, id string, expectedGeneration int64, owner, reason string) (int64, error) {
	if err := validateKey("owner", owner, MaxCallerBytes); err != nil {
		return 0, err
	}
	if expectedGeneration < 0 {
		return 0, fleet.Errorf(fleet.CodeInvalid, "expected_generation must be >= 0, got %d", expectedGeneration)
	}
	return setOwner(ctx, tx, id, &expectedGeneration, owner, reason)
}

// Revoke takes the document away from whoever holds it, at the next
// generation: every publication fenced by an older generation is superseded.
func Revoke(ctx context.Context, tx *store.Tx, id, reason string) (int64, error) {
	return setOwner(ctx, tx, id, nil, "", reason)
}

func setOwner(ctx context.Context, tx *store.Tx, id string, expected *int64, owner, reason string) (int64, error) {
	// The compare-and-swap is the UPDATE's own condition; only a miss reads
	// the document, to say why.
	var next int64
	var err error
	if expected != nil {
		err = tx.QueryRowContext(ctx,
			`UPDATE documents SET owner = $1, generation = generation + 1, updated_at_ms = $2
			 WHERE id = $3 AND generation = $4 RETURNING generation`,
			owner, tx.NowMS(), id, *expected).Scan(&next)
	} else {
		err = tx.QueryRowContext(ctx,
			`UPDATE documents SET owner = $1, generation = generation + 1, updated_at_ms = $2
			 WHERE id = $3 RETURNING generation`,
			owner, tx.NowMS(), id).Scan(&next)
	}
	if errors.Is(err, sql.ErrNoRows) {
		doc, getErr := Get(ctx, tx, id)
		if getErr != nil {
			return 0, getErr
		}
		if expected == nil {
			return 0, fmt.Errorf("revoke document %s: the update matched no row", id)
		}
		return 0, fleet.Errorf(fleet.CodeAssignmentConflict,
			"document %s is at generation %d, not the expected %d", id, doc.Generation, *expected)
	}
	if err != nil {
		return 0, fmt.Errorf("assign document %s: %w", id, err)
	}
	if _, err := tx.ExecContext(ctx,
		`INSERT INTO assignments (document_id, generation, owner, reason, at_ms) VALUES ($1, $2, $3, $4, $5)`,
		id, next, owner, reason, tx.NowMS()); err != nil {
		return 0, fmt.Errorf("record assignment of %s: %w", id, err)
	}
	return next, nil
}

// Participant lets a larger transaction take part in a publication.
type Participant interface {
	// AssignmentHolds reports whether the caller's assignment still stands
	// beyond owner and generation (for the fleet: the job is still running).
	AssignmentHolds(ctx context.Context, tx *store.Tx) (bool, error)
	// Decided runs in the publication's transaction once the outcome is
	// decided and the document written, before the outcome is recorded. It
	// returns the receipt id to retain in the outcome.
	Decided(ctx context.Context, tx *store.Tx, o Outcome) (receiptID string, err error)
}

// Result is what Publish returns.
type Result struct {
	Outcome Outcome
	// Raw is the outcome exactly as retained; a replay returns these bytes.
	Raw      []byte
	Replayed bool
}

// Publish runs the publication of SPEC section 6 inside tx, in this order:
//  1. replay: the operation key's retained outcome, if the binding is
//     identical; any difference (including only the caller) is
//     operation_conflict;
//  2. owner and generation: a caller that is not the current owner at the
//     request's generation is superseded, even with the newest version;
//  3. expected version: a mismatch is version_conflict;
//  4. the document, its mutation row and the operation record, written
//     together (with whatever the participant adds).
//
// Refusals are retained like publications, so they replay as refusals. p may
// be nil.
func Publish(ctx context.Context, tx *store.Tx, documentID string, caller fleet.Caller, req PublishRequest, p Participant) (Result, error) {
	req, err := req.normalized()
	if err != nil {
		return Result{}, err
	}
	if err := validateCaller(caller); err != nil {
		return Result{}, err
	}
	binding, err := bindingOf(documentID, caller, req)
	if err != nil {
		return Result{}, err
	}

	// The document row is read (and on PostgreSQL locked) first, so that
	// concurrent publications of one document, from any host, decide one
	// after another. The decision order below is unchanged by it.
	doc, err := Get(ctx, tx, documentID)
	if err != nil {
		return Result{}, err
	}

	// 1. Replay lookup.
	if prior, found, err := replay(ctx, tx, documentID, req.OperationKey, binding); err != nil || found {
		return prior, err
	}

	// 2. Owner and generation, then 3. expected version.
	holds := doc.Owner == caller.ID && doc.Generation == req.Generation
	if holds && p != nil {
		if holds, err = p.AssignmentHolds(ctx, tx); err != nil {
			return Result{}, err
		}
	}
	outcome := Outcome{Version: doc.Version}
	switch {
	case !holds:
		outcome.Status = StatusSuperseded
	case doc.Version != req.ExpectedVersion:
		outcome.Status = StatusVersionConflict
	default:
		outcome.Status = StatusPublished
	}

	// 4. The writes.
	if outcome.Status == StatusPublished {
		if outcome.Version, err = nextVersion(doc.Version); err != nil {
			return Result{}, err
		}
		if err := writeMutation(ctx, tx, documentID, caller, req, outcome.Version); err != nil {
			return Result{}, err
		}
	}
	if p != nil {
		if outcome.ReceiptID, err = p.Decided(ctx, tx, outcome); err != nil {
			return Result{}, err
		}
	}
	raw, err := json.Marshal(outcome)
	if err != nil {
		return Result{}, err
	}
	if _, err := tx.ExecContext(ctx,
		`INSERT INTO operations (document_id, operation_key, binding, caller, status, outcome, deliveries, created_at_ms)
		 VALUES ($1, $2, $3, $4, $5, $6, 1, $7)`,
		documentID, req.OperationKey, string(binding), caller.ID, string(outcome.Status), string(raw), tx.NowMS()); err != nil {
		return Result{}, fmt.Errorf("record operation %s: %w", req.OperationKey, err)
	}
	return Result{Outcome: outcome, Raw: raw}, nil
}

// bindingOf is what an operation key is bound to: the tool, the exact
// arguments and the caller's credential digest. It is compared byte for byte
// with what was stored, so it needs to be deterministic and unambiguous, not
// RFC 8785: fixed field order, and the body already canonical.
func bindingOf(documentID string, caller fleet.Caller, req PublishRequest) ([]byte, error) {
	type arguments struct {
		Document        string          `json:"document"`
		OperationKey    string          `json:"operation_key"`
		Generation      int64           `json:"generation"`
		ExpectedVersion int64           `json:"expected_version"`
		Body            json.RawMessage `json:"body"`
	}
	return json.Marshal(struct {
		Tool      string    `json:"tool"`
		Arguments arguments `json:"arguments"`
		Caller    string    `json:"caller_credential_sha256"`
	}{PublishTool, arguments{documentID, req.OperationKey, req.Generation, req.ExpectedVersion, req.Body}, caller.CredentialSHA256})
}

// replay returns the retained outcome of an identical earlier request and
// counts the delivery.
func replay(ctx context.Context, tx *store.Tx, documentID, key string, binding []byte) (Result, bool, error) {
	var storedBinding, outcome string
	err := tx.QueryRowContext(ctx,
		`SELECT binding, outcome FROM operations WHERE document_id = $1 AND operation_key = $2`,
		documentID, key).Scan(&storedBinding, &outcome)
	if errors.Is(err, sql.ErrNoRows) {
		return Result{}, false, nil
	}
	if err != nil {
		return Result{}, false, fmt.Errorf("look up operation %s: %w", key, err)
	}
	if storedBinding != string(binding) {
		return Result{}, false, fleet.Errorf(fleet.CodeOperationConflict,
			"operation key %s was used before with a different caller or different arguments", key)
	}
	if _, err := tx.ExecContext(ctx,
		`UPDATE operations SET deliveries = deliveries + 1 WHERE document_id = $1 AND operation_key = $2`,
		documentID, key); err != nil {
		return Result{}, false, fmt.Errorf("count delivery of %s: %w", key, err)
	}
	var o Outcome
	if err := json.Unmarshal([]byte(outcome), &o); err != nil {
		return Result{}, false, fmt.Errorf("decode retained outcome of %s: %w", key, err)
	}
	return Result{Outcome: o, Raw: []byte(outcome), Replayed: true}, true, nil
}

func writeMutation(ctx context.Context, tx *store.Tx, documentID string, caller fleet.Caller, req PublishRequest, version int64) error {
	if _, err := tx.ExecContext(ctx,
		`UPDATE documents SET body = $1, version = $2, updated_at_ms = $3 WHERE id = $4`,
		string(req.Body), version, tx.NowMS(), documentID); err != nil {
		return fmt.Errorf("write document %s: %w", documentID, err)
	}
	if _, err := tx.ExecContext(ctx,
		`INSERT INTO mutations (document_id, version, operation_key, caller, at_ms) VALUES ($1, $2, $3, $4, $5)`,
		documentID, version, req.OperationKey, caller.ID, tx.NowMS()); err != nil {
		return fmt.Errorf("record mutation of %s: %w", documentID, err)
	}
	return nil
}

// Operation is a retained operation record.
type Operation struct {
	DocumentID   string          `json:"document_id"`
	OperationKey string          `json:"operation_key"`
	Caller       string          `json:"caller"`
	Status       Status          `json:"status"`
	Outcome      json.RawMessage `json:"outcome"`
	Deliveries   int64           `json:"deliveries"`
}

// Operations lists a document's retained operations, oldest first.
func Operations(ctx context.Context, tx *store.Tx, documentID string) ([]Operation, error) {
	rows, err := tx.QueryContext(ctx,
		`SELECT document_id, operation_key, caller, status, outcome, deliveries FROM operations
		 WHERE document_id = $1 ORDER BY created_at_ms, operation_key`, documentID)
	if err != nil {
		return nil, fmt.Errorf("list operations of %s: %w", documentID, err)
	}
	defer rows.Close()
	var out []Operation
	for rows.Next() {
		var o Operation
		var outcome string
		if err := rows.Scan(&o.DocumentID, &o.OperationKey, &o.Caller, &o.Status, &outcome, &o.Deliveries); err != nil {
			return nil, err
		}
		o.Outcome = json.RawMessage(outcome)
		out = append(out, o)
	}
	return out, rows.Err()
}

// MutationCount counts a document's mutations.
func MutationCount(ctx context.Context, tx *store.Tx, documentID string) (int64, error) {
	var n int64
	err := tx.QueryRowContext(ctx, `SELECT COUNT(*) FROM mutations WHERE document_id = $1`, documentID).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("count mutations of %s: %w", documentID, err)
	}
	return n, nil
}
