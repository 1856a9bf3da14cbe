// Package clientip finds a request's client address from the proxy's source address and
// the x-forwarded-for header, trusting only the hops listed in TRUSTED_PROXIES, and
// canonicalises it into the identity that is counted: IPv4 per address (IPv4-mapped
// IPv6 as IPv4), IPv6 per prefix (CLIENT_IPV6_PREFIX, /64 by default), so that one host
// cannot spread its attempts over the 2^64 addresses of its network.
package clientip

import (
	"fmt"
	"net/netip"
	"strconv"
	"strings"
)

// maxHops bounds how many x-forwarded-for entries are walked.
const maxHops = 64

// DefaultIPv6Prefix is the prefix length IPv6 clients are counted per: a /64 is what a
// single site (one home, one VM) is usually given, so every address in it is one client.
const DefaultIPv6Prefix = 64

// MinIPv6Prefix is the shortest prefix CLIENT_IPV6_PREFIX accepts.
const MinIPv6Prefix = 32

// Resolver resolves client addresses. The zero value trusts no proxy and counts IPv6
// clients per DefaultIPv6Prefix.
type Resolver struct {
	trusted []netip.Prefix
	// v6Bits is the IPv6 prefix length of Key; 0 means DefaultIPv6Prefix.
	v6Bits int
}

// ParseIPv6Prefix reads a CLIENT_IPV6_PREFIX value: a prefix length from MinIPv6Prefix
// to 128, with or without a leading "/"; empty means DefaultIPv6Prefix.
func ParseIPv6Prefix(s string) (int, error) {
	s = strings.TrimPrefix(strings.TrimSpace(s), "/")
	if s == "" {
		return DefaultIPv6Prefix, nil
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < MinIPv6Prefix || n > 128 {
		return 0, fmt.Errorf("%q: must be a prefix length from %d to 128, such as 64", s, MinIPv6Prefix)
	}
	return n, nil
}

// SetIPv6Prefix sets the prefix length IPv6 clients are counted per (see
// ParseIPv6Prefix); it returns r.
func (r *Resolver) SetIPv6Prefix(bits int) *Resolver {
	r.v6Bits = bits
	return r
}

// IPv6Prefix returns the prefix length IPv6 clients are counted per.
func (r *Resolver) IPv6Prefix() int {
	if r == nil || r.v6Bits == 0 {
		return DefaultIPv6Prefix
	}
	return r.v6Bits
}

// Key is the counted identity of a client address: an IPv4 address as itself (an
// IPv4-mapped IPv6 address as the IPv4 one), an IPv6 address as its prefix of
// IPv6Prefix bits in canonical form ("2001:db8:1:2::/64"; the address itself at 128),
// so that every spelling of one client, and every address of one IPv6 network, shares
// one counter.
func (r *Resolver) Key(a netip.Addr) string {
	return string(r.AppendKey(make([]byte, 0, 48), a))
}

// AppendKey appends a's Key to b.
func (r *Resolver) AppendKey(b []byte, a netip.Addr) []byte {
	a = a.Unmap().WithZone("")
	if !a.Is6() {
		return a.AppendTo(b)
	}
	bits := r.IPv6Prefix()
	if bits >= 128 {
		return a.AppendTo(b)
	}
	p, _ := a.Prefix(bits)
	return p.AppendTo(b)
}

// ClientKey resolves a request's client (Resolve) and returns its Key; ok is false when
// source is not an address.
func (r *Resolver) ClientKey(source, xff string) (key string, ok bool) {
	a, ok := r.Resolve(source, xff)
	if !ok {
		return "", false
	}
	return r.Key(a), true
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

// Load reads TRUSTED_PROXIES and CLIENT_IPV6_PREFIX through getenv, the two variables
// both programs resolve and count clients with; an error names the variable.
func Load(getenv func(string) string) (*Resolver, error) {
	r, err := Parse(getenv("TRUSTED_PROXIES"))
	if err != nil {
		return nil, fmt.Errorf("TRUSTED_PROXIES: %w", err)
	}
	bits, err := ParseIPv6Prefix(getenv("CLIENT_IPV6_PREFIX"))
	if err != nil {
		return nil, fmt.Errorf("CLIENT_IPV6_PREFIX=%w", err)
	}
	return r.SetIPv6Prefix(bits), nil
}
