package httpapi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/fleet/fleet/internal/fleet"
	"github.com/fleet/fleet/internal/wire"
)

func afterParam(c echo.Context) (int64, error) {
	v := c.QueryParam("after")
	if v == "" {
		return 0, nil
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n < 0 {
		return 0, fleet.Errorf(wire.CodeInvalid, "after must be a non-negative integer")
	}
	return n, nil
}

const eventPage = 1000

// events is GET /admin/events: the oldest page after `after`, or, with
// `before`, `kind` or `job`, the newest page in (after, before) of that
// kind and job, read back through the log's indexes.
func (s *Server) events(c echo.Context) error {
	after, err := afterParam(c)
	if err != nil {
		return err
	}
	f := wire.EventQuery{After: after, Before: math.MaxInt64, Kind: wire.EventKind(c.QueryParam("kind")),
		Job: c.QueryParam("job"), Limit: eventPage}
	if v := c.QueryParam("before"); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < 1 {
			return fleet.Errorf(wire.CodeInvalid, "before must be a positive integer, got %.20q", v)
		}
		f.Before = n
	}
	if f.Job != "" {
		if _, err := canonicalOperationID(f.Job); err != nil {
			return err
		}
	}
	if f.Kind != "" && !slices.Contains(wire.EventKinds, f.Kind) {
		return fleet.Errorf(wire.CodeInvalid, "kind %.40q is not an event kind; the kinds are %s", f.Kind, joinKinds())
	}
	if v := c.QueryParam("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > eventPage {
			return fleet.Errorf(wire.CodeInvalid, "limit must be 1 to %d, got %.20q", eventPage, v)
		}
		f.Limit = n
	}
	ctx := c.Request().Context()
	var evs []wire.Event
	if c.QueryParam("before") == "" && f.Kind == "" && f.Job == "" {
		evs, err = s.host.Views().Events(ctx, after, f.Limit)
	} else {
		evs, err = s.host.Views().FindEvents(ctx, f)
	}
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, wire.EventPage{Events: evs})
}

func joinKinds() string {
	kinds := make([]string, len(wire.EventKinds))
	for i, k := range wire.EventKinds {
		kinds[i] = string(k)
	}
	return strings.Join(kinds, ", ")
}

// eventStream is GET /admin/events as Server-Sent Events: every event after
// `after` (or Last-Event-ID), then each new one as it commits. It ends when
// the client goes, when the credential it was opened with is rotated or
// revoked (checked every credentialRecheck, so within the second the token
// stops working), or when a newer stream displaces it (streams.hold).
// streamEvery bounds how often an event stream reads the log: events reach
// a follower at most this late, in batches.
const (
	streamEvery       = 100 * time.Millisecond
	credentialRecheck = 200 * time.Millisecond
)

func (s *Server) eventStream(c echo.Context) error {
	after, err := afterParam(c)
	if err != nil {
		return err
	}
	if id := c.Request().Header.Get("Last-Event-ID"); id != "" {
		if n, err := strconv.ParseInt(id, 10, 64); err == nil && n > after {
			after = n
		}
	}
	st := eventStreamer{s: s, ctx: c.Request().Context(), caller: callerOf(c), w: c.Response(), after: after}
	st.w.Header().Set("Content-Type", "text/event-stream")
	st.w.Header().Set("Cache-Control", "no-cache")
	st.w.WriteHeader(http.StatusOK)
	st.keepAlive = time.NewTicker(15 * time.Second)
	defer st.keepAlive.Stop()
	st.recheck = time.NewTicker(credentialRecheck)
	defer st.recheck.Stop()
	var lastRead time.Time
	for {
		// A busy host commits hundreds of times a second: read at most
		// every streamEvery and send what committed meanwhile together,
		// rather than one read and one write per commit per stream.
		if wait := streamEvery - time.Since(lastRead); wait > 0 {
			select {
			case <-st.ctx.Done():
				return st.ended()
			case <-time.After(wait):
			}
		}
		if !st.inForce() {
			return nil
		}
		lastRead = time.Now()
		changed := s.host.Changed()
		full, err := st.sendPage()
		if err != nil {
			return st.ended() // the stream is already committed; the client reconnects
		}
		if full {
			continue
		}
		if open := st.waitForChange(changed); !open {
			return nil
		}
	}
}

// eventStreamer is one open event stream.
type eventStreamer struct {
	s                  *Server
	ctx                context.Context
	caller             fleet.Caller
	w                  *echo.Response
	after              int64
	keepAlive, recheck *time.Ticker
}

// ended says why the host ends the stream, as an SSE comment (no event
// a client would take for the log's).
func (st *eventStreamer) ended() error {
	if errors.Is(context.Cause(st.ctx), errStreamDisplaced) {
		fmt.Fprintf(st.w, ": closed: more than %d event streams were open, and this was the oldest\n\n", st.s.streams.limit)
		st.w.Flush()
	}
	return nil
}

// inForce is whether the stream's credential still holds; when it does
// not, the stream says so before it closes.
func (st *eventStreamer) inForce() bool {
	if _, err := st.s.host.Access().InForce(st.ctx, st.caller); fleet.ErrorCode(err) == wire.CodeUnauthorized {
		fmt.Fprint(st.w, ": closed: the credential this stream was opened with was rotated or revoked\n\n")
		st.w.Flush()
		return false
	}
	return true
}

// sendPage sends the events after the last sent, a page at most; full
// says a whole page went, so more may be waiting.
func (st *eventStreamer) sendPage() (full bool, err error) {
	evs, err := st.s.host.Views().Events(st.ctx, st.after, eventPage)
	if err != nil {
		return false, err
	}
	for _, e := range evs {
		data, _ := json.Marshal(e)
		fmt.Fprintf(st.w, "id: %d\nevent: %s\ndata: %s\n\n", e.Sequence, e.Kind, data)
		st.after = e.Sequence
	}
	st.w.Flush()
	return len(evs) == eventPage, nil
}

// waitForChange waits for the next commit, rechecking the credential and
// keeping the connection alive meanwhile; open is false when the stream
// has ended.
func (st *eventStreamer) waitForChange(changed <-chan struct{}) (open bool) {
	for {
		select {
		case <-st.ctx.Done():
			st.ended()
			return false
		case <-changed:
			return true
		case <-st.recheck.C:
			if !st.inForce() {
				return false
			}
		case <-st.keepAlive.C:
			fmt.Fprint(st.w, ": keep-alive\n\n")
			return true
		}
	}
}
