package host

import (
	"context"
	"time"

	"github.com/fleet/fleet/internal/host/access"
	"github.com/fleet/fleet/internal/store"
	"github.com/fleet/fleet/internal/wire"
)

// WorkersWindow is how far back the workers view counts completions and
// failures.
const WorkersWindow = time.Hour

// Workers is the workers view: every worker credential (revoked ones
// included) with what its jobs say of it (held now; completed and failed
// in the last hour, of the jobs it held last) and when it was last seen:
// the later of its last call to this host and the last time it moved a
// job (on any host). It counts as alive when seen within a lease, or while
// it holds a job whose lease is live.
func (h *Host) Workers(ctx context.Context) (wire.Workers, error) {
	now := h.db.Now()
	out := wire.Workers{NowMS: now.UnixMilli(), WindowS: int64(WorkersWindow / time.Second), Workers: []wire.WorkerView{}}
	err := h.db.Read(ctx, func(tx *store.Tx) error {
		creds, err := tx.CredentialList(ctx)
		if err != nil {
			return err
		}
		activity, err := tx.WorkerActivity(ctx, now.Add(-WorkersWindow).UnixMilli())
		if err != nil {
			return err
		}
		byName := make(map[string]store.WorkerActivity, len(activity))
		for _, a := range activity {
			byName[a.Worker] = a
		}
		for _, c := range creds {
			if c.Role != access.RoleWorker {
				continue
			}
			a := byName[c.Name]
			v := wire.WorkerView{Name: c.Name, RevokedAtMS: c.RevokedMS, Held: a.Held, CompletedInWindow: a.Completed,
				FailedInWindow: a.Failed, LastSeenMS: a.LastSeenMS}
			if at, ok := h.access.LastCall(c.Name); ok {
				v.LastSeenMS = max(v.LastSeenMS, at)
			}
			v.Alive = c.RevokedMS == 0 && (a.Held > 0 || (v.LastSeenMS > 0 && now.UnixMilli()-v.LastSeenMS <= h.Lease.Milliseconds()))
			out.Workers = append(out.Workers, v)
		}
		return nil
	})
	return out, err
}
