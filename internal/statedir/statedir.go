// Package statedir is a host's state directory on disk: where its database,
// credential files and trusted-kernel.json live, and how files in it are
// written (to a temporary name, synced, renamed). It links no database
// driver, so workers and tools read credentials through it.
package statedir

import (
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// Files of a state directory.
const (
	DatabaseFile      = "fleet.sqlite3"
	CredentialsDir    = "credentials"
	TrustedKernelFile = "trusted-kernel.json"
	OperatorName      = "operator"
)

// Location is where a state's database is: the SQLite file in the state
// directory, or database when that is set (a postgres:// URL shared by
// several hosts).
func Location(stateDir, database string) string {
	if database != "" {
		return database
	}
	return filepath.Join(stateDir, DatabaseFile)
}

// CredentialPath is the file of the credential named name.
func CredentialPath(stateDir, name string) string {
	return filepath.Join(stateDir, CredentialsDir, name)
}

// NewCredential makes a fresh bearer token (32 random bytes) and writes it
// to the credential file of name (mode 0600). The caller records its
// digest; the file is written first so that a recorded credential always
// has its file.
func NewCredential(stateDir, name string) (token string, err error) {
	if token, err = NewToken(); err != nil {
		return "", err
	}
	return token, WriteCredential(stateDir, name, token)
}

// NewToken makes a fresh credential token (256 random bits).
func NewToken() (string, error) {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		return "", err
	}
	return "fleet_" + base64.RawURLEncoding.EncodeToString(b), nil
}

// WriteCredential writes a token to its credential file, replacing any.
func WriteCredential(stateDir, name, token string) error {
	if err := os.MkdirAll(filepath.Join(stateDir, CredentialsDir), 0o700); err != nil {
		return fmt.Errorf("credentials directory: %w", err)
	}
	if err := WriteFileAtomic(CredentialPath(stateDir, name), []byte(token+"\n"), 0o600); err != nil {
		return fmt.Errorf("credential %s: %w", name, err)
	}
	return nil
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

// HostIDFile holds the identity a host serving this directory takes when
// serve is given no --host-id.
const HostIDFile = "host-id"

// HostID is this state directory's host identity: the host-id file's
// content, made on first use ("host-" and 8 random hex digits). Hosts that
// share one directory must each be given their own --host-id instead.
func HostID(stateDir string) (string, error) {
	path := filepath.Join(stateDir, HostIDFile)
	for attempt := 0; attempt < 2; attempt++ {
		data, err := os.ReadFile(path)
		if err == nil {
			id := strings.TrimSpace(string(data))
			if id == "" {
				return "", fmt.Errorf("%s is empty; remove it or pass --host-id", path)
			}
			return id, nil
		}
		if !errors.Is(err, fs.ErrNotExist) {
			return "", fmt.Errorf("read host id: %w", err)
		}
		b := make([]byte, 4)
		if _, err := rand.Read(b); err != nil {
			return "", err
		}
		// Written whole under a temporary name, then linked into place, so
		// two hosts starting at once agree on the first one's id.
		tmp := path + ".new-" + hex.EncodeToString(b)
		if err := WriteFileAtomic(tmp, []byte("host-"+hex.EncodeToString(b)+"\n"), 0o600); err != nil {
			return "", fmt.Errorf("write host id: %w", err)
		}
		err = os.Link(tmp, path)
		os.Remove(tmp)
		if err != nil && !errors.Is(err, fs.ErrExist) {
			return "", fmt.Errorf("write host id: %w", err)
		}
	}
	return "", fmt.Errorf("read host id: %s keeps changing", path)
}
