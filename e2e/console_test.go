package e2e

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/fleet/fleet/internal/wire"
)

// TestConsoleSession checks the console's sign-in and its guards over plain
// HTTP: the cookie's attributes, who may sign in, and the Host and Origin
// checks on every cookie-authenticated request.
func TestConsoleSession(t *testing.T) {
	t.Parallel()
	state := initState(t, sampleInput(t, nil))
	h := startHost(t, state)
	operator := credential(t, state, "operator")
	origin := map[string]string{"Origin": h.URL}

	send := func(method, path, cookie string, headers map[string]string, body string) *http.Response {
		t.Helper()
		req, err := http.NewRequest(method, h.URL+path, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		if body != "" {
			req.Header.Set("Content-Type", "application/json")
		}
		if cookie != "" {
			req.AddCookie(&http.Cookie{Name: "fleet_console", Value: cookie})
		}
		for k, v := range headers {
			if k == "Host" {
				req.Host = v
			} else {
				req.Header.Set(k, v)
			}
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp
	}
	signIn := func(token string, headers map[string]string) *http.Response {
		t.Helper()
		return send("POST", "/console/session", "", headers, fmt.Sprintf(`{"credential":%q}`, token))
	}

	page := send("GET", "/", "", nil, "")
	if page.StatusCode != 200 || !strings.Contains(page.Header.Get("Content-Security-Policy"), "frame-ancestors 'none'") {
		t.Fatalf("GET /: %d, CSP %q", page.StatusCode, page.Header.Get("Content-Security-Policy"))
	}
	// The icon a browser asks for, without a credential.
	if icon := send("GET", "/favicon.ico", "", nil, ""); icon.StatusCode != 200 || icon.Header.Get("Content-Type") != "image/svg+xml" {
		t.Fatalf("GET /favicon.ico: %d %q", icon.StatusCode, icon.Header.Get("Content-Type"))
	}
	if r := signIn("not-a-credential", origin); r.StatusCode != 401 {
		t.Fatalf("unknown credential signed in: %d", r.StatusCode)
	}
	if r := signIn(credential(t, state, "worker-1"), origin); r.StatusCode != 403 {
		t.Fatalf("worker credential signed in to the console: %d", r.StatusCode)
	}
	if r := signIn(operator, map[string]string{"Origin": "http://evil.example"}); r.StatusCode != 403 {
		t.Fatalf("cross-origin sign-in: %d", r.StatusCode)
	}
	r := signIn(operator, origin)
	if r.StatusCode != 200 || len(r.Cookies()) != 1 {
		t.Fatalf("sign-in: %d, cookies %v", r.StatusCode, r.Cookies())
	}
	cookie := r.Cookies()[0]
	if !cookie.HttpOnly || cookie.SameSite != http.SameSiteStrictMode || cookie.Path != "/" || strings.Contains(cookie.Value, operator) {
		t.Fatalf("session cookie %+v: want HttpOnly, SameSite=Strict, Path=/, not the credential", cookie)
	}
	session := cookie.Value

	if r := send("GET", "/admin/snapshot", session, nil, ""); r.StatusCode != 200 {
		t.Fatalf("snapshot with the session: %d", r.StatusCode)
	}
	if r := send("GET", "/v1/documents/x", session, nil, ""); r.StatusCode != 401 {
		t.Fatalf("a console session reached a worker route: %d", r.StatusCode)
	}
	before := digest(t, state)
	target := getSnapshot(t, h, operator).Jobs[0].OperationID
	for name, headers := range map[string]map[string]string{
		"foreign origin":  {"Origin": "http://evil.example"},
		"no origin":       {},
		"rebound host":    {"Origin": "http://evil.example:1", "Host": "evil.example:1"},
		"same-site fetch": {"Sec-Fetch-Site": "same-site"},
	} {
		if r := send("POST", "/admin/jobs/"+target+"/cancel", session, headers, ""); r.StatusCode != 403 {
			t.Errorf("%s: cancel answered %d, want 403", name, r.StatusCode)
		}
	}
	if r := send("GET", "/admin/snapshot", session, map[string]string{"Host": "evil.example"}, ""); r.StatusCode != 403 {
		t.Errorf("read through a rebound host name: %d, want 403", r.StatusCode)
	}
	if after := digest(t, state); after != before {
		t.Fatalf("refused console requests changed the database")
	}
	if r := send("POST", "/admin/jobs/"+target+"/cancel", session, origin, ""); r.StatusCode != 200 {
		t.Fatalf("same-origin cancel: %d", r.StatusCode)
	}
	if r := send("DELETE", "/console/session", session, origin, ""); r.StatusCode != 204 {
		t.Fatalf("sign out: %d", r.StatusCode)
	}
	if r := send("GET", "/admin/snapshot", session, nil, ""); r.StatusCode != 401 {
		t.Fatalf("snapshot after sign-out: %d", r.StatusCode)
	}
	// serve --console-host names a host the console answers to besides IP
	// addresses and localhost, e.g. a reverse proxy's. Last: a second host
	// on this state takes over its identity, and the first one stops at
	// its next liveness beat.
	named := startHost(t, state, "--console-host", "fleet.example")
	for name, want := range map[string]int{"fleet.example": 200, "other.example": 403} {
		hostHeader := name + ":" + strings.Split(named.addr(), ":")[1]
		req, _ := http.NewRequest("POST", named.URL+"/console/session", strings.NewReader(fmt.Sprintf(`{"credential":%q}`, operator)))
		req.Host = hostHeader
		req.Header.Set("Origin", "http://"+hostHeader)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != want {
			t.Errorf("sign-in through host %s: %d, want %d", name, resp.StatusCode, want)
		}
	}
}

// chromiumPath finds a Chromium. When FLEET_REQUIRE_BROWSER is set (CI sets
// it) a missing browser fails the test instead of skipping it.
func chromiumPath(t *testing.T) string {
	for _, name := range []string{os.Getenv("FLEET_CHROMIUM"), "chromium", "chromium-browser", "google-chrome"} {
		if name == "" {
			continue
		}
		if path, err := exec.LookPath(name); err == nil {
			return path
		}
	}
	if os.Getenv("FLEET_REQUIRE_BROWSER") != "" {
		t.Fatal("no Chromium found and FLEET_REQUIRE_BROWSER is set; install Debian's chromium package")
	}
	t.Skip("SKIPPED the browser test: no Chromium on PATH (apt-get install chromium, or set FLEET_CHROMIUM); .ci/run installs it and requires it")
	return ""
}

// TestConsoleBrowser drives the console in headless Chromium against a real
// host: sign in, watch the jobs table, submit a report, cancel a queued job
// and see its state change without a reload, change the allowance, requeue
// a refused job, and check a receipt's signature and chain link.
func TestConsoleBrowser(t *testing.T) {
	t.Parallel()
	chromium := chromiumPath(t)
	state := initState(t, sampleInput(t, nil))
	h := startHost(t, state, "--lease", "5m")
	operator := credential(t, state, "operator")
	worker := credential(t, state, "worker-1")
	// Two reports complete and two are refused: the allowance covers two.
	startWorker(t, h.URL, state, "worker-1").wait(t, 60*time.Second)

	ctx := newBrowser(t, chromium)

	run := func(t *testing.T, what string, steps ...chromedp.Action[chromedp.Void]) {
		t.Helper()
		if err := chromedp.Do(ctx, steps...); err != nil {
			t.Fatalf("%s: %v\nhost log:\n%s", what, err, h.log)
		}
	}
	// waitJS polls a JavaScript condition in the page until it holds.
	waitJS := func(t *testing.T, what, js string) {
		t.Helper()
		if _, err := chromedp.Run(ctx, chromedp.Poll[bool](js, chromedp.WithPollingTimeout(20*time.Second))); err != nil {
			t.Fatalf("%s: waiting for %s: %v\nhost log:\n%s", what, js, err, h.log)
		}
	}
	// clickJS clicks an element through the DOM once it exists. The jobs
	// table re-renders on every event, so a click by screen position could
	// land on a row that has just been replaced.
	clickJS := func(t *testing.T, what, sel string) {
		t.Helper()
		waitJS(t, what, fmt.Sprintf(`document.querySelector(%q) !== null`, sel))
		evalJS[chromedp.Void](t, ctx, fmt.Sprintf(`document.querySelector(%q).click()`, sel))
	}
	confirm := func(t *testing.T, what string) {
		t.Helper()
		waitJS(t, what, `document.querySelector("#confirm").open`)
		clickJS(t, what, "#confirm-ok")
	}

	// The steps run in order in one page, each reading what those before
	// it left: running is the job a worker holds from the fourth step on.
	var claim struct {
		Job struct {
			OperationID string `json:"operation_id"`
			Claim       struct {
				ClaimID    string `json:"claim_id"`
				Generation int64  `json:"generation"`
			} `json:"claim"`
		} `json:"job"`
	}
	var running string
	t.Run("sign in", func(t *testing.T) {
		run(t, "sign in",
			chromedp.Navigate(h.URL+"/"),
			chromedp.WaitVisible(chromedp.ID("credential")),
			chromedp.SendKeys(chromedp.ID("credential"), operator),
			chromedp.Click(chromedp.CSS("#signin-form button[type=submit]")),
			chromedp.WaitVisible(chromedp.CSS("#jobs tbody tr")),
		)
		waitJS(t, "jobs table", `document.querySelectorAll("#jobs tbody tr").length === 4`)
		if visible := evalJS[string](t, ctx, `document.cookie`); visible != "" {
			t.Fatalf("the session cookie is readable by scripts: %q", visible)
		}
		states := evalJS[[]string](t, ctx, `[...document.querySelectorAll("#jobs tbody tr")].map(r => r.dataset.state)`)
		if strings.Join(states, ",") != "completed,completed,refused,refused" {
			t.Fatalf("table states %v", states)
		}
		// A marker on window survives only if the page is never reloaded.
		evalJS[bool](t, ctx, `window.__noReload = true`)
	})
	t.Run("submit a report and cancel a job", func(t *testing.T) {
		run(t, "fill in a report", chromedp.SetValue(chromedp.ID("submit-document"), "Console report\n- [ ] check the fleet\n"))
		clickJS(t, "submit the report", "#submit-form button[type=submit]")
		waitJS(t, "submitted jobs appear", `document.querySelectorAll('#jobs tbody tr[data-state="queued"]').length === 2`)

		target := evalJS[string](t, ctx, `document.querySelector('#jobs tbody tr[data-state="queued"]').dataset.op`)
		clickJS(t, "cancel a queued job", fmt.Sprintf(`#jobs tbody tr[data-op=%q] button[data-action=cancel]`, target))
		confirm(t, "confirm the cancel")
		waitJS(t, "cancelled without reload", fmt.Sprintf(
			`window.__noReload === true && document.querySelector('#jobs tbody tr[data-op=%q]').dataset.state === "cancelled_before_dispatch"`, target))
		if got := jobState(t, h, operator, target); got != wire.CancelledBeforeDispatch {
			t.Fatalf("host says the cancelled job is %s", got)
		}
	})
	t.Run("raise the allowance", func(t *testing.T) {
		run(t, "set the allowance", chromedp.SetValue(chromedp.ID("raise-to"), "100"))
		clickJS(t, "raise the allowance", "#raise-form button[type=submit]")
		confirm(t, "confirm the allowance")
		waitJS(t, "allowance raised", `document.querySelector("#acct-allowance").textContent.startsWith("100 ")`)
		if a := getSnapshot(t, h, operator).Accounting; a.Allowance != 100 || a.Available != 60 {
			t.Fatalf("accounting after the raise: %+v", a)
		}
	})
	t.Run("requeue a refused job", func(t *testing.T) {
		refused := evalJS[string](t, ctx, `document.querySelector('#jobs tbody tr[data-state="refused"]').dataset.op`)
		clickJS(t, "requeue a refused job", fmt.Sprintf(`#jobs tbody tr[data-op=%q] button[data-action=requeue]`, refused))
		confirm(t, "confirm the requeue")
		waitJS(t, "requeued", fmt.Sprintf(`document.querySelector('#jobs tbody tr[data-op=%q]').dataset.state === "queued"`, refused))
	})
	t.Run("a running job, its lease and the workers view", func(t *testing.T) {
		// A worker claims and starts a job behind the browser's back: the table
		// shows it running, with its owner and a lease counting down.
		mustStatus(t, call(t, "POST", h.URL+"/v1/claims", worker, nil), 200).decode(t, &claim)
		running = claim.Job.OperationID
		mustStatus(t, call(t, "POST", h.URL+"/v1/jobs/"+running+"/dispatch", worker,
			map[string]any{"claim_id": claim.Job.Claim.ClaimID, "generation": claim.Job.Claim.Generation}), 200)
		waitJS(t, "running with a lease", fmt.Sprintf(
			`(r => r.dataset.state === "running" && /^\d+s$/.test(r.querySelector(".lease").textContent) && r.querySelector(".owner").textContent === "worker-1")(document.querySelector('#jobs tbody tr[data-op=%q]'))`, running))

		// The row shows the job's operation id, when it was created and
		// claimed, and how long it has run; reconcile is not offered while its
		// worker holds a live lease (the host would refuse it).
		waitJS(t, "the running row's times", fmt.Sprintf(
			`(r => r.querySelector(".op").title === %q && r.querySelector(".claimed time") !== null && /\d+ s ago/.test(r.querySelector(".claimed").textContent) &&
				/^\d+( ms|\.\d s)$/.test(r.querySelector(".run").textContent) && r.querySelector("button[data-action=reconcile]") === null &&
				r.querySelector("button[data-action=cancel]") !== null)(document.querySelector('#jobs tbody tr[data-op=%q]'))`, running, running))
		// The workers view: worker-1, alive, holding the running job.
		waitJS(t, "the workers view", `(r => r !== null && r.dataset.alive === "true" && r.querySelector(".held").textContent === "1" &&
			Number(r.querySelector(".completed").textContent) >= 2)(document.querySelector('#workers tbody tr[data-worker="worker-1"]'))`)
	})
	t.Run("the tenants view", func(t *testing.T) {
		// A tenant the operator adds shows with its terms and weight at the
		// next refresh; the tenant default, with no allowance of its own,
		// holds the running job.
		mustStatus(t, call(t, "POST", h.URL+"/admin/tenants", operator, map[string]any{"name": "team-v", "allowance": 40, "period": "day"}), 200)
		waitJS(t, "the tenants view", `(rows => rows.length === 2 &&
			rows[0].dataset.tenant === "default" && rows[0].querySelector(".allowance").textContent === "fleet's" &&
			rows[0].querySelector(".running").textContent === "1" &&
			rows[1].dataset.tenant === "team-v" && rows[1].querySelector(".allowance").textContent === "40" &&
			rows[1].querySelector(".available").textContent === "40" && /^day from \d{4}-\d\d-\d\d$/.test(rows[1].querySelector(".period").textContent) &&
			rows[1].querySelector(".weight").textContent === "1")(
			[...document.querySelectorAll('#tenants tbody tr')])`)
		// Its weight changed shows at the next refresh too.
		mustStatus(t, call(t, "POST", h.URL+"/admin/tenants/team-v/weight", operator, map[string]any{"weight": 4}), 200)
		waitJS(t, "the tenant's new weight", `document.querySelector('#tenants tbody tr[data-tenant="team-v"] .weight').textContent === "4"`)
	})
	t.Run("submit a report to a tenant", func(t *testing.T) {
		// The form names the tenant whose allowance the report spends; a
		// tenant not there is refused, saying so, with nothing queued.
		run(t, "fill in a report for a tenant", chromedp.SetValue(chromedp.ID("submit-document"), "Team V's notes.\n"),
			chromedp.SetValue(chromedp.ID("submit-tenant"), "team-v"))
		clickJS(t, "submit the report", "#submit-form button[type=submit]")
		waitJS(t, "queued", `document.querySelector("#flash").textContent === "Queued 2 job(s)."`)
		var page wire.JobPage
		mustStatus(t, call(t, "GET", h.URL+"/admin/jobs?tenant=team-v", operator, nil), 200).decode(t, &page)
		if len(page.Jobs) != 2 {
			t.Fatalf("team-v's jobs after the console's submission: %+v", page.Jobs)
		}
		run(t, "fill in a report for no such tenant", chromedp.SetValue(chromedp.ID("submit-document"), "Nobody's.\n"),
			chromedp.SetValue(chromedp.ID("submit-tenant"), "team-none"))
		clickJS(t, "submit the report", "#submit-form button[type=submit]")
		waitJS(t, "refused", `document.querySelector("#flash").textContent.startsWith("Report not submitted: ") &&
			document.querySelector("#flash").textContent.includes("team-none")`)
		evalJS[chromedp.Void](t, ctx, `document.querySelector("#submit-tenant").value = ""`) // back to the tenant default
	})
	t.Run("reassign a document", func(t *testing.T) {
		// Reassign the running job's document from its detail panel: the owner
		// changes and the generation moves on, fencing worker-1 out.
		clickJS(t, "open the running job", fmt.Sprintf(`#jobs tbody tr[data-op=%q] td.section a`, running))
		run(t, "name the new owner", chromedp.WaitVisible(chromedp.ID("assign-owner")), chromedp.SetValue(chromedp.ID("assign-owner"), "worker-2"))
		clickJS(t, "reassign the document", "#assign-form button[type=submit]")
		confirm(t, "confirm the reassignment")
		waitJS(t, "reassigned", fmt.Sprintf(
			`(r => r.querySelector(".owner").textContent === "worker-2" && Number(r.querySelector(".gen").textContent) === %d)(document.querySelector('#jobs tbody tr[data-op=%q]'))`,
			claim.Job.Claim.Generation+1, running))
		_, err := chromedp.Run(ctx, chromedp.Evaluate[chromedp.Void](`document.querySelector("#detail-close").click()`))
		if err != nil {
			t.Fatal(err)
		}
	})
	t.Run("a failed attempt", func(t *testing.T) {
		// A worker's attempt fails behind the browser's back: the row goes back
		// to queued with 1 of 3 attempts spent, and its panel shows the reason.
		var failing wire.ClaimResult
		mustStatus(t, call(t, "POST", h.URL+"/v1/claims", worker, nil), 200).decode(t, &failing)
		mustStatus(t, call(t, "POST", h.URL+"/v1/jobs/"+failing.Job.OperationID+"/fail", worker, map[string]any{
			"claim_id": failing.Job.Claim.ClaimID, "generation": failing.Job.Claim.Generation,
			"reason": "the model endpoint answered 401", "retryable": true}), 200)
		waitJS(t, "a failed attempt in the table", fmt.Sprintf(
			`(r => r.dataset.state === "queued" && r.querySelector(".attempts").textContent === "1/3")(document.querySelector('#jobs tbody tr[data-op=%q]'))`,
			failing.Job.OperationID))
		clickJS(t, "open the job that failed", fmt.Sprintf(`#jobs tbody tr[data-op=%q] td.section a`, failing.Job.OperationID))
		waitJS(t, "its attempt on the job page", `document.querySelector("#detail-attempts").textContent.includes("the model endpoint answered 401")`)
		if _, err := chromedp.Run(ctx, chromedp.Evaluate[chromedp.Void](`document.querySelector("#detail-close").click()`)); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("a receipt and the timeline", func(t *testing.T) {
		completed := evalJS[string](t, ctx, `document.querySelector('#jobs tbody tr[data-state="completed"]').dataset.op`)
		clickJS(t, "open a receipt", fmt.Sprintf(`#jobs tbody tr[data-op=%q] td.receipt a`, completed))
		run(t, "the receipt panel", chromedp.WaitVisible(chromedp.ID("receipt-panel")))
		waitJS(t, "receipt verifies", `document.querySelectorAll("#receipt-checks li.ok").length === 4 && document.querySelectorAll("#receipt-checks li").length === 4`)
		body := evalJS[string](t, ctx, `document.querySelector("#receipt-body").textContent`)
		if !strings.HasPrefix(body, `{"accounting":{`) || !strings.Contains(body, `"kind":"publication"`) {
			t.Fatalf("receipt body is not the canonical publication body: %s", body)
		}

		timeline := evalJS[[]int64](t, ctx, `[...document.querySelectorAll("#events > li")].map(li => Number(li.dataset.seq))`)
		last := getSnapshot(t, h, operator).Events
		if len(timeline) == 0 || timeline[0] != last || timeline[len(timeline)-1] != 1 {
			t.Fatalf("timeline %v: want newest %d first, down to 1", timeline, last)
		}
	})
	t.Run("charts", func(t *testing.T) {
		// The charts draw from the host's series: the publications the worker
		// made before sign-in, the allowance spent, latencies measured.
		waitJS(t, "the charts", `(c => c !== null && c.uplot && c.uplot.data[0].length >= 2 && c.uplot.axes.length === 2 && c.uplot.scales.x.time === true &&
				c.querySelector("canvas") !== null && c.querySelectorAll(".u-legend .u-series").length === 4)(document.querySelector("#chart-allowance")) &&
			document.querySelector('p.latest[data-chart="allowance"] span[data-name="spent"]').textContent === "spent 40" &&
			document.querySelector("#chart-latency").uplot.data.slice(1).some(s => s.some(v => v != null)) &&
			document.querySelector("#chart-depth").uplot.scales.y.distr === 4 &&
			document.querySelector("#chart-jobtime").uplot.data.slice(1).some(s => s.some(v => v != null))`)
		// The allowance's lines have the bar's colours; latencies, measured
		// only in some seconds, are drawn across the seconds between; counts
		// per second are a 10-second average.
		waitJS(t, "the charts read true", `(s => s !== null && getComputedStyle(s).color === getComputedStyle(document.querySelector("#bar .spent")).backgroundColor)(document.querySelector('p.latest[data-chart="allowance"] span[data-name="spent"]')) &&
			document.querySelector("#chart-latency").uplot.series.slice(1).every(s => s.spanGaps === true) &&
			document.querySelector("#chart-rate").uplot.axes[1].label.includes("10 s average")`)
		// Hovering a chart shows the values at that second in its legend.
		evalJS[chromedp.Void](t, ctx, `(u => u.setCursor({left: u.bbox.width / devicePixelRatio - 2, top: 10}))(document.querySelector("#chart-allowance").uplot)`)
		waitJS(t, "the legend's values under the pointer", `[...document.querySelectorAll("#chart-allowance .u-legend .u-series .u-value")].slice(1).some(v => /^\d/.test(v.textContent))`)
		// Dragging across a chart zooms it into that time range; a double
		// click shows the whole of it again. The chart is brought into view at
		// once and held still first, and the pointer enters it (uPlot reads
		// where the chart is on the page as the pointer enters): a smooth
		// scroll still moving the page (the receipt panel's, slow on a loaded
		// machine) left uPlot reading the drag against where the chart was.
		// The move says it moved (movementX): uPlot ignores a move of nothing
		// while a drag is on.
		evalJS[chromedp.Void](t, ctx, `document.querySelector("#chart-allowance").scrollIntoView({block: "center", behavior: "instant"})`)
		waitJS(t, "the chart holds still", `(top => { const still = window.__chartTop === top; window.__chartTop = top; return still; })(document.querySelector("#chart-allowance").uplot.over.getBoundingClientRect().top)`)
		evalJS[chromedp.Void](t, ctx, `(u => { const r = u.over.getBoundingClientRect();
			const at = (type, x, target) => target.dispatchEvent(new MouseEvent(type, {clientX: r.left + x, clientY: r.top + r.height / 2, movementX: x - 2, bubbles: true, view: window, button: 0}));
			at("mouseenter", 2, u.over); at("mousedown", 2, u.over); at("mousemove", r.width / 2, u.over); at("mouseup", r.width / 2, document); })(document.querySelector("#chart-allowance").uplot)`)
		waitJS(t, "zoomed into a time range", `(u => u.scales.x.max < u.data[0][u.data[0].length - 1] - 0.5)(document.querySelector("#chart-allowance").uplot)`)
		// New samples arrive every two seconds and leave the zoom alone.
		seen := evalJS[int](t, ctx, `document.querySelector("#chart-allowance").uplot.data[0].length`)
		waitJS(t, "still zoomed after new samples", fmt.Sprintf(`(u => u.data[0].length > %d && u.scales.x.max < u.data[0][u.data[0].length - 1] - 0.5)(document.querySelector("#chart-allowance").uplot)`, seen))
		evalJS[chromedp.Void](t, ctx, `(u => u.over.dispatchEvent(new MouseEvent("dblclick", {bubbles: true, view: window})))(document.querySelector("#chart-allowance").uplot)`)
		waitJS(t, "the whole hour again", `(u => u.scales.x.max >= u.data[0][u.data[0].length - 1])(document.querySelector("#chart-allowance").uplot)`)
	})
	t.Run("pages, chips and filters", func(t *testing.T) {
		// Pages, chips and filters: 60 more jobs make a second page of all
		// jobs; the queued chip shows only queued rows, the section filter
		// only that section; the browser never reads the whole snapshot.
		mustStatus(t, call(t, "POST", h.URL+"/admin/reports", operator, map[string]any{"document": "More to page through.",
			"sections": slices.Repeat([]string{"links"}, 60), "idempotency_key": "paging"}), 200)
		waitJS(t, "a second page", `!document.querySelector("#page-next").disabled && document.querySelectorAll("#jobs tbody tr").length === 50`)
		clickJS(t, "the next page", "#page-next")
		waitJS(t, "the second page", `document.querySelector("#jobs-count").textContent.includes("page 2") && !document.querySelector("#page-prev").disabled &&
			document.querySelectorAll("#jobs tbody tr").length > 0 && document.querySelectorAll("#jobs tbody tr").length < 50`)
		clickJS(t, "back", "#page-prev")
		waitJS(t, "the first page again", `document.querySelector("#page-prev").disabled && document.querySelectorAll("#jobs tbody tr").length === 50`)
		clickJS(t, "the queued chip", `#chips button[data-state="queued"]`)
		waitJS(t, "only queued rows", `(rows => rows.length > 0 && rows.every(r => r.dataset.state === "queued"))([...document.querySelectorAll("#jobs tbody tr")]) &&
			document.querySelector('#chips button[data-state="queued"]').classList.contains("on")`)
		evalJS[chromedp.Void](t, ctx, `(s => { s.value = "links"; s.dispatchEvent(new Event("change")); })(document.querySelector("#filter-section"))`)
		waitJS(t, "only queued links", `(rows => rows.length > 0 && rows.every(r => r.dataset.state === "queued" && r.querySelector(".section").textContent === "links"))([...document.querySelectorAll("#jobs tbody tr")])`)
		evalJS[chromedp.Void](t, ctx, `(s => { s.value = ""; s.dispatchEvent(new Event("change")); })(document.querySelector("#filter-section"))`)
		clickJS(t, "every state", `#chips button[data-state="all"]`)
		waitJS(t, "every job again", `document.querySelector('#chips button[data-state="all"]').classList.contains("on") &&
			document.querySelectorAll("#jobs tbody tr").length === 50 && document.querySelector("#jobs tbody tr .pos").textContent === "1"`)
		if n := evalJS[int](t, ctx, `performance.getEntriesByType("resource").filter(r => r.name.includes("/admin/snapshot")).length`); n != 0 {
			t.Fatalf("the console read the whole snapshot %d times", n)
		}
	})
	t.Run("the priority filter", func(t *testing.T) {
		mustStatus(t, call(t, "POST", h.URL+"/admin/reports", operator, map[string]any{"document": "Urgent.",
			"sections": []string{"summary", "terms"}, "idempotency_key": "urgent", "priority": 1}), 200)
		evalJS[chromedp.Void](t, ctx, `(s => { s.value = "1"; s.dispatchEvent(new Event("change")); })(document.querySelector("#filter-priority"))`)
		waitJS(t, "only the priority-1 jobs", `location.search.includes("priority=1") &&
			(rows => rows.length === 2 && rows.every(r => r.querySelector(".priority").textContent === "1"))([...document.querySelectorAll("#jobs tbody tr")])`)
		evalJS[chromedp.Void](t, ctx, `(s => { s.value = ""; s.dispatchEvent(new Event("change")); })(document.querySelector("#filter-priority"))`)
		waitJS(t, "every priority again", `!location.search.includes("priority") && document.querySelectorAll("#jobs tbody tr").length === 50`)
	})
	t.Run("the tenant filter", func(t *testing.T) {
		mustStatus(t, call(t, "POST", h.URL+"/admin/tenants", operator, map[string]any{"name": "team-f"}), 200)
		var res wire.ReportsResult
		mustStatus(t, call(t, "POST", h.URL+"/admin/reports", operator, map[string]any{"document": "A team's.",
			"sections": []string{"summary", "terms"}, "idempotency_key": "team-f", "tenant": "team-f"}), 200).decode(t, &res)
		evalJS[chromedp.Void](t, ctx, `(s => { s.value = "team-f"; s.dispatchEvent(new Event("change")); })(document.querySelector("#filter-tenant"))`)
		waitJS(t, "only team-f's jobs", fmt.Sprintf(`location.search.includes("tenant=team-f") &&
			(rows => rows.length === 2 && rows.map(r => r.dataset.op).sort().join() === %q)([...document.querySelectorAll("#jobs tbody tr")])`,
			strings.Join(slices.Sorted(slices.Values(res.OperationIDs)), ",")))
		evalJS[chromedp.Void](t, ctx, `(s => { s.value = ""; s.dispatchEvent(new Event("change")); })(document.querySelector("#filter-tenant"))`)
		waitJS(t, "every tenant again", `!location.search.includes("tenant") && document.querySelectorAll("#jobs tbody tr").length === 50`)
	})
	t.Run("pause and resume", func(t *testing.T) {
		// Pause claims from the header: the host's claims answer paused, the
		// header says so; resume.
		clickJS(t, "pause claims", "#claims-toggle")
		confirm(t, "confirm the pause")
		waitJS(t, "paused", `document.querySelector("#claims-state").classList.contains("paused") && document.querySelector("#claims-toggle").textContent === "Resume claims"`)
		var pausedClaim wire.ClaimResult
		mustStatus(t, call(t, "POST", h.URL+"/v1/claims", worker, nil), 200).decode(t, &pausedClaim)
		if pausedClaim.Queue != wire.QueuePaused || pausedClaim.Job != nil {
			t.Fatalf("a claim while the console has claims paused: %+v", pausedClaim)
		}
		clickJS(t, "resume claims", "#claims-toggle")
		confirm(t, "confirm the resumption")
		waitJS(t, "resumed", `!document.querySelector("#claims-state").classList.contains("paused") && document.querySelector("#claims-toggle").textContent === "Pause claims"`)
	})
	t.Run("filters in the address and a bulk requeue", func(t *testing.T) {
		// The filters are in the address: the refused chip's view, opened
		// afresh from its address, shows only refused rows with the chip on.
		clickJS(t, "the refused chip", `#chips button[data-state="refused"]`)
		waitJS(t, "the address names the filter", `location.search === "?state=refused"`)
		run(t, "open the address afresh", chromedp.Navigate(h.URL+"/?state=links-not-a-state&section=links"))
		waitJS(t, "an address the host refuses says so", `!document.querySelector("#flash").hidden`)
		run(t, "a deep link", chromedp.Navigate(h.URL+"/?state=queued&section=links"))
		waitJS(t, "the deep link's view", `(rows => rows.length > 0 && rows.every(r => r.dataset.state === "queued" && r.querySelector(".section").textContent === "links"))([...document.querySelectorAll("#jobs tbody tr")]) &&
			document.querySelector('#chips button[data-state="queued"]').classList.contains("on") && document.querySelector("#filter-section").value === "links"`)
		// Bulk: requeue every refused job from the refused chip's view; the
		// confirmation names the count, each job is requeued on its own.
		refusedNow := 0
		for _, j := range getSnapshot(t, h, operator).Jobs {
			if j.State == wire.Refused {
				refusedNow++
			}
		}
		if refusedNow == 0 {
			t.Fatal("no refused job left to requeue in bulk")
		}
		evalJS[chromedp.Void](t, ctx, `(s => { s.value = ""; s.dispatchEvent(new Event("change")); })(document.querySelector("#filter-section"))`)
		waitJS(t, "no section filter", `!location.search.includes("section")`)
		clickJS(t, "the refused chip again", `#chips button[data-state="refused"]`)
		waitJS(t, "only refused rows", `(rows => rows.length > 0 && rows.every(r => r.dataset.state === "refused"))([...document.querySelectorAll("#jobs tbody tr")])`)
		clickJS(t, "requeue them all", "#bulk-requeue")
		waitJS(t, "the confirmation names the count", fmt.Sprintf(`document.querySelector("#confirm").open && document.querySelector("#confirm-text").textContent.startsWith("Requeue %d job(s) matching state refused?")`, refusedNow))
		clickJS(t, "confirm the bulk requeue", "#confirm-ok")
		waitJS(t, "requeued in bulk", fmt.Sprintf(`document.querySelector("#flash").textContent.startsWith("Requeue: %d done, 0 refused")`, refusedNow))
		for _, j := range getSnapshot(t, h, operator).Jobs {
			if j.State == wire.Refused {
				t.Fatalf("job %s still refused after the bulk requeue", j.OperationID)
			}
		}
		clickJS(t, "every state", `#chips button[data-state="all"]`)
	})
	t.Run("formatted counts and a screenshot", func(t *testing.T) {
		// Numbers are formatted: 64 jobs in all.
		waitJS(t, "formatted counts", `/^\d{1,3}(,\d{3})* in all/.test(document.querySelector("#jobs-count").textContent)`)

		evalJS[chromedp.Void](t, ctx, `window.scrollTo(0, 0)`)
		png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
		if err != nil {
			t.Fatalf("screenshot: %v", err)
		}
		shot := filepath.Join(t.TempDir(), "console.png")
		if err := os.WriteFile(shot, png, 0o644); err != nil {
			t.Fatal(err)
		}
		t.Logf("screenshot: %s (%d bytes)", shot, len(png))
	})
}

// newBrowser starts headless Chromium for one test, gone at its end.
func newBrowser(t *testing.T, chromium string, extra ...chromedp.ExecAllocatorOption) context.Context {
	t.Helper()
	alloc, cancelAlloc := chromedp.NewExecAllocator(context.Background(), append(append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(chromium),
		chromedp.NoSandbox,
		chromedp.DisableGPU,
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-dev-shm-usage", true),
		chromedp.WindowSize(1280, 1100),
	), extra...)...)
	browser, cancelBrowser := chromedp.NewContext(alloc, chromedp.WithLogf(t.Logf))
	// Generous: CI runs this beside the crash suites of both backends.
	ctx, cancel := context.WithTimeout(browser, 4*time.Minute)
	t.Cleanup(func() { cancel(); cancelBrowser(); cancelAlloc() })
	return ctx
}

// evalJS evaluates an expression in the page and decodes its value.
func evalJS[T any](t *testing.T, ctx context.Context, js string) T {
	t.Helper()
	v, err := chromedp.Run(ctx, chromedp.Evaluate[T](js))
	if err != nil {
		t.Fatalf("evaluate %s: %v", js, err)
	}
	return v
}

func jobState(t *testing.T, h *hostProcess, operator, op string) wire.JobState {
	t.Helper()
	for _, j := range getSnapshot(t, h, operator).Jobs {
		if j.OperationID == op {
			return j.State
		}
	}
	t.Fatalf("job %s not in the snapshot", op)
	return ""
}
