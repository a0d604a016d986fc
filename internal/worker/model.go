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
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/fleet/fleet/internal/budget"
	"github.com/fleet/fleet/internal/retry"
	"github.com/fleet/fleet/internal/wire"
)

// Model mode: each section is one chat-completions request
// to an OpenAI-compatible endpoint. The API key is read from the worker's
// environment and sent only in that request's Authorization header: never
// logged, never in an event, never in the published body.

// Defaults for model mode.
const (
	DefaultModelURL     = "https://openrouter.ai/api/v1"
	DefaultModel        = "openai/gpt-4.1-mini"
	DefaultModelTimeout = 120 * time.Second
	// modelAttempts bounds tries of one call on 429, 5xx and transport errors.
	modelAttempts = 5
	// maxRetryAfter caps how long a Retry-After can make the worker wait.
	maxRetryAfter = 60 * time.Second
	// maxModelResponse bounds what is read from the endpoint.
	maxModelResponse = 4 << 20
)

// Model calls a chat-completions endpoint.
type Model struct {
	BaseURL string // the API base, before /chat/completions
	Key     string // may be empty for a local server that needs none
	Name    string
	Timeout time.Duration // per attempt
	HTTP    *http.Client
	Log     *slog.Logger
	// backoff is the first pause between attempts without Retry-After; tests shorten it.
	backoff time.Duration
}

// ModelFromEnv reads FLEET_MODEL_URL, FLEET_MODEL, FLEET_MODEL_TIMEOUT and
// OPENROUTER_API_KEY or OPENAI_API_KEY. It refuses to go on without a key,
// unless FLEET_MODEL_URL names a server of one's own (Ollama, llama.cpp),
// which may need none.
func ModelFromEnv(log *slog.Logger) (*Model, error) {
	m := &Model{BaseURL: os.Getenv("FLEET_MODEL_URL"), Name: os.Getenv("FLEET_MODEL"), Timeout: DefaultModelTimeout,
		HTTP: &http.Client{}, Log: log, backoff: time.Second}
	m.Key = os.Getenv("OPENROUTER_API_KEY")
	if m.Key == "" {
		m.Key = os.Getenv("OPENAI_API_KEY")
	}
	if m.Key == "" && m.BaseURL == "" {
		return nil, errors.New("--mode model needs an API key: set OPENROUTER_API_KEY or OPENAI_API_KEY " +
			"(or FLEET_MODEL_URL to a local OpenAI-compatible server, e.g. http://127.0.0.1:11434/v1 for Ollama)")
	}
	if m.BaseURL == "" {
		m.BaseURL = DefaultModelURL
	}
	m.BaseURL = strings.TrimRight(m.BaseURL, "/")
	if !strings.HasPrefix(m.BaseURL, "http://") && !strings.HasPrefix(m.BaseURL, "https://") {
		return nil, fmt.Errorf("FLEET_MODEL_URL must be an http(s) URL, got %q", m.BaseURL)
	}
	if m.Name == "" {
		m.Name = DefaultModel
	}
	if v := os.Getenv("FLEET_MODEL_TIMEOUT"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			return nil, fmt.Errorf("FLEET_MODEL_TIMEOUT must be a positive duration like 90s, got %q", v)
		}
		m.Timeout = d
	}
	return m, nil
}

// instructions tell the model what each section is.
var instructions = map[string]string{
	"summary":  "Summarize the document in three to five sentences.",
	"terms":    "List the twelve most important terms of the document, one per line, most important first.",
	"actions":  "List every action item or obligation the document states, one per line.",
	"links":    "List every http or https URL in the document, one per line, exactly as written.",
	"overview": "Write one line for each section this one follows, in the order given, saying what it found.",
}

// Instruction is what a section asks of whoever writes it (a model, or an
// agent through fleet-mcp); false for a section with none.
func Instruction(section string) (string, bool) {
	s, ok := instructions[section]
	return s, ok
}

// ModelAnswer is the published body of a model-written section.
type ModelAnswer struct {
	Section string     `json:"section"`
	Model   string     `json:"model"`
	Answer  string     `json:"answer"`
	Usage   wire.Usage `json:"usage"`
}

type chatRequest struct {
	Model    string        `json:"model"`
	Messages []chatMessage `json:"messages"`
}

type chatMessage struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

type chatResponse struct {
	Model   string `json:"model"`
	Choices []struct {
		Message chatMessage `json:"message"`
	} `json:"choices"`
	Usage *wire.Usage `json:"usage"`
}

// Write asks the model for one section. It retries 429 and 5xx answers and
// transport failures with backoff, honouring Retry-After, up to
// modelAttempts; ctx ending (an operator's cancel reaching the heartbeat)
// cancels the request in flight.
func (m *Model) Write(ctx context.Context, section, document string) (ModelAnswer, error) {
	instruction, ok := instructions[section]
	if !ok {
		return ModelAnswer{}, fmt.Errorf("no model instruction for section %q", section)
	}
	payload, err := json.Marshal(chatRequest{Model: m.Name, Messages: []chatMessage{
		{Role: "system", Content: "You write one section of a report about a document. Answer with the section's text only."},
		{Role: "user", Content: fmt.Sprintf("Section: %s\n%s\n\nDocument:\n%s", section, instruction, document)},
	}})
	if err != nil {
		return ModelAnswer{}, err
	}
	pause := retry.New(m.backoff, 30*time.Second)
	for attempt := 1; ; attempt++ {
		resp, retryAfter, err := m.once(ctx, payload)
		if err == nil {
			if len(resp.Choices) == 0 || resp.Usage == nil || !budget.ValidUsage(*resp.Usage) {
				return ModelAnswer{}, errors.New("the model's answer has no choices or no usage")
			}
			name := resp.Model
			if name == "" {
				name = m.Name
			}
			return ModelAnswer{Section: section, Model: name, Answer: resp.Choices[0].Message.Content, Usage: *resp.Usage}, nil
		}
		var final *finalError
		if errors.As(err, &final) || ctx.Err() != nil || attempt == modelAttempts {
			return ModelAnswer{}, fmt.Errorf("model call for %s (attempt %d): %w", section, attempt, err)
		}
		wait := pause.NextBackOff()
		if retryAfter > 0 {
			wait = min(retryAfter, maxRetryAfter)
		}
		m.Log.Warn("model call failed; retrying", "section", section, "attempt", attempt, "wait", wait.String(), "err", err.Error())
		select {
		case <-ctx.Done():
			return ModelAnswer{}, fmt.Errorf("model call for %s: %w", section, ctx.Err())
		case <-time.After(wait):
		}
	}
}

// finalError is an answer no retry will change (a 4xx other than 429).
type finalError struct{ msg string }

func (e *finalError) Error() string { return e.msg }

func (m *Model) once(ctx context.Context, payload []byte) (chatResponse, time.Duration, error) {
	ctx, cancel := context.WithTimeout(ctx, m.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, m.BaseURL+"/chat/completions", bytes.NewReader(payload))
	if err != nil {
		return chatResponse{}, 0, &finalError{err.Error()}
	}
	req.Header.Set("Content-Type", "application/json")
	if m.Key != "" {
		req.Header.Set("Authorization", "Bearer "+m.Key)
	}
	resp, err := m.HTTP.Do(req)
	if err != nil {
		return chatResponse{}, 0, errors.New(m.redact(err.Error()))
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, maxModelResponse))
	if err != nil {
		return chatResponse{}, 0, errors.New(m.redact(err.Error()))
	}
	if resp.StatusCode == http.StatusTooManyRequests || resp.StatusCode >= 500 {
		return chatResponse{}, retryAfter(resp.Header.Get("Retry-After")), fmt.Errorf("%s: %s", resp.Status, m.redact(snippet(data)))
	}
	if resp.StatusCode != http.StatusOK {
		return chatResponse{}, 0, &finalError{fmt.Sprintf("%s: %s", resp.Status, m.redact(snippet(data)))}
	}
	var out chatResponse
	if err := json.Unmarshal(data, &out); err != nil {
		return chatResponse{}, 0, &finalError{"the model's answer is not chat-completions JSON: " + err.Error()}
	}
	return out, 0, nil
}

// redact keeps the key out of any message built from what came back.
func (m *Model) redact(s string) string {
	if m.Key == "" {
		return s
	}
	return strings.ReplaceAll(s, m.Key, "[redacted]")
}

func snippet(data []byte) string {
	const max = 300
	s := strings.TrimSpace(string(data))
	if len(s) > max {
		s = s[:max] + "…"
	}
	return s
}

// retryAfter reads a Retry-After header: seconds, or an HTTP date.
func retryAfter(v string) time.Duration {
	if v == "" {
		return 0
	}
	if n, err := strconv.Atoi(strings.TrimSpace(v)); err == nil && n >= 0 {
		return time.Duration(n) * time.Second
	}
	if t, err := http.ParseTime(v); err == nil {
		return max(time.Until(t), 0)
	}
	return 0
}
