// Package fleet holds what every layer of Fleet shares: the error codes that
// the HTTP edge maps to statuses, and the caller identity the trusted adapter
// supplies to the domain packages.
package fleet

import (
	"errors"
	"fmt"
)

// Code is a stable, machine-readable error code. The HTTP layer maps each code
// to one status; clients branch on the code, never on the message.
type Code string

const (
	CodeInvalid            Code = "invalid_request"
	CodeBodyTooLarge       Code = "body_too_large"
	CodeUnauthorized       Code = "unauthorized"
	CodeForbidden          Code = "forbidden"
	CodeNotFound           Code = "not_found"
	CodeStaleClaim         Code = "stale_claim"
	CodeOperationConflict  Code = "operation_conflict"
	CodeAssignmentConflict Code = "assignment_conflict"
	CodeAllowanceConflict  Code = "allowance_conflict"
	CodeStateConflict      Code = "state_conflict"
	CodeUnavailable        Code = "unavailable"
	CodeInternal           Code = "internal"
)

// Error is a domain error with a stable code and a message fit for the caller.
type Error struct {
	Code    Code
	Message string
}

func (e *Error) Error() string { return string(e.Code) + ": " + e.Message }

// Errorf builds an *Error with a formatted message.
func Errorf(code Code, format string, args ...any) *Error {
	return &Error{Code: code, Message: fmt.Sprintf(format, args...)}
}

// ErrorCode returns the code of the first *Error in err's chain, CodeInternal
// for any other non-nil error, and "" for nil.
func ErrorCode(err error) Code {
	if err == nil {
		return ""
	}
	var e *Error
	if errors.As(err, &e) {
		return e.Code
	}
	return CodeInternal
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
