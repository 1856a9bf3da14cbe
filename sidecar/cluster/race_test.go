//go:build race

package cluster

// raceEnabled is set when the tests run under the race detector, which makes the
// simulated cluster (one goroutine, nothing to race) many times slower.
const raceEnabled = true
