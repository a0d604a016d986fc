package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net/url"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/fleet/fleet/internal/cli"
	"github.com/fleet/fleet/internal/wire"
)

// reportCommand shows a submitted report as a tree of what waits for
// what (GET /admin/reports/{key}), or cancels it.
func (c *ctl) reportCommand() *cobra.Command {
	var cancel bool
	cmd := &cobra.Command{
		Use:   "report KEY [--cancel]",
		Short: "A report's sections as a tree of what waits for what, each with its state; or cancel the report",
		Example: `  fleetctl report q3              # the overview, then beneath it each section it waits for
  fleetctl --json report q3 | jq '.sections[] | select(.state == "blocked")'
  fleetctl report q3 --cancel     # cancels its blocked, queued, claimed and running jobs`,
		Args: cli.Args(1, "the report's key (the idempotency key it was submitted with)"),
		RunE: func(cmd *cobra.Command, a []string) error {
			path := "/admin/reports/" + url.PathEscape(a[0])
			if cancel {
				raw, err := c.call(cmd.Context(), "POST", path+"/cancel", nil)
				if err != nil {
					return err
				}
				return c.show(raw, func(w *tabwriter.Writer) error {
					var res wire.ReportCancellation
					if err := json.Unmarshal(raw, &res); err != nil {
						return err
					}
					fmt.Fprintf(w, "%d cancelled, %d unchanged (finished already)\n", len(res.Cancelled), len(res.Unchanged))
					for _, op := range res.Cancelled {
						fmt.Fprintf(w, "cancelled\t%s\n", op)
					}
					for _, op := range res.Unchanged {
						fmt.Fprintf(w, "unchanged\t%s\n", op)
					}
					return nil
				})
			}
			raw, err := c.call(cmd.Context(), "GET", path, nil)
			if err != nil {
				return err
			}
			return c.show(raw, func(w *tabwriter.Writer) error {
				var r wire.Report
				if err := json.Unmarshal(raw, &r); err != nil {
					return err
				}
				fmt.Fprintf(w, "report %s, %d sections, submitted %s\n", wire.EscapeText(r.Key), len(r.Sections), when(r.CreatedAtMS))
				writeTree(w, r.Sections)
				return nil
			})
		},
	}
	cmd.Flags().BoolVar(&cancel, "cancel", false, "cancel the report's jobs that have not finished")
	return cmd
}

// writeTree writes a report's sections as a tree: each section nothing
// waits for at the top, each section it waits for beneath it (one waited
// for by several appears under each).
func writeTree(w io.Writer, sections []wire.ReportSection) {
	bySection := map[string]wire.ReportSection{}
	waitedFor := map[string]bool{}
	for _, s := range sections {
		bySection[s.Section] = s
		for _, d := range s.After {
			waitedFor[d] = true
		}
	}
	var walk func(s wire.ReportSection, prefix, branch string)
	walk = func(s wire.ReportSection, prefix, branch string) {
		line := fmt.Sprintf("%s%s%s\t%s\t%s", prefix, branch, s.Section, s.State, s.OperationID)
		if s.State == wire.Blocked {
			line += fmt.Sprintf("\twaits for %d", s.WaitingOn)
		}
		fmt.Fprintln(w, line)
		next := prefix + strings.Map(func(r rune) rune { return ' ' }, branch)
		if branch == "├── " {
			next = prefix + "│   "
		}
		for i, d := range s.After {
			b := "├── "
			if i == len(s.After)-1 {
				b = "└── "
			}
			walk(bySection[d], next, b)
		}
	}
	for _, s := range sections {
		if !waitedFor[s.Section] {
			walk(s, "", "")
		}
	}
}
