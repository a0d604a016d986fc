package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/fleet/fleet/internal/mcpworker"
	"github.com/fleet/fleet/internal/storetest"
	"github.com/fleet/fleet/internal/wire"
)

// mcpAgent is a scripted agent: the Go SDK's MCP client, talking to a
// fleet-mcp process (over stdio, or streamable HTTP).
type mcpAgent struct {
	t       *testing.T
	session *mcp.ClientSession
	log     *os.File
	// deniedAtTake counts the jobs take_job answered denied (refused
	// with their claim).
	deniedAtTake int
}

// startMCP launches fleet-mcp for the worker name over the command
// transport, as an MCP client launches a local server.
func startMCP(t *testing.T, hostURL, state, name string, extra ...string) *mcpAgent {
	t.Helper()
	args := append([]string{"--host", hostURL, "--credential", filepath.Join(state, "credentials", name)}, extra...)
	cmd := exec.Command(filepath.Join(binDir, "fleet-mcp"), args...)
	log := mcpLog(t, name)
	cmd.Stderr = log
	return connectMCP(t, &mcp.CommandTransport{Command: cmd}, log)
}

func mcpLog(t *testing.T, name string) *os.File {
	t.Helper()
	log, err := os.Create(filepath.Join(t.TempDir(), name+"-mcp.log"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		log.Close()
		if data, _ := os.ReadFile(log.Name()); strings.Contains(string(data), "DATA RACE") {
			t.Errorf("fleet-mcp %s reported a data race:\n%s", name, data)
		}
	})
	return log
}

func connectMCP(t *testing.T, transport mcp.Transport, log *os.File) *mcpAgent {
	t.Helper()
	client := mcp.NewClient(&mcp.Implementation{Name: "fleet-e2e-agent", Version: "0"}, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	session, err := client.Connect(ctx, transport, nil)
	if err != nil {
		t.Fatalf("connect to fleet-mcp: %v", err)
	}
	t.Cleanup(func() { session.Close() })
	return &mcpAgent{t: t, session: session, log: log}
}

func (a *mcpAgent) logText() string {
	data, _ := os.ReadFile(a.log.Name())
	return string(data)
}

// call calls a tool; the answer's text when it is a tool error.
func (a *mcpAgent) call(tool string, args any, out any) (errText string) {
	a.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	if args == nil {
		args = map[string]any{}
	}
	res, err := a.session.CallTool(ctx, &mcp.CallToolParams{Name: tool, Arguments: args})
	if err != nil {
		a.t.Fatalf("%s: %v\nfleet-mcp's log:\n%s", tool, err, a.logText())
	}
	if res.IsError {
		var text []string
		for _, c := range res.Content {
			if tc, ok := c.(*mcp.TextContent); ok {
				text = append(text, tc.Text)
			}
		}
		errText = strings.Join(text, "\n")
		if errText == "" {
			a.t.Fatalf("%s: a tool error without text", tool)
		}
	}
	if out != nil && res.StructuredContent != nil {
		data, _ := json.Marshal(res.StructuredContent)
		if err := json.Unmarshal(data, out); err != nil {
			a.t.Fatalf("%s: structured content %s: %v", tool, data, err)
		}
	}
	return errText
}

// ok calls a tool that must succeed.
func (a *mcpAgent) ok(tool string, args any, out any) {
	a.t.Helper()
	if e := a.call(tool, args, out); e != "" {
		a.t.Fatalf("%s answered a tool error: %s\nfleet-mcp's log:\n%s", tool, e, a.logText())
	}
}

// fails calls a tool that must answer a tool error starting with code.
func (a *mcpAgent) fails(tool string, args any, code string) string {
	a.t.Helper()
	e := a.call(tool, args, nil)
	if !strings.HasPrefix(e, code+":") {
		a.t.Fatalf("%s answered %q, want a %s tool error", tool, e, code)
	}
	return e
}

// take takes the next job, waiting while the queue says so; nil when
// there is nothing to do.
func (a *mcpAgent) take() *mcpworker.Job {
	a.t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		var out mcpworker.TakeOutput
		a.ok("take_job", nil, &out)
		switch out.Status {
		case "claimed":
			return out.Job
		case "denied": // refused with its claim: settled, and not held
			if out.Admission == nil || out.Admission.Decision != "deny" || out.Admission.ReceiptID == "" || out.Job == nil {
				a.t.Fatalf("take_job denied: %+v", out)
			}
			a.deniedAtTake++
			continue
		case "nothing_to_do":
			return nil
		}
		if time.Now().After(deadline) {
			a.t.Fatalf("take_job still %s after a minute", out.Status)
		}
		time.Sleep(100 * time.Millisecond) // the agent's own pause before asking again
	}
}

// work runs the agent's loop: take, begin, write, publish, until there is
// nothing to do. It returns how many sections it published and how many
// were denied.
func (a *mcpAgent) work() (published, denied int) {
	a.t.Helper()
	before := a.deniedAtTake
	defer func() { denied += a.deniedAtTake - before }()
	for job := a.take(); job != nil; job = a.take() {
		var begin mcpworker.BeginOutput
		if e := a.call("begin_work", nil, &begin); e != "" {
			if !strings.HasPrefix(e, "denied:") || begin.Decision != "deny" || begin.ReceiptID == "" {
				a.t.Fatalf("begin_work: %s (%+v)", e, begin)
			}
			denied++
			continue
		}
		var pub mcpworker.PublishOutput
		a.ok("publish_section", map[string]any{"text": agentText(job), "prompt_tokens": 100, "completion_tokens": 20}, &pub)
		if pub.Status != "published" || pub.ReceiptID == "" {
			a.t.Fatalf("publish_section: %+v", pub)
		}
		published++
	}
	return published, denied
}

func agentText(job *mcpworker.Job) string {
	return fmt.Sprintf("The %s of %d bytes, as an agent wrote it.", job.Section, len(job.Document))
}

// TestMCPWorkerRunsAReport: an agent through fleet-mcp (the Go SDK's
// client over the command transport) runs the sample report in a
// model-mode state. The allowance pays for two of four sections: two are
// denied with their receipts. The first publication's answer is lost (the
// host's lose-ack fault) and recovered under the same operation key: one
// mutation. The figures are those ./run.sh shows for the same input
// (TestSampleRun), and verify is clean.
func TestMCPWorkerRunsAReport(t *testing.T) {
	t.Parallel()
	state := initState(t, sampleInput(t, func(m map[string]any) { m["mode"], m["lose_ack_index"] = "model", 0 }))
	h := startHost(t, state)
	operator := credential(t, state, "operator")
	agent := startMCP(t, h.URL, state, "worker-1")

	tools, err := agent.session.ListTools(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, tool := range tools.Tools {
		names = append(names, tool.Name)
		if tool.Description == "" || tool.InputSchema == nil || tool.OutputSchema == nil {
			t.Errorf("tool %s lacks a description or a schema", tool.Name)
		}
	}
	if got := strings.Join(names, ","); got != "begin_work,publish_section,read_document,report_failure,status,take_job" {
		t.Fatalf("tools %s", got)
	}
	prompt, err := agent.session.GetPrompt(context.Background(), &mcp.GetPromptParams{Name: mcpworker.PromptName})
	if err != nil || len(prompt.Messages) != 1 || !strings.Contains(prompt.Messages[0].Content.(*mcp.TextContent).Text, "take_job") {
		t.Fatalf("prompt %s: %+v, %v", mcpworker.PromptName, prompt, err)
	}
	// Nothing held yet: the job's tools say so.
	agent.fails("publish_section", map[string]any{"text": "x"}, "no_job")

	// The first job by hand: read it, begin it, publish it.
	job := agent.take()
	if job == nil || job.Document != sampleDocument || job.Instructions == "" || job.ClaimID == "" {
		t.Fatalf("first job %+v", job)
	}
	agent.fails("take_job", nil, "holding_job")
	var begin mcpworker.BeginOutput
	agent.ok("begin_work", nil, &begin)
	var doc mcpworker.DocumentOutput
	agent.ok("read_document", nil, &doc)
	if begin.Decision != "allow" || doc.DocumentID != job.DocumentID || doc.Version != 0 || !doc.AssignedToYou {
		t.Fatalf("begin %+v, document %+v", begin, doc)
	}
	// The agent sees its tenant's remaining allowance (default's is the
	// fleet's); it has no allowance of its own.
	if begin.Tenant != wire.DefaultTenant || begin.TenantAvailable == nil || *begin.TenantAvailable != begin.Available || begin.OwnAvailable != nil {
		t.Fatalf("begin's levels: %+v", begin)
	}
	agent.fails("publish_section", map[string]any{"text": "x", "prompt_tokens": 5}, "invalid_request")
	var first mcpworker.PublishOutput
	agent.ok("publish_section", map[string]any{"text": agentText(job)}, &first)
	if first.Status != "published" || !first.Replayed || first.Version != 1 {
		t.Fatalf("the lost answer was not recovered from the retained outcome: %+v", first)
	}
	var detail wire.JobDetail
	mustStatus(t, call(t, "GET", h.URL+"/admin/jobs/"+job.OperationID, operator, nil), 200).decode(t, &detail)
	if detail.State != wire.Completed || detail.Mutations != 1 || len(detail.Operations) != 1 ||
		detail.Operations[0].Deliveries != 2 || detail.Operations[0].OperationKey != first.OperationKey {
		t.Fatalf("after a lost answer: %s, %d mutations, operations %+v", detail.State, detail.Mutations, detail.Operations)
	}
	var body struct {
		OperationID string `json:"operation_id"`
		InputSHA256 string `json:"input_sha256"`
		Section     string `json:"section"`
		Mode        string `json:"mode"`
		Model       string `json:"model"`
		Answer      string `json:"answer"`
	}
	if err := json.Unmarshal(detail.Document.Body, &body); err != nil || body.OperationID != job.OperationID || body.InputSHA256 == "" ||
		body.Section != job.Section || body.Mode != "model" || body.Model != mcpworker.AgentModel || body.Answer != agentText(job) {
		t.Fatalf("published body %s (%v)", detail.Document.Body, err)
	}

	published, denied := agent.work()
	if published != 1 || denied != 2 {
		t.Fatalf("the loop published %d and was denied %d, want 1 and 2", published, denied)
	}
	snap := getSnapshot(t, h, operator)
	got := map[wire.JobState]int{}
	for _, j := range snap.Jobs {
		got[j.State]++
	}
	db := openDB(t, state)
	mutations := count(t, db, `SELECT COUNT(*) FROM mutations`)
	// TestSampleRun's summary line for this input: 4 jobs, 2 completed, 2
	// refused, 40 spent, 0 reserved, 10 available, 2 mutations.
	a := snap.Accounting
	if len(snap.Jobs) != 4 || got[wire.Completed] != 2 || got[wire.Refused] != 2 || a.Spent != 40 || a.Reserved != 0 ||
		a.Available != 10 || mutations != 2 {
		t.Fatalf("jobs %v, accounting %+v, mutations %d", got, a, mutations)
	}
	verifyState(t, state)
	var st mcpworker.StatusOutput
	agent.ok("status", nil, &st)
	if st.Holding {
		t.Fatalf("status after the queue emptied: %+v", st)
	}
}

// TestMCPFences: an agent whose document was reassigned while it worked is
// superseded and the document stays as it was; after a host restart a
// claimed job's claim is stale, refused, and the agent is told; a failure
// the agent reports settles the attempt; an agent that leaves gives its job
// back at once.
func TestMCPFences(t *testing.T) {
	t.Parallel()
	state := initState(t, sampleInput(t, func(m map[string]any) { m["mode"], m["allowance"] = "model", 1000 }))
	h := startHost(t, state)
	operator := credential(t, state, "operator")
	// A claim that admits leaves no claimed job for a restart to fence:
	// these fences are the separate dispatch's.
	agent := startMCP(t, h.URL, state, "worker-1", "--separate-dispatch")

	job := agent.take()
	agent.fails("publish_section", map[string]any{"text": "x"}, "not_admitted")
	agent.ok("begin_work", nil, nil)
	mustStatus(t, call(t, "POST", h.URL+"/admin/documents/"+job.DocumentID+"/assign", operator,
		map[string]any{"expected_generation": job.Generation, "owner": "worker-2"}), 200)
	var doc mcpworker.DocumentOutput
	agent.ok("read_document", nil, &doc)
	if doc.AssignedToYou {
		t.Fatalf("the reassigned document still reads as the agent's: %+v", doc)
	}
	agent.fails("publish_section", map[string]any{"text": "too late"}, "superseded")
	var detail wire.JobDetail
	mustStatus(t, call(t, "GET", h.URL+"/admin/jobs/"+job.OperationID, operator, nil), 200).decode(t, &detail)
	if detail.Document.Version != 0 || detail.Mutations != 0 {
		t.Fatalf("a superseded agent changed the document: version %d, %d mutations", detail.Document.Version, detail.Mutations)
	}

	// The host restarts while the agent holds a claimed job.
	next := agent.take()
	h.kill()
	h = startHost(t, state, "--listen", h.addr())
	e := agent.fails("begin_work", nil, "stale_claim")
	if !strings.Contains(e, "take_job for the next") {
		t.Fatalf("the agent is not told what to do: %s", e)
	}
	var st mcpworker.StatusOutput
	agent.ok("status", nil, &st)
	if st.Holding {
		t.Fatalf("still holding %s after its claim was refused: %+v", next.OperationID, st)
	}
	mustStatus(t, call(t, "GET", h.URL+"/admin/jobs/"+next.OperationID, operator, nil), 200).decode(t, &detail)
	if detail.State != wire.Queued || detail.Generation != next.Generation+1 {
		t.Fatalf("the restart's stale job: %s at generation %d", detail.State, detail.Generation)
	}

	// An agent that cannot write a section says why: a reason over the
	// host's limit is refused with the job still held, then one in bounds
	// settles the attempt and queues the job for a retry.
	failing := agent.take()
	agent.ok("begin_work", nil, nil)
	agent.fails("report_failure", map[string]any{"reason": strings.Repeat("x", 2000)}, "invalid_request")
	var failed mcpworker.FailOutput
	agent.ok("report_failure", map[string]any{"reason": "the document is in a script I cannot read", "retryable": true}, &failed)
	mustStatus(t, call(t, "GET", h.URL+"/admin/jobs/"+failing.OperationID, operator, nil), 200).decode(t, &detail)
	if failed.State != "queued" || failed.ReceiptID == "" || detail.State != wire.Queued || detail.Attempts != failed.Attempt ||
		!strings.Contains(detail.LastError, "cannot read") {
		t.Fatalf("report_failure answered %+v; the job is %s, attempts %d, last error %q", failed, detail.State, detail.Attempts, detail.LastError)
	}

	// An agent that leaves while holding a running job: fleet-mcp reports
	// the attempt failed as it exits, and the job is queued again at once.
	leaver := startMCP(t, h.URL, state, "worker-2")
	left := leaver.take()
	leaver.ok("begin_work", nil, nil)
	leaver.session.Close()
	mustStatus(t, call(t, "GET", h.URL+"/admin/jobs/"+left.OperationID, operator, nil), 200).decode(t, &detail)
	if detail.State != wire.Queued || detail.Attempts != 1 || !strings.Contains(detail.LastError, "left fleet-mcp") {
		t.Fatalf("the job of an agent that left: %s, attempts %d, last error %q", detail.State, detail.Attempts, detail.LastError)
	}
}

// TestMCPHeartbeats: fleet-mcp keeps a thinking agent's lease alive past
// several lease periods (and its token counts settle the job at
// model_prices), tells the agent of an operator's cancel on its
// next call, and lets a stuck agent's job go at the heartbeat ceiling.
func TestMCPHeartbeats(t *testing.T) {
	t.Parallel()
	state := initState(t, sampleInput(t, func(m map[string]any) {
		m["mode"], m["allowance"] = "model", 1000
		m["model_prices"] = map[string]float64{"prompt_per_1k": 2, "completion_per_1k": 10}
	}))
	h := startHost(t, state, "--lease", "1s")
	operator := credential(t, state, "operator")
	jobOf := func(op string) wire.JobDetail {
		var d wire.JobDetail
		mustStatus(t, call(t, "GET", h.URL+"/admin/jobs/"+op, operator, nil), 200).decode(t, &d)
		return d
	}
	agent := startMCP(t, h.URL, state, "worker-1")
	stuck := startMCP(t, h.URL, state, "worker-2", "--heartbeat-ceiling", "2s")

	// Thinking past several leases: the lease moves on, the job stays running.
	job := agent.take()
	agent.ok("begin_work", nil, nil)
	firstLease, _ := time.Parse(time.RFC3339Nano, job.LeaseExpires)
	waitFor(t, 30*time.Second, "the lease renewed past three lease periods", func() bool {
		d := jobOf(job.OperationID)
		if d.State != wire.Running {
			t.Fatalf("the thinking agent's job went %s", d.State)
		}
		return d.LeaseExpiresAtMS > firstLease.Add(3*time.Second).UnixMilli()
	})
	var pub mcpworker.PublishOutput
	agent.ok("publish_section", map[string]any{"text": "written slowly", "prompt_tokens": 1200, "completion_tokens": 300}, &pub)
	if pub.Status != "published" {
		t.Fatalf("after a long think: %+v", pub)
	}
	// The agent's token counts settle the job at model_prices: 2.4 + 3 = 6
	// of the 20 reserved.
	settled := false
	for _, r := range jobOf(job.OperationID).Receipts {
		if r.Kind == wire.KindPublication {
			settled = r.Cost == 6 && r.Reserved != nil && *r.Reserved == 20
		}
	}
	if !settled {
		t.Fatalf("the publication did not settle 6 of 20: %+v", jobOf(job.OperationID).Receipts)
	}

	// The operator cancels the next job; the agent learns it.
	job = agent.take()
	agent.ok("begin_work", nil, nil)
	mustStatus(t, call(t, "POST", h.URL+"/admin/jobs/"+job.OperationID+"/cancel", operator, nil), 200)
	var notices []string
	waitFor(t, 10*time.Second, "the agent told of the cancel", func() bool {
		var st mcpworker.StatusOutput
		agent.ok("status", nil, &st)
		notices = append(notices, st.Notices...)
		return !st.Holding
	})
	if len(notices) != 1 || !strings.Contains(notices[0], job.OperationID) || !strings.Contains(notices[0], "cancelled by the operator") {
		t.Fatalf("notices %q", notices)
	}
	agent.fails("publish_section", map[string]any{"text": "x"}, "no_job")

	// The stuck agent takes and begins a job, then never returns.
	job = stuck.take()
	stuck.ok("begin_work", nil, nil)
	waitFor(t, 30*time.Second, "the ceiling to let the job go", func() bool {
		return jobOf(job.OperationID).State == wire.Queued
	})
	if d := jobOf(job.OperationID); d.Attempts != 1 || !strings.Contains(d.LastError, "heartbeat ceiling") {
		t.Fatalf("the released job: attempts %d, last error %q", d.Attempts, d.LastError)
	}
	var st mcpworker.StatusOutput
	stuck.ok("status", nil, &st)
	if st.Holding || len(st.Notices) != 1 || !strings.Contains(st.Notices[0], "heartbeat ceiling of 2s") {
		t.Fatalf("the stuck agent's status: %+v", st)
	}
	verifyState(t, state)
}

// TestMCPStreamableHTTP: the same worker over streamable HTTP, through the
// SDK's HTTP client transport (a text the host refuses as too long leaves
// the job held for a shorter one); the endpoint binds loopback only and
// refuses what a browser page could send it.
func TestMCPStreamableHTTP(t *testing.T) {
	t.Parallel()
	state := initState(t, sampleInput(t, func(m map[string]any) { m["mode"], m["sections"] = "model", []string{"summary", "links"} }))
	h := startHost(t, state)
	cmd := exec.Command(filepath.Join(binDir, "fleet-mcp"), "--host", h.URL, "--listen", "127.0.0.1:0",
		"--credential", filepath.Join(state, "credentials", "worker-1"))
	log := mcpLog(t, "worker-1")
	cmd.Stderr = log
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	line, err := bufio.NewReader(stdout).ReadBytes('\n')
	var ready struct{ URL string }
	if err != nil || json.Unmarshal(line, &ready) != nil || !strings.HasPrefix(ready.URL, "http://127.0.0.1:") {
		t.Fatalf("ready line %q: %v", line, err)
	}
	agent := connectMCP(t, &mcp.StreamableClientTransport{Endpoint: ready.URL}, log)
	// A text over the publication limit is refused, the job kept: a
	// shorter one publishes.
	agent.take()
	agent.ok("begin_work", nil, nil)
	e := agent.call("publish_section", map[string]any{"text": strings.Repeat("long ", 20000)}, nil)
	if !strings.HasPrefix(e, "body_too_large:") && !strings.HasPrefix(e, "invalid_request:") {
		t.Fatalf("a 100 KB text: %q", e)
	}
	var pub mcpworker.PublishOutput
	agent.ok("publish_section", map[string]any{"text": "short"}, &pub)
	if pub.Status != "published" {
		t.Fatalf("the shorter text: %+v", pub)
	}
	if published, denied := agent.work(); published != 1 || denied != 0 {
		t.Fatalf("over HTTP: published %d, denied %d", published, denied)
	}
	verifyState(t, state)

	// A browser page cannot drive the worker: not from another site, not
	// through a name rebound to loopback.
	initialize := []byte(`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18"}}`)
	for name, header := range map[string]http.Header{
		"cross-site":   {"Sec-Fetch-Site": {"cross-site"}, "Origin": {"https://evil.example"}},
		"rebound name": {"Host": {"evil.example"}},
	} {
		req, _ := http.NewRequest("POST", ready.URL, bytes.NewReader(initialize))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		for k, v := range header {
			req.Header[k] = v
		}
		req.Host = req.Header.Get("Host")
		resp, err := httpClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusForbidden {
			t.Errorf("a %s request: %d, want 403", name, resp.StatusCode)
		}
	}

	out, err := exec.Command(filepath.Join(binDir, "fleet-mcp"), "--host", h.URL, "--listen", "0.0.0.0:0",
		"--credential", filepath.Join(state, "credentials", "worker-1")).CombinedOutput()
	if code := exitCode(err); code != 2 || !strings.Contains(string(out), "loopback addresses only") {
		t.Fatalf("a non-loopback --listen: exit %d, %s", code, out)
	}
}

// TestMCPWorkersShareTheAllowance: eight agents at once over fifty jobs,
// on SQLite and on PostgreSQL served by two hosts (four agents on each).
// The allowance pays for thirty: thirty are published, each once, twenty
// denied, and never more spent than the allowance.
func TestMCPWorkersShareTheAllowance(t *testing.T) {
	t.Parallel()
	sections := make([]string, 50)
	for i := range sections {
		sections[i] = []string{"summary", "terms", "actions", "links"}[i%4]
	}
	input := sampleInput(t, func(m map[string]any) {
		m["mode"], m["sections"], m["concurrency"], m["allowance"], m["cost_per_report"] = "model", sections, 8, 600, 20
	})
	play := func(t *testing.T, state string, hosts []*hostProcess, verifyArgs ...string) {
		var wg sync.WaitGroup
		var mu sync.Mutex
		var published, denied int
		for i := 1; i <= 8; i++ {
			own := hosts[i%len(hosts)]
			agent := startMCP(t, own.URL, state, fmt.Sprintf("worker-%d", i))
			wg.Go(func() {
				p, d := agent.work()
				mu.Lock()
				published, denied = published+p, denied+d
				mu.Unlock()
			})
		}
		wg.Wait()
		snap := getSnapshot(t, hosts[0], credential(t, state, "operator"))
		a := snap.Accounting
		if published != 30 || denied != 20 || a.Spent != 600 || a.Reserved != 0 || a.Available != 0 || snap.Mutations != 30 {
			t.Fatalf("published %d, denied %d, accounting %+v, %d mutations", published, denied, a, snap.Mutations)
		}
		states := map[wire.JobState]int{}
		for _, j := range snap.Jobs {
			states[j.State]++
			if (j.State == wire.Completed) != (j.DocumentVersion == 1) {
				t.Fatalf("job %s is %s at document version %d", j.OperationID, j.State, j.DocumentVersion)
			}
		}
		if states[wire.Completed] != 30 || states[wire.Refused] != 20 {
			t.Fatalf("jobs by state %v", states)
		}
		verifyState(t, state, verifyArgs...)
	}
	t.Run("sqlite", func(t *testing.T) {
		t.Parallel()
		state := initState(t, input)
		play(t, state, []*hostProcess{startHost(t, state)})
	})
	t.Run("postgres", func(t *testing.T) {
		t.Parallel()
		server := storetest.PostgresURL()
		if server == "" {
			t.Skip("SKIPPED the PostgreSQL half: set " + storetest.EnvPostgres + " (.ci/run starts one)")
		}
		database := newPostgresDatabase(t, server)
		state := initState(t, input, "--database", database)
		play(t, state, []*hostProcess{
			startHost(t, state, "--database", database, "--host-id", "a"),
			startHost(t, state, "--database", database, "--host-id", "b"),
		}, "--database", database)
	})
}

// tsSDKVersion is the TypeScript MCP SDK the cross-client test installs.
const tsSDKVersion = "1.32.2"

// TestMCPFromTypeScript: a client nobody here wrote, the official
// TypeScript SDK (from npm, run by Node), drives fleet-mcp through a
// report: it lists the tools, reads the prompt, and publishes. It skips
// when Node or npm is missing or npm cannot fetch the SDK, unless
// FLEET_REQUIRE_NODE is set (CI).
func TestMCPFromTypeScript(t *testing.T) {
	t.Parallel()
	node, nerr := exec.LookPath("node")
	npm, perr := exec.LookPath("npm")
	if nerr != nil || perr != nil {
		if os.Getenv("FLEET_REQUIRE_NODE") != "" {
			t.Fatalf("FLEET_REQUIRE_NODE is set and node or npm is missing: %v %v", nerr, perr)
		}
		t.Skip("node and npm not found: install Debian's nodejs and npm to drive fleet-mcp from the TypeScript MCP SDK")
	}
	dir := t.TempDir()
	script, err := os.ReadFile(filepath.Join("testdata", "mcp-agent.mjs"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "agent.mjs"), script, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "package.json"), []byte(`{"private":true,"type":"module"}`), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	install := exec.CommandContext(ctx, npm, "install", "--no-audit", "--no-fund", "--loglevel=error", "@modelcontextprotocol/sdk@"+tsSDKVersion)
	install.Dir = dir
	if out, err := install.CombinedOutput(); err != nil {
		if os.Getenv("FLEET_REQUIRE_NODE") == "" { // a machine offline, say
			t.Skipf("npm install @modelcontextprotocol/sdk@%s failed, so the TypeScript client's test is skipped: %v\n%s", tsSDKVersion, err, out)
		}
		t.Fatalf("npm install @modelcontextprotocol/sdk@%s: %v\n%s", tsSDKVersion, err, out)
	}

	state := initState(t, sampleInput(t, func(m map[string]any) {
		m["mode"], m["sections"], m["allowance"] = "model", []string{"summary", "terms", "links"}, 40
	}))
	h := startHost(t, state)
	run := exec.CommandContext(ctx, node, "agent.mjs", filepath.Join(binDir, "fleet-mcp"),
		"--host", h.URL, "--credential", filepath.Join(state, "credentials", "worker-1"))
	run.Dir = dir
	log := mcpLog(t, "ts-agent")
	run.Stderr = log
	out, err := run.Output()
	if err != nil {
		data, _ := os.ReadFile(log.Name())
		t.Fatalf("the TypeScript agent: %v\n%s\n%s", err, out, data)
	}
	var seen struct {
		Tools   []string
		Prompt  string
		Results []struct {
			Section     string
			OperationID string `json:"operation_id"`
			Status      string
			ReceiptID   string `json:"receipt_id"`
			Error       string
		}
	}
	if err := json.Unmarshal(out, &seen); err != nil {
		t.Fatalf("the TypeScript agent printed %s: %v", out, err)
	}
	if strings.Join(seen.Tools, ",") != "begin_work,publish_section,read_document,report_failure,status,take_job" ||
		!strings.Contains(seen.Prompt, "publish_section") || len(seen.Results) != 3 {
		t.Fatalf("the TypeScript agent saw %s", out)
	}
	var published, denied int
	operator := credential(t, state, "operator")
	for _, r := range seen.Results {
		switch {
		case r.Status == "published" && r.ReceiptID != "":
			published++
			var d wire.JobDetail
			mustStatus(t, call(t, "GET", h.URL+"/admin/jobs/"+r.OperationID, operator, nil), 200).decode(t, &d)
			if d.State != wire.Completed || !strings.Contains(string(d.Document.Body), `"model":"ts-agent"`) {
				t.Fatalf("%s after the TypeScript agent: %s, body %s", r.Section, d.State, d.Document.Body)
			}
		case strings.HasPrefix(r.Error, "denied:"):
			denied++
		default:
			t.Fatalf("unexpected result %+v", r)
		}
	}
	if published != 2 || denied != 1 {
		t.Fatalf("published %d, denied %d: %s", published, denied, out)
	}
	verifyState(t, state)
}

// TestReadmeMCP follows the README's MCP section as written: its shell
// block makes a model-mode state and serves it; its client configuration
// launches fleet-mcp, which the Go SDK's client (standing in for the
// agent's) drives through the whole report. Only the port, the state's
// place and the binaries' place change.
func TestReadmeMCP(t *testing.T) {
	t.Parallel()
	const heading = "Agents as workers (MCP)"
	shells, configs := readmeBlocks(t, heading, "sh"), readmeBlocks(t, heading, "json")
	if len(shells) != 1 || len(configs) != 1 {
		t.Fatalf("the README's MCP section has %d shell and %d JSON blocks, want one of each", len(shells), len(configs))
	}
	port, dir := freePort(t), filepath.Join(t.TempDir(), "mcp")
	local := strings.NewReplacer("go build -o bin/ ./cmd/...", "# built by TestMain", "/path/to/fleet/bin/", binDir+"/",
		"bin/", binDir+"/", "/tmp/fleet-mcp", dir, "127.0.0.1:8080", "127.0.0.1:"+port)
	serveBlock(t, local.Replace(shells[0]), port)

	var config struct {
		MCPServers map[string]struct {
			Command string
			Args    []string
			Env     map[string]string
		} `json:"mcpServers"`
	}
	if err := json.Unmarshal([]byte(local.Replace(configs[0])), &config); err != nil {
		t.Fatalf("the README's client configuration: %v", err)
	}
	server, ok := config.MCPServers["fleet"]
	if !ok || len(config.MCPServers) != 1 {
		t.Fatalf("the configuration's servers: %+v", config.MCPServers)
	}
	cmd := exec.Command(server.Command, server.Args...)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH")} // as a client launches it: only what the configuration gives
	for k, v := range server.Env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	log := mcpLog(t, "readme")
	cmd.Stderr = log
	agent := connectMCP(t, &mcp.CommandTransport{Command: cmd}, log)
	if published, denied := agent.work(); published != 2 || denied != 2 {
		t.Fatalf("following the README: published %d, denied %d", published, denied)
	}
	verifyState(t, filepath.Join(dir, "state"))
}

// TestMCPRateLimited: a host that keeps asking the worker to slow down for
// longer than --outage is told to the agent as rate_limited, and the job
// stays held.
func TestMCPRateLimited(t *testing.T) {
	t.Parallel()
	state := initState(t, sampleInput(t, func(m map[string]any) { m["mode"], m["sections"] = "model", []string{"summary"} }))
	h := startHost(t, state, "--worker-rate", "0.1", "--worker-burst", "2")
	agent := startMCP(t, h.URL, state, "worker-1", "--outage", "1s")
	job := agent.take()
	agent.ok("read_document", nil, nil)
	e := agent.fails("read_document", nil, "rate_limited")
	if !strings.Contains(e, "slow down") {
		t.Fatalf("the agent is not told what to do: %s", e)
	}
	var st mcpworker.StatusOutput
	agent.ok("status", nil, &st)
	if !st.Holding || st.Job.OperationID != job.OperationID {
		t.Fatalf("after rate limiting: %+v", st)
	}
}

// TestMCPAgentCap: an agent whose credential carries an allowance of its
// own sees what it has left, and its tenant's, in begin_work's answer, and
// past its cap is refused naming its own allowance, through a real MCP
// client and fleet-mcp.
func TestMCPAgentCap(t *testing.T) {
	t.Parallel()
	state := initState(t, sampleInput(t, func(m map[string]any) { m["mode"], m["allowance"], m["cost_per_report"] = "model", 1000, 20 }))
	h := startHost(t, state)
	operator := credential(t, state, "operator")
	mustStatus(t, call(t, "POST", h.URL+"/admin/credentials", operator, map[string]any{"name": "agent-1", "allowance": 20}), 200)
	agent := startMCP(t, h.URL, state, "agent-1")
	job := agent.take()
	var begin mcpworker.BeginOutput
	agent.ok("begin_work", nil, &begin)
	if begin.Decision != "allow" || begin.OwnAvailable == nil || *begin.OwnAvailable != 0 || begin.TenantAvailable == nil ||
		*begin.TenantAvailable != 980 || begin.Tenant != wire.DefaultTenant {
		t.Fatalf("begin within the agent's 20: %+v", begin)
	}
	agent.ok("publish_section", map[string]any{"text": agentText(job)}, nil)
	var denied mcpworker.TakeOutput
	agent.ok("take_job", nil, &denied)
	if denied.Status != "denied" || denied.Admission == nil || denied.Admission.Level != wire.LevelCredential ||
		!strings.Contains(denied.Admission.Reason, "credential agent-1's own allowance exhausted") {
		t.Fatalf("a take past the agent's 20: %+v", denied)
	}
	// So is a separate dispatch's.
	separate := startMCP(t, h.URL, state, "agent-1", "--separate-dispatch")
	separate.take()
	if e := separate.fails("begin_work", nil, "denied"); !strings.Contains(e, "credential agent-1's own allowance exhausted") {
		t.Fatalf("begin past the agent's 20: %s", e)
	}
}

// TestMCPAgentForTenants: an agent through fleet-mcp on a credential
// limited to team-a takes and publishes only team-a's sections, and is
// told there is nothing to do once they are done, with the tenant
// default's jobs still queued.
func TestMCPAgentForTenants(t *testing.T) {
	t.Parallel()
	state := initState(t, sampleInput(t, func(m map[string]any) { m["mode"], m["allowance"], m["cost_per_report"] = "model", 1000, 20 }))
	h := startHost(t, state)
	operator := credential(t, state, "operator")
	mustStatus(t, call(t, "POST", h.URL+"/admin/tenants", operator, map[string]any{"name": "team-a"}), 200)
	mustStatus(t, call(t, "POST", h.URL+"/admin/reports", operator, map[string]any{"document": sampleDocument,
		"sections": []string{"summary", "links"}, "idempotency_key": "team-a-1", "tenant": "team-a"}), 200)
	mustStatus(t, call(t, "POST", h.URL+"/admin/credentials", operator, map[string]any{"name": "agent-a", "tenants": []string{"team-a"}}), 200)
	agent := startMCP(t, h.URL, state, "agent-a")
	if published, denied := agent.work(); published != 2 || denied != 0 {
		t.Fatalf("agent-a published %d and was denied %d; want team-a's 2", published, denied)
	}
	var l wire.TenantsList
	mustStatus(t, call(t, "GET", h.URL+"/admin/tenants", operator, nil), 200).decode(t, &l)
	for _, x := range l.Tenants {
		if want := map[string]int64{"team-a": 2, "default": 0}[x.Name]; x.Jobs["completed"] != want {
			t.Fatalf("tenant %s has %d jobs completed, want %d: %+v", x.Name, x.Jobs["completed"], want, l.Tenants)
		}
	}
}

// TestMCPAgentAfter: an agent through fleet-mcp is given an overview only
// after the section it waits for is published, and take_job hands it
// what that section published.
func TestMCPAgentAfter(t *testing.T) {
	t.Parallel()
	state := initState(t, sampleInput(t, func(m map[string]any) { m["mode"], m["allowance"], m["cost_per_report"] = "model", 1000, 20 }))
	h := startHost(t, state)
	operator := credential(t, state, "operator")
	var snap wire.Snapshot
	mustStatus(t, call(t, "GET", h.URL+"/admin/snapshot", operator, nil), 200).decode(t, &snap)
	for _, j := range snap.Jobs { // the sample's, out of the way
		mustStatus(t, call(t, "POST", h.URL+"/admin/jobs/"+j.OperationID+"/cancel", operator, nil), 200)
	}
	mustStatus(t, call(t, "POST", h.URL+"/admin/reports", operator, map[string]any{"document": sampleDocument,
		"sections": []string{"overview", "summary"}, "idempotency_key": "after-1", "after": map[string][]string{"overview": {"summary"}}}), 200)
	agent := startMCP(t, h.URL, state, "worker-1")
	first := agent.take()
	if first == nil || first.Section != "summary" || len(first.After) != 0 {
		t.Fatalf("the first job: %+v", first)
	}
	agent.ok("begin_work", nil, nil)
	agent.ok("publish_section", map[string]any{"text": "The fleet renews its leases."}, nil)
	next := agent.take()
	if next == nil || next.Section != "overview" || len(next.After) != 1 || next.After[0].Section != "summary" ||
		!strings.Contains(next.After[0].Published, "The fleet renews its leases.") {
		t.Fatalf("the overview as the agent is given it: %+v", next)
	}
	agent.ok("begin_work", nil, nil)
	agent.ok("publish_section", map[string]any{"text": "summary: the fleet renews its leases."}, nil)
	if again := agent.take(); again != nil {
		t.Fatalf("a third job: %+v", again)
	}
}
