// Package receipts signs every admission, publication, cancellation,
// requeue and reconciliation decision. A receipt's body is canonical JSON
// (RFC 8785); its id is "rcpt-" plus the hex SHA-256 of the body; its
// signature is Ed25519 by the kernel key over the body; prev links each
// receipt to the one before, so the log is a hash chain. The host stores
// what Sign returns in the transaction of the decision.
package receipts

import (
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"

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
	Accounting  wire.Accounting
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

// Sign makes the receipt for d as the link after (prevSequence, prevID)
// ("" for the first), and the JSON to store.
func (k *Kernel) Sign(d Draft, prevSequence int64, prevID string, issuedAtMS int64) (wire.Receipt, []byte, error) {
	body := wire.ReceiptBody{
		Sequence: prevSequence + 1, Kind: d.Kind, OperationID: d.OperationID, Caller: d.Caller,
		Decision: d.Decision, Cost: d.Cost, Reserved: d.Reserved, Accounting: d.Accounting,
		IssuedAtMS: issuedAtMS, KernelKey: k.PublicKey,
	}
	if prevID != "" {
		body.Prev = &prevID
	}
	signed, ok := canonicalBody(body)
	if !ok {
		var err error
		if signed, err = canonical(body); err != nil {
			return wire.Receipt{}, nil, err
		}
	}
	r := wire.Receipt{ID: idOf(signed), ReceiptBody: body, Signature: hex.EncodeToString(ed25519.Sign(k.private, signed))}
	// Only the signed body must be canonical; the stored receipt is plain
	// JSON of the same fields (a verifier recanonicalizes the body).
	stored, err := json.Marshal(r)
	return r, stored, err
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

func idOf(signedBody []byte) string {
	sum := sha256.Sum256(signedBody)
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
	if idOf(signed) != r.ID {
		return fmt.Errorf("receipt %s: id does not match its body", r.ID)
	}
	sig, err := hex.DecodeString(r.Signature)
	if err != nil || !ed25519.Verify(pub, signed, sig) {
		return fmt.Errorf("receipt %s: signature does not verify", r.ID)
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
	c.IDMatchesBody = idOf(signed) == r.ID
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
