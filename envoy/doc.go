// Package envoy holds the Envoy bootstrap configs that front the core with the rate-limit
// sidecar (ext_authz, and the global rate limit filter with the rules of ratelimit/), and
// the test that validates every one of them against Envoy's own protos.
package envoy
