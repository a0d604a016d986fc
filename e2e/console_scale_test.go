package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/fleet/fleet/internal/wire"
)

// seedJobs adds n queued jobs (in one batch, a document each) to a SQLite
// state that no host serves yet: a fixture, since enqueuing 100,000 jobs
// through the API would take the test longer than the behaviour it
// checks. The seeding program (testdata/seedjobs) is built without the
// race detector: under it, the same inserts cost a minute of CPU.
func seedJobs(t *testing.T, state string, n int, sections []string) {
	t.Helper()
	out, err := exec.Command(filepath.Join(binDir, "tools", "seedjobs"), "-state", state, "-n", fmt.Sprint(n),
		"-sections", strings.Join(sections, ",")).CombinedOutput()
	if err != nil {
		t.Fatalf("seed %d jobs: %v\n%s", n, err, out)
	}
}

// TestConsoleAt100kJobs: the console signs in to a host holding 100,000
// jobs, shows the first page, pages, filters by state and by section, and
// sees a row change state live; it never reads every job. The times it
// takes are logged (BENCHMARKS.md has them), not asserted: speed is
// measured by benchmarks, not by timed tests.
func TestConsoleAt100kJobs(t *testing.T) {
	// Beside the others: its times are logged, not asserted, and its
	// fixture's CPU overlaps their waiting on processes (85 s alone).
	t.Parallel()
	chromium := chromiumPath(t)
	state := initState(t, sampleInput(t, nil))
	seedJobs(t, state, 100_000, []string{"summary", "terms", "actions", "links"})
	h := startHost(t, state, "--lease", "5m")
	operator := credential(t, state, "operator")
	worker := credential(t, state, "worker-1")

	alloc, cancelAlloc := chromedp.NewExecAllocator(context.Background(), append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(chromium), chromedp.NoSandbox, chromedp.DisableGPU,
		chromedp.Flag("disable-background-networking", true), chromedp.Flag("disable-dev-shm-usage", true),
		chromedp.WindowSize(1280, 1100))...)
	defer cancelAlloc()
	browser, cancelBrowser := chromedp.NewContext(alloc, chromedp.WithLogf(t.Logf))
	defer cancelBrowser()
	ctx, cancel := context.WithTimeout(browser, 3*time.Minute)
	defer cancel()
	waitJS := func(what, js string) time.Duration {
		t.Helper()
		started := time.Now()
		if _, err := chromedp.Run(ctx, chromedp.Poll[bool](js, chromedp.WithPollingTimeout(60*time.Second), chromedp.WithPollingInterval(5*time.Millisecond))); err != nil {
			t.Fatalf("%s: waiting for %s: %v", what, js, err)
		}
		return time.Since(started)
	}
	if err := chromedp.Do(ctx, chromedp.Navigate(h.URL+"/"), chromedp.WaitVisible(chromedp.ID("credential")),
		chromedp.SendKeys(chromedp.ID("credential"), operator)); err != nil {
		t.Fatal(err)
	}
	evalJS[chromedp.Void](t, ctx, `document.querySelector("#signin-form button[type=submit]").click()`)
	firstPaint := waitJS("the first page", `document.querySelectorAll("#jobs tbody tr").length === 50 &&
		document.querySelector("#jobs-count").textContent.startsWith("100,004 in all")`)

	evalJS[chromedp.Void](t, ctx, `document.querySelector('#chips button[data-state="queued"]').click()`)
	filterState := waitJS("queued only", `document.querySelector('#chips button[data-state="queued"]').classList.contains("on") &&
		(rows => rows.length === 50 && rows.every(r => r.dataset.state === "queued"))([...document.querySelectorAll("#jobs tbody tr")])`)
	evalJS[chromedp.Void](t, ctx, `(s => { s.value = "links"; s.dispatchEvent(new Event("change")); })(document.querySelector("#filter-section"))`)
	filterSection := waitJS("queued links only", `(rows => rows.length === 50 && rows.every(r => r.querySelector(".section").textContent === "links"))([...document.querySelectorAll("#jobs tbody tr")])`)
	evalJS[chromedp.Void](t, ctx, `document.querySelector("#page-next").click()`)
	nextPage := waitJS("the second page", `document.querySelector("#jobs-count").textContent.includes("page 2") && document.querySelectorAll("#jobs tbody tr").length === 50`)
	evalJS[chromedp.Void](t, ctx, `(s => { s.value = ""; s.dispatchEvent(new Event("change")); })(document.querySelector("#filter-section"))`)
	evalJS[chromedp.Void](t, ctx, `document.querySelector('#chips button[data-state="all"]').click()`)
	waitJS("every state, page 1", `document.querySelector('#chips button[data-state="all"]').classList.contains("on") && document.querySelector("#page-prev").disabled`)

	// A worker claims the oldest job: its row, on the first page, changes live.
	var res wire.ClaimResult
	mustStatus(t, call(t, "POST", h.URL+"/v1/claims", worker, nil), 200).decode(t, &res)
	live := waitJS("the claimed row", fmt.Sprintf(`(r => r !== null && r.dataset.state === "claimed")(document.querySelector('#jobs tbody tr[data-op=%q]'))`, res.Job.OperationID))

	waitJS("the queue depth chart", `(t => t !== null && t.textContent.startsWith("queued 100,00"))(document.querySelector('p.latest[data-chart="depth"] span[data-name="queued"]'))`)
	if live := evalJS[string](t, ctx, `document.querySelector("#live").textContent`); live != "live" {
		t.Fatalf("the console's status reads %q", live)
	}
	heap := evalJS[float64](t, ctx, `performance.memory ? performance.memory.usedJSHeapSize / 1048576 : -1`)
	if n := evalJS[int](t, ctx, `performance.getEntriesByType("resource").filter(r => r.name.includes("/admin/snapshot")).length`); n != 0 {
		t.Fatalf("the console read every job %d times", n)
	}
	png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatalf("screenshot: %v", err)
	}
	shot := filepath.Join(t.TempDir(), "console-100k.png")
	if err := os.WriteFile(shot, png, 0o644); err != nil {
		t.Fatal(err)
	}
	// FLEET_CONSOLE_SCREENSHOT copies it out, to refresh the README's.
	if dst := os.Getenv("FLEET_CONSOLE_SCREENSHOT"); dst != "" {
		if err := os.WriteFile(dst, png, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("screenshot: %s (%d bytes)", shot, len(png))
	t.Logf("100,004 jobs: first page %v after sign-in; state filter %v; section filter %v; next page %v; a claim shown %v; JS heap %.1f MiB",
		firstPaint.Round(time.Millisecond), filterState.Round(time.Millisecond), filterSection.Round(time.Millisecond),
		nextPage.Round(time.Millisecond), live.Round(time.Millisecond), heap)
}
