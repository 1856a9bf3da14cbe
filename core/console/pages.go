package console

import (
	"bytes"
	"embed"
	"errors"
	"fmt"
	"html/template"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/gofiber/fiber/v2"

	"github.com/converger/edge/core/login"
	"github.com/converger/edge/core/store"
	"github.com/converger/edge/shared/buckets"
)

//go:embed templates/*.html
var templateFiles embed.FS

// The pages, below /admin beside the login pages.
var pageNames = []string{"tenants", "tenant", "audit", "limits", "message"}

// refreshSeconds is how often the Limits page reloads itself (a meta refresh).
const refreshSeconds = 5

func (c *Console) parseTemplates() error {
	funcs := template.FuncMap{
		"spec": func(l *limitJSON) string { return l.String() },
		// seconds writes milliseconds in whole seconds, rounded up.
		"seconds": func(ms any) string {
			var n int64
			switch v := ms.(type) {
			case int64:
				n = v
			case uint64:
				n = int64(min(v, 1<<62))
			}
			return strconv.FormatInt((n+999)/1000, 10)
		},
		"ago": func(ms int64) string {
			if ms < 0 {
				return "never"
			}
			return (time.Duration(ms) * time.Millisecond).Round(time.Millisecond).String() + " ago"
		},
		"time":  func(t time.Time) string { return t.UTC().Format("2006-01-02 15:04:05Z") },
		"chart": newChart,
		"query": func(kv ...string) string {
			v := url.Values{}
			for i := 0; i+1 < len(kv); i += 2 {
				if kv[i+1] != "" {
					v.Set(kv[i], kv[i+1])
				}
			}
			return v.Encode()
		},
	}
	c.views = map[string]*template.Template{}
	for _, name := range pageNames {
		t, err := template.New("layout.html").Funcs(funcs).ParseFS(templateFiles, "templates/layout.html", "templates/"+name+".html")
		if err != nil {
			return fmt.Errorf("console: templates: %w", err)
		}
		c.views[name] = t
	}
	layout, err := templateFiles.ReadFile("templates/layout.html")
	if err != nil {
		return err
	}
	c.csp = login.ContentSecurityPolicy(layout)
	return nil
}

func (c *Console) registerPages(r fiber.Router) {
	mw := []fiber.Handler{c.pageHeaders, c.withDeadline, c.authPage}
	r.Get("/admin/tenants", append(mw, c.tenantsPage)...)
	r.Get("/admin/tenants/:id", append(mw, c.tenantPage)...)
	r.Post("/admin/tenants/:id/limits", append(mw, c.limitsForm)...)
	r.Post("/admin/tenants/:id/status", append(mw, c.statusForm)...)
	r.Get("/admin/audit", append(mw, c.auditPage)...)
	r.Get("/admin/limits", append(mw, c.livePage)...)
}

// pageHeaders sets the security headers of every page, as the login pages have them.
func (c *Console) pageHeaders(ctx *fiber.Ctx) error {
	login.SetPageHeaders(&ctx.Response().Header, c.csp)
	return ctx.Next()
}

// authPage lets signed-in admins through and sends everyone else to the sign-in page;
// a form's POST must carry the session's CSRF token.
func (c *Console) authPage(ctx *fiber.Ctx) error {
	adm, err := c.Pages.SignedInAdmin(ctx)
	if err != nil {
		return c.pageError(ctx, nil, err)
	}
	if adm == nil {
		return ctx.Redirect("/admin/login", fiber.StatusSeeOther)
	}
	a := &actor{adminID: adm.ID, email: adm.Email, via: "session", scope: store.ScopeWrite, session: adm}
	if ctx.Method() == fiber.MethodPost && !login.ValidCSRF(adm, ctx.FormValue("_csrf")) {
		return c.message(ctx, a, fiber.StatusForbidden, "The form has expired or did not come from this site. Go back, reload the page and try again.")
	}
	ctx.Locals(localActor, a)
	return ctx.Next()
}

// view is what every page renders.
type view struct {
	Title   string
	Nav     string
	Admin   *login.Admin
	Refresh int
	Error   string
	Notice  string
	Data    any
}

func (c *Console) render(ctx *fiber.Ctx, status int, page string, v view) error {
	if a := actorOf(ctx); a != nil {
		v.Admin = a.session
	}
	var b bytes.Buffer
	if err := c.views[page].Execute(&b, v); err != nil {
		c.Logger.Error("console: rendering a page", "page", page, "error", err, "request_id", requestID(ctx))
		ctx.Set(fiber.HeaderContentType, fiber.MIMETextPlainCharsetUTF8)
		return ctx.Status(fiber.StatusInternalServerError).SendString("Something went wrong.")
	}
	ctx.Set(fiber.HeaderContentType, fiber.MIMETextHTMLCharsetUTF8)
	return ctx.Status(status).Send(b.Bytes())
}

func (c *Console) message(ctx *fiber.Ctx, a *actor, status int, text string) error {
	if a != nil {
		ctx.Locals(localActor, a)
	}
	return c.render(ctx, status, "message", view{Title: "Console", Error: text})
}

// pageError answers a failed page: 404, 503 while the database does not answer, else
// 500 (logged).
func (c *Console) pageError(ctx *fiber.Ctx, a *actor, err error) error {
	switch {
	case errors.Is(err, store.ErrNotFound):
		return c.message(ctx, a, fiber.StatusNotFound, "There is no such tenant.")
	case unavailable(err):
		c.Logger.Warn("console: the database did not answer", "request_id", requestID(ctx), "route", ctx.Route().Path, "error", err)
		ctx.Set(fiber.HeaderRetryAfter, "1")
		return c.message(ctx, a, fiber.StatusServiceUnavailable, "The database is not answering; try again shortly.")
	}
	c.Logger.Error("console: page failed", "request_id", requestID(ctx), "route", ctx.Route().Path, "error", err)
	return c.message(ctx, a, fiber.StatusInternalServerError, "Something went wrong. Try again later.")
}

// The notices after a change (a fixed code in the redirect, never text).
var notices = map[string]string{
	"limits":      "The limits are saved; the sidecars apply them now.",
	"unchanged":   "Nothing changed: the limits were already so.",
	"activated":   "The tenant is active.",
	"deactivated": "The tenant is deactivated: its keys, channels, tokens and portal users are refused now.",
}

type tenantsData struct {
	Query   string
	Tenants []tenantJSON
	Next    string
}

func (c *Console) tenantsPage(ctx *fiber.Ctx) error {
	q, _ := param(ctx, "q")
	cursor, err := store.ParseCursor(ctx.Query("cursor"))
	if err != nil {
		cursor = store.Cursor{}
	}
	list, more, err := c.Store.Tenants(ctx.UserContext(), q, cursor, defaultPage)
	if err != nil {
		return c.pageError(ctx, actorOf(ctx), err)
	}
	d := tenantsData{Query: q}
	for _, t := range list {
		d.Tenants = append(d.Tenants, tenantOut(t))
	}
	if more {
		last := list[len(list)-1]
		d.Next = store.Cursor{Name: last.Name, ID: last.ID}.String()
	}
	return c.render(ctx, fiber.StatusOK, "tenants", view{Title: "Tenants", Nav: "tenants", Data: d})
}

type tenantData struct {
	Tenant       tenantJSON
	Channels     []channelJSON
	MoreChannels bool
	Limits       limitsView
	// Form holds the edit form's values by bucket; Fields its errors.
	Form   map[string]string
	Fields map[string][]string
}

// maxChannelsShown bounds the channels on a tenant's page.
const maxChannelsShown = 100

func (c *Console) tenantData(ctx *fiber.Ctx, id string) (tenantData, error) {
	t, err := c.Store.TenantByID(ctx.UserContext(), id)
	if err != nil {
		return tenantData{}, err
	}
	chans, more, err := c.Store.TenantChannels(ctx.UserContext(), id, store.Cursor{}, maxChannelsShown)
	if err != nil {
		return tenantData{}, err
	}
	lv, err := c.tenantLimits(ctx.UserContext(), id)
	if err != nil {
		return tenantData{}, err
	}
	d := tenantData{Tenant: tenantOut(t), MoreChannels: more, Limits: lv, Form: map[string]string{}}
	for _, ch := range chans {
		d.Channels = append(d.Channels, channelOut(ch))
	}
	for _, b := range lv.Buckets {
		d.Form[b.Bucket] = b.Override.String()
	}
	return d, nil
}

func (c *Console) tenantPage(ctx *fiber.Ctx) error {
	id, good := tenantID(ctx)
	if !good {
		return c.pageError(ctx, actorOf(ctx), store.ErrNotFound)
	}
	d, err := c.tenantData(ctx, id)
	if err != nil {
		return c.pageError(ctx, actorOf(ctx), err)
	}
	return c.render(ctx, fiber.StatusOK, "tenant", view{Title: "Tenant " + d.Tenant.Name, Nav: "tenants",
		Notice: notices[ctx.Query("done")], Data: d})
}

// limitsForm saves the edit form: every overridable bucket's field, "LIMIT/WINDOW" as
// `core limits set` takes it, or empty for no override.
func (c *Console) limitsForm(ctx *fiber.Ctx) error {
	a := actorOf(ctx)
	id, good := tenantID(ctx)
	if !good {
		return c.pageError(ctx, a, store.ErrNotFound)
	}
	current, err := c.Store.Limits(ctx.UserContext(), id)
	if err != nil {
		return c.pageError(ctx, a, err)
	}
	set, fields, form := buckets.Overrides{}, map[string][]string{}, map[string]string{}
	var drop []string
	for _, name := range buckets.OverridableNames() {
		v := strings.TrimSpace(ctx.FormValue("limit." + name))
		form[name] = strings.Clone(v)
		if v == "" {
			if _, had := current.Overrides[name]; had || current.Invalid != nil {
				drop = append(drop, name)
			}
			continue
		}
		l, err := store.ParseOverride(name, v)
		if err != nil {
			fields[name] = []string{err.Error()}
			continue
		}
		set[name] = l
	}
	var ch store.LimitsChange
	if len(fields) == 0 && len(set)+len(drop) > 0 {
		ch, err = a.operator(c.Store).EditLimits(ctx.UserContext(), id, set, drop)
		if errors.Is(err, store.ErrInvalid) {
			fields["limits"] = []string{err.Error()}
		} else if err != nil {
			return c.pageError(ctx, a, err)
		}
	}
	if len(fields) > 0 {
		d, err := c.tenantData(ctx, id)
		if err != nil {
			return c.pageError(ctx, a, err)
		}
		d.Form, d.Fields = form, fields
		return c.render(ctx, fiber.StatusUnprocessableEntity, "tenant", view{Title: "Tenant " + d.Tenant.Name, Nav: "tenants",
			Error: "Some limits are not valid; nothing was saved.", Data: d})
	}
	done := "unchanged"
	if ch.Changed {
		done = "limits"
	}
	return ctx.Redirect("/admin/tenants/"+id+"?done="+done, fiber.StatusSeeOther)
}

// statusForm activates or deactivates a tenant.
func (c *Console) statusForm(ctx *fiber.Ctx) error {
	a := actorOf(ctx)
	id, good := tenantID(ctx)
	if !good {
		return c.pageError(ctx, a, store.ErrNotFound)
	}
	status := ctx.FormValue("status")
	if status != store.StatusActive && status != store.StatusInactive {
		return c.message(ctx, a, fiber.StatusBadRequest, "The form asked for an unknown status.")
	}
	if _, _, err := a.operator(c.Store).SetTenantStatus(ctx.UserContext(), id, status); err != nil {
		return c.pageError(ctx, a, err)
	}
	done := "activated"
	if status == store.StatusInactive {
		done = "deactivated"
	}
	return ctx.Redirect("/admin/tenants/"+id+"?done="+done, fiber.StatusSeeOther)
}

type auditData struct {
	Query   store.AuditQuery
	Entries []auditJSON
	Older   int64
}

func (c *Console) auditPage(ctx *fiber.Ctx) error {
	q, bad := auditQuery(ctx)
	if bad != "" {
		return c.message(ctx, actorOf(ctx), fiber.StatusBadRequest, "The filter "+bad+" is not valid.")
	}
	list, more, err := c.Store.SearchAuditLogs(ctx.UserContext(), q)
	if err != nil {
		return c.pageError(ctx, actorOf(ctx), err)
	}
	d := auditData{Query: q}
	for _, e := range list {
		d.Entries = append(d.Entries, auditJSON{ID: e.ID, Actor: e.Actor, ActorEmail: e.ActorEmail, Action: e.Action,
			Resource: e.Resource, Changes: e.Changes, InsertedAt: e.InsertedAt.UTC()})
	}
	if more {
		d.Older = list[len(list)-1].ID
	}
	return c.render(ctx, fiber.StatusOK, "audit", view{Title: "Audit log", Nav: "audit", Data: d})
}

func (c *Console) livePage(ctx *fiber.Ctx) error {
	v, err := c.live(ctx.UserContext(), defaultTop)
	status, msg := fiber.StatusOK, ""
	switch {
	case errors.Is(err, errNoLiveView):
		// A setting, not an outage: retrying does not help.
		msg = "No sidecar is configured (LIMITER_ADDR), so there is no live view."
	case err != nil:
		c.Logger.Warn("console: the sidecar did not answer", "request_id", requestID(ctx), "error", err)
		status, msg = fiber.StatusServiceUnavailable, "The sidecar did not answer; this page tries again in a few seconds."
	}
	if status != fiber.StatusOK {
		ctx.Set(fiber.HeaderRetryAfter, strconv.Itoa(refreshSeconds))
	}
	return c.render(ctx, status, "limits", view{Title: "Limits", Nav: "limits", Refresh: refreshSeconds, Error: msg, Data: v})
}
