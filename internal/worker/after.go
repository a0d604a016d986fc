package worker

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"

	"github.com/gowebpki/jcs"

	"github.com/fleet/fleet/internal/sections"
	"github.com/fleet/fleet/internal/wire"
)

// ReadOutputs reads the published outputs of the sections a job waited
// for (its input's after) through c, each checked against the version and
// digest the input names: what the job computes from is exactly what its
// input digest covers. fleet-worker and fleet-mcp both read them so.
func ReadOutputs(ctx context.Context, c *Client, after []wire.DependencyOutput) ([]sections.Output, error) {
	out := make([]sections.Output, 0, len(after))
	for _, dep := range after {
		resp, err := c.Do(ctx, http.MethodGet, "/v1/documents/"+dep.DocumentID, nil)
		if err != nil {
			return nil, fmt.Errorf("read the %s section it waits for: %w", dep.Section, err)
		}
		var doc wire.Document
		if err := json.Unmarshal(resp.Body, &doc); err != nil {
			return nil, fmt.Errorf("read the %s section it waits for: %w", dep.Section, err)
		}
		canon, err := jcs.Transform(doc.Body)
		if err != nil {
			return nil, fmt.Errorf("the %s section it waits for: %w", dep.Section, err)
		}
		sum := sha256.Sum256(canon)
		if doc.Version != dep.Version || hex.EncodeToString(sum[:]) != dep.OutputSHA256 {
			return nil, fmt.Errorf("the %s section it waits for is version %d with digest %x, not the version %d and digest %s its input names",
				dep.Section, doc.Version, sum, dep.Version, dep.OutputSHA256)
		}
		out = append(out, sections.Output{Section: dep.Section, Body: canon})
	}
	return out, nil
}

// withOutputs is the text a model writes a section from: the document,
// then each section it waits for as published.
func withOutputs(document string, outputs []sections.Output) string {
	if len(outputs) == 0 {
		return document
	}
	var b strings.Builder
	b.WriteString(document)
	b.WriteString("\n\nThe sections this one follows, as they were published:\n")
	for _, o := range outputs {
		fmt.Fprintf(&b, "\n## %s\n%s\n", o.Section, o.Body)
	}
	return b.String()
}
