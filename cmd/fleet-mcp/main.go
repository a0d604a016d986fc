// Command fleet-mcp makes an MCP-capable agent a Fleet worker: an MCP
// server (stdio, or streamable HTTP on loopback) whose tools claim, admit,
// read, publish and fail jobs with one worker credential the agent never
// sees.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/spf13/cobra"

	"github.com/fleet/fleet/internal/cli"
	"github.com/fleet/fleet/internal/client"
	"github.com/fleet/fleet/internal/logging"
	"github.com/fleet/fleet/internal/mcpworker"
	"github.com/fleet/fleet/internal/statedir"
)

func main() {
	if err := newRoot().ExecuteContext(context.Background()); err != nil {
		fmt.Fprintln(os.Stderr, "fleet-mcp:", err)
		if cli.IsUsage(err) {
			os.Exit(2)
		}
		os.Exit(1)
	}
}

// credentialFileVar is the name MCP client configurations are given in the
// README; FLEET_CREDENTIAL (the flag's own variable) wins when both are set.
const credentialFileVar = "FLEET_CREDENTIAL_FILE"

type options struct {
	host, credential, listen, caFile string
	outage, ceiling                  time.Duration
	separateDispatch                 bool
}

func newRoot() *cobra.Command {
	var o options
	cmd := &cobra.Command{
		Use:   "fleet-mcp --host URL --credential FILE",
		Short: "Serve a Fleet worker's calls as MCP tools, so an MCP-capable agent works as a fenced, budgeted worker",
		Long: `fleet-mcp is an MCP server for one Fleet worker. An MCP client (an agent)
launches it and calls its tools: take_job, begin_work, read_document,
publish_section, report_failure and status; the prompt fleet_worker
describes the loop. fleet-mcp holds the worker credential (never shown to
the agent), renews the held job's lease in the background up to
--heartbeat-ceiling, and builds each publication's body bound to its job
under an operation key it keeps, so a lost answer is recovered and never
published twice. It speaks MCP over stdin and stdout, or with --listen over
streamable HTTP at /mcp on a loopback address (it prints a JSON line with
the URL once ready). The state must be in model mode. Every flag marked
"(or FLEET_…)" may come from that environment variable instead
(docs/configuration.md). Exit codes: 0 done, 1 failed, 2 a usage mistake.`,
		Example: `  fleet-mcp --host http://127.0.0.1:8080 --credential /tmp/fleet/credentials/worker-1
  FLEET_HOST=http://127.0.0.1:8080 FLEET_CREDENTIAL_FILE=/tmp/fleet/credentials/worker-1 fleet-mcp
  fleet-mcp --host http://127.0.0.1:8080 --credential worker-1 --listen 127.0.0.1:8765`,
		Args: cli.Args(0, "no arguments"),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if o.credential == "" {
				o.credential = os.Getenv(credentialFileVar)
			}
			if err := cli.Require(cmd, "host", "credential"); err != nil {
				return err
			}
			if err := cli.CheckHostURL(o.host); err != nil {
				return cli.Usage(err)
			}
			if o.ceiling <= 0 {
				return cli.Usagef("--heartbeat-ceiling must be positive, got %s", o.ceiling)
			}
			if o.outage <= 0 {
				return cli.Usagef("--outage must be positive, got %s", o.outage)
			}
			if o.listen != "" {
				if err := loopbackOnly(o.listen); err != nil {
					return cli.Usage(err)
				}
			}
			return run(cmd.Context(), o)
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.host, "host", "", "the host's URL, or several hosts sharing one database, comma-separated (failover)")
	f.StringVar(&o.credential, "credential", "", "the worker's credential file (or "+credentialFileVar+")")
	f.StringVar(&o.listen, "listen", "", "serve MCP over streamable HTTP at /mcp on this loopback address (127.0.0.1:0 picks a port) instead of stdin and stdout")
	f.DurationVar(&o.outage, "outage", mcpworker.DefaultOutage, "a tool answers host_unreachable after the host is unreachable this long, and rate_limited after it asks to slow down this long")
	f.DurationVar(&o.ceiling, "heartbeat-ceiling", mcpworker.DefaultHeartbeatCeiling, "stop renewing a held job's lease this long after taking it, and report the attempt failed (retryable)")
	f.BoolVar(&o.separateDispatch, "separate-dispatch", false, "leave a job's admission to begin_work's own call to the host, rather than having take_job's claim admit it (a job in two calls: claim-and-admit, then publish)")
	cli.CAFile(f, &o.caFile)
	cli.Env(f, "host", "credential", "outage", "heartbeat-ceiling", "separate-dispatch", "ca-file")
	cli.EnvOnly(cmd, credentialFileVar, "", "the worker's credential file, when neither --credential nor FLEET_CREDENTIAL gives it")
	cli.Setup(cmd)
	return cmd
}

// loopbackOnly refuses an address others could reach: whoever reaches
// fleet-mcp's HTTP endpoint acts as its worker.
func loopbackOnly(addr string) error {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("--listen %q: %v", addr, err)
	}
	if host == "localhost" {
		return nil
	}
	if ip := net.ParseIP(host); ip == nil || !ip.IsLoopback() {
		return fmt.Errorf("--listen %q: fleet-mcp serves loopback addresses only (127.0.0.1, ::1, localhost), since whoever reaches it acts as its worker", addr)
	}
	return nil
}

// Bounds of the HTTP transport: a section's text is at most 64 KiB as
// published, and a session left idle this long is closed.
const (
	maxRequestBody     = 1 << 20
	httpSessionTimeout = time.Hour
)

func run(parent context.Context, o options) error {
	token, err := statedir.ReadCredential(o.credential)
	if err != nil {
		return err
	}
	// stdout is the MCP stream with stdio: the log goes to stderr.
	log := logging.New(os.Stderr).With("worker", filepath.Base(o.credential), "pid", os.Getpid(), "via", "mcp")
	ctx, stop := signal.NotifyContext(parent, syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	transport, err := client.Transport(o.caFile)
	if err != nil {
		return cli.Usage(err)
	}
	agent := mcpworker.New(ctx, mcpworker.Config{HostURL: o.host, Token: token, Outage: o.outage, Transport: transport,
		HeartbeatCeiling: o.ceiling, SeparateDispatch: o.separateDispatch, Log: log})
	server := mcpworker.NewServer(agent)
	defer func() {
		// The agent left (or fleet-mcp was stopped): the held job goes
		// back to the queue for a retry, not when its lease runs out.
		leave, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		agent.Close(leave)
	}()
	if o.listen == "" {
		log.Info("serving MCP over stdio", "host", o.host)
		err := server.Run(ctx, mcpworker.StdioTransport(os.Stdin, os.Stdout))
		if ctx.Err() != nil || errors.Is(err, context.Canceled) {
			return nil
		}
		return err
	}
	ln, err := net.Listen("tcp", o.listen)
	if err != nil {
		return err
	}
	mux := http.NewServeMux()
	// A browser page must not drive the worker: the SDK refuses a loopback
	// request whose Host is not loopback (DNS rebinding), and the cross-origin
	// check refuses one a browser marks as sent from another site.
	handler := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return server },
		&mcp.StreamableHTTPOptions{Logger: log, SessionTimeout: httpSessionTimeout, MaxRequestBodyBytes: maxRequestBody})
	mux.Handle("/mcp", http.NewCrossOriginProtection().Handler(handler))
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	url := "http://" + ln.Addr().String() + "/mcp"
	ready, _ := json.Marshal(map[string]any{"url": url, "pid": os.Getpid()})
	fmt.Println(string(ready))
	log.Info("serving MCP over streamable HTTP", "url", url, "host", o.host)
	go func() {
		<-ctx.Done()
		shut, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		srv.Shutdown(shut)
	}()
	if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}
