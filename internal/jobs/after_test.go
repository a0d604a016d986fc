package jobs_test

import (
	"strings"
	"testing"

	"github.com/fleet/fleet/internal/fleet"
	"github.com/fleet/fleet/internal/jobs"
	"github.com/fleet/fleet/internal/wire"
)

// TestValidateAfter: dependencies within a report are accepted when they
// name the report's sections, once each, without a ring; each mistake is
// invalid_request naming it.
func TestValidateAfter(t *testing.T) {
	four := []string{"summary", "terms", "actions", "links"}
	ok := map[string][]string{"summary": {"terms", "actions", "links"}, "actions": {"terms"}}
	if err := jobs.ValidateAfter(four, ok); err != nil {
		t.Fatalf("a summary after the rest: %v", err)
	}
	if err := jobs.ValidateAfter([]string{"summary", "summary"}, nil); err != nil {
		t.Fatalf("no dependencies: %v", err)
	}
	for name, c := range map[string]struct {
		sections []string
		after    map[string][]string
		says     string
	}{
		"two in a ring":         {four, map[string][]string{"summary": {"terms"}, "terms": {"summary"}}, "ring: summary waits for terms waits for summary"},
		"a longer ring":         {four, map[string][]string{"summary": {"terms"}, "terms": {"links"}, "links": {"summary"}, "actions": {"links"}}, "ring: links waits for summary waits for terms waits for links"},
		"itself":                {four, map[string][]string{"summary": {"summary"}}, "names summary itself"},
		"an unknown key":        {four, map[string][]string{"risks": {"terms"}}, `section "risks"`},
		"an unknown dependency": {four, map[string][]string{"summary": {"risks"}}, `section "risks"`},
		"a dependency twice":    {four, map[string][]string{"summary": {"terms", "terms"}}, "names terms twice"},
		"none":                  {four, map[string][]string{"summary": {}}, "after.summary is empty"},
		"one section":           {[]string{"summary"}, map[string][]string{"summary": {"terms"}}, "two sections or more"},
		"a section twice":       {[]string{"summary", "terms", "terms"}, map[string][]string{"summary": {"terms"}}, `sections[1] and sections[2] are both "terms"`},
	} {
		err := jobs.ValidateAfter(c.sections, c.after)
		if fleet.ErrorCode(err) != wire.CodeInvalid || !strings.Contains(fleet.ErrorMessage(err), c.says) {
			t.Errorf("%s: %v; want invalid_request saying %q", name, err, c.says)
		}
	}
}
