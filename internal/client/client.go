// Package client is the one way Fleet's own programs (workers, fleet-run,
// fleetctl, fleet-bench) call a host: a JSON request with a bearer
// credential, and a non-2xx answer turned into an *Error carrying the
// host's stable error code.
package client

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"

	"github.com/fleet/fleet/internal/wire"
)

// Error is a host's answer with a status other than 2xx.
type Error struct {
	Status  int
	Code    wire.Code // the stable error code, e.g. stale_claim
	Message string
	Body    []byte
	// RetryAfter is the answer's Retry-After header (429, 503), as sent.
	RetryAfter string
}

func (e *Error) Error() string {
	if e.Code == "" {
		// Not a Fleet error body: another server, or a proxy in between.
		body := strings.TrimSpace(string(e.Body))
		if len(body) > 80 {
			body = body[:80] + "…"
		}
		return fmt.Sprintf("%d %s, not a Fleet host's answer: %s", e.Status, http.StatusText(e.Status), wire.EscapeText(body))
	}
	return fmt.Sprintf("%d %s: %s", e.Status, e.Code, e.Message)
}

// IsCode reports whether err is an *Error with the code.
func IsCode(err error, code wire.Code) bool {
	var e *Error
	return errors.As(err, &e) && e.Code == code
}

// Response is a 2xx answer.
type Response struct {
	Status int
	Header http.Header
	Body   []byte
}

// Decode unmarshals the body into out.
func (r Response) Decode(out any) error { return json.Unmarshal(r.Body, out) }

// Encode is a request body as JSON without HTML escaping: a publication's
// text full of < or & would otherwise travel at six times its size.
func Encode(v any) ([]byte, error) {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(b.Bytes(), []byte("\n")), nil
}

// Do sends method path to the host at base. body, when not nil, is sent as
// JSON ([]byte as is); header adds to the request's headers. A transport
// failure is returned as is (a certificate not trusted as
// *CertificateError); an answer outside 2xx as *Error.
func Do(ctx context.Context, hc *http.Client, base, token, method, path string, body any, header http.Header) (Response, error) {
	var rd io.Reader
	switch b := body.(type) {
	case nil:
	case []byte:
		rd = bytes.NewReader(b)
	default:
		data, err := Encode(b)
		if err != nil {
			return Response{}, err
		}
		rd = bytes.NewReader(data)
	}
	req, err := http.NewRequestWithContext(ctx, method, base+path, rd)
	if err != nil {
		return Response{}, err
	}
	for k, vs := range header {
		req.Header[k] = vs
	}
	req.Header.Set("Authorization", "Bearer "+token)
	if rd != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := hc.Do(req)
	if err != nil {
		return Response{}, untrusted(base, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		return Response{}, err
	}
	if resp.StatusCode/100 != 2 {
		var e wire.ErrorBody
		json.Unmarshal(data, &e) // a body that is not ours leaves the code empty; Body keeps it
		return Response{}, &Error{Status: resp.StatusCode, Code: e.Error.Code, Message: e.Error.Message, Body: data,
			RetryAfter: resp.Header.Get("Retry-After")}
	}
	return Response{Status: resp.StatusCode, Header: resp.Header, Body: data}, nil
}
