package closedloop

import (
	"fmt"
	"time"
)

// Summary is one target's figures over the rounds: medians of req/s, p50, p99 and CPU
// per request, and sums of the counts.
type Summary struct {
	Target                             string
	RPS                                float64
	P50, P99                           time.Duration
	TargetCPU, GenCPU                  time.Duration // per request
	Requests, Errors, Denied, Rejected int
	ByClass                            []ClassCount
}

// Summarize summarizes the phases of one target.
func Summarize(phases []PhaseResult, target string) Summary {
	s := Summary{Target: target}
	var rps, p50, p99, tcpu, gcpu []float64
	for _, p := range phases {
		if p.Target != target {
			continue
		}
		rps = append(rps, p.RPS)
		p50 = append(p50, float64(p.P50))
		p99 = append(p99, float64(p.P99))
		tcpu = append(tcpu, float64(p.TargetCPU))
		gcpu = append(gcpu, float64(p.GenCPU))
		s.Requests += p.Requests
		s.Errors += p.Errors
		s.Denied += p.Denied
		s.Rejected += p.Rejected
		if s.ByClass == nil {
			s.ByClass = make([]ClassCount, len(p.ByClass))
		}
		for c := range p.ByClass {
			s.ByClass[c].Requests += p.ByClass[c].Requests
			s.ByClass[c].Denied += p.ByClass[c].Denied
		}
	}
	s.RPS, s.P50, s.P99 = Median(rps), time.Duration(Median(p50)), time.Duration(Median(p99))
	s.TargetCPU, s.GenCPU = time.Duration(Median(tcpu)), time.Duration(Median(gcpu))
	return s
}

// Comparison is a target against a baseline, over the same rounds.
type Comparison struct {
	Target, Baseline Summary
	// ThroughputRatio and P99Ratio compare the medians; the Paired ratios are the medians
	// of the per-round ratios.
	ThroughputRatio, P99Ratio   float64
	PairedThroughput, PairedP99 float64
}

// Compare compares a target's phases with a baseline's.
func Compare(phases []PhaseResult, target, baseline string) Comparison {
	c := Comparison{Target: Summarize(phases, target), Baseline: Summarize(phases, baseline)}
	c.ThroughputRatio = Ratio(c.Target.RPS, c.Baseline.RPS)
	c.P99Ratio = Ratio(float64(c.Target.P99), float64(c.Baseline.P99))
	var thr, p99 []float64
	rounds := 0
	for _, p := range phases {
		rounds = max(rounds, p.Round)
	}
	for round := 1; round <= rounds; round++ {
		var t, b *PhaseResult
		for i := range phases {
			p := &phases[i]
			switch {
			case p.Round == round && p.Target == target:
				t = p
			case p.Round == round && p.Target == baseline:
				b = p
			}
		}
		if t != nil && b != nil {
			thr = append(thr, Ratio(t.RPS, b.RPS))
			p99 = append(p99, Ratio(float64(t.P99), float64(b.P99)))
		}
	}
	c.PairedThroughput, c.PairedP99 = Median(thr), Median(p99)
	return c
}

// Meets reports whether the target meets the aims: throughput at least minThroughput of
// the baseline's, p99 at most maxP99 of it, and no errors.
func (c Comparison) Meets(minThroughput, maxP99 float64) bool {
	return c.ThroughputRatio >= minThroughput && c.P99Ratio <= maxP99 && c.Target.Errors == 0 && c.Baseline.Errors == 0
}

// Ratio is a/b, 0 when b is 0.
func Ratio(a, b float64) float64 {
	if b == 0 {
		return 0
	}
	return a / b
}

// Pct is a as a percentage of b, 0 when b is 0.
func Pct(a, b int) float64 {
	if b == 0 {
		return 0
	}
	return 100 * float64(a) / float64(b)
}

// FmtLoad prints a load in CPUs, "?" when unknown.
func FmtLoad(l float64) string {
	if l < 0 {
		return "?"
	}
	return fmt.Sprintf("%.2f", l)
}

// FmtCPU prints a CPU time per request, "?" when unknown.
func FmtCPU(d time.Duration) string {
	if d <= 0 {
		return "?"
	}
	return fmt.Sprintf("%.1fµs", float64(d)/1e3)
}
