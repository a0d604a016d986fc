package e2e

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fleet/fleet/internal/statedir"
	"github.com/fleet/fleet/internal/store/postgres"
	"github.com/fleet/fleet/internal/storetest"
	"github.com/fleet/fleet/internal/wire"
)

// forgedReason is a failure reason that, printed as it is, would show as
// a line of the host's own: an event the operator never saw committed.
const forgedReason = "timeout\n  99  12:00:00.000  fleet.completed          operator  The operator approved \u202egnp.exe"

// TestWorkerTextCannotForge: a worker's failure reason holding a line
// break or a bidi override is refused over HTTP with invalid_request and
// changes nothing; and text of that kind already stored (by a host before
// this check) is printed by fleetctl escaped, on its one line.
func TestWorkerTextCannotForge(t *testing.T) {
	t.Parallel()
	state := initState(t, sampleInput(t, func(m map[string]any) { m["sections"] = []string{"summary"} }))
	h := startHost(t, state)
	worker := credential(t, state, "worker-1")
	var claimed wire.ClaimResult
	mustStatus(t, call(t, "POST", h.URL+"/v1/claims", worker, nil), 200).decode(t, &claimed)
	if claimed.Job == nil {
		t.Fatal("nothing to claim")
	}
	op, ref := claimed.Job.OperationID, claimed.Job.Claim
	before := digest(t, state)
	for _, reason := range []string{forgedReason, "zero\u200bwidth", "tab\tand more", "sep\u2028arator"} {
		r := call(t, "POST", h.URL+"/v1/jobs/"+op+"/fail", worker, map[string]any{
			"claim_id": ref.ClaimID, "generation": ref.Generation, "reason": reason, "retryable": true})
		if r.Status != 400 || r.code() != wire.CodeInvalid || !strings.Contains(string(r.Body), "reason") {
			t.Fatalf("reason %q answered %d %s; want 400 invalid_request naming the reason", reason, r.Status, r.Body)
		}
	}
	if digest(t, state) != before {
		t.Fatal("refused failures changed the state")
	}
	mustStatus(t, call(t, "POST", h.URL+"/v1/jobs/"+op+"/fail", worker, map[string]any{
		"claim_id": ref.ClaimID, "generation": ref.Generation, "reason": "timeout", "retryable": true}), 200)
	h.kill()

	// What a host before the check could have stored.
	db, err := sql.Open("sqlite", "file:"+filepath.Join(state, statedir.DatabaseFile)+"?_pragma=busy_timeout(10000)")
	if err != nil {
		t.Fatal(err)
	}
	for _, stmt := range []string{
		`UPDATE job_attempts SET reason = ?`, `UPDATE jobs SET last_error = ?, reason = 'attempt 1 of 3 failed: ' || ?`,
		`UPDATE events SET title = 'worker-1''s attempt failed (' || ? || ')' WHERE kind = 'fleet.retry_scheduled'`,
	} {
		args := []any{forgedReason}
		if strings.Count(stmt, "?") == 2 {
			args = append(args, forgedReason)
		}
		if res, err := db.Exec(stmt, args...); err != nil {
			t.Fatal(err)
		} else if n, _ := res.RowsAffected(); n == 0 {
			t.Fatalf("%s changed no row", stmt)
		}
	}
	db.Close()

	h = startHost(t, state)
	ctl := operatorCtl(t, h, state)
	for _, out := range []string{ctl("events"), ctl("job", op), ctl("jobs")} {
		for _, line := range strings.Split(out, "\n") {
			if strings.HasPrefix(strings.TrimSpace(line), "99 ") || strings.ContainsRune(line, '\u202e') {
				t.Fatalf("fleetctl printed the worker's text as its own line or with its override:\n%s", out)
			}
		}
		if !strings.Contains(out, `timeout\n  99`) || !strings.Contains(out, `\u202e`) {
			t.Fatalf("fleetctl did not show the stored reason escaped:\n%s", out)
		}
	}
}

// TestStoredReportKeyPrintsEscaped: a report key with a terminal's escape
// and a line break, as a host before keys were checked could have stored
// it, is printed by fleetctl escaped on its one line, in the report's view
// and in its job's.
func TestStoredReportKeyPrintsEscaped(t *testing.T) {
	t.Parallel()
	state := initState(t, sampleInput(t, func(m map[string]any) { m["sections"] = []string{"summary"} }))
	const key = "q3\x1b[2J\n  99  12:00:00.000  fleet.completed"
	db, err := sql.Open("sqlite", "file:"+filepath.Join(state, statedir.DatabaseFile)+"?_pragma=busy_timeout(10000)")
	if err != nil {
		t.Fatal(err)
	}
	for _, stmt := range []string{`UPDATE batches SET idempotency_key = ?`, `UPDATE jobs SET batch_key = ?`} {
		if res, err := db.Exec(stmt, key); err != nil {
			t.Fatal(err)
		} else if n, _ := res.RowsAffected(); n == 0 {
			t.Fatalf("%s changed no row", stmt)
		}
	}
	db.Close()
	h := startHost(t, state)
	ctl := operatorCtl(t, h, state)
	op := getSnapshot(t, h, credential(t, state, "operator")).Jobs[0].OperationID
	for _, out := range []string{ctl("report", key), ctl("job", op)} {
		if strings.ContainsRune(out, '\x1b') || strings.Contains(out, "\n  99") || !strings.Contains(out, `q3\x1b[2J\n  99`) {
			t.Fatalf("fleetctl printed the stored key unescaped:\n%q", out)
		}
	}
}

// backendStates runs fn on a state served by SQLite, and when PostgreSQL
// is there (FLEET_TEST_POSTGRES_URL) on one served by two hosts sharing a
// PostgreSQL database and the state directory, as the attacks
// were tried.
func backendStates(t *testing.T, edit func(map[string]any), fn func(t *testing.T, state string, hosts []*hostProcess)) {
	t.Run("sqlite", func(t *testing.T) {
		t.Parallel()
		state := initState(t, sampleInput(t, edit))
		fn(t, state, []*hostProcess{startHost(t, state)})
	})
	t.Run("postgres", func(t *testing.T) {
		t.Parallel()
		server := storetest.PostgresURL()
		if server == "" {
			t.Skip("SKIPPED the PostgreSQL half: set " + storetest.EnvPostgres + " (.ci/run starts one)")
		}
		database := newPostgresDatabase(t, server)
		state := initState(t, sampleInput(t, edit), "--database", database)
		hosts := []*hostProcess{
			startHost(t, state, "--database", database, "--host-id", "a"),
			startHost(t, state, "--database", database, "--host-id", "b"),
		}
		fn(t, state, hosts)
	})
}

// newPostgresDatabase makes a schema of its own on server for one test,
// dropped at cleanup, and returns its URL.
func newPostgresDatabase(t *testing.T, server string) string {
	t.Helper()
	suffix := make([]byte, 6)
	rand.Read(suffix)
	schema := "e2e_" + hex.EncodeToString(suffix)
	database, err := postgres.CreateSchema(context.Background(), server, schema)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { postgres.DropSchema(context.Background(), server, schema) })
	return database
}

// TestConcurrentRotationsLeaveAWorkingFile: two rotations of one
// credential at once, many times over (through both hosts where there are
// two); after each pair the token in the credential's file is the one the
// hosts accept (issue 21, item 2: the file was written after the commit,
// and the two writes could land in either order).
func TestConcurrentRotationsLeaveAWorkingFile(t *testing.T) {
	t.Parallel()
	backendStates(t, nil, func(t *testing.T, state string, hosts []*hostProcess) {
		operator := credential(t, state, "operator")
		for round := range 40 {
			var wg sync.WaitGroup
			answers := make([]response, 2)
			for i := range answers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					answers[i] = call(t, "POST", hosts[(round+i)%len(hosts)].URL+"/admin/credentials/worker-2/rotate", operator, nil)
				}()
			}
			wg.Wait()
			for _, a := range answers {
				mustStatus(t, a, 200)
			}
			token := credential(t, state, "worker-2")
			for _, h := range hosts {
				// Another host rereads the credentials within a second.
				waitFor(t, 3*time.Second, "the credential file's token to be accepted", func() bool {
					r := call(t, "GET", h.URL+"/v1/documents/no-such-document", token, nil)
					if r.Status != 404 && r.Status != 401 {
						t.Fatalf("round %d: %d %s", round, r.Status, r.Body)
					}
					return r.Status == 404
				})
			}
		}
	})
}

// signIn signs in to h's console with token and returns the session
// cookie's value.
func signIn(t *testing.T, h *hostProcess, token string) string {
	t.Helper()
	req, _ := http.NewRequest("POST", h.URL+"/console/session", strings.NewReader(fmt.Sprintf(`{"credential":%q}`, token)))
	req.Header.Set("Origin", h.URL)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	for _, c := range resp.Cookies() {
		if c.Name == "fleet_console" && resp.StatusCode == 200 {
			return c.Value
		}
	}
	t.Fatalf("sign-in answered %d without a session", resp.StatusCode)
	return ""
}

// withSession sends a request as the console would, with its cookie.
func withSession(t *testing.T, h *hostProcess, method, path, cookie string) response {
	t.Helper()
	req, _ := http.NewRequest(method, h.URL+path, nil)
	req.Header.Set("Origin", h.URL)
	req.AddCookie(&http.Cookie{Name: "fleet_console", Value: cookie})
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	return response{Status: resp.StatusCode, Header: resp.Header, Body: data}
}

// openStream opens GET /admin/events/stream on h with a cookie or a bearer
// token and returns a channel closed when the host ends the stream.
func openStream(t *testing.T, h *hostProcess, cookie, bearer string) <-chan struct{} {
	t.Helper()
	req, _ := http.NewRequest("GET", h.URL+"/admin/events/stream", nil)
	if cookie != "" {
		req.AddCookie(&http.Cookie{Name: "fleet_console", Value: cookie})
	} else {
		req.Header.Set("Authorization", "Bearer "+bearer)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	resp, err := http.DefaultClient.Do(req.WithContext(ctx))
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != 200 {
		t.Fatalf("event stream: %d", resp.StatusCode)
	}
	ended := make(chan struct{})
	go func() {
		defer close(ended)
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}()
	return ended
}

// TestRotationEndsSessionsAndStreams: rotating the operator credential
// ends, on every host, each console session and event stream opened with
// the old token within the second the old bearer stops working; the
// sessions cannot rotate again and get the next token (issue 21, item 1:
// a session lived on for its 12 hours). Revoking a worker credential ends
// nothing of the operator's.
func TestRotationEndsSessionsAndStreams(t *testing.T) {
	t.Parallel()
	backendStates(t, nil, func(t *testing.T, state string, hosts []*hostProcess) {
		old := credential(t, state, "operator")
		type opened struct {
			h                    *hostProcess
			cookie               string
			cookieEnd, bearerEnd <-chan struct{}
		}
		var all []opened
		for _, h := range hosts {
			cookie := signIn(t, h, old)
			mustStatus(t, withSession(t, h, "GET", "/admin/stats", cookie), 200)
			all = append(all, opened{h: h, cookie: cookie, cookieEnd: openStream(t, h, cookie, ""), bearerEnd: openStream(t, h, "", old)})
		}
		mustStatus(t, call(t, "POST", hosts[0].URL+"/admin/credentials/worker-3/revoke", old, nil), 200)
		for _, o := range all {
			mustStatus(t, withSession(t, o.h, "GET", "/admin/stats", o.cookie), 200)
		}

		var rotated wire.CredentialChange
		mustStatus(t, call(t, "POST", hosts[0].URL+"/admin/credentials/operator/rotate", old, nil), 200).decode(t, &rotated)
		at := time.Now()
		for _, o := range all {
			waitFor(t, 3*time.Second, "the old operator token to be refused", func() bool {
				return call(t, "GET", o.h.URL+"/admin/stats", old, nil).Status == 401
			})
			// The same second: the session goes with the bearer.
			if r := withSession(t, o.h, "GET", "/admin/stats", o.cookie); r.Status != 401 || r.code() != wire.CodeUnauthorized {
				t.Fatalf("%s: a session of the rotated token read the stats: %d %s", o.h.URL, r.Status, r.Body)
			}
			if r := withSession(t, o.h, "POST", "/admin/credentials/operator/rotate", o.cookie); r.Status != 401 || strings.Contains(string(r.Body), "fleet_") {
				t.Fatalf("%s: a session of the rotated token rotated again: %d %s", o.h.URL, r.Status, r.Body)
			}
			for what, ended := range map[string]<-chan struct{}{"cookie": o.cookieEnd, "bearer": o.bearerEnd} {
				select {
				case <-ended:
				case <-time.After(2*time.Second - time.Since(at)):
					t.Fatalf("%s: the event stream opened with the old token (%s) still runs %s after the rotation", o.h.URL, what, time.Since(at))
				}
			}
		}
		// The new token signs in as before.
		mustStatus(t, withSession(t, hosts[0], "GET", "/admin/stats", signIn(t, hosts[0], rotated.Token)), 200)
	})
}

// drippingSignIns keeps n connections that send a sign-in's headers
// promising a 100-byte body and then one byte every half second, each
// reopened every 10 s or when the host cuts it off, as the attack in issue
// 21, item 3 did; stop ends them.
func drippingSignIns(h *hostProcess, n int) (stop func()) {
	return attackers(h.addr(), n, func(ctx context.Context, conn net.Conn) {
		fmt.Fprintf(conn, "POST /console/session HTTP/1.1\r\nHost: %s\r\nOrigin: %s\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n", h.addr(), h.URL)
		reopen := time.After(10 * time.Second)
		for {
			if _, err := conn.Write([]byte(" ")); err != nil {
				return
			}
			select {
			case <-ctx.Done():
				return
			case <-reopen:
				return
			case <-time.After(500 * time.Millisecond):
			}
		}
	})
}

// TestSignInUnderSlowBodies: while 24 connections without a credential
// trickle sign-in bodies, 20 real operator sign-ins all succeed (issue 21,
// item 3: the sign-in's 16 slots were the attacker's to hold, and 18 of 20
// answered 503).
func TestSignInUnderSlowBodies(t *testing.T) {
	t.Parallel()
	state := initState(t, sampleInput(t, nil))
	h := startHost(t, state)
	operator := credential(t, state, "operator")
	stop := drippingSignIns(h, 24)
	defer stop()
	time.Sleep(300 * time.Millisecond) // every attacker connected and trickling
	for i := range 20 {
		req, _ := http.NewRequest("POST", h.URL+"/console/session", strings.NewReader(fmt.Sprintf(`{"credential":%q}`, operator)))
		req.Header.Set("Origin", h.URL)
		resp, err := httpClient.Do(req)
		if err != nil {
			t.Fatalf("sign-in %d: %v", i, err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("sign-in %d of 20 during the attack: %d %s", i+1, resp.StatusCode, body)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestSignInThrottled: 2,000 wrong credentials from 8 threads are answered
// 401 only until the address's failure budget is spent, then 429 with
// Retry-After, counted in the metrics; a body over the sign-in's few
// hundred bytes is 413 (issue 21, item 4: all 2,000 were 401, at 1,408 a
// second).
func TestSignInThrottled(t *testing.T) {
	t.Parallel()
	state := initState(t, sampleInput(t, nil))
	h := startHost(t, state)
	var mu sync.Mutex
	statuses := map[int]int{}
	var retryAfter string
	started := time.Now()
	var wg sync.WaitGroup
	for thread := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 250 {
				req, _ := http.NewRequest("POST", h.URL+"/console/session",
					strings.NewReader(fmt.Sprintf(`{"credential":"fleet_guess_%d_%d"}`, thread, i)))
				req.Header.Set("Origin", h.URL)
				resp, err := httpClient.Do(req)
				if err != nil {
					t.Error(err)
					return
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				mu.Lock()
				statuses[resp.StatusCode]++
				if resp.StatusCode == 429 {
					retryAfter = resp.Header.Get("Retry-After")
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	took := time.Since(started)
	// The address's budget: 10 at once, then one every 6 s.
	if allowed := 10 + int(took/(6*time.Second)) + 1; statuses[401] > allowed || statuses[401] < 10 {
		t.Fatalf("%v in %s: want at most %d refusals answered 401, the rest 429", statuses, took, allowed)
	}
	if statuses[429] != 2000-statuses[401] || retryAfter == "" {
		t.Fatalf("%v; Retry-After %q", statuses, retryAfter)
	}
	metrics := string(call(t, "GET", h.URL+"/metrics", credential(t, state, "operator"), nil).Body)
	for _, want := range []string{`fleet_console_sign_ins_total{outcome="throttled"} ` + fmt.Sprint(statuses[429]),
		`fleet_console_sign_ins_total{outcome="failed"} ` + fmt.Sprint(statuses[401])} {
		if !strings.Contains(metrics, want+"\n") {
			t.Fatalf("the metrics lack %q", want)
		}
	}
	req, _ := http.NewRequest("POST", h.URL+"/console/session", strings.NewReader(fmt.Sprintf(`{"credential":%q}`, strings.Repeat("x", 600))))
	req.Header.Set("Origin", h.URL)
	resp, err := httpClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 413 {
		t.Fatalf("a 600-byte credential: %d", resp.StatusCode)
	}
}

// TestEventStreamsApartFromRequests: forty event streams open with the
// operator credential leave its requests their slots (issue 21, item 9:
// the 33rd stream took the last of the credential's 32 and the operator's
// API answered 503); past --max-streams a new stream closes the oldest.
func TestEventStreamsApartFromRequests(t *testing.T) {
	t.Parallel()
	state := initState(t, sampleInput(t, nil))
	h := startHost(t, state, "--max-streams", "8")
	operator := credential(t, state, "operator")
	var streams []<-chan struct{}
	for range 40 {
		streams = append(streams, openStream(t, h, "", operator))
	}
	mustStatus(t, call(t, "GET", h.URL+"/admin/stats", operator, nil), 200)
	mustStatus(t, call(t, "POST", h.URL+"/admin/credentials/worker-3/revoke", operator, nil), 200)
	for i, ended := range streams[:32] {
		select {
		case <-ended:
		case <-time.After(3 * time.Second):
			t.Fatalf("stream %d, older than the 8 newest, is still open", i)
		}
	}
	for i, ended := range streams[32:] {
		select {
		case <-ended:
			t.Fatalf("stream %d, one of the 8 newest, was closed", 32+i)
		default:
		}
	}
	metrics := string(call(t, "GET", h.URL+"/metrics", operator, nil).Body)
	if !strings.Contains(metrics, "fleet_event_streams_closed_total 32\n") {
		t.Fatal("the metrics do not count the 32 streams closed")
	}
}
