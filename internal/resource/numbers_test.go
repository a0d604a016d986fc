package resource

import "testing"

// TestMayBeInexactReadsNumbersOnly: the pre-scan that spares most bodies
// the token walk looks at numbers, not at strings. A section's body names
// its input's SHA-256 in hex, where a digit followed by an "e" is the rule,
// and such a body went the slow way every time.
func TestMayBeInexactReadsNumbersOnly(t *testing.T) {
	for body, want := range map[string]bool{
		`{"input_sha256":"3e4f09c1e2"}`:           false,
		`{"id":"12345678901234567890"}`:           false,
		`{"quoted":"a\"1.5","n":[1,2,3]}`:         false,
		`{"3.5e":1}`:                              false,
		`{"n":[1,2,3],"words":17}`:                false,
		`{"n":1.5}`:                               true,
		`{"n":1e2}`:                               true,
		`{"n":12345678901234567}`:                 true,
		`{"s":"\\","n":0.5}`:                      true,
		`{"s":"\u0022","n":[2E3]}`:                true,
		`{"h":"3e4f","n":-0.25}`:                  true,
		`{"a":"x\\\"y","b":"1e2","c":[3.0]}`:      true,
		`{"a":"x\\\\","b":"9999999999999999999"}`: false,
	} {
		if got := mayBeInexact([]byte(body)); got != want {
			t.Errorf("mayBeInexact(%s) = %v, want %v", body, got, want)
		}
	}
}

// TestInexactNumberAfterStringsRefused: passing over strings must not pass
// over a number after one, however the string ends (an escaped quote, an
// escaped backslash before its closing quote).
func TestInexactNumberAfterStringsRefused(t *testing.T) {
	for _, body := range []string{
		`{"h":"3e4f","n":12345678901234567891}`,
		`{"s":"a\"b","n":[0.10000000000000001]}`,
		`{"s":"a\\","n":9007199254740993}`,
		`{"s":"\\\"","t":"\u0022","n":{"m":1.00000000000000000001}}`,
	} {
		_, err := DecodePublishRequest([]byte(`{"operation_key":"k","generation":1,"expected_version":0,"body":` + body + `}`))
		if err == nil {
			t.Errorf("%s: taken, want the inexact number refused", body)
		}
	}
}
