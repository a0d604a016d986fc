package sqlite

import (
	"context"
	"slices"

	"github.com/fleet/fleet/internal/store"
	"github.com/fleet/fleet/internal/store/dbutil"
	"github.com/fleet/fleet/internal/store/sqlite/dbsqlc"
)

func (c *conn) JobDependencyInsertMany(ctx context.Context, deps []store.JobDependency) error {
	return wrap(c.q.JobDependencyInsertMany(ctx, dbutil.DependencyRows(deps)), "record dependencies", "")
}

func (c *conn) JobDependencyList(ctx context.Context, op string) ([]string, error) {
	deps, err := c.q.JobDependencyList(ctx, op)
	return deps, wrap(err, "list the dependencies of", op)
}

func (c *conn) JobReleaseDependents(ctx context.Context, p *store.JobReleaseDependentsParams) ([]string, error) {
	rows, err := c.q.JobReleaseDependents(ctx, p.NowMS, p.DependsOn)
	if err != nil {
		return nil, wrap(err, "release the dependents of", p.DependsOn)
	}
	var ready []string
	for _, r := range rows {
		if r.WaitingOn == 0 {
			ready = append(ready, r.OperationID)
		}
	}
	slices.Sort(ready)
	return ready, nil
}

func (c *conn) JobUnblock(ctx context.Context, p *store.JobUnblockParams) error {
	n, err := c.q.JobUnblock(ctx, &dbsqlc.JobUnblockParams{InputSha256: p.InputSHA256, ExpectedSha256: p.ExpectedSHA256,
		AfterJson: p.AfterJSON, UpdatedAtMs: p.NowMS, OperationID: p.OperationID})
	return dbutil.Guarded(n, err, "unblock", p.OperationID)
}
