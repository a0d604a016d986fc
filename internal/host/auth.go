package host

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"fmt"
	"regexp"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sync/singleflight"

	"github.com/fleet/fleet/internal/fleet"
	"github.com/fleet/fleet/internal/statedir"
	"github.com/fleet/fleet/internal/store"
	"github.com/fleet/fleet/internal/wire"
)

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
func (h *Host) Authenticate(ctx context.Context, token string) (fleet.Caller, string, error) {
	return h.authenticateDigest(ctx, sha256.Sum256([]byte(token)))
}

// InForce checks that the credential a caller was authenticated with (its
// digest, fleet.Caller's CredentialSHA256) is still in force, as
// Authenticate would find its token now, and returns its role. What lives
// on past one request (a console session, an event stream) asks it again,
// so a rotation or revocation ends it within the second the token stops
// working.
func (h *Host) InForce(ctx context.Context, caller fleet.Caller) (string, error) {
	d, err := hex.DecodeString(caller.CredentialSHA256)
	if err != nil || len(d) != sha256.Size {
		return "", fleet.Errorf(wire.CodeUnauthorized, "unknown credential")
	}
	var digest [sha256.Size]byte
	copy(digest[:], d)
	found, role, err := h.authenticateDigest(ctx, digest)
	if err == nil && found.ID != caller.ID {
		err = fleet.Errorf(wire.CodeUnauthorized, "unknown credential")
	}
	return role, err
}

func (h *Host) authenticateDigest(ctx context.Context, digest [sha256.Size]byte) (fleet.Caller, string, error) {
	found, ok, loadedAt := h.creds.find(digest)
	if h.db.Now().Sub(loadedAt) >= credentialsFresh {
		_, err, _ := h.creds.reload.Do("", func() (any, error) {
			// Shared by every request that finds the copy stale, so not
			// ended by any one's client; bounded, so a database that does
			// not answer is an error rather than a wait.
			ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), credentialsReadTimeout)
			defer cancel()
			return nil, h.loadCredentials(ctx)
		})
		if err != nil {
			return fleet.Caller{}, "", err
		}
		found, ok, _ = h.creds.find(digest)
	}
	if !ok {
		return fleet.Caller{}, "", fleet.Errorf(wire.CodeUnauthorized, "unknown credential")
	}
	if found.revokedMS != 0 {
		return fleet.Caller{}, "", fleet.Errorf(wire.CodeUnauthorized, "credential %s was revoked at %s; ask the operator for a new one",
			found.name, time.UnixMilli(found.revokedMS).UTC().Format(time.RFC3339))
	}
	if found.role == RoleWorker {
		h.noteCall(found.name)
	}
	return fleet.Caller{ID: found.name, CredentialSHA256: hex.EncodeToString(digest[:])}, found.role, nil
}

// noteCall records that a worker called this host now.
func (h *Host) noteCall(worker string) {
	at, ok := h.lastCall.Load(worker)
	if !ok {
		at, _ = h.lastCall.LoadOrStore(worker, new(atomic.Int64))
	}
	at.(*atomic.Int64).Store(h.db.Now().UnixMilli())
}

func (h *Host) loadCredentials(ctx context.Context) error {
	h.creds.loading.Lock()
	defer h.creds.loading.Unlock()
	var all []credential
	err := h.db.Read(ctx, func(tx *store.Tx) error {
		stored, err := tx.CredentialList(ctx)
		if err != nil {
			return err
		}
		for _, s := range stored {
			d, err := hex.DecodeString(s.SHA256)
			if err != nil || len(d) != sha256.Size {
				return fmt.Errorf("credential %s: stored digest is not SHA-256 hex", s.Name)
			}
			c := credential{name: s.Name, role: s.Role, revokedMS: s.RevokedMS}
			copy(c.digest[:], d)
			all = append(all, c)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("load credentials: %w", err)
	}
	h.creds.mu.Lock()
	h.creds.all, h.creds.loadedAt = all, h.db.Now()
	h.creds.mu.Unlock()
	return nil
}

// ValidateCredentialName refuses a name no credential can have.
func ValidateCredentialName(name string) error {
	if !credentialName.MatchString(name) {
		return fleet.Errorf(wire.CodeInvalid, "credential name %.80q must be 1 to 64 of a-z, 0-9, '.', '_', '-'", name)
	}
	return nil
}

// addCredential writes the credential file and records its digest in tx.
// The file is written first so that a committed credential always has its
// file.
func addCredential(ctx context.Context, tx *store.Tx, stateDir, name, role string) error {
	if err := ValidateCredentialName(name); err != nil {
		return err
	}
	if (name == OperatorName) != (role == RoleOperator) {
		return fleet.Errorf(wire.CodeInvalid, "the name %q is reserved for the operator credential", OperatorName)
	}
	switch _, err := tx.CredentialGet(ctx, name); {
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
func AddWorkerCredential(ctx context.Context, stateDir string, db *store.DB, name string) error {
	return db.WithTx(ctx, func(tx *store.Tx) error { return addCredential(ctx, tx, stateDir, name, RoleWorker) })
}
