package jobs

import (
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/fleet/fleet/internal/fleet"
	"github.com/fleet/fleet/internal/store"
	"github.com/fleet/fleet/internal/wire"
)

// ValidateAfter checks a report's dependencies (after: a section's name to
// the sections it waits for): a report with any names each of its
// sections once and has two or more; every name after holds is one of
// them; no section waits for itself, names one twice, or waits for none;
// and no sections wait for each other in a ring. The message names what
// is wrong.
func ValidateAfter(sections []string, after map[string][]string) error {
	if len(after) == 0 {
		return nil
	}
	if len(sections) < 2 {
		return fleet.Errorf(wire.CodeInvalid, "after needs a report of two sections or more; this one has %d", len(sections))
	}
	for i, s := range sections {
		if j := slices.Index(sections, s); j < i {
			return fleet.Errorf(wire.CodeInvalid, "sections[%d] and sections[%d] are both %q; a report with after names each section once", j, i, s)
		}
	}
	for _, s := range slices.Sorted(maps.Keys(after)) {
		deps := after[s]
		switch {
		case !slices.Contains(sections, s):
			return fleet.Errorf(wire.CodeInvalid, "after names section %.40q, which the report does not have", s)
		case len(deps) == 0:
			return fleet.Errorf(wire.CodeInvalid, "after.%s is empty; name the sections it waits for, or leave it out", s)
		}
		for i, d := range deps {
			switch {
			case d == s:
				return fleet.Errorf(wire.CodeInvalid, "after.%s names %s itself", s, s)
			case !slices.Contains(sections, d):
				return fleet.Errorf(wire.CodeInvalid, "after.%s names section %.40q, which the report does not have", s, d)
			case slices.Index(deps, d) < i:
				return fleet.Errorf(wire.CodeInvalid, "after.%s names %s twice", s, d)
			}
		}
	}
	if ring := findRing(after); ring != nil {
		return fleet.Errorf(wire.CodeInvalid, "after makes a ring: %s", strings.Join(ring, " waits for "))
	}
	return nil
}

// findRing is a ring of sections waiting for each other (its first
// section again at its end), or nil: a depth-first walk from each section
// in name order, so the ring named is always the same one.
func findRing(after map[string][]string) []string {
	const (
		unseen = iota
		onPath
		done
	)
	mark := map[string]int{}
	var path []string
	var walk func(s string) []string
	walk = func(s string) []string {
		mark[s] = onPath
		path = append(path, s)
		for _, d := range slices.Sorted(slices.Values(after[s])) {
			switch mark[d] {
			case onPath:
				start := slices.Index(path, d)
				return append(slices.Clone(path[start:]), d)
			case unseen:
				if ring := walk(d); ring != nil {
					return ring
				}
			}
		}
		path = path[:len(path)-1]
		mark[s] = done
		return nil
	}
	for _, s := range slices.Sorted(maps.Keys(after)) {
		if mark[s] == unseen {
			if ring := walk(s); ring != nil {
				return ring
			}
		}
	}
	return nil
}

// InputOf is a job's input: its batch's document, its section and, once it
// is queued, the outputs of the jobs it waited for (a job stores them
// as JSON it wrote itself).
func InputOf(j store.Job, document string) wire.Input {
	in := wire.Input{Document: document, Section: j.Section}
	if j.AfterJSON != "" {
		if err := json.Unmarshal([]byte(j.AfterJSON), &in.After); err != nil {
			panic(fmt.Sprintf("job %s: stored outputs it waited for are not JSON: %v", j.OperationID, err))
		}
	}
	return in
}
