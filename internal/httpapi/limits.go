package httpapi

import (
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
// so a caller without one holds none but the few of the sign-in route; a
// body must arrive within BodyTimeout of the headers; one credential holds
// at most PerCredential slots; and each worker credential makes at most
// WorkerRate requests a second (bursts of WorkerBurst), more being 429.
type Limits struct {
	MaxInFlight   int           // slots for authenticated requests, in all
	PerCredential int           // of them, at most this many for one credential
	SignIn        int           // slots for console sign-ins, which read a body before anyone is known
	BodyTimeout   time.Duration // from the headers to the body's last byte
	WorkerRate    float64       // requests a second per worker credential; 0 is unlimited
	WorkerBurst   int
}

// Defaults for `fleet-host serve`.
const (
	DefaultMaxInFlight   = 256
	DefaultPerCredential = 32
	DefaultSignIn        = 16
	DefaultBodyTimeout   = 5 * time.Second
	DefaultWorkerRate    = 2000
	DefaultWorkerBurst   = 2000
)

// DefaultLimits are serve's limits when no flag changes them.
func DefaultLimits() Limits {
	return Limits{MaxInFlight: DefaultMaxInFlight, PerCredential: DefaultPerCredential, SignIn: DefaultSignIn,
		BodyTimeout: DefaultBodyTimeout, WorkerRate: DefaultWorkerRate, WorkerBurst: DefaultWorkerBurst}
}

// slots bounds requests in flight, in all and per holder.
type slots struct {
	size, per int
	what      string // for the refusal: "requests", "sign-ins"

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
// read timeout.
func bodyDeadline(d time.Duration) echo.MiddlewareFunc {
	return func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c echo.Context) error {
			if d > 0 && c.Request().ContentLength != 0 {
				// Not every writer supports deadlines (tests' recorders);
				// the server's own read timeout still bounds those.
				_ = http.NewResponseController(c.Response()).SetReadDeadline(time.Now().Add(d))
			}
			return next(c)
		}
	}
}
