// Package clusterload is the cluster accuracy test: it starts clusters of sidecars on
// loopback, drives one key from every node at a paced rate over the limit, and reports
// how much each window allowed against the limit, and the sync traffic, per sync interval.
package clusterload

import (
	"errors"
	"flag"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// The aims for share mode.
const (
	// AimNodes and AimSyncMS are the configuration of the first aim: with 3 nodes and a
	// 100 ms sync, each window allows at most AimMaxAllowed × the limit at every offered
	// load of the share-mode scenario (Config.Loads, spread evenly) and in its
	// window-start burst (Config.Burst).
	AimNodes      = 3
	AimSyncMS     = 100
	AimMaxAllowed = 1.05
	// AimSingleMin is the second aim: a node that is the only one with traffic gets its
	// full limit in every window. The tolerance covers the checks sent within a moment of
	// a window's end that the sidecar counts in the next window (send time assigns them).
	AimSingleMin = 0.995
)

// Config is the test's configuration, one field per flag.
type Config struct {
	Sidecar   string
	Nodes     []int  // cluster sizes
	Intervals []int  // RATE_LIMIT_SYNC_INTERVAL_MS values
	Modes     []bool // RATE_LIMIT_SHARE_MODE values
	Limit     int    // L: the limit of the key per window
	Window    time.Duration
	Offered   float64 // checks offered per window in total, as a multiple of Limit
	// Loads and Burst are the share-mode scenario, on AimNodes nodes syncing every
	// AimSyncMS, in each of Modes: one key offered each of Loads × Limit per window,
	// spread evenly; then Burst × Limit per window (0: none) sent at each window's start,
	// each node its part as fast as it can.
	Loads   []float64
	Burst   float64
	Windows int // measured windows per configuration
	Warmup  int // windows sent but not measured, before the measured ones
	// Repeat starts each configuration of more than one node this many times: a node's
	// flushes keep their phase in the window for the life of the process, so the windows
	// of one start are alike and only fresh starts sample other phases.
	Repeat int
	// Keys and TrafficSyncMS are the traffic scenario: the same check rate over this many
	// distinct keys, on a cluster of 3 in share mode syncing every TrafficSyncMS.
	Keys          []int
	TrafficSyncMS int
	Out           string // markdown report; "" writes none
	Plot          string // PNG plot; "" draws none
	Quick         bool
	Strict        bool // exit 1 when an aim is missed
	// Exact, when On, runs only the exactness scenarios (exact.go).
	Exact ExactConfig

	// Args are the command-line arguments the configuration came from, for the report's
	// command that reproduces the run.
	Args []string
}

// DefaultConfig returns the defaults of the flags.
func DefaultConfig() Config {
	return Config{
		Sidecar:       "bin/sidecar",
		Nodes:         []int{1, 3, 5},
		Intervals:     []int{10, 25, 50, 100, 250, 500},
		Modes:         []bool{false, true},
		Limit:         300,
		Window:        time.Second,
		Offered:       3,
		Loads:         []float64{1.5, 3, 8, 10},
		Burst:         3,
		Windows:       5,
		Warmup:        1,
		Repeat:        3,
		Keys:          []int{1, 100, 1000},
		TrafficSyncMS: 100,
		Out:           "bench/results/cluster-sync.md",
		Plot:          "bench/results/cluster-sync.png",
	}
}

// ApplyQuick sets the -quick preset on the flags not given on the command line (set
// names those that were): 3 nodes, sync every 25, 100 and 500 ms, one start of 3
// measured windows each, keys 1 and 1000, loads 1.5× and 10× and the burst, and no
// files written.
func (c *Config) ApplyQuick(set map[string]bool) {
	if !c.Quick {
		return
	}
	if !set["n"] {
		c.Nodes = []int{3}
	}
	if !set["intervals"] {
		c.Intervals = []int{25, 100, 500}
	}
	if !set["windows"] {
		c.Windows = 3
	}
	if !set["repeat"] {
		c.Repeat = 1
	}
	if !set["keys"] {
		c.Keys = []int{1, 1000}
	}
	if !set["loads"] {
		c.Loads = []float64{1.5, 10}
	}
	if !set["out"] {
		c.Out = ""
	}
	if !set["plot"] {
		c.Plot = ""
	}
}

// RegisterFlags defines the flags of `bench cluster` on fs, with c's values as defaults.
func (c *Config) RegisterFlags(fs *flag.FlagSet) {
	fs.StringVar(&c.Sidecar, "sidecar", c.Sidecar, "sidecar binary (relative paths: from the repository root, else the working directory)")
	fs.Var((*intList)(&c.Nodes), "n", "cluster sizes, comma-separated")
	fs.Var((*intList)(&c.Intervals), "intervals", "sync intervals in ms (RATE_LIMIT_SYNC_INTERVAL_MS), comma-separated")
	fs.Var((*modeList)(&c.Modes), "modes", "share modes (RATE_LIMIT_SHARE_MODE): off, on, or off,on")
	fs.IntVar(&c.Limit, "limit", c.Limit, "limit L of the key per window")
	fs.DurationVar(&c.Window, "window", c.Window, "window of the limit (whole milliseconds)")
	fs.Float64Var(&c.Offered, "offered", c.Offered, "checks offered per window in total, as a multiple of the limit, spread evenly over the nodes")
	fs.Var((*floatList)(&c.Loads), "loads", "share-mode scenario: offered loads, multiples of the limit spread evenly, comma-separated (3 nodes, sync 100 ms, each of -modes)")
	fs.Float64Var(&c.Burst, "burst", c.Burst, "share-mode scenario: checks sent at each window's start, as a multiple of the limit split over the nodes (0: no burst)")
	fs.IntVar(&c.Windows, "windows", c.Windows, "measured windows per configuration")
	fs.IntVar(&c.Warmup, "warmup", c.Warmup, "windows of load before the measured ones, not measured")
	fs.IntVar(&c.Repeat, "repeat", c.Repeat, "fresh cluster starts per configuration of more than one node, their windows pooled (each start has its own flush phase in the window)")
	fs.Var((*intList)(&c.Keys), "keys", "traffic scenario: numbers of distinct keys the same check rate is spread over, comma-separated")
	fs.IntVar(&c.TrafficSyncMS, "traffic-interval", c.TrafficSyncMS, "traffic and single-node scenarios: sync interval in ms (3 nodes, share mode on)")
	fs.StringVar(&c.Out, "out", c.Out, "markdown report (relative paths: from the repository root); empty: none")
	fs.StringVar(&c.Plot, "plot", c.Plot, "PNG plot (relative paths: from the repository root); empty: none")
	fs.BoolVar(&c.Quick, "quick", c.Quick, "fast check: -n 3 -intervals 25,100,500 -windows 3 -keys 1,1000 -loads 1.5,10, no files written (flags given explicitly win)")
	fs.BoolVar(&c.Strict, "strict", c.Strict, "exit 1 when a share-mode aim is missed")
	c.Exact.register(fs)
}

// Limits of the test, so that a run stays bounded.
const (
	maxNodes   = 9
	maxRate    = 20_000 // checks per second, all nodes together
	maxRunTime = 2 * time.Hour
	// startCost is a rough cost of starting and stopping a cluster, for the estimate.
	startCost = 1500 * time.Millisecond
)

// Validate refuses values the test cannot run with.
func (c Config) Validate() error {
	var errs []error
	check := func(ok bool, format string, args ...any) {
		if !ok {
			errs = append(errs, fmt.Errorf(format, args...))
		}
	}
	check(c.Sidecar != "", "-sidecar: required")
	check(len(c.Nodes) > 0, "-n: at least one cluster size")
	for _, n := range c.Nodes {
		check(n >= 1 && n <= maxNodes, "-n %d: must be from 1 to %d", n, maxNodes)
	}
	check(len(c.Intervals) > 0, "-intervals: at least one")
	for _, i := range c.Intervals {
		check(i >= 1 && i <= 60_000, "-intervals %d: must be from 1 to 60000 ms", i)
	}
	check(len(c.Modes) > 0, "-modes: off, on or off,on")
	check(c.Limit >= 1 && c.Limit <= 1_000_000, "-limit %d: must be from 1 to 1000000", c.Limit)
	check(c.Window >= 100*time.Millisecond && c.Window <= time.Minute && c.Window%time.Millisecond == 0,
		"-window %v: must be whole milliseconds from 100ms to 1m", c.Window)
	check(c.Offered > 0 && c.Offered <= 20, "-offered %g: must be above 0 and at most 20", c.Offered)
	for _, o := range c.Loads {
		check(o > 0 && o <= 20, "-loads %g: must be above 0 and at most 20", o)
	}
	check(c.Burst >= 0 && c.Burst <= 20, "-burst %g: must be from 0 to 20", c.Burst)
	check(c.Windows >= 1 && c.Windows <= 100, "-windows %d: must be from 1 to 100", c.Windows)
	check(c.Warmup >= 0 && c.Warmup <= 10, "-warmup %d: must be from 0 to 10", c.Warmup)
	check(c.Repeat >= 1 && c.Repeat <= 20, "-repeat %d: must be from 1 to 20", c.Repeat)
	for _, k := range c.Keys {
		check(k >= 1 && k <= 100_000, "-keys %d: must be from 1 to 100000", k)
	}
	check(c.TrafficSyncMS >= 1 && c.TrafficSyncMS <= 60_000, "-traffic-interval %d: must be from 1 to 60000 ms", c.TrafficSyncMS)
	if c.Window > 0 {
		if rate := c.maxOffered() * float64(c.Limit) / c.Window.Seconds(); rate > maxRate {
			errs = append(errs, fmt.Errorf("the highest of -offered, -loads and -burst × -limit / -window = %.0f checks/s: at most %d, the load generator shares the machine with the sidecars", rate, maxRate))
		}
		if d := c.Estimate(); d > maxRunTime {
			errs = append(errs, fmt.Errorf("the run would take about %v: at most %v; use fewer sizes, intervals, modes or windows", d.Round(time.Minute), maxRunTime))
		}
	}
	return errors.Join(errs...)
}

// maxOffered is the most checks per window any load offers, × the limit.
func (c Config) maxOffered() float64 {
	m := max(c.Offered, c.Burst)
	for _, o := range c.Loads {
		m = max(m, o)
	}
	return m
}

// sweepLoads is the number of loads in the share-mode scenario: Loads and the burst.
func (c Config) sweepLoads() int {
	n := len(c.Loads)
	if c.Burst > 0 {
		n++
	}
	return n
}

// Runs returns the number of cluster starts for the grid (a configuration of one node
// is started once: it has no flush phase to sample), of loads in the scenarios, which
// share one cluster, and of cluster starts for the share-mode scenario (one per mode
// and repeat, each running all its loads).
func (c Config) Runs() (grid, scenarios, sweep int) {
	for _, n := range c.Nodes {
		starts := c.Repeat
		if n == 1 {
			starts = 1
		}
		grid += starts * len(c.Intervals) * len(c.Modes)
	}
	if c.sweepLoads() > 0 {
		sweep = len(c.Modes) * c.Repeat
	}
	return grid, 2 + len(c.Keys), sweep
}

// Estimate returns about how long the run takes.
func (c Config) Estimate() time.Duration {
	grid, scen, sweep := c.Runs()
	perLoad := time.Duration(c.Warmup+c.Windows)*c.Window + c.Window/2
	return time.Duration(grid+1)*(startCost+perLoad) + time.Duration(scen)*perLoad +
		time.Duration(sweep)*(startCost+time.Duration(c.sweepLoads())*perLoad)
}

// intList is a flag of comma-separated positive integers.
type intList []int

func (l *intList) String() string {
	if l == nil {
		return ""
	}
	s := make([]string, len(*l))
	for i, v := range *l {
		s[i] = strconv.Itoa(v)
	}
	return strings.Join(s, ",")
}

func (l *intList) Set(v string) error {
	var out []int
	for f := range strings.SplitSeq(v, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil {
			return fmt.Errorf("%q is not a whole number", f)
		}
		out = append(out, n)
	}
	*l = out
	return nil
}

// floatList is a flag of comma-separated numbers.
type floatList []float64

func (l *floatList) String() string {
	if l == nil {
		return ""
	}
	s := make([]string, len(*l))
	for i, v := range *l {
		s[i] = strconv.FormatFloat(v, 'g', -1, 64)
	}
	return strings.Join(s, ",")
}

func (l *floatList) Set(v string) error {
	var out []float64
	for f := range strings.SplitSeq(v, ",") {
		if strings.TrimSpace(f) == "" {
			continue
		}
		n, err := strconv.ParseFloat(strings.TrimSpace(f), 64)
		if err != nil {
			return fmt.Errorf("%q is not a number", f)
		}
		out = append(out, n)
	}
	*l = out
	return nil
}

// modeList is a flag of share modes: off, on, or both.
type modeList []bool

func (l *modeList) String() string {
	if l == nil {
		return ""
	}
	s := make([]string, len(*l))
	for i, v := range *l {
		s[i] = modeName(v)
	}
	return strings.Join(s, ",")
}

func (l *modeList) Set(v string) error {
	var out []bool
	for f := range strings.SplitSeq(v, ",") {
		switch strings.TrimSpace(f) {
		case "off", "false":
			out = append(out, false)
		case "on", "true":
			out = append(out, true)
		default:
			return fmt.Errorf("%q: must be off or on", f)
		}
	}
	*l = out
	return nil
}

func modeName(share bool) string {
	if share {
		return "on"
	}
	return "off"
}
