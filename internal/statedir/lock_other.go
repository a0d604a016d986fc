//go:build !unix

package statedir

import "sync"

var credentialsMu sync.Mutex

// LockCredentials serializes the writers of credential files within this
// process; on systems without flock(2), hosts sharing one state
// directory are not serialized with each other.
func LockCredentials(string) (unlock func(), err error) {
	credentialsMu.Lock()
	return credentialsMu.Unlock, nil
}
