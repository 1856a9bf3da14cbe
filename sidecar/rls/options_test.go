package rls

import (
	"strings"
	"testing"
)

// MERGE_DOMAIN_CONFIG, as the reference's loadConfig: the second file of a domain adds
// its descriptors to the domain's top level; a top-level key and value in both is a
// duplicate, named in the file read second; without the option the second file is
// refused.
func TestMergeDomains(t *testing.T) {
	a := File{"a.yaml", []byte("domain: shop\ndescriptors:\n  - key: client\n    rate_limit: {unit: minute, requests_per_unit: 2}\n")}
	b := File{"b.yaml", []byte("domain: shop\ndescriptors:\n  - key: route\n    value: /x\n    rate_limit: {unit: hour, requests_per_unit: 5}\n")}
	dup := File{"c.yaml", []byte("domain: shop\ndescriptors:\n  - key: client\n    rate_limit: {unit: day, requests_per_unit: 9}\n")}

	if _, err := Compile([]File{a, b}, LoadOptions{}, true); err == nil || !strings.Contains(err.Error(), "b.yaml: line 1: domain: duplicate domain 'shop' in config file") {
		t.Fatalf("without merging: %v", err)
	}
	r, err := Compile([]File{a, b}, LoadOptions{MergeDomains: true}, true)
	if err != nil {
		t.Fatal(err)
	}
	if got := r.Domains(); len(got) != 1 || got[0] != "shop" {
		t.Fatalf("domains %v", got)
	}
	want := "shop.client: unit=MINUTE requests_per_unit=2, shadow_mode: false\nshop.route_/x: unit=HOUR requests_per_unit=5, shadow_mode: false\n"
	if got := r.Dump(); got != want {
		t.Errorf("Dump:\n%s\nwant\n%s", got, want)
	}
	_, err = Compile([]File{a, dup}, LoadOptions{MergeDomains: true}, false)
	if err == nil || err.Error() != "c.yaml: descriptors[0]: duplicate descriptor composite key 'shop.client'" {
		t.Errorf("a key in two files: %v", err)
	}

	tt := newTester(t, "", Options{})
	tt.svc.SetRules(r)
	for i, want := range []Code{OK, OK, OverLimit} {
		if got := tt.ask("shop", desc("client=c1")).Code; got != want {
			t.Errorf("client hit %d: %v, want %v", i+1, got, want)
		}
	}
	if st := tt.ask("shop", desc("route=/x")).Statuses[0]; st.Limit.PerUnit != 5 || st.Remaining != 4 {
		t.Errorf("the second file's rule: %+v", st)
	}
}

// QUOTA_MODE for all, as the reference: every descriptor but the unlimited ones is in
// quota mode, so the request is over only when all of them are; a descriptor that
// matched nothing is one that is not over.
func TestGlobalQuotaMode(t *testing.T) {
	const file = `domain: q
descriptors:
  - key: a
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: b
    rate_limit: {unit: minute, requests_per_unit: 2}
  - key: free
    rate_limit: {unlimited: true}
`
	tt := newTester(t, file, Options{QuotaMode: true, ResponseHeaders: true})
	if r := tt.ask("q", desc("a=1"), desc("b=1")); r.Code != OK {
		t.Fatalf("first: %v", r.Code)
	}
	r := tt.ask("q", desc("a=1"), desc("b=1"))
	if r.Code != OK || r.Statuses[0].Code != OverLimit || r.Statuses[1].Code != OK {
		t.Fatalf("a over, b not: %v %+v", r.Code, r.Statuses)
	}
	// The header describes the one with least left, a quota-mode over counting as 0 left.
	if r.Header != 0 {
		t.Errorf("header status %d, want 0", r.Header)
	}
	if r := tt.ask("q", desc("a=1"), desc("b=1")); r.Code != OverLimit {
		t.Errorf("both over: %v %+v", r.Code, r.Statuses)
	}
	if r := tt.ask("q", desc("a=1"), desc("nothing=1")); r.Code != OK {
		t.Errorf("with an unmatched descriptor: %v", r.Code)
	}
	if r := tt.ask("q", desc("a=1"), desc("free=1")); r.Code != OverLimit {
		t.Errorf("with an unlimited descriptor (not in quota mode): %v", r.Code)
	}
	off := newTester(t, file, Options{})
	off.ask("q", desc("a=1"))
	if r := off.ask("q", desc("a=1"), desc("b=1")); r.Code != OverLimit {
		t.Errorf("without QUOTA_MODE: %v", r.Code)
	}
}

// The metadata a request returns is that of the rules it passed: matched with a limit
// and not over (a rule in shadow mode passes), never an unlimited, replaced, overridden
// or over one.
func TestPassedMetadata(t *testing.T) {
	const file = `domain: m
descriptors:
  - key: a
    metadata: {tier: gold}
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: s
    shadow_mode: true
    metadata: {shadow: true}
    rate_limit: {unit: minute, requests_per_unit: 0}
  - key: u
    metadata: {free: true}
    rate_limit: {unlimited: true}
`
	tt := newTester(t, file, Options{DynamicMetadata: true})
	r := tt.ask("m", desc("a=1"), desc("s=1"), desc("u=1"), desc("a=2").override(5, Minute))
	if !r.Metadata {
		t.Fatal("Metadata not set")
	}
	if m := r.PassedMetadata(0); m.GetFields()["tier"].GetStringValue() != "gold" {
		t.Errorf("a passed: %v", m)
	}
	if m := r.PassedMetadata(1); !m.GetFields()["shadow"].GetBoolValue() {
		t.Errorf("shadow rule: %v", m)
	}
	if m := r.PassedMetadata(2); m != nil {
		t.Errorf("unlimited: %v", m)
	}
	if m := r.PassedMetadata(3); m != nil {
		t.Errorf("override: %v", m)
	}
	if m := tt.ask("m", desc("a=1")).PassedMetadata(0); m != nil {
		t.Errorf("over the limit: %v", m)
	}
}
