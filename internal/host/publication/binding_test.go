package publication_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/gowebpki/jcs"

	"github.com/fleet/fleet/internal/host/publication"
	"github.com/fleet/fleet/internal/jobs"
	"github.com/fleet/fleet/internal/sections"
	"github.com/fleet/fleet/internal/store"
)

// TestBind: a body binds to its job when it names the job's operation,
// input and section in the state's mode, and a deterministic body is
// exactly the section computed from the job's input (by the digest stored
// when the job was queued); each mismatch says what it is.
func TestBind(t *testing.T) {
	const op, section, input, document = "op-1", "summary", "in-sha", "Fleet review. Workers renew their leases."
	expected, err := jobs.ExpectedDigest(op, section, input, document, nil)
	if err != nil {
		t.Fatal(err)
	}
	j := store.Job{OperationID: op, Section: section, InputSHA256: input, ExpectedSHA256: expected}
	right, err := sections.Body(op, section, input, document)
	if err != nil {
		t.Fatal(err)
	}
	canon, err := jcs.Transform(right)
	if err != nil {
		t.Fatal(err)
	}
	with := func(edit func(m map[string]any)) json.RawMessage {
		var m map[string]any
		json.Unmarshal(canon, &m)
		edit(m)
		out, _ := json.Marshal(m)
		c, _ := jcs.Transform(out)
		return c
	}
	deterministic := publication.New(nil, nil, nil, publication.Config{Mode: publication.ModeDeterministic})
	for _, c := range []struct {
		name, reason string
		body         json.RawMessage
	}{
		{"the section computed", "", canon},
		{"another operation", "operation_id", with(func(m map[string]any) { m["operation_id"] = "op-2" })},
		{"another input", "input_sha256", with(func(m map[string]any) { m["input_sha256"] = "x" })},
		{"another section", "section", with(func(m map[string]any) { m["section"] = "terms" })},
		{"another mode", "mode", with(func(m map[string]any) { m["mode"] = publication.ModeModel })},
		{"another result", "not the summary section computed", with(func(m map[string]any) { m["result"] = "made up" })},
	} {
		b, err := deterministic.Bind(context.Background(), nil, j, c.body)
		if err != nil || b.Matches != (c.reason == "") || !strings.Contains(b.Reason, c.reason) {
			t.Errorf("%s: %+v (%v), want a reason naming %q", c.name, b, err, c.reason)
		}
	}
}
