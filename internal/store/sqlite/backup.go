package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
)

// Backup writes a consistent copy of the database at path to the new file
// to while hosts serve it: SQLite's VACUUM INTO, which reads the database
// in one transaction (never a copy of a live WAL database's files). The
// copy is made mode 0600, for it holds the kernel key's seed; a file
// already at to is never overwritten. It answers the copy's size.
func Backup(ctx context.Context, path, to string) (int64, error) {
	if _, err := os.Stat(path); errors.Is(err, fs.ErrNotExist) {
		return 0, fmt.Errorf("backup: there is no SQLite database at %s (a PostgreSQL state's database is PostgreSQL's to back up, with pg_dump)", path)
	}
	if err := checkHeader(path); err != nil {
		return 0, err
	}
	f, err := os.OpenFile(to, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if errors.Is(err, fs.ErrExist) {
		return 0, fmt.Errorf("backup: %s exists; a backup never overwrites a file", to)
	}
	if err != nil {
		return 0, fmt.Errorf("backup: %w", err)
	}
	f.Close()
	// Not query_only: SQLite counts VACUUM INTO as a write (of the copy);
	// it only reads the database.
	db, err := sql.Open("sqlite", dsn(path, false, "FULL"))
	if err != nil {
		os.Remove(to)
		return 0, fmt.Errorf("backup: %w", err)
	}
	defer db.Close()
	if _, err := db.ExecContext(ctx, "VACUUM INTO ?", to); err != nil {
		os.Remove(to)
		var coded interface{ Code() int }
		if errors.As(err, &coded) && coded.Code()&0xff == sqliteFull {
			return 0, fmt.Errorf("backup %s to %s: no space left for the copy in %s; nothing was kept (%w)", path, to, filepath.Dir(to), err)
		}
		return 0, fmt.Errorf("backup %s to %s: %w", path, to, err)
	}
	st, err := os.Stat(to)
	if err != nil {
		return 0, fmt.Errorf("backup: %w", err)
	}
	return st.Size(), nil
}

// CheckCopy refuses a file that is not a whole Fleet database this build
// can serve: not SQLite, another application's, a newer schema, or one
// whose pages do not check (a truncated copy).
func CheckCopy(ctx context.Context, path string) error {
	if err := checkHeader(path); err != nil {
		return err
	}
	db, err := sql.Open("sqlite", dsn(path, true, ""))
	if err != nil {
		return err
	}
	defer db.Close()
	var appID, version int
	if err := db.QueryRowContext(ctx, "PRAGMA application_id").Scan(&appID); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	if appID != ApplicationID {
		return fmt.Errorf("%s is not a Fleet database (application_id %#x)", path, appID)
	}
	if err := db.QueryRowContext(ctx, "PRAGMA user_version").Scan(&version); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	if version < 1 || version > len(Migrations()) {
		return fmt.Errorf("%s has schema %d; this build serves 1 to %d", path, version, len(Migrations()))
	}
	var check string
	if err := db.QueryRowContext(ctx, "PRAGMA quick_check").Scan(&check); err != nil {
		return fmt.Errorf("%s does not check as a whole database: %w", path, err)
	}
	if check != "ok" {
		return fmt.Errorf("%s does not check as a whole database: %s", path, check)
	}
	return nil
}
