package wire

import (
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
)

// A worker's text (a failure's reason) is shown to operators beside the
// host's own output. These runes could make it pass for that output when
// printed: control characters (line breaks and tabs included) start a
// line of its own, line and paragraph separators do the same, and format
// characters (bidi overrides and isolates, zero-width characters) change
// what a reader sees from what is stored.
func unsafeRune(r rune) bool {
	return unicode.IsControl(r) || unicode.In(r, unicode.Cf, unicode.Zl, unicode.Zp)
}

// IsPlainText reports whether s is valid UTF-8 on one line, with no
// control, format or separator characters.
func IsPlainText(s string) bool {
	return utf8.ValidString(s) && !strings.ContainsFunc(s, unsafeRune)
}

// EscapeText returns s with each rune IsPlainText refuses written as a Go
// escape (\n, \u202e) and invalid UTF-8 as \x escapes, so that text from
// outside the host prints on one line and reads as what it is.
func EscapeText(s string) string {
	if IsPlainText(s) {
		return s
	}
	var b strings.Builder
	for i, r := range s {
		switch {
		case r == utf8.RuneError && !strings.HasPrefix(s[i:], "\uFFFD"):
			b.WriteString(`\x` + strconv.FormatUint(uint64(s[i]), 16))
		case unsafeRune(r):
			q := strconv.QuoteRuneToASCII(r)
			b.WriteString(q[1 : len(q)-1])
		default:
			b.WriteRune(r)
		}
	}
	return b.String()
}
