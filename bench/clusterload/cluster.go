package clusterload

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"

	"github.com/converger/edge/bench/benchtls"
	"github.com/converger/edge/bench/cputime"
	"github.com/converger/edge/bench/procs"
	"github.com/converger/edge/bench/promscrape"
	"github.com/converger/edge/bench/rawcheck"
)

// node is one sidecar of a cluster.
type node struct {
	name       string
	bind       string // memberlist's address
	grpc, http string // from its "sidecar started" log line
	proc       *procs.Proc
	conn       *grpc.ClientConn
}

// cluster is N sidecars on loopback that joined each other.
type cluster struct {
	nodes   []*node
	syncMS  int
	share   bool
	started time.Duration // from the first start to every node seeing all members
	// stopping silences the nodes' logs: memberlist logs errors while shutting down.
	stopping atomic.Bool
}

// clusterSpec is what a cluster is started with.
type clusterSpec struct {
	bin        string // sidecar binary
	limitsFile string // RATE_LIMIT_CONFIG
	nodes      int
	syncMS     int
	share      bool
	env        []string // more of the sidecars' environment (exact.go)
}

// startCluster starts the sidecars and waits until each sees all the others. A port
// taken between choosing it and binding it makes it try again with others, twice.
func startCluster(ctx context.Context, spec clusterSpec, stderr io.Writer) (*cluster, error) {
	var lastErr error
	for range 3 {
		c, err := tryStartCluster(ctx, spec, stderr)
		if err == nil {
			return c, nil
		}
		if !errors.Is(err, errPortTaken) {
			return nil, err
		}
		lastErr = err
	}
	return nil, lastErr
}

var errPortTaken = errors.New("a port was taken")

func tryStartCluster(ctx context.Context, spec clusterSpec, stderr io.Writer) (c *cluster, err error) {
	t0 := time.Now()
	binds, err := procs.FreeTCPUDPPorts(spec.nodes)
	if err != nil {
		return nil, err
	}
	c = &cluster{syncMS: spec.syncMS, share: spec.share}
	defer func() {
		if err != nil {
			c.stop()
		}
	}()
	// With -mtls, the checks (rawcheck.Dial), /readyz and /metrics over mutual TLS; the
	// cluster's own traffic is memberlist's, with its key.
	env := append(procs.SidecarEnv(), benchtls.SidecarEnv()...)
	type started struct {
		grpc, http string
	}
	startedc := make([]chan started, spec.nodes)
	// A node's flushes keep the phase its process started with. Started within a few
	// milliseconds of each other, the nodes would flush in step; in a deployment they
	// start apart, so each starts at its own random moment within one interval.
	offsets := make([]time.Duration, spec.nodes)
	for i := 1; i < spec.nodes; i++ {
		offsets[i] = rand.N(time.Duration(spec.syncMS) * time.Millisecond)
	}
	slices.Sort(offsets)
	for i := range spec.nodes {
		if d := time.Until(t0.Add(offsets[i])); d > 0 {
			time.Sleep(d)
		}
		n := &node{name: "bench-" + strconv.Itoa(i), bind: binds[i]}
		startedc[i] = make(chan started, 1)
		var once sync.Once
		out := &procs.TailWriter{Line: func(line string) {
			var rec struct {
				Level string `json:"level"`
				Msg   string `json:"msg"`
				GRPC  string `json:"grpc"`
				HTTP  string `json:"http"`
			}
			if json.Unmarshal([]byte(line), &rec) != nil {
				if strings.TrimSpace(line) != "" && !c.stopping.Load() {
					fmt.Fprintf(stderr, "%s: %s\n", n.name, line) // not a log record: a crash
				}
				return
			}
			switch {
			case rec.Msg == "sidecar started":
				once.Do(func() { startedc[i] <- started{rec.GRPC, rec.HTTP} })
			case c.stopping.Load():
			case rec.Level == "ERROR" || rec.Level == "WARN" && !expectedWarning(rec.Msg):
				fmt.Fprintf(stderr, "%s: %s\n", n.name, line)
			}
		}}
		cmd := exec.Command(spec.bin)
		cmd.Env = append(env,
			"CLUSTER_STRATEGY=static",
			"CLUSTER_JOIN="+strings.Join(binds, ","),
			"CLUSTER_BIND_ADDR="+n.bind,
			"CLUSTER_NODE_NAME="+n.name,
			"CLUSTER_INSECURE=true",
			"RATE_LIMIT_SYNC_INTERVAL_MS="+strconv.Itoa(spec.syncMS),
			"RATE_LIMIT_SHARE_MODE="+strconv.FormatBool(spec.share),
			"RATE_LIMIT_CONFIG="+spec.limitsFile,
			"SIDECAR_GRPC_ADDR=127.0.0.1:0",
			"SIDECAR_HTTP_ADDR=127.0.0.1:0",
			"LOG_LEVEL=info", // the "sidecar started" line, with the addresses, is at info
			"LOG_FORMAT=json",
		)
		cmd.Env = append(cmd.Env, spec.env...)
		if n.proc, err = procs.Start("sidecar "+n.name, cmd, out); err != nil {
			return c, err
		}
		c.nodes = append(c.nodes, n)
	}
	for i, n := range c.nodes {
		select {
		case s := <-startedc[i]:
			n.grpc, n.http = s.grpc, s.http
		case <-n.proc.Done():
			if strings.Contains(n.proc.Out.Tail(), "address already in use") {
				return c, fmt.Errorf("%w: %v", errPortTaken, n.proc.Exited())
			}
			return c, n.proc.Exited()
		case <-time.After(20 * time.Second):
			return c, fmt.Errorf("the sidecar %s did not log \"sidecar started\" within 20s; its last output:\n%s", n.name, n.proc.Out.Tail())
		case <-ctx.Done():
			return c, ctx.Err()
		}
	}
	if err := c.waitMembers(ctx, 20*time.Second); err != nil {
		return c, err
	}
	for _, n := range c.nodes {
		conns, err := rawcheck.Dial(ctx, n.grpc, 1)
		if err != nil {
			return c, fmt.Errorf("%s: %w", n.name, err)
		}
		n.conn = conns[0]
	}
	c.started = time.Since(t0)
	return c, nil
}

// expectedWarning tells the sidecar's warnings that this test causes on purpose.
func expectedWarning(msg string) bool {
	return strings.HasPrefix(msg, "DATABASE_URL is not set") || strings.HasPrefix(msg, "TOKEN_VERIFY_KEYS is not set") ||
		strings.HasPrefix(msg, "the clock is shifted by SIDECAR_TEST_CLOCK_OFFSET_MS") // bench cluster -exact
}

// waitMembers polls every node's /readyz until each reports cluster_size N.
func (c *cluster) waitMembers(ctx context.Context, timeout time.Duration) error {
	client, err := benchtls.HTTPClient(time.Second)
	if err != nil {
		return err
	}
	deadline := time.Now().Add(timeout)
	want := len(c.nodes)
	for _, n := range c.nodes {
		for {
			size, err := readySize(ctx, client, benchtls.URL(n.http, "/readyz"))
			if err == nil && size == want {
				break
			}
			if perr := n.proc.Exited(); perr != nil {
				return perr
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("%s: the cluster did not form within %v (cluster_size %d, want %d, error %v)", n.name, timeout, size, want, err)
			}
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(20 * time.Millisecond):
			}
		}
	}
	return nil
}

func readySize(ctx context.Context, client *http.Client, url string) (int, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, err
	}
	resp, err := client.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	var body struct {
		ClusterSize int `json:"cluster_size"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		return 0, err
	}
	if resp.StatusCode != http.StatusOK {
		return body.ClusterSize, fmt.Errorf("/readyz: %s", resp.Status)
	}
	return body.ClusterSize, nil
}

// scrape reads every node's cluster metrics at once.
func (c *cluster) scrape(ctx context.Context) ([]Scrape, error) {
	out := make([]Scrape, len(c.nodes))
	errs := make([]error, len(c.nodes))
	var wg sync.WaitGroup
	for i, n := range c.nodes {
		wg.Go(func() {
			t0 := time.Now()
			s, err := promscrape.Scrape(ctx, benchtls.URL(n.http, "/metrics"), metricPrefixes)
			t1 := time.Now()
			if err != nil {
				errs[i] = fmt.Errorf("%s: %w", n.name, err)
				return
			}
			out[i] = Scrape{AtNS: t0.UnixNano() + t1.Sub(t0).Nanoseconds()/2, Metrics: promscrape.Map(s)}
		})
	}
	wg.Wait()
	return out, errors.Join(errs...)
}

// cpuSample is the CPU time used so far by this process, each node and the machine.
type cpuSample struct {
	at            time.Time
	self, machine time.Duration
	nodes         []time.Duration
	ok            bool
}

func (c *cluster) cpu() cpuSample {
	s := cpuSample{at: time.Now(), ok: true}
	var err error
	if s.self, err = cputime.Self(); err != nil {
		s.ok = false
	}
	if s.machine, err = cputime.Machine(); err != nil {
		s.ok = false
	}
	for _, n := range c.nodes {
		d, err := cputime.Process(n.proc.Pid())
		s.ok = s.ok && err == nil
		s.nodes = append(s.nodes, d)
	}
	return s
}

// cpuLoad returns, between two samples, the CPUs the nodes used (mean per node) and the
// CPUs the rest of the machine used: other processes, and kernel work charged to none.
// ok is false when a sample is incomplete.
func cpuLoad(a, b cpuSample) (perNode, other float64, ok bool) {
	sec := b.at.Sub(a.at).Seconds()
	if !a.ok || !b.ok || sec <= 0 || len(a.nodes) != len(b.nodes) || len(a.nodes) == 0 {
		return 0, 0, false
	}
	used := b.self - a.self
	nodes := time.Duration(0)
	for i := range a.nodes {
		nodes += b.nodes[i] - a.nodes[i]
	}
	used += nodes
	other = max(0, (b.machine-a.machine-used).Seconds()/sec)
	return nodes.Seconds() / sec / float64(len(a.nodes)), other, true
}

// exited reports a node that died.
func (c *cluster) exited() error {
	for _, n := range c.nodes {
		if err := n.proc.Exited(); err != nil {
			return err
		}
	}
	return nil
}

// stop closes the connections and stops every node, in parallel.
func (c *cluster) stop() {
	if c == nil {
		return
	}
	c.stopping.Store(true)
	var ps []*procs.Proc
	for _, n := range c.nodes {
		if n.conn != nil {
			n.conn.Close()
		}
		ps = append(ps, n.proc)
	}
	procs.StopAll(ps)
}
