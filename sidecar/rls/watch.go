package rls

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"syscall"
	"time"
)

// fingerprint describes the rule files of dir as the file system has them: names,
// sizes, modification times and inodes of the files the links lead to. Any write,
// creation, removal or link swap (a Kubernetes ConfigMap update replaces ..data) changes it.
func fingerprint(dir string) string {
	files, err := ruleFiles(dir)
	if err != nil {
		return "error: " + err.Error()
	}
	var b strings.Builder
	for _, c := range files {
		var ino, dev uint64
		if st, ok := c.info.Sys().(*syscall.Stat_t); ok {
			ino, dev = st.Ino, uint64(st.Dev)
		}
		fmt.Fprintf(&b, "%q %d %d %d %d\n", c.name, c.info.Size(), c.info.ModTime().UnixNano(), ino, dev)
	}
	return b.String()
}

// Watcher reloads a rule directory when it changes.
type Watcher struct {
	Dir      string
	Interval time.Duration // how often the directory is looked at; 1 s when 0
	Logger   *slog.Logger
	Options  LoadOptions // how the files are put together
}

// Run applies every valid change of the directory to s until ctx ends, starting from the
// rules s has when they were loaded from the directory. A change that is not valid (a
// file with a problem, or one read half-written) keeps the rules in use whole, is logged
// with its problems and counted; the next change is tried again.
func (w *Watcher) Run(ctx context.Context, s *Service) {
	var last string
	if r := s.Rules(); r != nil && r.dir == w.Dir {
		last = r.seen
	}
	interval := w.Interval
	if interval <= 0 {
		interval = time.Second
	}
	log := w.Logger
	if log == nil {
		log = slog.Default()
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		fp := fingerprint(w.Dir)
		if fp == last {
			continue
		}
		last = fp
		rules, err := Load(w.Dir, w.Options)
		if err != nil {
			s.Loaded(false)
			log.Error("RLS_CONFIG_DIR changed but is not valid: the previous rules stay in use",
				"dir", w.Dir, "problems", err.Error())
			continue
		}
		s.SetRules(rules)
		s.Loaded(true)
		descs, limits := rules.Size()
		log.Info("RLS rules reloaded", "dir", w.Dir, "files", len(rules.files), "domains", len(rules.domains),
			"descriptors", descs, "limits", limits)
	}
}
