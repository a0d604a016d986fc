package httpapi

import (
	"math"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/labstack/echo/v4"
	"golang.org/x/time/rate"

	"github.com/fleet/fleet/internal/fleet"
	"github.com/fleet/fleet/internal/wire"
)

// A console sign-in is the one route that reads a body before anyone is
// known. It holds nothing a signed-in caller needs: no request slot, a
// body of at most signInBodyBytes that must arrive within signInBodyTimeout
// of the headers, and failed attempts drawn from a budget per client
// address and one for the host, past which it is 429 with Retry-After.
const (
	signInBodyBytes   = 512 // {"credential":"fleet_…"} is under 80
	signInBodyTimeout = time.Second
	// maxSignInAddresses bounds the per-address budgets kept; past it,
	// addresses whose budget is whole again are forgotten, then new ones
	// share one budget.
	maxSignInAddresses = 4096
)

// SignInBudget is how many failed sign-ins an address, and the host in
// all, may make: Burst at once, then one every Every.
type SignInBudget struct {
	Burst int
	Every time.Duration
}

// Default sign-in failure budgets: an operator who mistypes gets ten
// tries, then one every six seconds; the host takes at most a hundred
// failures at once from everyone, then one a second.
var (
	DefaultSignInPerAddress = SignInBudget{Burst: 10, Every: 6 * time.Second}
	DefaultSignInPerHost    = SignInBudget{Burst: 100, Every: time.Second}
)

func (b SignInBudget) limiter() *rate.Limiter {
	return rate.NewLimiter(rate.Every(b.Every), max(1, b.Burst))
}

// signInThrottle keeps the failure budgets.
type signInThrottle struct {
	perAddress SignInBudget
	host       *rate.Limiter

	mu       sync.Mutex
	by       map[string]*rate.Limiter
	overflow *rate.Limiter
}

func newSignInThrottle(perAddress, perHost SignInBudget) *signInThrottle {
	return &signInThrottle{perAddress: perAddress, host: perHost.limiter(), by: map[string]*rate.Limiter{},
		overflow: perAddress.limiter()}
}

// clientAddress is the address a sign-in is charged to: the peer's IP (a
// header naming another is the caller's to choose), an IPv6 address by
// its /64, since one client commonly holds a whole /64.
func clientAddress(r *http.Request) string {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		host = r.RemoteAddr
	}
	ip := net.ParseIP(host)
	if ip == nil {
		return host
	}
	if ip.To4() == nil {
		return ip.Mask(net.CIDRMask(64, 128)).String() + "/64"
	}
	return ip.String()
}

func (s *signInThrottle) address(addr string) *rate.Limiter {
	s.mu.Lock()
	defer s.mu.Unlock()
	if l := s.by[addr]; l != nil {
		return l
	}
	if len(s.by) >= maxSignInAddresses {
		now := time.Now()
		for a, l := range s.by {
			if l.TokensAt(now) >= float64(l.Burst()) {
				delete(s.by, a)
			}
		}
		if len(s.by) >= maxSignInAddresses {
			return s.overflow
		}
	}
	l := s.perAddress.limiter()
	s.by[addr] = l
	return l
}

// check refuses a sign-in whose address or host has no failure left,
// with 429 and the whole seconds until one is back.
func (s *signInThrottle) check(c echo.Context) error {
	now := time.Now()
	var wait time.Duration
	for _, l := range []*rate.Limiter{s.address(clientAddress(c.Request())), s.host} {
		if short := 1 - l.TokensAt(now); short > 0 {
			wait = max(wait, time.Duration(short*float64(time.Second)/float64(l.Limit())))
		}
	}
	if wait == 0 {
		return nil
	}
	c.Response().Header().Set("Retry-After", strconv.Itoa(int(math.Ceil(max(wait, time.Second).Seconds()))))
	return fleet.Errorf(wire.CodeRateLimited, "too many failed console sign-ins from this address or in all; retry after the Retry-After")
}

// failed charges a failed sign-in to its address and the host.
func (s *signInThrottle) failed(c echo.Context) {
	now := time.Now()
	s.address(clientAddress(c.Request())).AllowN(now, 1)
	s.host.AllowN(now, 1)
}

// readSignIn reads a sign-in's body under its own tight bounds.
func readSignIn(c echo.Context) ([]byte, error) {
	// From now rather than from the headers: the request has waited for
	// nothing since they arrived (it holds no slot).
	_ = http.NewResponseController(c.Response()).SetReadDeadline(time.Now().Add(signInBodyTimeout))
	data, err := readBodyUpTo(c, signInBodyBytes)
	if err == nil {
		_ = http.NewResponseController(c.Response()).SetReadDeadline(time.Time{})
	}
	return data, err
}
