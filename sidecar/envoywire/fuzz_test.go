package envoywire

import "testing"

// FuzzCheckRequest: whatever the bytes, the codec does not panic, and answers as the
// standard path does (InvalidArgument where proto.Unmarshal fails). Seeds: testdata/fuzz
// (recorded, crafted and generated requests) and the recorded ones.
func FuzzCheckRequest(f *testing.F) {
	e := newEnv(f)
	_, msgs := e.recorded(f, "check", newCheckRequest)
	for _, m := range msgs {
		f.Add(m)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		if _, err := e.compareCheck(b); err != nil {
			t.Fatal(err)
		}
	})
}

// FuzzRateLimitRequest is FuzzCheckRequest for RateLimitRequests.
func FuzzRateLimitRequest(f *testing.F) {
	e := newEnv(f)
	_, msgs := e.recorded(f, "ratelimit", newRateLimitRequest)
	for _, m := range msgs {
		f.Add(m)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		if _, err := e.compareRateLimit(b); err != nil {
			t.Fatal(err)
		}
	})
}
