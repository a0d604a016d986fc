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
	"github.com/fleet/fleet/internal/host/access"
	"github.com/fleet/fleet/internal/host/ledger"
	"github.com/fleet/fleet/internal/host/operator"
	"github.com/fleet/fleet/internal/input"
	"github.com/fleet/fleet/internal/jobs"
	"github.com/fleet/fleet/internal/receipts"
	"github.com/fleet/fleet/internal/statedir"
	"github.com/fleet/fleet/internal/store"
	"github.com/fleet/fleet/internal/wire"
)

// Init creates a state directory from an input: the database (by create,
// once the directory exists: the command chooses the backend, creating by
// exclusive creation), the kernel key, one credential per worker plus the
// operator's, and one queued job per section. It refuses a directory that
// exists and is not empty.
func Init(ctx context.Context, stateDir string, create func(context.Context) (*store.DB, error), in input.Input) (err error) {
	existed, err := makeEmptyDir(stateDir)
	if err != nil {
		return err
	}
	defer func() {
		// A failed init (a full disk, say) leaves no partial state behind.
		if err != nil {
			entries, _ := os.ReadDir(stateDir)
			for _, e := range entries {
				os.RemoveAll(filepath.Join(stateDir, e.Name()))
			}
			if !existed {
				os.Remove(stateDir)
			}
		}
	}()
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
	db, err := create(ctx)
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
	first, err := planState(in)
	if err != nil {
		return err
	}
	return db.WithTx(ctx, func(tx *store.Tx) error {
		return seed(ctx, tx, stateDir, in, kernel, first)
	})
}

// makeEmptyDir creates the state directory, or takes one that exists and
// is empty (existed says which); it refuses one that is not empty.
func makeEmptyDir(stateDir string) (existed bool, err error) {
	err = os.Mkdir(stateDir, 0o700)
	if err == nil {
		return false, nil
	}
	if !errors.Is(err, fs.ErrExist) {
		return false, fmt.Errorf("init %s: %w", stateDir, err)
	}
	entries, err := os.ReadDir(stateDir)
	if err != nil {
		return false, fmt.Errorf("init %s: %w", stateDir, err)
	}
	if len(entries) > 0 {
		return false, fmt.Errorf("init %s: refusing a directory that is not empty", stateDir)
	}
	return true, nil
}

// firstRecords is what a new state's first transaction writes that can
// be worked out before it: the settings, the batch's digest and its jobs.
type firstRecords struct {
	settings map[string]string
	digest   string
	planned  []operator.NewJob
}

// planState works out a new state's first records from its input.
func planState(in input.Input) (firstRecords, error) {
	var f firstRecords
	var err error
	if f.settings, err = initialSettings(in); err != nil {
		return f, err
	}
	if f.digest, err = jobs.BatchDigest(in.Document, in.Sections, wire.RetryPolicy{}, nil, nil, in.After); err != nil {
		return f, err
	}
	f.planned, err = operator.PlanJobs(in.Document, in.Sections, in.After)
	return f, err
}

// initialSettings are the settings an input gives a new state.
func initialSettings(in input.Input) (map[string]string, error) {
	retry, err := json.Marshal(in.Retry)
	if err != nil {
		return nil, err
	}
	settings := map[string]string{settingLeaseMS: strconv.FormatInt(DefaultLease.Milliseconds(), 10), settingMode: in.Mode,
		settingRetryPolicy: string(retry)}
	if in.ModelPrices != nil {
		prices, err := json.Marshal(in.ModelPrices)
		if err != nil {
			return nil, err
		}
		settings[settingModelPrices] = string(prices)
	}
	if in.LoseAckIndex != nil {
		settings[settingLoseAckIndex] = strconv.FormatInt(*in.LoseAckIndex, 10)
	}
	return settings, nil
}

// seed writes a new state's first records: the kernel, the accounting,
// the settings, the credentials and the input's jobs, with the event that
// says so.
func seed(ctx context.Context, tx *store.Tx, stateDir string, in input.Input, kernel *receipts.Kernel,
	first firstRecords) error {
	if err := tx.KernelInsert(ctx, store.Kernel{PublicKey: kernel.PublicKey, Seed: kernel.Seed(), CreatedAtMS: tx.NowMS()}); err != nil {
		return err
	}
	if err := tx.AccountingInsert(ctx, &store.AccountingInsertParams{Allowance: in.Allowance, CostPerReport: in.CostPerReport}); err != nil {
		return err
	}
	// The tenant every report that names none is in, with no cap of its
	// own: a one-team fleet admits what its allowance covers.
	if err := tx.TenantInsert(ctx, store.Tenant{Name: wire.DefaultTenant, Weight: 1, CreatedAtMS: tx.NowMS()}); err != nil {
		return err
	}
	for name, value := range first.settings {
		if err := tx.SettingPut(ctx, name, value); err != nil {
			return err
		}
	}
	if err := access.Insert(ctx, tx, stateDir, OperatorName, access.RoleOperator); err != nil {
		return err
	}
	for i := 1; i <= in.Concurrency; i++ {
		if err := access.Insert(ctx, tx, stateDir, fmt.Sprintf("worker-%d", i), access.RoleWorker); err != nil {
			return err
		}
	}
	ops, err := operator.Enqueue(ctx, tx, store.Batch{Key: operator.InitBatchKey, RequestSHA256: first.digest, Document: in.Document}, first.planned,
		operator.Queue{Policy: in.Retry, Priority: wire.DefaultPriority, Tenant: wire.DefaultTenant})
	if err != nil {
		return err
	}
	acct, err := tx.AccountingGet(ctx, store.NoLock)
	if err != nil {
		return err
	}
	return ledger.AppendEvent(ctx, tx, wire.EventStarted, OperatorName,
		fmt.Sprintf("Fleet initialized: %d jobs, %d workers, allowance %d %s at %d a report",
			len(ops), in.Concurrency, acct.Allowance, acct.Unit, acct.CostPerReport),
		map[string]any{"jobs": len(ops), "workers": in.Concurrency, "accounting": acct, "kernel_key": kernel.PublicKey})
}
