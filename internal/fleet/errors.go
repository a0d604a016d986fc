// Package fleet holds what every layer of Fleet shares: the error type the
// HTTP edge maps to statuses by its wire.Code, and the caller identity the
// trusted adapter supplies to the host.
package fleet

import (
	"errors"
	"fmt"

	"github.com/fleet/fleet/internal/wire"
)

// Error is a domain error with a stable code and a message fit for the caller.
type Error struct {
	Code    wire.Code
	Message string
}

func (e *Error) Error() string { return string(e.Code) + ": " + e.Message }

// Errorf builds an *Error with a formatted message.
func Errorf(code wire.Code, format string, args ...any) *Error {
	return &Error{Code: code, Message: fmt.Sprintf(format, args...)}
}

// ErrorCode returns the code of the first *Error in err's chain,
// CodeInternal for any other non-nil error, and "" for nil.
func ErrorCode(err error) wire.Code {
	if err == nil {
		return ""
	}
	var e *Error
	if errors.As(err, &e) {
		return e.Code
	}
	return wire.CodeInternal
}

// ErrorMessage returns the message of the first *Error in err's chain, or a
// generic text for internal errors so that internals do not leak to clients.
func ErrorMessage(err error) string {
	var e *Error
	if errors.As(err, &e) {
		return e.Message
	}
	return "internal error"
}
