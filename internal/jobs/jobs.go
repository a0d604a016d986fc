// Package jobs is the job state machine: which state may follow which, what
// a claim must match, and what a batch may hold. It decides; the host
// writes what it decides inside its transactions.
package jobs

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"unicode/utf8"

	"github.com/gowebpki/jcs"

	"github.com/fleet/fleet/internal/fleet"
	"github.com/fleet/fleet/internal/sections"
	"github.com/fleet/fleet/internal/store"
	"github.com/fleet/fleet/internal/wire"
)

// transitions is the state machine (docs/api.md, "Job states").
var transitions = map[wire.JobState][]wire.JobState{
	// A blocked job is queued by the completion of the last job it waits
	// for (store.JobUnblock, guarded by its state), or cancelled.
	wire.Blocked:    {wire.Queued, wire.CancelledBeforeDispatch},
	wire.Queued:     {wire.Claimed, wire.CancelledBeforeDispatch},
	wire.Claimed:    {wire.Running, wire.Refused, wire.Queued, wire.CancelledBeforeDispatch, wire.Failed},
	wire.Running:    {wire.Completed, wire.Cancelled, wire.Unresolved, wire.Queued, wire.Failed},
	wire.Refused:    {wire.Queued},
	wire.Unresolved: {wire.Completed, wire.Queued},
	wire.Failed:     {wire.Queued},
}

// CanMove reports whether a job in state from may become to.
func CanMove(from, to wire.JobState) bool { return slices.Contains(transitions[from], to) }

// CheckMove returns state_conflict unless the state machine lets j become
// `to`. The host checks before it runs the named transition, which is
// itself guarded by the state it read.
func CheckMove(j store.Job, to wire.JobState) error {
	if !CanMove(j.State, to) {
		return fleet.Errorf(wire.CodeStateConflict, "job %s is %s; it cannot become %s", j.OperationID, j.State, to)
	}
	return nil
}

// CheckClaim refuses a job of a tenant the caller does not serve
// (forbidden), and returns stale_claim unless (claimID, generation) is the
// job's current claim, held by caller, and the job is in one of the
// states.
func CheckClaim(j store.Job, caller fleet.Caller, claimID string, generation int64, states ...wire.JobState) error {
	if err := CheckTenant(caller, j.Tenant, "job "+j.OperationID); err != nil {
		return err
	}
	c := j.CurrentClaim()
	if c == nil || c.ClaimID != claimID || c.Generation != generation || j.Worker != caller.ID || !slices.Contains(states, j.State) {
		return fleet.Errorf(wire.CodeStaleClaim, "claim %s at generation %d is not the current claim of job %s (%s)",
			claimID, generation, j.OperationID, j.State)
	}
	return nil
}

// CheckTenant refuses a caller limited to some tenants what is another
// tenant's (what, e.g. "job op-1"), naming only the tenants it serves.
func CheckTenant(caller fleet.Caller, tenant, what string) error {
	if caller.Serves(tenant) {
		return nil
	}
	return fleet.Errorf(wire.CodeForbidden, "%s is not of a tenant %s serves (%s)", what, caller.ID, strings.Join(caller.Tenants, ", "))
}

// CancelledUnder reports whether the operator cancelled the job while this
// caller held this claim (a cancellation keeps the claim id on the job, so
// its holder learns of it).
func CancelledUnder(j store.Job, caller, claimID string) bool {
	return (j.State == wire.Cancelled || j.State == wire.CancelledBeforeDispatch) &&
		claimID != "" && j.ClaimID == claimID && j.Worker == caller
}

// DispatchRepeat reports whether a dispatch is the repeat of the one that
// was decided: same claim, same worker, same generation, and the decision
// still stands: running, refused, or unresolved (an admitted job whose
// lease ran out, keeping its assignment and reservation, which its worker
// may still finish; a worker whose answer was lost while the host was
// down longer than the lease must get its admission back, not drop work
// already paid for).
func DispatchRepeat(j store.Job, caller string, ref wire.ClaimRef) bool {
	return (j.State == wire.Running || j.State == wire.Refused || j.State == wire.Unresolved) &&
		j.AdmissionClaimID == ref.ClaimID && j.Worker == caller && j.Generation == ref.Generation
}

// Publishable reports whether a job's publication can still take effect:
// running, or unresolved (its slow worker may still be alive); a refused,
// cancelled or completed job never again.
func Publishable(s wire.JobState) bool { return s == wire.Running || s == wire.Unresolved }

// Sections a job can compute.
var Sections = []string{"summary", "terms", "actions", "links", "overview"}

// Limits of a batch.
const (
	MaxDocumentBytes = 64_000
	MaxSections      = 64
)

// ValidateBatch checks a document and its sections.
func ValidateBatch(document string, sections []string) error {
	switch {
	case len(document) == 0 || strings.TrimSpace(document) == "":
		return fleet.Errorf(wire.CodeInvalid, "document must not be blank")
	case len(document) > MaxDocumentBytes:
		return fleet.Errorf(wire.CodeInvalid, "document is %d bytes; the limit is %d", len(document), MaxDocumentBytes)
	case !utf8.ValidString(document):
		return fleet.Errorf(wire.CodeInvalid, "document is not valid UTF-8 (the first bad byte is at offset %d)", firstInvalidUTF8(document))
	case strings.ContainsRune(document, 0):
		return fleet.Errorf(wire.CodeInvalid, "document holds a NUL character at byte offset %d; a document is text", strings.IndexByte(document, 0))
	case len(sections) == 0 || len(sections) > MaxSections:
		return fleet.Errorf(wire.CodeInvalid, "sections must hold 1 to %d entries, got %d", MaxSections, len(sections))
	}
	for i, s := range sections {
		if !slices.Contains(Sections, s) {
			return fleet.Errorf(wire.CodeInvalid, "sections[%d] is %q; it must be one of %s", i, s, strings.Join(Sections, ", "))
		}
	}
	checked := map[string]bool{}
	for _, s := range sections {
		if !checked[s] {
			checked[s] = true
			if err := sectionFits(document, s); err != nil {
				return err
			}
		}
	}
	return nil
}

// sectionFits refuses a section whose publication could not be stored: a
// worker would compute it, be refused at publication and leave the job
// unresolved holding its reservation, every time it ran. The body is the
// deterministic worker's, with an operation id and input digest of their
// real lengths, so its canonical size is the real one.
func sectionFits(document, section string) error {
	body, err := sections.Body("00000000-0000-0000-0000-000000000000", section, strings.Repeat("0", 64), document)
	if err == nil {
		body, err = jcs.Transform(body)
	}
	if err != nil {
		return fmt.Errorf("compute the %s section: %w", section, err)
	}
	if len(body) > wire.MaxPublishBodyBytes {
		return fleet.Errorf(wire.CodeInvalid, "document: its %s section would be a %d-byte publication, and a publication holds at most %d bytes; shorten the document or leave out the %s section",
			section, len(body), wire.MaxPublishBodyBytes, section)
	}
	return nil
}

// firstInvalidUTF8 is the byte offset of s's first byte that is not part
// of valid UTF-8 (len(s) when there is none).
func firstInvalidUTF8(s string) int {
	for i, r := range s {
		if r == utf8.RuneError {
			if _, size := utf8.DecodeRuneInString(s[i:]); size == 1 {
				return i
			}
		}
	}
	return len(s)
}

// InputSHA256 is the hex SHA-256 of the input's canonical JSON.
func InputSHA256(in wire.Input) (string, error) {
	data, err := json.Marshal(in)
	if err != nil {
		return "", err
	}
	canonical, err := jcs.Transform(data)
	if err != nil {
		return "", err
	}
	return fleet.DigestHex(canonical), nil
}

// BatchDigest identifies a batch request for idempotent resubmission.
func BatchDigest(document string, sections []string, retry wire.RetryPolicy, priority *int64, tenant *string, after map[string][]string) (string, error) {
	request := map[string]any{"document": document, "sections": sections}
	// A policy, a priority, a tenant or dependencies are part of the request only when
	// it was given, so requests from before them keep their digests.
	if retry != (wire.RetryPolicy{}) {
		request["retry"] = retry
	}
	if priority != nil {
		request["priority"] = *priority
	}
	if tenant != nil {
		request["tenant"] = *tenant
	}
	if len(after) > 0 {
		request["after"] = after
	}
	data, err := json.Marshal(request)
	if err != nil {
		return "", err
	}
	return fleet.DigestHex(data), nil
}

// Priority is the priority a report's jobs are queued at: the one it
// names, wire.MinPriority to wire.MaxPriority, or wire.DefaultPriority.
func Priority(named *int64) (int64, error) {
	if named == nil {
		return wire.DefaultPriority, nil
	}
	if p := *named; p < wire.MinPriority || p > wire.MaxPriority {
		return 0, fleet.Errorf(wire.CodeInvalid, "priority must be %d (claimed first) to %d, got %d", wire.MinPriority, wire.MaxPriority, p)
	}
	return *named, nil
}

// Policy is a job's retry policy: at most MaxAttempts attempts; a retry
// waits BackoffBaseMS × 2^(failures−1), at most BackoffCapMS, with jitter.
type Policy struct {
	MaxAttempts   int64 `json:"max_attempts"`
	BackoffBaseMS int64 `json:"backoff_base_ms"`
	BackoffCapMS  int64 `json:"backoff_cap_ms"`
}

// DefaultPolicy is a state's policy unless its input.json says otherwise.
var DefaultPolicy = Policy{MaxAttempts: 3, BackoffBaseMS: 1000, BackoffCapMS: 60_000}

// Limits of a retry policy.
const (
	MaxAttempts  = 100
	MaxBackoffMS = 24 * 60 * 60 * 1000
)

// With is p with the fields r gives, checked.
func (p Policy) With(r wire.RetryPolicy) (Policy, error) {
	if r.MaxAttempts != nil {
		p.MaxAttempts = *r.MaxAttempts
	}
	if r.BackoffBaseMS != nil {
		p.BackoffBaseMS = *r.BackoffBaseMS
	}
	if r.BackoffCapMS != nil {
		p.BackoffCapMS = *r.BackoffCapMS
	}
	switch {
	case p.MaxAttempts < 1 || p.MaxAttempts > MaxAttempts:
		return p, fleet.Errorf(wire.CodeInvalid, "max_attempts must be 1 to %d, got %d", MaxAttempts, p.MaxAttempts)
	case p.BackoffBaseMS < 0 || p.BackoffBaseMS > MaxBackoffMS:
		return p, fleet.Errorf(wire.CodeInvalid, "backoff_base_ms must be 0 to %d, got %d", MaxBackoffMS, p.BackoffBaseMS)
	case p.BackoffCapMS < p.BackoffBaseMS || p.BackoffCapMS > MaxBackoffMS:
		return p, fleet.Errorf(wire.CodeInvalid, "backoff_cap_ms must be backoff_base_ms (%d) to %d, got %d", p.BackoffBaseMS, MaxBackoffMS, p.BackoffCapMS)
	}
	return p, nil
}

// Backoff is how long a job waits before its retry after its failures-th
// failed attempt: base × 2^(failures−1), capped, then "equal jitter" (half
// fixed, half random, from rnd in [0, 1)), so retries of jobs that failed
// together spread out.
func (p Policy) Backoff(failures int64, rnd float64) int64 {
	d := p.BackoffBaseMS
	for i := int64(1); i < failures && d < p.BackoffCapMS; i++ {
		d *= 2
	}
	d = min(d, p.BackoffCapMS)
	return d/2 + int64(rnd*float64(d-d/2))
}

// RecoveryAdvice says what an operator can do for a job that reconcile
// found no publication for.
func RecoveryAdvice(s wire.JobState) string {
	switch s {
	case wire.Refused:
		return "Admission was denied and no report exists. Raise the allowance and requeue to run it."
	case wire.Unresolved:
		return "Admitted, but no publication is known; its worker may still publish. Requeue to run it again (its reservation settles as spent)."
	case wire.Failed:
		return "Every attempt failed (see its attempts). Requeue to run it again with its attempts reset."
	case wire.Cancelled, wire.CancelledBeforeDispatch:
		return "Cancelled by the operator; no report was published."
	default:
		return "In progress; nothing to recover. Reconcile again once it settles."
	}
}

// ExpectedDigest is the hex SHA-256 of the canonical body a deterministic
// worker publishes for a job, computed when it is queued (after: the
// outputs of the jobs it waits for, in its input's order).
func ExpectedDigest(op, section, inputSHA256, document string, after []sections.Output) (string, error) {
	body, err := sections.BodyAfter(op, section, inputSHA256, document, after)
	if err != nil {
		return "", fmt.Errorf("compute the %s section of %s: %w", section, op, err)
	}
	canon, err := jcs.Transform(body)
	if err != nil {
		return "", fmt.Errorf("canonicalize the %s section of %s: %w", section, op, err)
	}
	sum := sha256.Sum256(canon)
	return hex.EncodeToString(sum[:]), nil
}
