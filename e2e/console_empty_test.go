package e2e

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
)

// streamsOpen is the host's count of open event streams.
func streamsOpen(t *testing.T, h *hostProcess, operator string) int {
	t.Helper()
	return int(metricValue(t, h, operator, "fleet_event_streams_open"))
}

// metricValue is the value of the host's unlabelled metric name, as its
// /metrics says.
func metricValue(t *testing.T, h *hostProcess, operator, name string) float64 {
	t.Helper()
	metrics := string(mustStatus(t, call(t, "GET", h.URL+"/metrics", operator, nil), 200).Body)
	for _, line := range strings.Split(metrics, "\n") {
		if rest, ok := strings.CutPrefix(line, name+" "); ok {
			n, err := strconv.ParseFloat(rest, 64)
			if err != nil {
				t.Fatal(err)
			}
			return n
		}
	}
	t.Fatalf("no %s in /metrics", name)
	return 0
}

// TestConsoleEmptyView (issue 34): a bookmarked view that matches nothing
// opens with its filter's chip to click out of it and no rows, while
// events arrive; the page never holds more than one event stream; and
// after its host goes away and comes back, it asks to sign in again and
// then holds one stream on the new host. (The old console threw on the
// empty page's null list at every event, reconnecting its stream each
// second without closing the old one, until the browser had six
// connections to the host and sent nothing more.)
func TestConsoleEmptyView(t *testing.T) {
	chromium := chromiumPath(t)
	t.Parallel()
	state := initState(t, sampleInput(t, nil))
	h := startHost(t, state)
	operator := credential(t, state, "operator")
	ctx := newBrowser(t, chromium)
	waitJS := func(what, js string) {
		t.Helper()
		if _, err := chromedp.Run(ctx, chromedp.Poll[bool](js, chromedp.WithPollingTimeout(30*time.Second))); err != nil {
			t.Fatalf("%s: waiting for %s: %v\nhost log:\n%s", what, js, err, h.log)
		}
	}
	signInPage := func(what string) {
		t.Helper()
		if err := chromedp.Do(ctx,
			chromedp.WaitVisible(chromedp.ID("credential")),
			chromedp.SendKeys(chromedp.ID("credential"), operator),
			chromedp.Click(chromedp.CSS("#signin-form button[type=submit]")),
			chromedp.WaitVisible(chromedp.ID("app")),
		); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}

	if err := chromedp.Do(ctx, chromedp.Navigate(h.URL+"/?state=failed")); err != nil {
		t.Fatal(err)
	}
	signInPage("sign in on a bookmarked empty view")
	waitJS("the failed chip, pressed, at 0", `(c => c !== null && c.classList.contains("on") && c.textContent === "failed 0")(document.querySelector('#chips button[data-state="failed"]'))`)
	waitJS("no rows", `document.querySelectorAll("#jobs tbody tr").length === 0 && document.querySelector("#jobs-count").textContent.includes("showing 0")`)
	// Events arrive while the empty view is on screen: a worker runs the
	// queue (two completed, two refused).
	startWorker(t, h.URL, state, "worker-1").wait(t, 60*time.Second)
	for range 8 {
		if n := streamsOpen(t, h, operator); n > 1 {
			t.Fatalf("the page holds %d event streams on an empty view; want 1", n)
		}
		time.Sleep(500 * time.Millisecond)
	}
	waitJS("the stream is live", `document.querySelector("#live").textContent === "live"`)
	evalJS[chromedp.Void](t, ctx, `document.querySelector('#chips button[data-state="all"]').click()`)
	waitJS("the rows once the filter is left", `document.querySelectorAll("#jobs tbody tr").length === 4 && !location.search.includes("state")`)

	// The host goes away and comes back on its address: the page says it
	// is reconnecting, then (its session was the old process's) asks to
	// sign in again, and then holds one stream on the new host.
	addr := h.addr()
	h.kill()
	waitJS("reconnecting", `document.querySelector("#live").textContent === "reconnecting"`)
	h = startHost(t, state, "--listen", addr)
	waitJS("asked to sign in again", `!document.querySelector("#signin").hidden`)
	signInPage("sign in again")
	waitJS("live again", `document.querySelector("#live").textContent === "live"`)
	waitFor(t, 10*time.Second, "one stream on the new host", func() bool { return streamsOpen(t, h, operator) == 1 })
	if got := evalJS[int](t, ctx, `document.querySelectorAll("#jobs tbody tr").length`); got != 4 {
		t.Fatalf("%d rows after signing in again; want 4", got)
	}
}

// consolePage is the console in a headless Chromium, signed in as the
// operator, for a test to drive.
type consolePage struct {
	t   *testing.T
	ctx context.Context
}

// openConsole starts Chromium on h's console at path and signs in.
func openConsole(t *testing.T, chromium string, h *hostProcess, operator, path string) consolePage {
	t.Helper()
	p := consolePage{t: t, ctx: newBrowser(t, chromium)}
	if err := chromedp.Do(p.ctx,
		chromedp.Navigate(h.URL+path),
		chromedp.WaitVisible(chromedp.ID("credential")),
		chromedp.SendKeys(chromedp.ID("credential"), operator),
		chromedp.Click(chromedp.CSS("#signin-form button[type=submit]")),
		chromedp.WaitVisible(chromedp.ID("app")),
	); err != nil {
		t.Fatalf("sign in to the console: %v", err)
	}
	return p
}

// wait polls a JavaScript condition in the page until it holds.
func (p consolePage) wait(what, js string) {
	p.t.Helper()
	if _, err := chromedp.Run(p.ctx, chromedp.Poll[bool](js, chromedp.WithPollingTimeout(30*time.Second))); err != nil {
		p.t.Fatalf("%s: waiting for %s: %v", what, js, err)
	}
}

// click clicks an element through the DOM once it exists.
func (p consolePage) click(what, sel string) {
	p.t.Helper()
	p.wait(what, fmt.Sprintf(`document.querySelector(%q) !== null`, sel))
	evalJS[chromedp.Void](p.t, p.ctx, fmt.Sprintf(`document.querySelector(%q).click()`, sel))
}
