package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/fleet/fleet/internal/cli"
	"github.com/fleet/fleet/internal/receipts"
	"github.com/fleet/fleet/internal/wire"
)

// notVerified is a receipt that did not verify: exit 3, so a script can
// tell it from a refusal (1) and a usage or connection error (2).
type notVerified struct{ error }

// receiptCommand shows a receipt, or verifies it.
func (c *ctl) receiptCommand() *cobra.Command {
	var trusted string
	cmd := &cobra.Command{
		Use:   "receipt show|verify RECEIPT_ID",
		Short: "Show a signed receipt, or verify its id, signature, kernel key and chain link",
		Long: `receipt show prints a receipt as stored. receipt verify checks it: with
--trusted-kernel (the state directory's trusted-kernel.json, or a copy of it
kept apart from the host) the id, kernel key and signature are checked here,
so a host that lies cannot pass its own check; the chain link is the host's
check (it needs the receipt before). Exit 3 when it does not verify.`,
		Example: `  fleetctl receipt show rcpt-6f1c…
  fleetctl receipt verify rcpt-6f1c… --trusted-kernel /tmp/fleet/trusted-kernel.json`,
		ValidArgs: []string{"show", "verify"},
		Args:      cli.Args(2, "show|verify and a receipt id"),
		RunE: func(cmd *cobra.Command, a []string) error {
			id := url.PathEscape(a[1])
			switch a[0] {
			case "show":
				raw, err := c.call(cmd.Context(), "GET", "/admin/receipts/"+id, nil)
				if err != nil {
					return err
				}
				return c.show(raw, func(w *tabwriter.Writer) error { return keyValues(w, raw) })
			case "verify":
				raw, err := c.call(cmd.Context(), "GET", "/admin/receipts/"+id+"/verification", nil)
				if err != nil {
					return err
				}
				var check wire.ReceiptCheck
				if err := json.Unmarshal(raw, &check); err != nil {
					return err
				}
				checkedHere := ""
				if trusted != "" {
					key, err := trustedKey(trusted)
					if err != nil {
						return cli.Usage(err)
					}
					if err := receipts.Verify(check.Receipt, key); err != nil {
						check.Problems = append(check.Problems, "checked here: "+err.Error())
					}
					checkedHere = key
				}
				if err := c.show(raw, func(w *tabwriter.Writer) error {
					fmt.Fprintf(w, "receipt\t%s\nkind\t%s\ndecision\t%s\noperation\t%s\nsequence\t%d\n", check.Receipt.ID,
						check.Receipt.Kind, check.Receipt.Decision, wire.EscapeText(check.Receipt.OperationID), check.Receipt.Sequence)
					fmt.Fprintf(w, "id matches body\t%v\nsignature valid\t%v\nkernel trusted\t%v\nchain linked\t%v\n",
						check.IDMatchesBody, check.SignatureValid, check.KernelTrusted, check.Chain.Linked)
					if checkedHere != "" {
						fmt.Fprintf(w, "checked here with\t%s\n", checkedHere)
					} else {
						fmt.Fprintln(w, "checked by\tthe host (pass --trusted-kernel to check here)")
					}
					return nil
				}); err != nil {
					return err
				}
				if len(check.Problems) > 0 {
					return notVerified{fmt.Errorf("receipt %s does not verify: %s", check.Receipt.ID, strings.Join(check.Problems, "; "))}
				}
				return nil
			}
			return cli.Usage(fmt.Errorf("receipt takes show or verify, not %q", a[0]))
		},
	}
	cmd.Flags().StringVar(&trusted, "trusted-kernel", "", "trusted-kernel.json to verify the signature against here")
	return cmd
}

// trustedKey reads the kernel's public key from a trusted-kernel.json.
func trustedKey(path string) (string, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	var k wire.TrustedKernel
	if err := json.Unmarshal(data, &k); err != nil || k.PublicKey == "" {
		return "", fmt.Errorf("%s is not a trusted-kernel.json (no public_key)", path)
	}
	return k.PublicKey, nil
}

// statsCommand prints the host's counters.
func (c *ctl) statsCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "stats",
		Short: "Counts by state, the allowance, and the storage counters",
		Example: `  fleetctl stats
  fleetctl --json stats | jq .storage.commits`,
		Args: cli.Args(0, "no arguments"),
		RunE: func(cmd *cobra.Command, _ []string) error {
			raw, err := c.call(cmd.Context(), "GET", "/admin/stats", nil)
			if err != nil {
				return err
			}
			return c.show(raw, func(w *tabwriter.Writer) error {
				var st wire.Stats
				if err := json.Unmarshal(raw, &st); err != nil {
					return err
				}
				a, s := st.Accounting, st.Storage
				claims := "running"
				if st.Claims.Paused {
					claims = "paused since " + time.UnixMilli(st.Claims.AtMS).UTC().Format(time.RFC3339) + ": " + wire.EscapeText(st.Claims.Reason)
				}
				fmt.Fprintf(w, "host time\t%s\nclaims\t%s\njobs\t%s\n", time.UnixMilli(st.NowMS).UTC().Format(time.RFC3339), claims, countsText(st.Jobs))
				fmt.Fprintf(w, "allowance\t%d spent, %d reserved, %d available of %d %s\n", a.Spent, a.Reserved, a.Available, a.Allowance, a.Unit)
				fmt.Fprintf(w, "mutations\t%d\nevents\t%d\n", st.Mutations, st.Events)
				fmt.Fprintf(w, "write transactions\t%d\ncommits\t%d\nretries\t%d\ncheckpoints\t%d\nround trips\t%d\n",
					s.WriteTransactions, s.Commits, s.Retries, s.Checkpoints, s.RoundTrips)
				return nil
			})
		},
	}
}

// snapshotCommand exports the whole state as the host reads it.
func (c *ctl) snapshotCommand() *cobra.Command {
	var output string
	cmd := &cobra.Command{
		Use:   "snapshot [--output FILE]",
		Short: "Export a snapshot: every job, the accounting and the log's heads, as JSON",
		Example: `  fleetctl snapshot --output fleet-snapshot.json
  fleetctl snapshot | jq '.jobs | length'`,
		Args: cli.Args(0, "no arguments"),
		RunE: func(cmd *cobra.Command, _ []string) error {
			raw, err := c.call(cmd.Context(), "GET", "/admin/snapshot", nil)
			if err != nil {
				return err
			}
			if output == "" {
				_, err := c.out.Write(append(raw, '\n'))
				return err
			}
			if err := os.WriteFile(output, append(raw, '\n'), 0o600); err != nil {
				return err
			}
			if c.json {
				line, _ := json.Marshal(map[string]any{"wrote": output, "bytes": len(raw) + 1})
				_, err := fmt.Fprintln(c.out, string(line))
				return err
			}
			fmt.Fprintf(c.out, "wrote %s (%d bytes)\n", output, len(raw)+1)
			return nil
		},
	}
	cmd.Flags().StringVarP(&output, "output", "o", "", "write to this file (default: standard output)")
	return cmd
}

// addCredential adds a worker credential over the API.
func (c *ctl) addCredential(cmd *cobra.Command, name string, allowance *int64, tenants []string) error {
	raw, err := c.call(cmd.Context(), "POST", "/admin/credentials", wire.CredentialAddRequest{Name: &name, Allowance: allowance, Tenants: tenants})
	if err != nil {
		return err
	}
	return c.show(raw, func(w *tabwriter.Writer) error {
		var ch wire.CredentialChange
		if err := json.Unmarshal(raw, &ch); err != nil {
			return err
		}
		if ch.Token == "" {
			return errors.New("the host's answer carries no token")
		}
		return showCredentialChange(w, ch)
	})
}

// showCredentialChange prints an added, revoked or rotated credential a
// field a line; a new token with the file it was written to.
func showCredentialChange(w *tabwriter.Writer, ch wire.CredentialChange) error {
	fmt.Fprintf(w, "credential\t%s\nrole\t%s\nchanged\t%v\n", ch.Credential.Name, ch.Credential.Role, ch.Changed)
	if ch.Credential.RevokedAtMS != 0 {
		fmt.Fprintf(w, "revoked\t%s\n", when(ch.Credential.RevokedAtMS))
	}
	if ch.ReceiptID != "" {
		fmt.Fprintf(w, "receipt\t%s\n", ch.ReceiptID)
	}
	if ch.Token != "" {
		fmt.Fprintf(w, "token\t%s\nfile\tcredentials/%s in the serving host's state directory\n", ch.Token, ch.Credential.Name)
	}
	if a := ch.Credential.Allowance; a != nil {
		fmt.Fprintf(w, "allowance\t%d\n", *a)
	}
	fmt.Fprintf(w, "tenants\t%s\n", tenantsOf(ch.Credential.Tenants))
	return nil
}

// pauseCommand pauses claims; resumeCommand resumes them.
func (c *ctl) pauseCommand() *cobra.Command {
	var reason string
	cmd := &cobra.Command{
		Use:   "pause [--reason TEXT]",
		Short: "Pause claims on every host: no job is handed out until resume; jobs in flight go on",
		Example: `  fleetctl pause --reason "incident 42: the model endpoint is down"
  fleetctl resume`,
		Args: cli.Args(0, "no arguments"),
		RunE: func(cmd *cobra.Command, _ []string) error {
			var body any
			if reason != "" {
				body = wire.ClaimsPauseRequest{Reason: &reason}
			}
			return c.claimsChange(cmd, "pause", body)
		},
	}
	cmd.Flags().StringVar(&reason, "reason", "", "why, for the event log and the receipt's event")
	return cmd
}

func (c *ctl) resumeCommand() *cobra.Command {
	return &cobra.Command{
		Use:     "resume",
		Short:   "Resume claims paused with pause",
		Example: "  fleetctl resume",
		Args:    cli.Args(0, "no arguments"),
		RunE:    func(cmd *cobra.Command, _ []string) error { return c.claimsChange(cmd, "resume", nil) },
	}
}

func (c *ctl) claimsChange(cmd *cobra.Command, verb string, body any) error {
	raw, err := c.call(cmd.Context(), "POST", "/admin/claims/"+verb, body)
	if err != nil {
		return err
	}
	return c.show(raw, func(w *tabwriter.Writer) error {
		var st wire.ClaimsState
		if err := json.Unmarshal(raw, &st); err != nil {
			return err
		}
		state := "running"
		if st.Paused {
			state = "paused"
		}
		fmt.Fprintf(w, "claims\t%s\nchanged\t%v\n", state, st.Changed)
		if st.Reason != "" {
			fmt.Fprintf(w, "reason\t%s\n", wire.EscapeText(st.Reason))
		}
		if st.ReceiptID != "" {
			fmt.Fprintf(w, "receipt\t%s\n", st.ReceiptID)
		}
		return nil
	})
}

// bulkCommand cancels or requeues every job a filter selects, a bounded
// number a call, each job its own operation.
func (c *ctl) bulkCommand() *cobra.Command {
	var f wire.JobFilter
	var state string
	var dryRun, yes bool
	var reason string
	cmd := &cobra.Command{
		Use:   "bulk cancel|requeue|reconcile [--state S] [--section S] [--owner W] [--priority P] [--tenant T] [--q ID] [--dry-run] --yes",
		Short: "Cancel, requeue or reconcile every job a filter selects; each job is its own operation, refused alone",
		Example: `  fleetctl bulk requeue --state failed --dry-run   # how many
  fleetctl bulk requeue --state failed --yes
  fleetctl bulk cancel --owner worker-3 --yes
  fleetctl bulk reconcile --state unresolved --yes`,
		ValidArgs: []string{"cancel", "requeue", "reconcile"},
		Args:      cli.Args(1, "cancel, requeue or reconcile"),
		RunE: func(cmd *cobra.Command, a []string) error {
			f.State = wire.JobState(state)
			if !dryRun && !yes {
				return cli.Usagef("bulk %s acts on every job the filter selects: say --yes (or count them with --dry-run)", a[0])
			}
			total := wire.BulkResult{Action: a[0], Refused: map[wire.Code]int64{}, Results: []wire.BulkItem{}}
			for after := ""; ; {
				raw, err := c.call(cmd.Context(), "POST", "/admin/jobs/bulk", wire.BulkRequest{Action: a[0], Filter: f, After: after, DryRun: dryRun, Reason: reason})
				if err != nil {
					return err
				}
				var res wire.BulkResult
				if err := json.Unmarshal(raw, &res); err != nil {
					return err
				}
				total.Matched, total.Applicable, total.Done = total.Matched+res.Matched, total.Applicable+res.Applicable, total.Done+res.Done
				for code, n := range res.Refused {
					total.Refused[code] += n
				}
				total.Results = append(total.Results, res.Results...)
				if after = res.Next; after == "" {
					break
				}
			}
			raw, err := json.Marshal(total)
			if err != nil {
				return err
			}
			return c.show(raw, func(w *tabwriter.Writer) error {
				fmt.Fprintf(w, "matched\t%d\n", total.Matched)
				if dryRun {
					fmt.Fprintf(w, "would act on\t%d (the rest are in states %s does not take)\n", total.Applicable, a[0])
					fmt.Fprintln(w, "done\tnothing (a dry run)")
					return nil
				}
				fmt.Fprintf(w, "done\t%d\n", total.Done)
				for code, n := range total.Refused {
					fmt.Fprintf(w, "refused %s\t%d\n", code, n)
				}
				return nil
			})
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&state, "state", "", "only jobs in this state")
	fl.StringVar(&reason, "reason", "", "why, for each job's event (one line)")
	fl.StringVar(&f.Section, "section", "", "only this section's jobs")
	fl.StringVar(&f.Owner, "owner", "", "only jobs whose document this worker holds")
	fl.Int64Var(&f.Priority, "priority", 0, "only jobs of this priority, 1 to 4 (0: any)")
	fl.StringVar(&f.Tenant, "tenant", "", "only this tenant's jobs")
	fl.StringVar(&f.Q, "q", "", "only jobs whose operation id starts so")
	fl.BoolVar(&dryRun, "dry-run", false, "count the jobs the filter selects; do nothing")
	fl.BoolVar(&yes, "yes", false, "act on them: required, since a filter may select many")
	return cmd
}

// workersCommand lists the worker credentials and what their jobs say of
// them (GET /admin/workers), as the console's workers view does.
func (c *ctl) workersCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "workers",
		Short: "Every worker credential: alive or not, last seen, jobs held, completed and failed lately",
		Example: `  fleetctl workers
  fleetctl --json workers | jq '.workers[] | select(.alive) | .name'`,
		Args: cli.Args(0, "no arguments"),
		RunE: func(cmd *cobra.Command, _ []string) error {
			raw, err := c.call(cmd.Context(), "GET", "/admin/workers", nil)
			if err != nil {
				return err
			}
			return c.show(raw, func(w *tabwriter.Writer) error {
				var ws wire.Workers
				if err := json.Unmarshal(raw, &ws); err != nil {
					return err
				}
				fmt.Fprintf(w, "WORKER\tALIVE\tLAST SEEN\tHELD\tCOMPLETED\tFAILED\tREVOKED\n")
				for _, v := range ws.Workers {
					fmt.Fprintf(w, "%s\t%t\t%s\t%d\t%d\t%d\t%s\n", wire.EscapeText(v.Name), v.Alive, when(v.LastSeenMS), v.Held,
						v.CompletedInWindow, v.FailedInWindow, when(v.RevokedAtMS))
				}
				fmt.Fprintf(w, "(completed and failed: in the last %d s)\n", ws.WindowS)
				return nil
			})
		},
	}
}

// tenantsOf is the tenants a credential serves, "all" for every one.
func tenantsOf(tenants []string) string {
	if len(tenants) == 0 {
		return "all"
	}
	return strings.Join(tenants, ",")
}
