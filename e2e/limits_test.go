package e2e

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fleet/fleet/internal/statedir"
	"github.com/fleet/fleet/internal/testkit"
	"github.com/fleet/fleet/internal/wire"
)

func TestRequestCap(t *testing.T) {
	t.Parallel()
	state := initState(t, sampleInput(t, nil))
	h := startHost(t, state, "--max-requests", "2", "--body-timeout", "60s") // the held bodies outlast the test
	op := credential(t, state, "operator")
	// Requests whose bodies never finish fill the cap; one that arrives
	// while a poll holds a slot is refused, so hold more until a poll is.
	var held []net.Conn
	full := func() bool {
		r := call(t, "GET", h.URL+"/admin/snapshot", op, nil)
		return r.Status == 503 && r.code() == wire.CodeUnavailable && r.Header.Get("Retry-After") != ""
	}
	for !full() {
		if len(held) == 10 {
			t.Fatal("ten requests holding their slots left room for another")
		}
		conn, err := net.Dial("tcp", h.addr())
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		fmt.Fprintf(conn, "POST /admin/allowance HTTP/1.1\r\nHost: %s\r\nAuthorization: Bearer %s\r\nContent-Length: 100\r\n\r\n{", h.addr(), op)
		held = append(held, conn)
		time.Sleep(50 * time.Millisecond)
	}
	for _, conn := range held {
		conn.Close()
	}
	waitFor(t, 5*time.Second, "a free slot", func() bool {
		return call(t, "GET", h.URL+"/admin/snapshot", op, nil).Status == 200
	})
}

// TestTricklingClient: a client that never finishes its headers is cut off,
// and the host serves others meanwhile.
func TestTricklingClient(t *testing.T) {
	t.Parallel()
	state := initState(t, sampleInput(t, nil))
	h := startHost(t, state, "--header-timeout", "300ms")
	conn, err := net.Dial("tcp", h.addr())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	fmt.Fprint(conn, "POST /v1/claims HTTP/1.1\r\nHost: x\r\nAuthor")
	mustStatus(t, call(t, "GET", h.URL+"/healthz", "", nil), 200)
	conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	_, err = io.ReadAll(conn)
	var netErr net.Error
	if errors.As(err, &netErr) && netErr.Timeout() {
		t.Fatal("the host kept a trickling client's connection open")
	}
}

func TestOversizedHeaders(t *testing.T) {
	t.Parallel()
	state := initState(t, sampleInput(t, nil))
	h := startHost(t, state)
	req, _ := http.NewRequest("GET", h.URL+"/healthz", nil)
	req.Header.Set("X-Padding", strings.Repeat("p", 100<<10))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusRequestHeaderFieldsTooLarge {
		t.Fatalf("100 KiB of headers: %d", resp.StatusCode)
	}
}

// smallDisk mounts a tmpfs of the given size for the test.
func smallDisk(t *testing.T, size string) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("mounting a small tmpfs to fill needs root")
	}
	dir := t.TempDir()
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size="+size, "tmpfs", dir).CombinedOutput(); err != nil {
		t.Fatalf("mount tmpfs: %v %s", err, out)
	}
	t.Cleanup(func() { exec.Command("umount", "-l", dir).Run() })
	return dir
}

// fill writes a file until the disk is full and returns its path.
func fill(t *testing.T, dir string) string {
	t.Helper()
	path := filepath.Join(dir, "filler")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	block := make([]byte, 4096)
	for {
		if _, err := f.Write(block); err != nil {
			if !errors.Is(err, syscall.ENOSPC) {
				t.Fatal(err)
			}
			return path
		}
	}
}

func TestFullDisk(t *testing.T) {
	t.Parallel()
	t.Run("Init", func(t *testing.T) {
		disk := smallDisk(t, "64k")
		path := filepath.Join(t.TempDir(), "input.json")
		testkit.WriteFile(t, path, sampleInput(t, nil), 0o600)
		out, err := exec.Command(filepath.Join(binDir, "fleet-host"), "init", "--state", filepath.Join(disk, "state"), "--input", path).CombinedOutput()
		if err == nil || !strings.Contains(string(out), "disk is full") {
			t.Fatalf("init on a full disk: %v %s", err, out)
		}
		if entries, _ := os.ReadDir(disk); len(entries) != 0 {
			t.Fatalf("a failed init left %v behind", entries)
		}
	})
	t.Run("Serving", func(t *testing.T) {
		disk := smallDisk(t, "2m")
		path := filepath.Join(t.TempDir(), "input.json")
		testkit.WriteFile(t, path, sampleInput(t, nil), 0o600)
		state := filepath.Join(disk, "state")
		if out, err := exec.Command(filepath.Join(binDir, "fleet-host"), "init", "--state", state, "--input", path).CombinedOutput(); err != nil {
			t.Fatalf("init: %v %s", err, out)
		}
		h := startHost(t, state)
		op := credential(t, state, "operator")
		filler := fill(t, disk)
		before := digest(t, state)
		batch := map[string]any{"document": strings.Repeat("word ", 12000), "sections": []string{"summary", "terms"}, "idempotency_key": "big"}
		r := call(t, "POST", h.URL+"/admin/reports", op, batch)
		if r.Status != 503 || r.code() != wire.CodeUnavailable || !strings.Contains(string(r.Body), "disk is full") {
			t.Fatalf("write on a full disk: %d %s", r.Status, r.Body)
		}
		if digest(t, state) != before {
			t.Fatal("a write that failed on a full disk changed the state")
		}
		os.Remove(filler)
		mustStatus(t, call(t, "POST", h.URL+"/admin/reports", op, batch), 200)
		h.kill()
		// A restart on a full disk refuses clearly; with room it recovers.
		// Its first write needs room only if the log it writes into must
		// grow: a log the killed host had checkpointed is written over
		// from its start, and a restart then serves (a background
		// checkpoint that finished before the kill, or not, decided which).
		// Emptied, the log must grow.
		truncateLog(t, state)
		filler = fill(t, disk)
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		out, err := exec.CommandContext(ctx, filepath.Join(binDir, "fleet-host"), "serve", "--state", state).CombinedOutput()
		if ctx.Err() != nil {
			t.Fatalf("serve on a full disk with an empty log kept serving: %s", out)
		}
		if err == nil || !strings.Contains(string(out), "full") {
			t.Fatalf("serve on a full disk: %v %s", err, out)
		}
		os.Remove(filler)
		h = startHost(t, state)
		if n := len(getSnapshot(t, h, op).Jobs); n != 6 {
			t.Fatalf("%d jobs after the full-disk episode, want 6", n)
		}
		h.kill()
		verifyState(t, state)
	})
}

// truncateLog checkpoints a stopped state's write-ahead log into its
// database and empties it.
func truncateLog(t *testing.T, state string) {
	t.Helper()
	db, err := sql.Open("sqlite", filepath.Join(state, statedir.DatabaseFile))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var busy, frames, copied int
	if err := db.QueryRow("PRAGMA wal_checkpoint(TRUNCATE)").Scan(&busy, &frames, &copied); err != nil || busy != 0 {
		t.Fatalf("checkpoint the log: busy %d (%v)", busy, err)
	}
}

func TestReadOnlyState(t *testing.T) {
	t.Parallel()
	disk := smallDisk(t, "4m")
	path := filepath.Join(t.TempDir(), "input.json")
	testkit.WriteFile(t, path, sampleInput(t, nil), 0o600)
	state := filepath.Join(disk, "state")
	if out, err := exec.Command(filepath.Join(binDir, "fleet-host"), "init", "--state", state, "--input", path).CombinedOutput(); err != nil {
		t.Fatalf("init: %v %s", err, out)
	}
	if out, err := exec.Command("mount", "-o", "remount,ro", disk).CombinedOutput(); err != nil {
		t.Fatalf("remount read-only: %v %s", err, out)
	}
	out, err := exec.Command(filepath.Join(binDir, "fleet-host"), "serve", "--state", state).CombinedOutput()
	if err == nil || !strings.Contains(string(out), "read-only") {
		t.Fatalf("serve on a read-only state: %v %s", err, out)
	}
}

// TestVerifyWhileServing: verify reads a state that a busy host is writing,
// without SQLITE_BUSY and without false violations.
func TestVerifyWhileServing(t *testing.T) {
	t.Parallel()
	sections := make([]string, 24)
	for i := range sections {
		sections[i] = "terms"
	}
	state := initState(t, sampleInput(t, func(m map[string]any) { m["sections"], m["concurrency"], m["allowance"] = sections, 4, 400 }))
	h := startHost(t, state)
	var ws []*workerProcess
	for i := 1; i <= 4; i++ {
		ws = append(ws, startWorker(t, h.URL, state, fmt.Sprintf("worker-%d", i), "--work-delay", "40ms"))
	}
	runs := 0
	for {
		verifyState(t, state)
		runs++
		done := true
		for _, w := range ws {
			select {
			case <-w.done:
			default:
				done = false
			}
		}
		if done {
			break
		}
	}
	verifyState(t, state)
	if runs < 2 {
		t.Fatalf("verify ran only %d times while the fleet worked", runs)
	}
	t.Logf("verify ran %d times during the run", runs)
}

// TestServeSaysWhatIsExposed: serve logs what each kind of caller reaches
// and what is not safe, and warns when it listens beyond loopback.
func TestServeSaysWhatIsExposed(t *testing.T) {
	t.Parallel()
	state := initState(t, sampleInput(t, nil))
	local := startHost(t, state)
	waitFor(t, 5*time.Second, "the exposure line", func() bool { return strings.Contains(local.log.String(), `"msg":"exposure"`) })
	if strings.Contains(local.log.String(), "listening beyond loopback") {
		t.Fatal("a loopback listener was warned about")
	}
	local.kill()
	open := startHost(t, state, "--listen", "0.0.0.0:0")
	waitFor(t, 5*time.Second, "the warning", func() bool {
		return strings.Contains(open.log.String(), "listening beyond loopback over plain HTTP")
	})
	for _, says := range []string{"without_credential", "operator_credential", "TLS"} {
		if !strings.Contains(open.log.String(), says) {
			t.Errorf("the exposure line does not say %s:\n%s", says, open.log)
		}
	}
}
