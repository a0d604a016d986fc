package sections

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"unicode/utf8"
)

// Output is a section a job waits for, as it was published: its name and
// its body.
type Output struct {
	Section string
	Body    json.RawMessage
}

// BodyAfter is the publication a deterministic worker makes for a job
// that waits for others: Body's, whose result also holds "from", one line
// for each output, in the order given (the job's input orders them by
// section), saying what that section found.
func BodyAfter(operationID, section, inputSHA256, document string, after []Output) (json.RawMessage, error) {
	if len(after) == 0 {
		return Body(operationID, section, inputSHA256, document)
	}
	result, err := Compute(section, document)
	if err != nil {
		return nil, err
	}
	from := make([]map[string]string, len(after))
	for i, o := range after {
		from[i] = map[string]string{"section": o.Section, "line": Line(o.Body)}
	}
	result["from"] = from
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	err = enc.Encode(map[string]any{"operation_id": operationID, "section": section,
		"input_sha256": inputSHA256, "mode": "deterministic", "result": result})
	return bytes.TrimSuffix(b.Bytes(), []byte("\n")), err
}

// maxLine bounds a line Line makes, in characters.
const maxLine = 160

// Line says in one line what a published section found: a deterministic
// body's counts or first terms, or the first line of a model's answer.
func Line(body json.RawMessage) string {
	var pub struct {
		Answer string `json:"answer"`
		Result struct {
			Paragraphs *int   `json:"paragraphs"`
			Words      int    `json:"words"`
			Terms      []Term `json:"terms"`
			Actions    []any  `json:"actions"`
			Links      []any  `json:"links"`
		} `json:"result"`
	}
	if err := json.Unmarshal(body, &pub); err != nil {
		return "(not a JSON object)"
	}
	r := pub.Result
	switch {
	case r.Paragraphs != nil:
		return fmt.Sprintf("%d paragraphs, %d words", *r.Paragraphs, r.Words)
	case r.Terms != nil:
		words := make([]string, 0, 5)
		for _, t := range r.Terms[:min(5, len(r.Terms))] {
			words = append(words, t.Word)
		}
		return "terms: " + strings.Join(words, ", ")
	case r.Actions != nil:
		return fmt.Sprintf("%d actions", len(r.Actions))
	case r.Links != nil:
		return fmt.Sprintf("%d links", len(r.Links))
	case pub.Answer != "":
		first, _, _ := strings.Cut(strings.TrimSpace(pub.Answer), "\n")
		return clip(strings.TrimSpace(first))
	}
	return "(published)"
}

// clip cuts s to maxLine characters.
func clip(s string) string {
	if utf8.RuneCountInString(s) <= maxLine {
		return s
	}
	return string([]rune(s)[:maxLine-1]) + "…"
}
