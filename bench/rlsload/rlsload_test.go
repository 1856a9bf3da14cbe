package rlsload

import (
	"strings"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/proto"

	"github.com/converger/edge/sidecar/limiter"
	"github.com/converger/edge/sidecar/rls"
)

// The workloads are what the scenarios say, decided by the sidecar's own rules and
// decision code: the hot and many-keys requests within their limits, the over-limit ones
// over after each key's first request.
func TestWorkloads(t *testing.T) {
	rules, err := rls.ParseFiles(map[string]string{"bench.yaml": Rules})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name       string
		keys       int
		overInBody bool
	}{{"hot", 1, false}, {"keys", 500, false}, {"over", 300, true}} {
		w, err := BuildWorkload(tc.name, tc.keys, 1)
		if err != nil {
			t.Fatal(err)
		}
		if w.Keys() != tc.keys || w.Len() != 2*tc.keys || w.Prologue != tc.keys {
			t.Fatalf("%s: %d keys, %d requests, prologue %d", tc.name, w.Keys(), w.Len(), w.Prologue)
		}
		svc := rls.New(limiter.New(limiter.Options{}), rules, rls.Options{})
		seen := map[int]bool{}
		for i := range uint64(w.Len()) {
			pos := w.Position(i)
			var req rlsv3.RateLimitRequest
			if err := proto.Unmarshal(w.Bytes(pos), &req); err != nil {
				t.Fatal(err)
			}
			d := rls.Request{Domain: req.GetDomain()}
			for _, pd := range req.GetDescriptors() {
				var e []rls.Entry
				for _, pe := range pd.GetEntries() {
					e = append(e, rls.Entry{Key: pe.GetKey(), Value: pe.GetValue()})
				}
				d.Descriptors = append(d.Descriptors, rls.Descriptor{Entries: e})
			}
			var resp rls.Response
			if err := svc.Decide(&d, &resp); err != nil {
				t.Fatal(err)
			}
			for _, st := range resp.Statuses {
				if !st.HasLimit {
					t.Fatalf("%s: a descriptor without a limit: %v", tc.name, req.GetDescriptors())
				}
			}
			wantOver := tc.overInBody && seen[w.Key(pos)]
			if got := resp.Code == rls.OverLimit; got != wantOver {
				t.Fatalf("%s request %d (key %d): over %v, want %v", tc.name, i, w.Key(pos), got, wantOver)
			}
			seen[w.Key(pos)] = true
		}
		if len(seen) != tc.keys {
			t.Errorf("%s: %d keys sent, want %d", tc.name, len(seen), tc.keys)
		}
	}
}

func TestReplyParse(t *testing.T) {
	for code, want := range map[rlsv3.RateLimitResponse_Code][2]bool{
		rlsv3.RateLimitResponse_OK: {true, false}, rlsv3.RateLimitResponse_OVER_LIMIT: {false, true}, rlsv3.RateLimitResponse_UNKNOWN: {false, false},
	} {
		b, _ := proto.Marshal(&rlsv3.RateLimitResponse{OverallCode: code, Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{{Code: code}}})
		var r Reply
		if err := r.Parse(b); err != nil || r.Allowed() != want[0] || r.RateLimited() != want[1] {
			t.Errorf("%v: %v %v %v", code, err, r.Allowed(), r.RateLimited())
		}
	}
	var r Reply
	if err := r.Parse([]byte{0x08}); err == nil {
		t.Error("a truncated reply parsed")
	}
}

func TestConfigValidate(t *testing.T) {
	c := DefaultConfig()
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	c.Keys, c.Rounds, c.Duration = 0, 100, 10*time.Second
	err := c.Validate()
	if err == nil || !strings.Contains(err.Error(), "-keys 0") || !strings.Contains(err.Error(), "at most") {
		t.Fatalf("%v", err)
	}
}
