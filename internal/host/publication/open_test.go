package publication_test

import (
	"context"

	"github.com/fleet/fleet/internal/host/publication"
	"github.com/fleet/fleet/internal/store/backend"
)

// initialize and open make a Store as a command does: it chooses the
// backend, and the resource is handed the database.
func initialize(ctx context.Context, location string) (*publication.Resource, error) {
	db, err := backend.Create(ctx, location)
	if err != nil {
		return nil, err
	}
	return publication.NewResource(db), nil
}

func open(ctx context.Context, location string) (*publication.Resource, error) {
	db, err := backend.Open(ctx, location, backend.Options{})
	if err != nil {
		return nil, err
	}
	return publication.NewResource(db), nil
}
