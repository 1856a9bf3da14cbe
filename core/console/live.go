package console

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"

	"github.com/converger/edge/shared/limiterpb"
)

// The live view: what the sidecar is limiting now. In a cluster the sidecar the core
// asks (LIMITER_ADDR) answers for every member: its minute counts include what the
// others reported, and its counters hold every member's hits (sidecar/cluster).

const (
	defaultTop = 10
	maxTop     = 100
)

var errNoLiveView = errors.New("no sidecar is configured")

type minuteJSON struct {
	StartMS int64  `json:"start_ms"`
	Allowed uint64 `json:"allowed"`
	Denied  uint64 `json:"denied"`
}

type busyJSON struct {
	// Key is the documented key: "<bucket>:<prefix><id>". API keys and channel secrets
	// are never keys (an unverified credential is counted by its hash).
	Key         string `json:"key"`
	Count       uint64 `json:"count"`
	Limit       uint64 `json:"limit"`
	WindowMS    uint64 `json:"window_ms"`
	WindowEndMS int64  `json:"window_end_ms"`
	ResetsInMS  int64  `json:"resets_in_ms"`
	Over        bool   `json:"over"`
}

type bucketLive struct {
	Bucket string `json:"bucket"`
	// Minutes are the last hour's, oldest first; the last is the current minute.
	Minutes []minuteJSON `json:"minutes"`
	Busiest []busyJSON   `json:"busiest"`
	// The hour's totals.
	Allowed uint64 `json:"allowed"`
	Denied  uint64 `json:"denied"`
}

type memberJSON struct {
	Name         string `json:"name"`
	Address      string `json:"address"`
	Self         bool   `json:"self"`
	HeardAgoMS   int64  `json:"heard_ago_ms"`
	SyncAgeMS    int64  `json:"sync_age_ms"`
	StaleDropped uint64 `json:"stale_dropped"`
}

type clusterJSON struct {
	Backend        string       `json:"backend"`
	Node           string       `json:"node"`
	SyncIntervalMS uint64       `json:"sync_interval_ms"`
	Members        []memberJSON `json:"members"`
}

type liveView struct {
	NowMS int64 `json:"now_ms"`
	// Nodes is how many sidecars' decisions the minute counts hold.
	Nodes   uint32       `json:"nodes"`
	Buckets []bucketLive `json:"buckets"`
	Cluster clusterJSON  `json:"cluster"`
}

// live asks the sidecar for its minute counts, busiest keys and cluster, at once.
func (c *Console) live(ctx context.Context, top int) (liveView, error) {
	if c.Sidecar == nil {
		return liveView{}, errNoLiveView
	}
	ctx, cancel := context.WithTimeout(ctx, c.SidecarTimeout)
	defer cancel()
	var (
		wg                    sync.WaitGroup
		tr                    *limiterpb.TrafficResponse
		busy                  *limiterpb.BusiestResponse
		cl                    *limiterpb.ClusterResponse
		trErr, busyErr, clErr error
	)
	wg.Go(func() { tr, trErr = c.Sidecar.Traffic(ctx) })
	wg.Go(func() { busy, busyErr = c.Sidecar.Busiest(ctx, uint32(top), "") })
	wg.Go(func() { cl, clErr = c.Sidecar.Cluster(ctx) })
	wg.Wait()
	if err := errors.Join(trErr, busyErr, clErr); err != nil {
		return liveView{}, err
	}
	v := liveView{NowMS: tr.GetNowMs(), Nodes: tr.GetNodes()}
	byName := map[string]*bucketLive{}
	get := func(name string) *bucketLive {
		if b := byName[name]; b != nil {
			return b
		}
		b := &bucketLive{Bucket: name, Minutes: []minuteJSON{}, Busiest: []busyJSON{}}
		byName[name] = b
		return b
	}
	for _, bt := range tr.GetBuckets() {
		b := get(bt.GetBucket())
		for _, m := range bt.GetMinutes() {
			b.Minutes = append(b.Minutes, minuteJSON{StartMS: m.GetStartMs(), Allowed: m.GetAllowed(), Denied: m.GetDenied()})
			b.Allowed += m.GetAllowed()
			b.Denied += m.GetDenied()
		}
	}
	for _, bb := range busy.GetBuckets() {
		b := get(bb.GetBucket())
		for _, k := range bb.GetKeys() {
			b.Busiest = append(b.Busiest, busyJSON{Key: k.GetKey(), Count: k.GetCount(), Limit: k.GetLimit(), WindowMS: k.GetWindowMs(),
				WindowEndMS: k.GetWindowEndMs(), ResetsInMS: max(k.GetWindowEndMs()-busy.GetNowMs(), 0), Over: k.GetCount() > k.GetLimit()})
		}
	}
	for _, name := range slices.Sorted(maps.Keys(byName)) {
		b := byName[name]
		if len(b.Minutes) == 0 {
			b.Minutes = emptyHour(v.NowMS)
		}
		v.Buckets = append(v.Buckets, *b)
	}
	if v.Buckets == nil {
		v.Buckets = []bucketLive{}
	}
	v.Cluster = clusterJSON{Backend: cl.GetBackend(), Node: cl.GetNode(), SyncIntervalMS: cl.GetSyncIntervalMs(), Members: []memberJSON{}}
	for _, m := range cl.GetMembers() {
		v.Cluster.Members = append(v.Cluster.Members, memberJSON{Name: m.GetName(), Address: m.GetAddress(), Self: m.GetSelf(),
			HeardAgoMS: m.GetHeardAgoMs(), SyncAgeMS: m.GetSyncAgeMs(), StaleDropped: m.GetStaleDropped()})
	}
	return v, nil
}

// emptyHour is an hour of minutes without decisions, ending with the current one.
func emptyHour(nowMS int64) []minuteJSON {
	cur := nowMS / 60_000
	out := make([]minuteJSON, 60)
	for i := range out {
		out[i].StartMS = (cur - 59 + int64(i)) * 60_000
	}
	return out
}

// chart is a bucket's hour as an SVG line chart: allowed and denied per minute.
type chart struct {
	Width, Height, Left, Bottom int
	// Allowed and Denied are polyline points "x,y x,y ...".
	Allowed, Denied string
	Max             uint64
	// The current minute's counts, also data attributes of the chart.
	AllowedNow, DeniedNow uint64
}

const (
	chartWidth  = 640
	chartHeight = 140
	chartLeft   = 50 // room for the scale
	chartBottom = 20 // room for the time axis
)

func newChart(minutes []minuteJSON) chart {
	ch := chart{Width: chartWidth, Height: chartHeight, Left: chartLeft, Bottom: chartHeight - chartBottom, Max: 1}
	for _, m := range minutes {
		ch.Max = max(ch.Max, m.Allowed, m.Denied)
	}
	plot := float64(ch.Bottom - 10)
	step := float64(chartWidth-chartLeft-10) / float64(max(len(minutes)-1, 1))
	var allowed, denied strings.Builder
	for i, m := range minutes {
		x := float64(chartLeft) + float64(i)*step
		fmt.Fprintf(&allowed, "%.1f,%.1f ", x, float64(ch.Bottom)-plot*float64(m.Allowed)/float64(ch.Max))
		fmt.Fprintf(&denied, "%.1f,%.1f ", x, float64(ch.Bottom)-plot*float64(m.Denied)/float64(ch.Max))
	}
	ch.Allowed, ch.Denied = strings.TrimSpace(allowed.String()), strings.TrimSpace(denied.String())
	if n := len(minutes); n > 0 {
		ch.AllowedNow, ch.DeniedNow = minutes[n-1].Allowed, minutes[n-1].Denied
	}
	return ch
}
