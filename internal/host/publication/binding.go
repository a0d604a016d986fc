package publication

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"

	"github.com/gowebpki/jcs"

	"github.com/fleet/fleet/internal/sections"
	"github.com/fleet/fleet/internal/store"
	"github.com/fleet/fleet/internal/wire"
)

// The modes a state's workers run in (input.json's mode).
const (
	ModeDeterministic = "deterministic"
	ModeModel         = "model"
)

// Bind reads what a publication body says it is and checks it against the
// job, in the transaction that decides the publication: the operation id
// and input digest must be the job's, the section the job's, the mode the
// state's (either, for a state from before modes were recorded), and a
// deterministic body must be exactly the section the host computes from
// the job's input. body is canonical JSON.
func (pb *Publisher) Bind(ctx context.Context, tx *store.Tx, j store.Job, body json.RawMessage) (wire.Binding, error) {
	var named struct {
		OperationID string `json:"operation_id"`
		InputSHA256 string `json:"input_sha256"`
		Section     string `json:"section"`
		Mode        string `json:"mode"`
	}
	// A body that is an object but whose names are not strings simply
	// names nothing.
	_ = json.Unmarshal(body, &named)
	b := wire.Binding{OperationID: named.OperationID, InputSHA256: named.InputSHA256, Section: named.Section, Mode: named.Mode}
	switch {
	case b.OperationID != j.OperationID:
		b.Reason = fmt.Sprintf("the body's operation_id is %.80q, not this job's %s", b.OperationID, j.OperationID)
	case b.InputSHA256 != j.InputSHA256:
		b.Reason = fmt.Sprintf("the body's input_sha256 is %.80q, not the SHA-256 of this job's input, %s", b.InputSHA256, j.InputSHA256)
	case b.Section != j.Section:
		b.Reason = fmt.Sprintf("the body's section is %.80q, not this job's %s", b.Section, j.Section)
	case b.Mode != ModeDeterministic && b.Mode != ModeModel, pb.mode != "" && b.Mode != pb.mode:
		b.Reason = fmt.Sprintf("the body's mode is %.80q; this state's workers run in %s mode", b.Mode, pb.modeName())
	case b.Mode == ModeDeterministic:
		matches, err := pb.isExpectedBody(ctx, tx, j, body)
		if err != nil {
			return b, err
		}
		if !matches {
			b.Reason = fmt.Sprintf("the body's result is not the %s section computed from this job's input", j.Section)
		}
	}
	b.Matches = b.Reason == ""
	return b, nil
}

// isExpectedBody reports whether a canonical body is the one a
// deterministic worker publishes for j: by the digest stored at enqueue,
// or, for a job queued before digests were stored, by computing it.
func (pb *Publisher) isExpectedBody(ctx context.Context, tx *store.Tx, j store.Job, body []byte) (bool, error) {
	if j.ExpectedSHA256 != "" {
		sum := sha256.Sum256(body)
		return hex.EncodeToString(sum[:]) == j.ExpectedSHA256, nil
	}
	want, err := pb.deterministicBody(ctx, tx, j)
	if err != nil {
		return false, err
	}
	return bytes.Equal(want, body) || bytes.Equal(canonical(want), body), nil
}

// deterministicBody is the body a deterministic worker publishes for the
// job, from the input its batch holds (as encoded, not yet canonical).
func (pb *Publisher) deterministicBody(ctx context.Context, tx *store.Tx, j store.Job) ([]byte, error) {
	batch, err := tx.BatchGet(ctx, j.BatchKey)
	if err != nil {
		return nil, fmt.Errorf("bind %s: %w", j.OperationID, err)
	}
	body, err := sections.Body(j.OperationID, j.Section, j.InputSHA256, batch.Document)
	if err != nil {
		return nil, fmt.Errorf("bind %s: compute the %s section: %w", j.OperationID, j.Section, err)
	}
	return body, nil
}

// canonical is body as RFC 8785 writes it. sections.Body is usually
// canonical already (sorted keys, no HTML escaping), so the comparison
// tries it as it is first and only canonicalizes when that differs; this
// runs on SQLite's serial path.
func canonical(body []byte) []byte {
	out, err := jcs.Transform(body)
	if err != nil {
		return nil // never equal to a canonical body
	}
	return out
}

func (pb *Publisher) modeName() string {
	if pb.mode == "" {
		return "either"
	}
	return pb.mode
}
