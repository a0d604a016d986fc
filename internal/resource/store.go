package resource

import (
	"context"

	"github.com/fleet/fleet/internal/fleet"
	"github.com/fleet/fleet/internal/store"
	"github.com/fleet/fleet/internal/wire"
)

// Store is the report resource on its own database, each call one
// transaction. The fleet host instead runs a Publication inside its own
// larger transactions.
type Store struct {
	DB *store.DB
}

// New serves the resource from db, which the caller opened or created
// (store/backend: the command chooses the backend); the Store closes it.
func New(db *store.DB) *Store { return &Store{DB: db} }

// Close closes the database.
func (s *Store) Close() error { return s.DB.Close() }

// CreateDocument adds an unassigned document.
func (s *Store) CreateDocument(ctx context.Context, id string) error {
	return s.DB.WithTx(ctx, func(tx *store.Tx) error { return CreateDocument(ctx, tx, id) })
}

// Assign is the operator's compare-and-swap transfer; see Assign.
func (s *Store) Assign(ctx context.Context, id string, expectedGeneration int64, owner string) (int64, error) {
	var gen int64
	err := s.DB.WithTx(ctx, func(tx *store.Tx) (err error) {
		gen, err = Assign(ctx, tx, id, expectedGeneration, owner, "operator")
		return err
	})
	return gen, err
}

// Publish runs one publication in its own transaction: lock the document,
// replay, decide, write, record.
func (s *Store) Publish(ctx context.Context, id string, caller fleet.Caller, req wire.PublishRequest) (Result, error) {
	p, err := NewPublication(id, caller, req)
	if err != nil {
		return Result{}, err
	}
	var res Result
	err = s.DB.WithTx(ctx, func(tx *store.Tx) error {
		doc, err := GetDocument(ctx, tx, id, store.ForUpdate)
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
func (s *Store) Get(ctx context.Context, id string) (wire.Document, error) {
	var d wire.Document
	err := s.DB.Read(ctx, func(tx *store.Tx) (err error) {
		d, err = GetDocument(ctx, tx, id, store.NoLock)
		return err
	})
	return d, err
}

// Operations lists a document's retained operations, oldest first.
func (s *Store) Operations(ctx context.Context, id string) ([]wire.Operation, error) {
	var ops []wire.Operation
	err := s.DB.Read(ctx, func(tx *store.Tx) (err error) {
		ops, err = tx.OperationList(ctx, id)
		return err
	})
	return ops, err
}

// MutationCount counts a document's mutations.
func (s *Store) MutationCount(ctx context.Context, id string) (int64, error) {
	var n int64
	err := s.DB.Read(ctx, func(tx *store.Tx) (err error) {
		n, err = tx.MutationCount(ctx, id)
		return err
	})
	return n, err
}
