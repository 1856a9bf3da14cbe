package envoywire

import (
	"math/rand/v2"
	"slices"
	"testing"

	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/proto"
)

func newCheckRequest() proto.Message     { return &authv3.CheckRequest{} }
func newRateLimitRequest() proto.Message { return &rlsv3.RateLimitRequest{} }

// checkRequests returns the CheckRequests of the differential test and the fuzzers'
// seeds: the recorded ones, the crafted ones, and n generated ones, some merged.
func (e *env) checkRequests(t testing.TB, n int) (names []string, msgs [][]byte) {
	names, msgs = e.recorded(t, "check", newCheckRequest)
	crafted := craftedChecks()
	for _, name := range slices.Sorted(func(yield func(string) bool) {
		for k := range crafted {
			if !yield(k) {
				return
			}
		}
	}) {
		names, msgs = append(names, "crafted: "+name), append(msgs, crafted[name])
	}
	g := &checkGen{rng: rand.New(rand.NewPCG(1, 2)), e: e}
	for i := range n {
		b, err := proto.Marshal(g.request())
		if err != nil {
			t.Fatal(err)
		}
		if i%7 == 0 && len(msgs) > 0 { // merged with an earlier one
			b = merge(msgs[len(msgs)-1-g.rng.IntN(min(len(msgs), 20))], b)
		}
		names, msgs = append(names, "generated"), append(msgs, b)
	}
	return names, msgs
}

func (e *env) rateLimitRequests(t testing.TB, n int) (names []string, msgs [][]byte) {
	names, msgs = e.recorded(t, "ratelimit", newRateLimitRequest)
	crafted := craftedRateLimits()
	for _, name := range slices.Sorted(func(yield func(string) bool) {
		for k := range crafted {
			if !yield(k) {
				return
			}
		}
	}) {
		names, msgs = append(names, "crafted: "+name), append(msgs, crafted[name])
	}
	g := &rateLimitGen{rng: rand.New(rand.NewPCG(3, 4))}
	for i := range n {
		b, err := proto.Marshal(g.request())
		if err != nil {
			t.Fatal(err)
		}
		if i%7 == 0 && len(msgs) > 0 {
			b = merge(msgs[len(msgs)-1-g.rng.IntN(min(len(msgs), 20))], b)
		}
		names, msgs = append(names, "generated"), append(msgs, b)
	}
	return names, msgs
}

// The codec and the standard path read the same CheckRequests the same way and give the
// same answers, over recorded, crafted, generated and damaged requests: the same
// messages refused, the same method, path, source and headers read, proto.Equal
// answers (allowed, rejected credentials, 429s) from deciders fed alike.
func TestCheckAnswersAsTheStandardPath(t *testing.T) {
	e := newEnv(t)
	names, msgs := e.checkRequests(t, 3000)
	rng := rand.New(rand.NewPCG(5, 6))
	count := map[outcome]int{}
	for i, b := range msgs {
		for round := range 2 {
			in := b
			if round == 1 {
				in = mutate(rng, b)
			}
			o, err := e.compareCheck(in)
			if err != nil {
				t.Fatalf("%s (request %d, damaged %v): %v\n%x", names[i], i, round == 1, err, in)
			}
			count[o]++
		}
	}
	nAllowed, nDenied, nRefused := count[allowed], count[denied], count[refused]
	t.Logf("%d requests and as many damaged: %d refused by both, %d allowed, %d denied", len(msgs), nRefused, nAllowed, nDenied)
	if nAllowed < 100 || nDenied < 100 || nRefused < 100 {
		t.Fatalf("the corpus does not cover allowed, denied and refused requests: %d, %d, %d", nAllowed, nDenied, nRefused)
	}
}

// The same for RateLimitRequests: the same messages refused, the same errors, the same
// answers.
func TestRateLimitAnswersAsTheStandardPath(t *testing.T) {
	e := newEnv(t)
	names, msgs := e.rateLimitRequests(t, 3000)
	rng := rand.New(rand.NewPCG(7, 8))
	count := map[outcome]int{}
	for i, b := range msgs {
		for round := range 2 {
			in := b
			if round == 1 {
				in = mutate(rng, b)
			}
			o, err := e.compareRateLimit(in)
			if err != nil {
				t.Fatalf("%s (request %d, damaged %v): %v\n%x", names[i], i, round == 1, err, in)
			}
			count[o]++
		}
	}
	t.Logf("%d requests and as many damaged: %d refused by both, %d errors, %d OK, %d over the limit", len(msgs), count[refused], count[failed], count[allowed], count[denied])
	for _, o := range []outcome{refused, failed, allowed, denied} {
		if count[o] < 100 {
			t.Fatalf("the corpus does not cover every outcome: %v", count)
		}
	}
}
