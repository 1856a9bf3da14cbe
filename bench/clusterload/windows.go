package clusterload

import (
	"math"
	"time"
)

// Outcome is what became of one check.
type Outcome uint8

// The outcomes.
const (
	Pending     Outcome = iota // not answered (the run ended first)
	Allowed                    // OK
	RateLimited                // denied with 429
	Other                      // another denial, or a gRPC error
)

// Send is one check: when it was sent and answered (wall clock, Unix nanoseconds; 0: not
// answered), to which node, its outcome, and whether it went out late (the pacer fell
// behind).
type Send struct {
	AtNS, DoneNS int64
	Node         uint8
	Outcome      Outcome
	Late         bool
}

// straddleMargin: a check sent at least this long before its window's end and answered
// after it straddled the end, and the sidecar may have counted it in the next window.
const straddleMargin = 50 * time.Millisecond

// WindowOf returns the index of the fixed window of windowMS that holds the instant ms
// (Unix milliseconds), as the sidecar computes it: ms / windowMS.
func WindowOf(ms, windowMS int64) int64 {
	w := ms / windowMS
	if ms < 0 && ms%windowMS != 0 {
		w-- // floor, for instants before 1970
	}
	return w
}

// FullWindows returns the windows wholly inside the span [fromMS, toMS): from first up
// to, not including, end. A window only partly covered by the load is not counted.
func FullWindows(fromMS, toMS, windowMS int64) (first, end int64) {
	first = WindowOf(fromMS+windowMS-1, windowMS) // the first window starting at or after fromMS
	end = WindowOf(toMS, windowMS)                // windows before the one holding toMS end by toMS
	return first, max(end, first)
}

// Window is what one window got: checks sent in it, and their outcomes, in total and per
// node; when its last check was sent, from its start (for a burst, how long the burst
// took to send); how many of its checks straddled its end (see straddleMargin); and
// whether the load missed its plan in it (see MarkDisturbed).
type Window struct {
	Index                       int64
	Sent, Allowed, Limited, Err int
	Late, Straddled             int
	AllowedByNode               []int
	LastNS                      int64
	Disturbed                   bool
}

// Tally counts the sends of the windows [first, end) by send time; sends outside those
// windows are not counted. Every window of the range is in the result, in order, also
// those that got no send.
func Tally(sends []Send, windowMS, first, end int64, nodes int) []Window {
	if end <= first {
		return nil
	}
	ws := make([]Window, end-first)
	for i := range ws {
		ws[i] = Window{Index: first + int64(i), AllowedByNode: make([]int, nodes)}
	}
	for _, s := range sends {
		w := WindowOf(floorDiv(s.AtNS, 1e6), windowMS)
		if w < first || w >= end {
			continue
		}
		win := &ws[w-first]
		win.Sent++
		win.LastNS = max(win.LastNS, s.AtNS-w*windowMS*1e6)
		if s.Late {
			win.Late++
		}
		if endNS := (w + 1) * windowMS * 1e6; s.DoneNS > endNS && s.AtNS <= endNS-int64(straddleMargin) {
			win.Straddled++
		}
		switch s.Outcome {
		case Allowed:
			win.Allowed++
			if int(s.Node) < nodes {
				win.AllowedByNode[s.Node]++
			}
		case RateLimited:
			win.Limited++
		default:
			win.Err++
		}
	}
	return ws
}

func floorDiv(a, b int64) int64 {
	q := a / b
	if a < 0 && a%b != 0 {
		q--
	}
	return q
}

// MarkDisturbed marks the windows whose load missed its plan, and returns how many:
// more than 1% of their checks went out late, or they got more than 2% more or fewer
// checks than planned. On a shared machine a stall of a few hundred milliseconds (other
// processes, the kernel) holds the pacer back and then lets it catch up in a burst:
// such a window measures the stall, not the cluster. Lateness does not count in a
// burst, which is sent as fast as it goes. A window some of whose checks straddled its
// end (a stall of the sidecars: they may have counted those in the next window, which
// the tally, by send time, cannot tell) is disturbed, and so is the next one.
func MarkDisturbed(ws []Window, planned float64, burst bool) int {
	n := 0
	for i := range ws {
		w := &ws[i]
		late := !burst && float64(w.Late) > 0.01*float64(w.Sent)
		straddled := w.Straddled > 0 || i > 0 && ws[i-1].Straddled > 0
		w.Disturbed = late || straddled || math.Abs(float64(w.Sent)-planned) > 0.02*planned
		if w.Disturbed {
			n++
		}
	}
	return n
}

// Stats summarizes allowed/limit over windows.
type Stats struct {
	Windows        int
	Mean, Min, Max float64
}

// AllowedStats returns the mean, min and max of allowed/limit over the windows that are
// not disturbed.
func AllowedStats(ws []Window, limit int) Stats {
	if limit <= 0 {
		return Stats{}
	}
	s := Stats{Min: math.Inf(1), Max: math.Inf(-1)}
	sum := 0.0
	for _, w := range ws {
		if w.Disturbed {
			continue
		}
		s.Windows++
		r := float64(w.Allowed) / float64(limit)
		sum += r
		s.Min = min(s.Min, r)
		s.Max = max(s.Max, r)
	}
	if s.Windows == 0 {
		return Stats{}
	}
	s.Mean = sum / float64(s.Windows)
	return s
}

// Traffic is a node-averaged rate of the cluster's sync traffic over a period.
type Traffic struct {
	Seconds float64 // length of the period (mean over nodes)
	// Per node, per second: sync messages and their bytes (payload, without UDP/IP
	// headers and memberlist's framing) sent and received.
	MsgsSent, BytesSent, MsgsRecv, BytesRecv float64
	// Flushes is the non-empty flushes per second per node; KeysPerFlush the mean
	// number of counters in one, over all nodes.
	Flushes, KeysPerFlush float64
	// Caps is share mode's caps per second per node.
	Caps float64
	// SendErrors and Stale are totals over the nodes during the period.
	SendErrors, Stale float64
	// MergeLagMS is the mean age of received messages when merged.
	MergeLagMS float64
}

// The metrics the traffic is computed from.
const (
	mMsgsSent    = `converger_cluster_sync_messages_total{direction="sent"}`
	mMsgsRecv    = `converger_cluster_sync_messages_total{direction="received"}`
	mBytesSent   = `converger_cluster_sync_bytes_total{direction="sent"}`
	mBytesRecv   = `converger_cluster_sync_bytes_total{direction="received"}`
	mKeysSum     = `converger_cluster_keys_per_flush_sum`
	mKeysCount   = `converger_cluster_keys_per_flush_count`
	mCaps        = `converger_cluster_share_mode_caps_total`
	mSendErrors  = `converger_cluster_send_errors_total`
	mStale       = `converger_cluster_stale_values_dropped_total`
	mLagSum      = `converger_cluster_merge_lag_seconds_sum`
	mLagCount    = `converger_cluster_merge_lag_seconds_count`
	mClusterSize = `converger_cluster_members`
	mKindValues  = `converger_cluster_sent_by_kind_messages_total{kind="values"}`
	mKindView    = `converger_cluster_sent_by_kind_messages_total{kind="view"}`
	// The owner replication's and the grants' messages (owner replication: summaries back
	// from keys' owners; the rest: requests for room and their answers, counts relayed to
	// a new owner, the busiest keys for the live view).
	mKindSummary = `converger_cluster_sent_by_kind_messages_total{kind="summary"}`
	mKindAsk     = `converger_cluster_sent_by_kind_messages_total{kind="ask"}`
	mKindAnswer  = `converger_cluster_sent_by_kind_messages_total{kind="answer"}`
	mKindRelay   = `converger_cluster_sent_by_kind_messages_total{kind="relay"}`
	mKindBusy    = `converger_cluster_sent_by_kind_messages_total{kind="busy"}`
	// mKindBundle is the packets holding several of the messages above: requests for
	// room or answers, or a flush's values, summaries and relayed counts for one member.
	mKindBundle = `converger_cluster_sent_by_kind_messages_total{kind="bundle"}`
	// mKindValuesBytes is the values' payload bytes.
	mKindValuesBytes = `converger_cluster_sent_by_kind_bytes_total{kind="values"}`
	mTransferSent    = `converger_cluster_state_transfer_bytes_total{direction="sent"}`
)

// metricPrefixes select the samples scraped from each node.
var metricPrefixes = []string{
	"converger_cluster_sync_messages_total{", "converger_cluster_sync_bytes_total{",
	mKeysSum, mKeysCount, mCaps, mSendErrors, mStale, mLagSum, mLagCount, mClusterSize,
	"converger_cluster_sent_by_kind_messages_total{", mKindValuesBytes, mTransferSent,
}

// Scrape is one node's metrics at one instant.
type Scrape struct {
	AtNS    int64
	Metrics map[string]float64 // absent counters count as 0
}

// TrafficOf computes the traffic from each node's scrapes at the start and at the end of
// a period (before[i] and after[i] are node i's).
func TrafficOf(before, after []Scrape) Traffic {
	var t Traffic
	n := min(len(before), len(after))
	if n == 0 {
		return t
	}
	var keys, flushes, lag, merges float64
	for i := range n {
		b, a := before[i].Metrics, after[i].Metrics
		d := func(name string) float64 { return a[name] - b[name] }
		sec := float64(after[i].AtNS-before[i].AtNS) / 1e9
		t.Seconds += sec / float64(n)
		if sec <= 0 {
			continue
		}
		t.MsgsSent += d(mMsgsSent) / sec / float64(n)
		t.BytesSent += d(mBytesSent) / sec / float64(n)
		t.MsgsRecv += d(mMsgsRecv) / sec / float64(n)
		t.BytesRecv += d(mBytesRecv) / sec / float64(n)
		t.Caps += d(mCaps) / sec / float64(n)
		t.Flushes += d(mKeysCount) / sec / float64(n)
		t.SendErrors += d(mSendErrors)
		t.Stale += d(mStale)
		keys += d(mKeysSum)
		flushes += d(mKeysCount)
		lag += d(mLagSum)
		merges += d(mLagCount)
	}
	if flushes > 0 {
		t.KeysPerFlush = keys / flushes
	}
	if merges > 0 {
		t.MergeLagMS = lag / merges * 1000
	}
	return t
}

// Merge pools the results of several starts of one configuration: their windows (the
// stats are over all of them), each start's own stats, the sums of their counts, and the
// mean of their traffic.
func Merge(rs []Result, limit int) Result {
	if len(rs) == 0 {
		return Result{}
	}
	out := rs[0]
	out.Windows, out.Starts, out.FirstErr = nil, nil, ""
	out.Sent, out.Late, out.Errors, out.MaxLate, out.Elapsed, out.Discarded, out.Retries = 0, 0, 0, 0, 0, 0, 0
	out.Traffic = Traffic{}
	k := float64(len(rs))
	out.NodeCPU, out.OtherLoad = 0, -1
	for _, r := range rs {
		out.NodeCPU += r.NodeCPU / k
		out.OtherLoad = max(out.OtherLoad, r.OtherLoad)
		out.Windows = append(out.Windows, r.Windows...)
		out.Starts = append(out.Starts, r.Allowed)
		out.Sent += r.Sent
		out.Late += r.Late
		out.Discarded += r.Discarded
		out.Retries += r.Retries
		out.Members = min(out.Members, r.Members)
		out.Errors += r.Errors
		out.MaxLate = max(out.MaxLate, r.MaxLate)
		out.Elapsed += r.Elapsed
		if out.FirstErr == "" {
			out.FirstErr = r.FirstErr
		}
		t, m := &out.Traffic, r.Traffic
		t.Seconds += m.Seconds
		t.MsgsSent += m.MsgsSent / k
		t.BytesSent += m.BytesSent / k
		t.MsgsRecv += m.MsgsRecv / k
		t.BytesRecv += m.BytesRecv / k
		t.Flushes += m.Flushes / k
		t.KeysPerFlush += m.KeysPerFlush / k
		t.Caps += m.Caps / k
		t.SendErrors += m.SendErrors
		t.Stale += m.Stale
		t.MergeLagMS += m.MergeLagMS / k
	}
	out.Allowed = AllowedStats(out.Windows, limit)
	out.SentRate = 0
	for _, r := range rs {
		out.SentRate += r.SentRate / k
	}
	out.SpanMedian, out.SpanMax = spans(out.Windows)
	return out
}
