package sections_test

import (
	"testing"

	"github.com/fleet/fleet/internal/sections"
	"github.com/fleet/fleet/internal/testkit"
)

const doc = `Quarterly review

The fleet must never spend past its budget. Workers claim sections.
Workers publish sections once.

- [ ] rotate the credentials
- [x] ship the verifier
See https://example.com/runbook and http://localhost:8080/x, not ftp://old or https:// alone.
`

func TestSummary(t *testing.T) {
	got := testkit.MustJSON(t, sections.Summary(doc))
	want := `{"first_lines":["Quarterly review","The fleet must never spend past its budget. Workers claim sections.","Workers publish sections once."],"paragraphs":3,"words":37}`
	if string(got) != want {
		t.Fatalf("got  %s\nwant %s", got, want)
	}
}

func TestTerms(t *testing.T) {
	got := sections.Terms(doc, 3)
	want := []sections.Term{{"https", 2}, {"sections", 2}, {"workers", 2}}
	if len(got) != 3 || got[0] != want[0] || got[1] != want[1] || got[2] != want[2] {
		t.Fatalf("got %v, want %v", got, want)
	}
	if len(sections.Terms(doc, 12)) != 12 {
		t.Fatal("terms are capped at n")
	}
}

func TestActions(t *testing.T) {
	got := sections.Actions(doc + "\nMustard is not a must-have? It is: MUST.\n")
	want := []string{
		"The fleet must never spend past its budget. Workers claim sections.",
		"- [ ] rotate the credentials",
		"Mustard is not a must-have? It is: MUST.",
	}
	if len(got) != len(want) {
		t.Fatalf("got %q", got)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("got %q, want %q", got, want)
		}
	}
}

func TestLinks(t *testing.T) {
	got := sections.Links(doc)
	if len(got) != 2 || got[0] != "https://example.com/runbook" || got[1] != "http://localhost:8080/x," {
		t.Fatalf("got %q", got)
	}
}

func TestComputeUnknown(t *testing.T) {
	if _, err := sections.Compute("poem", doc); err == nil {
		t.Fatal("unknown section accepted")
	}
}
