package coreload

import (
	"context"
	"strings"
	"testing"
	"time"
)

func phase(round int, scenario, target string, rps float64, p99 time.Duration, errors int) PhaseResult {
	return PhaseResult{Round: round, Scenario: scenario, Target: target, RPS: rps, Requests: int(rps), P50: p99 / 2, P99: p99, Errors: errors}
}

func TestSummarize(t *testing.T) {
	r := &Report{Config: DefaultConfig()}
	r.Config.Rounds = 3
	r.Phases = []PhaseResult{
		phase(1, ScenarioMany, TargetCore, 5400, 10*time.Millisecond, 0),
		phase(1, ScenarioMany, TargetBaseline, 6000, 5*time.Millisecond, 0),
		phase(1, ScenarioHot, TargetCore, 1000, 20*time.Millisecond, 0),
		phase(1, ScenarioHot, TargetBaseline, 4000, 8*time.Millisecond, 0),
		phase(2, ScenarioMany, TargetBaseline, 5000, 6*time.Millisecond, 0),
		phase(2, ScenarioMany, TargetCore, 6300, 12*time.Millisecond, 0),
		phase(2, ScenarioHot, TargetBaseline, 4000, 8*time.Millisecond, 0),
		phase(2, ScenarioHot, TargetCore, 2000, 20*time.Millisecond, 0),
		phase(3, ScenarioMany, TargetCore, 3600, 11*time.Millisecond, 0),
		phase(3, ScenarioMany, TargetBaseline, 8000, 4*time.Millisecond, 0),
		phase(3, ScenarioHot, TargetCore, 1500, 20*time.Millisecond, 0),
		phase(3, ScenarioHot, TargetBaseline, 3000, 8*time.Millisecond, 0),
	}
	r.summarize()
	c, b := r.summary(ScenarioMany, TargetCore), r.summary(ScenarioMany, TargetBaseline)
	if c.RPS != 5400 || b.RPS != 6000 || c.P99 != 11*time.Millisecond || b.P99 != 5*time.Millisecond || c.Requests != 15300 {
		t.Fatalf("many: core %+v, baseline %+v", c, b)
	}
	many, hot := r.ratio(ScenarioMany), r.ratio(ScenarioHot)
	if many.Throughput != 0.9 || many.P99 != 2.2 {
		t.Fatalf("many ratios %+v", many)
	}
	// Per-round ratios: 0.9, 1.26, 0.45 → median 0.9.
	if many.PairedThr != 0.9 {
		t.Fatalf("paired %v, want 0.9", many.PairedThr)
	}
	if hot.Throughput != 1500.0/4000 {
		t.Fatalf("hot ratio %v", hot.Throughput)
	}
	if !r.Pass {
		t.Fatal("exactly the aim must pass")
	}

	// Just under the aim fails; so does any failed request.
	r.Phases[0].RPS, r.Phases[5].RPS, r.Phases[8].RPS = 2999, 2999, 2999
	r.summarize()
	if r.Pass {
		t.Fatalf("%.4f of the baseline must fail", r.ratio(ScenarioMany).Throughput)
	}
	r.Phases[0].RPS, r.Phases[5].RPS, r.Phases[8].RPS = 5000, 5000, 5000
	r.Phases[3].Errors = 1
	r.summarize()
	if r.Pass || r.Errors() != 1 {
		t.Fatalf("a failed request must fail the run (pass %v, errors %d)", r.Pass, r.Errors())
	}
	r.Phases[3].Errors = 0
	r.WarmupErrors = 2
	r.summarize()
	if r.Pass || r.Errors() != 2 {
		t.Fatal("warm-up errors must fail the run")
	}
}

func TestReportText(t *testing.T) {
	r := &Report{Config: DefaultConfig(), Started: time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)}
	r.Config.Rounds = 1
	r.Config.Args = []string{"-rounds", "1", "-out", "my report.md"}
	r.Phases = []PhaseResult{
		phase(1, ScenarioMany, TargetCore, 2000, 10*time.Millisecond, 0),
		phase(1, ScenarioMany, TargetBaseline, 5000, 5*time.Millisecond, 0),
		phase(1, ScenarioHot, TargetCore, 1000, 20*time.Millisecond, 3),
		phase(1, ScenarioHot, TargetBaseline, 2000, 8*time.Millisecond, 0),
	}
	r.Phases[2].FirstErr = "status 500"
	r.Phases[0].CoreCPU, r.Phases[0].GenCPU, r.Phases[0].PGCPU, r.Phases[0].RestCPU = 100*time.Microsecond, 50*time.Microsecond, 150*time.Microsecond, time.Millisecond
	r.Phases[1].GenCPU, r.Phases[1].PGCPU = 80*time.Microsecond, 120*time.Microsecond
	r.summarize()
	md := r.Markdown()
	for _, want := range []string{
		"**Result: FAIL** (over many conversations the core reaches 0.400 of the baseline's throughput, aim ≥ 0.90; 3 failed requests)",
		"| many conversations | core | 2000 | 2000 | 5.00ms | 10.0ms | 0 | 100µs | 50µs | 150µs | 300µs | 1000µs |",
		"| many conversations | 0.400 | 0.400 | 2.00 | 1.50 | ≥ 0.90 | FAIL |",
		"| one hot conversation | 0.500 |",
		"First error of round 1, hot, core: `status 500`",
		"./bin/bench core -rounds 1 -out 'my report.md'",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("markdown lacks %q:\n%s", want, md)
		}
	}
	var b strings.Builder
	r.WriteText(&b)
	if !strings.Contains(b.String(), "throughput core/baseline 0.400 (aim ≥ 0.90)  FAIL") || !strings.Contains(b.String(), "result: FAIL") {
		t.Errorf("text:\n%s", b.String())
	}
}

func TestPicker(t *testing.T) {
	p := &picker{convs: []string{"a", "b", "c"}}
	var got []string
	for range 7 {
		got = append(got, p.pick())
	}
	if strings.Join(got, "") != "abcabca" {
		t.Fatalf("round robin: %v", got)
	}
}

func TestCPUSplit(t *testing.T) {
	before := cpuSample{target: time.Second, self: time.Second, pg: 4 * time.Second, machine: 10 * time.Second, ok: true}
	after := cpuSample{target: 3 * time.Second, self: 2 * time.Second, pg: 6 * time.Second, machine: 18 * time.Second, ok: true}
	tg, gen, pg, rest := after.perRequest(before, 1000)
	if tg != 2*time.Millisecond || gen != time.Millisecond || pg != 2*time.Millisecond || rest != 3*time.Millisecond {
		t.Fatalf("split %v %v %v %v", tg, gen, pg, rest)
	}
	if (PhaseResult{CoreCPU: tg, GenCPU: gen, PGCPU: pg, RestCPU: rest}).StackCPU() != 5*time.Millisecond {
		t.Fatal("the stack is the core, the generator and PostgreSQL")
	}
	if tg, _, _, _ := after.perRequest(cpuSample{}, 1000); tg != 0 {
		t.Fatal("an unknown sample must give zero")
	}
	if tg, _, _, _ := after.perRequest(before, 0); tg != 0 {
		t.Fatal("no requests must give zero")
	}
}

func TestValidate(t *testing.T) {
	if err := DefaultConfig().Validate(); err != nil {
		t.Fatal(err)
	}
	c := DefaultConfig()
	c.Conversations, c.Concurrency, c.Duration, c.Rounds, c.TextBytes, c.Core = 0, 0, time.Millisecond, 0, 0, ""
	err := c.Validate()
	for _, want := range []string{"-conversations", "-concurrency", "-duration", "-rounds", "-text-bytes", "-core"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Validate: %v, want a word on %s", err, want)
		}
	}
}

func TestFindBinary(t *testing.T) {
	if _, err := FindBinary(t.TempDir(), "bin/core"); err == nil || !strings.Contains(err.Error(), "go build -o bin/core") {
		t.Fatalf("err = %v", err)
	}
}

func TestOverloadConfig(t *testing.T) {
	if err := DefaultOverloadConfig().Validate(); err != nil {
		t.Fatalf("defaults: %v", err)
	}
	c := DefaultOverloadConfig()
	c.Growth, c.Factor, c.Timeout = 1, 0, 0
	err := c.Validate()
	for _, flag := range []string{"-growth", "-factor", "-timeout"} {
		if err == nil || !strings.Contains(err.Error(), flag) {
			t.Errorf("%s not refused: %v", flag, err)
		}
	}
}

// The open loop offers its rate whatever the answers, and a step is within the bound
// only when its p99 is and nearly all of it was achieved.
func TestOpenLoop(t *testing.T) {
	ctx := t.Context()
	fast := openLoop(ctx, 200, 500*time.Millisecond, 50*time.Millisecond, func(context.Context) bool { return true })
	if !fast.Within || fast.Sent < 90 || fast.Sent > 110 || fast.Failed != 0 {
		t.Fatalf("fast target: %+v", fast)
	}
	slow := openLoop(ctx, 200, 500*time.Millisecond, 50*time.Millisecond, func(context.Context) bool {
		time.Sleep(80 * time.Millisecond)
		return true
	})
	if slow.Within || slow.P99 < 80*time.Millisecond {
		t.Fatalf("slow target: %+v", slow)
	}
	failing := openLoop(ctx, 200, 500*time.Millisecond, 50*time.Millisecond, func(context.Context) bool { return false })
	if failing.Within || failing.Failed != failing.Sent {
		t.Fatalf("failing target: %+v", failing)
	}
}

// The overload report gives the capacities over many conversations and on one, each
// beside the baseline's.
func TestOverloadMarkdown(t *testing.T) {
	cfg := DefaultOverloadConfig()
	r := &OverloadReport{Config: cfg, CoreCap: 1600, BaselineCap: 2000, HotCoreCap: 900, HotBaselineCap: 1000,
		HotCore: []step{{Rate: 900, Achieved: 899, P50: time.Millisecond, P99: 40 * time.Millisecond, Within: true}}, Recovered: -1}
	md := r.Markdown()
	for _, want := range []string{
		"| core capacity on 1000 conversations (highest rate with p99 ≤ 100ms) | 1600 req/s |",
		"| capacity core/baseline on 1000 conversations | 0.80 |",
		"| core capacity on one conversation (highest rate with p99 ≤ 100ms) | 900 req/s |",
		"| capacity core/baseline on one conversation | 0.90 |",
		"## Capacity search: core, one conversation",
		"| 900 | 899 | 1.00ms | 40.0ms | 0 | true |",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("report lacks %q:\n%s", want, md)
		}
	}
}
