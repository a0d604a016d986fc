package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/fleet/fleet/internal/statedir"
	"github.com/fleet/fleet/internal/wire"
)

// export writes events.ndjson, reports/<operation_id>.json for each
// published section and report.md (the sections in input order).
func (r *run) export(ctx context.Context, snap wire.Snapshot) error {
	var ndjson bytes.Buffer
	r.mu.Lock()
	for _, e := range r.events {
		line, _ := json.Marshal(e)
		ndjson.Write(append(line, '\n'))
	}
	r.mu.Unlock()
	if err := statedir.WriteFileAtomic(filepath.Join(r.dir, "events.ndjson"), ndjson.Bytes(), 0o600); err != nil {
		return err
	}
	reports := filepath.Join(r.dir, "reports")
	if err := os.MkdirAll(reports, 0o700); err != nil {
		return err
	}
	var md strings.Builder
	md.WriteString("# Fleet report\n\n")
	for _, j := range snap.Jobs {
		if j.State != wire.Completed {
			fmt.Fprintf(&md, "## %s\n\n_Not published: %s (%s)._\n\n", j.Section, j.State, j.Reason)
			continue
		}
		var d wire.JobDetail
		if err := r.api.operator(ctx, "GET", "/admin/jobs/"+j.OperationID, nil, &d); err != nil {
			return err
		}
		report := map[string]any{"operation_id": j.OperationID, "section": j.Section, "document_id": j.DocumentID,
			"version": d.Document.Version, "input_sha256": j.InputSHA256, "outcome": j.Outcome, "body": d.Document.Body}
		data, _ := json.MarshalIndent(report, "", "  ")
		if err := statedir.WriteFileAtomic(filepath.Join(reports, j.OperationID+".json"), append(data, '\n'), 0o600); err != nil {
			return err
		}
		md.WriteString(renderSection(j.Section, d.Document.Body))
	}
	return statedir.WriteFileAtomic(filepath.Join(r.dir, "report.md"), []byte(md.String()), 0o600)
}

// renderSection turns a published body into Markdown.
func renderSection(section string, body json.RawMessage) string {
	var doc struct {
		Mode   string `json:"mode"`
		Model  string `json:"model"`
		Answer string `json:"answer"`
		Usage  struct {
			PromptTokens     int64 `json:"prompt_tokens"`
			CompletionTokens int64 `json:"completion_tokens"`
		} `json:"usage"`
		Result struct {
			Paragraphs int      `json:"paragraphs"`
			Words      int      `json:"words"`
			FirstLines []string `json:"first_lines"`
			Terms      []struct {
				Word  string `json:"word"`
				Count int    `json:"count"`
			} `json:"terms"`
			Actions []string `json:"actions"`
			Links   []string `json:"links"`
		} `json:"result"`
	}
	var b strings.Builder
	fmt.Fprintf(&b, "## %s\n\n", section)
	if err := json.Unmarshal(body, &doc); err != nil {
		fmt.Fprintf(&b, "```json\n%s\n```\n\n", body)
		return b.String()
	}
	if doc.Mode == "model" {
		fmt.Fprintf(&b, "%s\n\n*Written by %s: %d prompt and %d completion tokens.*\n\n",
			strings.TrimSpace(doc.Answer), doc.Model, doc.Usage.PromptTokens, doc.Usage.CompletionTokens)
		return b.String()
	}
	res := doc.Result
	switch section {
	case "summary":
		fmt.Fprintf(&b, "%d paragraphs, %d words.\n\n", res.Paragraphs, res.Words)
		for _, l := range res.FirstLines {
			fmt.Fprintf(&b, "> %s\n", l)
		}
	case "terms":
		b.WriteString("| term | count |\n| --- | --- |\n")
		for _, t := range res.Terms {
			fmt.Fprintf(&b, "| %s | %d |\n", t.Word, t.Count)
		}
	case "actions":
		for _, a := range res.Actions {
			fmt.Fprintf(&b, "- %s\n", strings.TrimPrefix(strings.TrimPrefix(a, "- [ ] "), "- "))
		}
	case "links":
		for _, l := range res.Links {
			fmt.Fprintf(&b, "- <%s>\n", l)
		}
	}
	b.WriteString("\n")
	return b.String()
}
