package store

import (
	"context"
	"fmt"

	"github.com/fleet/fleet/internal/wire"
)

// itemSavepoints are the fixed savepoint names of a batch's items (the HTTP
// edge refuses a batch of more than wire.MaxBatchItems), so their
// statements are cached.
var itemSavepoints = savepointNames("item", wire.MaxBatchItems)

// Item runs item i of a batch request (i < wire.MaxBatchItems) in a savepoint of the
// request's transaction, so that each item gets exactly what it would get
// as a request of its own. An error fn returns that refused reports as the
// item's own refusal rolls back only the item's writes and log appends and
// comes back as itemErr; the other items go on. Any other error (a lost
// race, a broken guard, a failed statement that may belong to an earlier
// item, which a pipelining backend reports late) is fatal: the request's
// whole transaction must fail, and runs again or is answered as a whole.
func (tx *Tx) Item(ctx context.Context, i int, fn func() error, refused func(error) bool) (itemErr, fatal error) {
	if i < 0 || i >= len(itemSavepoints) {
		return nil, fmt.Errorf("batch item %d: there are savepoints for %d", i, len(itemSavepoints))
	}
	c, ok := tx.Executor.(Conn)
	if !ok {
		return nil, fmt.Errorf("batch item %d: not a write transaction", i)
	}
	sp := itemSavepoints[i]
	if err := c.Savepoint(ctx, sp); err != nil {
		return nil, fmt.Errorf("savepoint for batch item %d: %w", i, err)
	}
	var mark logMark
	if tx.log != nil {
		mark = tx.log.mark()
	}
	var held heldMark
	if tx.held != nil {
		held = tx.held.mark()
	}
	err := fn()
	if err != nil && !refused(err) {
		return nil, err
	}
	if err != nil {
		if tx.log != nil {
			tx.log.rollback(mark)
		}
		if tx.held != nil {
			tx.held.rollback(held)
		}
		if rerr := c.RollbackTo(ctx, sp); rerr != nil {
			return nil, fmt.Errorf("roll back batch item %d: %w", i, rerr)
		}
	}
	if rerr := c.Release(ctx, sp); rerr != nil {
		return nil, fmt.Errorf("release batch item %d: %w", i, rerr)
	}
	return err, nil
}
