package manage

import (
	"errors"
	"flag"
	"fmt"

	"github.com/converger/edge/core/store"
)

// The activation and deactivation of tenants and channels, and the channels' settings.

func registerStatus() {
	tenantName := func(fs *flag.FlagSet, r *runner) {
		fs.StringVar(&r.o.name, "name", "", "the tenant's name (required)")
	}
	channelNames := func(fs *flag.FlagSet, r *runner) {
		fs.StringVar(&r.o.tenant, "tenant", "", "the tenant's name (required)")
		fs.StringVar(&r.o.name, "name", "", "the channel's name (required)")
	}
	register(&command{
		group: "tenants", name: "deactivate", args: "--name N",
		summary: "Sets a tenant inactive: its API keys, channels, tokens and portal users are refused,\n" +
			"by the sidecars at once too (NOTIFY tenant_changes).",
		changes: true, flags: tenantName, run: tenantStatus(store.StatusInactive),
	})
	register(&command{
		group: "tenants", name: "activate", args: "--name N",
		summary: "Sets an inactive tenant active again: its API keys, channels, tokens and portal users work again.",
		changes: true, flags: tenantName, run: tenantStatus(store.StatusActive),
	})
	register(&command{
		group: "channels", name: "deactivate", args: "--tenant N --name C",
		summary: "Sets a channel inactive: its secret, publishable key and tokens are refused, and its inbound\n" +
			"webhooks answer 400; by the sidecars at once too (NOTIFY tenant_changes).",
		changes: true, flags: channelNames, run: channelStatus(store.StatusInactive),
	})
	register(&command{
		group: "channels", name: "activate", args: "--tenant N --name C",
		summary: "Sets an inactive channel active again.",
		changes: true, flags: channelNames, run: channelStatus(store.StatusActive),
	})
	register(&command{
		group: "channels", name: "update", args: "--tenant N --name C --require-signature=true|false",
		summary: "Changes a channel's settings. --require-signature=false lets its inbound webhooks in\n" +
			"unsigned (each is logged as deprecated); true, the default of new channels, refuses them.",
		changes: true,
		flags: func(fs *flag.FlagSet, r *runner) {
			channelNames(fs, r)
			fs.Var(&r.o.requireSignature, "require-signature", "true or false: whether inbound webhooks must be signed")
		},
		run: channelsUpdate,
	})
}

func tenantStatus(status string) func(*runner, []string) error {
	return func(r *runner, _ []string) error {
		if err := r.required("name", r.o.name); err != nil {
			return err
		}
		st, t, err := r.openTenant(r.o.name)
		if err != nil {
			return err
		}
		t, changed, err := st.As(r.actor).SetTenantStatus(r.ctx, t.ID, status)
		if errors.Is(err, store.ErrNotFound) {
			return failf("no tenant named %q", r.o.name)
		}
		if err != nil {
			return err
		}
		switch {
		case !changed:
			fmt.Fprintf(r.stdout, "Tenant %s (%s) was already %s; nothing changed.\n", t.Name, t.ID, status)
		case status == store.StatusInactive:
			fmt.Fprintf(r.stdout, "Tenant %s (%s) deactivated: its API keys, channels, tokens and portal users are refused\n"+
				"from now on, by the sidecars too.\n", t.Name, t.ID)
		default:
			fmt.Fprintf(r.stdout, "Tenant %s (%s) activated: its API keys, channels, tokens and portal users work again.\n", t.Name, t.ID)
		}
		return nil
	}
}

func channelStatus(status string) func(*runner, []string) error {
	return func(r *runner, _ []string) error {
		if err := r.required("tenant", r.o.tenant, "name", r.o.name); err != nil {
			return err
		}
		st, t, c, err := r.openChannel(r.o.tenant, r.o.name)
		if err != nil {
			return err
		}
		c, changed, err := st.As(r.actor).SetChannelStatus(r.ctx, c.ID, status)
		if err != nil {
			return err
		}
		switch {
		case !changed:
			fmt.Fprintf(r.stdout, "Channel %s (%s) of tenant %s was already %s; nothing changed.\n", c.Name, c.ID, t.Name, status)
		case status == store.StatusInactive:
			fmt.Fprintf(r.stdout, "Channel %s (%s) of tenant %s deactivated: its secret, publishable key, tokens and inbound\n"+
				"webhooks are refused from now on, by the sidecars too.\n", c.Name, c.ID, t.Name)
		default:
			fmt.Fprintf(r.stdout, "Channel %s (%s) of tenant %s activated.\n", c.Name, c.ID, t.Name)
		}
		if !c.TenantActive {
			fmt.Fprintf(r.stdout, "Note: tenant %s is inactive, so the channel refuses traffic anyway.\n", t.Name)
		}
		return nil
	}
}

func channelsUpdate(r *runner, _ []string) error {
	if err := r.required("tenant", r.o.tenant, "name", r.o.name); err != nil {
		return err
	}
	if !r.o.requireSignature.set {
		return r.usagef("nothing to update: give --require-signature=true or --require-signature=false")
	}
	st, t, c, err := r.openChannel(r.o.tenant, r.o.name)
	if err != nil {
		return err
	}
	c, changed, err := st.As(r.actor).SetRequireSignature(r.ctx, c.ID, r.o.requireSignature.value)
	if err != nil {
		return err
	}
	switch {
	case !changed:
		fmt.Fprintf(r.stdout, "Channel %s (%s) of tenant %s already has require_signature %v; nothing changed.\n",
			c.Name, c.ID, t.Name, c.RequireSignature)
	case c.RequireSignature:
		fmt.Fprintf(r.stdout, "Channel %s (%s) of tenant %s: inbound webhooks must be signed from now on.\n", c.Name, c.ID, t.Name)
	default:
		fmt.Fprintf(r.stdout, "Channel %s (%s) of tenant %s: unsigned inbound webhooks are accepted from now on\n"+
			"(each is logged as deprecated); signed ones are still verified.\n", c.Name, c.ID, t.Name)
	}
	return nil
}
