package closedloop

import (
	"context"
	"flag"
	"fmt"
	"io"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/converger/edge/bench/rawcheck"
)

// -conns takes a comma-separated list that replaces the default, repeats counted once;
// anything else is refused.
func TestCountsFlag(t *testing.T) {
	l := Loop{Conns: Counts{1, 4}}
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	l.RegisterFlags(fs, true)
	if err := fs.Parse([]string{"-conns", "2, 8,2"}); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(l.Conns, Counts{2, 8}) || l.Conns.String() != "2,8" {
		t.Fatalf("-conns 2,8,2: %v", l.Conns)
	}
	for _, bad := range []string{"", "1,x", "1,,4"} {
		var c Counts
		if err := c.Set(bad); err == nil {
			t.Errorf("Set(%q) = %v, want an error", bad, c)
		}
	}
	for _, c := range []Counts{nil, {0}, {1, 257}, {1, 2, 3, 4, 5, 6, 7, 8, 9}} {
		l := Loop{Concurrency: 1, Conns: c, Duration: time.Second, Rounds: 1, MaxRequests: 1}
		if errs := l.Check(); len(errs) != 1 || !strings.Contains(errs[0].Error(), "-conns") {
			t.Errorf("-conns %v: %v, want one -conns error", c, errs)
		}
	}
}

// A sequence sends every key once, then a shuffle of the keys over and over, each
// request its key's bytes.
func TestSequence(t *testing.T) {
	s, err := NewSequence(5, 1, func(k int) ([]byte, error) { return []byte(fmt.Sprint("key", k)), nil })
	if err != nil {
		t.Fatal(err)
	}
	if s.Len() != 10 || s.Keys() != 5 || s.Prologue != 5 {
		t.Fatalf("len %d, keys %d, prologue %d", s.Len(), s.Keys(), s.Prologue)
	}
	var first, body []int
	for i := range uint64(25) {
		pos := s.Position(i)
		k := s.Key(pos)
		if got := string(s.Bytes(pos)); got != fmt.Sprint("key", k) {
			t.Fatalf("request %d: %q of key %d", i, got, k)
		}
		if i < 5 {
			first = append(first, k)
		} else if i < 10 {
			body = append(body, k)
		} else if want := body[(i-5)%5]; k != want {
			t.Fatalf("request %d: key %d, the body repeated has %d", i, k, want)
		}
	}
	if !slices.Equal(first, []int{0, 1, 2, 3, 4}) {
		t.Errorf("prologue %v", first)
	}
	if sorted := slices.Sorted(slices.Values(body)); !slices.Equal(sorted, first) {
		t.Errorf("body %v is not the keys shuffled", body)
	}
	if _, err := NewSequence(3, 1, func(k int) ([]byte, error) { return nil, fmt.Errorf("no %d", k) }); err == nil {
		t.Error("a request's error was lost")
	}
}

// The verdict of scenarios is that of every scenario on the fewest connections
// measured; results on more connections are reported, not decisive.
func TestScenariosPass(t *testing.T) {
	res := func(name string, conns int, pass bool) ScenarioResult {
		return ScenarioResult{Name: name, Conns: conns, Pass: pass}
	}
	names := []string{"hot", "keys"}
	for _, c := range []struct {
		results []ScenarioResult
		want    bool
	}{
		{[]ScenarioResult{res("hot", 1, true), res("hot", 4, false), res("keys", 1, true), res("keys", 4, false)}, true},
		{[]ScenarioResult{res("hot", 1, true), res("hot", 4, true), res("keys", 1, false), res("keys", 4, true)}, false},
		{[]ScenarioResult{res("hot", 4, true), res("keys", 4, true)}, true},
		{[]ScenarioResult{res("hot", 1, true)}, false}, // keys not measured
		{nil, false},
	} {
		if got := ScenariosPass(c.results, names); got != c.want {
			t.Errorf("%+v: %v, want %v", c.results, got, c.want)
		}
	}
}

// Aims need the throughput, p99 and CPU per request, measured, within their bounds.
func TestAims(t *testing.T) {
	a := Aims{MinThroughput: 1, MaxP99: 1, MaxCPU: 1}
	phases := func(tRPS float64, tP99, tCPU time.Duration) []PhaseResult {
		return []PhaseResult{
			{Target: "t", Round: 1, RPS: tRPS, P99: tP99, TargetCPU: tCPU},
			{Target: "b", Round: 1, RPS: 100, P99: time.Millisecond, TargetCPU: 10 * time.Microsecond},
		}
	}
	for _, c := range []struct {
		name string
		p    []PhaseResult
		want bool
	}{
		{"better", phases(120, 900*time.Microsecond, 8*time.Microsecond), true},
		{"equal", phases(100, time.Millisecond, 10*time.Microsecond), true},
		{"slower", phases(99, time.Millisecond, 10*time.Microsecond), false},
		{"later", phases(100, 1100*time.Microsecond, 10*time.Microsecond), false},
		{"costlier", phases(100, time.Millisecond, 11*time.Microsecond), false},
		{"CPU unknown", phases(100, time.Millisecond, 0), false},
	} {
		cmp := Compare(c.p, "t", "b")
		if got := a.Met(cmp); got != c.want {
			t.Errorf("%s: %v (ratios %.2f %.2f %.2f), want %v", c.name, got, cmp.ThroughputRatio, cmp.P99Ratio, cmp.CPURatio, c.want)
		}
	}
}

// A scenario measures target and baseline on the connections asked for, in rounds, and
// its report has a line per scenario and number of connections.
func TestRunGRPCScenario(t *testing.T) {
	addr, b := startNoop(t)
	w, err := NewSequence(3, 1, func(int) ([]byte, error) { return b, nil })
	if err != nil {
		t.Fatal(err)
	}
	reqs := NewGRPCRequests(rawcheck.Method, w.Len(), w.Bytes, func() Reply { return new(rawcheck.Reply) })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	loop := Loop{Concurrency: 2, Rounds: 2, Warmup: 10 * time.Millisecond, Duration: 10 * time.Second, MaxRequests: 40}
	var results []ScenarioResult
	for _, conns := range []int{1, 2} {
		res, err := RunGRPCScenario(ctx, loop, conns, "hot", "a no-op", w, w.Prologue, reqs,
			Endpoint{Name: "a", Addr: addr, Proc: self{}}, Endpoint{Name: "b", Addr: addr, Proc: self{}},
			Aims{MinThroughput: 1, MaxP99: 1, MaxCPU: 1}, t.Logf)
		if err != nil {
			t.Fatal(err)
		}
		if res.Conns != conns || len(res.Phases) != 4 || res.Target.Requests != 80 || res.Baseline.Requests != 80 || res.KeysDenied != 0 {
			t.Fatalf("%d conns: %+v", conns, res)
		}
		if res.Target.Errors+res.Baseline.Errors+res.WarmupErrors != 0 {
			t.Errorf("%d conns: errors %d %d %d", conns, res.Target.Errors, res.Baseline.Errors, res.WarmupErrors)
		}
		results = append(results, res)
	}
	var text strings.Builder
	WriteScenariosText(&text, results, Aims{}, "429")
	if n := strings.Count(text.String(), "\n"); n != 4 { // header, two results, aims
		t.Errorf("text report of %d lines:\n%s", n, text.String())
	}
	var md strings.Builder
	WriteScenariosMarkdown(&md, results, Aims{}, "429", 2)
	if !strings.Contains(md.String(), "| hot | 2 | a | 80 |") {
		t.Errorf("markdown report without the run on 2 connections:\n%s", md.String())
	}
}
