package e2e

import (
	"slices"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/fleet/fleet/internal/series"
)

// TestConsoleTenantBurn: what a tenant spends shows in the host's series
// at its next reading of the tenants, and in the console's burn chart, by
// tenant, in credits a minute.
func TestConsoleTenantBurn(t *testing.T) {
	chromium := chromiumPath(t)
	t.Parallel()
	state := initState(t, sampleInput(t, func(m map[string]any) {
		m["sections"], m["allowance"], m["cost_per_report"] = []string{"summary"}, 1000, 10
	}))
	h := startHost(t, state)
	operator := credential(t, state, "operator")
	// The host's first reading of the tenants is only a baseline: wait for
	// it, so that what team-a spends falls after it.
	var got struct{ Samples []series.Sample }
	waitFor(t, 10*time.Second, "the host's first sample", func() bool {
		mustStatus(t, call(t, "GET", h.URL+"/admin/series", operator, nil), 200).decode(t, &got)
		return len(got.Samples) > 0
	})
	mustStatus(t, call(t, "POST", h.URL+"/admin/tenants", operator, map[string]any{"name": "team-a"}), 200)
	mustStatus(t, call(t, "POST", h.URL+"/admin/reports", operator, map[string]any{"document": sampleDocument,
		"sections": []string{"summary", "terms", "actions"}, "idempotency_key": "burn-1", "tenant": "team-a"}), 200)
	startWorker(t, h.URL, state, "worker-1").wait(t, 60*time.Second)
	var burned int64
	waitFor(t, 3*series.TenantsEvery*time.Second, "a reading with team-a's burn", func() bool {
		mustStatus(t, call(t, "GET", h.URL+"/admin/series", operator, nil), 200).decode(t, &got)
		burned = 0
		for _, s := range got.Samples {
			if s.Tenants != nil {
				burned += s.Tenants.Burn["team-a"]
			}
		}
		return burned == 30
	})

	ctx := newBrowser(t, chromium)
	if err := chromedp.Do(ctx,
		chromedp.Navigate(h.URL+"/"),
		chromedp.WaitVisible(chromedp.ID("credential")),
		chromedp.SendKeys(chromedp.ID("credential"), operator),
		chromedp.Click(chromedp.CSS("#signin-form button[type=submit]")),
		chromedp.WaitVisible(chromedp.ID("app")),
	); err != nil {
		t.Fatal(err)
	}
	// team-a's line is named under the chart, and its points are the
	// readings' burn in credits a minute (credits × 60 / the reading's
	// interval): the same readings the host answered.
	var want []float64
	for _, s := range got.Samples {
		if s.Tenants != nil && s.Tenants.Burn["team-a"] > 0 {
			want = append(want, float64(s.Tenants.Burn["team-a"]*60)/float64(s.Tenants.IntervalS))
		}
	}
	js := `(spans => spans.some(s => s.dataset.name === "team-a"))([...document.querySelectorAll('p.latest[data-chart="burn"] span')])`
	if _, err := chromedp.Run(ctx, chromedp.Poll[bool](js, chromedp.WithPollingTimeout(30*time.Second))); err != nil {
		t.Fatalf("the burn chart names no team-a: %v\nhost log:\n%s", err, h.log)
	}
	drawn := evalJS[[]float64](t, ctx, `(u => u.data[u.series.findIndex(s => s.label === "team-a")].filter(v => v > 0))(document.querySelector("#chart-burn").uplot)`)
	if !slices.Equal(drawn, want) {
		t.Fatalf("team-a's burn drawn %v, want %v (credits a minute)", drawn, want)
	}
}
