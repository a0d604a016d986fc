package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/spf13/cobra"

	"github.com/fleet/fleet/internal/cli"
	"github.com/fleet/fleet/internal/receipts"
	"github.com/fleet/fleet/internal/statedir"
	"github.com/fleet/fleet/internal/store"
	"github.com/fleet/fleet/internal/store/backend"
	"github.com/fleet/fleet/internal/store/sqlite"
)

// backupCommand copies a SQLite state's database while hosts serve it.
func backupCommand(out io.Writer) *cobra.Command {
	var state, to string
	cmd := &cobra.Command{
		Use:   "backup --state DIR --to FILE",
		Short: "Copy a state's database, consistent, while hosts serve it (SQLite; PostgreSQL's is pg_dump's)",
		Long: `backup writes one file: the state's whole database as of one moment (SQLite's VACUUM INTO, read in one
transaction while hosts go on serving), mode 0600. It holds every figure, job, receipt, event and published section,
the kernel key's seed (a secret: whoever holds it can sign receipts) and the credentials' SHA-256 digests, not their
tokens. restore makes a state of it.`,
		Example: `  fleet-host backup --state /var/lib/fleet --to /backups/fleet-$(date +%F).sqlite3`,
		Args:    cli.Args(0, "no arguments"),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := cli.Require(cmd, "state", "to"); err != nil {
				return err
			}
			size, err := sqlite.Backup(cmd.Context(), filepath.Join(state, statedir.DatabaseFile), to)
			if err != nil {
				return err
			}
			line, _ := json.Marshal(map[string]any{"backup": to, "bytes": size, "contains": "the database: figures, jobs, receipts, events, " +
				"published sections, the kernel key's seed and the credentials' digests (not their tokens)"})
			_, err = fmt.Fprintln(out, string(line))
			return err
		},
	}
	cmd.Flags().StringVar(&state, "state", "", "the state directory (its SQLite database)")
	cmd.Flags().StringVar(&to, "to", "", "the backup file to write; it must not exist")
	return cmd
}

// restoreCommand makes a new state of a backup.
func restoreCommand(out io.Writer) *cobra.Command {
	var from, state string
	cmd := &cobra.Command{
		Use:   "restore --from FILE --state NEWDIR",
		Short: "Make a new state of a backup: its database, its trusted-kernel.json, an empty credentials directory",
		Long: `restore checks the backup whole (a Fleet database of a schema this build serves, every page sound), then
makes NEWDIR (which must not exist, or be empty) of it. serve continues its receipt chain and event numbering. What
committed after the backup is not there. The credential files are not in a backup: each holder keeps its own token,
which still works (the database holds its digest); fleet-host credentials rotate gives a new one.`,
		Example: `  fleet-host restore --from /backups/fleet-2026-12-05.sqlite3 --state /var/lib/fleet-restored`,
		Args:    cli.Args(0, "no arguments"),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := cli.Require(cmd, "from", "state"); err != nil {
				return err
			}
			if err := restore(cmd.Context(), from, state); err != nil {
				return err
			}
			line, _ := json.Marshal(map[string]any{"restored": state, "from": from})
			_, err := fmt.Fprintln(out, string(line))
			return err
		},
	}
	cmd.Flags().StringVar(&from, "from", "", "the backup file")
	cmd.Flags().StringVar(&state, "state", "", "the new state directory; it must not exist, or be empty")
	return cmd
}

// restore makes state of the backup from; on any failure it leaves state
// as it found it (absent, or empty).
func restore(ctx context.Context, from, state string) (err error) {
	if err := sqlite.CheckCopy(ctx, from); err != nil {
		return fmt.Errorf("restore: %w", err)
	}
	entries, err := os.ReadDir(state)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		if err := os.MkdirAll(state, 0o700); err != nil {
			return fmt.Errorf("restore: %w", err)
		}
		defer func() {
			if err != nil {
				os.RemoveAll(state)
			}
		}()
	case err != nil:
		return fmt.Errorf("restore: %w", err)
	case len(entries) > 0:
		return fmt.Errorf("restore: %s is not empty; restore makes a new state", state)
	default:
		defer func() {
			if err != nil {
				emptyDir(state)
			}
		}()
	}
	if err := copyFile(from, filepath.Join(state, statedir.DatabaseFile)); err != nil {
		return fmt.Errorf("restore: %w", err)
	}
	if err := writeTrusted(ctx, state); err != nil {
		return fmt.Errorf("restore: %w", err)
	}
	return os.Mkdir(filepath.Join(state, "credentials"), 0o700)
}

// emptyDir empties dir again after a failed restore into it.
func emptyDir(dir string) {
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		os.RemoveAll(filepath.Join(dir, e.Name()))
	}
}

// copyFile copies from to the new file to, mode 0600, synced.
func copyFile(from, to string) error {
	src, err := os.Open(from)
	if err != nil {
		return err
	}
	defer src.Close()
	dst, err := os.OpenFile(to, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	if _, err := io.Copy(dst, src); err != nil {
		dst.Close()
		return err
	}
	if err := dst.Sync(); err != nil {
		dst.Close()
		return err
	}
	return dst.Close()
}

// writeTrusted opens the restored database (bringing an older schema up
// to date) and writes its kernel's public key to trusted-kernel.json.
func writeTrusted(ctx context.Context, state string) error {
	db, err := backend.Open(ctx, filepath.Join(state, statedir.DatabaseFile), backend.Options{})
	if err != nil {
		return err
	}
	defer db.Close()
	var k store.Kernel
	if err := db.Read(ctx, func(tx *store.Tx) (err error) {
		k, err = tx.KernelGet(ctx)
		return err
	}); err != nil {
		return err
	}
	kernel, err := receipts.LoadKernel(k.PublicKey, k.Seed)
	if err != nil {
		return err
	}
	trusted, err := json.MarshalIndent(kernel.Trusted(), "", "  ")
	if err != nil {
		return err
	}
	return statedir.WriteFileAtomic(filepath.Join(state, statedir.TrustedKernelFile), append(trusted, '\n'), 0o644)
}
