package resource

import (
	"context"

	"github.com/fleet/fleet/internal/fleet"
	"github.com/fleet/fleet/internal/store"
)

// Store is the report resource on its own database file, each call one
// transaction. The fleet host instead calls the package functions inside its
// own transactions.
type Store struct {
	DB *store.DB
}

// Initialize creates a new database at path by exclusive creation; an
// existing path is refused.
func Initialize(ctx context.Context, path string) (*Store, error) {
	db, err := store.Create(ctx, path)
	if err != nil {
		return nil, err
	}
	return &Store{DB: db}, nil
}

// Open opens an existing database, refusing a missing path, a file that is
// not a Fleet database and an unknown schema version.
func Open(ctx context.Context, path string) (*Store, error) {
	db, err := store.Open(ctx, path)
	if err != nil {
		return nil, err
	}
	return &Store{DB: db}, nil
}

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

// Publish runs one publication in its own immediate transaction.
func (s *Store) Publish(ctx context.Context, id string, caller fleet.Caller, req PublishRequest) (Result, error) {
	var res Result
	err := s.DB.WithTx(ctx, func(tx *store.Tx) (err error) {
		res, err = Publish(ctx, tx, id, caller, req, nil)
		return err
	})
	return res, err
}

// Get reads a document.
func (s *Store) Get(ctx context.Context, id string) (Document, error) {
	var d Document
	err := s.DB.Read(ctx, func(tx *store.Tx) (err error) {
		d, err = Get(ctx, tx, id)
		return err
	})
	return d, err
}

// Operations lists a document's retained operations.
func (s *Store) Operations(ctx context.Context, id string) ([]Operation, error) {
	var ops []Operation
	err := s.DB.Read(ctx, func(tx *store.Tx) (err error) {
		ops, err = Operations(ctx, tx, id)
		return err
	})
	return ops, err
}

// MutationCount counts a document's mutations.
func (s *Store) MutationCount(ctx context.Context, id string) (int64, error) {
	var n int64
	err := s.DB.Read(ctx, func(tx *store.Tx) (err error) {
		n, err = MutationCount(ctx, tx, id)
		return err
	})
	return n, err
}
