// Package access is who may call the host: every credential's digest, in
// a copy each host refreshes within a second of a change made anywhere;
// authentication of a bearer token, or of the credential a session or a
// stream was opened with; when each worker last called; and the
// operator's changes (add, revoke, rotate), each signed and logged in the
// change's transaction.
package access

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"fmt"
	"regexp"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sync/singleflight"

	"github.com/fleet/fleet/internal/budget"
	"github.com/fleet/fleet/internal/fleet"
	"github.com/fleet/fleet/internal/host/ledger"
	"github.com/fleet/fleet/internal/receipts"
	"github.com/fleet/fleet/internal/statedir"
	"github.com/fleet/fleet/internal/store"
	"github.com/fleet/fleet/internal/wire"
)

// OperatorName is the operator credential's name, and the caller of the
// operator's events and receipts.
const OperatorName = statedir.OperatorName

// Credentials is one host's view of the state's credentials.
type Credentials struct {
	ledger   *ledger.Ledger
	stateDir string
	cache    credentialCache
	// lastCall is when each worker credential last called this host
	// (name -> *atomic.Int64, Unix ms), for the workers view.
	lastCall sync.Map
}

// New serves the credentials of the state in stateDir, written through l.
func New(l *ledger.Ledger, stateDir string) *Credentials {
	return &Credentials{ledger: l, stateDir: stateDir}
}

// LastCall is when the worker credential name last called this host
// (Unix ms), if it has since the host started.
func (a *Credentials) LastCall(name string) (int64, bool) {
	at, ok := a.lastCall.Load(name)
	if !ok {
		return 0, false
	}
	return at.(*atomic.Int64).Load(), true
}

// Roles a credential can have.
const (
	RoleWorker   = "worker"
	RoleOperator = "operator"
)

var credentialName = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]{0,63}$`)

type credential struct {
	name   string
	role   string
	digest [sha256.Size]byte
	// revokedMS is when it was revoked (0: in force). A revoked one is
	// kept so that its holder is told so, not that it is unknown.
	revokedMS int64
	// capped: it has an allowance of its own; tenants: the only tenants
	// it serves (nil: all). Both are fixed when it is added, so the copy
	// says what the database does once the credential is known.
	capped  bool
	tenants []string
}

// credentialCache holds every credential's digest. Lookups compare against
// all of them in constant time per entry, so timing says nothing about which
// digest a token was close to.
type credentialCache struct {
	mu       sync.RWMutex
	all      []credential
	loadedAt time.Time
	// reload makes concurrent misses share one read of the credentials.
	reload singleflight.Group
	// loading serializes reads of the credentials, so a read that began
	// before a change committed never replaces one that began after it
	// (two rotations' reloads finishing in the other order).
	loading sync.Mutex
}

func (c *credentialCache) find(digest [sha256.Size]byte) (credential, bool, time.Time) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	var found credential
	ok := false
	for _, cr := range c.all {
		if subtle.ConstantTimeCompare(digest[:], cr.digest[:]) == 1 {
			found, ok = cr, true
		}
	}
	return found, ok, c.loadedAt
}

// credentialsFresh is how long the host trusts its copy of the
// credentials: a revocation or rotation made anywhere (another host, the
// CLI) takes effect here within it.
const credentialsFresh = time.Second

// credentialsReadTimeout bounds a reread of the credentials as long as a
// write transaction is given: a request waits out a database that stalls
// for less (its body, sent meanwhile, is then read), and is answered
// unavailable past it.
const credentialsReadTimeout = store.TxDeadline

// Authenticate maps a bearer token to its caller and role. An unknown or
// revoked token is unauthorized. The credentials are read again once the
// copy is a second old (or older), whatever arrives, so that a credential
// added, revoked or rotated by another process counts here within a
// second; at most once a second, however many unknown tokens arrive.
func (a *Credentials) Authenticate(ctx context.Context, token string) (fleet.Caller, string, error) {
	return a.authenticateDigest(ctx, sha256.Sum256([]byte(token)))
}

// InForce checks that the credential a caller was authenticated with (its
// digest, fleet.Caller's CredentialSHA256) is still in force, as
// Authenticate would find its token now, and returns its role. What lives
// on past one request (a console session, an event stream) asks it again,
// so a rotation or revocation ends it within the second the token stops
// working.
func (a *Credentials) InForce(ctx context.Context, caller fleet.Caller) (string, error) {
	d, err := hex.DecodeString(caller.CredentialSHA256)
	if err != nil || len(d) != sha256.Size {
		return "", fleet.Errorf(wire.CodeUnauthorized, "unknown credential")
	}
	var digest [sha256.Size]byte
	copy(digest[:], d)
	found, role, err := a.authenticateDigest(ctx, digest)
	if err == nil && found.ID != caller.ID {
		err = fleet.Errorf(wire.CodeUnauthorized, "unknown credential")
	}
	return role, err
}

func (a *Credentials) authenticateDigest(ctx context.Context, digest [sha256.Size]byte) (fleet.Caller, string, error) {
	found, ok, loadedAt := a.cache.find(digest)
	if a.ledger.DB().Now().Sub(loadedAt) >= credentialsFresh {
		_, err, _ := a.cache.reload.Do("", func() (any, error) {
			// Shared by every request that finds the copy stale, so not
			// ended by any one's client; bounded, so a database that does
			// not answer is an error rather than a wait.
			ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), credentialsReadTimeout)
			defer cancel()
			return nil, a.Load(ctx)
		})
		if err != nil {
			return fleet.Caller{}, "", err
		}
		found, ok, _ = a.cache.find(digest)
	}
	if !ok {
		return fleet.Caller{}, "", fleet.Errorf(wire.CodeUnauthorized, "unknown credential")
	}
	if found.revokedMS != 0 {
		return fleet.Caller{}, "", fleet.Errorf(wire.CodeUnauthorized, "credential %s was revoked at %s; ask the operator for a new one",
			found.name, time.UnixMilli(found.revokedMS).UTC().Format(time.RFC3339))
	}
	if found.role == RoleWorker {
		a.noteCall(found.name)
	}
	return fleet.Caller{ID: found.name, CredentialSHA256: hex.EncodeToString(digest[:]), Capped: found.capped,
		Tenants: found.tenants}, found.role, nil
}

// noteCall records that a worker called this host now.
func (a *Credentials) noteCall(worker string) {
	at, ok := a.lastCall.Load(worker)
	if !ok {
		at, _ = a.lastCall.LoadOrStore(worker, new(atomic.Int64))
	}
	at.(*atomic.Int64).Store(a.ledger.DB().Now().UnixMilli())
}

func (a *Credentials) Load(ctx context.Context) error {
	a.cache.loading.Lock()
	defer a.cache.loading.Unlock()
	var all []credential
	err := a.ledger.DB().Read(ctx, func(tx *store.Tx) error {
		stored, err := tx.CredentialList(ctx)
		if err != nil {
			return err
		}
		for _, s := range stored {
			d, err := hex.DecodeString(s.SHA256)
			if err != nil || len(d) != sha256.Size {
				return fmt.Errorf("credential %s: stored digest is not SHA-256 hex", s.Name)
			}
			c := credential{name: s.Name, role: s.Role, revokedMS: s.RevokedMS, capped: s.Allowance != nil, tenants: s.Tenants}
			copy(c.digest[:], d)
			all = append(all, c)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("load credentials: %w", err)
	}
	a.cache.mu.Lock()
	a.cache.all, a.cache.loadedAt = all, a.ledger.DB().Now()
	a.cache.mu.Unlock()
	return nil
}

// ValidateCredentialName refuses a name no credential can have.
func ValidateName(name string) error {
	if !credentialName.MatchString(name) {
		return fleet.Errorf(wire.CodeInvalid, "credential name %.80q must be 1 to 64 of a-z, 0-9, '.', '_', '-'", name)
	}
	return nil
}

// addCredential writes the credential file and records its digest in tx.
// The file is written first so that a committed credential always has its
// file.
func Insert(ctx context.Context, tx *store.Tx, stateDir, name, role string) error {
	if err := ValidateName(name); err != nil {
		return err
	}
	if (name == OperatorName) != (role == RoleOperator) {
		return fleet.Errorf(wire.CodeInvalid, "the name %q is reserved for the operator credential", OperatorName)
	}
	switch _, err := tx.CredentialGet(ctx, name, store.NoLock); {
	case err == nil:
		return fleet.Errorf(wire.CodeInvalid, "a credential named %q already exists", name)
	case !store.IsNotFound(err):
		return err
	}
	token, err := statedir.NewCredential(stateDir, name)
	if err != nil {
		return err
	}
	return tx.CredentialInsert(ctx, store.Credential{Name: name, Role: role,
		SHA256: fleet.DigestHex([]byte(token)), CreatedMS: tx.NowMS()})
}

// AddWorkerCredential adds a worker credential to a state's database (the
// caller opened it), e.g. while a host serves it, so a fleet can grow.
func AddWorker(ctx context.Context, stateDir string, db *store.DB, name string) error {
	return db.WithTx(ctx, func(tx *store.Tx) error { return Insert(ctx, tx, stateDir, name, RoleWorker) })
}

// Credentials lists every credential, revoked ones included, by name.
func (a *Credentials) List(ctx context.Context) ([]wire.Credential, error) {
	var out []wire.Credential
	err := a.ledger.DB().Read(ctx, func(tx *store.Tx) error {
		stored, err := tx.CredentialList(ctx)
		out = make([]wire.Credential, 0, len(stored)) // a read may run again
		for _, c := range stored {
			out = append(out, credentialOf(c))
		}
		return err
	})
	return out, err
}

func credentialOf(c store.Credential) wire.Credential {
	out := wire.Credential{Name: c.Name, Role: c.Role, CreatedAtMS: c.CreatedMS, RevokedAtMS: c.RevokedMS,
		Allowance: c.Allowance, Spent: c.Spent, Reserved: c.Reserved, Tenants: c.Tenants}
	if out.Tenants == nil {
		out.Tenants = []string{}
	}
	return out
}

// RevokeCredential ends a worker credential: within a second no host
// serving the state accepts it (see Authenticate). Its claims are left as
// they are, to expire or be reassigned like any worker's that went away.
// The revocation is signed (a credential receipt) and logged; revoking a
// credential revoked already changes nothing. The operator credential
// cannot be revoked, only rotated, or nobody could run the state.
func (a *Credentials) Revoke(ctx context.Context, name string) (wire.CredentialChange, error) {
	return a.change(ctx, "revoke", name, func(tx *store.Tx, c *store.Credential) (wire.Decision, string, error) {
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
func (a *Credentials) Rotate(ctx context.Context, name string) (wire.CredentialChange, error) {
	change, err := a.change(ctx, "rotate", name, func(tx *store.Tx, c *store.Credential) (wire.Decision, string, error) {
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
	if err := a.writeToken(ctx, name, change.Token); err != nil {
		// Committed: the token in the answer is the one that works.
		return change, fmt.Errorf("rotated %s, but its file was not written (the new token is in this answer): %w", name, err)
	}
	return change, nil
}

// Terms are what a worker credential is added with, fixed for its life.
type Terms struct {
	// Allowance is its own cap in credits; nil for none.
	Allowance *int64
	// Tenants are the only tenants whose jobs it claims; none for all.
	Tenants []string
}

// check refuses terms no credential can have, and puts the tenants in
// name order, each once.
func (t *Terms) check() error {
	if t.Allowance != nil {
		if err := budget.ValidateAllowance(*t.Allowance); err != nil {
			return err
		}
	}
	for _, name := range t.Tenants {
		if err := budget.ValidateTenantName(name); err != nil {
			return err
		}
	}
	t.Tenants = slices.Compact(slices.Sorted(slices.Values(t.Tenants)))
	if len(t.Tenants) == 0 {
		t.Tenants = nil
	}
	return nil
}

// checkTenants refuses tenants that do not exist (read in one statement:
// a list of names is bounded by the tenants there are).
func checkTenants(ctx context.Context, tx *store.Tx, names []string) error {
	if len(names) == 0 {
		return nil
	}
	all, err := tx.TenantList(ctx)
	if err != nil {
		return err
	}
	for _, name := range names {
		if !slices.ContainsFunc(all, func(t store.Tenant) bool { return t.Name == name }) {
			return fleet.Errorf(wire.CodeNotFound, "tenant %s not found (fleetctl tenant add makes one)", name)
		}
	}
	return nil
}

// Add adds a worker credential while the host serves: its token is
// returned (this once) and, once the addition has committed, written to
// credentials/NAME in the state directory; every host serving the state
// takes it within a second. The addition is signed (a credential receipt,
// decision added) and logged. A name already taken, by a credential in
// force or revoked, is a state conflict: rotate it for a new token. A
// tenant named that does not exist is not found.
func (a *Credentials) Add(ctx context.Context, name string, terms Terms) (wire.CredentialChange, error) {
	if err := ValidateName(name); err != nil {
		return wire.CredentialChange{}, err
	}
	if err := terms.check(); err != nil {
		return wire.CredentialChange{}, err
	}
	token, err := statedir.NewToken()
	if err != nil {
		return wire.CredentialChange{}, err
	}
	res, err := ledger.Write(ctx, a.ledger, ledger.Named[wire.CredentialChange]("credential"), func(tx *store.Tx) (wire.CredentialChange, error) {
		switch c, err := tx.CredentialGet(ctx, name, store.NoLock); {
		case err == nil && c.RevokedMS != 0:
			return wire.CredentialChange{}, fleet.Errorf(wire.CodeStateConflict, "credential %s exists, revoked; a revoked name is not given out again", name)
		case err == nil:
			return wire.CredentialChange{}, fleet.Errorf(wire.CodeStateConflict, "credential %s exists; rotate it for a new token", name)
		case !store.IsNotFound(err):
			return wire.CredentialChange{}, err
		}
		if err := checkTenants(ctx, tx, terms.Tenants); err != nil {
			return wire.CredentialChange{}, err
		}
		c := store.Credential{Name: name, Role: RoleWorker, SHA256: fleet.DigestHex([]byte(token)), CreatedMS: tx.NowMS(),
			Allowance: terms.Allowance, Tenants: terms.Tenants}
		if err := tx.CredentialInsert(ctx, c); err != nil {
			return wire.CredentialChange{}, err
		}
		return a.changed(ctx, tx, c, wire.DecisionAdded, token)
	})
	if err != nil {
		return wire.CredentialChange{}, err
	}
	if err := a.Load(ctx); err != nil {
		return res, err
	}
	a.ledger.Log.Info("credential", "name", name, "decision", "add", "receipt_id", res.ReceiptID)
	if err := a.writeToken(ctx, name, token); err != nil {
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
func (a *Credentials) writeToken(ctx context.Context, name, token string) error {
	unlock, err := statedir.LockCredentials(a.stateDir)
	if err != nil {
		return err
	}
	defer unlock()
	var current store.Credential
	if err := a.ledger.DB().Read(ctx, func(tx *store.Tx) (err error) {
		current, err = tx.CredentialGet(ctx, name, store.NoLock)
		return err
	}); err != nil {
		return err
	}
	if current.SHA256 != fleet.DigestHex([]byte(token)) {
		return nil // a later rotation's token is in force; its writer writes it
	}
	return statedir.WriteCredential(a.stateDir, name, token)
}

// changeCredential applies change to the named credential in one
// transaction with its receipt and event, and refreshes this host's copy
// of the credentials at once.
func (a *Credentials) change(ctx context.Context, verb, name string,
	change func(tx *store.Tx, c *store.Credential) (wire.Decision, string, error)) (wire.CredentialChange, error) {
	res, err := ledger.Write(ctx, a.ledger, ledger.Named[wire.CredentialChange]("credential"), func(tx *store.Tx) (wire.CredentialChange, error) {
		// Locked: a revocation and a rotation racing from two hosts would
		// otherwise each write what it read, and the later could put the
		// credential back in force.
		c, err := tx.CredentialGet(ctx, name, store.ForUpdate)
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
		return a.changed(ctx, tx, c, decision, token)
	})
	if err != nil {
		return wire.CredentialChange{}, err
	}
	if res.Changed {
		if err := a.Load(ctx); err != nil {
			return res, err
		}
		a.ledger.Log.Info("credential", "name", name, "decision", verb, "receipt_id", res.ReceiptID)
	}
	return res, nil
}

// credentialChanged signs a credential change (a credential receipt) and
// logs it, in the change's transaction.
func (a *Credentials) changed(ctx context.Context, tx *store.Tx, c store.Credential, decision wire.Decision, token string) (wire.CredentialChange, error) {
	acct, err := tx.AccountingGet(ctx, store.NoLock)
	if err != nil {
		return wire.CredentialChange{}, err
	}
	r, err := a.ledger.IssueReceipt(tx, receipts.Draft{Kind: wire.KindCredential, OperationID: "credential:" + c.Name,
		Caller: OperatorName, Decision: decision, Accounting: acct})
	if err != nil {
		return wire.CredentialChange{}, err
	}
	return wire.CredentialChange{Credential: credentialOf(c), Changed: true, ReceiptID: r.ID, Token: token},
		ledger.AppendEvent(ctx, tx, wire.EventCredential, OperatorName,
			fmt.Sprintf("The operator %s the %s credential %s", decision, c.Role, c.Name),
			map[string]any{"credential": c.Name, "role": c.Role, "decision": decision, "receipt_id": r.ID, "tenants": credentialOf(c).Tenants})
}
