package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/fleet/fleet/internal/input"
	"github.com/fleet/fleet/internal/statedir"
	"github.com/fleet/fleet/internal/store"
	"github.com/fleet/fleet/internal/store/postgres"
	"github.com/fleet/fleet/internal/wire"
)

type run struct {
	database string // the run's PostgreSQL schema URL, or "" on SQLite
	bin      string
	in       input.Input
	rawInput []byte
	timeout  time.Duration
	out      io.Writer
	dir      string
	api      *api

	host    *hostProc
	hostLog *os.File
	workers []*workerProc

	// progress draws a live one-line status under the timeline; only on a
	// terminal, so logs and tests get plain lines.
	progress bool

	mu     sync.Mutex
	events []wire.Event
	follow context.CancelFunc
	wg     sync.WaitGroup
}

// Summary is summary.json. A boolean is null when its
// scenario was not part of the input.
type Summary struct {
	Jobs                      int   `json:"jobs"`
	Completed                 int   `json:"completed"`
	Refused                   int   `json:"refused"`
	Cancelled                 int   `json:"cancelled"`
	Unresolved                int   `json:"unresolved"`
	Failed                    int   `json:"failed"`
	Spent                     int64 `json:"spent"`
	Reserved                  int64 `json:"reserved"`
	Available                 int64 `json:"available"`
	Mutations                 int64 `json:"mutations"`
	LostAckRecovered          *bool `json:"lost_ack_recovered"`
	RestartRetainedAccounting *bool `json:"restart_retained_accounting"`
	RestartRetainedKernelKey  *bool `json:"restart_retained_kernel_key"`
	ReceiptsVerified          bool  `json:"receipts_verified"`
	StaleClaimRefused         *bool `json:"stale_claim_refused"`
	// For an input with after (and left out without): every section that
	// waited for others was claimed only after each had published, and
	// its body was computed from their outputs as published.
	WaitedForDependencies *bool `json:"waited_for_dependencies,omitempty"`
	ComputedFromOutputs   *bool `json:"computed_from_outputs,omitempty"`
}

func (r *run) stateDir() string { return filepath.Join(r.dir, "state") }

func (r *run) say(format string, args ...any) {
	if r.progress {
		fmt.Fprint(r.out, "\r\033[K") // clear the progress line first
	}
	fmt.Fprintf(r.out, format+"\n", args...)
}

// showProgress redraws the one-line status: jobs by state and credits.
func (r *run) showProgress(ctx context.Context) {
	var st wire.Stats
	if !r.progress || r.api.operator(ctx, "GET", "/admin/stats", nil, &st) != nil {
		return
	}
	var parts []string
	for _, s := range []wire.JobState{wire.Queued, wire.Claimed, wire.Running, wire.Completed, wire.Refused,
		wire.Cancelled, wire.CancelledBeforeDispatch, wire.Unresolved, wire.Failed} {
		if n := st.Jobs[s]; n > 0 {
			parts = append(parts, fmt.Sprintf("%s %d", s, n))
		}
	}
	a := st.Accounting
	fmt.Fprintf(r.out, "\r\033[K  [%s | credits: %d spent, %d reserved, %d available of %d]",
		strings.Join(parts, ", "), a.Spent, a.Reserved, a.Available, a.Allowance)
}

// usePostgres gives a run on PostgreSQL (FLEET_DATABASE) a schema of its
// own, named for the run, so runs never share state; fleet-host reads
// FLEET_DATABASE, so setting it here points every child at that schema.
func (r *run) usePostgres(ctx context.Context) error {
	server := os.Getenv("FLEET_DATABASE")
	if server == "" {
		return nil
	}
	if !store.IsURL(server) {
		return fmt.Errorf("FLEET_DATABASE must be a postgres:// URL, got %q", server)
	}
	name := "fleet_run_" + strings.ToLower(strings.NewReplacer("-", "_").Replace(filepath.Base(r.dir)))
	url, err := postgres.CreateSchema(ctx, server, name)
	if err != nil {
		return err
	}
	r.database = url
	if err := statedir.WriteFileAtomic(filepath.Join(r.dir, "database"), []byte(url+"\n"), 0o600); err != nil {
		return err
	}
	return os.Setenv("FLEET_DATABASE", url)
}

func (r *run) play(ctx context.Context, runs string) (bool, error) {
	if err := r.prepare(ctx, runs); err != nil {
		return false, err
	}
	r.say("Fleet run %s", r.dir)
	r.say("%d sections, %d workers, allowance %d credits at %d a report", len(r.in.Sections), r.in.Concurrency, r.in.Allowance, r.in.CostPerReport)
	if err := r.startHost(); err != nil {
		return false, err
	}
	followCtx, cancelFollow := context.WithCancel(ctx)
	r.follow = cancelFollow
	r.wg.Add(1)
	go r.followEvents(followCtx)

	closeLogs, err := r.launch(ctx)
	defer closeLogs()
	if err != nil {
		return false, err
	}
	before, err := r.waitSettled(ctx)
	if err != nil {
		return false, err
	}
	var sum Summary
	snap, reconciled, err := r.restartAndReconcile(ctx, before, &sum)
	if err != nil {
		return false, err
	}
	rep, verified, err := r.verify(ctx)
	if err != nil {
		return false, err
	}
	sum.ReceiptsVerified = verified
	if r.in.LoseAckIndex != nil {
		sum.LostAckRecovered = r.lostAckRecovered(ctx, reconciled)
	}
	r.syncEvents(ctx)
	r.stopFollowing()
	if err := r.export(ctx, snap); err != nil {
		return false, err
	}
	countStates(&sum, snap)
	if len(r.in.After) > 0 {
		waited, computed, err := r.checkDependents(ctx, snap)
		if err != nil {
			return false, err
		}
		sum.WaitedForDependencies, sum.ComputedFromOutputs = &waited, &computed
	}
	sum.Mutations = snap.Mutations
	a := snap.Accounting
	sum.Spent, sum.Reserved, sum.Available = a.Spent, a.Reserved, a.Available
	failed := sum.failedInvariants(a, rep.Violations)
	line, _ := json.Marshal(sum)
	if err := statedir.WriteFileAtomic(filepath.Join(r.dir, "summary.json"), append(line, '\n'), 0o600); err != nil {
		return false, err
	}
	for _, f := range failed {
		r.say("INVARIANT FAILED: %s", f)
	}
	r.sayWhatNext()
	r.say("%s", line)
	return len(failed) == 0, nil
}

// prepare makes the run's directory with its input, its database (a
// schema of its own on PostgreSQL) and state, and reads the operator's
// credential.
func (r *run) prepare(ctx context.Context, runs string) error {
	var err error
	if r.dir, err = newRunDir(runs); err != nil {
		return err
	}
	if err := statedir.WriteFileAtomic(filepath.Join(r.dir, "input.json"), r.rawInput, 0o600); err != nil {
		return err
	}
	if err := r.usePostgres(ctx); err != nil {
		return err
	}
	if err := r.initState(ctx); err != nil {
		return err
	}
	if r.api.token, err = statedir.ReadCredential(filepath.Join(r.stateDir(), statedir.CredentialsDir, statedir.OperatorName)); err != nil {
		return err
	}
	r.hostLog, err = os.OpenFile(filepath.Join(r.dir, "host.log"), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o600)
	return err
}

// launch cancels the job the input names, then starts the workers, each
// logging to a file of its own; closeLogs closes those files.
func (r *run) launch(ctx context.Context) (closeLogs func(), err error) {
	var logs []*os.File
	closeLogs = func() {
		for _, f := range logs {
			f.Close()
		}
	}
	if r.in.CancelIndex != nil {
		var snap wire.Snapshot
		if err := r.api.operator(ctx, "GET", "/admin/snapshot", nil, &snap); err != nil {
			return closeLogs, err
		}
		op := snap.Jobs[*r.in.CancelIndex].OperationID
		if err := r.api.operator(ctx, "POST", "/admin/jobs/"+op+"/cancel", nil, nil); err != nil {
			return closeLogs, err
		}
	}
	for i := 1; i <= r.in.Concurrency; i++ {
		name := fmt.Sprintf("worker-%d", i)
		log, err := os.OpenFile(filepath.Join(r.dir, name+".log"), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o600)
		if err != nil {
			return closeLogs, err
		}
		logs = append(logs, log)
		w, err := startWorker(r.bin, r.host.URL, filepath.Join(r.stateDir(), statedir.CredentialsDir, name), r.in.Mode, log)
		if err != nil {
			return closeLogs, err
		}
		r.workers = append(r.workers, w)
	}
	return closeLogs, nil
}

// restartAndReconcile, once the workers have settled (before), kills and
// restarts the host when the input asks, then reconciles every job, and
// answers the state after and each job's reconciliation.
func (r *run) restartAndReconcile(ctx context.Context, before wire.Snapshot, sum *Summary) (wire.Snapshot, map[string]wire.Reconciliation, error) {
	if r.in.Restart {
		r.say("== stopping the host (SIGKILL pid %d) and restarting it on the same state", r.host.PID)
		r.host.kill()
		if err := r.startHost(); err != nil {
			return before, nil, err
		}
		sum.StaleClaimRefused = ptr(r.staleClaimRefused(ctx))
	}
	reconciled := map[string]wire.Reconciliation{}
	for _, j := range before.Jobs {
		var rec wire.Reconciliation
		if err := r.api.operator(ctx, "POST", "/admin/jobs/"+j.OperationID+"/reconcile", nil, &rec); err != nil {
			return before, nil, err
		}
		reconciled[j.OperationID] = rec
	}
	var snap wire.Snapshot
	if err := r.api.operator(ctx, "GET", "/admin/snapshot", nil, &snap); err != nil {
		return before, nil, err
	}
	if r.in.Restart {
		sum.RestartRetainedAccounting = ptr(before.Accounting == snap.Accounting)
		sum.RestartRetainedKernelKey = ptr(before.KernelKey == snap.KernelKey && snap.KernelKey == r.host.KernelKey)
	}
	return snap, reconciled, nil
}

// failedInvariants names each invariant the summary breaks: one mutation
// per completed job, a clean verify, never past the allowance, and each
// scenario the input played.
func (sum *Summary) failedInvariants(a wire.Accounting, violations []string) []string {
	var failed []string
	check := func(ok bool, what string) {
		if !ok {
			failed = append(failed, what)
		}
	}
	check(sum.Mutations == int64(sum.Completed), "mutations equal completed")
	check(sum.ReceiptsVerified, "fleet-host verify (receipts, chain, events, accounting, one mutation per job): "+strings.Join(violations, "; "))
	check(a.Spent+a.Reserved <= a.Allowance && a.Available >= 0, "spent + reserved <= allowance")
	for name, b := range map[string]*bool{"accounting equal before and after the restart": sum.RestartRetainedAccounting,
		"kernel key equal before and after the restart":             sum.RestartRetainedKernelKey,
		"stale claim refused after the restart":                     sum.StaleClaimRefused,
		"lost acknowledgement recovered":                            sum.LostAckRecovered,
		"sections claimed only after those they wait for published": sum.WaitedForDependencies,
		"sections computed from the outputs they waited for":        sum.ComputedFromOutputs} {
		check(b == nil || *b, name)
	}
	return failed
}

// sayWhatNext says where the run is and how to look at it.
func (r *run) sayWhatNext() {
	r.say("run directory: %s", r.dir)
	state := filepath.Join(r.dir, "state")
	serve := filepath.Join(r.bin, "fleet-host") + " serve --state " + state
	if r.database != "" {
		// The URL may carry a password: point at the file rather than print it.
		serve += ` --database "$(cat ` + filepath.Join(r.dir, "database") + `)"`
	}
	r.say("console: %s, open the console URL it prints, sign in with %s", serve, filepath.Join(state, "credentials", "operator"))
	r.say("fleetctl: %s --host URL --credential %s jobs", filepath.Join(r.bin, "fleetctl"), filepath.Join(state, "credentials", "operator"))
}

func ptr[T any](v T) *T { return &v }

func (r *run) startHost() error {
	h, err := startHost(r.bin, r.stateDir(), r.hostLog)
	if err != nil {
		return err
	}
	r.host = h
	r.api.setURL(h.URL)
	r.say("== host pid %d serving at %s, kernel key %s…", h.PID, h.URL, h.KernelKey[:16])
	return nil
}

// shutdown stops whatever is still running.
func (r *run) shutdown() {
	for _, w := range r.workers {
		select {
		case <-w.done:
		default:
			w.cmd.Process.Kill()
			<-w.done
		}
	}
	r.stopFollowing()
	if r.host != nil {
		r.host.stop()
	}
	if r.hostLog != nil {
		r.hostLog.Close()
	}
}

func (r *run) stopFollowing() {
	if r.follow != nil {
		r.follow()
		r.wg.Wait()
		r.follow = nil
		if r.progress {
			fmt.Fprint(r.out, "\r\033[K")
		}
	}
}

// waitSettled waits until every job is terminal or unresolved and every
// worker has exited.
func (r *run) waitSettled(ctx context.Context) (wire.Snapshot, error) {
	deadline := time.Now().Add(r.timeout)
	for {
		var snap wire.Snapshot
		err := r.api.operator(ctx, "GET", "/admin/snapshot", nil, &snap)
		if err == nil && allSettled(snap) && r.workersDone() {
			for _, w := range r.workers {
				if w.err != nil {
					r.say("warning: %s exited with %v (see %s.log)", w.name, w.err, w.name)
				}
			}
			return snap, nil
		}
		if time.Now().After(deadline) {
			return snap, fmt.Errorf("jobs not settled after %s (last error: %v)", r.timeout, err)
		}
		select {
		case <-ctx.Done():
			return snap, ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func allSettled(s wire.Snapshot) bool {
	for _, j := range s.Jobs {
		if !j.State.Settled() {
			return false
		}
	}
	return true
}

func (r *run) workersDone() bool {
	for _, w := range r.workers {
		select {
		case <-w.done:
		default:
			return false
		}
	}
	return true
}

func countStates(sum *Summary, snap wire.Snapshot) {
	sum.Jobs = len(snap.Jobs)
	for _, j := range snap.Jobs {
		switch j.State {
		case wire.Completed:
			sum.Completed++
		case wire.Refused:
			sum.Refused++
		case wire.Cancelled, wire.CancelledBeforeDispatch:
			sum.Cancelled++
		case wire.Unresolved:
			sum.Unresolved++
		case wire.Failed:
			sum.Failed++
		}
	}
}

// followEvents prints the timeline as events commit.
func (r *run) followEvents(ctx context.Context) {
	defer r.wg.Done()
	for ctx.Err() == nil {
		r.syncEvents(ctx)
		r.mu.Lock()
		r.showProgress(ctx)
		r.mu.Unlock()
		select {
		case <-ctx.Done():
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func (r *run) syncEvents(ctx context.Context) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for {
		after := int64(len(r.events))
		var page wire.EventPage
		if err := r.api.operator(ctx, "GET", fmt.Sprintf("/admin/events?after=%d", after), nil, &page); err != nil {
			return // the host may be restarting; the next poll catches up
		}
		for _, e := range page.Events {
			if e.Sequence != int64(len(r.events))+1 {
				return
			}
			r.events = append(r.events, e)
			r.say("%3d  %-24s %-9s %s", e.Sequence, e.Kind, e.Actor, e.Title)
		}
		if len(page.Events) == 0 {
			return
		}
	}
}

// workerClaim is a "claimed" line of a worker log.
type workerLine struct {
	Msg         string `json:"msg"`
	OperationID string `json:"operation_id"`
	ClaimID     string `json:"claim_id"`
	Generation  int64  `json:"generation"`
	Replayed    bool   `json:"replayed"`
	Outcome     string `json:"outcome"`
}

func (r *run) workerLines(name string) []workerLine {
	f, err := os.Open(filepath.Join(r.dir, name+".log"))
	if err != nil {
		return nil
	}
	defer f.Close()
	var out []workerLine
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var l workerLine
		if json.Unmarshal(sc.Bytes(), &l) == nil {
			out = append(out, l)
		}
	}
	return out
}

// staleClaimRefused presents a claim taken before the restart to heartbeat,
// with its worker's credential, and expects 409 stale_claim.
func (r *run) staleClaimRefused(ctx context.Context) bool {
	for i := 1; i <= r.in.Concurrency; i++ {
		name := fmt.Sprintf("worker-%d", i)
		for _, l := range r.workerLines(name) {
			if l.Msg != "claimed" {
				continue
			}
			token, err := statedir.ReadCredential(filepath.Join(r.stateDir(), statedir.CredentialsDir, name))
			if err != nil {
				return false
			}
			status, body, _ := r.api.call(ctx, token, "POST", "/v1/jobs/"+l.OperationID+"/heartbeat",
				wire.ClaimRef{ClaimID: l.ClaimID, Generation: l.Generation}, nil)
			r.say("== %s presented its pre-restart claim %s to heartbeat: %d %s", name, l.ClaimID, status, bytes.TrimSpace(body))
			var refusal wire.ErrorBody
			return status == 409 && json.Unmarshal(body, &refusal) == nil && refusal.Error.Code == wire.CodeStaleClaim
		}
	}
	r.say("== no worker took a claim before the restart; nothing to present")
	return false
}

// lostAckRecovered checks the job whose acknowledgement was dropped: one
// mutation, its worker's retry got the original outcome, and reconciliation
// reused the existing effect with the original receipt. Nil when no
// publication reached the index.
func (r *run) lostAckRecovered(ctx context.Context, reconciled map[string]wire.Reconciliation) *bool {
	op := r.lostAckJob(ctx)
	if op == "" {
		r.say("== no publication reached lose_ack_index %d; the fault was not exercised", *r.in.LoseAckIndex)
		return nil
	}
	var detail wire.JobDetail
	if err := r.api.operator(ctx, "GET", "/admin/jobs/"+op, nil, &detail); err != nil || detail.Outcome == nil {
		return ptr(false)
	}
	retryGotOriginal := r.workerGotReplay(op, string(detail.Outcome))
	var outcome struct {
		ReceiptID string `json:"receipt_id"`
	}
	json.Unmarshal(detail.Outcome, &outcome)
	rec := reconciled[op]
	ok := detail.Mutations == 1 && retryGotOriginal && rec.ReusedExistingEffect && rec.ReceiptID == outcome.ReceiptID
	r.say("== lost acknowledgement of %s: %d mutation, retry got the original outcome: %t, reconcile reused receipt %s: %t",
		op, detail.Mutations, retryGotOriginal, outcome.ReceiptID, rec.ReusedExistingEffect)
	return &ok
}

// lostAckJob is the job whose publication's acknowledgement the fault
// dropped, as its event says ("" when none did).
func (r *run) lostAckJob(ctx context.Context) string {
	r.syncEvents(ctx)
	r.mu.Lock()
	defer r.mu.Unlock()
	op := ""
	for _, e := range r.events {
		var d struct {
			OperationID string `json:"operation_id"`
			Fault       string `json:"fault"`
		}
		if e.Kind == wire.EventPublished && json.Unmarshal(e.Data, &d) == nil && d.Fault == "lose_ack" {
			op = d.OperationID
		}
	}
	return op
}

// workerGotReplay is whether a worker's log shows its publication of op
// answered as a replay with exactly outcome.
func (r *run) workerGotReplay(op, outcome string) bool {
	for i := 1; i <= r.in.Concurrency; i++ {
		for _, l := range r.workerLines(fmt.Sprintf("worker-%d", i)) {
			if l.Msg == "publication answered" && l.OperationID == op && l.Replayed && l.Outcome == outcome {
				return true
			}
		}
	}
	return false
}
