// Package benchtls puts the load tests' connections on mutual TLS: `bench authz -mtls`,
// `bench rls -mtls`, `bench forward-auth -mtls` and `bench cluster -mtls` make a CA and
// certificates in a directory that BENCH_TLS_DIR names, and the sidecar's gRPC and HTTP
// ports, the no-op servers (child processes, which inherit the variable) and the load
// generator's connections then all use them, so that both sides of a ratio pay the same
// TLS.
package benchtls

import (
	"crypto/tls"
	"net/http"
	"os"
	"path/filepath"
	"time"

	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/converger/edge/shared/testpki"
	"github.com/converger/edge/shared/tlsconfig"
)

// DirEnv names the directory of the certificates; unset: plain text.
const DirEnv = "BENCH_TLS_DIR"

// ClientID is the identity of the load generator's certificate, the one the servers allow.
const ClientID = "spiffe://bench.local/load"

// Enable makes the certificates in a new directory and sets DirEnv; the returned function
// removes them.
func Enable() (func(), error) {
	dir, err := os.MkdirTemp("", "bench-tls-")
	if err != nil {
		return nil, err
	}
	cleanup := func() { os.RemoveAll(dir) }
	ca, err := testpki.NewCA("bench CA")
	if err == nil {
		var server, client *testpki.Pair
		if server, err = ca.Issue(testpki.Localhost("server")); err == nil {
			if err = ca.Write(server, dir, "server"); err == nil {
				if client, err = ca.Issue(testpki.Leaf{Name: "load", URIs: []string{ClientID}}); err == nil {
					err = ca.Write(client, dir, "client")
				}
			}
		}
	}
	if err == nil {
		err = os.Setenv(DirEnv, dir)
	}
	if err != nil {
		cleanup()
		return nil, err
	}
	return cleanup, nil
}

func dir() string { return os.Getenv(DirEnv) }

// Enabled reports whether the run is on mutual TLS.
func Enabled() bool { return dir() != "" }

// SidecarEnv are the variables that put a sidecar's gRPC and HTTP ports on mutual TLS
// with the load generator allowed (none in plain text).
func SidecarEnv() []string {
	d := dir()
	if d == "" {
		return nil
	}
	var env []string
	for _, p := range []string{"SIDECAR_GRPC_TLS", "SIDECAR_HTTP_TLS"} {
		env = append(env, p+"_CERT_FILE="+filepath.Join(d, "server.crt"), p+"_KEY_FILE="+filepath.Join(d, "server.key"),
			p+"_CLIENT_CA_FILE="+filepath.Join(d, "server-ca.crt"), p+"_ALLOWED_CLIENTS="+ClientID)
	}
	return env
}

// URL is the URL of path on a sidecar's HTTP port or a no-op forward-auth server at
// addr: https:// on mutual TLS, else http://.
func URL(addr, path string) string {
	if Enabled() {
		return "https://" + addr + path
	}
	return "http://" + addr + path
}

// HTTPClient is a client for URL's addresses, with the load generator's certificate on
// mutual TLS; each request is bounded by timeout (none when 0).
func HTTPClient(timeout time.Duration) (*http.Client, error) {
	cfg, err := ClientConfig()
	if err != nil {
		return nil, err
	}
	if cfg == nil {
		return &http.Client{Timeout: timeout}, nil
	}
	return &http.Client{Timeout: timeout, Transport: &http.Transport{TLSClientConfig: cfg, MaxIdleConnsPerHost: 4, IdleConnTimeout: 30 * time.Second}}, nil
}

// ServerFiles are the same port's TLS for the no-op server; nil in plain text.
func ServerFiles() *tlsconfig.ServerFiles {
	d := dir()
	if d == "" {
		return nil
	}
	return &tlsconfig.ServerFiles{Name: "BENCH_NOOP_TLS", CertFile: filepath.Join(d, "server.crt"), KeyFile: filepath.Join(d, "server.key"),
		ClientCAFile: filepath.Join(d, "server-ca.crt"), ClientAuth: tlsconfig.RequireClientCert, AllowedClients: []string{ClientID}}
}

// ClientCredentials are the load generator's: mutual TLS with its certificate, or plain
// text.
func ClientCredentials() (credentials.TransportCredentials, error) {
	cfg, err := ClientConfig()
	if err != nil || cfg == nil {
		return insecure.NewCredentials(), err
	}
	return credentials.NewTLS(cfg), nil
}

// ClientConfig is the load generator's TLS; nil in plain text.
func ClientConfig() (*tls.Config, error) {
	d := dir()
	if d == "" {
		return nil, nil
	}
	return tlsconfig.ClientConfig(&tlsconfig.ClientFiles{Name: "BENCH_TLS", CAFile: filepath.Join(d, "client-ca.crt"),
		CertFile: filepath.Join(d, "client.crt"), KeyFile: filepath.Join(d, "client.key"), ServerName: "localhost"}, "", tlsconfig.Options{})
}
