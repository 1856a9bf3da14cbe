package rls

import "strings"

// Entry is one key and value of a request descriptor.
type Entry struct{ Key, Value string }

// match walks a domain's tree with a descriptor's entries, one level per entry, as the
// reference's GetLimit does. At each level it takes the rule with the entry's key and
// value, else the first rule in file order whose wildcard value matches, else the rule
// with the key and no value. The descriptor matches the rule its last entry lands on,
// and nothing when the walk stops earlier or the rule path is longer: there is no
// fallback to a parent's limit. Keys and values are compared byte for byte and never
// joined, so (a_b=c) and (a=b_c) are different entries.
func (d *domain) match(entries []Entry) *rule {
	lv := &d.root
	var r *rule
	for i, e := range entries {
		r = lv.find(e)
		if r == nil {
			return nil
		}
		if i == len(entries)-1 {
			return r
		}
		if len(r.children.byKey) == 0 {
			return nil // more entries than the rule path
		}
		lv = &r.children
	}
	return nil // no entries
}

func (lv *level) find(e Entry) *rule {
	kr := lv.byKey[e.Key]
	if kr == nil {
		return nil
	}
	if e.Value != "" && len(kr.exact) > 0 {
		if r := kr.exact[e.Value]; r != nil {
			return r
		}
	}
	for _, r := range kr.wild {
		if wildcardMatch(r.value, e.Value) {
			return r
		}
	}
	return kr.bare
}

// wildcardMatch reports whether s matches pattern, in which every '*' stands for any run
// of bytes, none included; the pattern is anchored at both ends and its fixed parts must
// appear in order without overlapping. There is no escape for a literal '*'.
func wildcardMatch(pattern, s string) bool {
	star := strings.IndexByte(pattern, '*')
	if star < 0 {
		return pattern == s
	}
	prefix := pattern[:star]
	if !strings.HasPrefix(s, prefix) {
		return false
	}
	s, pattern = s[len(prefix):], pattern[star+1:]
	last := strings.LastIndexByte(pattern, '*')
	suffix := pattern[last+1:] // the whole rest when there is no other '*'
	if !strings.HasSuffix(s, suffix) {
		return false
	}
	if last < 0 {
		return true
	}
	s = s[:len(s)-len(suffix)]
	// The parts between the first and the last '*', each as early as it appears.
	for middle := pattern[:last]; middle != ""; {
		var part string
		part, middle, _ = strings.Cut(middle, "*")
		if part == "" {
			continue
		}
		i := strings.Index(s, part)
		if i < 0 {
			return false
		}
		s = s[i+len(part):]
	}
	return true
}
