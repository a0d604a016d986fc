package httpapi

import (
	"context"
	"errors"
	"io"
	"net/http"
	"time"

	"github.com/labstack/echo/v4"
	"golang.org/x/sync/semaphore"

	"github.com/fleet/fleet/internal/fleet"
	"github.com/fleet/fleet/internal/wire"
)

// What a request's body can make the host hold. Decoding never builds a
// tree of the body's values (resource.DecodeStrict streams, a publication
// is canonicalized as it streams), so a request holds a small multiple of
// its body: the bytes read, the decoder's copy, the items and requests
// decoded from them, a canonical body. BodyMemoryFactor is that multiple
// as charged; TestBodyMemoryBounded measures it on a real host.
const (
	// BodyMemoryFactor is what one byte of body is charged against
	// Limits.BodyMemory while its request is served.
	BodyMemoryFactor = 8
	// bodyMemoryWait is how long a request waits for room before 503.
	bodyMemoryWait = time.Second
	// bodyReadStep is the least a body's buffer grows by.
	bodyReadStep = 32 << 10
)

// MinBodyMemory is room for one batch call at its largest, in whole MiB.
const MinBodyMemory = ((MaxBatchBodyBytes+1)*BodyMemoryFactor + 1<<20 - 1) &^ (1<<20 - 1)

// DefaultBodyMemory is serve's --body-memory: room for several batch
// calls at their largest (8.25 MiB, charged 66 MiB) and thousands of
// ordinary calls at once.
const DefaultBodyMemory = 512 << 20

// bodyMemory is the host's budget for what the bodies being served hold,
// shared by every request: a body is charged BodyMemoryFactor times its
// buffer as it is read (as it arrives, so a chunked body is charged what
// it sends, not the route's limit), and the charge is given back when its
// request ends. A request that finds no room within bodyMemoryWait is
// refused 503 with Retry-After, having done nothing.
type bodyMemory struct {
	sem      *semaphore.Weighted
	size     int64
	onRefuse func() // counts a refusal
}

func newBodyMemory(size int64) *bodyMemory {
	return &bodyMemory{sem: semaphore.NewWeighted(size), size: size}
}

// bodyCharge is what one request holds of the budget.
type bodyCharge struct {
	budget *bodyMemory
	held   int64
}

const ctxBodyCharge = "fleet.body-charge"

// chargeBodies makes c's body reads charge the budget until the returned
// function gives back what they took (serveAs defers it).
func (b *bodyMemory) chargeBodies(c echo.Context) (release func()) {
	charge := &bodyCharge{budget: b}
	c.Set(ctxBodyCharge, charge)
	return func() {
		if charge.held > 0 {
			b.sem.Release(charge.held)
			charge.held = 0
		}
	}
}

// take charges n more bytes, waiting up to bodyMemoryWait for room.
func (ch *bodyCharge) take(c echo.Context, n int64) error {
	if ch == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(c.Request().Context(), bodyMemoryWait)
	defer cancel()
	if n > ch.budget.size-ch.held || ch.budget.sem.Acquire(ctx, n) != nil {
		if ch.budget.onRefuse != nil {
			ch.budget.onRefuse()
		}
		c.Response().Header().Set("Retry-After", "1")
		return fleet.Errorf(wire.CodeUnavailable, "the host holds its limit of request bodies in memory (%d MiB); retry shortly", ch.budget.size>>20)
	}
	ch.held += n
	return nil
}

// readMetered reads r whole, at most limit bytes, charging the buffer as
// it grows: a declared length is charged up front (its buffer is made to
// fit), anything else as it arrives.
func readMetered(c echo.Context, r io.Reader, limit int64) ([]byte, error) {
	charge, _ := c.Get(ctxBodyCharge).(*bodyCharge)
	size := int64(bodyReadStep)
	if cl := c.Request().ContentLength; cl >= 0 && cl <= limit {
		size = cl + 1 // one more, so the end is read without growing
	}
	size = min(size, limit+1)
	if err := charge.take(c, size*BodyMemoryFactor); err != nil {
		return nil, err
	}
	buf := make([]byte, 0, size)
	for {
		n, err := r.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		if errors.Is(err, io.EOF) {
			return buf, nil
		}
		if err != nil {
			return buf, err
		}
		// Full below limit+1 (the reader gives at most limit bytes, then
		// MaxBytesError, so a buffer of limit+1 never fills): grow it.
		if len(buf) == cap(buf) {
			grown := min(max(int64(cap(buf))*2, bodyReadStep), limit+1)
			if err := charge.take(c, (grown-int64(cap(buf)))*BodyMemoryFactor); err != nil {
				return nil, err
			}
			next := make([]byte, len(buf), grown)
			copy(next, buf)
			buf = next
		}
	}
}

// bodyRead is the body of c, limited, as readMetered reads it.
func bodyRead(c echo.Context, limit int64) ([]byte, error) {
	return readMetered(c, http.MaxBytesReader(c.Response(), c.Request().Body, limit), limit)
}
