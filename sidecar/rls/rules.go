// Package rls is Envoy's rate limit service (envoy.service.ratelimit.v3) as
// envoyproxy/ratelimit defines it: its rule files (one domain per file), the matching of
// request descriptors to rules, and the decisions, counted in the sidecar's limiter so
// that they replicate like every other counter. The gRPC and HTTP faces are in rlsapi.
package rls

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"google.golang.org/protobuf/types/known/structpb"
)

// Rules is a directory of rule files, checked and compiled into one tree of rules per
// domain. It never changes once built: a reload builds new Rules and swaps them in.
type Rules struct {
	domains map[string]*domain
	files   []string
	limits  []*Limit // every limit, in file order
	rules   int
	// dir and seen are the directory the rules were read from and its fingerprint just
	// before, from which a Watcher sees it change; opts how they were read.
	dir, seen string
	opts      LoadOptions
}

// Files returns the names of the files the rules came from, in the order they were read.
func (r *Rules) Files() []string { return slices.Clone(r.files) }

// Domains returns the domains, sorted.
func (r *Rules) Domains() []string {
	var out []string
	for name := range r.domains {
		out = append(out, name)
	}
	slices.Sort(out)
	return out
}

// Size returns the number of descriptors of every file and the number of limits among
// them.
func (r *Rules) Size() (descriptors, limits int) { return r.rules, len(r.limits) }

type domain struct {
	name string
	file string
	root level
	// override counts the hits of descriptors that carry their own limit.
	override *stats
}

// level is the rules one level down from a node (or from the domain), by key.
type level struct {
	byKey map[string]*keyRules
	all   []*rule // every rule, in file order
}

// keyRules are a level's rules of one key.
type keyRules struct {
	exact map[string]*rule // by value; wildcard values are there as written too
	wild  []*rule          // the rules whose value holds a '*', in file order
	bare  *rule            // the rule without a value
}

// key returns the rules of a key, created when needed.
func (lv *level) key(k string) *keyRules {
	kr := lv.byKey[k]
	if kr == nil {
		kr = &keyRules{exact: map[string]*rule{}}
		lv.byKey[k] = kr
	}
	return kr
}

// rule is one descriptor of a rule file.
type rule struct {
	key, value string
	limits     []*Limit // none: the rule limits nothing itself (a path, or a whitelist)
	unlimited  bool
	replaces   []string // names of limits that a match of this rule drops from the request
	shadow     bool
	quota      bool
	// countDenied false: hits are counted only when the request is allowed.
	countDenied bool
	refunds     bool
	// metadata is the descriptor's metadata, returned in the dynamic metadata of the
	// requests it passes (RLS_RESPONSE_DYNAMIC_METADATA); nil when it has none.
	metadata *structpb.Struct
	// share holds, by depth, the wildcard that stands for the request's value in the
	// counter ids of this rule's limits (share_threshold); nil when none does.
	share    []string
	children level
	// stat is the rule's name in statistics and messages, as the reference names it:
	// domain.key_value.key (a wildcard as written).
	stat string
	file string
	line int
}

// Limit is one limit of a rule: requests per window of Multiplier units.
type Limit struct {
	PerUnit    uint32
	Unit       Unit
	Multiplier uint32 // 1 unless the rule file's unit_multiplier says otherwise
	Name       string
	window     time.Duration
	seconds    int64 // the window's length, in counter ids
	rule       *rule
	stats      *stats // nil until Metrics binds the rules
}

// Window returns the limit's window.
func (l *Limit) Window() time.Duration { return l.window }

// Bounds of a directory.
const (
	MaxFileSize = 1 << 20 // bytes of one rule file
	MaxFiles    = 1000    // rule files of a directory
)

// candidate is a directory entry that is read as a rule file.
type candidate struct {
	name string
	path string
	info os.FileInfo // of the file a symbolic link leads to
}

// ruleFiles lists the rule files of dir, sorted by name: regular files (or links to
// them) whose name ends in .yaml or .yml and does not start with '.'. So a Kubernetes
// ConfigMap mount (name.yaml -> ..data/name.yaml, ..data -> ..2026_12_01_...) yields each
// key once, and a README or an editor's .swp file beside the rules is ignored.
func ruleFiles(dir string) ([]candidate, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var out []candidate
	for _, e := range entries {
		name := e.Name()
		if strings.HasPrefix(name, ".") || !(strings.HasSuffix(name, ".yaml") || strings.HasSuffix(name, ".yml")) {
			continue
		}
		path := filepath.Join(dir, name)
		info, err := os.Stat(path)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
		if !info.Mode().IsRegular() {
			continue
		}
		out = append(out, candidate{name, path, info})
	}
	if len(out) > MaxFiles {
		return nil, fmt.Errorf("holds %d rule files, more than %d", len(out), MaxFiles)
	}
	return out, nil
}

// LoadOptions say how the rule files of a directory (or of an xDS server) are put
// together.
type LoadOptions struct {
	// MergeDomains (RLS_MERGE_DOMAIN_CONFIG, the reference's MERGE_DOMAIN_CONFIG) merges
	// the files of one domain into one tree, in the order they are read, instead of
	// refusing the second: as the reference, a key and value written at the top level of
	// two of them is still a duplicate, and the rules below one of them come from its
	// file alone.
	MergeDomains bool
}

// LoadDir reads and checks every rule file of dir, one domain per file. The error is
// Problems: every problem found, each naming its file and, where it can, the line and
// the key.
func LoadDir(dir string) (*Rules, error) { return Load(dir, LoadOptions{}) }

// Load is LoadDir with options.
func Load(dir string, o LoadOptions) (*Rules, error) {
	seen := fingerprint(dir) // before reading: a change while reading is seen next time
	files, err := ruleFiles(dir)
	if err != nil {
		return nil, Problems{{File: dir, Msg: err.Error()}}
	}
	var problems Problems
	var specs []*fileSpec
	for _, c := range files {
		data, err := readFile(c.path)
		if err != nil {
			problems = append(problems, Problem{File: c.name, Msg: err.Error()})
			continue
		}
		spec, ps := parseFile(c.name, data)
		problems = append(problems, ps...)
		if spec != nil {
			specs = append(specs, spec)
		}
	}
	r, err := finish(specs, problems, o)
	if err != nil {
		return nil, err
	}
	r.dir, r.seen, r.opts = dir, seen, o
	return r, nil
}

// finish compiles the files' rules and returns them, or every problem found, by file.
func finish(specs []*fileSpec, problems Problems, o LoadOptions) (*Rules, error) {
	r, ps := compile(specs, o.MergeDomains)
	problems = append(problems, ps...)
	if problems != nil {
		slices.SortStableFunc(problems, func(a, b Problem) int { return strings.Compare(a.File, b.File) })
		return nil, problems
	}
	return r, nil
}

func readFile(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, MaxFileSize+1))
	if err != nil {
		return nil, err
	}
	if len(data) > MaxFileSize {
		return nil, fmt.Errorf("larger than %d bytes", MaxFileSize)
	}
	return data, nil
}

// ParseFiles checks and compiles rule files given by name and content, in that order: a
// directory without the directory (tests, tools).
func ParseFiles(files map[string]string) (*Rules, error) {
	names := make([]string, 0, len(files))
	for name := range files {
		names = append(names, name)
	}
	slices.Sort(names)
	var problems Problems
	var specs []*fileSpec
	for _, name := range names {
		spec, ps := parseFile(name, []byte(files[name]))
		problems = append(problems, ps...)
		if spec != nil {
			specs = append(specs, spec)
		}
	}
	return finish(specs, problems, LoadOptions{})
}

// File is one rule file: its name (in messages) and its content.
type File struct {
	Name string
	Data []byte
}

// Compile checks and compiles rule files in the order given, as a directory's would be:
// for rules that come from elsewhere (an xDS server). Problems name each file; they
// carry no line when lines says so (a document made from a message has none worth
// showing).
func Compile(files []File, o LoadOptions, lines bool) (*Rules, error) {
	var problems Problems
	var specs []*fileSpec
	for _, f := range files {
		spec, ps := parseFile(f.Name, f.Data)
		problems = append(problems, ps...)
		if spec != nil {
			specs = append(specs, spec)
		}
	}
	r, ps := compile(specs, o.MergeDomains)
	problems = append(problems, ps...)
	if problems != nil {
		if !lines {
			for i := range problems {
				problems[i].Line = 0
			}
		}
		return nil, problems
	}
	r.opts = o
	return r, nil
}

type compiler struct {
	r        *Rules
	file     string
	problems Problems
}

func (c *compiler) fail(line int, path, format string, args ...any) {
	c.problems = append(c.problems, Problem{File: c.file, Line: line, Key: path, Msg: fmt.Sprintf(format, args...)})
}

// compile checks the rules of every file together and builds their trees, as the
// reference's loadConfig and loadDescriptors do, in the same order of checks. With merge,
// a file of a domain already read adds its descriptors to the domain's top level.
func compile(specs []*fileSpec, merge bool) (*Rules, Problems) {
	c := &compiler{r: &Rules{domains: map[string]*domain{}}}
	for _, f := range specs {
		c.file = f.name
		c.r.files = append(c.r.files, f.name)
		if f.domain == "" {
			continue // reported by the parser
		}
		if prev, dup := c.r.domains[f.domain]; dup {
			if merge {
				c.level(&prev.root, f.descriptors, f.domain+".", nil, 0)
				continue
			}
			c.fail(f.domainLine, "domain", "duplicate domain '%s' in config file (also in %s)", f.domain, prev.file)
			continue
		}
		d := &domain{name: f.domain, file: f.name, root: newLevel()}
		c.level(&d.root, f.descriptors, f.domain+".", nil, 0)
		c.r.domains[f.domain] = d
	}
	return c.r, c.problems
}

func newLevel() level { return level{byKey: map[string]*keyRules{}} }

func (c *compiler) level(lv *level, specs []*descSpec, parent string, share []string, depth int) {
	for _, d := range specs {
		if d.key == "" {
			c.fail(d.line, d.path, "descriptor has empty key")
			continue
		}
		final := d.key
		if d.value != "" {
			final += "_" + d.value
		}
		stat := parent + final
		kr := lv.key(d.key)
		_, dupExact := kr.exact[d.value]
		if (d.value != "" && dupExact) || (d.value == "" && kr.bare != nil) {
			c.fail(d.keyLine, d.path, "duplicate descriptor composite key '%s'", stat)
			continue
		}
		c.r.rules++
		r := &rule{
			key: d.key, value: d.value, shadow: d.shadow, quota: d.quota,
			countDenied: d.countDenied, refunds: d.refunds, metadata: d.metadata,
			stat: stat, file: c.file, line: d.line, children: newLevel(),
		}
		c.limits(r, d)
		wildcard := strings.Contains(d.value, "*")
		if d.share && !wildcard {
			c.fail(d.line, d.path, "share_threshold can only be used with wildcard values (containing '*'), but found key '%s'", final)
		}
		// The share patterns down to this depth: this rule's when it shares its wildcard.
		s := share
		if d.share && wildcard {
			s = make([]string, depth+1)
			copy(s, share)
			s[depth] = d.value
		}
		if len(r.limits) > 0 {
			r.share = s
		}
		c.level(&r.children, d.children, stat+".", s, depth+1)
		lv.all = append(lv.all, r)
		if d.value == "" {
			kr.bare = r
		} else {
			kr.exact[d.value] = r
			if wildcard {
				kr.wild = append(kr.wild, r)
			}
		}
	}
}

// limits checks a descriptor's rate_limit or rate_limits and sets the rule's limits.
func (c *compiler) limits(r *rule, d *descSpec) {
	if d.rateLimit != nil && d.hasLimits {
		c.fail(d.line, d.path, "rate_limit and rate_limits cannot both be set: write every limit of the descriptor in rate_limits")
	}
	if l := d.rateLimit; l != nil {
		valid := l.unitKnown && l.unit != UnitUnknown
		switch {
		case l.unlimited && valid:
			c.fail(l.line, l.path, "should not specify rate limit unit when unlimited")
		case l.unlimited && l.multiplier != 0:
			c.fail(l.multLine, l.path+".unit_multiplier", "unit_multiplier cannot go with unlimited")
		case l.unlimited:
			r.unlimited = true
		case !valid:
			c.fail(l.line, l.path, "invalid rate limit unit '%s'", l.unitText)
		default:
			c.add(r, l)
		}
		c.replaces(r, l)
	}
	if d.hasLimits {
		if len(d.rateLimits) == 0 || len(d.rateLimits) > maxLimitsEach {
			c.fail(d.line, d.path+".rate_limits", "must hold from 1 to %d limits, each with its own window", maxLimitsEach)
		}
		for _, l := range d.rateLimits {
			if l.unlimited {
				c.fail(l.line, l.path, "unlimited goes in rate_limit, not in rate_limits")
				continue
			}
			if !l.unitKnown || l.unit == UnitUnknown {
				c.fail(l.line, l.path, "invalid rate limit unit '%s'", l.unitText)
				continue
			}
			c.add(r, l)
			c.replaces(r, l)
		}
		for i, a := range r.limits {
			for _, b := range r.limits[:i] {
				if a.seconds == b.seconds {
					c.fail(d.line, d.path+".rate_limits", "two limits with a window of %s: each limit of a descriptor needs its own window", a.window)
				}
			}
		}
	}
	switch {
	case !d.countDenied && len(r.limits) == 0:
		c.fail(d.line, d.path+".count_denied", "count_denied: false needs a limit on this descriptor (rate_limit or rate_limits)")
	case d.refunds && len(r.limits) == 0:
		c.fail(d.line, d.path+".allow_refunds", "allow_refunds needs a limit on this descriptor (rate_limit or rate_limits)")
	}
}

func (c *compiler) add(r *rule, l *limitSpec) {
	mult := max(l.multiplier, 1)
	secs := l.unit.Seconds() * int64(mult)
	if secs > int64(MaxWindow/time.Second) {
		c.fail(l.multLine, l.path+".unit_multiplier", "a window of %d × %s is longer than %d years", mult, strings.ToLower(l.unit.String()), MaxWindow/(365*24*time.Hour))
		return
	}
	lim := &Limit{
		PerUnit: l.perUnit, Unit: l.unit, Multiplier: mult, Name: l.name,
		window: time.Duration(secs) * time.Second, seconds: secs, rule: r,
	}
	r.limits = append(r.limits, lim)
	c.r.limits = append(c.r.limits, lim)
}

func (c *compiler) replaces(r *rule, l *limitSpec) {
	for i, name := range l.replaces {
		switch name {
		case "":
			c.fail(l.replLines[i], l.path+".replaces", "should not have an empty replaces entry")
		case l.name:
			c.fail(l.replLines[i], l.path+".replaces", "replaces should not contain name of same descriptor")
		default:
			if !slices.Contains(r.replaces, name) {
				r.replaces = append(r.replaces, name)
			}
		}
	}
}

// Dump writes the rules as the reference's /rlconfig shows them: one line per descriptor
// that has a rate_limit, "domain.key_value.key: unit=MINUTE requests_per_unit=10,
// shadow_mode: false" (an unlimited one with unit=UNKNOWN requests_per_unit=0), domains
// sorted and descriptors in file order (the reference's order is random). A descriptor
// with rate_limits or unit_multiplier (ours) has one line per limit, with its window.
func (r *Rules) Dump() string {
	var b strings.Builder
	for _, name := range r.Domains() {
		r.domains[name].root.each(func(ru *rule) {
			if ru.unlimited {
				fmt.Fprintf(&b, "%s: unit=UNKNOWN requests_per_unit=0, shadow_mode: %t\n", ru.stat, ru.shadow)
			}
			for _, l := range ru.limits {
				fmt.Fprintf(&b, "%s: unit=%s requests_per_unit=%d, shadow_mode: %t", ru.stat, l.Unit, l.PerUnit, ru.shadow)
				if len(ru.limits) > 1 || l.Multiplier > 1 {
					fmt.Fprintf(&b, ", window: %s", l.window)
				}
				b.WriteByte('\n')
			}
		})
	}
	return b.String()
}
