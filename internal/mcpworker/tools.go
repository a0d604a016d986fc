package mcpworker

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"time"

	"github.com/google/uuid"

	"github.com/fleet/fleet/internal/client"
	"github.com/fleet/fleet/internal/wire"
	"github.com/fleet/fleet/internal/worker"
)

// Job is a claimed job as the agent sees it.
type Job struct {
	OperationID  string   `json:"operation_id" jsonschema:"the job's id"`
	DocumentID   string   `json:"document_id" jsonschema:"the report document the section belongs to"`
	Section      string   `json:"section" jsonschema:"the section to write: summary, terms, actions, links or overview"`
	Instructions string   `json:"instructions" jsonschema:"what the section must contain"`
	Document     string   `json:"document" jsonschema:"the text to write the section about"`
	ClaimID      string   `json:"claim_id" jsonschema:"this worker's claim on the job (fleet-mcp presents it for you)"`
	Generation   int64    `json:"generation" jsonschema:"the document's assignment generation the claim holds"`
	LeaseExpires string   `json:"lease_expires_at" jsonschema:"when the lease runs out unless renewed (fleet-mcp renews it while you work), RFC 3339"`
	After        []Output `json:"after,omitempty" jsonschema:"the sections of the report this one waited for, as they were published: write from them"`
}

// Output is a section a job waited for, as it was published.
type Output struct {
	Section   string `json:"section"`
	Published string `json:"published" jsonschema:"the section's published body (JSON); a model's text is its answer"`
}

// TakeOutput answers take_job.
type TakeOutput struct {
	Status string `json:"status" jsonschema:"claimed (job holds the job), denied (the job claimed was refused at once: the allowance cannot pay for it; do not write it; call take_job again), nothing_to_do (the queue is empty: stop), waiting (jobs in flight may come back: call again in a while) or paused (the operator paused claims: call again in a while)"`
	Job    *Job   `json:"job,omitempty" jsonschema:"the job claimed, when status is claimed or denied"`
	// Admission is the claimed job's admission, made with the claim.
	Admission *BeginOutput `json:"admission,omitempty" jsonschema:"the job's admission against the allowance, made with the claim (begin_work answers it again)"`
	Notices   []string     `json:"notices,omitempty" jsonschema:"what happened to an earlier job since your last call (cancelled, reassigned, released)"`
}

// BeginOutput answers begin_work.
type BeginOutput struct {
	Decision  string `json:"decision" jsonschema:"allow (write the section now) or deny (the shared allowance cannot pay for it: do not write it; take the next job)"`
	Reason    string `json:"reason"`
	ReceiptID string `json:"receipt_id" jsonschema:"the signed admission receipt"`
	Available int64  `json:"available" jsonschema:"credits left in the shared allowance after this decision"`
	// The levels the admission reserved at besides the fleet's.
	Tenant          string   `json:"tenant,omitempty" jsonschema:"the job's tenant (its team)"`
	TenantAvailable *int64   `json:"tenant_available,omitempty" jsonschema:"credits the job's tenant may still spend after this decision"`
	OwnAvailable    *int64   `json:"own_available,omitempty" jsonschema:"credits your own allowance still holds after this decision, when your credential has one"`
	Level           string   `json:"level,omitempty" jsonschema:"on a deny, the allowance that was short: fleet, tenant or credential (your own)"`
	Notices         []string `json:"notices,omitempty"`
}

// DocumentOutput answers read_document.
type DocumentOutput struct {
	DocumentID    string         `json:"document_id"`
	Version       int64          `json:"version" jsonschema:"0 until a section is published, then 1"`
	Generation    int64          `json:"generation" jsonschema:"the document's assignment generation"`
	AssignedToYou bool           `json:"assigned_to_you" jsonschema:"whether the document is still assigned to this worker (its generation is your claim's)"`
	Body          map[string]any `json:"body,omitempty" jsonschema:"the published section (a JSON object), once there is one"`
	Notices       []string       `json:"notices,omitempty"`
}

// PublishInput is publish_section's arguments.
type PublishInput struct {
	Text             string `json:"text" jsonschema:"the section's text, exactly as it should be published"`
	Model            string `json:"model,omitempty" jsonschema:"the model that wrote it, which prices its tokens at the state's model_prices (default mcp-agent)"`
	PromptTokens     *int64 `json:"prompt_tokens,omitempty" jsonschema:"tokens the writing read, if known; with completion_tokens, settles the job's cost at the state's model prices"`
	CompletionTokens *int64 `json:"completion_tokens,omitempty" jsonschema:"tokens the writing produced, if known"`
}

// PublishOutput answers publish_section.
type PublishOutput struct {
	Status        string   `json:"status" jsonschema:"published"`
	Version       int64    `json:"version"`
	ReceiptID     string   `json:"receipt_id" jsonschema:"the signed publication receipt"`
	OperationKey  string   `json:"operation_key" jsonschema:"the key fleet-mcp published under"`
	Replayed      bool     `json:"replayed" jsonschema:"the answer is the host's retained outcome of an earlier delivery of the same publication (its first answer was lost)"`
	ResentEarlier bool     `json:"resent_earlier,omitempty" jsonschema:"an earlier publish_section's text was sent again instead of this one, since it may already have committed"`
	Notices       []string `json:"notices,omitempty"`
}

// FailInput is report_failure's arguments.
type FailInput struct {
	Reason           string `json:"reason" jsonschema:"why the section could not be written, in one line"`
	Retryable        bool   `json:"retryable,omitempty" jsonschema:"whether another attempt (by any worker) could succeed"`
	Model            string `json:"model,omitempty" jsonschema:"the model the attempt ran on, which prices its tokens at the state's model_prices (default mcp-agent)"`
	PromptTokens     *int64 `json:"prompt_tokens,omitempty" jsonschema:"tokens the attempt read, if known"`
	CompletionTokens *int64 `json:"completion_tokens,omitempty" jsonschema:"tokens the attempt produced, if known"`
}

// FailOutput answers report_failure.
type FailOutput struct {
	State       string   `json:"state" jsonschema:"queued (it will be retried) or failed"`
	Attempt     int64    `json:"attempt"`
	MaxAttempts int64    `json:"max_attempts"`
	ReceiptID   string   `json:"receipt_id"`
	Notices     []string `json:"notices,omitempty"`
}

// StatusOutput answers status.
type StatusOutput struct {
	Holding           bool     `json:"holding" jsonschema:"whether this worker holds a job"`
	Job               *Job     `json:"job,omitempty"`
	Admitted          bool     `json:"admitted,omitempty" jsonschema:"begin_work allowed the held job"`
	LeaseExpires      string   `json:"lease_expires_at,omitempty" jsonschema:"the held job's lease as last renewed, RFC 3339"`
	HeartbeatStopsAt  string   `json:"heartbeat_stops_at,omitempty" jsonschema:"when fleet-mcp stops renewing the lease and lets the job go, RFC 3339"`
	ClaimEnded        string   `json:"claim_ended,omitempty" jsonschema:"why the held job's claim no longer counts, if it does not"`
	PublicationUnsure bool     `json:"publication_unsure,omitempty" jsonschema:"a publication was sent and its answer never came: call publish_section again to learn its outcome"`
	Notices           []string `json:"notices,omitempty"`
}

// empty is the arguments of a tool that takes none.
type empty struct{}

func rfc3339(ms int64) string { return time.UnixMilli(ms).UTC().Format(time.RFC3339Nano) }

func (h *held) view() *Job {
	instr, _ := worker.Instruction(h.job.Section)
	job := &Job{OperationID: h.job.OperationID, DocumentID: h.job.DocumentID, Section: h.job.Section,
		Instructions: instr, Document: h.job.Input.Document, ClaimID: h.ref.ClaimID, Generation: h.ref.Generation,
		LeaseExpires: rfc3339(h.leaseMS)}
	for _, o := range h.after {
		job.After = append(job.After, Output{Section: o.Section, Published: string(o.Body)})
	}
	return job
}

// Take claims the next job, unless the agent holds a live one.
func (a *Agent) Take(ctx context.Context) (TakeOutput, error) {
	a.mu.Lock()
	h := a.job
	a.mu.Unlock()
	if h != nil {
		if a.endedReason(h) == "" {
			return TakeOutput{}, toolErr(codeHoldingJob, "you hold job %s (%s): publish_section or report_failure first",
				h.job.OperationID, h.job.Section)
		}
		a.drop(h) // its claim ended; the agent was told, or is now
	}
	res, err := a.claimOne(ctx)
	if err != nil {
		return TakeOutput{}, err
	}
	if len(res.Jobs) == 0 {
		status := "waiting"
		switch res.Queue {
		case wire.QueueEmpty:
			status = "nothing_to_do"
		case wire.QueuePaused:
			status = "paused"
		}
		return TakeOutput{Status: status, Notices: a.takeNotices()}, nil
	}
	job := res.Jobs[0]
	a.client.SetLease(time.Until(time.UnixMilli(job.Claim.LeaseExpiresAtMS)))
	if adm := job.Admission; adm != nil && adm.Decision != wire.DecisionAllow {
		// Refused for good with the claim: the job is settled, not held.
		a.cfg.Log.Info("claimed and refused", "operation_id", job.OperationID, "reason", adm.Reason)
		denied := beginOutput(*adm)
		return TakeOutput{Status: "denied", Job: (&held{job: job, ref: refOf(job), leaseMS: job.Claim.LeaseExpiresAtMS}).view(),
			Admission: &denied, Notices: a.takeNotices()}, nil
	}
	h = a.hold(job)
	var admission *BeginOutput
	if job.Admission != nil {
		allowed := beginOutput(*job.Admission)
		admission = &allowed
		a.mu.Lock()
		h.admitted, h.admission = true, admission
		a.mu.Unlock()
		a.cfg.Log.Info("admitted with its claim", "operation_id", job.OperationID, "receipt_id", job.Admission.Receipt.ID)
	}
	a.cfg.Log.Info("claimed", "operation_id", job.OperationID, "section", job.Section, "generation", job.Claim.Generation)
	after, err := worker.ReadOutputs(ctx, a.client, job.Input.After)
	if err != nil {
		return TakeOutput{}, toolErr(codeNoOutputs, "you hold job %s (%s), but the sections it waited for could not be read (%v): report_failure",
			job.OperationID, job.Section, err)
	}
	a.mu.Lock()
	h.after = after
	a.mu.Unlock()
	a.mu.Lock()
	view := h.view() // the heartbeat may be renewing the lease already
	a.mu.Unlock()
	return TakeOutput{Status: "claimed", Job: view, Admission: admission, Notices: a.takeNotices()}, nil
}

// claimTimeout bounds a claim seen through after its call was cut short.
const claimTimeout = 30 * time.Second

// claimOne claims a job. The claim is seen through even when the call is
// cut short (fleet-mcp stopped, or the agent cancelled it): the host may
// have committed it, and with a claim that admits the job is then running
// and paid for under this worker. A job whose call was cut short is handed
// back at once (released), since nobody will be told of it.
func (a *Agent) claimOne(ctx context.Context) (wire.ClaimResult, error) {
	var res wire.ClaimResult
	one := 1
	through, cancel := context.WithTimeout(context.WithoutCancel(ctx), claimTimeout)
	defer cancel()
	resp, err := a.client.Do(through, http.MethodPost, "/v1/claims", wire.ClaimRequest{Max: &one, Key: uuid.NewString(), Admit: !a.cfg.SeparateDispatch})
	if err == nil {
		err = json.Unmarshal(resp.Body, &res)
	}
	if err != nil {
		return res, hostErr("take_job", err)
	}
	if ctx.Err() == nil {
		return res, nil
	}
	for _, job := range res.Jobs {
		if job.Admission != nil && job.Admission.Decision != wire.DecisionAllow {
			continue // refused with the claim: settled, nothing held
		}
		var rel wire.ReleaseResult
		if _, err := a.post(through, job.OperationID, "release", refOf(job), &rel); err != nil {
			a.cfg.Log.Warn("handing back a job claimed as take_job was cut short; its lease will end it", "operation_id", job.OperationID, "err", err.Error())
			continue
		}
		a.cfg.Log.Info("handed back a job claimed as take_job was cut short", "operation_id", job.OperationID, "state", rel.State)
	}
	return res, hostErr("take_job", ctx.Err())
}

// refOf is the claim a job is held under.
func refOf(job wire.ClaimedJob) wire.ClaimRef {
	return wire.ClaimRef{ClaimID: job.Claim.ClaimID, Generation: job.Claim.Generation}
}

// beginOutput is what the agent is told of an admission.
func beginOutput(adm wire.Admission) BeginOutput {
	out := BeginOutput{Decision: string(adm.Decision), Reason: adm.Reason, ReceiptID: adm.Receipt.ID, Available: adm.Accounting.Available,
		Level: adm.Level}
	if t := adm.Tenant; t != nil {
		out.Tenant, out.TenantAvailable = t.Name, &t.Available
	}
	if c := adm.Credential; c != nil {
		out.OwnAvailable = &c.Available
	}
	return out
}

// Begin asks the host to admit the held job against the shared allowance.
func (a *Agent) Begin(ctx context.Context) (BeginOutput, error) {
	h, err := a.current()
	if err != nil {
		return BeginOutput{}, err
	}
	a.mu.Lock()
	admitted := h.admission
	a.mu.Unlock()
	if admitted != nil { // take_job's claim admitted it
		out := *admitted
		out.Notices = a.takeNotices()
		return out, nil
	}
	var adm wire.Admission
	if _, err := a.post(ctx, h.job.OperationID, "dispatch", h.ref, &adm); err != nil {
		if client.IsCode(err, wire.CodeStaleClaim) {
			a.drop(h)
		}
		return BeginOutput{}, hostErr("begin_work", err)
	}
	out := beginOutput(adm)
	if adm.Decision != wire.DecisionAllow {
		a.drop(h) // refused for good: the job is settled
		a.cfg.Log.Info("refused", "operation_id", h.job.OperationID, "reason", adm.Reason)
		out.Notices = a.takeNotices()
		return out, toolErr(codeDenied, "job %s was denied: %s (receipt %s, %d credits available); do not write it; call take_job for the next",
			h.job.OperationID, adm.Reason, adm.Receipt.ID, adm.Accounting.Available)
	}
	a.mu.Lock()
	h.admitted = true
	a.mu.Unlock()
	a.cfg.Log.Info("admitted", "operation_id", h.job.OperationID, "receipt_id", adm.Receipt.ID)
	out.Notices = a.takeNotices()
	return out, nil
}

// Read reads the held job's document as it is now.
func (a *Agent) Read(ctx context.Context) (DocumentOutput, error) {
	h, err := a.current()
	if err != nil {
		return DocumentOutput{}, err
	}
	doc, err := a.document(ctx, h)
	if err != nil {
		return DocumentOutput{}, err
	}
	out := DocumentOutput{DocumentID: doc.ID, Version: doc.Version, Generation: doc.Generation,
		AssignedToYou: doc.Generation == h.ref.Generation, Notices: a.takeNotices()}
	if len(doc.Body) > 0 && string(doc.Body) != "null" {
		if err := json.Unmarshal(doc.Body, &out.Body); err != nil {
			return DocumentOutput{}, toolErr(codeUnreachable, "read_document: the host's document body is not a JSON object: %v", err)
		}
	}
	return out, nil
}

func (a *Agent) document(ctx context.Context, h *held) (wire.Document, error) {
	resp, err := a.client.Do(ctx, http.MethodGet, "/v1/documents/"+h.job.DocumentID, nil)
	if err != nil {
		return wire.Document{}, hostErr("read_document", err)
	}
	var doc wire.Document
	if err := json.Unmarshal(resp.Body, &doc); err != nil {
		return wire.Document{}, hostErr("read_document", err)
	}
	return doc, nil
}

// usage is the agent's token counts, when it gave both.
func usage(prompt, completion *int64) (*wire.Usage, error) {
	switch {
	case prompt == nil && completion == nil:
		return nil, nil
	case prompt == nil || completion == nil:
		return nil, toolErr(string(wire.CodeInvalid), "give prompt_tokens and completion_tokens together, or neither")
	case *prompt < 0 || *completion < 0:
		return nil, toolErr(string(wire.CodeInvalid), "token counts cannot be negative")
	}
	return &wire.Usage{PromptTokens: *prompt, CompletionTokens: *completion}, nil
}

// Publish publishes the held job's section: fleet-mcp builds the body
// bound to the job and chooses its operation key, so the agent can neither
// publish another job's result nor publish one twice.
func (a *Agent) Publish(ctx context.Context, in PublishInput) (PublishOutput, error) {
	h, err := a.current()
	if err != nil {
		return PublishOutput{}, err
	}
	a.mu.Lock()
	admitted, req := h.admitted, h.pending
	a.mu.Unlock()
	if !admitted {
		return PublishOutput{}, toolErr(codeNotAdmitted, "job %s was not admitted: call begin_work first", h.job.OperationID)
	}
	resent := req != nil
	if req == nil {
		if req, err = a.publication(ctx, h, in); err != nil {
			return PublishOutput{}, err
		}
	}
	var outcome wire.Outcome
	a.mu.Lock()
	h.publishing = true // a renewal refused from now on may be this publication's commit
	a.mu.Unlock()
	resp, err := a.post(ctx, h.job.OperationID, "publish", req, &outcome)
	a.mu.Lock()
	h.publishing = false
	a.mu.Unlock()
	var api *client.Error
	if err != nil && !errors.As(err, &api) {
		// Unanswered: it may have committed. Kept, to be sent again as it is.
		a.mu.Lock()
		h.pending = req
		a.mu.Unlock()
		return PublishOutput{}, toolErr(codeUnreachable, "publish_section: %v; the publication may have committed: call publish_section again to send it again under the same operation key (never twice published)", err)
	}
	if err != nil {
		switch {
		case client.IsCode(err, wire.CodeRateLimited):
			a.mu.Lock()
			h.pending = req // not taken in: sent again as it is when the agent calls again
			a.mu.Unlock()
		case inputRefused(err):
			a.mu.Lock()
			h.pending = nil // refused before anything was applied: the next text goes under a new key
			a.mu.Unlock()
		default:
			a.drop(h) // refused for good: the claim, not the text
		}
		return PublishOutput{}, hostErr("publish_section", err)
	}
	a.drop(h) // answered: whatever it says is final for this job
	a.cfg.Log.Info("publication answered", "operation_id", h.job.OperationID, "operation_key", req.OperationKey,
		"status", outcome.Status, "replayed", resp.Replayed)
	switch outcome.Status {
	case wire.StatusPublished:
		return PublishOutput{Status: string(outcome.Status), Version: outcome.Version, ReceiptID: outcome.ReceiptID,
			OperationKey: req.OperationKey, Replayed: resp.Replayed, ResentEarlier: resent, Notices: a.takeNotices()}, nil
	case wire.StatusSuperseded:
		return PublishOutput{}, toolErr(codeSuperseded, "job %s: the document was reassigned to another worker; nothing was published (%s)", h.job.OperationID, outcome.Reason)
	case wire.StatusVersionConflict:
		return PublishOutput{}, toolErr(codeConflict, "job %s: the document changed since it was read; nothing was published (%s)", h.job.OperationID, outcome.Reason)
	default:
		return PublishOutput{}, toolErr(codeRejected, "job %s: the host rejected the publication: %s", h.job.OperationID, outcome.Reason)
	}
}

// inputRefused reports whether the host refused what the agent gave (its
// text too long, a reason too long) rather than the claim: nothing was
// applied, and the agent may try again with other input.
func inputRefused(err error) bool {
	return client.IsCode(err, wire.CodeInvalid) || client.IsCode(err, wire.CodeBodyTooLarge)
}

// publication builds the bound body for the agent's text.
func (a *Agent) publication(ctx context.Context, h *held, in PublishInput) (*wire.PublishRequest, error) {
	if in.Text == "" {
		return nil, toolErr(string(wire.CodeInvalid), "text is empty: give the section's text")
	}
	u, err := usage(in.PromptTokens, in.CompletionTokens)
	if err != nil {
		return nil, err
	}
	model := in.Model
	if model == "" {
		model = AgentModel
	}
	fields := map[string]any{"operation_id": h.job.OperationID, "section": h.job.Section,
		"input_sha256": h.job.InputSHA256, "mode": "model", "model": model, "answer": in.Text}
	if u != nil {
		fields["usage"] = u
	}
	body, err := client.Encode(fields)
	if err != nil {
		return nil, toolErr(string(wire.CodeInvalid), "the section's text cannot be sent: %v", err)
	}
	doc, err := a.document(ctx, h)
	if err != nil {
		return nil, err
	}
	key, err := newOperationKey()
	if err != nil {
		return nil, err
	}
	return &wire.PublishRequest{OperationKey: key, Generation: h.ref.Generation, ExpectedVersion: doc.Version, Body: body}, nil
}

// Fail reports the held job's attempt failed.
func (a *Agent) Fail(ctx context.Context, in FailInput) (FailOutput, error) {
	h, err := a.current()
	if err != nil {
		return FailOutput{}, err
	}
	if in.Reason == "" {
		return FailOutput{}, toolErr(string(wire.CodeInvalid), "reason is empty: say why the section could not be written")
	}
	u, err := usage(in.PromptTokens, in.CompletionTokens)
	if err != nil {
		return FailOutput{}, err
	}
	if u != nil {
		u.Model = cmp.Or(in.Model, AgentModel)
	}
	a.mu.Lock()
	admitted := h.admitted
	a.mu.Unlock()
	req := wire.FailRequest{ClaimID: h.ref.ClaimID, Generation: h.ref.Generation, Reason: wire.EscapeText(in.Reason),
		Retryable: in.Retryable, NoEffect: !admitted, Usage: u}
	var res wire.FailResult
	if _, err := a.post(ctx, h.job.OperationID, "fail", req, &res); err != nil {
		var api *client.Error
		if errors.As(err, &api) && !inputRefused(err) && !client.IsCode(err, wire.CodeRateLimited) {
			a.drop(h)
		}
		return FailOutput{}, hostErr("report_failure", err)
	}
	a.drop(h)
	return FailOutput{State: string(res.State), Attempt: res.Attempt, MaxAttempts: res.MaxAttempts,
		ReceiptID: res.ReceiptID, Notices: a.takeNotices()}, nil
}

// Status says what this worker holds.
func (a *Agent) Status() StatusOutput {
	a.mu.Lock()
	h := a.job
	var out StatusOutput
	if h != nil {
		out = StatusOutput{Holding: true, Job: h.view(), Admitted: h.admitted, LeaseExpires: rfc3339(h.leaseMS),
			ClaimEnded: h.ended, PublicationUnsure: h.pending != nil}
		if h.ended == "" {
			out.HeartbeatStopsAt = h.takenAt.Add(a.cfg.HeartbeatCeiling).UTC().Format(time.RFC3339Nano)
		}
	}
	a.mu.Unlock()
	out.Notices = a.takeNotices()
	return out
}

// promptText is the worker loop, for an agent pointed at Fleet.
const promptText = `You are a worker in a Fleet: a host hands out report sections, a shared
allowance pays for them, and every publication is checked against your claim.
Repeat until take_job answers nothing_to_do:
1. Call take_job. If it answers waiting or paused, wait a little and call it
   again. If it answers denied, the shared allowance cannot pay for the
   section it claimed: do not write it; call take_job again. If it answers
   claimed, it gives you a document, a section, the section's instructions
   and, for a section that follows others (after), what they published.
2. Call begin_work. If it answers allow, go on. If it answers the error
   denied, do not write the section: go back to 1.
3. Write the section about the document (and what the sections it follows
   published), following the instructions. Answer with the section's text
   only.
4. Call publish_section with that text (and your token counts, if you know
   them). If you cannot write it, call report_failure with the reason instead.
5. If a notice says the job was cancelled or let go, or a call answers
   superseded or stale_claim, the job is no longer yours: drop it and go
   back to 1. If a call answers host_unreachable
   or rate_limited, wait a while and call it again: publish_section resends
   the same publication and never publishes twice.
Notices in any answer tell you what happened to a job you held. Call status
whenever you are unsure what you hold.`
