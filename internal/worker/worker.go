package worker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"
	"go.opentelemetry.io/otel/attribute"
	"golang.org/x/sync/errgroup"

	"github.com/fleet/fleet/internal/client"
	"github.com/fleet/fleet/internal/crash"
	"github.com/fleet/fleet/internal/sections"
	"github.com/fleet/fleet/internal/tracing"
	"github.com/fleet/fleet/internal/wire"
)

// Config configures a worker.
type Config struct {
	HostURL string
	Token   string
	// Transport carries the calls to the host (nil: Go's default); an
	// https:// host behind a private CA needs one trusting it.
	Transport http.RoundTripper
	// Follow keeps the worker asking for work when the queue is empty.
	Follow bool
	// Outage is how long the host may be unreachable before giving up.
	Outage time.Duration
	// WorkDelay stretches each computation, to watch or test a running job.
	WorkDelay time.Duration
	// Poll is the pause between claims while the queue is waiting.
	Poll time.Duration
	// Slots is how many jobs the worker runs at once (default 1); it
	// claims as many as it has free slots in one call.
	Slots int
	// BatchCalls sends the dispatches, heartbeats, publications and
	// failures its jobs make at about the same time as batch calls.
	BatchCalls bool
	// SeparateDispatch dispatches each claimed job in a call of its own,
	// rather than asking the claim to admit its jobs (a job in two
	// calls: claim-and-admit, then publish).
	SeparateDispatch bool
	// Model, when set, writes each section with a language model (model
	// mode) instead of computing it.
	Model *Model
	// Drain is how long the jobs held go on once Run's context ends (the
	// worker is told to stop) before those unfinished are handed back;
	// 0 is a third of the lease the host gives (10 s before a claim).
	Drain time.Duration
	Log   *slog.Logger
}

// errDrained ends the jobs still running when the drain is over.
var errDrained = errors.New("the worker is stopping and its drain is over")

// Worker runs jobs until the queue is empty.
type Worker struct {
	cfg    Config
	client *Client
	log    *slog.Logger
	// calls are the batchers by single call (dispatch, heartbeat, publish,
	// fail), while Run runs with several slots; nil sends each on its own.
	calls map[string]*batcher
	lease atomic.Int64 // the last claim's lease, in nanoseconds
}

// batchPaths are the batch routes of the single calls.
var batchPaths = map[string]string{"dispatch": "/v1/dispatches", "heartbeat": "/v1/heartbeats",
	"publish": "/v1/publications", "fail": "/v1/failures"}

// post makes a job's call (dispatch, heartbeat, publish or fail): in the
// next batch of its kind when the worker batches, else on its own.
func (w *Worker) post(ctx context.Context, call, op string, body any) (Response, error) {
	if b := w.calls[call]; b != nil {
		return b.call(ctx, op, body)
	}
	return w.client.Do(ctx, http.MethodPost, "/v1/jobs/"+op+"/"+call, body)
}

// New makes a worker.
func New(cfg Config) *Worker {
	if cfg.Outage <= 0 {
		cfg.Outage = 60 * time.Second
	}
	if cfg.Poll <= 0 {
		cfg.Poll = 250 * time.Millisecond
	}
	cfg.Slots = max(cfg.Slots, 1)
	client := &Client{BaseURL: cfg.HostURL, Token: cfg.Token, PID: os.Getpid(), Outage: cfg.Outage,
		HTTP: &http.Client{Timeout: 30 * time.Second, Transport: tracing.Transport(cfg.Transport)}, Log: cfg.Log}
	return &Worker{cfg: cfg, client: client, log: cfg.Log}
}

// Run claims and runs jobs, up to Slots at once, until the host reports an
// empty queue and its own jobs are done. While the operator has claims
// paused it waits, polling, whatever Follow. A job that fails stops the
// others and Run returns its error.
//
// When ctx ends (SIGTERM, SIGINT) the worker stops claiming and drains:
// the jobs it holds go on for Drain, and each still unfinished then is
// handed back to the host (released: queued again at once, its
// reservation given back), so nothing waits out a lease; Run then returns
// nil.
func (w *Worker) Run(ctx context.Context) error {
	work, stopWork := context.WithCancelCause(context.WithoutCancel(ctx))
	defer stopWork(nil)
	ran := make(chan struct{})
	defer close(ran)
	go w.drainAfter(ctx, ran, stopWork)
	jobs, jobsCtx := errgroup.WithContext(work)
	claimCtx, stopClaims := context.WithCancel(jobsCtx)
	defer stopClaims()
	defer context.AfterFunc(ctx, stopClaims)()
	if w.cfg.BatchCalls {
		w.calls = map[string]*batcher{}
		for call, path := range batchPaths {
			w.calls[call] = newBatcher(jobsCtx, w.client, path)
		}
	}
	finished := make(chan struct{}, w.cfg.Slots)
	start := func(job wire.ClaimedJob) {
		jobs.Go(func() error {
			defer func() { finished <- struct{}{} }()
			return w.runJob(jobsCtx, job)
		})
	}
	running, paused := 0, false
	for {
		var res wire.ClaimResult
		free := w.cfg.Slots - running
		if free > 0 {
			if claimCtx.Err() != nil {
				break // a job failed, or ctx ended: its error, if any, is Wait's
			}
			// A claim on its way when ctx ends is seen through (to the
			// drain's end): the host may have committed it, and with a
			// claim that admits its jobs are running and paid for, so they
			// are worked within the drain or handed back, not dropped.
			var err error
			if res, err = w.claim(jobsCtx, free); err != nil {
				if claimCtx.Err() != nil {
					break // a job failed, or the drain ended: its error, if any, is Wait's
				}
				return errors.Join(fmt.Errorf("claim: %w", err), jobs.Wait())
			}
			for _, job := range res.Jobs {
				running++
				start(job)
			}
			if claimCtx.Err() != nil {
				break // told to stop: what the claim answered runs within the drain
			}
			paused = w.notePause(paused, res.Queue)
			if len(res.Jobs) > 0 {
				continue
			}
			if res.Queue == wire.QueueEmpty && running == 0 && !w.cfg.Follow {
				w.log.Info("queue empty; done")
				break
			}
		}
		// Every slot is busy, or nothing was claimable: wait for a job to
		// finish, or (when the queue may yet fill) poll again.
		select {
		case <-finished:
			running--
		case <-w.pollAfter(free, res.Queue):
		case <-claimCtx.Done():
			return jobs.Wait()
		}
	}
	return jobs.Wait()
}

// notePause logs the operator pausing or resuming claims, once each time
// it changes, and answers whether claims are paused now.
func (w *Worker) notePause(paused bool, queue wire.Queue) bool {
	now := queue == wire.QueuePaused
	if now != paused {
		if now {
			w.log.Info("claims paused by the operator; waiting for them to resume")
		} else {
			w.log.Info("claims resumed")
		}
	}
	return now
}

// pollAfter is when to claim again with free slots and nothing claimed:
// after Poll while the queue may yet fill (waiting, paused, or following),
// else never (nil) but when a job finishes.
func (w *Worker) pollAfter(free int, queue wire.Queue) <-chan time.Time {
	if free > 0 && (queue == wire.QueueWaiting || queue == wire.QueuePaused || w.cfg.Follow) {
		return time.After(w.cfg.Poll)
	}
	return nil
}

// drainAfter ends the jobs' context with errDrained once the drain after
// ctx's end is over, unless Run returned first.
func (w *Worker) drainAfter(ctx context.Context, ran <-chan struct{}, stopWork context.CancelCauseFunc) {
	select {
	case <-ran:
		return
	case <-ctx.Done():
	}
	drain := w.cfg.Drain
	if drain <= 0 {
		drain = 10 * time.Second
		if lease := time.Duration(w.lease.Load()); lease > 0 {
			drain = lease / 3
		}
	}
	w.log.Info("stopping: claiming no more; the jobs held may finish, and are handed back after the drain", "drain", drain.String())
	t := time.NewTimer(drain)
	defer t.Stop()
	select {
	case <-ran:
	case <-t.C:
		stopWork(errDrained)
	}
}

// handBack releases a job the drain cut short: it goes back to the queue
// at once, its reservation given back. A claim already stale (the job's
// publication committed as the drain ended, or it was taken back) leaves
// nothing to hand back.
func (w *Worker) handBack(job wire.ClaimedJob, log *slog.Logger) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ref := wire.ClaimRef{ClaimID: job.Claim.ClaimID, Generation: job.Claim.Generation}
	resp, err := w.client.Do(ctx, http.MethodPost, "/v1/jobs/"+job.OperationID+"/release", ref)
	if client.IsCode(err, wire.CodeStaleClaim) {
		log.Info("drain over; the job was no longer this worker's to hand back", "err", err.Error())
		return nil
	}
	if err != nil {
		return fmt.Errorf("hand back %s: %w", job.OperationID, err)
	}
	var res wire.ReleaseResult
	if err := json.Unmarshal(resp.Body, &res); err != nil {
		return fmt.Errorf("hand back %s: %w", job.OperationID, err)
	}
	log.Info("drain over; handed the job back", "state", res.State, "generation", res.Generation,
		"released", res.Released, "receipt_id", res.ReceiptID)
	return nil
}

// claim asks for up to n jobs, under a key of its own: a claim sent again
// because its answer was lost gets back what the first committed.
func (w *Worker) claim(ctx context.Context, n int) (wire.ClaimResult, error) {
	body := wire.ClaimRequest{Max: &n, Key: uuid.NewString(), Admit: !w.cfg.SeparateDispatch}
	resp, err := w.client.Do(ctx, http.MethodPost, "/v1/claims", body)
	if err != nil {
		return wire.ClaimResult{}, err
	}
	var res wire.ClaimResult
	if err := json.Unmarshal(resp.Body, &res); err != nil {
		return res, err
	}
	if len(res.Jobs) == 0 && res.Job != nil { // a host from before batched claims
		res.Jobs = []wire.ClaimedJob{*res.Job}
	}
	if len(res.Jobs) > 0 {
		lease := time.Until(time.UnixMilli(res.Jobs[0].Claim.LeaseExpiresAtMS))
		w.client.SetLease(lease)
		w.lease.Store(int64(lease))
	}
	return res, nil
}

func (w *Worker) runJob(ctx context.Context, job wire.ClaimedJob) (err error) {
	// One job is one trace: its calls carry this span's context to the
	// host, whose spans for them (down to the commit) are its children.
	ctx, span := tracing.Start(ctx, "fleet-worker.job", tracing.OperationID.String(job.OperationID),
		tracing.ClaimID.String(job.Claim.ClaimID), tracing.Generation.Int64(job.Claim.Generation),
		attribute.String("fleet.section", job.Section))
	defer func() { tracing.End(span, err) }()
	log := w.log.With("operation_id", job.OperationID, "section", job.Section, "claim_id", job.Claim.ClaimID, "generation", job.Claim.Generation)
	defer func() {
		if err != nil && errors.Is(context.Cause(ctx), errDrained) {
			err = w.handBack(job, log)
		}
	}()
	log.Info("claimed")
	crash.At("worker.after-claim")
	ref := wire.ClaimRef{ClaimID: job.Claim.ClaimID, Generation: job.Claim.Generation}
	op := job.OperationID
	if admitted, err := w.admit(ctx, job, ref, log); err != nil || !admitted {
		return err
	}
	crash.At("worker.after-dispatch")

	// Heartbeat while computing and publishing. A cancellation stops the
	// computation; a lost lease only stops the heartbeats: the host's fence
	// decides whether the publication still counts (an unresolved job's
	// slow worker may still complete it).
	workCtx, stopWork := context.WithCancelCause(ctx)
	defer stopWork(nil)
	beatsDone := make(chan struct{})
	go func() {
		defer close(beatsDone)
		w.heartbeat(workCtx, op, ref, job.Claim.LeaseExpiresAtMS, stopWork, log)
	}()
	defer func() { stopWork(nil); <-beatsDone }()

	body, err := w.compute(workCtx, job)
	if err != nil {
		if cause := context.Cause(workCtx); cause != nil && ctx.Err() == nil {
			log.Warn("stopped before publishing", "reason", cause.Error())
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		// One job failing is not the worker failing: report it, so the host
		// settles the attempt and retries or fails the job, and go on.
		return w.reportFailure(ctx, op, ref, err, log)
	}
	return w.publish(ctx, job, body, log)
}

// admit is a claimed job's admission: the claim's, when it admitted the
// job, or else its dispatch's. admitted is false when the host refused it
// (the allowance, say) or the claim went stale first.
func (w *Worker) admit(ctx context.Context, job wire.ClaimedJob, ref wire.ClaimRef, log *slog.Logger) (admitted bool, err error) {
	adm := job.Admission
	if adm == nil {
		resp, err := w.post(ctx, "dispatch", job.OperationID, ref)
		if client.IsCode(err, wire.CodeStaleClaim) {
			log.Warn("claim went stale before dispatch", "err", err.Error())
			return false, nil
		}
		if err != nil {
			return false, fmt.Errorf("dispatch %s: %w", job.OperationID, err)
		}
		if err := json.Unmarshal(resp.Body, &adm); err != nil {
			return false, fmt.Errorf("dispatch %s: %w", job.OperationID, err)
		}
	}
	if adm.Decision != wire.DecisionAllow {
		log.Info("refused", "reason", adm.Reason, "receipt_id", adm.Receipt.ID)
		return false, nil
	}
	log.Info("admitted", "reason", adm.Reason, "receipt_id", adm.Receipt.ID)
	return true, nil
}

// publish publishes a computed body at the document's version when the
// job was claimed (nothing but its owner's publication moves it), under an
// operation key of its own, retried with that key until the host answers.
// Should the version have moved all the same (a host from before claims
// carried it answers 0), it reads the document and publishes once more.
func (w *Worker) publish(ctx context.Context, job wire.ClaimedJob, body json.RawMessage, log *slog.Logger) error {
	outcome, err := w.publishAt(ctx, job, job.DocumentVersion, body, log)
	if err != nil || outcome == nil || outcome.Status != wire.StatusVersionConflict {
		return err
	}
	resp, err := w.client.Do(ctx, http.MethodGet, "/v1/documents/"+job.DocumentID, nil)
	if err != nil {
		return fmt.Errorf("read document %s: %w", job.DocumentID, err)
	}
	var doc wire.Document
	if err := json.Unmarshal(resp.Body, &doc); err != nil {
		return fmt.Errorf("read document %s: %w", job.DocumentID, err)
	}
	_, err = w.publishAt(ctx, job, doc.Version, body, log)
	return err
}

// publishAt is one publication at version: its outcome, or nil when the
// host refused it for good.
func (w *Worker) publishAt(ctx context.Context, job wire.ClaimedJob, version int64, body json.RawMessage, log *slog.Logger) (*wire.Outcome, error) {
	key, err := uuid.NewV7()
	if err != nil {
		return nil, err
	}
	req := wire.PublishRequest{OperationKey: key.String(), Generation: job.Claim.Generation,
		ExpectedVersion: version, Body: body}
	// Retried inside Do with the same operation key until the host answers.
	resp, err := w.post(ctx, "publish", job.OperationID, req)
	var refused *client.Error
	if errors.As(err, &refused) {
		// The host refused this publication for good (its body, say, over
		// the host's limit): the job is left to its lease and the operator,
		// and this worker goes on with the next one.
		log.Error("publication refused; leaving the job", "operation_key", req.OperationKey, "err", err.Error())
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("publish %s: %w", job.OperationID, err)
	}
	crash.At("worker.mid-publish")
	var outcome wire.Outcome
	if err := json.Unmarshal(resp.Body, &outcome); err != nil {
		return nil, fmt.Errorf("publish %s: %w", job.OperationID, err)
	}
	log.Info("publication answered", "operation_key", req.OperationKey, "status", outcome.Status,
		"version", outcome.Version, "receipt_id", outcome.ReceiptID, "replayed", resp.Replayed, "outcome", string(resp.Body))
	return &outcome, nil
}

func (w *Worker) heartbeat(ctx context.Context, op string, ref wire.ClaimRef, leaseEndMS int64, stop context.CancelCauseFunc, log *slog.Logger) {
	interval := max(time.Until(time.UnixMilli(leaseEndMS))/3, 100*time.Millisecond)
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		resp, err := w.post(ctx, "heartbeat", op, ref)
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			log.Warn("heartbeat refused; finishing anyway, the host decides at publication", "err", err.Error())
			return
		}
		var hb wire.HeartbeatResult
		if json.Unmarshal(resp.Body, &hb) == nil && hb.CancelRequested {
			log.Info("the operator cancelled the job")
			stop(fmt.Errorf("cancelled by the operator"))
			return
		}
	}
}

// compute produces the published body.
// reportFailure tells the host this attempt failed. A model call may have
// had an effect (and a cost) before it failed, so only a deterministic
// worker says it had none; and only a model call is worth retrying (a
// deterministic section fails the same way every time). The reason is the
// error's text, bounded.
func (w *Worker) reportFailure(ctx context.Context, op string, ref wire.ClaimRef, cause error, log *slog.Logger) error {
	// The host takes one line of plain text: an error's line breaks and
	// other unprintable runes are sent as escapes.
	reason := wire.EscapeText(cause.Error())
	if len(reason) > 512 {
		cut := 512
		for cut > 0 && !utf8.RuneStart(reason[cut]) {
			cut--
		}
		reason = reason[:cut] + "…"
	}
	req := wire.FailRequest{ClaimID: ref.ClaimID, Generation: ref.Generation, Reason: reason,
		Retryable: w.cfg.Model != nil, NoEffect: w.cfg.Model == nil}
	resp, err := w.post(ctx, "fail", op, req)
	var refused *client.Error
	if errors.As(err, &refused) {
		log.Warn("failure report refused (the claim went stale)", "err", err.Error())
		return nil
	}
	if err != nil {
		return fmt.Errorf("report failure: %w", err)
	}
	var res wire.FailResult
	if err := json.Unmarshal(resp.Body, &res); err != nil {
		return fmt.Errorf("report failure: %w", err)
	}
	log.Warn("attempt failed", "reason", reason, "attempt", res.Attempt, "max_attempts", res.MaxAttempts,
		"state", res.State, "claimable_at_ms", res.ClaimableAtMS, "receipt_id", res.ReceiptID)
	return nil
}

func (w *Worker) compute(ctx context.Context, job wire.ClaimedJob) (json.RawMessage, error) {
	if w.cfg.WorkDelay > 0 {
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(w.cfg.WorkDelay):
		}
	}
	outputs, err := ReadOutputs(ctx, w.client, job.Input.After)
	if err != nil {
		return nil, err
	}
	if w.cfg.Model != nil {
		answer, err := w.cfg.Model.Write(ctx, job.Section, withOutputs(job.Input.Document, outputs))
		if err != nil {
			return nil, err
		}
		w.log.Info("model answered", "operation_id", job.OperationID, "model", answer.Model,
			"prompt_tokens", answer.Usage.PromptTokens, "completion_tokens", answer.Usage.CompletionTokens)
		return json.Marshal(map[string]any{"operation_id": job.OperationID, "section": job.Section,
			"input_sha256": job.InputSHA256, "mode": "model", "model": answer.Model, "answer": answer.Answer, "usage": answer.Usage})
	}
	return sections.BodyAfter(job.OperationID, job.Section, job.InputSHA256, job.Input.Document, outputs)
}
