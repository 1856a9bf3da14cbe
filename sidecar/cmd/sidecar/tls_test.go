package main

// TLS and mutual TLS on the sidecar's two ports, against the built binary: refusals of
// plain-text clients, of clients without a certificate, with one of another CA or
// outside the allow list, and certificates rotated under running connections.

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/converger/edge/shared/testpki"
	"github.com/converger/edge/shared/tlsconfig"
)

// transport is how the tests' clients reach the ports.
type transport string

const (
	plainText transport = "plaintext"
	mutualTLS transport = "mtls"
)

// overEachTransport runs a suite in plain text and over mutual TLS, in parallel.
func overEachTransport(t *testing.T, suite func(*testing.T, transport)) {
	for _, tr := range []transport{plainText, mutualTLS} {
		t.Run(string(tr), func(t *testing.T) {
			t.Parallel()
			suite(t, tr)
		})
	}
}

// envoyID is the identity of the allowed client, as a mesh would issue Envoy's.
const envoyID = "spiffe://cluster.local/ns/edge/sa/envoy"

// portsTLS is a CA, the sidecar's certificate and a client's, with the variables that
// put both ports on mutual TLS with envoyID allowed.
type portsTLS struct {
	dir    string
	ca     *testpki.CA
	server *testpki.Pair
	env    map[string]string
	client *tls.Config // trusts the CA, presents envoyID's certificate
}

func newPortsTLS(t *testing.T) *portsTLS {
	t.Helper()
	p := &portsTLS{dir: t.TempDir()}
	var err error
	if p.ca, err = testpki.NewCA("sidecar test CA"); err != nil {
		t.Fatal(err)
	}
	p.server = p.issue(t, testpki.Localhost("sidecar"), "sidecar")
	// Free ports: other tests and programs on the machine use the defaults.
	p.env = map[string]string{"SIDECAR_GRPC_ADDR": "127.0.0.1:0", "SIDECAR_HTTP_ADDR": "127.0.0.1:0"}
	for _, port := range []string{"SIDECAR_GRPC_TLS", "SIDECAR_HTTP_TLS"} {
		p.env[port+"_CERT_FILE"] = p.server.CertFile
		p.env[port+"_KEY_FILE"] = p.server.KeyFile
		p.env[port+"_CLIENT_CA_FILE"] = p.server.CAFile
		p.env[port+"_ALLOWED_CLIENTS"] = envoyID
	}
	p.client = p.clientConfig(t, p.issue(t, testpki.Leaf{Name: "envoy", URIs: []string{envoyID}}, "envoy"))
	return p
}

func (p *portsTLS) issue(t *testing.T, l testpki.Leaf, name string) *testpki.Pair {
	t.Helper()
	pair, err := p.ca.Issue(l)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.ca.Write(pair, p.dir, name); err != nil {
		t.Fatal(err)
	}
	return pair
}

// clientConfig trusts the CA and presents pair's certificate (none when nil).
func (p *portsTLS) clientConfig(t *testing.T, pair *testpki.Pair) *tls.Config {
	t.Helper()
	f := &tlsconfig.ClientFiles{Name: "TEST", CAFile: p.server.CAFile}
	if pair != nil {
		f.CertFile, f.KeyFile = pair.CertFile, pair.KeyFile
	}
	c, err := tlsconfig.NewClient(f, "localhost", tlsconfig.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return c.Config()
}

// healthOver asks the gRPC port's health service with creds.
func healthOver(addr string, creds credentials.TransportCredentials) error {
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(creds))
	if err != nil {
		return err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err = healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{})
	return err
}

func getOver(url string, cfg *tls.Config) (int, error) {
	client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: cfg}}
	resp, err := client.Get(url)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	return resp.StatusCode, nil
}

func TestTLSPortsRefuse(t *testing.T) {
	t.Parallel()
	p := newPortsTLS(t)
	s := start(t, p.env)
	grpcAddr, httpAddr := s.addrs(30 * time.Second)

	if err := healthOver(grpcAddr, credentials.NewTLS(p.client)); err != nil {
		t.Fatalf("the allowed client on the gRPC port: %v", err)
	}
	if code, err := getOver("https://"+httpAddr+"/healthz", p.client); err != nil || code != 200 {
		t.Fatalf("the allowed client on the HTTP port: %d %v", code, err)
	}

	other, err := testpki.NewCA("another CA")
	if err != nil {
		t.Fatal(err)
	}
	foreign, err := other.Issue(testpki.Leaf{Name: "envoy", URIs: []string{envoyID}})
	if err != nil {
		t.Fatal(err)
	}
	if err := other.Write(foreign, p.dir, "foreign"); err != nil {
		t.Fatal(err)
	}
	intruder := p.issue(t, testpki.Leaf{Name: "intruder", URIs: []string{"spiffe://cluster.local/ns/other/sa/intruder"}}, "intruder")
	expired := p.issue(t, testpki.Leaf{Name: "envoy", URIs: []string{envoyID}, Expired: true}, "expired")
	for _, c := range []struct {
		name string
		cfg  *tls.Config // nil: plain text
	}{
		{"plain text", nil},
		{"no client certificate", p.clientConfig(t, nil)},
		{"a certificate of another CA", p.clientConfig(t, foreign)},
		{"an expired certificate", p.clientConfig(t, expired)},
		{"outside the allow list", p.clientConfig(t, intruder)},
	} {
		t.Run(c.name, func(t *testing.T) {
			creds := insecure.NewCredentials()
			url := "https://" + httpAddr + "/healthz"
			if c.cfg != nil {
				creds = credentials.NewTLS(c.cfg)
			} else {
				url = "http://" + httpAddr + "/healthz"
			}
			if err := healthOver(grpcAddr, creds); err == nil {
				t.Error("the gRPC port answered")
			}
			if code, err := getOver(url, c.cfg); err == nil {
				t.Errorf("the HTTP port answered %d", code)
			}
		})
	}
	// The refusal of the intruder names its identity and the variable in the log.
	deadline := time.Now().Add(5 * time.Second)
	for !strings.Contains(s.stderr.String(), "spiffe://cluster.local/ns/other/sa/intruder") {
		if time.Now().After(deadline) {
			t.Fatalf("no log line names the refused identity; stderr:\n%s", s.stderr)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if !strings.Contains(s.stderr.String(), "SIDECAR_GRPC_TLS_ALLOWED_CLIENTS") {
		t.Errorf("the refusal does not name the allow list; stderr:\n%s", s.stderr)
	}
	// Still serving.
	if err := healthOver(grpcAddr, credentials.NewTLS(p.client)); err != nil {
		t.Fatalf("after the refusals: %v", err)
	}
}

// TestTLSRotation replaces the sidecar's certificate files as a Secret's update does: a
// connection opened before keeps working, new ones get the new certificate.
func TestTLSRotation(t *testing.T) {
	t.Parallel()
	p := newPortsTLS(t)
	mount := t.TempDir()
	swap := func(version string, pair *testpki.Pair) {
		t.Helper()
		dir := filepath.Join(mount, version)
		if err := os.Mkdir(dir, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := p.ca.Write(pair, dir, "tls"); err != nil {
			t.Fatal(err)
		}
		tmp := filepath.Join(mount, "..data_tmp")
		if err := os.Symlink(version, tmp); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, filepath.Join(mount, "..data")); err != nil {
			t.Fatal(err)
		}
	}
	swap("v1", p.server)
	for _, f := range []string{"tls.crt", "tls.key"} {
		if err := os.Symlink(filepath.Join("..data", f), filepath.Join(mount, f)); err != nil {
			t.Fatal(err)
		}
	}
	for _, port := range []string{"SIDECAR_GRPC_TLS", "SIDECAR_HTTP_TLS"} {
		p.env[port+"_CERT_FILE"], p.env[port+"_KEY_FILE"] = filepath.Join(mount, "tls.crt"), filepath.Join(mount, "tls.key")
	}
	n := startRLSWith(t, p, nil)
	serialOf := func(addr string, alpn string) string {
		t.Helper()
		cfg := p.client.Clone()
		cfg.NextProtos = []string{alpn}
		c, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", addr, cfg)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		return c.ConnectionState().PeerCertificates[0].SerialNumber.String()
	}
	// The open gRPC connection, used before and after.
	if _, err := n.call(&rlsv3.RateLimitRequest{Domain: "d", Descriptors: []*rlv3.RateLimitDescriptor{rd("k=v")}}); err != nil {
		t.Fatal(err)
	}
	if got := serialOf(n.grpcAddr, "h2"); got != p.server.SerialNumber.String() {
		t.Fatalf("serial %s before the rotation", got)
	}
	second, err := p.ca.Issue(testpki.Localhost("sidecar v2"))
	if err != nil {
		t.Fatal(err)
	}
	swap("v2", second)
	deadline := time.Now().Add(10 * time.Second)
	for _, addr := range []struct{ addr, alpn string }{{n.grpcAddr, "h2"}, {n.httpAddr, "http/1.1"}} {
		for serialOf(addr.addr, addr.alpn) != second.SerialNumber.String() {
			if time.Now().After(deadline) {
				t.Fatalf("%s: new connections still get the old certificate", addr.addr)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	if n.conn.GetState().String() != "READY" {
		t.Errorf("the connection opened before the rotation is %s", n.conn.GetState())
	}
	if _, err := n.call(&rlsv3.RateLimitRequest{Domain: "d", Descriptors: []*rlv3.RateLimitDescriptor{rd("k=v")}}); err != nil {
		t.Fatalf("the connection opened before the rotation: %v", err)
	}
}

// TestTLSHTTPPortRefusesByClosing: at the HTTP port's connection caps a TLS client's
// connection is closed before the handshake, not answered with the plain-text 429 a
// plain port writes (which a TLS client could only read as a broken handshake); the
// connections within the cap are served.
func TestTLSHTTPPortRefusesByClosing(t *testing.T) {
	t.Parallel()
	p := newPortsTLS(t)
	p.env["SIDECAR_HTTP_MAX_CONNS_PER_IP"] = "1"
	s := start(t, p.env)
	_, httpAddr := s.addrs(30 * time.Second)

	held, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", httpAddr, p.client)
	if err != nil {
		t.Fatalf("the first connection: %v", err)
	}
	defer held.Close()
	_ = held.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(held, "GET /healthz HTTP/1.1\r\nHost: sidecar\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(held), nil)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("the first connection, within the cap: %v %v", resp, err)
	}
	resp.Body.Close()

	// A second connection from the same address is over SIDECAR_HTTP_MAX_CONNS_PER_IP.
	second, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", httpAddr, p.client)
	if err == nil {
		second.Close()
		t.Fatal("a connection over the per-address cap was served")
	}
	if strings.Contains(err.Error(), "does not look like a TLS handshake") || strings.Contains(err.Error(), "HTTP") {
		t.Fatalf("the refusal reached the TLS client as plain text: %v", err)
	}
	var alert tls.AlertError
	if !errors.Is(err, io.EOF) && !errors.Is(err, syscall.ECONNRESET) && !errors.As(err, &alert) {
		t.Errorf("the refusal: %v, want the connection closed", err)
	}
	// The refused connection was counted. A scrape that races the release of the held
	// connection's place is refused and counted too, so the count is at least 1.
	held.Close()
	refused := regexp.MustCompile(`(?m)^converger_sidecar_http_connections_refused_total ([0-9]+)$`)
	deadline := time.Now().Add(10 * time.Second)
	for {
		body, err := getBody("https://"+httpAddr+"/metrics", p.client)
		if m := refused.FindStringSubmatch(body); err == nil && m != nil && m[1] != "0" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("converger_sidecar_http_connections_refused_total is not counted: %v\n%s", err, body)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// getBody GETs url on a connection of its own, closed after the answer (so that it
// holds no place in a per-address cap after it returns).
func getBody(url string, cfg *tls.Config) (string, error) {
	client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: cfg, DisableKeepAlives: true}}
	resp, err := client.Get(url)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return string(b), err
}
