package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"github.com/fleet/fleet/internal/client"
)

// hostProc is a running `fleet-host serve`.
type hostProc struct {
	cmd       *exec.Cmd
	URL       string `json:"url"`
	PID       int    `json:"pid"`
	KernelKey string `json:"kernel_key"`
	done      chan struct{}
}

// startHost starts `fleet-host serve` and waits for its ready line. Its
// stderr and the rest of its stdout go to log.
func startHost(bin, stateDir string, log io.Writer) (*hostProc, error) {
	cmd := exec.Command(filepath.Join(bin, "fleet-host"), "serve", "--state", stateDir, "--listen", "127.0.0.1:0")
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	cmd.Stderr = log
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start host: %w", err)
	}
	h := &hostProc{cmd: cmd, done: make(chan struct{})}
	lines := bufio.NewReader(stdout)
	ready := make(chan error, 1)
	go func() {
		line, err := lines.ReadBytes('\n')
		if err == nil {
			err = json.Unmarshal(line, h)
		}
		ready <- err
		io.Copy(log, lines)
	}()
	go func() { cmd.Wait(); close(h.done) }()
	select {
	case err := <-ready:
		if err != nil {
			h.kill()
			return nil, fmt.Errorf("host did not report ready: %w", err)
		}
	case <-h.done:
		return nil, fmt.Errorf("host exited before it was ready (see host.log)")
	case <-time.After(30 * time.Second):
		h.kill()
		return nil, fmt.Errorf("host not ready after 30s")
	}
	return h, nil
}

func (h *hostProc) kill() {
	h.cmd.Process.Signal(syscall.SIGKILL)
	<-h.done
}

// stop asks the host to shut down cleanly, then kills it if it lingers.
func (h *hostProc) stop() {
	h.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-h.done:
	case <-time.After(30 * time.Second):
		h.kill()
	}
}

// workerProc is a running `fleet-worker`.
type workerProc struct {
	name string
	cmd  *exec.Cmd
	err  error
	done chan struct{}
}

func startWorker(bin, hostURL, credential, mode string, log io.Writer) (*workerProc, error) {
	cmd := exec.Command(filepath.Join(bin, "fleet-worker"), "--host", hostURL, "--credential", credential, "--mode", mode)
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start worker: %w", err)
	}
	w := &workerProc{name: filepath.Base(credential), cmd: cmd, done: make(chan struct{})}
	go func() { w.err = cmd.Wait(); close(w.done) }()
	return w, nil
}

// api is the operator's HTTP client; the URL changes when the host restarts.
type api struct {
	mu    sync.Mutex
	url   string
	token string
	http  *http.Client
}

func (a *api) setURL(u string) { a.mu.Lock(); a.url = u; a.mu.Unlock() }

func (a *api) base() string { a.mu.Lock(); defer a.mu.Unlock(); return a.url }

// call sends a request with the given credential and decodes a 2xx answer
// into out. It returns the status and raw body for callers that check 4xx.
func (a *api) call(ctx context.Context, token, method, path string, body, out any) (int, []byte, error) {
	resp, err := client.Do(ctx, a.http, a.base(), token, method, path, body, nil)
	var refused *client.Error
	if errors.As(err, &refused) {
		return refused.Status, refused.Body, fmt.Errorf("%s %s: %w", method, path, err)
	}
	if err != nil {
		return 0, nil, err
	}
	if out != nil {
		if err := resp.Decode(out); err != nil {
			return resp.Status, resp.Body, fmt.Errorf("%s %s: %w", method, path, err)
		}
	}
	return resp.Status, resp.Body, nil
}

func (a *api) operator(ctx context.Context, method, path string, body, out any) error {
	_, _, err := a.call(ctx, a.token, method, path, body, out)
	return err
}
