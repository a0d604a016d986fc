package e2e

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"os/exec"
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
	ctl := func(args ...string) string {
		t.Helper()
		all := append([]string{"--host", h.URL, "--credential", filepath.Join(state, "credentials", "operator")}, args...)
		out, err := exec.Command(filepath.Join(binDir, "fleetctl"), all...).CombinedOutput()
		if err != nil {
			t.Fatalf("fleetctl %v: %v\n%s", args, err, out)
		}
		return string(out)
	}
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
