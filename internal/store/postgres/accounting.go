package postgres

import (
	"context"
	"fmt"

	"github.com/fleet/fleet/internal/store"
	"github.com/fleet/fleet/internal/store/dbutil"
	"github.com/fleet/fleet/internal/store/postgres/dbsqlc"
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

func (c *conn) AccountingInsert(ctx context.Context, p *store.AccountingInsertParams) error {
	if err := c.q.AccountingSettingsInsert(ctx, p.CostPerReport); err != nil {
		return dbutil.Failed(err, "init accounting", "")
	}
	if err := c.q.AccountingShardsInsert(ctx, shardCount); err != nil {
		return dbutil.Failed(err, "init accounting shards", "")
	}
	return c.spread(ctx, p.Allowance)
}

func (c *conn) AccountingGet(ctx context.Context, lock store.Lock) (wire.Accounting, error) {
	if lock {
		if err := c.lockAll(ctx); err != nil {
			return wire.Accounting{}, err
		}
	}
	a, err := c.q.AccountingGet(ctx)
	return dbutil.Accounting(a.Allowance, a.Spent, a.Reserved, a.Calls, a.CostPerReport), dbutil.One(err, "read accounting", "")
}

// shardTry is one guarded update of one shard: ok false when its guard
// refused (no row).
type shardTry func() (acct wire.Accounting, shard int64, ok bool, err error)

// appliedRow is every guarded shard update's row.
type appliedRow = struct {
	Shard         int64
	Allowance     int64
	Spent         int64
	Reserved      int64
	Calls         int64
	CostPerReport int64
}

// applied reads a guarded shard update's row: the allowance's figures as
// they stand after it, and which shard it was.
func applied[R ~struct {
	Shard         int64
	Allowance     int64
	Spent         int64
	Reserved      int64
	Calls         int64
	CostPerReport int64
}](what string, r R, err error) (wire.Accounting, int64, bool, error) {
	a := appliedRow(r)
	switch {
	case isNoRows(err):
		return wire.Accounting{Unit: "credits"}, -1, false, nil
	case err != nil:
		return wire.Accounting{Unit: "credits"}, -1, false, dbutil.Failed(err, what, "")
	}
	return dbutil.Accounting(a.Allowance, a.Spent, a.Reserved, a.Calls, a.CostPerReport), a.Shard, true, nil
}

func (c *conn) AccountingReserve(ctx context.Context) (store.Reservation, error) {
	free := func() (wire.Accounting, int64, bool, error) {
		r, err := c.q.AccountingReserveFree(ctx)
		return applied("reserve", r, err)
	}
	on := func(shard int64) shardTry {
		return func() (wire.Accounting, int64, bool, error) {
			r, err := c.q.AccountingReserveOn(ctx, shard)
			return applied("reserve", r, err)
		}
	}
	covering := func() ([]int64, error) { return c.q.AccountingReserveCovering(ctx) }
	if a, shard, ok, err := c.onOneShard(ctx, "reserve", free, covering, on); err != nil || ok {
		return store.Reservation{Accounting: a, Shard: shard, OK: ok}, err
	}
	// No shard covers it alone: decide on the whole, holding every shard.
	a, err := c.AccountingGet(ctx, store.ForUpdate)
	if err != nil || a.Available < a.CostPerReport {
		return store.Reservation{Accounting: a, Shard: -1}, err
	}
	if err := c.spread(ctx, a.Allowance); err != nil {
		return store.Reservation{Accounting: a, Shard: -1}, err
	}
	a, shard, ok, err := free()
	if err == nil && !ok {
		err = fmt.Errorf("reserve: %d credits available and no shard covers %d after spreading them", a.Available, a.CostPerReport)
	}
	return store.Reservation{Accounting: a, Shard: shard, OK: ok}, err
}

func (c *conn) AccountingMove(ctx context.Context, p *store.AccountingMoveParams) (store.Settlement, error) {
	on := func(shard int64) shardTry {
		return func() (wire.Accounting, int64, bool, error) {
			r, err := c.q.AccountingMoveOn(ctx, &dbsqlc.AccountingMoveOnParams{FromReserved: p.FromReserved, ToSpent: p.ToSpent, Shard: shard})
			return applied("settle credits", r, err)
		}
	}
	if p.Shard >= 0 {
		// Where the job's reservation is held: settle there, waiting for
		// the shard if another transaction holds it. No savepoint: the
		// guard holds, since the reservation is there, and the shard is
		// this transaction's first (the lock-all below takes shards in
		// order, and the database would break the deadlock that a shard
		// held here could make with it, which only inconsistent data
		// reaches).
		a, _, ok, err := on(p.Shard)()
		if err != nil || ok {
			return store.Settlement{Accounting: a, OK: ok}, err
		}
	}
	free := func() (wire.Accounting, int64, bool, error) {
		r, err := c.q.AccountingMoveFree(ctx, p.FromReserved, p.ToSpent)
		return applied("settle credits", r, err)
	}
	covering := func() ([]int64, error) { return c.q.AccountingMoveCovering(ctx, p.FromReserved) }
	if a, _, ok, err := c.onOneShard(ctx, "settle credits", free, covering, on); err != nil || ok {
		return store.Settlement{Accounting: a, OK: ok}, err
	}
	// The reservations are spread over shards: settle shard by shard,
	// holding every shard.
	a, err := c.AccountingGet(ctx, store.ForUpdate)
	if err != nil || a.Reserved < p.FromReserved {
		return store.Settlement{Accounting: a}, err
	}
	shards, err := c.q.AccountingShardList(ctx)
	if err != nil {
		return store.Settlement{Accounting: a}, dbutil.Failed(err, "settle credits", "")
	}
	// Each shard gives up part of its reservations and counts as spent
	// at most what it gave up, so no shard's spent + reserved grows.
	leftReserved, leftSpent := p.FromReserved, p.ToSpent
	for _, s := range shards {
		take := min(s.Reserved, leftReserved)
		if take == 0 {
			continue
		}
		spend := min(take, leftSpent)
		if err := c.q.AccountingShardSettle(ctx, &dbsqlc.AccountingShardSettleParams{FromReserved: take, ToSpent: spend, Shard: s.Shard}); err != nil {
			return store.Settlement{Accounting: a}, dbutil.Failed(err, "settle credits", "")
		}
		leftReserved, leftSpent = leftReserved-take, leftSpent-spend
	}
	if leftReserved != 0 || leftSpent != 0 {
		return store.Settlement{Accounting: a}, fmt.Errorf("settle credits: %d reserved and %d spent left over", leftReserved, leftSpent)
	}
	a, err = c.AccountingGet(ctx, store.NoLock)
	return store.Settlement{Accounting: a, OK: err == nil}, err
}

func (c *conn) AccountingSetAllowance(ctx context.Context, allowance int64) (wire.Accounting, error) {
	if err := c.lockAll(ctx); err != nil {
		return wire.Accounting{}, err
	}
	if err := c.spread(ctx, allowance); err != nil {
		return wire.Accounting{}, err
	}
	return c.AccountingGet(ctx, store.NoLock)
}

func (c *conn) AccountingHold(ctx context.Context, operationIDs []string) error {
	_, err := c.q.AccountingHold(ctx, operationIDs)
	return wrap(err, "hold allowance shards", "")
}

func (c *conn) lockAll(ctx context.Context) error {
	_, err := c.q.AccountingLockShards(ctx)
	return wrap(err, "lock the allowance", "")
}

// spread redistributes the available credits under allowance; the caller
// holds every shard. The shards' CHECKs refuse an allowance below what
// they hold.
func (c *conn) spread(ctx context.Context, allowance int64) error {
	return wrap(c.q.AccountingSpread(ctx, allowance), "set allowance", "")
}

// onOneShard runs a guarded update on one shard: first on a covering one
// no one holds (free), else on a covering one (picked by covering)
// waiting for its holder (on). Each try runs in a savepoint rolled back,
// with any lock it took, when it changes nothing, so this transaction
// holds no shard when it gives up.
func (c *conn) onOneShard(ctx context.Context, what string, free shardTry, covering func() ([]int64, error), on func(int64) shardTry) (wire.Accounting, int64, bool, error) {
	if err := c.Savepoint(ctx, shardSavepoint); err != nil {
		return wire.Accounting{}, -1, false, err
	}
	a, shard, ok, err := free()
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
		picked, err := covering()
		switch {
		case err != nil:
			return a, -1, false, dbutil.Failed(err, what, "")
		case len(picked) == 0:
			return a, -1, false, nil // no shard covers it alone
		}
		if a, shard, ok, err = on(picked[0])(); err != nil || ok {
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
