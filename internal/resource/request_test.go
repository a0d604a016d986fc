package resource_test

import (
	"encoding/json"
	"runtime"
	"strings"
	"testing"

	"github.com/gowebpki/jcs"

	"github.com/fleet/fleet/internal/fleet"
	"github.com/fleet/fleet/internal/resource"
	"github.com/fleet/fleet/internal/wire"
)

func TestDecodePublishRequest(t *testing.T) {
	t.Run("OK", func(t *testing.T) {
		req, err := resource.DecodePublishRequest([]byte(`{"operation_key":"k","generation":3,"expected_version":0,"body":{"z":1,"a":[true]}}`))
		if err != nil {
			t.Fatal(err)
		}
		if req.OperationKey != "k" || req.Generation != 3 || string(req.Body) != `{"a":[true],"z":1}` {
			t.Fatalf("%+v", req)
		}
	})
	cases := map[string]struct{ body, mention string }{
		"unknown field":      {`{"operation_key":"k","generation":1,"expected_version":0,"body":{},"caller":"x"}`, `"caller"`},
		"owner field":        {`{"operation_key":"k","generation":1,"expected_version":0,"body":{},"owner":"x"}`, `"owner"`},
		"missing key":        {`{"generation":1,"expected_version":0,"body":{}}`, "operation_key"},
		"missing generation": {`{"operation_key":"k","expected_version":0,"body":{}}`, "generation"},
		"missing version":    {`{"operation_key":"k","generation":1,"body":{}}`, "expected_version"},
		"missing body":       {`{"operation_key":"k","generation":1,"expected_version":0}`, "body"},
		"wrong type":         {`{"operation_key":7,"generation":1,"expected_version":0,"body":{}}`, "operation_key"},
		"float generation":   {`{"operation_key":"k","generation":1.5,"expected_version":0,"body":{}}`, "generation"},
		"huge generation":    {`{"operation_key":"k","generation":99999999999999999999,"expected_version":0,"body":{}}`, "generation"},
		"negative":           {`{"operation_key":"k","generation":-1,"expected_version":0,"body":{}}`, "generation"},
		"trailing":           {`{"operation_key":"k","generation":1,"expected_version":0,"body":{}} {}`, "malformed"},
		"duplicate key":      {`{"operation_key":"k","operation_key":"j","generation":1,"expected_version":0,"body":{}}`, "malformed"},
		"not object":         {`[1,2]`, "object"},
		"truncated":          {`{"operation_key":"k"`, "malformed"},
		"body string":        {`{"operation_key":"k","generation":1,"expected_version":0,"body":"x"}`, "body"},
		"invalid utf8":       {"{\"operation_key\":\"\xff\",\"generation\":1,\"expected_version\":0,\"body\":{}}", "malformed"},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			_, err := resource.DecodePublishRequest([]byte(c.body))
			if fleet.ErrorCode(err) != wire.CodeInvalid {
				t.Fatalf("err %v, want invalid_request", err)
			}
			if !strings.Contains(err.Error(), c.mention) {
				t.Fatalf("error %q does not name %q", err, c.mention)
			}
		})
	}
}

// FuzzDecodePublishRequest: the decoder never panics, and whatever it accepts
// is within limits and decodes again to the same request.
func FuzzDecodePublishRequest(f *testing.F) {
	f.Add([]byte(`{"operation_key":"k","generation":1,"expected_version":0,"body":{"a":1}}`))
	f.Add([]byte(`{"operation_key":"","generation":-1,"expected_version":0,"body":[]}`))
	f.Add([]byte(`{"operation_key":"k","generation":1,"expected_version":0,"body":{"a":"\u00e9"},"x":1}`))
	f.Add([]byte(`{"operation_key":"k","generation":1e3,"expected_version":0,"body":{}}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		req, err := resource.DecodePublishRequest(data)
		if err != nil {
			if fleet.ErrorCode(err) != wire.CodeInvalid {
				t.Fatalf("non-invalid error %v", err)
			}
			return
		}
		if req.OperationKey == "" || len(req.OperationKey) > resource.MaxKeyBytes || req.Generation < 0 ||
			req.ExpectedVersion < 0 || len(req.Body) > resource.MaxBodyBytes {
			t.Fatalf("accepted out-of-range request %+v", req)
		}
		// The streaming canonicalization stores what a tree-building RFC
		// 8785 implementation makes of the same body, byte for byte.
		if want, err := jcs.Transform(req.Body); err != nil || string(want) != string(req.Body) {
			t.Fatalf("canonical body %q; jcs makes %q (%v)", req.Body, want, err)
		}
		again, err := json.Marshal(req)
		if err != nil {
			t.Fatal(err)
		}
		req2, err := resource.DecodePublishRequest(again)
		if err != nil || req2.OperationKey != req.OperationKey || string(req2.Body) != string(req.Body) ||
			req2.Generation != req.Generation || req2.ExpectedVersion != req.ExpectedVersion {
			t.Fatalf("round trip changed %+v into %+v (%v)", req, req2, err)
		}
	})
}

// TestBodyNumbersExact: a body's numbers are kept as sent. RFC 8785 writes
// a number as the shortest form of the nearest 64-bit float, so a number
// that float cannot hold (a 20-digit id, 2^53 + 1, 0.10000000000000001)
// would be stored as another value, and two different bodies would bind to
// the same operation; such a number is refused, naming it. A number is
// accepted when its value is exactly that of its canonical form (1.50,
// 1e2, -0, 0.1); a longer spelling of a float, even its exact binary
// value (1 + 2^-52 written out in full), is refused too, as docs/api.md
// says: telling it apart would take arbitrary-precision arithmetic on
// digits a caller chooses.
func TestBodyNumbersExact(t *testing.T) {
	publish := func(number string) (resource.Request, error) {
		return resource.DecodePublishRequest([]byte(`{"operation_key":"k","generation":1,"expected_version":0,"body":{"n":[` + number + `]}}`))
	}
	for _, n := range []string{"12345678901234567891", "12345678901234567890", "9007199254740993",
		"0.10000000000000001", "1.00000000000000000001", "-123456789012345678901234567890", "5e-400",
		"1.0000000000000002220446049250313080847263336181640625"} {
		_, err := publish(n)
		if fleet.ErrorCode(err) != wire.CodeInvalid || !strings.Contains(err.Error(), n) {
			t.Errorf("%s: err %v, want invalid_request naming the number", n, err)
		}
	}
	for n, stored := range map[string]string{"9007199254740992": "9007199254740992", "0.1": "0.1", "1.50": "1.5",
		"1e2": "100", "-0": "0", "1E-7": "1e-7", "123456789012345680000": "123456789012345680000", "0.000001": "0.000001"} {
		req, err := publish(n)
		if err != nil {
			t.Errorf("%s: %v", n, err)
			continue
		}
		if want := `{"n":[` + stored + `]}`; string(req.Body) != want {
			t.Errorf("%s stored as %s, want %s", n, req.Body, want)
		}
	}
	// The case: the same operation key with the last digit changed
	// must not be taken for the same body.
	a, errA := publish("12345678901234567891")
	b, errB := publish("12345678901234567890")
	if errA == nil && errB == nil && string(a.Body) == string(b.Body) {
		t.Fatalf("two different bodies bind alike: %s", a.Body)
	}
}

// TestDecodingHoldsLittle (issue 33, item 1): decoding a request of many
// small values, the shape that made a tree-building decoder allocate about
// 96 times its size, allocates a small multiple of its size: about 6
// times, and under the race detector, whose sync.Pool drops buffers at
// random, up to about 13; 16 fails the old decoder by far.
func TestDecodingHoldsLittle(t *testing.T) {
	n := resource.MaxBodyBytes
	flat := `{"a":[` + strings.Repeat("1,", n/2-20) + `1]}`
	objects := `{"a":[` + strings.Repeat("{},", n/3-20) + `{}]}`
	for name, body := range map[string]string{"numbers": flat, "objects": objects} {
		publish := []byte(`{"operation_key":"k","generation":1,"expected_version":0,"body":` + body + `}`)
		claim := []byte(`{"claim_id":"c","generation":1,"extra":` + body + `}`)
		for what, decode := range map[string]func(){
			"publication": func() { resource.DecodePublishRequest(publish) },
			"strict":      func() { var v struct{ ClaimID string }; resource.DecodeStrict(claim, &v) },
		} {
			decode() // pools filled
			allocated := testing.AllocsPerRun(1, decode)
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			decode()
			runtime.ReadMemStats(&after)
			bytes := after.TotalAlloc - before.TotalAlloc
			t.Logf("%s %s: %d bytes allocated for %d bytes of request", name, what, bytes, len(publish))
			if bytes > uint64(16*len(publish)) {
				t.Errorf("%s %s: %d bytes allocated for %d bytes of request (%d allocations); want at most 16 times", name, what, bytes, len(publish), int(allocated))
			}
		}
	}
}

// BenchmarkDecodePublishRequest decodes a publication of a section's body
// as fleet-worker sends it: its input's SHA-256 in hex, counts, no
// fractions.
func BenchmarkDecodePublishRequest(b *testing.B) {
	publish := []byte(`{"operation_key":"job-7f3c","generation":3,"expected_version":0,"body":` +
		`{"input_sha256":"3e4f09c1e2aa5b6c7d8e9f00112233445566778899aabbccddeeff0011223344","mode":"deterministic",` +
		`"operation_id":"op-1234","result":{"first_lines":["Benchmark document. It must be short."],"paragraphs":1,"words":6},"section":"summary"}}`)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := resource.DecodePublishRequest(publish); err != nil {
			b.Fatal(err)
		}
	}
}
