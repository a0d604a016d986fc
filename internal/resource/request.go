package resource

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"math"
	"strings"

	"github.com/gowebpki/jcs"

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

// DecodePublishRequest decodes a publication body strictly: unknown fields,
// missing fields, trailing data, duplicate keys and out-of-range values are
// refused with an invalid_request error naming the problem. The returned
// request's Body is canonical JSON (RFC 8785).
func DecodePublishRequest(data []byte) (wire.PublishRequest, error) {
	var raw struct {
		OperationKey    *string         `json:"operation_key"`
		Generation      *int64          `json:"generation"`
		ExpectedVersion *int64          `json:"expected_version"`
		Body            json.RawMessage `json:"body"`
	}
	if err := DecodeStrict(data, &raw); err != nil {
		return wire.PublishRequest{}, err
	}
	switch {
	case raw.OperationKey == nil:
		return wire.PublishRequest{}, fleet.Errorf(wire.CodeInvalid, "operation_key is required")
	case raw.Generation == nil:
		return wire.PublishRequest{}, fleet.Errorf(wire.CodeInvalid, "generation is required")
	case raw.ExpectedVersion == nil:
		return wire.PublishRequest{}, fleet.Errorf(wire.CodeInvalid, "expected_version is required")
	case raw.Body == nil:
		return wire.PublishRequest{}, fleet.Errorf(wire.CodeInvalid, "body is required")
	}
	return Normalize(wire.PublishRequest{
		OperationKey:    *raw.OperationKey,
		Generation:      *raw.Generation,
		ExpectedVersion: *raw.ExpectedVersion,
		Body:            raw.Body,
	})
}

// Normalize validates a publication request and returns it with a
// canonical body. It runs before the write transaction (it reads no state),
// so the serial path never parses a body.
func Normalize(r wire.PublishRequest) (wire.PublishRequest, error) {
	if err := validateKey("operation_key", r.OperationKey, MaxKeyBytes); err != nil {
		return r, err
	}
	if r.Generation < 0 {
		return r, fleet.Errorf(wire.CodeInvalid, "generation must be >= 0, got %d", r.Generation)
	}
	if r.ExpectedVersion < 0 {
		return r, fleet.Errorf(wire.CodeInvalid, "expected_version must be >= 0, got %d", r.ExpectedVersion)
	}
	trimmed := bytes.TrimSpace(r.Body)
	if len(trimmed) == 0 || trimmed[0] != '{' {
		return r, fleet.Errorf(wire.CodeInvalid, "body must be a JSON object")
	}
	canonical, err := jcs.Transform(trimmed)
	if err != nil {
		return r, fleet.Errorf(wire.CodeInvalid, "body is not canonicalizable JSON: %v", err)
	}
	if err := checkNumbersExact(trimmed); err != nil {
		return r, err
	}
	if len(canonical) > MaxBodyBytes {
		return r, fleet.Errorf(wire.CodeInvalid, "body is %d bytes; the limit is %d", len(canonical), MaxBodyBytes)
	}
	r.Body = canonical
	return r, nil
}

// DecodeStrict decodes one JSON value into v, refusing unknown fields,
// duplicate keys, invalid UTF-8 and trailing data. Errors are invalid_request
// and name the offending field where the decoder knows it.
func DecodeStrict(data []byte, v any) error {
	// jcs parses the whole text and refuses duplicate keys and invalid
	// UTF-8, which encoding/json silently accepts.
	if _, err := jcs.Transform(data); err != nil {
		return fleet.Errorf(wire.CodeInvalid, "malformed JSON: %v", err)
	}
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

// validateCaller checks the adapter-supplied caller.
func validateCaller(c fleet.Caller) error {
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

// nextVersion refuses to wrap the version counter.
func nextVersion(v int64) (int64, error) {
	if v == math.MaxInt64 {
		return 0, fleet.Errorf(wire.CodeStateConflict, "document version %d cannot be incremented", v)
	}
	return v + 1, nil
}
