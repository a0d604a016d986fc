package store

import (
	"fmt"
	"io/fs"
	"sort"
	"strconv"
	"strings"
)

// Migration is one numbered schema change of a backend.
type Migration struct {
	Version int
	Name    string
	SQL     string
}

// Migrations reads a backend's embedded migrations (files named
// NNNN_name.sql in dir), numbered 1..n in order. A misnumbered file is a
// build mistake, so it panics.
func Migrations(fsys fs.FS, dir string) []Migration {
	entries, err := fs.ReadDir(fsys, dir)
	if err != nil {
		panic(err)
	}
	var out []Migration
	for _, e := range entries {
		prefix, _, ok := strings.Cut(e.Name(), "_")
		n, err := strconv.Atoi(prefix)
		if !ok || err != nil {
			panic("migration without a numeric prefix: " + e.Name())
		}
		text, err := fs.ReadFile(fsys, dir+"/"+e.Name())
		if err != nil {
			panic(err)
		}
		out = append(out, Migration{Version: n, Name: e.Name(), SQL: string(text)})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Version < out[j].Version })
	for i, m := range out {
		if m.Version != i+1 {
			panic(fmt.Sprintf("migrations are not numbered 1..n: %s", m.Name))
		}
	}
	return out
}

// CheckVersion decides what opening a database at schema version found
// means for a build whose newest schema is latest: migrate is true when an
// older schema should be migrated forward; an error refuses a database
// without Fleet's schema, a newer one, and an older one opened read-only.
func CheckVersion(found, latest int, readOnly bool) (migrate bool, err error) {
	switch {
	case found < 1:
		return false, fmt.Errorf("no Fleet schema here (version %d); run fleet-host init first", found)
	case found > latest:
		return false, fmt.Errorf("unknown schema version %d (this build knows 1 to %d)", found, latest)
	case found < latest && readOnly:
		return false, fmt.Errorf("schema version %d needs migrating to %d; open it read-write first", found, latest)
	}
	return found < latest, nil
}
