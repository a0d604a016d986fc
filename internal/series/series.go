// Package series keeps a host's last hour as per-second samples for the
// console's charts: completions, refusals and failures per second, jobs by
// state, the allowance, request latency percentiles, and every so often
// what each tenant spent. It is bounded: one sample a second, an hour of
// them, at most a fixed number of latencies per request kind per second,
// and of tenants per sample.
package series

import (
	"cmp"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/fleet/fleet/internal/wire"
)

// Kept is how many seconds of samples are kept.
const Kept = 3600

// perSecond bounds the latencies kept per request kind in one second; past
// it, one replaces a random kept one (reservoir sampling), so percentiles
// stay fair under load.
const perSecond = 512

// Latency is a second's percentiles of one request kind, in milliseconds.
type Latency struct {
	P50 float64 `json:"p50_ms"`
	P99 float64 `json:"p99_ms"`
	N   int     `json:"n"`
}

// Sample is one second.
type Sample struct {
	T         int64                   `json:"t"` // unix seconds
	Completed int64                   `json:"completed"`
	Refused   int64                   `json:"refused"`
	Failed    int64                   `json:"failed"`
	Jobs      map[wire.JobState]int64 `json:"jobs"`
	Spent     int64                   `json:"spent"`
	Reserved  int64                   `json:"reserved"`
	Available int64                   `json:"available"`
	// Latency: the requests claim, dispatch and publish; queue_wait (of
	// the jobs claimed) and run (of the jobs completed).
	Latency map[string]Latency `json:"latency"`
	// Tenants is what the tenants spent since the reading before, in the
	// seconds the host read their figures (every TenantsEvery); nil in
	// the others.
	Tenants *TenantBurn `json:"tenants,omitempty"`
}

// TenantsEvery is how often, in seconds, the host reads what each tenant
// has spent for the series.
const TenantsEvery = 10

// MaxBurnTenants bounds the tenants a sample names: the ones that spent
// most; the rest add up under OtherTenants.
const MaxBurnTenants = 16

// OtherTenants names, in a sample, what the tenants past MaxBurnTenants
// spent between them. No tenant has the name (one has no parentheses).
const OtherTenants = "(others)"

// TenantBurn is what the tenants spent over IntervalS seconds: a credit
// count per tenant that spent any, the most MaxBurnTenants by name, the
// rest under OtherTenants.
type TenantBurn struct {
	IntervalS int64            `json:"interval_s"`
	Burn      map[string]int64 `json:"burn"`
}

// Recorder collects the current second and keeps the samples.
type Recorder struct {
	mu        sync.Mutex
	completed int64
	refused   int64
	failed    int64
	latencies map[string][]float64
	seen      map[string]int
	samples   []Sample // oldest first, at most Kept
	rnd       uint64
	// The tenants' spent at the last reading, and when; the burn since
	// the one before, for the next sample.
	tenantsSpent map[string]int64
	tenantsAt    time.Time
	burn         *TenantBurn
}

// New makes an empty recorder.
func New() *Recorder {
	return &Recorder{latencies: map[string][]float64{}, seen: map[string]int{}, rnd: 0x9e3779b97f4a7c15}
}

// Completed, Refused and Failed count one of each in the current second.
func (r *Recorder) Completed() { r.mu.Lock(); r.completed++; r.mu.Unlock() }
func (r *Recorder) Refused()   { r.mu.Lock(); r.refused++; r.mu.Unlock() }
func (r *Recorder) Failed()    { r.mu.Lock(); r.failed++; r.mu.Unlock() }

// Observe records one request of kind (claim, dispatch, publish) taking
// d, or a job's queue_wait or run.
func (r *Recorder) Observe(kind string, d time.Duration) {
	ms := float64(d.Microseconds()) / 1000
	r.mu.Lock()
	defer r.mu.Unlock()
	r.seen[kind]++
	kept := r.latencies[kind]
	if len(kept) < perSecond {
		r.latencies[kind] = append(kept, ms)
		return
	}
	// xorshift: cheap, and only fairness matters here.
	r.rnd ^= r.rnd << 13
	r.rnd ^= r.rnd >> 7
	r.rnd ^= r.rnd << 17
	if i := int(r.rnd % uint64(r.seen[kind])); i < perSecond {
		kept[i] = ms
	}
}

// ObserveTenants takes what each tenant has spent (its period's figure)
// as read now, for the sample the next Tick closes: what each spent since
// the reading before. A tenant whose spent fell started a new period, and
// counts what it has spent in it. The first reading is only a baseline.
func (r *Recorder) ObserveTenants(now time.Time, spent map[string]int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	prev, at := r.tenantsSpent, r.tenantsAt
	r.tenantsSpent, r.tenantsAt = spent, now
	if prev == nil {
		return
	}
	type burned struct {
		name    string
		credits int64
	}
	var all []burned
	for name, v := range spent {
		if d := v - prev[name]; d > 0 {
			all = append(all, burned{name, d})
		} else if d < 0 && v > 0 {
			all = append(all, burned{name, v})
		}
	}
	slices.SortFunc(all, func(a, b burned) int {
		return cmp.Or(cmp.Compare(b.credits, a.credits), strings.Compare(a.name, b.name))
	})
	b := &TenantBurn{IntervalS: int64(now.Sub(at).Round(time.Second) / time.Second), Burn: map[string]int64{}}
	for i, x := range all {
		if i < MaxBurnTenants {
			b.Burn[x.name] = x.credits
		} else {
			b.Burn[OtherTenants] += x.credits
		}
	}
	r.burn = b
}

// Tick closes the second ending at now with the state as it stands, and
// starts the next.
func (r *Recorder) Tick(now time.Time, jobs map[wire.JobState]int64, a wire.Accounting) {
	r.mu.Lock()
	defer r.mu.Unlock()
	s := Sample{T: now.Unix(), Completed: r.completed, Refused: r.refused, Failed: r.failed, Jobs: jobs,
		Spent: a.Spent, Reserved: a.Reserved, Available: a.Available, Latency: map[string]Latency{}, Tenants: r.burn}
	r.burn = nil
	for kind, ms := range r.latencies {
		slices.Sort(ms)
		s.Latency[kind] = Latency{P50: ms[len(ms)/2], P99: ms[len(ms)*99/100], N: r.seen[kind]}
	}
	r.completed, r.refused, r.failed = 0, 0, 0
	r.latencies, r.seen = map[string][]float64{}, map[string]int{}
	if len(r.samples) == Kept {
		copy(r.samples, r.samples[1:])
		r.samples = r.samples[:Kept-1]
	}
	r.samples = append(r.samples, s)
}

// After is the samples later than unix second t, oldest first.
func (r *Recorder) After(t int64) []Sample {
	r.mu.Lock()
	defer r.mu.Unlock()
	i, _ := slices.BinarySearchFunc(r.samples, t+1, func(s Sample, t int64) int {
		switch {
		case s.T < t:
			return -1
		case s.T > t:
			return 1
		}
		return 0
	})
	return append([]Sample{}, r.samples[i:]...) // never nil: JSON [] , not null
}
