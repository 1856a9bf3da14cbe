package benchtls_test

import (
	"context"
	"net"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/converger/edge/bench/benchtls"
	"github.com/converger/edge/bench/noop"
	"github.com/converger/edge/bench/rawcheck"
	"github.com/converger/edge/bench/rawhttp"
)

// With -mtls the no-op serves over mutual TLS and the load generator's connections
// reach it; a plain-text client does not.
func TestMutualTLS(t *testing.T) {
	cleanup, err := benchtls.Enable()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cleanup(); os.Unsetenv(benchtls.DirEnv) })
	if len(benchtls.SidecarEnv()) != 8 {
		t.Errorf("sidecar variables: %v", benchtls.SidecarEnv())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	addrc := make(chan string, 1)
	errc := make(chan error, 1)
	go func() { errc <- noop.Serve(ctx, "127.0.0.1:0", func(a net.Addr) { addrc <- a.String() }) }()
	var addr string
	select {
	case addr = <-addrc:
	case err := <-errc:
		t.Fatal(err)
	}
	conns, err := rawcheck.Dial(ctx, addr, 1)
	if err != nil {
		t.Fatalf("the load generator over mutual TLS: %v", err)
	}
	rawcheck.Close(conns)

	plain, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer plain.Close()
	cctx, ccancel := context.WithTimeout(ctx, 3*time.Second)
	defer ccancel()
	if _, err := healthpb.NewHealthClient(plain).Check(cctx, &healthpb.HealthCheckRequest{}); err == nil {
		t.Error("a plain-text client was answered")
	}
	cancel()
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
}

// With -mtls the no-op forward-auth servers (both HTTP servers) serve over mutual TLS:
// the load generator's connections (rawhttp with ClientConfig) and HTTPClient reach them
// at URL's https:// address, a plain-text or certificate-less client does not.
func TestMutualTLSForwardAuth(t *testing.T) {
	cleanup, err := benchtls.Enable()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cleanup(); os.Unsetenv(benchtls.DirEnv) })
	env := strings.Join(benchtls.SidecarEnv(), " ")
	for _, v := range []string{"SIDECAR_HTTP_TLS_CERT_FILE=", "SIDECAR_HTTP_TLS_CLIENT_CA_FILE=", "SIDECAR_HTTP_TLS_ALLOWED_CLIENTS=" + benchtls.ClientID} {
		if !strings.Contains(env, v) {
			t.Errorf("the sidecar's variables lack %s: %s", v, env)
		}
	}
	cfg, err := benchtls.ClientConfig()
	if err != nil {
		t.Fatal(err)
	}
	req := rawhttp.Request("GET", "/check", "127.0.0.1", map[string]string{"x-forwarded-uri": "/"})
	for name, serve := range map[string]func(context.Context, string, func(net.Addr)) error{"net/http": noop.ServeHTTP, "fasthttp": noop.ServeFastHTTP} {
		t.Run(name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			addrc := make(chan string, 1)
			errc := make(chan error, 1)
			go func() { errc <- serve(ctx, "127.0.0.1:0", func(a net.Addr) { addrc <- a.String() }) }()
			var addr string
			select {
			case addr = <-addrc:
			case err := <-errc:
				t.Fatal(err)
			}
			c := rawhttp.Conn{Addr: addr, TLS: cfg}
			for range 3 { // one handshake, then the same connection
				if status, err := c.Do(ctx, req); err != nil || status != 200 {
					t.Fatalf("the load generator over mutual TLS: %d %v", status, err)
				}
			}
			c.Close()
			client, err := benchtls.HTTPClient(5 * time.Second)
			if err != nil {
				t.Fatal(err)
			}
			if u := benchtls.URL(addr, "/readyz"); !strings.HasPrefix(u, "https://") {
				t.Errorf("URL on mutual TLS: %s", u)
			} else if resp, err := client.Get(u); err != nil || resp.StatusCode != 200 {
				t.Errorf("HTTPClient: %v %v", resp, err)
			} else {
				resp.Body.Close()
			}

			plain := rawhttp.Conn{Addr: addr}
			if status, err := plain.Do(ctx, req); err == nil && status == 200 {
				t.Error("a plain-text client was answered")
			}
			plain.Close()
			noCert := cfg.Clone()
			noCert.GetClientCertificate = nil
			anon := rawhttp.Conn{Addr: addr, TLS: noCert}
			if status, err := anon.Do(ctx, req); err == nil && status == 200 {
				t.Error("a client without a certificate was answered")
			}
			anon.Close()
			cancel()
			if err := <-errc; err != nil {
				t.Fatal(err)
			}
		})
	}
	os.Unsetenv(benchtls.DirEnv)
	if u := benchtls.URL("127.0.0.1:1", "/metrics"); u != "http://127.0.0.1:1/metrics" {
		t.Errorf("URL in plain text: %s", u)
	}
	if c, err := benchtls.HTTPClient(time.Second); err != nil || c.Transport != nil && c.Transport.(*http.Transport).TLSClientConfig != nil {
		t.Errorf("HTTPClient in plain text: %v", err)
	}
}
