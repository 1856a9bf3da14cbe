// Package benchtls puts the load tests' gRPC connections on mutual TLS: `bench authz
// -mtls` and `bench rls -mtls` make a CA and certificates in a directory that
// BENCH_TLS_DIR names, and the sidecar's gRPC port, the no-op server (a child process,
// which inherits the variable) and the load generator's connections then all use them,
// so that both sides of a ratio pay the same TLS.
package benchtls

import (
	"crypto/tls"
	"os"
	"path/filepath"

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

// SidecarEnv are the variables that put a sidecar's gRPC port on mutual TLS with the
// load generator allowed (none in plain text).
func SidecarEnv() []string {
	d := dir()
	if d == "" {
		return nil
	}
	return []string{
		"SIDECAR_GRPC_TLS_CERT_FILE=" + filepath.Join(d, "server.crt"), "SIDECAR_GRPC_TLS_KEY_FILE=" + filepath.Join(d, "server.key"),
		"SIDECAR_GRPC_TLS_CLIENT_CA_FILE=" + filepath.Join(d, "server-ca.crt"), "SIDECAR_GRPC_TLS_ALLOWED_CLIENTS=" + ClientID,
	}
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
