package sqlite

import (
	"context"
	"fmt"

	"github.com/fleet/fleet/internal/store"
	"github.com/fleet/fleet/internal/store/dbutil"
	"github.com/fleet/fleet/internal/wire"
)

// The fleet's allowance is one row. A write transaction reserves and
// settles on it in the process (ahead.go), as it does at tenants: a batch
// of 32 jobs' admissions and publications would otherwise be 64 UPDATEs
// of that row on the one writer's serial path, about 9 µs each. Reads in
// the transaction see its decisions; anything else that writes the row
// writes them first.

// aheadAllowance is the allowance as this transaction's decisions left
// it, and what they changed.
type aheadAllowance struct {
	allowance, spent, reserved, calls, cost int64
	changed                                 aheadChange
}

type aheadChange struct{ reserved, spent, calls int64 }

func (a *aheadAllowance) accounting() wire.Accounting {
	return dbutil.Accounting(a.allowance, a.spent, a.reserved, a.calls, a.cost)
}

// allowanceAhead is the allowance as this transaction's decisions left
// it, read at its first.
func (c *conn) allowanceAhead(ctx context.Context) (*aheadAllowance, error) {
	if c.ahead != nil && c.ahead.fleet != nil {
		return c.ahead.fleet, nil
	}
	row, err := c.q.AccountingGet(ctx)
	if err != nil {
		return nil, dbutil.One(err, "read accounting", "")
	}
	if c.ahead == nil {
		c.ahead = newAhead(row.CostPerReport)
	}
	c.ahead.fleet = &aheadAllowance{allowance: row.Allowance, spent: row.Spent, reserved: row.Reserved, calls: row.Calls,
		cost: row.CostPerReport}
	return c.ahead.fleet, nil
}

func (c *conn) AccountingInsert(ctx context.Context, p *store.AccountingInsertParams) error {
	if err := c.writeAhead(ctx); err != nil {
		return err
	}
	return wrap(c.q.AccountingInsert(ctx, p.Allowance, p.CostPerReport), "init accounting", "")
}

func (c *conn) AccountingGet(ctx context.Context, _ store.Lock) (wire.Accounting, error) {
	if c.ahead != nil && c.ahead.fleet != nil {
		return c.ahead.fleet.accounting(), nil
	}
	a, err := c.q.AccountingGet(ctx)
	return dbutil.Accounting(a.Allowance, a.Spent, a.Reserved, a.Calls, a.CostPerReport), dbutil.One(err, "read accounting", "")
}

// AccountingReserve reserves a report's cost if what is available covers
// it (the guard AccountingReserve's UPDATE had); otherwise nothing changes.
func (c *conn) AccountingReserve(ctx context.Context) (store.Reservation, error) {
	a, err := c.allowanceAhead(ctx)
	if err != nil {
		return store.Reservation{Shard: -1}, err
	}
	if a.allowance-a.spent-a.reserved < a.cost {
		return store.Reservation{Accounting: a.accounting(), Shard: -1}, nil
	}
	a.reserved, a.calls = a.reserved+a.cost, a.calls+1
	a.changed.reserved, a.changed.calls = a.changed.reserved+a.cost, a.changed.calls+1
	return store.Reservation{Accounting: a.accounting(), OK: true}, nil
}

// AccountingMove settles FromReserved (ToSpent of it spent) if that much is
// reserved; otherwise nothing changes. Figures the row's CHECKs would
// refuse are an error, as the UPDATE's would have been.
func (c *conn) AccountingMove(ctx context.Context, p *store.AccountingMoveParams) (store.Settlement, error) {
	a, err := c.allowanceAhead(ctx)
	if err != nil {
		return store.Settlement{}, err
	}
	if a.reserved < p.FromReserved {
		return store.Settlement{Accounting: a.accounting()}, nil
	}
	reserved, spent := a.reserved-p.FromReserved, a.spent+p.ToSpent
	if spent < 0 || spent+reserved > a.allowance {
		return store.Settlement{Accounting: a.accounting()}, fmt.Errorf("settle credits: %d reserved and %d spent would break the allowance of %d",
			reserved, spent, a.allowance)
	}
	a.reserved, a.spent = reserved, spent
	a.changed.reserved, a.changed.spent = a.changed.reserved-p.FromReserved, a.changed.spent+p.ToSpent
	return store.Settlement{Accounting: a.accounting(), OK: true}, nil
}

func (c *conn) AccountingSetAllowance(ctx context.Context, allowance int64) (wire.Accounting, error) {
	if err := c.writeAhead(ctx); err != nil {
		return wire.Accounting{}, err
	}
	a, err := c.q.AccountingSetAllowance(ctx, allowance)
	return dbutil.Accounting(a.Allowance, a.Spent, a.Reserved, a.Calls, a.CostPerReport), dbutil.One(err, "set allowance", "")
}
