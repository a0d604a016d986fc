package wire

import "testing"

func TestPlainText(t *testing.T) {
	for _, tc := range []struct {
		in, escaped string
		plain       bool
	}{
		{"model answered 500", "model answered 500", true},
		{"naïve — 日本語 «non»", "naïve — 日本語 «non»", true},
		{"a\nb", `a\nb`, false},
		{"a\r\n  99  fleet.completed", `a\r\n  99  fleet.completed`, false},
		{"tab\there", `tab\there`, false},
		{"evil \u202egnp.exe", `evil \u202egnp.exe`, false},
		{"zero\u200bwidth", `zero\u200bwidth`, false},
		{"line\u2028sep", `line\u2028sep`, false},
		{"bad \xff byte", `bad \xff byte`, false},
		{"a real \uFFFD stays", "a real \uFFFD stays", true},
	} {
		if got := IsPlainText(tc.in); got != tc.plain {
			t.Errorf("IsPlainText(%q) = %v, want %v", tc.in, got, tc.plain)
		}
		if got := EscapeText(tc.in); got != tc.escaped {
			t.Errorf("EscapeText(%q) = %q, want %q", tc.in, got, tc.escaped)
		}
	}
}
