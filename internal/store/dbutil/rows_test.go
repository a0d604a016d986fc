package dbutil

import (
	"encoding/json"
	"math"
	"math/rand/v2"
	"reflect"
	"testing"
)

// rowValues are rows of strings and integers as json.Marshal wrote them
// for the multi-row statements, with the strings that need escaping:
// quotes, backslashes, control characters, HTML, the line separators
// JavaScript reads as newlines, multi-byte runes and invalid UTF-8.
func rowValues(rng *rand.Rand) [][]any {
	pieces := []string{"", "a", "op-7", `"`, `\`, "\n", "\t", "\x00", "\x1f", "<b>&amp;</b>", "\u2028", "\u2029", "é", "世界",
		"😀", "\xff", "\xc3", "a\xe2\x82", "worker-1's publication of summary", `{"k":[1,2]}`}
	rows := make([][]any, rng.IntN(8))
	for i := range rows {
		row := make([]any, 1+rng.IntN(9))
		for j := range row {
			if rng.IntN(2) == 0 {
				row[j] = []int64{0, 1, -1, 42, math.MaxInt64, math.MinInt64, 1700000000123}[rng.IntN(7)]
				continue
			}
			s := ""
			for range rng.IntN(4) {
				s += pieces[rng.IntN(len(pieces))]
			}
			row[j] = s
		}
		rows[i] = row
	}
	return rows
}

func decode(t *testing.T, text string) any {
	t.Helper()
	var v any
	if err := json.Unmarshal([]byte(text), &v); err != nil {
		t.Fatalf("%q is not JSON: %v", text, err)
	}
	return v
}

// TestRowsAsMarshal: what Rows writes reads back as what json.Marshal
// wrote for the same rows, value for value, for 2,000 random sets of rows;
// so does Strings against JSON.
func TestRowsAsMarshal(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for range 2000 {
		rows := rowValues(rng)
		w := NewRows(len(rows), 16)
		var strs []string
		for _, row := range rows {
			w.Row()
			for _, v := range row {
				switch v := v.(type) {
				case int64:
					w.Int(v)
				case string:
					w.Str(v)
					strs = append(strs, v)
				}
			}
		}
		if got, want := decode(t, w.String()), decode(t, JSON(rows)); !reflect.DeepEqual(got, want) {
			t.Fatalf("rows %q read back as %v, json.Marshal's as %v", rows, got, want)
		}
		if got, want := decode(t, Strings(strs)), decode(t, JSON(append([]string{}, strs...))); !reflect.DeepEqual(got, want) {
			t.Fatalf("strings %q read back as %v, json.Marshal's as %v", strs, got, want)
		}
	}
	if got := NewRows(0, 0).String(); got != "[]" {
		t.Errorf("no rows: %s, want []", got)
	}
	if got := Strings(nil); got != "[]" {
		t.Errorf("no strings: %s, want []", got)
	}
}

// BenchmarkRows: a batch's 96 event rows, written by Rows and by
// json.Marshal of [][]any.
//
//	go test ./internal/store/dbutil -run '^$' -bench Rows -benchmem
func BenchmarkRows(b *testing.B) {
	row := func(i int) []any {
		return []any{int64(1000 + i), int64(1700000000000 + i), "publication.allowed", "worker-17",
			"worker-17's publication of summary: published at version 1", int64(i * 60), int64(60), "0193a3b2-7c4e-7000-8000-000000000001"}
	}
	b.Run("marshal", func(b *testing.B) {
		for b.Loop() {
			rows := make([][]any, 96)
			for i := range rows {
				rows[i] = row(i)
			}
			_ = JSON(rows)
		}
	})
	b.Run("rows", func(b *testing.B) {
		for b.Loop() {
			w := NewRows(96, 160)
			for i := range 96 {
				w.Row().Int(int64(1000 + i)).Int(int64(1700000000000 + i)).Str("publication.allowed").Str("worker-17").
					Str("worker-17's publication of summary: published at version 1").Int(int64(i * 60)).Int(60).
					Str("0193a3b2-7c4e-7000-8000-000000000001")
			}
			_ = w.String()
		}
	})
}
