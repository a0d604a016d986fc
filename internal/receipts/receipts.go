// Package receipts signs every admission, publication, cancellation,
// requeue and reconciliation decision (SPEC section 7). A receipt's body is
// canonical JSON (RFC 8785); its id is "rcpt-" plus the hex SHA-256 of the
// body; its signature is Ed25519 by the kernel key over the body; prev links
// each receipt to the one before, so the log is a hash chain.
package receipts

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/gowebpki/jcs"

	"github.com/fleet/fleet/internal/budget"
	"github.com/fleet/fleet/internal/fleet"
	"github.com/fleet/fleet/internal/store"
)

// Receipt kinds.
const (
	KindAdmission      = "admission"      // decision allow | deny
	KindPublication    = "publication"    // published | superseded | version_conflict
	KindCancellation   = "cancellation"   // cancelled
	KindRequeue        = "requeue"        // requeued
	KindReconciliation = "reconciliation" // reused_existing_effect | no_known_effect
)

// Body is what the kernel signs.
type Body struct {
	Sequence    int64   `json:"sequence"`
	Prev        *string `json:"prev"` // null for the first receipt
	Kind        string  `json:"kind"`
	OperationID string  `json:"operation_id"`
	Caller      string  `json:"caller"`
	Decision    string  `json:"decision"`
	Cost        int64   `json:"cost"` // credits this decision moved (for a publication: settled as spent)
	// Reserved is what the admission held, on a publication; the part of it
	// not settled (Reserved - Cost) went back to available.
	Reserved   *int64            `json:"reserved,omitempty"`
	Accounting budget.Accounting `json:"accounting"`
	IssuedAtMS int64             `json:"issued_at_ms"`
	KernelKey  string            `json:"kernel_key"`
}

// Receipt is a signed body with its id.
type Receipt struct {
	ID string `json:"id"`
	Body
	Signature string `json:"signature"`
}

// Draft is what a caller decides; Issue fills in the rest.
type Draft struct {
	Kind        string
	OperationID string
	Caller      string
	Decision    string
	Cost        int64
	Reserved    *int64
	Accounting  budget.Accounting
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

// Save stores the kernel key in the database.
func (k *Kernel) Save(ctx context.Context, tx *store.Tx) error {
	_, err := tx.ExecContext(ctx, `INSERT INTO kernel (id, public_key, seed, created_at_ms) VALUES (1, $1, $2, $3)`,
		k.PublicKey, k.private.Seed(), tx.NowMS())
	if err != nil {
		return fmt.Errorf("save kernel key: %w", err)
	}
	return nil
}

// LoadKernel reads the kernel key from the database.
func LoadKernel(ctx context.Context, tx *store.Tx) (*Kernel, error) {
	var pub string
	var seed []byte
	if err := tx.QueryRowContext(ctx, `SELECT public_key, seed FROM kernel WHERE id = 1`).Scan(&pub, &seed); err != nil {
		return nil, fmt.Errorf("load kernel key: %w", err)
	}
	if len(seed) != ed25519.SeedSize {
		return nil, fmt.Errorf("load kernel key: stored seed is %d bytes", len(seed))
	}
	k := kernelFromSeed(seed)
	if k.PublicKey != pub {
		return nil, fmt.Errorf("load kernel key: stored public key does not match the seed")
	}
	return k, nil
}

// TrustedKernel is the content of trusted-kernel.json.
type TrustedKernel struct {
	Algorithm string `json:"algorithm"`
	PublicKey string `json:"public_key"`
}

// Trusted describes the kernel's public key for offline verification.
func (k *Kernel) Trusted() TrustedKernel {
	return TrustedKernel{Algorithm: "Ed25519", PublicKey: k.PublicKey}
}

// Issue signs a receipt for d as the next link of the chain and stores it.
func Issue(ctx context.Context, tx *store.Tx, k *Kernel, d Draft) (Receipt, error) {
	// The chain head stays ours until commit, so the chain is linear across hosts.
	if err := tx.LockChain(ctx, store.ChainLog); err != nil {
		return Receipt{}, err
	}
	var seq int64
	var prev sql.NullString
	err := tx.QueryRowContext(ctx, `SELECT sequence, id FROM receipts ORDER BY sequence DESC LIMIT 1`).Scan(&seq, &prev)
	if err != nil && !errors.Is(err, sql.ErrNoRows) {
		return Receipt{}, fmt.Errorf("read receipt chain head: %w", err)
	}
	body := Body{
		Sequence: seq + 1, Kind: d.Kind, OperationID: d.OperationID, Caller: d.Caller,
		Decision: d.Decision, Cost: d.Cost, Reserved: d.Reserved, Accounting: d.Accounting,
		IssuedAtMS: tx.NowMS(), KernelKey: k.PublicKey,
	}
	if prev.Valid {
		body.Prev = &prev.String
	}
	signed, err := canonical(body)
	if err != nil {
		return Receipt{}, err
	}
	r := Receipt{ID: idOf(signed), Body: body, Signature: hex.EncodeToString(ed25519.Sign(k.private, signed))}
	// Only the signed body must be canonical; the stored receipt is plain
	// JSON of the same fields (a verifier recanonicalizes the body).
	full, err := json.Marshal(r)
	if err != nil {
		return Receipt{}, err
	}
	if _, err := tx.ExecContext(ctx,
		`INSERT INTO receipts (sequence, id, kind, operation_id, body) VALUES ($1, $2, $3, $4, $5)`,
		r.Sequence, r.ID, r.Kind, r.OperationID, string(full)); err != nil {
		return Receipt{}, fmt.Errorf("store receipt: %w", err)
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
func Verify(r Receipt, publicKeyHex string) error {
	pub, err := hex.DecodeString(publicKeyHex)
	if err != nil || len(pub) != ed25519.PublicKeySize {
		return fmt.Errorf("trusted kernel key is not a hex Ed25519 public key")
	}
	if r.KernelKey != publicKeyHex {
		return fmt.Errorf("receipt %s names kernel key %s, not the trusted one", r.ID, r.KernelKey)
	}
	signed, err := canonical(r.Body)
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
func VerifyChain(chain []Receipt, publicKeyHex string) []string {
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

// Get reads one receipt.
func Get(ctx context.Context, tx *store.Tx, id string) (Receipt, json.RawMessage, error) {
	var body string
	err := tx.QueryRowContext(ctx, `SELECT body FROM receipts WHERE id = $1`, id).Scan(&body)
	if errors.Is(err, sql.ErrNoRows) {
		return Receipt{}, nil, fleet.Errorf(fleet.CodeNotFound, "receipt %s not found", id)
	}
	if err != nil {
		return Receipt{}, nil, fmt.Errorf("read receipt %s: %w", id, err)
	}
	var r Receipt
	if err := json.Unmarshal([]byte(body), &r); err != nil {
		return Receipt{}, nil, fmt.Errorf("decode receipt %s: %w", id, err)
	}
	return r, json.RawMessage(body), nil
}

// List reads receipts in chain order; with operationID set, only that
// operation's.
func List(ctx context.Context, tx *store.Tx, operationID string) ([]Receipt, error) {
	query := `SELECT body FROM receipts ORDER BY sequence`
	args := []any{}
	if operationID != "" {
		query = `SELECT body FROM receipts WHERE operation_id = $1 ORDER BY sequence`
		args = append(args, operationID)
	}
	rows, err := tx.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, fmt.Errorf("list receipts: %w", err)
	}
	defer rows.Close()
	var out []Receipt
	for rows.Next() {
		var body string
		if err := rows.Scan(&body); err != nil {
			return nil, err
		}
		var r Receipt
		if err := json.Unmarshal([]byte(body), &r); err != nil {
			return nil, fmt.Errorf("decode receipt: %w", err)
		}
		out = append(out, r)
	}
	return out, rows.Err()
}

// Check is one receipt checked on its own and against the receipt before
// it: what the console shows an operator.
type Check struct {
	Receipt        Receipt        `json:"receipt"`
	CanonicalBody  string         `json:"canonical_body"` // the exact bytes signed (RFC 8785)
	IDMatchesBody  bool           `json:"id_matches_body"`
	SignatureValid bool           `json:"signature_valid"`
	KernelTrusted  bool           `json:"kernel_trusted"` // names the host's kernel key
	Chain          ChainLinkCheck `json:"chain"`
	Problems       []string       `json:"problems"`
}

// ChainLinkCheck says whether a receipt links to its predecessor.
type ChainLinkCheck struct {
	Prev         *string `json:"prev"`
	PrevSequence int64   `json:"prev_sequence,omitempty"`
	Linked       bool    `json:"linked"` // prev is the receipt at sequence-1 (or null at 1)
}

// CheckOne verifies receipt id with the trusted key and its link to the
// receipt before it, reading both in tx.
func CheckOne(ctx context.Context, tx *store.Tx, id, publicKeyHex string) (Check, error) {
	r, _, err := Get(ctx, tx, id)
	if err != nil {
		return Check{}, err
	}
	c := Check{Receipt: r, Problems: []string{}}
	signed, err := canonical(r.Body)
	if err != nil {
		return Check{}, fmt.Errorf("canonicalize receipt %s: %w", id, err)
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
	case r.Prev != nil:
		prev, _, err := Get(ctx, tx, *r.Prev)
		if err == nil {
			c.Chain.PrevSequence = prev.Sequence
			c.Chain.Linked = prev.Sequence == r.Sequence-1
		} else if fleet.ErrorCode(err) != fleet.CodeNotFound {
			return Check{}, err
		}
	}
	if !c.Chain.Linked {
		c.Problems = append(c.Problems, fmt.Sprintf("receipt %s does not link to the receipt at sequence %d", r.ID, r.Sequence-1))
	}
	return c, nil
}

// LatestByOperation maps each operation to its newest receipt's id.
func LatestByOperation(ctx context.Context, tx *store.Tx) (map[string]string, error) {
	rows, err := tx.QueryContext(ctx, `SELECT r.operation_id, r.id FROM receipts r
		JOIN (SELECT operation_id, MAX(sequence) AS newest FROM receipts GROUP BY operation_id) m
		ON m.operation_id = r.operation_id AND m.newest = r.sequence`)
	if err != nil {
		return nil, fmt.Errorf("read newest receipts: %w", err)
	}
	defer rows.Close()
	out := map[string]string{}
	for rows.Next() {
		var op, id string
		if err := rows.Scan(&op, &id); err != nil {
			return nil, fmt.Errorf("read newest receipts: %w", err)
		}
		out[op] = id
	}
	return out, rows.Err()
}
