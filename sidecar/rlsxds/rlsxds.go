// Package rlsxds gets the rate limit service's rules from an xDS management server, as
// envoyproxy/ratelimit does with CONFIG_TYPE=GRPC_XDS_SOTW: it subscribes to the
// reference's resource (ratelimit.config.ratelimit.v3.RateLimitConfig) over ADS, state
// of the world, applies each valid response whole, NACKs an invalid one with its
// problems and keeps the rules in use, and connects again with a backoff when the
// stream ends.
package rlsxds

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	rlsconfv3 "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	"go.yaml.in/yaml/v3"
	rpcstatus "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/converger/edge/sidecar/rls"
)

// TypeURL is the resource the client subscribes to, the reference's.
const TypeURL = "type.googleapis.com/ratelimit.config.ratelimit.v3.RateLimitConfig"

// MaxMessage bounds a DiscoveryResponse (gRPC's default for a client).
const MaxMessage = 4 << 20

// maxNackWait bounds the wait before NACKing a version again: a server's next version
// is read after it.
const maxNackWait = 5 * time.Second

// Options configure a Client.
type Options struct {
	ServerURL string            // host:port of the management server
	NodeID    string            // the node the server keeps a snapshot for
	Metadata  map[string]string // the node's metadata
	Headers   map[string]string // sent with the stream (gRPC metadata)
	// BackoffInitial and BackoffMax bound the wait before connecting again: it doubles
	// from the first to the second after each failed attempt, each wait drawn between
	// half and all of it, and starts again from the first once a response arrives.
	BackoffInitial, BackoffMax time.Duration
	Load                       rls.LoadOptions
	Logger                     *slog.Logger
	Registry                   prometheus.Registerer // nil: no metrics
}

// Client follows a management server's rules into an rls.Service.
type Client struct {
	o   Options
	svc *rls.Service
	log *slog.Logger

	connected prometheus.Gauge
	updates   *prometheus.CounterVec
	versions  *prometheus.GaugeVec

	mu     sync.Mutex
	status Status
}

// Status is what /readyz shows of the client.
type Status struct {
	Connected bool   `json:"connected"`
	Applied   bool   `json:"applied"`            // rules have been received and applied
	Version   string `json:"version"`            // of the rules in use (the last ACK)
	Rejected  string `json:"rejected,omitempty"` // the last version NACKed, when after Version
	Error     string `json:"error,omitempty"`    // why it was
}

// New returns a client that applies the server's rules to svc once Run.
func New(o Options, svc *rls.Service) *Client {
	c := &Client{o: o, svc: svc, log: o.Logger}
	if c.log == nil {
		c.log = slog.Default()
	}
	if c.o.BackoffInitial <= 0 {
		c.o.BackoffInitial = time.Second
	}
	c.o.BackoffMax = max(c.o.BackoffMax, c.o.BackoffInitial)
	c.connected = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "converger_rls_xds_connected", Help: "1 while the stream to the rate limit rules' xDS server is up.",
	})
	c.updates = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "converger_rls_xds_updates_total", Help: "Responses of the xDS server by result: accepted (ACK, applied) or rejected (NACK, the rules in use stay).",
	}, []string{"result"})
	c.versions = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "converger_rls_xds_version_info", Help: "1 for the xDS version of the rules in use.",
	}, []string{"version"})
	c.updates.WithLabelValues("accepted")
	c.updates.WithLabelValues("rejected")
	if o.Registry != nil {
		o.Registry.MustRegister(c.connected, c.updates, c.versions)
	}
	return c
}

// Status returns the client's state.
func (c *Client) Status() Status {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.status
}

func (c *Client) update(f func(*Status)) {
	c.mu.Lock()
	defer c.mu.Unlock()
	f(&c.status)
}

// Run follows the server until ctx ends: a stream at a time, another after a backoff
// when one ends.
func (c *Client) Run(ctx context.Context) {
	// The connection's own backoff follows the same bounds, or a long outage would leave
	// it at grpc-go's two minutes whatever BackoffMax says.
	conn, err := grpc.NewClient(c.o.ServerURL, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(MaxMessage)),
		grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           backoff.Config{BaseDelay: c.o.BackoffInitial, Multiplier: 2, Jitter: 0.5, MaxDelay: c.o.BackoffMax},
			MinConnectTimeout: 5 * time.Second,
		}))
	if err != nil { // only for a target that cannot be parsed, which config refuses
		c.log.Error("RLS xDS: cannot reach the server", "server", c.o.ServerURL, "error", err)
		return
	}
	defer conn.Close()
	backoff := c.o.BackoffInitial
	for {
		received, err := c.follow(ctx, conn)
		c.connected.Set(0)
		c.update(func(s *Status) { s.Connected = false })
		if ctx.Err() != nil {
			return
		}
		if received {
			backoff = c.o.BackoffInitial
		}
		wait := backoff/2 + rand.N(backoff/2+1)
		c.log.Warn("RLS xDS: the stream to the server ended; the rules in use stay", "server", c.o.ServerURL, "error", err, "retry_in", wait)
		if !sleep(ctx, wait) {
			return
		}
		backoff = min(2*backoff, c.o.BackoffMax)
	}
}

// sleep waits for d, false when ctx ends first.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// follow runs one stream: the subscription, then every response ACKed or NACKed, until
// the stream fails. received says whether the server answered at all.
func (c *Client) follow(ctx context.Context, conn *grpc.ClientConn) (received bool, err error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	if len(c.o.Headers) > 0 {
		ctx = metadata.NewOutgoingContext(ctx, metadata.New(c.o.Headers))
	}
	stream, err := discoveryv3.NewAggregatedDiscoveryServiceClient(conn).StreamAggregatedResources(ctx)
	if err != nil {
		return false, err
	}
	node := &corev3.Node{Id: c.o.NodeID}
	if len(c.o.Metadata) > 0 {
		f := map[string]*structpb.Value{}
		for k, v := range c.o.Metadata {
			f[k] = structpb.NewStringValue(v)
		}
		node.Metadata = &structpb.Struct{Fields: f}
	}
	// The version in use, so that a server that still has it (one restarted with the
	// same snapshot) need not send it again.
	version := c.Status().Version
	if err := stream.Send(&discoveryv3.DiscoveryRequest{Node: node, TypeUrl: TypeURL, VersionInfo: version}); err != nil {
		return false, err
	}
	var rejected string        // the version last NACKed
	var nackWait time.Duration // before NACKing it again
	for {
		resp, err := stream.Recv()
		if err != nil {
			return received, err
		}
		if !received {
			received = true
			c.connected.Set(1)
			c.update(func(s *Status) { s.Connected = true })
			c.log.Info("RLS xDS: connected", "server", c.o.ServerURL, "node", c.o.NodeID)
		}
		ack := &discoveryv3.DiscoveryRequest{Node: node, TypeUrl: TypeURL, ResponseNonce: resp.GetNonce()}
		rules, err := c.rules(resp)
		if err != nil {
			ack.VersionInfo = version
			ack.ErrorDetail = &rpcstatus.Status{Code: int32(codes.InvalidArgument), Message: err.Error()}
			c.svc.Loaded(false)
			c.updates.WithLabelValues("rejected").Inc()
			if resp.GetVersionInfo() == rejected {
				// A server that answers a NACK with the same version again (go-control-plane's
				// snapshot cache does) would make a busy loop of it: each repeat waits longer,
				// as a reconnection does.
				if !sleep(ctx, nackWait/2+rand.N(nackWait/2+1)) {
					return received, ctx.Err()
				}
				nackWait = min(2*nackWait, c.o.BackoffMax, maxNackWait)
			} else {
				rejected, nackWait = resp.GetVersionInfo(), c.o.BackoffInitial
				c.update(func(s *Status) { s.Rejected, s.Error = rejected, err.Error() })
				c.log.Error("RLS xDS: rules refused (NACK); the previous rules stay in use",
					"version", rejected, "problems", err.Error())
			}
		} else {
			rejected = ""
			c.svc.SetRules(rules)
			c.svc.Loaded(true)
			c.updates.WithLabelValues("accepted").Inc()
			c.versions.Reset()
			c.versions.WithLabelValues(resp.GetVersionInfo()).Set(1)
			prev := version
			version = resp.GetVersionInfo()
			ack.VersionInfo = version
			c.update(func(s *Status) { s.Applied, s.Version, s.Rejected, s.Error = true, version, "", "" })
			descs, limits := rules.Size()
			c.log.Info("RLS xDS: rules applied", "version", version, "previous", prev, "domains", rules.Domains(),
				"descriptors", descs, "limits", limits)
		}
		if err := stream.Send(ack); err != nil {
			return received, err
		}
	}
}

// rules reads a response's resources as rule files, in order, each named by its
// resource's name (else its domain), and compiles them as a directory's.
func (c *Client) rules(resp *discoveryv3.DiscoveryResponse) (*rls.Rules, error) {
	if t := resp.GetTypeUrl(); t != TypeURL {
		return nil, fmt.Errorf("the response is of type %s, not %s", t, TypeURL)
	}
	res := resp.GetResources()
	if len(res) > rls.MaxFiles {
		return nil, fmt.Errorf("%d resources, more than %d", len(res), rls.MaxFiles)
	}
	files := make([]rls.File, 0, len(res))
	var errs []error
	for i, a := range res {
		var conf rlsconfv3.RateLimitConfig
		if a.GetTypeUrl() != TypeURL {
			errs = append(errs, fmt.Errorf("resource %d: of type %s, not %s", i, a.GetTypeUrl(), TypeURL))
			continue
		}
		if err := proto.Unmarshal(a.GetValue(), &conf); err != nil {
			errs = append(errs, fmt.Errorf("resource %d: %w", i, err))
			continue
		}
		name := conf.GetName()
		if name == "" {
			name = conf.GetDomain()
		}
		if name == "" {
			name = fmt.Sprintf("resource %d", i)
		}
		data, err := yaml.Marshal(document(&conf))
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", name, err))
			continue
		}
		files = append(files, rls.File{Name: name, Data: data})
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return rls.Compile(files, c.o.Load, false)
}

// document is a RateLimitConfig as the rule file it stands for, field by field as the
// reference converts it (a unit always, by its name, UNKNOWN when unset), so that the
// same checks and messages apply to it.
func document(c *rlsconfv3.RateLimitConfig) map[string]any {
	return map[string]any{"domain": c.GetDomain(), "descriptors": descriptors(c.GetDescriptors())}
}

func descriptors(ds []*rlsconfv3.RateLimitDescriptor) []any {
	out := make([]any, len(ds))
	for i, d := range ds {
		m := map[string]any{"key": d.GetKey()}
		if d.GetValue() != "" {
			m["value"] = d.GetValue()
		}
		if p := d.GetRateLimit(); p != nil {
			l := map[string]any{"unit": p.GetUnit().String(), "requests_per_unit": p.GetRequestsPerUnit()}
			if p.GetUnlimited() {
				l["unlimited"] = true
			}
			if p.GetName() != "" {
				l["name"] = p.GetName()
			}
			if len(p.GetReplaces()) > 0 {
				var rs []any
				for _, r := range p.GetReplaces() {
					rs = append(rs, map[string]any{"name": r.GetName()})
				}
				l["replaces"] = rs
			}
			m["rate_limit"] = l
		}
		if len(d.GetDescriptors()) > 0 {
			m["descriptors"] = descriptors(d.GetDescriptors())
		}
		if d.GetShadowMode() {
			m["shadow_mode"] = true
		}
		if d.GetDetailedMetric() {
			m["detailed_metric"] = true
		}
		out[i] = m
	}
	return out
}

// Updates and Versions are the client's metrics, for tests.
func (c *Client) Updates() *prometheus.CounterVec { return c.updates }
func (c *Client) Versions() *prometheus.GaugeVec  { return c.versions }
