package closedloop

import (
	"math"
	"slices"
	"time"
)

// Percentile returns the p-quantile (0 ≤ p ≤ 1) of sorted latencies by the nearest-rank
// method: the smallest value that at least a share p of the values do not exceed. It is
// 0 for no values.
func Percentile(sorted []time.Duration, p float64) time.Duration {
	n := len(sorted)
	if n == 0 {
		return 0
	}
	rank := int(math.Ceil(p * float64(n)))
	return sorted[min(max(rank, 1), n)-1]
}

// Median returns the median of xs (the mean of the middle two for an even count), 0 for none.
func Median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	m := len(s) / 2
	if len(s)%2 == 1 {
		return s[m]
	}
	return (s[m-1] + s[m]) / 2
}
