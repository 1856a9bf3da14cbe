package manage

import (
	"errors"
	"flag"
	"fmt"
	"strings"

	"github.com/converger/edge/core/store"
)

// The origins whose web pages may call the client API with a tenant's credentials.

func registerOrigins() {
	register(&command{
		group: "tenants", name: "origins set", args: "--name N ORIGIN ... | --name N --none",
		summary: "Replaces the origins whose web pages (Web Chat on the tenant's sites) may call the client API\n" +
			"with the tenant's credentials, across origins (CORS). An origin is scheme://host[:port], such as\n" +
			"https://www.example.com or http://localhost:3000; --none removes them all. Every core applies the\n" +
			"change at once (NOTIFY tenant_changes). CORS_ORIGINS allows origins for every tenant besides.",
		changes: true, positional: true,
		flags: func(fs *flag.FlagSet, r *runner) {
			fs.StringVar(&r.o.name, "name", "", "the tenant's name (required)")
			fs.BoolVar(&r.o.none, "none", false, "remove every origin")
		},
		run: originsSet,
	})
	register(&command{
		group: "tenants", name: "origins show", args: "--name N",
		summary: "Shows the origins whose web pages may call the client API with the tenant's credentials.",
		flags: func(fs *flag.FlagSet, r *runner) {
			fs.StringVar(&r.o.name, "name", "", "the tenant's name (required)")
		},
		run: originsShow,
	})
}

func originsSet(r *runner, origins []string) error {
	if err := r.required("name", r.o.name); err != nil {
		return err
	}
	switch {
	case r.o.none && len(origins) > 0:
		return r.usagef("--none removes every origin: give it without origins")
	case !r.o.none && len(origins) == 0:
		return r.usagef("which origins? (--none removes them all)")
	}
	canonical, err := store.CanonicalOrigins(origins)
	if err != nil {
		return r.usagef("%v", err)
	}
	if len(canonical) > store.MaxTenantOrigins {
		return r.usagef("a tenant has at most %d origins", store.MaxTenantOrigins)
	}
	st, t, err := r.openTenant(r.o.name)
	if err != nil {
		return err
	}
	ch, err := st.As(r.actor).SetTenantOrigins(r.ctx, t.ID, canonical)
	if errors.Is(err, store.ErrNotFound) {
		return failf("no tenant named %q", r.o.name)
	}
	if err != nil {
		return err
	}
	if !ch.Changed {
		fmt.Fprintf(r.stdout, "Tenant %s (%s) has these origins already; nothing changed.\n", ch.Tenant.Name, ch.Tenant.ID)
	} else {
		fmt.Fprintf(r.stdout, "Allowed origins of tenant %s (%s) set; every core applies them at once.\n", ch.Tenant.Name, ch.Tenant.ID)
	}
	writeOrigins(r, ch.Tenant, ch.After)
	return nil
}

func originsShow(r *runner, _ []string) error {
	if err := r.required("name", r.o.name); err != nil {
		return err
	}
	st, t, err := r.openTenant(r.o.name)
	if err != nil {
		return err
	}
	list, err := st.TenantOrigins(r.ctx, t.ID)
	if err != nil {
		return err
	}
	fmt.Fprintf(r.stdout, "Allowed origins of tenant %s (%s):\n", t.Name, t.ID)
	writeOrigins(r, t, list)
	return nil
}

func writeOrigins(r *runner, t store.Tenant, origins []string) {
	if len(origins) == 0 {
		fmt.Fprintf(r.stdout, "  (none: only CORS_ORIGINS, and pages of the core's own origin)\n")
	}
	for _, o := range origins {
		fmt.Fprintf(r.stdout, "  %s\n", o)
	}
	if t.Status != store.StatusActive {
		fmt.Fprintf(r.stdout, "Note: the tenant is %s, so its origins are refused as its credentials are.\n", strings.TrimSpace(t.Status))
	}
}
