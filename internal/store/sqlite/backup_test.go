package sqlite

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/fleet/fleet/internal/store"
)

// TestBackup: a copy taken while the database is open holds what was
// committed before it, checks whole, and is mode 0600; a copy never
// overwrites a file; a truncated copy or another file does not check.
func TestBackup(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	path := filepath.Join(dir, "fleet.sqlite3")
	db, err := Create(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if err := db.WithTx(ctx, func(tx *store.Tx) error { return tx.SettingPut(ctx, "before", "the backup") }); err != nil {
		t.Fatal(err)
	}
	to := filepath.Join(dir, "copy")
	if _, err := Backup(ctx, path, to); err != nil {
		t.Fatal(err)
	}
	if info, err := os.Stat(to); err != nil || info.Mode().Perm() != 0o600 {
		t.Fatalf("the copy: %v, %v", info, err)
	}
	if err := CheckCopy(ctx, to); err != nil {
		t.Fatalf("the copy does not check: %v", err)
	}
	copied, err := Open(ctx, to, true, Options{})
	if err != nil {
		t.Fatal(err)
	}
	var got string
	err = copied.Read(ctx, func(tx *store.Tx) (err error) { got, err = tx.SettingGet(ctx, "before"); return err })
	copied.Close()
	if err != nil || got != "the backup" {
		t.Fatalf("the copy's setting: %q, %v", got, err)
	}
	if _, err := Backup(ctx, path, to); err == nil || !strings.Contains(err.Error(), "exists") {
		t.Fatalf("a copy over a file: %v", err)
	}
	data, _ := os.ReadFile(to)
	for name, content := range map[string][]byte{"truncated": data[:len(data)/2], "text": []byte("hello\n")} {
		bad := filepath.Join(dir, name)
		os.WriteFile(bad, content, 0o600)
		if err := CheckCopy(ctx, bad); err == nil {
			t.Errorf("a %s file checks as a copy", name)
		}
	}
}
