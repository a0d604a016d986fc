// Package host is the authoritative host: every operation of the fleet is one
// function here that runs one transaction in which the checks and the writes
// that must agree happen together (claim and generation, expected version,
// operation record, reservation, job state, receipt, event).
package host

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"github.com/fleet/fleet/internal/budget"
	"github.com/fleet/fleet/internal/crash"
	"github.com/fleet/fleet/internal/events"
	"github.com/fleet/fleet/internal/jobs"
	"github.com/fleet/fleet/internal/metrics"
	"github.com/fleet/fleet/internal/receipts"
	"github.com/fleet/fleet/internal/store"
)

// Files of a state directory.
const (
	DatabaseFile      = "fleet.sqlite3"
	CredentialsDir    = "credentials"
	TrustedKernelFile = "trusted-kernel.json"
	OperatorName      = "operator"
)

// DefaultLease is a claim's lease unless the state or serve says otherwise.
const DefaultLease = 30 * time.Second

// Setting names.
const (
	settingLeaseMS      = "lease_ms"
	settingLoseAckIndex = "lose_ack_index"
	settingModelPrices  = "model_prices" // JSON budget.Prices, in model mode
	settingServing      = "serving"      // "1" while a host serves; left set by a crash
	settingServes       = "serves"       // how many times a host has started serving
)

// Host is an open state directory.
type Host struct {
	db       *store.DB
	kernel   *receipts.Kernel
	stateDir string
	// Lease is the length of a claim's lease and of each renewal.
	Lease time.Duration
	// loseAck is the fault injection of SPEC section 9: the mutation ordinal
	// (0 = the first publication to commit) whose acknowledgement the HTTP
	// layer drops after the commit. nil when off.
	loseAck *int64
	// prices, when set, settle publications by reported usage.
	prices *budget.Prices

	creds credentialCache

	metrics *metrics.Metrics

	// Log receives one structured line per committed decision, carrying
	// operation_id, worker, generation and receipt_id. Discarded unless set.
	Log *slog.Logger

	mu          sync.Mutex
	seenWorkers map[string]bool // workers that have claimed since this host started
	changed     chan struct{}   // closed and replaced after every write commit
}

// Location is where a state's database is: the SQLite file in the state
// directory, or database when that is set (a postgres:// URL shared by
// several hosts).
func Location(stateDir, database string) string {
	if database != "" {
		return database
	}
	return filepath.Join(stateDir, DatabaseFile)
}

// Open opens an existing state: the directory, and its database (see
// Location).
func Open(ctx context.Context, stateDir, database string, opts ...store.Options) (*Host, error) {
	if database != "" && !store.IsURL(database) {
		return nil, fmt.Errorf("--database must be a postgres:// URL, got %q", database)
	}
	db, err := store.Open(ctx, Location(stateDir, database), opts...)
	if err != nil {
		return nil, err
	}
	h := &Host{db: db, stateDir: stateDir, Lease: DefaultLease, seenWorkers: map[string]bool{}, changed: make(chan struct{})}
	h.metrics = metrics.New(h.metricsSnapshot)
	h.Log = slog.New(slog.DiscardHandler)
	db.OnCommit = h.metrics.Commit
	err = db.Read(ctx, func(tx *store.Tx) error {
		if h.kernel, err = receipts.LoadKernel(ctx, tx); err != nil {
			return err
		}
		settings, err := readSettings(ctx, tx)
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
			var p budget.Prices
			if err := json.Unmarshal([]byte(v), &p); err != nil {
				return fmt.Errorf("setting %s: %q: %w", settingModelPrices, v, err)
			}
			h.prices = &p
		}
		if v, ok := settings[settingLoseAckIndex]; ok {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil || n < 0 {
				return fmt.Errorf("setting %s: %q is not a non-negative number", settingLoseAckIndex, v)
			}
			h.loseAck = &n
		}
		return nil
	})
	if err != nil {
		db.Close()
		return nil, fmt.Errorf("open state %s: %w", stateDir, err)
	}
	return h, nil
}

// Close closes the database.
func (h *Host) Close() error { return h.db.Close() }

// Metrics is the host's Prometheus instrumentation.
func (h *Host) Metrics() *metrics.Metrics { return h.metrics }

func (h *Host) metricsSnapshot(ctx context.Context) (metrics.Snapshot, error) {
	st, err := h.Stats(ctx)
	snap := metrics.Snapshot{JobsByState: map[string]int64{}, Accounting: st.Accounting, BatchReruns: h.db.Stats().Retries}
	for state, n := range st.Jobs {
		snap.JobsByState[string(state)] = n
	}
	return snap, err
}

// KernelKey is the hex public key receipts are signed with.
func (h *Host) KernelKey() string { return h.kernel.PublicKey }

// DB is the host's database, for tests and the verifier.
func (h *Host) DB() *store.DB { return h.db }

// Changed returns a channel closed after the next write commit, so that
// event streams wake without polling.
func (h *Host) Changed() <-chan struct{} {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.changed
}

// write runs fn in one write transaction and wakes watchers after commit.
// point names the operation's crash points (see package crash): its
// ".before-commit" point is reached with every write made and nothing
// committed, its ".after-commit" point with everything committed and nothing
// answered. point is called after fn, since some operations (dispatch) are
// named by what they decide.
func (h *Host) write(ctx context.Context, point func() string, fn func(tx *store.Tx) error) error {
	err := h.db.WithTx(ctx, func(tx *store.Tx) error {
		if err := fn(tx); err != nil {
			return err
		}
		crash.At(point() + ".before-commit")
		return nil
	})
	if err != nil {
		return err
	}
	crash.At(point() + ".after-commit")
	h.wake()
	return nil
}

// wake releases everyone waiting on Changed.
func (h *Host) wake() {
	h.mu.Lock()
	close(h.changed)
	h.changed = make(chan struct{})
	h.mu.Unlock()
}

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
		var head int64
		err := h.db.Read(ctx, func(tx *store.Tx) error {
			return tx.QueryRowContext(ctx, `SELECT COALESCE(MAX(sequence), 0) FROM events`).Scan(&head)
		})
		if err == nil && head > seen {
			if seen > 0 {
				h.wake()
			}
			seen = head
		}
	}
}

// named is a fixed crash-point name.
func named(point string) func() string { return func() string { return point } }

func readSettings(ctx context.Context, tx *store.Tx) (map[string]string, error) {
	rows, err := tx.QueryContext(ctx, `SELECT name, value FROM settings`)
	if err != nil {
		return nil, fmt.Errorf("read settings: %w", err)
	}
	defer rows.Close()
	out := map[string]string{}
	for rows.Next() {
		var k, v string
		if err := rows.Scan(&k, &v); err != nil {
			return nil, err
		}
		out[k] = v
	}
	return out, rows.Err()
}

func putSetting(ctx context.Context, tx *store.Tx, name, value string) error {
	_, err := tx.ExecContext(ctx,
		`INSERT INTO settings (name, value) VALUES ($1, $2) ON CONFLICT (name) DO UPDATE SET value = excluded.value`,
		name, value)
	if err != nil {
		return fmt.Errorf("write setting %s: %w", name, err)
	}
	return nil
}

// Start runs restart recovery (SPEC section 9) in one transaction before the
// host serves: a crash left unrecorded is recorded, claimed jobs go back to
// the queue at a new generation (their claims are stale), running jobs keep
// their leases and expire normally.
func (h *Host) Start(ctx context.Context, url string) error {
	return h.write(ctx, named("restart-recovery"), func(tx *store.Tx) error {
		settings, err := readSettings(ctx, tx)
		if err != nil {
			return err
		}
		serves, _ := strconv.Atoi(settings[settingServes])
		acct, err := budget.Get(ctx, tx)
		if err != nil {
			return err
		}
		if settings[settingServing] == "1" {
			if _, err := events.Append(ctx, tx, events.HostStopped, "host",
				fmt.Sprintf("The host stopped without shutting down; %d of %d credits spent", acct.Spent, acct.Allowance),
				map[string]any{"clean": false, "accounting": acct}); err != nil {
				return err
			}
		}
		claimed, err := jobs.InState(ctx, tx, jobs.Claimed)
		if err != nil {
			return err
		}
		requeued := []string{}
		for i := range claimed {
			j := &claimed[i]
			if err := jobs.RevokeAssignment(ctx, tx, j, "restart"); err != nil {
				return err
			}
			if err := jobs.Transition(ctx, tx, j, jobs.Queued, "host restarted while claimed"); err != nil {
				return err
			}
			requeued = append(requeued, j.OperationID)
		}
		kind, title := events.HostStarted, "The host started serving"
		if serves > 0 {
			kind = events.HostRestarted
			title = fmt.Sprintf("The host restarted with its allowance and records; %d of %d credits spent", acct.Spent, acct.Allowance)
		}
		if _, err := events.Append(ctx, tx, kind, "host", title, map[string]any{
			"url": url, "kernel_key": h.kernel.PublicKey, "accounting": acct, "requeued": requeued,
		}); err != nil {
			return err
		}
		if err := putSetting(ctx, tx, settingServes, strconv.Itoa(serves+1)); err != nil {
			return err
		}
		return putSetting(ctx, tx, settingServing, "1")
	})
}

// Stop records a clean shutdown.
func (h *Host) Stop(ctx context.Context) error {
	return h.write(ctx, named("stop"), func(tx *store.Tx) error {
		acct, err := budget.Get(ctx, tx)
		if err != nil {
			return err
		}
		if _, err := events.Append(ctx, tx, events.HostStopped, "host",
			fmt.Sprintf("The host shut down; %d of %d credits spent", acct.Spent, acct.Allowance),
			map[string]any{"clean": true, "accounting": acct}); err != nil {
			return err
		}
		return putSetting(ctx, tx, settingServing, "0")
	})
}

// ExpireLeases applies lease expiry (SPEC section 9): a claimed job goes
// back to the queue at a new generation; a running job becomes unresolved
// and keeps its assignment, so a slow worker still alive can publish.
func (h *Host) ExpireLeases(ctx context.Context) (int, error) {
	// A cheap read first, so an idle host takes no write lock; the write
	// transaction below decides afresh from what it reads itself.
	var due []jobs.Job
	if err := h.db.Read(ctx, func(tx *store.Tx) (err error) { due, err = jobs.Expired(ctx, tx); return err }); err != nil || len(due) == 0 {
		return 0, err
	}
	var n int
	var movedTo []jobs.State
	err := h.write(ctx, named("lease-expiry"), func(tx *store.Tx) error {
		expired, err := jobs.Expired(ctx, tx)
		if err != nil {
			return err
		}
		n, movedTo = len(expired), nil
		for i := range expired {
			j := &expired[i]
			worker := j.Worker
			if j.State == jobs.Claimed {
				if err := jobs.RevokeAssignment(ctx, tx, j, "lease expired"); err != nil {
					return err
				}
				if err := jobs.Transition(ctx, tx, j, jobs.Queued, "lease expired before dispatch"); err != nil {
					return err
				}
			} else if err := jobs.Transition(ctx, tx, j, jobs.Unresolved,
				"lease expired while running; no publication is known"); err != nil {
				return err
			}
			movedTo = append(movedTo, j.State)
			if _, err := events.Append(ctx, tx, events.LeaseExpired, "host",
				fmt.Sprintf("%s's lease on %s expired; the job is %s", worker, j.Section, j.State),
				map[string]any{"operation_id": j.OperationID, "worker": worker, "state": j.State, "generation": j.Generation}); err != nil {
				return err
			}
		}
		return nil
	})
	if err == nil {
		for _, st := range movedTo {
			h.metrics.LeaseExpired(string(st))
		}
		if n > 0 {
			h.Log.Info("leases expired", "jobs", n)
		}
	}
	return n, err
}

// RunLeaseSweeper expires leases every interval until ctx ends.
func (h *Host) RunLeaseSweeper(ctx context.Context, interval time.Duration, onError func(error)) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if _, err := h.ExpireLeases(ctx); err != nil && !errors.Is(err, context.Canceled) && !errors.Is(err, sql.ErrConnDone) {
				onError(err)
			}
		}
	}
}
