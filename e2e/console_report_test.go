package e2e

import (
	"fmt"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/fleet/fleet/internal/wire"
)

// TestConsoleReportView: a job's page shows its report, each section with
// its state and what it waits for, and follows them live: the overview
// blocked behind two sections, then, once a worker runs the report, all
// three completed, without a reload.
func TestConsoleReportView(t *testing.T) {
	chromium := chromiumPath(t)
	t.Parallel()
	state := initState(t, sampleInput(t, func(m map[string]any) { m["allowance"] = 1000 }))
	h := startHost(t, state)
	operator := credential(t, state, "operator")
	var res wire.ReportsResult
	mustStatus(t, call(t, "POST", h.URL+"/admin/reports", operator, map[string]any{"document": sampleDocument, "idempotency_key": "flow-1",
		"sections": []string{"overview", "terms", "links"}, "after": map[string][]string{"overview": {"terms", "links"}}}), 200).decode(t, &res)
	ctx := newBrowser(t, chromium)
	if err := chromedp.Do(ctx,
		chromedp.Navigate(h.URL+"/#job/"+res.OperationIDs[0]),
		chromedp.WaitVisible(chromedp.ID("credential")),
		chromedp.SendKeys(chromedp.ID("credential"), operator),
		chromedp.Click(chromedp.CSS("#signin-form button[type=submit]")),
		chromedp.WaitVisible(chromedp.ID("detail-panel")),
	); err != nil {
		t.Fatal(err)
	}
	waitJS := func(what, js string) {
		t.Helper()
		if _, err := chromedp.Run(ctx, chromedp.Poll[bool](js, chromedp.WithPollingTimeout(30*time.Second))); err != nil {
			t.Fatalf("%s: waiting for %s: %v\nhost log:\n%s", what, js, err, h.log)
		}
	}
	rows := `[...document.querySelectorAll("#detail-report tbody tr")]`
	waitJS("the report, blocked", fmt.Sprintf(`(rows => rows.length === 3 && rows[0].dataset.section === "overview" && rows[0].dataset.state === "blocked" &&
		rows[0].querySelector(".after").textContent === "links, terms (2 not completed)" &&
		rows[1].dataset.state === "queued" && rows[2].querySelector(".after").textContent === "—")(%s)`, rows))
	evalJS[chromedp.Void](t, ctx, `window.__noReload = true`)
	startWorker(t, h.URL, state, "worker-1").wait(t, 60*time.Second)
	waitJS("the report, completed, live", fmt.Sprintf(`window.__noReload === true && (rows => rows.length === 3 &&
		rows.every(r => r.dataset.state === "completed"))(%s)`, rows))
}
