// Package worker is a fleet worker: it claims jobs from the host, asks for
// admission, heartbeats while it computes, and publishes through the
// resource, retrying through host restarts with the same operation key.
package worker

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
)

// APIError is a 4xx answer from the host: final, never retried.
type APIError struct {
	Status  int
	Code    string
	Message string
}

func (e *APIError) Error() string { return fmt.Sprintf("%d %s: %s", e.Status, e.Code, e.Message) }

// IsCode reports whether err is an APIError with the code.
func IsCode(err error, code string) bool {
	var e *APIError
	return errors.As(err, &e) && e.Code == code
}

// Client calls the host, riding through outages: a refused connection, a
// dropped response or a 5xx is retried with bounded backoff until the host
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
		if payload, err = json.Marshal(body); err != nil {
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
		var api *APIError
		if errors.As(err, &api) && api.Status < 500 {
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
	var body io.Reader
	if payload != nil {
		body = bytes.NewReader(payload)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.base()+path, body)
	if err != nil {
		return Response{}, err
	}
	req.Header.Set("Authorization", "Bearer "+c.Token)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Fleet-Worker-Pid", strconv.Itoa(c.PID))
	resp, err := c.HTTP.Do(req)
	if err != nil {
		return Response{}, err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		return Response{}, err
	}
	if resp.StatusCode >= 400 {
		var e struct {
			Error struct{ Code, Message string } `json:"error"`
		}
		json.Unmarshal(data, &e)
		return Response{}, &APIError{Status: resp.StatusCode, Code: e.Error.Code, Message: e.Error.Message}
	}
	return Response{Body: data, Replayed: resp.Header.Get("Idempotent-Replayed") == "true"}, nil
}
