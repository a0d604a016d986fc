// Command fleet-run plays a fleet run (what ./run.sh does): it creates a run
// directory, initializes a host from the input, serves it, starts the
// workers, plays the scenario (cancel, lost acknowledgement, restart),
// reconciles, verifies, prints a timeline and a summary, and exits 0 only
// when every invariant held.
package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/fleet/fleet/internal/input"
	"github.com/fleet/fleet/internal/logging"
	"github.com/fleet/fleet/internal/worker"
)

func main() {
	inputPath := flag.String("input", "input.json", "the run's input")
	bin := flag.String("bin", "", "directory holding fleet-host and fleet-worker (default: this program's)")
	runs := flag.String("runs", "runs", "where run directories are created")
	timeout := flag.Duration("timeout", 5*time.Minute, "give up when the jobs have not settled by then")
	flag.Parse()
	if *bin == "" {
		exe, err := os.Executable()
		if err != nil {
			fatal(2, err)
		}
		*bin = filepath.Dir(exe)
	}
	raw, err := os.ReadFile(*inputPath)
	if err != nil {
		fatal(2, err)
	}
	in, err := input.Parse(raw)
	if err != nil {
		fatal(2, err)
	}
	if in.Mode == "model" {
		// Say what is missing before making a run directory for nothing.
		if _, err := worker.ModelFromEnv(nil); err != nil {
			fatal(2, fmt.Errorf("input.json asks for \"mode\": \"model\": %w", err))
		}
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	r := &run{bin: *bin, in: in, rawInput: raw, timeout: *timeout, out: os.Stdout, progress: logging.IsTerminal(os.Stdout),
		api: &api{http: &http.Client{Timeout: 30 * time.Second}}}
	ok, err := r.play(ctx, *runs)
	r.shutdown()
	if errors.Is(err, context.Canceled) || ctx.Err() != nil {
		fmt.Fprintf(os.Stderr, "\ninterrupted; stopped the host and every worker; run directory kept: %s\n", r.dir)
		os.Exit(130)
	}
	if err != nil {
		if r.dir != "" {
			fmt.Fprintf(os.Stderr, "run directory: %s\n", r.dir)
		}
		fatal(1, err)
	}
	if !ok {
		os.Exit(1)
	}
}

func fatal(code int, err error) {
	fmt.Fprintln(os.Stderr, "fleet-run:", err)
	os.Exit(code)
}

func newRunDir(runs string) (string, error) {
	if err := os.MkdirAll(runs, 0o755); err != nil {
		return "", err
	}
	b := make([]byte, 3)
	rand.Read(b)
	dir := filepath.Join(runs, time.Now().UTC().Format("20060102T150405Z")+"-"+hex.EncodeToString(b))
	if err := os.Mkdir(dir, 0o700); err != nil {
		return "", err
	}
	return filepath.Abs(dir)
}

func (r *run) initState(ctx context.Context) error {
	cmd := exec.CommandContext(ctx, filepath.Join(r.bin, "fleet-host"), "init",
		"--state", r.stateDir(), "--input", filepath.Join(r.dir, "input.json"))
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("fleet-host init: %v: %s", err, out)
	}
	return nil
}

func (r *run) verify(ctx context.Context) (verifyReport, bool, error) {
	var rep verifyReport
	cmd := exec.CommandContext(ctx, filepath.Join(r.bin, "fleet-host"), "verify", "--state", r.stateDir())
	out, err := cmd.Output()
	var exit *exec.ExitError
	if err != nil && !errors.As(err, &exit) {
		return rep, false, fmt.Errorf("fleet-host verify: %w", err)
	}
	if jerr := json.Unmarshal(out, &rep); jerr != nil {
		return rep, false, fmt.Errorf("fleet-host verify printed no report: %v (%v)", jerr, err)
	}
	return rep, err == nil && rep.OK, nil
}

type verifyReport struct {
	OK         bool     `json:"ok"`
	Receipts   int      `json:"receipts"`
	Events     int64    `json:"events"`
	Violations []string `json:"violations"`
}
