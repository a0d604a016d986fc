package httpapi

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"unicode/utf8"

	"github.com/labstack/echo/v4"

	"github.com/fleet/fleet/internal/fleet"
	"github.com/fleet/fleet/internal/host"
	"github.com/fleet/fleet/internal/resource"
	"github.com/fleet/fleet/internal/wire"
)

// MaxBatchBodyBytes bounds a batch call's body: a single call's limit for
// each item it may hold.
const MaxBatchBodyBytes = wire.MaxBatchItems * MaxBodyBytes

// batchItems reads a batch call's body: the envelope through
// decodeEnvelope, then each item's operation id and request through
// decodeItem, the single call's decoder. An item that does not decode is
// answered alone, with the single call's error, and the rest go to the
// host.
func batchItems[R any](c echo.Context, decodeEnvelope func([]byte, *batchBody) error, decodeItem func([]byte) (R, error)) (calls []host.JobCall[R], index []int, results []wire.ItemResult, err error) {
	data, err := readBodyUpTo(c, MaxBatchBodyBytes)
	if err != nil {
		return nil, nil, nil, err
	}
	var body batchBody
	if err := decodeEnvelope(data, &body); err != nil {
		return nil, nil, nil, err
	}
	switch {
	case body.Items == nil:
		return nil, nil, nil, fleet.Errorf(wire.CodeInvalid, "items is required")
	case len(*body.Items) == 0 || len(*body.Items) > wire.MaxBatchItems:
		return nil, nil, nil, fleet.Errorf(wire.CodeInvalid, "items must hold 1 to %d calls, got %d", wire.MaxBatchItems, len(*body.Items))
	}
	results = make([]wire.ItemResult, len(*body.Items))
	for i, raw := range *body.Items {
		op, req, err := batchItem(raw, decodeItem)
		results[i].OperationID = op
		if err != nil {
			results[i].Status, results[i].Body = errorAnswer(err)
			continue
		}
		calls = append(calls, host.JobCall[R]{OperationID: op, Request: req})
		index = append(index, i)
	}
	return calls, index, results, nil
}

// batchBody is a batch call's envelope.
type batchBody struct {
	Items *[]json.RawMessage `json:"items"`
}

// envelopeStrict is DecodeStrict over the whole batch: the duplicate-key
// and UTF-8 pass covers every item's request, which decodeItem then reads
// without one (resource.DecodeChecked).
func envelopeStrict(data []byte, body *batchBody) error { return resource.DecodeStrict(data, body) }

// envelopeOfPublications checks a batch of publications without
// canonicalizing it: each publication request is canonicalized whole by
// its own decoder (resource.DecodePublishRequest), which is its
// duplicate-key check, so the envelope needs only its UTF-8 checked and
// its own keys and each item's found once. A duplicate key inside one
// request refuses that item alone.
func envelopeOfPublications(data []byte, body *batchBody) error {
	if !utf8.Valid(data) {
		return fleet.Errorf(wire.CodeInvalid, "malformed JSON: invalid UTF-8")
	}
	if err := keysOnce(data); err != nil {
		return err
	}
	if err := resource.DecodeChecked(data, body); err != nil || body.Items == nil {
		return err
	}
	for _, item := range *body.Items {
		if err := keysOnce(item); err != nil {
			return err
		}
	}
	return nil
}

// keysOnce refuses an object in which a key appears twice, looking at its
// own keys only (its values are skipped whole). Anything but an object is
// left to the decoder to refuse.
func keysOnce(data []byte) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return nil
	}
	seen := map[string]bool{}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil // malformed: the decoder names it
		}
		key, _ := tok.(string)
		if seen[key] {
			return fleet.Errorf(wire.CodeInvalid, "malformed JSON: duplicate key %.80q", key)
		}
		seen[key] = true
		var skip json.RawMessage
		if err := dec.Decode(&skip); err != nil {
			return nil
		}
	}
	return nil
}

func batchItem[R any](raw json.RawMessage, decodeItem func([]byte) (R, error)) (string, R, error) {
	var none R
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
	// Each item gets what it would get alone, the single call's body
	// limit included.
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
func answerItems[T any](results []wire.ItemResult, index []int, answers []host.Answer[T], encode func(T) (json.RawMessage, error)) error {
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
func runBatch[R, T any](c echo.Context, decodeEnvelope func([]byte, *batchBody) error, decodeItem func([]byte) (R, error),
	call func(ctx context.Context, caller fleet.Caller, items []host.JobCall[R]) ([]host.Answer[T], error),
	encode func(T) (json.RawMessage, error)) ([]wire.ItemResult, []host.Answer[T], []int, error) {
	calls, index, results, err := batchItems(c, decodeEnvelope, decodeItem)
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
	results, _, _, err := runBatch(c, envelopeStrict, claimRefChecked, s.host.DispatchMany,
		func(raw json.RawMessage) (json.RawMessage, error) { return raw, nil })
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, wire.BatchResult{Results: results})
}

func (s *Server) heartbeats(c echo.Context) error {
	results, _, _, err := runBatch(c, envelopeStrict, claimRefChecked, s.host.HeartbeatMany, marshal[wire.HeartbeatResult])
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
	results, _, _, err := runBatch(c, envelopeStrict, decodeFailure, s.host.FailMany, marshal[wire.FailResult])
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, wire.BatchResult{Results: results})
}

func (s *Server) publications(c echo.Context) error {
	results, answers, index, err := runBatch(c, envelopeOfPublications, resource.DecodePublishRequest, s.host.PublishMany,
		func(p host.Publication) (json.RawMessage, error) { return p.Raw, nil })
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
