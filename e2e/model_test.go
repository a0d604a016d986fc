package e2e

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fleet/fleet/internal/storetest"
	"github.com/fleet/fleet/internal/testkit"
	"github.com/fleet/fleet/internal/wire"
)

const modelKey = "sk-fleet-test-5f1c0ffee5ecret"

// fakeOpenAI is an OpenAI-compatible chat-completions server on loopback.
// terms is refused once with 429; actions hangs until its caller hangs up.
type fakeOpenAI struct {
	*httptest.Server
	mu               sync.Mutex
	calls            map[string]int
	auth             map[string]bool
	actionsStarted   chan struct{}
	actionsCancelled chan struct{}
}

var sectionLine = regexp.MustCompile(`Section: (\w+)`)

func newFakeOpenAI(t *testing.T) *fakeOpenAI {
	f := &fakeOpenAI{calls: map[string]int{}, auth: map[string]bool{},
		actionsStarted: make(chan struct{}), actionsCancelled: make(chan struct{})}
	f.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if r.URL.Path != "/v1/chat/completions" {
			http.Error(w, "no such path "+r.URL.Path, http.StatusNotFound)
			return
		}
		m := sectionLine.FindSubmatch(body)
		if m == nil {
			http.Error(w, "no section in the prompt", http.StatusBadRequest)
			return
		}
		section := string(m[1])
		f.mu.Lock()
		f.calls[section]++
		n := f.calls[section]
		f.auth[r.Header.Get("Authorization")] = true
		f.mu.Unlock()
		switch {
		case section == "terms" && n == 1:
			w.Header().Set("Retry-After", "1")
			http.Error(w, `{"error":{"message":"rate limited"}}`, http.StatusTooManyRequests)
			return
		case section == "actions":
			close(f.actionsStarted)
			<-r.Context().Done()
			close(f.actionsCancelled)
			return
		}
		json.NewEncoder(w).Encode(map[string]any{"model": "fake/model-1",
			"choices": []any{map[string]any{"message": map[string]string{"role": "assistant", "content": "ANSWER for " + section}}},
			"usage":   map[string]int{"prompt_tokens": 1200, "completion_tokens": 300}})
	}))
	t.Cleanup(f.Close)
	return f
}

func (f *fakeOpenAI) callsOf(section string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls[section]
}

// TestModelWorkers runs model-mode workers against a fake endpoint: sections
// come from the model's answers, a 429 is retried, an operator's cancel
// cancels a hanging call, each publication settles what its usage cost at
// model_prices (6 of the 20 credits reserved) and releases the rest, and the
// API key appears nowhere but in the calls to the endpoint.
func TestModelWorkers(t *testing.T) {
	t.Parallel()
	fake := newFakeOpenAI(t)
	state := initState(t, sampleInput(t, func(m map[string]any) {
		m["mode"], m["concurrency"], m["allowance"], m["cost_per_report"] = "model", 2, 100, 20
		m["model_prices"] = map[string]float64{"prompt_per_1k": 2, "completion_per_1k": 10} // 2.4 + 3 = 6 credits
	}))
	h := startHost(t, state, "--lease", "3s")
	operator := credential(t, state, "operator")
	env := []string{"FLEET_MODEL_URL=" + fake.URL + "/v1", "OPENAI_API_KEY=" + modelKey, "OPENROUTER_API_KEY=", "FLEET_MODEL=fake/model"}
	var ws []*workerProcess
	for i := 1; i <= 2; i++ {
		ws = append(ws, startWorkerFrom(t, filepath.Join(binDir, "fleet-worker"), env, h.URL, state, fmt.Sprintf("worker-%d", i), "--mode", "model"))
	}

	select {
	case <-fake.actionsStarted:
	case <-time.After(30 * time.Second):
		t.Fatal("the actions section never reached the model")
	}
	var actions string
	for _, j := range getSnapshot(t, h, operator).Jobs {
		if j.Section == "actions" {
			actions = j.OperationID
		}
	}
	mustStatus(t, call(t, "POST", h.URL+"/admin/jobs/"+actions+"/cancel", operator, nil), 200)
	select {
	case <-fake.actionsCancelled: // the heartbeat learned of the cancel and hung up
	case <-time.After(15 * time.Second):
		t.Fatal("the operator's cancel did not cancel the model call in flight")
	}
	for _, w := range ws {
		w.wait(t, 60*time.Second)
	}

	snap := getSnapshot(t, h, operator)
	for _, j := range snap.Jobs {
		want := wire.Completed
		if j.Section == "actions" {
			want = wire.Cancelled
		}
		if j.State != want {
			t.Fatalf("%s is %s, want %s", j.Section, j.State, want)
		}
	}
	if n := fake.callsOf("terms"); n != 2 {
		t.Fatalf("terms reached the model %d times, want 2 (a 429, then the answer)", n)
	}
	// Three publications settle 6 each and release 14 each; the cancelled
	// running job's 20 stay spent, as in deterministic mode.
	if a := snap.Accounting; a.Spent != 3*6+20 || a.Reserved != 0 || a.Available != 100-38 || a.Calls != 4 {
		t.Fatalf("accounting %+v", a)
	}
	for _, j := range snap.Jobs {
		if j.Section == "actions" {
			continue
		}
		var d wire.JobDetail
		mustStatus(t, call(t, "GET", h.URL+"/admin/jobs/"+j.OperationID, operator, nil), 200).decode(t, &d)
		var body struct {
			Mode, Model, Answer string
			Usage               struct{ PromptTokens, CompletionTokens int64 } `json:"usage"`
		}
		testkit.MustDecode(t, d.Document.Body, &body)
		if body.Mode != "model" || body.Model != "fake/model-1" || body.Answer != "ANSWER for "+j.Section {
			t.Fatalf("%s's published body: %s", j.Section, d.Document.Body)
		}
		var pub *wire.Receipt
		for i := range d.Receipts {
			if d.Receipts[i].Kind == wire.KindPublication {
				pub = &d.Receipts[i]
			}
		}
		if pub == nil || pub.Cost != 6 || pub.Reserved == nil || *pub.Reserved != 20 {
			t.Fatalf("%s's publication receipt: %+v", j.Section, pub)
		}
	}
	verifyState(t, state)

	// The key went to the endpoint, and nowhere else.
	if !fake.auth["Bearer "+modelKey] {
		t.Fatal("the endpoint never received the key")
	}
	evs := call(t, "GET", h.URL+"/admin/events?after=0", operator, nil)
	places := map[string]string{"host log": h.log.String(), "events": string(evs.Body)}
	for _, w := range ws {
		data, _ := os.ReadFile(w.log.Name())
		places[filepath.Base(w.log.Name())] = string(data)
	}
	files, _ := filepath.Glob(filepath.Join(state, "*"))
	for _, f := range files {
		if data, err := os.ReadFile(f); err == nil {
			places[f] = string(data)
		}
	}
	for where, text := range places {
		if strings.Contains(text, modelKey) {
			t.Errorf("the API key appears in %s", where)
		}
	}
	if len(places) < 5 || !strings.Contains(places["events"], "fleet.published") {
		t.Fatalf("checked too little for the key: %d places", len(places))
	}
}

// TestModelWorkerRefusesWithoutKey: no key and no local endpoint is a clear
// refusal at start, before any claim.
func TestModelWorkerRefusesWithoutKey(t *testing.T) {
	t.Parallel()
	state := initState(t, sampleInput(t, func(m map[string]any) { m["mode"] = "model" }))
	h := startHost(t, state)
	w := startWorkerFrom(t, filepath.Join(binDir, "fleet-worker"),
		[]string{"OPENAI_API_KEY=", "OPENROUTER_API_KEY=", "FLEET_MODEL_URL="}, h.URL, state, "worker-1", "--mode", "model")
	<-w.done
	data, _ := os.ReadFile(w.log.Name())
	if w.err == nil || !strings.Contains(string(data), "OPENROUTER_API_KEY or OPENAI_API_KEY") {
		t.Fatalf("worker without a key: %v\n%s", w.err, data)
	}
	for _, j := range getSnapshot(t, h, credential(t, state, "operator")).Jobs {
		if j.State != wire.Queued {
			t.Fatalf("a refused worker touched %s: %s", j.Section, j.State)
		}
	}
}

// TestModelFailuresRetried: a model endpoint that answers 401 to the
// summary twice and then answers, and to the terms every time. The worker
// reports each failed attempt and goes on: summary completes on its third
// attempt with two failures recorded, terms fails after its three, the
// other sections complete, every attempt settles its reservation (no
// usage reported: all of it), and the worker ends on its own.
func TestModelFailuresRetried(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T) {
		t.Parallel()
		modelFailuresRetried(t)
	})
}

func modelFailuresRetried(t *testing.T) {
	var dbArgs []string
	if storetest.OnPostgres(t) {
		dbArgs = []string{"--database", storetest.NewLocation(t)}
	}
	var mu sync.Mutex
	calls := map[string]int{}
	fake := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		m := sectionLine.FindSubmatch(body)
		if m == nil {
			http.Error(w, "no section", http.StatusBadRequest)
			return
		}
		section := string(m[1])
		mu.Lock()
		calls[section]++
		n := calls[section]
		mu.Unlock()
		if section == "terms" || section == "summary" && n <= 2 {
			http.Error(w, `{"error":{"message":"invalid api key"}}`, http.StatusUnauthorized)
			return
		}
		json.NewEncoder(w).Encode(map[string]any{"model": "fake/model-1",
			"choices": []any{map[string]any{"message": map[string]string{"role": "assistant", "content": "ANSWER for " + section}}},
			"usage":   map[string]int{"prompt_tokens": 100, "completion_tokens": 10}})
	}))
	t.Cleanup(fake.Close)
	state := initState(t, sampleInput(t, func(m map[string]any) {
		m["mode"], m["concurrency"], m["allowance"], m["cost_per_report"] = "model", 1, 200, 20
		m["max_attempts"], m["backoff_base_ms"], m["backoff_cap_ms"] = 3, 200, 400
	}), dbArgs...)
	h := startHost(t, state, dbArgs...)
	operator := credential(t, state, "operator")
	env := []string{"FLEET_MODEL_URL=" + fake.URL + "/v1", "OPENAI_API_KEY=" + modelKey, "OPENROUTER_API_KEY=", "FLEET_MODEL=fake/model"}
	w := startWorkerFrom(t, filepath.Join(binDir, "fleet-worker"), env, h.URL, state, "worker-1", "--mode", "model")
	w.wait(t, 90*time.Second)

	snap := getSnapshot(t, h, operator)
	for _, j := range snap.Jobs {
		var d wire.JobDetail
		mustStatus(t, call(t, "GET", h.URL+"/admin/jobs/"+j.OperationID, operator, nil), 200).decode(t, &d)
		switch j.Section {
		case "summary":
			if d.State != wire.Completed || d.Attempts != 2 || len(d.AttemptLog) != 2 || !strings.Contains(d.AttemptLog[0].Reason, "401") {
				t.Fatalf("summary: %s after %d failed attempts, log %+v", d.State, d.Attempts, d.AttemptLog)
			}
		case "terms":
			if d.State != wire.Failed || d.Attempts != 3 || len(d.AttemptLog) != 3 || !strings.Contains(d.LastError, "401") {
				t.Fatalf("terms: %s after %d failed attempts (%s)", d.State, d.Attempts, d.LastError)
			}
		default:
			if d.State != wire.Completed || d.Attempts != 0 {
				t.Fatalf("%s: %s, %d attempts", j.Section, d.State, d.Attempts)
			}
		}
		for _, a := range d.AttemptLog {
			if a.Cost != 20 {
				t.Fatalf("%s's attempt %d settled %d, want its whole reservation of 20", j.Section, a.Attempt, a.Cost)
			}
		}
	}
	// Summary: two failures and a publication; terms: three failures;
	// actions and links: a publication each. 8 admissions, all spent.
	if a := snap.Accounting; a.Spent != 160 || a.Reserved != 0 || a.Calls != 8 {
		t.Fatalf("accounting %+v", a)
	}
	mu.Lock()
	summaryCalls := calls["summary"]
	mu.Unlock()
	if summaryCalls != 3 {
		t.Fatalf("summary reached the model %d times, want 3", summaryCalls)
	}
	metrics := string(mustStatus(t, call(t, "GET", h.URL+"/metrics", operator, nil), 200).Body)
	for _, line := range []string{`fleet_job_failures_total{class="retryable",then="queued"} 4`,
		`fleet_job_failures_total{class="retryable",then="failed"} 1`, `fleet_jobs{state="failed"} 1`} {
		if !strings.Contains(metrics, line) {
			t.Errorf("metrics lack %s", line)
		}
	}
	verifyState(t, state, dbArgs...)
}

// TestRunWithFailingModel: fleet-run (what ./run.sh execs) in model mode
// against an endpoint that refuses every call ends with every job failed
// after its attempts, each attempt paid for, and the run itself completes:
// a failing endpoint makes failed jobs, not a dead fleet.
func TestRunWithFailingModel(t *testing.T) {
	t.Parallel()
	fake := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		http.Error(w, `{"error":{"message":"invalid api key"}}`, http.StatusUnauthorized)
	}))
	t.Cleanup(fake.Close)
	dir := t.TempDir()
	path := filepath.Join(dir, "input.json")
	testkit.WriteFile(t, path, sampleInput(t, func(m map[string]any) {
		m["mode"], m["allowance"], m["restart"] = "model", 1000, false
		m["max_attempts"], m["backoff_base_ms"], m["backoff_cap_ms"] = 2, 100, 200
	}), 0o600)
	cmd := exec.Command(filepath.Join(binDir, "fleet-run"), "--bin", binDir, "--input", path, "--runs", filepath.Join(dir, "runs"))
	cmd.Env = append(os.Environ(), "FLEET_MODEL_URL="+fake.URL+"/v1", "OPENAI_API_KEY="+modelKey, "OPENROUTER_API_KEY=", "FLEET_MODEL=fake/model")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("fleet-run: %v\n%s", err, out)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	last := lines[len(lines)-1]
	if !strings.HasPrefix(last, `{"jobs":4,"completed":0,`) || !strings.Contains(last, `"unresolved":0,"failed":4,"spent":160,"reserved":0`) ||
		!strings.Contains(last, `"receipts_verified":true`) {
		t.Fatalf("summary %s\n%s", last, out)
	}
}
