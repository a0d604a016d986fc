// Package tracing is Fleet's OpenTelemetry setup: off unless the standard
// OTEL_* variables ask for it, then spans exported over OTLP/HTTP and W3C
// trace context carried on every call between a worker and the host, so
// one job is one trace from the worker's call to the host's commit.
package tracing

import (
	"context"
	"errors"
	"net/http"
	"os"
	"strings"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.26.0"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
)

// Name is the instrumentation scope of Fleet's own spans.
const Name = "github.com/fleet/fleet"

// Attribute keys on Fleet's spans.
const (
	OperationID  = attribute.Key("fleet.operation_id")
	OperationIDs = attribute.Key("fleet.operation_ids") // a batch's
	ClaimID      = attribute.Key("fleet.claim_id")
	Generation   = attribute.Key("fleet.generation")
	Worker       = attribute.Key("fleet.worker")
)

// Requested reports whether the environment asks for traces: an OTLP
// endpoint, or OTEL_TRACES_EXPORTER=otlp, and not OTEL_SDK_DISABLED=true.
func Requested() bool {
	if strings.EqualFold(os.Getenv("OTEL_SDK_DISABLED"), "true") {
		return false
	}
	if e := os.Getenv("OTEL_TRACES_EXPORTER"); e != "" {
		return strings.EqualFold(e, "otlp")
	}
	return os.Getenv("OTEL_EXPORTER_OTLP_ENDPOINT") != "" || os.Getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") != ""
}

// Setup installs an OTLP/HTTP exporter (configured by the OTEL_EXPORTER_OTLP_*
// variables) and the W3C propagators when Requested, naming the service
// service unless OTEL_SERVICE_NAME does; otherwise it changes nothing and
// tracing stays off. The returned function flushes and stops the exporter.
func Setup(ctx context.Context, service string) (shutdown func(context.Context) error, err error) {
	if !Requested() {
		return func(context.Context) error { return nil }, nil
	}
	exporter, err := otlptracehttp.New(ctx)
	if err != nil {
		return nil, errors.Join(errors.New("tracing: the OTLP exporter"), err)
	}
	return Install(sdktrace.NewBatchSpanProcessor(exporter), service), nil
}

// Install makes spans go to processor (tests pass a synchronous one with
// an in-memory exporter) and trace context travel as W3C headers.
func Install(processor sdktrace.SpanProcessor, service string) func(context.Context) error {
	if s := os.Getenv("OTEL_SERVICE_NAME"); s != "" {
		service = s
	}
	res, _ := resource.Merge(resource.Default(), resource.NewSchemaless(semconv.ServiceName(service)))
	provider := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(processor), sdktrace.WithResource(res))
	otel.SetTracerProvider(provider)
	otel.SetTextMapPropagator(propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{}))
	on.Store(true)
	return func(ctx context.Context) error {
		on.Store(false)
		return provider.Shutdown(ctx)
	}
}

// Tracer is Fleet's tracer (a no-op one while tracing is off).
func Tracer() trace.Tracer { return otel.Tracer(Name) }

// Start starts a span of Fleet's own, with the attributes With put in
// ctx and attrs.
func Start(ctx context.Context, name string, attrs ...attribute.KeyValue) (context.Context, trace.Span) {
	if !on.Load() {
		return ctx, noop.Span{} // nothing to record, and ending it ends no one else's
	}
	if held, ok := ctx.Value(attrsKey{}).([]attribute.KeyValue); ok {
		attrs = append(held[:len(held):len(held)], attrs...)
	}
	return Tracer().Start(ctx, name, trace.WithAttributes(attrs...))
}

type attrsKey struct{}

// With carries attributes in ctx for the spans Start starts below it (the
// operation id and claim a host method was called with, say, for the span
// its transaction starts).
func With(ctx context.Context, attrs ...attribute.KeyValue) context.Context {
	if !on.Load() {
		return ctx
	}
	if held, ok := ctx.Value(attrsKey{}).([]attribute.KeyValue); ok {
		attrs = append(held[:len(held):len(held)], attrs...)
	}
	return context.WithValue(ctx, attrsKey{}, attrs)
}

// Enabled reports whether spans are being recorded.
func Enabled() bool { return on.Load() }

// End ends span, recording err (a refusal included) as its status.
func End(span trace.Span, err error) {
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	}
	span.End()
}

// Since records, in ctx's trace, a span named name from since to now,
// ended with err: a request's own span for work another request ran for
// it (a combined transaction), which has its own span in that request's
// trace.
func Since(ctx context.Context, name string, since time.Time, err error, attrs ...attribute.KeyValue) {
	if !Enabled() {
		return
	}
	_, span := Tracer().Start(ctx, name, trace.WithTimestamp(since), trace.WithAttributes(attrs...))
	End(span, err)
}

// Handler wraps a server's handler so that each request is a span, a child
// of the caller's when its headers carry trace context; as it is while
// tracing is off, costing nothing.
func Handler(h http.Handler, operation string) http.Handler {
	if !on.Load() {
		return h
	}
	return otelhttp.NewHandler(h, operation)
}

// Transport wraps a client's transport so that each call is a span and
// carries the trace context; as it is while tracing is off.
func Transport(rt http.RoundTripper) http.RoundTripper {
	if !on.Load() {
		return rt
	}
	if rt == nil {
		rt = http.DefaultTransport
	}
	return otelhttp.NewTransport(rt)
}

// on says whether Install ran (and its shutdown did not).
var on atomic.Bool
