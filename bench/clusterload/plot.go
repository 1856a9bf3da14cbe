package clusterload

import (
	"fmt"
	"image/color"
	"math"
	"os"
	"slices"
	"strconv"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
)

// palette colors the cluster sizes, in the order of -n.
var palette = []color.RGBA{
	{R: 0x1f, G: 0x77, B: 0xb4, A: 0xff}, // blue
	{R: 0xd6, G: 0x27, B: 0x28, A: 0xff}, // red
	{R: 0x2c, G: 0xa0, B: 0x2c, A: 0xff}, // green
	{R: 0xff, G: 0x7f, B: 0x0e, A: 0xff}, // orange
	{R: 0x94, G: 0x67, B: 0xbd, A: 0xff}, // purple
	{R: 0x8c, G: 0x56, B: 0x4b, A: 0xff}, // brown
	{R: 0x17, G: 0xbe, B: 0xcf, A: 0xff}, // cyan
	{R: 0x7f, G: 0x7f, B: 0x7f, A: 0xff}, // grey
	{R: 0xbc, G: 0xbd, B: 0x22, A: 0xff}, // olive
}

// series is one line of a panel: x is the sync interval in ms.
type series struct {
	label  string
	xy     plotter.XYs
	color  color.Color
	dashes []vg.Length
	glyph  draw.GlyphDrawer // nil: no points
	width  vg.Length
}

// plotSeries returns, for each cluster size and mode of the grid, its measured max A/L and
// bytes/s per node by sync interval, and the model's max A/L.
func (r *Report) plotSeries() (overshoot, traffic []series) {
	sizes := r.nodeSizes()
	for i, n := range sizes {
		col := palette[i%len(palette)]
		for _, share := range r.Config.Modes {
			var over, bytes, model plotter.XYs
			for _, g := range r.Grid {
				if g.Nodes != n || g.Share != share || g.Allowed.Windows == 0 {
					continue
				}
				over = append(over, plotter.XY{X: float64(g.SyncMS), Y: g.Allowed.Max})
				model = append(model, plotter.XY{X: float64(g.SyncMS), Y: g.TheoryMax})
				if g.Traffic.BytesSent > 0 {
					bytes = append(bytes, plotter.XY{X: float64(g.SyncMS), Y: g.Traffic.BytesSent})
				}
			}
			sortXY(over)
			sortXY(bytes)
			sortXY(model)
			dashes, glyph := []vg.Length(nil), draw.GlyphDrawer(draw.CircleGlyph{})
			if share {
				dashes, glyph = []vg.Length{vg.Points(6), vg.Points(3)}, draw.TriangleGlyph{}
			}
			label := fmt.Sprintf("N=%d, share mode %s", n, modeName(share))
			overshoot = append(overshoot, series{label: label, xy: over, color: col, dashes: dashes, glyph: glyph, width: vg.Points(1.6)})
			if len(bytes) > 0 {
				traffic = append(traffic, series{label: label, xy: bytes, color: col, dashes: dashes, glyph: glyph, width: vg.Points(1.6)})
			}
			if !share && n > 1 {
				overshoot = append(overshoot, series{label: fmt.Sprintf("N=%d, model without share mode", n), xy: model, color: col,
					dashes: []vg.Length{vg.Points(1.5), vg.Points(2.5)}, width: vg.Points(1.2)})
			}
		}
	}
	return overshoot, traffic
}

func sortXY(xy plotter.XYs) {
	slices.SortFunc(xy, func(a, b plotter.XY) int {
		switch {
		case a.X < b.X:
			return -1
		case a.X > b.X:
			return 1
		}
		return 0
	})
}

// intervalTicks labels the sync intervals of the grid on a log axis.
func (r *Report) intervalTicks() plot.ConstantTicks {
	var ticks plot.ConstantTicks
	iv := slices.Clone(r.Config.Intervals)
	slices.Sort(iv)
	for _, ms := range slices.Compact(iv) {
		ticks = append(ticks, plot.Tick{Value: float64(ms), Label: strconv.Itoa(ms)})
	}
	return ticks
}

// linearTicks labels a linear axis every 0.05, 0.1, 0.2 or 0.5, whichever gives at most
// about a dozen labels.
type linearTicks struct{}

func (linearTicks) Ticks(lo, hi float64) []plot.Tick {
	step := 0.05
	for _, s := range []float64{0.05, 0.1, 0.2, 0.5, 1, 2, 5} {
		step = s
		if (hi-lo)/s <= 12 {
			break
		}
	}
	var ticks []plot.Tick
	for v := math.Ceil(lo/step) * step; v <= hi+1e-9; v += step {
		ticks = append(ticks, plot.Tick{Value: v, Label: strconv.FormatFloat(math.Round(v*100)/100, 'f', -1, 64)})
	}
	return ticks
}

// ratioTicks labels a log axis of ratios near 1: 0.95, 1, 1.05, 1.1, 1.2, 1.5, 2, 3, 5.
type ratioTicks struct{}

func (ratioTicks) Ticks(lo, hi float64) []plot.Tick {
	var ticks []plot.Tick
	for _, v := range []float64{0.95, 1, 1.05, 1.1, 1.2, 1.5, 2, 3, 5, 10} {
		if v >= lo && v <= hi {
			ticks = append(ticks, plot.Tick{Value: v, Label: strconv.FormatFloat(v, 'f', -1, 64)})
		}
	}
	return ticks
}

// logTicks labels a log axis at 1, 2 and 5 times the powers of ten.
type logTicks struct{}

func (logTicks) Ticks(lo, hi float64) []plot.Tick {
	var ticks []plot.Tick
	if lo <= 0 || hi <= lo {
		return nil
	}
	for p := math.Floor(math.Log10(lo)); p <= math.Ceil(math.Log10(hi)); p++ {
		for _, m := range []float64{1, 2, 5} {
			v := m * math.Pow(10, p)
			if v < lo || v > hi {
				continue
			}
			label := strconv.FormatFloat(v, 'f', -1, 64)
			if v >= 1000 {
				label = strconv.FormatFloat(v/1000, 'f', -1, 64) + "k"
			}
			ticks = append(ticks, plot.Tick{Value: v, Label: label})
		}
	}
	return ticks
}

func addSeries(p *plot.Plot, ss []series) error {
	for _, s := range ss {
		if len(s.xy) == 0 {
			continue
		}
		l, err := plotter.NewLine(s.xy)
		if err != nil {
			return err
		}
		l.Color, l.Dashes, l.Width = s.color, s.dashes, s.width
		p.Add(l)
		if s.glyph != nil {
			pts, err := plotter.NewScatter(s.xy)
			if err != nil {
				return err
			}
			pts.Color, pts.Shape, pts.Radius = s.color, s.glyph, vg.Points(3)
			p.Add(pts)
			p.Legend.Add(s.label, l, pts)
		} else {
			p.Legend.Add(s.label, l)
		}
	}
	return nil
}

// loadSeries returns, for each mode of the share-mode scenario, its measured max A/L by
// load (x: the load's place, 1, 2, ...), the model's without share mode, and the ticks
// naming the loads.
func (r *Report) loadSeries() (ss []series, ticks plot.ConstantTicks) {
	var names []string
	place := map[string]float64{}
	for _, l := range r.Loads {
		if _, ok := place[loadName(l)]; !ok {
			names = append(names, loadName(l))
			place[loadName(l)] = float64(len(names))
		}
	}
	for i, n := range names {
		ticks = append(ticks, plot.Tick{Value: float64(i + 1), Label: n})
	}
	sizes := r.nodeSizes()
	col := palette[0]
	if i := slices.Index(sizes, AimNodes); i >= 0 {
		col = palette[i%len(palette)] // the grid's color for the same cluster size
	} else if len(sizes) < len(palette) {
		col = palette[len(sizes)]
	}
	for _, share := range r.Config.Modes {
		var meas, model plotter.XYs
		for _, l := range r.Loads {
			if l.Share != share || l.Allowed.Windows == 0 {
				continue
			}
			x := place[loadName(l)]
			meas = append(meas, plotter.XY{X: x, Y: l.Allowed.Max})
			model = append(model, plotter.XY{X: x, Y: l.TheoryMax})
		}
		dashes, glyph := []vg.Length(nil), draw.GlyphDrawer(draw.CircleGlyph{})
		if share {
			dashes, glyph = []vg.Length{vg.Points(6), vg.Points(3)}, draw.TriangleGlyph{}
		}
		ss = append(ss, series{label: fmt.Sprintf("N=%d, share mode %s", AimNodes, modeName(share)), xy: meas, color: col, dashes: dashes, glyph: glyph, width: vg.Points(1.6)})
		if !share {
			ss = append(ss, series{label: fmt.Sprintf("N=%d, model without share mode", AimNodes), xy: model, color: col,
				dashes: []vg.Length{vg.Points(1.5), vg.Points(2.5)}, width: vg.Points(1.2)})
		}
	}
	return ss, ticks
}

// loadPanel draws the most allowed per window against the offered load.
func (r *Report) loadPanel() (*plot.Plot, error) {
	ss, ticks := r.loadSeries()
	p := plot.New()
	p.Title.Text = fmt.Sprintf("Most allowed per window against the load (%d nodes, sync %d ms, %d starts × %d windows)", AimNodes, AimSyncMS, r.Config.Repeat, r.Config.Windows)
	p.X.Label.Text = "offered per window, × L (burst: sent at each window's start)"
	p.Y.Label.Text = "max allowed / L (log scale)"
	p.X.Tick.Marker = ticks
	xmin, xmax := 0.5, float64(len(ticks))+0.5
	p.X.Min, p.X.Max = xmin, xmax
	p.Add(plotter.NewGrid())
	ymax := AimMaxAllowed
	for _, s := range ss {
		for _, pt := range s.xy {
			ymax = max(ymax, pt.Y)
		}
	}
	p.Y.Min, p.Y.Max = 0.95, ymax*1.05
	p.Y.Scale, p.Y.Tick.Marker = plot.LogScale{}, ratioTicks{}
	for _, y := range []struct {
		v      float64
		c      color.Color
		dashes []vg.Length
	}{{1, color.Black, nil}, {AimMaxAllowed, color.Gray{Y: 0x60}, []vg.Length{vg.Points(8), vg.Points(4)}}} {
		l, err := plotter.NewLine(plotter.XYs{{X: xmin, Y: y.v}, {X: xmax, Y: y.v}})
		if err != nil {
			return nil, err
		}
		l.Color, l.Width, l.Dashes = y.c, vg.Points(0.8), y.dashes
		p.Add(l)
		if y.dashes != nil {
			p.Legend.Add(fmt.Sprintf("aim with share mode: %.2f× L", AimMaxAllowed), l)
		}
	}
	if err := addSeries(p, ss); err != nil {
		return nil, err
	}
	p.Legend.Top, p.Legend.Left = true, true
	p.Legend.XOffs, p.Legend.YOffs = vg.Points(8), vg.Points(-8)
	p.Legend.ThumbnailWidth = vg.Points(28)
	return p, nil
}

// WritePlot draws the operator's picture to a PNG file: the most allowed per window
// against the offered load in the share-mode scenario (left, when run), against the
// sync interval with the model's line (middle), and the sync traffic per node (right).
func (r *Report) WritePlot(path string) error {
	overshoot, traffic := r.plotSeries()
	c := r.Config
	xmin, xmax := math.Inf(1), math.Inf(-1)
	for _, ms := range c.Intervals {
		xmin, xmax = min(xmin, float64(ms)), max(xmax, float64(ms))
	}
	if xmin == xmax {
		xmin, xmax = xmin/2, xmax*2
	}
	xmin, xmax = xmin/1.15, xmax*1.15

	left := plot.New()
	left.Title.Text = fmt.Sprintf("Most allowed per window (max over %d starts × %d windows), %.3g× L offered evenly", c.Repeat, c.Windows, c.Offered)
	left.X.Label.Text = "RATE_LIMIT_SYNC_INTERVAL_MS (log scale)"
	left.Y.Label.Text = "max allowed / L"
	left.X.Scale, left.X.Tick.Marker = plot.LogScale{}, r.intervalTicks()
	left.X.Min, left.X.Max = xmin, xmax
	left.Add(plotter.NewGrid())
	ymin, ymax := 0.85, AimMaxAllowed+0.05
	for _, s := range overshoot {
		for _, p := range s.xy {
			ymin, ymax = min(ymin, p.Y-0.05), max(ymax, p.Y)
		}
	}
	left.Y.Min, left.Y.Max = ymin, ymax*1.05
	left.Y.Tick.Marker = linearTicks{}
	limitLine, err := plotter.NewLine(plotter.XYs{{X: xmin, Y: 1}, {X: xmax, Y: 1}})
	if err != nil {
		return err
	}
	limitLine.Color, limitLine.Width = color.Black, vg.Points(0.8)
	left.Add(limitLine)
	aim, err := plotter.NewLine(plotter.XYs{{X: xmin, Y: AimMaxAllowed}, {X: xmax, Y: AimMaxAllowed}})
	if err != nil {
		return err
	}
	aim.Color, aim.Width, aim.Dashes = color.Gray{Y: 0x60}, vg.Points(1), []vg.Length{vg.Points(8), vg.Points(4)}
	left.Add(aim)
	if err := addSeries(left, overshoot); err != nil {
		return err
	}
	left.Legend.Add(fmt.Sprintf("aim with share mode: %.2f× L", AimMaxAllowed), aim)
	left.Legend.Top, left.Legend.Left = true, true
	left.Legend.XOffs, left.Legend.YOffs = vg.Points(8), vg.Points(-8)
	left.Legend.ThumbnailWidth = vg.Points(28)

	right := plot.New()
	right.Title.Text = "Sync traffic sent per node (one key; payload bytes)"
	right.X.Label.Text = "RATE_LIMIT_SYNC_INTERVAL_MS (log scale)"
	right.Y.Label.Text = "bytes/s per node (log scale)"
	right.X.Scale, right.X.Tick.Marker = plot.LogScale{}, r.intervalTicks()
	right.X.Min, right.X.Max = xmin, xmax
	right.Y.Scale, right.Y.Tick.Marker = plot.LogScale{}, logTicks{}
	right.Add(plotter.NewGrid())
	if len(traffic) > 0 {
		if err := addSeries(right, traffic); err != nil {
			return err
		}
		ylo, yhi := math.Inf(1), math.Inf(-1)
		for _, s := range traffic {
			for _, p := range s.xy {
				ylo, yhi = min(ylo, p.Y), max(yhi, p.Y)
			}
		}
		right.Y.Min, right.Y.Max = ylo/2, yhi*2
	} else {
		right.Y.Min, right.Y.Max = 1, 10
	}
	right.Legend.Top, right.Legend.Left = false, true
	right.Legend.XOffs, right.Legend.YOffs = vg.Points(8), vg.Points(8)
	right.Legend.ThumbnailWidth = vg.Points(28)

	panels := []*plot.Plot{left, right}
	if len(r.Loads) > 0 {
		loads, err := r.loadPanel()
		if err != nil {
			return err
		}
		panels = append([]*plot.Plot{loads}, panels...)
	}
	return writePanels(path, panels, 7.5*vg.Inch, 6*vg.Inch)
}

// writePanels draws the panels side by side, each w wide and h high, into a PNG at path.
func writePanels(path string, panels []*plot.Plot, w, h vg.Length) error {
	img := vgimg.NewWith(vgimg.UseWH(vg.Length(len(panels))*w, h), vgimg.UseDPI(100))
	tiles := draw.Tiles{Rows: 1, Cols: len(panels), PadX: vg.Points(20), PadY: vg.Points(10), PadTop: vg.Points(6), PadBottom: vg.Points(6), PadLeft: vg.Points(6), PadRight: vg.Points(12)}
	canvases := plot.Align([][]*plot.Plot{panels}, tiles, draw.New(img))
	for i, p := range panels {
		p.Draw(canvases[0][i])
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := (vgimg.PngCanvas{Canvas: img}).WriteTo(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
