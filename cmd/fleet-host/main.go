// Command fleet-host is the authoritative host: init, serve, credentials add
// and verify.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"runtime/pprof"
	"strings"
	"syscall"
	"time"

	"github.com/fleet/fleet/internal/host"
	"github.com/fleet/fleet/internal/httpapi"
	"github.com/fleet/fleet/internal/input"
	"github.com/fleet/fleet/internal/logging"
	"github.com/fleet/fleet/internal/statedir"
	"github.com/fleet/fleet/internal/store"
	"github.com/fleet/fleet/internal/store/backend"
	"github.com/fleet/fleet/internal/verify"
)

const usage = `usage:
  fleet-host init --state DIR --input FILE [--database postgres://…]
  fleet-host serve --state DIR [--database postgres://…] [--listen 127.0.0.1:0] [--lease 30s] [--max-requests 256] [--max-requests-per-credential 32] [--max-streams 64] [--header-timeout 10s] [--body-timeout 5s] [--worker-rate 2000] [--worker-burst 2000] [--sync FULL|NORMAL] [--console-host NAME,...]
  fleet-host credentials add|revoke|rotate --state DIR --name NAME [--database postgres://…]
  fleet-host credentials list --state DIR [--database postgres://…]
  fleet-host verify --state DIR [--database postgres://…]`

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, usage)
		os.Exit(2)
	}
	ctx := context.Background()
	var err error
	switch cmd, args := os.Args[1], os.Args[2:]; cmd {
	case "init":
		err = runInit(ctx, args)
	case "serve":
		err = runServe(ctx, args)
	case "credentials":
		if len(args) == 0 {
			fmt.Fprintln(os.Stderr, usage)
			os.Exit(2)
		}
		switch args[0] {
		case "add":
			err = runCredentialsAdd(ctx, args[1:])
		case "list", "revoke", "rotate":
			err = runCredentialsChange(ctx, args[0], args[1:], os.Stdout)
		default:
			fmt.Fprintln(os.Stderr, usage)
			os.Exit(2)
		}
	case "verify":
		var ok bool
		ok, err = runVerify(ctx, args, os.Stdout)
		if err == nil && !ok {
			os.Exit(1)
		}
	default:
		fmt.Fprintln(os.Stderr, usage)
		os.Exit(2)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "fleet-host:", err)
		os.Exit(1)
	}
}

func parse(fs *flag.FlagSet, args []string, required ...string) error {
	fs.SetOutput(os.Stderr)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("%s: unexpected argument %q", fs.Name(), fs.Arg(0))
	}
	for _, name := range required {
		if fs.Lookup(name).Value.String() == "" {
			return fmt.Errorf("%s: --%s is required", fs.Name(), name)
		}
	}
	return nil
}

func runInit(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("init", flag.ContinueOnError)
	state := fs.String("state", "", "state directory to create")
	database := fs.String("database", os.Getenv("FLEET_DATABASE"), "a postgres:// URL: keep the state in PostgreSQL, not in the state directory (default $FLEET_DATABASE)")
	inputPath := fs.String("input", "", "input.json")
	if err := parse(fs, args, "state", "input"); err != nil {
		return err
	}
	data, err := os.ReadFile(*inputPath)
	if err != nil {
		return fmt.Errorf("init: %w", err)
	}
	in, err := input.Parse(data)
	if err != nil {
		return err
	}
	if err := host.Init(ctx, *state, *database, in); err != nil {
		return err
	}
	// What was made, and what to run next.
	fmt.Printf("made the state %s: %d jobs queued, an allowance of %d credits, credentials operator and worker-1 to worker-%d in %s\n",
		*state, len(in.Sections), in.Allowance, in.Concurrency, filepath.Join(*state, "credentials"))
	dbFlag := ""
	if *database != "" {
		dbFlag = " --database …"
	}
	fmt.Printf("next: fleet-host serve --state %s%s\n", *state, dbFlag)
	fmt.Printf("then: fleet-worker --host URL --credential %s\n", filepath.Join(*state, "credentials", "worker-1"))
	return nil
}

func runCredentialsAdd(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("credentials add", flag.ContinueOnError)
	state := fs.String("state", "", "state directory")
	database := fs.String("database", os.Getenv("FLEET_DATABASE"), "a postgres:// URL: keep the state in PostgreSQL, not in the state directory (default $FLEET_DATABASE)")
	name := fs.String("name", "", "the worker's name (its identity)")
	if err := parse(fs, args, "state", "name"); err != nil {
		return err
	}
	if err := host.AddWorkerCredential(ctx, *state, *database, *name); err != nil {
		return err
	}
	file := statedir.CredentialPath(*state, *name)
	fmt.Printf("added the worker credential %s in %s (hosts serving the state take it within a second)\n", *name, file)
	fmt.Printf("next: fleet-worker --host URL --credential %s\n", file)
	return nil
}

// runCredentialsChange lists, revokes or rotates credentials on the state
// directly (as add does), printing JSON: the list, or the change with its
// receipt (a rotation's new token is also written to the credential file).
func runCredentialsChange(ctx context.Context, verb string, args []string, out io.Writer) error {
	fs := flag.NewFlagSet("credentials "+verb, flag.ContinueOnError)
	state := fs.String("state", "", "state directory")
	database := fs.String("database", os.Getenv("FLEET_DATABASE"), "a postgres:// URL: keep the state in PostgreSQL, not in the state directory (default $FLEET_DATABASE)")
	name := fs.String("name", "", "the credential's name")
	required := []string{"state", "name"}
	if verb == "list" {
		required = required[:1]
	}
	if err := parse(fs, args, required...); err != nil {
		return err
	}
	h, err := host.Open(ctx, *state, *database)
	if err != nil {
		return err
	}
	defer h.Close()
	var result any
	switch verb {
	case "list":
		list, err := h.Credentials(ctx)
		if err != nil {
			return err
		}
		result = map[string]any{"credentials": list}
	case "revoke", "rotate":
		if err := host.ValidateCredentialName(*name); err != nil {
			return err
		}
		change := h.RevokeCredential
		if verb == "rotate" {
			change = h.RotateCredential
		}
		if result, err = change(ctx, *name); err != nil {
			return fmt.Errorf("credentials %s %s: %w", verb, *name, err)
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
		"without_credential", "/healthz, /trusted-kernel.json and the console's page and sign-in: they reveal nothing secret",
		"worker_credential", "/v1/…, per-credential rate and slot limits",
		"operator_credential", "/admin/…, /metrics and the console (a session cookie after sign-in)",
		"not_safe", "plain HTTP beyond loopback or a trusted network: put a TLS-terminating proxy in front, and name the console's host with --console-host")
	if tcp, ok := addr.(*net.TCPAddr); ok && !tcp.IP.IsLoopback() {
		log.Warn("listening beyond loopback over plain HTTP: credentials cross the network in clear unless a TLS proxy is in front",
			"listen", addr.String())
	}
}

func runVerify(ctx context.Context, args []string, out io.Writer) (bool, error) {
	fs := flag.NewFlagSet("verify", flag.ContinueOnError)
	state := fs.String("state", "", "state directory")
	database := fs.String("database", os.Getenv("FLEET_DATABASE"), "a postgres:// URL: keep the state in PostgreSQL, not in the state directory (default $FLEET_DATABASE)")
	if err := parse(fs, args, "state"); err != nil {
		return false, err
	}
	rep, err := verify.State(ctx, *state, *database)
	if err != nil {
		return false, err
	}
	data, _ := json.MarshalIndent(rep, "", "  ")
	fmt.Fprintln(out, string(data))
	return rep.OK, nil
}

func runServe(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	state := fs.String("state", "", "state directory")
	database := fs.String("database", os.Getenv("FLEET_DATABASE"), "a postgres:// URL: keep the state in PostgreSQL, not in the state directory (default $FLEET_DATABASE)")
	listen := fs.String("listen", "127.0.0.1:0", "address to listen on")
	lease := fs.Duration("lease", 0, "claim lease and renewal (default: the state's, 30s)")
	maxInFlight := fs.Int("max-requests", httpapi.DefaultMaxInFlight, "authenticated requests served at once; more get 503")
	perCredential := fs.Int("max-requests-per-credential", httpapi.DefaultPerCredential, "of those, at most this many for one credential")
	maxStreams := fs.Int("max-streams", httpapi.DefaultStreams, "event streams open at once, apart from the request slots; past it a new one closes the oldest")
	bodyTimeout := fs.Duration("body-timeout", httpapi.DefaultBodyTimeout, "time a client has from its headers to its body's last byte")
	workerRate := fs.Float64("worker-rate", httpapi.DefaultWorkerRate, "requests a second each worker credential may make (0: no limit); more get 429")
	workerBurst := fs.Int("worker-burst", httpapi.DefaultWorkerBurst, "requests a worker credential may make at once above its rate")
	headerTimeout := fs.Duration("header-timeout", 10*time.Second, "time a client has to send its request headers")
	sync := fs.String("sync", "FULL", "SQLite synchronous: FULL (every commit survives power loss) or NORMAL")
	cpuProfile := fs.String("cpuprofile", "", "write a CPU profile to this file until shutdown")
	consoleHosts := fs.String("console-host", "", "comma-separated host names the web console answers to, besides IP addresses and localhost")
	hostID := fs.String("host-id", "", "this host's identity among the hosts serving the state (default: the state directory's host-id file); hosts sharing a state directory need one each")
	liveness := fs.Duration("host-liveness", host.DefaultHostLiveness, "how long a host may go unseen before the other hosts take it for gone")
	if err := parse(fs, args, "state"); err != nil {
		return err
	}
	log := logging.New(os.Stderr)
	if *cpuProfile != "" {
		f, err := os.Create(*cpuProfile)
		if err != nil {
			return fmt.Errorf("serve: %w", err)
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			return fmt.Errorf("serve: %w", err)
		}
		defer pprof.StopCPUProfile()
	}
	h, err := host.Open(ctx, *state, *database, backend.Options{Synchronous: *sync})
	if err != nil {
		return err
	}
	defer h.Close()
	h.Log = log
	if *lease > 0 {
		h.Lease = *lease
	}
	if *maxInFlight < 1 || *perCredential < 1 || *maxStreams < 1 || *headerTimeout <= 0 || *bodyTimeout <= 0 || *liveness <= 0 || *workerBurst < 1 {
		return fmt.Errorf("serve: --max-requests, --max-requests-per-credential, --max-streams, --header-timeout, --body-timeout, --worker-burst and --host-liveness must be positive")
	}
	if *workerRate < 0 {
		return fmt.Errorf("serve: --worker-rate must be 0 (no limit) or positive, got %g", *workerRate)
	}
	h.ID, h.Liveness = *hostID, *liveness
	ln, err := net.Listen("tcp", *listen)
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
	limits := httpapi.DefaultLimits()
	limits.MaxInFlight, limits.PerCredential, limits.BodyTimeout = *maxInFlight, *perCredential, *bodyTimeout
	limits.WorkerRate, limits.WorkerBurst = *workerRate, *workerBurst
	limits.Streams = *maxStreams
	api := httpapi.New(h, log, limits)
	api.AllowHosts(strings.Split(*consoleHosts, ","))
	srv := &http.Server{
		Handler:           api.Handler(),
		ReadHeaderTimeout: *headerTimeout,
		ReadTimeout:       30 * time.Second,
		IdleTimeout:       120 * time.Second,
		MaxHeaderBytes:    64 << 10,
		BaseContext:       func(net.Listener) context.Context { return baseCtx },
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
	sweep := min(h.Lease/4, time.Second)
	go h.RunLeaseSweeper(baseCtx, sweep, func(err error) { log.Error("lease sweep", "err", err) })
	go h.RunSampler(baseCtx, func(err error) { log.Warn("series sample", "err", err) })
	takenOver := make(chan error, 1)
	go func() {
		if err := h.RunBeat(baseCtx, func(err error) { log.Error("host liveness", "err", err) }); err != nil {
			takenOver <- err
		}
	}()
	if store.IsURL(*database) {
		go h.WatchOtherHosts(baseCtx, 250*time.Millisecond)
	}

	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	ready, _ := json.Marshal(map[string]any{"url": url, "console": url + "/", "pid": os.Getpid(), "kernel_key": h.KernelKey(), "host": h.ID})
	fmt.Println(string(ready))
	log.Info("serving", "url", url, "host", h.ID, "state", *state, "lease", h.Lease.String(),
		"console", url+"/", "sign_in_with", filepath.Join(*state, "credentials", host.OperatorName))
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
	// Stop accepting, end long-lived streams, and let in-flight transactions
	// finish (they do not inherit request cancellation).
	cancelBase()
	shutdownCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := srv.Shutdown(shutdownCtx); err != nil && !errors.Is(err, http.ErrServerClosed) {
		log.Error("shutdown", "err", err)
	}
	if err := h.Stop(ctx); err != nil {
		return fmt.Errorf("serve: record shutdown: %w", err)
	}
	log.Info("stopped")
	return nil
}
