package clusterload

import "math"

// The model the measurements are compared with, without share mode.
//
// N nodes share a steady load of offered × L checks per window evenly: each node gets
// r = offered × L / N per window. A node learns each other node's count from that node's
// last flush, so it sees it up to one sync interval I late (plus the transit, well
// under a millisecond on loopback). The node allows while its own count plus what it
// has heard of stays within L. When the true total reaches L, the others have counted
// up to (N − 1) × r × I / W more than it has heard of, so the window allows about
//
//	L + (N − 1) × r × I / W,  that is  allowed/L ≈ 1 + (N − 1) × offered × I / (N × W)
//
// at most (every report a whole interval old), and half that overshoot on average (a
// report's age at that moment is spread evenly over the interval). No window allows more
// than was offered, nor more than N × L: each node stops at L on its own count. A burst at
// a window's start, before any flush, reaches that N × L.

// SteadyMax is the model's most allowed/L per window under a steady load.
func SteadyMax(n int, offered, syncMS, windowMS float64) float64 {
	return steady(n, offered, syncMS, windowMS)
}

// SteadyMean is the model's mean allowed/L per window under a steady load.
func SteadyMean(n int, offered, syncMS, windowMS float64) float64 {
	return steady(n, offered, syncMS/2, windowMS)
}

func steady(n int, offered, lagMS, windowMS float64) float64 {
	if n < 1 || offered <= 0 || windowMS <= 0 {
		return 0
	}
	over := 1 + float64(n-1)*offered*lagMS/(float64(n)*windowMS)
	return min(over, offered, float64(n))
}

// BurstMax is the most allowed/L of a window whose checks all arrive at its start, before
// any node has heard of another's count.
func BurstMax(n int, offered float64) float64 {
	return min(float64(n), offered)
}

// SyncMessages is the model's sync messages per second sent by a node whose changed keys
// fit in one message: one per flush to each of the N − 1 others, every flush having
// changed keys.
func SyncMessages(n int, syncMS float64) float64 {
	if n < 2 || syncMS <= 0 {
		return 0
	}
	return float64(n-1) * 1000 / syncMS
}

// ValuesPerFlush is the model's number of counters in one flush of a node that sends c
// checks per sync interval over k keys in turn (round robin): the keys changed since the
// last flush, min(k, c), and those of the last flush once more (the sidecar resends them
// so that one lost packet heals at once), so min(k, 2c) in all. Traffic follows the keys
// that change, not the checks.
func ValuesPerFlush(k int, c float64) float64 {
	if k <= 0 || c <= 0 {
		return 0
	}
	return min(float64(k), 2*max(c, 1))
}

// ShareHolds reports whether share mode's bound holds at any offered load: each node
// flushes at least twice a window, so that every node sets its claim of the next window
// from a report of the others' demand in this one: 2 × I ≤ W.
func ShareHolds(syncMS, windowMS float64) bool {
	return syncMS > 0 && 2*syncMS <= windowMS
}

// SteadyInterval is the longest sync interval, in ms, at which the steady-load model keeps
// the most allowed per window within aim × L without share mode: I ≤ (aim − 1) × N × W /
// ((N − 1) × offered). It is +Inf when no interval goes over (one node, or an offered
// load within the aim).
func SteadyInterval(n int, offered, windowMS, aim float64) float64 {
	if n < 2 || offered <= aim {
		return math.Inf(1)
	}
	return (aim - 1) * float64(n) * windowMS / (float64(n-1) * offered)
}
