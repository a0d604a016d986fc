package wire

// ReceiptBody is what the kernel signs, as canonical JSON (RFC 8785).
type ReceiptBody struct {
	Sequence    int64       `json:"sequence"`
	Prev        *string     `json:"prev"` // null for the first receipt
	Kind        ReceiptKind `json:"kind"`
	OperationID string      `json:"operation_id"`
	Caller      string      `json:"caller"`
	Decision    Decision    `json:"decision"`
	Cost        int64       `json:"cost"` // credits this decision moved
	// Reserved is what the admission held, on a publication; the part of it
	// not settled (Reserved - Cost) went back to available.
	Reserved *int64 `json:"reserved,omitempty"`
	// Pricing, on a publication or failure that reported usage in a state
	// with model_prices, says which model priced it, or that none did.
	Pricing    *Pricing   `json:"pricing,omitempty"`
	Accounting Accounting `json:"accounting"`
	// Tenant is the tenant a job's receipt (or a tenant's) is of; left
	// out by builds before tenants, whose receipts are the tenant
	// default's.
	Tenant string `json:"tenant,omitempty"`
	// Level, on a denied admission, is the budget level that was short:
	// fleet, tenant or credential.
	Level string `json:"level,omitempty"`
	// Credential is the credential whose own allowance holds part of the
	// job's reservation, on its admission and its settlement.
	Credential string `json:"credential,omitempty"`
	IssuedAtMS int64  `json:"issued_at_ms"`
	KernelKey  string `json:"kernel_key"`
	// Nonce is random: two identical decisions in one millisecond still
	// get two ids.
	Nonce string `json:"nonce"`
}

// Receipt is a signed body with its id ("rcpt-" + hex SHA-256 of the
// canonical body with sequence 0 and prev null, as it was decided) and its
// hex Ed25519 signature over the canonical body.
type Receipt struct {
	ID string `json:"id"`
	ReceiptBody
	Signature string `json:"signature"`
}

// ReceiptCheck is GET /admin/receipts/{id}/verification.
type ReceiptCheck struct {
	Receipt        Receipt        `json:"receipt"`
	CanonicalBody  string         `json:"canonical_body"` // the exact bytes signed
	IDMatchesBody  bool           `json:"id_matches_body"`
	SignatureValid bool           `json:"signature_valid"`
	KernelTrusted  bool           `json:"kernel_trusted"`
	Chain          ChainLinkCheck `json:"chain"`
	Problems       []string       `json:"problems"`
}

// ChainLinkCheck says whether a receipt links to its predecessor.
type ChainLinkCheck struct {
	Prev         *string `json:"prev"`
	PrevSequence int64   `json:"prev_sequence,omitempty"`
	Linked       bool    `json:"linked"`
}
