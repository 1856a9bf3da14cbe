package clusterload

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/converger/edge/bench/procs"
	"github.com/converger/edge/bench/runinfo"
)

// ScaleConfig is `bench cluster-scale`: what the cluster's replication costs each node
// as the cluster grows. N sidecars on loopback, every node checking every one of Keys
// keys in turn at RatePerNode checks a second (a busy tenant behind every pod), with a
// limit so high that no check should be refused. Per node: CPU, cluster traffic (bytes
// and messages both ways, as the sidecar's /metrics counts them), checks served and
// refused. Every configuration runs with each binary in turn (the baseline first), so
// the ratios are of the same run.
type ScaleConfig struct {
	Sidecar     string // the sidecar under test (default: bin/sidecar)
	Base        string // the baseline sidecar, e.g. built from the previous release ("": none)
	Nodes       intList
	Keys        intList
	RatePerNode float64
	SyncMS      int
	Warmup      time.Duration
	Duration    time.Duration
	Quick       bool
	Out         string
	Args        []string
}

// DefaultScaleConfig is the scenario: N = 1, 3, 10, 20, 20 hot keys and 1,000, 200
// checks a second per node, 100 ms sync, each row measured over a minute: the limits'
// window, since values far from their limits wait up to half of it in a large cluster
// (a shorter measure would see more or fewer of them depending on where it falls).
func DefaultScaleConfig() ScaleConfig {
	return ScaleConfig{Sidecar: "bin/sidecar", Nodes: intList{1, 3, 10, 20}, Keys: intList{20, 1000}, RatePerNode: 200, SyncMS: 100,
		Warmup: 3 * time.Second, Duration: time.Minute, Out: "bench/results/cluster-scale.md"}
}

// RegisterFlags adds the flags.
func (c *ScaleConfig) RegisterFlags(fs *flag.FlagSet) {
	fs.StringVar(&c.Sidecar, "sidecar", c.Sidecar, "the sidecar binary under test (default: bin/sidecar of the repository)")
	fs.StringVar(&c.Base, "base", c.Base, "the baseline sidecar binary (e.g. the previous release's), run in turn with the one under test")
	fs.Var(&c.Nodes, "n", "cluster sizes, comma-separated")
	fs.Var(&c.Keys, "keys", "key counts, comma-separated (every node checks every key in turn)")
	fs.Float64Var(&c.RatePerNode, "rate", c.RatePerNode, "checks per second per node")
	fs.IntVar(&c.SyncMS, "sync-ms", c.SyncMS, "sync interval (ms)")
	fs.DurationVar(&c.Warmup, "warmup", c.Warmup, "load before measuring, per configuration")
	fs.DurationVar(&c.Duration, "duration", c.Duration, "measured load, per configuration")
	fs.BoolVar(&c.Quick, "quick", false, "N = 1 and 3, 20 keys, 1 s warm-up, 3 s measured (for tests)")
	fs.StringVar(&c.Out, "out", c.Out, "the report (markdown)")
}

// ApplyQuick shrinks the run unless a flag set it.
func (c *ScaleConfig) ApplyQuick(set map[string]bool) {
	if !c.Quick {
		return
	}
	if !set["n"] {
		c.Nodes = intList{1, 3}
	}
	if !set["keys"] {
		c.Keys = intList{20}
	}
	if !set["warmup"] {
		c.Warmup = time.Second
	}
	if !set["duration"] {
		c.Duration = 3 * time.Second
	}
}

// Validate checks the bounds: every run is bounded in count and time.
func (c ScaleConfig) Validate() error {
	switch {
	case len(c.Nodes) == 0 || len(c.Keys) == 0:
		return errors.New("-n and -keys need at least one value")
	case c.RatePerNode <= 0 || c.RatePerNode > 5000:
		return errors.New("-rate must be in (0, 5000]")
	case c.SyncMS < 5 || c.SyncMS > 5000:
		return errors.New("-sync-ms must be from 5 to 5000")
	case c.Duration < time.Second || c.Duration > 10*time.Minute || c.Warmup < 0 || c.Warmup > time.Minute:
		return errors.New("-duration must be from 1s to 10m, -warmup at most 1m")
	}
	for _, n := range c.Nodes {
		if n < 1 || n > 64 {
			return errors.New("-n: 1 to 64 nodes")
		}
	}
	for _, k := range c.Keys {
		if k < 1 || k > 100_000 {
			return errors.New("-keys: 1 to 100000")
		}
	}
	return nil
}

// ScaleRow is one configuration with one binary.
type ScaleRow struct {
	Binary   string // "base" or "new"
	Nodes    int
	Keys     int
	Seconds  float64
	CPU      float64 // cores per node (utime + stime over the measured load)
	Other    float64 // cores the rest of the machine used meanwhile
	Served   float64 // allowed checks per second per node
	Refused  int     // checks refused (the limit is never reached: every one is below it)
	Errors   int
	Late     int
	BytesOut float64 // per node per second
	BytesIn  float64
	MsgsOut  float64
	MsgsIn   float64
	// Transfer is the state transfers' bytes per node per second (the baseline's sync
	// bytes leave them out; the new one's include them).
	Transfer float64
	// ValuesOut and ViewOut are the counter values' and the live view's messages sent per
	// node per second (converger_cluster_sent_by_kind_messages_total); -1 when the
	// binary does not report them.
	ValuesOut, ViewOut float64
	// SummaryOut is the summaries sent per second (owner replication), OwnOtherOut the
	// rest of this node's own protocol's messages: requests for room, answers, relayed
	// counts and busiest keys.
	SummaryOut, OwnOtherOut float64
	// BundleOut is the packets holding several of those messages: requests for room or
	// answers, or a flush's values, summaries and relayed counts for one member.
	BundleOut float64
	// ValuesBytesOut is the counter values' payload bytes sent per node per second.
	ValuesBytesOut float64
}

// ScaleReport is a run's result.
type ScaleReport struct {
	Config  ScaleConfig
	Started time.Time
	Machine runinfo.Machine
	Load    [2]string // load average at the start and end
	Rows    []ScaleRow
	Failed  error // the row that stopped the run, if one did
}

// scaleLimit is far above what any key gets in a window: a refusal is below the limit.
const scaleLimit = 1_000_000

// RunScale runs every configuration with each binary and writes the report.
func RunScale(ctx context.Context, cfg ScaleConfig, stdout, stderr io.Writer) (*ScaleReport, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	logf := func(format string, args ...any) { fmt.Fprintf(stderr, "bench cluster-scale: "+format+"\n", args...) }
	root := procs.RepoRoot()
	bin, err := procs.FindSidecar(root, cfg.Sidecar)
	if err != nil {
		return nil, err
	}
	bins := []struct{ name, path string }{{"new", bin}}
	if cfg.Base != "" {
		bins = append([]struct{ name, path string }{{"base", cfg.Base}}, bins...)
	}
	dir, err := os.MkdirTemp("", "bench-cluster-scale-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	limits := filepath.Join(dir, "limits.yaml")
	if err := os.WriteFile(limits, fmt.Appendf(nil, "limits: {%s: {limit: %d, window: 60000ms}}\n", loadBucket, scaleLimit), 0o644); err != nil {
		return nil, err
	}
	rep := &ScaleReport{Config: cfg, Started: time.Now(), Machine: runinfo.Describe(ctx)}
	rep.Load[0] = runinfo.LoadAvg()
	keyBase := 0
	var failed error
rows:
	for _, n := range cfg.Nodes {
		for _, keys := range cfg.Keys {
			for _, b := range bins {
				// A row whose cluster could not be started or read (a machine too busy to
				// answer /metrics in time) is tried once more; then the report is written
				// with the rows done.
				row, err := scaleOnce(ctx, b.path, limits, n, keys, keyBase, cfg, stderr)
				keyBase += keys
				if err != nil && ctx.Err() == nil {
					logf("%s, N=%d, %d keys: %v; once more", b.name, n, keys, err)
					row, err = scaleOnce(ctx, b.path, limits, n, keys, keyBase, cfg, stderr)
					keyBase += keys
				}
				if err != nil {
					failed = fmt.Errorf("%s, N=%d, %d keys: %w", b.name, n, keys, err)
					break rows
				}
				row.Binary = b.name
				logf("%-4s N=%-2d keys=%-4d cpu/node %.3f  served/node %.0f/s  refused %d  sent %.1f KB/s %.0f msg/s  received %.1f KB/s %.0f msg/s  (values %.1f, summary %.1f, own other %.1f, bundle %.1f msg/s)",
					b.name, n, keys, row.CPU, row.Served, row.Refused, row.BytesOut/1000, row.MsgsOut, row.BytesIn/1000, row.MsgsIn,
					row.ValuesOut, row.SummaryOut, row.OwnOtherOut, row.BundleOut)
				rep.Rows = append(rep.Rows, row)
			}
		}
	}
	rep.Load[1] = runinfo.LoadAvg()
	rep.Failed = failed
	var b strings.Builder
	rep.WriteMarkdown(&b)
	fmt.Fprint(stdout, b.String())
	if cfg.Out != "" {
		path, err := procs.WriteReport(root, cfg.Out, b.String())
		if err != nil {
			return rep, err
		}
		logf("report: %s", path)
		png := strings.TrimSuffix(path, filepath.Ext(path)) + ".png"
		if err := rep.WritePlot(png); err != nil {
			return rep, fmt.Errorf("the plot: %w", err)
		}
		logf("plot: %s", png)
	}
	return rep, failed
}

// scaleOnce starts a cluster of n, loads it and measures the nodes.
func scaleOnce(ctx context.Context, bin, limits string, n, keys, keyBase int, cfg ScaleConfig, stderr io.Writer) (ScaleRow, error) {
	c, err := startCluster(ctx, clusterSpec{bin: bin, limitsFile: limits, nodes: n, syncMS: cfg.SyncMS, share: true}, stderr)
	if err != nil {
		return ScaleRow{}, err
	}
	defer c.stop()
	start := time.Now().Add(200 * time.Millisecond)
	measureFrom := start.Add(cfg.Warmup)
	spec := loadSpec{rate: cfg.RatePerNode * float64(n), senders: allNodes(n), keys: keys, keyBase: keyBase,
		start: start, end: measureFrom.Add(cfg.Duration)}
	type out struct {
		res *loadResult
		err error
	}
	done := make(chan out, 1)
	go func() {
		res, err := spec.run(ctx, c)
		done <- out{res, err}
	}()
	sleepUntil(ctx, measureFrom)
	s0, err := c.scrape(ctx)
	if err != nil {
		return ScaleRow{}, err
	}
	cpu0 := c.cpu()
	sleepUntil(ctx, spec.end)
	cpu1 := c.cpu()
	s1, err := c.scrape(ctx)
	if err != nil {
		return ScaleRow{}, err
	}
	o := <-done
	if o.err != nil {
		return ScaleRow{}, o.err
	}
	if err := c.exited(); err != nil {
		return ScaleRow{}, err
	}
	row := ScaleRow{Nodes: n, Keys: keys, Seconds: cpu1.at.Sub(cpu0.at).Seconds()}
	var ok bool
	if row.CPU, row.Other, ok = cpuLoad(cpu0, cpu1); !ok {
		return row, errors.New("could not read the nodes' CPU time")
	}
	from, to := measureFrom.UnixNano(), spec.end.UnixNano()
	allowed := 0
	for _, s := range o.res.sends {
		if s.AtNS < from || s.AtNS >= to {
			continue
		}
		switch s.Outcome {
		case Allowed:
			allowed++
		case RateLimited:
			row.Refused++
		default:
			row.Errors++
		}
		if s.Late {
			row.Late++
		}
	}
	per := func(name string) float64 {
		sum := 0.0
		for i := range s1 {
			sum += s1[i].Metrics[name] - s0[i].Metrics[name]
		}
		return sum / float64(n) / row.Seconds
	}
	row.Served = float64(allowed) / float64(n) / cfg.Duration.Seconds()
	row.BytesOut, row.BytesIn = per(mBytesSent), per(mBytesRecv)
	row.MsgsOut, row.MsgsIn = per(mMsgsSent), per(mMsgsRecv)
	row.Transfer = per(mTransferSent)
	row.ValuesOut, row.ViewOut, row.ValuesBytesOut = -1, -1, -1
	if _, ok := s1[0].Metrics[mKindValues]; ok {
		row.ValuesOut, row.ViewOut, row.ValuesBytesOut = per(mKindValues), per(mKindView), per(mKindValuesBytes)
		row.SummaryOut = per(mKindSummary)
		row.OwnOtherOut = per(mKindAsk) + per(mKindAnswer) + per(mKindRelay) + per(mKindBusy)
		row.BundleOut = per(mKindBundle)
	} else {
		row.SummaryOut, row.OwnOtherOut, row.BundleOut = -1, -1, -1
	}
	return row, nil
}

// WriteMarkdown writes the report: one table, and the ratios of the new binary to the
// baseline and of N = 20 (the largest N) to N = 3 (the smallest above 1).
func (r *ScaleReport) WriteMarkdown(w io.Writer) {
	c := r.Config
	fmt.Fprintf(w, "# Cluster replication cost by cluster size\n\n")
	fmt.Fprintf(w, "Command: `%s`. Started %s; %s. Load average at the start %s, at the end %s.\n\n",
		runinfo.Command("cluster-scale", c.Args), r.Started.UTC().Format(time.RFC3339), fmt.Sprintf("%s, %d CPUs", r.Machine.CPU, r.Machine.NProc), r.Load[0], r.Load[1])
	fmt.Fprintf(w, "N sidecars on loopback, share mode on, %d ms sync; every node checks every key in turn at %.0f checks/s (limit %d a minute: never reached, so every refusal is below the limit); %v warm-up, %v measured per row; the baseline and the binary under test alternate per configuration. ",
		c.SyncMS, c.RatePerNode, scaleLimit, c.Warmup, c.Duration)
	fmt.Fprintf(w, "CPU is each sidecar's utime + stime (cores, mean per node). Traffic is per node per second from `converger_cluster_sync_bytes_total` and `converger_cluster_sync_messages_total`: every packet and stream of the cluster at the transport (memberlist's probes, push/pulls and the live view included), for a baseline from `c433963` on as well (one before it counted its sync messages only, before memberlist's framing, and its state transfers are the `transfer` column). Of the messages sent, `values` are counter values (their payload bytes before memberlist's framing and encryption in `values KB/s`) `view` the live view's queries and minute counts, `summary` the summaries keys' owners send (owner replication), `own other` the rest of the sidecar's own protocol (requests for room and answers, counts relayed to a new owner, busiest keys) and `bundle` the packets that hold several of those (requests for room or answers, or a flush's values and summaries for one member; counted there only) (`converger_cluster_sent_by_kind_messages_total` and `…_bytes_total`; – for a binary without them, 0 for kinds it does not send); the rest are memberlist's probes and gossip.\n\n")
	if c.Out != "" {
		base := filepath.Base(c.Out)
		fmt.Fprintf(w, "![Messages and kilobytes sent per node against N](%s.png)\n\n", strings.TrimSuffix(base, filepath.Ext(base)))
	}
	fmt.Fprintf(w, "| binary | N | keys | CPU/node | other CPU | served/node/s | refused | errors | sent KB/s | sent msg/s | recv KB/s | recv msg/s | transfer KB/s | values msg/s | values KB/s | view msg/s | summary msg/s | own other msg/s | bundle msg/s |\n")
	fmt.Fprintf(w, "| --- | --: | --: | --: | --: | --: | --: | --: | --: | --: | --: | --: | --: | --: | --: | --: | --: | --: | --: |\n")
	orDash := func(v float64) string {
		if v < 0 {
			return "–"
		}
		return fmt.Sprintf("%.1f", v)
	}
	kb := func(v float64) string {
		if v < 0 {
			return "–"
		}
		return fmt.Sprintf("%.2f", v/1000)
	}
	for _, x := range r.Rows {
		fmt.Fprintf(w, "| %s | %d | %d | %.3f | %.2f | %.0f | %d | %d | %.1f | %.0f | %.1f | %.0f | %.2f | %s | %s | %s | %s | %s | %s |\n",
			x.Binary, x.Nodes, x.Keys, x.CPU, x.Other, x.Served, x.Refused, x.Errors, x.BytesOut/1000, x.MsgsOut, x.BytesIn/1000, x.MsgsIn, x.Transfer/1000,
			orDash(x.ValuesOut), kb(x.ValuesBytesOut), orDash(x.ViewOut), orDash(x.SummaryOut), orDash(x.OwnOtherOut), orDash(x.BundleOut))
	}
	if r.Failed != nil {
		fmt.Fprintf(w, "\nThe run stopped early: %s.\n", strings.ReplaceAll(r.Failed.Error(), "\n", "; "))
	}
	fmt.Fprintf(w, "\n")
	// Growth with N, per binary and key count: the largest N against the smallest above 1,
	// and CPU against N = 1.
	find := func(bin string, n, keys int) (ScaleRow, bool) {
		for _, x := range r.Rows {
			if x.Binary == bin && x.Nodes == n && x.Keys == keys {
				return x, true
			}
		}
		return ScaleRow{}, false
	}
	lo, hi := 0, 0
	for _, n := range c.Nodes {
		if n > 1 && (lo == 0 || n < lo) {
			lo = n
		}
		hi = max(hi, n)
	}
	if lo == 0 || hi == lo {
		return
	}
	fmt.Fprintf(w, "| binary | keys | traffic N=%d / N=%d (bytes out, in; msgs out, in) | CPU N=%d − N=1 (cores) |\n| --- | --: | --- | --: |\n", hi, lo, hi)
	for _, bin := range []string{"base", "new"} {
		for _, k := range c.Keys {
			a, ok1 := find(bin, lo, k)
			b, ok2 := find(bin, hi, k)
			if !ok1 || !ok2 {
				continue
			}
			ratio := func(x, y float64) string {
				if y == 0 {
					return "–"
				}
				return fmt.Sprintf("%.2f", x/y)
			}
			cpu := "–"
			if one, ok := find(bin, 1, k); ok {
				cpu = fmt.Sprintf("%+.3f", b.CPU-one.CPU)
			}
			fmt.Fprintf(w, "| %s | %d | %s, %s; %s, %s | %s |\n", bin, k, ratio(b.BytesOut, a.BytesOut), ratio(b.BytesIn, a.BytesIn),
				ratio(b.MsgsOut, a.MsgsOut), ratio(b.MsgsIn, a.MsgsIn), cpu)
		}
	}
	fmt.Fprintf(w, "\nThe machine has 2 cores shared with other builds: the \"other CPU\" column is what the rest of the machine used during each row.\n")
}
