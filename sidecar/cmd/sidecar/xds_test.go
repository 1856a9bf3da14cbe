package main

import (
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	rlsconfv3 "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"

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
