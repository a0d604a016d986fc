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
)

// Limits of the resource's inputs.
const (
	MaxKeyBytes    = 512
	MaxCallerBytes = 512
	MaxBodyBytes   = 64 << 10
	MaxDocIDBytes  = 128
)

// PublishRequest is what a worker sends to publish a document. It has no
// caller, owner or worker field: the caller comes from the trusted adapter.
type PublishRequest struct {
	OperationKey    string          `json:"operation_key"`
	Generation      int64           `json:"generation"`
	ExpectedVersion int64           `json:"expected_version"`
	Body            json.RawMessage `json:"body"`

	// canonical is the Body that normalized produced; while Body still
	// equals it, the publication transaction (which runs one request at a
	// time) skips parsing it again.
	canonical []byte
}

// DecodePublishRequest decodes a publication body strictly: unknown fields,
// missing fields, trailing data, duplicate keys and out-of-range values are
// refused with an invalid_request error naming the problem. The returned
// request's Body is canonical JSON (RFC 8785).
func DecodePublishRequest(data []byte) (PublishRequest, error) {
	var raw struct {
		OperationKey    *string         `json:"operation_key"`
		Generation      *int64          `json:"generation"`
		ExpectedVersion *int64          `json:"expected_version"`
		Body            json.RawMessage `json:"body"`
	}
	if err := DecodeStrict(data, &raw); err != nil {
		return PublishRequest{}, err
	}
	switch {
	case raw.OperationKey == nil:
		return PublishRequest{}, fleet.Errorf(fleet.CodeInvalid, "operation_key is required")
	case raw.Generation == nil:
		return PublishRequest{}, fleet.Errorf(fleet.CodeInvalid, "generation is required")
	case raw.ExpectedVersion == nil:
		return PublishRequest{}, fleet.Errorf(fleet.CodeInvalid, "expected_version is required")
	case raw.Body == nil:
		return PublishRequest{}, fleet.Errorf(fleet.CodeInvalid, "body is required")
	}
	req := PublishRequest{
		OperationKey:    *raw.OperationKey,
		Generation:      *raw.Generation,
		ExpectedVersion: *raw.ExpectedVersion,
		Body:            raw.Body,
	}
	canonical, err := req.normalized()
	if err != nil {
		return PublishRequest{}, err
	}
	return canonical, nil
}

// normalized validates the request and returns it with a canonical body.
func (r PublishRequest) normalized() (PublishRequest, error) {
	if err := validateKey("operation_key", r.OperationKey, MaxKeyBytes); err != nil {
		return r, err
	}
	if r.Generation < 0 {
		return r, fleet.Errorf(fleet.CodeInvalid, "generation must be >= 0, got %d", r.Generation)
	}
	if r.ExpectedVersion < 0 {
		return r, fleet.Errorf(fleet.CodeInvalid, "expected_version must be >= 0, got %d", r.ExpectedVersion)
	}
	if r.canonical != nil && bytes.Equal(r.Body, r.canonical) {
		return r, nil
	}
	trimmed := bytes.TrimSpace(r.Body)
	if len(trimmed) == 0 || trimmed[0] != '{' {
		return r, fleet.Errorf(fleet.CodeInvalid, "body must be a JSON object")
	}
	canonical, err := jcs.Transform(trimmed)
	if err != nil {
		return r, fleet.Errorf(fleet.CodeInvalid, "body is not canonicalizable JSON: %v", err)
	}
	if len(canonical) > MaxBodyBytes {
		return r, fleet.Errorf(fleet.CodeInvalid, "body is %d bytes; the limit is %d", len(canonical), MaxBodyBytes)
	}
	r.Body, r.canonical = canonical, canonical
	return r, nil
}

// DecodeStrict decodes one JSON value into v, refusing unknown fields,
// duplicate keys, invalid UTF-8 and trailing data. Errors are invalid_request
// and name the offending field where the decoder knows it.
func DecodeStrict(data []byte, v any) error {
	// jcs parses the whole text and refuses duplicate keys and invalid
	// UTF-8, which encoding/json silently accepts.
	if _, err := jcs.Transform(data); err != nil {
		return fleet.Errorf(fleet.CodeInvalid, "malformed JSON: %v", err)
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return describeDecodeError(err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return fleet.Errorf(fleet.CodeInvalid, "malformed JSON: data after the top-level value")
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
			return fleet.Errorf(fleet.CodeInvalid, "the request must be a JSON object, got %s", typeErr.Value)
		}
		return fleet.Errorf(fleet.CodeInvalid, "field %s: expected %s, got %s", field, typeErr.Type, typeErr.Value)
	case errors.As(err, &syntaxErr):
		return fleet.Errorf(fleet.CodeInvalid, "malformed JSON at byte %d: %v", syntaxErr.Offset, syntaxErr)
	case strings.HasPrefix(err.Error(), "json: unknown field "):
		return fleet.Errorf(fleet.CodeInvalid, "unknown field %s", strings.TrimPrefix(err.Error(), "json: unknown field "))
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return fleet.Errorf(fleet.CodeInvalid, "malformed JSON: unexpected end of input")
	default:
		return fleet.Errorf(fleet.CodeInvalid, "malformed JSON: %v", err)
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
			return fleet.Errorf(fleet.CodeInvalid, "document id %q may hold only letters, digits, '-', '_' and '.'", id)
		}
	}
	if id == "." || id == ".." {
		return fleet.Errorf(fleet.CodeInvalid, "document id %q is reserved", id)
	}
	return nil
}

// validateCaller checks the adapter-supplied caller.
func validateCaller(c fleet.Caller) error {
	if err := validateKey("caller", c.ID, MaxCallerBytes); err != nil {
		return err
	}
	if len(c.CredentialSHA256) != 64 {
		return fleet.Errorf(fleet.CodeInvalid, "caller credential digest must be 64 hex characters")
	}
	if _, err := hex.DecodeString(c.CredentialSHA256); err != nil {
		return fleet.Errorf(fleet.CodeInvalid, "caller credential digest must be hex")
	}
	return nil
}

func validateKey(name, value string, max int) error {
	switch {
	case value == "":
		return fleet.Errorf(fleet.CodeInvalid, "%s must not be empty", name)
	case len(value) > max:
		return fleet.Errorf(fleet.CodeInvalid, "%s is %d bytes; the limit is %d", name, len(value), max)
	}
	for _, c := range value {
		if c < 0x20 || c == 0x7f || c == '\uFFFD' {
			return fleet.Errorf(fleet.CodeInvalid, "%s holds a control character or invalid UTF-8", name)
		}
	}
	return nil
}

// nextVersion refuses to wrap the version counter.
func nextVersion(v int64) (int64, error) {
	if v == math.MaxInt64 {
		return 0, fleet.Errorf(fleet.CodeStateConflict, "document version %d cannot be incremented", v)
	}
	return v + 1, nil
}
