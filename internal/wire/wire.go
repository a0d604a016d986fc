// Package wire is Fleet's HTTP contract as Go types: the requests and
// answers of every route, the error body, and the typed codes, states,
// statuses, decisions and event kinds they carry. It imports nothing but the
// standard library, so the worker, fleetctl and fleet-run link no database
// driver; docs/api.md describes the same contract in words.
package wire

import "encoding/json"

// Code is a stable, machine-readable error code. The HTTP edge maps each to
// one status; clients branch on the code, never on the message.
type Code string

const (
	CodeInvalid            Code = "invalid_request"     // 400
	CodeBodyTooLarge       Code = "body_too_large"      // 413
	CodeUnauthorized       Code = "unauthorized"        // 401
	CodeForbidden          Code = "forbidden"           // 403
	CodeNotFound           Code = "not_found"           // 404
	CodeStaleClaim         Code = "stale_claim"         // 409
	CodeOperationConflict  Code = "operation_conflict"  // 409
	CodeAssignmentConflict Code = "assignment_conflict" // 409
	CodeAllowanceConflict  Code = "allowance_conflict"  // 409
	CodeStateConflict      Code = "state_conflict"      // 409
	CodeStillRunning       Code = "still_running"       // 409: reconcile while a worker holds a live lease
	CodeRateLimited        Code = "rate_limited"        // 429
	CodeRequestTimeout     Code = "request_timeout"     // 408: the body did not arrive in time; sending it again may succeed
	CodeUnavailable        Code = "unavailable"         // 503
	CodeInternal           Code = "internal"            // 500
)

// Codes lists every code, so a test can hold the HTTP edge and clients to
// the whole set.
var Codes = []Code{CodeInvalid, CodeBodyTooLarge, CodeUnauthorized, CodeForbidden, CodeNotFound, CodeStaleClaim,
	CodeOperationConflict, CodeAssignmentConflict, CodeAllowanceConflict, CodeStateConflict, CodeStillRunning,
	CodeRateLimited, CodeRequestTimeout, CodeUnavailable, CodeInternal}

// MaxPublishBodyBytes bounds a publication's body as stored (canonical
// JSON). A batch is accepted only if every section it asks for fits.
const MaxPublishBodyBytes = 64 << 10

// ErrorBody is every non-2xx answer: {"error":{"code":…,"message":…}}.
type ErrorBody struct {
	Error ErrorDetail `json:"error"`
}

// ErrorDetail is the code and a message fit for the caller.
type ErrorDetail struct {
	Code    Code   `json:"code"`
	Message string `json:"message"`
}

// JobState is a job's state (docs/api.md, "Job states").
type JobState string

const (
	// Blocked: it waits for other sections of its report to complete
	// (after); it reserves nothing and cannot be claimed.
	Blocked                 JobState = "blocked"
	Queued                  JobState = "queued"
	Claimed                 JobState = "claimed"
	Running                 JobState = "running"
	Completed               JobState = "completed"
	Refused                 JobState = "refused"
	CancelledBeforeDispatch JobState = "cancelled_before_dispatch"
	Cancelled               JobState = "cancelled"
	Unresolved              JobState = "unresolved"
	// Failed: its last attempt failed, or one failed that was not worth
	// retrying; every attempt's reason is kept.
	Failed JobState = "failed"
)

// JobStates lists every state, in the order a job usually meets them.
var JobStates = []JobState{Blocked, Queued, Claimed, Running, Completed, Refused, Cancelled, CancelledBeforeDispatch, Unresolved, Failed}

// Settled reports whether nothing more will happen to the job without an
// operator: it is terminal, or unresolved.
func (s JobState) Settled() bool { return s != Queued && s != Claimed && s != Running }

// Active reports whether a worker holds the job (claimed or running).
func (s JobState) Active() bool { return s == Claimed || s == Running }

// Status is a publication's outcome.
type Status string

const (
	StatusPublished       Status = "published"
	StatusSuperseded      Status = "superseded"
	StatusVersionConflict Status = "version_conflict"
	// StatusRejected: the body does not belong to its job (another
	// operation id or input, or not the section computed for the input);
	// Outcome.Reason says which.
	StatusRejected Status = "rejected"
)

// Decision is what a receipt records was decided.
type Decision string

const (
	DecisionAllow                Decision = "allow" // admission
	DecisionDeny                 Decision = "deny"  // admission
	DecisionCancelled            Decision = "cancelled"
	DecisionRequeued             Decision = "requeued"
	DecisionReleased             Decision = "released"               // requeue: its worker gave it back unfinished
	DecisionReusedExistingEffect Decision = "reused_existing_effect" // reconciliation
	DecisionNoKnownEffect        Decision = "no_known_effect"        // reconciliation
	DecisionRetry                Decision = "retry"                  // failure: queued again after its backoff
	DecisionFailed               Decision = "failed"                 // failure: no attempt left, or not worth one
	DecisionRevoked              Decision = "revoked"                // credential
	DecisionRotated              Decision = "rotated"                // credential
	DecisionAdded                Decision = "added"                  // credential
	DecisionPaused               Decision = "paused"                 // claims
	DecisionResumed              Decision = "resumed"                // claims
	DecisionAllowanceSet         Decision = "allowance_set"          // tenant
	DecisionWeightSet            Decision = "weight_set"             // tenant
	DecisionPeriodStarted        Decision = "period_started"         // rollover
)

// PublicationDecision is the receipt decision of a publication outcome.
func PublicationDecision(s Status) Decision { return Decision(s) }

// ReceiptKind says which decision a receipt signs.
type ReceiptKind string

const (
	KindAdmission      ReceiptKind = "admission"
	KindPublication    ReceiptKind = "publication"
	KindCancellation   ReceiptKind = "cancellation"
	KindRequeue        ReceiptKind = "requeue"
	KindReconciliation ReceiptKind = "reconciliation"
	KindCredential     ReceiptKind = "credential" // operation_id is "credential:NAME"
	KindFailure        ReceiptKind = "failure"
	KindClaims         ReceiptKind = "claims" // operation_id is "claims": a pause or resumption
	// KindRollover starts a tenant's new period: operation_id is
	// "tenant:NAME", cost what the ended period spent.
	KindRollover ReceiptKind = "rollover"
	// KindTenant records a tenant's creation or allowance change:
	// operation_id is "tenant:NAME".
	KindTenant ReceiptKind = "tenant"
)

// Queue says why a claim found no job.
type Queue string

const (
	QueueEmpty   Queue = "empty"   // nothing queued, claimed or running
	QueueWaiting Queue = "waiting" // claimed, running or backing-off jobs may come back
	QueuePaused  Queue = "paused"  // the operator paused claims; jobs in flight go on
)

// Accounting is the shared allowance. Available is allowance - spent -
// reserved, never negative.
type Accounting struct {
	Allowance     int64  `json:"allowance"`
	Spent         int64  `json:"spent"`
	Reserved      int64  `json:"reserved"`
	Available     int64  `json:"available"`
	Calls         int64  `json:"calls"`
	Unit          string `json:"unit"`
	CostPerReport int64  `json:"cost_per_report"`
}

// Usage is what a model call used, as a model worker reports it in the
// published body.
type Usage struct {
	// Model is the model the tokens were spent on, which prices them
	// (model_prices); in a published body, the body's "model" when the
	// usage names none.
	Model            string `json:"model,omitempty"`
	PromptTokens     int64  `json:"prompt_tokens"`
	CompletionTokens int64  `json:"completion_tokens"`
}

// Pricing is how a reported usage was settled, on its receipt: the model
// it named and whether the state's model_prices priced it (if not, the
// whole reservation was settled).
type Pricing struct {
	Model  string `json:"model"`
	Priced bool   `json:"priced"`
}

// Job is one report section's job, joined with its document's assignment.
// The fields marked "-" are the host's own and never leave it.
type Job struct {
	OperationID      string          `json:"operation_id"`
	Position         int64           `json:"position"`
	Batch            string          `json:"batch"`
	Section          string          `json:"section"`
	DocumentID       string          `json:"document_id"`
	InputSHA256      string          `json:"input_sha256"`
	State            JobState        `json:"state"`
	Generation       int64           `json:"generation"`       // the document's assignment generation
	Owner            string          `json:"owner"`            // the document's current assignee
	DocumentVersion  int64           `json:"document_version"` // the document's version (1 once published)
	Worker           string          `json:"worker"`           // who holds (or last held) the claim
	ClaimHost        string          `json:"claim_host"`       // the host that issued that claim
	ClaimID          string          `json:"-"`
	LeaseExpiresAtMS int64           `json:"lease_expires_at_ms"`
	Reserved         int64           `json:"reserved"`
	AdmissionClaimID string          `json:"-"`
	Admission        json.RawMessage `json:"-"`
	// ReserveShard is the allowance shard holding Reserved, where the
	// backend splits the allowance (PostgreSQL); -1 when none is known.
	ReserveShard int64           `json:"-"`
	Outcome      json.RawMessage `json:"outcome"` // the retained publication outcome
	Reason       string          `json:"reason"`
	ReceiptID    string          `json:"receipt_id,omitempty"` // the newest receipt, in listings
	CreatedAtMS  int64           `json:"created_at_ms"`
	UpdatedAtMS  int64           `json:"updated_at_ms"`
	// Attempts failed so far (a failure reported, or a lease that ran out
	// before dispatch), out of MaxAttempts; a retry is not claimed before
	// ClaimableAtMS. LastError is the newest attempt's reason.
	Attempts      int64  `json:"attempts"`
	MaxAttempts   int64  `json:"max_attempts"`
	BackoffBaseMS int64  `json:"backoff_base_ms"`
	BackoffCapMS  int64  `json:"backoff_cap_ms"`
	ClaimableAtMS int64  `json:"claimable_at_ms"`
	LastError     string `json:"last_error,omitempty"`
	// When the job was last claimed, started (its dispatch allowed) and
	// finished (completed, failed, cancelled or refused), in Unix ms; 0
	// when it has not been since it was last queued.
	ClaimedAtMS  int64 `json:"claimed_at_ms"`
	StartedAtMS  int64 `json:"started_at_ms"`
	FinishedAtMS int64 `json:"finished_at_ms"`
	// Priority is 1 (claimed first) to 4; claims take the claimable jobs
	// by priority, then in the order they became claimable.
	Priority int64 `json:"priority"`
	// Tenant is the tenant the job (and its document) is in.
	Tenant string `json:"tenant"`
	// WaitingOn is how many of the jobs it waits for have not completed
	// (a blocked job's; the job's detail names them).
	WaitingOn int64 `json:"waiting_on"`
}

// Priorities a job may have: claims take MinPriority's claimable jobs
// first; a report that names none gets DefaultPriority.
const (
	MinPriority     = 1
	MaxPriority     = 4
	DefaultPriority = 2
)

// Attempt is one failed attempt of a job.
type Attempt struct {
	Attempt    int64  `json:"attempt"`
	Worker     string `json:"worker"`
	Generation int64  `json:"generation"`
	Reason     string `json:"reason"`
	Retryable  bool   `json:"retryable"`
	Outcome    string `json:"outcome"` // retry or failed
	Cost       int64  `json:"cost"`    // credits the attempt settled as spent
	AtMS       int64  `json:"at_ms"`
}

// CurrentClaim is the job's live claim, or nil.
func (j Job) CurrentClaim() *Claim {
	if j.ClaimID == "" || !j.State.Active() {
		return nil
	}
	return &Claim{ClaimID: j.ClaimID, Generation: j.Generation, LeaseExpiresAtMS: j.LeaseExpiresAtMS}
}

// Claim is a worker's lease on a job.
type Claim struct {
	ClaimID          string `json:"claim_id"`
	Generation       int64  `json:"generation"`
	LeaseExpiresAtMS int64  `json:"lease_expires_at_ms"`
}

// ClaimRef is how a worker presents its claim (dispatch and heartbeat bodies).
type ClaimRef struct {
	ClaimID    string `json:"claim_id"`
	Generation int64  `json:"generation"`
}

// Input is what a worker computes from.
type Input struct {
	Document string `json:"document"`
	Section  string `json:"section"`
	// After is the outputs of the sections it waits for, by section.
	After []DependencyOutput `json:"after,omitempty"`
}

// ClaimedJob is what a worker receives with a claim.
type ClaimedJob struct {
	OperationID string `json:"operation_id"`
	Section     string `json:"section"`
	DocumentID  string `json:"document_id"`
	InputSHA256 string `json:"input_sha256"`
	Input       Input  `json:"input"`
	Claim       Claim  `json:"claim"`
	// DocumentVersion is the document's version when claimed: the one a
	// publication expects, as nothing but its owner's publication moves it.
	DocumentVersion int64 `json:"document_version"`
	// Admission is the job's admission when the claim admitted it
	// (ClaimRequest.Admit): exactly what its dispatch would have answered.
	Admission *Admission `json:"admission,omitempty"`
}

// ClaimRequest is POST /v1/claims' optional body: lease up to Max jobs at
// once (1 to MaxClaimBatch; 1 without a body).
type ClaimRequest struct {
	Max *int `json:"max"`
	// Key, a canonical UUID the worker chose for this claim, makes it
	// repeatable: sent again with the Fleet-Repeat header, it answers the
	// jobs claimed under it that the worker still holds.
	Key string `json:"key,omitempty"`
	// Admit admits each job claimed in the claim's own transaction, as
	// its dispatch would (reserved at every level, or denied), and
	// answers each job's admission with it: a job in two calls.
	Admit bool `json:"admit,omitempty"`
}

// HeaderRepeat marks a request sent again because its answer did not
// arrive (fleet-worker sets it on every resend).
const HeaderRepeat = "Fleet-Repeat"

// MaxClaimBatch bounds how many jobs one claim may lease.
const MaxClaimBatch = 64

// ClaimResult is POST /v1/claims: the jobs leased (each with its own claim,
// generation and lease), or why there is none. Job is the first of Jobs,
// for clients that claim one at a time.
type ClaimResult struct {
	Job   *ClaimedJob  `json:"job"`
	Jobs  []ClaimedJob `json:"jobs"`
	Queue Queue        `json:"queue,omitempty"` // when Jobs is empty
}

// Admission is POST /v1/jobs/{op}/dispatch, retained so a repeat returns it
// unchanged.
type Admission struct {
	Decision   Decision   `json:"decision"` // allow | deny
	Reason     string     `json:"reason"`
	Receipt    Receipt    `json:"receipt"`
	Accounting Accounting `json:"accounting"` // the fleet's
	// Level, on a denial, is the budget level that was short: fleet,
	// tenant or credential.
	Level string `json:"level,omitempty"`
	// Tenant is the job's tenant's figures after the decision.
	Tenant *TenantFigures `json:"tenant,omitempty"`
	// Credential is the caller's own allowance's figures after the
	// decision, for a credential with one.
	Credential *TenantFigures `json:"credential,omitempty"`
}

// HeartbeatResult is POST /v1/jobs/{op}/heartbeat.
type HeartbeatResult struct {
	LeaseExpiresAtMS int64 `json:"lease_expires_at_ms"`
	CancelRequested  bool  `json:"cancel_requested"`
}

// PublishRequest is POST /v1/jobs/{op}/publish. It has no caller, owner or
// worker field: the caller is the credential's.
type PublishRequest struct {
	OperationKey    string          `json:"operation_key"`
	Generation      int64           `json:"generation"`
	ExpectedVersion int64           `json:"expected_version"`
	Body            json.RawMessage `json:"body"`
}

// Outcome is a publication's retained result.
type Outcome struct {
	Status    Status `json:"status"`
	Version   int64  `json:"version"`
	ReceiptID string `json:"receipt_id,omitempty"`
	Reason    string `json:"reason,omitempty"` // why it was rejected
}

// Document is one report document as a worker sees it (GET
// /v1/documents/{id}); Owner stays on the host.
type Document struct {
	ID         string          `json:"id"`
	Version    int64           `json:"version"`
	Generation int64           `json:"generation"`
	Body       json.RawMessage `json:"body"`
	Owner      string          `json:"-"`
}

// Operation is a retained publication record.
type Operation struct {
	DocumentID   string          `json:"document_id"`
	OperationKey string          `json:"operation_key"`
	Caller       string          `json:"caller"`
	Status       Status          `json:"status"`
	Outcome      json.RawMessage `json:"outcome"`
	Deliveries   int64           `json:"deliveries"`
}

// CancelResult is POST /admin/jobs/{op}/cancel.
type CancelResult struct {
	State     JobState `json:"state"`
	ReceiptID *string  `json:"receipt_id"`
	// CancellationRequested: a worker held the job (claimed or running)
	// and is told to stop at its next heartbeat or publication.
	CancellationRequested bool `json:"cancellation_requested"`
}

// RequeueResult is POST /admin/jobs/{op}/requeue.
type RequeueResult struct {
	State      JobState `json:"state"`
	Generation int64    `json:"generation"`
	ReceiptID  string   `json:"receipt_id"`
}

// ReleaseResult is POST /v1/jobs/{op}/release: the job queued again at a
// new generation, and the reservation it held given back.
type ReleaseResult struct {
	State      JobState `json:"state"`
	Generation int64    `json:"generation"`
	Released   int64    `json:"released"`
	ReceiptID  string   `json:"receipt_id"`
}

// Reconciliation is POST /admin/jobs/{op}/reconcile.
type Reconciliation struct {
	State                  JobState        `json:"state"`
	ReusedExistingEffect   bool            `json:"reused_existing_effect"`
	Outcome                json.RawMessage `json:"outcome,omitempty"`
	ReceiptID              string          `json:"receipt_id,omitempty"`
	Recovery               string          `json:"recovery,omitempty"`
	ReconciliationReceipt  string          `json:"reconciliation_receipt_id"`
	PublishedOperationKey  string          `json:"operation_key,omitempty"`
	PublicationDeliveries  int64           `json:"deliveries,omitempty"`
	PublishedMutationCount int64           `json:"mutations"`
	// Binding is what the published body says it is, checked against the
	// job (nil when nothing is published).
	Binding *Binding `json:"binding,omitempty"`
	// Artifact is the published section body, when the effect is reused.
	Artifact json.RawMessage `json:"artifact,omitempty"`
}

// Binding is what ties a publication to its job: the operation id, the
// SHA-256 of the job's input and the section its body names, its mode,
// and whether they are the job's (Reason says what differs).
type Binding struct {
	OperationID string `json:"operation_id"`
	InputSHA256 string `json:"input_sha256"`
	Section     string `json:"section"`
	Mode        string `json:"mode"`
	Matches     bool   `json:"matches"`
	Reason      string `json:"reason,omitempty"`
}

// FailRequest is POST /v1/jobs/{op}/fail: the worker's current claim and
// why its attempt failed. Retryable says whether another attempt could
// succeed. NoEffect says nothing happened before any external call, so the
// attempt costs nothing; otherwise it costs its whole reservation, or with
// model prices the Usage reported.
type FailRequest struct {
	ClaimID    string `json:"claim_id"`
	Generation int64  `json:"generation"`
	Reason     string `json:"reason"`
	Retryable  bool   `json:"retryable"`
	NoEffect   bool   `json:"no_effect"`
	Usage      *Usage `json:"usage,omitempty"`
}

// FailResult answers a fail call: the job's state after it (queued for a
// retry, or failed), which attempt this was, when the retry may be
// claimed, and what the attempt settled.
type FailResult struct {
	State         JobState `json:"state"`
	Attempt       int64    `json:"attempt"`
	MaxAttempts   int64    `json:"max_attempts"`
	ClaimableAtMS int64    `json:"claimable_at_ms,omitempty"`
	ReceiptID     string   `json:"receipt_id"`
	Settled       int64    `json:"settled"`
	Released      int64    `json:"released"`
}

// JobPageQuery is GET /admin/jobs: filters (each optional), a cursor from
// an earlier page's Next, and a page size.
type JobPageQuery struct {
	State    JobState
	Section  string
	Owner    string
	Priority int64  // 0 for any
	Tenant   string // "" for any
	Q        string // an operation id, or its start
	After    string
	Limit    int
}

// JobPage is one page of jobs in queue order, the cursor of the next page
// ("" when this is the last), and the number of jobs in each state.
type JobPage struct {
	Jobs   []Job              `json:"jobs"`
	Next   string             `json:"next"`
	Counts map[JobState]int64 `json:"counts"`
}

// Limits of a page of jobs.
const (
	DefaultJobPage = 50
	MaxJobPage     = 500
)

// Credential is a credential as the operator sees it (never its token or
// digest).
type Credential struct {
	Name        string `json:"name"`
	Role        string `json:"role"`
	CreatedAtMS int64  `json:"created_at_ms"`
	RevokedAtMS int64  `json:"revoked_at_ms,omitempty"` // 0 while in force
	// Allowance is the credential's own cap (an agent's), fixed when it
	// was added; null for none. Spent and Reserved are what the jobs it
	// admitted under it settled and hold.
	Allowance *int64 `json:"allowance"`
	Spent     int64  `json:"spent"`
	Reserved  int64  `json:"reserved"`
	// Tenants are the only tenants whose jobs it claims, in name order,
	// fixed when it was added; empty for every tenant.
	Tenants []string `json:"tenants"`
}

// CredentialChange answers a revocation or a rotation: the credential as
// it now is, the receipt of the change (none when nothing changed: a
// credential revoked already), and for an addition or a rotation the new
// token, shown this once.
type CredentialChange struct {
	Credential Credential `json:"credential"`
	Changed    bool       `json:"changed"`
	ReceiptID  string     `json:"receipt_id,omitempty"`
	Token      string     `json:"token,omitempty"`
}

// ClaimsPauseRequest is POST /admin/claims/pause's optional body.
type ClaimsPauseRequest struct {
	Reason *string `json:"reason"`
}

// ClaimsState is whether claims are paused (POST /admin/claims/pause and
// /resume answer it with the change's receipt; GET /admin/stats carries it).
type ClaimsState struct {
	Paused bool   `json:"paused"`
	Reason string `json:"reason,omitempty"` // why they were paused
	By     string `json:"by,omitempty"`     // who paused them
	AtMS   int64  `json:"at_ms,omitempty"`  // when they were paused or resumed
	// Changed is false when they already were as asked (nothing signed).
	Changed   bool   `json:"changed"`
	ReceiptID string `json:"receipt_id,omitempty"`
}

// BulkRequest is POST /admin/jobs/bulk: cancel or requeue the jobs a
// filter selects, from the cursor After on.
type BulkRequest struct {
	Action string    `json:"action"` // cancel, requeue or reconcile
	Filter JobFilter `json:"filter"`
	After  string    `json:"after,omitempty"` // a BulkResult's Next
	// DryRun counts the jobs the filter selects and does nothing.
	DryRun bool `json:"dry_run,omitempty"`
	// Reason, the operator's (one line of plain text, at most 1,024
	// bytes), goes in each job's event.
	Reason string `json:"reason,omitempty"`
	// Through, a dry run's Through, acts only on jobs at or before that
	// place in the queue: what was counted and confirmed, never a job
	// that arrived since.
	Through string `json:"through,omitempty"`
}

// JobFilter selects jobs as GET /admin/jobs's parameters do.
type JobFilter struct {
	State    JobState `json:"state,omitempty"`
	Section  string   `json:"section,omitempty"`
	Owner    string   `json:"owner,omitempty"`
	Priority int64    `json:"priority,omitempty"`
	Tenant   string   `json:"tenant,omitempty"`
	Q        string   `json:"q,omitempty"`
}

// BulkResult is what a bulk call did: each job's answer (its state after,
// or its refusal), counts, and the cursor to go on from ("" when done).
type BulkResult struct {
	Action  string `json:"action"`
	Matched int64  `json:"matched"`
	// Applicable is how many of those matched are in a state the action
	// takes (cancel: queued, claimed, running; requeue: refused,
	// unresolved, failed; reconcile: unresolved): what it would do.
	Applicable int64          `json:"applicable"`
	Done       int64          `json:"done"`
	Refused    map[Code]int64 `json:"refused"`
	Results    []BulkItem     `json:"results"`
	Next       string         `json:"next"`
	// Through is, for a dry run, the place in the queue of the last job
	// it counted ("" when none): send it with the action.
	Through string `json:"through,omitempty"`
}

// BulkItem is one job's answer in a bulk call.
type BulkItem struct {
	OperationID string       `json:"operation_id"`
	State       JobState     `json:"state,omitempty"`
	Error       *ErrorDetail `json:"error,omitempty"`
}

// Workers is GET /admin/workers: every worker credential and what its jobs
// say of it.
type Workers struct {
	NowMS   int64        `json:"now_ms"`
	WindowS int64        `json:"window_s"` // what "in the window" counts back
	Workers []WorkerView `json:"workers"`
}

// WorkerView is one worker in the workers view.
type WorkerView struct {
	Name        string `json:"name"`
	RevokedAtMS int64  `json:"revoked_at_ms,omitempty"`
	// Alive: seen within a lease, or holding a job.
	Alive      bool  `json:"alive"`
	LastSeenMS int64 `json:"last_seen_ms"` // 0: never
	Held       int64 `json:"held"`         // jobs claimed or running now
	// Of the jobs it held last, those that completed and failed in the
	// window.
	CompletedInWindow int64 `json:"completed_in_window"`
	FailedInWindow    int64 `json:"failed_in_window"`
}

// CredentialAddRequest is POST /admin/credentials: a new worker
// credential's name.
type CredentialAddRequest struct {
	Name *string `json:"name"`
	// Allowance is the credential's own cap in credits, fixed for its
	// life; left out for none.
	Allowance *int64 `json:"allowance,omitempty"`
	// Tenants limits it to these tenants' jobs, fixed for its life; left
	// out (or empty) for every tenant's.
	Tenants []string `json:"tenants,omitempty"`
}

// AssignRequest is POST /admin/documents/{id}/assign.
type AssignRequest struct {
	ExpectedGeneration *int64  `json:"expected_generation"`
	Owner              *string `json:"owner"`
}

// AssignResult is POST /admin/documents/{id}/assign's answer: the
// document's new assignment.
type AssignResult struct {
	ID         string `json:"id"`
	Version    int64  `json:"version"`
	Generation int64  `json:"generation"`
	Owner      string `json:"owner"`
}

// AllowanceRequest is POST /admin/allowance.
type AllowanceRequest struct {
	ExpectedAllowance *int64 `json:"expected_allowance"`
	Allowance         *int64 `json:"allowance"`
}

// ReportsRequest is POST /admin/reports.
type ReportsRequest struct {
	Document       *string  `json:"document"`
	Sections       []string `json:"sections"`
	IdempotencyKey *string  `json:"idempotency_key,omitempty"`
	// Priority is every job's of the report, MinPriority to MaxPriority
	// (DefaultPriority when left out).
	Priority *int64 `json:"priority,omitempty"`
	// Tenant names the tenant every job of the report is in
	// (DefaultTenant when left out); it must exist.
	Tenant *string `json:"tenant,omitempty"`
	// After names, for a section, the sections of the report it waits for.
	After map[string][]string `json:"after,omitempty"`
	RetryPolicy
}

// RetryPolicy is how a report's failed attempts are retried (input.json
// and POST /admin/reports); each field left out takes the state's default.
type RetryPolicy struct {
	MaxAttempts   *int64 `json:"max_attempts,omitempty"`
	BackoffBaseMS *int64 `json:"backoff_base_ms,omitempty"`
	BackoffCapMS  *int64 `json:"backoff_cap_ms,omitempty"`
}

// ReportsResult lists the operation ids of a batch in section order.
type ReportsResult struct {
	OperationIDs []string `json:"operation_ids"`
	Replayed     bool     `json:"replayed"`
}

// StorageStats counts what a host's database has done since it started.
type StorageStats struct {
	WriteTransactions int64 `json:"write_transactions"`
	Commits           int64 `json:"commits"`
	Checkpoints       int64 `json:"checkpoints"` // that copied frames (SQLite)
	Retries           int64 `json:"retries"`     // batches rerun after losing a race to another host
	// RoundTrips counts the exchanges with a database server (PostgreSQL;
	// 0 for SQLite, which runs in the host's process).
	RoundTrips int64 `json:"round_trips"`
	// SequencerRounds counts the transactions in which this host's
	// sequencer placed log entries, SequencerEntries the events and
	// receipts they placed (PostgreSQL; SQLite places them in the
	// writer's own commit).
	SequencerRounds  int64 `json:"sequencer_rounds"`
	SequencerEntries int64 `json:"sequencer_entries"`
	// SequencerBusy counts the sequencer's tries that found the log lock
	// taken by another transaction (another host's round, an enqueue).
	SequencerBusy int64 `json:"sequencer_busy"`
	// SequencerUnlisted counts the rounds, of SequencerRounds, that placed
	// this host's own entries without listing what was pending first,
	// since no other host had placed any since its last round.
	SequencerUnlisted int64 `json:"sequencer_unlisted"`
	// Operations counts committed writes by operation (claim, dispatch,
	// publish, ...): the statements each write's own transaction function
	// ran (the event and receipt rows it appends are written after it, for
	// its whole commit, and are not in them), and the jobs it acted on.
	Operations map[string]OperationStats `json:"operations"`
}

// OperationStats is one operation's counts in StorageStats.
type OperationStats struct {
	Writes     int64 `json:"writes"`
	Statements int64 `json:"statements"`
	Rows       int64 `json:"rows"`
}

// Snapshot is GET /admin/snapshot.
type Snapshot struct {
	Jobs       []Job        `json:"jobs"`
	Accounting Accounting   `json:"accounting"`
	KernelKey  string       `json:"kernel_key"`
	Mutations  int64        `json:"mutations"`
	Events     int64        `json:"events"`
	Storage    StorageStats `json:"storage"`
	NowMS      int64        `json:"now_ms"` // the host's clock, for lease countdowns
}

// Stats is GET /admin/stats: the jobs by state (counting the jobs not
// completed, so its cost grows with those), the accounting and the
// storage counters.
type Stats struct {
	NowMS      int64              `json:"now_ms"` // the host's clock, for countdowns
	Claims     ClaimsState        `json:"claims"` // whether claims are paused
	Jobs       map[JobState]int64 `json:"jobs"`
	Accounting Accounting         `json:"accounting"`
	Mutations  int64              `json:"mutations"`
	Events     int64              `json:"events"`
	Storage    StorageStats       `json:"storage"`
}

// JobDetail is GET /admin/jobs/{op}.
type JobDetail struct {
	Job
	Claim      *Claim      `json:"claim"`
	Input      Input       `json:"input"`
	Document   Document    `json:"document"`
	Operations []Operation `json:"operations"`
	Mutations  int64       `json:"mutations"`
	Receipts   []Receipt   `json:"receipts"`
	// AttemptLog is every failed attempt, oldest first.
	AttemptLog []Attempt `json:"attempt_log"`
	// Dependencies is the jobs it waits for, as they stand.
	Dependencies []Dependency `json:"dependencies"`
}

// TrustedKernel is GET /trusted-kernel.json and the state's file of that name.
type TrustedKernel struct {
	Algorithm string `json:"algorithm"`
	PublicKey string `json:"public_key"`
}

// MaxReasonBytes bounds a reason a worker or the operator gives (a failed
// attempt's, a pause's, a bulk action's): it is kept on the job, in its
// event and shown to operators.
const MaxReasonBytes = 1024

// MaxBatchItems is the most items one batch call holds.
const MaxBatchItems = 64

// BatchRequest is a batch call's body (POST /v1/dispatches,
// /v1/heartbeats, /v1/publications, /v1/failures): each item names a job
// and carries the single call's request body for it.
type BatchRequest struct {
	Items []BatchItem `json:"items"`
}

// BatchItem is one job's call in a batch.
type BatchItem struct {
	OperationID string          `json:"operation_id"`
	Request     json.RawMessage `json:"request"`
}

// BatchResult answers a batch call, one result per item, in order.
type BatchResult struct {
	Results []ItemResult `json:"results"`
}

// ItemResult is what the single call would have answered for the item:
// its HTTP status, its body (an answer, or an ErrorBody), and for a
// publication whether it was a replay (the single call's
// Idempotent-Replayed header).
type ItemResult struct {
	OperationID string          `json:"operation_id"`
	Status      int             `json:"status"`
	Replayed    bool            `json:"replayed,omitempty"`
	Body        json.RawMessage `json:"body"`
}
