package e2e

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

// fromAddress is a client whose connections come from the loopback
// address ip, as a caller on another machine would from its own.
func fromAddress(ip string) *http.Client {
	dialer := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}, Timeout: 5 * time.Second}
	return &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DialContext: dialer.DialContext}}
}

// signInFrom sends a console sign-in from client and answers its status.
func signInFrom(t *testing.T, client *http.Client, h *hostProcess, token string) int {
	t.Helper()
	req, _ := http.NewRequest("POST", h.URL+"/console/session", strings.NewReader(fmt.Sprintf(`{"credential":%q}`, token)))
	req.Header.Set("Origin", h.URL)
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}

// TestSignInNoLockout (issue 33, item 2): failed sign-ins from twelve
// addresses spend every failure budget the host has, and the operator's
// correct credential still signs in, from a fresh address and from one
// whose own budget is spent; a wrong credential stays throttled.
func TestSignInNoLockout(t *testing.T) {
	t.Parallel()
	state := initState(t, sampleInput(t, nil))
	h := startHost(t, state)
	for a := range 12 {
		client := fromAddress(fmt.Sprintf("127.0.0.%d", 2+a))
		for i := range 12 {
			if status := signInFrom(t, client, h, fmt.Sprintf("fleet_guess_%d_%d", a, i)); status != 401 && status != 429 {
				t.Fatalf("a guess answered %d", status)
			}
		}
	}
	operator := credential(t, state, "operator")
	if status := signInFrom(t, fromAddress("127.0.0.99"), h, "fleet_one_more_guess"); status != 429 {
		t.Fatalf("a guess from a fresh address after the host's budget is spent answered %d; want 429", status)
	}
	if status := signInFrom(t, fromAddress("127.0.0.2"), h, "fleet_and_another"); status != 429 {
		t.Fatalf("a guess from a spent address answered %d; want 429", status)
	}
	for _, ip := range []string{"127.0.0.100", "127.0.0.2"} {
		if status := signInFrom(t, fromAddress(ip), h, operator); status != 200 {
			t.Fatalf("the operator's credential from %s after the failures answered %d; want 200", ip, status)
		}
	}
	if status := signInFrom(t, fromAddress("127.0.0.100"), h, credential(t, state, "worker-1")); status != 429 {
		t.Fatalf("a worker's credential at the console while throttled answered %d; want 429", status)
	}
}
