package closedloop

import (
	"testing"
	"time"
)

func TestPercentile(t *testing.T) {
	var lat []time.Duration
	for i := 1; i <= 100; i++ {
		lat = append(lat, time.Duration(i)*time.Millisecond)
	}
	for _, c := range []struct {
		p    float64
		want time.Duration
	}{{0, 1}, {0.01, 1}, {0.5, 50}, {0.9, 90}, {0.99, 99}, {0.995, 100}, {1, 100}} {
		if got := Percentile(lat, c.p); got != c.want*time.Millisecond {
			t.Errorf("Percentile(1..100ms, %v) = %v, want %v", c.p, got, c.want*time.Millisecond)
		}
	}
	// 1000 values: p99 is the 990th, p99.9 the 999th.
	lat = lat[:0]
	for i := 1; i <= 1000; i++ {
		lat = append(lat, time.Duration(i))
	}
	if got := Percentile(lat, 0.99); got != 990 {
		t.Errorf("p99 of 1..1000 = %v, want 990", got)
	}
	if got := Percentile(lat, 0.999); got != 999 {
		t.Errorf("p99.9 of 1..1000 = %v, want 999", got)
	}
	if got := Percentile([]time.Duration{7}, 0.99); got != 7 {
		t.Errorf("p99 of one value = %v, want 7", got)
	}
	if got := Percentile(nil, 0.5); got != 0 {
		t.Errorf("p50 of nothing = %v, want 0", got)
	}
}

func TestMedian(t *testing.T) {
	for _, c := range []struct {
		xs   []float64
		want float64
	}{{nil, 0}, {[]float64{3}, 3}, {[]float64{9, 1, 5}, 5}, {[]float64{4, 1, 3, 2}, 2.5}} {
		in := append([]float64(nil), c.xs...)
		if got := Median(c.xs); got != c.want {
			t.Errorf("Median(%v) = %v, want %v", c.xs, got, c.want)
		}
		for i := range in {
			if in[i] != c.xs[i] {
				t.Errorf("Median reordered its argument: %v", c.xs)
			}
		}
	}
}
