package host

import (
	"context"
	"fmt"

	"github.com/fleet/fleet/internal/fleet"
	"github.com/fleet/fleet/internal/host/ledger"
	"github.com/fleet/fleet/internal/receipts"
	"github.com/fleet/fleet/internal/statedir"
	"github.com/fleet/fleet/internal/store"
	"github.com/fleet/fleet/internal/wire"
)

// Credentials lists every credential, revoked ones included, by name.
func (h *Host) Credentials(ctx context.Context) ([]wire.Credential, error) {
	var out []wire.Credential
	err := h.db.Read(ctx, func(tx *store.Tx) error {
		stored, err := tx.CredentialList(ctx)
		for _, c := range stored {
			out = append(out, credentialOf(c))
		}
		return err
	})
	return out, err
}

func credentialOf(c store.Credential) wire.Credential {
	return wire.Credential{Name: c.Name, Role: c.Role, CreatedAtMS: c.CreatedMS, RevokedAtMS: c.RevokedMS}
}

// RevokeCredential ends a worker credential: within a second no host
// serving the state accepts it (see Authenticate). Its claims are left as
// they are, to expire or be reassigned like any worker's that went away.
// The revocation is signed (a credential receipt) and logged; revoking a
// credential revoked already changes nothing. The operator credential
// cannot be revoked, only rotated, or nobody could run the state.
func (h *Host) RevokeCredential(ctx context.Context, name string) (wire.CredentialChange, error) {
	return h.changeCredential(ctx, "revoke", name, func(tx *store.Tx, c *store.Credential) (wire.Decision, string, error) {
		if c.Role == RoleOperator {
			return "", "", fleet.Errorf(wire.CodeInvalid, "the operator credential cannot be revoked; rotate it instead")
		}
		c.RevokedMS = tx.NowMS()
		return wire.DecisionRevoked, "", nil
	})
}

// RotateCredential gives a credential a new token: the old one stops
// working within a second on every host, the new one is returned (this
// once) and, once the change has committed, written to the credential's
// file in the state directory. A revoked credential is not rotated.
func (h *Host) RotateCredential(ctx context.Context, name string) (wire.CredentialChange, error) {
	change, err := h.changeCredential(ctx, "rotate", name, func(tx *store.Tx, c *store.Credential) (wire.Decision, string, error) {
		if c.RevokedMS != 0 {
			return "", "", fleet.Errorf(wire.CodeStateConflict, "credential %s was revoked; add a new one instead", c.Name)
		}
		token, err := statedir.NewToken()
		if err != nil {
			return "", "", err
		}
		c.SHA256 = fleet.DigestHex([]byte(token))
		return wire.DecisionRotated, token, nil
	})
	if err != nil {
		return change, err
	}
	if err := h.writeCredentialToken(ctx, name, change.Token); err != nil {
		// Committed: the token in the answer is the one that works.
		return change, fmt.Errorf("rotated %s, but its file was not written (the new token is in this answer): %w", name, err)
	}
	return change, nil
}

// AddCredential adds a worker credential while the host serves: its token
// is returned (this once) and, once the addition has committed, written to
// credentials/NAME in the state directory; every host serving the state
// takes it within a second. The addition is signed (a credential receipt,
// decision added) and logged. A name already taken, by a credential in
// force or revoked, is a state conflict: rotate it for a new token.
func (h *Host) AddCredential(ctx context.Context, name string) (wire.CredentialChange, error) {
	if err := ValidateCredentialName(name); err != nil {
		return wire.CredentialChange{}, err
	}
	token, err := statedir.NewToken()
	if err != nil {
		return wire.CredentialChange{}, err
	}
	res, err := ledger.Write(ctx, h.ledger, ledger.Named[wire.CredentialChange]("credential"), func(tx *store.Tx) (wire.CredentialChange, error) {
		switch c, err := tx.CredentialGet(ctx, name); {
		case err == nil && c.RevokedMS != 0:
			return wire.CredentialChange{}, fleet.Errorf(wire.CodeStateConflict, "credential %s exists, revoked; a revoked name is not given out again", name)
		case err == nil:
			return wire.CredentialChange{}, fleet.Errorf(wire.CodeStateConflict, "credential %s exists; rotate it for a new token", name)
		case !store.IsNotFound(err):
			return wire.CredentialChange{}, err
		}
		c := store.Credential{Name: name, Role: RoleWorker, SHA256: fleet.DigestHex([]byte(token)), CreatedMS: tx.NowMS()}
		if err := tx.CredentialInsert(ctx, c); err != nil {
			return wire.CredentialChange{}, err
		}
		return h.credentialChanged(ctx, tx, c, wire.DecisionAdded, token)
	})
	if err != nil {
		return wire.CredentialChange{}, err
	}
	if err := h.loadCredentials(ctx); err != nil {
		return res, err
	}
	h.Log.Info("credential", "name", name, "decision", "add", "receipt_id", res.ReceiptID)
	if err := h.writeCredentialToken(ctx, name, token); err != nil {
		return res, fmt.Errorf("added %s, but its file was not written (the token is in this answer): %w", name, err)
	}
	return res, nil
}

// writeCredentialToken writes a new token (added or rotated) to the
// credential's file, unless a later rotation has committed meanwhile:
// under the state directory's credential lock it writes only while the
// database still holds this token's digest. Two rotations in flight
// (through one host or several) then leave the file holding the token the
// database accepts, whichever of them reaches the file first.
func (h *Host) writeCredentialToken(ctx context.Context, name, token string) error {
	unlock, err := statedir.LockCredentials(h.stateDir)
	if err != nil {
		return err
	}
	defer unlock()
	var current store.Credential
	if err := h.db.Read(ctx, func(tx *store.Tx) (err error) {
		current, err = tx.CredentialGet(ctx, name)
		return err
	}); err != nil {
		return err
	}
	if current.SHA256 != fleet.DigestHex([]byte(token)) {
		return nil // a later rotation's token is in force; its writer writes it
	}
	return statedir.WriteCredential(h.stateDir, name, token)
}

// changeCredential applies change to the named credential in one
// transaction with its receipt and event, and refreshes this host's copy
// of the credentials at once.
func (h *Host) changeCredential(ctx context.Context, verb, name string,
	change func(tx *store.Tx, c *store.Credential) (wire.Decision, string, error)) (wire.CredentialChange, error) {
	res, err := ledger.Write(ctx, h.ledger, ledger.Named[wire.CredentialChange]("credential"), func(tx *store.Tx) (wire.CredentialChange, error) {
		c, err := tx.CredentialGet(ctx, name)
		if store.IsNotFound(err) {
			return wire.CredentialChange{}, fleet.Errorf(wire.CodeNotFound, "no credential named %.80q", name)
		}
		if err != nil {
			return wire.CredentialChange{}, err
		}
		if c.RevokedMS != 0 && verb == "revoke" {
			return wire.CredentialChange{Credential: credentialOf(c)}, nil // revoked already: nothing to do
		}
		decision, token, err := change(tx, &c)
		if err != nil {
			return wire.CredentialChange{}, err
		}
		if err := tx.CredentialUpdate(ctx, c); err != nil {
			return wire.CredentialChange{}, err
		}
		return h.credentialChanged(ctx, tx, c, decision, token)
	})
	if err != nil {
		return wire.CredentialChange{}, err
	}
	if res.Changed {
		if err := h.loadCredentials(ctx); err != nil {
			return res, err
		}
		h.Log.Info("credential", "name", name, "decision", verb, "receipt_id", res.ReceiptID)
	}
	return res, nil
}

// credentialChanged signs a credential change (a credential receipt) and
// logs it, in the change's transaction.
func (h *Host) credentialChanged(ctx context.Context, tx *store.Tx, c store.Credential, decision wire.Decision, token string) (wire.CredentialChange, error) {
	acct, err := tx.AccountingGet(ctx, store.NoLock)
	if err != nil {
		return wire.CredentialChange{}, err
	}
	r, err := h.ledger.IssueReceipt(tx, receipts.Draft{Kind: wire.KindCredential, OperationID: "credential:" + c.Name,
		Caller: OperatorName, Decision: decision, Accounting: acct})
	if err != nil {
		return wire.CredentialChange{}, err
	}
	return wire.CredentialChange{Credential: credentialOf(c), Changed: true, ReceiptID: r.ID, Token: token},
		ledger.AppendEvent(ctx, tx, wire.EventCredential, OperatorName,
			fmt.Sprintf("The operator %s the %s credential %s", decision, c.Role, c.Name),
			map[string]any{"credential": c.Name, "role": c.Role, "decision": decision, "receipt_id": r.ID})
}
