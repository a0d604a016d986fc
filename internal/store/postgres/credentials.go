package postgres

import (
	"context"

	"github.com/fleet/fleet/internal/store"
	"github.com/fleet/fleet/internal/store/dbutil"
	"github.com/fleet/fleet/internal/store/postgres/dbsqlc"
)

// The credentials: who may call, and a credential's own allowance.

func credentialFrom(c dbsqlc.Credential) store.Credential {
	out := store.Credential{Name: c.Name, Role: c.Role, SHA256: c.Sha256, CreatedMS: c.CreatedAtMs, RevokedMS: c.RevokedAtMs,
		Spent: c.Spent, Reserved: c.Reserved, Tenants: store.SplitTenants(c.Tenants)}
	if c.Allowance.Valid {
		out.Allowance = &c.Allowance.Int64
	}
	return out
}

func (c *conn) CredentialInsert(ctx context.Context, cr store.Credential) error {
	return wrap(c.q.CredentialInsert(ctx, &dbsqlc.CredentialInsertParams{Name: cr.Name, Role: cr.Role, Sha256: cr.SHA256,
		CreatedAtMs: cr.CreatedMS, Allowance: int8Of(cr.Allowance), Tenants: store.JoinTenants(cr.Tenants)}), "record credential", cr.Name)
}

func (c *conn) CredentialGet(ctx context.Context, name string, lock store.Lock) (store.Credential, error) {
	get := c.q.CredentialGet
	if lock {
		get = c.q.CredentialGetForUpdate
	}
	cr, err := get(ctx, name)
	return credentialFrom(cr), dbutil.One(err, "read credential", name)
}

func (c *conn) CredentialList(ctx context.Context) ([]store.Credential, error) {
	rows, err := c.q.CredentialList(ctx)
	out := make([]store.Credential, 0, len(rows))
	for _, r := range rows {
		out = append(out, credentialFrom(r))
	}
	return out, wrap(err, "list credentials", "")
}

func (c *conn) CredentialUpdate(ctx context.Context, cr store.Credential) error {
	updated, err := c.q.CredentialUpdate(ctx, &dbsqlc.CredentialUpdateParams{Sha256: cr.SHA256, RevokedAtMs: cr.RevokedMS, Name: cr.Name})
	if err == nil && len(updated) != 1 {
		err = store.ErrNotFound
	}
	return wrap(err, "update credential", cr.Name)
}

func (c *conn) CredentialReserve(ctx context.Context, name string) (store.CredentialReservation, error) {
	cr, err := c.q.CredentialReserve(ctx, name)
	if isNoRows(err) { // no allowance of its own, or not enough of it
		cr, err := c.CredentialGet(ctx, name, store.NoLock)
		return store.CredentialReservation{Credential: cr}, err
	}
	return store.CredentialReservation{Credential: credentialFrom(cr), OK: err == nil}, wrap(err, "reserve at credential", name)
}

func (c *conn) CredentialMove(ctx context.Context, p *store.CredentialMoveParams) (bool, error) {
	_, err := c.q.CredentialMove(ctx, &dbsqlc.CredentialMoveParams{FromReserved: p.FromReserved, ToSpent: p.ToSpent, Name: p.Name})
	if isNoRows(err) {
		return false, nil
	}
	return err == nil, wrap(err, "settle credits at credential", p.Name)
}
