package publication

import (
	"context"

	"github.com/fleet/fleet/internal/fleet"
	"github.com/fleet/fleet/internal/resource"
	"github.com/fleet/fleet/internal/store"
	"github.com/fleet/fleet/internal/wire"
)

// Resource is the report resource on its own database, without jobs, each
// call one transaction: what resource-exercise plays. Its publication is
// the job-bound one's steps without the job: lock the document, replay,
// decide, write, record.
type Resource struct {
	DB *store.DB
}

// NewResource serves the resource from db, which the caller opened or created
// (store/backend: the command chooses the backend); the Store closes it.
func NewResource(db *store.DB) *Resource { return &Resource{DB: db} }

// Close closes the database.
func (s *Resource) Close() error { return s.DB.Close() }

// CreateDocument adds an unassigned document.
func (s *Resource) CreateDocument(ctx context.Context, id string) error {
	return s.DB.WithTx(ctx, func(tx *store.Tx) error { return resource.CreateDocument(ctx, tx, id) })
}

// Assign is the operator's compare-and-swap transfer; see Assign.
func (s *Resource) Assign(ctx context.Context, id string, expectedGeneration int64, owner string) (int64, error) {
	var gen int64
	err := s.DB.WithTx(ctx, func(tx *store.Tx) (err error) {
		gen, err = resource.Assign(ctx, tx, id, expectedGeneration, owner, "operator")
		return err
	})
	return gen, err
}

// Publish runs one publication in its own transaction: lock the document,
// replay, decide (the assignment holds when the caller owns the document
// at the request's generation), write, record.
func (s *Resource) Publish(ctx context.Context, id string, caller fleet.Caller, req wire.PublishRequest) (Result, error) {
	r, err := resource.Normalize(req)
	if err != nil {
		return Result{}, err
	}
	p, err := newOperation(id, caller, r)
	if err != nil {
		return Result{}, err
	}
	var res Result
	err = s.DB.WithTx(ctx, func(tx *store.Tx) error {
		doc, err := resource.GetDocument(ctx, tx, id, store.ForUpdate)
		if err != nil {
			return err
		}
		var found bool
		if res, found, err = p.Replay(ctx, tx); err != nil || found {
			return err
		}
		outcome, err := p.Decide(doc, true)
		if err != nil {
			return err
		}
		if outcome.Status == wire.StatusPublished {
			if err := p.Write(ctx, tx, outcome.Version); err != nil {
				return err
			}
		}
		res, err = p.Record(ctx, tx, outcome)
		return err
	})
	return res, err
}

// Get reads a document.
func (s *Resource) Get(ctx context.Context, id string) (wire.Document, error) {
	var d wire.Document
	err := s.DB.Read(ctx, func(tx *store.Tx) (err error) {
		d, err = resource.GetDocument(ctx, tx, id, store.NoLock)
		return err
	})
	return d, err
}

// Operations lists a document's retained operations, oldest first.
func (s *Resource) Operations(ctx context.Context, id string) ([]wire.Operation, error) {
	var ops []wire.Operation
	err := s.DB.Read(ctx, func(tx *store.Tx) (err error) {
		ops, err = tx.OperationList(ctx, id)
		return err
	})
	return ops, err
}

// MutationCount counts a document's mutations.
func (s *Resource) MutationCount(ctx context.Context, id string) (int64, error) {
	var n int64
	err := s.DB.Read(ctx, func(tx *store.Tx) (err error) {
		n, err = tx.MutationCount(ctx, id)
		return err
	})
	return n, err
}
