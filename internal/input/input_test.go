package input_test

import (
	"strings"
	"testing"

	"github.com/fleet/fleet/internal/input"
)

func TestDefaults(t *testing.T) {
	in, err := input.Parse([]byte(`{"document":"text","sections":["summary"]}`))
	if err != nil {
		t.Fatal(err)
	}
	if in.Concurrency != 3 || in.Allowance != 50 || in.CostPerReport != 20 || in.Mode != "deterministic" || in.Restart || in.CancelIndex != nil {
		t.Fatalf("%+v", in)
	}
}

func TestRefusals(t *testing.T) {
	for body, field := range map[string]string{
		`{"sections":["summary"]}`:                                                                                              "document",
		`{"document":"x"}`:                                                                                                      "sections",
		`{"document":"x","sections":["summary"],"extra":1}`:                                                                     "extra",
		`{"document":"x","sections":["summary"],"concurrency":0}`:                                                               "concurrency",
		`{"document":"x","sections":["summary"],"allowance":-5}`:                                                                "allowance",
		`{"document":"x","sections":["summary"],"cancel_index":1}`:                                                              "cancel_index",
		`{"document":"x","sections":["summary"],"lose_ack_index":"0"}`:                                                          "lose_ack_index",
		`{"document":"x","sections":["summary"],"mode":"fast"}`:                                                                 "mode",
		`{"document":"x","sections":["summary"],"cost_per_report":1.5}`:                                                         "cost_per_report",
		`{"document":"x","sections":["summary","summary","sumary"]}`:                                                            "sections[2]",
		`{"document":"x","sections":["summary","terms"],"after":{"summary":["terms"],"terms":["summary"]}}`:                     "ring",
		`{"document":"x","sections":["summary","terms"],"after":{"summary":["links"]}}`:                                         "links",
		"{\"document\":\"\\u0000\",\"sections\":[\"summary\"]}":                                                                 "document",
		`{"document":"x","sections":["summary"],"restart":null,"mode":1}`:                                                       "mode",
		`{"document":"x","sections":["summary"],"model_prices":{"prompt_per_1k":1,"completion_per_1k":1}}`:                      "model_prices needs \"mode\": \"model\"",
		`{"document":"x","sections":["summary"],"mode":"model","model_prices":{"prompt_per_1k":1}}`:                             "completion_per_1k",
		`{"document":"x","sections":["summary"],"mode":"model","model_prices":{"prompt_per_1k":-1,"completion_per_1k":1}}`:      "model_prices.prompt_per_1k",
		`{"document":"x","sections":["summary"],"mode":"model","model_prices":{"prompt_per_1k":1,"completion_per_1k":1,"x":2}}`: "x",
	} {
		_, err := input.Parse([]byte(body))
		if err == nil || !strings.Contains(err.Error(), field) {
			t.Errorf("%s: %v (want a refusal naming %s)", body, err, field)
		}
	}
}

// FuzzParse: Parse never panics and what it accepts is within the limits.
func FuzzParse(f *testing.F) {
	f.Add([]byte(`{"document":"text","sections":["summary","links"],"concurrency":2,"lose_ack_index":0}`))
	f.Add([]byte(`{"document":"","sections":[]}`))
	f.Add([]byte(`{"document":"x","sections":["terms"],"cancel_index":0,"restart":true,"mode":"model"}`))
	f.Add([]byte(`{"document":"x","sections":["terms"],"mode":"model","model_prices":{"prompt_per_1k":0.4,"completion_per_1k":1.6}}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		in, err := input.Parse(data)
		if err != nil {
			return
		}
		if in.Concurrency < 1 || in.Concurrency > 64 || len(in.Sections) < 1 || len(in.Sections) > 64 ||
			strings.TrimSpace(in.Document) == "" || len(in.Document) > 64000 || in.CostPerReport < 1 || in.Allowance < 0 {
			t.Fatalf("accepted %+v", in)
		}
		if in.CancelIndex != nil && (*in.CancelIndex < 0 || *in.CancelIndex >= len(in.Sections)) {
			t.Fatalf("accepted cancel_index %d", *in.CancelIndex)
		}
	})
}
