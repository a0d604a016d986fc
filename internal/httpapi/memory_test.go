package httpapi_test

import (
	"strings"
	"testing"

	"github.com/fleet/fleet/internal/httpapi"
)

// BenchmarkBigBodies: batch bodies at the largest size made of millions
// of small values, the shape that made the host hold some 90 times a body
// (issue 33, item 1); B/op is what one costs in allocations, most of it
// garbage (TestBodyMemoryBounded measures what a real host holds).
//
//	go test ./internal/httpapi -run '^$' -bench BigBodies -benchtime 5x
func BenchmarkBigBodies(b *testing.B) {
	th := newTestHost(b, fourSections)
	op := th.jobs[0].OperationID
	ones := strings.Repeat("1,", (httpapi.MaxBatchBodyBytes-400)/2) + "1"
	failures := `{"items":[{"operation_id":"` + op + `","request":{"claim_id":"c","generation":1,"reason":"x","retryable":true,"junk":[` + ones + `]}}]}`
	item := `{"operation_id":"` + op + `","request":{"operation_key":"k","generation":1,"expected_version":0,"body":{"a":[` +
		strings.Repeat("1,", (httpapi.MaxBodyBytes-200)/2) + `1]}}}`
	publications := `{"items":[` + strings.Repeat(item+",", 62) + item + `]}`
	b.Run("failures", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			th.do("POST", "/v1/failures", th.worker, failures)
		}
	})
	b.Run("publications", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			th.do("POST", "/v1/publications", th.worker, publications)
		}
	})
}
