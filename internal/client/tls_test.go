package client_test

import (
	"context"
	"encoding/pem"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/fleet/fleet/internal/client"
)

// TestTransportTrustsCAFile: a host whose certificate a private CA signed
// is reached with that CA's certificate as --ca-file; without it the call
// fails naming the flag to give, and a file with no certificate in it, or
// none at all, is refused naming it.
func TestTransportTrustsCAFile(t *testing.T) {
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Write([]byte(`{}`))
	}))
	defer srv.Close()
	dir := t.TempDir()
	caFile := filepath.Join(dir, "ca.pem")
	os.WriteFile(caFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}), 0o600)

	rt, err := client.Transport(caFile)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := client.Do(context.Background(), &http.Client{Transport: rt}, srv.URL, "tok", "GET", "/", nil, nil); err != nil {
		t.Fatalf("with the CA file: %v", err)
	}

	plain, err := client.Transport("")
	if err != nil {
		t.Fatal(err)
	}
	_, err = client.Do(context.Background(), &http.Client{Transport: plain}, srv.URL, "tok", "GET", "/", nil, nil)
	var untrusted *client.CertificateError
	if !errors.As(err, &untrusted) || !strings.Contains(err.Error(), "--ca-file") || !strings.Contains(err.Error(), "FLEET_CA_FILE") {
		t.Fatalf("without the CA file: %v", err)
	}

	notPEM := filepath.Join(dir, "not.pem")
	os.WriteFile(notPEM, []byte("not a certificate\n"), 0o600)
	for file, says := range map[string]string{notPEM: "no PEM certificate", filepath.Join(dir, "none.pem"): "no such file"} {
		if _, err := client.Transport(file); err == nil || !strings.Contains(err.Error(), says) || !strings.Contains(err.Error(), file) {
			t.Fatalf("--ca-file %s: %v", file, err)
		}
	}
}
