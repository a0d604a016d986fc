// Package metrics is the host's Prometheus instrumentation. Counters are
// incremented after the transaction they describe commits; gauges of jobs
// and credits are read from the database at scrape time, so they can never
// drift from it.
package metrics

import (
	"context"
	"net/http"
	"time"

	"github.com/fleet/fleet/internal/wire"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Snapshot is what the scrape-time collector reads.
type Snapshot struct {
	JobsByState map[wire.JobState]int64
	Accounting  wire.Accounting
	// BatchReruns counts write batches rolled back and run again after
	// losing a race to another host (PostgreSQL); 0 on SQLite.
	BatchReruns int64
	// ClaimsPaused is whether the operator paused claims.
	ClaimsPaused bool
	// Tenants are each tenant's figures: the label's values are the
	// operator's tenants, at most fleet-host --max-tenants of them.
	Tenants []wire.TenantFigures
}

// Metrics holds one host's metrics in its own registry.
type Metrics struct {
	registry       *prometheus.Registry
	admissions     *prometheus.CounterVec
	publications   *prometheus.CounterVec
	replays        prometheus.Counter
	leaseExpiries  *prometheus.CounterVec
	httpDuration   *prometheus.HistogramVec
	commitDuration prometheus.Histogram
	commitBatch    prometheus.Histogram
	refused        *prometheus.CounterVec
	failures       *prometheus.CounterVec
	signIns        *prometheus.CounterVec
	streamsClosed  prometheus.Counter
	streamsOpen    prometheus.Gauge
	queueWait      prometheus.Histogram
	runTime        prometheus.Histogram
}

// New registers the metrics; read is called at each scrape.
func New(read func(ctx context.Context) (Snapshot, error)) *Metrics {
	m := &Metrics{
		registry: prometheus.NewRegistry(),
		admissions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fleet_admissions_total", Help: "Admission decisions, by decision (allow, deny).",
		}, []string{"decision"}),
		publications: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fleet_publications_total", Help: "Publication decisions, by outcome (published, superseded, version_conflict, rejected).",
		}, []string{"outcome"}),
		replays: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "fleet_publication_replays_total", Help: "Publications answered from their retained outcome.",
		}),
		leaseExpiries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fleet_lease_expiries_total", Help: "Expired leases, by the state the job moved to (queued, unresolved).",
		}, []string{"state"}),
		httpDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "fleet_http_request_duration_seconds", Help: "HTTP request duration, by route template, method and status code.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 14),
		}, []string{"route", "method", "code"}),
		commitDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "fleet_commit_duration_seconds", Help: "Duration of each SQLite commit (one per group-commit batch).",
			Buckets: prometheus.ExponentialBuckets(0.0002, 2, 14),
		}),
		failures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fleet_job_failures_total", Help: "Failed attempts, by class (retryable or permanent, as the worker reported it; lease_expired: a claim that lapsed before dispatch) and by what followed (queued: a retry; failed: none left).",
		}, []string{"class", "then"}),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fleet_http_requests_refused_total", Help: "Requests refused before serving, by reason (busy: no slot for the host or the credential; rate_limited: a worker credential over its rate; memory: no room in --body-memory for its body).",
		}, []string{"reason"}),
		signIns: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fleet_console_sign_ins_total", Help: "Console sign-ins, by outcome (ok; failed: an unknown or non-operator credential; throttled: refused 429 past the failure budget of the address or of the host).",
		}, []string{"outcome"}),
		streamsClosed: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "fleet_event_streams_closed_total", Help: "Event streams the host closed to make room for a new one (past --max-streams, the oldest goes first).",
		}),
		streamsOpen: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "fleet_event_streams_open", Help: "Event streams open now (the console holds one per tab).",
		}),
		// Buckets double from 1 ms to 2.3 h: a quantile read from them is
		// off by at most a factor of 2 (quadrupling ones read a p99 of
		// 1,030 s where no job waited 7 minutes).
		queueWait: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "fleet_job_queue_wait_seconds", Help: "How long each claimed job waited, from when it became claimable (enqueued, or its retry's backoff over) to its claim.",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 24),
		}),
		runTime: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "fleet_job_run_seconds", Help: "How long each completed job ran, from its dispatch being allowed to the publication that completed it.",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 24),
		}),
		commitBatch: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "fleet_commit_requests", Help: "Write requests sharing each commit.",
			Buckets: []float64{1, 2, 4, 8, 16, 32, 64, 128, 256},
		}),
	}
	m.startAtZero()
	m.registry.MustRegister(m.admissions, m.publications, m.replays, m.leaseExpiries, m.httpDuration,
		m.commitDuration, m.commitBatch, m.refused, m.failures, m.signIns, m.streamsClosed, m.streamsOpen, m.queueWait, m.runTime, &stateCollector{read: read},
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// startAtZero creates every labelled counter's series for each label value
// it can take, so that each is exported at 0 from the start: a dashboard
// after a restart reads 0, not "No data", and a rate over it is defined.
func (m *Metrics) startAtZero() {
	for _, d := range []wire.Decision{wire.DecisionAllow, wire.DecisionDeny} {
		m.admissions.WithLabelValues(string(d))
	}
	for _, st := range []wire.Status{wire.StatusPublished, wire.StatusSuperseded, wire.StatusVersionConflict, wire.StatusRejected} {
		m.publications.WithLabelValues(string(st))
	}
	for _, st := range []wire.JobState{wire.Queued, wire.Unresolved, wire.Failed} {
		m.leaseExpiries.WithLabelValues(string(st))
	}
	for _, f := range [][2]string{{"retryable", "queued"}, {"retryable", "failed"}, {"permanent", "failed"},
		{"lease_expired", "queued"}, {"lease_expired", "failed"}} {
		m.failures.WithLabelValues(f[0], f[1])
	}
	for _, r := range []string{"busy", "rate_limited", "memory"} {
		m.refused.WithLabelValues(r)
	}
	for _, o := range []string{"ok", "failed", "throttled"} {
		m.signIns.WithLabelValues(o)
	}
}

// Handler serves the registry in the Prometheus text format.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.registry, promhttp.HandlerOpts{})
}

// Admission counts an admission decision.
func (m *Metrics) Admission(decision string) { m.admissions.WithLabelValues(decision).Inc() }

// Publication counts a publication decision.
func (m *Metrics) Publication(outcome string) { m.publications.WithLabelValues(outcome).Inc() }

// Replay counts a publication answered from its retained outcome.
func (m *Metrics) Replay() { m.replays.Inc() }

// LeaseExpired counts an expired lease.
func (m *Metrics) LeaseExpired(state string) { m.leaseExpiries.WithLabelValues(state).Inc() }

// Request observes one HTTP request.
func (m *Metrics) Request(route, method, code string, d time.Duration) {
	m.httpDuration.WithLabelValues(route, method, code).Observe(d.Seconds())
}

// SignIn counts a console sign-in by outcome (ok, failed, throttled).
func (m *Metrics) SignIn(outcome string) { m.signIns.WithLabelValues(outcome).Inc() }

// StreamClosed counts an event stream closed to make room for a newer one.
func (m *Metrics) StreamClosed() { m.streamsClosed.Inc() }

// StreamsOpen moves the count of open event streams by delta (1 as one
// opens, -1 as it ends).
func (m *Metrics) StreamsOpen(delta int) { m.streamsOpen.Add(float64(delta)) }

// Refused counts a request refused before it was served ("busy",
// "rate_limited", "memory").
func (m *Metrics) Refused(reason string) { m.refused.WithLabelValues(reason).Inc() }

// Failure counts a failed attempt by its class and the state its job went
// to.
func (m *Metrics) Failure(class, then string) { m.failures.WithLabelValues(class, then).Inc() }

// Waited observes how long a claimed job waited to be claimed.
func (m *Metrics) Waited(d time.Duration) { m.queueWait.Observe(d.Seconds()) }

// Ran observes how long a completed job ran.
func (m *Metrics) Ran(d time.Duration) { m.runTime.Observe(d.Seconds()) }

// Commit observes one commit of a batch of requests.
func (m *Metrics) Commit(requests int, d time.Duration) {
	m.commitDuration.Observe(d.Seconds())
	m.commitBatch.Observe(float64(requests))
}

var (
	jobsDesc    = prometheus.NewDesc("fleet_jobs", "Jobs, by state.", []string{"state"}, nil)
	creditsDesc = prometheus.NewDesc("fleet_credits", "The shared allowance, by kind (allowance, spent, reserved, available).", []string{"kind"}, nil)
	rerunsDesc  = prometheus.NewDesc("fleet_batch_reruns_total", "Write batches rolled back and run again after losing a race to another host (PostgreSQL).", nil, nil)
	scrapeDesc  = prometheus.NewDesc("fleet_state_scrape_error", "1 when reading jobs and credits from the database failed at this scrape.", nil, nil)
	pausedDesc  = prometheus.NewDesc("fleet_claims_paused", "1 while the operator has claims paused (every claim answers with no job), else 0.", nil, nil)
	tenantDesc  = prometheus.NewDesc("fleet_tenant_credits",
		"Each tenant's figures, by kind (allowance, only for a tenant with one of its own; spent this period, reserved, available).", []string{"tenant", "kind"}, nil)
)

type stateCollector struct {
	read func(ctx context.Context) (Snapshot, error)
}

func (c *stateCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- jobsDesc
	ch <- creditsDesc
	ch <- rerunsDesc
	ch <- scrapeDesc
	ch <- pausedDesc
	ch <- tenantDesc
}

func (c *stateCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	s, err := c.read(ctx)
	if err != nil {
		ch <- prometheus.MustNewConstMetric(scrapeDesc, prometheus.GaugeValue, 1)
		return
	}
	ch <- prometheus.MustNewConstMetric(scrapeDesc, prometheus.GaugeValue, 0)
	ch <- prometheus.MustNewConstMetric(rerunsDesc, prometheus.CounterValue, float64(s.BatchReruns))
	paused := 0.0
	if s.ClaimsPaused {
		paused = 1
	}
	ch <- prometheus.MustNewConstMetric(pausedDesc, prometheus.GaugeValue, paused)
	// Every state is reported, even when no job is in it, so a dashboard
	// sees zeros rather than gaps.
	for _, st := range wire.JobStates {
		ch <- prometheus.MustNewConstMetric(jobsDesc, prometheus.GaugeValue, float64(s.JobsByState[st]), string(st))
	}
	a := s.Accounting
	for kind, v := range map[string]int64{"allowance": a.Allowance, "spent": a.Spent, "reserved": a.Reserved, "available": a.Available} {
		ch <- prometheus.MustNewConstMetric(creditsDesc, prometheus.GaugeValue, float64(v), kind)
	}
	for _, t := range s.Tenants {
		if t.Allowance != nil {
			ch <- prometheus.MustNewConstMetric(tenantDesc, prometheus.GaugeValue, float64(*t.Allowance), t.Name, "allowance")
		}
		for kind, v := range map[string]int64{"spent": t.Spent, "reserved": t.Reserved, "available": t.Available} {
			ch <- prometheus.MustNewConstMetric(tenantDesc, prometheus.GaugeValue, float64(v), t.Name, kind)
		}
	}
}
