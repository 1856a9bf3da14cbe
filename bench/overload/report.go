package overload

import (
	"context"
	"fmt"
	"io"
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
				res.Name, fmt.Sprintf("%.0f", s.Capacity), fmt.Sprintf("%.1f×", s.Load), fmt.Sprintf("%.0f", s.Rate), fmt.Sprintf("%.0f", s.SentRate()),
				fmt.Sprintf("%.0f", s.Goodput()), pct(s.Goodput(), s.Capacity),
				pct(float64(s.Missed), sent), pct(float64(s.Shed), sent), pct(float64(s.Refused), sent), pct(float64(s.Overflow), sent), pct(float64(s.Errors), sent),
				runinfo.Latency(s.P99), fmt.Sprintf("%.0f", s.ShedCounter),
			})
		}
	}
	return out
}

var header = []string{"sidecar", "capacity/s", "load", "offered/s", "sent/s", "in time/s", "goodput", "missed", "shed", "refused", "overflow", "errors", "p99 in time", "shed metric"}

// WriteText writes the report's table to w.
func (r *Report) WriteText(w io.Writer) {
	fmt.Fprintf(w, "bench %s -overload: deadline %v, %d connections, sidecar on CPU %d, generator on CPU %d, generator queue bound %v of capacity (0: none)\n",
		r.Service, r.Config.Deadline, r.Config.Conns, r.Config.SidecarCPU, r.Config.GeneratorCPU, r.Config.Queue)
	fmt.Fprintln(w, strings.Join(header, "\t"))
	for _, row := range r.rows() {
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
	fmt.Fprintf(&b, "The sidecar pinned to CPU %d, the generator to CPU %d; before each load, the capacity measured closed loop (%d callers over %d connections, 2 s after 1 s of warm-up), then the load open loop, %v of warm-up and %v counted, every check with a %v gRPC deadline; generator bound on outstanding checks: what the capacity answers in %v (0: none).\n\n",
		r.Config.SidecarCPU, r.Config.GeneratorCPU, r.Config.Concurrency, r.Config.Conns, r.Config.Warmup, r.Config.Duration, r.Config.Deadline, r.Config.Queue)
	b.WriteString("*goodput*: decisions answered before the deadline, as a share of the capacity; *missed*, *shed* (the sidecar's 503 answer), *refused* (refused unread, ResourceExhausted), *overflow* (failed in the generator at its bound), *errors*: shares of the checks sent; *p99 in time*: of the decisions answered in time; *shed metric*: the sidecar's `converger_sidecar_checks_shed_total` over the load.\n\n")
	b.WriteString("| " + strings.Join(header, " | ") + " |\n|" + strings.Repeat("---|", len(header)) + "\n")
	for _, row := range r.rows() {
		b.WriteString("| " + strings.Join(row, " | ") + " |\n")
	}
	return b.String()
}
