package dbutil

import (
	"strings"
	"testing"
)

type leadingJob struct {
	ID    string
	Count int64
}

type leadingRow struct {
	ID    string
	Count int64
	Extra string
}

type driftedRow struct {
	Count int64
	ID    string
}

// TestLeading: a row that leads with a table's fields reads as the table's
// row; one whose fields drifted (another order, a missing field) panics as
// soon as it is declared, naming the field.
func TestLeading(t *testing.T) {
	read := Leading[leadingJob, leadingRow]()
	if got := read(&leadingRow{ID: "a", Count: 7, Extra: "x"}); got != (leadingJob{ID: "a", Count: 7}) {
		t.Fatalf("read %+v", got)
	}
	for name, declare := range map[string]func(){
		"another order": func() { Leading[leadingJob, driftedRow]() },
		"fewer fields":  func() { Leading[leadingRow, leadingJob]() },
	} {
		func() {
			defer func() {
				if r := recover(); r == nil || !strings.Contains(r.(string), "dbutil.Leading") {
					t.Errorf("%s: no panic naming the drift: %v", name, r)
				}
			}()
			declare()
		}()
	}
}

func BenchmarkLeading(b *testing.B) {
	read := Leading[leadingJob, leadingRow]()
	row := leadingRow{ID: "a", Count: 7}
	for b.Loop() {
		_ = read(&row)
	}
}
