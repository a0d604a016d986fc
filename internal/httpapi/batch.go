package httpapi

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"

	"github.com/go-json-experiment/json/jsontext"

	"github.com/labstack/echo/v4"

	"github.com/fleet/fleet/internal/fleet"
	"github.com/fleet/fleet/internal/host/ledger"
	"github.com/fleet/fleet/internal/host/publication"
	"github.com/fleet/fleet/internal/resource"
	"github.com/fleet/fleet/internal/wire"
)

// MaxBatchBodyBytes bounds a batch call's body: a single call's limit for
// each item it may hold.
const MaxBatchBodyBytes = wire.MaxBatchItems * MaxBodyBytes

// batchItems reads a batch call's body: the envelope through
// readEnvelope, then each item's operation id and request through
// decodeItem, the single call's decoder. An item that does not decode is
// answered alone, with the single call's error, and the rest go to the
// host.
func batchItems[R any](c echo.Context, envelope envelopeChecks, decodeItem func([]byte) (R, error)) (calls []ledger.JobCall[R], index []int, results []wire.ItemResult, err error) {
	data, err := readBodyUpTo(c, MaxBatchBodyBytes)
	if err != nil {
		return nil, nil, nil, err
	}
	items, err := readEnvelope(data, envelope)
	if err != nil {
		return nil, nil, nil, err
	}
	switch {
	case items == nil:
		return nil, nil, nil, fleet.Errorf(wire.CodeInvalid, "items is required")
	case len(items) == 0 || len(items) > wire.MaxBatchItems:
		return nil, nil, nil, fleet.Errorf(wire.CodeInvalid, "items must hold 1 to %d calls, got %d", wire.MaxBatchItems, len(items))
	}
	results = make([]wire.ItemResult, len(items))
	for i, raw := range items {
		op, req, err := batchItem(raw, decodeItem)
		results[i].OperationID = op
		if err != nil {
			results[i].Status, results[i].Body = errorAnswer(err)
			continue
		}
		calls = append(calls, ledger.JobCall[R]{OperationID: op, Request: req})
		index = append(index, i)
	}
	return calls, index, results, nil
}

// envelopeChecks are what reading a batch's envelope checks.
type envelopeChecks int

const (
	// envelopeStrict checks the whole batch as DecodeStrict does (a key
	// twice anywhere, invalid UTF-8 anywhere), so each item's request is
	// then read without that pass (resource.DecodeChecked).
	envelopeStrict envelopeChecks = iota
	// envelopeOfPublications checks UTF-8 everywhere but keys only in the
	// envelope and each item's own: each publication request is checked
	// whole by its own decoder (resource.DecodePublishRequest), so a key
	// twice inside one request refuses that item alone.
	envelopeOfPublications
)

// itemOverhead is what an item adds to its request: its operation id,
// its keys, some spacing.
const itemOverhead = 1 << 10

// readEnvelope reads a batch's envelope, {"items":[…]}, as it streams and
// answers each item's text as sent: no decoder copies the whole body or
// builds a tree of it (what a batch makes the host hold is a small
// multiple of its size). Items null or absent answer nil.
func readEnvelope(data []byte, checks envelopeChecks) ([]json.RawMessage, error) {
	// From a bytes.Buffer the decoder reads data in place, without a copy.
	r := envelopeReader{dec: jsontext.NewDecoder(bytes.NewBuffer(data),
		jsontext.AllowDuplicateNames(checks == envelopeOfPublications)), checks: checks}
	if err := r.expect('{', "the request must be a JSON object"); err != nil {
		return nil, err
	}
	var items []json.RawMessage
	seen := false
	for r.dec.PeekKind() == '"' {
		name, err := r.dec.ReadToken()
		if err != nil {
			return nil, resource.MalformedJSON(err)
		}
		switch {
		case name.String() != "items":
			return nil, fleet.Errorf(wire.CodeInvalid, "unknown field %.80q", name.String())
		case seen:
			return nil, fleet.Errorf(wire.CodeInvalid, "malformed JSON: duplicate key \"items\"")
		}
		seen = true
		if items, err = r.items(); err != nil {
			return nil, err
		}
	}
	if err := r.expect('}', "malformed object"); err != nil {
		return nil, err
	}
	if _, err := r.dec.ReadToken(); !errors.Is(err, io.EOF) {
		return nil, fleet.Errorf(wire.CodeInvalid, "malformed JSON: data after the top-level value")
	}
	return items, nil
}

// envelopeReader is readEnvelope's decoder and the checks its items get.
type envelopeReader struct {
	dec    *jsontext.Decoder
	checks envelopeChecks
}

// expect reads the next token, which must be of kind; what says otherwise.
func (r envelopeReader) expect(kind jsontext.Kind, what string) error {
	tok, err := r.dec.ReadToken()
	if err != nil {
		return resource.MalformedJSON(err)
	}
	if tok.Kind() != kind {
		return fleet.Errorf(wire.CodeInvalid, "%s, got %s", what, tok.Kind())
	}
	return nil
}

// items reads the value of "items": null (nil) or an array of items, each
// kept as sent.
func (r envelopeReader) items() ([]json.RawMessage, error) {
	if r.dec.PeekKind() == 'n' {
		if _, err := r.dec.ReadToken(); err != nil {
			return nil, resource.MalformedJSON(err)
		}
		return nil, nil
	}
	if err := r.expect('[', "field items: expected an array"); err != nil {
		return nil, err
	}
	items := []json.RawMessage{}
	for r.dec.PeekKind() != ']' && r.dec.PeekKind() != 0 {
		item, err := r.dec.ReadValue()
		if err != nil {
			return nil, resource.MalformedJSON(err)
		}
		if r.checks == envelopeOfPublications && len(item) <= MaxBodyBytes+itemOverhead {
			if err := keysOnce(item); err != nil {
				return nil, err
			}
		}
		items = append(items, bytes.Clone(item))
	}
	return items, r.expect(']', "field items: malformed array")
}

// keysOnce refuses an object in which a key appears twice, looking at its
// own keys only (its values are skipped whole). Anything but an object is
// left to the decoder to refuse.
func keysOnce(data []byte) error {
	dec := jsontext.NewDecoder(bytes.NewBuffer(data), jsontext.AllowDuplicateNames(true))
	if tok, err := dec.ReadToken(); err != nil || tok.Kind() != '{' {
		return nil
	}
	seen := map[string]bool{}
	for dec.PeekKind() == '"' {
		tok, err := dec.ReadToken()
		if err != nil {
			return nil // malformed: the decoder names it
		}
		key := tok.String()
		if seen[key] {
			return fleet.Errorf(wire.CodeInvalid, "malformed JSON: duplicate key %.80q", key)
		}
		seen[key] = true
		if err := dec.SkipValue(); err != nil {
			return nil
		}
	}
	return nil
}

func batchItem[R any](raw json.RawMessage, decodeItem func([]byte) (R, error)) (string, R, error) {
	var none R
	// Each item gets what it would get alone, the single call's body
	// limit included; one far over it is not decoded at all.
	if len(raw) > MaxBodyBytes+itemOverhead {
		return "", none, fleet.Errorf(wire.CodeBodyTooLarge, "item is over %d bytes, the single call's body limit", MaxBodyBytes)
	}
	var item struct {
		OperationID *string         `json:"operation_id"`
		Request     json.RawMessage `json:"request"`
	}
	if err := resource.DecodeChecked(raw, &item); err != nil {
		return "", none, err
	}
	if item.OperationID == nil {
		return "", none, fleet.Errorf(wire.CodeInvalid, "operation_id is required")
	}
	op, err := canonicalOperationID(*item.OperationID)
	if err != nil {
		return *item.OperationID, none, err
	}
	if item.Request == nil {
		return op, none, fleet.Errorf(wire.CodeInvalid, "request is required")
	}
	if len(item.Request) > MaxBodyBytes {
		return op, none, fleet.Errorf(wire.CodeBodyTooLarge, "request body is over %d bytes", MaxBodyBytes)
	}
	req, err := decodeItem(item.Request)
	return op, req, err
}

// errorAnswer is the status and body the single call answers err with.
func errorAnswer(err error) (int, json.RawMessage) {
	code := fleet.ErrorCode(err)
	body, _ := json.Marshal(wire.ErrorBody{Error: wire.ErrorDetail{Code: code, Message: fleet.ErrorMessage(err)}})
	return statusFor(code), body
}

// answerItems fills in the host's answers for the items it was given.
func answerItems[T any](results []wire.ItemResult, index []int, answers []ledger.Answer[T], encode func(T) (json.RawMessage, error)) error {
	for k, a := range answers {
		r := &results[index[k]]
		if a.Err != nil {
			r.Status, r.Body = errorAnswer(a.Err)
			continue
		}
		body, err := encode(a.Value)
		if err != nil {
			return err
		}
		r.Status, r.Body = http.StatusOK, body
	}
	return nil
}

// runBatch decodes a batch, runs the decoded items through call and
// answers every item.
func runBatch[R, T any](c echo.Context, envelope envelopeChecks, decodeItem func([]byte) (R, error),
	call func(ctx context.Context, caller fleet.Caller, items []ledger.JobCall[R]) ([]ledger.Answer[T], error),
	encode func(T) (json.RawMessage, error)) ([]wire.ItemResult, []ledger.Answer[T], []int, error) {
	calls, index, results, err := batchItems(c, envelope, decodeItem)
	if err != nil || len(calls) == 0 {
		return results, nil, nil, err
	}
	answers, err := call(c.Request().Context(), callerOf(c), calls)
	if err != nil {
		return nil, nil, nil, err
	}
	return results, answers, index, answerItems(results, index, answers, encode)
}

func marshal[T any](v T) (json.RawMessage, error) { return json.Marshal(v) }

// claimRefChecked decodes a batch item's claim reference.
func claimRefChecked(data []byte) (wire.ClaimRef, error) {
	return claimRefDecoded(data, resource.DecodeChecked)
}

func (s *Server) dispatches(c echo.Context) error {
	results, _, _, err := runBatch(c, envelopeStrict, claimRefChecked, s.host.Admission().DispatchMany,
		func(raw json.RawMessage) (json.RawMessage, error) { return raw, nil })
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, wire.BatchResult{Results: results})
}

func (s *Server) heartbeats(c echo.Context) error {
	results, _, _, err := runBatch(c, envelopeStrict, claimRefChecked, s.host.Claims().HeartbeatMany, marshal[wire.HeartbeatResult])
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, wire.BatchResult{Results: results})
}

func (s *Server) failures(c echo.Context) error {
	decodeFailure := func(data []byte) (wire.FailRequest, error) {
		var req wire.FailRequest
		return req, resource.DecodeChecked(data, &req)
	}
	results, _, _, err := runBatch(c, envelopeStrict, decodeFailure, s.host.Failures().FailMany, marshal[wire.FailResult])
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, wire.BatchResult{Results: results})
}

func (s *Server) publications(c echo.Context) error {
	results, answers, index, err := runBatch(c, envelopeOfPublications, resource.DecodePublishRequest, s.host.Publications().PublishMany,
		func(p publication.Publication) (json.RawMessage, error) { return p.Raw, nil })
	if err != nil {
		return err
	}
	ackLost := false
	for k, a := range answers {
		if a.Err == nil {
			results[index[k]].Replayed = a.Value.Replayed
			ackLost = ackLost || a.Value.AckLost
		}
	}
	if ackLost && s.dropAcknowledgement(c, "a batch of publications") {
		return nil
	}
	return c.JSON(http.StatusOK, wire.BatchResult{Results: results})
}
