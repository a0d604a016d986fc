package resource

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"strings"

	"github.com/go-json-experiment/json/jsontext"

	"github.com/fleet/fleet/internal/fleet"
	"github.com/fleet/fleet/internal/wire"
)

// Limits of the resource's inputs.
const (
	MaxKeyBytes    = 512
	MaxCallerBytes = 512
	MaxBodyBytes   = wire.MaxPublishBodyBytes
	MaxDocIDBytes  = 128
)

// Request is a publication request that has been checked and whose body
// is canonical JSON (RFC 8785). Only DecodePublishRequest and Normalize
// make one, so what takes a Request never canonicalizes the body again.
type Request struct{ wire.PublishRequest }

// DecodePublishRequest decodes a publication body strictly: unknown fields,
// missing fields, trailing data, duplicate keys and out-of-range values are
// refused with an invalid_request error naming the problem. The request is
// checked whole as it streams (duplicate keys, UTF-8), then its body is
// canonicalized; neither builds a tree of the values, so what a request
// makes the host hold is a small multiple of its size whatever its shape.
func DecodePublishRequest(data []byte) (Request, error) {
	if err := validJSON(data); err != nil {
		return Request{}, err
	}
	var raw struct {
		OperationKey    *string         `json:"operation_key"`
		Generation      *int64          `json:"generation"`
		ExpectedVersion *int64          `json:"expected_version"`
		Body            json.RawMessage `json:"body"`
	}
	// The fields are read from the text as sent: canonical JSON would
	// round a generation past 2^53 to a float's value.
	if err := decodeChecked(data, &raw); err != nil {
		return Request{}, err
	}
	switch {
	case raw.OperationKey == nil:
		return Request{}, fleet.Errorf(wire.CodeInvalid, "operation_key is required")
	case raw.Generation == nil:
		return Request{}, fleet.Errorf(wire.CodeInvalid, "generation is required")
	case raw.ExpectedVersion == nil:
		return Request{}, fleet.Errorf(wire.CodeInvalid, "expected_version is required")
	case raw.Body == nil:
		return Request{}, fleet.Errorf(wire.CodeInvalid, "body is required")
	}
	r := wire.PublishRequest{OperationKey: *raw.OperationKey, Generation: *raw.Generation,
		ExpectedVersion: *raw.ExpectedVersion, Body: raw.Body}
	if err := check(r); err != nil {
		return Request{}, err
	}
	if err := checkNumbersExact(bytes.TrimSpace(r.Body)); err != nil {
		return Request{}, err
	}
	canonical, err := canonicalize(r.Body)
	if err != nil {
		return Request{}, err
	}
	r.Body = canonical
	return Request{r}, checkSize(r.Body)
}

// canonicalize is a valid JSON text in canonical form (RFC 8785), made as it
// streams: what it holds is a small multiple of the text's size, where a
// parse into a tree holds some 90 times a flat array's. Its numbers must
// be exact (checkNumbersExact): canonical JSON writes each as the nearest
// 64-bit float.
func canonicalize(text []byte) ([]byte, error) {
	v := jsontext.Value(bytes.Clone(text))
	if err := v.Canonicalize(); err != nil {
		return nil, fleet.Errorf(wire.CodeInvalid, "body is not canonicalizable JSON: %v", err)
	}
	return v, nil
}

// MalformedJSON is a JSON decoder's error as the caller's invalid_request.
func MalformedJSON(err error) error {
	return fleet.Errorf(wire.CodeInvalid, "malformed JSON: %v", strings.TrimPrefix(err.Error(), "jsontext: "))
}

// validJSON checks that data is one JSON text with no key twice in an
// object and valid UTF-8, reading it as a stream: no tree of its values is
// built, so a body of a million small values costs what its bytes do.
func validJSON(data []byte) error {
	// From a bytes.Buffer the decoder reads data in place, without a copy.
	dec := jsontext.NewDecoder(bytes.NewBuffer(data))
	if err := dec.SkipValue(); err != nil {
		return MalformedJSON(err)
	}
	if _, err := dec.ReadToken(); !errors.Is(err, io.EOF) {
		return fleet.Errorf(wire.CodeInvalid, "malformed JSON: data after the top-level value")
	}
	return nil
}

// Normalize checks a publication request and canonicalizes its body. It
// reads no state, so it runs before the write transaction.
func Normalize(r wire.PublishRequest) (Request, error) {
	if err := check(r); err != nil {
		return Request{}, err
	}
	trimmed := bytes.TrimSpace(r.Body)
	if err := validJSON(trimmed); err != nil {
		return Request{}, err
	}
	if err := checkNumbersExact(trimmed); err != nil {
		return Request{}, err
	}
	canonical, err := canonicalize(trimmed)
	if err != nil {
		return Request{}, err
	}
	r.Body = canonical
	return Request{r}, checkSize(r.Body)
}

// check validates a request's key, generation and expected version, and
// that its body is an object.
func check(r wire.PublishRequest) error {
	if err := validateKey("operation_key", r.OperationKey, MaxKeyBytes); err != nil {
		return err
	}
	if r.Generation < 0 {
		return fleet.Errorf(wire.CodeInvalid, "generation must be >= 0, got %d", r.Generation)
	}
	if r.ExpectedVersion < 0 {
		return fleet.Errorf(wire.CodeInvalid, "expected_version must be >= 0, got %d", r.ExpectedVersion)
	}
	trimmed := bytes.TrimSpace(r.Body)
	if len(trimmed) == 0 || trimmed[0] != '{' {
		return fleet.Errorf(wire.CodeInvalid, "body must be a JSON object")
	}
	return nil
}

// checkSize bounds a canonical body.
func checkSize(canonical []byte) error {
	if len(canonical) > MaxBodyBytes {
		return fleet.Errorf(wire.CodeInvalid, "body is %d bytes; the limit is %d", len(canonical), MaxBodyBytes)
	}
	return nil
}

// DecodeStrict decodes one JSON value into v, refusing unknown fields,
// duplicate keys, invalid UTF-8 and trailing data. Errors are invalid_request
// and name the offending field where the decoder knows it.
func DecodeStrict(data []byte, v any) error {
	// encoding/json silently accepts duplicate keys and invalid UTF-8.
	if err := validJSON(data); err != nil {
		return err
	}
	return decodeChecked(data, v)
}

// DecodeChecked is DecodeStrict for a text whose keys and UTF-8 were
// already checked, as part of a larger text DecodeStrict read (a batch
// call's items).
func DecodeChecked(data []byte, v any) error { return decodeChecked(data, v) }

// decodeChecked is DecodeStrict for a text whose keys and UTF-8 are
// already checked.
func decodeChecked(data []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return describeDecodeError(err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return fleet.Errorf(wire.CodeInvalid, "malformed JSON: data after the top-level value")
	}
	return nil
}

func describeDecodeError(err error) error {
	var typeErr *json.UnmarshalTypeError
	var syntaxErr *json.SyntaxError
	switch {
	case errors.As(err, &typeErr):
		field := typeErr.Field
		if field == "" {
			return fleet.Errorf(wire.CodeInvalid, "the request must be a JSON object, got %s", typeErr.Value)
		}
		return fleet.Errorf(wire.CodeInvalid, "field %s: expected %s, got %s", field, typeErr.Type, typeErr.Value)
	case errors.As(err, &syntaxErr):
		return fleet.Errorf(wire.CodeInvalid, "malformed JSON at byte %d: %v", syntaxErr.Offset, syntaxErr)
	case strings.HasPrefix(err.Error(), "json: unknown field "):
		return fleet.Errorf(wire.CodeInvalid, "unknown field %s", strings.TrimPrefix(err.Error(), "json: unknown field "))
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return fleet.Errorf(wire.CodeInvalid, "malformed JSON: unexpected end of input")
	default:
		return fleet.Errorf(wire.CodeInvalid, "malformed JSON: %v", err)
	}
}

// ValidateDocumentID checks a document id: 1..128 bytes of letters, digits,
// '-', '_' and '.', so ids are safe in paths, URLs and file names.
func ValidateDocumentID(id string) error {
	if err := validateKey("document id", id, MaxDocIDBytes); err != nil {
		return err
	}
	for _, c := range id {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_' || c == '.') {
			return fleet.Errorf(wire.CodeInvalid, "document id %q may hold only letters, digits, '-', '_' and '.'", id)
		}
	}
	if id == "." || id == ".." {
		return fleet.Errorf(wire.CodeInvalid, "document id %q is reserved", id)
	}
	return nil
}

// ValidateCaller checks the adapter-supplied caller.
func ValidateCaller(c fleet.Caller) error {
	if err := validateKey("caller", c.ID, MaxCallerBytes); err != nil {
		return err
	}
	if len(c.CredentialSHA256) != 64 {
		return fleet.Errorf(wire.CodeInvalid, "caller credential digest must be 64 hex characters")
	}
	if _, err := hex.DecodeString(c.CredentialSHA256); err != nil {
		return fleet.Errorf(wire.CodeInvalid, "caller credential digest must be hex")
	}
	return nil
}

func validateKey(name, value string, max int) error {
	switch {
	case value == "":
		return fleet.Errorf(wire.CodeInvalid, "%s must not be empty", name)
	case len(value) > max:
		return fleet.Errorf(wire.CodeInvalid, "%s is %d bytes; the limit is %d", name, len(value), max)
	}
	for _, c := range value {
		if c < 0x20 || c == 0x7f || c == '\uFFFD' {
			return fleet.Errorf(wire.CodeInvalid, "%s holds a control character or invalid UTF-8", name)
		}
	}
	return nil
}
