package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/chromedp"

	"github.com/fleet/fleet/internal/client"
	"github.com/fleet/fleet/internal/wire"
)

// caddyPath is Caddy's binary, or the test is skipped (failed under
// FLEET_REQUIRE_CADDY, as .ci/run sets it).
func caddyPath(t *testing.T) string {
	return toolPath(t, "caddy", "TLS proxy", "FLEET_REQUIRE_CADDY", "apt-get install caddy")
}

// tlsProxy is Caddy serving the README's Caddyfile in front of a host.
type tlsProxy struct {
	URL    string // https://localhost:port
	CAFile string // Caddy's internal CA's certificate
}

// startTLSProxy runs Caddy with the README's Caddyfile, its storage, name
// and upstream replaced by the test's, and waits until it answers over
// HTTPS with a certificate its CA file verifies.
func startTLSProxy(t *testing.T, caddy, upstream string) tlsProxy {
	t.Helper()
	blocks := readmeBlocks(t, "Operating a host", "caddyfile")
	if len(blocks) != 1 {
		t.Fatalf("the README's Operating a host section has %d caddyfile blocks, want 1", len(blocks))
	}
	dir, port := t.TempDir(), freePort(t)
	config := strings.NewReplacer(
		"/var/lib/caddy", filepath.Join(dir, "data"),
		"fleet.example.com:8443", "localhost:"+port,
		"127.0.0.1:8080", upstream,
	).Replace(blocks[0])
	for _, replaced := range []string{"/var/lib/caddy", "fleet.example.com", "127.0.0.1:8080"} {
		if !strings.Contains(blocks[0], replaced) {
			t.Fatalf("the README's Caddyfile no longer names %s, which the test replaces:\n%s", replaced, blocks[0])
		}
	}
	path := filepath.Join(dir, "Caddyfile")
	os.WriteFile(path, []byte(config), 0o600)
	cmd := exec.Command(caddy, "run", "--config", path, "--adapter", "caddyfile")
	// Caddy keeps its own files under HOME and XDG's directories.
	cmd.Env = append(os.Environ(), "HOME="+dir, "XDG_DATA_HOME="+filepath.Join(dir, "xdg"), "XDG_CONFIG_HOME="+filepath.Join(dir, "xdg"))
	log := &logBuffer{}
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	p := tlsProxy{URL: "https://localhost:" + port, CAFile: filepath.Join(dir, "data", "pki", "authorities", "local", "root.crt")}
	waitFor(t, 30*time.Second, "caddy to serve HTTPS\n"+log.String(), func() bool {
		rt, err := client.Transport(p.CAFile)
		if err != nil {
			return false
		}
		resp, err := (&http.Client{Transport: rt, Timeout: 5 * time.Second}).Get(p.URL + "/healthz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	return p
}

// TestTLSProxy: a host behind the README's Caddy set-up, reached over
// HTTPS only. fleetctl, fleet-worker and fleet-mcp each reach it with the
// CA file (--ca-file or FLEET_CA_FILE) and are refused without it, naming
// the flag; the event stream through the proxy delivers an event as it
// commits; and the console, in a real Chromium, signs in over HTTPS with
// a Secure, HttpOnly cookie and shows a report submitted afterwards
// without a reload.
func TestTLSProxy(t *testing.T) {
	t.Parallel()
	caddy, chromium := caddyPath(t), chromiumPath(t)
	state := initState(t, sampleInput(t, func(m map[string]any) {
		m["allowance"], m["cost_per_report"], m["restart"], m["mode"] = 1000, 1, false, "model"
	}))
	h := startHost(t, state)
	proxy := startTLSProxy(t, caddy, strings.TrimPrefix(h.URL, "http://"))
	operatorFile := filepath.Join(state, "credentials", "operator")
	fleetctl := func(env []string, args ...string) (string, error) {
		cmd := exec.Command(filepath.Join(binDir, "fleetctl"), append([]string{"--host", proxy.URL, "--credential", operatorFile}, args...)...)
		cmd.Env = append(os.Environ(), env...)
		out, err := cmd.CombinedOutput()
		return string(out), err
	}

	t.Run("fleetctl", func(t *testing.T) {
		if out, err := fleetctl(nil, "stats"); err == nil || !strings.Contains(out, "--ca-file") || !strings.Contains(out, "FLEET_CA_FILE") {
			t.Fatalf("fleetctl without the CA file: %v\n%s", err, out)
		}
		notPEM := filepath.Join(t.TempDir(), "not.pem")
		os.WriteFile(notPEM, []byte("not a certificate\n"), 0o600)
		if out, err := fleetctl(nil, "--ca-file", notPEM, "stats"); err == nil || !strings.Contains(out, "no PEM certificate") {
			t.Fatalf("fleetctl with a file holding no certificate: %v\n%s", err, out)
		}
		if out, err := fleetctl([]string{"FLEET_CA_FILE=" + proxy.CAFile}, "stats"); err != nil || !strings.Contains(out, "queued") {
			t.Fatalf("fleetctl with FLEET_CA_FILE: %v\n%s", err, out)
		}
	})

	t.Run("event stream", func(t *testing.T) {
		var stats wire.Stats
		mustStatus(t, call(t, "GET", h.URL+"/admin/stats", credential(t, state, "operator"), nil), 200).decode(t, &stats)
		eventStreamThroughProxy(t, proxy, credential(t, state, "operator"), stats.Events, func() {
			doc := filepath.Join(t.TempDir(), "doc.md")
			os.WriteFile(doc, []byte(sampleDocument), 0o600)
			if out, err := fleetctl(nil, "--ca-file", proxy.CAFile, "submit", "--document", doc, "--sections", "summary", "--key", "streamed"); err != nil {
				t.Fatalf("fleetctl submit: %v\n%s", err, out)
			}
		})
	})

	t.Run("workers", func(t *testing.T) {
		startWorker(t, proxy.URL, state, "worker-1", "--ca-file", "/nonexistent/ca.pem").failed(t, 30*time.Second, "no such file")
		// Refused at once, not retried for the outage (60 s by default).
		startWorker(t, proxy.URL, state, "worker-2").failed(t, 20*time.Second, "FLEET_CA_FILE")
		agent := startMCP(t, proxy.URL, state, "worker-3", "--ca-file", proxy.CAFile)
		if published, _ := agent.work(); published == 0 {
			t.Fatal("fleet-mcp over HTTPS published nothing")
		}
		model := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			json.NewEncoder(w).Encode(map[string]any{"model": "fake/model-1",
				"choices": []any{map[string]any{"message": map[string]string{"role": "assistant", "content": "A section, over HTTPS."}}},
				"usage":   map[string]int{"prompt_tokens": 100, "completion_tokens": 20}})
		}))
		defer model.Close()
		startWorkerFrom(t, filepath.Join(binDir, "fleet-worker"), []string{"FLEET_MODEL_URL=" + model.URL + "/v1", "OPENAI_API_KEY=sk-test"},
			proxy.URL, state, "worker-1", "--mode", "model", "--ca-file", proxy.CAFile).wait(t, 60*time.Second)
		if out, _ := fleetctl(nil, "--ca-file", proxy.CAFile, "jobs", "--state", "queued"); strings.Contains(out, "summary") {
			t.Fatalf("jobs still queued after the workers over HTTPS:\n%s", out)
		}
	})

	t.Run("console", func(t *testing.T) {
		consoleThroughProxy(t, chromium, proxy, credential(t, state, "operator"), func() {
			doc := filepath.Join(t.TempDir(), "doc.md")
			os.WriteFile(doc, []byte(sampleDocument), 0o600)
			if out, err := fleetctl(nil, "--ca-file", proxy.CAFile, "submit", "--document", doc, "--sections", "terms,links", "--key", "seen-live"); err != nil {
				t.Fatalf("fleetctl submit: %v\n%s", err, out)
			}
		})
	})
}

// eventStreamThroughProxy opens the operator's event stream through the
// proxy after the events so far, runs act, and waits for the event it
// commits to arrive while the stream stays open: a proxy that buffered
// the stream would hold it back.
func eventStreamThroughProxy(t *testing.T, proxy tlsProxy, operator string, after int64, act func()) {
	t.Helper()
	rt, err := client.Transport(proxy.CAFile)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", proxy.URL+"/admin/events/stream", nil)
	req.Header.Set("Authorization", "Bearer "+operator)
	req.Header.Set("Last-Event-ID", fmt.Sprint(after)) // nothing from before: only what commits now
	resp, err := (&http.Client{Transport: rt}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("event stream through the proxy: %s", resp.Status)
	}
	lines := make(chan string, 64)
	go func() {
		defer close(lines)
		for sc := bufio.NewScanner(resp.Body); sc.Scan(); {
			lines <- sc.Text()
		}
	}()
	act()
	timeout := time.After(20 * time.Second)
	for {
		select {
		case line, ok := <-lines:
			if !ok {
				t.Fatal("the event stream ended before the event arrived")
			}
			if line == "event: fleet.enqueued" {
				return
			}
		case <-timeout:
			t.Fatal("the enqueued event did not come through the proxy within 20 s of committing")
		}
	}
}

// consoleThroughProxy signs in to the console over HTTPS in Chromium,
// checks the session cookie, and watches a report act submits appear in
// the jobs table without a reload. Chromium is told to accept the
// certificate (it has its own trust store); the commands above check it.
func consoleThroughProxy(t *testing.T, chromium string, proxy tlsProxy, operator string, act func()) {
	t.Helper()
	ctx := newBrowser(t, chromium, chromedp.Flag("ignore-certificate-errors", true))
	waitJS := func(what, js string) {
		t.Helper()
		if _, err := chromedp.Run(ctx, chromedp.Poll[bool](js, chromedp.WithPollingTimeout(20*time.Second))); err != nil {
			t.Fatalf("%s: waiting for %s: %v", what, js, err)
		}
	}
	if err := chromedp.Do(ctx,
		chromedp.Navigate(proxy.URL+"/"),
		chromedp.WaitVisible(chromedp.ID("credential")),
		chromedp.SendKeys(chromedp.ID("credential"), operator),
		chromedp.Click(chromedp.CSS("#signin-form button[type=submit]")),
		chromedp.WaitVisible(chromedp.CSS("#jobs tbody tr")),
	); err != nil {
		t.Fatalf("sign in over HTTPS: %v", err)
	}
	cookies, err := chromedp.Run(ctx, func(ctx context.Context, target *chromedp.Target) (network.GetCookiesResult, error) {
		return cdp.Call(ctx, target, network.GetCookies, network.GetCookiesParams{URLs: []string{proxy.URL + "/"}})
	})
	if err != nil {
		t.Fatal(err)
	}
	var session *network.Cookie
	for _, c := range cookies.Cookies {
		if c.Name == "fleet_console" {
			session = c
		}
	}
	if session == nil || !session.Secure || !session.HTTPOnly {
		t.Fatalf("the console's session cookie over HTTPS: %+v", session)
	}
	before := evalJS[int](t, ctx, `document.querySelectorAll("#jobs tbody tr").length`)
	evalJS[bool](t, ctx, `window.__noReload = true`)
	act()
	waitJS("the submitted report's jobs", fmt.Sprintf(`document.querySelectorAll("#jobs tbody tr").length === %d`, before+2))
	if !evalJS[bool](t, ctx, `window.__noReload === true`) {
		t.Fatal("the console reloaded to show the report")
	}
}
