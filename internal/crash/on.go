//go:build crashpoints

package crash

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"sync/atomic"
	"syscall"
	"time"
)

var (
	target = os.Getenv(EnvPoint)
	hitAt  = func() int64 {
		n, err := strconv.ParseInt(os.Getenv(EnvHit), 10, 64)
		if err != nil || n < 1 {
			return 1
		}
		return n
	}()
	hits  atomic.Int64
	pause = os.Getenv(EnvSignal) == "STOP"
	lose  = os.Getenv(EnvSignal) == "ERROR"
)

// Enabled reports whether this binary has crash points.
const Enabled = true

// At kills the process with SIGKILL if name is the selected point and this
// is the selected hit; with FLEET_CRASH_SIGNAL=STOP it stops the process
// there instead (SIGSTOP), holding whatever it holds, until a SIGCONT lets
// it go on from the point as if nothing had happened.
func At(name string) {
	if lose || target == "" || name != target || hits.Add(1) != hitAt {
		return
	}
	if pause {
		fmt.Fprintf(os.Stderr, "crash point %s: SIGSTOP\n", name)
		syscall.Kill(os.Getpid(), syscall.SIGSTOP)
		return
	}
	fmt.Fprintf(os.Stderr, "crash point %s: SIGKILL\n", name)
	syscall.Kill(os.Getpid(), syscall.SIGKILL)
	select {} // SIGKILL cannot be caught; never return into the caller
}

// ErrLost is the error Lost injects.
var ErrLost = errors.New("injected fault: the answer to a committed request was lost")

// Lost, with FLEET_CRASH_SIGNAL=ERROR, returns ErrLost at the selected
// point and hit instead of killing the process: the host answers an error
// for what it committed, as when its connection to the database breaks
// after the commit was sent and before its answer came back.
func Lost(name string) error {
	if !lose || target == "" || name != target || hits.Add(1) != hitAt {
		return nil
	}
	fmt.Fprintf(os.Stderr, "crash point %s: the answer is lost\n", name)
	return ErrLost
}

// Clock is the host's clock moved ahead by EnvClockAhead, or nil (the
// host keeps its own) when it is not set or not a duration.
func Clock() func() time.Time {
	ahead, err := time.ParseDuration(os.Getenv(EnvClockAhead))
	if err != nil || ahead == 0 {
		return nil
	}
	return func() time.Time { return time.Now().Add(ahead) }
}
