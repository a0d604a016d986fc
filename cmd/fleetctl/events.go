package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/fleet/fleet/internal/cli"
	"github.com/fleet/fleet/internal/client"
	"github.com/fleet/fleet/internal/retry"
	"github.com/fleet/fleet/internal/wire"
)

// eventsCommand prints the event log, or follows it live.
func (c *ctl) eventsCommand() *cobra.Command {
	var after int64
	var follow bool
	var only eventFilter
	cmd := &cobra.Command{
		Use: "events",
		Short: "Print the event log; --kind and --job print the newest events of a kind or a job from the whole log; " +
			"--follow streams new events as they commit, reconnecting when the stream ends",
		Example: `  fleetctl events --after 100
  fleetctl events --kind fleet.failed
  fleetctl events --job 019a2420-b1c3-7def-8123-456789abcdef
  fleetctl events --follow --kind fleet.lease_expired`,
		Args: cli.Args(0, "no arguments"),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if only.limit < 1 || only.limit > 1000 {
				return cli.Usage(fmt.Errorf("--limit %d: give 1 to 1000", only.limit))
			}
			return c.events(cmd.Context(), &after, &follow, only)
		},
	}
	cmd.Flags().Int64Var(&after, "after", 0, "only events after this sequence number")
	cmd.Flags().BoolVar(&follow, "follow", false, "keep streaming new events")
	cmd.Flags().StringVar(&only.kind, "kind", "", "only events of this kind (e.g. fleet.failed), the newest --limit of them")
	cmd.Flags().StringVar(&only.job, "job", "", "only events about this job (its operation id), the newest --limit of them")
	cmd.Flags().IntVar(&only.limit, "limit", 1000, "with --kind or --job, how many of the newest to print")
	return cmd
}

// eventFilter is events' --kind, --job and --limit.
type eventFilter struct {
	kind, job string
	limit     int
}

func (f eventFilter) set() bool { return f.kind != "" || f.job != "" }

func (f eventFilter) takes(e wire.Event) bool {
	return (f.kind == "" || string(e.Kind) == f.kind) && (f.job == "" || e.OperationID == f.job)
}

func (c *ctl) events(ctx context.Context, after *int64, follow *bool, only eventFilter) error {
	if only.set() {
		return c.filteredEvents(ctx, after, *follow, only)
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
	return c.follow(ctx, after, eventFilter{})
}

// filteredEvents prints the newest events of a kind or job, which the host
// reads from its whole log through an index, and with follow goes on from
// the log's head as it was, printing only the new events that match.
func (c *ctl) filteredEvents(ctx context.Context, after *int64, follow bool, only eventFilter) error {
	page := func(query url.Values) ([]wire.Event, error) {
		raw, err := c.call(ctx, "GET", "/admin/events?"+query.Encode(), nil)
		if err != nil {
			return nil, err
		}
		var p wire.EventPage
		return p.Events, json.Unmarshal(raw, &p)
	}
	// The head first, so that nothing committed between the two reads is
	// missed by the follow or printed twice.
	newest, err := page(url.Values{"before": {strconv.FormatInt(math.MaxInt64, 10)}, "limit": {"1"}})
	if err != nil {
		return err
	}
	head := int64(0)
	if len(newest) > 0 {
		head = newest[0].Sequence
	}
	q := url.Values{"after": {strconv.FormatInt(*after, 10)}, "before": {strconv.FormatInt(head+1, 10)},
		"limit": {strconv.Itoa(only.limit)}}
	if only.kind != "" {
		q.Set("kind", only.kind)
	}
	if only.job != "" {
		q.Set("job", only.job)
	}
	evs, err := page(q)
	if err != nil {
		return err
	}
	for _, e := range evs {
		c.printEvent(e)
	}
	if !follow {
		return nil
	}
	*after = max(*after, head)
	return c.follow(ctx, after, only)
}

// Reconnection delays of events --follow: doubled after each attempt that
// got nothing, back to the first once events arrive.
const (
	followRetryFirst = 250 * time.Millisecond
	followRetryMax   = 10 * time.Second
)

// follow streams the event log from after on, for as long as fleetctl
// runs: when the stream ends (the host stopped, the network dropped, the
// host closed it), it says so on stderr and reconnects with backoff,
// resuming after the last event it printed (Last-Event-ID), so no event is
// printed twice or skipped. A refusal (a revoked credential, say) ends it.
func (c *ctl) follow(ctx context.Context, after *int64, only eventFilter) error {
	waits := retry.New(followRetryFirst, followRetryMax)
	for {
		got, why, err := c.streamOnce(ctx, after, only)
		if ctx.Err() != nil {
			return nil // interrupted by the user
		}
		var refused *client.Error
		if errors.As(err, &refused) && refused.Code != "" && refused.Code != wire.CodeUnavailable && refused.Code != wire.CodeRateLimited {
			return err
		}
		if err != nil {
			why = err.Error()
		}
		if got > 0 {
			waits.Reset()
		}
		wait := waits.NextBackOff().Round(time.Millisecond)
		fmt.Fprintf(c.errOut, "fleetctl: the event stream ended (%s); reconnecting in %s, after event %d\n", why, wait, *after)
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(wait):
		}
	}
}

// streamOnce reads one event stream until it ends: how many events it
// printed, and why it ended (the host's closing comment, if it sent one).
func (c *ctl) streamOnce(ctx context.Context, after *int64, only eventFilter) (got int, why string, err error) {
	req, err := http.NewRequestWithContext(ctx, "GET", fmt.Sprintf("%s/admin/events/stream?after=%d", c.base, *after), nil)
	if err != nil {
		return 0, "", err
	}
	req.Header.Set("Authorization", "Bearer "+c.token)
	req.Header.Set("Last-Event-ID", strconv.FormatInt(*after, 10))
	resp, err := c.stream.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		data, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
		var e wire.ErrorBody
		json.Unmarshal(data, &e) // not ours: the code stays empty
		return 0, "", &client.Error{Status: resp.StatusCode, Code: e.Error.Code, Message: e.Error.Message, Body: data}
	}
	why = "the host closed the connection"
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	var data string
	for sc.Scan() {
		line := sc.Text()
		switch {
		case line == "":
			var e wire.Event
			if data != "" && json.Unmarshal([]byte(data), &e) == nil && e.Sequence > *after {
				if only.takes(e) {
					c.printEvent(e)
				}
				*after, got = e.Sequence, got+1
			}
			data = ""
		case strings.HasPrefix(line, "data: "):
			data += strings.TrimPrefix(line, "data: ")
		case strings.HasPrefix(line, ": closed: "):
			why = wire.EscapeText(strings.TrimPrefix(line, ": closed: "))
		}
	}
	if err := sc.Err(); err != nil {
		return got, "", err
	}
	return got, why, nil
}
