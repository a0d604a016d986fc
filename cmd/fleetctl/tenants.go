package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/url"
	"strconv"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/fleet/fleet/internal/cli"
	"github.com/fleet/fleet/internal/wire"
)

// tenantsCommand lists the tenants with their figures (GET /admin/tenants).
func (c *ctl) tenantsCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "tenants",
		Short: "Every tenant: its allowance, spent this period, reserved, available, period, weight and jobs",
		Example: `  fleetctl tenants
  fleetctl --json tenants | jq '.tenants[] | select(.available < 100) | .name'`,
		Args: cli.Args(0, "no arguments"),
		RunE: func(cmd *cobra.Command, _ []string) error {
			raw, err := c.call(cmd.Context(), "GET", "/admin/tenants", nil)
			if err != nil {
				return err
			}
			return c.show(raw, func(w *tabwriter.Writer) error {
				var l wire.TenantsList
				if err := json.Unmarshal(raw, &l); err != nil {
					return err
				}
				fmt.Fprintf(w, "TENANT\tALLOWANCE\tSPENT\tRESERVED\tAVAILABLE\tPERIOD\tSINCE\tWEIGHT\tQUEUED\tRUNNING\tCOMPLETED\n")
				for _, t := range l.Tenants {
					fmt.Fprintf(w, "%s\t%s\t%d\t%d\t%d\t%s\t%s\t%d\t%d\t%d\t%d\n", t.Name, allowanceOf(t.Allowance), t.Spent, t.Reserved,
						t.Available, dash(t.Period), when(t.PeriodStartMS), t.Weight, t.Jobs[string(wire.Queued)],
						t.Jobs[string(wire.Running)], t.Jobs[string(wire.Completed)])
				}
				a := l.Fleet
				fmt.Fprintf(w, "(the fleet: %d spent, %d reserved, %d available of %d)\n", a.Spent, a.Reserved, a.Available, a.Allowance)
				return nil
			})
		},
	}
}

// allowanceOf is a tenant's allowance, or "fleet's" for one without.
func allowanceOf(a *int64) string {
	if a == nil {
		return "fleet's"
	}
	return strconv.FormatInt(*a, 10)
}

// tenantCommand adds a tenant or sets one's allowance or weight.
func (c *ctl) tenantCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "tenant add NAME [--allowance N] [--period day|week|month] [--weight W] | tenant allowance NAME N | tenant weight NAME W",
		Short: "Add a tenant, or set a tenant's allowance (compare-and-swap on the one it has now) or its weight in claims",
	}
	var allowance, weight int64
	var period string
	add := &cobra.Command{
		Use:   "add NAME [--allowance N] [--period day|week|month] [--weight W]",
		Short: "Add a tenant: its own allowance (none: only the fleet's bounds it), the period after which its spending starts again, its weight in claims",
		Example: `  fleetctl tenant add research --allowance 5000 --period month
  fleetctl tenant add support --allowance 200 --period day --weight 2`,
		Args: cli.Args(1, "the tenant's name"),
		RunE: func(cmd *cobra.Command, a []string) error {
			req := wire.TenantRequest{Name: &a[0]}
			if cmd.Flags().Changed("allowance") {
				req.Allowance = &allowance
			}
			if cmd.Flags().Changed("period") {
				req.Period = &period
			}
			if cmd.Flags().Changed("weight") {
				req.Weight = &weight
			}
			raw, err := c.call(cmd.Context(), "POST", "/admin/tenants", req)
			if err != nil {
				return err
			}
			return c.show(raw, func(w *tabwriter.Writer) error { return keyValues(w, raw) })
		},
	}
	add.Flags().Int64Var(&allowance, "allowance", 0, "the tenant's own allowance in credits (default: none of its own)")
	add.Flags().StringVar(&period, "period", "", "day, week or month (UTC): its spent starts again at 0 after each (default: never)")
	add.Flags().Int64Var(&weight, "weight", 1, "its share of claims, 1 to 1000: when several tenants have work, claims take their jobs in proportion to their weights")
	set := &cobra.Command{
		Use:     "allowance NAME N",
		Short:   "Set a tenant's allowance (compare-and-swap on the one it has now)",
		Example: "  fleetctl tenant allowance research 8000",
		Args:    cli.Args(2, "the tenant's name and its new allowance"),
		RunE: func(cmd *cobra.Command, a []string) error {
			n, err := strconv.ParseInt(a[1], 10, 64)
			if err != nil {
				return cli.Usage(fmt.Errorf("allowance %q is not a whole number", a[1]))
			}
			raw, err := c.setTenantAllowance(cmd.Context(), a[0], n)
			if err != nil {
				return err
			}
			return c.show(raw, func(w *tabwriter.Writer) error { return keyValues(w, raw) })
		},
	}
	weigh := &cobra.Command{
		Use:     "weight NAME W",
		Short:   "Set a tenant's weight in claims, 1 to 1000: every host's claims take it within a second",
		Example: "  fleetctl tenant weight support 3",
		Args:    cli.Args(2, "the tenant's name and its new weight"),
		RunE: func(cmd *cobra.Command, a []string) error {
			n, err := strconv.ParseInt(a[1], 10, 64)
			if err != nil {
				return cli.Usage(fmt.Errorf("weight %q is not a whole number", a[1]))
			}
			raw, err := c.call(cmd.Context(), "POST", "/admin/tenants/"+url.PathEscape(a[0])+"/weight", wire.TenantWeightRequest{Weight: &n})
			if err != nil {
				return err
			}
			return c.show(raw, func(w *tabwriter.Writer) error { return keyValues(w, raw) })
		},
	}
	cmd.AddCommand(add, set, weigh)
	return cmd
}

// setTenantAllowance reads the tenant's allowance and swaps it for n.
func (c *ctl) setTenantAllowance(ctx context.Context, name string, n int64) ([]byte, error) {
	raw, err := c.call(ctx, "GET", "/admin/tenants", nil)
	if err != nil {
		return nil, err
	}
	var l wire.TenantsList
	if err := json.Unmarshal(raw, &l); err != nil {
		return nil, err
	}
	req := wire.TenantAllowanceRequest{Allowance: &n}
	for _, t := range l.Tenants {
		if t.Name == name {
			req.ExpectedAllowance = t.Allowance
		}
	}
	return c.call(ctx, "POST", "/admin/tenants/"+url.PathEscape(name)+"/allowance", req)
}
