package postgres_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/url"
	"testing"
	"time"

	"github.com/fleet/fleet/internal/faultproxy"
	"github.com/fleet/fleet/internal/receipts"
	"github.com/fleet/fleet/internal/store"
	"github.com/fleet/fleet/internal/storetest"
	"github.com/fleet/fleet/internal/wire"
)

// BenchmarkSequencerRound times one round of the log's sequencer as a host
// runs it when other hosts place too: take the log's lock, list what is
// pending, seal its receipts, place the entries and commit. One round at a
// time holds the lock across the whole fleet, so a round's time bounds how
// many jobs a second the fleet can log, however many hosts it has. The
// pending log holds whole jobs' entries (three events and two receipts a
// job, as a claim that admits and its publication write them) in rows of
// ten jobs; 100 jobs are 500 entries, near a round's limit of 512. With
// delay, every message to and from the database waits that long, as
// fleet-bench -db-latency does. The unsigned case seals each receipt
// without its signature: what is left is the round's work in the database
// and the host's encoding, which a host with more cores cannot spread.
//
//	FLEET_TEST_POSTGRES_URL=… go test ./internal/store/postgres -run '^$' -bench SequencerRound -benchtime 100x
func BenchmarkSequencerRound(b *testing.B) {
	if storetest.PostgresURL() == "" {
		b.Skip("SKIPPED: needs PostgreSQL; set " + storetest.EnvPostgres)
	}
	kernel, err := receipts.NewKernel()
	if err != nil {
		b.Fatal(err)
	}
	for _, delay := range []time.Duration{0, time.Millisecond} {
		for _, jobs := range []int{10, 100} {
			b.Run(fmt.Sprintf("delay=%s/jobs=%d", delay, jobs), func(b *testing.B) {
				benchmarkRound(b, delay, jobs, kernel, kernel)
			})
		}
		b.Run(fmt.Sprintf("delay=%s/jobs=100/unsigned", delay), func(b *testing.B) {
			benchmarkRound(b, delay, 100, kernel, unsigned{})
		})
	}
}

// unsigned places a receipt as Kernel.Seal does, but leaves it unsigned.
type unsigned struct{}

func (unsigned) Seal(r *wire.Receipt, prevSequence int64, prevID string) ([]byte, error) {
	r.Sequence, r.Prev = prevSequence+1, nil
	if prevID != "" {
		r.Prev = &prevID
	}
	return json.Marshal(r)
}

func benchmarkRound(b *testing.B, delay time.Duration, jobs int, kernel *receipts.Kernel, sealer store.Sealer) {
	ctx := context.Background()
	location := storetest.NewPostgresLocation(b)
	p := newPendingTable(b, location)
	via := location
	if delay > 0 {
		u, err := url.Parse(location)
		if err != nil {
			b.Fatal(err)
		}
		proxy, err := faultproxy.Start(u.Host)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(proxy.Close)
		if via, err = proxy.Via(location); err != nil {
			b.Fatal(err)
		}
		proxy.SetDelay(delay)
	}
	db := storetest.MustOpen(b, via)
	db.SetSealer(sealer)
	const rowJobs = 10
	placed := 0
	before := db.Stats()
	b.ResetTimer()
	for range b.N {
		b.StopTimer()
		for range jobs / rowJobs {
			events, rs := jobsLog(kernel, rowJobs, placed)
			p.write(func(ctx context.Context, conn store.Conn) error {
				_, err := conn.PendingLogInsert(ctx, events, rs)
				return err
			})
			placed += rowJobs
		}
		b.StartTimer()
		if err := db.PlacePending(ctx); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	if n := p.rows(); n != 0 {
		b.Fatalf("%d pending rows left after the rounds", n)
	}
	after := db.Stats()
	if rounds := after.SequencerRounds - before.SequencerRounds; rounds != int64(b.N) {
		b.Fatalf("%d sequencer rounds for %d forced, want one each", rounds, b.N)
	}
	b.ReportMetric(float64(after.RoundTrips-before.RoundTrips)/float64(b.N), "round-trips/op")
	b.ReportMetric(float64(jobs*b.N)/b.Elapsed().Seconds(), "jobs/s")
}

// jobsLog is n jobs' entries as a claim that admits and a publication
// append them: a claim, an admission and a publication event, and the
// admission's and the publication's receipts.
func jobsLog(k *receipts.Kernel, n, from int) ([]wire.Event, []wire.Receipt) {
	var events []wire.Event
	var rs []wire.Receipt
	acct := wire.Accounting{Allowance: 1000000, Spent: int64(from), Reserved: 32, Available: 999968 - int64(from), Calls: int64(from), Unit: "credits", CostPerReport: 1}
	for i := from; i < from+n; i++ {
		op := fmt.Sprintf("op-%08d", i)
		data, _ := json.Marshal(map[string]any{"operation_id": op, "worker": "worker-17", "claim_id": op + ".c1", "generation": 1})
		for _, kind := range []wire.EventKind{wire.EventClaimed, wire.EventAllowed, wire.EventPublished} {
			events = append(events, wire.Event{TimestampMS: int64(i), Kind: kind, Actor: "worker-17", Title: string(kind) + " " + op, Data: data, OperationID: op})
		}
		for _, kind := range []wire.ReceiptKind{wire.KindAdmission, wire.KindPublication} {
			rs = append(rs, k.Prepare(receipts.Draft{Kind: kind, OperationID: op, Caller: "worker-17", Decision: wire.DecisionAllow, Cost: 1, Accounting: acct, Tenant: "default"}, int64(i)))
		}
	}
	return events, rs
}
