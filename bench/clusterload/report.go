package clusterload

import (
	"fmt"
	"io"
	"math"
	"path/filepath"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/converger/edge/bench/runinfo"
)

// Command is the command line that reproduces the run.
func (r *Report) Command() string { return runinfo.Command("cluster", r.Config.Args) }

// aimLines are the two share-mode aims with their figures and verdicts.
func (r *Report) aimLines() [2][3]string {
	s := r.Single.Allowed
	worst, ok := r.worstLoad()
	measured := "not measured"
	if ok {
		measured = fmt.Sprintf("max %.3f× L (%s; mean %.3f, min %.3f there) over %d windows of %d loads", worst.Allowed.Max, loadName(worst), worst.Allowed.Mean, worst.Allowed.Min, r.loadWindows(), r.shareLoads())
	}
	return [2][3]string{
		{fmt.Sprintf("%d nodes, sync %d ms, share mode on, %s: at most %.2f× L allowed per window", AimNodes, AimSyncMS, r.loadsDescription(), AimMaxAllowed),
			measured, runinfo.Verdict(r.AimPass)},
		{fmt.Sprintf("one node of %d has all the traffic (%.3g× L, sync %d ms, share mode on): its full limit in every window (≥ %.3f× L)", AimNodes, r.Single.Offered, r.Single.SyncMS, AimSingleMin),
			fmt.Sprintf("min %.3f× L (mean %.3f, max %.3f) over %d windows", s.Min, s.Mean, s.Max, s.Windows), runinfo.Verdict(r.SinglePass)},
	}
}

// loadsDescription says what the share-mode scenario offers.
func (r *Report) loadsDescription() string {
	c := r.Config
	var parts []string
	if len(c.Loads) > 0 {
		l := make([]string, len(c.Loads))
		for i, o := range c.Loads {
			l[i] = fmt.Sprintf("%.3g×", o)
		}
		parts = append(parts, strings.Join(l, ", ")+" L offered evenly")
	}
	if c.Burst > 0 {
		parts = append(parts, fmt.Sprintf("%.3g× L sent at each window's start", c.Burst))
	}
	return strings.Join(parts, ", and ")
}

// loadName names a load of the share-mode scenario.
func loadName(l Result) string {
	if l.Burst {
		return fmt.Sprintf("burst %.3g×", l.Offered)
	}
	return fmt.Sprintf("%.3g×", l.Offered)
}

// worstLoad is the share-mode load whose most allowed window allowed the most.
func (r *Report) worstLoad() (Result, bool) {
	var worst Result
	ok := false
	for _, l := range r.Loads {
		if l.Share && l.Allowed.Windows > 0 && (!ok || l.Allowed.Max > worst.Allowed.Max) {
			worst, ok = l, true
		}
	}
	return worst, ok
}

// shareLoads and loadWindows count the share-mode loads and their measured windows.
func (r *Report) shareLoads() (n int) {
	for _, l := range r.Loads {
		if l.Share {
			n++
		}
	}
	return n
}

func (r *Report) loadWindows() (n int) {
	for _, l := range r.Loads {
		if l.Share {
			n += l.Allowed.Windows
		}
	}
	return n
}

// WriteText prints the tables and the aims.
func (r *Report) WriteText(w io.Writer) {
	c := r.Config
	fmt.Fprintf(w, "\nbench cluster: L = %d per %v, %.3g× L offered per window in total, %d start(s) × (%d warm-up + %d measured windows) per configuration; %s, %d CPUs; run took %v\n\n",
		c.Limit, c.Window, c.Offered, c.Repeat, c.Warmup, c.Windows, r.CPU, r.NProc, r.Elapsed.Round(time.Second))
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "N\tsync ms\tshare\tmean A/L\tmax A/L\tmin A/L\tmean A/L per start\tmodel mean\tmodel max\tmsg/s/node\tB/s/node\tCPU/node\tcaps/s\twindows\tdiscarded\tother load\t")
	for _, g := range r.Grid {
		fmt.Fprintf(tw, "%d\t%d\t%s\t%.3f\t%.3f\t%.3f\t%s\t%.3f\t%.3f\t%.1f\t%.0f\t%.3f\t%.1f\t%d\t%d\t%s\t\n", g.Nodes, g.SyncMS, modeName(g.Share),
			g.Allowed.Mean, g.Allowed.Max, g.Allowed.Min, startMeans(g.Starts), g.TheoryMean, g.TheoryMax, g.Traffic.MsgsSent, g.Traffic.BytesSent, g.NodeCPU, g.Traffic.Caps,
			g.Allowed.Windows, g.Discarded, fmtLoad(g.OtherLoad))
	}
	tw.Flush()
	if len(r.Loads) > 0 {
		fmt.Fprintf(w, "\nshare-mode scenario (%d nodes, sync %d ms):\n", AimNodes, AimSyncMS)
		tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintln(tw, "load\tshare\tplanned checks/s\tsent checks/s\tlate\tburst sent in (median, longest)\tmean A/L\tmax A/L\tmin A/L\tmodel max\twindows\tdiscarded\tother load\t")
		for _, l := range r.Loads {
			fmt.Fprintf(tw, "%s\t%s\t%.0f\t%.0f\t%d\t%s\t%.3f\t%.3f\t%.3f\t%.3f\t%d\t%d\t%s\t\n", loadName(l), modeName(l.Share), r.rate(l), l.SentRate, l.Late, burstSpan(l),
				l.Allowed.Mean, l.Allowed.Max, l.Allowed.Min, l.TheoryMax, l.Allowed.Windows, l.Discarded, fmtLoad(l.OtherLoad))
		}
		tw.Flush()
	}
	fmt.Fprintf(w, "\ntraffic against keys (%d nodes, sync %d ms, share mode on):\n", AimNodes, c.TrafficSyncMS)
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "keys\tchecks/s\tmsg/s/node\tB/s/node\tvalues/flush\tmodel values/flush\t")
	for _, k := range r.Keys {
		fmt.Fprintf(tw, "%d\t%.0f\t%.1f\t%.0f\t%.1f\t%.1f\t\n", k.Keys, r.rate(k), k.Traffic.MsgsSent, k.Traffic.BytesSent, k.Traffic.KeysPerFlush, r.modelValues(k))
	}
	tw.Flush()
	fmt.Fprintf(w, "\none node of %d with all the traffic: allowed/L per window %s\n\n", AimNodes, windowList(r.Single.Windows, c.Limit))
	for _, a := range r.aimLines() {
		fmt.Fprintf(w, "aim: %s — %s — %s\n", a[0], a[1], a[2])
	}
}

// burstSpan is how long a burst took to send, "—" for a paced load.
func burstSpan(l Result) string {
	if !l.Burst {
		return "—"
	}
	return fmt.Sprintf("%v, %v", l.SpanMedian.Round(100*time.Microsecond), l.SpanMax.Round(100*time.Microsecond))
}

// startMeans lists each start's mean A/L.
func startMeans(ss []Stats) string {
	s := make([]string, len(ss))
	for i, st := range ss {
		s[i] = fmt.Sprintf("%.3f", st.Mean)
	}
	return strings.Join(s, " ")
}

// bytesPerMessage is the mean size of the grid's sync messages.
func (r *Report) bytesPerMessage() float64 {
	var msgs, bytes float64
	for _, g := range r.Grid {
		msgs += g.Traffic.MsgsSent
		bytes += g.Traffic.BytesSent
	}
	if msgs == 0 {
		return 0
	}
	return bytes / msgs
}

// fmtLoad prints a load in CPUs, "?" when unknown.
func fmtLoad(l float64) string {
	if l < 0 {
		return "?"
	}
	return fmt.Sprintf("%.2f", l)
}

// retries counts the loads measured again, over the whole run.
func (r *Report) retries() int {
	n := r.Single.Retries
	for _, g := range slices.Concat(r.Grid, r.Loads) {
		n += g.Retries
	}
	for _, k := range r.Keys {
		n += k.Retries
	}
	return n
}

// rate is a result's checks per second in total.
func (r *Report) rate(res Result) float64 {
	return res.Offered * float64(r.Config.Limit) / r.Config.Window.Seconds()
}

// modelValues is the model's counters per flush for a result.
func (r *Report) modelValues(res Result) float64 {
	perNodePerFlush := r.rate(res) / float64(max(res.Senders, 1)) * float64(res.SyncMS) / 1000
	return ValuesPerFlush(res.Keys, perNodePerFlush)
}

// windowList lists the A/L of the windows that are not disturbed.
func windowList(ws []Window, limit int) string {
	var s []string
	for _, w := range ws {
		if !w.Disturbed {
			s = append(s, fmt.Sprintf("%.3f", float64(w.Allowed)/float64(limit)))
		}
	}
	return strings.Join(s, " ")
}

// nodeSizes returns the cluster sizes of the grid, in order.
func (r *Report) nodeSizes() []int {
	var ns []int
	for _, g := range r.Grid {
		if !slices.Contains(ns, g.Nodes) {
			ns = append(ns, g.Nodes)
		}
	}
	return ns
}

// advice is, for a cluster size and mode, the longest sync interval such that it and
// every shorter one measured kept the max allowed/L within the aim, and its result; ok
// is false when even the shortest did not.
func (r *Report) advice(n int, share bool) (best Result, ok bool) {
	var rows []Result
	for _, g := range r.Grid {
		if g.Nodes == n && g.Share == share && g.Allowed.Windows > 0 {
			rows = append(rows, g)
		}
	}
	slices.SortFunc(rows, func(a, b Result) int { return a.SyncMS - b.SyncMS })
	for _, g := range rows {
		if g.Allowed.Max > AimMaxAllowed {
			break
		}
		best, ok = g, true
	}
	return best, ok
}

// fit compares the grid's measurements with the models.
type fit struct {
	// Without share mode, N > 1: rows, rows whose max stayed within the model's max, and
	// the mean over rows of measured/modelled overshoot (A/L − 1), for the max and the
	// mean.
	rows, withinMax     int
	maxRatio, meanRatio float64
	// In share mode where each node flushes at least twice a window: rows, and the
	// largest max A/L.
	shareRows int
	shareMax  float64
	// Share-mode rows whose mean A/L was under 0.98, and the lowest mean.
	shareUnder int
	shareLow   Result
}

func (r *Report) modelFit() fit {
	var f fit
	wms := float64(r.Config.Window.Milliseconds())
	var nMax, nMean int
	for _, g := range r.Grid {
		if g.Nodes < 2 || g.Allowed.Windows == 0 {
			continue
		}
		if g.Share {
			if g.Allowed.Mean < 0.98 {
				f.shareUnder++
				if f.shareUnder == 1 || g.Allowed.Mean < f.shareLow.Allowed.Mean {
					f.shareLow = g
				}
			}
			if ShareHolds(float64(g.SyncMS), wms) {
				f.shareRows++
				f.shareMax = max(f.shareMax, g.Allowed.Max)
			}
			continue
		}
		f.rows++
		if g.Allowed.Max <= g.TheoryMax+0.01 {
			f.withinMax++
		}
		if g.TheoryMax > 1.001 {
			f.maxRatio += (g.Allowed.Max - 1) / (g.TheoryMax - 1)
			nMax++
		}
		if g.TheoryMean > 1.001 {
			f.meanRatio += (g.Allowed.Mean - 1) / (g.TheoryMean - 1)
			nMean++
		}
	}
	if nMax > 0 {
		f.maxRatio /= float64(nMax)
	}
	if nMean > 0 {
		f.meanRatio /= float64(nMean)
	}
	return f
}

// Markdown renders the report for bench/results.
func (r *Report) Markdown() string {
	var b strings.Builder
	c := r.Config
	fmt.Fprintf(&b, "# Cluster sync: accuracy and traffic against the sync interval and the offered load\n\n")
	fmt.Fprintf(&b, "Written by `bench cluster` on %s; the run took %v. One key with a limit L = %d per %v is driven from every node of a cluster on loopback at %.3g× L per window in total, spread evenly and paced; the share-mode scenario drives %d nodes syncing every %d ms at %s. Each configuration of more than one node is started %d times (fresh processes), each start running %d warm-up and %d measured windows; the stats pool the measured windows of all its starts. **A/L** is the number of checks a window allowed divided by L.\n\n",
		r.Started.UTC().Format("2006-01-02 15:04 UTC"), r.Elapsed.Round(time.Second), c.Limit, c.Window, c.Offered, AimNodes, AimSyncMS, r.loadsDescription(), c.Repeat, c.Warmup, c.Windows)

	b.WriteString("## Share-mode aims\n\n| aim | measured | verdict |\n|---|---|---|\n")
	for _, a := range r.aimLines() {
		fmt.Fprintf(&b, "| %s | %s | **%s** |\n", a[0], a[1], a[2])
	}
	if worst, ok := r.worstLoad(); ok {
		fmt.Fprintf(&b, "\nPer window (A/L, in order, disturbed windows left out): the share-mode load that allowed the most (%s) %s; single node %s.\n", loadName(worst), windowList(worst.Windows, c.Limit), windowList(r.Single.Windows, c.Limit))
	}

	if c.Plot != "" {
		fmt.Fprintf(&b, "\n![max A/L against the offered load and the sync interval, and sync traffic](%s)\n", filepath.Base(c.Plot))
	}
	r.writeLoads(&b)

	b.WriteString("\n## Choosing RATE_LIMIT_SYNC_INTERVAL_MS\n\n")
	fmt.Fprintf(&b, "The longest sync interval at which, as at every shorter one measured, no window allowed more than %.2f× L, and the sync traffic it costs each node (at %.3g× L offered; without share mode the overshoot grows with the rate, see the model):\n\n", AimMaxAllowed, c.Offered)
	fmt.Fprintf(&b, "| nodes | share mode | longest interval within %.2f× L | its max A/L | its mean A/L | its messages/s per node | its bytes/s per node | the model's longest, share mode off |\n|--:|---|--:|--:|--:|--:|--:|--:|\n", AimMaxAllowed)
	for _, n := range r.nodeSizes() {
		if n < 2 {
			continue
		}
		model := "—"
		if iv := SteadyInterval(n, c.Offered, float64(c.Window.Milliseconds()), AimMaxAllowed); !math.IsInf(iv, 1) {
			model = fmt.Sprintf("%.0f ms", iv)
		}
		for _, share := range c.Modes {
			m := model
			if share {
				m = ""
			}
			if g, ok := r.advice(n, share); ok {
				fmt.Fprintf(&b, "| %d | %s | %d ms | %.3f | %.3f | %.1f | %.0f | %s |\n", n, modeName(share), g.SyncMS, g.Allowed.Max, g.Allowed.Mean, g.Traffic.MsgsSent, g.Traffic.BytesSent, m)
			} else {
				fmt.Fprintf(&b, "| %d | %s | none: the shortest measured went over | | | | | %s |\n", n, modeName(share), m)
			}
		}
	}
	fmt.Fprintf(&b, "\nThe model's longest interval without share mode is (%.2f − 1) × N × W / ((N − 1) × offered): it shrinks as the overload grows, so size it for the worst overload a key is expected to see (here %.3g× L). ", AimMaxAllowed, c.Offered)
	b.WriteString("In share mode the window stays at about L at any load while each node flushes at least twice a window (see below): the interval then trades traffic against how soon a node that starts getting a key's checks gets its part, not accuracy. A shorter interval costs traffic in proportion (one message per interval to each other node for every batch of changed keys). Traffic does not depend on the number of checks, only on the keys that change in an interval (see below).\n")

	b.WriteString("\n## Allowed per window and sync traffic, per configuration\n\n")
	b.WriteString("Model columns (below): the steady-load model's mean and max A/L without share mode, for every row. \"per start\" is each cluster start's mean A/L: the windows of one start are alike, since the flushes keep their phase in the window. Traffic is per node and per second over the measured windows, from the sidecars' `converger_cluster_sync_messages_total` and `converger_cluster_sync_bytes_total` (sent); caps/s counts share mode's caps (`converger_cluster_share_mode_caps_total`) per node.\n\n")
	b.WriteString("| N | sync ms | share mode | mean A/L | max A/L | min A/L | mean A/L per start | model mean | model max | messages/s per node | bytes/s per node | CPU per node | caps/s | windows | discarded | checks sent | late | errors | other load |\n|--:|--:|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|\n")
	for _, g := range r.Grid {
		fmt.Fprintf(&b, "| %d | %d | %s | %.3f | %s | %.3f | %s | %.3f | %.3f | %.1f | %.0f | %.3f | %.1f | %d | %d | %d | %d | %d | %s |\n", g.Nodes, g.SyncMS, modeName(g.Share),
			g.Allowed.Mean, bold(fmt.Sprintf("%.3f", g.Allowed.Max), g.Allowed.Max > AimMaxAllowed), g.Allowed.Min, startMeans(g.Starts), g.TheoryMean, g.TheoryMax,
			g.Traffic.MsgsSent, g.Traffic.BytesSent, g.NodeCPU, g.Traffic.Caps, g.Allowed.Windows, g.Discarded, g.Sent, g.Late, g.Errors, fmtLoad(g.OtherLoad))
	}
	fmt.Fprintf(&b, "\nMax A/L above %.2f is in bold. \"windows\" are the measured windows the stats are over; \"discarded\" those left out because the load missed its plan in them (more than 1%% of their checks sent over %v late, or more than 2%% more or fewer checks than planned: a stall of the shared machine; or one of their checks, sent %v or more before their end, answered after it: the sidecar may have counted it in the next window, so that window and the next); \"late\" counts all checks sent late; \"errors\" counts gRPC errors. \"CPU per node\" is the CPU time a sidecar used per second (1 = one CPU busy) over the measured windows, load and sync together; \"other load\" the CPUs the rest of the machine used meanwhile (the worst start), other processes and kernel work charged to none. A load that kept fewer than half its windows, during which a node lost sight of another, or during which the rest of the machine used more than %.2f CPUs (the sidecars may then be starved while the load generator is not) was measured again, at most %d times (%d loads in this run); when no attempt was usable, the windows kept by every attempt during which the nodes saw each other are pooled.\n",
		AimMaxAllowed, lateAfter, straddleMargin, maxOtherLoad, maxRetries, r.retries())
	r.writeFirstErrors(&b)

	b.WriteString("\n## The model, and how the measurements compare\n\n")
	fmt.Fprintf(&b, "Without share mode, each of N nodes gets r = %.3g× L / N checks per window and hears of the others' counts from their last flush, up to one sync interval I late. When the true total reaches L, the others have counted up to (N − 1) × r × I / W more than a node has heard of, and it goes on allowing them:\n\n", c.Offered)
	b.WriteString("- **steady load**: overshoot ≈ (N − 1) × per-node rate × I / L, i.e. max A/L ≈ 1 + (N − 1) × offered × I / (N × W) when every report is a whole interval old; the mean is half the overshoot (a report's age is spread evenly over the interval). Never more than offered, nor than N.\n")
	b.WriteString("- **burst at a window start**: every node can allow L on its own count before any flush: up to **N × L** without share mode (min(N, offered) × L), whatever the interval; measured in the share-mode scenario, where the burst takes some milliseconds to send (see its row), so that some flushes fall within it.\n")
	fmt.Fprintf(&b, "- **traffic**: each flush sends, to each of the N − 1 others, the counters changed since the last flush and those of the last flush once more; one key fits in one message (%.0f bytes here: the header names the origin, node name and incarnation), so a node sends (N − 1) × 1000 / I messages per second, whatever the check rate.\n\n", r.bytesPerMessage())
	f := r.modelFit()
	if f.rows > 0 {
		fmt.Fprintf(&b, "Measured without share mode (N > 1): the max A/L stayed within the model's max in %d of %d configurations; the measured overshoot (A/L − 1) was on average %.0f%% of the model's for the max and %.0f%% of the model's for the mean. ",
			f.withinMax, f.rows, 100*f.maxRatio, 100*f.meanRatio)
		b.WriteString("The sync interval divides the window, so a node's flushes fall at the same moments of every window for the life of the process: the windows of one start are alike (see \"per start\"), and each start is one draw of the flush phases. Over a few starts the max lands between the model's mean and its worst case (every report a whole interval old when the limit is reached). With N = 1 there is no one to hear of and every window allows exactly L.\n")
	}
	if slices.Contains(c.Modes, true) {
		b.WriteString("\nShare mode (`sidecar/cluster/share.go`) runs at each flush: each node claims a part of the limit for the current window and the next, and sends its claim with its count and what it was asked for. It sets aside the others' claims and divides what is left by what each node is projected to need until the window ends (max-min fair), what nobody needs split over the members as headroom; the next window's claims are set before it begins, from the demand of the last window's length, so a burst at a window's start finds each node holding only its part. A node that is the only one with demand is not bound. The bound holds at any offered load once every node has set the next window's claim from a report of this one, that is while each flushes at least twice a window (2 × I ≤ W); with longer intervals it may not. Checks refused by the bound are not counted, so they do not use up the others' budget.\n\n")
		if f.shareRows > 0 {
			fmt.Fprintf(&b, "Measured in share mode with 2 × I ≤ W: %d configurations of the grid, the most allowed in any window %.3f L. ", f.shareRows, f.shareMax)
		}
		if f.shareUnder > 0 {
			fmt.Fprintf(&b, "Share mode allowed less than 0.98 L on average in %d configurations, the least at N = %d, sync %d ms: %.3f L.", f.shareUnder, f.shareLow.Nodes, f.shareLow.SyncMS, f.shareLow.Allowed.Mean)
		}
		b.WriteString("\n")
	}

	b.WriteString("\n## Traffic against the number of keys\n\n")
	fmt.Fprintf(&b, "%d nodes, sync %d ms, share mode on; the same checks per second spread over more keys (client IPs, in turn), and last one key at a tenth of the rate. The model's counters per flush are min(keys, 2 × checks per node per interval): the keys changed since the last flush, plus those of the last flush sent once more.\n\n", AimNodes, c.TrafficSyncMS)
	b.WriteString("| keys | checks/s (all nodes) | messages/s per node | bytes/s per node | values/flush | model values/flush | bytes per value | CPU per node | merge lag |\n|--:|--:|--:|--:|--:|--:|--:|--:|--:|\n")
	for _, k := range r.Keys {
		perValue := 0.0
		if t := k.Traffic; t.Flushes > 0 && t.KeysPerFlush > 0 {
			// Each flush goes to the N − 1 others.
			perValue = t.BytesSent / (t.Flushes * float64(k.Nodes-1)) / t.KeysPerFlush
		}
		fmt.Fprintf(&b, "| %d | %.0f | %.1f | %.0f | %.1f | %.1f | %.1f | %.3f | %.2f ms |\n", k.Keys, r.rate(k), k.Traffic.MsgsSent, k.Traffic.BytesSent, k.Traffic.KeysPerFlush, r.modelValues(k), perValue, k.NodeCPU, k.Traffic.MergeLagMS)
	}
	b.WriteString("\nMessages stay at one per interval per peer until a flush's counters no longer fit in one UDP packet (1200 bytes); bytes grow with the counters per flush. The check rate alone changes nothing: one key at a tenth of the rate costs what one key costs at the full rate.\n")

	fmt.Fprintf(&b, "\n## One node with all the traffic\n\n%d nodes, sync %d ms, share mode on; node 0 gets all %.3g× L per window, the others none.\n\n", AimNodes, r.Single.SyncMS, r.Single.Offered)
	b.WriteString("| window | sent | allowed | A/L | allowed by node | disturbed |\n|--:|--:|--:|--:|---|---|\n")
	for i, w := range r.Single.Windows {
		d := ""
		if w.Disturbed {
			d = "yes (left out)"
		}
		fmt.Fprintf(&b, "| %d | %d | %d | %.3f | %v | %s |\n", i+1, w.Sent, w.Allowed, float64(w.Allowed)/float64(c.Limit), w.AllowedByNode, d)
	}
	fmt.Fprintf(&b, "\nA node that hears of no other node's count is never capped by share mode, so it gets L in every window (a check sent within a moment of a window's end may be counted by the sidecar in the next one, hence the %.3f tolerance of the aim).\n", AimSingleMin)

	b.WriteString("\n## Environment\n\n")
	fmt.Fprintf(&b, "- date: %s\n- go version: `%s` (bench built with %s)\n- CPU: %s, nproc %d\n- load average at start / end: %s / %s\n",
		r.Started.UTC().Format(time.RFC3339), r.GoVersion, r.BenchGo, r.CPU, r.NProc, r.LoadStart, r.LoadEnd)
	fmt.Fprintf(&b, "- sidecar: `%s`, source: %s\n", c.Sidecar, r.SidecarSource)
	fmt.Fprintf(&b, "- duration: %v in all (grid %v, share-mode scenario %v, other scenarios %v); starting a cluster and seeing it formed took at most %v\n",
		r.Elapsed.Round(time.Second), r.GridTime.Round(time.Second), r.LoadsTime.Round(time.Second), r.ScenarioTime.Round(time.Second), r.ClusterStart.Round(time.Millisecond))

	b.WriteString("\n## Flags\n\n| flag | value |\n|---|---|\n")
	for _, f := range r.flagRows() {
		fmt.Fprintf(&b, "| `%s` | `%s` |\n", f[0], f[1])
	}
	fmt.Fprintf(&b, "\n## Reproduce\n\n```sh\n%s\n```\n", r.Command())
	fmt.Fprintf(&b, `
## Method

- Each configuration starts N `+"`bin/sidecar`"+` processes on loopback (CLUSTER_STRATEGY=static, CLUSTER_JOIN naming
  every node, CLUSTER_INSECURE=true, RATE_LIMIT_SYNC_INTERVAL_MS, RATE_LIMIT_SHARE_MODE, and RATE_LIMIT_CONFIG with
  `+"`limits: {%s: {limit: %d, window: %dms}}`"+`), waits until every node's /readyz shows cluster_size N, and
  stops them afterwards.
- The load is Envoy's ext_authz Check over gRPC for `+"`%s %s`"+` (counted per client IP in %s), the source
  address being the client IP: one IP is one key. Checks are sent on a fixed schedule (an open loop: a slow answer
  does not delay the next check), evenly spaced over all the sending nodes together, with at most %d in flight per
  node; the load is bounded in count (rate × duration) and in time (the last measured window's end, plus 3 s for
  answers).
- Windows are aligned to the wall clock as in the sidecar (window = now_ms / window_ms); each check is assigned to a
  window by the time it was sent. The load starts up to 100 ms before a window begins; that partial window is
  discarded, the next %d are the warm-up, the next %d are measured. Configurations of more than one node are started
  %d times afresh, since a node's flushes keep their phase in the window for the life of the process.
- Traffic is the difference of each node's /metrics between the start and the end of the measured windows, divided by
  the time between the two scrapes, averaged over the nodes. Bytes are sync-message payloads as the sidecar counts
  them: without UDP/IP headers, memberlist's framing, or memberlist's own gossip and probes.
- The share-mode scenario starts, for each share mode, %d fresh clusters of %d nodes syncing every %d ms, and runs every
  load on each in turn, each on a key of its own. A burst load sends, at the start of each window (the warm-up's too),
  each node its part of the burst at once: the checks are queued at the window's start and go out as fast as the
  generator can send them, at most %d in flight per node; "burst sent in" is the time from the window's start to the
  last check sent. A burst window is left out only when it got more than 2%% more or fewer checks than planned, or when a check of it or of the window before was answered after that window's end (a stall of the sidecars: the tally, by send time, cannot tell which window counted it).
- The load generator and all the sidecars share the machine's %d CPUs. The nodes of a cluster start at random moments
  within one sync interval, so that their flushes are out of step as in a deployment.
`, loadBucket, c.Limit, c.Window.Milliseconds(), loadMethod, loadPath, loadBucket, maxInFlight, c.Warmup, c.Windows, c.Repeat, c.Repeat, AimNodes, AimSyncMS, maxInFlight, r.NProc)
	return b.String()
}

func bold(s string, on bool) string {
	if on {
		return "**" + s + "**"
	}
	return s
}

// writeLoads renders the share-mode scenario.
func (r *Report) writeLoads(b *strings.Builder) {
	if len(r.Loads) == 0 {
		return
	}
	c := r.Config
	fmt.Fprintf(b, "\n## Share mode at any offered load\n\n%d nodes, sync %d ms, one key with L = %d per %v; each load on a fresh key, %d starts per mode. \"planned\" is the checks per second the load offers, \"sent\" what the generator achieved over the measured windows; a burst sends each window's checks at its start.\n\n",
		AimNodes, AimSyncMS, c.Limit, c.Window, c.Repeat)
	b.WriteString("| load | share mode | planned checks/s | sent checks/s | late | burst sent in (median, longest) | mean A/L | max A/L | min A/L | mean A/L per start | model max, share mode off | CPU per node | windows | discarded | other load |\n|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|\n")
	for _, l := range r.Loads {
		fmt.Fprintf(b, "| %s | %s | %.0f | %.0f | %d | %s | %.3f | %s | %.3f | %s | %.3f | %.3f | %d | %d | %s |\n", loadName(l), modeName(l.Share), r.rate(l), l.SentRate, l.Late, burstSpan(l),
			l.Allowed.Mean, bold(fmt.Sprintf("%.3f", l.Allowed.Max), l.Allowed.Max > AimMaxAllowed), l.Allowed.Min, startMeans(l.Starts), l.TheoryMax, l.NodeCPU, l.Allowed.Windows, l.Discarded, fmtLoad(l.OtherLoad))
	}
	fmt.Fprintf(b, "\nMax A/L above %.2f is in bold. The model's max without share mode is the steady-load model's for a paced load (below), min(N, offered) for a burst sent before any flush; a burst that takes a few milliseconds to send lets some flushes through, so it measures less. With share mode the next window's claims are set before it begins, so neither the rate nor the burst moves the window off L.\n", AimMaxAllowed)
}

func (r *Report) writeFirstErrors(b *strings.Builder) {
	all := append(append(append([]Result(nil), r.Grid...), r.Loads...), r.Single)
	all = append(all, r.Keys...)
	for _, g := range all {
		if g.FirstErr != "" {
			fmt.Fprintf(b, "\nFirst gRPC error of %s N=%d sync=%d ms share=%s: `%s`\n", g.Scenario, g.Nodes, g.SyncMS, modeName(g.Share), g.FirstErr)
		}
	}
}

// flagRows lists the flags and their values.
func (r *Report) flagRows() [][2]string {
	c := r.Config
	return [][2]string{
		{"-sidecar", c.Sidecar},
		{"-n", (*intList)(&c.Nodes).String()},
		{"-intervals", (*intList)(&c.Intervals).String()},
		{"-modes", (*modeList)(&c.Modes).String()},
		{"-limit", fmt.Sprint(c.Limit)},
		{"-window", c.Window.String()},
		{"-offered", fmt.Sprint(c.Offered)},
		{"-loads", (*floatList)(&c.Loads).String()},
		{"-burst", fmt.Sprint(c.Burst)},
		{"-windows", fmt.Sprint(c.Windows)},
		{"-warmup", fmt.Sprint(c.Warmup)},
		{"-repeat", fmt.Sprint(c.Repeat)},
		{"-keys", (*intList)(&c.Keys).String()},
		{"-traffic-interval", fmt.Sprint(c.TrafficSyncMS)},
		{"-out", c.Out},
		{"-plot", c.Plot},
		{"-quick", fmt.Sprint(c.Quick)},
		{"-strict", fmt.Sprint(c.Strict)},
	}
}
