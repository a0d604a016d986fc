// Command resource-exercise plays the stale-writer exercise of the report
// resource against a new SQLite file and prints what the reopened file shows:
//
//	{"mutations":2,"stale_writer":"superseded","original_outcome_replayed":true,"survives_reopen":true}
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"

	"github.com/fleet/fleet/internal/fleet"
	"github.com/fleet/fleet/internal/host/publication"
	"github.com/fleet/fleet/internal/store/backend"
	"github.com/fleet/fleet/internal/wire"
)

const documentID = "report-exercise"

type summary struct {
	Mutations               int64       `json:"mutations"`
	StaleWriter             wire.Status `json:"stale_writer"`
	OriginalOutcomeReplayed bool        `json:"original_outcome_replayed"`
	SurvivesReopen          bool        `json:"survives_reopen"`
}

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: resource-exercise PATH (a new SQLite file; an existing path is refused)")
		os.Exit(2)
	}
	out, err := run(context.Background(), os.Args[1])
	if err != nil {
		fmt.Fprintln(os.Stderr, "resource-exercise:", err)
		os.Exit(1)
	}
	fmt.Println(string(out))
}

// caller stands in for the trusted adapter: each worker's identity and the
// digest of the credential it would present.
func caller(id string) fleet.Caller {
	return fleet.Caller{ID: id, CredentialSHA256: fleet.DigestHex([]byte("credential-of-" + id))}
}

// The exercise's three publications: A's original, A's rewrite after the
// document was transferred to B, and B's correction.
var (
	original = wire.PublishRequest{OperationKey: "a-original", Generation: 1, ExpectedVersion: 0,
		Body: json.RawMessage(`{"summary":"A's report"}`)}
	stale = wire.PublishRequest{OperationKey: "a-after-transfer", Generation: 2, ExpectedVersion: 1,
		Body: json.RawMessage(`{"summary":"A's stale rewrite"}`)}
	correction = wire.PublishRequest{OperationKey: "b-correction", Generation: 2, ExpectedVersion: 1,
		Body: json.RawMessage(`{"summary":"B's correction"}`)}
)

func run(ctx context.Context, path string) ([]byte, error) {
	firstOutcome, replayOutcome, err := play(ctx, path)
	if err != nil {
		return nil, err
	}
	// Everything below is read from the file after closing and reopening it.
	db, err := backend.Open(ctx, path, backend.Options{})
	if err != nil {
		return nil, fmt.Errorf("reopen: %w", err)
	}
	s := publication.NewResource(db)
	defer s.Close()
	var sum summary
	if sum.Mutations, err = s.MutationCount(ctx, documentID); err != nil {
		return nil, err
	}
	ops, err := s.Operations(ctx, documentID)
	if err != nil {
		return nil, err
	}
	byKey := map[string]wire.Operation{}
	for _, op := range ops {
		byKey[op.OperationKey] = op
	}
	sum.StaleWriter = byKey[stale.OperationKey].Status
	orig := byKey[original.OperationKey]
	sum.OriginalOutcomeReplayed = orig.Deliveries == 2 &&
		bytes.Equal(orig.Outcome, firstOutcome) && bytes.Equal(replayOutcome, firstOutcome)
	doc, err := s.Get(ctx, documentID)
	if err != nil {
		return nil, err
	}
	wantBody, _ := json.Marshal(json.RawMessage(correction.Body))
	sum.SurvivesReopen = len(ops) == 3 && doc.Version == 2 && doc.Generation == 2 &&
		doc.Owner == caller("worker-b").ID && bytes.Equal(doc.Body, wantBody)
	return json.Marshal(sum)
}

// play creates the file and plays the exercise on it: A publishes, the
// document goes to B, A rereads and writes again, B publishes, A replays
// its original. It answers the original's outcome and the replay's.
func play(ctx context.Context, path string) (firstOutcome, replayOutcome []byte, err error) {
	a, b := caller("worker-a"), caller("worker-b")
	db, err := backend.Create(ctx, path)
	if err != nil {
		return nil, nil, err
	}
	s := publication.NewResource(db)
	defer s.Close()
	if err := s.CreateDocument(ctx, documentID); err != nil {
		return nil, nil, err
	}
	if _, err := s.Assign(ctx, documentID, 0, a.ID); err != nil {
		return nil, nil, fmt.Errorf("assign worker A: %w", err)
	}
	res, err := s.Publish(ctx, documentID, a, original)
	if err != nil {
		return nil, nil, fmt.Errorf("worker A publishes: %w", err)
	}
	firstOutcome = res.Raw
	if _, err := s.Assign(ctx, documentID, 1, b.ID); err != nil {
		return nil, nil, fmt.Errorf("transfer to worker B: %w", err)
	}
	// A rereads the newest version and generation, then writes again.
	doc, err := s.Get(ctx, documentID)
	if err != nil {
		return nil, nil, err
	}
	rewrite := stale
	rewrite.Generation, rewrite.ExpectedVersion = doc.Generation, doc.Version
	if _, err := s.Publish(ctx, documentID, a, rewrite); err != nil {
		return nil, nil, fmt.Errorf("worker A writes after the transfer: %w", err)
	}
	if _, err := s.Publish(ctx, documentID, b, correction); err != nil {
		return nil, nil, fmt.Errorf("worker B publishes: %w", err)
	}
	if res, err = s.Publish(ctx, documentID, a, original); err != nil {
		return nil, nil, fmt.Errorf("worker A replays its original operation: %w", err)
	}
	return firstOutcome, res.Raw, nil
}
