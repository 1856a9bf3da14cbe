package overload

import (
	"flag"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

func TestHistogramQuantile(t *testing.T) {
	h := &histogram{b: make([]atomic.Int64, int(250*time.Millisecond/histStep)+1)}
	if q := h.quantile(0.99); q != 0 {
		t.Fatalf("empty: %v", q)
	}
	for i := range 99 {
		h.add(time.Duration(i) * 10 * time.Microsecond) // below 1 ms
	}
	h.add(time.Second) // past the deadline: the last bucket
	if q := h.quantile(0.5); q > time.Millisecond {
		t.Fatalf("p50 %v, want at most 1ms", q)
	}
	if q := h.quantile(0.995); q < 250*time.Millisecond {
		t.Fatalf("p99.5 %v, want the last bucket", q)
	}
}

func TestFlagsAndCheck(t *testing.T) {
	c := DefaultConfig("x.md")
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	c.RegisterFlags(fs)
	if err := fs.Parse([]string{"-overload", "-overload-loads", "1.5, 3", "-overload-queue", "20ms"}); err != nil {
		t.Fatal(err)
	}
	if !c.Enabled || len(c.Loads) != 2 || c.Loads[1] != 3 || c.Queue != 20*time.Millisecond || len(c.Check()) != 0 {
		t.Fatalf("parsed %+v, errors %v", c, c.Check())
	}
	c.GeneratorCPU = c.SidecarCPU
	c.Queue = time.Second
	c.Loads = []float64{0}
	var msgs []string
	for _, err := range c.Check() {
		msgs = append(msgs, err.Error())
	}
	for _, want := range []string{"two different CPUs", "-overload-queue", "-overload-loads 0"} {
		if !strings.Contains(strings.Join(msgs, "\n"), want) {
			t.Errorf("no error about %q in %v", want, msgs)
		}
	}
}
