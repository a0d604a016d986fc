package host

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"time"

	"github.com/fleet/fleet/internal/fleet"
	"github.com/fleet/fleet/internal/store"
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
}

// credentialCache holds every credential's digest. Lookups compare against
// all of them in constant time per entry, so timing says nothing about which
// digest a token was close to.
type credentialCache struct {
	mu       sync.Mutex
	all      []credential
	loadedAt time.Time
}

// Authenticate maps a bearer token to its caller and role. An unknown token
// is unauthorized. A credential added while the host serves is found after a
// reload, at most once a second.
func (h *Host) Authenticate(ctx context.Context, token string) (fleet.Caller, string, error) {
	digest := sha256.Sum256([]byte(token))
	h.creds.mu.Lock()
	defer h.creds.mu.Unlock()
	for attempt := 0; attempt < 2; attempt++ {
		var found *credential
		for i := range h.creds.all {
			if subtle.ConstantTimeCompare(digest[:], h.creds.all[i].digest[:]) == 1 {
				found = &h.creds.all[i]
			}
		}
		if found != nil {
			return fleet.Caller{ID: found.name, CredentialSHA256: hex.EncodeToString(digest[:])}, found.role, nil
		}
		if attempt == 0 && time.Since(h.creds.loadedAt) > time.Second {
			if err := h.loadCredentials(ctx); err != nil {
				return fleet.Caller{}, "", err
			}
			continue
		}
		break
	}
	return fleet.Caller{}, "", fleet.Errorf(fleet.CodeUnauthorized, "unknown credential")
}

func (h *Host) loadCredentials(ctx context.Context) error {
	var all []credential
	err := h.db.Read(ctx, func(tx *store.Tx) error {
		rows, err := tx.QueryContext(ctx, `SELECT name, role, sha256 FROM credentials`)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var c credential
			var hexDigest string
			if err := rows.Scan(&c.name, &c.role, &hexDigest); err != nil {
				return err
			}
			d, err := hex.DecodeString(hexDigest)
			if err != nil || len(d) != sha256.Size {
				return fmt.Errorf("credential %s: stored digest is not SHA-256 hex", c.name)
			}
			copy(c.digest[:], d)
			all = append(all, c)
		}
		return rows.Err()
	})
	if err != nil {
		return fmt.Errorf("load credentials: %w", err)
	}
	h.creds.all, h.creds.loadedAt = all, time.Now()
	return nil
}

// newToken is a fresh bearer credential: 32 random bytes.
func newToken() (string, error) {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		return "", err
	}
	return "fleet_" + base64.RawURLEncoding.EncodeToString(b), nil
}

// addCredential writes the credential file (mode 0600, written to a temporary
// name, synced and renamed) and records its digest in tx. The file is written
// first so that a committed credential always has its file.
func addCredential(ctx context.Context, tx *store.Tx, stateDir, name, role string) error {
	if !credentialName.MatchString(name) {
		return fleet.Errorf(fleet.CodeInvalid, "credential name %q must be 1 to 64 of a-z, 0-9, '.', '_', '-'", name)
	}
	if (name == OperatorName) != (role == RoleOperator) {
		return fleet.Errorf(fleet.CodeInvalid, "the name %q is reserved for the operator credential", OperatorName)
	}
	var exists int
	if err := tx.QueryRowContext(ctx, `SELECT COUNT(*) FROM credentials WHERE name = $1`, name).Scan(&exists); err != nil {
		return err
	}
	if exists > 0 {
		return fleet.Errorf(fleet.CodeInvalid, "a credential named %q already exists", name)
	}
	token, err := newToken()
	if err != nil {
		return err
	}
	dir := filepath.Join(stateDir, CredentialsDir)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("credentials directory: %w", err)
	}
	if err := WriteFileAtomic(filepath.Join(dir, name), []byte(token+"\n"), 0o600); err != nil {
		return fmt.Errorf("credential %s: %w", name, err)
	}
	if _, err := tx.ExecContext(ctx,
		`INSERT INTO credentials (name, role, sha256, created_at_ms) VALUES ($1, $2, $3, $4)`,
		name, role, fleet.DigestHex([]byte(token)), tx.NowMS()); err != nil {
		return fmt.Errorf("record credential %s: %w", name, err)
	}
	return nil
}

// AddWorkerCredential adds a worker credential to a state directory, e.g.
// while a host serves it, so a fleet can grow.
func AddWorkerCredential(ctx context.Context, stateDir, database, name string) error {
	db, err := store.Open(ctx, Location(stateDir, database))
	if err != nil {
		return err
	}
	defer db.Close()
	return db.WithTx(ctx, func(tx *store.Tx) error { return addCredential(ctx, tx, stateDir, name, RoleWorker) })
}

// ReadCredential reads a credential file, trimming the newline.
func ReadCredential(path string) (string, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("read credential: %w", err)
	}
	token := strings.TrimSpace(string(data))
	if token == "" {
		return "", fmt.Errorf("read credential %s: the file is empty", path)
	}
	return token, nil
}

// WriteFileAtomic writes data to a temporary name in the same directory,
// syncs it and renames it over path, so readers see the old file or the new
// one, never a torn one.
func WriteFileAtomic(path string, data []byte, mode os.FileMode) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if err := tmp.Chmod(mode); err != nil {
		tmp.Close()
		return err
	}
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return err
	}
	// Sync the directory so the rename itself survives a crash.
	if d, err := os.Open(filepath.Dir(path)); err == nil {
		d.Sync()
		d.Close()
	}
	return nil
}
