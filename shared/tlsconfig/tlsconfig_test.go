package tlsconfig_test

import (
	"bufio"
	"crypto/tls"
	"errors"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/converger/edge/shared/testpki"
	"github.com/converger/edge/shared/tlsconfig"
)

// pki is a CA with a server certificate and a client certificate written to files.
type pki struct {
	dir            string
	ca             *testpki.CA
	server, client *testpki.Pair
}

func newPKI(t *testing.T, clientURI string) *pki {
	t.Helper()
	p := &pki{dir: t.TempDir()}
	var err error
	if p.ca, err = testpki.NewCA("test CA"); err != nil {
		t.Fatal(err)
	}
	p.server = p.issue(t, testpki.Localhost("server"), "server")
	p.client = p.issue(t, testpki.Leaf{Name: "client", URIs: []string{clientURI}}, "client")
	return p
}

func (p *pki) issue(t *testing.T, l testpki.Leaf, name string) *testpki.Pair {
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

// echo serves lines back on a TLS listener on loopback; handshake errors go to errs.
type echo struct {
	addr string
	errs chan error
}

func serve(t *testing.T, s *tlsconfig.Server) *echo {
	t.Helper()
	raw, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ln := tls.NewListener(raw, s.Config())
	t.Cleanup(func() { ln.Close() })
	e := &echo{addr: raw.Addr().String(), errs: make(chan error, 16)}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				_ = c.SetDeadline(time.Now().Add(10 * time.Second))
				if err := c.(*tls.Conn).Handshake(); err != nil {
					e.errs <- err
					return
				}
				_, _ = io.Copy(c, c)
			}()
		}
	}()
	return e
}

func newServer(t *testing.T, env map[string]string) *tlsconfig.Server {
	t.Helper()
	f, err := tlsconfig.LoadServer(func(k string) string { return env[k] }, "PORT_TLS")
	if err != nil {
		t.Fatal(err)
	}
	s, err := tlsconfig.NewServer(f, tlsconfig.Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), CheckEvery: 10 * time.Millisecond}, "test/1")
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func clientConfig(t *testing.T, caFile, certFile, keyFile string) *tls.Config {
	t.Helper()
	env := map[string]string{"C_TLS_CA_FILE": caFile, "C_TLS_CERT_FILE": certFile, "C_TLS_KEY_FILE": keyFile, "C_TLS_SERVER_NAME": "localhost"}
	f, err := tlsconfig.LoadClient(func(k string) string { return env[k] }, "C_TLS")
	if err != nil {
		t.Fatal(err)
	}
	c, err := tlsconfig.NewClient(f, "", tlsconfig.Options{})
	if err != nil {
		t.Fatal(err)
	}
	cfg := c.Config()
	cfg.NextProtos = []string{"test/1"}
	return cfg
}

// roundTrip connects, sends a line and reads it back: the error of the first step that
// fails (with TLS 1.3 a refused client certificate shows at the first read).
func roundTrip(addr string, cfg *tls.Config) (*tls.Conn, error) {
	c, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", addr, cfg)
	if err != nil {
		return nil, err
	}
	if err := ping(c); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

func ping(c net.Conn) error {
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.WriteString(c, "ping\n"); err != nil {
		return err
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return err
	}
	if line != "ping\n" {
		return errors.New("echo: " + line)
	}
	return nil
}

func mtlsEnv(p *pki) map[string]string {
	return map[string]string{"PORT_TLS_CERT_FILE": p.server.CertFile, "PORT_TLS_KEY_FILE": p.server.KeyFile,
		"PORT_TLS_CLIENT_CA_FILE": p.server.CAFile}
}

func TestServerTLSOnly(t *testing.T) {
	p := newPKI(t, "spiffe://cluster.local/ns/edge/sa/envoy")
	e := serve(t, newServer(t, map[string]string{"PORT_TLS_CERT_FILE": p.server.CertFile, "PORT_TLS_KEY_FILE": p.server.KeyFile}))

	c, err := roundTrip(e.addr, clientConfig(t, p.server.CAFile, "", ""))
	if err != nil {
		t.Fatalf("a client that trusts the CA: %v", err)
	}
	if st := c.ConnectionState(); st.NegotiatedProtocol != "test/1" || st.Version < tls.VersionTLS12 {
		t.Errorf("ALPN %q, version %x", st.NegotiatedProtocol, st.Version)
	}
	c.Close()

	// A plain-text client gets no answer, and the server says why.
	plain, err := net.Dial("tcp", e.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer plain.Close()
	if err := ping(plain); err == nil {
		t.Fatal("a plain-text client was answered on a TLS port")
	}
	if err := <-e.errs; !strings.Contains(err.Error(), "tls") {
		t.Errorf("server's handshake error: %v", err)
	}

	// TLS 1.1 is refused.
	old := clientConfig(t, p.server.CAFile, "", "")
	old.MinVersion, old.MaxVersion = tls.VersionTLS10, tls.VersionTLS11
	if _, err := roundTrip(e.addr, old); err == nil {
		t.Error("TLS 1.1 was accepted")
	}
	// A client that does not trust the server's CA refuses it.
	other := newPKI(t, "spiffe://x/y")
	if _, err := roundTrip(e.addr, clientConfig(t, other.server.CAFile, "", "")); err == nil ||
		!strings.Contains(err.Error(), "certificate signed by unknown authority") {
		t.Errorf("a client of another CA: %v", err)
	}
}

func TestServerRequiresClientCertificates(t *testing.T) {
	p := newPKI(t, "spiffe://cluster.local/ns/edge/sa/envoy")
	e := serve(t, newServer(t, mtlsEnv(p)))

	if _, err := roundTrip(e.addr, clientConfig(t, p.server.CAFile, p.client.CertFile, p.client.KeyFile)); err != nil {
		t.Fatalf("a client with a certificate of the CA: %v", err)
	}
	if _, err := roundTrip(e.addr, clientConfig(t, p.server.CAFile, "", "")); err == nil {
		t.Error("a client without a certificate was served")
	} else if err := <-e.errs; !strings.Contains(err.Error(), "client didn't provide a certificate") {
		t.Errorf("server's refusal: %v", err)
	}

	// A certificate of another CA, and an expired one of the right CA.
	other := newPKI(t, "spiffe://cluster.local/ns/edge/sa/envoy")
	if _, err := roundTrip(e.addr, clientConfig(t, p.server.CAFile, other.client.CertFile, other.client.KeyFile)); err == nil {
		t.Error("a client certificate of another CA was accepted")
	} else if err := <-e.errs; !strings.Contains(err.Error(), "unknown authority") {
		t.Errorf("server's refusal: %v", err)
	}
	expired := p.issue(t, testpki.Leaf{Name: "old", URIs: []string{"spiffe://cluster.local/ns/edge/sa/envoy"}, Expired: true}, "expired")
	if _, err := roundTrip(e.addr, clientConfig(t, p.server.CAFile, expired.CertFile, expired.KeyFile)); err == nil {
		t.Error("an expired client certificate was accepted")
	} else if err := <-e.errs; !strings.Contains(err.Error(), "expired") {
		t.Errorf("server's refusal: %v", err)
	}
}

func TestServerExpiredCertificateRefusedByClients(t *testing.T) {
	p := newPKI(t, "spiffe://x/y")
	expired := p.issue(t, testpki.Leaf{Name: "server", DNS: []string{"localhost"}, Expired: true}, "server")
	e := serve(t, newServer(t, map[string]string{"PORT_TLS_CERT_FILE": expired.CertFile, "PORT_TLS_KEY_FILE": expired.KeyFile}))
	if _, err := roundTrip(e.addr, clientConfig(t, p.server.CAFile, "", "")); err == nil || !strings.Contains(err.Error(), "expired") {
		t.Errorf("an expired server certificate: %v", err)
	}
}

func TestServerAllowList(t *testing.T) {
	p := newPKI(t, "spiffe://cluster.local/ns/edge/sa/envoy")
	env := mtlsEnv(p)
	env["PORT_TLS_ALLOWED_CLIENTS"] = "spiffe://cluster.local/ns/edge/sa/envoy, core.edge.svc"
	e := serve(t, newServer(t, env))

	if _, err := roundTrip(e.addr, clientConfig(t, p.server.CAFile, p.client.CertFile, p.client.KeyFile)); err != nil {
		t.Fatalf("an allowed URI: %v", err)
	}
	dns := p.issue(t, testpki.Leaf{Name: "core", DNS: []string{"CORE.edge.svc"}}, "core")
	if _, err := roundTrip(e.addr, clientConfig(t, p.server.CAFile, dns.CertFile, dns.KeyFile)); err != nil {
		t.Fatalf("an allowed DNS name: %v", err)
	}
	intruder := p.issue(t, testpki.Leaf{Name: "intruder", URIs: []string{"spiffe://cluster.local/ns/other/sa/envoy"}}, "intruder")
	if _, err := roundTrip(e.addr, clientConfig(t, p.server.CAFile, intruder.CertFile, intruder.KeyFile)); err == nil {
		t.Fatal("a client outside the allow list was served")
	} else if !strings.Contains(err.Error(), "bad certificate") {
		t.Errorf("the client's error: %v", err)
	}
	err := <-e.errs
	if !errors.Is(err, tlsconfig.ErrNotAllowed) || !strings.Contains(err.Error(), "PORT_TLS_ALLOWED_CLIENTS") ||
		!strings.Contains(err.Error(), "spiffe://cluster.local/ns/other/sa/envoy") {
		t.Errorf("the server's refusal names neither the list nor the identity: %v", err)
	}

	// A prefix entry.
	if !tlsconfig.Allowed([]string{"spiffe://cluster.local/ns/edge/*"}, "spiffe://cluster.local/ns/edge/sa/a") ||
		tlsconfig.Allowed([]string{"spiffe://cluster.local/ns/edge/*"}, "spiffe://cluster.local/ns/edgy/sa/a") ||
		tlsconfig.Allowed([]string{"spiffe://cluster.local/ns/edge/sa/a"}, "SPIFFE://cluster.local/ns/edge/sa/A") {
		t.Error("Allowed's prefix or case rules")
	}
}

func TestServerOptionalClientCertificates(t *testing.T) {
	p := newPKI(t, "spiffe://cluster.local/ns/edge/sa/envoy")
	env := mtlsEnv(p)
	env["PORT_TLS_CLIENT_AUTH"] = "optional"
	e := serve(t, newServer(t, env))
	if _, err := roundTrip(e.addr, clientConfig(t, p.server.CAFile, "", "")); err != nil {
		t.Errorf("optional: a client without a certificate: %v", err)
	}
	if _, err := roundTrip(e.addr, clientConfig(t, p.server.CAFile, p.client.CertFile, p.client.KeyFile)); err != nil {
		t.Errorf("optional: a client with one: %v", err)
	}
	other := newPKI(t, "spiffe://x/y")
	if _, err := roundTrip(e.addr, clientConfig(t, p.server.CAFile, other.client.CertFile, other.client.KeyFile)); err == nil {
		t.Error("optional: an invalid client certificate was accepted")
	}
}

// TestServerRotation swaps the Secret's files as Kubernetes does (a new directory, the
// ..data link renamed over the old one): new connections get the new certificate, an
// open one carries on; files that cannot be used keep the last good ones.
func TestServerRotation(t *testing.T) {
	p := newPKI(t, "spiffe://cluster.local/ns/edge/sa/envoy")
	mount := t.TempDir()
	version := func(name string, pair *testpki.Pair) {
		t.Helper()
		dir := filepath.Join(mount, name)
		if err := os.Mkdir(dir, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := p.ca.Write(pair, dir, "tls"); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(name, filepath.Join(mount, "..data_tmp")); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(filepath.Join(mount, "..data_tmp"), filepath.Join(mount, "..data")); err != nil {
			t.Fatal(err)
		}
	}
	version("v1", p.server)
	for _, f := range []string{"tls.crt", "tls.key", "tls-ca.crt"} {
		if err := os.Symlink(filepath.Join("..data", f), filepath.Join(mount, f)); err != nil {
			t.Fatal(err)
		}
	}
	e := serve(t, newServer(t, map[string]string{"PORT_TLS_CERT_FILE": filepath.Join(mount, "tls.crt"),
		"PORT_TLS_KEY_FILE": filepath.Join(mount, "tls.key"), "PORT_TLS_CLIENT_CA_FILE": filepath.Join(mount, "tls-ca.crt")}))
	cfg := clientConfig(t, p.server.CAFile, p.client.CertFile, p.client.KeyFile)
	old, err := roundTrip(e.addr, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer old.Close()
	if got := old.ConnectionState().PeerCertificates[0].SerialNumber; got.Cmp(p.server.SerialNumber) != 0 {
		t.Fatalf("serial %v, want the first certificate's", got)
	}

	second, err := p.ca.Issue(testpki.Localhost("server v2"))
	if err != nil {
		t.Fatal(err)
	}
	version("v2", second)
	serialOfNew := func() string {
		time.Sleep(20 * time.Millisecond) // past CheckEvery
		c, err := roundTrip(e.addr, cfg)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		return c.ConnectionState().PeerCertificates[0].SerialNumber.String()
	}
	if got := serialOfNew(); got != second.SerialNumber.String() {
		t.Fatalf("a new connection after the rotation got serial %s, want %s", got, second.SerialNumber)
	}
	if err := ping(old); err != nil {
		t.Fatalf("the connection opened before the rotation: %v", err)
	}

	// A half-written rotation (a key that is not the certificate's) keeps v2.
	third, err := p.ca.Issue(testpki.Localhost("server v3"))
	if err != nil {
		t.Fatal(err)
	}
	third.KeyPEM = p.server.KeyPEM
	version("v3", third)
	if got := serialOfNew(); got != second.SerialNumber.String() {
		t.Fatalf("unusable files replaced the certificate: serial %s", got)
	}
}

func TestLoadErrors(t *testing.T) {
	p := newPKI(t, "spiffe://x/y")
	for _, c := range []struct {
		env  map[string]string
		want string
	}{
		{map[string]string{"P_CERT_FILE": p.server.CertFile}, "set both"},
		{map[string]string{"P_CLIENT_CA_FILE": p.server.CAFile}, "need P_CERT_FILE"},
		{map[string]string{"P_CERT_FILE": p.server.CertFile, "P_KEY_FILE": p.server.KeyFile, "P_CLIENT_AUTH": "require"}, "needs P_CLIENT_CA_FILE"},
		{map[string]string{"P_CERT_FILE": p.server.CertFile, "P_KEY_FILE": p.server.KeyFile, "P_CLIENT_AUTH": "maybe", "P_CLIENT_CA_FILE": p.server.CAFile}, "must be require or optional"},
		{map[string]string{"P_CERT_FILE": p.server.CertFile, "P_KEY_FILE": p.server.KeyFile, "P_ALLOWED_CLIENTS": "a"}, "needs P_CLIENT_CA_FILE"},
		{map[string]string{"P_CERT_FILE": p.server.CertFile, "P_KEY_FILE": p.client.KeyFile}, "private key does not match"},
		{map[string]string{"P_CERT_FILE": p.server.CertFile, "P_KEY_FILE": p.server.KeyFile, "P_CLIENT_CA_FILE": p.server.KeyFile}, "no PEM certificate"},
		{map[string]string{"P_CERT_FILE": "/nonexistent", "P_KEY_FILE": p.server.KeyFile}, "no such file"},
	} {
		_, err := tlsconfig.LoadServer(func(k string) string { return c.env[k] }, "P")
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: %v, want %q", c.env, err, c.want)
		}
	}
	if f, err := tlsconfig.LoadServer(func(string) string { return "" }, "P"); f != nil || err != nil {
		t.Errorf("nothing set: %v, %v", f, err)
	}
	for _, c := range []struct {
		env  map[string]string
		want string
	}{
		{map[string]string{"P_CERT_FILE": p.client.CertFile, "P_KEY_FILE": p.client.KeyFile}, "need P_CA_FILE"},
		{map[string]string{"P_CA_FILE": p.server.CAFile, "P_CERT_FILE": p.client.CertFile}, "set both"},
		{map[string]string{"P_CA_FILE": "/nonexistent"}, "no such file"},
	} {
		_, err := tlsconfig.LoadClient(func(k string) string { return c.env[k] }, "P")
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: %v, want %q", c.env, err, c.want)
		}
	}
}

// replace writes b to path by a rename, as an editor or a Secret's update would.
func replace(t *testing.T, path string, b []byte) {
	t.Helper()
	if err := os.WriteFile(path+".tmp", b, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(path+".tmp", path); err != nil {
		t.Fatal(err)
	}
}

// TestClientCARotation rotates the CA a client trusts (AUTHZ_TLS_CA_FILE and the like):
// the next connection is verified against the new CA, an open one carries on, and a
// broken CA file keeps the last good one.
func TestClientCARotation(t *testing.T) {
	p := newPKI(t, "spiffe://x/y")
	next := newPKI(t, "spiffe://x/y")
	mount := t.TempDir()
	certFile, keyFile, caFile := filepath.Join(mount, "tls.crt"), filepath.Join(mount, "tls.key"), filepath.Join(mount, "ca.crt")
	serveWith := func(pair *testpki.Pair) {
		replace(t, certFile, pair.CertPEM)
		replace(t, keyFile, pair.KeyPEM)
	}
	serveWith(p.server)
	replace(t, caFile, p.ca.CertPEM)
	e := serve(t, newServer(t, map[string]string{"PORT_TLS_CERT_FILE": certFile, "PORT_TLS_KEY_FILE": keyFile}))

	f, err := tlsconfig.LoadClient(func(k string) string {
		return map[string]string{"C_TLS_CA_FILE": caFile}[k]
	}, "C_TLS")
	if err != nil {
		t.Fatal(err)
	}
	c, err := tlsconfig.NewClient(f, e.addr, tlsconfig.Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), CheckEvery: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	cfg := c.Config()
	cfg.NextProtos = []string{"test/1"}
	dial := func() (*tls.Conn, error) {
		time.Sleep(20 * time.Millisecond) // past CheckEvery
		return roundTrip(e.addr, cfg)
	}
	old, err := dial()
	if err != nil {
		t.Fatalf("before the rotation: %v", err)
	}
	defer old.Close()

	// The client trusts only the new CA now: the server's certificate of the old one is
	// refused at the next connection.
	replace(t, caFile, next.ca.CertPEM)
	if conn, err := dial(); err == nil {
		conn.Close()
		t.Fatal("a certificate of the CA no longer in the CA file was accepted")
	} else if !strings.Contains(err.Error(), "certificate signed by unknown authority") {
		t.Fatalf("refusal after the CA's rotation: %v", err)
	}
	// The server rotates too: its new certificate is verified against the new CA.
	serveWith(next.server)
	conn, err := dial()
	if err != nil {
		t.Fatalf("the new CA's certificate: %v", err)
	}
	if got := conn.ConnectionState().PeerCertificates[0].SerialNumber; got.Cmp(next.server.SerialNumber) != 0 {
		t.Errorf("serial %v, want the new certificate's", got)
	}
	conn.Close()
	if err := ping(old); err != nil {
		t.Fatalf("the connection opened before the rotation: %v", err)
	}

	// A broken CA file keeps the last good CA.
	replace(t, caFile, []byte("not a certificate\n"))
	if conn, err := dial(); err != nil {
		t.Fatalf("a broken CA file replaced the last good one: %v", err)
	} else {
		conn.Close()
	}

	// The name is still verified: the address's host (127.0.0.1) against a certificate
	// for another name.
	elsewhere, err := next.ca.Issue(testpki.Leaf{Name: "elsewhere", DNS: []string{"elsewhere.example"}})
	if err != nil {
		t.Fatal(err)
	}
	serveWith(elsewhere)
	if conn, err := dial(); err == nil {
		conn.Close()
		t.Fatal("a certificate for another name was accepted")
	} else if !strings.Contains(err.Error(), "127.0.0.1") {
		t.Errorf("refusal of another name: %v", err)
	}
}

// TestServerClientCARotation rotates a port's CA for client certificates
// (<prefix>_CLIENT_CA_FILE): the next client is verified against the new CA, an open
// connection carries on, and a broken CA file keeps the last good one.
func TestServerClientCARotation(t *testing.T) {
	p := newPKI(t, "spiffe://cluster.local/ns/edge/sa/envoy")
	next := newPKI(t, "spiffe://cluster.local/ns/edge/sa/envoy")
	caFile := filepath.Join(t.TempDir(), "ca.crt")
	replace(t, caFile, p.ca.CertPEM)
	e := serve(t, newServer(t, map[string]string{"PORT_TLS_CERT_FILE": p.server.CertFile, "PORT_TLS_KEY_FILE": p.server.KeyFile,
		"PORT_TLS_CLIENT_CA_FILE": caFile}))
	oldClient := clientConfig(t, p.server.CAFile, p.client.CertFile, p.client.KeyFile)
	newClient := clientConfig(t, p.server.CAFile, next.client.CertFile, next.client.KeyFile)
	dial := func(cfg *tls.Config) (*tls.Conn, error) {
		time.Sleep(20 * time.Millisecond) // past CheckEvery
		return roundTrip(e.addr, cfg)
	}
	old, err := dial(oldClient)
	if err != nil {
		t.Fatalf("before the rotation: %v", err)
	}
	defer old.Close()
	if _, err := dial(newClient); err == nil {
		t.Fatal("a client certificate of a CA not yet trusted was accepted")
	} else if err := <-e.errs; !strings.Contains(err.Error(), "unknown authority") {
		t.Fatalf("server's refusal: %v", err)
	}

	replace(t, caFile, next.ca.CertPEM)
	conn, err := dial(newClient)
	if err != nil {
		t.Fatalf("a client of the new CA after the rotation: %v", err)
	}
	conn.Close()
	if _, err := dial(oldClient); err == nil {
		t.Fatal("a client of the CA rotated out was accepted")
	} else if err := <-e.errs; !strings.Contains(err.Error(), "unknown authority") {
		t.Fatalf("server's refusal: %v", err)
	}
	if err := ping(old); err != nil {
		t.Fatalf("the connection opened before the rotation: %v", err)
	}

	replace(t, caFile, []byte("-----BEGIN CERTIFICATE-----\nbroken\n"))
	if conn, err := dial(newClient); err != nil {
		t.Fatalf("a broken CA file replaced the last good one: %v", err)
	} else {
		conn.Close()
	}
}

func TestClientServerName(t *testing.T) {
	p := newPKI(t, "spiffe://x/y")
	f := &tlsconfig.ClientFiles{Name: "C_TLS", CAFile: p.server.CAFile}
	for addr, want := range map[string]string{"sidecar.edge.svc:8081": "sidecar.edge.svc", "[::1]:8081": "::1",
		"dns:///sidecar.edge.svc:8081": "sidecar.edge.svc", "localhost": "localhost"} {
		c, err := tlsconfig.NewClient(f, addr, tlsconfig.Options{})
		if err != nil {
			t.Fatal(err)
		}
		if got := c.Config().ServerName; got != want {
			t.Errorf("%s: server name %q, want %q", addr, got, want)
		}
	}
	if _, err := tlsconfig.NewClient(f, "", tlsconfig.Options{}); err == nil || !strings.Contains(err.Error(), "C_TLS_SERVER_NAME") {
		t.Errorf("no name and no address: %v", err)
	}
	named := *f
	named.ServerName = "core.edge.svc"
	if c, err := tlsconfig.NewClient(&named, "10.0.0.1:8081", tlsconfig.Options{}); err != nil || c.Config().ServerName != "core.edge.svc" {
		t.Errorf("SERVER_NAME overrides the address: %v", err)
	}
}
