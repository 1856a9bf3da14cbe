package clusterload

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/converger/edge/bench/procs"
	"github.com/converger/edge/bench/promscrape"
	"github.com/converger/edge/bench/rawcheck"
	"github.com/converger/edge/bench/runinfo"
	"github.com/converger/edge/shared/limiterclient"
)

// The exactness scenarios (`bench cluster -exact`): share mode must hold the limit at
// both ends, never above it and never refusing below it. Each trial is one fresh key in
// one window of a minute, as token_create (10 a minute per client IP, checked as Envoy
// does over ext_authz) and login_ip (5 a minute, checked over the Limiter service) are
// used: small limits, a few checks per node. A trial's under-admission is the checks
// refused when the window's allowed total ended below L, as a share of L; its overshoot
// the allowed total over L. Every cluster size runs the baseline binary and the sidecar
// in turn, on fresh clusters, and the report sets them side by side.

// ExactConfig configures the exactness scenarios.
type ExactConfig struct {
	On       bool   // run them (and nothing else)
	Baseline string // sidecar binary to compare with, in the same run ("": none)
	Nodes    []int
	Keys     int // keys (trials) per scenario
	Rounds   int // fresh clusters per binary and size, alternating
	Out      string
	// GrantWait, when set, is the sidecars' RATE_LIMIT_GRANT_WAIT_MS (the baseline
	// ignores it).
	GrantWait string
}

func (e *ExactConfig) register(fs *flag.FlagSet) {
	fs.BoolVar(&e.On, "exact", false, "run only the exactness scenarios: under-admission and overshoot at small limits (token_create 10/min, login_ip 5/min)")
	fs.StringVar(&e.Baseline, "exact-baseline", "", "-exact: baseline sidecar binary measured in the same run")
	fs.Var((*intList)(&e.Nodes), "exact-n", "-exact: cluster sizes, comma-separated (default 3,20)")
	fs.IntVar(&e.Keys, "exact-keys", 20, "-exact: keys (trials) per scenario")
	fs.IntVar(&e.Rounds, "exact-rounds", 1, "-exact: fresh clusters per binary and size, the binaries alternating")
	fs.StringVar(&e.GrantWait, "exact-grant-wait", "", "-exact: the sidecars' RATE_LIMIT_GRANT_WAIT_MS, the owner's grants (empty: the binary's default)")
	fs.StringVar(&e.Out, "exact-out", "", "-exact: markdown file whose section between the exactness markers is replaced (e.g. bench/results/cluster-sync.md); empty: none")
}

// exactLimits are the limits of the trials.
const exactLimits = "limits:\n  token_create: {limit: 10, window: 1m}\n  login_ip: {limit: 5, window: 1m}\n"

// exactStep is a trial's checks on one node: count of them, as fast as they go, at at
// (from the trial's start) and pause after the step before ended, whichever is later.
type exactStep struct {
	at    time.Duration
	pause time.Duration
	node  int
	count int
}

// exactScenario is a plan of checks on one key, given the cluster size.
type exactScenario struct {
	name   string
	bucket string // token_create (ext_authz) or login_ip (Limiter service)
	limit  int
	// slow says the demand moves between nodes no faster than every two sync intervals
	// (the aim there is no under-admission at all).
	slow bool
	plan func(n int) []exactStep
}

// exactScenarios are the scenarios, each run on Keys keys at once.
func exactScenarios() []exactScenario {
	ss := []exactScenario{{
		name: "split use: 4 on n1, 4 on n2, 600 ms idle, 3 on n3", bucket: "token_create", limit: 10, slow: true,
		plan: func(int) []exactStep {
			return []exactStep{{node: 0, count: 4}, {node: 1, count: 4}, {pause: 600 * time.Millisecond, node: 2, count: 3}}
		},
	}}
	// Small limits, one to three checks per node, the nodes in turn 300 ms apart, until
	// twice the limit was offered.
	for _, lim := range []struct {
		bucket string
		limit  int
	}{{"login_ip", 5}, {"token_create", 10}} {
		for per := 1; per <= 3; per++ {
			ss = append(ss, exactScenario{
				name: fmt.Sprintf("limit %d, %d check(s) per node in turn, 300 ms apart", lim.limit, per), bucket: lim.bucket, limit: lim.limit, slow: true,
				plan: func(n int) []exactStep {
					var out []exactStep
					for i := 0; i*per < 2*lim.limit; i++ {
						out = append(out, exactStep{at: time.Duration(i) * 300 * time.Millisecond, node: i % n, count: per})
					}
					return out
				},
			})
		}
	}
	// Loads of 0.5 to 10 × L over 4 s: even over the nodes; moving from node to node
	// every 200 ms and every 600 ms; on n1, joined by n2 halfway.
	const span = 4 * time.Second
	for _, load := range []float64{0.5, 1, 3, 10} {
		total := int(math.Round(load * 10))
		at := func(j int) time.Duration { return time.Duration(j) * span / time.Duration(total) }
		shape := func(name string, slow bool, node func(j, n int) int) exactScenario {
			return exactScenario{name: fmt.Sprintf("%s, %s× L", name, fmtLoad(load)), bucket: "token_create", limit: 10, slow: slow,
				plan: func(n int) []exactStep {
					var out []exactStep
					for j := range total {
						out = append(out, exactStep{at: at(j), node: node(j, n), count: 1})
					}
					return out
				}}
		}
		ss = append(ss,
			shape("even over the nodes", false, func(j, n int) int { return j % n }),
			shape("moving every 200 ms", false, func(j, n int) int { return int(at(j)/(200*time.Millisecond)) % n }),
			shape("moving every 600 ms", true, func(j, n int) int { return int(at(j)/(600*time.Millisecond)) % n }),
			shape("n1, joined by n2 mid-window", false, func(j, n int) int {
				if at(j) < span/2 {
					return 0
				}
				return j % 2
			}),
		)
	}
	return ss
}

// ExactResult is one scenario on one binary and cluster size.
type ExactResult struct {
	Scenario string
	Binary   string // "baseline" or "sidecar"
	Nodes    int
	Limit    int
	Slow     bool
	Keys     int
	Offered  int     // checks per key
	Exact    int     // keys whose window allowed exactly min(offered, L)
	Under    float64 // mean under-admission per key, × L
	UnderMax float64 // the worst key's
	Over     float64 // the most allowed in a key's window, × L
	Errors   int
}

// ExactReport is the outcome of the exactness scenarios.
type ExactReport struct {
	Started time.Time
	Elapsed time.Duration
	runinfo.Machine
	LoadStart, LoadEnd string
	Command            string
	Results            []ExactResult
	Pass               bool // the sidecar met the aims in every scenario
	// Grants are the owner's grants (converger_cluster_share_grants_total summed over
	// the nodes) of each cluster run, by "N nodes, binary".
	Grants []string
}

// RunExact runs the exactness scenarios and writes their section of the report.
func RunExact(ctx context.Context, cfg Config, stdout, stderr io.Writer) (*Report, error) {
	e := cfg.Exact
	if len(e.Nodes) == 0 {
		e.Nodes = []int{3, 20}
	}
	if e.Keys < 1 || e.Keys > 100 || e.Rounds < 1 || e.Rounds > 5 {
		return nil, errors.New("-exact-keys: 1 to 100, -exact-rounds: 1 to 5")
	}
	for _, n := range e.Nodes {
		if n < 3 || n > 24 {
			return nil, fmt.Errorf("-exact-n %d: 3 to 24 nodes", n)
		}
	}
	logf := func(format string, args ...any) { fmt.Fprintf(stderr, "bench cluster -exact: "+format+"\n", args...) }
	root := procs.RepoRoot()
	bins := map[string]string{}
	names := []string{"sidecar"}
	var err error
	if bins["sidecar"], err = procs.FindSidecar(root, cfg.Sidecar); err != nil {
		return nil, err
	}
	if e.Baseline != "" {
		if bins["baseline"], err = procs.FindSidecar(root, e.Baseline); err != nil {
			return nil, err
		}
		names = []string{"baseline", "sidecar"}
	}
	dir, err := os.MkdirTemp("", "bench-cluster-exact-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	limits := filepath.Join(dir, "limits.yaml")
	if err := os.WriteFile(limits, []byte(exactLimits), 0o644); err != nil {
		return nil, err
	}
	rep := &ExactReport{Started: time.Now(), Machine: runinfo.Describe(ctx), LoadStart: runinfo.LoadAvg(), Command: runinfo.Command("cluster", cfg.Args)}
	scens := exactScenarios()
	type acc struct {
		res   ExactResult
		under []float64
	}
	accs := map[string]*acc{}
	var order []string
	for _, n := range e.Nodes {
		for round := range e.Rounds {
			for _, b := range names {
				logf("%d nodes, %s (round %d of %d)", n, b, round+1, e.Rounds)
				outs, grants, err := exactOnCluster(ctx, bins[b], limits, n, e.Keys, scens, e.GrantWait, stderr)
				if err != nil {
					return nil, fmt.Errorf("%s, %d nodes: %w", b, n, err)
				}
				if grants != "" {
					rep.Grants = append(rep.Grants, fmt.Sprintf("%d nodes, %s: %s", n, b, grants))
					logf("%d nodes, %s: grants %s", n, b, grants)
				}
				for i, sc := range scens {
					id := fmt.Sprintf("%d|%s|%d", n, b, i)
					a := accs[id]
					if a == nil {
						a = &acc{res: ExactResult{Scenario: sc.name, Binary: b, Nodes: n, Limit: sc.limit, Slow: sc.slow}}
						accs[id] = a
						order = append(order, id)
					}
					for _, o := range outs[i] {
						a.res.Keys++
						a.res.Offered = o.offered
						a.res.Errors += o.errors
						if o.allowed == min(o.offered, sc.limit) {
							a.res.Exact++
						}
						u := 0.0
						if o.allowed < sc.limit {
							u = float64(o.refused) / float64(sc.limit)
						}
						a.under = append(a.under, u)
						a.res.UnderMax = max(a.res.UnderMax, u)
						a.res.Over = max(a.res.Over, float64(o.allowed)/float64(sc.limit))
					}
				}
			}
		}
	}
	rep.Pass = true
	for _, id := range order {
		a := accs[id]
		for _, u := range a.under {
			a.res.Under += u / float64(len(a.under))
		}
		if a.res.Binary == "sidecar" && !exactMet(a.res) {
			rep.Pass = false
		}
		rep.Results = append(rep.Results, a.res)
	}
	rep.Elapsed, rep.LoadEnd = time.Since(rep.Started), runinfo.LoadAvg()
	md := rep.Markdown()
	fmt.Fprint(stdout, md)
	if e.Out != "" {
		path := e.Out
		if !filepath.IsAbs(path) {
			path = filepath.Join(root, path)
		}
		if err := replaceSection(path, md); err != nil {
			return nil, err
		}
		logf("wrote %s", path)
	}
	return &Report{Config: cfg, AimPass: rep.Pass, SinglePass: true}, nil
}

// exactMet reports whether a scenario met the aims: no under-admission where demand
// moves slower than two sync intervals, at most 0.02 × L per window elsewhere, and at
// most 1.05 × L allowed in any window.
func exactMet(r ExactResult) bool {
	under := r.Under <= 0.02
	if r.Slow {
		under = r.UnderMax == 0
	}
	return under && r.Over <= AimMaxAllowed && r.Errors == 0
}

// trialOutcome is one key's window.
type trialOutcome struct {
	offered, allowed, refused, errors int
}

// exactOnCluster starts a cluster of n with the binary, its clocks shifted so that a
// minute window begins once it has formed, and runs every scenario on keys keys at once
// in that window. It returns the outcomes by scenario.
func exactOnCluster(ctx context.Context, bin, limits string, n, keys int, scens []exactScenario, grantWait string, stderr io.Writer) ([][]trialOutcome, string, error) {
	const windowMS = 60_000
	budget := 3*time.Second + time.Duration(n)*300*time.Millisecond // to start and form
	start := time.Now().Add(budget).UnixMilli()
	offset := (start/windowMS+1)*windowMS - start // the shifted clock: a window begins at start
	env := []string{fmt.Sprintf("SIDECAR_TEST_CLOCK_OFFSET_MS=%d", offset)}
	if grantWait != "" {
		env = append(env, "RATE_LIMIT_GRANT_WAIT_MS="+grantWait)
	}
	c, err := startCluster(ctx, clusterSpec{bin: bin, limitsFile: limits, nodes: n, syncMS: AimSyncMS, share: true, env: env}, stderr)
	if err != nil {
		return nil, "", err
	}
	defer c.stop()
	lims := make([]*limiterclient.Client, n)
	for i, nd := range c.nodes {
		if lims[i], err = limiterclient.New(nd.grpc); err != nil {
			return nil, "", err
		}
		defer lims[i].Close()
	}
	shifted := func() int64 { return time.Now().UnixMilli() + offset }
	// The trials begin 500 ms into the next window and end well before it does.
	begin := (shifted()/windowMS+1)*windowMS + 500
	sleepUntil(ctx, time.UnixMilli(begin-offset))
	if ctx.Err() != nil {
		return nil, "", ctx.Err()
	}
	out := make([][]trialOutcome, len(scens))
	var wg sync.WaitGroup
	key := 0
	t0 := time.Now()
	for i, sc := range scens {
		out[i] = make([]trialOutcome, keys)
		plan := sc.plan(n)
		for k := range keys {
			key++
			ip := fmt.Sprintf("198.19.%d.%d", key/250, key%250+1)
			wg.Go(func() { out[i][k] = runTrial(ctx, c, lims, sc.bucket, ip, key, plan, t0) })
		}
	}
	wg.Wait()
	if end := shifted(); end/windowMS != begin/windowMS {
		return nil, "", fmt.Errorf("the trials outlasted their window (machine too slow)")
	}
	return out, grantSummary(ctx, c), c.exited()
}

// grantSummary sums the owner's grants over the nodes ("" when none reports them: a
// release without grants).
func grantSummary(ctx context.Context, c *cluster) string {
	sum := map[string]float64{}
	for _, n := range c.nodes {
		samples, err := promscrape.Scrape(ctx, "http://"+n.http+"/metrics",
			[]string{"converger_cluster_share_grants_total{", askRTTBuckets, askLagBuckets})
		if err != nil {
			continue
		}
		for _, s := range samples {
			sum[s.Name] += s.Value
		}
	}
	if len(sum) == 0 {
		return ""
	}
	get := func(role, result string) float64 {
		t := 0.0
		for k, v := range sum {
			if strings.Contains(k, `role="`+role+`"`) && strings.Contains(k, `result="`+result+`"`) {
				t += v
			}
		}
		return t
	}
	out := fmt.Sprintf("asked %g (granted %g, zero %g, timed out %g and of those took a part %g, late %g and of those applied %g); owners answered %g with room and %g with none (themselves: %g and %g)",
		get("asked", "sent"), get("asked", "granted"), get("asked", "zero"), get("asked", "timed_out"), get("asked", "took_part"),
		get("asked", "late"), get("asked", "late_applied"),
		get("answered_other", "granted"), get("answered_other", "zero"), get("answered_self", "granted"), get("answered_self", "zero"))
	if rtt := quantiles(sum, askRTTBuckets); rtt != "" {
		out += "; round trip " + rtt + ", of which the way in " + quantiles(sum, askLagBuckets)
	}
	return out
}

// The requests' histograms (a release before them has none).
const (
	askRTTBuckets = "converger_cluster_share_ask_seconds_bucket{"
	askLagBuckets = "converger_cluster_share_ask_lag_seconds_bucket{"
)

// quantiles gives the median and the 90th and 99th percentiles of the histogram whose
// buckets (summed over the nodes) are the samples named with prefix, each as the bucket
// bound it falls under ("" when the histogram is missing or empty).
func quantiles(sum map[string]float64, prefix string) string {
	type bucket struct{ le, n float64 }
	var bs []bucket
	for name, n := range sum {
		rest, ok := strings.CutPrefix(name, prefix)
		if !ok {
			continue
		}
		_, le, ok := strings.Cut(rest, `le="`)
		if !ok {
			continue
		}
		le, _, _ = strings.Cut(le, `"`)
		v, err := strconv.ParseFloat(le, 64) // "+Inf" parses as +Inf
		if err != nil {
			continue
		}
		bs = append(bs, bucket{v, n})
	}
	slices.SortFunc(bs, func(a, b bucket) int { return cmp.Compare(a.le, b.le) })
	if len(bs) == 0 || bs[len(bs)-1].n == 0 {
		return ""
	}
	total := bs[len(bs)-1].n
	at := func(q float64) string {
		for _, b := range bs {
			if b.n >= q*total {
				if math.IsInf(b.le, 1) {
					return "> " + strconv.FormatFloat(bs[max(len(bs)-2, 0)].le*1000, 'g', -1, 64) + " ms"
				}
				return "≤ " + strconv.FormatFloat(b.le*1000, 'g', -1, 64) + " ms"
			}
		}
		return "?"
	}
	return fmt.Sprintf("p50 %s, p90 %s, p99 %s of %g", at(.5), at(.9), at(.99), total)
}

// runTrial runs a plan on one key.
func runTrial(ctx context.Context, c *cluster, lims []*limiterclient.Client, bucket, ip string, id int, plan []exactStep, t0 time.Time) trialOutcome {
	var o trialOutcome
	req, err := checkRequest(ip, id)
	if err != nil {
		o.errors++
		return o
	}
	for _, st := range plan {
		sleepUntil(ctx, t0.Add(st.at))
		if st.pause > 0 {
			sleepUntil(ctx, time.Now().Add(st.pause))
		}
		for range st.count {
			o.offered++
			cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			var allowed bool
			if bucket == "token_create" {
				var reply rawcheck.Reply
				err = c.nodes[st.node].conn.Invoke(cctx, rawcheck.Method, &rawcheck.Request{B: req}, &reply)
				allowed = err == nil && reply.Allowed()
				if err == nil && !allowed && !reply.RateLimited() {
					err = errors.New("denied, not rate limited")
				}
			} else {
				var r limiterclient.Result
				r, err = lims[st.node].Check(cctx, bucket, ip, 1)
				allowed = err == nil && r.Allowed
			}
			cancel()
			switch {
			case err != nil:
				o.errors++
			case allowed:
				o.allowed++
			default:
				o.refused++
			}
		}
	}
	return o
}

// Markdown is the exactness section of the report.
func (r *ExactReport) Markdown() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s\n## Exact at both ends: under-admission and overshoot at small limits\n\n", exactBegin)
	fmt.Fprintf(&b, "`%s`, %s, %s (load average %s → %s); %v. The machine was shared with other builds and tests: the figures are noisy.\n\n",
		r.Command, r.Started.UTC().Format(time.RFC3339), fmt.Sprintf("%s, %d CPUs", r.CPU, r.NProc), r.LoadStart, r.LoadEnd, r.Elapsed.Round(time.Second))
	b.WriteString("Share mode on, sync every 100 ms. Each scenario runs on fresh keys at once, each key one trial in one window of a minute " +
		"(token_create: 10 a minute per client IP, checked over ext_authz; login_ip: 5 a minute, over the Limiter service). " +
		"**Under-admission**: the checks refused in a key's window whose allowed total ended below L, as a share of L (mean over the keys; worst key). " +
		"**Overshoot**: the most allowed in a key's window, × L. **Exact**: keys whose window allowed exactly min(offered, L). " +
		"The baseline is the previous release's binary, measured in the same run on fresh clusters of the same size. " +
		"Aims: no under-admission where demand moves no faster than every two sync intervals (marked *slow*), at most 0.02 × L elsewhere, overshoot at most 1.05 × L.\n\n")
	sizes := []int{}
	for _, res := range r.Results {
		if !slices.Contains(sizes, res.Nodes) {
			sizes = append(sizes, res.Nodes)
		}
	}
	for _, n := range sizes {
		fmt.Fprintf(&b, "**%d nodes**\n\n| scenario | offered per key | baseline: exact keys | under-admission (worst) | overshoot | sidecar: exact keys | under-admission (worst) | overshoot | aims |\n|---|--:|--:|--:|--:|--:|--:|--:|:-:|\n", n)
		byScen := map[string]map[string]ExactResult{}
		var scens []string
		for _, res := range r.Results {
			if res.Nodes != n {
				continue
			}
			if byScen[res.Scenario] == nil {
				byScen[res.Scenario] = map[string]ExactResult{}
				scens = append(scens, res.Scenario)
			}
			byScen[res.Scenario][res.Binary] = res
		}
		for _, s := range scens {
			cell := func(res ExactResult, ok bool) string {
				if !ok {
					return "– | – | –"
				}
				errs := ""
				if res.Errors > 0 {
					errs = fmt.Sprintf(" (%d errors)", res.Errors)
				}
				return fmt.Sprintf("%d/%d%s | %.3f (%.2f) | %.2f", res.Exact, res.Keys, errs, res.Under, res.UnderMax, res.Over)
			}
			base, okB := byScen[s]["baseline"]
			side, okS := byScen[s]["sidecar"]
			name := s
			if side.Slow || base.Slow {
				name += " *(slow)*"
			}
			met := "–"
			if okS {
				met = map[bool]string{true: "met", false: "**missed**"}[exactMet(side)]
			}
			fmt.Fprintf(&b, "| %s | %d | %s | %s | %s |\n", name, max(side.Offered, base.Offered), cell(base, okB), cell(side, okS), met)
		}
		b.WriteString("\n")
	}
	if len(r.Grants) > 0 {
		b.WriteString("The owner's grants (`converger_cluster_share_grants_total`, summed over the nodes of each run):\n\n")
		for _, g := range r.Grants {
			fmt.Fprintf(&b, "- %s\n", g)
		}
		b.WriteString("\n")
	}
	b.WriteString(exactEnd + "\n")
	return b.String()
}

// The markers of the exactness section in the report, so that `-exact` replaces only it.
const (
	exactBegin = "<!-- bench cluster -exact: begin -->"
	exactEnd   = "<!-- bench cluster -exact: end -->"
)

// replaceSection puts md in place of the exactness section of the file at path, or at
// its end when it has none.
func replaceSection(path, md string) error {
	old, err := os.ReadFile(path)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	s := string(old)
	i, j := strings.Index(s, exactBegin), strings.Index(s, exactEnd)
	if i >= 0 && j > i {
		s = s[:i] + strings.TrimSuffix(md, "\n") + s[j+len(exactEnd):]
	} else {
		if s != "" && !strings.HasSuffix(s, "\n\n") {
			s = strings.TrimRight(s, "\n") + "\n\n"
		}
		s += md
	}
	return os.WriteFile(path, []byte(s), 0o644)
}
