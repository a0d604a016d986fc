package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/url"
	"os"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/fleet/fleet/internal/cli"
	"github.com/fleet/fleet/internal/wire"
)

// schedulesCommand lists the recurring reports (GET /admin/schedules).
func (c *ctl) schedulesCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "schedules",
		Short: "Every recurring report: its schedule, its next slot, how often it has fired, and whether it is paused",
		Args:  cli.Args(0, "no arguments"),
		RunE: func(cmd *cobra.Command, _ []string) error {
			raw, err := c.call(cmd.Context(), "GET", "/admin/schedules", nil)
			if err != nil {
				return err
			}
			return c.show(raw, func(w *tabwriter.Writer) error {
				var l wire.SchedulesList
				if err := json.Unmarshal(raw, &l); err != nil {
					return err
				}
				fmt.Fprintln(w, "NAME\tSCHEDULE\tSECTIONS\tTENANT\tNEXT\tFIRED\tPAUSED")
				for _, s := range l.Schedules {
					fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%d\t%v\n", s.Name, s.Schedule, strings.Join(s.Report.Sections, ","), reportTenant(s.Report),
						when(s.NextAtMS), s.Fired, s.Paused)
				}
				return nil
			})
		},
	}
}

// scheduleCommand adds, pauses, resumes or removes a recurring report.
func (c *ctl) scheduleCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "schedule add NAME --cron SPEC --document FILE --sections a,b [...] | schedule pause|resume|remove NAME",
		Short: "Add a recurring report, or pause, resume or remove one",
	}
	var spec, docPath, sections, tenant string
	var after []string
	var priority int64
	var retryPolicy func(*cobra.Command) (wire.RetryPolicy, error)
	add := &cobra.Command{
		Use:   "add NAME --cron SPEC --document FILE --sections a,b [--after SECTION=DEP,DEP]... [--tenant NAME] [--priority P] [--max-attempts N --backoff-base D --backoff-cap D]",
		Short: "Add a recurring report: at each slot of its schedule (UTC) a host submits the report once",
		Example: `  fleetctl schedule add weekly --cron "0 9 * * 1" --document notes.md --sections summary,terms   # Mondays at 09:00 UTC
  fleetctl schedule add digest --cron "@every 6h" --document notes.md --sections overview,summary,links --after overview=summary,links`,
		Args: cli.Args(1, "the schedule's name"),
		RunE: func(cmd *cobra.Command, a []string) error {
			if spec == "" || docPath == "" || sections == "" {
				return cli.Usage(errors.New("schedule add needs --cron SPEC, --document FILE and --sections a,b"))
			}
			doc, err := os.ReadFile(docPath)
			if err != nil {
				return err
			}
			deps, err := parseAfter(after)
			if err != nil {
				return err
			}
			retry, err := retryPolicy(cmd)
			if err != nil {
				return err
			}
			document := string(doc)
			report := &wire.ReportsRequest{Document: &document, Sections: strings.Split(sections, ","), After: deps, RetryPolicy: retry}
			if cmd.Flags().Changed("tenant") {
				report.Tenant = &tenant
			}
			if cmd.Flags().Changed("priority") {
				report.Priority = &priority
			}
			raw, err := c.call(cmd.Context(), "POST", "/admin/schedules", wire.ScheduleRequest{Name: &a[0], Schedule: &spec, Report: report})
			if err != nil {
				return err
			}
			return c.show(raw, func(w *tabwriter.Writer) error { return showSchedule(w, raw) })
		},
	}
	add.Flags().StringVar(&spec, "cron", "", `when: a cron expression in UTC ("0 9 * * 1") or a descriptor ("@daily", "@every 2h"); at most once a minute`)
	add.Flags().StringVar(&docPath, "document", "", "file with the document text")
	add.Flags().StringVar(&sections, "sections", "", "comma-separated sections: summary, terms, actions, links, overview")
	add.Flags().StringArrayVar(&after, "after", nil, "SECTION=DEP,DEP: the section waits for those of the report; repeat for more")
	add.Flags().StringVar(&tenant, "tenant", wire.DefaultTenant, "the tenant whose allowance the reports spend")
	add.Flags().Int64Var(&priority, "priority", wire.DefaultPriority, "the jobs' priority, 1 (claimed first) to 4")
	retryPolicy = retryFlags(add.Flags())
	cmd.AddCommand(add)
	for _, verb := range []string{"pause", "resume", "remove"} {
		cmd.AddCommand(&cobra.Command{
			Use: verb + " NAME",
			Short: map[string]string{"pause": "Pause a schedule: no slot fires until it resumes", "resume": "Resume a schedule from its next slot",
				"remove": "Remove a schedule (the reports it submitted stay)"}[verb],
			Args: cli.Args(1, "the schedule's name"),
			RunE: func(cmd *cobra.Command, a []string) error {
				method, path := "POST", "/admin/schedules/"+url.PathEscape(a[0])+"/"+verb
				if verb == "remove" {
					method, path = "DELETE", "/admin/schedules/"+url.PathEscape(a[0])
				}
				raw, err := c.call(cmd.Context(), method, path, nil)
				if err != nil {
					return err
				}
				return c.show(raw, func(w *tabwriter.Writer) error { return showSchedule(w, raw) })
			},
		})
	}
	return cmd
}

// showSchedule prints one schedule as key-value lines.
func showSchedule(w *tabwriter.Writer, raw []byte) error {
	var s wire.Schedule
	if err := json.Unmarshal(raw, &s); err != nil {
		return err
	}
	fmt.Fprintf(w, "schedule\t%s\nwhen\t%s (UTC)\nsections\t%s\n", s.Name, s.Schedule, strings.Join(s.Report.Sections, ","))
	fmt.Fprintf(w, "tenant\t%s\n", reportTenant(s.Report))
	if s.Report.Priority != nil {
		fmt.Fprintf(w, "priority\t%d\n", *s.Report.Priority)
	}
	for _, section := range slices.Sorted(maps.Keys(s.Report.After)) {
		fmt.Fprintf(w, "after\t%s=%s\n", section, strings.Join(s.Report.After[section], ","))
	}
	if r := s.Report.RetryPolicy; r.MaxAttempts != nil || r.BackoffBaseMS != nil || r.BackoffCapMS != nil {
		fmt.Fprintf(w, "retries\t%s attempts, backoff %s to %s\n", orState(r.MaxAttempts, func(n int64) string { return fmt.Sprint(n) }), orState(r.BackoffBaseMS, msText), orState(r.BackoffCapMS, msText))
	}
	fmt.Fprintf(w, "next\t%s\nfired\t%d\npaused\t%v\n", when(s.NextAtMS), s.Fired, s.Paused)
	return nil
}

// orState shows a retry policy's field, or "the state's" when left out.
func orState(v *int64, show func(int64) string) string {
	if v == nil {
		return "the state's"
	}
	return show(*v)
}

func msText(ms int64) string { return (time.Duration(ms) * time.Millisecond).String() }

// reportTenant is the tenant a schedule's reports spend: the one it names,
// or the tenant default.
func reportTenant(r wire.ReportsRequest) string {
	if r.Tenant != nil {
		return *r.Tenant
	}
	return wire.DefaultTenant
}
