package rls

import (
	"math"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are the service's Prometheus metrics: per rule, the reference's statistics
// (total hits, within limit, near limit, over limit, shadow mode), labelled by domain and
// rule, never by a request's values; per request, the decisions; and the loads of the
// rule directory. A rule file's detailed_metric and value_to_metric would name series by
// request values, so they change nothing here.
type Metrics struct {
	hits, within, near, over, shadow *prometheus.CounterVec
	requests                         *prometheus.CounterVec
	ok, overLimit, failed            prometheus.Counter
	globalShadow                     prometheus.Counter
	duration                         prometheus.Histogram
	loads                            *prometheus.CounterVec
	lastLoad                         prometheus.Gauge
	rules, domains                   prometheus.Gauge

	mu    sync.Mutex
	bound map[[2]string]*stats // the label sets of the rules in use
}

// MaxRuleSeries bounds the rules that get series of their own; the others of a domain
// share the rule label "_other".
const MaxRuleSeries = 1000

// The result labels.
const (
	resultOK        = "ok"
	resultOverLimit = "over_limit"
	resultError     = "error"
)

// NearLimitRatio is the share of a limit past which hits count as near it, as the
// reference's NEAR_LIMIT_RATIO default.
const NearLimitRatio = 0.8

// NewMetrics creates the metrics and registers them on reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	rule := []string{"domain", "rule"}
	counter := func(name, help string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{Name: "converger_rls_" + name, Help: help}, rule)
	}
	m := &Metrics{
		hits:   counter("hits_total", "Hits counted by a rate limit service rule (total_hits)."),
		within: counter("within_limit_total", "Hits within a rule's limit (within_limit)."),
		near:   counter("near_limit_total", "Hits past 80% of a rule's limit, within it or as it was reached (near_limit)."),
		over:   counter("over_limit_total", "Hits over a rule's limit (over_limit)."),
		shadow: counter("shadow_mode_total", "Hits over the limit of a rule in shadow mode, answered OK (shadow_mode)."),
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "converger_rls_requests_total",
			Help: "ShouldRateLimit calls (gRPC and /json) by result: ok, over_limit, error.",
		}, []string{"result"}),
		globalShadow: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "converger_rls_global_shadow_mode_total",
			Help: "Requests over the limit answered OK because of RLS_SHADOW_MODE.",
		}),
		duration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "converger_rls_request_duration_seconds",
			Help:    "Time to decide a ShouldRateLimit call.",
			Buckets: []float64{.00001, .000025, .00005, .0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25},
		}),
		loads: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "converger_rls_config_loads_total",
			Help: "Loads of RLS_CONFIG_DIR by result: success, error (the previous rules stay).",
		}, []string{"result"}),
		lastLoad: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "converger_rls_config_last_success_timestamp_seconds",
			Help: "When the rules in use were loaded, in Unix seconds.",
		}),
		rules: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "converger_rls_config_rules",
			Help: "Descriptors of the rules in use.",
		}),
		domains: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "converger_rls_config_domains",
			Help: "Domains of the rules in use.",
		}),
		bound: map[[2]string]*stats{},
	}
	reg.MustRegister(m.hits, m.within, m.near, m.over, m.shadow, m.requests, m.globalShadow, m.duration,
		m.loads, m.lastLoad, m.rules, m.domains)
	m.ok, m.overLimit, m.failed = m.requests.WithLabelValues(resultOK), m.requests.WithLabelValues(resultOverLimit), m.requests.WithLabelValues(resultError)
	m.loads.WithLabelValues("success")
	m.loads.WithLabelValues("error")
	return m
}

// stats are one rule limit's counters, resolved once per load.
type stats struct{ hits, within, near, over, shadow prometheus.Counter }

// bind gives every limit and domain of r its counters, and deletes the series of rules
// that r no longer has. It is called before r is put to use.
func (m *Metrics) bind(r *Rules) {
	m.mu.Lock()
	defer m.mu.Unlock()
	used := map[[2]string]*stats{}
	get := func(domain, rule string) *stats {
		k := [2]string{domain, rule}
		if s := used[k]; s != nil {
			return s
		}
		s := m.bound[k]
		if s == nil {
			s = &stats{
				hits: m.hits.WithLabelValues(domain, rule), within: m.within.WithLabelValues(domain, rule),
				near: m.near.WithLabelValues(domain, rule), over: m.over.WithLabelValues(domain, rule),
				shadow: m.shadow.WithLabelValues(domain, rule),
			}
		}
		used[k] = s
		return s
	}
	series := 0
	for _, name := range r.Domains() {
		d := r.domains[name]
		d.override = get(name, "_override")
		d.root.each(func(ru *rule) {
			for _, l := range ru.limits {
				label := ru.stat
				if len(ru.limits) > 1 {
					label += "@" + strconv.FormatInt(l.seconds, 10) + "s"
				}
				if series >= MaxRuleSeries {
					label = "_other"
				} else {
					series++
				}
				l.stats = get(name, label)
			}
		})
	}
	for k := range m.bound {
		if used[k] == nil {
			for _, v := range []*prometheus.CounterVec{m.hits, m.within, m.near, m.over, m.shadow} {
				v.DeleteLabelValues(k[0], k[1])
			}
		}
	}
	m.bound = used
	descs, _ := r.Size()
	m.rules.Set(float64(descs))
	m.domains.Set(float64(len(r.domains)))
}

// each calls f for every rule below lv, depth first, in file order.
func (lv *level) each(f func(*rule)) {
	for _, r := range lv.all {
		f(r)
		r.children.each(f)
	}
}

// Observe counts one request by its result and how long it took to decide.
func (m *Metrics) Observe(over, failed bool, d time.Duration) {
	if m == nil {
		return
	}
	switch {
	case failed:
		m.failed.Inc()
	case over:
		m.overLimit.Inc()
	default:
		m.ok.Inc()
	}
	m.duration.Observe(d.Seconds())
}

func (m *Metrics) loaded(ok bool, at time.Time) {
	if m == nil {
		return
	}
	if ok {
		m.loads.WithLabelValues("success").Inc()
		m.lastLoad.Set(float64(at.UnixMilli()) / 1000)
	} else {
		m.loads.WithLabelValues("error").Inc()
	}
}

// record counts one limit's hits as the reference does: total; within the limit, or
// over it (the part past the limit) with the part between the near threshold and the
// limit as near; and shadow mode when a rule in shadow mode was over.
func (s *stats) record(hits uint32, after uint64, limit uint32, shadow bool) {
	if s == nil || hits == 0 {
		return
	}
	h := uint64(hits)
	before := after - min(h, after)
	l := uint64(limit)
	near := uint64(math.Floor(float64(float32(limit) * NearLimitRatio)))
	s.hits.Add(float64(h))
	if after > l {
		if before >= l {
			s.over.Add(float64(h))
		} else {
			s.over.Add(float64(after - l))
			s.near.Add(float64(l - max(near, before)))
		}
		if shadow {
			s.shadow.Add(float64(h))
		}
		return
	}
	s.within.Add(float64(h))
	if after > near {
		if before >= near {
			s.near.Add(float64(h))
		} else {
			s.near.Add(float64(after - near))
		}
	}
}
