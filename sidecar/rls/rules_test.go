package rls

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The validation decisions of the reference (RLS.md §2.3, test/config/*.yaml of
// envoyproxy/ratelimit), its wording, and where we say more (line and key).
func TestInvalidFiles(t *testing.T) {
	for _, tc := range []struct {
		name string
		file string
		want []string // substrings of the error
	}{
		{"yaml syntax", "'''", []string{"error loading config file: yaml: found unexpected end of stream"}},
		{"unknown key", "domain: d\ndescriptors:\n  - key: k\n    ratelimit: {unit: second, requests_per_unit: 1}\n",
			[]string{"line 4", "descriptors[0].ratelimit", "config error, unknown key 'ratelimit'"}},
		{"unknown key in rate_limit", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requestsperunit: 1}\n",
			[]string{"config error, unknown key 'requestsperunit'", "descriptors[0].rate_limit.requestsperunit"}},
		{"shadow_mode inside rate_limit", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, shadow_mode: true}\n",
			[]string{"config error, unknown key 'shadow_mode'"}},
		{"non-string key", "0.25: test-domain\n", []string{"config error, key is not of type string: 0.25"}},
		{"list of non-maps", "domain: d\ndescriptors: [a, b]\n", []string{"config error, yaml file contains list of type other than map: a"}},
		{"float leaf", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1.5}\n",
			[]string{"error checking config", "1.5", "line 4"}},
		{"negative", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: -5}\n",
			[]string{"error loading config file: cannot unmarshal !!int `-5` into uint32"}},
		{"quoted number", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: \"10\"}\n",
			[]string{"cannot unmarshal !!str `10` into uint32"}},
		{"over 32 bits", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 5000000000}\n",
			[]string{"cannot unmarshal !!int `5000000000` into uint32"}},
		{"descriptors as a map", "domain: d\ndescriptors: {key: k}\n", []string{"cannot unmarshal !!map into a list"}},
		{"top level a list", "- domain: d\n", []string{"cannot unmarshal !!seq"}},
		{"no domain", "descriptors:\n", []string{"config file cannot have empty domain"}},
		{"empty file", "", []string{"config file cannot have empty domain"}},
		{"only comments", "# nothing\n", []string{"config file cannot have empty domain"}},
		{"empty key", "domain: d\ndescriptors:\n  - value: v\n", []string{"descriptor has empty key"}},
		{"duplicate key and value", "domain: test-domain\ndescriptors:\n  - {key: key1, value: value1}\n  - {key: key1, value: value1}\n",
			[]string{"duplicate descriptor composite key 'test-domain.key1_value1'", "line 4"}},
		{"duplicate bare keys with different units", "domain: d\ndescriptors:\n  - {key: k, rate_limit: {unit: second, requests_per_unit: 1}}\n  - {key: k, rate_limit: {unit: minute, requests_per_unit: 1}}\n",
			[]string{"duplicate descriptor composite key 'd.k'"}},
		{"duplicate nested", "domain: d\ndescriptors:\n  - key: a\n    descriptors:\n      - {key: b, value: c}\n      - {key: b, value: c}\n",
			[]string{"duplicate descriptor composite key 'd.a.b_c'"}},
		{"bad unit", "domain: d\ndescriptors:\n  - {key: k, rate_limit: {unit: fortnight, requests_per_unit: 1}}\n", []string{"invalid rate limit unit 'fortnight'"}},
		{"no unit", "domain: d\ndescriptors:\n  - {key: k, rate_limit: {requests_per_unit: 1}}\n", []string{"invalid rate limit unit ''"}},
		{"empty rate_limit", "domain: d\ndescriptors:\n  - {key: k, rate_limit: {}}\n", []string{"invalid rate limit unit ''"}},
		{"unit UNKNOWN", "domain: d\ndescriptors:\n  - {key: k, rate_limit: {unit: unknown}}\n", []string{"invalid rate limit unit 'unknown'"}},
		{"unlimited with unit", "domain: d\ndescriptors:\n  - {key: k, rate_limit: {unlimited: true, unit: day}}\n", []string{"should not specify rate limit unit when unlimited"}},
		{"empty replaces", "domain: d\ndescriptors:\n  - {key: k, rate_limit: {unit: day, replaces: [{name: }]}}\n", []string{"should not have an empty replaces entry"}},
		{"replaces itself", "domain: d\ndescriptors:\n  - {key: k, rate_limit: {unit: day, name: a, replaces: [{name: a}]}}\n", []string{"replaces should not contain name of same descriptor"}},
		{"share_threshold without wildcard", "domain: d\ndescriptors:\n  - {key: key1, value: value1, share_threshold: true, rate_limit: {unit: day}}\n",
			[]string{"share_threshold can only be used with wildcard values (containing '*'), but found key 'key1_value1'"}},
		{"metadata with a timestamp", "domain: d\ndescriptors:\n  - {key: k, metadata: {at: 2001-12-14}}\n", []string{"error parsing metadata"}},
		{"duplicate yaml key", "domain: a\ndomain: b\n", []string{"already set"}},
		{"two documents", "domain: a\n---\ndomain: b\n", []string{"more than one YAML document"}},
		{"not a boolean", "domain: d\ndescriptors:\n  - {key: k, shadow_mode: maybe}\n", []string{"into a boolean"}},
		// Ours.
		{"unit_multiplier 0", "domain: d\ndescriptors:\n  - {key: k, rate_limit: {unit: second, unit_multiplier: 0}}\n", []string{"unit_multiplier must be at least 1"}},
		{"window over ten years", "domain: d\ndescriptors:\n  - {key: k, rate_limit: {unit: year, unit_multiplier: 11}}\n", []string{"longer than 10 years"}},
		{"rate_limit and rate_limits", "domain: d\ndescriptors:\n  - {key: k, rate_limit: {unit: second}, rate_limits: [{unit: day}]}\n", []string{"cannot both be set"}},
		{"rate_limits empty", "domain: d\ndescriptors:\n  - {key: k, rate_limits: []}\n", []string{"from 1 to 8 limits"}},
		{"rate_limits same window", "domain: d\ndescriptors:\n  - {key: k, rate_limits: [{unit: minute}, {unit: second, unit_multiplier: 60}]}\n", []string{"two limits with a window of 1m0s"}},
		{"rate_limits unlimited", "domain: d\ndescriptors:\n  - {key: k, rate_limits: [{unlimited: true}]}\n", []string{"unlimited goes in rate_limit"}},
		{"count_denied without a limit", "domain: d\ndescriptors:\n  - {key: k, count_denied: false}\n", []string{"count_denied: false needs a limit"}},
		{"allow_refunds without a limit", "domain: d\ndescriptors:\n  - {key: k, allow_refunds: true}\n", []string{"allow_refunds needs a limit"}},
		{"too deep", "domain: d\ndescriptors:\n" + strings.Repeat("  ", 0) + deep(40), []string{"nested deeper than"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseFiles(map[string]string{"rules.yaml": tc.file})
			if err == nil {
				t.Fatalf("accepted:\n%s", tc.file)
			}
			msg := err.Error()
			if !strings.HasPrefix(msg, "rules.yaml: ") {
				t.Errorf("the error does not start with the file's name: %s", msg)
			}
			for _, w := range tc.want {
				if !strings.Contains(msg, w) {
					t.Errorf("the error does not say %q:\n%s", w, msg)
				}
			}
		})
	}
}

// deep is a chain of n nested descriptors.
func deep(n int) string {
	var b strings.Builder
	for i := range n {
		ind := strings.Repeat("    ", i)
		b.WriteString(ind + "  - key: k\n" + ind + "    descriptors:\n")
	}
	return b.String()
}

// What the reference accepts, odd as it is.
func TestAcceptedFiles(t *testing.T) {
	for _, tc := range []struct{ name, file string }{
		{"requests_per_unit left out (denies all)", "domain: d\ndescriptors:\n  - {key: k, rate_limit: {unit: second}}\n"},
		{"requests_per_unit with unlimited", "domain: d\ndescriptors:\n  - {key: k, rate_limit: {unlimited: true, requests_per_unit: 5}}\n"},
		{"unlimited with a unit that is not one", "domain: d\ndescriptors:\n  - {key: k, rate_limit: {unlimited: true, unit: fortnight}}\n"},
		{"a domain without descriptors", "domain: d\n"},
		{"descriptors null", "domain: d\ndescriptors:\n"},
		{"the same key under different parents", "domain: d\ndescriptors:\n  - {key: a, descriptors: [{key: k}]}\n  - {key: b, descriptors: [{key: k}]}\n"},
		{"a limit and children", "domain: d\ndescriptors:\n  - {key: a, rate_limit: {unit: hour}, descriptors: [{key: k, rate_limit: {unit: day}}]}\n"},
		{"rate_limit null", "domain: d\ndescriptors:\n  - {key: a, rate_limit: }\n"},
		{"units in any case", "domain: d\ndescriptors:\n  - {key: a, rate_limit: {unit: Second}}\n  - {key: b, rate_limit: {unit: WEEK}}\n"},
		{"YAML 1.1 booleans", "domain: d\ndescriptors:\n  - {key: a, shadow_mode: yes, quota_mode: on, rate_limit: {unit: day}}\n"},
		{"a number as domain", "domain: 5\n"},
		{"metadata of any shape", "domain: d\ndescriptors:\n  - {key: a, metadata: {x: [1, {y: z}], n: null}}\n"},
		{"statistics keys", "domain: d\ndescriptors:\n  - {key: a, value: 'v*', detailed_metric: true, value_to_metric: true, share_threshold: true, rate_limit: {unit: day}}\n"},
		{"anchors and merges", "domain: d\ndescriptors:\n  - &base {key: a, rate_limit: {unit: day, requests_per_unit: 5}}\n  - <<: *base\n    key: b\n"},
		{"keys that alias in the reference", "domain: d\ndescriptors:\n  - {key: a_b}\n  - {key: a, value: b}\n"},
		{"a trailing document marker", "domain: d\n---\n"},
		{"ours", "domain: d\ndescriptors:\n  - key: a\n    count_denied: false\n    allow_refunds: true\n    rate_limits:\n      - {unit: second, requests_per_unit: 10}\n      - {unit: minute, unit_multiplier: 5, requests_per_unit: 100, name: five}\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := ParseFiles(map[string]string{"rules.yaml": tc.file}); err != nil {
				t.Fatalf("refused: %v\n%s", err, tc.file)
			}
		})
	}
}

// Every problem of every file is reported, each with its file.
func TestEveryProblemIsReported(t *testing.T) {
	_, err := ParseFiles(map[string]string{
		"a.yaml": "domain: shop\ndescriptors:\n  - {key: k, ratelimit: 1}\n  - {key: j, rate_limit: {unit: fortnight}}\n",
		"b.yaml": "domain: shop\n",
		"c.yaml": "descriptors:\n",
	})
	ps, ok := err.(Problems)
	if !ok {
		t.Fatalf("%T %v", err, err)
	}
	want := []string{
		"a.yaml: line 3: descriptors[0].ratelimit: config error, unknown key 'ratelimit'",
		"a.yaml: line 4: descriptors[1].rate_limit: invalid rate limit unit 'fortnight'",
		"b.yaml: line 1: domain: duplicate domain 'shop' in config file (also in a.yaml)",
		"c.yaml: line 1: domain: config file cannot have empty domain",
	}
	if len(ps) != len(want) {
		t.Fatalf("%d problems:\n%v", len(ps), err)
	}
	for i, w := range want {
		if ps[i].Error() != w {
			t.Errorf("problem %d:\n got %s\nwant %s", i, ps[i].Error(), w)
		}
	}
}

// A directory: .yaml and .yml files at the top, dot entries and other files ignored,
// links followed, so a ConfigMap mount loads each key once.
func TestLoadDirReadsAConfigMapMount(t *testing.T) {
	dir := t.TempDir()
	data := filepath.Join(dir, "..2026_12_01_00_00_00.000000001")
	must(t, os.Mkdir(data, 0o755))
	must(t, os.WriteFile(filepath.Join(data, "shop.yaml"), []byte("domain: shop\n"), 0o644))
	must(t, os.WriteFile(filepath.Join(data, "maps.yml"), []byte("domain: maps\n"), 0o644))
	must(t, os.Symlink(filepath.Base(data), filepath.Join(dir, "..data")))
	must(t, os.Symlink("..data/shop.yaml", filepath.Join(dir, "shop.yaml")))
	must(t, os.Symlink("..data/maps.yml", filepath.Join(dir, "maps.yml")))
	must(t, os.WriteFile(filepath.Join(dir, "README"), []byte("not yaml: ["), 0o644))
	must(t, os.WriteFile(filepath.Join(dir, ".shop.yaml.swp"), []byte("\x00\x01"), 0o644))
	must(t, os.WriteFile(filepath.Join(dir, ".hidden.yaml"), []byte("domain: shop\n"), 0o644))
	must(t, os.Mkdir(filepath.Join(dir, "sub.yaml"), 0o755))
	r, err := LoadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(r.Domains(), ","); got != "maps,shop" {
		t.Errorf("domains %s", got)
	}
	if got := strings.Join(r.Files(), ","); got != "maps.yml,shop.yaml" {
		t.Errorf("files %s", got)
	}
	if _, err := LoadDir(filepath.Join(dir, "missing")); err == nil || !strings.Contains(err.Error(), "no such file") {
		t.Errorf("a missing directory: %v", err)
	}
	big := filepath.Join(t.TempDir(), "big.yaml")
	must(t, os.WriteFile(big, []byte("domain: d\n#"+strings.Repeat("x", MaxFileSize)), 0o644))
	if _, err := LoadDir(filepath.Dir(big)); err == nil || !strings.Contains(err.Error(), "big.yaml: larger than") {
		t.Errorf("an oversized file: %v", err)
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
