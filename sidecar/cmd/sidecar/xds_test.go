package main

import (
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	rlsconfv3 "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"google.golang.org/grpc/connectivity"

	"github.com/converger/edge/sidecar/rlsxds/xdstest"
)

func xdsShop(version string, perHour uint32) *rlsconfv3.RateLimitConfig {
	return &rlsconfv3.RateLimitConfig{Name: "shop-" + version, Domain: "shop", Descriptors: []*rlsconfv3.RateLimitDescriptor{{
		Key: "client_id", RateLimit: &rlsconfv3.RateLimitPolicy{Unit: rlsconfv3.RateLimitUnit_HOUR, RequestsPerUnit: perHour},
	}}}
}

// readyVersion is the xDS version a node's /readyz reports, "" until it is ready.
func readyVersion(t *testing.T, httpAddr string) string {
	code, body := getJSON(t, "http://"+httpAddr+"/readyz")
	if code != 200 {
		return ""
	}
	x, _ := body["rls_xds"].(map[string]any)
	v, _ := x["version"].(string)
	return v
}

// A cluster of three sidecars follows one go-control-plane management server, set up
// by the reference's variable names: each applies the rules, counts them together, and
// follows the next version; /rlconfig shows the rules in use.
func TestClusterXDSRules(t *testing.T) {
	t.Parallel()
	srv := xdstest.Start(t, "127.0.0.1:0")
	srv.Set("edge", "v1", xdsShop("v1", 2))
	nodes := startCluster(t, 3, hourLimits, clockOffset(time.Hour), func(_ int, env map[string]string) {
		env["CONFIG_TYPE"] = "GRPC_XDS_SOTW"
		env["CONFIG_GRPC_XDS_SERVER_URL"] = srv.Addr
		env["CONFIG_GRPC_XDS_NODE_ID"] = "edge"
		env["XDS_CLIENT_BACKOFF_INITIAL_INTERVAL"] = "50ms"
		env["XDS_CLIENT_BACKOFF_MAX_INTERVAL"] = "500ms"
	})
	clients := make([]*rlsNode, len(nodes))
	for i, nd := range nodes {
		clients[i] = &rlsNode{t: t, sidecar: nd.sidecar, grpcAddr: nd.grpcAddr, httpAddr: nd.httpAddr}
		clients[i].dial()
		eventually(t, 10*time.Second, nd.name+" ready with v1", func() (bool, string) {
			v := readyVersion(t, nd.httpAddr)
			return v == "v1", v
		})
	}
	n1 := clients[0]
	n1.want(n1.ask("shop", rd("client_id=c")), ok, "OK 2/HOUR"+rem(1))
	n1.ask("shop", rd("client_id=c"))
	eventually(t, 5*time.Second, "n3 sees the two hits", func() (bool, string) {
		r := clients[2].ask("shop", withHits(rd("client_id=c"), 0))
		return statusText(r.GetStatuses()[0]) == "OK 2/HOUR", statusText(r.GetStatuses()[0])
	})

	srv.Set("edge", "v2", xdsShop("v2", 5))
	for i, c := range clients {
		eventually(t, 10*time.Second, nodes[i].name+" follows v2", func() (bool, string) {
			r := c.ask("shop", withHits(rd("client_id=c"), 0))
			return statusText(r.GetStatuses()[0]) == "OK 5/HOUR rem=3", statusText(r.GetStatuses()[0])
		})
		if v := readyVersion(t, c.httpAddr); v != "v2" {
			t.Errorf("%s /readyz version %q", nodes[i].name, v)
		}
	}
	resp, err := http.Get("http://" + n1.httpAddr + "/rlconfig")
	must(t, err)
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if want := "shop.client_id: unit=HOUR requests_per_unit=5, shadow_mode: false\n"; string(b) != want {
		t.Errorf("/rlconfig: %q, want %q", b, want)
	}
	if m := scrape(t, n1.httpAddr); !strings.Contains(m, `converger_rls_xds_version_info{version="v2"} 1`) || !strings.Contains(m, "converger_rls_xds_connected 1") {
		t.Errorf("metrics:\n%s", grepLines(m, "converger_rls_xds"))
	}
}

// The reference's other settings by their names, through the binary: merged domain
// files, the header names, the dynamic metadata, quota mode for all, and a connection
// sent away at GRPC_MAX_CONNECTION_AGE (the next call connects again).
func TestRLSReferenceSettings(t *testing.T) {
	t.Parallel()
	dir := writeRules(t, map[string]string{
		"a.yaml": "domain: shop\ndescriptors:\n  - key: client_id\n    metadata: {tier: gold}\n    rate_limit: {unit: hour, requests_per_unit: 1}\n",
		"b.yaml": "domain: shop\ndescriptors:\n  - key: route\n    rate_limit: {unit: hour, requests_per_unit: 5}\n",
	})
	n := startRLS(t, map[string]string{
		"RLS_CONFIG_DIR": dir, "MERGE_DOMAIN_CONFIG": "true", "QUOTA_MODE": "true",
		"LIMIT_RESPONSE_HEADERS_ENABLED": "true", "LIMIT_LIMIT_HEADER": "X-Limit", "LIMIT_REMAINING_HEADER": "X-Left", "LIMIT_RESET_HEADER": "X-Reset",
		"RESPONSE_DYNAMIC_METADATA": "true", "GRPC_MAX_CONNECTION_AGE": "1s", "GRPC_MAX_CONNECTION_AGE_GRACE": "1s",
	})
	r := n.ask("shop", rd("client_id=c"), rd("route=/x"))
	n.want(r, ok, "OK 1/HOUR", "OK 5/HOUR rem=4")
	if h := r.GetResponseHeadersToAdd(); len(h) != 3 || h[0].GetKey() != "X-Limit" || h[0].GetValue() != "1" || h[1].GetKey() != "X-Left" || h[2].GetKey() != "X-Reset" {
		t.Errorf("headers %v", h)
	}
	md := r.GetDynamicMetadata().AsMap()
	if md["domain"] != "shop" || md["metadata"].(map[string]any)["tier"] != "gold" || len(md["descriptors"].([]any)) != 2 {
		t.Errorf("dynamic metadata %v", md)
	}
	// client_id is over, route is not: in quota mode for all, the request is OK.
	r = n.ask("shop", rd("client_id=c"), rd("route=/x"))
	n.want(r, ok, "OVER_LIMIT 1/HOUR", "OK 5/HOUR rem=3")
	if _, has := r.GetDynamicMetadata().AsMap()["metadata"]; has {
		t.Errorf("metadata of a rule over the limit: %v", r.GetDynamicMetadata().AsMap())
	}

	// The connection is sent away after about a second, then used again.
	deadline := time.Now().Add(10 * time.Second)
	for n.conn.GetState() != connectivity.Idle && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if s := n.conn.GetState(); s != connectivity.Idle {
		t.Fatalf("connection state %v after GRPC_MAX_CONNECTION_AGE, want IDLE (GOAWAY)", s)
	}
	n.want(n.ask("shop", rd("route=/x")), ok, "OK 5/HOUR rem=2")
}
