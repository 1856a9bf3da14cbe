package closedloop

import (
	"context"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"github.com/converger/edge/bench/runinfo"
)

// Endpoint is a server under load: the target, or the baseline it is compared with.
type Endpoint struct {
	Name, Addr string
	Proc       Process
}

// Aims are what a target must do relative to its baseline: at least MinThroughput of its
// requests per second, at most MaxP99 of its p99 and MaxCPU of its CPU per request.
type Aims struct{ MinThroughput, MaxP99, MaxCPU float64 }

func (a Aims) String() string {
	return fmt.Sprintf("throughput ≥ %.2f×, p99 ≤ %.2f×, CPU per request ≤ %.2f× the baseline's, no errors", a.MinThroughput, a.MaxP99, a.MaxCPU)
}

// Met reports whether c meets the aims.
func (a Aims) Met(c Comparison) bool {
	return c.Meets(a.MinThroughput, a.MaxP99) && c.MeetsCPU(a.MaxCPU)
}

// ScenarioResult is one scenario measured on a number of connections: its rounds and the
// target against the baseline.
type ScenarioResult struct {
	Name, Summary string
	Conns         int // gRPC connections per endpoint
	Keys          int
	Phases        []PhaseResult
	WarmupErrors  int
	Comparison
	// KeysDenied is the number of keys the target denied for their rate limit at least once.
	KeysDenied int
	Pass       bool
}

// RunGRPCScenario measures a scenario: target and baseline, each called over conns
// connections with reqs in w's order (prologue: the requests the first warm-up sends at
// least), in alternating rounds; the target is compared with the baseline against aims.
func RunGRPCScenario(ctx context.Context, l Loop, conns int, name, summary string, w Workload, prologue int, reqs *GRPCRequests,
	target, baseline Endpoint, aims Aims, logf func(string, ...any)) (ScenarioResult, error) {
	var ts []*Target
	for _, e := range []Endpoint{target, baseline} {
		c, err := DialGRPC(ctx, e.Addr, conns, l.Concurrency, reqs)
		if err != nil {
			return ScenarioResult{}, fmt.Errorf("%s: %w", e.Name, err)
		}
		t := NewTarget(e.Name, e.Addr, e.Proc, c, w.Keys())
		defer t.Close()
		ts = append(ts, t)
	}
	prefix := fmt.Sprintf("%s/%d: ", name, conns)
	logf(prefix+"%s; %d keys, %d requests", summary, w.Keys(), w.Len())
	r := NewRunner(w, l.Concurrency, l.MaxRequests)
	phases, warmupErrors, err := r.RunRounds(ctx, ts, Rounds{
		Rounds: l.Rounds, Warmup: l.Warmup, Duration: l.Duration, Prologue: prologue,
		Logf: func(format string, args ...any) { logf(prefix+format, args...) },
	})
	if err != nil {
		return ScenarioResult{}, err
	}
	res := ScenarioResult{Name: name, Summary: summary, Conns: conns, Keys: w.Keys(), Phases: phases, WarmupErrors: warmupErrors,
		Comparison: Compare(phases, target.Name, baseline.Name)}
	for _, d := range ts[0].DeniedKeys {
		if d {
			res.KeysDenied++
		}
	}
	res.Pass = aims.Met(res.Comparison) && warmupErrors == 0
	return res, nil
}

// ScenariosPass reports whether every scenario of names passed on the fewest connections
// measured.
func ScenariosPass(results []ScenarioResult, names []string) bool {
	fewest := 0
	for _, s := range results {
		if fewest == 0 || s.Conns < fewest {
			fewest = s.Conns
		}
	}
	passed := map[string]bool{}
	for _, s := range results {
		if s.Conns == fewest {
			passed[s.Name] = s.Pass
		}
	}
	for _, n := range names {
		if !passed[n] {
			return false
		}
	}
	return true
}

// WriteScenariosText prints one line per scenario and number of connections: the ratios
// and the verdict. denials names the target's rate-limit denials ("over limit", "429").
func WriteScenariosText(w io.Writer, results []ScenarioResult, aims Aims, denials string) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "scenario\tconns\treq/s\tno-op req/s\tthroughput\tp99\tno-op p99\tp99 ratio\tCPU/req\tno-op CPU/req\tCPU ratio\t"+denials+"\tkeys denied\tverdict\t")
	for _, s := range results {
		fmt.Fprintf(tw, "%s\t%d\t%.0f\t%.0f\t%.3f\t%s\t%s\t%.3f\t%s\t%s\t%.3f\t%.1f%%\t%d of %d\t%s\t\n", s.Name, s.Conns, s.Target.RPS, s.Baseline.RPS, s.ThroughputRatio,
			runinfo.Latency(s.Target.P99), runinfo.Latency(s.Baseline.P99), s.P99Ratio, FmtCPU(s.Target.TargetCPU), FmtCPU(s.Baseline.TargetCPU), s.CPURatio,
			Pct(s.Target.Denied, s.Target.Requests), s.KeysDenied, s.Keys, runinfo.Verdict(s.Pass))
	}
	tw.Flush()
	fmt.Fprintf(w, "aims: %s\n", aims)
}

// WriteScenariosMarkdown writes the scenarios' tables: medians per endpoint, the ratios
// and verdicts, and every round.
func WriteScenariosMarkdown(b *strings.Builder, results []ScenarioResult, aims Aims, denials string, nproc int) {
	b.WriteString("| scenario | connections | target | requests | req/s | p50 | p99 | errors | " + denials + " | CPU per request |\n|---|--:|---|--:|--:|--:|--:|--:|--:|--:|\n")
	for _, s := range results {
		for _, t := range []Summary{s.Target, s.Baseline} {
			fmt.Fprintf(b, "| %s | %d | %s | %d | %.0f | %s | %s | %d | %.1f%% | %s |\n", s.Name, s.Conns, t.Target, t.Requests, t.RPS,
				runinfo.Latency(t.P50), runinfo.Latency(t.P99), t.Errors, Pct(t.Denied, t.Requests), FmtCPU(t.TargetCPU))
		}
	}
	b.WriteString("\nRatios to the no-op in the same run (aims: " + aims.String() + "):\n\n")
	b.WriteString("| scenario | connections | throughput | p99 | CPU per request | paired per round (throughput, p99, CPU) | keys denied | verdict |\n|---|--:|--:|--:|--:|--:|--:|---|\n")
	for _, s := range results {
		fmt.Fprintf(b, "| %s | %d | %.3f | %.3f | %.3f | %.3f, %.3f, %.3f | %d of %d | %s |\n", s.Name, s.Conns, s.ThroughputRatio, s.P99Ratio, s.CPURatio,
			s.PairedThroughput, s.PairedP99, s.PairedCPU, s.KeysDenied, s.Keys, runinfo.Verdict(s.Pass))
	}
	b.WriteString("\n| scenario | connections | round | target | requests | req/s | p50 | p90 | p99 | p99.9 | max | errors | " + denials + " | CPU/req | generator CPU/req | other load |\n|---|--:|--:|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|\n")
	for _, s := range results {
		for _, p := range s.Phases {
			fmt.Fprintf(b, "| %s | %d | %d | %s | %d | %.0f | %s | %s | %s | %s | %s | %d | %.1f%% | %s | %s | %s |\n", s.Name, s.Conns, p.Round, p.Target, p.Requests, p.RPS,
				runinfo.Latency(p.P50), runinfo.Latency(p.P90), runinfo.Latency(p.P99), runinfo.Latency(p.P999), runinfo.Latency(p.Max), p.Errors,
				Pct(p.Denied, p.Requests), FmtCPU(p.TargetCPU), FmtCPU(p.GenCPU), FmtLoad(p.OtherLoad))
		}
	}
	fmt.Fprintf(b, "\nOther load is the CPU the rest of the machine used during the phase, in CPUs of the %d: on a shared machine, phases with more of it are slower for reasons outside the targets.\n", nproc)
	for _, s := range results {
		for _, p := range s.Phases {
			if p.FirstErr != "" {
				fmt.Fprintf(b, "\nFirst error of %s on %d connections, round %d, %s: `%s`\n", s.Name, s.Conns, p.Round, p.Target, p.FirstErr)
			}
		}
	}
}
