package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"

	"github.com/gowebpki/jcs"

	"github.com/fleet/fleet/internal/wire"
)

// checkDependents reads each job that waited for others: waited, each was
// claimed only after every job it waited for had finished (completed);
// computed, its input names each one's output as its document holds it,
// and its published body has a line for each (the deterministic worker's
// from; a model's answer is not checked for lines).
func (r *run) checkDependents(ctx context.Context, snap wire.Snapshot) (waited, computed bool, err error) {
	waited, computed = true, true
	details := map[string]wire.JobDetail{}
	detail := func(op string) (wire.JobDetail, error) {
		if d, ok := details[op]; ok {
			return d, nil
		}
		var d wire.JobDetail
		err := r.api.operator(ctx, "GET", "/admin/jobs/"+op, nil, &d)
		details[op] = d
		return d, err
	}
	for _, j := range snap.Jobs {
		d, err := detail(j.OperationID)
		if err != nil {
			return false, false, err
		}
		if len(d.Dependencies) == 0 || d.State != wire.Completed {
			continue
		}
		w, c, err := r.checkDependent(d, detail)
		if err != nil {
			return false, false, err
		}
		waited, computed = waited && w, computed && c
	}
	return waited, computed, nil
}

// checkDependent is checkDependents for one completed job that waited.
func (r *run) checkDependent(d wire.JobDetail, detail func(string) (wire.JobDetail, error)) (waited, computed bool, err error) {
	waited, computed = true, len(d.Input.After) == len(d.Dependencies)
	for _, out := range d.Input.After {
		dep, err := detail(out.OperationID)
		if err != nil {
			return false, false, err
		}
		waited = waited && dep.State == wire.Completed && dep.FinishedAtMS <= d.ClaimedAtMS
		computed = computed && outputDigest(dep.Document.Body) == out.OutputSHA256 && dep.Document.Version == out.Version
	}
	if r.in.Mode != "model" {
		var body struct {
			Result struct {
				From []json.RawMessage `json:"from"`
			} `json:"result"`
		}
		computed = computed && json.Unmarshal(d.Document.Body, &body) == nil && len(body.Result.From) == len(d.Input.After)
	}
	return waited, computed, nil
}

// outputDigest is the SHA-256 of a body as the host stores it (canonical
// JSON; an answer's encoder may escape what canonical JSON does not).
func outputDigest(body json.RawMessage) string {
	canon, err := jcs.Transform(body)
	if err != nil {
		return ""
	}
	sum := sha256.Sum256(canon)
	return hex.EncodeToString(sum[:])
}
