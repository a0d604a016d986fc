package receipts

import (
	"strconv"
	"unicode/utf8"

	"github.com/fleet/fleet/internal/wire"
)

// maxExactInteger is the largest integer an RFC 8785 number (an IEEE 754
// double) holds exactly; past it a generic canonicalizer rounds.
const maxExactInteger = 1 << 53

// canonicalBody writes b as RFC 8785 canonical JSON by construction: the
// keys in their sorted order, integers in decimal, strings escaped as
// ECMAScript's JSON.stringify does. It is what Seal signs and Prepare
// hashes for the id, on the write path, so it avoids the generic
// encode-parse-sort pass; Verify still
// recanonicalizes with that generic pass, and TestCanonicalBodyMatchesJCS
// holds the two equal. ok is false for a body this encoder does not cover
// exactly (an integer beyond 2^53, a string that is not UTF-8), which then
// takes the generic pass.
func canonicalBody(b wire.ReceiptBody) (out []byte, ok bool) {
	if !exactlyEncodable(b) {
		return nil, false
	}
	a := b.Accounting
	out = make([]byte, 0, 512)
	out = append(out, `{"accounting":{"allowance":`...)
	out = strconv.AppendInt(out, a.Allowance, 10)
	out = append(out, `,"available":`...)
	out = strconv.AppendInt(out, a.Available, 10)
	out = append(out, `,"calls":`...)
	out = strconv.AppendInt(out, a.Calls, 10)
	out = append(out, `,"cost_per_report":`...)
	out = strconv.AppendInt(out, a.CostPerReport, 10)
	out = append(out, `,"reserved":`...)
	out = strconv.AppendInt(out, a.Reserved, 10)
	out = append(out, `,"spent":`...)
	out = strconv.AppendInt(out, a.Spent, 10)
	out = append(out, `,"unit":`...)
	out = appendString(out, a.Unit)
	out = append(out, `},"caller":`...)
	out = appendString(out, b.Caller)
	out = append(out, `,"cost":`...)
	out = strconv.AppendInt(out, b.Cost, 10)
	if b.Credential != "" {
		out = append(out, `,"credential":`...)
		out = appendString(out, b.Credential)
	}
	out = append(out, `,"decision":`...)
	out = appendString(out, string(b.Decision))
	out = append(out, `,"issued_at_ms":`...)
	out = strconv.AppendInt(out, b.IssuedAtMS, 10)
	out = append(out, `,"kernel_key":`...)
	out = appendString(out, b.KernelKey)
	out = append(out, `,"kind":`...)
	out = appendString(out, string(b.Kind))
	if b.Level != "" {
		out = append(out, `,"level":`...)
		out = appendString(out, b.Level)
	}
	out = append(out, `,"nonce":`...)
	out = appendString(out, b.Nonce)
	out = append(out, `,"operation_id":`...)
	out = appendString(out, b.OperationID)
	out = append(out, `,"prev":`...)
	if b.Prev == nil {
		out = append(out, "null"...)
	} else {
		out = appendString(out, *b.Prev)
	}
	if b.Pricing != nil {
		out = append(out, `,"pricing":{"model":`...)
		out = appendString(out, b.Pricing.Model)
		out = append(out, `,"priced":`...)
		out = strconv.AppendBool(out, b.Pricing.Priced)
		out = append(out, '}')
	}
	if b.Reserved != nil {
		out = append(out, `,"reserved":`...)
		out = strconv.AppendInt(out, *b.Reserved, 10)
	}
	out = append(out, `,"sequence":`...)
	out = strconv.AppendInt(out, b.Sequence, 10)
	if b.Tenant != "" {
		out = append(out, `,"tenant":`...)
		out = appendString(out, b.Tenant)
	}
	return append(out, '}'), true
}

// exactlyEncodable reports whether canonicalBody writes b as RFC 8785
// does: every string UTF-8, every integer within a double's exact range.
func exactlyEncodable(b wire.ReceiptBody) bool {
	a := b.Accounting
	for _, s := range []string{a.Unit, b.Caller, string(b.Decision), b.KernelKey, string(b.Kind), b.Nonce, b.OperationID, b.Tenant, b.Level, b.Credential} {
		if !utf8.ValidString(s) {
			return false
		}
	}
	if (b.Prev != nil && !utf8.ValidString(*b.Prev)) || (b.Pricing != nil && !utf8.ValidString(b.Pricing.Model)) {
		return false
	}
	for _, n := range []int64{b.Sequence, b.Cost, b.IssuedAtMS, a.Allowance, a.Spent, a.Reserved, a.Available, a.Calls, a.CostPerReport} {
		if n > maxExactInteger || n < -maxExactInteger {
			return false
		}
	}
	return b.Reserved == nil || (*b.Reserved <= maxExactInteger && *b.Reserved >= -maxExactInteger)
}

// appendString appends s as a JSON string the way RFC 8785 (ECMAScript's
// JSON.stringify) escapes it: the quote, the backslash and control
// characters only, with the short escapes where they exist; everything
// else, non-ASCII included, as it is.
func appendString(out []byte, s string) []byte {
	const hex = "0123456789abcdef"
	out = append(out, '"')
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '"' || c == '\\':
			out = append(out, '\\', c)
		case c >= 0x20:
			out = append(out, c)
		case c == '\b':
			out = append(out, '\\', 'b')
		case c == '\f':
			out = append(out, '\\', 'f')
		case c == '\n':
			out = append(out, '\\', 'n')
		case c == '\r':
			out = append(out, '\\', 'r')
		case c == '\t':
			out = append(out, '\\', 't')
		default:
			out = append(out, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xf])
		}
	}
	return append(out, '"')
}
