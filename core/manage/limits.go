package manage

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"slices"
	"strings"

	"github.com/converger/edge/core/store"
	"github.com/converger/edge/shared/buckets"
)

func registerLimits() {
	tenantFlag := func(fs *flag.FlagSet, r *runner) {
		fs.StringVar(&r.o.tenant, "tenant", "", "the tenant's name (required)")
	}
	register(&command{
		group: "limits", name: "set", args: "--tenant N BUCKET=LIMIT/WINDOW ...",
		summary: "Sets per-tenant overrides, merged with the tenant's other overrides.\n" +
			"BUCKET is one of " + strings.Join(buckets.OverridableNames(), ", ") + ".\n" +
			"LIMIT is a positive integer; WINDOW a duration in whole milliseconds up to 24h (500ms, 1s, 60s, 1h).\n" +
			"Example: core limits set --tenant acme inbound=2000/1s activity_create=300/1s\n" +
			"The sidecars are notified in the same transaction (NOTIFY rate_limit_overrides).",
		changes: true, positional: true, flags: tenantFlag, run: limitsSet,
	})
	register(&command{
		group: "limits", name: "show", args: "--tenant N",
		summary: "Shows the overridable limits of a tenant and where each comes from.",
		flags:   tenantFlag, run: limitsShow,
	})
	register(&command{
		group: "limits", name: "clear", args: "--tenant N [BUCKET ...]",
		summary: "Removes overrides of a tenant (all of them when no bucket is named), so that those buckets\n" +
			"fall back to the installation's limits. The sidecars are notified in the same transaction.",
		changes: true, positional: true, flags: tenantFlag, run: limitsClear,
	})
}

// parseLimitSpec reads "bucket=limit/window", e.g. "inbound=2000/1s".
func parseLimitSpec(spec string) (string, buckets.Limit, error) {
	name, value, ok := strings.Cut(spec, "=")
	if !ok || name == "" || !strings.Contains(value, "/") {
		return "", buckets.Limit{}, fmt.Errorf("%q: write BUCKET=LIMIT/WINDOW, e.g. inbound=2000/1s", spec)
	}
	l, err := store.ParseOverride(name, value)
	if err != nil {
		return "", buckets.Limit{}, fmt.Errorf("%q: %v", spec, err)
	}
	return name, l, nil
}

func limitsSet(r *runner, specs []string) error {
	if err := r.required("tenant", r.o.tenant); err != nil {
		return err
	}
	if len(specs) == 0 {
		return r.usagef("name at least one limit, e.g. inbound=2000/1s")
	}
	set := buckets.Overrides{}
	for _, spec := range specs {
		name, l, err := parseLimitSpec(spec)
		if err != nil {
			return r.usagef("%v", err)
		}
		if _, dup := set[name]; dup {
			return r.usagef("%s is given twice", name)
		}
		set[name] = l
	}
	// The stored document must pass the sidecars' parser; the store checks the merged
	// one again.
	if _, err := buckets.ParseOverrides(set.JSON()); err != nil {
		return r.usagef("%v", err)
	}
	st, err := r.store(nil)
	if err != nil {
		return err
	}
	t, err := r.tenant(st, r.o.tenant)
	if err != nil {
		return err
	}
	ch, err := st.As(r.actor).SetLimits(r.ctx, t.ID, set)
	if err != nil {
		return limitsError(err, r.o.tenant)
	}
	w := r.stdout
	if !ch.Changed {
		fmt.Fprintf(w, "Limits of tenant %s (%s) unchanged: they were already set so.\n", t.Name, t.ID)
		return nil
	}
	fmt.Fprintf(w, "Limits of tenant %s (%s) set:\n", t.Name, t.ID)
	for _, name := range sortedNames(set) {
		fmt.Fprintf(w, "  %-18s %-10s (was: %s)\n", name, set[name].Spec(), previous(ch.Before, name))
	}
	fmt.Fprintln(w, "The sidecars were notified (NOTIFY rate_limit_overrides) and apply them at once.")
	return nil
}

func limitsClear(r *runner, names []string) error {
	if err := r.required("tenant", r.o.tenant); err != nil {
		return err
	}
	for i, name := range names {
		if b, ok := buckets.Lookup(name); !ok || !b.Overridable {
			return r.usagef("%q is not an overridable bucket (allowed: %s)", name, strings.Join(buckets.OverridableNames(), ", "))
		}
		if slices.Contains(names[:i], name) {
			return r.usagef("%s is given twice", name)
		}
	}
	st, err := r.store(nil)
	if err != nil {
		return err
	}
	t, err := r.tenant(st, r.o.tenant)
	if err != nil {
		return err
	}
	ch, err := st.As(r.actor).ClearLimits(r.ctx, t.ID, names)
	if err != nil {
		return limitsError(err, r.o.tenant)
	}
	w := r.stdout
	if !ch.Changed {
		fmt.Fprintf(w, "Limits of tenant %s (%s) unchanged: no such override was set.\n", t.Name, t.ID)
		return nil
	}
	fmt.Fprintf(w, "Overrides of tenant %s (%s) cleared:\n", t.Name, t.ID)
	if ch.Before.Invalid != nil {
		fmt.Fprintf(w, "  the stored document, which was not valid: %s\n", ch.Before.Raw)
	} else {
		for _, name := range sortedNames(ch.Before.Overrides) {
			if _, kept := ch.After[name]; !kept {
				fmt.Fprintf(w, "  %-18s (was: %s)\n", name, ch.Before.Overrides[name].Spec())
			}
		}
	}
	fmt.Fprintln(w, "The sidecars were notified (NOTIFY rate_limit_overrides) and apply the installation's limits at once.")
	return nil
}

func limitsShow(r *runner, _ []string) error {
	if err := r.required("tenant", r.o.tenant); err != nil {
		return err
	}
	st, err := r.store(nil)
	if err != nil {
		return err
	}
	t, err := r.tenant(st, r.o.tenant)
	if err != nil {
		return err
	}
	l, err := st.Limits(r.ctx, t.ID)
	if err != nil {
		return limitsError(err, r.o.tenant)
	}
	writeLimits(r.stdout, t, l)
	return nil
}

func writeLimits(w io.Writer, t store.Tenant, l store.TenantLimits) {
	fmt.Fprintf(w, "Limits of tenant %s (%s):\n", t.Name, t.ID)
	fmt.Fprintf(w, "  %-18s %-10s %s\n", "BUCKET", "LIMIT", "SOURCE")
	for _, name := range buckets.OverridableNames() {
		if o, ok := l.Overrides[name]; ok {
			fmt.Fprintf(w, "  %-18s %-10s %s\n", name, o.Spec(), "tenant override")
			continue
		}
		b, _ := buckets.Lookup(name)
		fmt.Fprintf(w, "  %-18s %-10s %s\n", name, b.Default.Spec(), "built-in default (RATE_LIMIT_CONFIG may change it)")
	}
	fmt.Fprintf(w, "stored: %s\n", l.Raw)
	if l.Invalid != nil {
		fmt.Fprintf(w, "The stored limits are not valid, so the sidecars ignore them: %v\n"+
			"`core limits clear --tenant %s` resets them.\n", l.Invalid, quoteArg(t.Name))
	}
}

func limitsError(err error, tenant string) error {
	switch {
	case errors.Is(err, store.ErrNotFound):
		return failf("no tenant named %q", tenant)
	case errors.Is(err, store.ErrInvalid):
		return failf("%v", err)
	}
	return err
}

func previous(before store.TenantLimits, name string) string {
	if before.Invalid != nil {
		return "an invalid stored document"
	}
	if l, ok := before.Overrides[name]; ok {
		return l.Spec()
	}
	return "no override"
}

func sortedNames(o buckets.Overrides) []string {
	var names []string
	for _, n := range buckets.OverridableNames() {
		if _, ok := o[n]; ok {
			names = append(names, n)
		}
	}
	return names
}
