package postgres

import (
	"context"
	"fmt"
	"maps"
	"slices"

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
	if err := c.writeAhead(ctx); err != nil {
		return err
	}
	if err := c.q.AccountingSettingsInsert(ctx, p.CostPerReport); err != nil {
		return dbutil.Failed(err, "init accounting", "")
	}
	if err := c.q.AccountingShardsInsert(ctx, shardCount); err != nil {
		return dbutil.Failed(err, "init accounting shards", "")
	}
	return c.spread(ctx, p.Allowance)
}

func (c *conn) AccountingGet(ctx context.Context, lock store.Lock) (wire.Accounting, error) {
	if c.ahead != nil && !lock {
		return c.ahead.figures(), nil
	}
	if err := c.writeAhead(ctx); err != nil {
		return wire.Accounting{}, err
	}
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
type shardTry = func() (acct wire.Accounting, shard int64, ok bool, err error)

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
	if a := c.ahead; a != nil && a.left > 0 {
		return a.handOut(), nil
	}
	if err := c.writeAhead(ctx); err != nil {
		return store.Reservation{Shard: -1}, err
	}
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
	if a, shard, ok, err := onOneShard(ctx, c, "reserve", free, covering, on); err != nil || ok {
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
	if s, ok := c.ahead.move(p); ok {
		return s, nil
	}
	if err := c.writeAhead(ctx); err != nil {
		return store.Settlement{}, err
	}
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
	if a, _, ok, err := onOneShard(ctx, c, "settle credits", free, covering, on); err != nil || ok {
		return store.Settlement{Accounting: a, OK: ok}, err
	}
	return c.settleSpread(ctx, p)
}

// settleSpread settles reservations spread over shards, shard by shard,
// holding every shard.
func (c *conn) settleSpread(ctx context.Context, p *store.AccountingMoveParams) (store.Settlement, error) {
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
	if err := c.writeAhead(ctx); err != nil {
		return wire.Accounting{}, err
	}
	if err := c.lockAll(ctx); err != nil {
		return wire.Accounting{}, err
	}
	if err := c.spread(ctx, allowance); err != nil {
		return wire.Accounting{}, err
	}
	return c.AccountingGet(ctx, store.NoLock)
}

func (c *conn) AccountingHold(ctx context.Context, operationIDs []string) error {
	if err := c.writeAhead(ctx); err != nil {
		return err
	}
	if err := c.writeTenantMoves(ctx); err != nil {
		return err
	}
	// The tenants' shards first, in the order an admission takes them
	// (tenant, then fleet).
	held, err := c.q.TenantHold(ctx, operationIDs)
	if err != nil {
		return wrap(err, "hold tenant shards", "")
	}
	c.holdTenants(held)
	rows, err := c.q.AccountingHold(ctx, operationIDs)
	if err != nil || len(rows) == 0 {
		return wrap(err, "hold allowance shards", "")
	}
	r := rows[0]
	a := &allowanceAhead{held: true, shards: make(map[int64]*shardFigures, len(rows)), cost: r.CostPerReport,
		others: shardFigures{allowance: r.OthersAllowance, spent: r.OthersSpent, reserved: r.OthersReserved, calls: r.OthersCalls}}
	for _, r := range rows {
		a.shards[r.Shard] = &shardFigures{allowance: r.Allowance, spent: r.Spent, reserved: r.Reserved, calls: r.Calls}
	}
	c.ahead = a
	return nil
}

func (c *conn) AccountingReserveAhead(ctx context.Context, n int) error {
	if err := c.writeAhead(ctx); err != nil {
		return err
	}
	r, err := c.q.AccountingReserveAhead(ctx, int64(n))
	switch {
	case isNoRows(err):
		return nil // every shard with room is held elsewhere: reserve one at a time
	case err != nil:
		return dbutil.Failed(err, "reserve ahead", "")
	}
	c.tookAhead(r.Shard, r.Take, r.CostPerReport, shardFigures{allowance: r.Allowance, spent: r.Spent, reserved: r.Reserved, calls: r.Calls})
	return nil
}

// tookAhead records take reservations taken ahead on shard. The shard's
// figures are the allowance's before them, less the others'; they are
// handed out one at a time.
func (c *conn) tookAhead(shard, take, cost int64, before shardFigures) {
	c.ahead = &allowanceAhead{shard: shard, left: take, cost: cost, shards: map[int64]*shardFigures{shard: &before}}
}

// allowanceAhead is what this transaction holds of the allowance and has
// changed in it without a statement of its own: reservations taken ahead
// (AccountingReserveAhead) and settlements on shards it holds
// (AccountingHold). Each is decided here on the locked shards' figures,
// with the guard the statement would have had, and all are written in
// one statement each (writeAhead) before anything else of this
// transaction reads or writes the allowance, and before it commits.
type allowanceAhead struct {
	// held: the shards are AccountingHold's, each with its own figures,
	// so settlements on them can be decided here. Reservations taken
	// ahead keep the whole allowance's figures under their one shard,
	// which no settlement may be decided on.
	held bool
	// shards are the shards this transaction holds, as its changes left
	// them; others the other shards' sums, as last read.
	shards map[int64]*shardFigures
	others shardFigures
	cost   int64
	// shard and left: reservations taken ahead there and not handed out.
	shard, left int64
	// moved is, per held shard, what settlements took off its reservations
	// and added to spent.
	moved map[int64]*shardFigures
}

type shardFigures struct{ allowance, spent, reserved, calls int64 }

// figures are the allowance's, as this transaction's changes left it.
func (a *allowanceAhead) figures() wire.Accounting {
	t := a.others
	for _, s := range a.shards {
		t.allowance, t.spent, t.reserved, t.calls = t.allowance+s.allowance, t.spent+s.spent, t.reserved+s.reserved, t.calls+s.calls
	}
	return dbutil.Accounting(t.allowance, t.spent, t.reserved, t.calls, a.cost)
}

// handOut is one reservation of those taken ahead, with the figures a
// reservation on that shard alone would have returned.
func (a *allowanceAhead) handOut() store.Reservation {
	a.left--
	s := a.shards[a.shard]
	s.reserved += a.cost
	s.calls++
	return store.Reservation{Accounting: a.figures(), Shard: a.shard, OK: true}
}

// move settles on a shard this transaction holds, guarded as
// AccountingMoveOn is (no fewer reserved there than the move takes off);
// ok is false when it cannot be decided here.
func (a *allowanceAhead) move(p *store.AccountingMoveParams) (store.Settlement, bool) {
	if a == nil || !a.held {
		return store.Settlement{}, false
	}
	s, held := a.shards[p.Shard]
	if !held || s.reserved < p.FromReserved || p.ToSpent > p.FromReserved {
		return store.Settlement{}, false
	}
	s.reserved -= p.FromReserved
	s.spent += p.ToSpent
	if a.moved == nil {
		a.moved = map[int64]*shardFigures{}
	}
	m := a.moved[p.Shard]
	if m == nil {
		m = &shardFigures{}
		a.moved[p.Shard] = m
	}
	m.reserved += p.FromReserved
	m.spent += p.ToSpent
	return store.Settlement{Accounting: a.figures(), OK: true}, true
}

// clone is a copy that shares nothing, for a savepoint.
func (a *allowanceAhead) clone() *allowanceAhead {
	if a == nil {
		return nil
	}
	b := *a
	b.shards = make(map[int64]*shardFigures, len(a.shards))
	for k, v := range a.shards {
		f := *v
		b.shards[k] = &f
	}
	b.moved = nil
	for k, v := range a.moved {
		if b.moved == nil {
			b.moved = map[int64]*shardFigures{}
		}
		f := *v
		b.moved[k] = &f
	}
	return &b
}

// writeAhead queues what the transaction changed ahead: the reservations
// taken ahead and not handed out go back, the settlements on held shards
// are written, one statement each (the pipeline sends them with the next
// statement, or the commit). Nothing more is decided ahead after it.
func (c *conn) writeAhead(ctx context.Context) error {
	a := c.ahead
	if a == nil {
		return nil
	}
	c.ahead = nil
	if a.left > 0 {
		if err := c.q.AccountingReserveReturn(ctx, a.left, a.shard); err != nil {
			return dbutil.Failed(err, "return reservations taken ahead", "")
		}
	}
	if len(a.moved) > 0 {
		p := &dbsqlc.AccountingMoveManyParams{}
		for _, shard := range slices.Sorted(maps.Keys(a.moved)) {
			m := a.moved[shard]
			p.Shards, p.FromReserved, p.ToSpent = append(p.Shards, shard), append(p.FromReserved, m.reserved), append(p.ToSpent, m.spent)
		}
		return wrap(c.q.AccountingMoveMany(ctx, p), "settle credits on held shards", "")
	}
	return nil
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

// onOneShard runs a guarded update on one shard (of the allowance, or of
// a tenant's figures F): first on a covering one no one holds (free), else
// on a covering one (picked by covering) waiting for its holder (on).
// Each try runs in a savepoint rolled back, with any lock it took, when
// it changes nothing, so this transaction holds no shard when it gives up.
func onOneShard[F any](ctx context.Context, c *conn, what string, free func() (F, int64, bool, error), covering func() ([]int64, error), on func(int64) func() (F, int64, bool, error)) (F, int64, bool, error) {
	var none F
	if err := c.Savepoint(ctx, shardSavepoint); err != nil {
		return none, -1, false, err
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
