// Command fleetctl operates a fleet host from scripts and terminals:
//
//	fleetctl [--host URL] [--credential FILE] [--json] COMMAND
//
// Every command has --help with examples; `fleetctl completion bash` (or
// zsh, fish, powershell) prints a completion script. FLEET_HOST and
// FLEET_CREDENTIAL stand for the two flags. It exits 0 on success, 1 when
// the host refused (the message carries its error code), 2 on a usage or
// connection error.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/google/uuid"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/fleet/fleet/internal/cli"
	"github.com/fleet/fleet/internal/client"
	"github.com/fleet/fleet/internal/statedir"
	"github.com/fleet/fleet/internal/wire"
)

// ctl is one fleetctl invocation: where the host is and how to print.
type ctl struct {
	base, token string
	json        bool
	http        *http.Client
	stream      *http.Client // no timeout: event streams last
	out, errOut io.Writer
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := newRoot(os.Stdout).ExecuteContext(ctx); err != nil {
		fatal(err)
	}
}

// newRoot is fleetctl's command tree, printing to out.
func newRoot(out io.Writer) *cobra.Command {
	c := &ctl{out: out, errOut: os.Stderr, http: &http.Client{Timeout: 30 * time.Second}, stream: &http.Client{}}
	var hostURL, credential, caFile string
	root := &cobra.Command{
		Use:   "fleetctl",
		Short: "Operate a Fleet host: jobs, the allowance, tenants, events, credentials",
		Long: `fleetctl operates a Fleet host with its operator credential, printing
tables (or JSON with --json). FLEET_HOST and FLEET_CREDENTIAL stand for
--host and --credential. Exit codes: 0 done, 1 the host refused (the
message names its error code), 2 a usage or connection error, or an
answer that is not a Fleet host's, 3 a receipt that does not verify.`,
		Example: `  export FLEET_HOST=http://127.0.0.1:8080 FLEET_CREDENTIAL=/tmp/fleet/credentials/operator
  fleetctl jobs --state failed
  fleetctl --json job 01a22f… | jq .attempt_log`,
		PersistentPreRunE: func(cmd *cobra.Command, _ []string) error {
			if cmd.Name() == "completion" || (cmd.Parent() != nil && cmd.Parent().Name() == "completion") || cmd.Name() == "help" ||
				cmd.Name() == "config-reference" {
				return nil
			}
			if err := cli.Require(cmd, "host", "credential"); err != nil {
				return err
			}
			if err := cli.CheckHostURL(hostURL); err != nil {
				return cli.Usage(err)
			}
			token, err := statedir.ReadCredential(credential)
			if err != nil {
				return cli.Usage(err)
			}
			transport, err := client.Transport(caFile)
			if err != nil {
				return cli.Usage(err)
			}
			c.http.Transport, c.stream.Transport = transport, transport
			c.base, c.token = strings.TrimRight(hostURL, "/"), token
			return nil
		},
	}
	root.PersistentFlags().StringVar(&hostURL, "host", "", "the host's URL")
	root.PersistentFlags().StringVar(&credential, "credential", "", "the operator credential file")
	root.PersistentFlags().BoolVar(&c.json, "json", false, "print JSON instead of tables")
	cli.CAFile(root.PersistentFlags(), &caFile)
	cli.Env(root.PersistentFlags(), "host", "credential", "ca-file")
	root.AddCommand(c.jobsCommand(), c.jobCommand(), c.actionCommand("cancel", "Cancel a blocked, queued, claimed or running job"),
		c.actionCommand("reconcile", "Resolve a job from what the resource committed"),
		c.actionCommand("requeue", "Queue a refused, unresolved or failed job again (attempts reset)"),
		c.allowanceCommand(), c.eventsCommand(), c.submitCommand(), c.assignCommand(), c.credentialsCommand(), c.watchCommand(),
		c.receiptCommand(), c.statsCommand(), c.snapshotCommand(), c.pauseCommand(), c.resumeCommand(), c.bulkCommand(),
		c.workersCommand(), c.tenantsCommand(), c.tenantCommand(), c.reportCommand(),
		c.schedulesCommand(), c.scheduleCommand())
	cli.Setup(root)
	return root
}

func fatal(err error) {
	fmt.Fprintln(os.Stderr, "fleetctl:", err)
	if errors.As(err, new(notVerified)) {
		os.Exit(3)
	}
	var refused *client.Error
	if errors.As(err, &refused) && refused.Code != "" { // the host answered: exit 1; anything else is 2
		os.Exit(1)
	}
	os.Exit(2)
}

func (c *ctl) call(ctx context.Context, method, path string, body any) ([]byte, error) {
	resp, err := client.Do(ctx, c.http, c.base, c.token, method, path, body, nil)
	return resp.Body, err
}

// jobsCommand lists jobs a page at a time (GET /admin/jobs), filtered, or
// every page with --all.
func (c *ctl) jobsCommand() *cobra.Command {
	var state, section, owner, q, after, priority, tenant string
	var limit int
	var all bool
	cmd := &cobra.Command{
		Use:   "jobs",
		Short: "List jobs a page at a time, filtered, with counts by state",
		Example: `  fleetctl jobs                               # the first 50
  fleetctl jobs --state failed --section terms
  fleetctl jobs --owner worker-2 --q 01a22f   # a worker's jobs whose ids start so
  fleetctl jobs --state queued --priority 1   # the queued jobs claimed first
  fleetctl jobs --tenant research             # one tenant's jobs
  fleetctl jobs --limit 200 --all             # every job, 200 a request`,
		Args: cli.Args(0, "no arguments"),
		RunE: func(cmd *cobra.Command, _ []string) error {
			var page wire.JobPage
			total := wire.JobPage{Jobs: []wire.Job{}} // an empty page is [], as the host sends it
			for {
				v := url.Values{}
				for k, s := range map[string]string{"state": state, "section": section, "owner": owner, "q": q, "after": after,
					"priority": priority, "tenant": tenant} {
					if s != "" {
						v.Set(k, s)
					}
				}
				v.Set("limit", strconv.Itoa(limit))
				raw, err := c.call(cmd.Context(), "GET", "/admin/jobs?"+v.Encode(), nil)
				if err != nil {
					return err
				}
				page = wire.JobPage{}
				if err := json.Unmarshal(raw, &page); err != nil {
					return err
				}
				total.Jobs, total.Counts, total.Next = append(total.Jobs, page.Jobs...), page.Counts, page.Next
				if !all || page.Next == "" {
					break
				}
				after = page.Next
			}
			raw, err := json.Marshal(total)
			if err != nil {
				return err
			}
			return c.show(raw, func(w *tabwriter.Writer) error {
				fmt.Fprintln(w, "OPERATION\tSECTION\tSTATE\tPRIORITY\tOWNER\tGEN\tRESERVED\tATTEMPTS\tREASON")
				for _, j := range total.Jobs {
					fmt.Fprintf(w, "%s\t%s\t%s\t%d\t%s\t%d\t%d\t%d/%d\t%s\n", j.OperationID, j.Section, j.State, j.Priority, dash(j.Owner), j.Generation,
						j.Reserved, j.Attempts, j.MaxAttempts, wire.EscapeText(j.Reason))
				}
				fmt.Fprintf(w, "\n%d shown; all jobs: %s\n", len(total.Jobs), countsText(total.Counts))
				if total.Next != "" {
					fmt.Fprintf(w, "more: fleetctl jobs --after %s (or --all)\n", total.Next)
				}
				return nil
			})
		},
	}
	f := cmd.Flags()
	f.StringVar(&state, "state", "", "only jobs in this state")
	f.StringVar(&section, "section", "", "only jobs of this section")
	f.StringVar(&owner, "owner", "", "only jobs whose document this worker holds")
	f.StringVar(&priority, "priority", "", "only jobs of this priority, 1 to 4")
	f.StringVar(&tenant, "tenant", "", "only this tenant's jobs")
	f.StringVar(&q, "q", "", "only the job with this operation id, or the ids that start so")
	f.IntVar(&limit, "limit", wire.DefaultJobPage, fmt.Sprintf("jobs a page (1 to %d)", wire.MaxJobPage))
	f.StringVar(&after, "after", "", "the page after this cursor (the next of an earlier page)")
	f.BoolVar(&all, "all", false, "every page, one after another")
	cmd.RegisterFlagCompletionFunc("state", fixedCompletions(jobStateNames()...))
	cmd.RegisterFlagCompletionFunc("section", fixedCompletions("summary", "terms", "actions", "links"))
	return cmd
}

// countsText is "3 queued, 1 failed" in the states' order.
func countsText(counts map[wire.JobState]int64) string {
	var parts []string
	for _, s := range wire.JobStates {
		if n := counts[s]; n > 0 {
			parts = append(parts, fmt.Sprintf("%d %s", n, s))
		}
	}
	return strings.Join(parts, ", ")
}

func jobStateNames() []string {
	names := make([]string, len(wire.JobStates))
	for i, s := range wire.JobStates {
		names[i] = string(s)
	}
	return names
}

func fixedCompletions(values ...string) func(*cobra.Command, []string, string) ([]string, cobra.ShellCompDirective) {
	return func(*cobra.Command, []string, string) ([]string, cobra.ShellCompDirective) {
		return values, cobra.ShellCompDirectiveNoFileComp
	}
}

// jobCommand shows one job.
func (c *ctl) jobCommand() *cobra.Command {
	return &cobra.Command{
		Use:     "job OPERATION_ID",
		Short:   "Show one job: its report, claim, document, attempts and receipts",
		Example: `  fleetctl job 01a22fb0-5b86-7b38-b72e-14eace2a81fe`,
		Args:    cli.Args(1, "one operation id"),
		RunE: func(cmd *cobra.Command, a []string) error {
			raw, err := c.call(cmd.Context(), "GET", "/admin/jobs/"+url.PathEscape(a[0]), nil)
			if err != nil {
				return err
			}
			return c.show(raw, func(w *tabwriter.Writer) error {
				var d wire.JobDetail
				if err := json.Unmarshal(raw, &d); err != nil {
					return err
				}
				fmt.Fprintf(w, "operation\t%s\nsection\t%s\nstate\t%s\nreason\t%s\nworker\t%s\ndocument\t%s (version %d, generation %d, owner %s)\nmutations\t%d\n",
					d.OperationID, d.Section, d.State, wire.EscapeText(d.Reason), dash(d.Worker), d.DocumentID, d.Document.Version, d.Document.Generation, dash(d.Owner), d.Mutations)
				fmt.Fprintf(w, "created\t%s\nclaimed\t%s\nstarted\t%s\nfinished\t%s\n",
					when(d.CreatedAtMS), when(d.ClaimedAtMS), when(d.StartedAtMS), when(d.FinishedAtMS))
				if d.Claim != nil {
					fmt.Fprintf(w, "claim\t%s (generation %d, lease until %s)\n", d.Claim.ClaimID, d.Claim.Generation, when(d.Claim.LeaseExpiresAtMS))
				}
				if len(d.Outcome) > 0 && string(d.Outcome) != "null" {
					fmt.Fprintf(w, "outcome\t%s\n", d.Outcome)
				}
				fmt.Fprintf(w, "report\t%s\n", wire.EscapeText(d.Batch)) // the key fleetctl report takes
				fmt.Fprintf(w, "priority\t%d\n", d.Priority)
				fmt.Fprintf(w, "tenant\t%s\n", d.Tenant)
				fmt.Fprintf(w, "attempts\t%d failed of %d\n", d.Attempts, d.MaxAttempts)
				if d.LastError != "" {
					fmt.Fprintf(w, "last error\t%s\n", wire.EscapeText(d.LastError))
				}
				if d.State == wire.Queued && d.ClaimableAtMS > time.Now().UnixMilli() {
					fmt.Fprintf(w, "retry at\t%s\n", time.UnixMilli(d.ClaimableAtMS).UTC().Format(time.RFC3339))
				}
				for _, dep := range d.Dependencies {
					fmt.Fprintf(w, "waits for\t%s %s (%s)%s\n", dep.Section, dep.OperationID, dep.State, because(dep.Reason))
				}
				for _, a := range d.AttemptLog {
					fmt.Fprintf(w, "attempt\t#%d by %s at generation %d: %s (%s, cost %d)\n", a.Attempt, dash(a.Worker), a.Generation, wire.EscapeText(a.Reason), a.Outcome, a.Cost)
				}
				for _, r := range d.Receipts {
					fmt.Fprintf(w, "receipt\t#%d %s %s cost %d at %s  %s\n", r.Sequence, r.Kind, r.Decision, r.Cost, when(r.IssuedAtMS), r.ID)
				}
				if len(d.Document.Body) > 0 && string(d.Document.Body) != "null" {
					fmt.Fprintf(w, "published\t%s\n", wire.EscapeText(string(d.Document.Body)))
				}
				return nil
			})
		},
	}
}

// actionCommand is cancel, reconcile or requeue of one job.
func (c *ctl) actionCommand(name, short string) *cobra.Command {
	return &cobra.Command{
		Use:     name + " OPERATION_ID",
		Short:   short,
		Example: "  fleetctl " + name + " 01a22fb0-5b86-7b38-b72e-14eace2a81fe",
		Args:    cli.Args(1, "one operation id"),
		RunE: func(cmd *cobra.Command, a []string) error {
			raw, err := c.call(cmd.Context(), "POST", "/admin/jobs/"+url.PathEscape(a[0])+"/"+name, nil)
			if err != nil {
				return err
			}
			return c.show(raw, func(w *tabwriter.Writer) error { return keyValues(w, raw) })
		},
	}
}

// allowanceCommand sets the allowance, compare-and-swap on the current one.
func (c *ctl) allowanceCommand() *cobra.Command {
	return &cobra.Command{
		Use:     "allowance N",
		Short:   "Set the allowance (compare-and-swap on the one the host has now)",
		Example: "  fleetctl allowance 500",
		Args:    cli.Args(1, "the new allowance"),
		RunE: func(cmd *cobra.Command, a []string) error {
			n, err := strconv.ParseInt(a[0], 10, 64)
			if err != nil {
				return cli.Usage(fmt.Errorf("allowance %q is not a whole number", a[0]))
			}
			raw, err := c.call(cmd.Context(), "GET", "/admin/stats", nil)
			if err != nil {
				return err
			}
			var st struct{ Accounting wire.Accounting }
			if err := json.Unmarshal(raw, &st); err != nil {
				return err
			}
			raw, err = c.call(cmd.Context(), "POST", "/admin/allowance", map[string]int64{"expected_allowance": st.Accounting.Allowance, "allowance": n})
			if err != nil {
				return err
			}
			return c.show(raw, func(w *tabwriter.Writer) error { return keyValues(w, raw) })
		},
	}
}

// assignCommand gives a document to a worker at the next generation, if
// its generation is the one the operator saw (the document's current one
// unless --expected-generation says).
func (c *ctl) assignCommand() *cobra.Command {
	var owner string
	var expected int64
	cmd := &cobra.Command{
		Use:     "assign DOCUMENT_ID --owner WORKER",
		Short:   "Give a job's document to a worker at the next generation (compare-and-swap)",
		Example: "  fleetctl assign doc-01a22fb0-5b86-7b38-b72e-14eace2a81fe --owner worker-2",
		Args:    cli.Args(1, "a document id"),
		RunE: func(cmd *cobra.Command, a []string) error {
			doc := a[0]
			if owner == "" {
				return cli.Usage(errors.New("assign needs --owner WORKER"))
			}
			if expected < 0 {
				// The current generation, from the job whose document it is.
				raw, err := c.call(cmd.Context(), "GET", "/admin/jobs?q="+url.QueryEscape(strings.TrimPrefix(doc, "doc-"))+"&limit=1", nil)
				if err != nil {
					return err
				}
				var page wire.JobPage
				if err := json.Unmarshal(raw, &page); err != nil {
					return err
				}
				if len(page.Jobs) != 1 || page.Jobs[0].DocumentID != doc {
					return cli.Usage(fmt.Errorf("no job has the document %s; give --expected-generation", doc))
				}
				expected = page.Jobs[0].Generation
			}
			raw, err := c.call(cmd.Context(), "POST", "/admin/documents/"+url.PathEscape(doc)+"/assign",
				map[string]any{"expected_generation": expected, "owner": owner})
			if err != nil {
				return err
			}
			return c.show(raw, func(w *tabwriter.Writer) error { return keyValues(w, raw) })
		},
	}
	cmd.Flags().StringVar(&owner, "owner", "", "the worker to give the document to")
	cmd.Flags().Int64Var(&expected, "expected-generation", -1, "assign only if the document is still at this generation (default: its current one)")
	return cmd
}

// credentialsCommand lists the credentials, or revokes or rotates one.
func (c *ctl) credentialsCommand() *cobra.Command {
	var name string
	var allowance int64
	var tenants []string
	cmd := &cobra.Command{
		Use:   "credentials [list | add NAME [--allowance N] [--tenant NAME]... | revoke NAME | rotate NAME] [--name NAME]",
		Short: "List the credentials, or add, revoke or rotate one",
		Example: `  fleetctl credentials
  fleetctl credentials add worker-9      # a new worker credential; prints its token, once
  fleetctl credentials add agent-7 --allowance 200   # an agent's own cap, below its tenant's and the fleet's
  fleetctl credentials add team-a-1 --tenant team-a  # claims only team-a's jobs
  fleetctl credentials revoke worker-3   # refused by every host within a second
  fleetctl credentials rotate worker-1   # prints the new token, once`,
		ValidArgs: []string{"list", "add", "revoke", "rotate"},
		RunE: func(cmd *cobra.Command, a []string) error {
			// --name as fleet-host's credentials commands take it.
			if name != "" && len(a) == 1 && a[0] != "list" {
				a = append(a, name)
			}
			if len(a) == 0 || (len(a) == 1 && a[0] == "list") {
				return c.listCredentials(cmd)
			}
			if len(a) == 2 && a[0] == "add" {
				var cap *int64
				if cmd.Flags().Changed("allowance") {
					cap = &allowance
				}
				return c.addCredential(cmd, a[1], cap, tenants)
			}
			if len(a) != 2 || (a[0] != "revoke" && a[0] != "rotate") {
				return cli.Usage(errors.New("credentials takes list, add NAME, revoke NAME or rotate NAME"))
			}
			raw, err := c.call(cmd.Context(), "POST", "/admin/credentials/"+url.PathEscape(a[1])+"/"+a[0], nil)
			if err != nil {
				return err
			}
			return c.show(raw, func(w *tabwriter.Writer) error {
				var ch wire.CredentialChange
				if err := json.Unmarshal(raw, &ch); err != nil {
					return err
				}
				return showCredentialChange(w, ch)
			})
		},
	}
	cmd.Flags().StringVar(&name, "name", "", "the credential to add, revoke or rotate (as fleet-host credentials takes it; or give it after the verb)")
	cmd.Flags().Int64Var(&allowance, "allowance", 0, "with add: the credential's own allowance in credits, fixed for its life (an agent's cap; default none)")
	cmd.Flags().StringArrayVar(&tenants, "tenant", nil, "with add: a tenant whose jobs the credential claims, fixed for its life; repeat for more (default every tenant's)")
	return cmd
}

// listCredentials shows every credential, revoked ones with when.
func (c *ctl) listCredentials(cmd *cobra.Command) error {
	raw, err := c.call(cmd.Context(), "GET", "/admin/credentials", nil)
	if err != nil {
		return err
	}
	return c.show(raw, func(w *tabwriter.Writer) error {
		var list struct{ Credentials []wire.Credential }
		if err := json.Unmarshal(raw, &list); err != nil {
			return err
		}
		fmt.Fprintln(w, "NAME\tROLE\tCREATED\tREVOKED\tALLOWANCE\tSPENT\tRESERVED\tTENANTS")
		for _, cr := range list.Credentials {
			revoked := "-"
			if cr.RevokedAtMS != 0 {
				revoked = time.UnixMilli(cr.RevokedAtMS).UTC().Format(time.RFC3339)
			}
			allowance := "-"
			if cr.Allowance != nil {
				allowance = strconv.FormatInt(*cr.Allowance, 10)
			}
			fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%d\t%d\t%s\n", cr.Name, cr.Role, time.UnixMilli(cr.CreatedAtMS).UTC().Format(time.RFC3339), revoked,
				allowance, cr.Spent, cr.Reserved, tenantsOf(cr.Tenants))
		}
		return nil
	})
}

// submitCommand queues a report.
func (c *ctl) submitCommand() *cobra.Command {
	var docPath, sections, key, tenant string
	var after []string
	var priority int64
	var retryPolicy func(*cobra.Command) (wire.RetryPolicy, error)
	cmd := &cobra.Command{
		Use:   "submit --document FILE --sections a,b [--after SECTION=DEP,DEP]... [--key K] [--tenant NAME] [--priority P] [--max-attempts N --backoff-base D --backoff-cap D]",
		Short: "Queue a report: one job per section",
		Example: `  fleetctl submit --document notes.md --sections summary,links --key batch-7
  fleetctl submit --document notes.md --sections terms --max-attempts 5 --backoff-base 2s --backoff-cap 5m
  fleetctl submit --document incident.md --sections summary --priority 1   # claimed before every job of priority 2 to 4
  fleetctl submit --document notes.md --sections summary --tenant research  # spends research's allowance
  fleetctl submit --document notes.md --sections summary,terms,links --after summary=terms,links   # summary waits for both`,
		Args: cli.Args(0, "no arguments"),
		RunE: func(cmd *cobra.Command, _ []string) error {
			retry, err := retryPolicy(cmd)
			if err != nil {
				return err
			}
			sub := submission{docPath: docPath, sections: sections, key: key, retry: retry}
			if sub.after, err = parseAfter(after); err != nil {
				return err
			}
			if cmd.Flags().Changed("priority") {
				sub.priority = &priority
			}
			if cmd.Flags().Changed("tenant") {
				sub.tenant = &tenant
			}
			return c.submit(cmd.Context(), sub)
		},
	}
	cmd.Flags().StringVar(&docPath, "document", "", "file with the document text")
	cmd.Flags().StringVar(&sections, "sections", "", "comma-separated sections: summary, terms, actions, links, overview")
	cmd.Flags().StringVar(&key, "key", "", "idempotency key (default: a new one); repeat it to resubmit safely")
	cmd.Flags().Int64Var(&priority, "priority", wire.DefaultPriority, "the jobs' priority, 1 (claimed first) to 4")
	cmd.Flags().StringVar(&tenant, "tenant", wire.DefaultTenant, "the tenant whose allowance the jobs spend")
	cmd.Flags().StringArrayVar(&after, "after", nil, "SECTION=DEP,DEP: the section waits for those of the report to complete; repeat for more")
	retryPolicy = retryFlags(cmd.Flags())
	return cmd
}

// retryFlags adds --max-attempts, --backoff-base and --backoff-cap to a
// command that submits reports, and answers what reads them: the retry
// policy given, each flag left out taking the state's.
func retryFlags(f *pflag.FlagSet) func(*cobra.Command) (wire.RetryPolicy, error) {
	var maxAttempts int64
	var backoffBase, backoffCap time.Duration
	f.Int64Var(&maxAttempts, "max-attempts", 0, "attempts each job gets before it fails (default: the state's)")
	f.DurationVar(&backoffBase, "backoff-base", 0, "wait before the first retry, doubled after each (default: the state's)")
	f.DurationVar(&backoffCap, "backoff-cap", 0, "the longest wait between retries (default: the state's)")
	return func(cmd *cobra.Command) (wire.RetryPolicy, error) {
		var retry wire.RetryPolicy
		if cmd.Flags().Changed("max-attempts") {
			retry.MaxAttempts = &maxAttempts
		}
		for _, d := range []struct {
			flag  string
			value time.Duration
			field **int64
		}{{"backoff-base", backoffBase, &retry.BackoffBaseMS}, {"backoff-cap", backoffCap, &retry.BackoffCapMS}} {
			if cmd.Flags().Changed(d.flag) {
				if d.value%time.Millisecond != 0 {
					return retry, cli.Usage(fmt.Errorf("--%s %s is not a whole number of milliseconds", d.flag, d.value))
				}
				ms := d.value.Milliseconds()
				*d.field = &ms
			}
		}
		return retry, nil
	}
}

// submission is what submit sends; priority and tenant are nil when not
// given, so a repeat keeps the request's digest.
type submission struct {
	docPath, sections, key string
	retry                  wire.RetryPolicy
	priority               *int64
	tenant                 *string
	after                  map[string][]string
}

// because is ": reason", escaped, or "" for none.
func because(reason string) string {
	if reason == "" {
		return ""
	}
	return ": " + wire.EscapeText(reason)
}

// parseAfter reads --after's SECTION=DEP,DEP values.
func parseAfter(values []string) (map[string][]string, error) {
	if len(values) == 0 {
		return nil, nil
	}
	after := map[string][]string{}
	for _, v := range values {
		section, deps, ok := strings.Cut(v, "=")
		if !ok || section == "" || deps == "" {
			return nil, cli.Usage(fmt.Errorf("--after %q is not SECTION=DEP,DEP", v))
		}
		if _, twice := after[section]; twice {
			return nil, cli.Usage(fmt.Errorf("--after names %s twice; list all it waits for in one", section))
		}
		after[section] = strings.Split(deps, ",")
	}
	return after, nil
}

func (c *ctl) submit(ctx context.Context, sub submission) error {
	if sub.docPath == "" || sub.sections == "" {
		return cli.Usage(errors.New("submit needs --document FILE and --sections a,b"))
	}
	doc, err := os.ReadFile(sub.docPath)
	if err != nil {
		return err
	}
	key := sub.key
	if key == "" {
		key = uuid.NewString()
	}
	document := string(doc)
	raw, err := c.call(ctx, "POST", "/admin/reports", wire.ReportsRequest{Document: &document,
		Sections: strings.Split(sub.sections, ","), IdempotencyKey: &key, RetryPolicy: sub.retry, Priority: sub.priority, Tenant: sub.tenant,
		After: sub.after})
	if err != nil {
		return err
	}
	return c.show(raw, func(w *tabwriter.Writer) error {
		var res wire.ReportsResult
		if err := json.Unmarshal(raw, &res); err != nil {
			return err
		}
		fmt.Fprintf(w, "idempotency key\t%s\n", key)
		for _, op := range res.OperationIDs {
			fmt.Fprintf(w, "queued\t%s\n", op)
		}
		return nil
	})
}

// watchCommand draws a live view of the host in the terminal: counts by
// state, the allowance, the rate of completions, refusals and failures
// over the last minute, and the newest events.
func (c *ctl) watchCommand() *cobra.Command {
	var interval time.Duration
	var count int
	cmd := &cobra.Command{
		Use:   "watch",
		Short: "A live view: counts, the allowance, rates and the newest events",
		Example: `  fleetctl watch
  fleetctl watch --interval 5s
  fleetctl watch --count 1        # one frame, e.g. for a script
  fleetctl --json watch | jq .completed_per_s   # a JSON line per frame`,
		Args: cli.Args(0, "no arguments"),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if interval < 100*time.Millisecond {
				return cli.Usage(errors.New("--interval must be at least 100ms"))
			}
			if count < 0 {
				return cli.Usagef("--count must be 0 (until interrupted) or more, got %d", count)
			}
			clear := false
			if f, ok := c.out.(*os.File); ok && !c.json {
				info, err := f.Stat()
				clear = err == nil && info.Mode()&os.ModeCharDevice != 0
			}
			for frame := 1; ; frame++ {
				f, err := c.frame(cmd.Context())
				if err != nil {
					return err
				}
				if c.json {
					line, _ := json.Marshal(f)
					fmt.Fprintln(c.out, string(line)) // one frame a line
				} else {
					if clear {
						fmt.Fprint(c.out, "\033[H\033[2J")
					}
					fmt.Fprint(c.out, f.text())
				}
				if count > 0 && frame >= count {
					return nil
				}
				select {
				case <-cmd.Context().Done():
					return nil
				case <-time.After(interval):
				}
			}
		},
	}
	cmd.Flags().DurationVar(&interval, "interval", time.Second, "how often to redraw")
	cmd.Flags().IntVar(&count, "count", 0, "stop after this many frames (0: until interrupted)")
	return cmd
}

// watchFrame is one frame of watch: what it draws, and with --json prints
// as one line of JSON.
type watchFrame struct {
	Host       string                  `json:"host"`
	NowMS      int64                   `json:"now_ms"`
	Jobs       map[wire.JobState]int64 `json:"jobs"`
	Claims     wire.ClaimsState        `json:"claims"`
	Accounting wire.Accounting         `json:"accounting"`
	// WindowS is how many seconds of samples the rates average over.
	WindowS   int          `json:"window_s"`
	Completed float64      `json:"completed_per_s"`
	Refused   float64      `json:"refused_per_s"`
	Failed    float64      `json:"failed_per_s"`
	Events    []wire.Event `json:"events"` // the newest, oldest first
}

// frame reads one frame of watch.
func (c *ctl) frame(ctx context.Context) (watchFrame, error) {
	raw, err := c.call(ctx, "GET", "/admin/stats", nil)
	if err != nil {
		return watchFrame{}, err
	}
	var st wire.Stats
	if err := json.Unmarshal(raw, &st); err != nil {
		return watchFrame{}, err
	}
	raw, err = c.call(ctx, "GET", fmt.Sprintf("/admin/series?after=%d", st.NowMS/1000-60), nil)
	if err != nil {
		return watchFrame{}, err
	}
	var series struct {
		Samples []struct{ Completed, Refused, Failed int64 }
	}
	if err := json.Unmarshal(raw, &series); err != nil {
		return watchFrame{}, err
	}
	var done, refused, failed int64
	for _, s := range series.Samples {
		done, refused, failed = done+s.Completed, refused+s.Refused, failed+s.Failed
	}
	per := func(n int64) float64 { return float64(n) / float64(max(1, len(series.Samples))) }
	raw, err = c.call(ctx, "GET", fmt.Sprintf("/admin/events?after=%d", max(0, st.Events-8)), nil)
	if err != nil {
		return watchFrame{}, err
	}
	var events wire.EventPage
	if err := json.Unmarshal(raw, &events); err != nil {
		return watchFrame{}, err
	}
	return watchFrame{Host: c.base, NowMS: st.NowMS, Jobs: st.Jobs, Claims: st.Claims, Accounting: st.Accounting, WindowS: len(series.Samples),
		Completed: per(done), Refused: per(refused), Failed: per(failed), Events: events.Events}, nil
}

// text draws a frame for a terminal.
func (f watchFrame) text() string {
	var b strings.Builder
	a := f.Accounting
	fmt.Fprintf(&b, "Fleet at %s, %s\n\n", f.Host, time.UnixMilli(f.NowMS).UTC().Format(time.RFC3339))
	if f.Claims.Paused {
		fmt.Fprintf(&b, "CLAIMS PAUSED since %s: %s (fleetctl resume)\n", time.UnixMilli(f.Claims.AtMS).UTC().Format(time.RFC3339), wire.EscapeText(f.Claims.Reason))
	}
	fmt.Fprintf(&b, "jobs       %s\n", countsText(f.Jobs))
	fmt.Fprintf(&b, "allowance  %d spent, %d reserved, %d available of %d\n", a.Spent, a.Reserved, a.Available, a.Allowance)
	fmt.Fprintf(&b, "per second over the last %d s: %.1f completed, %.1f refused, %.1f failed\n\nnewest events\n",
		f.WindowS, f.Completed, f.Refused, f.Failed)
	for i := len(f.Events) - 1; i >= 0; i-- {
		e := f.Events[i]
		fmt.Fprintf(&b, "%6d  %s  %-22s %s\n", e.Sequence, time.UnixMilli(e.TimestampMS).UTC().Format("15:04:05"), e.Kind, wire.EscapeText(e.Title))
	}
	return b.String()
}
