package rls

import (
	"errors"
	"fmt"
	"math"
	"sync/atomic"
	"time"

	"google.golang.org/protobuf/types/known/structpb"

	"github.com/converger/edge/sidecar/limiter"
)

// A request and its decision, independent of the protos: rlsapi converts
// RateLimitRequest and RateLimitResponse to and from these.

// Request is a ShouldRateLimit request.
type Request struct {
	Domain      string
	Descriptors []Descriptor
	// Hits is hits_addend: what every descriptor without its own counts; 0 means 1.
	Hits uint32
	// ExtraDescriptors counts descriptors a decoder saw past MaxDescriptors+1 and did not
	// keep: the request is refused for its count, which includes them.
	ExtraDescriptors int
	// DecideBy, when not zero, is when the decision is due (limiter.DecideBy): a wait
	// for a counter's owner ends by then.
	DecideBy time.Time
}

// Descriptor is one descriptor of a request.
type Descriptor struct {
	Entries []Entry
	// Override is the descriptor's own limit (limit), when HasOverride.
	HasOverride bool
	Override    Override
	// Hits is the descriptor's hits_addend, when HasHits: 0 checks without counting.
	HasHits bool
	Hits    uint64
	// Refund (is_negative_hits) gives the hits back, on a rule with allow_refunds.
	Refund bool
	// ExtraEntries counts entries a decoder saw past MaxEntries+1 and did not keep, as
	// Request.ExtraDescriptors.
	ExtraEntries int
}

// Override is a descriptor's RateLimitOverride.
type Override struct {
	PerUnit    uint32
	Unit       Unit
	Multiplier uint32 // 0 or 1: one unit
}

// Response is a decision: the overall code and one status per descriptor, in order.
type Response struct {
	Code     Code
	Statuses []Status
	// Header is the index of the status that the RateLimit-Limit, -Remaining and -Reset
	// response headers describe, -1 for none (always with the headers off); HeaderNames
	// are their names.
	Header      int
	HeaderNames *HeaderNames
	// Metadata is set when the answer carries dynamic metadata
	// (RLS_RESPONSE_DYNAMIC_METADATA): see PassedMetadata.
	Metadata bool

	// Scratch space, kept between the decisions a Response is reused for.
	work    []work
	ids     []byte
	pending []pending
}

// Status is a DescriptorStatus.
type Status struct {
	Code Code
	// Limit is the current_limit, when HasLimit.
	HasLimit bool
	Limit    CurrentLimit
	// Remaining is limit_remaining.
	Remaining uint32
	// Reset is duration_until_reset in whole seconds, sent when HasLimit.
	Reset int64
}

// CurrentLimit is a status's current_limit.
type CurrentLimit struct {
	PerUnit uint32
	Unit    Unit
	// Multiplier is sent as unit_multiplier when it is not 0; it is 0 for a limit of one
	// unit, so that answers to files without unit_multiplier are the reference's.
	Multiplier uint32
	Name       string
}

// Bounds of a request.
const (
	MaxDescriptors = 256
	MaxEntries     = 64
)

// The errors of a request, answered as the reference words them.
var (
	ErrNoDomain      = &RequestError{"rate limit domain must not be empty"}
	ErrNoDescriptors = &RequestError{"rate limit descriptor list must not be empty"}
)

// RequestError is a request the service refuses (gRPC InvalidArgument, HTTP 400).
type RequestError struct{ msg string }

func (e *RequestError) Error() string { return e.msg }

// IsRequestError reports whether err is the client's mistake.
func IsRequestError(err error) bool {
	var re *RequestError
	return errors.As(err, &re)
}

// HeaderNames are the names of the response headers: limit, remaining, reset.
type HeaderNames [3]string

// DefaultHeaderNames are the reference's default names.
var DefaultHeaderNames = HeaderNames{"RateLimit-Limit", "RateLimit-Remaining", "RateLimit-Reset"}

// ErrNoRules answers every request of a service that must wait for its first rules (from
// an xDS server) before it has them, as the reference words it. It is not the client's
// mistake: gRPC Unavailable, HTTP 503.
var ErrNoRules = errors.New("no rate limit configuration loaded")

// Options configure a Service.
type Options struct {
	// QuotaMode (RLS_QUOTA_MODE, the reference's QUOTA_MODE) puts every descriptor that is
	// not unlimited in quota mode: the request is over only when all of them are.
	QuotaMode bool
	// HeaderNames name the response headers; the reference's defaults when empty
	// (RLS_LIMIT_HEADER, RLS_REMAINING_HEADER, RLS_RESET_HEADER).
	HeaderNames HeaderNames
	// DynamicMetadata (RLS_RESPONSE_DYNAMIC_METADATA) marks every answer as carrying the
	// reference's dynamic metadata.
	DynamicMetadata bool
	// WaitForRules answers ErrNoRules until SetRules is first called (rules from an xDS
	// server), instead of OK for every request.
	WaitForRules bool
	// ShadowMode (RLS_SHADOW_MODE) counts and decides everything but answers OK overall.
	ShadowMode bool
	// ResponseHeaders (RLS_RESPONSE_HEADERS) chooses the status of the RateLimit-*
	// headers.
	ResponseHeaders bool
	// Metrics, when not nil, count every decision and load.
	Metrics *Metrics
}

// Bucket is the limiter's bucket of the service's counters. Refunds of rules with
// allow_refunds are the limiter's (Limiter.Refund): a counter of their own in
// Bucket+limiter.RefundSuffix, counted up, never down, so that it replicates as a
// G-counter; a rule's count is its hits less its refunds.
const Bucket = "rls"

// Service decides ShouldRateLimit requests over the current rules.
type Service struct {
	lim   *limiter.Limiter
	hits  limiter.BucketID
	opts  Options
	rules atomic.Pointer[Rules]
}

// New returns a service over lim with rules (nil: none, every request is OK).
func New(lim *limiter.Limiter, rules *Rules, o Options) *Service {
	s := &Service{lim: lim, hits: lim.Bucket(Bucket), opts: o}
	for i, n := range s.opts.HeaderNames {
		if n == "" {
			s.opts.HeaderNames[i] = DefaultHeaderNames[i]
		}
	}
	if rules != nil {
		s.SetRules(rules)
	}
	return s
}

// SetRules puts r in use for the requests that begin after it returns. Counters are not
// touched: they belong to requests, not rules, so a raised limit keeps the hits already
// counted in the window.
func (s *Service) SetRules(r *Rules) {
	if s.opts.Metrics != nil {
		s.opts.Metrics.bind(r)
	}
	s.rules.Store(r)
}

// Rules returns the rules in use, nil when there are none.
func (s *Service) Rules() *Rules { return s.rules.Load() }

// Loaded counts a load of the rule directory in the metrics.
func (s *Service) Loaded(ok bool) { s.opts.Metrics.loaded(ok, time.Now()) }

// Metrics returns the metrics, nil when there are none.
func (s *Service) Metrics() *Metrics { return s.opts.Metrics }

// work is what the decision knows of one descriptor between its steps.
type work struct {
	rule     *rule
	override bool
	hits     uint32
	refund   bool
	dropped  uint32 // bit j: limit j dropped by replaces
	quota    bool   // in quota mode, with a limit in play
}

// pending is a limit of a rule with count_denied false, counted only if the request is
// allowed.
type pending struct {
	desc  int
	lim   limiter.Limit
	id    [2]int      // the id in Response.ids
	count uint32      // the rule's count, less its refunds, before the request
	ls    limitStatus // as decided on the count before the request
}

func (r *Response) reset(n int) {
	r.Code, r.Header = OK, -1
	if cap(r.Statuses) < n {
		r.Statuses = make([]Status, n)
		r.work = make([]work, n)
	}
	r.Statuses, r.work = r.Statuses[:n], r.work[:n]
	clear(r.Statuses)
	clear(r.work)
	r.ids, r.pending = r.ids[:0], r.pending[:0]
}

// Decide answers a request into resp, which may be reused for the next one (its
// statuses are then overwritten). It does what the reference's ShouldRateLimit does:
// match every descriptor; drop the rules that a matched rule replaces; count each
// remaining limit in its window and give each descriptor its status; decide overall (any
// descriptor over, or every one in quota mode over; OK in global shadow mode); and
// choose the status the response headers describe.
func (s *Service) Decide(req *Request, resp *Response) error {
	if err := check(req); err != nil {
		return err
	}
	var d *domain
	rules := s.rules.Load()
	if rules != nil {
		d = rules.domains[req.Domain]
	} else if s.opts.WaitForRules {
		return ErrNoRules
	}
	resp.reset(len(req.Descriptors))
	resp.Metadata = s.opts.DynamicMetadata
	replacing := false
	for i := range req.Descriptors {
		desc, w := &req.Descriptors[i], &resp.work[i]
		w.hits = hitsOf(desc, req.Hits)
		w.refund = desc.Refund
		switch {
		case d == nil: // an unknown domain: every descriptor is OK, overrides too
		case desc.HasOverride:
			w.override = true
		default:
			w.rule = d.match(desc.Entries)
			replacing = replacing || (w.rule != nil && len(w.rule.replaces) > 0)
		}
	}
	if replacing {
		dropReplaced(resp.work)
	}
	for i := range req.Descriptors {
		s.count(d, req, i, resp)
	}
	if s.opts.QuotaMode {
		globalQuota(resp)
	}
	over := overall(resp)
	if len(resp.pending) > 0 {
		s.settle(req, resp, over)
		if s.opts.QuotaMode {
			globalQuota(resp)
		}
		over = overall(resp)
	}
	if over {
		resp.Code = OverLimit
		if s.opts.ShadowMode {
			resp.Code = OK
			if m := s.opts.Metrics; m != nil {
				m.globalShadow.Inc()
			}
		}
	}
	if s.opts.ResponseHeaders {
		resp.Header = headerStatus(resp)
		resp.HeaderNames = &s.opts.HeaderNames
	}
	return nil
}

// PassedMetadata returns the metadata of the rule that descriptor i passed, nil when
// none: as the reference, the metadata of a rule that matched with a limit in play
// (not unlimited, not replaced, not a limit override) and whose status is not
// OVER_LIMIT (a rule in shadow mode reports OK, so passes).
func (r *Response) PassedMetadata(i int) *structpb.Struct {
	w, st := &r.work[i], &r.Statuses[i]
	if w.rule == nil || w.override || !st.HasLimit || st.Code == OverLimit {
		return nil
	}
	return w.rule.metadata
}

// check refuses what the reference refuses, and what it would crash on or could not
// bound: an override without a valid unit, more descriptors or entries than the bounds.
func check(req *Request) error {
	if req.Domain == "" {
		return ErrNoDomain
	}
	if len(req.Descriptors) == 0 {
		return ErrNoDescriptors
	}
	if n := len(req.Descriptors) + req.ExtraDescriptors; n > MaxDescriptors {
		return &RequestError{fmt.Sprintf("at most %d descriptors per request, not %d", MaxDescriptors, n)}
	}
	for i := range req.Descriptors {
		desc := &req.Descriptors[i]
		if n := len(desc.Entries) + desc.ExtraEntries; n > MaxEntries {
			return &RequestError{fmt.Sprintf("descriptor %d: at most %d entries, not %d", i, MaxEntries, n)}
		}
		if desc.HasOverride {
			o := desc.Override
			if o.Unit.Seconds() == 0 {
				return &RequestError{fmt.Sprintf("descriptor %d: the limit override has no valid unit (%d)", i, o.Unit)}
			}
			if int64(max(o.Multiplier, 1))*o.Unit.Seconds() > int64(MaxWindow/time.Second) {
				return &RequestError{fmt.Sprintf("descriptor %d: the limit override's window of %d units is longer than %v", i, o.Multiplier, MaxWindow)}
			}
		}
	}
	return nil
}

// hitsOf is a descriptor's addend: its own hits_addend (0 too), else the request's, else 1.
func hitsOf(desc *Descriptor, reqHits uint32) uint32 {
	switch {
	case desc.HasHits:
		return uint32(min(desc.Hits, math.MaxUint32))
	case reqHits == 0:
		return 1
	}
	return reqHits
}

// dropReplaced drops, from every matched rule, the limits whose name a matched rule of
// the same request replaces (an unlimited rule's replaces too), whatever the order of
// the descriptors.
func dropReplaced(ws []work) {
	for i := range ws {
		r := ws[i].rule
		if r == nil {
			continue
		}
		for j, l := range r.limits {
			if l.Name == "" {
				continue
			}
			for k := range ws {
				if ws[k].rule != nil && contains(ws[k].rule.replaces, l.Name) {
					ws[i].dropped |= 1 << j
					break
				}
			}
		}
	}
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// limitStatus is one limit's outcome for a descriptor.
type limitStatus struct {
	over      bool
	remaining uint32
	reset     int64
	lim       *Limit
}

// count counts descriptor i's limits and writes its status.
func (s *Service) count(d *domain, req *Request, i int, resp *Response) {
	st, w, desc := &resp.Statuses[i], &resp.work[i], &req.Descriptors[i]
	*st = Status{Code: OK}
	switch {
	case w.override:
		o := desc.Override
		mult := max(o.Multiplier, 1)
		secs := o.Unit.Seconds() * int64(mult)
		hits := w.hits
		if w.refund {
			hits = 0 // no rule allows refunds here: checked, not counted
		}
		lim := limiter.Limit{Count: o.PerUnit, Window: time.Duration(secs) * time.Second}
		id := s.id(resp, req.Domain, desc.Entries, nil, secs)
		ls := s.plain(s.key(s.hits, resp, id), hits, lim, d.override, false, req.DecideBy)
		st.HasLimit, st.Limit = true, CurrentLimit{PerUnit: o.PerUnit, Unit: o.Unit}
		if o.Multiplier > 1 {
			st.Limit.Multiplier = o.Multiplier
		}
		st.Remaining, st.Reset = ls.remaining, ls.reset
		if ls.over {
			st.Code = OverLimit
		}
		return
	case w.rule == nil:
		return
	case w.rule.unlimited:
		st.Remaining = math.MaxUint32
		return
	}
	var outs [maxLimitsEach]limitStatus
	n := 0
	for j, l := range w.rule.limits {
		if w.dropped&(1<<j) == 0 {
			outs[n] = s.limit(resp, req, i, l)
			n++
		}
	}
	setStatus(st, w, w.rule, outs[:n])
}

// setStatus writes a descriptor's status from its limits' outcomes: the first limit over,
// else the one with the least left. A rule in shadow mode reports OK when over. With no
// outcome (every limit replaced) the status is as if nothing matched.
func setStatus(st *Status, w *work, r *rule, outs []limitStatus) {
	*st = Status{Code: OK}
	w.quota = false
	if len(outs) == 0 {
		return
	}
	best := outs[0]
	for _, ls := range outs[1:] {
		if (ls.over && !best.over) || (!best.over && !ls.over && ls.remaining < best.remaining) {
			best = ls
		}
	}
	w.quota = r.quota
	l := best.lim
	st.HasLimit = true
	st.Limit = CurrentLimit{PerUnit: l.PerUnit, Unit: l.Unit, Name: l.Name}
	if l.Multiplier > 1 {
		st.Limit.Multiplier = l.Multiplier
	}
	st.Remaining, st.Reset = best.remaining, best.reset
	if best.over && !r.shadow {
		st.Code = OverLimit
	}
}

// id builds a counter id in resp.ids and returns its place there.
func (s *Service) id(resp *Response, domain string, entries []Entry, share []string, secs int64) [2]int {
	start := len(resp.ids)
	resp.ids = appendID(resp.ids, domain, entries, share, secs)
	return [2]int{start, len(resp.ids)}
}

func (s *Service) key(b limiter.BucketID, resp *Response, id [2]int) limiter.Key {
	return limiter.Key{Bucket: b, ID: bytesString(resp.ids[id[0]:id[1]])}
}

// plain counts hits on a counter as the reference does: added first, then over iff the
// count is past the limit (denied hits count too). No hits: decided without counting.
// A wait for the counter's owner ends by by (zero: none).
func (s *Service) plain(k limiter.Key, hits uint32, lim limiter.Limit, st *stats, shadow bool, by time.Time) limitStatus {
	if hits == 0 {
		res := s.lim.Peek(k, lim)
		return outcome(res.Count > lim.Count, res.Count, lim.Count, res)
	}
	res := s.lim.CheckBy(k, hits, lim, by)
	st.record(hits, uint64(res.Count), lim.Count, shadow)
	return outcome(!res.Allowed, res.Count, lim.Count, res)
}

func outcome(over bool, after, limit uint32, res limiter.Result) limitStatus {
	ls := limitStatus{over: over, reset: resetSeconds(res)}
	if !over {
		ls.remaining = limit - min(after, limit)
	}
	return ls
}

// resetSeconds is duration_until_reset: what is left of the window, in whole seconds
// rounded up (windows start on whole seconds), from 1 to the window's length.
func resetSeconds(res limiter.Result) int64 {
	return max((res.WindowEndMS-res.NowMS+999)/1000, 1)
}

// limit counts one limit of a matched rule for descriptor i.
func (s *Service) limit(resp *Response, req *Request, i int, l *Limit) limitStatus {
	w, desc := &resp.work[i], &req.Descriptors[i]
	r := l.rule
	id := s.id(resp, req.Domain, desc.Entries, r.share, l.seconds)
	lim := limiter.Limit{Count: l.PerUnit, Window: l.window}
	hitsKey := s.key(s.hits, resp, id)
	if !r.refunds && r.countDenied {
		hits := w.hits
		if w.refund {
			hits = 0 // the rule does not allow refunds: checked, not counted
		}
		ls := s.plain(hitsKey, hits, lim, l.stats, r.shadow, req.DecideBy)
		ls.lim = l
		return ls
	}
	// The rule's count is its hits less its refunds: Peek, Take and Refund deduct them;
	// Check does not, so its hits are compared with the limit plus the refunds.
	var ls limitStatus
	switch {
	case w.refund && r.refunds:
		res := s.lim.Refund(hitsKey, w.hits, lim) // never more than the count
		ls = outcome(res.Count > l.PerUnit, res.Count, l.PerUnit, res)
	case w.hits == 0 || w.refund:
		res := s.lim.Peek(hitsKey, lim)
		ls = outcome(res.Count > l.PerUnit, res.Count, l.PerUnit, res)
	case !r.countDenied:
		// Decided on the count as it is; counted in settle, only if the request is allowed.
		res := s.lim.Peek(hitsKey, lim)
		after := min(uint64(res.Count)+uint64(w.hits), math.MaxUint32)
		ls = outcome(after > uint64(l.PerUnit), uint32(after), l.PerUnit, res)
		ls.lim = l
		resp.pending = append(resp.pending, pending{desc: i, lim: lim, id: id, count: res.Count, ls: ls})
		return ls
	default: // count_denied and allow_refunds
		refunds := s.lim.Refunded(hitsKey, lim)
		res := s.lim.CheckBy(hitsKey, w.hits, limiter.Limit{Count: satAdd(l.PerUnit, refunds), Window: l.window}, req.DecideBy)
		after := res.Count - min(refunds, res.Count)
		l.stats.record(w.hits, uint64(after), l.PerUnit, r.shadow)
		ls = outcome(!res.Allowed, after, l.PerUnit, res)
	}
	ls.lim = l
	return ls
}

func satAdd(a, b uint32) uint32 {
	if a > math.MaxUint32-b {
		return math.MaxUint32
	}
	return a + b
}

// settle counts the limits of rules with count_denied false. When the request is allowed,
// each takes its hits if they are still within its limit (another request may have taken
// the last of it meanwhile: the descriptor is then over, and the request denied); when it
// is denied, they count nothing. Their descriptors' statuses are then written again.
func (s *Service) settle(req *Request, resp *Response, over bool) {
	for k := range resp.pending {
		p := &resp.pending[k]
		w := &resp.work[p.desc]
		l := p.ls.lim
		if over {
			l.stats.record(w.hits, uint64(p.count)+uint64(w.hits), l.PerUnit, l.rule.shadow)
			if !p.ls.over {
				p.ls.remaining = l.PerUnit - min(p.count, l.PerUnit) // nothing counted
			}
			continue
		}
		res := s.lim.TakeBy(s.key(s.hits, resp, p.id), w.hits, p.lim, req.DecideBy)
		if res.Allowed {
			l.stats.record(w.hits, uint64(res.Count), l.PerUnit, l.rule.shadow)
			p.ls = outcome(false, res.Count, l.PerUnit, res)
		} else {
			l.stats.record(w.hits, uint64(p.count)+uint64(w.hits), l.PerUnit, l.rule.shadow)
			p.ls = outcome(true, 0, l.PerUnit, res)
		}
		p.ls.lim = l
	}
	var outs [maxLimitsEach]limitStatus
	for k := 0; k < len(resp.pending); {
		desc, n := resp.pending[k].desc, 0
		for ; k < len(resp.pending) && resp.pending[k].desc == desc; k++ {
			outs[n] = resp.pending[k].ls
			n++
		}
		setStatus(&resp.Statuses[desc], &resp.work[desc], resp.work[desc].rule, outs[:n])
	}
}

// globalQuota puts every descriptor but the unlimited ones in quota mode, as the
// reference's QUOTA_MODE does: a descriptor that matched nothing, or was replaced, is a
// quota-mode descriptor that is not over, so a request that has one is never over.
func globalQuota(resp *Response) {
	for i := range resp.work {
		w := &resp.work[i]
		w.quota = w.override || w.rule == nil || !w.rule.unlimited
	}
}

// overall is the request's code before global shadow mode: over when a descriptor not in
// quota mode is over, or when every quota-mode descriptor is (a rule in shadow mode has
// already reported OK).
func overall(resp *Response) bool {
	quota, quotaOver := 0, 0
	for i := range resp.Statuses {
		over := resp.Statuses[i].Code == OverLimit
		switch {
		case resp.work[i].quota:
			quota++
			if over {
				quotaOver++
			}
		case over:
			return true
		}
	}
	return quota > 0 && quotaOver == quota
}

// headerStatus chooses the status the response headers describe: the last one over the
// limit (not counting quota mode), else the first with the least remaining among those
// with a limit; -1 when none has a limit.
func headerStatus(resp *Response) int {
	chosen := -1
	least := uint32(math.MaxUint32)
	for i := range resp.Statuses {
		st := &resp.Statuses[i]
		if st.HasLimit && st.Remaining < least {
			chosen, least = i, st.Remaining
		}
		if st.Code == OverLimit && !resp.work[i].quota {
			chosen, least = i, 0
		}
	}
	return chosen
}
