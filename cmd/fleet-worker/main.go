// Command fleet-worker claims report sections from a fleet host, computes
// them and publishes them.
package main

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/fleet/fleet/internal/cli"
	"github.com/fleet/fleet/internal/client"
	"github.com/fleet/fleet/internal/logging"
	"github.com/fleet/fleet/internal/statedir"
	"github.com/fleet/fleet/internal/tracing"
	"github.com/fleet/fleet/internal/wire"
	"github.com/fleet/fleet/internal/worker"
)

func main() {
	if err := newRoot().ExecuteContext(context.Background()); err != nil {
		fmt.Fprintln(os.Stderr, "fleet-worker:", err)
		if cli.IsUsage(err) {
			os.Exit(2)
		}
		os.Exit(1)
	}
}

// newRoot is fleet-worker: one command, run until the queue is empty (or
// interrupted, with --follow).
func newRoot() *cobra.Command {
	var o options
	cmd := &cobra.Command{
		Use:   "fleet-worker --host URL --credential FILE",
		Short: "Claim report sections from a Fleet host, compute them and publish them",
		Long: `fleet-worker claims jobs with its credential, writes each section
(deterministically, or with a language model: --mode model and the
FLEET_MODEL_* variables, README), and publishes it fenced by its claim. It
stops when the queue is empty, or with --follow when interrupted. Every
flag marked "(or FLEET_…)" may come from that environment variable instead
(docs/configuration.md). On SIGTERM or SIGINT it claims no more, lets the
jobs it holds finish for --drain, hands back those still unfinished
(queued again at once, their reservations given back) and exits 0. Exit
codes: 0 done, 1 failed, 2 a usage mistake.`,
		Example: `  fleet-worker --host http://127.0.0.1:8080 --credential /tmp/fleet/credentials/worker-1
  fleet-worker --host http://10.0.0.1:8080,http://10.0.0.2:8080 --credential worker-1 --slots 8 --follow
  FLEET_HOST=http://127.0.0.1:8080 FLEET_CREDENTIAL=/tmp/fleet/credentials/worker-2 fleet-worker --mode model`,
		Args: cli.Args(0, "no arguments"),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := cli.Require(cmd, "host", "credential"); err != nil {
				return err
			}
			for _, host := range strings.Split(o.hostURL, ",") {
				if err := cli.CheckHostURL(host); err != nil {
					return cli.Usage(err)
				}
			}
			if o.slots < 1 || o.slots > wire.MaxClaimBatch {
				return cli.Usagef("--slots must be 1 to %d, got %d", wire.MaxClaimBatch, o.slots)
			}
			if o.mode != "deterministic" && o.mode != "model" {
				return cli.Usagef("--mode must be deterministic or model, got %q", o.mode)
			}
			if o.drain < 0 {
				return cli.Usagef("--drain must be 0 (a third of the lease) or positive, got %s", o.drain)
			}
			if o.outage <= 0 {
				return cli.Usagef("--outage must be positive, got %s", o.outage)
			}
			if o.workDelay < 0 {
				return cli.Usagef("--work-delay must be 0 (none) or positive, got %s", o.workDelay)
			}
			return run(o)
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.hostURL, "host", "", "the host's URL, or several hosts sharing one database, comma-separated (failover)")
	f.StringVar(&o.credential, "credential", "", "the worker's credential file")
	f.StringVar(&o.mode, "mode", "deterministic", "deterministic or model")
	f.BoolVar(&o.follow, "follow", false, "keep asking for work when the queue is empty")
	f.DurationVar(&o.outage, "outage", 60*time.Second, "give up after the host is unreachable this long")
	f.DurationVar(&o.workDelay, "work-delay", 0, "stretch each computation by this long")
	f.DurationVar(&o.drain, "drain", 0, "on SIGTERM or SIGINT, how long the jobs held may go on before the unfinished are handed back (0: a third of the lease, 10s with the default lease)")
	f.IntVar(&o.slots, "slots", 1, fmt.Sprintf("jobs to run at once, claimed together (1 to %d)", wire.MaxClaimBatch))
	f.BoolVar(&o.batchCalls, "batch-calls", true, "with --slots above 1, send the dispatches, heartbeats, publications and failures the running jobs make at about the same time as batch calls (--batch-calls=false: each alone)")
	f.BoolVar(&o.separateDispatch, "separate-dispatch", false, "dispatch each claimed job in a call of its own, rather than having the claim admit its jobs (a job in two calls: claim-and-admit, then publish)")
	cli.CAFile(f, &o.caFile)
	cli.Env(f, "host", "credential", "mode", "follow", "outage", "work-delay", "drain", "slots", "batch-calls", "separate-dispatch", "ca-file")
	cli.EnvOnly(cmd, "OPENROUTER_API_KEY", "", "--mode model: the API key (or OPENAI_API_KEY); kept out of flags, so out of process lists")
	cli.EnvOnly(cmd, "OPENAI_API_KEY", "", "--mode model: the API key when OPENROUTER_API_KEY is not set")
	cli.EnvOnly(cmd, "FLEET_MODEL", worker.DefaultModel, "--mode model: the model's name")
	cli.EnvOnly(cmd, "FLEET_MODEL_URL", worker.DefaultModelURL, "--mode model: the OpenAI-compatible API's base URL (a local server, e.g. Ollama's http://127.0.0.1:11434/v1, needs no key)")
	cli.EnvOnly(cmd, "FLEET_MODEL_TIMEOUT", worker.DefaultModelTimeout.String(), "--mode model: how long one model call may take")
	cli.EnvTracing(cmd, "fleet-worker")
	cli.Setup(cmd)
	return cmd
}

// options are fleet-worker's flags.
type options struct {
	hostURL, credential, mode, caFile    string
	follow, batchCalls, separateDispatch bool
	outage, workDelay, drain             time.Duration
	slots                                int
}

func run(o options) error {
	name := filepath.Base(o.credential)
	log := logging.New(os.Stderr).With("worker", name, "pid", os.Getpid())
	var model *worker.Model
	switch o.mode {
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
		return fmt.Errorf("--mode must be deterministic or model, got %q", o.mode)
	}
	token, err := statedir.ReadCredential(o.credential)
	if err != nil {
		return err
	}
	transport, err := client.Transport(o.caFile)
	if err != nil {
		return cli.Usage(err)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	stopTracing, err := tracing.Setup(ctx, "fleet-worker")
	if err != nil {
		return err
	}
	defer func() {
		flush, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := stopTracing(flush); err != nil {
			log.Warn("tracing: flushing spans", "err", err)
		}
	}()
	log.Info("started", "host", o.hostURL)
	return worker.New(worker.Config{HostURL: o.hostURL, Token: token, Follow: o.follow, Outage: o.outage, Transport: transport,
		WorkDelay: o.workDelay, Drain: o.drain, Slots: o.slots, BatchCalls: o.batchCalls && o.slots > 1, SeparateDispatch: o.separateDispatch,
		Model: model, Log: log}).Run(ctx)
}
