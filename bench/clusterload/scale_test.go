package clusterload

import (
	stdpng "image/png"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestScaleConfig(t *testing.T) {
	c := DefaultScaleConfig()
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	c.Quick = true
	c.ApplyQuick(map[string]bool{"keys": true})
	if len(c.Nodes) != 2 || c.Duration != 3*time.Second || len(c.Keys) != 2 {
		t.Fatalf("quick: %+v", c)
	}
	for _, bad := range []func(*ScaleConfig){
		func(c *ScaleConfig) { c.Nodes = intList{0} },
		func(c *ScaleConfig) { c.Nodes = nil },
		func(c *ScaleConfig) { c.Keys = intList{200_000} },
		func(c *ScaleConfig) { c.RatePerNode = 0 },
		func(c *ScaleConfig) { c.Duration = time.Hour },
		func(c *ScaleConfig) { c.SyncMS = 1 },
	} {
		c := DefaultScaleConfig()
		bad(&c)
		if c.Validate() == nil {
			t.Errorf("accepted %+v", c)
		}
	}
}

func TestScaleReport(t *testing.T) {
	r := &ScaleReport{Config: DefaultScaleConfig()}
	r.Config.Nodes = intList{1, 3, 20}
	r.Config.Keys = intList{20}
	for _, b := range []string{"base", "new"} {
		for _, n := range []int{1, 3, 20} {
			f := float64(n - 1)
			if b == "new" {
				f = 2
			}
			r.Rows = append(r.Rows, ScaleRow{Binary: b, Nodes: n, Keys: 20, CPU: 0.04 + 0.001*float64(n), Served: 200,
				BytesOut: 1000 * f, BytesIn: 1000 * f, MsgsOut: 10 * f, MsgsIn: 10 * f})
		}
	}
	var b strings.Builder
	r.WriteMarkdown(&b)
	out := b.String()
	png := filepath.Join(t.TempDir(), "scale.png")
	if err := r.WritePlot(png); err != nil {
		t.Fatal(err)
	}
	// A run stopped before its first measured row has no plot, and says so.
	empty := &ScaleReport{Config: r.Config, Rows: r.Rows[:1]}
	if err := empty.WritePlot(filepath.Join(t.TempDir(), "empty.png")); err == nil {
		t.Error("a report with only N = 1 plotted")
	}
	f, err := os.Open(png)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if img, err := stdpng.Decode(f); err != nil || img.Bounds().Dx() < 1000 {
		t.Fatalf("the plot: %v, %v", err, img)
	}
	for _, want := range []string{
		"![Messages and kilobytes sent per node against N](cluster-scale.png)",
		"| base | 20 | 20 | 0.060 |",
		"| base | 20 | 9.50, 9.50; 9.50, 9.50 | +0.019 |", // 19 against 2
		"| new | 20 | 1.00, 1.00; 1.00, 1.00 | +0.019 |",
		"shared with other builds",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("the report lacks %q:\n%s", want, out)
		}
	}
}

// TestEveryNodeChecksEveryKey: whatever the numbers of nodes and keys, each sender goes
// through every key, equally often.
func TestEveryNodeChecksEveryKey(t *testing.T) {
	for _, n := range []int{1, 3, 10, 20} {
		for _, keys := range []int{1, 20, 1000} {
			for s := range n {
				seen := make([]int, keys)
				for k := range 3 * keys {
					seen[keyOf(k, s, n, keys)]++
				}
				for key, c := range seen {
					if c != 3 {
						t.Fatalf("n=%d keys=%d: sender %d checked key %d %d times in %d checks, want 3", n, keys, s, key, c, 3*keys)
					}
				}
			}
		}
	}
}
