package postgres

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync/atomic"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fleet/fleet/internal/store/postgres/dbsqlc"
)

// pipeline runs one transaction on a pooled pgx connection in as few round
// trips as its reads allow. It is the DBTX the generated queries run on.
// BEGIN, and every statement whose result the caller does not read (Exec:
// the job transitions, mutation and operation writes, savepoints, the
// placed log), wait and go out in one pipelined batch with the next query
// or with COMMIT. Exec's command tag is therefore empty: a query whose
// count matters returns rows (no query of ours is :execrows). A claim,
// a dispatch or a publication then costs one round trip per read it
// decides on, plus the commit, instead of one per statement.
//
// A held-back statement that fails fails the batch it went out with: the
// query or the commit reports its error (naming the statement), and the
// transaction is lost, as it would have been had it run alone (Fleet never
// recovers from a failed write within a transaction, save through the
// allowance's savepoints, whose guarded statements are queries).
type pipeline struct {
	// ctx is the transaction's, given when it began: every statement and
	// the commit run under it rather than the context a caller passes with
	// each statement (a request's, which its client may end), so a write
	// transaction ends only by its own deadline (store.TxDeadline).
	ctx     context.Context
	conn    *pgxpool.Conn
	begin   string // sent ahead of the first statement; "" for a read of one statement
	begun   bool   // BEGIN has gone out
	held    []heldStatement
	settled bool // committed or rolled back; conn is back in the pool
	// commitNext sends COMMIT right behind the next query, whose rows are
	// read before the commit's outcome (commitErr, once they are closed).
	commitNext bool
	commitErr  error

	roundTrips *atomic.Int64
	// statements counts the transaction's own statements (not BEGIN or
	// COMMIT), for Conn.Statements.
	statements int64
	// plans is the plan_cache_mode the transaction's next statement runs
	// under as far as the pipeline knows: planAuto, the session's, until
	// a statement of statementPlans switches it (plans.go).
	plans planMode
}

type heldStatement struct {
	sql  string
	args []any
	// savepoint names a savepoint held lazily (savepoint): counted as a
	// statement only if it goes out.
	savepoint string
	// switchesPlans marks a switch of the plan mode (planFor).
	switchesPlans bool
}

var _ dbsqlc.DBTX = (*pipeline)(nil)

func (p *pipeline) Exec(_ context.Context, query string, args ...any) (pgconn.CommandTag, error) {
	if p.settled {
		return pgconn.CommandTag{}, errSettled
	}
	p.statements++
	if sw, ok := p.planFor(query); ok {
		p.held = append(p.held, sw)
	}
	p.held = append(p.held, heldStatement{sql: query, args: append([]any(nil), args...)})
	return pgconn.CommandTag{}, nil
}

var errSettled = errors.New("the transaction has already ended")

// send queues what is held (and BEGIN when it has not gone out) ahead of
// tail, sends it all in one round trip, and reads the results of what was
// held. The caller reads tail's results from the returned batch and closes
// it.
func (p *pipeline) send(_ context.Context, tail ...heldStatement) (pgx.BatchResults, error) {
	if p.begun && p.begin == "" {
		return nil, errors.New("a read of one statement sent a second")
	}
	b := &pgx.Batch{}
	ahead := len(p.held)
	if !p.begun && p.begin != "" {
		b.Queue(p.begin)
		ahead++
	}
	for _, h := range p.held {
		if h.savepoint != "" {
			p.statements++
		}
		b.Queue(h.sql, h.args...)
	}
	for _, t := range tail {
		b.Queue(t.sql, t.args...)
	}
	held := p.held
	p.begun, p.held = true, nil
	p.roundTrips.Add(1)
	br := p.conn.SendBatch(p.ctx, b)
	for i := range ahead {
		if _, err := br.Exec(); err != nil {
			br.Close()
			if i == 0 && len(held) < ahead {
				return nil, fmt.Errorf("begin transaction: %w", err)
			}
			return nil, fmt.Errorf("%s: %w", describe(held[i-(ahead-len(held))].sql), err)
		}
	}
	return br, nil
}

// savepoint opens a savepoint lazily. It waits with the held statements
// and goes out with them only if they go out before it is released or
// rolled back to: a batch item whose statements all wait for the commit
// (its reads done ahead) then costs no SAVEPOINT, no RELEASE and no
// subtransaction. PostgreSQL keeps at most 64 subtransaction ids per
// transaction in shared memory; past them every other backend's
// visibility checks go through pg_subtrans, which slows every host.
func (p *pipeline) savepoint(name string) error {
	if p.settled {
		return errSettled
	}
	p.held = append(p.held, heldStatement{sql: "SAVEPOINT " + name, savepoint: name})
	return nil
}

// heldSavepoint is the index in held of the newest savepoint name held
// lazily, or -1 when it went out (or was never opened).
func (p *pipeline) heldSavepoint(name string) int {
	for i := len(p.held) - 1; i >= 0; i-- {
		if p.held[i].savepoint == name {
			return i
		}
	}
	return -1
}

// rollbackTo undoes what was done since the savepoint, which stays open.
// Held lazily, that is dropping what is held after it; gone out, whatever
// is held came after it and is dropped too, and ROLLBACK TO is held.
func (p *pipeline) rollbackTo(name string) error {
	if p.settled {
		return errSettled
	}
	i := p.heldSavepoint(name)
	if i < 0 {
		p.drop(0)
		// ROLLBACK TO also undoes a SET LOCAL made since the savepoint.
		_, err := p.Exec(p.ctx, "ROLLBACK TO SAVEPOINT "+name)
		p.plans = planUnknown
		return err
	}
	p.drop(i + 1)
	return nil
}

// releaseSavepoint closes a savepoint, keeping what was done since, and
// the savepoints opened after it, as RELEASE does.
func (p *pipeline) releaseSavepoint(name string) error {
	if p.settled {
		return errSettled
	}
	i := p.heldSavepoint(name)
	if i < 0 {
		p.held = slices.DeleteFunc(p.held, func(h heldStatement) bool { return h.savepoint != "" })
		_, err := p.Exec(p.ctx, "RELEASE SAVEPOINT "+name)
		return err
	}
	p.held = append(p.held[:i], slices.DeleteFunc(p.held[i+1:], func(h heldStatement) bool { return h.savepoint != "" })...)
	return nil
}

// drop forgets the held statements from index i on: they never ran. If a
// switch of the plan mode is among them, the mode is no longer known.
func (p *pipeline) drop(i int) {
	for _, h := range p.held[i:] {
		if h.savepoint == "" {
			p.statements--
		}
		if h.switchesPlans {
			p.plans = planUnknown
		}
	}
	p.held = p.held[:i]
}

// describe shortens a statement for an error message.
func describe(query string) string {
	const most = 60
	if len(query) > most {
		return query[:most] + "…"
	}
	return query
}

func (p *pipeline) Query(ctx context.Context, query string, args ...any) (pgx.Rows, error) {
	if p.settled {
		return nil, errSettled
	}
	p.statements++
	if sw, ok := p.planFor(query); ok {
		p.held = append(p.held, sw)
	}
	tail := []heldStatement{{sql: query, args: args}}
	commit := p.commitNext
	if commit {
		p.commitNext = false
		p.commitErr = errors.New("commit: the transaction's last query was not read to its end")
		tail = append(tail, heldStatement{sql: "COMMIT"})
	}
	br, err := p.send(ctx, tail...)
	if err != nil {
		if commit {
			p.commitErr = err
			p.release()
		}
		return nil, err
	}
	rows, err := br.Query()
	if err != nil {
		br.Close()
		if commit {
			p.commitErr = err
			p.release()
		}
		return nil, err
	}
	r := &batchRows{Rows: rows, batch: br}
	if commit {
		r.commitOf = p
	}
	return r, nil
}

// batchRows are the last statement's rows of a batch; closing them closes
// the batch, which makes the connection free for the next round trip. In
// a batch that ends with COMMIT (commitOf), closing them reads the
// commit's outcome into the pipeline and gives the connection back.
type batchRows struct {
	pgx.Rows
	batch    pgx.BatchResults
	err      error
	commitOf *pipeline
}

func (r *batchRows) Close() {
	if r.batch == nil {
		return
	}
	r.Rows.Close()
	if p := r.commitOf; p != nil {
		err := r.Rows.Err()
		if err == nil {
			err = committed(r.batch.Exec())
		}
		if closeErr := r.batch.Close(); err == nil {
			err = closeErr
		}
		p.commitErr = err
		p.release()
		r.batch = nil
		return
	}
	r.err = r.batch.Close()
	r.batch = nil
}

// committed reads COMMIT's answer: a transaction an earlier error aborted
// answers ROLLBACK, and no error, and nothing was written.
func committed(tag pgconn.CommandTag, err error) error {
	if err != nil {
		return err
	}
	if tag.String() != "COMMIT" {
		return fmt.Errorf("commit: the transaction was rolled back (%s)", tag.String())
	}
	return nil
}

func (r *batchRows) Err() error {
	if err := r.Rows.Err(); err != nil {
		return err
	}
	return r.err
}

func (p *pipeline) QueryRow(ctx context.Context, query string, args ...any) pgx.Row {
	rows, err := p.Query(ctx, query, args...)
	return firstRow{rows: rows, err: err}
}

// firstRow reads the first row of rows, as database/sql's Row does.
type firstRow struct {
	rows pgx.Rows
	err  error
}

func (r firstRow) Scan(dest ...any) error {
	if r.err != nil {
		return r.err
	}
	defer r.rows.Close()
	if !r.rows.Next() {
		r.rows.Close()
		if err := r.rows.Err(); err != nil {
			return err
		}
		return pgx.ErrNoRows // errors.Is sql.ErrNoRows
	}
	if err := r.rows.Scan(dest...); err != nil {
		return err
	}
	r.rows.Close()
	return r.rows.Err()
}

// Commit sends what is held and COMMIT in one round trip. A transaction
// that sent nothing ends without a word to the server.
func (p *pipeline) Commit() error {
	if p.settled {
		return errSettled
	}
	if (!p.begun || p.begin == "") && len(p.held) == 0 {
		p.release()
		return nil
	}
	return p.commitWith(p.ctx)
}

// commitWith sends what is held, then COMMIT, in one round trip.
func (p *pipeline) commitWith(ctx context.Context) error {
	if p.settled {
		return errSettled
	}
	defer p.release()
	br, err := p.send(ctx, heldStatement{sql: "COMMIT"})
	if err != nil {
		p.endFailed()
		return err
	}
	err = committed(br.Exec())
	if closeErr := br.Close(); err == nil {
		err = closeErr
	}
	return err
}

// Rollback drops what is held and ends the transaction; after Commit it
// does nothing.
func (p *pipeline) Rollback() error {
	if p.settled {
		return nil
	}
	defer p.release()
	p.held = nil
	if !p.begun || p.begin == "" {
		return nil
	}
	p.roundTrips.Add(1)
	_, err := p.conn.Exec(context.Background(), "ROLLBACK")
	return err
}

// endFailed rolls back a transaction that a held statement failed before
// its COMMIT ran, so that its connection goes back to the pool to be used
// again: the pool closes one left inside a transaction, and a new one
// costs the server a process and every statement's plan again.
func (p *pipeline) endFailed() {
	if pc := p.conn.Conn().PgConn(); pc.IsClosed() || pc.TxStatus() == 'I' {
		return
	}
	p.roundTrips.Add(1)
	_, _ = p.conn.Exec(p.ctx, "ROLLBACK") // under the transaction's deadline: a server gone quiet costs the connection, not the caller
}

// release gives the connection back; the pool closes one left inside a
// transaction (a failed COMMIT or ROLLBACK) rather than reuse it.
func (p *pipeline) release() {
	if p.conn == nil {
		return
	}
	p.settled = true
	p.conn.Release()
	p.conn = nil
}
