// Package resource is the report resource: documents with a version, an
// owner and an assignment generation, published only by their current
// owner, with every outcome retained under its operation key. Its rules are
// the building blocks of a publication transaction (Publication), which the
// fleet host runs with the job's steps added (host/publish.go) and Store
// runs on its own.
package resource

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/fleet/fleet/internal/fleet"
	"github.com/fleet/fleet/internal/store"
	"github.com/fleet/fleet/internal/wire"
)

// PublishTool names the publication in operation bindings, so a key reused
// for another kind of call can never match.
const PublishTool = "report.publish"

// CreateDocument adds an unassigned document at version 0 with a null body.
func CreateDocument(ctx context.Context, tx *store.Tx, id string) error {
	if err := ValidateDocumentID(id); err != nil {
		return err
	}
	return tx.DocumentInsert(ctx, id, tx.NowMS())
}

// GetDocument reads a document; an unknown id is not_found. With
// store.ForUpdate, in a write transaction, the row stays locked until it
// ends.
func GetDocument(ctx context.Context, tx *store.Tx, id string, lock store.Lock) (wire.Document, error) {
	d, err := tx.DocumentGet(ctx, id, lock)
	if store.IsNotFound(err) {
		return d, fleet.Errorf(wire.CodeNotFound, "document %s not found", id)
	}
	return d, err
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
		return 0, fleet.Errorf(wire.CodeInvalid, "expected_generation must be >= 0, got %d", expectedGeneration)
	}
	return setOwner(ctx, tx, id, &expectedGeneration, owner, reason)
}

// Revoke takes the document away from whoever holds it, at the next
// generation: every publication fenced by an older generation is superseded.
func Revoke(ctx context.Context, tx *store.Tx, id, reason string) (int64, error) {
	return setOwner(ctx, tx, id, nil, "", reason)
}

func setOwner(ctx context.Context, tx *store.Tx, id string, expected *int64, owner, reason string) (int64, error) {
	// The compare-and-swap is the write's own condition; only a miss reads
	// the document, to say why.
	a, err := tx.DocumentAssign(ctx, &store.DocumentAssignParams{ID: id, IfGeneration: expected, Owner: owner,
		Reason: reason, AtMS: tx.NowMS()})
	if err != nil {
		return 0, err
	}
	if !a.OK {
		doc, err := GetDocument(ctx, tx, id, store.NoLock)
		switch {
		case err != nil:
			return 0, err
		case expected == nil:
			return 0, fmt.Errorf("revoke document %s: the update matched no row", id)
		}
		return 0, fleet.Errorf(wire.CodeAssignmentConflict,
			"document %s is at generation %d, not the expected %d", id, doc.Generation, *expected)
	}
	return a.Generation, nil
}

// Publication is one publication request, validated and bound to its
// caller, being decided inside a transaction. Its steps run in this order:
//  1. Replay: the operation key's retained outcome, if the binding is
//     identical; any difference (including only the caller) is
//     operation_conflict;
//  2. Decide: a caller that is not the current owner at the request's
//     generation is superseded, even with the newest version; then a
//     version other than the expected one is version_conflict;
//  3. Write: the document and its mutation row, when published;
//  4. Record: the operation record, retained for replays (refusals too).
type Publication struct {
	DocumentID string
	Caller     fleet.Caller
	Request    wire.PublishRequest // with a canonical body
	binding    []byte
}

// Result is what a publication returns.
type Result struct {
	Outcome wire.Outcome
	// Raw is the outcome exactly as retained; a replay returns these bytes.
	Raw      []byte
	Replayed bool
}

// NewPublication validates a request and binds it to its caller; Bind is
// the same for a request Normalize has already checked.
func NewPublication(documentID string, caller fleet.Caller, req wire.PublishRequest) (*Publication, error) {
	r, err := Normalize(req)
	if err != nil {
		return nil, err
	}
	return Bind(documentID, caller, r)
}

// Bind binds a checked request to its caller. It reads no state.
func Bind(documentID string, caller fleet.Caller, r Request) (*Publication, error) {
	req := r.PublishRequest
	if err := validateCaller(caller); err != nil {
		return nil, err
	}
	binding, err := bindingOf(documentID, caller, req)
	if err != nil {
		return nil, err
	}
	return &Publication{DocumentID: documentID, Caller: caller, Request: req, binding: binding}, nil
}

// bindingOf is what an operation key is bound to: the tool, the exact
// arguments and the caller's credential digest. It is compared byte for byte
// with what was stored, so it needs to be deterministic and unambiguous, not
// RFC 8785: fixed field order, and the body already canonical.
func bindingOf(documentID string, caller fleet.Caller, req wire.PublishRequest) ([]byte, error) {
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

// Replay returns the retained outcome of an identical earlier request, and
// counts the delivery; found is false when the key is new.
func (p *Publication) Replay(ctx context.Context, tx *store.Tx) (res Result, found bool, err error) {
	key := p.Request.OperationKey
	prior, err := tx.OperationGet(ctx, p.DocumentID, key)
	if store.IsNotFound(err) {
		return Result{}, false, nil
	}
	if err != nil {
		return Result{}, false, err
	}
	if string(prior.Binding) != string(p.binding) {
		return Result{}, false, fleet.Errorf(wire.CodeOperationConflict,
			"operation key %s was used before with a different caller or different arguments", key)
	}
	if err := tx.OperationCountDelivery(ctx, p.DocumentID, key); err != nil {
		return Result{}, false, err
	}
	var o wire.Outcome
	if err := json.Unmarshal(prior.Outcome, &o); err != nil {
		return Result{}, false, fmt.Errorf("decode retained outcome of %s: %w", key, err)
	}
	return Result{Outcome: o, Raw: prior.Outcome, Replayed: true}, true, nil
}

// Decide is the outcome for doc as it stands: superseded unless the
// caller's assignment holds (owner, generation and whatever else the
// caller's transaction requires), else version_conflict unless the version
// is the expected one, else published at the next version.
func (p *Publication) Decide(doc wire.Document, assignmentHolds bool) (wire.Outcome, error) {
	holds := assignmentHolds && doc.Owner == p.Caller.ID && doc.Generation == p.Request.Generation
	outcome := wire.Outcome{Version: doc.Version}
	switch {
	case !holds:
		outcome.Status = wire.StatusSuperseded
	case doc.Version != p.Request.ExpectedVersion:
		outcome.Status = wire.StatusVersionConflict
	default:
		next, err := nextVersion(doc.Version)
		if err != nil {
			return outcome, err
		}
		outcome.Status, outcome.Version = wire.StatusPublished, next
	}
	return outcome, nil
}

// Write writes the published body at version, and its mutation row.
func (p *Publication) Write(ctx context.Context, tx *store.Tx, version int64) error {
	if err := tx.DocumentWrite(ctx, &store.DocumentWriteParams{ID: p.DocumentID, Body: p.Request.Body, Version: version,
		AtMS: tx.NowMS()}); err != nil {
		return err
	}
	return tx.MutationInsert(ctx, store.Mutation{DocumentID: p.DocumentID, Version: version,
		OperationKey: p.Request.OperationKey, Caller: p.Caller.ID, AtMS: tx.NowMS()})
}

// Record retains the outcome under the operation key and returns it as
// retained.
func (p *Publication) Record(ctx context.Context, tx *store.Tx, outcome wire.Outcome) (Result, error) {
	raw, err := json.Marshal(outcome)
	if err != nil {
		return Result{}, err
	}
	err = tx.OperationInsert(ctx, store.StoredOperation{Binding: p.binding, CreatedMS: tx.NowMS(),
		Operation: wire.Operation{DocumentID: p.DocumentID, OperationKey: p.Request.OperationKey, Caller: p.Caller.ID,
			Status: outcome.Status, Outcome: raw, Deliveries: 1}})
	return Result{Outcome: outcome, Raw: raw}, err
}
