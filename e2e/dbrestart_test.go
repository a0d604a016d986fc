package e2e

import (
	"fmt"
	"net/http"
	"sync"
	"testing"
)

// TestHostAnswersAfterDatabaseRestart: a host whose PostgreSQL restarts
// (pg_ctl -m immediate) answers its operator's reads as soon as the server
// is back. Its pool still holds the connections the restart cut, busy a
// moment before, so the pool does not ping them when they are taken; a
// read that meets one must be run again on a fresh connection, not
// answered 503: the soak saw no host answer /admin/stats in a sample right
// after such a restart.
func TestHostAnswersAfterDatabaseRestart(t *testing.T) {
	t.Parallel()
	server, restartDatabase := privatePostgres(t)
	if server == "" {
		t.Skip("no PostgreSQL server binaries here to restart")
	}
	c := newClusterOn(t, server, []string{"a"}, nil)
	h := c.startWith("a")
	read := func() int {
		req, _ := newRequest("GET", h.URL+"/admin/stats", c.operator, nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	// Fill the pool: reads at once take a connection each.
	fill := func() {
		var wg sync.WaitGroup
		for range 12 {
			wg.Go(func() {
				for range 5 {
					read()
				}
			})
		}
		wg.Wait()
	}
	fill()
	if err := restartDatabase(); err != nil {
		t.Fatal(err)
	}
	var failed []string
	for i := range 40 {
		if status := read(); status != 200 {
			failed = append(failed, fmt.Sprintf("read %d: %d", i, status))
		}
	}
	if len(failed) > 0 {
		t.Fatalf("after the database restarted, %d of 40 reads failed: %v\nhost log:\n%s", len(failed), failed, h.log)
	}
}
