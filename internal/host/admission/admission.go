// Package admission is a claimed job's dispatch: in one transaction the
// claim checked, the cost reserved against the allowance (or denied), the
// job moved to running (or refused) with its admission retained for
// repeats, the receipt signed and the event appended.
package admission

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/fleet/fleet/internal/fleet"
	"github.com/fleet/fleet/internal/host/ledger"
	"github.com/fleet/fleet/internal/host/views"
	"github.com/fleet/fleet/internal/jobs"
	"github.com/fleet/fleet/internal/metrics"
	"github.com/fleet/fleet/internal/receipts"
	"github.com/fleet/fleet/internal/series"
	"github.com/fleet/fleet/internal/store"
	"github.com/fleet/fleet/internal/tracing"
	"github.com/fleet/fleet/internal/wire"
)

// Admission admits claimed jobs against the allowance.
type Admission struct {
	ledger  *ledger.Ledger
	metrics *metrics.Metrics
	series  *series.Recorder
	views   *views.Views  // a repeat's receipt, as the log placed it
	lease   time.Duration // a running job's lease from its admission
}

// New admits through l, counting in m and s, reading receipts through v;
// lease is the lease a claim has now.
func New(l *ledger.Ledger, m *metrics.Metrics, s *series.Recorder, v *views.Views, lease time.Duration) *Admission {
	return &Admission{ledger: l, metrics: m, series: s, views: v, lease: lease}
}

// Dispatch asks the host to admit a claimed job against the allowance. In
// one transaction it checks the claim, reserves the cost (or denies), moves
// the job to running (or refused), signs the receipt and appends the event.
// A repeat with the claim that was dispatched returns the original decision
// while the job is still running or refused.
func (a *Admission) Dispatch(ctx context.Context, caller fleet.Caller, op string, ref wire.ClaimRef) (json.RawMessage, error) {
	point := func(d dispatched) string {
		switch {
		case d.adm.Decision == "": // none made (the span's name until one is)
			return "dispatch"
		case d.receipt == nil:
			return "dispatch-repeat"
		}
		return "dispatch-" + string(d.adm.Decision)
	}
	ctx = tracing.With(ctx, tracing.OperationID.String(op), tracing.ClaimID.String(ref.ClaimID),
		tracing.Generation.Int64(ref.Generation), tracing.Worker.String(caller.ID))
	out, err := ledger.Write(ctx, a.ledger, point, func(tx *store.Tx) (dispatched, error) {
		return a.dispatch(ctx, tx, caller, op, ref, true)
	})
	if err != nil {
		return nil, err
	}
	return a.answerDispatch(ctx, caller, op, ref, out)
}

// dispatch is Dispatch's transaction, or a batch's item. Alone
// (reserveBoth), it takes the reservations at the job's tenant and at the
// fleet ahead, in one statement where reserving at each would be one
// each; a batch took its items' ahead already (ledger.Batch).
func (a *Admission) dispatch(ctx context.Context, tx *store.Tx, caller fleet.Caller, op string, ref wire.ClaimRef, reserveBoth bool) (dispatched, error) {
	j, err := jobs.Get(ctx, tx, op, store.ForUpdate)
	if err != nil {
		return dispatched{}, err
	}
	if jobs.DispatchRepeat(j, caller.ID, ref) {
		return retained(j)
	}
	if err := jobs.CheckClaim(j, caller, ref.ClaimID, ref.Generation, wire.Claimed); err != nil {
		return dispatched{}, err
	}
	if reserveBoth {
		if err := reserveAhead(ctx, tx, []store.Job{j}); err != nil {
			return dispatched{}, err
		}
	}
	return a.admit(ctx, tx, caller, j)
}

// retained is the decision a job's admission made, retained for repeats.
func retained(j store.Job) (dispatched, error) {
	var adm wire.Admission
	if err := json.Unmarshal(j.Admission, &adm); err != nil {
		return dispatched{}, fmt.Errorf("dispatch %s: retained admission: %w", j.OperationID, err)
	}
	return dispatched{adm: adm}, nil
}

// answerDispatch counts and logs a committed admission and answers it: a
// repeat's answer holds its receipt as the log placed it.
func (a *Admission) answerDispatch(ctx context.Context, caller fleet.Caller, op string, ref wire.ClaimRef, out dispatched) (json.RawMessage, error) {
	adm, err := a.answer(ctx, caller, op, ref, out)
	if err != nil {
		return nil, err
	}
	return json.Marshal(adm)
}

// answer is answerDispatch's admission, before it is encoded.
func (a *Admission) answer(ctx context.Context, caller fleet.Caller, op string, ref wire.ClaimRef, out dispatched) (wire.Admission, error) {
	adm := out.adm
	switch {
	case out.receipt != nil:
		adm.Receipt = *out.receipt
		decision := string(adm.Decision)
		a.metrics.Admission(decision)
		if adm.Decision == wire.DecisionDeny {
			a.series.Refused()
		}
		a.ledger.Log.Info("admission", "operation_id", op, "worker", caller.ID, "generation", ref.Generation,
			"decision", decision, "receipt_id", adm.Receipt.ID, "available", adm.Accounting.Available)
	case adm.Receipt.Signature == "":
		// A repeat: the retained admission names its receipt (one retained
		// by an older build holds the whole receipt and is answered as is).
		raw, err := a.placedReceipt(ctx, adm.Receipt.ID)
		if err == nil {
			err = json.Unmarshal(raw, &adm.Receipt)
		}
		if err != nil {
			return adm, fmt.Errorf("dispatch %s: retained admission's receipt: %w", op, err)
		}
	}
	return adm, nil
}

// placedReceipt reads a receipt that has committed, placing the log
// first if it is still pending: the host that decided it may have died
// between its commit and its sequencer's round, or be slow to place it,
// and any host's sequencer places every host's entries.
func (a *Admission) placedReceipt(ctx context.Context, id string) (json.RawMessage, error) {
	raw, err := a.views.Receipt(ctx, id)
	if fleet.ErrorCode(err) != wire.CodeNotFound {
		return raw, err
	}
	if err := a.ledger.DB().PlacePending(ctx); err != nil {
		return nil, err
	}
	return a.views.Receipt(ctx, id)
}

// retainedAdmission is an admission as its job keeps it for repeats: its
// receipt by id alone. Marshalled whole, the receipt's empty fields were
// a fifth of the job row, which every later transition writes again.
type retainedAdmission struct {
	wire.Admission
	Receipt receiptRef `json:"receipt"`
}

type receiptRef struct {
	ID string `json:"id"`
}

// dispatched is a dispatch's decision.
type dispatched struct {
	adm     wire.Admission
	receipt *wire.Receipt // as the log places it; nil for a repeat
}

// admit decides a claimed job's admission: it reserves the cost at
// every level that applies (levels.go; all or none) or denies naming the
// level that was short, signs the receipt, moves the job to running (or
// refused) with the admission retained for repeats, and appends the event.
func (a *Admission) admit(ctx context.Context, tx *store.Tx, caller fleet.Caller, j store.Job) (dispatched, error) {
	var out dispatched
	lv, err := reserveLevels(ctx, a.ledger, tx, caller, j)
	if err != nil {
		return out, err
	}
	adm, cost, kind := lv.admission()
	title := fmt.Sprintf("%s may write the %s section: %s", caller.ID, j.Section, adm.Reason)
	if adm.Decision == wire.DecisionDeny {
		title = fmt.Sprintf("%s was refused the %s section: %s", caller.ID, j.Section, adm.Reason)
	}
	acct := adm.Accounting
	receipt, err := a.ledger.IssueReceipt(tx, receipts.Draft{Kind: wire.KindAdmission, OperationID: j.OperationID, Caller: caller.ID,
		Decision: adm.Decision, Cost: cost, Accounting: acct, Tenant: j.Tenant, Level: adm.Level, Credential: lv.credentialHeld()})
	if err != nil {
		return out, err
	}
	// The retained admission names its receipt; a repeat reads the
	// receipt as the log placed it.
	adm.Receipt = wire.Receipt{ID: receipt.ID}
	retained, err := json.Marshal(retainedAdmission{Admission: adm, Receipt: receiptRef{ID: receipt.ID}})
	if err != nil {
		return out, err
	}
	if lv.short == "" {
		err = tx.JobSetRunning(ctx, &store.JobSetRunningParams{OperationID: j.OperationID, IfClaimID: j.ClaimID,
			Reserved: cost, ReserveShard: lv.fleet.Shard, TenantShard: lv.tenant.Shard, ReserveCredential: lv.credentialHeld(),
			Admission: retained, LeaseExpiresAtMS: tx.Now.Add(a.lease).UnixMilli(), Reason: adm.Reason, NowMS: tx.NowMS()})
	} else {
		err = tx.JobSetRefused(ctx, &store.JobSetRefusedParams{OperationID: j.OperationID, IfClaimID: j.ClaimID,
			Admission: retained, Reason: adm.Reason, NowMS: tx.NowMS()})
	}
	if err != nil {
		return out, err
	}
	out.adm, out.receipt = adm, receipt
	return out, ledger.AppendJobEvent(ctx, tx, kind, caller.ID, title, j.OperationID, admittedData{
		OperationID: j.OperationID, Section: j.Section, ReceiptID: receipt.ID, Accounting: acct, Tenant: j.Tenant})
}

// admittedData is an admission's event's data, its members in the order
// encoding/json writes a map's.
type admittedData struct {
	Accounting  wire.Accounting `json:"accounting"`
	OperationID string          `json:"operation_id"`
	ReceiptID   string          `json:"receipt_id"`
	Section     string          `json:"section"`
	Tenant      string          `json:"tenant"`
}

// DispatchMany is Dispatch for each item, in one transaction.
func (a *Admission) DispatchMany(ctx context.Context, caller fleet.Caller, items []ledger.JobCall[wire.ClaimRef]) ([]ledger.Answer[json.RawMessage], error) {
	done, err := ledger.Batch(ctx, a.ledger, "dispatch-batch", ledger.BatchReads{Ops: ledger.Ops(items), Reserve: true}, func(tx *store.Tx, i int) (dispatched, error) {
		return a.dispatch(ctx, tx, caller, items[i].OperationID, items[i].Request, false)
	})
	if err != nil {
		return nil, err
	}
	out := make([]ledger.Answer[json.RawMessage], len(items))
	for i, d := range done {
		if out[i].Err = d.Err; d.Err == nil {
			out[i].Value, out[i].Err = a.answerDispatch(ctx, caller, items[i].OperationID, items[i].Request, d.Value)
		}
	}
	return out, nil
}
