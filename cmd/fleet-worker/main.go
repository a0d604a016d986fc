// Command fleet-worker claims report sections from a fleet host, computes
// them and publishes them.
package main

import (
	"context"
	"flag"
	"fmt"
	"net/url"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/fleet/fleet/internal/logging"
	"github.com/fleet/fleet/internal/statedir"
	"github.com/fleet/fleet/internal/wire"
	"github.com/fleet/fleet/internal/worker"
)

func main() {
	hostURL := flag.String("host", "", "the host's URL, or several hosts sharing one database, comma-separated (failover)")
	credential := flag.String("credential", "", "the worker's credential file")
	mode := flag.String("mode", "deterministic", "deterministic or model")
	follow := flag.Bool("follow", false, "keep asking for work when the queue is empty")
	outage := flag.Duration("outage", 60*time.Second, "give up after the host is unreachable this long")
	workDelay := flag.Duration("work-delay", 0, "stretch each computation by this long")
	slots := flag.Int("slots", 1, fmt.Sprintf("jobs to run at once, claimed together (1 to %d)", wire.MaxClaimBatch))
	batchCalls := flag.Bool("batch-calls", true, "with --slots above 1, send the dispatches, heartbeats, publications and failures the running jobs make at about the same time as batch calls (--batch-calls=false: each alone)")
	flag.Parse()
	if err := run(*hostURL, *credential, *mode, *follow, *outage, *workDelay, *slots, *batchCalls); err != nil {
		fmt.Fprintln(os.Stderr, "fleet-worker:", err)
		os.Exit(1)
	}
}

func run(hostURL, credential, mode string, follow bool, outage, workDelay time.Duration, slots int, batchCalls bool) error {
	if hostURL == "" || credential == "" {
		return fmt.Errorf("--host and --credential are required")
	}
	if slots < 1 || slots > wire.MaxClaimBatch {
		return fmt.Errorf("--slots must be 1 to %d, got %d", wire.MaxClaimBatch, slots)
	}
	name := filepath.Base(credential)
	log := logging.New(os.Stderr).With("worker", name, "pid", os.Getpid())
	var model *worker.Model
	switch mode {
	case "deterministic":
	case "model":
		var err error
		if model, err = worker.ModelFromEnv(log); err != nil {
			return err
		}
		endpoint := model.BaseURL
		if u, err := url.Parse(endpoint); err == nil {
			endpoint = u.Redacted() // a URL may carry user:password
		}
		log.Info("model mode", "endpoint", endpoint, "model", model.Name, "key_set", model.Key != "")
	default:
		return fmt.Errorf("--mode must be deterministic or model, got %q", mode)
	}
	token, err := statedir.ReadCredential(credential)
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	log.Info("started", "host", hostURL)
	return worker.New(worker.Config{HostURL: hostURL, Token: token, Follow: follow, Outage: outage,
		WorkDelay: workDelay, Slots: slots, BatchCalls: batchCalls && slots > 1, Model: model, Log: log}).Run(ctx)
}
