// Command fleet-host is the authoritative host: init, serve, credentials add
// and verify.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"runtime/debug"
	"runtime/pprof"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/fleet/fleet/internal/cli"
	"github.com/fleet/fleet/internal/crash"
	"github.com/fleet/fleet/internal/host"
	"github.com/fleet/fleet/internal/host/access"
	"github.com/fleet/fleet/internal/host/registry"
	"github.com/fleet/fleet/internal/host/tenants"
	"github.com/fleet/fleet/internal/httpapi"
	"github.com/fleet/fleet/internal/input"
	"github.com/fleet/fleet/internal/logging"
	"github.com/fleet/fleet/internal/statedir"
	"github.com/fleet/fleet/internal/store"
	"github.com/fleet/fleet/internal/store/backend"
	"github.com/fleet/fleet/internal/tracing"
	"github.com/fleet/fleet/internal/verify"
)

func main() {
	err := newRoot(os.Stdout).ExecuteContext(context.Background())
	if err == nil {
		return
	}
	var failed verifyFailed
	if !errors.As(err, &failed) {
		fmt.Fprintln(os.Stderr, "fleet-host:", err)
	}
	if cli.IsUsage(err) {
		os.Exit(2)
	}
	os.Exit(1)
}

// verifyFailed is a verification that found a problem (its report is
// printed): exit 1 without another message.
type verifyFailed struct{ error }

// newRoot is fleet-host's command tree, printing to out.
func newRoot(out io.Writer) *cobra.Command {
	root := &cobra.Command{
		Use:   "fleet-host",
		Short: "The authoritative host: its state, its HTTP API and console, its credentials",
		Long: `fleet-host creates a state (init), serves it (serve), manages its
credentials offline (credentials) and checks it whole (verify). Every flag
marked "(or FLEET_…)" may come from that environment variable instead;
docs/configuration.md lists them all. Exit codes: 0 done, 1 failed (or a
verification found a problem), 2 a usage mistake.`,
		Example: `  fleet-host init --state /tmp/fleet --input input.json
  fleet-host serve --state /tmp/fleet --listen 127.0.0.1:8080
  FLEET_DATABASE=postgres://fleet@db/fleet fleet-host serve --state /tmp/fleet`,
	}
	root.AddCommand(initCommand(), serveCommand(out), credentialsCommand(out), verifyCommand(out), backupCommand(out), restoreCommand(out))
	cli.Setup(root)
	return root
}

// stateFlags adds --state and --database, which every command takes.
func stateFlags(cmd *cobra.Command, state, database *string, stateUsage string) {
	cmd.Flags().StringVar(state, "state", "", stateUsage)
	cmd.Flags().StringVar(database, "database", "", "a postgres:// URL: keep the state in PostgreSQL, not in the state directory")
	cli.Env(cmd.Flags(), "state", "database")
}

func initCommand() *cobra.Command {
	var state, database, inputPath string
	cmd := &cobra.Command{
		Use:   "init --state DIR --input FILE",
		Short: "Create a state from an input.json: the kernel key, credentials, allowance and first jobs",
		Example: `  fleet-host init --state /tmp/fleet --input input.json
  fleet-host init --state /tmp/fleet --input input.json --database postgres://fleet@127.0.0.1/fleet`,
		Args: cli.Args(0, "no arguments"),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := cli.Require(cmd, "state", "input"); err != nil {
				return err
			}
			return runInit(cmd.Context(), state, database, inputPath)
		},
	}
	stateFlags(cmd, &state, &database, "state directory to create")
	cmd.Flags().StringVar(&inputPath, "input", "", "input.json: the document, sections, allowance and worker count")
	return cmd
}

func runInit(ctx context.Context, state, database, inputPath string) error {
	data, err := os.ReadFile(inputPath)
	if err != nil {
		return fmt.Errorf("init: %w", err)
	}
	in, err := input.Parse(data)
	if err != nil {
		return err
	}
	location, err := backend.StateLocation(state, database)
	if err != nil {
		return fmt.Errorf("init: %w", err)
	}
	create := func(ctx context.Context) (*store.DB, error) { return backend.Create(ctx, location) }
	if err := host.Init(ctx, state, create, in); err != nil {
		return err
	}
	// What was made, and what to run next.
	fmt.Printf("made the state %s: %d jobs queued, an allowance of %d credits, credentials operator and worker-1 to worker-%d in %s\n",
		state, len(in.Sections), in.Allowance, in.Concurrency, filepath.Join(state, "credentials"))
	dbFlag := ""
	if database != "" {
		dbFlag = " --database …"
	}
	fmt.Printf("next: fleet-host serve --state %s%s\n", state, dbFlag)
	fmt.Printf("then: fleet-worker --host URL --credential %s\n", filepath.Join(state, "credentials", "worker-1"))
	return nil
}

// openHost opens the state's database on the backend its location names
// (this command's choice: the host links no driver) and serves it.
func openHost(ctx context.Context, state, database string, opts backend.Options, ho host.Options) (*host.Host, error) {
	db, err := backend.OpenState(ctx, state, database, opts)
	if err != nil {
		return nil, err
	}
	if clock := crash.Clock(); clock != nil {
		db.Now = clock // a crash-point build's test, running past a period's end
	}
	return host.Open(ctx, state, db, ho)
}

func credentialsCommand(out io.Writer) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "credentials",
		Short: "Add, list, revoke or rotate credentials on the state directly, serving or not",
		Example: `  fleet-host credentials add --state /tmp/fleet --name worker-9
  fleet-host credentials list --state /tmp/fleet`,
	}
	for _, verb := range []struct{ name, short, example string }{
		{"add", "Add a worker credential; its token is written to credentials/NAME", "fleet-host credentials add --state /tmp/fleet --name worker-9   # grow the fleet, even while serving"},
		{"list", "List the credentials (JSON), revoked ones included", "fleet-host credentials list --state /tmp/fleet"},
		{"revoke", "Revoke a worker credential: refused by every host within a second", "fleet-host credentials revoke --state /tmp/fleet --name worker-9"},
		{"rotate", "Give a credential a new token, printed and written to its file", "fleet-host credentials rotate --state /tmp/fleet --name worker-1"},
	} {
		var state, database, name string
		sub := &cobra.Command{
			Use:     verb.name + " --state DIR" + map[bool]string{true: "", false: " --name NAME"}[verb.name == "list"],
			Short:   verb.short,
			Example: "  " + verb.example,
			Args:    cli.Args(0, "no arguments"),
			RunE: func(cmd *cobra.Command, _ []string) error {
				required := []string{"state", "name"}
				if verb.name == "list" {
					required = required[:1]
				}
				if err := cli.Require(cmd, required...); err != nil {
					return err
				}
				if verb.name == "add" {
					return runCredentialsAdd(cmd.Context(), state, database, name, out)
				}
				return runCredentialsChange(cmd.Context(), verb.name, state, database, name, out)
			},
		}
		stateFlags(sub, &state, &database, "state directory")
		if verb.name != "list" {
			sub.Flags().StringVar(&name, "name", "", "the credential's name")
		}
		cmd.AddCommand(sub)
	}
	return cmd
}

func runCredentialsAdd(ctx context.Context, state, database, name string, out io.Writer) error {
	db, err := backend.OpenState(ctx, state, database, backend.Options{})
	if err != nil {
		return err
	}
	defer db.Close()
	if err := access.AddWorker(ctx, state, db, name); err != nil {
		return err
	}
	file := statedir.CredentialPath(state, name)
	fmt.Fprintf(out, "added the worker credential %s in %s (hosts serving the state take it within a second)\n", name, file)
	fmt.Fprintf(out, "next: fleet-worker --host URL --credential %s\n", file)
	return nil
}

// runCredentialsChange lists, revokes or rotates credentials on the state
// directly (as add does), printing JSON: the list, or the change with its
// receipt (a rotation's new token is also written to the credential file).
func runCredentialsChange(ctx context.Context, verb, state, database, name string, out io.Writer) error {
	h, err := openHost(ctx, state, database, backend.Options{}, host.Options{})
	if err != nil {
		return err
	}
	defer h.Close()
	var result any
	switch verb {
	case "list":
		list, err := h.Access().List(ctx)
		if err != nil {
			return err
		}
		result = map[string]any{"credentials": list}
	case "revoke", "rotate":
		if err := access.ValidateName(name); err != nil {
			return err
		}
		change := h.Access().Revoke
		if verb == "rotate" {
			change = h.Access().Rotate
		}
		if result, err = change(ctx, name); err != nil {
			return fmt.Errorf("credentials %s %s: %w", verb, name, err)
		}
	}
	enc := json.NewEncoder(out)
	enc.SetIndent("", "  ")
	return enc.Encode(result)
}

// logExposure says what this listener exposes and what is safe: every
// route but three needs a credential, and none is safe over plain HTTP
// beyond a trusted network, since bearer credentials and the console's
// cookie would cross it in clear.
func logExposure(log *slog.Logger, addr net.Addr) {
	log.Info("exposure",
		"without_credential", "/healthz, /trusted-kernel.json, /favicon.ico and the console's page and sign-in: they reveal nothing secret",
		"worker_credential", "/v1/…, per-credential rate and slot limits",
		"operator_credential", "/admin/…, /metrics and the console (a session cookie after sign-in)",
		"not_safe", "plain HTTP beyond loopback or a trusted network: put a TLS-terminating proxy in front, and name the console's host with --console-host")
	if tcp, ok := addr.(*net.TCPAddr); ok && !tcp.IP.IsLoopback() {
		log.Warn("listening beyond loopback over plain HTTP: credentials cross the network in clear unless a TLS proxy is in front",
			"listen", addr.String())
	}
}

func verifyCommand(out io.Writer) *cobra.Command {
	var state, database string
	cmd := &cobra.Command{
		Use:     "verify --state DIR",
		Short:   "Check a state whole: the receipt chain, the accounting, every job against its receipts (JSON report; exit 1 on a problem)",
		Example: `  fleet-host verify --state /tmp/fleet | jq .ok`,
		Args:    cli.Args(0, "no arguments"),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := cli.Require(cmd, "state"); err != nil {
				return err
			}
			location, err := backend.ExistingStateLocation(state, database)
			if err != nil {
				return err
			}
			db, err := backend.OpenReadOnly(cmd.Context(), location)
			if err != nil {
				return err
			}
			defer db.Close()
			rep, err := verify.State(cmd.Context(), state, db)
			if err != nil {
				return err
			}
			data, _ := json.MarshalIndent(rep, "", "  ")
			fmt.Fprintln(out, string(data))
			if !rep.OK {
				return verifyFailed{errors.New("the state did not verify")}
			}
			return nil
		},
	}
	stateFlags(cmd, &state, &database, "state directory")
	return cmd
}

// serveOptions are serve's flags.
type serveOptions struct {
	state, database, listen, sync, cpuProfile, consoleHosts, hostID string
	lease, bodyTimeout, headerTimeout, liveness                     time.Duration
	maxInFlight, perCredential, maxStreams, workerBurst, bodyMemory int
	maxTenants                                                      int
	workerRate                                                      float64
}

func serveCommand(out io.Writer) *cobra.Command {
	var o serveOptions
	cmd := &cobra.Command{
		Use:   "serve --state DIR [--listen ADDR]",
		Short: "Serve a state: the worker and operator API, the console, the lease sweeper; prints a JSON line with its URL once ready",
		Long: `serve runs until SIGTERM or SIGINT, then stops accepting, lets the
transactions in flight finish and records its shutdown. Its first line on
standard output is JSON: {"url","console","pid","kernel_key","host"}.
--listen 127.0.0.1:0 takes a free port each start; give a fixed one
(127.0.0.1:8080) to keep the URL across restarts.`,
		Example: `  fleet-host serve --state /tmp/fleet --listen 127.0.0.1:8080
  fleet-host serve --state /tmp/fleet --database postgres://fleet@db/fleet --host-id host-a --listen :8080 --console-host fleet.example.com
  FLEET_LEASE=10s FLEET_WORKER_RATE=500 fleet-host serve --state /tmp/fleet`,
		Args: cli.Args(0, "no arguments"),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := cli.Require(cmd, "state"); err != nil {
				return err
			}
			return runServe(cmd.Context(), o, out)
		},
	}
	f := cmd.Flags()
	stateFlags(cmd, &o.state, &o.database, "state directory")
	f.StringVar(&o.listen, "listen", "127.0.0.1:0", "address to listen on (port 0: a free one each start)")
	f.DurationVar(&o.lease, "lease", 0, "claim lease and renewal (default: the state's, 30s)")
	f.IntVar(&o.maxInFlight, "max-requests", httpapi.DefaultMaxInFlight, "authenticated requests served at once; more get 503")
	f.IntVar(&o.perCredential, "max-requests-per-credential", httpapi.DefaultPerCredential, "of those, at most this many for one credential")
	f.IntVar(&o.maxStreams, "max-streams", httpapi.DefaultStreams, "event streams open at once, apart from the request slots; past it a new one closes the oldest")
	f.DurationVar(&o.bodyTimeout, "body-timeout", httpapi.DefaultBodyTimeout, "time a client has from its headers to its body's last byte")
	f.Float64Var(&o.workerRate, "worker-rate", httpapi.DefaultWorkerRate, "requests a second each worker credential may make (0: no limit); more get 429")
	f.IntVar(&o.bodyMemory, "body-memory", httpapi.DefaultBodyMemory>>20, fmt.Sprintf("MiB that the bodies of the requests being served may make the host hold, in all (each is charged %d times its size); past it a request waits a second, then 503", httpapi.BodyMemoryFactor))
	f.IntVar(&o.workerBurst, "worker-burst", httpapi.DefaultWorkerBurst, "requests a worker credential may make at once above its rate")
	f.DurationVar(&o.headerTimeout, "header-timeout", 10*time.Second, "time a client has to send its request headers")
	f.StringVar(&o.sync, "sync", "FULL", "SQLite synchronous: FULL (every commit survives power loss) or NORMAL")
	f.StringVar(&o.cpuProfile, "cpuprofile", "", "write a CPU profile to this file until shutdown")
	f.StringVar(&o.consoleHosts, "console-host", "", "comma-separated host names the web console answers to, besides IP addresses and localhost")
	f.StringVar(&o.hostID, "host-id", "", "this host's identity among the hosts serving the state (default: the state directory's host-id file); hosts sharing a state directory need one each")
	f.DurationVar(&o.liveness, "host-liveness", registry.DefaultHostLiveness, "how long a host may go unseen before the other hosts take it for gone")
	f.IntVar(&o.maxTenants, "max-tenants", tenants.DefaultMaxTenants, "the most tenants the fleet may have (each is a label of the per-tenant metrics); adding one past it is refused")
	cli.EnvTracing(cmd, "fleet-host")
	cli.EnvOnly(cmd, "GOGC", fmt.Sprint(gcPercent), "the Go garbage collector's target heap growth in percent (Go's own variable); the host sets "+fmt.Sprint(gcPercent)+" when it is unset")
	cli.Env(f, "listen", "lease", "max-requests", "max-requests-per-credential", "max-streams", "body-timeout", "worker-rate",
		"worker-burst", "body-memory", "header-timeout", "sync", "console-host", "host-id", "host-liveness", "max-tenants")
	return cmd
}

func runServe(ctx context.Context, o serveOptions, out io.Writer) error {
	log := logging.New(os.Stderr)
	if err := o.check(); err != nil {
		return err
	}
	stopTracing, err := tracing.Setup(ctx, "fleet-host")
	if err != nil {
		return fmt.Errorf("serve: %w", err)
	}
	defer func() {
		flush, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := stopTracing(flush); err != nil {
			log.Warn("tracing: flushing spans", "err", err)
		}
	}()
	collectLessOften()
	if o.cpuProfile != "" {
		stop, err := startCPUProfile(o.cpuProfile)
		if err != nil {
			return fmt.Errorf("serve: %w", err)
		}
		defer stop()
	}
	h, err := openHost(ctx, o.state, o.database, backend.Options{Synchronous: o.sync},
		host.Options{Lease: o.lease, ID: o.hostID, Liveness: o.liveness, MaxTenants: o.maxTenants})
	if err != nil {
		return err
	}
	defer h.Close()
	h.SetLog(log)
	ln, err := net.Listen("tcp", o.listen)
	if err != nil {
		return fmt.Errorf("serve: %w", err)
	}
	url := "http://" + ln.Addr().String()
	if err := h.Start(ctx, url); err != nil {
		ln.Close()
		return fmt.Errorf("serve: restart recovery: %w", err)
	}

	baseCtx, cancelBase := context.WithCancel(ctx)
	defer cancelBase()
	srv := newServer(baseCtx, h, o, log)
	takenOver := runBackground(baseCtx, h, o, log)
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	ready, _ := json.Marshal(map[string]any{"url": url, "console": url + "/", "pid": os.Getpid(), "kernel_key": h.KernelKey(), "host": h.ID})
	fmt.Fprintln(out, string(ready))
	if tracing.Enabled() {
		log.Info("tracing: spans go to the OTLP endpoint the OTEL_* variables name")
	}
	log.Info("serving", "url", url, "host", h.ID, "state", o.state, "lease", h.Lease.String(),
		"console", url+"/", "sign_in_with", filepath.Join(o.state, "credentials", host.OperatorName))
	logExposure(log, ln.Addr())

	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	select {
	case err := <-served:
		return fmt.Errorf("serve: %w", err)
	case err := <-takenOver:
		// Another process serves under this identity now; this one stops
		// without recording a shutdown, which is the other's to record.
		cancelBase()
		srv.Close()
		return fmt.Errorf("serve: host %s: %w", h.ID, err)
	case sig := <-stop:
		log.Info("stopping", "signal", sig.String())
	}
	cancelBase()
	return stopServing(ctx, srv, h, log)
}

// check refuses limits that would leave the host unable to serve, naming
// the flag: a usage mistake (exit 2).
func (o serveOptions) check() error {
	for _, n := range []struct {
		flag  string
		value int
	}{{"max-requests", o.maxInFlight}, {"max-requests-per-credential", o.perCredential}, {"max-streams", o.maxStreams},
		{"worker-burst", o.workerBurst}, {"max-tenants", o.maxTenants}} {
		if n.value < 1 {
			return cli.Usagef("serve: --%s must be at least 1, got %d", n.flag, n.value)
		}
	}
	for _, d := range []struct {
		flag  string
		value time.Duration
	}{{"header-timeout", o.headerTimeout}, {"body-timeout", o.bodyTimeout}, {"host-liveness", o.liveness}} {
		if d.value <= 0 {
			return cli.Usagef("serve: --%s must be positive, got %s", d.flag, d.value)
		}
	}
	if _, _, err := net.SplitHostPort(o.listen); err != nil {
		return cli.Usagef("serve: --listen %q is not HOST:PORT (%v)", o.listen, err)
	}
	if o.lease < 0 { // a negative lease panics the lease sweeper's ticker, taking the host down
		return cli.Usagef("serve: --lease must be positive (or 0, the state's), got %s", o.lease)
	}
	if least := httpapi.MinBodyMemory >> 20; o.bodyMemory < least {
		return cli.Usagef("serve: --body-memory must be at least %d (MiB), room for one batch call at its largest, got %d", least, o.bodyMemory)
	}
	if o.workerRate < 0 {
		return cli.Usagef("serve: --worker-rate must be 0 (no limit) or positive, got %g", o.workerRate)
	}
	return nil
}

// gcPercent is the heap growth at which a serving host collects when the
// environment does not say (GOGC). Its live heap is tens of MiB and most
// of what it allocates is one request's garbage, so collecting at twice
// Go's default growth costs 5-16 MiB more and saves 2-19 % of its CPU
// a job (BENCHMARKS.md); what the request bodies may hold stays bounded by
// --body-memory (TestBodyMemoryBounded).
const gcPercent = 200

// collectLessOften sets the collector's target to gcPercent unless GOGC
// is set.
func collectLessOften() {
	if _, set := os.LookupEnv("GOGC"); !set {
		debug.SetGCPercent(gcPercent)
	}
}

// startCPUProfile profiles the host into path until stop.
func startCPUProfile(path string) (stop func(), err error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, err
	}
	return func() { pprof.StopCPUProfile(); f.Close() }, nil
}

// newServer is the HTTP server of the API and console under o's limits;
// its requests' contexts end with baseCtx.
func newServer(baseCtx context.Context, h *host.Host, o serveOptions, log *slog.Logger) *http.Server {
	limits := httpapi.DefaultLimits()
	limits.MaxInFlight, limits.PerCredential, limits.BodyTimeout = o.maxInFlight, o.perCredential, o.bodyTimeout
	limits.WorkerRate, limits.WorkerBurst = o.workerRate, o.workerBurst
	limits.Streams = o.maxStreams
	limits.BodyMemory = int64(o.bodyMemory) << 20
	api := httpapi.New(h, log, limits)
	api.AllowHosts(strings.Split(o.consoleHosts, ","))
	return &http.Server{
		Handler:           tracing.Handler(api.Handler(), "fleet-host"),
		ReadHeaderTimeout: o.headerTimeout,
		ReadTimeout:       30 * time.Second,
		IdleTimeout:       120 * time.Second,
		MaxHeaderBytes:    64 << 10,
		BaseContext:       func(net.Listener) context.Context { return baseCtx },
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
}

// runBackground starts what the host does between requests until ctx
// ends: the lease sweeper, the charts' sampler, the schedules' firing
// every second, its liveness beat and, on
// PostgreSQL, the watch on the other hosts. The channel answers when
// another process has taken this host's identity.
func runBackground(ctx context.Context, h *host.Host, o serveOptions, log *slog.Logger) <-chan error {
	sweep := min(h.Lease/4, time.Second)
	go h.Claims().RunLeaseSweeper(ctx, sweep, func(err error) { log.Error("lease sweep", "err", err) })
	go h.RunSampler(ctx, func(err error) { log.Warn("series sample", "err", err) })
	go h.Schedules().Run(ctx, time.Second, func(err error) { log.Error("schedules", "err", err) })
	takenOver := make(chan error, 1)
	go func() {
		if err := h.RunBeat(ctx, func(err error) { log.Error("host liveness", "err", err) }); err != nil {
			takenOver <- err
		}
	}()
	if store.IsURL(o.database) {
		go h.WatchOtherHosts(ctx, 250*time.Millisecond)
	}
	return takenOver
}

// stopServing stops accepting, lets in-flight transactions finish (they
// do not inherit request cancellation; long-lived streams ended with the
// base context), records the shutdown and keeps the charts' hour.
func stopServing(ctx context.Context, srv *http.Server, h *host.Host, log *slog.Logger) error {
	shutdownCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := srv.Shutdown(shutdownCtx); err != nil && !errors.Is(err, http.ErrServerClosed) {
		log.Error("shutdown", "err", err)
	}
	if err := h.Stop(ctx); err != nil {
		return fmt.Errorf("serve: record shutdown: %w", err)
	}
	if err := h.SaveSeries(); err != nil {
		log.Warn("the charts' hour was not kept for the next start", "err", err)
	}
	log.Info("stopped")
	return nil
}
