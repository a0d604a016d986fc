package host_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/fleet/fleet/internal/fleet"
	"github.com/fleet/fleet/internal/host/ledger"
	"github.com/fleet/fleet/internal/host/publication"
	"github.com/fleet/fleet/internal/resource"
	"github.com/fleet/fleet/internal/sections"
	"github.com/fleet/fleet/internal/store"
	"github.com/fleet/fleet/internal/storetest"
	"github.com/fleet/fleet/internal/wire"
)

// TestMixedBatches: batches of dispatches, publications, heartbeats and
// failures whose items are allowed and refused by the allowance, repeated,
// published, superseded, version-conflicted, rejected, replayed, stale and
// unknown, each get exactly the answer the single call gives, and leave
// the accounting, the jobs, the receipts and the event log exactly as the
// same calls sent one by one do. Two twin states run the same script on
// the same clock, one call at a time and in batches, and their
// transcripts are compared.
func TestMixedBatches(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T) {
		single := runMixedScript(t, oneByOne)
		batched := runMixedScript(t, inBatches)
		for _, twin := range []struct {
			name  string
			lines []string
		}{{"in batches", batched}, {"in batches of distinct jobs", runMixedScript(t, inDistinctBatches)}} {
			if len(single) != len(twin.lines) {
				t.Fatalf("%d lines one by one, %d %s", len(single), len(twin.lines), twin.name)
			}
			for i := range single {
				if single[i] != twin.lines[i] {
					t.Errorf("line %d:\n  one by one: %s\n  %s: %s", i, single[i], twin.name, twin.lines[i])
				}
			}
		}
		// The script covers every outcome it claims to.
		all := strings.Join(batched, "\n")
		for _, want := range []string{`"decision":"allow"`, `"decision":"deny"`, "stale_claim", "not_found",
			`"status":"published"`, `"status":"superseded"`, `"status":"version_conflict"`, `"status":"rejected"`,
			"replayed", `"state":"queued"`, `"state":"failed"`, `"cancel_requested":false`, "invalid_request",
			`mutation 0: {"caller":"worker-1","key":"k0","version":1}`, `"deliveries":2`} {
			if !strings.Contains(all, want) {
				t.Errorf("the script never produced %s:\n%s", want, all)
			}
		}
	})
}

// How runMixedScript sends its calls: each alone; each step's calls as one
// batch (which names some jobs twice, so its items read their jobs
// themselves); or as consecutive batches none of which names a job twice
// (which read their jobs ahead of their items, store.Tx.ReadAhead).
const (
	oneByOne = iota
	inBatches
	inDistinctBatches
)

// sendBatch sends a step's calls as one batch, or with distinct as
// batches cut before each call whose job the batch already names, and
// returns every call's answer in order.
func sendBatch[R, T any](t *testing.T, calls []ledger.JobCall[R], distinct bool, send func([]ledger.JobCall[R]) ([]ledger.Answer[T], error)) []ledger.Answer[T] {
	t.Helper()
	var out []ledger.Answer[T]
	for len(calls) > 0 {
		n, named := 0, map[string]bool{}
		for n < len(calls) && (!distinct || !named[calls[n].OperationID]) {
			named[calls[n].OperationID] = true
			n++
		}
		answers, err := send(calls[:n])
		if err != nil {
			t.Fatal(err)
		}
		out, calls = append(out, answers...), calls[n:]
	}
	return out
}

// runMixedScript runs the script on a fresh state (4 sections, allowance 60,
// cost 20: three admissions, then denials) and returns its transcript:
// every answer and, at the end, the jobs, accounting, receipts and events,
// with ids that differ between states replaced by names.
func runMixedScript(t *testing.T, mode int) []string {
	t.Helper()
	batched, distinct := mode != oneByOne, mode == inDistinctBatches
	ctx := context.Background()
	f := newState(t, 60, 20, 2)
	clock := storetest.NewClock(time.UnixMilli(1_800_000_000_000))
	h := f.openAs(t, "", clock)
	w1, w2 := caller("worker-1"), caller("worker-2")
	res, err := h.Claims().Claim(ctx, w1, 0, 4)
	if err != nil || len(res.Jobs) != 4 {
		t.Fatalf("claim: %+v, %v", res, err)
	}
	jobs := res.Jobs
	names := map[string]string{}
	for i, j := range jobs {
		names[j.OperationID], names[j.Claim.ClaimID] = fmt.Sprint("job", i), fmt.Sprint("claim", i)
	}
	unknown := uuid.Must(uuid.NewV7()).String()
	names[unknown], names[h.ID] = "unknown-job", "the-host"
	var out []string
	say := func(step string, i int, v any, err error) {
		line := fmt.Sprintf("%s %d: ", step, i)
		if err != nil {
			line += "error " + string(fleet.ErrorCode(err))
		} else {
			line += string(testMustJSON(t, v))
		}
		for id, name := range names {
			line = strings.ReplaceAll(line, id, name)
		}
		out = append(out, scrub(line))
	}

	ref := func(j wire.ClaimedJob) wire.ClaimRef { return refOf(j) }
	dispatches := []ledger.JobCall[wire.ClaimRef]{
		{OperationID: jobs[0].OperationID, Request: ref(jobs[0])}, {OperationID: jobs[1].OperationID, Request: ref(jobs[1])}, {OperationID: jobs[2].OperationID, Request: ref(jobs[2])},
		{OperationID: jobs[3].OperationID, Request: ref(jobs[3])}, // the allowance is spent: denied
		{OperationID: jobs[0].OperationID, Request: ref(jobs[0])}, // a repeat: the retained admission
		{OperationID: jobs[1].OperationID, Request: wire.ClaimRef{ClaimID: "not-the-claim", Generation: jobs[1].Claim.Generation}},
		{OperationID: unknown, Request: ref(jobs[0])},
	}
	if batched {
		answers := sendBatch(t, dispatches, distinct, func(c []ledger.JobCall[wire.ClaimRef]) ([]ledger.Answer[json.RawMessage], error) {
			return h.Admission().DispatchMany(ctx, w1, c)
		})
		for i, a := range answers {
			say("dispatch", i, json.RawMessage(a.Value), a.Err)
		}
	} else {
		for i, d := range dispatches {
			raw, err := h.Admission().Dispatch(ctx, w1, d.OperationID, d.Request)
			say("dispatch", i, raw, err)
		}
	}

	body := func(j wire.ClaimedJob) json.RawMessage {
		raw, err := sections.Body(j.OperationID, j.Section, j.InputSHA256, j.Input.Document)
		if err != nil {
			t.Fatal(err)
		}
		return raw
	}
	req := func(key string, j wire.ClaimedJob, version int64, b json.RawMessage) resource.Request {
		return canon(t, wire.PublishRequest{OperationKey: key, Generation: j.Claim.Generation, ExpectedVersion: version, Body: b})
	}
	type pubCall struct {
		who  fleet.Caller
		call ledger.JobCall[resource.Request]
	}
	publications := []pubCall{
		{w1, ledger.JobCall[resource.Request]{OperationID: jobs[0].OperationID, Request: req("k0", jobs[0], 0, body(jobs[0]))}}, // published
		{w1, ledger.JobCall[resource.Request]{OperationID: jobs[1].OperationID, Request: req("k1", jobs[1], 5, body(jobs[1]))}}, // version_conflict
		{w1, ledger.JobCall[resource.Request]{OperationID: jobs[2].OperationID, Request: req("k2", jobs[2], 0, body(jobs[1]))}}, // rejected: job 1's body
		{w1, ledger.JobCall[resource.Request]{OperationID: jobs[0].OperationID, Request: req("k0", jobs[0], 0, body(jobs[0]))}}, // replayed
		{w1, ledger.JobCall[resource.Request]{OperationID: jobs[3].OperationID, Request: req("k3", jobs[3], 0, body(jobs[3]))}}, // refused job: superseded
		{w1, ledger.JobCall[resource.Request]{OperationID: unknown, Request: req("k9", jobs[0], 0, body(jobs[0]))}},             // not_found
	}
	if batched {
		calls := make([]ledger.JobCall[resource.Request], len(publications))
		for i, p := range publications {
			calls[i] = p.call
		}
		answers := sendBatch(t, calls, distinct, func(c []ledger.JobCall[resource.Request]) ([]ledger.Answer[publication.Publication], error) {
			return h.Publications().PublishMany(ctx, w1, c)
		})
		for i, a := range answers {
			say("publish", i, publicationLine(a.Value), a.Err)
		}
	} else {
		for i, p := range publications {
			pub, err := h.Publications().Publish(ctx, p.who, p.call.OperationID, p.call.Request)
			say("publish", i, publicationLine(pub), err)
		}
	}
	// Another worker's publication of job 1 is superseded.
	pub, err := h.Publications().Publish(ctx, w2, jobs[1].OperationID, req("w2", jobs[1], 0, body(jobs[1])))
	say("publish-other", 0, publicationLine(pub), err)

	beats := []ledger.JobCall[wire.ClaimRef]{
		{OperationID: jobs[1].OperationID, Request: ref(jobs[1])}, // running: renewed
		{OperationID: jobs[3].OperationID, Request: ref(jobs[3])}, // refused: stale
		{OperationID: jobs[0].OperationID, Request: ref(jobs[0])}, // completed: stale
	}
	failures := []ledger.JobCall[wire.FailRequest]{
		{OperationID: jobs[1].OperationID, Request: wire.FailRequest{ClaimID: jobs[1].Claim.ClaimID, Generation: jobs[1].Claim.Generation, Reason: "flaky", Retryable: true}},
		{OperationID: jobs[2].OperationID, Request: wire.FailRequest{ClaimID: jobs[2].Claim.ClaimID, Generation: jobs[2].Claim.Generation, Reason: "broken"}},
		{OperationID: jobs[1].OperationID, Request: wire.FailRequest{ClaimID: jobs[1].Claim.ClaimID, Generation: jobs[1].Claim.Generation, Reason: "flaky", Retryable: true}}, // a repeat
		{OperationID: jobs[3].OperationID, Request: wire.FailRequest{ClaimID: jobs[3].Claim.ClaimID, Generation: jobs[3].Claim.Generation, Reason: "x"}},                      // refused: stale
		{OperationID: jobs[2].OperationID, Request: wire.FailRequest{ClaimID: jobs[2].Claim.ClaimID, Generation: jobs[2].Claim.Generation}},                                   // no reason: invalid
	}
	if batched {
		answers := sendBatch(t, beats, distinct, func(c []ledger.JobCall[wire.ClaimRef]) ([]ledger.Answer[wire.HeartbeatResult], error) {
			return h.Claims().HeartbeatMany(ctx, w1, c)
		})
		for i, a := range answers {
			say("heartbeat", i, a.Value, a.Err)
		}
		failed := sendBatch(t, failures, distinct, func(c []ledger.JobCall[wire.FailRequest]) ([]ledger.Answer[wire.FailResult], error) {
			return h.Failures().FailMany(ctx, w1, c)
		})
		for i, a := range failed {
			say("fail", i, a.Value, a.Err)
		}
	} else {
		for i, b := range beats {
			hb, err := h.Claims().Heartbeat(ctx, w1, b.OperationID, b.Request)
			say("heartbeat", i, hb, err)
		}
		for i, fr := range failures {
			res, err := h.Failures().Fail(ctx, w1, fr.OperationID, fr.Request)
			say("fail", i, res, err)
		}
	}

	snap, err := h.Views().Snapshot(ctx)
	if err != nil {
		t.Fatal(err)
	}
	say("accounting", 0, snap.Accounting, nil)
	for i, j := range snap.Jobs {
		say("job", i, map[string]any{"state": j.State, "reason": j.Reason, "generation": j.Generation, "version": j.DocumentVersion,
			"reserved": j.Reserved, "attempts": j.Attempts, "owner": j.Owner}, nil)
	}
	events, err := h.Views().Events(ctx, 0, 1000)
	if err != nil {
		t.Fatal(err)
	}
	for i, e := range events {
		say("event", i, map[string]any{"kind": e.Kind, "actor": e.Actor, "title": e.Title}, nil)
	}
	var receipts [][]byte
	storetest.Read(t, h.DB(), func(ctx context.Context, tx *store.Tx) (err error) {
		// Each document's mutations and retained operations (a batch's
		// are written at its end, store.Tx.WriteHeld).
		for i, j := range jobs {
			ms, err := tx.MutationList(ctx, j.DocumentID)
			if err != nil {
				return err
			}
			for _, m := range ms {
				say("mutation", i, map[string]any{"version": m.Version, "key": m.OperationKey, "caller": m.Caller}, nil)
			}
			ops, err := tx.OperationList(ctx, j.DocumentID)
			if err != nil {
				return err
			}
			for _, o := range ops {
				say("operation", i, map[string]any{"key": o.OperationKey, "caller": o.Caller, "status": o.Status, "deliveries": o.Deliveries}, nil)
			}
		}
		receipts, err = tx.ReceiptList(ctx, "")
		return err
	})
	for i, raw := range receipts {
		var r wire.Receipt
		if err := json.Unmarshal(raw, &r); err != nil {
			t.Fatal(err)
		}
		say("receipt", i, map[string]any{"kind": r.Kind, "operation": r.OperationID, "decision": r.Decision, "cost": r.Cost,
			"accounting": r.Accounting, "sequence": r.Sequence}, nil)
	}
	f.verify(t)
	return out
}

// publicationLine is what a publication's answer says, without its
// receipt id (a digest over a nonce) but with whether it was a replay.
func publicationLine(p publication.Publication) map[string]any {
	return map[string]any{"status": p.Outcome.Status, "version": p.Outcome.Version, "reason": p.Outcome.Reason,
		"replayed": p.Replayed, "has_receipt": p.Outcome.ReceiptID != ""}
}

// scrub drops what differs between two states by design: receipt ids and
// signatures (digests over nonces), the kernel key, and a retry's
// claimable time (its backoff has random jitter).
func scrub(line string) string {
	var v any
	head, rest, ok := strings.Cut(line, ": ")
	if !ok || json.Unmarshal([]byte(rest), &v) != nil {
		return line
	}
	var drop func(any) any
	drop = func(x any) any {
		switch x := x.(type) {
		case map[string]any:
			for k := range x {
				switch k {
				case "receipt_id", "id", "signature", "prev", "nonce", "kernel_key", "claimable_at_ms":
					delete(x, k)
				default:
					x[k] = drop(x[k])
				}
			}
		case []any:
			for i := range x {
				x[i] = drop(x[i])
			}
		}
		return x
	}
	data, _ := json.Marshal(drop(v))
	return head + ": " + string(data)
}

func testMustJSON(t *testing.T, v any) []byte {
	t.Helper()
	data, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return data
}
