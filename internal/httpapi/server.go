// Package httpapi is the host's HTTP API on echo. It is
// the trusted adapter: it establishes the caller from the bearer credential
// and hands it to the host separately from any request body.
package httpapi

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/labstack/echo/v4"
	semconv "go.opentelemetry.io/otel/semconv/v1.26.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/fleet/fleet/internal/fleet"
	"github.com/fleet/fleet/internal/host"
	"github.com/fleet/fleet/internal/host/access"
	"github.com/fleet/fleet/internal/host/claims"
	"github.com/fleet/fleet/internal/resource"
	"github.com/fleet/fleet/internal/wire"
)

// MaxBodyBytes is the largest request body accepted: room for a
// publication whose canonical body is at the limit, as any JSON encoder
// may send it (Go's writes U+2028 and U+2029, 3 bytes each, as 6-byte
// escapes that canonical JSON does not use), and its envelope.
const MaxBodyBytes = 2*wire.MaxPublishBodyBytes + 4<<10

// statusOf is the one table from error codes to HTTP statuses.
var statusOf = map[wire.Code]int{
	wire.CodeInvalid:            http.StatusBadRequest,
	wire.CodeBodyTooLarge:       http.StatusRequestEntityTooLarge,
	wire.CodeUnauthorized:       http.StatusUnauthorized,
	wire.CodeForbidden:          http.StatusForbidden,
	wire.CodeNotFound:           http.StatusNotFound,
	wire.CodeStaleClaim:         http.StatusConflict,
	wire.CodeOperationConflict:  http.StatusConflict,
	wire.CodeAssignmentConflict: http.StatusConflict,
	wire.CodeAllowanceConflict:  http.StatusConflict,
	wire.CodeStateConflict:      http.StatusConflict,
	wire.CodeStillRunning:       http.StatusConflict,
	wire.CodeRateLimited:        http.StatusTooManyRequests,
	wire.CodeRequestTimeout:     http.StatusRequestTimeout,
	wire.CodeUnavailable:        http.StatusServiceUnavailable,
	wire.CodeInternal:           http.StatusInternalServerError,
}

const (
	ctxCaller = "fleet.caller"
	// HeaderWorkerPID lets a worker name its process in the event log.
	HeaderWorkerPID = "Fleet-Worker-Pid"
	// HeaderReplayed marks a publication answered from its retained outcome.
	HeaderReplayed = "Idempotent-Replayed"
)

// Server serves a host.
type Server struct {
	host         *host.Host
	log          *slog.Logger
	echo         *echo.Echo
	sessions     sessions
	consoleHosts map[string]bool
	routes       map[string]bool // registered route templates: the metrics' route label

	slots   *slots          // authenticated requests in flight
	streams *streams        // open event streams, apart from the slots
	signIns *signInThrottle // failed console sign-ins, by address and in all
	rates   *rates          // per worker credential; nil when unlimited
	bodies  *bodyMemory     // what the bodies being served hold, in all

	bodyTimeout time.Duration // from the caller being known to the body's last byte
}

// New builds the routes under limits (see Limits): over them a request is
// 503 unavailable or 429 rate_limited, with Retry-After, so neither a
// flood nor slow clients can exhaust the host's memory or its connections
// to the database, and no caller without a credential holds a slot others
// need.
func New(h *host.Host, log *slog.Logger, limits Limits) *Server {
	e := echo.New()
	e.HideBanner, e.HidePort = true, true
	e.JSONSerializer = listSerializer{}
	s := &Server{host: h, log: log, echo: e, consoleHosts: map[string]bool{},
		slots:   newSlots(limits.MaxInFlight, limits.PerCredential, "requests"),
		streams: newStreams(limits.Streams),
		signIns: newSignInThrottle(limits.SignInPerAddress, limits.SignInPerHost),
		rates:   newRates(limits.WorkerRate, limits.WorkerBurst), bodyTimeout: limits.BodyTimeout,
		bodies: newBodyMemory(limits.BodyMemory)}
	s.streams.onClose, s.streams.onCount = h.Metrics().StreamClosed, h.Metrics().StreamsOpen
	s.bodies.onRefuse = func() { h.Metrics().Refused("memory") }
	e.HTTPErrorHandler = s.handleError
	e.Use(s.observe, bodyDeadline(limits.BodyTimeout))

	e.GET("/healthz", func(c echo.Context) error { return c.JSON(http.StatusOK, map[string]string{"status": "ok"}) })
	e.GET("/trusted-kernel.json", func(c echo.Context) error {
		return c.JSON(http.StatusOK, h.TrustedKernel())
	})

	s.routeConsole(e)
	e.GET("/metrics", echo.WrapHandler(h.Metrics().Handler()), s.authenticate(access.RoleOperator))

	// An event stream lives as long as its client: it holds a place among
	// the streams, never a request slot the operator's requests need.
	e.GET("/admin/events/stream", s.eventStream, s.authenticateHolding(access.RoleOperator, s.streams.hold))

	w := e.Group("/v1", s.authenticate(access.RoleWorker))
	w.POST("/claims", s.claim)
	w.POST("/jobs/:op/dispatch", s.dispatch)
	w.POST("/jobs/:op/heartbeat", s.heartbeat)
	w.POST("/jobs/:op/publish", s.publish)
	w.POST("/jobs/:op/fail", s.fail)
	w.POST("/jobs/:op/release", s.release)
	w.POST("/dispatches", s.dispatches)
	w.POST("/heartbeats", s.heartbeats)
	w.POST("/publications", s.publications)
	w.POST("/failures", s.failures)
	w.GET("/documents/:id", s.document)

	a := e.Group("/admin", s.authenticate(access.RoleOperator))
	a.GET("/snapshot", s.snapshot)
	a.GET("/stats", s.stats)
	a.GET("/jobs", s.jobPage)
	a.GET("/jobs/:op", s.job)
	a.POST("/reports", s.reports)
	a.GET("/reports/:key", s.report)
	s.scheduleRoutes(a)
	a.POST("/reports/:key/cancel", s.cancelReport)
	a.POST("/jobs/bulk", s.bulk)
	a.POST("/jobs/:op/cancel", s.cancel)
	a.POST("/jobs/:op/reconcile", s.reconcile)
	a.POST("/jobs/:op/requeue", s.requeue)
	a.POST("/documents/:id/assign", s.assign)
	a.POST("/allowance", s.allowance)
	a.GET("/tenants", s.tenants)
	a.POST("/tenants", s.addTenant)
	a.POST("/tenants/:name/allowance", s.tenantAllowance)
	a.POST("/tenants/:name/weight", s.tenantWeight)
	a.GET("/events", s.events)
	a.GET("/receipts/:id", s.receipt)
	a.GET("/receipts/:id/verification", s.receiptCheck)
	a.GET("/credentials", s.credentials)
	a.GET("/workers", func(c echo.Context) error { return reply(c)(s.host.Views().Workers(c.Request().Context())) })
	a.GET("/series", s.series)
	a.POST("/credentials", s.addCredential)
	a.POST("/claims/pause", s.pauseClaims)
	a.POST("/claims/resume", s.resumeClaims)
	a.POST("/credentials/:name/revoke", s.changeCredential(s.host.Access().Revoke))
	a.POST("/credentials/:name/rotate", s.changeCredential(s.host.Access().Rotate))
	s.routes = map[string]bool{}
	for _, r := range e.Routes() {
		s.routes[r.Path] = true
	}
	return s
}

// Handler is the HTTP handler.
func (s *Server) Handler() http.Handler { return s.echo }

func (s *Server) handleError(err error, c echo.Context) {
	if c.Response().Committed {
		return
	}
	code, msg := fleet.ErrorCode(err), fleet.ErrorMessage(err)
	var he *echo.HTTPError
	if errors.As(err, &he) {
		switch he.Code {
		case http.StatusNotFound:
			code, msg = wire.CodeNotFound, "no such route"
		case http.StatusMethodNotAllowed:
			code, msg = wire.CodeInvalid, "method not allowed on this route"
		default:
			code, msg = wire.CodeInvalid, fmt.Sprint(he.Message)
		}
	}
	status := statusFor(code)
	if status >= 500 {
		s.log.Error("request failed", "method", c.Request().Method, "path", c.Request().URL.Path, "err", err)
	}
	c.JSON(status, wire.ErrorBody{Error: wire.ErrorDetail{Code: code, Message: msg}})
}

// statusFor is the HTTP status of an error code.
func statusFor(code wire.Code) int {
	if status, ok := statusOf[code]; ok {
		return status
	}
	return http.StatusInternalServerError
}

// authenticate requires a bearer credential of the given role: none or an
// unknown one is 401, the other role's is 403. Operator routes also take
// the console's session cookie, with its Host and Origin checks.
func (s *Server) authenticate(role string) echo.MiddlewareFunc {
	return s.authenticateHolding(role, s.holdSlot)
}

// authenticateHolding is authenticate with the request served while hold
// gives it its place: a request slot, or for an event stream a stream's.
func (s *Server) authenticateHolding(role string, hold func(echo.Context, fleet.Caller) (func(), error)) echo.MiddlewareFunc {
	return func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c echo.Context) error {
			token, ok := strings.CutPrefix(c.Request().Header.Get("Authorization"), "Bearer ")
			if !ok && role == access.RoleOperator {
				caller, present, err := s.sessionCaller(c)
				if err != nil {
					return err
				}
				if present {
					return s.serveAs(c, caller, role, next, hold)
				}
			}
			if !ok || strings.TrimSpace(token) == "" {
				return fleet.Errorf(wire.CodeUnauthorized, "an Authorization: Bearer credential is required")
			}
			caller, got, err := s.host.Access().Authenticate(c.Request().Context(), strings.TrimSpace(token))
			if err != nil {
				return err
			}
			if got != role {
				return fleet.Errorf(wire.CodeForbidden, "a %s credential cannot call %s routes", got, role)
			}
			return s.serveAs(c, caller, role, next, hold)
		}
	}
}

// serveAs serves an authenticated request in the place hold gives it, once
// its worker credential is within its rate.
func (s *Server) serveAs(c echo.Context, caller fleet.Caller, role string, next echo.HandlerFunc,
	hold func(echo.Context, fleet.Caller) (func(), error)) error {
	if role == access.RoleWorker {
		if err := s.rates.allow(c, caller.ID); err != nil {
			s.host.Metrics().Refused("rate_limited")
			return err
		}
	}
	release, err := hold(c, caller)
	if err != nil {
		return err
	}
	defer release()
	defer s.bodies.chargeBodies(c)()
	setBodyDeadline(c, s.bodyTimeout)
	c.Set(ctxCaller, caller)
	return next(c)
}

// holdSlot holds one of the caller's credential's request slots.
func (s *Server) holdSlot(c echo.Context, caller fleet.Caller) (func(), error) {
	release, err := s.slots.take(c, caller.ID)
	if err != nil {
		s.host.Metrics().Refused("busy")
	}
	return release, err
}

// observe records each request's duration by route template (not the raw
// path, whose ids would make every request its own series).
func (s *Server) observe(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		started := time.Now()
		err := next(c)
		if err != nil {
			c.Error(err) // write the error response now, so its status is known
		}
		// Labels take values from fixed sets only: a caller without a
		// credential chooses the method and path, and each new value
		// would be a series kept for the host's lifetime.
		route := c.Path()
		if !s.routes[route] {
			route = "unmatched"
		}
		method := c.Request().Method
		if !knownMethods[method] {
			method = "other"
		}
		if span := trace.SpanFromContext(c.Request().Context()); span.IsRecording() {
			span.SetName(method + " " + route) // the route template, never the caller's path
			span.SetAttributes(semconv.HTTPRoute(route))
		}
		took := time.Since(started)
		s.host.Metrics().Request(route, method, strconv.Itoa(c.Response().Status), took)
		if kind := seriesKinds[route]; kind != "" && c.Response().Status == http.StatusOK {
			s.host.Series().Observe(kind, took)
		}
		return nil
	}
}

// seriesKinds are the routes whose latency the console charts: a batch
// call's is what each of its items waited, so it counts as its kind's
// (a worker with --slots above 1 sends its dispatches and publications so).
var seriesKinds = map[string]string{"/v1/claims": "claim", "/v1/jobs/:op/dispatch": "dispatch", "/v1/jobs/:op/publish": "publish",
	"/v1/dispatches": "dispatch", "/v1/publications": "publish"}

var knownMethods = map[string]bool{
	http.MethodGet: true, http.MethodHead: true, http.MethodPost: true, http.MethodPut: true,
	http.MethodPatch: true, http.MethodDelete: true, http.MethodOptions: true,
}

func callerOf(c echo.Context) fleet.Caller { return c.Get(ctxCaller).(fleet.Caller) }

// reply is a handler's answer: v as 200 JSON, or err for the error
// handler. Handlers call it as reply(c)(s.host.Operation(…)).
func reply(c echo.Context) func(v any, err error) error {
	return func(v any, err error) error {
		if err != nil {
			return err
		}
		return c.JSON(http.StatusOK, v)
	}
}

// claim leases one job, or with {"max": N} up to N; with "admit" it
// admits them too.
func (s *Server) claim(c echo.Context) error {
	data, err := readBody(c)
	if err != nil {
		return err
	}
	max := 1
	var req wire.ClaimRequest
	if len(bytes.TrimSpace(data)) > 0 {
		if err := resource.DecodeStrict(data, &req); err != nil {
			return err
		}
		if req.Max != nil {
			max = *req.Max
		}
		if id, err := uuid.Parse(req.Key); req.Key != "" && (err != nil || id.String() != req.Key) {
			return fleet.Errorf(wire.CodeInvalid, "key %.80q is not a canonical UUID", req.Key)
		}
	}
	pid, _ := strconv.Atoi(c.Request().Header.Get(HeaderWorkerPID))
	repeat, err := repeatHeader(c)
	if err != nil {
		return err
	}
	return reply(c)(s.host.Claims().Take(c.Request().Context(), callerOf(c),
		claims.Ask{Max: max, Key: req.Key, Repeat: repeat, Admit: req.Admit, WorkerPID: pid}))
}

// claimCall reads what dispatch and heartbeat share: the operation id and
// the presented claim.
func claimCall(c echo.Context) (string, wire.ClaimRef, error) {
	op, err := operationID(c)
	if err != nil {
		return "", wire.ClaimRef{}, err
	}
	ref, err := decodeClaimRef(c)
	return op, ref, err
}

func (s *Server) dispatch(c echo.Context) error {
	op, ref, err := claimCall(c)
	if err != nil {
		return err
	}
	raw, err := s.host.Admission().Dispatch(c.Request().Context(), callerOf(c), op, ref)
	if err != nil {
		return err
	}
	return c.JSONBlob(http.StatusOK, raw)
}

func (s *Server) release(c echo.Context) error {
	op, ref, err := claimCall(c)
	if err != nil {
		return err
	}
	return reply(c)(s.host.Claims().Release(c.Request().Context(), callerOf(c), op, ref))
}

func (s *Server) heartbeat(c echo.Context) error {
	op, ref, err := claimCall(c)
	if err != nil {
		return err
	}
	return reply(c)(s.host.Claims().Heartbeat(c.Request().Context(), callerOf(c), op, ref))
}

func (s *Server) fail(c echo.Context) error {
	op, err := operationID(c)
	if err != nil {
		return err
	}
	var req wire.FailRequest
	if err := decode(c, &req); err != nil {
		return err
	}
	return reply(c)(s.host.Failures().Fail(c.Request().Context(), callerOf(c), op, req))
}

func (s *Server) publish(c echo.Context) error {
	op, err := operationID(c)
	if err != nil {
		return err
	}
	data, err := readBody(c)
	if err != nil {
		return err
	}
	req, err := resource.DecodePublishRequest(data)
	if err != nil {
		return err
	}
	pub, err := s.host.Publications().Publish(c.Request().Context(), callerOf(c), op, req)
	if err != nil {
		return err
	}
	if pub.AckLost && s.dropAcknowledgement(c, op) {
		return nil
	}
	if pub.Replayed {
		c.Response().Header().Set(HeaderReplayed, "true")
	}
	return c.JSONBlob(http.StatusOK, pub.Raw)
}

// dropAcknowledgement is the lost acknowledgement fault: the publication
// is committed; the connection is dropped without a response, once. It
// reports whether it was.
func (s *Server) dropAcknowledgement(c echo.Context, what string) bool {
	s.log.Warn("dropping the acknowledgement of a committed publication (lose_ack_index)", "operation_id", what)
	conn, _, err := http.NewResponseController(c.Response().Writer).Hijack()
	if err != nil {
		return false
	}
	conn.Close()
	return true
}

func (s *Server) document(c echo.Context) error {
	id, err := documentID(c)
	if err != nil {
		return err
	}
	return reply(c)(s.host.Views().Document(c.Request().Context(), callerOf(c), id))
}

func (s *Server) snapshot(c echo.Context) error {
	return reply(c)(s.host.Views().Snapshot(c.Request().Context()))
}

func (s *Server) stats(c echo.Context) error {
	return reply(c)(s.host.Views().Stats(c.Request().Context()))
}

func (s *Server) jobPage(c echo.Context) error {
	q := wire.JobPageQuery{State: wire.JobState(c.QueryParam("state")), Section: c.QueryParam("section"),
		Owner: c.QueryParam("owner"), Q: c.QueryParam("q"), After: c.QueryParam("after"), Tenant: c.QueryParam("tenant")}
	if v := c.QueryParam("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > wire.MaxJobPage {
			return fleet.Errorf(wire.CodeInvalid, "limit must be 1 to %d, got %.20q", wire.MaxJobPage, v)
		}
		q.Limit = n
	}
	if v := c.QueryParam("priority"); v != "" {
		// The range, and 0, are the view's to refuse, as for a bulk filter.
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n == 0 {
			return fleet.Errorf(wire.CodeInvalid, "priority must be %d to %d, got %.20q", wire.MinPriority, wire.MaxPriority, v)
		}
		q.Priority = n
	}
	return reply(c)(s.host.Views().JobPage(c.Request().Context(), q))
}

func (s *Server) job(c echo.Context) error {
	op, err := operationID(c)
	if err != nil {
		return err
	}
	return reply(c)(s.host.Views().Job(c.Request().Context(), op))
}

func (s *Server) reports(c echo.Context) error {
	var req wire.ReportsRequest
	if err := decode(c, &req); err != nil {
		return err
	}
	return reply(c)(s.host.Operator().SubmitReports(c.Request().Context(), req))
}

// operatorAction handles the bodiless POSTs on a job.
func (s *Server) operatorAction(c echo.Context, act func(ctx context.Context, op string) (any, error)) error {
	op, err := operationID(c)
	if err != nil {
		return err
	}
	if err := emptyBody(c); err != nil {
		return err
	}
	return reply(c)(act(c.Request().Context(), op))
}

func (s *Server) cancel(c echo.Context) error {
	return s.operatorAction(c, func(ctx context.Context, op string) (any, error) { return s.host.Operator().Cancel(ctx, op, "") })
}

func (s *Server) reconcile(c echo.Context) error {
	return s.operatorAction(c, func(ctx context.Context, op string) (any, error) { return s.host.Operator().Reconcile(ctx, op, "") })
}

func (s *Server) requeue(c echo.Context) error {
	return s.operatorAction(c, func(ctx context.Context, op string) (any, error) { return s.host.Operator().Requeue(ctx, op, "") })
}

// series serves the per-second samples after ?after= (unix seconds; all
// of the last hour without it).
func (s *Server) series(c echo.Context) error {
	var after int64
	if v := c.QueryParam("after"); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < 0 {
			return fleet.Errorf(wire.CodeInvalid, "after %.20q is not a time in unix seconds", v)
		}
		after = n
	}
	return c.JSON(http.StatusOK, map[string]any{"interval_s": 1, "samples": s.host.Series().After(after)})
}

func (s *Server) credentials(c echo.Context) error {
	list, err := s.host.Access().List(c.Request().Context())
	return reply(c)(map[string]any{"credentials": list}, err)
}

// bulk cancels or requeues the jobs a filter selects, a bounded number a
// call.
func (s *Server) bulk(c echo.Context) error {
	var req wire.BulkRequest
	if err := decode(c, &req); err != nil {
		return err
	}
	return reply(c)(s.host.Operator().Bulk(c.Request().Context(), req))
}

// pauseClaims pauses claims; the body, optional, may say why.
func (s *Server) pauseClaims(c echo.Context) error {
	data, err := readBody(c)
	if err != nil {
		return err
	}
	var req wire.ClaimsPauseRequest
	if len(bytes.TrimSpace(data)) > 0 {
		if err := resource.DecodeStrict(data, &req); err != nil {
			return err
		}
	}
	reason := ""
	if req.Reason != nil {
		reason = *req.Reason
	}
	return reply(c)(s.host.ClaimsSwitch().Pause(c.Request().Context(), reason))
}

// resumeClaims ends a pause of claims.
func (s *Server) resumeClaims(c echo.Context) error {
	if err := emptyBody(c); err != nil {
		return err
	}
	return reply(c)(s.host.ClaimsSwitch().Resume(c.Request().Context()))
}

// addCredential serves the addition of a worker credential.
func (s *Server) addCredential(c echo.Context) error {
	var req wire.CredentialAddRequest
	if err := decode(c, &req); err != nil {
		return err
	}
	if req.Name == nil {
		return fleet.Errorf(wire.CodeInvalid, "name is required")
	}
	return reply(c)(s.host.Access().Add(c.Request().Context(), *req.Name, access.Terms{Allowance: req.Allowance, Tenants: req.Tenants}))
}

// changeCredential serves a revocation or rotation of the :name credential.
func (s *Server) changeCredential(change func(ctx context.Context, name string) (wire.CredentialChange, error)) echo.HandlerFunc {
	return func(c echo.Context) error {
		if err := emptyBody(c); err != nil {
			return err
		}
		name := c.Param("name")
		if err := access.ValidateName(name); err != nil {
			return err
		}
		return reply(c)(change(c.Request().Context(), name))
	}
}

func (s *Server) assign(c echo.Context) error {
	id, err := documentID(c)
	if err != nil {
		return err
	}
	var req wire.AssignRequest
	if err := decode(c, &req); err != nil {
		return err
	}
	d, err := s.host.Operator().Assign(c.Request().Context(), id, req)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, wire.AssignResult{ID: d.ID, Version: d.Version, Generation: d.Generation, Owner: d.Owner})
}

func (s *Server) allowance(c echo.Context) error {
	var req wire.AllowanceRequest
	if err := decode(c, &req); err != nil {
		return err
	}
	return reply(c)(s.host.Operator().SetAllowance(c.Request().Context(), req))
}

func receiptParam(c echo.Context) (string, error) {
	id := c.Param("id")
	hexPart, ok := strings.CutPrefix(id, "rcpt-")
	if !ok || len(hexPart) != 64 || strings.Trim(hexPart, "0123456789abcdef") != "" {
		return "", fleet.Errorf(wire.CodeInvalid, "receipt id %.80q is not rcpt- and 64 hex digits", id)
	}
	return id, nil
}

func (s *Server) receipt(c echo.Context) error {
	id, err := receiptParam(c)
	if err != nil {
		return err
	}
	raw, err := s.host.Views().Receipt(c.Request().Context(), id)
	if err != nil {
		return err
	}
	return c.JSONBlob(http.StatusOK, raw)
}
