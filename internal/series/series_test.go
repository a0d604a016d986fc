package series_test

import (
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/fleet/fleet/internal/series"
	"github.com/fleet/fleet/internal/wire"
)

// TestRecorder: a second's counts and latency percentiles close into a
// sample at its tick, the next second starts empty, After reads what is
// newer than a time, and no more than an hour is kept.
func TestRecorder(t *testing.T) {
	r := series.New()
	start := time.Unix(1_000_000, 0)
	r.Completed()
	r.Completed()
	r.Refused()
	for i := 1; i <= 100; i++ {
		r.Observe("publish", time.Duration(i)*time.Millisecond)
	}
	for range 5000 { // past the reservoir: percentiles still near the truth
		r.Observe("claim", 10*time.Millisecond)
	}
	r.Tick(start, map[wire.JobState]int64{wire.Queued: 7}, wire.Accounting{Spent: 40, Reserved: 20, Available: 40})
	r.Failed()
	r.Tick(start.Add(time.Second), map[wire.JobState]int64{wire.Queued: 6}, wire.Accounting{Spent: 60})

	all := r.After(0)
	if len(all) != 2 {
		t.Fatalf("%d samples", len(all))
	}
	s := all[0]
	if s.T != start.Unix() || s.Completed != 2 || s.Refused != 1 || s.Failed != 0 || s.Jobs[wire.Queued] != 7 || s.Spent != 40 || s.Reserved != 20 {
		t.Fatalf("first sample %+v", s)
	}
	if p := s.Latency["publish"]; p.P50 != 51 || p.P99 != 100 || p.N != 100 {
		t.Fatalf("publish latency %+v, want p50 51 ms, p99 100 ms of 100", p)
	}
	if c := s.Latency["claim"]; c.P50 != 10 || c.P99 != 10 || c.N != 5000 {
		t.Fatalf("claim latency %+v", c)
	}
	if next := all[1]; next.Completed != 0 || next.Failed != 1 || len(next.Latency) != 0 {
		t.Fatalf("the second second did not start empty: %+v", next)
	}
	if newer := r.After(start.Unix()); len(newer) != 1 || newer[0].T != start.Unix()+1 {
		t.Fatalf("after the first second: %+v", newer)
	}
	if none := r.After(start.Unix() + 10); none == nil || len(none) != 0 {
		t.Fatalf("nothing newer must be an empty list (JSON []), got %#v", none)
	}
	for i := range series.Kept + 10 {
		r.Tick(start.Add(time.Duration(2+i)*time.Second), nil, wire.Accounting{})
	}
	if kept := r.After(0); len(kept) != series.Kept || kept[len(kept)-1].T != start.Unix()+int64(series.Kept+11) {
		t.Fatalf("kept %d samples, the newest at %d", len(kept), kept[len(kept)-1].T)
	}
}

// TestSaveAndLoad: a saved hour comes back, less what is over an hour old
// and what overlaps the samples already held.
func TestSaveAndLoad(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	r := series.New()
	for _, at := range []time.Time{now.Add(-2 * time.Hour), now.Add(-30 * time.Minute), now.Add(-2 * time.Second)} {
		r.Tick(at, map[wire.JobState]int64{}, wire.Accounting{Spent: at.Unix() % 100})
	}
	path := filepath.Join(t.TempDir(), "series.json")
	if err := r.Save(path); err != nil {
		t.Fatal(err)
	}
	next := series.New()
	next.Tick(now.Add(-2*time.Second), map[wire.JobState]int64{}, wire.Accounting{})
	if err := next.Load(path, now); err != nil {
		t.Fatal(err)
	}
	var got []int64
	for _, s := range next.After(0) {
		got = append(got, s.T)
	}
	if want := []int64{now.Add(-30 * time.Minute).Unix(), now.Add(-2 * time.Second).Unix()}; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("loaded %v; want %v", got, want)
	}
	if err := series.New().Load(filepath.Join(t.TempDir(), "none.json"), now); err != nil {
		t.Fatalf("nothing saved: %v", err)
	}
}

// TestTenantBurn: the tenants' spent, read every so often, closes into the
// sample of that second as what each spent since the reading before (a
// period that started again counts its spent since); the first reading
// is only a baseline; a sample names at most the 16 that spent most and
// adds up the rest under "(others)"; samples between readings carry none.
func TestTenantBurn(t *testing.T) {
	r := series.New()
	start := time.Unix(1_000_000, 0)
	spent := map[string]int64{"team-a": 100, "team-b": 50}
	for i := range 20 {
		spent[fmt.Sprintf("small-%02d", i)] = 0
	}
	r.ObserveTenants(start, spent)
	r.Tick(start, nil, wire.Accounting{})
	r.Tick(start.Add(time.Second), nil, wire.Accounting{})
	next := map[string]int64{"team-a": 160, "team-b": 20, "team-new": 7} // team-b's period started again
	for i := range 20 {
		next[fmt.Sprintf("small-%02d", i)] = int64(i + 1)
	}
	r.ObserveTenants(start.Add(10*time.Second), next)
	r.Tick(start.Add(10*time.Second), nil, wire.Accounting{})
	all := r.After(0)
	if len(all) != 3 || all[0].Tenants != nil || all[1].Tenants != nil {
		t.Fatalf("the baseline's and an unread second's samples carry tenants: %+v", all)
	}
	got := all[2].Tenants
	if got == nil || got.IntervalS != 10 || len(got.Burn) != 17 {
		t.Fatalf("the second reading: %+v", got)
	}
	// The 16 that spent most: team-a 60, team-b 20, small-19..small-06
	// (20..7; small-06 before team-new's 7 by name); the rest, small-00..
	// small-05 (1..6) and team-new, add up under "(others)".
	want := map[string]int64{"team-a": 60, "team-b": 20, series.OtherTenants: 1 + 2 + 3 + 4 + 5 + 6 + 7}
	for i := 6; i < 20; i++ {
		want[fmt.Sprintf("small-%02d", i)] = int64(i + 1)
	}
	for name, v := range want {
		if got.Burn[name] != v {
			t.Errorf("%s burned %d, want %d (all: %v)", name, got.Burn[name], v, got.Burn)
		}
	}
	// Saved and loaded back, the tenants' burn is still there.
	path := filepath.Join(t.TempDir(), "series.json")
	if err := r.Save(path); err != nil {
		t.Fatal(err)
	}
	back := series.New()
	if err := back.Load(path, start.Add(20*time.Second)); err != nil {
		t.Fatal(err)
	}
	if s := back.After(0); len(s) != 3 || s[2].Tenants == nil || s[2].Tenants.Burn["team-a"] != 60 {
		t.Fatalf("loaded: %+v", s)
	}
}
