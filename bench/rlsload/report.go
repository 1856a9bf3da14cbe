package rlsload

import (
	"fmt"
	"io"
	"slices"
	"strings"
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

// ScenarioResult is one scenario on a number of connections.
type ScenarioResult = closedloop.ScenarioResult

// summarize decides the run: every scenario meets the aims on one connection (on the
// fewest connections measured, without a run on one).
func (r *Report) summarize() {
	names := make([]string, len(scenarios))
	for i, s := range scenarios {
		names[i] = s.Name
	}
	r.Pass = closedloop.ScenariosPass(r.Scenarios, names)
}

// Command is the command line that reproduces the run.
func (r *Report) Command() string { return runinfo.Command("rls", r.Config.Args) }

// WriteText prints the report's tables.
func (r *Report) WriteText(w io.Writer) {
	c := r.Config
	fmt.Fprintf(w, "\nbench rls: per scenario and connection count %d rounds × (%v warm-up + %v measured) per target, concurrency %d over %s connections\n",
		c.Rounds, c.Warmup, c.Duration, c.Concurrency, c.Conns)
	fmt.Fprintf(w, "%s, %d CPUs, load %s → %s\n\n", r.CPU, r.NProc, r.LoadStart, r.LoadEnd)
	closedloop.WriteScenariosText(w, r.Scenarios, Aims, "over limit")
	fmt.Fprintf(w, "result (on %d connection): %s\n", slices.Min(c.Conns), runinfo.Verdict(r.Pass))
}

// Markdown renders the report for bench/results.
func (r *Report) Markdown() string {
	var b strings.Builder
	c := r.Config
	fmt.Fprintf(&b, "# Rate limit service load test: sidecar against a no-op server\n\n")
	fmt.Fprintf(&b, "Written by `bench rls` on %s. **Result: %s** (every scenario on %d connection: %s).\n\n",
		r.Started.UTC().Format("2006-01-02 15:04 UTC"), runinfo.Verdict(r.Pass), slices.Min(c.Conns), Aims)
	b.WriteString("## Result (medians over rounds)\n\n")
	closedloop.WriteScenariosMarkdown(&b, r.Scenarios, Aims, "over limit", r.NProc)
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
	fmt.Fprintf(&b, "- flags: -keys %d -over-keys %d -concurrency %d -conns %s -warmup %v -duration %v -rounds %d -max-requests %d -seed %d\n",
		c.Keys, c.OverKeys, c.Concurrency, c.Conns, c.Warmup, c.Duration, c.Rounds, c.MaxRequests, c.Seed)
	fmt.Fprintf(&b, "\n## Reproduce\n\n```sh\n%s\n```\n", r.Command())
	fmt.Fprintf(&b, `
## Method

- Both targets are separate processes on loopback, started by the load test: `+"`bin/sidecar`"+` with the rules above in
  RLS_CONFIG_DIR (no database) and LOG_LEVEL=warn, whose ShouldRateLimit reads and writes its messages with its own
  codec (sidecar/envoywire); and `+"`bin/bench noop`"+`, a plain grpc-go server with gRPC's standard proto codec and
  the sidecar's keepalive and message-size options, whose ShouldRateLimit answers OK with one OK status per descriptor.
- CPU per call is the CPU time (user + system) of the target's process during its measured phases divided by the
  calls answered.
- The requests are built and marshaled before measuring and sent as they are, so the generator does the same work for
  both targets; of an answer it reads only the overall code.
- Closed loop: %d workers, each sending its next request when the previous one is answered, over %s connections per
  target (round robin; each number of connections a run of its own). Each scenario has a prologue (every key once) and a body (the keys shuffled) that repeats.
- Rounds alternate the order of the targets; each phase is a %v unmeasured warm-up (the first lasts until the prologue
  is sent), then %v measured. Throughput and p99 are the medians over rounds; p99 is exact (nearest rank).
`, c.Concurrency, c.Conns, c.Warmup, c.Duration)
	return b.String()
}
