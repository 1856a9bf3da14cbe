package clusterload

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestExactAims: no under-admission at all where demand moves slowly, at most 0.02 × L
// elsewhere, never more than 1.05 × L, no errors.
func TestExactAims(t *testing.T) {
	for _, c := range []struct {
		r    ExactResult
		want bool
	}{
		{ExactResult{Slow: true, Over: 1}, true},
		{ExactResult{Slow: true, Under: 0.001, UnderMax: 0.1, Over: 1}, false},
		{ExactResult{Under: 0.02, UnderMax: 0.3, Over: 1}, true},
		{ExactResult{Under: 0.03, Over: 1}, false},
		{ExactResult{Over: 1.1}, false},
		{ExactResult{Over: 1, Errors: 1}, false},
	} {
		if got := exactMet(c.r); got != c.want {
			t.Errorf("%+v: met %v, want %v", c.r, got, c.want)
		}
	}
}

// TestExactReportSection: the report's section sits between its markers, lists the
// grants, and replaces only its own section of a file.
func TestExactReportSection(t *testing.T) {
	r := &ExactReport{Command: "bench cluster -exact", Results: []ExactResult{
		{Scenario: "split use", Binary: "baseline", Nodes: 3, Limit: 10, Slow: true, Keys: 20, Offered: 11, Under: 0.6, UnderMax: 0.6, Over: 0.5},
		{Scenario: "split use", Binary: "sidecar", Nodes: 3, Limit: 10, Slow: true, Keys: 20, Offered: 11, Exact: 20, Over: 1},
	}, Grants: []string{"3 nodes, sidecar: asked 4 (granted 4, zero 0, timed out 0, late 0)"}}
	md := r.Markdown()
	for _, want := range []string{exactBegin, exactEnd, "| split use *(slow)* | 11 | 0/20 | 0.600 (0.60) | 0.50 | 20/20 | 0.000 (0.00) | 1.00 | met |", "- 3 nodes, sidecar: asked 4"} {
		if !strings.Contains(md, want) {
			t.Errorf("the section lacks %q:\n%s", want, md)
		}
	}
	path := filepath.Join(t.TempDir(), "report.md")
	if err := os.WriteFile(path, []byte("# Figures\n\nbefore\n\n"+exactBegin+"\nold\n"+exactEnd+"\n\nafter\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := replaceSection(path, md); err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(path)
	if s := string(b); !strings.Contains(s, "before") || !strings.Contains(s, "after") || strings.Contains(s, "old") || strings.Count(s, exactBegin) != 1 {
		t.Errorf("replaced badly:\n%s", s)
	}
}

// TestQuantiles reads the request histograms summed over the nodes: each quantile as the
// bound of the first bucket that holds it.
func TestQuantiles(t *testing.T) {
	b := func(le string) string { return askRTTBuckets + `le="` + le + `"}` }
	sum := map[string]float64{
		b("0.005"): 50, b("0.01"): 80, b("0.025"): 99, b("0.05"): 99, b("+Inf"): 100,
		askLagBuckets + `le="+Inf"}`: 0, `converger_cluster_share_grants_total{role="asked",result="sent"}`: 100,
	}
	if got, want := quantiles(sum, askRTTBuckets), "p50 ≤ 5 ms, p90 ≤ 25 ms, p99 ≤ 25 ms of 100"; got != want {
		t.Errorf("got %q, want %q", got, want)
	}
	sum[b("+Inf")] = 1000
	if got, want := quantiles(sum, askRTTBuckets), "p50 > 50 ms, p90 > 50 ms, p99 > 50 ms of 1000"; got != want {
		t.Errorf("got %q, want %q", got, want)
	}
	if got := quantiles(sum, askLagBuckets); got != "" {
		t.Errorf("an empty histogram: %q", got)
	}
}
