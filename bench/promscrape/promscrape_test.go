package promscrape

import (
	"strings"
	"testing"
)

func TestParse(t *testing.T) {
	in := `# HELP converger_sidecar_cache_lookups_total Lookups
# TYPE converger_sidecar_cache_lookups_total counter
converger_sidecar_cache_lookups_total{cache="api_keys",result="hit"} 1234
converger_sidecar_cache_lookups_total{cache="api_keys",result="miss"} 5
go_goroutines 12
converger_rate_limit_exceeded_count{bucket="inbound"} 7e+03
converger_cluster_keys_per_flush_sum 42.5
converger_cluster_keys_per_flush_count 17
converger_cluster_keys_per_flush_bucket{le="1"} 3
broken_line_without_value
converger_rate_limit_exceeded_count{bucket="upload"} notanumber
`
	prefixes := []string{"converger_sidecar_cache_lookups_total{", "converger_rate_limit_exceeded_count{", "converger_cluster_keys_per_flush_s", "converger_cluster_keys_per_flush_c"}
	got := Parse(strings.NewReader(in), prefixes)
	want := []Sample{
		{`converger_sidecar_cache_lookups_total{cache="api_keys",result="hit"}`, 1234},
		{`converger_sidecar_cache_lookups_total{cache="api_keys",result="miss"}`, 5},
		{`converger_rate_limit_exceeded_count{bucket="inbound"}`, 7000},
		{`converger_cluster_keys_per_flush_sum`, 42.5},
		{`converger_cluster_keys_per_flush_count`, 17},
	}
	if len(got) != len(want) {
		t.Fatalf("Parse = %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("sample %d = %v, want %v", i, got[i], want[i])
		}
	}
	m := Map(got)
	if m[`converger_rate_limit_exceeded_count{bucket="inbound"}`] != 7000 || m["converger_cluster_keys_per_flush_count"] != 17 || len(m) != 5 {
		t.Errorf("Map = %v", m)
	}
}
