package coreload

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/converger/edge/bench/closedloop"
	"github.com/converger/edge/bench/runinfo"
)

// Report is the outcome of a load test.
type Report struct {
	Config  Config
	Started time.Time
	runinfo.Machine
	// Source is the commit the core binary most likely came from.
	Source string
	// LoadStart and LoadEnd are /proc/loadavg at the start and the end.
	LoadStart, LoadEnd string
	Setup              struct{ Postgres, Seed time.Duration }
	// Phases are the measured phases in the order they ran.
	Phases       []PhaseResult
	WarmupErrors int
	// Summaries by scenario and target: medians over rounds.
	Summaries []Summary
	// Ratios by scenario: core over baseline.
	Ratios []Ratio
	// Rows is the number of activities at the end, HotSeq the hot conversation's last seq.
	Rows, HotSeq int64
	Pass         bool
}

// Summary is one target's figures in one scenario: medians over rounds of req/s, p50,
// p99 and CPU per request, and sums of the counts.
type Summary struct {
	Scenario, Target                          string
	RPS                                       float64
	P50, P99                                  time.Duration
	CoreCPU, GenCPU, PGCPU, StackCPU, RestCPU time.Duration
	Requests, Errors                          int
}

// Ratio compares the core with the baseline in one scenario: the ratio of the median
// throughputs and p99s, the median of the per-round throughput ratios, and the ratio of
// the median CPU per request of the stacks (StackCPU), core over baseline.
type Ratio struct {
	Scenario                             string
	Throughput, P99, PairedThr, StackCPU float64
}

// summary returns the summary of a scenario's target.
func (r *Report) summary(scenario, target string) Summary {
	for _, s := range r.Summaries {
		if s.Scenario == scenario && s.Target == target {
			return s
		}
	}
	return Summary{Scenario: scenario, Target: target}
}

// ratio returns the ratios of a scenario.
func (r *Report) ratio(scenario string) Ratio {
	for _, x := range r.Ratios {
		if x.Scenario == scenario {
			return x
		}
	}
	return Ratio{Scenario: scenario}
}

func (r *Report) summarize() {
	r.Summaries, r.Ratios = nil, nil
	for _, sc := range []string{ScenarioMany, ScenarioHot} {
		for _, tg := range []string{TargetCore, TargetBaseline} {
			s := Summary{Scenario: sc, Target: tg}
			var rps, p50, p99, ccpu, gcpu, pcpu, scpu, rcpu []float64
			for _, p := range r.Phases {
				if p.Scenario != sc || p.Target != tg {
					continue
				}
				rps = append(rps, p.RPS)
				p50 = append(p50, float64(p.P50))
				p99 = append(p99, float64(p.P99))
				ccpu = append(ccpu, float64(p.CoreCPU))
				gcpu = append(gcpu, float64(p.GenCPU))
				pcpu = append(pcpu, float64(p.PGCPU))
				scpu = append(scpu, float64(p.StackCPU()))
				rcpu = append(rcpu, float64(p.RestCPU))
				s.Requests += p.Requests
				s.Errors += p.Errors
			}
			s.RPS, s.P50, s.P99 = closedloop.Median(rps), time.Duration(closedloop.Median(p50)), time.Duration(closedloop.Median(p99))
			med := func(v []float64) time.Duration { return time.Duration(closedloop.Median(v)) }
			s.CoreCPU, s.GenCPU, s.PGCPU, s.StackCPU, s.RestCPU = med(ccpu), med(gcpu), med(pcpu), med(scpu), med(rcpu)
			r.Summaries = append(r.Summaries, s)
		}
		c, b := r.summary(sc, TargetCore), r.summary(sc, TargetBaseline)
		x := Ratio{Scenario: sc, Throughput: ratio(c.RPS, b.RPS), P99: ratio(float64(c.P99), float64(b.P99)),
			StackCPU: ratio(float64(c.StackCPU), float64(b.StackCPU))}
		var paired []float64
		for round := 1; round <= r.Config.Rounds; round++ {
			var cr, br *PhaseResult
			for i := range r.Phases {
				p := &r.Phases[i]
				if p.Round != round || p.Scenario != sc {
					continue
				}
				if p.Target == TargetCore {
					cr = p
				} else {
					br = p
				}
			}
			if cr != nil && br != nil {
				paired = append(paired, ratio(cr.RPS, br.RPS))
			}
		}
		x.PairedThr = closedloop.Median(paired)
		r.Ratios = append(r.Ratios, x)
	}
	r.Pass = r.ratio(ScenarioMany).Throughput >= MinThroughputRatio && r.Errors() == 0
}

// Errors is the number of failed requests, warm-ups included.
func (r *Report) Errors() int {
	n := r.WarmupErrors
	for _, s := range r.Summaries {
		n += s.Errors
	}
	return n
}

func ratio(a, b float64) float64 {
	if b == 0 {
		return 0
	}
	return a / b
}

// coreCPU prints the core process's CPU per request: "—" for the baseline, which does
// not use the core.
func coreCPU(target string, d time.Duration) string {
	if target == TargetBaseline {
		return "—"
	}
	return fmtCPU(d)
}

// fmtCPU prints a CPU time per request, "?" when unknown.
func fmtCPU(d time.Duration) string {
	if d <= 0 {
		return "?"
	}
	return fmt.Sprintf("%.0fµs", float64(d)/1e3)
}

// Command is the command line that reproduces the run.
func (r *Report) Command() string {
	parts := []string{"go build -o bin/core ./core/cmd/core && go build -o bin/bench ./bench/cmd/bench && ./bin/bench core"}
	for _, a := range r.Config.Args {
		parts = append(parts, runinfo.ShellQuote(a))
	}
	return strings.Join(parts, " ")
}

var scenarioText = map[string]string{
	ScenarioMany: "many conversations",
	ScenarioHot:  "one hot conversation",
}

// WriteText prints the report's tables.
func (r *Report) WriteText(w io.Writer) {
	c := r.Config
	fmt.Fprintf(w, "\nbench core: %d rounds × 2 scenarios × 2 targets × (%v warm-up + %v measured), concurrency %d, %d PostgreSQL connections per target\n",
		c.Rounds, c.Warmup, c.Duration, c.Concurrency, c.PoolSize())
	fmt.Fprintf(w, "%s, %d CPUs, load %s → %s\n\n", r.CPU, r.NProc, r.LoadStart, r.LoadEnd)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "round\tscenario\ttarget\trequests\treq/s\tp50\tp90\tp99\tmax\terrors\tcore CPU/req\tgen CPU/req\tPG CPU/req\tstack CPU/req\tother CPU/req\t")
	for _, p := range r.Phases {
		fmt.Fprintf(tw, "%d\t%s\t%s\t%d\t%.0f\t%s\t%s\t%s\t%s\t%d\t%s\t%s\t%s\t%s\t%s\t\n", p.Round, p.Scenario, p.Target, p.Requests, p.RPS,
			runinfo.Latency(p.P50), runinfo.Latency(p.P90), runinfo.Latency(p.P99), runinfo.Latency(p.Max), p.Errors, coreCPU(p.Target, p.CoreCPU), fmtCPU(p.GenCPU),
			fmtCPU(p.PGCPU), fmtCPU(p.StackCPU()), fmtCPU(p.RestCPU))
	}
	for _, s := range r.Summaries {
		fmt.Fprintf(tw, "median\t%s\t%s\t%d\t%.0f\t%s\t\t%s\t\t%d\t%s\t%s\t%s\t%s\t%s\t\n", s.Scenario, s.Target, s.Requests, s.RPS,
			runinfo.Latency(s.P50), runinfo.Latency(s.P99), s.Errors, coreCPU(s.Target, s.CoreCPU), fmtCPU(s.GenCPU), fmtCPU(s.PGCPU), fmtCPU(s.StackCPU), fmtCPU(s.RestCPU))
	}
	tw.Flush()
	fmt.Fprintln(w)
	for _, x := range r.Ratios {
		aim := "(information)"
		if x.Scenario == ScenarioMany {
			aim = fmt.Sprintf("(aim ≥ %.2f)  %s", MinThroughputRatio, runinfo.Verdict(x.Throughput >= MinThroughputRatio))
		}
		fmt.Fprintf(w, "%-21s throughput core/baseline %.3f %s; paired per round %.3f; p99 core/baseline %.2f; stack CPU/req core/baseline %.2f\n",
			scenarioText[x.Scenario]+":", x.Throughput, aim, x.PairedThr, x.P99, x.StackCPU)
	}
	fmt.Fprintf(w, "failed requests: %d (warm-ups included); %d activities stored, seq gap-free in every conversation; hot conversation at seq %d\n",
		r.Errors(), r.Rows, r.HotSeq)
	fmt.Fprintf(w, "result: %s\n", runinfo.Verdict(r.Pass))
}

// Markdown renders the report for bench/results.
func (r *Report) Markdown() string {
	var b strings.Builder
	c := r.Config
	many := r.ratio(ScenarioMany)
	fmt.Fprintf(&b, "# Core load test: activity POST through the core against pgx directly\n\n")
	fmt.Fprintf(&b, "Written by `bench core` on %s. **Result: %s** (over many conversations the core reaches %.3f of the baseline's throughput, aim ≥ %.2f; %d failed requests).\n\n",
		r.Started.UTC().Format("2006-01-02 15:04 UTC"), runinfo.Verdict(r.Pass), many.Throughput, MinThroughputRatio, r.Errors())

	b.WriteString("## Result (medians over rounds)\n\n")
	b.WriteString("| scenario | target | requests | req/s | p50 | p99 | errors | core CPU/req | generator CPU/req | PostgreSQL CPU/req | stack CPU/req | other CPU/req |\n|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|\n")
	for _, s := range r.Summaries {
		fmt.Fprintf(&b, "| %s | %s | %d | %.0f | %s | %s | %d | %s | %s | %s | %s | %s |\n", scenarioText[s.Scenario], s.Target, s.Requests, s.RPS,
			runinfo.Latency(s.P50), runinfo.Latency(s.P99), s.Errors, coreCPU(s.Target, s.CoreCPU), fmtCPU(s.GenCPU), fmtCPU(s.PGCPU), fmtCPU(s.StackCPU), fmtCPU(s.RestCPU))
	}
	b.WriteString("\n| scenario | throughput core/baseline | paired per round (median) | p99 core/baseline | stack CPU/req core/baseline | aim | verdict |\n|---|--:|--:|--:|--:|---|---|\n")
	for _, x := range r.Ratios {
		aim, verdict := "—", "information"
		if x.Scenario == ScenarioMany {
			aim, verdict = fmt.Sprintf("≥ %.2f", MinThroughputRatio), runinfo.Verdict(x.Throughput >= MinThroughputRatio)
		}
		fmt.Fprintf(&b, "| %s | %.3f | %.3f | %.2f | %.2f | %s | %s |\n", scenarioText[x.Scenario], x.Throughput, x.PairedThr, x.P99, x.StackCPU, aim, verdict)
	}
	fmt.Fprintf(&b, "\nAt the end: %d activities stored, seq gap-free (1..last_seq) in every conversation; the hot conversation reached seq %d.\n",
		r.Rows, r.HotSeq)
	b.WriteString("\nWhere the core's time goes (a perf profile under this load, taken by hand): [core-profile.md](core-profile.md).\n")

	b.WriteString("\n## Rounds\n\n| round | scenario | target | requests | req/s | p50 | p90 | p99 | max | errors | core CPU/req | generator CPU/req | PostgreSQL CPU/req | stack CPU/req | other CPU/req |\n|--:|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|\n")
	for _, p := range r.Phases {
		fmt.Fprintf(&b, "| %d | %s | %s | %d | %.0f | %s | %s | %s | %s | %d | %s | %s | %s | %s | %s |\n", p.Round, p.Scenario, p.Target, p.Requests, p.RPS,
			runinfo.Latency(p.P50), runinfo.Latency(p.P90), runinfo.Latency(p.P99), runinfo.Latency(p.Max), p.Errors, coreCPU(p.Target, p.CoreCPU), fmtCPU(p.GenCPU),
			fmtCPU(p.PGCPU), fmtCPU(p.StackCPU()), fmtCPU(p.RestCPU))
	}
	for _, p := range r.Phases {
		if p.FirstErr != "" {
			fmt.Fprintf(&b, "\nFirst error of round %d, %s, %s: `%s`\n", p.Round, p.Scenario, p.Target, p.FirstErr)
		}
	}

	b.WriteString("\n## Environment\n\n")
	fmt.Fprintf(&b, "- date: %s\n- go version: `%s` (bench built with %s)\n- CPU: %s, nproc %d\n- load average at start / end: %s / %s\n- source: %s\n",
		r.Started.UTC().Format(time.RFC3339), r.GoVersion, r.BenchGo, r.CPU, r.NProc, r.LoadStart, r.LoadEnd, r.Source)
	fmt.Fprintf(&b, "- setup: PostgreSQL started and migrated in %v, seeded in %v\n", r.Setup.Postgres.Round(time.Millisecond), r.Setup.Seed.Round(time.Millisecond))

	b.WriteString("\n## Flags\n\n| flag | value |\n|---|---|\n")
	for _, f := range [][2]string{
		{"-core", c.Core}, {"-conversations", fmt.Sprint(c.Conversations)}, {"-concurrency", fmt.Sprint(c.Concurrency)},
		{"-warmup", c.Warmup.String()},
		{"-duration", c.Duration.String()}, {"-rounds", fmt.Sprint(c.Rounds)}, {"-text-bytes", fmt.Sprint(c.TextBytes)},
		{"-out", c.Out}, {"-strict", fmt.Sprint(c.Strict)},
	} {
		fmt.Fprintf(&b, "| `%s` | `%s` |\n", f[0], f[1])
	}
	fmt.Fprintf(&b, "\n## Reproduce\n\n```sh\n%s\n```\n", r.Command())

	fmt.Fprintf(&b, `
## Method

- One throwaway PostgreSQL (shared/pgserver, temporary data directory) with the core's migrations; one
  tenant, one webhook channel (no echo replies), %d conversations for the "many" scenario and one
  more for the "hot" one, created through core/store and SQL before the run.
- **core**: a real `+"`bin/core serve`"+` process on loopback, no sidecar and no AUTHZ_ADDR, LOG_LEVEL=warn,
  with its default pool of %d PostgreSQL connections (pgxpool: max(4, CPUs); `+"`pool_max_conns`"+` cannot go in
  DATABASE_URL because `+"`core serve`"+` migrates through the same URL and PostgreSQL refuses the parameter). The generator POSTs `+"`/api/v1/conversations/:id/activities`"+`
  with the tenant's `+"`x-api-key`"+` and `+"`{\"type\":\"message\",\"text\":\"<%d bytes>\"}`"+` over keep-alive
  HTTP/1.1 connections (one per worker; pre-built requests, only the answer's status read: bench/rawhttp,
  so that the client costs little beside the core) and counts a request when it answers 201.
- **baseline**: the generator itself, through a pgx pool of as many connections (%d), runs in one transaction
  `+"`UPDATE conversations SET last_seq = last_seq + 1, updated_at = now() WHERE id = $1 AND tenant_id = $2 AND status = 'active' RETURNING last_seq`"+`
  and `+"`INSERT INTO activities (...) VALUES (...) RETURNING id`"+` with the same row (type, sender, text,
  attachments, metadata): the least any implementation of a gap-free seq must do per activity.
- Closed loop: %d workers per target, each sending its next request when the previous one is
  answered. "many": the workers take the conversations round robin (a lock is rarely contended);
  "hot": every request goes to one conversation, so the writers queue on its row lock and the
  throughput is bounded by how long each transaction holds it.
- Rounds alternate the order of the targets (round 1: core first, round 2: baseline first, …),
  scenario by scenario. Each phase is a %v unmeasured warm-up, then %v measured. Latency is measured
  per request around the call; p50/p99 are exact (all latencies sorted, nearest rank). The verdict
  compares the medians over rounds.
- CPU per request is read from /proc around each measured phase: the core process, the generator
  (getrusage), PostgreSQL (the postmaster, its backends and background processes), and the rest
  of the machine (other processes: on a shared machine, other people's work). The stack is the
  core, the generator and PostgreSQL: for the baseline, the generator is the implementation itself
  (its pgx calls); for the core, it is the HTTP client. All share the machine's CPUs, so on a
  small machine the throughput follows the stack's CPU per request and how much of the machine
  the other processes leave; the stack's CPU per request depends far less on them.
- At the end the run checks that every conversation's activities are exactly seq 1..last_seq.
`, c.Conversations, c.PoolSize(), c.TextBytes, c.PoolSize(), c.Concurrency, c.Warmup, c.Duration)
	return b.String()
}
