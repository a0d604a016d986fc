// Package testkit holds the set-up steps tests share, each failing the test
// on error rather than dropping it.
package testkit

import (
	"encoding/json"
	"os"
	"testing"
)

// MustJSON encodes v.
func MustJSON(tb testing.TB, v any) []byte {
	tb.Helper()
	data, err := json.Marshal(v)
	if err != nil {
		tb.Fatalf("encode %T: %v", v, err)
	}
	return data
}

// MustDecode decodes data into v.
func MustDecode(tb testing.TB, data []byte, v any) {
	tb.Helper()
	if err := json.Unmarshal(data, v); err != nil {
		tb.Fatalf("decode %T from %q: %v", v, data, err)
	}
}

// WriteFile writes a file.
func WriteFile(tb testing.TB, path string, data []byte, mode os.FileMode) {
	tb.Helper()
	if err := os.WriteFile(path, data, mode); err != nil {
		tb.Fatal(err)
	}
}
