package fleet

import (
	"crypto/sha256"
	"encoding/hex"
	"slices"
)

// Caller is who is making a request, as established by the trusted adapter
// (the HTTP layer's credential check), never by a request body.
type Caller struct {
	// ID is the identity bound to the credential, e.g. "worker-2"; it is
	// what assignments name as owner.
	ID string
	// CredentialSHA256 is the hex SHA-256 of the credential presented; it is
	// part of every operation binding.
	CredentialSHA256 string
	// Capped: the credential has an allowance of its own (fixed when it
	// was added), which its admissions reserve at too.
	Capped bool
	// Tenants are the only tenants whose jobs the credential may claim,
	// hold and read (fixed when it was added); nil for every tenant.
	Tenants []string
}

// Serves reports whether the caller may work on the tenant's jobs.
func (c Caller) Serves(tenant string) bool {
	return c.Tenants == nil || slices.Contains(c.Tenants, tenant)
}

// DigestHex is the hex SHA-256 of s.
func DigestHex(s []byte) string {
	sum := sha256.Sum256(s)
	return hex.EncodeToString(sum[:])
}
