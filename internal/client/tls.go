package client

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net/http"
	"os"
)

// Transport is the HTTP transport a command calls hosts with: Go's default,
// trusting besides the system's roots the certificates in caFile (PEM)
// when one is given, for a host behind a TLS proxy whose certificate a
// private CA signed (Caddy's internal CA, a company's own).
func Transport(caFile string) (http.RoundTripper, error) {
	if caFile == "" {
		return http.DefaultTransport, nil
	}
	data, err := os.ReadFile(caFile)
	if err != nil {
		return nil, fmt.Errorf("--ca-file: %w", err)
	}
	pool, err := x509.SystemCertPool()
	if err != nil {
		pool = x509.NewCertPool()
	}
	if !pool.AppendCertsFromPEM(data) {
		return nil, fmt.Errorf("--ca-file %s holds no PEM certificate", caFile)
	}
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.TLSClientConfig = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	return t, nil
}

// CertificateError is a host whose certificate this caller does not
// trust: no retry helps, the operator has to give the CA.
type CertificateError struct {
	URL string
	Err error
}

func (e *CertificateError) Error() string {
	return fmt.Sprintf("%s: the host's certificate is not one this machine trusts (%v); give the certificate of the CA that signed it with --ca-file or FLEET_CA_FILE", e.URL, e.Err)
}

func (e *CertificateError) Unwrap() error { return e.Err }

// untrusted names a failed TLS verification as a CertificateError.
func untrusted(base string, err error) error {
	var verify *tls.CertificateVerificationError
	if errors.As(err, &verify) {
		return &CertificateError{URL: base, Err: verify}
	}
	return err
}
