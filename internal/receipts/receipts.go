// Package receipts signs every admission, publication, cancellation,
// requeue and reconciliation decision. A receipt's body is canonical JSON
// (RFC 8785). Its id is "rcpt-" plus the hex SHA-256 of the body as it was
// decided, before the log placed it: sequence 0 and prev null (a random
// nonce keeps two identical decisions apart). Its signature is Ed25519 by
// the kernel key over the whole body, sequence and prev included; prev
// names the receipt before, so the log is a hash chain.
//
// Deciding and placing are two steps because they happen at two times: the
// transaction that decides writes the receipt's id wherever it is referred
// to (the job, the event, the retained outcome), and the log's sequencer
// numbers, links and signs it in commit order (Seal), in that transaction
// or, where several hosts write at once, right after it commits.
package receipts

import (
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	mrand "math/rand/v2"

	"github.com/gowebpki/jcs"

	"github.com/fleet/fleet/internal/wire"
)

// Draft is what a caller decides; Sign fills in the rest.
type Draft struct {
	Kind        wire.ReceiptKind
	OperationID string
	Caller      string
	Decision    wire.Decision
	Cost        int64
	Reserved    *int64
	Pricing     *wire.Pricing
	Accounting  wire.Accounting
	Tenant      string
	Level       string
	Credential  string
}

// Kernel is the host's signing identity.
type Kernel struct {
	private   ed25519.PrivateKey
	PublicKey string // hex
}

// NewKernel makes a fresh Ed25519 key.
func NewKernel() (*Kernel, error) {
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("generate kernel key: %w", err)
	}
	return kernelFromSeed(priv.Seed()), nil
}

func kernelFromSeed(seed []byte) *Kernel {
	priv := ed25519.NewKeyFromSeed(seed)
	return &Kernel{private: priv, PublicKey: hex.EncodeToString(priv.Public().(ed25519.PublicKey))}
}

// LoadKernel rebuilds the kernel from its stored seed, refusing a seed that
// does not give the stored public key.
func LoadKernel(publicKey string, seed []byte) (*Kernel, error) {
	if len(seed) != ed25519.SeedSize {
		return nil, fmt.Errorf("load kernel key: stored seed is %d bytes", len(seed))
	}
	k := kernelFromSeed(seed)
	if k.PublicKey != publicKey {
		return nil, fmt.Errorf("load kernel key: stored public key does not match the seed")
	}
	return k, nil
}

// Seed is the private seed, for storing the kernel.
func (k *Kernel) Seed() []byte { return k.private.Seed() }

// Trusted describes the kernel's public key for offline verification.
func (k *Kernel) Trusted() wire.TrustedKernel {
	return wire.TrustedKernel{Algorithm: "Ed25519", PublicKey: k.PublicKey}
}

// Prepare makes the receipt for d, with its id and no place in the chain
// yet: what the deciding transaction refers to.
func (k *Kernel) Prepare(d Draft, issuedAtMS int64) wire.Receipt {
	body := wire.ReceiptBody{
		Kind: d.Kind, OperationID: d.OperationID, Caller: d.Caller,
		Decision: d.Decision, Cost: d.Cost, Reserved: d.Reserved, Pricing: d.Pricing, Accounting: d.Accounting, Tenant: d.Tenant, Level: d.Level, Credential: d.Credential,
		IssuedAtMS: issuedAtMS, KernelKey: k.PublicKey, Nonce: fmt.Sprintf("%016x", mrand.Uint64()),
	}
	return wire.Receipt{ID: idOf(body), ReceiptBody: body}
}

// Seal places r as the link after (prevSequence, prevID) ("" for the first)
// and signs it, returning the JSON to store.
func (k *Kernel) Seal(r *wire.Receipt, prevSequence int64, prevID string) ([]byte, error) {
	r.Sequence, r.Prev = prevSequence+1, nil
	if prevID != "" {
		r.Prev = &prevID
	}
	signed, err := encode(r.ReceiptBody)
	if err != nil {
		return nil, fmt.Errorf("seal receipt %s: %w", r.ID, err)
	}
	r.Signature = hex.EncodeToString(ed25519.Sign(k.private, signed))
	// Only the signed body must be canonical; the stored receipt is plain
	// JSON of the same fields (a verifier recanonicalizes the body).
	return json.Marshal(r)
}

// encode is the canonical body: by construction where it can be, else the
// generic pass.
func encode(b wire.ReceiptBody) ([]byte, error) {
	if out, ok := canonicalBody(b); ok {
		return out, nil
	}
	return canonical(b)
}

// Decode reads a stored receipt.
func Decode(stored []byte) (wire.Receipt, error) {
	var r wire.Receipt
	if err := json.Unmarshal(stored, &r); err != nil {
		return r, fmt.Errorf("decode receipt: %w", err)
	}
	return r, nil
}

func canonical(v any) ([]byte, error) {
	data, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	return jcs.Transform(data)
}

// idOf is the id of the decision b records: the digest of its body
// before the log placed it.
func idOf(b wire.ReceiptBody) string {
	b.Sequence, b.Prev = 0, nil
	decided, err := encode(b)
	if err != nil {
		return ""
	}
	sum := sha256.Sum256(decided)
	return "rcpt-" + hex.EncodeToString(sum[:])
}

// Verify checks one receipt against a hex Ed25519 public key: the kernel key
// it names, its id and its signature.
func Verify(r wire.Receipt, publicKeyHex string) error {
	pub, err := hex.DecodeString(publicKeyHex)
	if err != nil || len(pub) != ed25519.PublicKeySize {
		return fmt.Errorf("trusted kernel key is not a hex Ed25519 public key")
	}
	if r.KernelKey != publicKeyHex {
		return fmt.Errorf("receipt %s names kernel key %s, not the trusted one", r.ID, r.KernelKey)
	}
	signed, err := canonical(r.ReceiptBody)
	if err != nil {
		return fmt.Errorf("receipt %s: %w", r.ID, err)
	}
	if idOf(r.ReceiptBody) != r.ID {
		return fmt.Errorf("receipt %s: id does not match its body", r.ID)
	}
	sig, err := hex.DecodeString(r.Signature)
	if err != nil || !ed25519.Verify(pub, signed, sig) {
		return fmt.Errorf("receipt %s: signature does not verify", r.ID)
	}
	return nil
}

// VerifyPrepared checks a receipt the log has not placed yet: the kernel
// key it names and its id (there is no signature until it is placed).
func VerifyPrepared(r wire.Receipt, publicKeyHex string) error {
	if r.KernelKey != publicKeyHex {
		return fmt.Errorf("receipt %s names kernel key %s, not the trusted one", r.ID, r.KernelKey)
	}
	if idOf(r.ReceiptBody) != r.ID {
		return fmt.Errorf("receipt %s: id does not match its body", r.ID)
	}
	return nil
}

// VerifyChain checks every receipt and the chain: sequences contiguous from
// 1 and each prev naming the receipt before. It returns every violation.
func VerifyChain(chain []wire.Receipt, publicKeyHex string) []string {
	var violations []string
	for i, r := range chain {
		if err := Verify(r, publicKeyHex); err != nil {
			violations = append(violations, err.Error())
		}
		if r.Sequence != int64(i+1) {
			violations = append(violations, fmt.Sprintf("receipt %s has sequence %d, want %d", r.ID, r.Sequence, i+1))
		}
		switch {
		case i == 0 && r.Prev != nil:
			violations = append(violations, fmt.Sprintf("first receipt %s has prev %s", r.ID, *r.Prev))
		case i > 0 && (r.Prev == nil || *r.Prev != chain[i-1].ID):
			violations = append(violations, fmt.Sprintf("receipt %s does not link to %s", r.ID, chain[i-1].ID))
		}
	}
	return violations
}

// Check verifies r with the trusted key and its link to prev, the receipt
// its prev names (nil when it names none or that receipt is missing): what
// the console shows an operator.
func Check(r wire.Receipt, prev *wire.Receipt, publicKeyHex string) (wire.ReceiptCheck, error) {
	c := wire.ReceiptCheck{Receipt: r, Problems: []string{}}
	signed, err := canonical(r.ReceiptBody)
	if err != nil {
		return c, fmt.Errorf("canonicalize receipt %s: %w", r.ID, err)
	}
	c.CanonicalBody = string(signed)
	c.IDMatchesBody = idOf(r.ReceiptBody) == r.ID
	c.KernelTrusted = r.KernelKey == publicKeyHex
	if err := Verify(r, publicKeyHex); err != nil {
		c.Problems = append(c.Problems, err.Error())
	}
	if pub, err := hex.DecodeString(r.KernelKey); err == nil && len(pub) == ed25519.PublicKeySize {
		if sig, err := hex.DecodeString(r.Signature); err == nil {
			c.SignatureValid = ed25519.Verify(pub, signed, sig)
		}
	}
	c.Chain.Prev = r.Prev
	switch {
	case r.Sequence == 1:
		c.Chain.Linked = r.Prev == nil
	case prev != nil:
		c.Chain.PrevSequence = prev.Sequence
		c.Chain.Linked = prev.Sequence == r.Sequence-1
	}
	if !c.Chain.Linked {
		c.Problems = append(c.Problems, fmt.Sprintf("receipt %s does not link to the receipt at sequence %d", r.ID, r.Sequence-1))
	}
	return c, nil
}
