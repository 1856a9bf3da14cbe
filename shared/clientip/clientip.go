// Package clientip finds a request's client address from the proxy's source address and
// the x-forwarded-for header, trusting only the hops listed in TRUSTED_PROXIES.
package clientip

import (
	"fmt"
	"net/netip"
	"strings"
)

// maxHops bounds how many x-forwarded-for entries are walked.
const maxHops = 64

// Resolver resolves client addresses. The zero value trusts no proxy.
type Resolver struct {
	trusted []netip.Prefix
}

// Parse reads a TRUSTED_PROXIES value: CIDRs or single addresses, separated by commas
// or spaces. An empty value trusts no proxy.
func Parse(s string) (*Resolver, error) {
	r := &Resolver{}
	for _, f := range strings.FieldsFunc(s, func(c rune) bool { return c == ',' || c == ' ' || c == '\t' || c == '\n' }) {
		var p netip.Prefix
		var err error
		if strings.Contains(f, "/") {
			p, err = netip.ParsePrefix(f)
		} else {
			var a netip.Addr
			a, err = netip.ParseAddr(f)
			if err == nil && a.Zone() != "" {
				return nil, fmt.Errorf("%q: zones are not allowed", f)
			}
			p = netip.PrefixFrom(a, a.BitLen())
		}
		if err != nil || !p.IsValid() {
			return nil, fmt.Errorf("%q is not a CIDR or an IP address", f)
		}
		if p.Addr().Is4In6() && p.Bits() >= 96 {
			// ::ffff:10.0.0.0/104 is written as 10.0.0.0/8.
			p = netip.PrefixFrom(p.Addr().Unmap(), p.Bits()-96)
		}
		r.trusted = append(r.trusted, p.Masked())
	}
	return r, nil
}

// Trusted reports whether a is a trusted proxy. IPv4-mapped IPv6 addresses match IPv4
// ranges.
func (r *Resolver) Trusted(a netip.Addr) bool {
	a = a.Unmap()
	for _, p := range r.trusted {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// Resolve returns the client address of a request that came from source (the proxy's
// view of its peer) with the given x-forwarded-for value. When source is trusted, the
// header is walked right to left: trusted hops are skipped, the first untrusted entry is
// the client, an unparsable entry stops the walk at the last trusted hop, and when every
// hop is trusted the left-most one is the client. ok is false when source itself is not
// an address.
func (r *Resolver) Resolve(source, xff string) (client netip.Addr, ok bool) {
	last, ok := ParseHost(source)
	if !ok || !r.Trusted(last) {
		return last, ok
	}
	for hops := 0; xff != "" && hops < maxHops; hops++ {
		entry := xff
		if i := strings.LastIndexByte(xff, ','); i >= 0 {
			entry, xff = xff[i+1:], xff[:i]
		} else {
			xff = ""
		}
		a, ok := ParseHost(strings.TrimSpace(entry))
		if !ok {
			return last, true
		}
		if !r.Trusted(a) {
			return a, true
		}
		last = a
	}
	return last, true
}

// ParseHost parses an address in any of the forms proxies write: "192.0.2.1",
// "192.0.2.1:8080", "2001:db8::1", "[2001:db8::1]" and "[2001:db8::1]:8080". IPv4-mapped
// IPv6 addresses are returned as IPv4; zones are dropped.
func ParseHost(s string) (netip.Addr, bool) {
	if len(s) == 0 || len(s) > 64 {
		return netip.Addr{}, false
	}
	if s[0] == '[' {
		end := strings.IndexByte(s, ']')
		if end < 0 || (end != len(s)-1 && (s[end+1] != ':' || !isPort(s[end+2:]))) {
			return netip.Addr{}, false
		}
		s = s[1:end]
	} else if i := strings.IndexByte(s, ':'); i >= 0 && strings.Count(s, ":") == 1 {
		if !isPort(s[i+1:]) {
			return netip.Addr{}, false
		}
		s = s[:i]
	}
	a, err := netip.ParseAddr(s)
	if err != nil {
		return netip.Addr{}, false
	}
	return a.Unmap().WithZone(""), true
}

func isPort(s string) bool {
	if s == "" || len(s) > 5 {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}
