package e2e

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/fleet/fleet/internal/wire"
)

// TestConsoleBulkSaysWhatItDoes (issue 34): a bulk action's confirmation
// counts the jobs it applies to, not every job the filter selects, and
// names those it leaves alone; past 100 jobs it is confirmed only by
// typing the count; and pausing claims asks for the reason it records.
func TestConsoleBulkSaysWhatItDoes(t *testing.T) {
	chromium := chromiumPath(t)
	t.Parallel()
	state := initState(t, sampleInput(t, nil))
	h := startHost(t, state)
	operator := credential(t, state, "operator")
	startWorker(t, h.URL, state, "worker-1").wait(t, 60*time.Second) // two completed, two refused
	page := openConsole(t, chromium, h, operator, "/")
	waitJS, click := page.wait, page.click
	waitJS("the jobs", `document.querySelectorAll("#jobs tbody tr").length === 4`)
	ctx := page.ctx

	// Rows selected: the action is on them alone. One refused row and one
	// completed: only the refused one can be requeued, the other is left.
	refused, completed := "", ""
	for _, j := range getSnapshot(t, h, operator).Jobs {
		switch j.State {
		case wire.Refused:
			refused = j.OperationID
		case wire.Completed:
			completed = j.OperationID
		}
	}
	for _, op := range []string{refused, completed} {
		click("select a row", fmt.Sprintf(`#jobs tbody tr[data-op=%q] td.pick input`, op))
	}
	waitJS("the buttons act on the selection", `document.querySelector("#bulk-requeue").textContent === "Requeue 2 selected…"`)
	click("requeue the selected", "#bulk-requeue")
	waitJS("the selection's count", `document.querySelector("#confirm").open && document.querySelector("#confirm-text").textContent === "Requeue the 1 selected job(s) that are refused, unresolved or failed? The other 1 selected are left alone."`)
	click("confirm", "#confirm-ok")
	waitJS("requeued the selected", `document.querySelector("#flash").textContent.startsWith("Requeue: 1 done, 0 refused (selected)") && document.querySelector("#bulk-requeue").textContent === "Requeue all…"`)
	if got := jobState(t, h, operator, refused); got != wire.Queued {
		t.Fatalf("the selected refused job is %s", got)
	}
	if got := jobState(t, h, operator, completed); got != wire.Completed {
		t.Fatalf("the selected completed job is %s", got)
	}

	// Every job selected by the filter; one more can be requeued.
	click("requeue all", "#bulk-requeue")
	waitJS("the count of what it does", `document.querySelector("#confirm").open && document.querySelector("#confirm-text").textContent.startsWith("Requeue 1 job(s) matching no filter: every job? The other 3 matching are not refused, unresolved or failed and are left alone.") && !document.querySelector("#confirm-ok").disabled`)
	click("confirm", "#confirm-ok")
	// The others are refused alone, as the dialog said they would be.
	waitJS("requeued", `document.querySelector("#flash").textContent.startsWith("Requeue: 1 done, 3 refused")`)

	// 120 more queued: cancelling them is confirmed by typing the count.
	for i := range 30 {
		mustStatus(t, call(t, "POST", h.URL+"/admin/reports", operator, map[string]any{"document": sampleDocument,
			"sections": []string{"summary", "terms", "actions", "links"}, "idempotency_key": fmt.Sprintf("bulk-%d", i)}), 200)
	}
	click("the queued chip", `#chips button[data-state="queued"]`)
	waitJS("the queued view", `location.search.includes("state=queued")`)
	click("cancel all", "#bulk-cancel")
	waitJS("a large change asks for its count", `document.querySelector("#confirm").open && document.querySelector("#confirm-text").textContent.startsWith("Cancel 122 job(s) matching state queued?") &&
		!document.querySelector("#confirm-typed-row").hidden && document.querySelector("#confirm-ok").disabled`)
	evalJS[chromedp.Void](t, ctx, `(i => { i.value = "121"; i.dispatchEvent(new Event("input")); })(document.querySelector("#confirm-typed"))`)
	if !evalJS[bool](t, ctx, `document.querySelector("#confirm-ok").disabled`) {
		t.Fatal("a wrong count confirms a large change")
	}
	evalJS[chromedp.Void](t, ctx, `(i => { i.value = "122"; i.dispatchEvent(new Event("input")); })(document.querySelector("#confirm-typed"))`)
	evalJS[chromedp.Void](t, ctx, `document.querySelector("#confirm-reason").value = "the batch was sent twice"`)
	click("confirm", "#confirm-ok")
	waitJS("cancelled", `document.querySelector("#flash").textContent.startsWith("Cancel: 122 done, 0 refused")`)
	var events wire.EventPage
	mustStatus(t, call(t, "GET", h.URL+"/admin/events?after=0&limit=1000", operator, nil), 200).decode(t, &events)
	withReason := 0
	for _, e := range events.Events {
		if e.Kind == wire.EventCancelled && strings.HasSuffix(e.Title, ": the batch was sent twice") {
			withReason++
		}
	}
	if withReason != 122 {
		t.Fatalf("%d cancellations carry the reason given; want 122", withReason)
	}
	if n := jobsIn(t, h, operator)[wire.Queued]; n != 0 {
		t.Fatalf("%d jobs still queued", n)
	}

	// A pause asks for its reason, and records it.
	click("pause claims", "#claims-toggle")
	waitJS("asked for a reason", `document.querySelector("#confirm").open && !document.querySelector("#confirm-reason-row").hidden`)
	evalJS[chromedp.Void](t, ctx, `document.querySelector("#confirm-reason").value = "incident 7: the model is down"`)
	click("confirm", "#confirm-ok")
	waitJS("paused with the reason", `document.querySelector("#claims-state").textContent === "claims paused: incident 7: the model is down"`)
}
