package rlsload

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/converger/edge/bench/closedloop"
	"github.com/converger/edge/bench/promscrape"
	"github.com/converger/edge/bench/runinfo"
)

// Report is the outcome of the load test.
type Report struct {
	Config  Config
	Started time.Time
	runinfo.Machine
	LoadStart, LoadEnd string
	Scenarios          []ScenarioResult
	Pass               bool
	Counters           []promscrape.Sample
}

// ScenarioResult is one scenario's rounds and their comparison.
type ScenarioResult struct {
	Name, Summary string
	Keys          int
	Phases        []closedloop.PhaseResult
	WarmupErrors  int
	closedloop.Comparison
	// KeysDenied is the number of keys the sidecar answered OVER_LIMIT at least once.
	KeysDenied int
	Pass       bool
}

func (r *Report) summarize() {
	r.Pass = len(r.Scenarios) == len(scenarios)
	for _, s := range r.Scenarios {
		r.Pass = r.Pass && s.Pass
	}
}

// Command is the command line that reproduces the run.
func (r *Report) Command() string { return runinfo.Command("rls", r.Config.Args) }

// WriteText prints the report's tables.
func (r *Report) WriteText(w io.Writer) {
	c := r.Config
	fmt.Fprintf(w, "\nbench rls: per scenario %d rounds × (%v warm-up + %v measured) per target, concurrency %d over %d connections\n",
		c.Rounds, c.Warmup, c.Duration, c.Concurrency, c.Conns)
	fmt.Fprintf(w, "%s, %d CPUs, load %s → %s\n\n", r.CPU, r.NProc, r.LoadStart, r.LoadEnd)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "scenario\tround\ttarget\trequests\treq/s\tp50\tp99\tp99.9\terrors\tover limit\tCPU/req\tother load\t")
	for _, s := range r.Scenarios {
		for _, p := range s.Phases {
			fmt.Fprintf(tw, "%s\t%d\t%s\t%d\t%.0f\t%s\t%s\t%s\t%d\t%.1f%%\t%s\t%s\t\n", s.Name, p.Round, p.Target, p.Requests, p.RPS,
				runinfo.Latency(p.P50), runinfo.Latency(p.P99), runinfo.Latency(p.P999), p.Errors, closedloop.Pct(p.Denied, p.Requests),
				closedloop.FmtCPU(p.TargetCPU), closedloop.FmtLoad(p.OtherLoad))
		}
	}
	tw.Flush()
	fmt.Fprintln(w)
	for _, s := range r.Scenarios {
		fmt.Fprintf(w, "%-5s throughput sidecar/no-op %.3f (≥ %.2f), p99 %.3f (≤ %.2f), paired %.3f / %.3f, CPU/req %s vs %s, %d of %d keys over limit: %s\n",
			s.Name, s.ThroughputRatio, MinThroughputRatio, s.P99Ratio, MaxP99Ratio, s.PairedThroughput, s.PairedP99,
			closedloop.FmtCPU(s.Target.TargetCPU), closedloop.FmtCPU(s.Baseline.TargetCPU), s.KeysDenied, s.Keys, runinfo.Verdict(s.Pass))
	}
	fmt.Fprintf(w, "result: %s\n", runinfo.Verdict(r.Pass))
}

// Markdown renders the report for bench/results.
func (r *Report) Markdown() string {
	var b strings.Builder
	c := r.Config
	fmt.Fprintf(&b, "# Rate limit service load test: sidecar against a no-op server\n\n")
	fmt.Fprintf(&b, "Written by `bench rls` on %s. **Result: %s** (every scenario: throughput sidecar/no-op ≥ %.2f and p99 ≤ %.2f × the no-op's, no gRPC errors).\n\n",
		r.Started.UTC().Format("2006-01-02 15:04 UTC"), runinfo.Verdict(r.Pass), MinThroughputRatio, MaxP99Ratio)
	b.WriteString("## Result (medians over rounds)\n\n| scenario | target | requests | req/s | p50 | p99 | gRPC errors | over limit | CPU per call |\n|---|---|--:|--:|--:|--:|--:|--:|--:|\n")
	for _, s := range r.Scenarios {
		for _, t := range []closedloop.Summary{s.Target, s.Baseline} {
			fmt.Fprintf(&b, "| %s | %s | %d | %.0f | %s | %s | %d | %.1f%% | %s |\n", s.Name, t.Target, t.Requests, t.RPS,
				runinfo.Latency(t.P50), runinfo.Latency(t.P99), t.Errors, closedloop.Pct(t.Denied, t.Requests), closedloop.FmtCPU(t.TargetCPU))
		}
	}
	b.WriteString("\n| scenario | throughput sidecar/no-op | p99 sidecar/no-op | paired per-round (throughput, p99) | keys over limit | verdict |\n|---|--:|--:|--:|--:|---|\n")
	for _, s := range r.Scenarios {
		fmt.Fprintf(&b, "| %s | %.3f | %.3f | %.3f, %.3f | %d of %d | %s |\n", s.Name, s.ThroughputRatio, s.P99Ratio, s.PairedThroughput, s.PairedP99,
			s.KeysDenied, s.Keys, runinfo.Verdict(s.Pass))
	}
	b.WriteString("\n## Rounds\n\n| scenario | round | target | requests | req/s | p50 | p90 | p99 | p99.9 | max | errors | over limit | CPU/req | generator CPU/req | other load |\n|---|--:|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|\n")
	for _, s := range r.Scenarios {
		for _, p := range s.Phases {
			fmt.Fprintf(&b, "| %s | %d | %s | %d | %.0f | %s | %s | %s | %s | %s | %d | %.1f%% | %s | %s | %s |\n", s.Name, p.Round, p.Target, p.Requests, p.RPS,
				runinfo.Latency(p.P50), runinfo.Latency(p.P90), runinfo.Latency(p.P99), runinfo.Latency(p.P999), runinfo.Latency(p.Max), p.Errors,
				closedloop.Pct(p.Denied, p.Requests), closedloop.FmtCPU(p.TargetCPU), closedloop.FmtCPU(p.GenCPU), closedloop.FmtLoad(p.OtherLoad))
		}
	}
	fmt.Fprintf(&b, "\nOther load is the CPU the rest of the machine used during the phase, in CPUs of the %d: on a shared machine, phases with more of it are slower for reasons outside the targets.\n", r.NProc)
	b.WriteString("\n## Scenarios\n\nEvery request is what Envoy's global rate limit filter sends for a route with two rate limits, `(remote_address)` and `(path, remote_address)`, in the domain `bench`:\n\n")
	for _, s := range scenarios {
		fmt.Fprintf(&b, "- **%s**: %s.\n", s.Name, s.Summary)
	}
	fmt.Fprintf(&b, "\nThe sidecar's rules (`RLS_CONFIG_DIR`):\n\n```yaml\n%s```\n", Rules)
	if len(r.Counters) > 0 {
		b.WriteString("\n## Sidecar counters at the end\n\n| metric | value |\n|---|--:|\n")
		for _, ct := range r.Counters {
			fmt.Fprintf(&b, "| `%s` | %.0f |\n", ct.Name, ct.Value)
		}
	}
	b.WriteString("\n## Environment\n\n")
	fmt.Fprintf(&b, "- date: %s\n- go version: `%s` (bench built with %s)\n- CPU: %s, nproc %d\n- load average at start / end: %s / %s\n",
		r.Started.UTC().Format(time.RFC3339), r.GoVersion, r.BenchGo, r.CPU, r.NProc, r.LoadStart, r.LoadEnd)
	fmt.Fprintf(&b, "- flags: -keys %d -over-keys %d -concurrency %d -conns %d -warmup %v -duration %v -rounds %d -max-requests %d -seed %d\n",
		c.Keys, c.OverKeys, c.Concurrency, c.Conns, c.Warmup, c.Duration, c.Rounds, c.MaxRequests, c.Seed)
	fmt.Fprintf(&b, "\n## Reproduce\n\n```sh\n%s\n```\n", r.Command())
	fmt.Fprintf(&b, `
## Method

- Both targets are separate processes on loopback, started by the load test: `+"`bin/sidecar`"+` with the rules above in
  RLS_CONFIG_DIR (no database) and LOG_LEVEL=warn; and `+"`bin/bench noop`"+`, a gRPC server with the sidecar's server
  options whose ShouldRateLimit answers OK with one OK status per descriptor.
- The requests are built and marshaled before measuring and sent as they are, so the generator does the same work for
  both targets; of an answer it reads only the overall code.
- Closed loop: %d workers, each sending its next request when the previous one is answered, over %d connections per
  target (round robin). Each scenario has a prologue (every key once) and a body (the keys shuffled) that repeats.
- Rounds alternate the order of the targets; each phase is a %v unmeasured warm-up (the first lasts until the prologue
  is sent), then %v measured. Throughput and p99 are the medians over rounds; p99 is exact (nearest rank).
`, c.Concurrency, c.Conns, c.Warmup, c.Duration)
	return b.String()
}
