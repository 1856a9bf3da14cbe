package rlsxds_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	rlsconfv3 "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/converger/edge/shared/testpki"
	"github.com/converger/edge/shared/tlsconfig"
	"github.com/converger/edge/sidecar/limiter"
	"github.com/converger/edge/sidecar/rls"
	"github.com/converger/edge/sidecar/rlsxds"
	"github.com/converger/edge/sidecar/rlsxds/xdstest"
)

// shop is a RateLimitConfig of one rule: key client, perMinute a minute.
func shop(name string, perMinute uint32) *rlsconfv3.RateLimitConfig {
	return &rlsconfv3.RateLimitConfig{Name: name, Domain: "shop", Descriptors: []*rlsconfv3.RateLimitDescriptor{{
		Key: "client", RateLimit: &rlsconfv3.RateLimitPolicy{Unit: rlsconfv3.RateLimitUnit_MINUTE, RequestsPerUnit: perMinute},
	}}}
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// limitOf is the limit the service applies to (client=id) in domain shop, 0 for none.
func limitOf(t *testing.T, svc *rls.Service, id string) uint32 {
	t.Helper()
	var resp rls.Response
	err := svc.Decide(&rls.Request{Domain: "shop", Descriptors: []rls.Descriptor{{
		Entries: []rls.Entry{{Key: "client", Value: id}}, HasHits: true, // checked, not counted
	}}}, &resp)
	if err != nil {
		t.Fatal(err)
	}
	return resp.Statuses[0].Limit.PerUnit
}

// The client against go-control-plane's server and snapshot cache: a valid snapshot is
// applied and ACKed, an invalid one NACKed with its problem while the rules stay, an
// empty one removes the rules, and a restarted server is followed again.
func TestFollowsManagementServer(t *testing.T) {
	srv := xdstest.Start(t, "127.0.0.1:0")
	srv.Set("edge-1", "v1", shop("shop-rules", 5))

	reg := prometheus.NewRegistry()
	svc := rls.New(limiter.New(limiter.Options{}), nil, rls.Options{WaitForRules: true, Metrics: rls.NewMetrics(reg)})
	var resp rls.Response
	if err := svc.Decide(&rls.Request{Domain: "shop", Descriptors: []rls.Descriptor{{}}}, &resp); err != rls.ErrNoRules {
		t.Fatalf("before the first rules: %v, want %v", err, rls.ErrNoRules)
	}
	c := rlsxds.New(rlsxds.Options{
		ServerURL: srv.Addr, NodeID: "edge-1", Metadata: map[string]string{"zone": "a"},
		BackoffInitial: 20 * time.Millisecond, BackoffMax: 100 * time.Millisecond, Registry: reg,
	}, svc)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { c.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })

	waitFor(t, "v1 applied", func() bool { return c.Status().Version == "v1" })
	if got := limitOf(t, svc, "c1"); got != 5 {
		t.Fatalf("v1: limit %d, want 5", got)
	}
	st := c.Status()
	if !st.Connected || !st.Applied {
		t.Errorf("status %+v", st)
	}
	first := srv.Requests()[0]
	if first.GetTypeUrl() != rlsxds.TypeURL || first.GetNode().GetId() != "edge-1" || first.GetNode().GetMetadata().GetFields()["zone"].GetStringValue() != "a" {
		t.Errorf("subscription %v", first)
	}
	if testutil.ToFloat64(c.Versions().WithLabelValues("v1")) != 1 {
		t.Errorf("version metric not set")
	}

	// A rule without a unit: refused whole, the problem in error_detail, v1 stays.
	bad := shop("shop-rules", 9)
	bad.Descriptors[0].RateLimit.Unit = rlsconfv3.RateLimitUnit_UNKNOWN
	other := shop("other", 7)
	other.Domain = "other"
	srv.Set("edge-1", "v2", other, bad)
	waitFor(t, "the NACK of v2", func() bool {
		for _, r := range srv.Requests() {
			if d := r.GetErrorDetail(); d != nil {
				if r.GetVersionInfo() != "v1" || r.GetResponseNonce() == "" ||
					d.GetMessage() != "shop-rules: descriptors[0].rate_limit: invalid rate limit unit 'UNKNOWN'" {
					t.Errorf("NACK %v", r)
				}
				return true
			}
		}
		return false
	})
	if got := limitOf(t, svc, "c1"); got != 5 || c.Status().Version != "v1" {
		t.Errorf("after the NACK: limit %d, version %q; want v1's 5", got, c.Status().Version)
	}
	// go-control-plane answers a NACK with the same version again: the client NACKs each
	// repeat after a growing wait (20 ms doubling to 100 ms here), not in a busy loop.
	time.Sleep(500 * time.Millisecond)
	if got := testutil.ToFloat64(c.Updates().WithLabelValues("rejected")); got < 1 || got > 20 {
		t.Errorf("rejected updates in 0.5 s: %v, want from 1 to 20", got)
	}

	// Two configs of one domain merge only with MergeDomains; here they are refused.
	srv.Set("edge-1", "v3", shop("a", 1), shop("b", 2))
	waitFor(t, "the NACK of v3", func() bool { return c.Status().Rejected == "v3" })
	if !strings.Contains(c.Status().Error, "duplicate domain 'shop'") {
		t.Errorf("v3 refused for %q", c.Status().Error)
	}

	// Removed: a snapshot with no rules leaves none.
	srv.Set("edge-1", "v4")
	waitFor(t, "v4 applied", func() bool { return c.Status().Version == "v4" })
	if got := limitOf(t, svc, "c1"); got != 0 {
		t.Errorf("after removal: limit %d", got)
	}

	// The server restarts, with a new version while it was down: followed again.
	srv.Stop()
	waitFor(t, "the stream's end seen", func() bool { return !c.Status().Connected })
	srv.Set("edge-1", "v5", shop("shop-rules", 11))
	if got := limitOf(t, svc, "c1"); got != 0 {
		t.Errorf("while the server is down: limit %d", got)
	}
	srv.Restart()
	waitFor(t, "v5 applied after the restart", func() bool { return c.Status().Version == "v5" })
	if got := limitOf(t, svc, "c1"); got != 11 {
		t.Errorf("v5: limit %d, want 11", got)
	}
	if !c.Status().Connected {
		t.Error("not connected after the restart")
	}
}

// syncBuffer collects a logger's lines from the client's goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// follow runs a client of node against srv with tlsCfg (nil: plain text) until the
// test ends.
func follow(t *testing.T, srv *xdstest.Server, node string, tlsCfg *tls.Config) (*rlsxds.Client, *rls.Service, *syncBuffer) {
	t.Helper()
	logs := &syncBuffer{}
	svc := rls.New(limiter.New(limiter.Options{}), nil, rls.Options{WaitForRules: true})
	c := rlsxds.New(rlsxds.Options{
		ServerURL: srv.Addr, NodeID: node, TLS: tlsCfg,
		BackoffInitial: 20 * time.Millisecond, BackoffMax: 100 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(logs, nil)),
	}, svc)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { c.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	return c, svc, logs
}

// refused waits for the client's stream to fail and checks that no rules came through
// and that the server never read a request of node: the connection was refused.
func refused(t *testing.T, srv *xdstest.Server, node string, c *rlsxds.Client, svc *rls.Service, logs *syncBuffer, want string) {
	t.Helper()
	waitFor(t, node+"'s stream refused", func() bool {
		return strings.Contains(logs.String(), "the stream to the server ended") && strings.Contains(logs.String(), want)
	})
	if st := c.Status(); st.Connected || st.Applied {
		t.Errorf("%s: status %+v, want neither connected nor applied", node, st)
	}
	var resp rls.Response
	if err := svc.Decide(&rls.Request{Domain: "shop", Descriptors: []rls.Descriptor{{}}}, &resp); err != rls.ErrNoRules {
		t.Errorf("%s: %v, want %v", node, err, rls.ErrNoRules)
	}
	for _, r := range srv.Requests() {
		if r.GetNode().GetId() == node {
			t.Errorf("the server read a request of %s: %v", node, r)
		}
	}
}

// The connection to the management server over TLS with shared/tlsconfig's client, as
// the sidecar makes it from RLS_XDS_TLS_*: the server's certificate verified against the
// CA, then mutual TLS with the client's certificate.
func TestTLS(t *testing.T) {
	dir := t.TempDir()
	ca, err := testpki.NewCA("xds test CA")
	if err != nil {
		t.Fatal(err)
	}
	server, err := ca.Issue(testpki.Localhost("xds server"))
	if err != nil {
		t.Fatal(err)
	}
	client, err := ca.Issue(testpki.Leaf{Name: "edge", URIs: []string{"spiffe://cluster.local/ns/edge/sa/sidecar"}})
	if err != nil {
		t.Fatal(err)
	}
	if err := ca.Write(server, dir, "server"); err != nil {
		t.Fatal(err)
	}
	if err := ca.Write(client, dir, "client"); err != nil {
		t.Fatal(err)
	}
	serverTLS := func(env map[string]string) *tls.Config {
		f, err := tlsconfig.LoadServer(func(k string) string { return env[k] }, "XDS_TLS")
		if err != nil {
			t.Fatal(err)
		}
		s, err := tlsconfig.NewServer(f, tlsconfig.Options{}, "h2")
		if err != nil {
			t.Fatal(err)
		}
		return s.Config()
	}
	clientTLS := func(env map[string]string) *tls.Config {
		f, err := tlsconfig.LoadClient(func(k string) string { return env[k] }, "RLS_XDS_TLS")
		if err != nil {
			t.Fatal(err)
		}
		cfg, err := tlsconfig.ClientConfig(f, "localhost", tlsconfig.Options{})
		if err != nil {
			t.Fatal(err)
		}
		return cfg
	}
	withCA := clientTLS(map[string]string{"RLS_XDS_TLS_CA_FILE": server.CAFile})
	withCert := clientTLS(map[string]string{"RLS_XDS_TLS_CA_FILE": server.CAFile,
		"RLS_XDS_TLS_CERT_FILE": client.CertFile, "RLS_XDS_TLS_KEY_FILE": client.KeyFile})

	t.Run("TLS", func(t *testing.T) {
		srv := xdstest.StartTLS(t, "127.0.0.1:0", serverTLS(map[string]string{
			"XDS_TLS_CERT_FILE": server.CertFile, "XDS_TLS_KEY_FILE": server.KeyFile}))
		for _, n := range []string{"tls", "plain"} {
			srv.Set(n, "v1", shop("shop-rules", 5))
		}
		c, svc, _ := follow(t, srv, "tls", withCA)
		waitFor(t, "v1 over TLS", func() bool { return c.Status().Version == "v1" })
		if got := limitOf(t, svc, "c1"); got != 5 {
			t.Errorf("over TLS: limit %d, want 5", got)
		}
		c, svc, logs := follow(t, srv, "plain", nil)
		refused(t, srv, "plain", c, svc, logs, "server preface") // the TLS server hung up on it
	})

	// cert-manager renews the server's certificate from a new CA and the CA file the
	// sidecar reads (RLS_XDS_TLS_CA_FILE) with it: after the server restarts, the client
	// reconnects verifying against the new CA, without a restart of its own.
	t.Run("CA rotated", func(t *testing.T) {
		mount := t.TempDir()
		put := func(name string, b []byte) {
			t.Helper()
			path := filepath.Join(mount, name)
			if err := os.WriteFile(path+".tmp", b, 0o600); err != nil {
				t.Fatal(err)
			}
			if err := os.Rename(path+".tmp", path); err != nil {
				t.Fatal(err)
			}
		}
		put("tls.crt", server.CertPEM)
		put("tls.key", server.KeyPEM)
		put("ca.crt", ca.CertPEM)
		quick := tlsconfig.Options{CheckEvery: 10 * time.Millisecond}
		st, err := tlsconfig.NewServer(&tlsconfig.ServerFiles{Name: "XDS_TLS", CertFile: filepath.Join(mount, "tls.crt"), KeyFile: filepath.Join(mount, "tls.key")}, quick, "h2")
		if err != nil {
			t.Fatal(err)
		}
		srv := xdstest.StartTLS(t, "127.0.0.1:0", st.Config())
		srv.Set("rotated", "v1", shop("shop-rules", 5))
		cc, err := tlsconfig.ClientConfig(&tlsconfig.ClientFiles{Name: "RLS_XDS_TLS", CAFile: filepath.Join(mount, "ca.crt")}, srv.Addr, quick)
		if err != nil {
			t.Fatal(err)
		}
		c, svc, _ := follow(t, srv, "rotated", cc)
		waitFor(t, "v1 over TLS", func() bool { return c.Status().Version == "v1" })

		next, err := testpki.NewCA("xds test CA, renewed")
		if err != nil {
			t.Fatal(err)
		}
		renewed, err := next.Issue(testpki.Localhost("xds server"))
		if err != nil {
			t.Fatal(err)
		}
		put("tls.crt", renewed.CertPEM)
		put("tls.key", renewed.KeyPEM)
		put("ca.crt", next.CertPEM)
		srv.Set("rotated", "v2", shop("shop-rules", 9))
		srv.Restart()
		waitFor(t, "v2 after the CA's rotation", func() bool { return c.Status().Version == "v2" })
		if got := limitOf(t, svc, "c1"); got != 9 {
			t.Errorf("after the CA's rotation: limit %d, want 9", got)
		}
	})

	t.Run("mutual TLS", func(t *testing.T) {
		srv := xdstest.StartTLS(t, "127.0.0.1:0", serverTLS(map[string]string{
			"XDS_TLS_CERT_FILE": server.CertFile, "XDS_TLS_KEY_FILE": server.KeyFile, "XDS_TLS_CLIENT_CA_FILE": server.CAFile}))
		for _, n := range []string{"with-cert", "without-cert"} {
			srv.Set(n, "v1", shop("shop-rules", 7))
		}
		c, svc, logs := follow(t, srv, "without-cert", withCA)
		refused(t, srv, "without-cert", c, svc, logs, "certificate required")
		c, svc, _ = follow(t, srv, "with-cert", withCert)
		waitFor(t, "v1 over mutual TLS", func() bool { return c.Status().Version == "v1" })
		if got := limitOf(t, svc, "c1"); got != 7 {
			t.Errorf("over mutual TLS: limit %d, want 7", got)
		}
	})
}
