package cluster

import (
	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the cluster's Prometheus metrics.
type metrics struct {
	members       prometheus.Gauge
	messages      *prometheus.CounterVec // direction
	bytes         *prometheus.CounterVec // direction
	sendErrors    prometheus.Counter
	malformed     prometheus.Counter
	keysPerFlush  prometheus.Histogram
	mergeLag      prometheus.Histogram
	stale         prometheus.Counter
	transfers     *prometheus.CounterVec // direction
	transferBytes *prometheus.CounterVec // direction
	transferCut   prometheus.Counter
	capped        prometheus.Counter
	// The owner's grants (grant.go): requests by role and result, and the hits given.
	grants      *prometheus.CounterVec // role, result
	grantedHits *prometheus.CounterVec // to
	// How long requests for room take: from the asker's send to its answer (askRTT),
	// and to the owner's reading of it (askLag), on the senders' clocks.
	askRTT, askLag prometheus.Histogram
	// What this node's own protocol hands to memberlist (send): messages and payload
	// bytes by kind; the rest of the sent traffic is memberlist's probes and gossip.
	kindMsgs, kindBytes *prometheus.CounterVec // kind
	// The directions of messages and bytes, resolved once: every packet counts them.
	msgSent, msgRecv, bytesSent, bytesRecv prometheus.Counter
}

func newMetrics(reg prometheus.Registerer, newestAge func() float64) *metrics {
	m := &metrics{
		members: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "converger_cluster_members", Help: "Live members of the cluster, this node included."}),
		messages: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "converger_cluster_sync_messages_total", Help: "Cluster messages by direction (sent, received): every UDP packet (sync, live view, memberlist's probes and gossip) and every TCP stream (state transfers)."}, []string{"direction"}),
		bytes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "converger_cluster_sync_bytes_total", Help: "Bytes of all cluster traffic by direction (sent, received), as they go on the network: UDP packets and TCP streams."}, []string{"direction"}),
		sendErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "converger_cluster_send_errors_total", Help: "Sync messages that could not be sent."}),
		malformed: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "converger_cluster_malformed_messages_total", Help: "Received cluster messages that could not be decoded."}),
		keysPerFlush: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "converger_cluster_keys_per_flush", Help: "Counters sent per sync interval.",
			Buckets: prometheus.ExponentialBuckets(1, 4, 10)}),
		mergeLag: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "converger_cluster_merge_lag_seconds", Help: "Age of received sync messages when merged (sender's clock to ours).",
			Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5}}),
		stale: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "converger_cluster_stale_values_dropped_total", Help: "Received values for windows that had already ended here."}),
		transfers: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "converger_cluster_state_transfers_total", Help: "State transfers (join and push/pull) by direction and kind."}, []string{"direction", "kind"}),
		transferBytes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "converger_cluster_state_transfer_bytes_total", Help: "Bytes of state transfers by direction."}, []string{"direction"}),
		transferCut: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "converger_cluster_state_transfer_truncated_total", Help: "State transfers cut at the size limit (the rest follows by sync)."}),
		capped: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "converger_cluster_share_mode_caps_total", Help: "Times share mode bounded a counter's share for one interval."}),
		grants: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "converger_cluster_share_grants_total",
			Help: "Requests for room of a key refused by share mode's bound below the limit. role=asked (this node asked the key's owner): result sent, granted, zero (nothing left), timed_out (no answer in time: the check was refused, unless took_part or the answer came before it gave up), took_part (timed out far below the limit: the node took a member's part of the free room), late (answered after the wait), late_applied (of those late, the ones whose grant still raised the bound: the answer came before the node's next value; it decided the check that asked if that check still waited); role=answered_other or answered_self (this node owns the key): result granted or zero."},
			[]string{"role", "result"}),
		grantedHits: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "converger_cluster_share_granted_hits_total",
			Help: "Hits this node, as the owner of keys, granted from the part of their limits nobody held, to another node (to=other) or to itself (to=self)."},
			[]string{"to"}),
		askRTT: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "converger_cluster_share_ask_seconds",
			Help:    "Time from this node's request for room to the owner's answer, answered in time or late (see converger_cluster_share_grants_total).",
			Buckets: askBuckets}),
		askLag: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "converger_cluster_share_ask_lag_seconds",
			Help:    "Age of another node's request for room when this node, as the key's owner, reads it (the asker's clock to ours): the way in of converger_cluster_share_ask_seconds.",
			Buckets: askBuckets}),
		kindMsgs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "converger_cluster_sent_by_kind_messages_total",
			Help: "Messages of this node's own protocol handed to the transport, by kind: values (counter values), view (the live view's minute counts), ask and answer (the owner's grants, one to a packet), bundle (asks or answers together in one packet), summary (a key owner's counts and bounds for a member), relay (counts relayed to a key's new owner) and busy (a node's busiest keys, with its live view's minute counts). What converger_cluster_sync_messages_total{direction=\"sent\"} has beyond their sum is memberlist's (probes, gossip, push/pull) and the state transfers."},
			[]string{"kind"}),
		kindBytes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "converger_cluster_sent_by_kind_bytes_total",
			Help: "Payload bytes of this node's own protocol handed to the transport, by kind (as converger_cluster_sent_by_kind_messages_total), before memberlist's framing and encryption."},
			[]string{"kind"}),
	}
	m.msgSent, m.msgRecv = m.messages.WithLabelValues("sent"), m.messages.WithLabelValues("received")
	m.bytesSent, m.bytesRecv = m.bytes.WithLabelValues("sent"), m.bytes.WithLabelValues("received")
	// Every series of the grants at 0 from the start, so that a rate of timed-out
	// requests (an alert) has a series before the first one.
	for _, r := range []string{"sent", "granted", "zero", "timed_out", "took_part", "late", "late_applied"} {
		m.grants.WithLabelValues("asked", r)
	}
	for _, role := range []string{"answered_other", "answered_self"} {
		m.grants.WithLabelValues(role, "granted")
		m.grants.WithLabelValues(role, "zero")
	}
	m.grantedHits.WithLabelValues("other")
	m.grantedHits.WithLabelValues("self")
	for _, k := range sendKinds {
		m.kindMsgs.WithLabelValues(k)
		m.kindBytes.WithLabelValues(k)
	}
	reg.MustRegister(m.members, m.messages, m.bytes, m.sendErrors, m.malformed, m.keysPerFlush, m.mergeLag,
		m.stale, m.transfers, m.transferBytes, m.transferCut, m.capped, m.grants, m.grantedHits, m.askRTT, m.askLag, m.kindMsgs, m.kindBytes,
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "converger_cluster_newest_remote_value_age_seconds",
			Help: "Age of the newest value received from another node (merge lag); -1 before the first."}, newestAge))
	return m
}

// askBuckets are the bounds of the requests' histograms: around the grants' wait (100 ms by
// default) and a sync interval.
var askBuckets = []float64{.001, .0025, .005, .01, .015, .02, .025, .05, .1, .25, 1}

// The kinds of message this node's own protocol sends.
const (
	kindValues  = "values"
	kindView    = "view"
	kindAsk     = "ask"
	kindAnswer  = "answer"
	kindSummary = "summary"
	kindRelay   = "relay"
	kindBusy    = "busy"
	kindBundle  = "bundle"
	// kindHandover is sent over TCP (handover.go).
	kindHandover = "handover"
)

var sendKinds = []string{kindValues, kindView, kindAsk, kindAnswer, kindSummary, kindRelay, kindBusy, kindBundle, kindHandover}
