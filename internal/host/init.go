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
	"github.com/fleet/fleet/internal/input"
	"github.com/fleet/fleet/internal/jobs"
	"github.com/fleet/fleet/internal/receipts"
	"github.com/fleet/fleet/internal/statedir"
	"github.com/fleet/fleet/internal/store"
	"github.com/fleet/fleet/internal/store/backend"
	"github.com/fleet/fleet/internal/wire"
)

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
	if err := budget.ValidateAllowance(in.Allowance); err != nil {
		return err
	}
	if err := budget.ValidateCost(in.CostPerReport); err != nil {
		return err
	}
	kernel, err := receipts.NewKernel()
	if err != nil {
		return err
	}
	db, err := backend.Create(ctx, statedir.Location(stateDir, database))
	if err != nil {
		return err
	}
	defer db.Close()
	trusted, err := json.MarshalIndent(kernel.Trusted(), "", "  ")
	if err != nil {
		return err
	}
	if err := statedir.WriteFileAtomic(filepath.Join(stateDir, statedir.TrustedKernelFile), append(trusted, '\n'), 0o644); err != nil {
		return fmt.Errorf("init %s: %w", stateDir, err)
	}
	retry, err := json.Marshal(in.Retry)
	if err != nil {
		return err
	}
	settings := map[string]string{settingLeaseMS: strconv.FormatInt(DefaultLease.Milliseconds(), 10), settingMode: in.Mode,
		settingRetryPolicy: string(retry)}
	if in.ModelPrices != nil {
		prices, err := json.Marshal(in.ModelPrices)
		if err != nil {
			return err
		}
		settings[settingModelPrices] = string(prices)
	}
	if in.LoseAckIndex != nil {
		settings[settingLoseAckIndex] = strconv.FormatInt(*in.LoseAckIndex, 10)
	}
	digest, err := jobs.BatchDigest(in.Document, in.Sections, wire.RetryPolicy{})
	if err != nil {
		return err
	}
	return db.WithTx(ctx, func(tx *store.Tx) error {
		if err := tx.KernelInsert(ctx, kernel.PublicKey, kernel.Seed(), tx.NowMS()); err != nil {
			return err
		}
		if err := tx.AccountingInsert(ctx, in.Allowance, in.CostPerReport); err != nil {
			return err
		}
		for name, value := range settings {
			if err := tx.SettingPut(ctx, name, value); err != nil {
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
		ops, err := enqueue(ctx, tx, store.Batch{Key: InitBatchKey, RequestSHA256: digest, Document: in.Document}, in.Sections, in.Retry)
		if err != nil {
			return err
		}
		acct, err := tx.AccountingGet(ctx, store.NoLock)
		if err != nil {
			return err
		}
		return appendEvent(ctx, tx, wire.EventStarted, OperatorName,
			fmt.Sprintf("Fleet initialized: %d jobs, %d workers, allowance %d %s at %d a report",
				len(ops), in.Concurrency, acct.Allowance, acct.Unit, acct.CostPerReport),
			map[string]any{"jobs": len(ops), "workers": in.Concurrency, "accounting": acct, "kernel_key": kernel.PublicKey})
	})
}
