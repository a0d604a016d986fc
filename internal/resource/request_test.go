package resource_test

import (
	"encoding/json"
	"strings"
	"testing"

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

// A decoded request whose body is changed afterwards is validated again.
func TestChangedBodyRevalidated(t *testing.T) {
	req, err := resource.DecodePublishRequest([]byte(`{"operation_key":"k","generation":1,"expected_version":0,"body":{"a":1}}`))
	if err != nil {
		t.Fatal(err)
	}
	req.Body = json.RawMessage(`[1]`)
	s, _ := setup(t)
	if _, err := s.Publish(t.Context(), doc, workerA, req); fleet.ErrorCode(err) != wire.CodeInvalid {
		t.Fatalf("a body changed after decoding was not revalidated: %v", err)
	}
}
