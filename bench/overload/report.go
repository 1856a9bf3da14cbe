package overload

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/converger/edge/bench/benchtls"
	"github.com/converger/edge/bench/promscrape"
	"github.com/converger/edge/bench/runinfo"
)

// scrapeShed reads the sidecar's converger_sidecar_checks_shed_total, 0 when it cannot
// (a baseline without the metric).
func scrapeShed(ctx context.Context, httpAddr string) float64 {
	s, err := promscrape.Scrape(ctx, benchtls.URL(httpAddr, "/metrics"), []string{"converger_sidecar_checks_shed_total"})
	if err != nil {
		return 0
	}
	var v float64
	for _, x := range promscrape.Map(s) {
		v += x
	}
	return v
}

func pct(n, of float64) string {
	if of == 0 {
		return "-"
	}
	return fmt.Sprintf("%.1f%%", 100*n/of)
}

func (r *Report) rows() [][]string {
	var out [][]string
	for _, res := range r.Results {
		for _, s := range res.Steps {
			sent := float64(s.Sent)
			out = append(out, []string{
				res.Name, strconv.Itoa(s.Round), fmt.Sprintf("%.0f → %.0f", s.Capacity, s.CapacityAfter), fmt.Sprintf("%.1f×", s.Load), fmt.Sprintf("%.0f", s.Rate), fmt.Sprintf("%.0f", s.SentRate()),
				fmt.Sprintf("%.0f", s.Goodput()), pct(s.Goodput(), s.Around()),
				pct(float64(s.Missed), sent), pct(float64(s.Shed), sent), pct(float64(s.Refused), sent), pct(float64(s.Overflow), sent), pct(float64(s.Errors), sent),
				runinfo.Latency(s.P99), fmt.Sprintf("%.0f", s.ShedCounter),
				fmt.Sprintf("%.2f / %.2f", s.CapacitySidecarCPU, s.CapacityGeneratorCPU), fmt.Sprintf("%.2f / %.2f", s.SidecarCPU, s.GeneratorCPU),
			})
		}
	}
	return out
}

var header = []string{"sidecar", "round", "capacity/s before → after", "load", "offered/s", "sent/s", "in time/s", "goodput", "missed", "shed", "refused", "overflow", "errors", "p99 in time", "shed metric", "CPU at capacity", "CPU at load"}

// summary is, per binary and load, the median of the rounds' goodput shares, the range,
// and the highest share of missed deadlines.
func (r *Report) summary() [][]string {
	var out [][]string
	for _, res := range r.Results {
		for _, load := range r.Config.Loads {
			var shares []float64
			var missed float64
			for _, s := range res.Steps {
				if s.Load == load {
					shares = append(shares, s.GoodputShare())
					if s.Sent > 0 {
						missed = max(missed, float64(s.Missed)/float64(s.Sent))
					}
				}
			}
			if len(shares) == 0 {
				continue
			}
			slices.Sort(shares)
			out = append(out, []string{res.Name, fmt.Sprintf("%.1f×", load), strconv.Itoa(len(shares)),
				fmt.Sprintf("%.1f%%", 100*shares[len(shares)/2]), fmt.Sprintf("%.1f–%.1f%%", 100*shares[0], 100*shares[len(shares)-1]), fmt.Sprintf("%.1f%%", 100*missed)})
		}
	}
	return out
}

var summaryHeader = []string{"sidecar", "load", "rounds", "goodput, median", "goodput, range", "missed, highest"}

// WriteText writes the report's table to w.
func (r *Report) WriteText(w io.Writer) {
	fmt.Fprintf(w, "bench %s -overload: deadline %v, %d connections, sidecar on CPU %d, generator on CPU %d, generator queue bound %v of capacity (0: none)\n",
		r.Service, r.Config.Deadline, r.Config.Conns, r.Config.SidecarCPU, r.Config.GeneratorCPU, r.Config.Queue)
	fmt.Fprintln(w, strings.Join(header, "\t"))
	for _, row := range r.rows() {
		fmt.Fprintln(w, strings.Join(row, "\t"))
	}
	fmt.Fprintln(w, strings.Join(summaryHeader, "\t"))
	for _, row := range r.summary() {
		fmt.Fprintln(w, strings.Join(row, "\t"))
	}
}

// Markdown is the report as a page.
func (r *Report) Markdown() string {
	var b strings.Builder
	fmt.Fprintf(&b, "# bench %s -overload\n\n", r.Service)
	fmt.Fprintf(&b, "Command: `%s`  \n", runinfo.Command(r.Service, r.Args))
	fmt.Fprintf(&b, "Machine: %s, %d CPUs, %s; load average %s at the start, %s at the end. Run at %s.\n\n",
		r.Machine.CPU, r.Machine.NProc, r.Machine.GoVersion, r.Load[0], r.Load[1], time.Now().UTC().Format(time.RFC3339))
	fmt.Fprintf(&b, "The sidecar pinned to CPU %d with a CPU quota of %.2f of it (a gRPC client costs about what the sidecar does per check, so the generator needs the spare CPU to offer 3×), the generator to CPU %d. Every request sent once before the first measurement (the first verification of each credential). Then %d rounds of the loads, each between two capacity measurements closed loop (%d callers over %d connections, 2 s after 1 s of warm-up), each load open loop, %v of warm-up and %v counted, every check with a %v gRPC deadline; generator bound on outstanding checks: what the capacity answers in %v (0: none).\n\n",
		r.Config.SidecarCPU, r.Config.SidecarShare, r.Config.GeneratorCPU, r.Config.Rounds, r.Config.Concurrency, r.Config.Conns, r.Config.Warmup, r.Config.Duration, r.Config.Deadline, r.Config.Queue)
	b.WriteString("*goodput*: decisions answered before the deadline, as a share of the capacity; *missed*, *shed* (the sidecar's 503 answer), *refused* (refused unread, ResourceExhausted), *overflow* (failed in the generator at its bound), *errors*: shares of the checks sent; *p99 in time*: of the decisions answered in time; *shed metric*: the sidecar's `converger_sidecar_checks_shed_total` over the load; *CPU*: cores used by the sidecar / by the generator, while the capacity was measured and over the load (a side near 1.00 is what bounds that phase).\n\n")
	table := func(h []string, rows [][]string) {
		b.WriteString("| " + strings.Join(h, " | ") + " |\n|" + strings.Repeat("---|", len(h)) + "\n")
		for _, row := range rows {
			b.WriteString("| " + strings.Join(row, " | ") + " |\n")
		}
	}
	b.WriteString("## Summary\n\nThe goodput of each round as a share of the capacity measured around it (the mean of the closed-loop measurements just before and just after the load); the median of the rounds and their range.\n\n")
	table(summaryHeader, r.summary())
	b.WriteString("\n## Every load\n\n")
	table(header, r.rows())
	return b.String()
}
