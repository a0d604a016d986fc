// Package mcpworker makes an MCP-capable agent a Fleet worker: fleet-mcp
// offers the worker's calls (claim, dispatch, read, publish, fail) as MCP
// tools, holds the worker credential itself, heartbeats the agent's claim
// in the background, and builds every publication's bound body, so the
// agent writes a section's text and nothing else. The host's fences apply
// unchanged: the agent is a worker like any other.
package mcpworker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"sync"
	"time"

	"github.com/google/uuid"

	"github.com/fleet/fleet/internal/client"
	"github.com/fleet/fleet/internal/sections"
	"github.com/fleet/fleet/internal/wire"
	"github.com/fleet/fleet/internal/worker"
)

// Config configures an agent's worker.
type Config struct {
	HostURL string
	Token   string
	// Transport carries the calls to the host (nil: Go's default); an
	// https:// host behind a private CA needs one trusting it.
	Transport http.RoundTripper
	// Outage is how long a call rides through an unreachable host before
	// the tool answers "host unreachable".
	Outage time.Duration
	// HeartbeatCeiling is how long after taking a job the server stops
	// keeping its lease alive and reports the attempt failed, so an agent
	// that never finishes cannot hold a job forever.
	HeartbeatCeiling time.Duration
	// SeparateDispatch leaves a job's admission to begin_work's own call,
	// rather than having take_job's claim admit it (a job in two calls).
	SeparateDispatch bool
	Log              *slog.Logger
}

// Defaults.
const (
	DefaultOutage           = 30 * time.Second
	DefaultHeartbeatCeiling = 30 * time.Minute
	// AgentModel is the body's model field when the agent names none.
	AgentModel = "mcp-agent"
)

// Agent is one worker's state as its agent sees it: at most one job held
// at a time, the notices its next call will carry, and the heartbeat
// keeping the held job's lease alive.
type Agent struct {
	cfg    Config
	client *worker.Client
	// life bounds the background heartbeats: the server's, not a call's.
	life context.Context

	// calls serializes the tools: an agent's steps happen one after the
	// other, and with HTTP several sessions share one worker.
	calls sync.Mutex
	// mu guards what the heartbeat shares with the tools.
	mu      sync.Mutex
	job     *held
	notices []string
}

// held is the job the agent holds.
type held struct {
	job      wire.ClaimedJob
	after    []sections.Output // the outputs of the sections it waited for
	ref      wire.ClaimRef
	takenAt  time.Time
	leaseMS  int64
	admitted bool
	// admission is begin_work's answer when take_job's claim admitted
	// the job already.
	admission *BeginOutput
	// ended says why the claim no longer counts (cancelled, refused at a
	// heartbeat, released at the ceiling); "" while it is live.
	ended string
	// pending is a publication sent whose answer never came: sent again
	// as it is, under the same operation key, on the next publish call.
	pending *wire.PublishRequest
	// publishing: a publication is on its way, its answer not yet in.
	publishing bool
	stopBeats  context.CancelFunc
}

// New makes an agent's worker; life bounds its background heartbeats.
func New(life context.Context, cfg Config) *Agent {
	if cfg.Outage <= 0 {
		cfg.Outage = DefaultOutage
	}
	if cfg.HeartbeatCeiling <= 0 {
		cfg.HeartbeatCeiling = DefaultHeartbeatCeiling
	}
	// A host that keeps asking to slow down is told to the agent after
	// as long as an outage, rather than holding its call indefinitely.
	c := &worker.Client{BaseURL: cfg.HostURL, Token: cfg.Token, PID: os.Getpid(), Outage: cfg.Outage,
		MaxThrottle: cfg.Outage, HTTP: &http.Client{Timeout: 30 * time.Second, Transport: cfg.Transport}, Log: cfg.Log}
	return &Agent{cfg: cfg, client: c, life: life}
}

// ToolError is a tool's failure as the agent reads it: a stable code
// (a host's error code, or one of fleet-mcp's own) and what to do.
type ToolError struct {
	Code    string
	Message string
}

func (e *ToolError) Error() string { return e.Code + ": " + e.Message }

// fleet-mcp's own codes, besides the host's (wire.Code).
const (
	codeNoJob       = "no_job"
	codeHoldingJob  = "holding_job"
	codeNotAdmitted = "not_admitted"
	codeUnreachable = "host_unreachable"
	codeSuperseded  = string(wire.StatusSuperseded)
	codeConflict    = string(wire.StatusVersionConflict)
	codeRejected    = string(wire.StatusRejected)
	codeDenied      = "denied"
	codeNoOutputs   = "outputs_unreadable"
)

func toolErr(code, format string, args ...any) error {
	return &ToolError{Code: code, Message: fmt.Sprintf(format, args...)}
}

// hostErr names what a failed host call means to the agent.
func hostErr(what string, err error) error {
	var api *client.Error
	if errors.As(err, &api) && api.Code != "" {
		msg := api.Message
		switch api.Code {
		case wire.CodeStaleClaim:
			msg += "; the job was taken back (its lease ran out, the host restarted, or it was reassigned): your work on it cannot be published; call take_job for the next"
		case wire.CodeRateLimited:
			msg += "; the host asks this worker to slow down: call again in a while (nothing was lost)"
		case wire.CodeUnauthorized:
			msg += "; fleet-mcp's credential is not accepted: the operator must issue a new one"
		}
		return toolErr(string(api.Code), "%s: %s", what, msg)
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return toolErr(codeUnreachable, "%s: the call was cut short: %v", what, err)
	}
	return toolErr(codeUnreachable, "%s: %v", what, err)
}

// post sends a job's call (dispatch, heartbeat, publish, fail).
func (a *Agent) post(ctx context.Context, op, call string, body, out any) (worker.Response, error) {
	resp, err := a.client.Do(ctx, http.MethodPost, "/v1/jobs/"+op+"/"+call, body)
	if err != nil {
		return resp, err
	}
	return resp, json.Unmarshal(resp.Body, out)
}

// note queues a notice for the agent's next call; a.mu is held.
func (a *Agent) note(format string, args ...any) {
	a.notices = append(a.notices, fmt.Sprintf(format, args...))
}

// takeNotices hands over and clears the queued notices.
func (a *Agent) takeNotices() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	n := a.notices
	a.notices = nil
	return n
}

// current is the held job, or a no_job error.
func (a *Agent) current() (*held, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.job == nil {
		return nil, toolErr(codeNoJob, "you hold no job: call take_job first")
	}
	return a.job, nil
}

// drop lets go of the held job h (if it still is): its heartbeat stops.
func (a *Agent) drop(h *held) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.job == h {
		a.job = nil
	}
	h.stopBeats()
}

// endedReason reports why h's claim stopped counting ("" while it counts).
func (a *Agent) endedReason(h *held) string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return h.ended
}

// hold takes job as the agent's and starts its heartbeat.
func (a *Agent) hold(job wire.ClaimedJob) *held {
	ctx, stop := context.WithCancel(a.life)
	h := &held{job: job, ref: refOf(job), takenAt: time.Now(), leaseMS: job.Claim.LeaseExpiresAtMS, stopBeats: stop}
	a.mu.Lock()
	a.job = h
	a.mu.Unlock()
	go a.heartbeat(ctx, h)
	return h
}

// heartbeat renews h's lease every third of it until the job is let go,
// the host refuses the renewal, the operator cancels it, or the ceiling
// passes; each of those is told to the agent on its next call.
func (a *Agent) heartbeat(ctx context.Context, h *held) {
	defer h.stopBeats() // frees its context however it ends
	ceiling := time.NewTimer(time.Until(h.takenAt.Add(a.cfg.HeartbeatCeiling)))
	defer ceiling.Stop()
	for {
		a.mu.Lock()
		interval := max(time.Until(time.UnixMilli(h.leaseMS))/3, 100*time.Millisecond)
		a.mu.Unlock()
		select {
		case <-ctx.Done():
			return
		case <-ceiling.C:
			a.release(ctx, h)
			return
		case <-time.After(interval):
		}
		var hb wire.HeartbeatResult
		_, err := a.post(ctx, h.job.OperationID, "heartbeat", h.ref, &hb)
		if ctx.Err() != nil {
			return
		}
		a.mu.Lock()
		switch {
		case err != nil && (h.pending != nil || h.publishing):
			// A publication went unanswered: the renewal is refused when it
			// committed (the job completed), so the claim's end says
			// nothing of it. Only publishing it again tells.
			h.ended = fmt.Sprintf("its renewal was refused (%v) after a publication whose answer was lost; that publication may have committed: call publish_section again to learn its outcome", err)
			a.note("job %s (%s): %s", h.job.OperationID, h.job.Section, h.ended)
		case err != nil:
			h.ended = hostErr("heartbeat", err).Error()
			a.note("job %s (%s): its lease could not be renewed (%s); publishing it will most likely be refused",
				h.job.OperationID, h.job.Section, h.ended)
		case hb.CancelRequested:
			h.ended = "the operator cancelled the job"
			if a.job == h {
				a.job = nil
			}
			a.note("job %s (%s) was cancelled by the operator: stop working on it; nothing of it will be published; call take_job for the next",
				h.job.OperationID, h.job.Section)
		default:
			h.leaseMS = hb.LeaseExpiresAtMS
		}
		stop := h.ended != ""
		a.mu.Unlock()
		if stop {
			return
		}
	}
}

// release gives up h at the heartbeat ceiling: its attempt is reported
// failed (retryable, so the job is retried without waiting out its
// lease) and the agent is told.
func (a *Agent) release(ctx context.Context, h *held) {
	reason := fmt.Sprintf("the agent held the job past fleet-mcp's heartbeat ceiling of %s", a.cfg.HeartbeatCeiling)
	res, err := a.giveUp(ctx, h, reason)
	a.mu.Lock()
	defer a.mu.Unlock()
	h.ended = reason
	if a.job == h {
		a.job = nil
	}
	if err != nil {
		a.cfg.Log.Warn("releasing a job at the heartbeat ceiling", "operation_id", h.job.OperationID, "err", err.Error())
		a.note("job %s (%s) was let go: %s; its lease will run out (%v)", h.job.OperationID, h.job.Section, reason, hostErr("fail", err))
		return
	}
	a.cfg.Log.Info("released at the heartbeat ceiling", "operation_id", h.job.OperationID, "state", res.State)
	a.note("job %s (%s) was let go: %s; the host put it back as %s; call take_job for the next",
		h.job.OperationID, h.job.Section, reason, res.State)
}

// giveUp reports h's attempt failed on the agent's behalf: retryable, and
// without effect when it was never admitted.
func (a *Agent) giveUp(ctx context.Context, h *held, reason string) (wire.FailResult, error) {
	a.mu.Lock()
	admitted := h.admitted
	a.mu.Unlock()
	req := wire.FailRequest{ClaimID: h.ref.ClaimID, Generation: h.ref.Generation, Reason: reason,
		Retryable: true, NoEffect: !admitted}
	var res wire.FailResult
	_, err := a.post(ctx, h.job.OperationID, "fail", req, &res)
	return res, err
}

// Close lets go of the held job as the agent leaves (its MCP session
// ended, or fleet-mcp was stopped): a live claim's attempt is reported
// failed, retryable, so the job is retried without waiting out its
// lease. A publication whose answer never came is left
// alone: it may have committed, and the host's lease and reconcile decide.
func (a *Agent) Close(ctx context.Context) {
	a.calls.Lock()
	defer a.calls.Unlock()
	a.mu.Lock()
	h := a.job
	a.job = nil
	a.mu.Unlock()
	if h == nil {
		return
	}
	h.stopBeats()
	a.mu.Lock()
	live := h.ended == "" && h.pending == nil
	a.mu.Unlock()
	if !live {
		return
	}
	res, err := a.giveUp(ctx, h, "the agent left fleet-mcp while holding the job")
	if err != nil {
		a.cfg.Log.Warn("letting go of the held job", "operation_id", h.job.OperationID, "err", err.Error())
		return
	}
	a.cfg.Log.Info("let go of the held job as the agent left", "operation_id", h.job.OperationID, "state", res.State)
}

// newOperationKey is a publication's key, chosen once per publication.
func newOperationKey() (string, error) {
	key, err := uuid.NewV7()
	if err != nil {
		return "", err
	}
	return key.String(), nil
}
