package authzload

import (
	"fmt"
	"io"
	"slices"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/converger/edge/bench/closedloop"
	"github.com/converger/edge/bench/promscrape"
	"github.com/converger/edge/bench/runinfo"
	"github.com/converger/edge/shared/buckets"
)

// Report is the outcome of a load test.
type Report struct {
	Config  Config
	Started time.Time
	runinfo.Machine
	// LoadStart and LoadEnd are /proc/loadavg at the start and the end: how noisy the
	// machine was.
	LoadStart, LoadEnd string
	Setup              SetupInfo
	// Phases are the measured phases in the order they ran.
	Phases       []closedloop.PhaseResult
	WarmupErrors int
	// Sidecar and Noop are the medians over rounds.
	Sidecar, Noop closedloop.Summary
	// ThroughputRatio and P99Ratio compare the medians; the Paired ratios are the medians
	// of the per-round ratios.
	ThroughputRatio, P99Ratio   float64
	PairedThroughput, PairedP99 float64
	Pass                        bool
	// KeysDenied is the number of keys that got a 429 from the sidecar at least once in
	// any phase; HotKeysDenied of them are hot. DeniedByKind splits them by kind, normal
	// and hot.
	KeysDenied, HotKeysDenied int
	DeniedByKind              [numKinds][2]int
	// Sent is the number of requests sent to the sidecar and the no-op, warm-ups included.
	SentSidecar, SentNoop uint64
	Counters              []promscrape.Sample
	// Proxies (forward-auth) are the proxies measured with the check against alone.
	Proxies []ProxyResult
	// MixPass is the mix's verdict; Scenarios are the scenarios, each on each number of
	// connections, and ScenariosPass their verdict on one connection.
	MixPass       bool
	Scenarios     []closedloop.ScenarioResult
	ScenariosPass bool
}

// ProxyResult is a proxy with the forward-auth check against the same proxy alone.
type ProxyResult struct {
	Name         string
	Skipped      string // why it was not measured; "" when it was
	Phases       []closedloop.PhaseResult
	WarmupErrors int
	closedloop.Comparison
}

// SetupInfo describes the data and the mix.
type SetupInfo struct {
	Postgres, Seed, Mix       time.Duration
	Tenants, Channels         int
	Keys, HotKeys             int
	Kinds                     [numKinds][2]int // total and hot keys by kind
	Requests, Prologue, Bytes int
}

// summarize decides the run: the mix meets its targets, and every scenario its aims on
// one connection (on the fewest measured), of those measured.
func (r *Report) summarize() {
	r.Pass = true
	if r.Config.Mix {
		c := closedloop.Compare(r.Phases, "sidecar", "no-op")
		r.Sidecar, r.Noop = c.Target, c.Baseline
		r.ThroughputRatio, r.P99Ratio = c.ThroughputRatio, c.P99Ratio
		r.PairedThroughput, r.PairedP99 = c.PairedThroughput, c.PairedP99
		r.MixPass = c.Meets(MinThroughputRatio, MaxP99Ratio) && r.WarmupErrors == 0
		r.Pass = r.MixPass
	}
	if r.Config.grpc() && r.Config.Scenarios {
		r.ScenariosPass = closedloop.ScenariosPass(r.Scenarios, scenarioNames())
		r.Pass = r.Pass && r.ScenariosPass
	}
}

var (
	ratio   = closedloop.Ratio
	pct     = closedloop.Pct
	fmtCPU  = closedloop.FmtCPU
	fmtLoad = closedloop.FmtLoad
)

// normalDeniedByKind lists the kinds of the normal keys that got a 429, e.g. " (3 client IP)".
func (r *Report) normalDeniedByKind() string {
	var parts []string
	for k := range numKinds {
		if n := r.DeniedByKind[k][0]; n > 0 {
			parts = append(parts, fmt.Sprintf("%d %s", n, k))
		}
	}
	if len(parts) == 0 {
		return ""
	}
	return ": " + strings.Join(parts, ", ")
}

// Command is the command line that reproduces the run.
func (r *Report) Command() string { return runinfo.Command(r.name(), r.Config.Args) }

// name is the bench command of the run.
func (r *Report) name() string { return r.Config.Name() }

// loops says how the closed loops reach a target.
func (r *Report) loops() string {
	if r.Config.Interface == "http" {
		return "one keep-alive HTTP/1.1 connection each"
	}
	return fmt.Sprintf("%d gRPC connections per target, round robin", r.Config.MixConns)
}

// flagRows lists the flags and their values.
func (r *Report) flagRows() [][2]string {
	c := r.Config
	rows := [][2]string{{"-sidecar", c.Sidecar}, {"-keys", fmt.Sprint(c.Keys)}, {"-over", fmt.Sprint(c.Over)}}
	if !c.grpc() {
		rows = append(rows, [2]string{"-proxies", c.Proxies})
	}
	rows = append(rows, c.Loop.Flags(c.grpc())...)
	if c.grpc() {
		rows = append(rows, [][2]string{{"-mix", fmt.Sprint(c.Mix)}, {"-mix-conns", fmt.Sprint(c.MixConns)}, {"-scenarios", fmt.Sprint(c.Scenarios)}, {"-over-keys", fmt.Sprint(c.OverKeys)}}...)
	}
	return append(rows, [][2]string{{"-seed", fmt.Sprint(c.Seed)}, {"-out", c.Out}, {"-strict", fmt.Sprint(c.Strict)}}...)
}

// WriteText prints the report's tables.
func (r *Report) WriteText(w io.Writer) {
	if r.Config.Mix {
		r.writeMixText(w)
	}
	if len(r.Scenarios) > 0 {
		fmt.Fprintf(w, "\nbench %s scenarios: %d rounds × (%v warm-up + %v measured) per target, concurrency %d over %s gRPC connections; load %s → %s\n\n",
			r.name(), r.Config.Rounds, r.Config.Warmup, r.Config.Duration, r.Config.Concurrency, r.Config.Conns, r.LoadStart, r.LoadEnd)
		closedloop.WriteScenariosText(w, r.Scenarios, ScenarioAims, "429")
		fmt.Fprintf(w, "scenarios on %d connection: %s\n", slices.Min(r.Config.Conns), runinfo.Verdict(r.ScenariosPass))
	}
	fmt.Fprintf(w, "result: %s\n", runinfo.Verdict(r.Pass))
}

// writeMixText prints the mix's tables.
func (r *Report) writeMixText(w io.Writer) {
	c := r.Config
	fmt.Fprintf(w, "\nbench %s: %d rounds × (%v warm-up + %v measured) per target, concurrency %d over %s\n",
		r.name(), c.Rounds, c.Warmup, c.Duration, c.Concurrency, r.loops())
	fmt.Fprintf(w, "mix: %d keys (%d hot), %d pre-built requests; %s, %d CPUs, load %s → %s\n\n",
		r.Setup.Keys, r.Setup.HotKeys, r.Setup.Requests, r.CPU, r.NProc, r.LoadStart, r.LoadEnd)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "round\ttarget\trequests\treq/s\tp50\tp90\tp99\tp99.9\tmax\terrors\t429\trejected\tCPU/req\tgen CPU/req\tother load\t")
	for _, p := range r.Phases {
		capped := ""
		if p.Capped {
			capped = " (capped)"
		}
		fmt.Fprintf(tw, "%d\t%s\t%d%s\t%.0f\t%s\t%s\t%s\t%s\t%s\t%d\t%.1f%%\t%.2f%%\t%s\t%s\t%s\t\n", p.Round, p.Target, p.Requests, capped, p.RPS,
			runinfo.Latency(p.P50), runinfo.Latency(p.P90), runinfo.Latency(p.P99), runinfo.Latency(p.P999), runinfo.Latency(p.Max), p.Errors, pct(p.Denied, p.Requests), pct(p.Rejected, p.Requests),
			fmtCPU(p.TargetCPU), fmtCPU(p.GenCPU), fmtLoad(p.OtherLoad))
	}
	for _, s := range []closedloop.Summary{r.Sidecar, r.Noop} {
		fmt.Fprintf(tw, "median\t%s\t%d\t%.0f\t%s\t\t%s\t\t\t%d\t%.1f%%\t%.2f%%\t%s\t%s\t\t\n", s.Target, s.Requests, s.RPS,
			runinfo.Latency(s.P50), runinfo.Latency(s.P99), s.Errors, pct(s.Denied, s.Requests), pct(s.Rejected, s.Requests), fmtCPU(s.TargetCPU), fmtCPU(s.GenCPU))
	}
	tw.Flush()
	fmt.Fprintf(w, "\nthroughput sidecar/no-op  %.3f  (target ≥ %.2f)  %s\n", r.ThroughputRatio, MinThroughputRatio, runinfo.Verdict(r.ThroughputRatio >= MinThroughputRatio))
	fmt.Fprintf(w, "p99 sidecar/no-op         %.3f  (target ≤ %.2f)  %s\n", r.P99Ratio, MaxP99Ratio, runinfo.Verdict(r.P99Ratio <= MaxP99Ratio))
	fmt.Fprintf(w, "paired per-round ratios (median): throughput %.3f, p99 %.3f\n", r.PairedThroughput, r.PairedP99)
	fmt.Fprintf(w, "CPU per check (median): sidecar %s, no-op %s (%+.1f%%); load generator %s\n",
		fmtCPU(r.Sidecar.TargetCPU), fmtCPU(r.Noop.TargetCPU), 100*(ratio(float64(r.Sidecar.TargetCPU), float64(r.Noop.TargetCPU))-1), fmtCPU(r.Noop.GenCPU))
	fmt.Fprintf(w, "errors: %d measured, %d in warm-ups; requests sent incl. warm-ups: sidecar %d, no-op %d\n",
		r.Sidecar.Errors+r.Noop.Errors, r.WarmupErrors, r.SentSidecar, r.SentNoop)
	fmt.Fprintf(w, "denials by the sidecar: %.1f%% of measured requests rate limited (429), %.2f%% rejected credentials; keys denied at least once: %d of %d (%d of %d hot keys, %d normal%s)\n",
		pct(r.Sidecar.Denied, r.Sidecar.Requests), pct(r.Sidecar.Rejected, r.Sidecar.Requests),
		r.KeysDenied, r.Setup.Keys, r.HotKeysDenied, r.Setup.HotKeys, r.KeysDenied-r.HotKeysDenied, r.normalDeniedByKind())
	fmt.Fprintf(w, "mix: %s\n", runinfo.Verdict(r.MixPass))
	for _, p := range r.Proxies {
		if p.Skipped != "" {
			fmt.Fprintf(w, "\n%s: not measured: %s\n", p.Name, p.Skipped)
			continue
		}
		fmt.Fprintf(w, "\n%s with the check against %s alone (medians over rounds):\n", p.Name, p.Name)
		for _, s := range []closedloop.Summary{p.Target, p.Baseline} {
			fmt.Fprintf(w, "  %-14s %8.0f req/s  p50 %s  p99 %s  errors %d  429 %.1f%%  proxy CPU/req %s\n", s.Target, s.RPS,
				runinfo.Latency(s.P50), runinfo.Latency(s.P99), s.Errors, pct(s.Denied, s.Requests), fmtCPU(s.TargetCPU))
		}
		fmt.Fprintf(w, "  throughput ratio %.3f, p99 ratio %.3f (paired per round: %.3f, %.3f)\n", p.ThroughputRatio, p.P99Ratio, p.PairedThroughput, p.PairedP99)
	}
}

// writeProxies renders the proxies' section: each with the check against alone.
func (r *Report) writeProxies(b *strings.Builder) {
	if len(r.Proxies) == 0 {
		return
	}
	b.WriteString("\n## Through the proxies: with the check against without it\n\n")
	b.WriteString("Each proxy runs twice, in front of the no-op HTTP server as the upstream: with its shipped configuration (`deploy/caddy/Caddyfile`, `deploy/nginx/converger.conf`: the forward-auth check on every request, answered by the sidecar above), and alone (a plain reverse proxy: for nginx the shipped file without its `auth_request` line). The clients send the mix's requests (method, URI, headers, no body, the client in X-Forwarded-For), in alternating rounds as above. Proxy CPU is the proxy's process only; with the check, the sidecar's CPU comes on top. nginx passes the clients' X-Forwarded-For on (appending its peer), so the sidecar counts the mix's clients; Caddy replaces it with its peer's address, so behind Caddy every IP-counted request counts as one client's (127.0.0.1).\n\n")
	b.WriteString("| proxy | target | requests | req/s | p50 | p99 | errors | 429 | proxy CPU per request |\n|---|---|--:|--:|--:|--:|--:|--:|--:|\n")
	for _, p := range r.Proxies {
		if p.Skipped != "" {
			fmt.Fprintf(b, "| %s | not measured: %s | | | | | | | |\n", p.Name, p.Skipped)
			continue
		}
		for _, s := range []closedloop.Summary{p.Target, p.Baseline} {
			fmt.Fprintf(b, "| %s | %s | %d | %.0f | %s | %s | %d | %.1f%% | %s |\n", p.Name, s.Target, s.Requests, s.RPS,
				runinfo.Latency(s.P50), runinfo.Latency(s.P99), s.Errors, pct(s.Denied, s.Requests), fmtCPU(s.TargetCPU))
		}
	}
	b.WriteString("\n| proxy | throughput with/without the check | p99 with/without | paired per round (throughput, p99) |\n|---|--:|--:|--:|\n")
	for _, p := range r.Proxies {
		if p.Skipped == "" {
			fmt.Fprintf(b, "| %s | %.3f | %.3f | %.3f, %.3f |\n", p.Name, p.ThroughputRatio, p.P99Ratio, p.PairedThroughput, p.PairedP99)
		}
	}
	b.WriteString("\n| proxy | round | target | requests | req/s | p50 | p99 | errors | 429 | proxy CPU/req | other load |\n|---|--:|---|--:|--:|--:|--:|--:|--:|--:|--:|\n")
	for _, p := range r.Proxies {
		for _, ph := range p.Phases {
			fmt.Fprintf(b, "| %s | %d | %s | %d | %.0f | %s | %s | %d | %.1f%% | %s | %s |\n", p.Name, ph.Round, ph.Target, ph.Requests, ph.RPS,
				runinfo.Latency(ph.P50), runinfo.Latency(ph.P99), ph.Errors, pct(ph.Denied, ph.Requests), fmtCPU(ph.TargetCPU), fmtLoad(ph.OtherLoad))
		}
	}
}

// Markdown renders the report for bench/results.
func (r *Report) Markdown() string {
	var b strings.Builder
	c := r.Config
	if c.Interface == "http" {
		fmt.Fprintf(&b, "# Forward-auth load test: the sidecar's HTTP check against a no-op HTTP handler (%s)\n\n", c.NoopServer)
	} else {
		fmt.Fprintf(&b, "# Authorization load test: sidecar against a no-op server\n\n")
	}
	fmt.Fprintf(&b, "Written by `bench %s` on %s. **Result: %s**", r.name(), r.Started.UTC().Format("2006-01-02 15:04 UTC"), runinfo.Verdict(r.Pass))
	if c.Mix {
		fmt.Fprintf(&b, "; the mix: %s (throughput sidecar/no-op %.3f, target ≥ %.2f; p99 sidecar/no-op %.3f, target ≤ %.2f; %d errors)",
			runinfo.Verdict(r.MixPass), r.ThroughputRatio, MinThroughputRatio, r.P99Ratio, MaxP99Ratio, r.Sidecar.Errors+r.Noop.Errors+r.WarmupErrors)
	}
	if len(r.Scenarios) > 0 {
		fmt.Fprintf(&b, "; the scenarios on %d connection: %s (%s)", slices.Min(c.Conns), runinfo.Verdict(r.ScenariosPass), ScenarioAims)
	}
	b.WriteString(".\n\n")
	if len(r.Scenarios) > 0 {
		r.writeScenarios(&b)
	}
	if c.Mix {
		r.writeMix(&b)
	}
	b.WriteString("\n## Environment\n\n")
	fmt.Fprintf(&b, "- date: %s\n- go version: `%s` (bench built with %s)\n- CPU: %s, nproc %d\n- load average at start / end: %s / %s\n",
		r.Started.UTC().Format(time.RFC3339), r.GoVersion, r.BenchGo, r.CPU, r.NProc, r.LoadStart, r.LoadEnd)
	if c.Mix {
		fmt.Fprintf(&b, "- setup: PostgreSQL started and migrated in %v, seeded in %v, mix built in %v\n",
			r.Setup.Postgres.Round(time.Millisecond), r.Setup.Seed.Round(time.Millisecond), r.Setup.Mix.Round(time.Millisecond))
	}

	b.WriteString("\n## Flags\n\n| flag | value |\n|---|---|\n")
	for _, f := range r.flagRows() {
		fmt.Fprintf(&b, "| `%s` | `%s` |\n", f[0], f[1])
	}
	fmt.Fprintf(&b, "\n## Reproduce\n\n```sh\n%s\n```\n", r.Command())

	r.writeProxies(&b)
	if c.Interface == "http" {
		fmt.Fprintf(&b, `
## Method

- Both targets are separate processes on loopback, started by the load test: `+"`bin/sidecar`"+` with a throwaway
  PostgreSQL (seeded with COPY), TOKEN_VERIFY_KEYS, TRUSTED_PROXIES=%s,127.0.0.1 (the load generator
  plays the proxy) and LOG_LEVEL=warn, whose HTTP port is a fasthttp server; and `+"`bin/bench noop-forward-auth -server %s`"+`,
  an HTTP server (net/http: the standard library's; fasthttp: the sidecar's, set as the sidecar sets it) with
  the sidecar's HTTP server timeouts, whose handler answers 200 with an empty body.
- The checks are those of `+"`bench authz`"+`'s mix, as a proxy sends them: GET /check with X-Forwarded-Method,
  X-Forwarded-Uri, the request's headers without its body, and X-Forwarded-For with the load balancer (the
  CheckRequest's source) appended, so that the sidecar resolves the same clients. They are built before
  measuring and sent as they are, so the generator does the same work for both targets.
- Closed loop: %d workers, each sending its next request when the previous one is answered, over %s.
  Each target keeps its own position in the request sequence.
- Rounds alternate the order of the targets (round 1: sidecar first, round 2: no-op first, …). Each
  phase is a %v unmeasured warm-up (the first one lasts at least until every key has been sent once,
  so that the sidecar's caches are filled), then %v measured (at most %d requests). Latency is
  measured per request around the HTTP exchange; p50/p99 are exact (all latencies sorted, nearest rank).
- Throughput and p99 are the medians over rounds; the verdict compares them with the no-op's.
- CPU per check is read from /proc for each target process around each measured phase.
- The sidecar's limits are the built-in defaults; hot keys get one burst per pass over the body.
`, TrustedProxies, c.NoopServer, c.Concurrency, r.loops(), c.Warmup, c.Duration, c.MaxRequests)
		return b.String()
	}
	fmt.Fprintf(&b, `
## Method

- Both targets are separate processes on loopback, started by the load test: `+"`bin/sidecar`"+` with a throwaway
  PostgreSQL (seeded with COPY), TOKEN_VERIFY_KEYS, TRUSTED_PROXIES=%s and LOG_LEVEL=warn, whose Check reads
  and writes its messages with its own codec (sidecar/envoywire); and `+"`bin/bench noop`"+`, a plain grpc-go
  server with gRPC's standard proto codec and the sidecar's keepalive and message-size options, whose Check
  returns OK.
- Requests are built and marshaled before measuring, as Envoy sends them (source = the load balancer,
  client in x-forwarded-for, lower-case headers with the credential, x-request-id, user-agent,
  content-type), and sent as they are, so the generator does the same work for both targets.
- Closed loop: %d workers, each sending its next request when the previous one is answered, over %d
  connections per target for the mix (round robin; the scenarios on each of their numbers of connections).
  Each target keeps its own position in the request sequence.
- Rounds alternate the order of the targets (round 1: sidecar first, round 2: no-op first, …). Each
  phase is a %v unmeasured warm-up (the first one lasts at least until every key has been sent once,
  so that the sidecar's caches are filled), then %v measured (at most %d requests). Latency is
  measured per request around the gRPC call; p50/p99 are exact (all latencies sorted, nearest rank).
- Throughput and p99 are the medians over rounds; the verdict compares them with the no-op's.
- CPU per check is read from /proc for each target process (and getrusage for the generator) around
  each measured phase. The targets and the generator share the machine's CPUs, so the throughput
  ratio follows (generator + no-op CPU) / (generator + sidecar CPU) per check; CPU per check is the
  steadier figure when other processes load the machine ("other load").
- In the mix, the sidecar's limits are the built-in defaults; hot keys get one burst per pass over the body
  (1.5× a one-second bucket's limit, twice a longer bucket's), at half the requests of its span.
`, TrustedProxies, c.Concurrency, c.MixConns, c.Warmup, c.Duration, c.MaxRequests)
	return b.String()
}

// writeMix renders the mix's sections.
func (r *Report) writeMix(b *strings.Builder) {
	b.WriteString("## The mix: all limited routes, medians over rounds\n\n")
	b.WriteString("| target | requests | req/s | p50 | p99 | errors | 429 | rejected credentials | CPU per check | generator CPU per check |\n|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|\n")
	for _, s := range []closedloop.Summary{r.Sidecar, r.Noop} {
		fmt.Fprintf(b, "| %s | %d | %.0f | %s | %s | %d | %.1f%% | %.2f%% | %s | %s |\n", s.Target, s.Requests, s.RPS, runinfo.Latency(s.P50), runinfo.Latency(s.P99),
			s.Errors, pct(s.Denied, s.Requests), pct(s.Rejected, s.Requests), fmtCPU(s.TargetCPU), fmtCPU(s.GenCPU))
	}
	b.WriteString("\n| ratio | value | target | verdict |\n|---|--:|--:|---|\n")
	fmt.Fprintf(b, "| throughput sidecar/no-op | %.3f | ≥ %.2f | %s |\n", r.ThroughputRatio, MinThroughputRatio, runinfo.Verdict(r.ThroughputRatio >= MinThroughputRatio))
	fmt.Fprintf(b, "| p99 sidecar/no-op | %.3f | ≤ %.2f | %s |\n", r.P99Ratio, MaxP99Ratio, runinfo.Verdict(r.P99Ratio <= MaxP99Ratio))
	fmt.Fprintf(b, "\nMedians of the per-round ratios (each round's sidecar phase against the same round's no-op phase): throughput %.3f, p99 %.3f.\n",
		r.PairedThroughput, r.PairedP99)
	fmt.Fprintf(b, "\nCPU per check is the CPU time (user + system) of the target's process during its measured phases divided by the requests answered: the sidecar costs %+.1f%% of the no-op's. The load generator shares the machine, so a target's throughput follows its CPU per check.\n\n",
		100*(ratio(float64(r.Sidecar.TargetCPU), float64(r.Noop.TargetCPU))-1))

	b.WriteString("## Rounds\n\n| round | target | requests | req/s | p50 | p90 | p99 | p99.9 | max | errors | 429 | CPU/req | generator CPU/req | other load |\n|--:|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|\n")
	for _, p := range r.Phases {
		capped := ""
		if p.Capped {
			capped = " (capped)"
		}
		fmt.Fprintf(b, "| %d | %s | %d%s | %.0f | %s | %s | %s | %s | %s | %d | %.1f%% | %s | %s | %s |\n", p.Round, p.Target, p.Requests, capped, p.RPS,
			runinfo.Latency(p.P50), runinfo.Latency(p.P90), runinfo.Latency(p.P99), runinfo.Latency(p.P999), runinfo.Latency(p.Max), p.Errors, pct(p.Denied, p.Requests), fmtCPU(p.TargetCPU), fmtCPU(p.GenCPU), fmtLoad(p.OtherLoad))
	}
	fmt.Fprintf(b, "\nOther load is the CPU the rest of the machine used during the phase (other processes, and kernel work charged to none), in CPUs of the %d: on a shared machine, phases with more of it are slower for reasons outside the targets.\n", r.NProc)
	fmt.Fprintf(b, "\nRequests sent including warm-ups: sidecar %d, no-op %d.\n", r.SentSidecar, r.SentNoop)
	for _, p := range r.Phases {
		if p.FirstErr != "" {
			fmt.Fprintf(b, "\nFirst error of round %d, %s: `%s`\n", p.Round, p.Target, p.FirstErr)
		}
	}

	b.WriteString("\n## Mix\n\n")
	fmt.Fprintf(b, "%d distinct keys, %d of them hot (driven over their limit in bursts); %d tenants and %d channels in PostgreSQL; %d pre-built requests (%.0f MB): a prologue of %d that sends every key once, then a body that repeats.\n\n",
		r.Setup.Keys, r.Setup.HotKeys, r.Setup.Tenants, r.Setup.Channels, r.Setup.Requests, float64(r.Setup.Bytes)/1e6, r.Setup.Prologue)
	b.WriteString("| key kind | keys | hot |\n|---|--:|--:|\n")
	for k := range numKinds {
		fmt.Fprintf(b, "| %s | %d | %d |\n", k, r.Setup.Kinds[k][0], r.Setup.Kinds[k][1])
	}
	b.WriteString("\nMeasured requests by class, and the sidecar's 429s:\n\n| request | route | first bucket | share | 429 on the sidecar |\n|---|---|---|--:|--:|\n")
	for c := range numClasses {
		cl := classes[c]
		var cc closedloop.ClassCount
		if int(c) < len(r.Sidecar.ByClass) {
			cc = r.Sidecar.ByClass[c]
		}
		route, bucket := cl.Pattern, cl.Bucket
		if route == "" {
			route, bucket = "(not limited)", "—"
		}
		fmt.Fprintf(b, "| %s | `%s %s` | %s | %.1f%% | %.1f%% |\n", cl.Name, cl.Method, route, bucket, pct(cc.Requests, r.Sidecar.Requests), pct(cc.Denied, cc.Requests))
	}
	fmt.Fprintf(b, "\nKeys that got a 429 at least once (any phase): %d of %d — %d of the %d hot keys and %d normal keys%s.\n",
		r.KeysDenied, r.Setup.Keys, r.HotKeysDenied, r.Setup.HotKeys, r.KeysDenied-r.HotKeysDenied, r.normalDeniedByKind())

	if len(r.Counters) > 0 {
		b.WriteString("\n## Sidecar counters at the end\n\n| metric | value |\n|---|--:|\n")
		cs := append([]promscrape.Sample(nil), r.Counters...)
		sort.Slice(cs, func(i, j int) bool { return cs[i].Name < cs[j].Name })
		for _, ct := range cs {
			fmt.Fprintf(b, "| `%s` | %.0f |\n", ct.Name, ct.Value)
		}
	}

}

// writeScenarios renders the scenarios' section.
func (r *Report) writeScenarios(b *strings.Builder) {
	c := r.Config
	b.WriteString("## Scenarios: one hot key, many keys, keys over their limit (medians over rounds)\n\n")
	fmt.Fprintf(b, "Each on %s gRPC connections per target, against the same no-op, by a sidecar of their own: no database, TOKEN_VERIFY_KEYS and TRUSTED_PROXIES as for the mix, and RATE_LIMIT_CONFIG raising `%s` far above what is sent and setting `%s` to one an hour:\n\n",
		c.Conns, buckets.ActivityCreate, buckets.Upload)
	for _, s := range scenarios {
		fmt.Fprintf(b, "- **%s**: %s.\n", s.Name, s.Summary)
	}
	b.WriteString("\nEvery request is a CheckRequest as Envoy sends it for a browser's POST behind a load balancer: 20 headers (the bearer token among them), the source and destination addresses, the request's time and size, empty metadata.\n\n")
	closedloop.WriteScenariosMarkdown(b, r.Scenarios, ScenarioAims, "429", r.NProc)
	b.WriteString("\n")
}
