package resource

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"strconv"
	"strings"

	"github.com/fleet/fleet/internal/fleet"
	"github.com/fleet/fleet/internal/wire"
)

// checkNumbersExact refuses a body holding a number that RFC 8785 would
// store as another value. Canonical JSON writes each number as the
// shortest form of the nearest 64-bit float, so 12345678901234567891 would
// become 12345678901234567000 and bind alike with every body that differs
// from it only there. A number is kept when its decimal value is exactly
// that of its canonical form (1.50 and 1e2 are; 0.10000000000000001 is
// not), so what is stored means what was sent.
func checkNumbersExact(body []byte) error {
	if !mayBeInexact(body) {
		return nil
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	for {
		tok, err := dec.Token()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return fleet.Errorf(wire.CodeInvalid, "body is not valid JSON: %v", err)
		}
		n, ok := tok.(json.Number)
		if !ok {
			continue
		}
		f, err := strconv.ParseFloat(string(n), 64)
		canonical := strconv.FormatFloat(f, 'e', -1, 64)
		if err != nil || decimalOf(string(n)) != decimalOf(canonical) {
			return fleet.Errorf(wire.CodeInvalid,
				"body: the number %.60s is not exactly a 64-bit float, and canonical JSON (RFC 8785) would store it as another value; send it as a string",
				string(n))
		}
	}
}

// mayBeInexact reports whether body could hold a number a float does not
// hold exactly. Without a run of more than 15 digits, or a digit followed
// by a fraction or an exponent, every number in it is an integer below
// 10^15, which a float holds; most bodies are such, and skip the token
// walk. Strings are passed over (body is valid JSON): a section's body
// names its input's SHA-256 in hex, where a digit before an "e" is the
// rule, not a number.
func mayBeInexact(body []byte) bool {
	run := 0
	inString, escaped := false, false
	for _, c := range body {
		switch {
		case inString:
			switch {
			case escaped:
				escaped = false
			case c == '\\':
				escaped = true
			case c == '"':
				inString = false
			}
		case c == '"':
			inString, run = true, 0
		case c >= '0' && c <= '9':
			if run++; run > 15 {
				return true
			}
		case run > 0 && (c == '.' || c == 'e' || c == 'E'):
			return true
		default:
			run = 0
		}
	}
	return false
}

// decimal is a number's value as digits and exponent, so two texts compare
// without arithmetic (and without big numbers an attacker could choose).
type decimal struct {
	negative bool
	digits   string // significant digits, no leading or trailing zeros; "" for zero
	exponent int    // value = 0.digits × 10^exponent
}

// decimalOf normalizes a JSON number text (already valid JSON).
func decimalOf(s string) decimal {
	var d decimal
	if strings.HasPrefix(s, "-") {
		d.negative, s = true, s[1:]
	}
	exp := 0
	if i := strings.IndexAny(s, "eE"); i >= 0 {
		e, err := strconv.Atoi(strings.TrimPrefix(s[i+1:], "+"))
		if err != nil {
			// An exponent past int: no float's shortest form has one.
			return decimal{digits: "overflow:" + s}
		}
		exp, s = e, s[:i]
	}
	whole, frac, _ := strings.Cut(s, ".")
	digits := whole + frac
	exp += len(whole)
	trimmed := strings.TrimLeft(digits, "0")
	exp -= len(digits) - len(trimmed)
	trimmed = strings.TrimRight(trimmed, "0")
	if trimmed == "" {
		return decimal{} // zero, whatever its sign
	}
	d.digits, d.exponent = trimmed, exp
	return d
}
