package rls

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"strings"

	"go.yaml.in/yaml/v3"
	"google.golang.org/protobuf/types/known/structpb"
)

// A rule file as written: the parser's output, before the rules of a directory are
// checked together and compiled into trees (rules.go).
type fileSpec struct {
	name        string
	domain      string
	domainLine  int
	descriptors []*descSpec
}

type descSpec struct {
	line, column int
	path         string // where it is in the file, e.g. descriptors[1].descriptors[0]
	key, value   string
	rateLimit    *limitSpec   // rate_limit; nil when absent or null
	rateLimits   []*limitSpec // rate_limits, ours: several limits on one descriptor
	hasLimits    bool         // rate_limits was written (even empty)
	children     []*descSpec
	shadow       bool
	quota        bool
	share        bool
	countDenied  bool // false: denied hits are not counted (ours)
	refunds      bool // is_negative_hits refunds hits (ours)
	metadata     *structpb.Struct
	keyLine      int
}

type limitSpec struct {
	line       int
	path       string
	unitText   string
	unit       Unit
	unitKnown  bool
	perUnit    uint32
	unlimited  bool
	name       string
	replaces   []string
	replLines  []int
	multiplier uint32 // 0: not written
	multLine   int
}

// Problem is one reason a rule file is refused: the file, where in it, and what.
type Problem struct {
	File string
	Line int    // 0 when unknown
	Key  string // the key path in the file, e.g. descriptors[0].rate_limit.unit; "" when none
	Msg  string
}

func (p Problem) Error() string {
	var b strings.Builder
	b.WriteString(p.File)
	b.WriteString(": ")
	if p.Line > 0 {
		fmt.Fprintf(&b, "line %d: ", p.Line)
	}
	if p.Key != "" {
		b.WriteString(p.Key)
		b.WriteString(": ")
	}
	b.WriteString(p.Msg)
	return b.String()
}

// Problems are every problem found in a directory of rule files.
type Problems []Problem

func (ps Problems) Error() string {
	s := make([]string, len(ps))
	for i, p := range ps {
		s[i] = p.Error()
	}
	return strings.Join(s, "\n")
}

// Bounds of what a rule file may hold.
const (
	maxDepth      = 64      // nested mappings and lists, however deep descriptors go
	maxNodes      = 1 << 20 // YAML nodes visited, aliases expanded
	maxLimitsEach = 8       // entries of one rate_limits
)

// The keys each level of a file may hold. The reference's keys, and ours (rate_limits,
// unit_multiplier, count_denied, allow_refunds), which change nothing in a file that
// does not use them.
var (
	topKeys        = keySet("domain", "descriptors")
	descriptorKeys = keySet("key", "value", "rate_limit", "rate_limits", "descriptors", "shadow_mode", "quota_mode",
		"share_threshold", "detailed_metric", "value_to_metric", "metadata", "count_denied", "allow_refunds")
	limitKeys   = keySet("unit", "requests_per_unit", "unlimited", "name", "replaces", "unit_multiplier")
	replaceKeys = keySet("name")
)

func keySet(keys ...string) map[string]bool {
	m := make(map[string]bool, len(keys))
	for _, k := range keys {
		m[k] = true
	}
	return m
}

type parser struct {
	file     string
	problems Problems
	nodes    int
}

func (p *parser) fail(line int, path, format string, args ...any) {
	p.problems = append(p.problems, Problem{File: p.file, Line: line, Key: path, Msg: fmt.Sprintf(format, args...)})
}

// parseFile reads one rule file. It reports every problem it finds rather than the
// first, with the line and the key path where it can.
func parseFile(name string, data []byte) (*fileSpec, Problems) {
	p := &parser{file: name}
	f := &fileSpec{name: name}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var doc yaml.Node
	err := dec.Decode(&doc)
	if err != nil && !errors.Is(err, io.EOF) {
		p.fail(0, "", "error loading config file: %v", err)
		return nil, p.problems
	}
	var next yaml.Node
	for {
		err := dec.Decode(&next)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			p.fail(0, "", "error loading config file: %v", err)
			return nil, p.problems
		}
		if len(next.Content) > 0 && !isNull(next.Content[0]) {
			p.fail(next.Line, "", "holds more than one YAML document; a rule file is one document with one domain")
			return nil, p.problems
		}
	}
	var top *yaml.Node
	if len(doc.Content) > 0 {
		top = p.resolve(doc.Content[0], 0)
	}
	if top != nil && !isNull(top) {
		if top.Kind != yaml.MappingNode {
			p.fail(top.Line, "", "error loading config file: cannot unmarshal %s into a mapping of domain and descriptors", describe(top))
			return nil, p.problems
		}
		for _, kv := range p.pairs(top, "", topKeys, 1) {
			switch kv.key {
			case "domain":
				f.domain, f.domainLine = p.str(kv), kv.k.Line
			case "descriptors":
				f.descriptors = p.descriptors(kv.v, "descriptors", 2)
			}
		}
	}
	if f.domain == "" && p.problems == nil {
		line := 0
		if top != nil {
			line = top.Line
		}
		p.fail(line, "domain", "config file cannot have empty domain")
	}
	// With problems, the file is still checked further (rules.go), so that one pass
	// reports every problem it has.
	return f, p.problems
}

// kv is one key and its value in a mapping.
type kv struct {
	key  string
	k, v *yaml.Node
	path string
}

// pairs returns the keys of a mapping, checked: every key a string, known at this level,
// and written once. Merge keys (<<) are expanded.
func (p *parser) pairs(n *yaml.Node, path string, known map[string]bool, depth int) []kv {
	if depth > maxDepth {
		p.fail(n.Line, path, "nested deeper than %d levels", maxDepth)
		return nil
	}
	var out []kv
	seen := map[string]int{}
	// Keys written in the mapping first, then those of its merges (<<) that it does not
	// set itself, as YAML's merge keys mean.
	var merges []*yaml.Node
	add := func(m *yaml.Node, merged bool) {
		for i := 0; i+1 < len(m.Content); i += 2 {
			k, v := p.resolve(m.Content[i], depth), p.resolve(m.Content[i+1], depth)
			if k == nil || v == nil {
				return
			}
			if k.Kind == yaml.ScalarNode && k.ShortTag() == "!!merge" {
				switch {
				case v.Kind == yaml.MappingNode:
					merges = append(merges, v)
				case v.Kind == yaml.SequenceNode:
					for _, e := range v.Content {
						if e = p.resolve(e, depth); e != nil && e.Kind == yaml.MappingNode {
							merges = append(merges, e)
						} else if e != nil {
							p.fail(e.Line, path, "a merge (<<) takes mappings, not %s", describe(e))
						}
					}
				default:
					p.fail(v.Line, path, "a merge (<<) takes a mapping, not %s", describe(v))
				}
				continue
			}
			if k.Kind != yaml.ScalarNode || k.ShortTag() != "!!str" {
				p.fail(k.Line, path, "config error, key is not of type string: %s", text(k))
				continue
			}
			name := k.Value
			kp := name
			if path != "" {
				kp = path + "." + name
			}
			if !known[name] {
				p.fail(k.Line, kp, "config error, unknown key '%s'", name)
				continue
			}
			if line, dup := seen[name]; dup {
				if !merged {
					p.fail(k.Line, kp, "key %q already set in this mapping (line %d)", name, line)
				}
				continue
			}
			seen[name] = k.Line
			out = append(out, kv{name, k, v, kp})
		}
	}
	add(n, false)
	for i := 0; i < len(merges) && i < maxDepth; i++ {
		add(merges[i], true)
	}
	return out
}

// resolve follows aliases and counts the nodes visited, so that a document of aliases
// of aliases cannot make the walk unbounded.
func (p *parser) resolve(n *yaml.Node, depth int) *yaml.Node {
	for hops := 0; n != nil && n.Kind == yaml.AliasNode; hops++ {
		if hops > maxDepth {
			p.fail(n.Line, "", "aliases nested deeper than %d", maxDepth)
			return nil
		}
		n = n.Alias
	}
	p.nodes++
	if p.nodes == maxNodes+1 {
		p.fail(0, "", "more than %d YAML nodes (aliases counted each time they are used)", maxNodes)
	}
	if p.nodes > maxNodes {
		return nil
	}
	return n
}

func isNull(n *yaml.Node) bool { return n.Kind == yaml.ScalarNode && n.ShortTag() == "!!null" }

// describe names a node's type as yaml's messages do: !!seq, !!map, !!int `5`.
func describe(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "!!map"
	case yaml.SequenceNode:
		return "!!seq"
	}
	return fmt.Sprintf("%s `%s`", n.ShortTag(), n.Value)
}

// text prints a node's value for a message: the scalar as written, or a list or
// mapping of them.
func text(n *yaml.Node) string {
	var v any
	if err := n.Decode(&v); err != nil {
		return n.Value
	}
	return fmt.Sprint(v)
}

// leaf reports a scalar the reference does not take as a leaf: it accepts strings,
// integers, booleans and null only.
func (p *parser) leaf(e kv) bool {
	switch e.v.ShortTag() {
	case "!!str", "!!int", "!!bool", "!!null", "!!timestamp":
		return true
	}
	p.fail(e.v.Line, e.path, "error checking config: %s is a %s; a value is a string, an integer or a boolean (quote it to make it a string)", e.v.Value, e.v.ShortTag())
	return false
}

// str reads a string value: a scalar's text (a number or a boolean is read as written,
// as the reference does), "" for null.
func (p *parser) str(e kv) string {
	if e.v.Kind != yaml.ScalarNode {
		p.fail(e.v.Line, e.path, "error loading config file: cannot unmarshal %s into a string", describe(e.v))
		return ""
	}
	if !p.leaf(e) || isNull(e.v) {
		return ""
	}
	return e.v.Value
}

// boolean reads a YAML 1.1 boolean (yes, on, y… are true, as for the reference).
func (p *parser) boolean(e kv) bool {
	if e.v.Kind != yaml.ScalarNode {
		p.fail(e.v.Line, e.path, "error loading config file: cannot unmarshal %s into a boolean", describe(e.v))
		return false
	}
	if !p.leaf(e) || isNull(e.v) {
		return false
	}
	var b bool
	quoted := e.v.Style&(yaml.DoubleQuotedStyle|yaml.SingleQuotedStyle) != 0
	if err := e.v.Decode(&b); err != nil || quoted {
		p.fail(e.v.Line, e.path, "error loading config file: cannot unmarshal %s into a boolean (true or false)", describe(e.v))
	}
	return b
}

// uint32Value reads a whole number from 0 to 4294967295; null is 0.
func (p *parser) uint32Value(e kv) uint32 {
	if e.v.Kind != yaml.ScalarNode {
		p.fail(e.v.Line, e.path, "error loading config file: cannot unmarshal %s into uint32", describe(e.v))
		return 0
	}
	if !p.leaf(e) || isNull(e.v) {
		return 0
	}
	var n uint32
	if e.v.ShortTag() != "!!int" || e.v.Decode(&n) != nil {
		p.fail(e.v.Line, e.path, "error loading config file: cannot unmarshal %s into uint32 (a whole number from 0 to %d)", describe(e.v), uint32(1<<32-1))
	}
	return n
}

// list returns the mappings of a list; null is an empty list.
func (p *parser) list(e kv) []*yaml.Node {
	if isNull(e.v) {
		return nil
	}
	if e.v.Kind != yaml.SequenceNode {
		p.fail(e.v.Line, e.path, "error loading config file: cannot unmarshal %s into a list", describe(e.v))
		return nil
	}
	var out []*yaml.Node
	for _, el := range e.v.Content {
		el = p.resolve(el, 0)
		if el == nil {
			continue
		}
		if el.Kind != yaml.MappingNode {
			p.fail(el.Line, e.path, "config error, yaml file contains list of type other than map: %s", text(el))
			continue
		}
		out = append(out, el)
	}
	return out
}

func (p *parser) descriptors(n *yaml.Node, path string, depth int) []*descSpec {
	e := kv{v: n, path: path}
	var out []*descSpec
	for i, m := range p.list(e) {
		out = append(out, p.descriptor(m, fmt.Sprintf("%s[%d]", path, i), depth))
	}
	return out
}

func (p *parser) descriptor(n *yaml.Node, path string, depth int) *descSpec {
	d := &descSpec{line: n.Line, column: n.Column, path: path, countDenied: true}
	for _, e := range p.pairs(n, path, descriptorKeys, depth) {
		switch e.key {
		case "key":
			d.key, d.keyLine = p.str(e), e.k.Line
		case "value":
			d.value = p.str(e)
		case "rate_limit":
			if isNull(e.v) {
				continue // rate_limit: with nothing is no limit, as for the reference
			}
			if e.v.Kind != yaml.MappingNode {
				p.fail(e.v.Line, e.path, "error loading config file: cannot unmarshal %s into a rate_limit mapping", describe(e.v))
				continue
			}
			d.rateLimit = p.limit(e.v, e.path, depth+1)
		case "rate_limits":
			d.hasLimits = true
			for i, m := range p.list(e) {
				d.rateLimits = append(d.rateLimits, p.limit(m, fmt.Sprintf("%s[%d]", e.path, i), depth+2))
			}
		case "descriptors":
			d.children = p.descriptors(e.v, e.path, depth+2)
		case "shadow_mode":
			d.shadow = p.boolean(e)
		case "quota_mode":
			d.quota = p.boolean(e)
		case "share_threshold":
			d.share = p.boolean(e)
		case "detailed_metric", "value_to_metric":
			p.boolean(e) // statistics names only; see metrics.go
		case "count_denied":
			d.countDenied = isNull(e.v) || p.boolean(e)
		case "allow_refunds":
			d.refunds = p.boolean(e)
		case "metadata":
			d.metadata = p.metadata(e)
		}
	}
	return d
}

func (p *parser) limit(n *yaml.Node, path string, depth int) *limitSpec {
	l := &limitSpec{line: n.Line, path: path}
	for _, e := range p.pairs(n, path, limitKeys, depth) {
		switch e.key {
		case "unit":
			l.unitText = p.str(e)
			l.unit, l.unitKnown = parseUnit(l.unitText)
		case "requests_per_unit":
			l.perUnit = p.uint32Value(e)
		case "unlimited":
			l.unlimited = p.boolean(e)
		case "name":
			l.name = p.str(e)
		case "unit_multiplier":
			before := len(p.problems)
			l.multiplier, l.multLine = p.uint32Value(e), e.v.Line
			if l.multiplier == 0 && len(p.problems) == before {
				p.fail(e.v.Line, e.path, "unit_multiplier must be at least 1 (the window is unit_multiplier units)")
			}
		case "replaces":
			for i, m := range p.list(e) {
				rp := fmt.Sprintf("%s[%d]", e.path, i)
				name := ""
				for _, r := range p.pairs(m, rp, replaceKeys, depth+2) {
					name = p.str(r)
				}
				l.replaces = append(l.replaces, name)
				l.replLines = append(l.replLines, m.Line)
			}
		}
	}
	return l
}

// metadata reads a descriptor's metadata as a protobuf Struct, as the reference
// requires; it plays no part in decisions, and is returned in the dynamic metadata of the
// requests that pass the descriptor (RLS_RESPONSE_DYNAMIC_METADATA). nil: none.
func (p *parser) metadata(e kv) *structpb.Struct {
	var v any
	if err := e.v.Decode(&v); err != nil {
		p.fail(e.v.Line, e.path, "error parsing metadata: %v", err)
		return nil
	}
	if v == nil {
		return nil
	}
	m, ok := v.(map[string]any)
	if !ok {
		p.fail(e.v.Line, e.path, "error parsing metadata: a mapping with string keys is required, not %s", describe(e.v))
		return nil
	}
	s, err := structpb.NewStruct(m)
	if err != nil {
		p.fail(e.v.Line, e.path, "error parsing metadata: %v", err)
		return nil
	}
	return s
}
