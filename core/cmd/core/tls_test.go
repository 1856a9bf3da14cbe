package main_test

import (
	"crypto/tls"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/converger/edge/shared/testpki"
	"github.com/converger/edge/shared/tlsconfig"
	"github.com/converger/edge/sidecar/service"
)

// TestTLSEverywhere runs the core with mutual TLS on CORE_ADDR, TLS on CORE_OPS_ADDR,
// and its AUTHZ_ADDR and LIMITER_ADDR clients on a sidecar whose gRPC port requires the
// core's certificate: requests are checked over mutual TLS, plain-text and unknown
// clients are refused.
func TestTLSEverywhere(t *testing.T) {
	const envoyID, coreID = "spiffe://cluster.local/ns/edge/sa/envoy", "spiffe://cluster.local/ns/edge/sa/core"
	dir := t.TempDir()
	ca, err := testpki.NewCA("core test CA")
	if err != nil {
		t.Fatal(err)
	}
	issue := func(l testpki.Leaf, name string) *testpki.Pair {
		t.Helper()
		p, err := ca.Issue(l)
		if err != nil {
			t.Fatal(err)
		}
		if err := ca.Write(p, dir, name); err != nil {
			t.Fatal(err)
		}
		return p
	}
	serverCert := issue(testpki.Localhost("edge"), "server")
	envoy := issue(testpki.Leaf{Name: "envoy", URIs: []string{envoyID}}, "envoy")
	coreClient := issue(testpki.Leaf{Name: "core", URIs: []string{coreID}}, "core")

	sc := service.StartForTest(t, map[string]string{
		"SIDECAR_GRPC_TLS_CERT_FILE": serverCert.CertFile, "SIDECAR_GRPC_TLS_KEY_FILE": serverCert.KeyFile,
		"SIDECAR_GRPC_TLS_CLIENT_CA_FILE": serverCert.CAFile, "SIDECAR_GRPC_TLS_ALLOWED_CLIENTS": coreID,
	}, "", service.Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	sidecar := sc.GRPCAddr.String()

	f := newFixture(t, "", 1)
	env := f.env(map[string]string{
		"CORE_TLS_CERT_FILE": serverCert.CertFile, "CORE_TLS_KEY_FILE": serverCert.KeyFile,
		"CORE_TLS_CLIENT_CA_FILE": serverCert.CAFile, "CORE_TLS_ALLOWED_CLIENTS": envoyID,
		"CORE_OPS_TLS_CERT_FILE": serverCert.CertFile, "CORE_OPS_TLS_KEY_FILE": serverCert.KeyFile,
		"AUTHZ_ADDR": sidecar, "AUTHZ_TLS_CA_FILE": serverCert.CAFile, "AUTHZ_TLS_CERT_FILE": coreClient.CertFile,
		"AUTHZ_TLS_KEY_FILE": coreClient.KeyFile, "AUTHZ_TLS_SERVER_NAME": "localhost", "AUTHZ_FAIL_OPEN": "false",
		"LIMITER_ADDR": sidecar, "LIMITER_TLS_CA_FILE": serverCert.CAFile, "LIMITER_TLS_CERT_FILE": coreClient.CertFile,
		"LIMITER_TLS_KEY_FILE": coreClient.KeyFile, "LIMITER_TLS_SERVER_NAME": "localhost",
	})
	client, err := tlsconfig.ClientConfig(&tlsconfig.ClientFiles{Name: "TEST", CAFile: serverCert.CAFile, CertFile: envoy.CertFile, KeyFile: envoy.KeyFile}, "localhost", tlsconfig.Options{})
	if err != nil {
		t.Fatal(err)
	}
	p := newProc(t, env)
	p.tls = client
	core := p.start(t)
	if !strings.HasPrefix(core.base, "https://") || !strings.HasPrefix(core.ops, "https://") {
		t.Fatalf("base %s, ops %s", core.base, core.ops)
	}

	get := func(c *http.Client, url string) (int, []byte, error) {
		req, err := http.NewRequest("GET", url, nil)
		if err != nil {
			return 0, nil, err
		}
		req.Header.Set("x-api-key", f.apiKey)
		resp, err := c.Do(req)
		if err != nil {
			return 0, nil, err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		return resp.StatusCode, b, err
	}
	// Checked by the sidecar over mutual TLS (AUTHZ_FAIL_OPEN=false: a failed Check
	// would be a 503).
	for range 3 {
		if code, body, err := get(core.client, core.base+"/api/v1/conversations/"+f.convs[0]); err != nil || code != 200 {
			t.Fatalf("over mutual TLS: %d %s %v\n%s", code, body, err, tailOf(core.logs.String()))
		}
	}
	code, body, err := get(core.client, core.ops+"/readyz")
	var ready map[string]any
	if err != nil || code != 200 || json.Unmarshal(body, &ready) != nil || ready["authz"] != "ok" {
		t.Fatalf("/readyz over TLS: %d %s %v", code, body, err)
	}
	if ready["limiter"] == "TRANSIENT_FAILURE" || ready["limiter"] == nil {
		t.Errorf("LIMITER_ADDR over mutual TLS: %v", ready["limiter"])
	}

	// Refused: plain text, no client certificate, a certificate outside the allow list.
	plainURL := "http://" + strings.TrimPrefix(core.base, "https://") + "/api/v1/conversations/" + f.convs[0]
	if code, _, err := get(&http.Client{Timeout: 5 * time.Second}, plainURL); err == nil && code == 200 {
		t.Error("a plain-text client was answered 200")
	}
	noCert, err := tlsconfig.ClientConfig(&tlsconfig.ClientFiles{Name: "TEST", CAFile: serverCert.CAFile}, "localhost", tlsconfig.Options{})
	if err != nil {
		t.Fatal(err)
	}
	tlsClient := func(c *tls.Config) *http.Client {
		return &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: c}}
	}
	if _, _, err := get(tlsClient(noCert), core.base+"/api/v1/conversations/"+f.convs[0]); err == nil {
		t.Error("a client without a certificate was answered")
	}
	// The ops port asks for no client certificate.
	if code, _, err := get(tlsClient(noCert), core.ops+"/healthz"); err != nil || code != 200 {
		t.Errorf("the ops port over TLS without a client certificate: %d %v", code, err)
	}
	other := issue(testpki.Leaf{Name: "other", URIs: []string{"spiffe://cluster.local/ns/other/sa/x"}}, "other")
	otherCfg, err := tlsconfig.ClientConfig(&tlsconfig.ClientFiles{Name: "TEST", CAFile: serverCert.CAFile, CertFile: other.CertFile, KeyFile: other.KeyFile}, "localhost", tlsconfig.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := get(tlsClient(otherCfg), core.base+"/api/v1/conversations/"+f.convs[0]); err == nil {
		t.Error("a client outside CORE_TLS_ALLOWED_CLIENTS was answered")
	}
	core.alive()
}
