// Package host is the authoritative host: every operation of the fleet is
// one function here that runs one transaction in which the checks and the
// writes that must agree happen together (claim and generation, expected
// version, operation record, reservation, job state, receipt, event).
//
// Where to look: claim.go (claim, dispatch, heartbeat), publish.go and
// binding.go, fail.go, operator.go (cancel, requeue, reconcile, assign,
// allowance, reports), credentials.go, registry.go (start, stop, liveness,
// retiring gone hosts), lifecycle.go (lease expiry), reads.go, auth.go,
// init.go, and tx.go for the transaction itself (write) and the steps they
// share (settlement, the named transitions, receipt, event).
package host

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"log/slog"
	"path/filepath"
	"strconv"
	"time"

	"github.com/fleet/fleet/internal/budget"
	"github.com/fleet/fleet/internal/host/access"
	"github.com/fleet/fleet/internal/host/admission"
	"github.com/fleet/fleet/internal/host/claims"
	"github.com/fleet/fleet/internal/host/failures"
	"github.com/fleet/fleet/internal/host/ledger"
	"github.com/fleet/fleet/internal/host/operator"
	"github.com/fleet/fleet/internal/host/pause"
	"github.com/fleet/fleet/internal/host/publication"
	"github.com/fleet/fleet/internal/host/registry"
	"github.com/fleet/fleet/internal/host/schedules"
	"github.com/fleet/fleet/internal/host/tenants"
	"github.com/fleet/fleet/internal/host/views"
	"github.com/fleet/fleet/internal/jobs"
	"github.com/fleet/fleet/internal/metrics"
	"github.com/fleet/fleet/internal/receipts"
	"github.com/fleet/fleet/internal/series"
	"github.com/fleet/fleet/internal/statedir"
	"github.com/fleet/fleet/internal/store"
	"github.com/fleet/fleet/internal/wire"
)

// OperatorName is the operator credential's name and the actor of the
// operator's events and receipts.
const OperatorName = statedir.OperatorName

// DefaultLease is a claim's lease unless the state or serve says otherwise.
const DefaultLease = 30 * time.Second

// Setting names.
const (
	settingLeaseMS      = "lease_ms"
	settingLoseAckIndex = "lose_ack_index"
	settingModelPrices  = "model_prices" // JSON budget.PriceTable (or, from before tables, one budget.Prices), in model mode
	settingMode         = "mode"         // deterministic or model; absent in states made before it
	settingRetryPolicy  = "retry_policy" // JSON jobs.Policy, the default for reports that give none
)

// Host is an open state.
type Host struct {
	db       *store.DB
	ledger   *ledger.Ledger // every write goes through it
	kernel   *receipts.Kernel
	stateDir string
	// Lease, ID and Liveness are as Open's Options chose them, and the
	// state's lease when they gave none; read them, never set them: the
	// rooms were handed them when the host opened. ID is the state
	// directory's after Start when Options gave none.
	Lease    time.Duration
	ID       string
	Liveness time.Duration
	// loseAck is the fault injection of the lost acknowledgement: the
	// mutation ordinal (0 = the first publication to commit) whose
	// acknowledgement the HTTP layer drops after the commit. nil when off.
	loseAck *int64
	// prices, when set, settle publications by reported usage.
	prices budget.PriceTable
	// mode is the state's workers' mode, which publications must be in
	// ("" for a state made before it was recorded: either).
	mode string
	// retry is the state's default retry policy.
	retry jobs.Policy

	access    *access.Credentials    // who may call, and when each worker last did
	registry  *registry.Registry     // this host among those serving the state
	failures  *failures.Failures     // failed attempts, retried or failed
	views     *views.Views           // what the host shows, changing nothing
	pause     *pause.Switch          // the operator's kill switch for claims
	publisher *publication.Publisher // publications, decided
	operator  *operator.Operator     // the operator's actions on jobs and the allowance
	tenants   *tenants.Tenants
	schedules *schedules.Schedules // the teams sharing the fleet
	admission *admission.Admission // claimed jobs admitted against the allowance
	claims    *claims.Claims       // who holds which job, and for how long

	metrics *metrics.Metrics
	series  *series.Recorder // the last hour, per second, for the console's charts

	// Log receives one structured line per committed decision, carrying
	// operation_id, worker, generation and receipt_id. Discarded unless set.
	Log *slog.Logger
}

// Options are what the command that opens a host chooses for it; a zero
// field keeps its default.
type Options struct {
	// Lease is a claim's lease and each renewal's (default: the state's,
	// else DefaultLease).
	Lease time.Duration
	// ID is this host's identity among the hosts serving the state
	// (default: the state directory's).
	ID string
	// Liveness is how long a host may go unseen before its peers take it
	// for gone (default registry.DefaultHostLiveness; see package registry).
	Liveness time.Duration
	// MaxTenants is the most tenants the fleet may have (default
	// tenants.DefaultMaxTenants): each is a label of the per-tenant metrics.
	MaxTenants int
	// CombinedPublications is how many combined batches of single
	// publications may run at once (publication.Config.Combine): 0 for
	// DefaultCombined where transactions commit concurrently (PostgreSQL)
	// and none on SQLite, whose one writer commits them together already;
	// negative for none.
	CombinedPublications int
	// CombinedClaims is how many combined transactions of claims that
	// admit may run at once (claims.New): 0 for DefaultCombinedClaims on
	// PostgreSQL and none on SQLite, negative for none, as
	// CombinedPublications. One pick and one commit serve the claims of
	// several workers that arrive together.
	CombinedClaims int
}

// DefaultCombined is how many combined batches of single publications run
// at once on PostgreSQL. Beside the database 1 did best and 4 least; with
// it 1 ms away and four hosts sharing the workers, a publication waiting
// for the one transaction in flight cost the hosts a sixth of their
// throughput and 2 cost them 3-8 %; 3 gave them 4-7 % more than 2 but
// cost one host beside its database 6-8 % (BENCHMARKS.md).
const DefaultCombined = 2

// DefaultCombinePatience is how long a single publication waits for the
// combined batch in flight before it starts the second. Beside the
// database the batch in flight has mostly committed by then, and the
// publications that waited go together in the next; with the database
// far away they go in the second slot, having waited a little. Against
// taking the second slot at once it gave one host and four more jobs a
// second and less CPU a job, beside the database and 1 ms away; 1 ms and
// 4 ms did as well as 2 (BENCHMARKS.md).
const DefaultCombinePatience = 2 * time.Millisecond

// DefaultCombinedClaims is how many combined transactions of claims that
// admit run at once on PostgreSQL. Against 2, one gave a host beside its
// database 6-16 % more jobs a second and every run 6-14 % less CPU a job;
// with the database 1 ms away it cost one host and four 2-6 % of their
// jobs a second (BENCHMARKS.md, "Claims that arrive together …").
const DefaultCombinedClaims = 1

// combined is Options.CombinedPublications or CombinedClaims, n, resolved
// for db, whose default where transactions commit concurrently is def.
func combined(db *store.DB, n, def int) int {
	switch {
	case n < 0:
		return 0
	case n == 0 && db.SharedByHosts():
		return def
	}
	return n
}

// Open serves an existing state: the directory, and its database, which
// the caller opened (store/backend: the command chooses the backend). The
// host owns db from here on and closes it, on failure too.
func Open(ctx context.Context, stateDir string, db *store.DB, opts Options) (*Host, error) {
	h := &Host{db: db, stateDir: stateDir, Lease: DefaultLease, ID: opts.ID, Liveness: cmp.Or(opts.Liveness, registry.DefaultHostLiveness)}
	h.metrics = metrics.New(h.metricsSnapshot)
	h.series = series.New()
	h.Log = slog.New(slog.DiscardHandler)
	db.OnCommit = h.metrics.Commit
	if err := db.Read(ctx, h.load); err != nil {
		db.Close()
		return nil, fmt.Errorf("open state %s: %w", stateDir, err)
	}
	h.Lease = cmp.Or(opts.Lease, h.Lease)
	db.SetSealer(h.kernel)
	h.ledger = ledger.New(db, h.kernel)
	h.access = access.New(h.ledger, stateDir)
	h.registry = registry.New(h.ledger, stateDir)
	h.failures = failures.New(h.ledger, h.metrics, h.series, h.prices)
	h.views = views.New(h.ledger, h.access, h.Lease)
	h.pause = pause.New(h.ledger)
	h.publisher = publication.New(h.ledger, h.metrics, h.series,
		publication.Config{Prices: h.prices, Mode: h.mode, LoseAck: h.loseAck, Combine: combined(db, opts.CombinedPublications, DefaultCombined),
			CombinePatience: DefaultCombinePatience})
	h.operator = operator.New(h.ledger, h.publisher, h.retry)
	h.tenants = tenants.New(h.ledger, cmp.Or(opts.MaxTenants, tenants.DefaultMaxTenants))
	h.schedules = schedules.New(h.ledger, h.operator)
	h.admission = admission.New(h.ledger, h.metrics, h.series, h.views, h.Lease)
	h.claims = claims.New(h.ledger, h.metrics, h.series, h.registry, h.admission, h.Lease, combined(db, opts.CombinedClaims, DefaultCombinedClaims))
	// A host that died between a commit and placing its log entries left
	// them pending: place them before anything reads the log.
	if err := db.PlacePending(ctx); err != nil {
		db.Close()
		return nil, fmt.Errorf("open state %s: %w", stateDir, err)
	}
	return h, nil
}

// load reads the kernel key and the settings.
func (h *Host) load(tx *store.Tx) error {
	ctx := context.Background()
	k, err := tx.KernelGet(ctx)
	if err != nil {
		return err
	}
	pub, seed := k.PublicKey, k.Seed
	if h.kernel, err = receipts.LoadKernel(pub, seed); err != nil {
		return err
	}
	settings, err := tx.SettingList(ctx)
	if err != nil {
		return err
	}
	if v, ok := settings[settingLeaseMS]; ok {
		ms, err := strconv.ParseInt(v, 10, 64)
		if err != nil || ms <= 0 {
			return fmt.Errorf("setting %s: %q is not a positive number", settingLeaseMS, v)
		}
		h.Lease = time.Duration(ms) * time.Millisecond
	}
	if v, ok := settings[settingModelPrices]; ok {
		if err := json.Unmarshal([]byte(v), &h.prices); err != nil {
			return fmt.Errorf("setting %s: %q: %w", settingModelPrices, v, err)
		}
	}
	h.retry = jobs.DefaultPolicy
	if v, ok := settings[settingRetryPolicy]; ok {
		if err := json.Unmarshal([]byte(v), &h.retry); err != nil {
			return fmt.Errorf("setting %s: %q: %w", settingRetryPolicy, v, err)
		}
	}
	switch v := settings[settingMode]; v {
	case "", publication.ModeDeterministic, publication.ModeModel:
		h.mode = v
	default:
		return fmt.Errorf("setting %s: %q is neither %s nor %s", settingMode, v, publication.ModeDeterministic, publication.ModeModel)
	}
	if v, ok := settings[settingLoseAckIndex]; ok {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < 0 {
			return fmt.Errorf("setting %s: %q is not a non-negative number", settingLoseAckIndex, v)
		}
		h.loseAck = &n
	}
	return nil
}

// Close closes the database.
func (h *Host) Close() error { return h.db.Close() }

// Access is who may call the host: authentication, and the operator's
// changes to the credentials.
func (h *Host) Access() *access.Credentials { return h.access }

// Claims leases jobs to workers: claims, heartbeats, releases and the
// lease sweeper.
func (h *Host) Claims() *claims.Claims { return h.claims }

// Admission admits claimed jobs against the allowance (Dispatch,
// DispatchMany).
func (h *Host) Admission() *admission.Admission { return h.admission }

// Operator is the operator's actions: cancel, requeue, reconcile (one
// job or all a filter selects), assign, the allowance, reports.
func (h *Host) Operator() *operator.Operator { return h.operator }

// Tenants is the teams sharing the fleet: creation and allowances.
func (h *Host) Tenants() *tenants.Tenants { return h.tenants }

// Schedules is the recurring reports.
func (h *Host) Schedules() *schedules.Schedules { return h.schedules }

// Publications decides publications (single calls and batches).
func (h *Host) Publications() *publication.Publisher { return h.publisher }

// Views is what the host shows: the snapshot, stats, jobs, events,
// receipts, documents and workers.
func (h *Host) Views() *views.Views { return h.views }

// ClaimsSwitch pauses and resumes every host's claims.
func (h *Host) ClaimsSwitch() *pause.Switch { return h.pause }

// Failures records failed attempts (single calls and batches).
func (h *Host) Failures() *failures.Failures { return h.failures }

// Registry is this host's record among the hosts serving the state.
func (h *Host) Registry() *registry.Registry { return h.registry }

// Start runs restart recovery (registry.Registry.Start) as this host's ID,
// the state directory's when unset, with its Liveness, and reads the
// charts' hour this host kept, before it serves.
func (h *Host) Start(ctx context.Context, url string) error {
	h.registry.ID, h.registry.Liveness = h.ID, h.Liveness
	if err := h.registry.Start(ctx, url); err != nil {
		return err
	}
	h.ID = h.registry.ID
	// The charts' hour as this host last kept it, read before it serves:
	// its first answer draws it (a file it cannot read only loses that).
	if err := h.series.Load(h.seriesPath(), time.Now()); err != nil {
		h.Log.Warn("the charts' hour kept at the last stop was not read", "err", err)
	}
	return nil
}

// Stop records a clean shutdown of this host.
func (h *Host) Stop(ctx context.Context) error { return h.registry.Stop(ctx) }

// RunBeat renews this host's liveness until ctx ends (registry.RunBeat).
func (h *Host) RunBeat(ctx context.Context, onError func(error)) error {
	return h.registry.RunBeat(ctx, onError)
}

// SetLog sends the host's decision log to l (before it serves).
func (h *Host) SetLog(l *slog.Logger) {
	h.Log = l
	h.ledger.Log = l
}

// Metrics is the host's Prometheus instrumentation.
func (h *Host) Metrics() *metrics.Metrics { return h.metrics }

// Series is the host's last hour, per second.
func (h *Host) Series() *series.Recorder { return h.series }

// seriesSaveEvery is how many seconds pass between saves of the series: a
// host killed outright loses at most those of its charts' hour.
const seriesSaveEvery = 10

// SaveSeries keeps the charts' hour in the state directory, for this host
// to draw again when it serves the state next (serve calls it as it stops).
func (h *Host) SaveSeries() error { return h.series.Save(h.seriesPath()) }

// seriesPath is this host's series file: one a host, since several hosts
// may share a state directory.
func (h *Host) seriesPath() string {
	name := "series.json"
	if h.ID != "" {
		sum := sha256.Sum256([]byte(h.ID))
		name = "series-" + hex.EncodeToString(sum[:6]) + ".json"
	}
	return filepath.Join(h.stateDir, name)
}

// RunSampler closes a second of the series every second until ctx ends,
// with the jobs by state (shared with pages, at most a second old) and the
// allowance, and every series.TenantsEvery seconds what the tenants have
// spent.
func (h *Host) RunSampler(ctx context.Context, onError func(error)) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	ticks := 0
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			counts, err := h.views.StateCounts(ctx)
			var acct wire.Accounting
			if err == nil {
				err = h.db.Read(ctx, func(tx *store.Tx) (err error) {
					acct, err = tx.AccountingGet(ctx, store.NoLock)
					return err
				})
			}
			if err != nil {
				if ctx.Err() == nil {
					onError(err)
				}
				continue
			}
			if ticks%series.TenantsEvery == 0 {
				if err := h.observeTenants(ctx, now); err != nil && ctx.Err() == nil {
					onError(err)
				}
			}
			h.series.Tick(now, counts, acct)
			if ticks++; ticks%seriesSaveEvery == 0 {
				if err := h.SaveSeries(); err != nil {
					onError(err)
				}
			}
		}
	}
}

// observeTenants reads what each tenant has spent, for the series'
// burn by tenant.
func (h *Host) observeTenants(ctx context.Context, now time.Time) error {
	spent := map[string]int64{}
	err := h.db.Read(ctx, func(tx *store.Tx) error {
		all, err := tx.TenantList(ctx)
		for _, t := range all {
			spent[t.Name] = t.Spent
		}
		return err
	})
	if err == nil {
		h.series.ObserveTenants(now, spent)
	}
	return err
}

func (h *Host) metricsSnapshot(ctx context.Context) (metrics.Snapshot, error) {
	st, err := h.views.Stats(ctx)
	if err != nil {
		return metrics.Snapshot{}, err
	}
	s := metrics.Snapshot{JobsByState: st.Jobs, Accounting: st.Accounting, BatchReruns: h.db.Stats().Retries,
		ClaimsPaused: st.Claims.Paused}
	err = h.db.Read(ctx, func(tx *store.Tx) error {
		all, err := tx.TenantList(ctx)
		for _, t := range all {
			s.Tenants = append(s.Tenants, tenants.Figures(t, st.Accounting))
		}
		return err
	})
	return s, err
}

// KernelKey is the hex public key receipts are signed with.
func (h *Host) KernelKey() string { return h.kernel.PublicKey }

// TrustedKernel is what trusted-kernel.json holds: the key to verify
// receipts with, offline.
func (h *Host) TrustedKernel() wire.TrustedKernel { return h.kernel.Trusted() }

// DB is the host's database, for tests.
func (h *Host) DB() *store.DB { return h.db }

// Changed returns a channel closed after the next write commit, so that
// event streams wake without polling.
func (h *Host) Changed() <-chan struct{} { return h.ledger.Changed() }

// WatchOtherHosts wakes event streams for writes this process did not make,
// those of other hosts sharing a PostgreSQL database, by polling the event
// log's head every interval until ctx ends. Every write appends an event.
func (h *Host) WatchOtherHosts(ctx context.Context, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	var seen int64
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		head, err := h.views.EventHead(ctx)
		if err == nil && head > seen {
			if seen > 0 {
				h.ledger.Wake()
			}
			seen = head
		}
	}
}
