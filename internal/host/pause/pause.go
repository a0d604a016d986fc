// Package pause is the operator's kill switch: while claims are paused
// every claim answers with no job and the queue "paused", on every host
// serving the state, and nothing in flight is touched (claimed jobs may
// still be dispatched, running ones heartbeat and publish). A pause and a
// resumption are each signed (a claims receipt) and logged.
package pause

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/fleet/fleet/internal/fleet"
	"github.com/fleet/fleet/internal/host/access"
	"github.com/fleet/fleet/internal/host/ledger"
	"github.com/fleet/fleet/internal/receipts"
	"github.com/fleet/fleet/internal/store"
	"github.com/fleet/fleet/internal/wire"
)

// Switch pauses and resumes the claims of every host serving the state.
type Switch struct{ ledger *ledger.Ledger }

// New is the switch of the state l writes to.
func New(l *ledger.Ledger) *Switch { return &Switch{ledger: l} }

// claimsSetting is the setting that holds the claims' state (as
// wire.ClaimsState JSON; absent: not paused). A claim reads it in its own
// statement (store.JobClaimManyParams.UnlessPaused).
const claimsSetting = store.ClaimsSetting

// Pause pauses claims, saying why. Pausing them when they are
// paused changes nothing and signs nothing.
func (s *Switch) Pause(ctx context.Context, reason string) (wire.ClaimsState, error) {
	if len(reason) > wire.MaxReasonBytes || !wire.IsPlainText(reason) {
		return wire.ClaimsState{}, fleet.Errorf(wire.CodeInvalid, "reason must be at most %d bytes of one line of UTF-8 text without control, format or separator characters", wire.MaxReasonBytes)
	}
	return s.set(ctx, true, reason)
}

// Resume ends a pause. Resuming claims that are not paused changes
// nothing and signs nothing.
func (s *Switch) Resume(ctx context.Context) (wire.ClaimsState, error) {
	return s.set(ctx, false, "")
}

func (s *Switch) set(ctx context.Context, paused bool, reason string) (wire.ClaimsState, error) {
	verb, decision, kind := "resumed", wire.DecisionResumed, wire.EventClaimsResumed
	if paused {
		verb, decision, kind = "paused", wire.DecisionPaused, wire.EventClaimsPaused
	}
	st, err := ledger.Write(ctx, s.ledger, ledger.Named[wire.ClaimsState]("claims"), func(tx *store.Tx) (wire.ClaimsState, error) {
		// Exclusive: the claims in flight finish first, and every claim
		// after this commits sees it, on every host.
		if err := tx.LockClaims(ctx, true); err != nil {
			return wire.ClaimsState{}, err
		}
		cur, err := Read(ctx, tx)
		if err != nil || cur.Paused == paused {
			return cur, err
		}
		next := wire.ClaimsState{Paused: paused, AtMS: tx.NowMS(), Changed: true}
		if paused {
			next.Reason, next.By = reason, access.OperatorName
		}
		stored, err := json.Marshal(wire.ClaimsState{Paused: next.Paused, Reason: next.Reason, By: next.By, AtMS: next.AtMS})
		if err != nil {
			return wire.ClaimsState{}, err
		}
		if err := tx.SettingPut(ctx, claimsSetting, string(stored)); err != nil {
			return wire.ClaimsState{}, err
		}
		acct, err := tx.AccountingGet(ctx, store.NoLock)
		if err != nil {
			return wire.ClaimsState{}, err
		}
		r, err := s.ledger.IssueReceipt(tx, receipts.Draft{Kind: wire.KindClaims, OperationID: "claims", Caller: access.OperatorName,
			Decision: decision, Accounting: acct})
		if err != nil {
			return wire.ClaimsState{}, err
		}
		next.ReceiptID = r.ID
		title := "The operator resumed claims"
		if paused {
			title = "The operator paused claims"
			if reason != "" {
				title += ": " + reason
			}
		}
		return next, ledger.AppendEvent(ctx, tx, kind, access.OperatorName, title,
			map[string]any{"paused": paused, "reason": reason, "receipt_id": r.ID})
	})
	if err == nil && st.Changed {
		s.ledger.Log.Info(fmt.Sprintf("claims %s", verb), "reason", reason, "receipt_id", st.ReceiptID)
	}
	return st, err
}

// Read reads whether claims are paused, in tx.
func Read(ctx context.Context, tx *store.Tx) (wire.ClaimsState, error) {
	v, err := tx.SettingGet(ctx, claimsSetting)
	if store.IsNotFound(err) {
		return wire.ClaimsState{}, nil
	}
	if err != nil {
		return wire.ClaimsState{}, err
	}
	var st wire.ClaimsState
	if err := json.Unmarshal([]byte(v), &st); err != nil {
		return wire.ClaimsState{}, fmt.Errorf("the claims setting %q: %w", v, err)
	}
	return st, nil
}

// Hold takes the claims lock shared for a claim's transaction: a pause
// waits for the claim, and a pause that has committed is seen by every
// statement the claim runs after it, such as its own claim's statement
// (store.JobClaimManyParams.UnlessPaused), which then takes nothing.
func Hold(ctx context.Context, tx *store.Tx) error {
	return tx.LockClaims(ctx, false)
}

// Paused reads, in a claim's transaction under Hold, whether claims are
// paused.
func Paused(ctx context.Context, tx *store.Tx) (bool, error) {
	st, err := Read(ctx, tx)
	return st.Paused, err
}
