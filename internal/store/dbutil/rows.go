package dbutil

import (
	"strconv"

	"github.com/go-json-experiment/json/jsontext"
)

// Rows is a JSON array of rows, each an array of integers and strings: the
// rows a multi-row statement unpacks with jsonb_each on SQLite. Written
// directly: json.Marshal of [][]any boxed every value and reflected on
// each, on SQLite's one writer.
type Rows struct {
	b     []byte
	fresh bool // the row has no value yet
}

// NewRows has room for rows of about size bytes each.
func NewRows(rows, size int) *Rows { return &Rows{b: make([]byte, 0, rows*size+2)} }

// Row starts a row.
func (r *Rows) Row() *Rows {
	if len(r.b) == 0 {
		r.b = append(r.b, '[')
	} else {
		r.b = append(r.b, ']', ',')
	}
	r.b = append(r.b, '[')
	r.fresh = true
	return r
}

func (r *Rows) comma() {
	if !r.fresh {
		r.b = append(r.b, ',')
	}
	r.fresh = false
}

// Int adds an integer to the row.
func (r *Rows) Int(v int64) *Rows {
	r.comma()
	r.b = strconv.AppendInt(r.b, v, 10)
	return r
}

// Str adds a string to the row. Invalid UTF-8 becomes U+FFFD, as
// json.Marshal makes it, so the error that says so is not one.
func (r *Rows) Str(s string) *Rows {
	r.comma()
	r.b, _ = jsontext.AppendQuote(r.b, s)
	return r
}

// String is the rows' JSON text.
func (r *Rows) String() string {
	if len(r.b) == 0 {
		return "[]"
	}
	return string(append(r.b, ']', ']'))
}

// Strings is a list of strings as a JSON array, for the lists SQLite
// unpacks with json_each.
func Strings(ss []string) string {
	n := 2
	for _, s := range ss {
		n += len(s) + 3
	}
	b := append(make([]byte, 0, n), '[')
	for i, s := range ss {
		if i > 0 {
			b = append(b, ',')
		}
		b, _ = jsontext.AppendQuote(b, s)
	}
	return string(append(b, ']'))
}
