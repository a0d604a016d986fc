package mcpworker_test

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/jsonschema-go/jsonschema"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/fleet/fleet/internal/host"
	"github.com/fleet/fleet/internal/hosttest"
	"github.com/fleet/fleet/internal/httpapi"
	"github.com/fleet/fleet/internal/input"
	"github.com/fleet/fleet/internal/mcpworker"
	"github.com/fleet/fleet/internal/statedir"
	"github.com/fleet/fleet/internal/store/backend"
)

// schemaSession is an MCP client session with fleet-mcp's server, for one
// worker of a real host behind a proxy that can lose publications'
// answers (the publication commits; the connection is closed unanswered).
type schemaSession struct {
	t        *testing.T
	session  *mcp.ClientSession
	schemas  map[string]*jsonschema.Resolved
	dropping atomic.Bool
}

func newSchemaSession(t *testing.T, separateDispatch bool) *schemaSession {
	ctx := context.Background()
	state := filepath.Join(t.TempDir(), "state")
	in, err := input.Parse([]byte(`{"document":"Schema text.\n- [ ] check\n","sections":["summary","terms","actions"],"allowance":20,"cost_per_report":20,"concurrency":1,"mode":"model"}`))
	if err != nil {
		t.Fatal(err)
	}
	if err := hosttest.Init(ctx, state, "", in); err != nil {
		t.Fatal(err)
	}
	// A lease of a second: renewals every third of a second.
	h, err := hosttest.OpenWith(ctx, state, "", backend.Options{}, host.Options{Lease: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close() })
	if err := h.Start(ctx, "test"); err != nil {
		t.Fatal(err)
	}
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	api := httpapi.New(h, quiet, httpapi.DefaultLimits()).Handler()
	s := &schemaSession{t: t, schemas: map[string]*jsonschema.Resolved{}}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if s.dropping.Load() && strings.HasSuffix(r.URL.Path, "/publish") {
			api.ServeHTTP(httptest.NewRecorder(), r) // committed, its answer lost
			conn, _, _ := w.(http.Hijacker).Hijack()
			conn.Close()
			return
		}
		api.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	token, err := statedir.ReadCredential(filepath.Join(state, "credentials", "worker-1"))
	if err != nil {
		t.Fatal(err)
	}
	agentCtx, cancel := context.WithCancel(ctx)
	t.Cleanup(cancel)
	// An outage long enough that a host slowed by a loaded machine (a
	// claim that admits, under the race detector beside other tests) is
	// not taken for one; the lost answer below waits it out once.
	agent := mcpworker.New(agentCtx, mcpworker.Config{HostURL: srv.URL, Token: token, Outage: 5 * time.Second, SeparateDispatch: separateDispatch, Log: quiet})
	serverT, clientT := mcp.NewInMemoryTransports()
	if _, err := mcpworker.NewServer(agent).Connect(ctx, serverT, nil); err != nil {
		t.Fatal(err)
	}
	if s.session, err = mcp.NewClient(&mcp.Implementation{Name: "schemas"}, nil).Connect(ctx, clientT, nil); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.session.Close() })
	tools, err := s.session.ListTools(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, tool := range tools.Tools {
		data, _ := json.Marshal(tool.OutputSchema)
		var schema jsonschema.Schema
		if err := json.Unmarshal(data, &schema); err != nil {
			t.Fatalf("%s's output schema: %v", tool.Name, err)
		}
		if s.schemas[tool.Name], err = schema.Resolve(nil); err != nil {
			t.Fatalf("%s's output schema: %v", tool.Name, err)
		}
	}
	return s
}

// call calls a tool; a protocol error (the server refusing its own answer
// against its schema, say) fails the test. It answers the structured
// content, checked against the tool's output schema, and the error text.
func (s *schemaSession) call(tool string, args map[string]any) (map[string]any, string) {
	s.t.Helper()
	if args == nil {
		args = map[string]any{}
	}
	res, err := s.session.CallTool(context.Background(), &mcp.CallToolParams{Name: tool, Arguments: args})
	if err != nil {
		s.t.Fatalf("%s: %v", tool, err)
	}
	var text []string
	for _, c := range res.Content {
		if tc, ok := c.(*mcp.TextContent); ok {
			text = append(text, tc.Text)
		}
	}
	if res.IsError && res.StructuredContent == nil {
		return nil, strings.Join(text, "\n")
	}
	data, _ := json.Marshal(res.StructuredContent)
	var out map[string]any
	if err := json.Unmarshal(data, &out); err != nil {
		s.t.Fatalf("%s: structured content %s: %v", tool, data, err)
	}
	if err := s.schemas[tool].Validate(out); err != nil {
		s.t.Fatalf("%s answered %s, which its output schema refuses: %v", tool, data, err)
	}
	if res.IsError {
		return out, strings.Join(text, "\n")
	}
	return out, ""
}

// TestAnswersMatchSchemas (issue 34): every tool's answer in every state
// it can be in, a read of a document whose publication committed
// included, is what its output schema says, on a real host, with
// take_job's claim admitting the job and with the separate dispatch.
func TestAnswersMatchSchemas(t *testing.T) {
	for _, separate := range []bool{false, true} {
		t.Run(map[bool]string{false: "claim-and-admit", true: "separate-dispatch"}[separate], func(t *testing.T) {
			answersMatchSchemas(t, separate)
		})
	}
}

func answersMatchSchemas(t *testing.T, separate bool) {
	s := newSchemaSession(t, separate)
	want := func(what string, out map[string]any, errText, field string, value any) {
		t.Helper()
		if errText != "" || out[field] != value {
			t.Fatalf("%s: %v %q; want %s %v", what, out, errText, field, value)
		}
	}
	out, errText := s.call("status", nil)
	want("status holding nothing", out, errText, "holding", false)
	out, errText = s.call("take_job", nil)
	want("take_job", out, errText, "status", "claimed")
	out, errText = s.call("status", nil)
	want("status holding a claimed job", out, errText, "holding", true)
	out, errText = s.call("read_document", nil)
	want("read_document before a publication", out, errText, "version", float64(0))
	out, errText = s.call("begin_work", nil)
	want("begin_work", out, errText, "decision", "allow")

	s.dropping.Store(true)
	if _, errText = s.call("publish_section", map[string]any{"text": "The summary.", "prompt_tokens": 10, "completion_tokens": 5}); !strings.HasPrefix(errText, "host_unreachable") {
		t.Fatalf("publish_section with its answer lost: %q", errText)
	}
	out, errText = s.call("read_document", nil)
	want("read_document after the publication committed", out, errText, "version", float64(1))
	if body, ok := out["body"].(map[string]any); !ok || body["answer"] != "The summary." {
		t.Fatalf("the published body: %v", out["body"])
	}
	out, errText = s.call("status", nil)
	want("status after a lost answer", out, errText, "publication_unsure", true)
	// The committed publication completed the job, so its renewal is
	// refused: the claim's end must not say the work cannot be published.
	deadline := time.Now().Add(10 * time.Second)
	for out["claim_ended"] == nil && time.Now().Before(deadline) {
		time.Sleep(100 * time.Millisecond)
		out, _ = s.call("status", nil)
	}
	if ended, _ := out["claim_ended"].(string); !strings.Contains(ended, "may have committed") || strings.Contains(ended, "cannot be published") {
		t.Fatalf("status after the renewal of a job whose publication committed: %v", out)
	}
	s.dropping.Store(false)
	out, errText = s.call("publish_section", map[string]any{"text": "The summary."})
	want("publish_section sent again", out, errText, "resent_earlier", true)

	out, errText = s.call("take_job", nil)
	if !separate { // refused with its claim, as every job past the allowance
		for out["status"] == "denied" {
			if adm, _ := out["admission"].(map[string]any); errText != "" || adm["decision"] != "deny" || adm["level"] != "fleet" {
				t.Fatalf("take_job past the allowance: %v %q", out, errText)
			}
			out, errText = s.call("take_job", nil)
		}
		want("take_job with nothing left", out, errText, "status", "nothing_to_do")
		return
	}
	want("take_job, the second", out, errText, "status", "claimed")
	if out, errText = s.call("begin_work", nil); !strings.HasPrefix(errText, "denied") || out["decision"] != "deny" {
		t.Fatalf("begin_work past the allowance: %v %q", out, errText)
	}
	out, errText = s.call("take_job", nil)
	want("take_job, the third", out, errText, "status", "claimed")
	out, errText = s.call("report_failure", map[string]any{"reason": "cannot", "retryable": false})
	want("report_failure", out, errText, "state", "failed")
	out, errText = s.call("take_job", nil)
	want("take_job with nothing left", out, errText, "status", "nothing_to_do")
}
