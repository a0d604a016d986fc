package postgres

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/fleet/fleet/internal/store"
	"github.com/fleet/fleet/internal/store/sqlexec"
	"github.com/fleet/fleet/internal/wire"
)

// The allowance is one figure, but on PostgreSQL it is held in shards
// (accounting_shards, migration 0004): one row would be locked by every
// reservation and settlement from its UPDATE to its commit, so every
// write of every host would queue behind the one before it, a durable
// commit apart. Each shard is guarded like the single row was (its
// CHECKs: spent + reserved never above its allowance, nothing negative),
// the shards' allowances add up to the allowance, so no shard can grant
// what the whole has not got. A reservation takes any shard that covers
// it and that no other transaction holds; only when none does are all
// shards locked, in order, and the available credits redistributed in
// whole reservations (or, if the whole cannot cover it, denied under
// those locks). The quick try runs in a savepoint that is rolled back when
// it finds nothing: a row it locked and then found no longer covering
// (PostgreSQL keeps such locks) would otherwise be held while this
// transaction waits for every shard in order, and two such transactions
// deadlock. The `accounting` view sums the shards for anyone reading
// the database directly.

// shardCount is how many shards a new database gets.
const shardCount = 32

// conn is sqlexec's Conn with the allowance's operations over shards and
// the log's statements joined (log.go).
type conn struct {
	*sqlexec.Conn
	pipe     *pipeline // Conn's Querier
	channel  string    // where placing the log is announced (LISTEN/NOTIFY)
	instance string    // who announces
}

const (
	lockShards = `SELECT shard FROM accounting_shards ORDER BY shard FOR UPDATE`

	// rebalance spreads the credits available under the allowance $1 over
	// the shards, a reservation's worth at a time, the remainder to shard
	// 0. The caller holds every shard.
	rebalance = `WITH t AS (
		SELECT $1::bigint - (SELECT COALESCE(SUM(spent + reserved), 0)::bigint FROM accounting_shards) AS available,
			(SELECT cost_per_report FROM accounting_settings) AS cost,
			(SELECT COUNT(*) FROM accounting_shards) AS shards)
		UPDATE accounting_shards s SET allowance = s.spent + s.reserved
			+ t.cost * ((t.available / t.cost) / t.shards + CASE WHEN s.shard < (t.available / t.cost) % t.shards THEN 1 ELSE 0 END)
			+ CASE WHEN s.shard = 0 THEN t.available % t.cost ELSE 0 END
		FROM t`

	// A reservation: on a covering shard no one holds (SKIP LOCKED, a
	// random one so reservations, and the settlements that look for them,
	// spread), or on a given shard, waiting for it.
	reserveFree = `UPDATE accounting_shards s SET reserved = s.reserved + c.cost_per_report, calls = s.calls + 1
		FROM accounting_settings c
		WHERE s.allowance - s.spent - s.reserved >= c.cost_per_report AND s.shard = (
			SELECT a.shard FROM accounting_shards a, accounting_settings k
			WHERE a.allowance - a.spent - a.reserved >= k.cost_per_report
			ORDER BY random() LIMIT 1 FOR UPDATE OF a SKIP LOCKED)`
	reserveCovering = `SELECT a.shard FROM accounting_shards a, accounting_settings k
		WHERE a.allowance - a.spent - a.reserved >= k.cost_per_report ORDER BY random() LIMIT 1`
	reserveOn = `UPDATE accounting_shards s SET reserved = s.reserved + c.cost_per_report, calls = s.calls + 1
		FROM accounting_settings c WHERE s.allowance - s.spent - s.reserved >= c.cost_per_report AND s.shard = $1`

	// A settlement, likewise, on a shard whose reservations cover it.
	moveFree = `UPDATE accounting_shards s SET reserved = s.reserved - $1, spent = s.spent + $2
		WHERE s.reserved >= $1 AND s.shard = (
			SELECT a.shard FROM accounting_shards a WHERE a.reserved >= $1 ORDER BY random() LIMIT 1 FOR UPDATE SKIP LOCKED)`
	moveCovering = `SELECT shard FROM accounting_shards WHERE reserved >= $1 ORDER BY random() LIMIT 1`
	moveOn       = `UPDATE accounting_shards s SET reserved = s.reserved - $1, spent = s.spent + $2 WHERE s.reserved >= $1 AND s.shard = $3`

	shardList   = `SELECT shard, reserved FROM accounting_shards ORDER BY shard`
	shardSettle = `UPDATE accounting_shards SET reserved = reserved - $1, spent = spent + $2 WHERE shard = $3`
)

func (c *conn) AccountingInsert(ctx context.Context, allowance, costPerReport int64) error {
	if err := c.DB.Exec(ctx, `INSERT INTO accounting_settings (id, cost_per_report) VALUES (1, $1)`, costPerReport); err != nil {
		return fmt.Errorf("init accounting: %w", err)
	}
	if err := c.DB.Exec(ctx, `INSERT INTO accounting_shards (shard, allowance, spent, reserved, calls)
		SELECT g, 0, 0, 0, 0 FROM generate_series(0, $1 - 1) AS g`, shardCount); err != nil {
		return fmt.Errorf("init accounting shards: %w", err)
	}
	return c.spread(ctx, allowance)
}

func (c *conn) AccountingGet(ctx context.Context, lock store.Lock) (wire.Accounting, error) {
	if lock {
		if err := c.lockAll(ctx); err != nil {
			return wire.Accounting{}, err
		}
	}
	return c.Conn.AccountingGet(ctx, store.NoLock)
}

func (c *conn) AccountingReserve(ctx context.Context) (wire.Accounting, int64, bool, error) {
	if a, shard, ok, err := c.onOneShard(ctx, "reserve", reserveFree, reserveCovering, reserveOn); err != nil || ok {
		return a, shard, ok, err
	}
	// No shard covers it alone: decide on the whole, holding every shard.
	a, err := c.AccountingGet(ctx, store.ForUpdate)
	if err != nil || a.Available < a.CostPerReport {
		return a, -1, false, err
	}
	if err := c.spread(ctx, a.Allowance); err != nil {
		return a, -1, false, err
	}
	a, shard, ok, err := c.applied(ctx, "reserve", reserveFree)
	if err == nil && !ok {
		err = fmt.Errorf("reserve: %d credits available and no shard covers %d after spreading them", a.Available, a.CostPerReport)
	}
	return a, shard, ok, err
}

func (c *conn) AccountingMove(ctx context.Context, shard, fromReserved, toSpent int64) (wire.Accounting, bool, error) {
	if shard >= 0 {
		// Where the job's reservation is held: settle there, waiting for
		// the shard if another transaction holds it. No savepoint: the
		// guard holds, since the reservation is there, and the shard is
		// this transaction's first (the lock-all below takes shards in
		// order, and the database would break the deadlock that a shard
		// held here could make with it, which only inconsistent data
		// reaches).
		a, _, ok, err := c.applied(ctx, "settle credits", moveOn, fromReserved, toSpent, shard)
		if err != nil || ok {
			return a, ok, err
		}
	}
	if a, _, ok, err := c.onOneShard(ctx, "settle credits", moveFree, moveCovering, moveOn, fromReserved, toSpent); err != nil || ok {
		return a, ok, err
	}
	// The reservations are spread over shards: settle shard by shard,
	// holding every shard.
	a, err := c.AccountingGet(ctx, store.ForUpdate)
	if err != nil || a.Reserved < fromReserved {
		return a, false, err
	}
	type held struct{ id, reserved int64 }
	var shards []held
	rows, err := c.DB.Query(ctx, shardList)
	if err != nil {
		return a, false, fmt.Errorf("settle credits: %w", err)
	}
	for rows.Next() {
		var s held
		if err := rows.Scan(&s.id, &s.reserved); err != nil {
			rows.Close()
			return a, false, fmt.Errorf("settle credits: %w", err)
		}
		shards = append(shards, s)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return a, false, fmt.Errorf("settle credits: %w", err)
	}
	// Each shard gives up part of its reservations and counts as spent
	// at most what it gave up, so no shard's spent + reserved grows.
	leftReserved, leftSpent := fromReserved, toSpent
	for _, s := range shards {
		take := min(s.reserved, leftReserved)
		if take == 0 {
			continue
		}
		spend := min(take, leftSpent)
		if err := c.DB.Exec(ctx, shardSettle, take, spend, s.id); err != nil {
			return a, false, fmt.Errorf("settle credits: %w", err)
		}
		leftReserved, leftSpent = leftReserved-take, leftSpent-spend
	}
	if leftReserved != 0 || leftSpent != 0 {
		return a, false, fmt.Errorf("settle credits: %d reserved and %d spent left over", leftReserved, leftSpent)
	}
	a, err = c.Conn.AccountingGet(ctx, store.NoLock)
	return a, err == nil, err
}

func (c *conn) AccountingSetAllowance(ctx context.Context, allowance int64) (wire.Accounting, error) {
	if err := c.lockAll(ctx); err != nil {
		return wire.Accounting{}, err
	}
	if err := c.spread(ctx, allowance); err != nil {
		return wire.Accounting{}, err
	}
	return c.Conn.AccountingGet(ctx, store.NoLock)
}

func (c *conn) lockAll(ctx context.Context) error {
	rows, err := c.DB.Query(ctx, lockShards)
	if err != nil {
		return fmt.Errorf("lock the allowance: %w", err)
	}
	for rows.Next() {
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return fmt.Errorf("lock the allowance: %w", err)
	}
	return nil
}

// spread redistributes the available credits under allowance; the caller
// holds every shard. The shards' CHECKs refuse an allowance below what
// they hold.
func (c *conn) spread(ctx context.Context, allowance int64) error {
	if err := c.DB.Exec(ctx, rebalance, allowance); err != nil {
		return fmt.Errorf("set allowance: %w", err)
	}
	return nil
}

// onOneShard runs a guarded UPDATE on one shard: first on a covering one
// no one holds (free), else on a covering one (picked by pick, which reads
// args[:1]) waiting for its holder (on, with the shard after args). Each
// try runs in a savepoint rolled back, with any lock it took, when it
// changes nothing, so this transaction holds no shard when it gives up.
func (c *conn) onOneShard(ctx context.Context, what, free, pick, on string, args ...any) (wire.Accounting, int64, bool, error) {
	if err := c.Savepoint(ctx, shardSavepoint); err != nil {
		return wire.Accounting{}, -1, false, err
	}
	a, shard, ok, err := c.applied(ctx, what, free, args...)
	if err != nil || ok {
		return a, shard, ok, err
	}
	if err := c.RollbackTo(ctx, shardSavepoint); err != nil {
		return a, -1, false, err
	}
	// The shard waited for may no longer cover it once its holder is done
	// (settlements drain the few reservations a shard holds): pick again a
	// few times before deciding on the whole, which stops every writer.
	for range shardTries {
		var pick1 int64
		switch err := c.DB.QueryRow(ctx, pick, args[:min(len(args), 1)]...).Scan(&pick1); {
		case errors.Is(err, sql.ErrNoRows):
			return a, -1, false, nil // no shard covers it alone
		case err != nil:
			return a, -1, false, fmt.Errorf("%s: %w", what, err)
		}
		if a, shard, ok, err = c.applied(ctx, what, on, append(args, pick1)...); err != nil || ok {
			return a, shard, ok, err
		}
		if err := c.RollbackTo(ctx, shardSavepoint); err != nil {
			return a, -1, false, err
		}
	}
	return a, -1, false, nil
}

// shardTries bounds the waits for one covering shard.
const shardTries = 4

const shardSavepoint = "accounting_shard"

// applied runs a guarded UPDATE of one shard (aliased s) and returns the
// allowance's figures as they stand after it, in the same statement (the
// updated shard as written, the others as the statement saw them), and
// which shard it was. ok is false when the guard refused.
func (c *conn) applied(ctx context.Context, what, update string, args ...any) (wire.Accounting, int64, bool, error) {
	a := wire.Accounting{Unit: "credits"}
	var shard int64
	err := c.DB.QueryRow(ctx, `WITH u AS (`+update+` RETURNING s.shard, s.allowance, s.spent, s.reserved, s.calls)
		SELECT u.shard, u.allowance + o.allowance, u.spent + o.spent, u.reserved + o.reserved, u.calls + o.calls, k.cost_per_report
		FROM u, accounting_settings k, (
			SELECT COALESCE(SUM(allowance), 0)::BIGINT AS allowance, COALESCE(SUM(spent), 0)::BIGINT AS spent,
				COALESCE(SUM(reserved), 0)::BIGINT AS reserved, COALESCE(SUM(calls), 0)::BIGINT AS calls
			FROM accounting_shards WHERE shard <> (SELECT shard FROM u)) AS o`, args...).
		Scan(&shard, &a.Allowance, &a.Spent, &a.Reserved, &a.Calls, &a.CostPerReport)
	if errors.Is(err, sql.ErrNoRows) {
		return a, -1, false, nil
	}
	if err != nil {
		return a, -1, false, fmt.Errorf("%s: %w", what, err)
	}
	a.Available = a.Allowance - a.Spent - a.Reserved
	return a, shard, true, nil
}
