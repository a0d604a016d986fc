// Package worker is a fleet worker: it claims jobs from the host, asks for
// admission, heartbeats while it computes, and publishes through the
// resource, retrying through host restarts with the same operation key.
package worker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/fleet/fleet/internal/client"
)

// Client calls the host, riding through outages: a refused connection, a
// dropped response, a 408 or a 5xx is retried with bounded backoff until the host
// has been unreachable for longer than Outage. BaseURL may list several
// hosts that share one database, comma-separated: a failure moves the next
// attempt to the next host, and since claims and outcomes live in the
// database, the work carries on there.
type Client struct {
	BaseURL string
	Token   string
	hostIdx atomic.Int64
	PID     int
	Outage  time.Duration
	HTTP    *http.Client
	Log     *slog.Logger
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
	backoff := 100 * time.Millisecond
	var outageStart time.Time
	for attempt := 1; ; attempt++ {
		resp, err := c.once(ctx, method, path, payload)
		if err == nil {
			return resp, nil
		}
		var api *client.Error
		if errors.As(err, &api) && api.Status == http.StatusTooManyRequests {
			// The host is up and asks this credential to slow down: wait
			// as it says, without counting it as an outage.
			wait := throttle(api.RetryAfter)
			c.Log.Warn("rate limited", "method", method, "path", path, "retry_after", wait.String())
			select {
			case <-ctx.Done():
				return Response{}, ctx.Err()
			case <-time.After(wait):
			}
			continue
		}
		// Final: any other 4xx but 408, a body the host did not get in
		// time, which the same request (the same operation key) may repeat.
		if errors.As(err, &api) && api.Status < 500 && api.Status != http.StatusRequestTimeout {
			return Response{}, err
		}
		if ctx.Err() != nil {
			return Response{}, ctx.Err()
		}
		if outageStart.IsZero() {
			outageStart = time.Now()
		}
		c.failover()
		if time.Since(outageStart) > c.Outage {
			return Response{}, fmt.Errorf("%s %s: host unreachable for over %s: %w", method, path, c.Outage, err)
		}
		c.Log.Warn("retrying", "method", method, "path", path, "attempt", attempt, "err", err.Error())
		select {
		case <-ctx.Done():
			return Response{}, ctx.Err()
		case <-time.After(backoff):
		}
		backoff = min(backoff*2, 2*time.Second)
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
	return strings.TrimRight(strings.TrimSpace(hosts[c.hostIdx.Load()%int64(len(hosts))]), "/")
}

// failover turns to the next host, if there is more than one.
func (c *Client) failover() {
	if len(c.hosts()) > 1 {
		c.hostIdx.Add(1)
		c.Log.Warn("failing over", "host", c.base())
	}
}

func (c *Client) once(ctx context.Context, method, path string, payload []byte) (Response, error) {
	var body any
	if payload != nil {
		body = payload
	}
	resp, err := client.Do(ctx, c.HTTP, c.base(), c.Token, method, path, body,
		http.Header{"Fleet-Worker-Pid": {strconv.Itoa(c.PID)}})
	if err != nil {
		return Response{}, err
	}
	return Response{Body: resp.Body, Replayed: resp.Header.Get("Idempotent-Replayed") == "true"}, nil
}
