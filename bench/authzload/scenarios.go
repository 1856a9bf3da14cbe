package authzload

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/converger/edge/bench/closedloop"
	"github.com/converger/edge/bench/procs"
	"github.com/converger/edge/bench/rawcheck"
	"github.com/converger/edge/shared/buckets"
	"github.com/converger/edge/shared/token"
)

// The scenarios of bench authz, besides the mix: the sidecar's Check in the three shapes
// bench rls measures ShouldRateLimit in, each on every -conns.
var scenarios = []struct{ Name, Summary string }{
	{"hot", "one client's POSTs of activities with its token: one hot counter, every request allowed"},
	{"keys", "POSTs of activities by the clients of 10,000 tenants (-keys), each with its token, in a shuffled round robin: a counter per tenant, every request allowed"},
	{"over", "uploads by the clients of 1,000 tenants (-over-keys) with a limit of one an hour: every request after a tenant's first is a 429"},
}

// scenarioLimits is the scenarios' sidecar's RATE_LIMIT_CONFIG: activities far above
// what a client sends, uploads at one an hour.
var scenarioLimits = fmt.Sprintf(`limits:
  %s: {limit: 4000000000, window: 1s}
  %s: {limit: 1, window: 1h}
`, buckets.ActivityCreate, buckets.Upload)

// scenarioRequests builds the CheckRequests of a scenario, as Envoy sends them for a
// browser's request through a load balancer (20 headers): key k's client address, its
// token (a tenant of its own), its conversation.
type scenarioRequests struct {
	signer *token.Signer
	now    time.Time
}

func (g *scenarioRequests) request(name string, k int) ([]byte, error) {
	base := map[string]int{"hot": 0, "keys": 1, "over": 2}[name] << 20
	id := fmt.Sprintf("%08x-0000-4000-8000-%012x", base>>20, k)
	tok, err := g.signer.Issue(claimsWithID(token.Claims{TenantID: id, ChannelID: id, UserID: "user-" + strconv.Itoa(k), Src: token.SrcSecret}, id), g.now)
	if err != nil {
		return nil, err
	}
	path := "/api/v1/converger/conversations/" + id + "/activities"
	if name == "over" {
		path = "/api/v1/converger/conversations/" + id + "/upload?userId=user-" + strconv.Itoa(k)
	}
	client := clientIP(base + k)
	h := map[string]string{
		":authority":                     host,
		":method":                        "POST",
		":path":                          path,
		":scheme":                        "https",
		"accept":                         "application/json",
		"accept-encoding":                "gzip, deflate, br",
		"accept-language":                "en-US,en;q=0.9",
		"authorization":                  "Bearer " + tok,
		"content-length":                 "212",
		"content-type":                   "application/json",
		"origin":                         "https://shop-" + strconv.Itoa(k%97) + ".example",
		"referer":                        "https://shop-" + strconv.Itoa(k%97) + ".example/help",
		"sec-fetch-dest":                 "empty",
		"sec-fetch-mode":                 "cors",
		"sec-fetch-site":                 "cross-site",
		"user-agent":                     browserAgents[k%len(browserAgents)],
		"x-envoy-expected-rq-timeout-ms": "15000",
		"x-forwarded-for":                client,
		"x-forwarded-proto":              "https",
		"x-request-id":                   fmt.Sprintf("%08x-4d1d-4a42-9b6a-%012x", k, base+k),
	}
	return proto.Marshal(&authv3.CheckRequest{Attributes: &authv3.AttributeContext{
		Source:      &authv3.AttributeContext_Peer{Address: socket(lbAddrs[k%len(lbAddrs)], uint32(1024+k%60000))},
		Destination: &authv3.AttributeContext_Peer{Address: socket("10.0.1.10", 10000)},
		Request: &authv3.AttributeContext_Request{
			Time: timestamppb.New(g.now),
			Http: &authv3.AttributeContext_HttpRequest{
				Id: strconv.Itoa(base + k), Method: "POST", Headers: h, Path: path, Host: host,
				Scheme: "https", Protocol: "HTTP/1.1", Size: 212,
			},
		},
		MetadataContext:      &corev3.Metadata{},
		RouteMetadataContext: &corev3.Metadata{},
	}})
}

// runScenarios starts a sidecar of its own for the scenarios (their limits, no
// database: a token route counts per tenant from the token, with no override to look
// up) and measures each scenario on each number of connections against the no-op.
func runScenarios(ctx context.Context, cfg Config, sidecarBin string, noop closedloop.Endpoint, stderr io.Writer, logf func(string, ...any)) ([]closedloop.ScenarioResult, error) {
	dir, err := os.MkdirTemp("", "bench-authz-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	limits := filepath.Join(dir, "limits.yaml")
	if err := os.WriteFile(limits, []byte(scenarioLimits), 0o644); err != nil {
		return nil, err
	}
	signer, err := newSigner()
	if err != nil {
		return nil, err
	}
	sc, scAddr, _, err := procs.StartSidecar(ctx, sidecarBin, []string{
		"TOKEN_VERIFY_KEYS=" + signer.PublicKey(), "TRUSTED_PROXIES=" + TrustedProxies, "RATE_LIMIT_CONFIG=" + limits,
		"LOG_LEVEL=error", "LOG_FORMAT=text",
	}, stderr)
	if err != nil {
		return nil, err
	}
	defer sc.Stop()
	logf("scenarios: sidecar %s without a database, limits %s %s", scAddr, buckets.ActivityCreate, buckets.Upload)
	g := &scenarioRequests{signer: signer, now: time.Now()}
	var out []closedloop.ScenarioResult
	for _, s := range scenarios {
		n := map[string]int{"hot": 1, "keys": cfg.Keys, "over": cfg.OverKeys}[s.Name]
		w, err := closedloop.NewSequence(n, cfg.Seed, func(k int) ([]byte, error) { return g.request(s.Name, k) })
		if err != nil {
			return nil, err
		}
		reqs := closedloop.NewGRPCRequests(rawcheck.Method, w.Len(), w.Bytes, func() closedloop.Reply { return new(rawcheck.Reply) })
		for _, conns := range cfg.Conns {
			res, err := closedloop.RunGRPCScenario(ctx, cfg.Loop, conns, s.Name, s.Summary, w, w.Prologue, reqs,
				closedloop.Endpoint{Name: "sidecar", Addr: scAddr, Proc: sc}, noop, ScenarioAims, logf)
			if err != nil {
				return nil, err
			}
			out = append(out, res)
		}
	}
	return out, nil
}

// scenarioNames are the scenarios' names, for closedloop.ScenariosPass.
func scenarioNames() []string {
	names := make([]string, len(scenarios))
	for i, s := range scenarios {
		names[i] = s.Name
	}
	return names
}
