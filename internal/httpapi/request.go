package httpapi

import (
	"bytes"
	"errors"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/labstack/echo/v4"

	"github.com/fleet/fleet/internal/fleet"
	"github.com/fleet/fleet/internal/resource"
	"github.com/fleet/fleet/internal/wire"
)

// What a request carries besides its caller: its body, read under the
// route's limit and the host's body memory, decoded strictly; the ids in
// its path; the Fleet-Repeat header.

// readBody reads the whole body, refusing one over MaxBodyBytes.
func readBody(c echo.Context) ([]byte, error) { return readBodyUpTo(c, MaxBodyBytes) }

// readBodyUpTo reads the whole body, refusing one over limit bytes.
func readBodyUpTo(c echo.Context, limit int64) ([]byte, error) {
	data, err := bodyRead(c, limit)
	if fleet.ErrorCode(err) == wire.CodeUnavailable {
		return nil, err // no room in the host's body memory
	}
	if err == nil {
		// The whole body is in: lift bodyDeadline's read deadline, which
		// would otherwise end the request's context when the server starts
		// watching the idle connection. (After a failed read it stays, so
		// the server's discarding of the rest fails fast too.)
		_ = http.NewResponseController(c.Response()).SetReadDeadline(time.Time{})
	}
	var tooLarge *http.MaxBytesError
	if errors.As(err, &tooLarge) {
		return nil, fleet.Errorf(wire.CodeBodyTooLarge, "request body is over %d bytes", limit)
	}
	var timeout net.Error
	if errors.As(err, &timeout) && timeout.Timeout() {
		return nil, fleet.Errorf(wire.CodeRequestTimeout, "read request body: the body did not arrive in time; send it again")
	}
	if err != nil {
		return nil, fleet.Errorf(wire.CodeInvalid, "read request body: %v", err)
	}
	return data, nil
}

// decode reads a JSON body strictly into v.
func decode(c echo.Context, v any) error {
	data, err := readBody(c)
	if err != nil {
		return err
	}
	return resource.DecodeStrict(data, v)
}

// operationID validates the :op path parameter as a canonical UUID.
func operationID(c echo.Context) (string, error) { return canonicalOperationID(c.Param("op")) }

// canonicalOperationID refuses an operation id that is not a canonical UUID.
func canonicalOperationID(op string) (string, error) {
	id, err := uuid.Parse(op)
	if err != nil || id.String() != op {
		return "", fleet.Errorf(wire.CodeInvalid, "operation id %.80q is not a canonical UUID", op)
	}
	return op, nil
}

func documentID(c echo.Context) (string, error) {
	id := c.Param("id")
	return id, resource.ValidateDocumentID(id)
}

func decodeClaimRef(c echo.Context) (wire.ClaimRef, error) {
	data, err := readBody(c)
	if err != nil {
		return wire.ClaimRef{}, err
	}
	return claimRefFrom(data)
}

// claimRefFrom decodes a claim reference (dispatch, heartbeat) strictly.
func claimRefFrom(data []byte) (wire.ClaimRef, error) {
	return claimRefDecoded(data, resource.DecodeStrict)
}

// claimRefDecoded decodes a claim reference with decode.
func claimRefDecoded(data []byte, decode func([]byte, any) error) (wire.ClaimRef, error) {
	var raw struct {
		ClaimID    *string `json:"claim_id"`
		Generation *int64  `json:"generation"`
	}
	if err := decode(data, &raw); err != nil {
		return wire.ClaimRef{}, err
	}
	switch {
	case raw.ClaimID == nil || *raw.ClaimID == "":
		return wire.ClaimRef{}, fleet.Errorf(wire.CodeInvalid, "claim_id is required")
	case len(*raw.ClaimID) > 128:
		return wire.ClaimRef{}, fleet.Errorf(wire.CodeInvalid, "claim_id is over 128 bytes")
	case raw.Generation == nil:
		return wire.ClaimRef{}, fleet.Errorf(wire.CodeInvalid, "generation is required")
	case *raw.Generation < 0:
		return wire.ClaimRef{}, fleet.Errorf(wire.CodeInvalid, "generation must be >= 0")
	}
	return wire.ClaimRef{ClaimID: *raw.ClaimID, Generation: *raw.Generation}, nil
}

// emptyBody refuses a body on a route that takes none (an empty object is
// allowed), so nothing a client sends is silently ignored.
func emptyBody(c echo.Context) error {
	data, err := readBody(c)
	if err != nil || len(bytes.TrimSpace(data)) == 0 {
		return err
	}
	var none struct{}
	return resource.DecodeStrict(data, &none)
}

// repeatHeader reads Fleet-Repeat: "true" marks a request sent again,
// "false" or none a first send; anything else is refused rather than
// guessed at, since a repeated claim answers other jobs than a new one.
func repeatHeader(c echo.Context) (bool, error) {
	values := c.Request().Header.Values(wire.HeaderRepeat)
	switch {
	case len(values) == 0:
		return false, nil
	case len(values) == 1 && values[0] == "true":
		return true, nil
	case len(values) == 1 && values[0] == "false":
		return false, nil
	}
	return false, fleet.Errorf(wire.CodeInvalid, "header %s must be true or false, got %.40q", wire.HeaderRepeat, strings.Join(values, ", "))
}
