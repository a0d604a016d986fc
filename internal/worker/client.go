// Package worker is a fleet worker: it claims jobs from the host, asks for
// admission, heartbeats while it computes, and publishes through the
// resource, retrying through host restarts with the same operation key.
package worker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/fleet/fleet/internal/client"
	"github.com/fleet/fleet/internal/retry"
	"github.com/fleet/fleet/internal/wire"
)

// Client calls the host, riding through outages: a refused connection, a
// dropped response, a 408 or a 5xx is retried with bounded backoff until the host
// has been unreachable for longer than Outage. A request the host has not
// answered within RequestTimeout (a third of the lease once a claim has
// told it, so a stalled host costs a fraction of a lease) counts as such
// a failure. BaseURL may list several hosts that share one database,
// comma-separated, the first being this worker's own: a failure moves the
// next attempt to another host, picked at random so that workers whose
// host fails spread over the rest, and homeReturn after leaving its own it
// tries its own again. Since claims and outcomes live in the database, the
// work carries on wherever it lands.
type Client struct {
	BaseURL string
	Token   string
	PID     int
	Outage  time.Duration
	HTTP    *http.Client
	Log     *slog.Logger
	// Now is the clock for returning to its own host; nil is time.Now.
	Now func() time.Time
	// MaxThrottle bounds how long one call waits out 429s in all before
	// returning the last as its error; 0 waits as long as the host asks.
	MaxThrottle time.Duration

	hostIdx   atomic.Int64
	awaySince atomic.Int64 // unix nanos of the last move away from its own host; 0 at home
	timeout   atomic.Int64 // RequestTimeout in nanoseconds; 0 for DefaultRequestTimeout
}

// Request timeouts: DefaultRequestTimeout until a claim says how long a
// lease is, then a third of the lease within these bounds.
const (
	DefaultRequestTimeout = 10 * time.Second
	minRequestTimeout     = 2 * time.Second
	maxRequestTimeout     = 30 * time.Second
	// homeReturn is how long a worker that left its own host works
	// elsewhere before trying its own again.
	homeReturn = 5 * time.Second
)

func (c *Client) now() time.Time {
	if c.Now != nil {
		return c.Now()
	}
	return time.Now()
}

// SetLease derives the request timeout from a claim's lease.
func (c *Client) SetLease(lease time.Duration) {
	c.timeout.Store(int64(min(max(lease/3, minRequestTimeout), maxRequestTimeout)))
}

// RequestTimeout is how long one request may go unanswered.
func (c *Client) RequestTimeout() time.Duration {
	if d := c.timeout.Load(); d > 0 {
		return time.Duration(d)
	}
	return DefaultRequestTimeout
}

// attemptTimeout is how long a request sent at sent may go unanswered: the
// request timeout, and no further than the end of the outage window (from
// outageStart, or from sent for the first), so a host that never answers
// is given up on after Outage, not after Outage plus a request timeout.
func (c *Client) attemptTimeout(sent, outageStart time.Time) time.Duration {
	timeout := c.RequestTimeout()
	if c.Outage <= 0 {
		return timeout
	}
	from := outageStart
	if from.IsZero() {
		from = sent
	}
	return min(timeout, max(c.Outage-sent.Sub(from), 50*time.Millisecond))
}

// Response is a successful answer.
type Response struct {
	Body     []byte
	Replayed bool
}

// Do sends one request, retrying transport failures and 5xx answers with the
// same body. The same body matters for publications: a retry carries the
// same operation key, so a lost acknowledgement is recovered, never redone.
func (c *Client) Do(ctx context.Context, method, path string, body any) (Response, error) {
	var payload []byte
	if body != nil {
		var err error
		if payload, err = client.Encode(body); err != nil {
			return Response{}, err
		}
	}
	pauses := retry.New(100*time.Millisecond, 2*time.Second)
	var outageStart time.Time
	var throttled time.Duration
	for attempt := 1; ; attempt++ {
		sent := time.Now()
		resp, err := c.once(ctx, method, path, payload, attempt > 1, c.attemptTimeout(sent, outageStart))
		if err == nil {
			return resp, nil
		}
		var api *client.Error
		if errors.As(err, &api) && api.Status == http.StatusTooManyRequests {
			// The host is up and asks this credential to slow down: wait
			// as it says, without counting it as an outage.
			wait := throttle(api.RetryAfter)
			if throttled += wait; c.MaxThrottle > 0 && throttled > c.MaxThrottle {
				return Response{}, err
			}
			c.Log.Warn("rate limited", "method", method, "path", path, "retry_after", wait.String())
			if err := sleep(ctx, wait); err != nil {
				return Response{}, err
			}
			continue
		}
		if err := c.retryable(ctx, api, err); err != nil {
			return Response{}, err
		}
		if outageStart.IsZero() {
			outageStart = sent // the outage began when the unanswered request went out
		}
		c.failover()
		if time.Since(outageStart) > c.Outage {
			return Response{}, fmt.Errorf("%s %s: host unreachable for over %s: %w", method, path, c.Outage, err)
		}
		c.Log.Warn("retrying", "method", method, "path", path, "attempt", attempt, "err", err.Error())
		if err := sleep(ctx, pauses.NextBackOff()); err != nil {
			return Response{}, err
		}
	}
}

// retryable is nil when a failed attempt may be sent again, else the error
// to answer: any 4xx but 408 is final (a 408 is a body the host did not get
// in time, which the same request, the same operation key, may repeat), as
// are a host certificate not trusted and the caller giving up.
func (c *Client) retryable(ctx context.Context, api *client.Error, err error) error {
	if api != nil && api.Status < 500 && api.Status != http.StatusRequestTimeout {
		return err
	}
	if errors.As(err, new(*client.CertificateError)) {
		return err // the same certificate again: only the operator can help
	}
	return ctx.Err()
}

// sleep waits d, or less when ctx ends (its error).
func sleep(ctx context.Context, d time.Duration) error {
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(d):
		return nil
	}
}

// throttle is how long to wait on a 429: its Retry-After, at least 100 ms
// and at most 30 s (a host that asks for longer is waited on in steps).
func throttle(retryAfter string) time.Duration {
	secs, err := strconv.Atoi(strings.TrimSpace(retryAfter))
	if err != nil || secs < 0 {
		return time.Second
	}
	return min(max(time.Duration(secs)*time.Second, 100*time.Millisecond), 30*time.Second)
}

func (c *Client) hosts() []string { return strings.Split(c.BaseURL, ",") }

func (c *Client) base() string {
	hosts := c.hosts()
	if away := c.awaySince.Load(); away != 0 && c.now().Sub(time.Unix(0, away)) > homeReturn &&
		c.awaySince.CompareAndSwap(away, 0) {
		c.hostIdx.Store(0)
		c.Log.Info("returning to its own host", "host", strings.TrimSpace(hosts[0]))
	}
	return strings.TrimRight(strings.TrimSpace(hosts[c.hostIdx.Load()%int64(len(hosts))]), "/")
}

// failover turns to another host at random, if there is more than one.
func (c *Client) failover() {
	n := int64(len(c.hosts()))
	if n < 2 {
		return
	}
	next := (c.hostIdx.Load()%n + 1 + rand.Int64N(n-1)) % n
	c.hostIdx.Store(next)
	if next == 0 {
		c.awaySince.Store(0)
	} else {
		c.awaySince.Store(c.now().UnixNano())
	}
	c.Log.Warn("failing over", "host", c.base())
}

// once sends the request; repeat marks it as sent before (Fleet-Repeat),
// its answer having not arrived.
func (c *Client) once(ctx context.Context, method, path string, payload []byte, repeat bool, timeout time.Duration) (Response, error) {
	var body any
	if payload != nil {
		body = payload
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	header := http.Header{"Fleet-Worker-Pid": {strconv.Itoa(c.PID)}}
	if repeat {
		header.Set(wire.HeaderRepeat, "true")
	}
	resp, err := client.Do(ctx, c.HTTP, c.base(), c.Token, method, path, body, header)
	if err != nil {
		return Response{}, err
	}
	return Response{Body: resp.Body, Replayed: resp.Header.Get("Idempotent-Replayed") == "true"}, nil
}
