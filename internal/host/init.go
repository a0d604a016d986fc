package host

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"

	"github.com/fleet/fleet/internal/budget"
	"github.com/fleet/fleet/internal/events"
	"github.com/fleet/fleet/internal/fleet"
	"github.com/fleet/fleet/internal/input"
	"github.com/fleet/fleet/internal/jobs"
	"github.com/fleet/fleet/internal/receipts"
	"github.com/fleet/fleet/internal/store"
)

// InitBatchKey is the batch the input's sections are enqueued under.
const InitBatchKey = "init"

// Init creates a state directory from an input: the database (exclusive
// creation), the kernel key, one credential per worker plus the operator's,
// and one queued job per section. It refuses a directory that exists and is
// not empty.
func Init(ctx context.Context, stateDir, database string, in input.Input) (err error) {
	if database != "" && !store.IsURL(database) {
		return fmt.Errorf("init: --database must be a postgres:// URL, got %q", database)
	}
	ours, existed := false, false // ours: it did not exist, or was empty
	defer func() {
		// A failed init (a full disk, say) leaves no partial state behind.
		if err != nil && ours {
			entries, _ := os.ReadDir(stateDir)
			for _, e := range entries {
				os.RemoveAll(filepath.Join(stateDir, e.Name()))
			}
			if !existed {
				os.Remove(stateDir)
			}
		}
	}()
	if err := os.Mkdir(stateDir, 0o700); err == nil {
		ours = true
	} else {
		if !errors.Is(err, fs.ErrExist) {
			return fmt.Errorf("init %s: %w", stateDir, err)
		}
		entries, err := os.ReadDir(stateDir)
		if err != nil {
			return fmt.Errorf("init %s: %w", stateDir, err)
		}
		if len(entries) > 0 {
			return fmt.Errorf("init %s: refusing a directory that is not empty", stateDir)
		}
		ours, existed = true, true
	}
	kernel, err := receipts.NewKernel()
	if err != nil {
		return err
	}
	db, err := store.Create(ctx, Location(stateDir, database))
	if err != nil {
		return err
	}
	defer db.Close()
	trusted, _ := json.MarshalIndent(kernel.Trusted(), "", "  ")
	if err := WriteFileAtomic(filepath.Join(stateDir, TrustedKernelFile), append(trusted, '\n'), 0o644); err != nil {
		return fmt.Errorf("init %s: %w", stateDir, err)
	}
	return db.WithTx(ctx, func(tx *store.Tx) error {
		if err := kernel.Save(ctx, tx); err != nil {
			return err
		}
		if err := budget.Init(ctx, tx, in.Allowance, in.CostPerReport); err != nil {
			return err
		}
		if err := putSetting(ctx, tx, settingLeaseMS, strconv.FormatInt(DefaultLease.Milliseconds(), 10)); err != nil {
			return err
		}
		if in.ModelPrices != nil {
			prices, _ := json.Marshal(in.ModelPrices)
			if err := putSetting(ctx, tx, settingModelPrices, string(prices)); err != nil {
				return err
			}
		}
		if in.LoseAckIndex != nil {
			if err := putSetting(ctx, tx, settingLoseAckIndex, strconv.FormatInt(*in.LoseAckIndex, 10)); err != nil {
				return err
			}
		}
		if err := addCredential(ctx, tx, stateDir, OperatorName, RoleOperator); err != nil {
			return err
		}
		for i := 1; i <= in.Concurrency; i++ {
			if err := addCredential(ctx, tx, stateDir, fmt.Sprintf("worker-%d", i), RoleWorker); err != nil {
				return err
			}
		}
		batch, err := batchDigest(in.Document, in.Sections)
		if err != nil {
			return err
		}
		queued, err := jobs.Enqueue(ctx, tx, InitBatchKey, batch, in.Document, in.Sections)
		if err != nil {
			return err
		}
		acct, err := budget.Get(ctx, tx)
		if err != nil {
			return err
		}
		_, err = events.Append(ctx, tx, events.Started, OperatorName,
			fmt.Sprintf("Fleet initialized: %d jobs, %d workers, allowance %d %s at %d a report",
				len(queued), in.Concurrency, acct.Allowance, acct.Unit, acct.CostPerReport),
			map[string]any{"jobs": len(queued), "workers": in.Concurrency, "accounting": acct, "kernel_key": kernel.PublicKey})
		return err
	})
}

// batchDigest identifies a batch request for idempotent resubmission.
func batchDigest(document string, sections []string) (string, error) {
	data, err := json.Marshal(map[string]any{"document": document, "sections": sections})
	if err != nil {
		return "", err
	}
	return fleet.DigestHex(data), nil
}
