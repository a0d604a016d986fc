package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/fleet/fleet/internal/wire"
)

// How fleetctl prints what the host answered: as it came with --json, else
// as aligned tables, every time a UTC time and every text of outside
// origin escaped onto its line.

// show prints raw JSON with --json, else the table that table writes.
func (c *ctl) show(raw []byte, table func(w *tabwriter.Writer) error) error {
	if c.json {
		var buf bytes.Buffer
		// Trimmed: Indent keeps the answer's own final newline, which
		// Fprintln would follow with a blank line.
		if err := json.Indent(&buf, bytes.TrimSpace(raw), "", "  "); err != nil {
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

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// when is a time in Unix ms as a reader wants it: RFC 3339 in UTC, "-"
// for 0 (not yet).
func when(ms int64) string {
	if ms <= 0 {
		return "-"
	}
	return time.UnixMilli(ms).UTC().Format("2006-01-02T15:04:05.000Z")
}

// timesInMS are the fields in Unix ms that are times, besides those
// ending _at_ms (backoff_base_ms and backoff_cap_ms are durations).
var timesInMS = map[string]bool{"at_ms": true, "last_seen_ms": true, "last_slot_ms": true, "now_ms": true,
	"period_start_ms": true, "timestamp_ms": true}

// keyValues prints a flat JSON object as aligned key/value lines; a time
// in Unix ms (a key ending _at_ms, or one of timesInMS) is shown as a time
// too.
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
		text := wire.EscapeText(strings.Trim(string(v), `"`))
		if ms, ok := m[k].(float64); ok && (strings.HasSuffix(k, "_at_ms") || timesInMS[k]) && ms > 0 {
			text += " (" + when(int64(ms)) + ")"
		}
		fmt.Fprintf(w, "%s\t%s\n", k, text)
	}
	return nil
}

func (c *ctl) printEvent(e wire.Event) {
	if c.json {
		line, _ := json.Marshal(e)
		fmt.Fprintln(c.out, string(line))
		return
	}
	fmt.Fprintf(c.out, "%4d  %s  %-24s %-9s %s\n", e.Sequence, time.UnixMilli(e.TimestampMS).UTC().Format("15:04:05.000"), e.Kind, wire.EscapeText(e.Actor), wire.EscapeText(e.Title))
}
