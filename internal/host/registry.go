package host

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/fleet/fleet/internal/statedir"
	"github.com/fleet/fleet/internal/store"
	"github.com/fleet/fleet/internal/wire"
)

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
func (h *Host) identify() error {
	if h.ID == "" {
		id, err := statedir.HostID(h.stateDir)
		if err != nil {
			return err
		}
		h.ID = id
	}
	b := make([]byte, 8)
	if _, err := rand.Read(b); err != nil {
		return err
	}
	h.instance = hex.EncodeToString(b)
	return nil
}

// goneHosts lists the hosts that stopped without shutting down: this
// host's own earlier process if its record still says serving, and every
// other serving host not seen within the liveness window.
func (h *Host) goneHosts(hosts []store.Host, nowMS int64) []store.Host {
	var gone []store.Host
	for _, o := range hosts {
		if o.Serving && (o.ID == h.ID || nowMS-o.SeenAtMS > h.Liveness.Milliseconds()) {
			gone = append(gone, o)
		}
	}
	return gone
}

// retireHosts records each gone host's unclean stop, marks it not serving
// and requeues, at a new generation, the claimed jobs it had issued (and
// any claim from before the registry, whose host is none of these). It
// returns the requeued operation ids.
func (h *Host) retireHosts(ctx context.Context, tx *store.Tx, gone []store.Host, legacyClaims bool) ([]string, error) {
	requeued := []string{}
	if len(gone) == 0 && !legacyClaims {
		return requeued, nil
	}
	acct, err := tx.AccountingGet(ctx, store.NoLock)
	if err != nil {
		return nil, err
	}
	goneIDs := map[string]bool{"": legacyClaims}
	for _, o := range gone {
		goneIDs[o.ID] = true
		if o.ID != h.ID {
			o.Serving = false
			if err := tx.HostPut(ctx, o); err != nil {
				return nil, err
			}
		}
		if err := appendEvent(ctx, tx, wire.EventHostStopped, "host",
			fmt.Sprintf("Host %s stopped without shutting down; %d of %d credits spent", o.ID, acct.Spent, acct.Allowance),
			map[string]any{"clean": false, "host": o.ID, "last_seen_ms": o.SeenAtMS, "noticed_by": h.ID, "accounting": acct}); err != nil {
			return nil, err
		}
	}
	claimed, err := tx.JobListInState(ctx, wire.Claimed)
	if err != nil {
		return nil, err
	}
	for i := range claimed {
		j := &claimed[i]
		if !goneIDs[j.ClaimHost] {
			continue
		}
		if err := revokeAssignment(ctx, tx, j, "host stopped"); err != nil {
			return nil, err
		}
		if err := moveJob(ctx, tx, j, wire.Queued, fmt.Sprintf("host %s stopped while it was claimed", j.ClaimHost)); err != nil {
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
func (h *Host) Start(ctx context.Context, url string) error {
	if err := h.identify(); err != nil {
		return fmt.Errorf("host identity: %w", err)
	}
	return h.write(ctx, named("restart-recovery"), func(tx *store.Tx) error {
		// Hosts decide who is gone one at a time (the log lock), so a
		// departed host is retired once.
		if err := tx.LockLog(ctx); err != nil {
			return err
		}
		settings, err := tx.SettingList(ctx)
		if err != nil {
			return err
		}
		serves, _ := strconv.Atoi(settings[settingServes])
		hosts, err := tx.HostList(ctx)
		if err != nil {
			return err
		}
		gone := h.goneHosts(hosts, tx.NowMS())
		// A state served before the registry existed records a crash of
		// its unnamed host the old way, once.
		if len(hosts) == 0 && settings[settingServing] == "1" {
			gone = append(gone, store.Host{ID: "", Serving: true})
		}
		requeued, err := h.retireHosts(ctx, tx, gone, true)
		if err != nil {
			return err
		}
		acct, err := tx.AccountingGet(ctx, store.NoLock)
		if err != nil {
			return err
		}
		kind, title := wire.EventHostStarted, fmt.Sprintf("Host %s started serving", h.ID)
		if slices.ContainsFunc(hosts, func(o store.Host) bool { return o.ID == h.ID }) || len(hosts) == 0 && serves > 0 {
			kind = wire.EventHostRestarted
			title = fmt.Sprintf("Host %s restarted with its allowance and records; %d of %d credits spent", h.ID, acct.Spent, acct.Allowance)
		}
		if err := appendEvent(ctx, tx, kind, "host", title, map[string]any{
			"url": url, "host": h.ID, "kernel_key": h.kernel.PublicKey, "accounting": acct, "requeued": requeued,
		}); err != nil {
			return err
		}
		return tx.HostPut(ctx, store.Host{ID: h.ID, Instance: h.instance, URL: url,
			StartedAtMS: tx.NowMS(), SeenAtMS: tx.NowMS(), Serving: true})
	})
}

// Stop records a clean shutdown of this host.
func (h *Host) Stop(ctx context.Context) error {
	return h.write(ctx, named("stop"), func(tx *store.Tx) error {
		acct, err := tx.AccountingGet(ctx, store.NoLock)
		if err != nil {
			return err
		}
		self, err := tx.HostGet(ctx, h.ID)
		if err != nil {
			return err
		}
		if self.Instance != h.instance {
			return ErrTakenOver
		}
		if err := appendEvent(ctx, tx, wire.EventHostStopped, "host",
			fmt.Sprintf("Host %s shut down; %d of %d credits spent", h.ID, acct.Spent, acct.Allowance),
			map[string]any{"clean": true, "host": h.ID, "accounting": acct}); err != nil {
			return err
		}
		self.Serving, self.SeenAtMS = false, tx.NowMS()
		return tx.HostPut(ctx, self)
	})
}

// Beat renews this host's liveness and retires any peer gone past the
// liveness window. ErrTakenOver means another process serves under this
// host's identity now.
func (h *Host) Beat(ctx context.Context) error {
	var retired []string
	err := h.write(ctx, named("host-beat"), func(tx *store.Tx) error {
		retired = nil
		// Hosts decide who is gone one at a time (the log lock), so a
		// departed host is retired once.
		if err := tx.LockLog(ctx); err != nil {
			return err
		}
		ok, err := tx.HostSeen(ctx, h.ID, h.instance, tx.NowMS())
		if err != nil {
			return err
		}
		if !ok {
			return ErrTakenOver
		}
		hosts, err := tx.HostList(ctx)
		if err != nil {
			return err
		}
		gone := h.goneHosts(hosts, tx.NowMS())
		gone = slices.DeleteFunc(gone, func(o store.Host) bool { return o.ID == h.ID })
		if _, err := h.retireHosts(ctx, tx, gone, false); err != nil {
			return err
		}
		for _, o := range gone {
			retired = append(retired, o.ID)
		}
		return nil
	})
	if err == nil && len(retired) > 0 {
		h.Log.Warn("hosts gone", "hosts", retired)
	}
	return err
}

// RunBeat renews this host's liveness every Liveness/5 until ctx ends
// or another process takes the identity over, which it returns.
func (h *Host) RunBeat(ctx context.Context, onError func(error)) error {
	t := time.NewTicker(h.Liveness / 5)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		switch err := h.Beat(ctx); {
		case errors.Is(err, ErrTakenOver):
			return err
		case err != nil && ctx.Err() == nil && !errors.Is(err, store.ErrClosed):
			onError(err)
		}
	}
}
