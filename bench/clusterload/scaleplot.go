package clusterload

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
)

// WritePlot draws what a node sends by cluster size: messages and kilobytes a second
// per node against N, a line per binary and number of keys (the baseline dashed), rows
// whose nodes served less than a third of their load left out.
func (r *ScaleReport) WritePlot(path string) error {
	type line struct {
		binary string
		keys   int
	}
	msgs, kb := map[line]plotter.XYs{}, map[line]plotter.XYs{}
	var lines []line
	for _, row := range r.Rows {
		if row.Nodes < 2 || row.Served < r.Config.RatePerNode/3 {
			continue
		}
		l := line{row.Binary, row.Keys}
		if _, ok := msgs[l]; !ok {
			lines = append(lines, l)
		}
		msgs[l] = append(msgs[l], plotter.XY{X: float64(row.Nodes), Y: max(row.MsgsOut, 0.1)})
		kb[l] = append(kb[l], plotter.XY{X: float64(row.Nodes), Y: max(row.BytesOut/1000, 0.01)})
	}
	if len(lines) == 0 {
		// A run stopped before its first row of two or more nodes, say: a log scale
		// has nothing to span.
		return errors.New("no row of two or more nodes that served a third of its load: nothing to plot")
	}
	slices.SortFunc(lines, func(a, b line) int {
		if a.keys != b.keys {
			return a.keys - b.keys
		}
		return strings.Compare(a.binary, b.binary)
	})
	var ticks plot.ConstantTicks
	for _, n := range r.Config.Nodes {
		if n >= 2 {
			ticks = append(ticks, plot.Tick{Value: float64(n), Label: strconv.Itoa(n)})
		}
	}
	panel := func(title, ylabel string, data map[line]plotter.XYs) (*plot.Plot, error) {
		p := plot.New()
		p.Title.Text = title
		p.X.Label.Text = "sidecars in the cluster (N)"
		p.Y.Label.Text = ylabel + " (log scale)"
		p.X.Tick.Marker = ticks
		p.Y.Scale, p.Y.Tick.Marker = plot.LogScale{}, logTicks{}
		p.Add(plotter.NewGrid())
		var ss []series
		ylo, yhi := math.Inf(1), math.Inf(-1)
		for i, l := range lines {
			xy := data[l]
			sortXY(xy)
			for _, pt := range xy {
				ylo, yhi = min(ylo, pt.Y), max(yhi, pt.Y)
			}
			s := series{label: fmt.Sprintf("%s, %d keys", l.binary, l.keys), xy: xy, color: palette[(i/2)%len(palette)],
				glyph: draw.CircleGlyph{}, width: vg.Points(1.5)}
			if l.binary == "base" {
				s.dashes = []vg.Length{vg.Points(6), vg.Points(3)}
			}
			ss = append(ss, s)
		}
		if err := addSeries(p, ss); err != nil {
			return nil, err
		}
		if ylo <= yhi {
			p.Y.Min, p.Y.Max = ylo/2, yhi*2
		}
		p.Legend.Top, p.Legend.Left = true, true
		p.Legend.XOffs, p.Legend.YOffs = vg.Points(8), vg.Points(-8)
		return p, nil
	}
	left, err := panel(fmt.Sprintf("Cluster messages sent per node (%.0f checks/s a node)", r.Config.RatePerNode), "messages/s per node", msgs)
	if err != nil {
		return err
	}
	right, err := panel("Cluster traffic sent per node, on the wire", "KB/s per node", kb)
	if err != nil {
		return err
	}
	return writePanels(path, []*plot.Plot{left, right}, 7*vg.Inch, 5*vg.Inch)
}
