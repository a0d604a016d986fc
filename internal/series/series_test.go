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
