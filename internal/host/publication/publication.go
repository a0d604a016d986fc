// Package publication is a worker's publication of a job's section, read
// top to bottom in one transaction as docs/api.md states it: the job and
// its document locked, an identical earlier request replayed, the owner,
// generation and job state then the expected version then the body's
// binding to its job decided, the document and its mutation written, the
// reservation settled, the job completed, the receipt and event, the
// outcome retained under the operation key.
package publication

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"go.opentelemetry.io/otel/attribute"

	"github.com/fleet/fleet/internal/budget"
	"github.com/fleet/fleet/internal/fleet"
	"github.com/fleet/fleet/internal/host/combine"
	"github.com/fleet/fleet/internal/host/dependents"
	"github.com/fleet/fleet/internal/host/ledger"
	"github.com/fleet/fleet/internal/jobs"
	"github.com/fleet/fleet/internal/metrics"
	"github.com/fleet/fleet/internal/receipts"
	"github.com/fleet/fleet/internal/resource"
	"github.com/fleet/fleet/internal/series"
	"github.com/fleet/fleet/internal/store"
	"github.com/fleet/fleet/internal/tracing"
	"github.com/fleet/fleet/internal/wire"
)

// Publisher decides publications.
type Publisher struct {
	ledger  *ledger.Ledger
	metrics *metrics.Metrics
	series  *series.Recorder
	// prices, when set, settle publications by reported usage.
	prices budget.PriceTable
	// mode is the state's workers' mode, which publications must be in
	// ("" for a state made before it was recorded: either).
	mode string
	// loseAck is the fault injection of the lost acknowledgement: the
	// mutation ordinal (0 = the first publication to commit) whose
	// acknowledgement the HTTP layer drops after the commit. nil when off.
	loseAck *int64
	// combiner, when set, runs single publications that arrive together
	// as one batch (combine.go).
	combiner *combine.Combiner[*combined]
}

// Config is what a state says of its publications.
type Config struct {
	Prices  budget.PriceTable // model prices; nil for none
	Mode    string            // ModeDeterministic, ModeModel, or "" (either)
	LoseAck *int64            // the lose_ack_index fault; nil when off
	Combine int               // combined batches of single publications in flight; 0: each alone
	// CombinePatience is how long a publication waits for the combined
	// batch in flight before it may start another (0: at once).
	CombinePatience time.Duration
}

// New decides publications through l, counting them in m and s.
func New(l *ledger.Ledger, m *metrics.Metrics, s *series.Recorder, c Config) *Publisher {
	pb := &Publisher{ledger: l, metrics: m, series: s, prices: c.Prices, mode: c.Mode, loseAck: c.LoseAck}
	if c.Combine > 0 {
		pb.combiner = newCombiner(pb, c.Combine, c.CombinePatience)
	}
	return pb
}

// Publication is a publish call's result. AckLost is the lost
// acknowledgement fault: the HTTP layer must drop the response.
type Publication struct {
	Result
	AckLost bool
	// Ran is how long the job ran, dispatch to this publication, when it
	// completed the job (0 otherwise): fleet_job_run_seconds.
	Ran time.Duration
}

// Publish publishes a job's section to its document. One transaction, in
// this order: lock the job and its document; replay an identical earlier
// request; decide (owner, generation and job state, then expected
// version, then the body's binding to the job); write the document and its
// mutation; settle the reservation; complete the job; prepare the receipt;
// append the event; retain the outcome under the operation key. Refusals
// are retained and replay as refusals. The receipt's sequence, link and
// signature are sealed when the log places it, before Publish returns.
// Where publications are combined (Config.Combine), those that arrive
// together share one transaction, each as an item of it (combine.go).
func (pb *Publisher) Publish(ctx context.Context, caller fleet.Caller, op string, req resource.Request) (Publication, error) {
	if pb.combiner != nil {
		return pb.publishCombined(ctx, caller, op, req)
	}
	return pb.publishAlone(ctx, caller, op, req)
}

// publishAlone is Publish in a transaction of its own.
func (pb *Publisher) publishAlone(ctx context.Context, caller fleet.Caller, op string, req resource.Request) (Publication, error) {
	usage := budget.ReportedUsage(req.Body)
	ctx = tracing.With(ctx, tracing.OperationID.String(op), tracing.Generation.Int64(req.Generation),
		tracing.Worker.String(caller.ID), attribute.String("fleet.operation_key", req.OperationKey))
	pub, err := ledger.Write(ctx, pb.ledger, ledger.Named[Publication]("publish"), func(tx *store.Tx) (Publication, error) {
		return pb.publish(ctx, tx, caller, op, req, usage)
	})
	if err != nil {
		return pub, err
	}
	pb.notePublication(caller, op, req, pub)
	return pub, nil
}

// Waiting is how many single publications wait for a combined batch to
// take them (none where publications are not combined).
func (pb *Publisher) Waiting() int {
	if pb.combiner == nil {
		return 0
	}
	return pb.combiner.Waiting()
}

// Running is how many combined batches hold a slot now (none where
// publications are not combined).
func (pb *Publisher) Running() int {
	if pb.combiner == nil {
		return 0
	}
	return pb.combiner.Running()
}

// notePublication counts and logs a committed publication.
func (pb *Publisher) notePublication(caller fleet.Caller, op string, req resource.Request, pub Publication) {
	if pub.Replayed {
		pb.metrics.Replay()
	} else {
		pb.metrics.Publication(string(pub.Outcome.Status))
		if pub.Outcome.Status == wire.StatusPublished {
			pb.series.Completed()
		}
		if pub.Ran > 0 {
			pb.metrics.Ran(pub.Ran)
			pb.series.Observe("run", pub.Ran)
		}
	}
	pb.ledger.Log.Info("publication", "operation_id", op, "worker", caller.ID, "generation", req.Generation,
		"status", pub.Outcome.Status, "version", pub.Outcome.Version, "receipt_id", pub.Outcome.ReceiptID,
		"replayed", pub.Replayed, "ack_lost", pub.AckLost)
}

// publish is Publish's transaction.
func (pb *Publisher) publish(ctx context.Context, tx *store.Tx, caller fleet.Caller, op string, req resource.Request, usage *wire.Usage) (Publication, error) {
	// The job and its document are read together, and on PostgreSQL
	// locked, first, so concurrent publications of one document, from any
	// host, decide one after another.
	j, err := jobs.Get(ctx, tx, op, store.ForUpdate)
	if err != nil {
		return Publication{}, err
	}
	if err := jobs.CheckTenant(caller, j.Tenant, "job "+op); err != nil {
		return Publication{}, err
	}
	p, err := newOperation(j.DocumentID, caller, req)
	if err != nil {
		return Publication{}, err
	}
	// An identical earlier request gets its retained outcome, nothing more.
	if prior, found, err := p.Replay(ctx, tx); err != nil || found {
		if err != nil {
			return Publication{}, err
		}
		return Publication{Result: prior}, ledger.AppendEvent(ctx, tx, wire.EventReplayed, caller.ID,
			fmt.Sprintf("%s repeated a publication of %s and got its retained outcome (%s)", caller.ID, j.Section, prior.Outcome.Status),
			map[string]any{"operation_id": op, "operation_key": req.OperationKey, "outcome": json.RawMessage(prior.Raw)})
	}
	outcome, err := pb.decidePublication(ctx, tx, p, j)
	if err != nil {
		return Publication{}, err
	}
	completedBefore := j.State == wire.Completed
	eff, err := pb.applyPublication(ctx, tx, p, &j, outcome, usage)
	if err != nil {
		return Publication{}, err
	}
	if outcome, err = pb.signAndLog(ctx, tx, caller, j, outcome, eff, completedBefore); err != nil {
		return Publication{}, err
	}
	res, err := p.Record(ctx, tx, outcome)
	pub := Publication{Result: res, AckLost: eff.ackLost}
	if outcome.Status == wire.StatusPublished && j.State == wire.Completed && j.StartedAtMS > 0 {
		pub.Ran = time.Duration(tx.NowMS()-j.StartedAtMS) * time.Millisecond
	}
	return pub, err
}

// signAndLog signs a decided publication's receipt and logs its event;
// then what waits for the section is queued in the same transaction, its
// events after the publication's: once, as this publication completes it
// (a later one, superseded, must not count it again).
func (pb *Publisher) signAndLog(ctx context.Context, tx *store.Tx, caller fleet.Caller, j store.Job, outcome wire.Outcome,
	eff publicationEffect, completedBefore bool) (wire.Outcome, error) {
	r, err := pb.ledger.IssueReceipt(tx, receipts.Draft{Kind: wire.KindPublication, OperationID: j.OperationID, Caller: caller.ID,
		Decision: wire.PublicationDecision(outcome.Status), Cost: eff.settled, Reserved: eff.reserved, Pricing: eff.pricing,
		Accounting: eff.acct, Tenant: j.Tenant, Credential: j.ReserveCredential})
	if err != nil {
		return outcome, err
	}
	outcome.ReceiptID = r.ID
	if err := ledger.AppendJobEvent(ctx, tx, publicationEvent(outcome.Status), caller.ID,
		fmt.Sprintf("%s's publication of %s: %s at version %d", caller.ID, j.Section, outcome.Status, outcome.Version), j.OperationID,
		eff.eventData(j.OperationID, j.Section, outcome, pb.prices != nil)); err != nil {
		return outcome, err
	}
	if j.State == wire.Completed && !completedBefore {
		return outcome, dependents.Release(ctx, tx, caller.ID, j)
	}
	return outcome, nil
}

// decidePublication decides a new request against the job as locked. Only
// a running job (or an unresolved one, whose slow worker may still be
// alive) can be published by its current owner at its current generation;
// then the version must be the expected one; then the body must be its
// job's, checked before it can take effect.
func (pb *Publisher) decidePublication(ctx context.Context, tx *store.Tx, p *operation, j store.Job) (wire.Outcome, error) {
	doc := wire.Document{ID: j.DocumentID, Version: j.DocumentVersion, Generation: j.Generation, Owner: j.Owner}
	outcome, err := p.Decide(doc, jobs.Publishable(j.State))
	if err != nil || outcome.Status == wire.StatusSuperseded {
		return outcome, err
	}
	binding, err := pb.Bind(ctx, tx, j, p.Request.Body)
	if err != nil {
		return outcome, err
	}
	if !binding.Matches {
		outcome = wire.Outcome{Status: wire.StatusRejected, Version: doc.Version, Reason: binding.Reason}
	}
	return outcome, nil
}

// publicationEffect is what a decided publication did to the allowance.
type publicationEffect struct {
	acct              wire.Accounting
	reserved          *int64 // what the job held, when it settled
	settled, released int64
	usage             *wire.Usage
	pricing           *wire.Pricing // how the usage was priced; nil without model prices or usage
	ackLost           bool
}

// applyPublication carries out a decided publication. Published: the
// document and its mutation are written, the reservation settles (all of
// it, or with model prices what the reported usage cost, the rest going
// back to available) and the job completes. Refused: nothing changes.
func (pb *Publisher) applyPublication(ctx context.Context, tx *store.Tx, p *operation, j *store.Job,
	outcome wire.Outcome, usage *wire.Usage) (publicationEffect, error) {
	var eff publicationEffect
	if outcome.Status != wire.StatusPublished {
		acct, err := tx.AccountingGet(ctx, store.NoLock)
		return publicationEffect{acct: acct}, err
	}
	if err := p.Write(ctx, tx, outcome.Version); err != nil {
		return eff, err
	}
	held := j.Reserved
	eff.settled, eff.released, eff.pricing = budget.Settlement(held, pb.prices, usage)
	eff.reserved, eff.usage = &held, usage
	var err error
	if eff.acct, err = jobs.Spend(ctx, tx, j, eff.settled); err != nil {
		return eff, err
	}
	if err := jobs.Complete(ctx, tx, j, "published"); err != nil {
		return eff, err
	}
	eff.ackLost, err = pb.losesAck(ctx, tx)
	return eff, err
}

// publicationEvent is the kind of event a publication's outcome appends.
func publicationEvent(status wire.Status) wire.EventKind {
	switch status {
	case wire.StatusPublished:
		return wire.EventPublished
	case wire.StatusVersionConflict:
		return wire.EventVersionConflict
	case wire.StatusRejected:
		return wire.EventRejected
	default:
		return wire.EventSuperseded
	}
}

// publicationData is a publication's event's data, its members in the
// order encoding/json writes a map's. What settled is there when the
// reservation settled, the usage and its pricing when it was priced.
type publicationData struct {
	Accounting  wire.Accounting `json:"accounting"`
	Fault       string          `json:"fault,omitempty"`
	OperationID string          `json:"operation_id"`
	Pricing     *wire.Pricing   `json:"pricing,omitempty"`
	Reason      string          `json:"reason,omitempty"`
	ReceiptID   string          `json:"receipt_id"`
	Released    *int64          `json:"released,omitempty"`
	Reserved    *int64          `json:"reserved,omitempty"`
	Section     string          `json:"section"`
	Settled     *int64          `json:"settled,omitempty"`
	Status      wire.Status     `json:"status"`
	Usage       *wire.Usage     `json:"usage,omitempty"`
	Version     int64           `json:"version"`
}

// eventData is the publication event's data.
func (eff publicationEffect) eventData(op, section string, outcome wire.Outcome, priced bool) publicationData {
	data := publicationData{OperationID: op, Section: section, Status: outcome.Status, Version: outcome.Version,
		ReceiptID: outcome.ReceiptID, Accounting: eff.acct, Reason: outcome.Reason}
	if eff.ackLost {
		data.Fault = wire.FaultLoseAck
	}
	if eff.reserved != nil {
		data.Reserved, data.Settled, data.Released = eff.reserved, &eff.settled, &eff.released
		// Priced usage always has its pricing (budget.Settlement).
		if eff.usage != nil && priced {
			data.Usage, data.Pricing = eff.usage, eff.pricing
		}
	}
	return data
}

// losesAck reports whether the publication just written is the one whose
// acknowledgement the lose_ack_index fault drops: the N-th mutation of the
// state (0 = the first). Replays add no mutation, so it fires once. Only
// counted when the fault is configured.
func (pb *Publisher) losesAck(ctx context.Context, tx *store.Tx) (bool, error) {
	if pb.loseAck == nil {
		return false, nil
	}
	// Where transactions commit concurrently (PostgreSQL), two could count
	// the same total; counting under the log lock makes "the N-th to commit"
	// one publication. Only with the fault configured.
	if err := tx.LockLog(ctx); err != nil {
		return false, err
	}
	n, err := tx.MutationTotal(ctx)
	return err == nil && n-1 == *pb.loseAck, err
}

// PublishMany is Publish for each item, in one transaction. AckLost on any
// item means the lost acknowledgement fault drops the whole answer.
func (pb *Publisher) PublishMany(ctx context.Context, caller fleet.Caller, items []ledger.JobCall[resource.Request]) ([]ledger.Answer[Publication], error) {
	callers := make([]fleet.Caller, len(items))
	for i := range callers {
		callers[i] = caller
	}
	return pb.publishMany(ctx, callers, items)
}

// publishMany is PublishMany with each item's own caller.
func (pb *Publisher) publishMany(ctx context.Context, callers []fleet.Caller, items []ledger.JobCall[resource.Request]) ([]ledger.Answer[Publication], error) {
	usage, keys := make([]*wire.Usage, len(items)), make([]string, len(items))
	for i, it := range items {
		usage[i], keys[i] = budget.ReportedUsage(it.Request.Body), it.Request.OperationKey
	}
	reads := ledger.BatchReads{Ops: ledger.Ops(items), Keys: keys, Hold: true}
	done, err := ledger.Batch(ctx, pb.ledger, "publish-batch", reads, func(tx *store.Tx, i int) (Publication, error) {
		return pb.publish(ctx, tx, callers[i], items[i].OperationID, items[i].Request, usage[i])
	})
	if err != nil {
		return nil, err
	}
	for i, a := range done {
		if a.Err == nil {
			pb.notePublication(callers[i], items[i].OperationID, items[i].Request, a.Value)
		}
	}
	return done, nil
}
