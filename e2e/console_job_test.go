package e2e

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/fleet/fleet/internal/wire"
)

// TestConsoleJobPage (issue 34): a job has a page of its own at
// #job/OP, opened from its row or straight from its address, at the top
// of the window with the other views stepped aside: its times, attempts,
// input document, published text, receipts and events; and the events
// view filters by kind and by job, each event linking to its job's page.
// The job's events are older than every event the console holds, so the
// page and the filters find them in the host's whole log.
func TestConsoleJobPage(t *testing.T) {
	chromium := chromiumPath(t)
	t.Parallel()
	state := initState(t, sampleInput(t, nil))
	h := startHost(t, state)
	operator := credential(t, state, "operator")
	startWorker(t, h.URL, state, "worker-1").wait(t, 60*time.Second)
	var done wire.Job
	for _, j := range getSnapshot(t, h, operator).Jobs {
		if j.State == wire.Completed {
			done = j
		}
	}
	// 400 newer events (claims paused and resumed): the console holds
	// the newest 200 when it opens, none of them the job's.
	for range 200 {
		mustStatus(t, call(t, "POST", h.URL+"/admin/claims/pause", operator, map[string]any{"reason": "r"}), 200)
		mustStatus(t, call(t, "POST", h.URL+"/admin/claims/resume", operator, nil), 200)
	}
	page := openConsole(t, chromium, h, operator, "/")
	waitJS, ctx := page.wait, page.ctx
	waitJS("the jobs", `document.querySelectorAll("#jobs tbody tr").length === 4`)

	// In a window narrower than the jobs table, each row's actions and its
	// receipt stay in view and whole.
	waitJS("the actions in view", `(c => c !== null && c.getBoundingClientRect().right <= document.documentElement.clientWidth)(document.querySelector("#jobs tbody tr td.actions"))`)
	waitJS("the receipt whole", `[...document.querySelectorAll("#jobs tbody td.receipt a")].every(a => a.scrollWidth <= a.parentElement.clientWidth)`)

	// Straight from its address, as a bookmark opens it.
	if err := chromedp.Do(ctx, chromedp.Navigate(h.URL+"/#job/"+done.OperationID)); err != nil {
		t.Fatal(err)
	}
	waitJS("the job page", fmt.Sprintf(`document.querySelector("#detail-op").textContent === %q && !document.querySelector("#detail-panel").hidden`, done.OperationID))
	waitJS("at the top, the others aside", `document.querySelector("#detail-panel").getBoundingClientRect().top < 200 && document.querySelector("#jobs-panel").offsetParent === null && document.querySelector("#charts-panel").offsetParent === null`)
	fields := evalJS[string](t, ctx, `document.querySelector("#detail-fields").textContent`)
	for _, want := range []string{"created", "claimed", "started", "finished", " UTC", "run time", "published at version 1"} {
		if !strings.Contains(fields, want) {
			t.Fatalf("the job page's fields lack %q:\n%s", want, fields)
		}
	}
	waitJS("its input document", `document.querySelector("#detail-input").textContent.startsWith("Fleet review")`)
	waitJS("its published text", fmt.Sprintf(`document.querySelector("#detail-published").textContent.includes(%q)`, done.OperationID))
	waitJS("its receipts", `document.querySelectorAll("#detail-receipts li a").length >= 2`)
	waitJS("its events", `[...document.querySelectorAll("#detail-events li")].some(li => li.dataset.kind === "fleet.published")`)
	evalJS[chromedp.Void](t, ctx, `document.querySelector("#detail-close").click()`)
	waitJS("back to every job", `location.hash === "" && document.querySelector("#jobs-panel").offsetParent !== null && document.querySelector("#detail-panel").hidden`)

	// The events view by kind, then by job; an event opens its job.
	evalJS[chromedp.Void](t, ctx, `(s => { s.value = "fleet.published"; s.dispatchEvent(new Event("change")); })(document.querySelector("#events-kind"))`)
	waitJS("only publications", `(items => items.length === 2 && items.every(li => li.dataset.kind === "fleet.published"))([...document.querySelectorAll("#events li")])`)
	evalJS[chromedp.Void](t, ctx, `(s => { s.value = ""; s.dispatchEvent(new Event("change")); })(document.querySelector("#events-kind"))`)
	waitJS("the live timeline again", `(items => items.length >= 200 && items.every(li => li.dataset.op === ""))([...document.querySelectorAll("#events li")])`)
	setJob := func(text string) {
		evalJS[chromedp.Void](t, ctx, fmt.Sprintf(`(i => { i.value = %q; i.dispatchEvent(new Event("input")); })(document.querySelector("#events-job"))`, text))
	}
	setJob(done.OperationID[:30]) // a start filters the events held, none of them the job's
	waitJS("none held", `document.querySelectorAll("#events li").length === 0 && document.querySelector("#events-count").textContent.includes("among the newest")`)
	setJob(done.OperationID)
	waitJS("only the job's events", fmt.Sprintf(`(items => items.length >= 3 && items.every(li => li.dataset.op === %q))([...document.querySelectorAll("#events li")])`, done.OperationID))
	evalJS[chromedp.Void](t, ctx, `document.querySelector("#events li a.job").click()`)
	waitJS("the event's job page", fmt.Sprintf(`location.hash === "#job/%s" && !document.querySelector("#detail-panel").hidden`, done.OperationID))
}
