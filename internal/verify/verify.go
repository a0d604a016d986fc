// Package verify checks a state offline and read-only, as `fleet-host
// verify` does: every receipt's signature and the hash chain, the event
// log's contiguity, the accounting of the fleet and of each tenant
// against the receipts and the jobs, and one mutation per published job.
package verify

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"

	"github.com/fleet/fleet/internal/receipts"
	"github.com/fleet/fleet/internal/statedir"
	"github.com/fleet/fleet/internal/store"
	"github.com/fleet/fleet/internal/wire"
)

// Report is what `fleet-host verify` prints.
type Report struct {
	OK        bool   `json:"ok"`
	KernelKey string `json:"kernel_key"`
	Receipts  int    `json:"receipts"`
	Events    int64  `json:"events"`
	// Pending counts log entries committed but not yet placed (a host died
	// between a commit and its sequencer's round; the next host start places
	// them). Their receipts count in the accounting check.
	Pending    int             `json:"pending_log_entries"`
	Jobs       int             `json:"jobs"`
	Completed  int             `json:"completed"`
	Mutations  int64           `json:"mutations"`
	Accounting wire.Accounting `json:"accounting"`
	// Tenants are each tenant's figures as the state holds them, checked
	// against its receipts and jobs as the fleet's are.
	Tenants []wire.TenantFigures `json:"tenants"`
	// Credentials are the figures of each credential with an allowance of
	// its own, checked the same way.
	Credentials []wire.TenantFigures `json:"credentials"`
	Violations  []string             `json:"violations"`
}

// State verifies the state in stateDir, whose database the caller opened
// (read-only: store/backend.OpenReadOnly). A violation is reported, not
// returned as an error; an error means the state could not be read.
func State(ctx context.Context, stateDir string, db *store.DB) (Report, error) {
	rep := Report{Tenants: []wire.TenantFigures{}, Credentials: []wire.TenantFigures{}, Violations: []string{}}
	var st stateRead
	err := db.Read(ctx, func(tx *store.Tx) (err error) {
		st, err = readState(ctx, tx)
		return err
	})
	if err == nil {
		err = check(st, stateDir, &rep)
	}
	if err != nil {
		return rep, fmt.Errorf("verify %s: %w", stateDir, err)
	}
	rep.OK = len(rep.Violations) == 0
	return rep, nil
}

// maxPending bounds the pending entries read; a sequencer places them
// within a round of their commit, so more means something else is wrong.
const maxPending = 1_000_000

func (rep *Report) bad(format string, args ...any) {
	rep.Violations = append(rep.Violations, fmt.Sprintf(format, args...))
}

// stateRead is everything verify reads of a state, in one read
// transaction, before it checks any of it: checking the chain's
// signatures takes a while on a long chain, and on PostgreSQL a
// transaction left idle that long is ended by the server (the hosts' pool
// sets idle_in_transaction_session_timeout on every session, verify's
// too).
type stateRead struct {
	kernel            store.Kernel
	stored            [][]byte
	pending           store.PendingLog
	events, lastEvent int64
	accounting        wire.Accounting
	jobs              []store.Job
	perDoc            map[string]int64
	repeated          int64
	tenants           []store.Tenant
	credentials       []store.Credential
	counts            map[wire.JobState]int64 // as the sampler and pages count them
}

func readState(ctx context.Context, tx *store.Tx) (st stateRead, err error) {
	if st.kernel, err = tx.KernelGet(ctx); err != nil {
		return st, err
	}
	if st.stored, err = tx.ReceiptList(ctx, ""); err != nil {
		return st, err
	}
	if st.pending, err = tx.PendingLogList(ctx, maxPending); err != nil {
		return st, err
	}
	if st.events, st.lastEvent, err = tx.EventHead(ctx); err != nil {
		return st, err
	}
	if st.accounting, err = tx.AccountingGet(ctx, store.NoLock); err != nil {
		return st, err
	}
	if st.jobs, err = tx.JobList(ctx); err != nil {
		return st, err
	}
	if st.counts, err = tx.JobCountByState(ctx); err != nil {
		return st, err
	}
	if st.perDoc, err = tx.MutationCountByDocument(ctx); err != nil {
		return st, err
	}
	if st.repeated, err = tx.MutationRepeatedOperations(ctx); err != nil {
		return st, err
	}
	if st.tenants, err = tx.TenantList(ctx); err != nil {
		return st, err
	}
	st.credentials, err = tx.CredentialList(ctx)
	return st, err
}

func check(st stateRead, stateDir string, rep *Report) error {
	kernel, err := checkKernel(st.kernel, stateDir, rep)
	if err != nil {
		return err
	}
	decided, err := checkReceipts(st, kernel, rep)
	if err != nil {
		return err
	}
	rep.Events = st.events
	if st.events != st.lastEvent {
		rep.bad("events are not contiguous: %d events, highest sequence %d", st.events, st.lastEvent)
	}
	rep.Accounting = st.accounting
	checkAccounting(rep, decided)
	checkJobs(rep, st.jobs, st.perDoc)
	checkCounts(rep, st.jobs, st.counts)
	checkTenants(rep, st.tenants, decided, st.jobs)
	checkCredentials(rep, st.credentials, decided, st.jobs)
	if st.repeated > 0 {
		rep.bad("%d operations mutated more than once", st.repeated)
	}
	return nil
}

// checkKernel loads the state's kernel and checks that the state
// directory's trusted key names it.
func checkKernel(k store.Kernel, stateDir string, rep *Report) (*receipts.Kernel, error) {
	kernel, err := receipts.LoadKernel(k.PublicKey, k.Seed)
	if err != nil {
		return nil, err
	}
	rep.KernelKey = kernel.PublicKey
	if data, err := os.ReadFile(filepath.Join(stateDir, statedir.TrustedKernelFile)); err != nil {
		rep.bad("%s: %v", statedir.TrustedKernelFile, err)
	} else {
		var trusted wire.TrustedKernel
		if json.Unmarshal(data, &trusted) != nil || trusted.PublicKey != kernel.PublicKey {
			rep.bad("%s does not name the kernel key in the database", statedir.TrustedKernelFile)
		}
	}
	return kernel, nil
}

// checkReceipts verifies the receipt chain and the receipts still
// pending in the log, and answers every receipt decided: the chain, then
// the pending.
func checkReceipts(st stateRead, kernel *receipts.Kernel, rep *Report) ([]wire.Receipt, error) {
	chain := make([]wire.Receipt, 0, len(st.stored))
	for _, raw := range st.stored {
		r, err := receipts.Decode(raw)
		if err != nil {
			return nil, err
		}
		chain = append(chain, r)
	}
	rep.Receipts = len(chain)
	rep.Violations = append(rep.Violations, receipts.VerifyChain(chain, kernel.PublicKey)...)

	rep.Pending = len(st.pending.Events) + len(st.pending.Receipts)
	decided := chain
	for _, p := range st.pending.Receipts {
		if err := receipts.VerifyPrepared(p.Receipt, kernel.PublicKey); err != nil {
			rep.bad("pending %v", err)
		}
		decided = append(decided, p.Receipt)
	}
	return decided, nil
}

// checkAccounting: never negative, and equal to what the receipts admit,
// settle and release.
func checkAccounting(rep *Report, chain []wire.Receipt) {
	a := rep.Accounting
	if a.Available < 0 || a.Spent < 0 || a.Reserved < 0 {
		rep.bad("accounting is negative: %+v", a)
	}
	var l levelLedger // the fleet's: every receipt
	for _, r := range chain {
		if r.Reserved != nil && *r.Reserved < r.Cost {
			rep.bad("receipt %s settles %d of a reservation of %d", r.ID, r.Cost, *r.Reserved)
		}
		l.add(r)
	}
	admitted, settled, released := l.admitted, l.settled, l.released
	if settled != a.Spent {
		rep.bad("spent is %d but the receipts settle %d", a.Spent, settled)
	}
	if admitted-released != a.Spent+a.Reserved {
		rep.bad("spent + reserved is %d but the receipts admit %d and release %d", a.Spent+a.Reserved, admitted, released)
	}
}

// checkJobs: exactly one mutation per completed job and none for the rest,
// and the reservations the jobs hold add up to reserved.
func checkJobs(rep *Report, all []store.Job, perDoc map[string]int64) {
	rep.Jobs = len(all)
	for _, n := range perDoc {
		rep.Mutations += n
	}
	var heldReserved int64
	for _, j := range all {
		heldReserved += j.Reserved
		n := perDoc[j.DocumentID]
		if j.State == wire.Completed {
			rep.Completed++
			if n != 1 {
				rep.bad("completed job %s has %d mutations, want 1", j.OperationID, n)
			}
		} else if n != 0 {
			rep.bad("job %s is %s but has %d mutations", j.OperationID, j.State, n)
		}
	}
	if heldReserved != rep.Accounting.Reserved {
		rep.bad("reserved is %d but the jobs hold %d", rep.Accounting.Reserved, heldReserved)
	}
	if rep.Mutations != int64(rep.Completed) {
		rep.bad("%d mutations for %d completed jobs", rep.Mutations, rep.Completed)
	}
}

// checkCounts: the jobs' positions run from 1 without a gap, and the
// counts by state (which take the completed jobs as the rest of those
// enqueued, the highest position) agree with the jobs themselves.
func checkCounts(rep *Report, all []store.Job, counts map[wire.JobState]int64) {
	positions := make([]int64, len(all))
	tally := map[wire.JobState]int64{}
	for i, j := range all {
		positions[i] = j.Position
		tally[j.State]++
	}
	slices.Sort(positions)
	for i, p := range positions {
		if p != int64(i+1) {
			rep.bad("job positions are not 1 to %d without a gap: no job at %d", len(all), i+1)
			break
		}
	}
	if !maps.Equal(tally, counts) {
		rep.bad("the counts by state %v are not the jobs' %v", counts, tally)
	}
}
