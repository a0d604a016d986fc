package httpapi

import (
	"context"
	"errors"
	"math"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/labstack/echo/v4"
	"golang.org/x/time/rate"

	"github.com/fleet/fleet/internal/fleet"
	"github.com/fleet/fleet/internal/wire"
)

// Limits are what one host serves at once and how fast. A request takes a
// slot only once its caller is known (its headers carry the credential),
// so a caller without one holds none (the console's sign-in reads a small
// body under bounds of its own, signin.go); a body must arrive within
// BodyTimeout of the headers; one credential holds at most PerCredential
// slots; each worker credential makes at most WorkerRate requests a second
// (bursts of WorkerBurst), more being 429; and event streams, which live
// as long as their clients, hold no slot but one of Streams places; and
// what the bodies being served hold is bounded by BodyMemory in all.
type Limits struct {
	MaxInFlight   int           // slots for authenticated requests, in all
	PerCredential int           // of them, at most this many for one credential
	Streams       int           // event streams open at once; past it a new one closes the oldest
	BodyTimeout   time.Duration // from the headers to the body's last byte
	WorkerRate    float64       // requests a second per worker credential; 0 is unlimited
	WorkerBurst   int
	BodyMemory    int64 // what the bodies being served may make the host hold, in bytes (memory.go)

	SignInPerAddress, SignInPerHost SignInBudget // failed console sign-ins, past which 429
}

// Defaults for `fleet-host serve`.
const (
	DefaultMaxInFlight   = 256
	DefaultPerCredential = 32
	DefaultStreams       = 64
	DefaultBodyTimeout   = 5 * time.Second
	DefaultWorkerRate    = 2000
	DefaultWorkerBurst   = 2000
)

// DefaultLimits are serve's limits when no flag changes them.
func DefaultLimits() Limits {
	return Limits{MaxInFlight: DefaultMaxInFlight, PerCredential: DefaultPerCredential, Streams: DefaultStreams,
		BodyTimeout: DefaultBodyTimeout, WorkerRate: DefaultWorkerRate, WorkerBurst: DefaultWorkerBurst, BodyMemory: DefaultBodyMemory,
		SignInPerAddress: DefaultSignInPerAddress, SignInPerHost: DefaultSignInPerHost}
}

// slots bounds requests in flight, in all and per holder.
type slots struct {
	size, per int
	what      string // for the refusal: "requests"

	mu   sync.Mutex
	used int
	held map[string]int
}

func newSlots(size, per int, what string) *slots {
	return &slots{size: size, per: max(1, min(per, size)), what: what, held: map[string]int{}}
}

// take holds a slot for who, or refuses with 503 and Retry-After when the
// host or who is at its limit; release gives it back.
func (s *slots) take(c echo.Context, who string) (release func(), err error) {
	s.mu.Lock()
	switch {
	case s.used >= s.size:
		s.mu.Unlock()
		c.Response().Header().Set("Retry-After", "1")
		return nil, fleet.Errorf(wire.CodeUnavailable, "the host is serving %d %s, its limit; retry shortly", s.size, s.what)
	case s.held[who] >= s.per:
		s.mu.Unlock()
		c.Response().Header().Set("Retry-After", "1")
		return nil, fleet.Errorf(wire.CodeUnavailable, "%s already has %d requests in flight, the limit for one credential; retry shortly", who, s.per)
	}
	s.used++
	s.held[who]++
	s.mu.Unlock()
	return func() {
		s.mu.Lock()
		s.used--
		if s.held[who]--; s.held[who] == 0 {
			delete(s.held, who)
		}
		s.mu.Unlock()
	}, nil
}

// rates keeps a token bucket per worker credential (there are as many as
// the operator made, so the map is bounded).
type rates struct {
	every rate.Limit
	burst int

	mu sync.Mutex
	by map[string]*rate.Limiter
}

func newRates(perSecond float64, burst int) *rates {
	if perSecond <= 0 {
		return nil
	}
	return &rates{every: rate.Limit(perSecond), burst: max(1, burst), by: map[string]*rate.Limiter{}}
}

// allow takes a token for who, or refuses with 429 and the whole seconds
// after which one will be there.
func (r *rates) allow(c echo.Context, who string) error {
	if r == nil {
		return nil
	}
	r.mu.Lock()
	l := r.by[who]
	if l == nil {
		l = rate.NewLimiter(r.every, r.burst)
		r.by[who] = l
	}
	r.mu.Unlock()
	res := l.Reserve()
	wait := res.Delay()
	if wait == 0 {
		return nil
	}
	res.Cancel()
	c.Response().Header().Set("Retry-After", strconv.Itoa(int(math.Ceil(max(wait, time.Second).Seconds()))))
	return fleet.Errorf(wire.CodeRateLimited, "%s is over its %g requests a second; retry after the Retry-After", who, float64(r.every))
}

// bodyDeadline gives a request's body BodyTimeout from its headers: a
// client that sends headers and then trickles its body is cut off, its
// read failing, instead of holding the request for the server's whole
// read timeout. serveAs gives it BodyTimeout again once the caller is
// known: authenticating may wait on the database, and a body the client
// sent meanwhile must not fail for the host's wait.
func bodyDeadline(d time.Duration) echo.MiddlewareFunc {
	return func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c echo.Context) error {
			setBodyDeadline(c, d)
			return next(c)
		}
	}
}

// setBodyDeadline makes reading the rest of c's body fail d from now.
func setBodyDeadline(c echo.Context, d time.Duration) {
	if d > 0 && c.Request().ContentLength != 0 {
		// Not every writer supports deadlines (tests' recorders); the
		// server's own read timeout still bounds those.
		_ = http.NewResponseController(c.Response()).SetReadDeadline(time.Now().Add(d))
	}
}

// errStreamDisplaced ends an event stream closed to make room for a newer.
var errStreamDisplaced = errors.New("displaced by a newer stream")

// streams bounds the event streams open at once, apart from the request
// slots: a stream lives as long as its client, so a forgotten tab or a
// stuck script must never hold a place the operator's requests need. Past
// the limit a new stream is not refused; the oldest open one is closed
// (its client may reconnect, displacing the next oldest).
type streams struct {
	limit   int
	onClose func()    // counts a displaced stream
	onCount func(int) // moves the count of open streams

	mu   sync.Mutex
	next uint64
	open []openStream // oldest first
}

type openStream struct {
	id     uint64
	cancel context.CancelCauseFunc
}

func newStreams(limit int) *streams { return &streams{limit: max(1, limit)} }

// hold gives a stream its place, closing the oldest past the limit, and
// makes the request's context end when it is displaced.
func (s *streams) hold(c echo.Context, _ fleet.Caller) (func(), error) {
	ctx, cancel := context.WithCancelCause(c.Request().Context())
	c.SetRequest(c.Request().WithContext(ctx))
	s.mu.Lock()
	for len(s.open) >= s.limit {
		s.open[0].cancel(errStreamDisplaced)
		s.open = s.open[1:]
		if s.onClose != nil {
			s.onClose()
		}
	}
	id := s.next
	s.next++
	s.open = append(s.open, openStream{id: id, cancel: cancel})
	s.mu.Unlock()
	if s.onCount != nil {
		s.onCount(1)
	}
	return func() {
		if s.onCount != nil {
			s.onCount(-1)
		}
		cancel(nil)
		s.mu.Lock()
		defer s.mu.Unlock()
		for i, o := range s.open {
			if o.id == id {
				s.open = append(s.open[:i], s.open[i+1:]...)
				break
			}
		}
	}, nil
}
