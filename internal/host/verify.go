package host

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"

	"github.com/fleet/fleet/internal/budget"
	"github.com/fleet/fleet/internal/jobs"
	"github.com/fleet/fleet/internal/receipts"
	"github.com/fleet/fleet/internal/store"
)

// VerifyReport is what `fleet-host verify` prints.
type VerifyReport struct {
	OK         bool              `json:"ok"`
	KernelKey  string            `json:"kernel_key"`
	Receipts   int               `json:"receipts"`
	Events     int64             `json:"events"`
	Jobs       int               `json:"jobs"`
	Completed  int               `json:"completed"`
	Mutations  int64             `json:"mutations"`
	Accounting budget.Accounting `json:"accounting"`
	Violations []string          `json:"violations"`
}

// Verify checks a state directory offline and read-only: every receipt's
// signature and the hash chain, event sequence contiguity, accounting
// (available = allowance - spent - reserved, never negative, and agreeing
// with the receipts and the jobs), and one mutation per published job.
func Verify(ctx context.Context, stateDir, database string) (VerifyReport, error) {
	rep := VerifyReport{Violations: []string{}}
	db, err := store.OpenReadOnly(ctx, Location(stateDir, database))
	if err != nil {
		return rep, err
	}
	defer db.Close()
	bad := func(format string, args ...any) {
		rep.Violations = append(rep.Violations, fmt.Sprintf(format, args...))
	}

	err = db.Read(ctx, func(tx *store.Tx) error {
		kernel, err := receipts.LoadKernel(ctx, tx)
		if err != nil {
			return err
		}
		rep.KernelKey = kernel.PublicKey
		if data, err := os.ReadFile(filepath.Join(stateDir, TrustedKernelFile)); err != nil {
			bad("%s: %v", TrustedKernelFile, err)
		} else {
			var trusted receipts.TrustedKernel
			if json.Unmarshal(data, &trusted) != nil || trusted.PublicKey != kernel.PublicKey {
				bad("%s does not name the kernel key in the database", TrustedKernelFile)
			}
		}

		chain, err := receipts.List(ctx, tx, "")
		if err != nil {
			return err
		}
		rep.Receipts = len(chain)
		rep.Violations = append(rep.Violations, receipts.VerifyChain(chain, kernel.PublicKey)...)

		var count, maxSeq int64
		if err := tx.QueryRowContext(ctx, `SELECT COUNT(*), COALESCE(MAX(sequence), 0) FROM events`).Scan(&count, &maxSeq); err != nil {
			return err
		}
		rep.Events = count
		if count != maxSeq {
			bad("events are not contiguous: %d events, highest sequence %d", count, maxSeq)
		}

		if rep.Accounting, err = budget.Get(ctx, tx); err != nil {
			return err
		}
		a := rep.Accounting
		if a.Available < 0 || a.Spent < 0 || a.Reserved < 0 {
			bad("accounting is negative: %+v", a)
		}
		var admitted, settled, released int64
		for _, r := range chain {
			switch {
			case r.Kind == receipts.KindAdmission && r.Decision == "allow":
				admitted += r.Cost
			case r.Kind == receipts.KindPublication, r.Kind == receipts.KindCancellation, r.Kind == receipts.KindRequeue:
				settled += r.Cost
				if r.Reserved != nil {
					if *r.Reserved < r.Cost {
						bad("receipt %s settles %d of a reservation of %d", r.ID, r.Cost, *r.Reserved)
					}
					released += *r.Reserved - r.Cost
				}
			}
		}
		if settled != a.Spent {
			bad("spent is %d but the receipts settle %d", a.Spent, settled)
		}
		if admitted-released != a.Spent+a.Reserved {
			bad("spent + reserved is %d but the receipts admit %d and release %d", a.Spent+a.Reserved, admitted, released)
		}

		all, err := jobs.List(ctx, tx)
		if err != nil {
			return err
		}
		rep.Jobs = len(all)
		var heldReserved int64
		perDoc := map[string]int64{}
		rows, err := tx.QueryContext(ctx, `SELECT document_id, COUNT(*) FROM mutations GROUP BY document_id`)
		if err != nil {
			return err
		}
		for rows.Next() {
			var doc string
			var n int64
			if err := rows.Scan(&doc, &n); err != nil {
				rows.Close()
				return err
			}
			perDoc[doc] = n
			rep.Mutations += n
		}
		rows.Close()
		for _, j := range all {
			heldReserved += j.Reserved
			n := perDoc[j.DocumentID]
			if j.State == jobs.Completed {
				rep.Completed++
				if n != 1 {
					bad("completed job %s has %d mutations, want 1", j.OperationID, n)
				}
			} else if n != 0 {
				bad("job %s is %s but has %d mutations", j.OperationID, j.State, n)
			}
		}
		if heldReserved != a.Reserved {
			bad("reserved is %d but the jobs hold %d", a.Reserved, heldReserved)
		}
		if rep.Mutations != int64(rep.Completed) {
			bad("%d mutations for %d completed jobs", rep.Mutations, rep.Completed)
		}
		var twice int64
		if err := tx.QueryRowContext(ctx,
			`SELECT COUNT(*) FROM (SELECT 1 FROM mutations GROUP BY document_id, operation_key HAVING COUNT(*) > 1) AS dup`,
		).Scan(&twice); err != nil {
			return err
		}
		if twice > 0 {
			bad("%d operations mutated more than once", twice)
		}
		return nil
	})
	if err != nil {
		return rep, fmt.Errorf("verify %s: %w", stateDir, err)
	}
	rep.OK = len(rep.Violations) == 0
	return rep, nil
}
