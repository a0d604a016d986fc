// Package dbutil is what the two backends' Executors share beside their
// SQL: how a failure is named, how no row becomes store.ErrNotFound, and
// how a pending receipt is kept while it waits for its place.
package dbutil

import (
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"

	"github.com/fleet/fleet/internal/store"
	"github.com/fleet/fleet/internal/wire"
)

// Failed wraps err with what was being done to subject ("read job" and the
// operation id). Errors are built only on failure: these calls are the
// serial write path.
func Failed(err error, what, subject string) error {
	if subject != "" {
		what += " " + subject
	}
	return fmt.Errorf("%s: %w", what, err)
}

// One is Failed for a read of one row, with no row made store.ErrNotFound
// (pgx's no-rows error is database/sql's too).
func One(err error, what, subject string) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, sql.ErrNoRows):
		return Failed(store.ErrNotFound, what, subject)
	}
	return Failed(err, what, subject)
}

// Guarded checks a guarded transition's count of rows changed.
func Guarded(changed int64, err error, transition, operationID string) error {
	switch {
	case err != nil:
		return Failed(err, transition, operationID)
	case changed != 1:
		return Failed(store.ErrGuard, transition, operationID)
	}
	return nil
}

// Accounting is the allowance's figures as a row holds them.
func Accounting(allowance, spent, reserved, calls, costPerReport int64) wire.Accounting {
	return wire.Accounting{Allowance: allowance, Spent: spent, Reserved: reserved, Calls: calls,
		CostPerReport: costPerReport, Unit: "credits", Available: allowance - spent - reserved}
}

// EncodePendingReceipt is how a prepared receipt waits in pending_receipts.
func EncodePendingReceipt(r wire.Receipt) (string, error) {
	b, err := json.Marshal(r)
	if err != nil {
		return "", fmt.Errorf("encode pending receipt %s: %w", r.ID, err)
	}
	return string(b), nil
}

// DecodePendingReceipt reads a pending receipt's stored body.
func DecodePendingReceipt(pending int64, body string) (store.PendingReceipt, error) {
	receipt, err := store.DecodeReceipt([]byte(body))
	if err != nil {
		return store.PendingReceipt{Pending: pending}, fmt.Errorf("decode pending receipt %d: %w", pending, err)
	}
	return store.PendingReceipt{Pending: pending, Receipt: receipt}, nil
}

// JobRows is jobs as the JSON array JobInsertMany's statement reads: each
// job an array of operation_id, position, batch_key, section,
// document_id, input_sha256, created_at_ms, max_attempts,
// backoff_base_ms, backoff_cap_ms, expected_sha256, its priority and its
// tenant resolved, waiting_on and dependents, in that order.
func JobRows(jobs []store.JobInsertParams) string {
	rows := NewRows(len(jobs), 240)
	for _, j := range jobs {
		rows.Row().Str(j.OperationID).Int(j.Position).Str(j.BatchKey).Str(j.Section).Str(j.DocumentID).Str(j.InputSHA256).
			Int(j.CreatedAtMS).Int(j.MaxAttempts).Int(j.BackoffBaseMS).Int(j.BackoffCapMS).Str(j.ExpectedSHA256).
			Int(j.PriorityOrDefault()).Str(j.TenantOrDefault()).Int(j.WaitingOn).Int(j.Dependents)
	}
	return rows.String()
}

// JSON is v as a JSON text, for the lists SQLite unpacks with json_each.
func JSON(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		panic(fmt.Sprintf("encode %T: %v", v, err)) // only slices of strings and numbers come here
	}
	return string(b)
}

// Bool is a boolean as the schema's INTEGER column holds it.
func Bool(b bool) int64 {
	if b {
		return 1
	}
	return 0
}

// Raw is a stored JSON text, or nil when empty.
func Raw(s string) []byte {
	if s == "" {
		return nil
	}
	return []byte(s)
}

// Leading reads the leading fields of a row of type R as a P: R's first
// fields must be P's, in P's order, with P's names and types (a query that
// returns a table's columns and then more, where sqlc cannot embed the
// table: a RETURNING, or a common table expression). It panics at once
// when they are not, so a query that drifts from its table fails at the
// first use, in any test, rather than misreading a column.
func Leading[P, R any]() func(*R) P {
	p, r := reflect.TypeFor[P](), reflect.TypeFor[R]()
	if p.Kind() != reflect.Struct || r.Kind() != reflect.Struct || r.NumField() < p.NumField() {
		panic(fmt.Sprintf("dbutil.Leading: %s does not lead with the fields of %s", r, p))
	}
	for i := range p.NumField() {
		pf, rf := p.Field(i), r.Field(i)
		if pf.Name != rf.Name || pf.Type != rf.Type {
			panic(fmt.Sprintf("dbutil.Leading: field %d of %s is %s %s, not %s's %s %s", i, r, rf.Name, rf.Type, p, pf.Name, pf.Type))
		}
	}
	n := p.NumField()
	return func(row *R) P {
		var out P
		src, dst := reflect.ValueOf(row).Elem(), reflect.ValueOf(&out).Elem()
		for i := range n {
			dst.Field(i).Set(src.Field(i))
		}
		return out
	}
}

// DependencyRows is dependencies as the JSON array
// JobDependencyInsertMany's statement reads: each [operation_id,
// depends_on].
func DependencyRows(deps []store.JobDependency) string {
	rows := make([][2]string, len(deps))
	for i, d := range deps {
		rows[i] = [2]string{d.OperationID, d.DependsOn}
	}
	return JSON(rows)
}

// SavedCounts reads a job_counts row: its counts are a JSON object.
func SavedCounts(takenMS int64, counts string, err error) (store.SavedCounts, error) {
	if err != nil {
		return store.SavedCounts{}, One(err, "read the saved job counts", "")
	}
	c := store.SavedCounts{TakenMS: takenMS}
	if err := json.Unmarshal([]byte(counts), &c.Counts); err != nil {
		return store.SavedCounts{}, fmt.Errorf("read the saved job counts: %w", err)
	}
	return c, nil
}
