package publication

import (
	"context"
	"encoding/json"
	"fmt"
	"math"

	"github.com/fleet/fleet/internal/fleet"
	"github.com/fleet/fleet/internal/resource"
	"github.com/fleet/fleet/internal/store"
	"github.com/fleet/fleet/internal/wire"
)

// PublishTool names the publication in operation bindings, so a key reused
// for another kind of call can never match.
const PublishTool = "report.publish"

// operation is one publication request, validated and bound to its
// caller, being decided inside a transaction. Its steps run in this order:
//  1. Replay: the operation key's retained outcome, if the binding is
//     identical; any difference (including only the caller) is
//     operation_conflict;
//  2. Decide: a caller that is not the current owner at the request's
//     generation is superseded, even with the newest version; then a
//     version other than the expected one is version_conflict;
//  3. Write: the document and its mutation row, when published;
//  4. Record: the operation record, retained for replays (refusals too).
type operation struct {
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

// newOperation binds a checked request to its caller. It reads no state.
func newOperation(documentID string, caller fleet.Caller, r resource.Request) (*operation, error) {
	req := r.PublishRequest
	if err := resource.ValidateCaller(caller); err != nil {
		return nil, err
	}
	binding, err := bindingOf(documentID, caller, req)
	if err != nil {
		return nil, err
	}
	return &operation{DocumentID: documentID, Caller: caller, Request: req, binding: binding}, nil
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
func (p *operation) Replay(ctx context.Context, tx *store.Tx) (res Result, found bool, err error) {
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
func (p *operation) Decide(doc wire.Document, assignmentHolds bool) (wire.Outcome, error) {
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
func (p *operation) Write(ctx context.Context, tx *store.Tx, version int64) error {
	if err := tx.DocumentWrite(ctx, &store.DocumentWriteParams{ID: p.DocumentID, Body: p.Request.Body, Version: version,
		AtMS: tx.NowMS()}); err != nil {
		return err
	}
	return tx.MutationInsert(ctx, store.Mutation{DocumentID: p.DocumentID, Version: version,
		OperationKey: p.Request.OperationKey, Caller: p.Caller.ID, AtMS: tx.NowMS()})
}

// Record retains the outcome under the operation key and returns it as
// retained.
func (p *operation) Record(ctx context.Context, tx *store.Tx, outcome wire.Outcome) (Result, error) {
	raw, err := json.Marshal(outcome)
	if err != nil {
		return Result{}, err
	}
	err = tx.OperationInsert(ctx, store.StoredOperation{Binding: p.binding, CreatedMS: tx.NowMS(),
		Operation: wire.Operation{DocumentID: p.DocumentID, OperationKey: p.Request.OperationKey, Caller: p.Caller.ID,
			Status: outcome.Status, Outcome: raw, Deliveries: 1}})
	return Result{Outcome: outcome, Raw: raw}, err
}

// nextVersion refuses to wrap the version counter.
func nextVersion(v int64) (int64, error) {
	if v == math.MaxInt64 {
		return 0, fleet.Errorf(wire.CodeStateConflict, "document version %d cannot be incremented", v)
	}
	return v + 1, nil
}
