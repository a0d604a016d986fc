// Package sections computes report sections from a document,
// deterministically.
package sections

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/url"
	"regexp"
	"sort"
	"strings"
	"unicode"
)

// Body is the publication a deterministic worker makes for a job: the
// section's result with what names the job (its operation id and the
// SHA-256 of its input). HTML characters are not escaped, so the body is
// no larger than its canonical form needs.
func Body(operationID, section, inputSHA256, document string) (json.RawMessage, error) {
	result, err := Compute(section, document)
	if err != nil {
		return nil, err
	}
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	err = enc.Encode(map[string]any{"operation_id": operationID, "section": section,
		"input_sha256": inputSHA256, "mode": "deterministic", "result": result})
	return bytes.TrimSuffix(b.Bytes(), []byte("\n")), err
}

// Compute returns the named section's result as a JSON-ready object.
func Compute(section, document string) (map[string]any, error) {
	switch section {
	case "summary":
		return Summary(document), nil
	case "terms":
		return map[string]any{"terms": Terms(document, 12)}, nil
	case "actions":
		return map[string]any{"actions": Actions(document)}, nil
	case "links":
		return map[string]any{"links": Links(document)}, nil
	case "overview":
		// What the sections it waits for found (BodyAfter's "from"); the
		// document's own words are the other sections' to count.
		return map[string]any{"from": []map[string]string{}}, nil
	}
	return nil, fmt.Errorf("unknown section %q", section)
}

func lines(document string) []string {
	return strings.Split(strings.ReplaceAll(document, "\r\n", "\n"), "\n")
}

// Summary counts paragraphs (runs of non-blank lines) and words, and keeps
// the first three non-empty lines.
func Summary(document string) map[string]any {
	paragraphs, inParagraph := 0, false
	first := []string{}
	for _, line := range lines(document) {
		trimmed := strings.TrimSpace(line)
		if trimmed == "" {
			inParagraph = false
			continue
		}
		if !inParagraph {
			paragraphs++
			inParagraph = true
		}
		if len(first) < 3 {
			first = append(first, trimmed)
		}
	}
	return map[string]any{"paragraphs": paragraphs, "words": len(strings.Fields(document)), "first_lines": first}
}

// Term is a word and how often it occurs.
type Term struct {
	Word  string `json:"word"`
	Count int    `json:"count"`
}

// Terms returns the n most frequent lower-cased words longer than three
// letters, by count descending then word ascending. A word is a run of
// letters.
func Terms(document string, n int) []Term {
	counts := map[string]int{}
	for _, w := range strings.FieldsFunc(strings.ToLower(document), func(r rune) bool { return !unicode.IsLetter(r) }) {
		if len([]rune(w)) > 3 {
			counts[w]++
		}
	}
	terms := make([]Term, 0, len(counts))
	for w, c := range counts {
		terms = append(terms, Term{Word: w, Count: c})
	}
	sort.Slice(terms, func(i, j int) bool {
		if terms[i].Count != terms[j].Count {
			return terms[i].Count > terms[j].Count
		}
		return terms[i].Word < terms[j].Word
	})
	if len(terms) > n {
		terms = terms[:n]
	}
	return terms
}

var mustWord = regexp.MustCompile(`(?i)\bmust\b`)

// Actions returns the lines that are unchecked task items or contain the
// word "must", trimmed.
func Actions(document string) []string {
	out := []string{}
	for _, line := range lines(document) {
		trimmed := strings.TrimSpace(line)
		if strings.HasPrefix(trimmed, "- [ ]") || mustWord.MatchString(trimmed) {
			out = append(out, trimmed)
		}
	}
	return out
}

// Links returns the whitespace-separated tokens that are http or https URLs
// with a host, in order.
func Links(document string) []string {
	out := []string{}
	for _, tok := range strings.Fields(document) {
		u, err := url.Parse(tok)
		if err == nil && (u.Scheme == "http" || u.Scheme == "https") && u.Host != "" {
			out = append(out, tok)
		}
	}
	return out
}
