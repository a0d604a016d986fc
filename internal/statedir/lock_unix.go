//go:build unix

package statedir

import (
	"fmt"
	"os"
	"path/filepath"
	"syscall"
)

// LockCredentials takes the state directory's credential lock, waiting
// for it: an exclusive flock(2) on credentials/.lock, held until unlock.
// It serializes the writers of credential files across the processes
// serving one state directory (and across goroutines of one, since each
// call opens the file anew).
func LockCredentials(stateDir string) (unlock func(), err error) {
	dir := filepath.Join(stateDir, CredentialsDir)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("credentials directory: %w", err)
	}
	f, err := os.OpenFile(filepath.Join(dir, ".lock"), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("credential lock: %w", err)
	}
	for {
		err = syscall.Flock(int(f.Fd()), syscall.LOCK_EX)
		if err != syscall.EINTR {
			break
		}
	}
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("credential lock: %w", err)
	}
	return func() { f.Close() }, nil // closing the file lets the lock go
}
