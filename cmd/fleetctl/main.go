// Command fleetctl operates a fleet host from scripts and terminals:
//
//	fleetctl --host URL --credential FILE [--json] COMMAND
//
//	jobs                          every job with its state
//	job ID                        one job with its claim, document and receipts
//	cancel ID | reconcile ID | requeue ID
//	allowance N                   set the allowance (compare-and-swap on the current one)
//	events [--after N] [--follow] the event log; --follow streams new events
//	submit --document FILE --sections a,b [--key K]
package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/google/uuid"

	"github.com/fleet/fleet/internal/client"
	"github.com/fleet/fleet/internal/statedir"
	"github.com/fleet/fleet/internal/wire"
)

const usage = `usage: fleetctl --host URL --credential FILE [--json] COMMAND
commands:
  jobs [--state S] [--section S] [--owner W] [--q ID] [--limit N] [--after CURSOR] [--all]
  job ID
  cancel ID | reconcile ID | requeue ID
  allowance N
  events [--after N] [--follow]
  submit --document FILE --sections summary,terms [--key K]
  assign DOCUMENT --owner WORKER [--expected-generation N]
  credentials [list] | credentials revoke NAME | credentials rotate NAME`

// ctl is one fleetctl invocation: where the host is and how to print.
type ctl struct {
	base, token string
	json        bool
	http        *http.Client
	out         io.Writer
}

func main() {
	fs := flag.NewFlagSet("fleetctl", flag.ContinueOnError)
	hostURL := fs.String("host", os.Getenv("FLEET_HOST"), "the host's URL (or FLEET_HOST)")
	credential := fs.String("credential", os.Getenv("FLEET_CREDENTIAL"), "the operator credential file (or FLEET_CREDENTIAL)")
	asJSON := fs.Bool("json", false, "print JSON instead of tables")
	fs.Usage = func() { fmt.Fprintln(os.Stderr, usage) }
	if err := fs.Parse(os.Args[1:]); err != nil {
		os.Exit(2)
	}
	if *hostURL == "" || *credential == "" || fs.NArg() == 0 {
		fmt.Fprintln(os.Stderr, usage)
		os.Exit(2)
	}
	token, err := statedir.ReadCredential(*credential)
	if err != nil {
		fatal(err)
	}
	c := &ctl{base: strings.TrimRight(*hostURL, "/"), token: token, json: *asJSON,
		http: &http.Client{Timeout: 30 * time.Second}, out: os.Stdout}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := c.run(ctx, fs.Arg(0), fs.Args()[1:]); err != nil {
		fatal(err)
	}
}

func fatal(err error) {
	fmt.Fprintln(os.Stderr, "fleetctl:", err)
	var refused *client.Error
	if errors.As(err, &refused) { // the host answered: exit 1; anything else is 2
		os.Exit(1)
	}
	os.Exit(2)
}

func (c *ctl) call(ctx context.Context, method, path string, body any) ([]byte, error) {
	resp, err := client.Do(ctx, c.http, c.base, c.token, method, path, body, nil)
	return resp.Body, err
}

// show prints raw JSON with --json, else the table that table writes.
func (c *ctl) show(raw []byte, table func(w *tabwriter.Writer) error) error {
	if c.json {
		var buf bytes.Buffer
		if err := json.Indent(&buf, raw, "", "  "); err != nil {
			return err
		}
		fmt.Fprintln(c.out, buf.String())
		return nil
	}
	w := tabwriter.NewWriter(c.out, 0, 4, 2, ' ', 0)
	if err := table(w); err != nil {
		return err
	}
	return w.Flush()
}

// assign gives a document to a worker at the next generation, if its
// generation is the one the operator saw (the document's current one
// unless --expected-generation says).
func (c *ctl) assign(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("assign", flag.ContinueOnError)
	owner := fs.String("owner", "", "the worker to give the document to")
	expected := fs.Int64("expected-generation", -1, "assign only if the document is still at this generation (default: its current one)")
	// The document may come before the flags or after them.
	var doc string
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		doc, args = args[0], args[1:]
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	if doc == "" && fs.NArg() == 1 {
		doc = fs.Arg(0)
	} else if fs.NArg() != 0 {
		doc = ""
	}
	if doc == "" || *owner == "" {
		return fmt.Errorf("assign takes a document id and --owner WORKER")
	}
	if *expected < 0 {
		// The current generation, from the job whose document it is.
		raw, err := c.call(ctx, "GET", "/admin/jobs?q="+url.QueryEscape(strings.TrimPrefix(doc, "doc-"))+"&limit=1", nil)
		if err != nil {
			return err
		}
		var page wire.JobPage
		if err := json.Unmarshal(raw, &page); err != nil {
			return err
		}
		if len(page.Jobs) != 1 || page.Jobs[0].DocumentID != doc {
			return fmt.Errorf("no job has the document %s; give --expected-generation", doc)
		}
		*expected = page.Jobs[0].Generation
	}
	raw, err := c.call(ctx, "POST", "/admin/documents/"+url.PathEscape(doc)+"/assign",
		map[string]any{"expected_generation": *expected, "owner": *owner})
	if err != nil {
		return err
	}
	return c.show(raw, func(w *tabwriter.Writer) error { return keyValues(w, raw) })
}

// credentials lists the credentials, or revokes or rotates one.
func (c *ctl) credentials(ctx context.Context, args []string) error {
	if len(args) == 0 || args[0] == "list" {
		raw, err := c.call(ctx, "GET", "/admin/credentials", nil)
		if err != nil {
			return err
		}
		return c.show(raw, func(w *tabwriter.Writer) error {
			var list struct{ Credentials []wire.Credential }
			if err := json.Unmarshal(raw, &list); err != nil {
				return err
			}
			fmt.Fprintln(w, "NAME\tROLE\tCREATED\tREVOKED")
			for _, cr := range list.Credentials {
				revoked := "-"
				if cr.RevokedAtMS != 0 {
					revoked = time.UnixMilli(cr.RevokedAtMS).UTC().Format(time.RFC3339)
				}
				fmt.Fprintf(w, "%s\t%s\t%s\t%s\n", cr.Name, cr.Role, time.UnixMilli(cr.CreatedAtMS).UTC().Format(time.RFC3339), revoked)
			}
			return nil
		})
	}
	if len(args) != 2 || (args[0] != "revoke" && args[0] != "rotate") {
		return fmt.Errorf("credentials takes list, revoke NAME or rotate NAME")
	}
	raw, err := c.call(ctx, "POST", "/admin/credentials/"+url.PathEscape(args[1])+"/"+args[0], nil)
	if err != nil {
		return err
	}
	return c.show(raw, func(w *tabwriter.Writer) error { return keyValues(w, raw) })
}

// jobs lists jobs a page at a time (GET /admin/jobs), filtered, or every
// page with --all.
func (c *ctl) jobs(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("jobs", flag.ContinueOnError)
	state := fs.String("state", "", "only jobs in this state")
	section := fs.String("section", "", "only jobs of this section")
	owner := fs.String("owner", "", "only jobs whose document this worker holds")
	q := fs.String("q", "", "only the job with this operation id, or the ids that start so")
	limit := fs.Int("limit", wire.DefaultJobPage, fmt.Sprintf("jobs a page (1 to %d)", wire.MaxJobPage))
	after := fs.String("after", "", "the page after this cursor (the next of an earlier page)")
	all := fs.Bool("all", false, "every page, one after another")
	if err := fs.Parse(args); err != nil {
		return err
	}
	var page, total wire.JobPage
	for {
		v := url.Values{}
		for k, s := range map[string]string{"state": *state, "section": *section, "owner": *owner, "q": *q, "after": *after} {
			if s != "" {
				v.Set(k, s)
			}
		}
		v.Set("limit", strconv.Itoa(*limit))
		raw, err := c.call(ctx, "GET", "/admin/jobs?"+v.Encode(), nil)
		if err != nil {
			return err
		}
		page = wire.JobPage{}
		if err := json.Unmarshal(raw, &page); err != nil {
			return err
		}
		total.Jobs, total.Counts, total.Next = append(total.Jobs, page.Jobs...), page.Counts, page.Next
		if !*all || page.Next == "" {
			break
		}
		*after = page.Next
	}
	raw, err := json.Marshal(total)
	if err != nil {
		return err
	}
	return c.show(raw, func(w *tabwriter.Writer) error {
		fmt.Fprintln(w, "OPERATION\tSECTION\tSTATE\tOWNER\tGEN\tRESERVED\tATTEMPTS\tREASON")
		for _, j := range total.Jobs {
			fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%d\t%d\t%d/%d\t%s\n", j.OperationID, j.Section, j.State, dash(j.Owner), j.Generation, j.Reserved,
				j.Attempts, j.MaxAttempts, j.Reason)
		}
		var counts []string
		for _, s := range wire.JobStates {
			if n := total.Counts[s]; n > 0 {
				counts = append(counts, fmt.Sprintf("%d %s", n, s))
			}
		}
		fmt.Fprintf(w, "\n%d shown; all jobs: %s\n", len(total.Jobs), strings.Join(counts, ", "))
		if total.Next != "" {
			fmt.Fprintf(w, "more: fleetctl jobs --after %s (or --all)\n", total.Next)
		}
		return nil
	})
}

func (c *ctl) run(ctx context.Context, cmd string, args []string) error {
	one := func() (string, error) {
		if len(args) != 1 {
			return "", fmt.Errorf("%s takes one operation id", cmd)
		}
		return args[0], nil
	}
	switch cmd {
	case "jobs":
		return c.jobs(ctx, args)
	case "job":
		op, err := one()
		if err != nil {
			return err
		}
		raw, err := c.call(ctx, "GET", "/admin/jobs/"+op, nil)
		if err != nil {
			return err
		}
		return c.show(raw, func(w *tabwriter.Writer) error {
			var d wire.JobDetail
			if err := json.Unmarshal(raw, &d); err != nil {
				return err
			}
			fmt.Fprintf(w, "operation\t%s\nsection\t%s\nstate\t%s\nreason\t%s\nworker\t%s\ndocument\t%s (version %d, generation %d, owner %s)\nmutations\t%d\n",
				d.OperationID, d.Section, d.State, d.Reason, dash(d.Worker), d.DocumentID, d.Document.Version, d.Document.Generation, dash(d.Document.Owner), d.Mutations)
			if d.Claim != nil {
				fmt.Fprintf(w, "claim\t%s (generation %d, lease until %s)\n", d.Claim.ClaimID, d.Claim.Generation, time.UnixMilli(d.Claim.LeaseExpiresAtMS).UTC().Format(time.RFC3339))
			}
			if d.Outcome != nil {
				fmt.Fprintf(w, "outcome\t%s\n", d.Outcome)
			}
			fmt.Fprintf(w, "attempts\t%d failed of %d\n", d.Attempts, d.MaxAttempts)
			if d.LastError != "" {
				fmt.Fprintf(w, "last error\t%s\n", d.LastError)
			}
			if d.State == wire.Queued && d.ClaimableAtMS > time.Now().UnixMilli() {
				fmt.Fprintf(w, "retry at\t%s\n", time.UnixMilli(d.ClaimableAtMS).UTC().Format(time.RFC3339))
			}
			for _, a := range d.AttemptLog {
				fmt.Fprintf(w, "attempt\t#%d by %s at generation %d: %s (%s, cost %d)\n", a.Attempt, dash(a.Worker), a.Generation, a.Reason, a.Outcome, a.Cost)
			}
			for _, r := range d.Receipts {
				fmt.Fprintf(w, "receipt\t#%d %s %s cost %d  %s\n", r.Sequence, r.Kind, r.Decision, r.Cost, r.ID)
			}
			return nil
		})
	case "cancel", "reconcile", "requeue":
		op, err := one()
		if err != nil {
			return err
		}
		raw, err := c.call(ctx, "POST", "/admin/jobs/"+op+"/"+cmd, nil)
		if err != nil {
			return err
		}
		return c.show(raw, func(w *tabwriter.Writer) error { return keyValues(w, raw) })
	case "allowance":
		if len(args) != 1 {
			return fmt.Errorf("allowance takes the new allowance")
		}
		n, err := strconv.ParseInt(args[0], 10, 64)
		if err != nil {
			return fmt.Errorf("allowance %q is not a whole number", args[0])
		}
		raw, err := c.call(ctx, "GET", "/admin/stats", nil)
		if err != nil {
			return err
		}
		var st struct{ Accounting wire.Accounting }
		if err := json.Unmarshal(raw, &st); err != nil {
			return err
		}
		raw, err = c.call(ctx, "POST", "/admin/allowance", map[string]int64{"expected_allowance": st.Accounting.Allowance, "allowance": n})
		if err != nil {
			return err
		}
		return c.show(raw, func(w *tabwriter.Writer) error { return keyValues(w, raw) })
	case "events":
		return c.events(ctx, args)
	case "submit":
		return c.submit(ctx, args)
	case "assign":
		return c.assign(ctx, args)
	case "credentials":
		return c.credentials(ctx, args)
	}
	return fmt.Errorf("unknown command %q\n%s", cmd, usage)
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// keyValues prints a flat JSON object as aligned key/value lines.
func keyValues(w *tabwriter.Writer, raw []byte) error {
	var m map[string]any
	if err := json.Unmarshal(raw, &m); err != nil {
		return err
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		v, _ := json.Marshal(m[k])
		fmt.Fprintf(w, "%s\t%s\n", k, strings.Trim(string(v), `"`))
	}
	return nil
}

func (c *ctl) printEvent(e wire.Event) {
	if c.json {
		line, _ := json.Marshal(e)
		fmt.Fprintln(c.out, string(line))
		return
	}
	fmt.Fprintf(c.out, "%4d  %s  %-24s %-9s %s\n", e.Sequence, time.UnixMilli(e.TimestampMS).UTC().Format("15:04:05.000"), e.Kind, e.Actor, e.Title)
}

func (c *ctl) events(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("events", flag.ContinueOnError)
	after := fs.Int64("after", 0, "only events after this sequence number")
	follow := fs.Bool("follow", false, "keep streaming new events")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if !*follow {
		for {
			raw, err := c.call(ctx, "GET", fmt.Sprintf("/admin/events?after=%d", *after), nil)
			if err != nil {
				return err
			}
			var page wire.EventPage
			if err := json.Unmarshal(raw, &page); err != nil {
				return err
			}
			for _, e := range page.Events {
				c.printEvent(e)
				*after = e.Sequence
			}
			if len(page.Events) == 0 {
				return nil
			}
		}
	}
	req, err := http.NewRequestWithContext(ctx, "GET", fmt.Sprintf("%s/admin/events/stream?after=%d", c.base, *after), nil)
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+c.token)
	resp, err := (&http.Client{}).Do(req) // no timeout: a stream
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		return &client.Error{Status: resp.StatusCode, Code: "stream", Message: resp.Status}
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		data, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok {
			continue
		}
		var e wire.Event
		if err := json.Unmarshal([]byte(data), &e); err == nil {
			c.printEvent(e)
		}
	}
	if ctx.Err() != nil {
		return nil // interrupted by the user
	}
	return sc.Err()
}

func (c *ctl) submit(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("submit", flag.ContinueOnError)
	docPath := fs.String("document", "", "file with the document text")
	sections := fs.String("sections", "", "comma-separated sections: summary, terms, actions, links")
	key := fs.String("key", "", "idempotency key (default: a new one); repeat it to resubmit safely")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *docPath == "" || *sections == "" {
		return fmt.Errorf("submit needs --document FILE and --sections a,b")
	}
	doc, err := os.ReadFile(*docPath)
	if err != nil {
		return err
	}
	if *key == "" {
		*key = uuid.NewString()
	}
	raw, err := c.call(ctx, "POST", "/admin/reports", map[string]any{
		"document": string(doc), "sections": strings.Split(*sections, ","), "idempotency_key": *key})
	if err != nil {
		return err
	}
	return c.show(raw, func(w *tabwriter.Writer) error {
		var res wire.ReportsResult
		if err := json.Unmarshal(raw, &res); err != nil {
			return err
		}
		fmt.Fprintf(w, "idempotency key\t%s\n", *key)
		for _, op := range res.OperationIDs {
			fmt.Fprintf(w, "queued\t%s\n", op)
		}
		return nil
	})
}
