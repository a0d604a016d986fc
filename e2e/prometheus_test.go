package e2e

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// prometheusPath is Prometheus's binary, or the test is skipped (failed
// under FLEET_REQUIRE_PROMETHEUS, as .ci/run sets it).
func prometheusPath(t *testing.T) string {
	return toolPath(t, "prometheus", "Prometheus", "FLEET_REQUIRE_PROMETHEUS", "apt-get install prometheus")
}

// toolPath is the named tool's binary on PATH. Without one the test (what)
// is skipped, saying how to install it, or fails when require is set, as
// .ci/run sets it.
func toolPath(t *testing.T, name, what, require, install string) string {
	t.Helper()
	if path, err := exec.LookPath(name); err == nil {
		return path
	}
	if os.Getenv(require) != "" {
		t.Fatalf("no %s on PATH and %s is set; %s", name, require, install)
	}
	t.Skipf("SKIPPED the %s test: no %s on PATH (%s); .ci/run installs it and requires it", what, name, install)
	return ""
}

// promQuery runs an instant query on the Prometheus at base: its series'
// labels and values.
func promQuery(t *testing.T, base, query string) []struct {
	Metric map[string]string `json:"metric"`
	Value  [2]any            `json:"value"`
} {
	t.Helper()
	resp, err := http.Get(base + "/api/v1/query?query=" + url.QueryEscape(query))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	var res struct {
		Status string `json:"status"`
		Error  string `json:"error"`
		Data   struct {
			Result []struct {
				Metric map[string]string `json:"metric"`
				Value  [2]any            `json:"value"`
			} `json:"result"`
		} `json:"data"`
	}
	if err := json.Unmarshal(body, &res); err != nil || res.Status != "success" {
		t.Fatalf("query %s: %s %s", query, res.Error, body)
	}
	return res.Data.Result
}

// TestDashboardOnPrometheus (issue 34): a real Prometheus scrapes the
// hosts with the operator's credential, and every query of the Grafana
// dashboard (its Host variable set to every host) is valid and returns
// data; jobs by state counts each job once, however many hosts serve the
// database (summed over two hosts, it would count each twice).
func TestDashboardOnPrometheus(t *testing.T) {
	prometheus := prometheusPath(t)
	t.Parallel()
	backendStates(t, func(m map[string]any) { m["allowance"] = 1000 }, func(t *testing.T, state string, hosts []*hostProcess) {
		startWorker(t, hosts[0].URL, state, "worker-1").wait(t, 60*time.Second) // four completed
		dir := t.TempDir()
		var targets []string
		for _, h := range hosts {
			targets = append(targets, strconv.Quote(h.addr()))
		}
		config := fmt.Sprintf(`global: {scrape_interval: 1s, evaluation_interval: 1s}
scrape_configs:
  - job_name: fleet
    authorization: {type: Bearer, credentials_file: %q}
    static_configs: [{targets: [%s]}]
`, filepath.Join(state, "credentials", "operator"), strings.Join(targets, ", "))
		if err := os.WriteFile(filepath.Join(dir, "prometheus.yml"), []byte(config), 0o600); err != nil {
			t.Fatal(err)
		}
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addr := ln.Addr().String()
		ln.Close()
		cmd := exec.Command(prometheus, "--config.file="+filepath.Join(dir, "prometheus.yml"), "--storage.tsdb.path="+filepath.Join(dir, "data"),
			"--web.listen-address="+addr)
		log, _ := os.Create(filepath.Join(dir, "prometheus.log"))
		cmd.Stdout, cmd.Stderr = log, log
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait(); log.Close() })
		base := "http://" + addr
		waitFor(t, 60*time.Second, "every host scraped three times", func() bool {
			resp, err := http.Get(base + "/-/ready")
			if err != nil {
				return false
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				return false // starting: its queries are 503 until it is ready
			}
			up := promQuery(t, base, `count_over_time(up{job="fleet"}[1m]) >= 3 and up{job="fleet"} == 1`)
			return len(up) == len(hosts)
		})

		var dash struct {
			Panels []struct {
				Title   string
				Targets []struct{ Expr string }
			}
		}
		raw, err := os.ReadFile("../docs/grafana/fleet.json")
		if err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal(raw, &dash); err != nil {
			t.Fatal(err)
		}
		queries, completed := 0, ""
		for _, p := range dash.Panels {
			for _, q := range p.Targets {
				queries++
				expr := strings.ReplaceAll(q.Expr, "$instance", ".*")
				got := promQuery(t, base, expr)
				if len(got) == 0 {
					t.Errorf("panel %q: %s returns no data", p.Title, expr)
				}
				for _, s := range got {
					if p.Title == "Jobs by state" && s.Metric["state"] == "completed" {
						completed, _ = s.Value[1].(string)
					}
				}
			}
		}
		if queries < 18 {
			t.Fatalf("%d queries", queries)
		}
		if completed != "4" {
			t.Fatalf("the jobs by state panel reads %q completed over %d host(s); want 4", completed, len(hosts))
		}
	})
}
