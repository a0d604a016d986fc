package store

import "context"

// Dependencies are the operations of sections that wait for others (the
// Executor embeds them): which job waits for which, and the move of a
// blocked job to queued once every job it waits for has completed.
type Dependencies interface {
	// JobDependencyInsertMany records which job waits for which, in one
	// statement.
	JobDependencyInsertMany(ctx context.Context, deps []JobDependency) error
	// JobDependencyList is the jobs a job waits for, by operation id.
	JobDependencyList(ctx context.Context, operationID string) ([]string, error)
	// JobReleaseDependents counts one dependency fewer for each blocked
	// job waiting for DependsOn, which has just completed, and names
	// those that now wait for none, in operation id order.
	JobReleaseDependents(ctx context.Context, p *JobReleaseDependentsParams) ([]string, error)
	// JobUnblock queues a blocked job that waits for nothing any more,
	// claimable at NowMS, with the input its dependencies' outputs made
	// (ErrGuard when it is not so).
	JobUnblock(ctx context.Context, p *JobUnblockParams) error
}

// JobDependency is one job waiting for another.
type JobDependency struct {
	OperationID string
	DependsOn   string
}

// JobReleaseDependentsParams releases the jobs waiting for DependsOn.
type JobReleaseDependentsParams struct {
	DependsOn string
	NowMS     int64
}

// JobUnblockParams queues a blocked job with its input complete: its
// digest, the digest of the body a deterministic worker publishes for it,
// and its dependencies' outputs (wire.DependencyOutput, as JSON).
type JobUnblockParams struct {
	OperationID    string
	InputSHA256    string
	ExpectedSHA256 string
	AfterJSON      string
	NowMS          int64
}
