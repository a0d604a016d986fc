package host

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/fleet/fleet/internal/budget"
	"github.com/fleet/fleet/internal/fleet"
	"github.com/fleet/fleet/internal/jobs"
	"github.com/fleet/fleet/internal/receipts"
	"github.com/fleet/fleet/internal/resource"
	"github.com/fleet/fleet/internal/store"
	"github.com/fleet/fleet/internal/wire"
)

// Publication is a publish call's result. AckLost is the lost
// acknowledgement fault: the HTTP layer must drop the response.
type Publication struct {
	resource.Result
	AckLost bool
}

// Publish publishes a job's section to its document. One transaction, in
// this order: lock the job and its document; replay an identical earlier
// request; decide (owner, generation and job state, then expected
// version); write the document and its mutation; settle the reservation;
// complete the job; sign the receipt; append the event; retain the outcome
// under the operation key. Refusals are retained and replay as refusals.
func (h *Host) Publish(ctx context.Context, caller fleet.Caller, op string, req wire.PublishRequest) (Publication, error) {
	// Checking and canonicalizing the request reads no state, so it stays
	// off the serial write path.
	req, err := resource.Normalize(req)
	if err != nil {
		return Publication{}, err
	}
	usage := budget.ReportedUsage(req.Body)
	var pub Publication
	err = h.write(ctx, named("publish"), func(tx *store.Tx) error {
		pub = Publication{}
		// The job and its document are read together, and on PostgreSQL
		// locked, first, so concurrent publications of one document, from
		// any host, decide one after another.
		j, err := getJob(ctx, tx, op, store.ForUpdate)
		if err != nil {
			return err
		}
		p, err := resource.Bind(j.DocumentID, caller, req)
		if err != nil {
			return err
		}
		doc := wire.Document{ID: j.DocumentID, Version: j.DocumentVersion, Generation: j.Generation, Owner: j.Owner}

		// An identical earlier request gets its retained outcome, nothing more.
		if prior, found, err := p.Replay(ctx, tx); err != nil || found {
			if err != nil {
				return err
			}
			pub.Result = prior
			return appendEvent(ctx, tx, wire.EventReplayed, caller.ID,
				fmt.Sprintf("%s repeated a publication of %s and got its retained outcome (%s)", caller.ID, j.Section, prior.Outcome.Status),
				map[string]any{"operation_id": op, "operation_key": req.OperationKey, "outcome": json.RawMessage(prior.Raw)})
		}

		// Only a running job (or an unresolved one, whose slow worker may
		// still be alive) can be published by its current owner at its
		// current generation; then the version must be the expected one.
		outcome, err := p.Decide(doc, jobs.Publishable(j.State))
		if err != nil {
			return err
		}
		// The holder's body must be its job's: checked here, against the
		// job as locked, before it can take effect.
		if outcome.Status != wire.StatusSuperseded {
			binding, err := h.bind(ctx, tx, j, req.Body)
			if err != nil {
				return err
			}
			if !binding.Matches {
				outcome = wire.Outcome{Status: wire.StatusRejected, Version: doc.Version, Reason: binding.Reason}
			}
		}

		var acct wire.Accounting
		var settled, released int64
		var reserved *int64
		kind := wire.EventSuperseded
		switch outcome.Status {
		case wire.StatusPublished:
			kind = wire.EventPublished
			if err := p.Write(ctx, tx, outcome.Version); err != nil {
				return err
			}
			// Settle the reservation: all of it, or with model prices what
			// the reported usage cost; the rest goes back to available.
			settled, released = budget.Settlement(j.Reserved, h.prices, usage)
			held := j.Reserved
			if acct, err = move(ctx, tx, &j, settled); err != nil {
				return err
			}
			reserved = &held
			if err := moveJob(ctx, tx, &j, wire.Completed, "published"); err != nil {
				return err
			}
			if pub.AckLost, err = h.losesAck(ctx, tx); err != nil {
				return err
			}
		case wire.StatusVersionConflict, wire.StatusRejected:
			kind = wire.EventVersionConflict
			if outcome.Status == wire.StatusRejected {
				kind = wire.EventRejected
			}
			fallthrough
		default:
			if acct, err = tx.AccountingGet(ctx, store.NoLock); err != nil {
				return err
			}
		}

		r, err := h.issueReceipt(tx, receipts.Draft{Kind: wire.KindPublication, OperationID: op, Caller: caller.ID,
			Decision: wire.PublicationDecision(outcome.Status), Cost: settled, Reserved: reserved, Accounting: acct})
		if err != nil {
			return err
		}
		outcome.ReceiptID = r.ID

		data := map[string]any{"operation_id": op, "section": j.Section, "status": outcome.Status,
			"version": outcome.Version, "receipt_id": r.ID, "accounting": acct}
		if outcome.Reason != "" {
			data["reason"] = outcome.Reason
		}
		if pub.AckLost {
			data["fault"] = wire.FaultLoseAck
		}
		if reserved != nil {
			data["reserved"], data["settled"], data["released"] = *reserved, settled, released
			if usage != nil && h.prices != nil {
				data["usage"] = usage
			}
		}
		if err := appendEvent(ctx, tx, kind, caller.ID,
			fmt.Sprintf("%s's publication of %s: %s at version %d", caller.ID, j.Section, outcome.Status, outcome.Version), data); err != nil {
			return err
		}

		pub.Result, err = p.Record(ctx, tx, outcome)
		return err
	})
	switch {
	case err != nil:
		return pub, err
	case pub.Replayed:
		h.metrics.Replay()
	default:
		h.metrics.Publication(string(pub.Outcome.Status))
		if pub.Outcome.Status == wire.StatusPublished {
			h.series.Completed()
		}
	}
	h.Log.Info("publication", "operation_id", op, "worker", caller.ID, "generation", req.Generation,
		"status", pub.Outcome.Status, "version", pub.Outcome.Version, "receipt_id", pub.Outcome.ReceiptID,
		"replayed", pub.Replayed, "ack_lost", pub.AckLost)
	return pub, nil
}

// losesAck reports whether the publication just written is the one whose
// acknowledgement the lose_ack_index fault drops: the N-th mutation of the
// state (0 = the first). Replays add no mutation, so it fires once. Only
// counted when the fault is configured.
func (h *Host) losesAck(ctx context.Context, tx *store.Tx) (bool, error) {
	if h.loseAck == nil {
		return false, nil
	}
	// Where transactions commit concurrently (PostgreSQL), two could count
	// the same total; counting under the log lock makes "the N-th to commit"
	// one publication. Only with the fault configured.
	if err := tx.LockLog(ctx); err != nil {
		return false, err
	}
	n, err := tx.MutationTotal(ctx)
	return err == nil && n-1 == *h.loseAck, err
}
