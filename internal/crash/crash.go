// Package crash holds the host's named crash points: places where a test can
// make the host die as if by SIGKILL (no deferred cleanup, nothing flushed),
// to prove that whatever was or was not committed there is recovered.
//
// Crash points exist only in binaries built with the `crashpoints` build
// tag; in every other build At compiles to nothing. With the tag, the
// environment selects the point:
//
//	FLEET_CRASH_AT=publish.after-commit   the point's name
//	FLEET_CRASH_HIT=3                     crash at its third hit (default 1)
//	FLEET_CRASH_SIGNAL=STOP               pause there (SIGSTOP) instead
//	FLEET_CRASH_SIGNAL=ERROR              at an .after-commit point, answer an error instead
package crash

// HostPoints are the host's crash points, each with a ".before-commit" and
// an ".after-commit" variant.
var HostPoints = []string{
	"claim", "dispatch-allow", "dispatch-deny", "heartbeat", "publish", "cancel",
	"reconcile", "requeue", "assign", "allowance", "reports", "restart-recovery", "lease-expiry", "host-beat",
	"credential", "fail", "dispatch-batch", "heartbeat-batch", "publish-batch", "fail-batch",
	"release", "tenant-add", "tenant-allowance", "claim-admit", "tenant-weight",
}

// SequencerPoints are the log sequencer's, reached only where several
// transactions write at once (PostgreSQL): with a round's placing written
// and not committed, and committed with its requests not yet answered.
var SequencerPoints = []string{"sequence"}

// WorkerPoints are the worker's: after its claim is answered, after its
// dispatch is answered, and with its publication committed but its answer
// not yet read.
var WorkerPoints = []string{"worker.after-claim", "worker.after-dispatch", "worker.mid-publish"}

// Env names.
const (
	EnvPoint = "FLEET_CRASH_AT"
	EnvHit   = "FLEET_CRASH_HIT"
	// EnvSignal=STOP pauses the process at the point instead of killing
	// it; EnvSignal=ERROR answers an error there instead (crash.Lost).
	EnvSignal = "FLEET_CRASH_SIGNAL"
	// EnvClockAhead moves a crash-point build's clock ahead by a Go
	// duration (Clock), so a test can run a host past a day's or a
	// month's end: a tenant's period rolls over as it would then.
	EnvClockAhead = "FLEET_CLOCK_AHEAD"
)
