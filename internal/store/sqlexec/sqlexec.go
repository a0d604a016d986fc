// Package sqlexec runs the named operations of store.Executor over a
// Querier (database/sql on SQLite, pgx on PostgreSQL), given the SQL of one
// backend. The SQL itself lives beside each backend (internal/store/sqlite,
// internal/store/postgres), which fills in Queries and may override any
// operation by embedding Conn; this package only binds arguments and scans
// rows, the part both backends share.
package sqlexec

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/fleet/fleet/internal/store"
	"github.com/fleet/fleet/internal/wire"
)

// Queries is a backend's SQL, one statement per operation. Statements take
// $N placeholders. A job row is, in order: operation_id, position,
// batch_key, section, document_id, input_sha256, state, generation, owner,
// worker, claim_id, lease_expires_at_ms, reserved, admission_claim_id,
// admission, outcome, reason, created_at_ms, updated_at_ms, the
// document's version, claim_host, reserve_shard, attempts, max_attempts,
// backoff_base_ms, backoff_cap_ms, claimable_at_ms and last_error;
// JobNextQueued adds the batch's
// document after it. An accounting
// row is allowance, spent, reserved, calls, cost_per_report.
type Queries struct {
	LockLog    string // "" when the backend has one writer
	TryLockLog string // returns whether it took the lock; "" when the backend has one writer
	Savepoint  string // prefix of "SAVEPOINT name"
	RollbackTo string // prefix of "ROLLBACK TO name"

	SettingList, SettingPut                                                                    string
	HostGet, HostList, HostPut, HostSeen, HostRetire                                           string
	KernelInsert, KernelGet                                                                    string
	CredentialInsert, CredentialGet, CredentialList, CredentialUpdate                          string
	AccountingInsert, AccountingGet, AccountingGetForUpdate                                    string
	AccountingReserve, AccountingMove, AccountingSetAllowance                                  string
	BatchInsert, BatchGet                                                                      string
	JobMaxPosition, JobInsert, JobGet, JobGetForUpdate                                         string
	JobNextQueued, JobUpdate, JobList, JobListByBatch                                          string
	JobListExpired, JobListExpiredForUpdate, JobListClaimedBy, JobListClaimedUnder, JobPending string
	JobCountByState                                                                            string
	JobPage                                                                                    string // job columns FROM …; JobPage adds WHERE, ORDER BY and LIMIT
	DocumentInsert, DocumentGet, DocumentGetForUpdate                                          string
	DocumentSetOwner, DocumentSetOwnerIfGeneration, DocumentWrite                              string
	AssignmentInsert, AssignmentList                                                           string
	AttemptInsert, AttemptList                                                                 string
	MutationInsert, MutationList, MutationCount, MutationTotal                                 string
	MutationCountByDocument, MutationRepeatedOperations                                        string
	OperationGet, OperationCountDelivery, OperationInsert                                      string
	OperationList                                                                              string
	ReceiptHead, ReceiptInsert, ReceiptGet, ReceiptList                                        string
	ReceiptListByOperation, ReceiptNewestByOperation                                           string
	EventInsert, EventList, EventHead, EventLast                                               string
	PendingEventInsert, PendingReceiptInsert                                                   string
	PendingEventList, PendingReceiptList                                                       string
	PendingEventDelete, PendingReceiptDelete                                                   string // "... IN ", a list follows
	PendingEventLeft, PendingReceiptLeft                                                       string // "... IN ", a list follows
	ReceiptGetMany                                                                             string // "... IN ", a list follows, then ORDER BY sequence
	ReceiptIDsOf                                                                               string // "... IN ", a list follows, then ORDER BY sequence
}

// Rows is a query's result, read row by row.
type Rows interface {
	Next() bool
	Scan(dest ...any) error
	Err() error
	Close()
}

// Row is a query's first row; Scan reports sql.ErrNoRows when there is none.
type Row interface {
	Scan(dest ...any) error
}

// Querier runs one transaction's statements.
type Querier interface {
	// Exec runs a statement whose result the caller does not read. A
	// backend may hold it back and send it with the next query or the
	// commit (one round trip for several statements); its error is then
	// reported by that call, and the transaction is lost with it.
	Exec(ctx context.Context, query string, args ...any) error
	// ExecCount runs a statement now and reports how many rows it changed.
	ExecCount(ctx context.Context, query string, args ...any) (int64, error)
	Query(ctx context.Context, query string, args ...any) (Rows, error)
	QueryRow(ctx context.Context, query string, args ...any) Row
	Commit() error
	Rollback() error
}

// StdQuerier is a database/sql transaction, or a wrapper of one that
// caches statements.
type StdQuerier interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// Std runs a transaction's statements through database/sql, each as it is
// called.
type Std struct {
	DB StdQuerier
	Tx *sql.Tx
}

func (s Std) Exec(ctx context.Context, query string, args ...any) error {
	_, err := s.DB.ExecContext(ctx, query, args...)
	return err
}

func (s Std) ExecCount(ctx context.Context, query string, args ...any) (int64, error) {
	res, err := s.DB.ExecContext(ctx, query, args...)
	if err != nil {
		return 0, err
	}
	return res.RowsAffected()
}

func (s Std) Query(ctx context.Context, query string, args ...any) (Rows, error) {
	rows, err := s.DB.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	return stdRows{rows}, nil
}

func (s Std) QueryRow(ctx context.Context, query string, args ...any) Row {
	return s.DB.QueryRowContext(ctx, query, args...)
}

func (s Std) Commit() error   { return s.Tx.Commit() }
func (s Std) Rollback() error { return s.Tx.Rollback() }

type stdRows struct{ *sql.Rows }

func (r stdRows) Close() { r.Rows.Close() }

// Conn is a store.Conn over one transaction.
type Conn struct {
	Q  *Queries
	DB Querier
}

var _ store.Conn = (*Conn)(nil)

// Errors name what failed and its subject ("read job" and the operation
// id); they are built only on failure, since these calls are the serial
// write path.

// failed wraps err with what was being done to subject.
func failed(err error, what, subject string) error {
	if subject != "" {
		what += " " + subject
	}
	return fmt.Errorf("%s: %w", what, err)
}

func (c *Conn) exec(ctx context.Context, what, subject, query string, args ...any) error {
	if err := c.DB.Exec(ctx, query, args...); err != nil {
		return failed(err, what, subject)
	}
	return nil
}

// one maps no row to store.ErrNotFound.
func one(err error, what, subject string) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, sql.ErrNoRows):
		return failed(store.ErrNotFound, what, subject)
	}
	return failed(err, what, subject)
}

// each scans every row of a query with scan.
func each(ctx context.Context, db Querier, what, subject, query string, scan func(Rows) error, args ...any) error {
	rows, err := db.Query(ctx, query, args...)
	if err != nil {
		return failed(err, what, subject)
	}
	defer rows.Close()
	for rows.Next() {
		if err := scan(rows); err != nil {
			return failed(err, what, subject)
		}
	}
	if err := rows.Err(); err != nil {
		return failed(err, what, subject)
	}
	return nil
}

func (c *Conn) Savepoint(ctx context.Context, name string) error {
	return c.exec(ctx, "savepoint", "", c.Q.Savepoint+name)
}

func (c *Conn) RollbackTo(ctx context.Context, name string) error {
	return c.exec(ctx, "roll back to savepoint", "", c.Q.RollbackTo+name)
}

func (c *Conn) Commit() error   { return c.DB.Commit() }
func (c *Conn) Rollback() error { return c.DB.Rollback() }

// maxRowsPerInsert keeps a multi-row INSERT's parameters well under
// SQLite's limit (32,766) and PostgreSQL's (65,535).
const maxRowsPerInsert = 500

// insertMany writes n rows of width values each as few multi-row INSERTs
// as it can: prefix is the statement up to VALUES, and fill sets row i's
// values. Statement texts repeat (one per row count), so they cache.
func (c *Conn) insertMany(ctx context.Context, what, prefix string, width, n int, fill func(i int, row []any)) error {
	for start := 0; start < n; start += maxRowsPerInsert {
		rows := min(n-start, maxRowsPerInsert)
		args := make([]any, rows*width)
		var q strings.Builder
		q.WriteString(prefix)
		for i := range rows {
			fill(start+i, args[i*width:(i+1)*width])
			if i > 0 {
				q.WriteByte(',')
			}
			q.WriteByte('(')
			for k := range width {
				if k > 0 {
					q.WriteByte(',')
				}
				q.WriteByte('$')
				q.WriteString(strconv.Itoa(i*width + k + 1))
			}
			q.WriteByte(')')
		}
		if err := c.exec(ctx, what, "", q.String(), args...); err != nil {
			return err
		}
	}
	return nil
}

func (c *Conn) LockLog(ctx context.Context) error {
	if c.Q.LockLog == "" {
		return nil
	}
	return c.exec(ctx, "lock the log", "", c.Q.LockLog)
}

func (c *Conn) TryLockLog(ctx context.Context) (bool, error) {
	if c.Q.TryLockLog == "" {
		return true, nil
	}
	var ok bool
	err := c.DB.QueryRow(ctx, c.Q.TryLockLog).Scan(&ok)
	return ok, one(err, "try the log lock", "")
}

func (c *Conn) SettingList(ctx context.Context) (map[string]string, error) {
	out := map[string]string{}
	err := each(ctx, c.DB, "read settings", "", c.Q.SettingList, func(r Rows) error {
		var k, v string
		err := r.Scan(&k, &v)
		out[k] = v
		return err
	})
	return out, err
}

func (c *Conn) SettingPut(ctx context.Context, name, value string) error {
	return c.exec(ctx, "write setting", name, c.Q.SettingPut, name, value)
}

func scanHost(row interface{ Scan(...any) error }) (store.Host, error) {
	var h store.Host
	var serving int64
	err := row.Scan(&h.ID, &h.Instance, &h.URL, &h.StartedAtMS, &h.SeenAtMS, &serving)
	h.Serving = serving == 1
	return h, err
}

func (c *Conn) HostGet(ctx context.Context, id string) (store.Host, error) {
	h, err := scanHost(c.DB.QueryRow(ctx, c.Q.HostGet, id))
	return h, one(err, "read host", id)
}

func (c *Conn) HostList(ctx context.Context) ([]store.Host, error) {
	var out []store.Host
	err := each(ctx, c.DB, "list hosts", "", c.Q.HostList, func(r Rows) error {
		h, err := scanHost(r)
		out = append(out, h)
		return err
	})
	return out, err
}

func (c *Conn) HostPut(ctx context.Context, h store.Host) error {
	serving := 0
	if h.Serving {
		serving = 1
	}
	return c.exec(ctx, "record host", h.ID, c.Q.HostPut, h.ID, h.Instance, h.URL, h.StartedAtMS, h.SeenAtMS, serving)
}

func (c *Conn) HostSeen(ctx context.Context, id, instance string, atMS int64) (found, serving bool, err error) {
	var s int64
	switch err := c.DB.QueryRow(ctx, c.Q.HostSeen, atMS, id, instance).Scan(&s); {
	case errors.Is(err, sql.ErrNoRows):
		return false, false, nil
	case err != nil:
		return false, false, failed(err, "renew host", id)
	}
	return true, s == 1, nil
}

func (c *Conn) HostRetire(ctx context.Context, h store.Host) (bool, error) {
	n, err := c.DB.ExecCount(ctx, c.Q.HostRetire, h.ID, h.Instance, h.SeenAtMS)
	if err != nil {
		return false, failed(err, "retire host", h.ID)
	}
	return n == 1, nil
}

func (c *Conn) KernelInsert(ctx context.Context, publicKey string, seed []byte, atMS int64) error {
	return c.exec(ctx, "save kernel key", "", c.Q.KernelInsert, publicKey, seed, atMS)
}

func (c *Conn) KernelGet(ctx context.Context) (string, []byte, error) {
	var pub string
	var seed []byte
	err := c.DB.QueryRow(ctx, c.Q.KernelGet).Scan(&pub, &seed)
	return pub, seed, one(err, "load kernel key", "")
}

func (c *Conn) CredentialInsert(ctx context.Context, cr store.Credential) error {
	return c.exec(ctx, "record credential", cr.Name, c.Q.CredentialInsert, cr.Name, cr.Role, cr.SHA256, cr.CreatedMS)
}

func (c *Conn) CredentialGet(ctx context.Context, name string) (store.Credential, error) {
	cr := store.Credential{Name: name}
	err := c.DB.QueryRow(ctx, c.Q.CredentialGet, name).Scan(&cr.Role, &cr.SHA256, &cr.CreatedMS, &cr.RevokedMS)
	return cr, one(err, "read credential", name)
}

func (c *Conn) CredentialList(ctx context.Context) ([]store.Credential, error) {
	var out []store.Credential
	err := each(ctx, c.DB, "list credentials", "", c.Q.CredentialList, func(r Rows) error {
		var cr store.Credential
		err := r.Scan(&cr.Name, &cr.Role, &cr.SHA256, &cr.CreatedMS, &cr.RevokedMS)
		out = append(out, cr)
		return err
	})
	return out, err
}

func (c *Conn) CredentialUpdate(ctx context.Context, cr store.Credential) error {
	n, err := c.DB.ExecCount(ctx, c.Q.CredentialUpdate, cr.SHA256, cr.RevokedMS, cr.Name)
	if err != nil {
		return failed(err, "update credential", cr.Name)
	}
	if n != 1 {
		return failed(store.ErrNotFound, "update credential", cr.Name)
	}
	return nil
}

func (c *Conn) AccountingInsert(ctx context.Context, allowance, costPerReport int64) error {
	return c.exec(ctx, "init accounting", "", c.Q.AccountingInsert, allowance, costPerReport)
}

func scanAccounting(row Row) (wire.Accounting, error) {
	a := wire.Accounting{Unit: "credits"}
	err := row.Scan(&a.Allowance, &a.Spent, &a.Reserved, &a.Calls, &a.CostPerReport)
	a.Available = a.Allowance - a.Spent - a.Reserved
	return a, err
}

func (c *Conn) AccountingGet(ctx context.Context, lock store.Lock) (wire.Accounting, error) {
	q := c.Q.AccountingGet
	if lock {
		q = c.Q.AccountingGetForUpdate
	}
	a, err := scanAccounting(c.DB.QueryRow(ctx, q))
	return a, one(err, "read accounting", "")
}

// guarded reads the accounting a guarded UPDATE … RETURNING wrote; no row
// means the guard refused, and the accounting is read as it stands.
func (c *Conn) guarded(ctx context.Context, what, subject string, row Row) (wire.Accounting, bool, error) {
	a, err := scanAccounting(row)
	if errors.Is(err, sql.ErrNoRows) {
		a, err = c.AccountingGet(ctx, store.ForUpdate)
		return a, false, err
	}
	if err != nil {
		return a, false, failed(err, what, subject)
	}
	return a, true, nil
}

// AccountingReserve reserves on the one accounting row, shard 0.
func (c *Conn) AccountingReserve(ctx context.Context) (wire.Accounting, int64, bool, error) {
	a, ok, err := c.guarded(ctx, "reserve", "", c.DB.QueryRow(ctx, c.Q.AccountingReserve))
	return a, 0, ok, err
}

func (c *Conn) AccountingMove(ctx context.Context, _ int64, fromReserved, toSpent int64) (wire.Accounting, bool, error) {
	return c.guarded(ctx, "settle credits", "",
		c.DB.QueryRow(ctx, c.Q.AccountingMove, fromReserved, toSpent))
}

func (c *Conn) AccountingSetAllowance(ctx context.Context, allowance int64) (wire.Accounting, error) {
	a, err := scanAccounting(c.DB.QueryRow(ctx, c.Q.AccountingSetAllowance, allowance))
	return a, one(err, "set allowance", "")
}

func (c *Conn) BatchInsert(ctx context.Context, b store.Batch) error {
	return c.exec(ctx, "record batch", b.Key, c.Q.BatchInsert, b.Key, b.RequestSHA256, b.Document, b.CreatedMS)
}

func (c *Conn) BatchGet(ctx context.Context, key string) (store.Batch, error) {
	b := store.Batch{Key: key}
	err := c.DB.QueryRow(ctx, c.Q.BatchGet, key).Scan(&b.RequestSHA256, &b.Document, &b.CreatedMS)
	return b, one(err, "read batch", key)
}

func (c *Conn) JobMaxPosition(ctx context.Context) (int64, error) {
	var n int64
	err := c.DB.QueryRow(ctx, c.Q.JobMaxPosition).Scan(&n)
	return n, one(err, "read queue tail", "")
}

func (c *Conn) JobInsert(ctx context.Context, j wire.Job) error {
	return c.exec(ctx, "enqueue", j.Section, c.Q.JobInsert, j.OperationID, j.Position, j.Batch, j.Section,
		j.DocumentID, j.InputSHA256, string(j.State), j.CreatedAtMS, j.MaxAttempts, j.BackoffBaseMS, j.BackoffCapMS)
}

// scanJob reads a job row (see Queries), and then the extra columns a
// query adds after it.
func scanJob(row interface{ Scan(...any) error }, extra ...any) (wire.Job, error) {
	var j wire.Job
	var admission, outcome string
	err := row.Scan(append([]any{&j.OperationID, &j.Position, &j.Batch, &j.Section, &j.DocumentID, &j.InputSHA256, &j.State,
		&j.Generation, &j.Owner, &j.Worker, &j.ClaimID, &j.LeaseExpiresAtMS, &j.Reserved, &j.AdmissionClaimID,
		&admission, &outcome, &j.Reason, &j.CreatedAtMS, &j.UpdatedAtMS, &j.DocumentVersion, &j.ClaimHost, &j.ReserveShard,
		&j.Attempts, &j.MaxAttempts, &j.BackoffBaseMS, &j.BackoffCapMS, &j.ClaimableAtMS, &j.LastError}, extra...)...)
	if admission != "" {
		j.Admission = json.RawMessage(admission)
	}
	if outcome != "" {
		j.Outcome = json.RawMessage(outcome)
	}
	return j, err
}

func (c *Conn) JobGet(ctx context.Context, op string, lock store.Lock) (wire.Job, error) {
	q := c.Q.JobGet
	if lock {
		q = c.Q.JobGetForUpdate
	}
	j, err := scanJob(c.DB.QueryRow(ctx, q, op))
	return j, one(err, "read job", op)
}

func (c *Conn) JobNextQueued(ctx context.Context, nowMS int64) (wire.Job, wire.Input, error) {
	var in wire.Input
	j, err := scanJob(c.DB.QueryRow(ctx, c.Q.JobNextQueued, nowMS), &in.Document)
	in.Section = j.Section
	return j, in, one(err, "find queued job", "")
}

func (c *Conn) JobUpdate(ctx context.Context, j wire.Job) error {
	return c.exec(ctx, "save job", j.OperationID, c.Q.JobUpdate,
		string(j.State), j.ClaimID, j.Worker, j.LeaseExpiresAtMS, j.Reserved, j.AdmissionClaimID,
		string(j.Admission), j.Reason, j.UpdatedAtMS, j.ClaimHost, j.ReserveShard,
		j.Attempts, j.ClaimableAtMS, j.LastError, j.OperationID)
}

func (c *Conn) jobs(ctx context.Context, query string, args ...any) ([]wire.Job, error) {
	out := []wire.Job{}
	err := each(ctx, c.DB, "list jobs", "", query, func(r Rows) error {
		j, err := scanJob(r)
		out = append(out, j)
		return err
	}, args...)
	return out, err
}

func (c *Conn) JobList(ctx context.Context) ([]wire.Job, error) { return c.jobs(ctx, c.Q.JobList) }

func (c *Conn) JobListExpired(ctx context.Context, nowMS int64, lock store.Lock) ([]wire.Job, error) {
	q := c.Q.JobListExpired
	if lock {
		q = c.Q.JobListExpiredForUpdate
	}
	return c.jobs(ctx, q, nowMS)
}

func (c *Conn) JobListClaimedUnder(ctx context.Context, worker, prefix string) ([]wire.Job, error) {
	return c.jobs(ctx, c.Q.JobListClaimedUnder, worker, prefix)
}

func (c *Conn) JobListClaimedBy(ctx context.Context, hostIDs []string) ([]wire.Job, error) {
	if len(hostIDs) == 0 {
		return []wire.Job{}, nil
	}
	ids, err := json.Marshal(hostIDs) // a JSON array both backends unpack
	if err != nil {
		return nil, err
	}
	return c.jobs(ctx, c.Q.JobListClaimedBy, string(ids))
}

func (c *Conn) JobPage(ctx context.Context, f store.JobFilter, after int64, limit int) ([]wire.Job, error) {
	args := []any{after}
	arg := func(v any) string {
		args = append(args, v)
		return "$" + strconv.Itoa(len(args))
	}
	where := []string{"j.position > $1"}
	if f.State != "" {
		where = append(where, "j.state = "+arg(string(f.State)))
	}
	if f.Section != "" {
		where = append(where, "j.section = "+arg(f.Section))
	}
	if f.Owner != "" {
		where = append(where, "d.owner = "+arg(f.Owner))
	}
	if f.OperationPrefix != "" {
		// Byte for byte on both backends: LIKE ignores case on SQLite, and
		// a range would follow PostgreSQL's collation, which may skip the
		// hyphens. A search scans in queue order; the others use indexes.
		where = append(where, "substr(j.operation_id, 1, "+arg(len(f.OperationPrefix))+") = "+arg(f.OperationPrefix))
	}
	query := c.Q.JobPage + " WHERE " + strings.Join(where, " AND ") + " ORDER BY j.position LIMIT " + arg(limit)
	return c.jobs(ctx, query, args...)
}

func (c *Conn) JobListByBatch(ctx context.Context, key string) ([]string, error) {
	var out []string
	err := each(ctx, c.DB, "list batch", key, c.Q.JobListByBatch, func(r Rows) error {
		var op string
		err := r.Scan(&op)
		out = append(out, op)
		return err
	}, key)
	return out, err
}

func (c *Conn) count(ctx context.Context, what, subject, query string, args ...any) (int64, error) {
	var n int64
	err := c.DB.QueryRow(ctx, query, args...).Scan(&n)
	return n, one(err, what, subject)
}

func (c *Conn) JobPending(ctx context.Context) (bool, error) {
	n, err := c.count(ctx, "read queue status", "", c.Q.JobPending)
	return n > 0, err
}

func (c *Conn) JobCountByState(ctx context.Context) (map[wire.JobState]int64, error) {
	out := map[wire.JobState]int64{}
	err := each(ctx, c.DB, "count jobs", "", c.Q.JobCountByState, func(r Rows) error {
		var s wire.JobState
		var n int64
		err := r.Scan(&s, &n)
		out[s] = n
		return err
	})
	return out, err
}

func (c *Conn) DocumentInsert(ctx context.Context, id string, atMS int64) error {
	return c.exec(ctx, "create document", id, c.Q.DocumentInsert, id, atMS)
}

func (c *Conn) DocumentGet(ctx context.Context, id string, lock store.Lock) (wire.Document, error) {
	q := c.Q.DocumentGet
	if lock {
		q = c.Q.DocumentGetForUpdate
	}
	var d wire.Document
	var body string
	err := c.DB.QueryRow(ctx, q, id).Scan(&d.ID, &d.Version, &d.Generation, &d.Owner, &body)
	d.Body = json.RawMessage(body)
	return d, one(err, "read document", id)
}

func (c *Conn) DocumentSetOwner(ctx context.Context, id string, expected *int64, owner string, atMS int64) (int64, bool, error) {
	var row Row
	if expected != nil {
		row = c.DB.QueryRow(ctx, c.Q.DocumentSetOwnerIfGeneration, owner, atMS, id, *expected)
	} else {
		row = c.DB.QueryRow(ctx, c.Q.DocumentSetOwner, owner, atMS, id)
	}
	var next int64
	err := row.Scan(&next)
	if errors.Is(err, sql.ErrNoRows) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, fmt.Errorf("assign document %s: %w", id, err)
	}
	return next, true, nil
}

func (c *Conn) DocumentWrite(ctx context.Context, id string, body []byte, version, atMS int64) error {
	return c.exec(ctx, "write document", id, c.Q.DocumentWrite, string(body), version, atMS, id)
}

func (c *Conn) AttemptInsert(ctx context.Context, a store.Attempt) error {
	retryable := 0
	if a.Retryable {
		retryable = 1
	}
	return c.exec(ctx, "record attempt of", a.OperationID, c.Q.AttemptInsert, a.OperationID, a.Attempt.Attempt, a.ClaimID,
		a.Worker, a.Generation, a.Reason, retryable, a.Outcome, a.Cost, string(a.Answer), a.AtMS)
}

func (c *Conn) AttemptList(ctx context.Context, operationID string) ([]store.Attempt, error) {
	var out []store.Attempt
	err := each(ctx, c.DB, "list attempts of", operationID, c.Q.AttemptList, func(r Rows) error {
		a := store.Attempt{OperationID: operationID}
		var retryable int64
		var answer string
		err := r.Scan(&a.Attempt.Attempt, &a.ClaimID, &a.Worker, &a.Generation, &a.Reason, &retryable, &a.Outcome, &a.Cost, &answer, &a.AtMS)
		a.Retryable, a.Answer = retryable == 1, []byte(answer)
		out = append(out, a)
		return err
	}, operationID)
	return out, err
}

func (c *Conn) AssignmentInsert(ctx context.Context, a store.Assignment) error {
	return c.exec(ctx, "record assignment of", a.DocumentID, c.Q.AssignmentInsert,
		a.DocumentID, a.Generation, a.Owner, a.Reason, a.AtMS)
}

func (c *Conn) AssignmentList(ctx context.Context, documentID string) ([]store.Assignment, error) {
	var out []store.Assignment
	err := each(ctx, c.DB, "list assignments of", documentID, c.Q.AssignmentList, func(r Rows) error {
		a := store.Assignment{DocumentID: documentID}
		err := r.Scan(&a.Generation, &a.Owner, &a.Reason, &a.AtMS)
		out = append(out, a)
		return err
	}, documentID)
	return out, err
}

func (c *Conn) MutationList(ctx context.Context, documentID string) ([]store.Mutation, error) {
	var out []store.Mutation
	err := each(ctx, c.DB, "list mutations of", documentID, c.Q.MutationList, func(r Rows) error {
		m := store.Mutation{DocumentID: documentID}
		err := r.Scan(&m.Version, &m.OperationKey, &m.Caller, &m.AtMS)
		out = append(out, m)
		return err
	}, documentID)
	return out, err
}

func (c *Conn) MutationInsert(ctx context.Context, m store.Mutation) error {
	return c.exec(ctx, "record mutation of", m.DocumentID, c.Q.MutationInsert,
		m.DocumentID, m.Version, m.OperationKey, m.Caller, m.AtMS)
}

func (c *Conn) MutationCount(ctx context.Context, documentID string) (int64, error) {
	return c.count(ctx, "count mutations of", documentID, c.Q.MutationCount, documentID)
}

func (c *Conn) MutationTotal(ctx context.Context) (int64, error) {
	return c.count(ctx, "count mutations", "", c.Q.MutationTotal)
}

func (c *Conn) MutationCountByDocument(ctx context.Context) (map[string]int64, error) {
	out := map[string]int64{}
	err := each(ctx, c.DB, "count mutations by document", "", c.Q.MutationCountByDocument, func(r Rows) error {
		var doc string
		var n int64
		err := r.Scan(&doc, &n)
		out[doc] = n
		return err
	})
	return out, err
}

func (c *Conn) MutationRepeatedOperations(ctx context.Context) (int64, error) {
	return c.count(ctx, "count repeated mutations", "", c.Q.MutationRepeatedOperations)
}

func (c *Conn) OperationGet(ctx context.Context, documentID, key string) (store.StoredOperation, error) {
	o := store.StoredOperation{Operation: wire.Operation{DocumentID: documentID, OperationKey: key}}
	var binding, outcome string
	err := c.DB.QueryRow(ctx, c.Q.OperationGet, documentID, key).Scan(
		&binding, &o.Caller, &o.Status, &outcome, &o.Deliveries, &o.CreatedMS)
	o.Binding, o.Outcome = []byte(binding), json.RawMessage(outcome)
	return o, one(err, "look up operation", key)
}

func (c *Conn) OperationCountDelivery(ctx context.Context, documentID, key string) error {
	return c.exec(ctx, "count delivery of", key, c.Q.OperationCountDelivery, documentID, key)
}

func (c *Conn) OperationInsert(ctx context.Context, o store.StoredOperation) error {
	return c.exec(ctx, "record operation", o.OperationKey, c.Q.OperationInsert, o.DocumentID, o.OperationKey,
		string(o.Binding), o.Caller, string(o.Status), string(o.Outcome), o.Deliveries, o.CreatedMS)
}

func (c *Conn) OperationList(ctx context.Context, documentID string) ([]wire.Operation, error) {
	out := []wire.Operation{}
	err := each(ctx, c.DB, "list operations of", documentID, c.Q.OperationList, func(r Rows) error {
		var o wire.Operation
		var outcome string
		err := r.Scan(&o.DocumentID, &o.OperationKey, &o.Caller, &o.Status, &outcome, &o.Deliveries)
		o.Outcome = json.RawMessage(outcome)
		out = append(out, o)
		return err
	}, documentID)
	return out, err
}

func (c *Conn) ReceiptHead(ctx context.Context) (int64, string, error) {
	var seq int64
	var id string
	err := c.DB.QueryRow(ctx, c.Q.ReceiptHead).Scan(&seq, &id)
	if errors.Is(err, sql.ErrNoRows) {
		return 0, "", nil
	}
	return seq, id, one(err, "read receipt chain head", "")
}

func (c *Conn) ReceiptInsert(ctx context.Context, receipts []store.StoredReceipt) error {
	return c.insertMany(ctx, "store receipts", c.Q.ReceiptInsert, 5, len(receipts), func(i int, row []any) {
		r := receipts[i]
		row[0], row[1], row[2], row[3], row[4] = r.Receipt.Sequence, r.Receipt.ID, string(r.Receipt.Kind), r.Receipt.OperationID, string(r.Stored)
	})
}

func (c *Conn) ReceiptGet(ctx context.Context, id string) ([]byte, error) {
	var body string
	err := c.DB.QueryRow(ctx, c.Q.ReceiptGet, id).Scan(&body)
	return []byte(body), one(err, "read receipt", id)
}

func (c *Conn) ReceiptList(ctx context.Context, operationID string) ([][]byte, error) {
	query, args := c.Q.ReceiptList, []any{}
	if operationID != "" {
		query, args = c.Q.ReceiptListByOperation, []any{operationID}
	}
	var out [][]byte
	err := each(ctx, c.DB, "list receipts", "", query, func(r Rows) error {
		var body string
		err := r.Scan(&body)
		out = append(out, []byte(body))
		return err
	}, args...)
	return out, err
}

func (c *Conn) ReceiptNewestByOperation(ctx context.Context) (map[string]string, error) {
	out := map[string]string{}
	err := each(ctx, c.DB, "read newest receipts", "", c.Q.ReceiptNewestByOperation, func(r Rows) error {
		var op, id string
		err := r.Scan(&op, &id)
		out[op] = id
		return err
	})
	return out, err
}

func (c *Conn) EventInsert(ctx context.Context, events []wire.Event) error {
	return c.insertMany(ctx, "append events", c.Q.EventInsert, 6, len(events), func(i int, row []any) {
		e := events[i]
		row[0], row[1], row[2], row[3], row[4], row[5] = e.Sequence, e.TimestampMS, string(e.Kind), e.Actor, e.Title, string(e.Data)
	})
}

func (c *Conn) EventLast(ctx context.Context) (int64, error) {
	return c.count(ctx, "read the event log's head", "", c.Q.EventLast)
}

func (c *Conn) EventList(ctx context.Context, after int64, limit int) ([]wire.Event, error) {
	out := []wire.Event{}
	err := each(ctx, c.DB, "list events", "", c.Q.EventList, func(r Rows) error {
		var e wire.Event
		var data string
		err := r.Scan(&e.Sequence, &e.TimestampMS, &e.Kind, &e.Actor, &e.Title, &data)
		e.Data = json.RawMessage(data)
		out = append(out, e)
		return err
	}, after, limit)
	return out, err
}

func (c *Conn) EventHead(ctx context.Context) (int64, int64, error) {
	var count, last int64
	err := c.DB.QueryRow(ctx, c.Q.EventHead).Scan(&count, &last)
	return count, last, one(err, "read event head", "")
}

func (c *Conn) PendingLogInsert(ctx context.Context, events []wire.Event, receipts []wire.Receipt) ([]int64, []int64, error) {
	eventIDs, err := c.insertReturning(ctx, "append pending events", c.Q.PendingEventInsert, 5, len(events), func(i int, row []any) {
		e := events[i]
		row[0], row[1], row[2], row[3], row[4] = e.TimestampMS, string(e.Kind), e.Actor, e.Title, string(e.Data)
	})
	if err != nil {
		return nil, nil, err
	}
	bodies := make([]string, len(receipts))
	for i, r := range receipts {
		b, err := json.Marshal(r)
		if err != nil {
			return nil, nil, fmt.Errorf("encode pending receipt %s: %w", r.ID, err)
		}
		bodies[i] = string(b)
	}
	receiptIDs, err := c.insertReturning(ctx, "append pending receipts", c.Q.PendingReceiptInsert, 2, len(receipts), func(i int, row []any) {
		row[0], row[1] = receipts[i].ID, bodies[i]
	})
	return eventIDs, receiptIDs, err
}

// insertReturning inserts rows one statement at a time, returning each
// row's id in order.
func (c *Conn) insertReturning(ctx context.Context, what, prefix string, width, n int, fill func(i int, row []any)) ([]int64, error) {
	ids := make([]int64, 0, n)
	query := prefix + placeholders(width) + " RETURNING id"
	row := make([]any, width)
	for i := range n {
		fill(i, row)
		var id int64
		if err := c.DB.QueryRow(ctx, query, row...).Scan(&id); err != nil {
			return nil, failed(err, what, "")
		}
		ids = append(ids, id)
	}
	return ids, nil
}

func (c *Conn) PendingLogLeft(ctx context.Context, events, receipts []int64) ([]int64, []int64, error) {
	leftEvents, err := c.idsIn(ctx, "check pending events", c.Q.PendingEventLeft, events)
	if err != nil {
		return nil, nil, err
	}
	leftReceipts, err := c.idsIn(ctx, "check pending receipts", c.Q.PendingReceiptLeft, receipts)
	return leftEvents, leftReceipts, err
}

// idsIn runs prefix ("SELECT id ... WHERE id IN ") over ids and returns
// the ids it finds.
func (c *Conn) idsIn(ctx context.Context, what, prefix string, ids []int64) ([]int64, error) {
	var out []int64
	err := inChunks(ids, func(list string, args []any) error {
		return each(ctx, c.DB, what, "", prefix+list, func(r Rows) error {
			var id int64
			err := r.Scan(&id)
			out = append(out, id)
			return err
		}, args...)
	})
	return out, err
}

// placeholders is "($1,...,$n)".
func placeholders(n int) string {
	var q strings.Builder
	q.WriteByte('(')
	for i := range n {
		if i > 0 {
			q.WriteByte(',')
		}
		q.WriteByte('$')
		q.WriteString(strconv.Itoa(i + 1))
	}
	q.WriteByte(')')
	return q.String()
}

func (c *Conn) ReceiptNewestFor(ctx context.Context, ops []string) (map[string]string, error) {
	out := map[string]string{}
	err := inChunks(ops, func(list string, args []any) error {
		return each(ctx, c.DB, "read newest receipts", "", c.Q.ReceiptIDsOf+list+" ORDER BY sequence", func(r Rows) error {
			var op, id string
			err := r.Scan(&op, &id)
			out[op] = id // later rows are newer
			return err
		}, args...)
	})
	return out, err
}

func (c *Conn) ReceiptGetMany(ctx context.Context, ids []string) ([][]byte, error) {
	var out [][]byte
	err := inChunks(ids, func(list string, args []any) error {
		return each(ctx, c.DB, "read receipts", "", c.Q.ReceiptGetMany+list+" ORDER BY sequence", func(r Rows) error {
			var body string
			err := r.Scan(&body)
			out = append(out, []byte(body))
			return err
		}, args...)
	})
	return out, err
}

func (c *Conn) PendingLogList(ctx context.Context, limit int) (store.PendingLog, error) {
	var p store.PendingLog
	err := each(ctx, c.DB, "list pending events", "", c.Q.PendingEventList, func(r Rows) error {
		var e store.PendingEvent
		var data string
		err := r.Scan(&e.Pending, &e.Event.TimestampMS, &e.Event.Kind, &e.Event.Actor, &e.Event.Title, &data)
		e.Event.Data = json.RawMessage(data)
		p.Events = append(p.Events, e)
		return err
	}, limit)
	if err != nil {
		return p, err
	}
	err = each(ctx, c.DB, "list pending receipts", "", c.Q.PendingReceiptList, func(r Rows) error {
		var pr store.PendingReceipt
		var body string
		if err := r.Scan(&pr.Pending, &body); err != nil {
			return err
		}
		if err := DecodePendingReceipt(body, &pr); err != nil {
			return err
		}
		p.Receipts = append(p.Receipts, pr)
		return nil
	}, limit)
	if err != nil {
		return p, err
	}
	if p.LastEvent, err = c.EventLast(ctx); err != nil {
		return p, err
	}
	p.Head.Sequence, p.Head.ID, err = c.ReceiptHead(ctx)
	return p, err
}

// DecodePendingReceipt reads a pending receipt's stored body.
func DecodePendingReceipt(body string, into *store.PendingReceipt) error {
	if err := json.Unmarshal([]byte(body), &into.Receipt); err != nil {
		return fmt.Errorf("decode pending receipt %d: %w", into.Pending, err)
	}
	return nil
}

func (c *Conn) PendingLogPlace(ctx context.Context, events []wire.Event, receipts []store.StoredReceipt, pendingEvents, pendingReceipts []int64) error {
	if err := c.EventInsert(ctx, events); err != nil {
		return err
	}
	if err := c.ReceiptInsert(ctx, receipts); err != nil {
		return err
	}
	if err := c.deleteMany(ctx, "remove placed events", c.Q.PendingEventDelete, pendingEvents); err != nil {
		return err
	}
	return c.deleteMany(ctx, "remove placed receipts", c.Q.PendingReceiptDelete, pendingReceipts)
}

// deleteMany runs prefix ("DELETE ... WHERE id IN ") over ids, in chunks.
func (c *Conn) deleteMany(ctx context.Context, what, prefix string, ids []int64) error {
	return inChunks(ids, func(list string, args []any) error {
		return c.exec(ctx, what, "", prefix+list, args...)
	})
}

// inChunks calls fn for each run of up to maxRowsPerInsert ids, with their
// placeholder list "($1,...,$n)" and the ids as its arguments.
func inChunks[T any](ids []T, fn func(list string, args []any) error) error {
	for start := 0; start < len(ids); start += maxRowsPerInsert {
		chunk := ids[start:min(len(ids), start+maxRowsPerInsert)]
		args := make([]any, len(chunk))
		for i, id := range chunk {
			args[i] = id
		}
		if err := fn(placeholders(len(chunk)), args); err != nil {
			return err
		}
	}
	return nil
}
