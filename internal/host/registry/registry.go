// Package registry is the hosts serving a state: each one's stable
// identity and the liveness record it renews without shared locks, a
// host's restart recovery, its clean stop, its rejoining after its peers
// took it for gone, and retiring a peer gone past the liveness window
// (recording its unclean stop and requeueing the claims it issued).
package registry

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/fleet/fleet/internal/fleet"
	"github.com/fleet/fleet/internal/host/ledger"
	"github.com/fleet/fleet/internal/jobs"
	"github.com/fleet/fleet/internal/statedir"
	"github.com/fleet/fleet/internal/store"
	"github.com/fleet/fleet/internal/wire"
)

// Settings a state from before the registry (migration 0002) recorded
// serving in; such a state is read once, at its first start with it.
const (
	settingServing = "serving" // "1" while a host served; left set by a crash
	settingServes  = "serves"  // how many times a host had started serving
)

// Registry is this host's record among the hosts serving a state.
type Registry struct {
	ledger   *ledger.Ledger
	stateDir string
	// ID is this host's identity among the hosts serving the state; set
	// it before Start, which otherwise takes the state directory's.
	ID       string
	instance string // this process, so a second one under the same ID is noticed
	// Liveness is how long a host may go unseen before its peers take it
	// for gone.
	Liveness time.Duration
	// renewedAtMS is when (this host's clock) its last renewal of its
	// liveness began (its registration at Start the first). See
	// CheckInTouch.
	renewedAtMS atomic.Int64
	beating     atomic.Bool // RunBeat runs: peers watch this host
}

// New is the registry of the state in stateDir, written through l.
func New(l *ledger.Ledger, stateDir string) *Registry {
	return &Registry{ledger: l, stateDir: stateDir, Liveness: DefaultHostLiveness}
}

func (r *Registry) log() *slog.Logger { return r.ledger.Log }

// The host registry: every host serving a state has a stable identity
// (serve --host-id, or the state directory's host-id file) and a liveness
// record it renews. A host whose record goes stale is gone: the first live
// host to notice records that it stopped without shutting down and requeues
// the claims it had issued. A live peer's claims are never requeued.

// DefaultHostLiveness is how long a host may go unseen before its peers
// take it for gone. It renews its record five times in that span.
const DefaultHostLiveness = 10 * time.Second

// ErrTakenOver is returned by a heartbeat when another process started
// under this host's identity: two hosts must not share an id, and the
// older one must stop serving.
var ErrTakenOver = errors.New("another process took over this host's identity; each host needs its own --host-id")

// identify fixes this process's identity before it serves.
func (r *Registry) identify() error {
	if r.ID == "" {
		id, err := statedir.HostID(r.stateDir)
		if err != nil {
			return err
		}
		r.ID = id
	}
	b := make([]byte, 8)
	if _, err := rand.Read(b); err != nil {
		return err
	}
	r.instance = hex.EncodeToString(b)
	return nil
}

// goneHosts lists the hosts that stopped without shutting down: this
// host's own earlier process if its record still says serving, and every
// other serving host not seen within the liveness window.
func (r *Registry) goneHosts(hosts []store.Host, nowMS int64) []store.Host {
	var gone []store.Host
	for _, o := range hosts {
		if o.Serving && (o.ID == r.ID || nowMS-o.SeenAtMS > r.Liveness.Milliseconds()) {
			gone = append(gone, o)
		}
	}
	return gone
}

// retireHosts records each gone host's unclean stop, marks it not serving
// and requeues, at a new generation, the claimed jobs it had issued (and
// any claim from before the registry, whose host is none of these). A
// host is retired only if its record is still as it was read
// (HostRetire), so two hosts deciding at once retire it once and a host
// that renewed meanwhile is left alone; a claimed job another transaction
// holds is passed over (its lease ends it). It returns the requeued
// operation ids.
func (r *Registry) retireHosts(ctx context.Context, tx *store.Tx, gone []store.Host, legacyClaims bool) ([]string, error) {
	requeued := []string{}
	var retired []store.Host
	var ids []string
	if legacyClaims {
		ids = append(ids, "")
	}
	for _, o := range gone {
		if o.ID != "" { // a state from before the registry has no record
			ok, err := tx.HostRetire(ctx, o)
			if err != nil {
				return nil, err
			}
			if !ok {
				continue
			}
		}
		retired = append(retired, o)
		ids = append(ids, o.ID)
	}
	if len(ids) == 0 {
		return requeued, nil
	}
	acct, err := tx.AccountingGet(ctx, store.NoLock)
	if err != nil {
		return nil, err
	}
	for _, o := range retired {
		if err := ledger.AppendEvent(ctx, tx, wire.EventHostStopped, "host",
			fmt.Sprintf("Host %s stopped without shutting down; %d of %d credits spent", o.ID, acct.Spent, acct.Allowance),
			map[string]any{"clean": false, "host": o.ID, "last_seen_ms": o.SeenAtMS, "noticed_by": r.ID, "accounting": acct}); err != nil {
			return nil, err
		}
	}
	claimed, err := tx.JobListClaimedBy(ctx, ids)
	if err != nil {
		return nil, err
	}
	for i := range claimed {
		j := &claimed[i]
		if err := jobs.RevokeAssignment(ctx, tx, j, "host stopped"); err != nil {
			return nil, err
		}
		if err := jobs.Requeue(ctx, tx, j, j.Worker, j.ClaimableAtMS, fmt.Sprintf("host %s stopped while it was claimed", j.ClaimHost)); err != nil {
			return nil, err
		}
		requeued = append(requeued, j.OperationID)
	}
	return requeued, nil
}

// Start runs restart recovery in one transaction before the host serves.
// An unclean stop of this host's earlier process, or of a peer gone past
// the liveness window, is recorded; the claimed jobs those hosts issued go
// back to the queue at a new generation (their claims are stale); a live
// peer's claims and every running job are left alone (leases expire
// normally). The host then registers as serving.
func (r *Registry) Start(ctx context.Context, url string) error {
	if err := r.identify(); err != nil {
		return fmt.Errorf("host identity: %w", err)
	}
	started := r.ledger.DB().Now()
	err := r.ledger.Record(ctx, "restart-recovery", func(tx *store.Tx) error {
		settings, err := tx.SettingList(ctx)
		if err != nil {
			return err
		}
		serves, _ := strconv.Atoi(settings[settingServes])
		hosts, err := tx.HostList(ctx)
		if err != nil {
			return err
		}
		gone := r.goneHosts(hosts, tx.NowMS())
		// A state served before the registry existed records a crash of
		// its unnamed host the old way, once.
		if len(hosts) == 0 && settings[settingServing] == "1" {
			gone = append(gone, store.Host{ID: "", Serving: true})
		}
		requeued, err := r.retireHosts(ctx, tx, gone, true)
		if err != nil {
			return err
		}
		acct, err := tx.AccountingGet(ctx, store.NoLock)
		if err != nil {
			return err
		}
		kind, title := wire.EventHostStarted, fmt.Sprintf("Host %s started serving", r.ID)
		if slices.ContainsFunc(hosts, func(o store.Host) bool { return o.ID == r.ID }) || len(hosts) == 0 && serves > 0 {
			kind = wire.EventHostRestarted
			title = fmt.Sprintf("Host %s restarted with its allowance and records; %d of %d credits spent", r.ID, acct.Spent, acct.Allowance)
		}
		if err := ledger.AppendEvent(ctx, tx, kind, "host", title, map[string]any{
			"url": url, "host": r.ID, "kernel_key": r.ledger.Kernel().PublicKey, "accounting": acct, "requeued": requeued,
		}); err != nil {
			return err
		}
		return tx.HostPut(ctx, store.Host{ID: r.ID, Instance: r.instance, URL: url,
			StartedAtMS: tx.NowMS(), SeenAtMS: tx.NowMS(), Serving: true})
	})
	if err == nil {
		r.renewedAtMS.Store(started.UnixMilli()) // registering renews it
	}
	return err
}

// Stop records a clean shutdown of this host.
func (r *Registry) Stop(ctx context.Context) error {
	return r.ledger.Record(ctx, "stop", func(tx *store.Tx) error {
		acct, err := tx.AccountingGet(ctx, store.NoLock)
		if err != nil {
			return err
		}
		self, err := tx.HostGet(ctx, r.ID)
		if err != nil {
			return err
		}
		if self.Instance != r.instance {
			return ErrTakenOver
		}
		if err := ledger.AppendEvent(ctx, tx, wire.EventHostStopped, "host",
			fmt.Sprintf("Host %s shut down; %d of %d credits spent", r.ID, acct.Spent, acct.Allowance),
			map[string]any{"clean": true, "host": r.ID, "accounting": acct}); err != nil {
			return err
		}
		self.Serving, self.SeenAtMS = false, tx.NowMS()
		return tx.HostPut(ctx, self)
	})
}

// Beat renews this host's liveness, in a transaction that waits on no
// other host: it takes no lock but its own record's. A host its peers took
// for gone while it stalled (a paused process, a frozen link) learns it
// here, and serves again from here on, watched like any other (its claims
// from before were requeued by whoever retired it). Then, if this renewal
// was prompt, it retires the peers gone past the liveness window: a beat
// that was itself slow, or came late after the last, says nothing about
// the others, since this host's own stall made every peer look stale.
// ErrTakenOver means another process serves under this host's identity now.
func (r *Registry) Beat(ctx context.Context) error {
	started := r.ledger.DB().Now()
	rejoined, err := ledger.Write(store.Urgent(ctx), r.ledger, ledger.Named[bool]("host-beat"), func(tx *store.Tx) (rejoined bool, err error) {
		seen, err := tx.HostSeen(ctx, &store.HostSeenParams{ID: r.ID, Instance: r.instance, AtMS: tx.NowMS()})
		switch {
		case err != nil:
			return false, err
		case !seen.Found:
			return false, ErrTakenOver
		case seen.Serving:
			return false, nil
		}
		self, err := tx.HostGet(ctx, r.ID)
		if err != nil {
			return false, err
		}
		self.Serving, self.SeenAtMS = true, tx.NowMS()
		if err := tx.HostPut(ctx, self); err != nil {
			return false, err
		}
		acct, err := tx.AccountingGet(ctx, store.NoLock)
		if err != nil {
			return false, err
		}
		return true, ledger.AppendEvent(ctx, tx, wire.EventHostRestarted, "host",
			fmt.Sprintf("Host %s serves again after its peers took it for gone; %d of %d credits spent", r.ID, acct.Spent, acct.Allowance),
			map[string]any{"host": r.ID, "rejoined": true, "accounting": acct, "requeued": []string{}})
	})
	if err != nil {
		return err
	}
	previous := r.renewedAtMS.Swap(started.UnixMilli())
	if rejoined {
		r.log().Warn("serving again: the other hosts had taken this one for gone and requeued its claims", "host", r.ID)
	}
	// Renewals come every Liveness/5; one that took half the window, or
	// began half the window after the last, is this host's own stall.
	half := r.Liveness / 2
	if took := r.ledger.DB().Now().Sub(started); took > half || previous != 0 && started.UnixMilli()-previous > half.Milliseconds() {
		r.log().Warn("this host's own renewal was slow or late; not judging the other hosts on it", "took", took.String())
		return nil
	}
	return r.retirePeers(ctx)
}

// retirePeers retires every peer gone past the liveness window. A cheap
// read decides whether there is any; the write decides afresh.
func (r *Registry) retirePeers(ctx context.Context) error {
	var gone []store.Host
	if err := r.ledger.DB().Read(ctx, func(tx *store.Tx) error {
		hosts, err := tx.HostList(ctx)
		gone = slices.DeleteFunc(r.goneHosts(hosts, tx.NowMS()), func(o store.Host) bool { return o.ID == r.ID })
		return err
	}); err != nil || len(gone) == 0 {
		return err
	}
	retired, err := ledger.Write(ctx, r.ledger, ledger.Named[[]string]("host-retire"), func(tx *store.Tx) ([]string, error) {
		hosts, err := tx.HostList(ctx)
		if err != nil {
			return nil, err
		}
		gone := slices.DeleteFunc(r.goneHosts(hosts, tx.NowMS()), func(o store.Host) bool { return o.ID == r.ID })
		if _, err := r.retireHosts(ctx, tx, gone, false); err != nil {
			return nil, err
		}
		var retired []string
		for _, o := range gone {
			retired = append(retired, o.ID)
		}
		return retired, nil
	})
	if err == nil && len(retired) > 0 {
		r.log().Warn("hosts gone", "hosts", retired)
	}
	return err
}

// CheckInTouch refuses a claim while this host has not renewed its
// liveness (registering at Start counts) for half the window: its peers
// may be about to take it for gone (or have), and would not watch a claim
// it issued then. It passes in a host that is not running RunBeat, which
// no peer is watching.
func (r *Registry) CheckInTouch() error {
	if !r.beating.Load() {
		return nil
	}
	if since := r.ledger.DB().Now().UnixMilli() - r.renewedAtMS.Load(); since > r.Liveness.Milliseconds()/2 {
		return fleet.Errorf(wire.CodeUnavailable,
			"this host has not renewed its liveness for %d ms (its link to the database is slow or was lost); retry shortly, or through another host", since)
	}
	return nil
}

// RunBeat renews this host's liveness every Liveness/5 until ctx ends
// or another process takes the identity over, which it returns.
func (r *Registry) RunBeat(ctx context.Context, onError func(error)) error {
	r.beating.Store(true)
	t := time.NewTicker(r.Liveness / 5)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		switch err := r.Beat(ctx); {
		case errors.Is(err, ErrTakenOver):
			return err
		case err != nil && ctx.Err() == nil && !errors.Is(err, store.ErrClosed):
			onError(err)
		}
	}
}
