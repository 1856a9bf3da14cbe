package console

import (
	"bytes"
	"encoding/json"
	"errors"
	"mime"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/gofiber/fiber/v2"

	"github.com/converger/edge/core/store"
	"github.com/converger/edge/shared/apierror"
	"github.com/converger/edge/shared/buckets"
	"github.com/converger/edge/shared/ids"
)

// apiPrefix is where the admin API lives.
const apiPrefix = "/admin/api/v1"

// Paging of the lists.
const (
	defaultPage = 50
	maxPage     = 200
)

func (c *Console) registerAPI(r fiber.Router) {
	api := r.Group(apiPrefix, c.apiHeaders, c.withDeadline, c.authAPI)
	c.handle(api, fiber.MethodGet, "/tenants", c.listTenants)
	c.handle(api, fiber.MethodGet, "/tenants/:id", c.getTenant)
	c.handle(api, fiber.MethodPost, "/tenants/:id/activate", c.setStatus(store.StatusActive))
	c.handle(api, fiber.MethodPost, "/tenants/:id/deactivate", c.setStatus(store.StatusInactive))
	c.handle(api, fiber.MethodGet, "/tenants/:id/channels", c.listChannels)
	c.handle(api, fiber.MethodGet, "/tenants/:id/limits", c.getLimits)
	c.handle(api, fiber.MethodPatch, "/tenants/:id/limits", c.patchLimits)
	c.handle(api, fiber.MethodDelete, "/tenants/:id/limits", c.clearLimits)
	c.handle(api, fiber.MethodDelete, "/tenants/:id/limits/:bucket", c.clearLimits)
	c.handle(api, fiber.MethodGet, "/audit", c.listAudit)
	c.handle(api, fiber.MethodGet, "/live", c.getLive)
}

// apiHeaders marks every answer of the API as not to be cached, refuses bodies over
// maxBody, and sends unknown paths and methods to apiFallback, before anything is
// authenticated.
func (c *Console) apiHeaders(ctx *fiber.Ctx) error {
	ctx.Set(fiber.HeaderCacheControl, "no-store")
	ctx.Set(fiber.HeaderXContentTypeOptions, "nosniff")
	for _, rt := range c.routes {
		if rt.method == ctx.Method() || (rt.method == fiber.MethodGet && ctx.Method() == fiber.MethodHead) {
			if rt.matches(ctx.Path()) {
				if len(ctx.Body()) > maxBody {
					return fail(ctx, errTooLarge, map[string]any{"max_bytes": maxBody})
				}
				return ctx.Next()
			}
		}
	}
	return c.apiFallback(ctx)
}

// ok answers 200 with {"data": data} and, when meta is not nil, {"meta": meta}.
func ok(ctx *fiber.Ctx, data, meta any) error {
	body := map[string]any{"data": data}
	if meta != nil {
		body["meta"] = meta
	}
	return ctx.Status(fiber.StatusOK).JSON(body)
}

// badParam answers 400 naming a query parameter.
func badParam(ctx *fiber.Ctx, name, why string) error {
	return fail(ctx, apierror.BadRequest.WithMessage("The query parameter "+name+" "+why+"."), map[string]any{"parameter": name})
}

// param reads a query parameter: at most maxParam bytes of UTF-8 without control
// characters.
func param(ctx *fiber.Ctx, name string) (string, bool) {
	v := ctx.Query(name)
	if len(v) > maxParam || !utf8.ValidString(v) || strings.ContainsFunc(v, func(r rune) bool { return r < 0x20 || r == 0x7f }) {
		return "", false
	}
	return strings.Clone(v), true
}

// pageSize reads ?limit= (default defaultPage, 1 to maxPage).
func pageSize(ctx *fiber.Ctx) (int, bool) {
	v := ctx.Query("limit")
	if v == "" {
		return defaultPage, true
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 || n > maxPage {
		return 0, false
	}
	return n, true
}

// tenantID reads the :id of the path; anything but a UUID is not found.
func tenantID(ctx *fiber.Ctx) (string, bool) {
	id := ctx.Params("id")
	if !ids.IsUUID(id) {
		return "", false
	}
	return strings.ToLower(id), true
}

type tenantJSON struct {
	ID             string    `json:"id"`
	Name           string    `json:"name"`
	Status         string    `json:"status"`
	APIKeyPrefix   string    `json:"api_key_prefix"`
	Channels       int       `json:"channels"`
	AllowedOrigins []string  `json:"allowed_origins"`
	InsertedAt     time.Time `json:"inserted_at"`
	UpdatedAt      time.Time `json:"updated_at"`
}

func tenantOut(t store.TenantInfo) tenantJSON {
	origins := t.AllowedOrigins
	if origins == nil {
		origins = []string{}
	}
	return tenantJSON{ID: t.ID, Name: t.Name, Status: t.Status, APIKeyPrefix: t.APIKeyPrefix, Channels: t.Channels,
		AllowedOrigins: origins, InsertedAt: t.InsertedAt.UTC(), UpdatedAt: t.UpdatedAt.UTC()}
}

type pageMeta struct {
	Limit      int    `json:"limit"`
	HasMore    bool   `json:"has_more"`
	NextCursor string `json:"next_cursor"`
}

func (c *Console) listTenants(ctx *fiber.Ctx) error {
	q, good := param(ctx, "q")
	if !good {
		return badParam(ctx, "q", "must be at most 256 bytes of UTF-8 text")
	}
	limit, good := pageSize(ctx)
	if !good {
		return badParam(ctx, "limit", "must be a whole number from 1 to "+strconv.Itoa(maxPage))
	}
	cursor, err := store.ParseCursor(ctx.Query("cursor"))
	if err != nil {
		return badParam(ctx, "cursor", "is not one this API gave")
	}
	list, more, err := c.Store.Tenants(ctx.UserContext(), q, cursor, limit)
	if err != nil {
		return c.storeError(ctx, err, "")
	}
	out := make([]tenantJSON, 0, len(list))
	for _, t := range list {
		out = append(out, tenantOut(t))
	}
	meta := pageMeta{Limit: limit, HasMore: more}
	if more {
		last := list[len(list)-1]
		meta.NextCursor = store.Cursor{Name: last.Name, ID: last.ID}.String()
	}
	return ok(ctx, out, meta)
}

func (c *Console) getTenant(ctx *fiber.Ctx) error {
	id, good := tenantID(ctx)
	if !good {
		return fail(ctx, apierror.NotFound, nil)
	}
	t, err := c.Store.TenantByID(ctx.UserContext(), id)
	if err != nil {
		return c.storeError(ctx, err, "")
	}
	return ok(ctx, tenantOut(t), nil)
}

// setStatus activates or deactivates a tenant: its API keys, channels, tokens and
// portal users stop (or start) working, in the sidecars at once.
func (c *Console) setStatus(status string) fiber.Handler {
	return func(ctx *fiber.Ctx) error {
		id, good := tenantID(ctx)
		if !good {
			return fail(ctx, apierror.NotFound, nil)
		}
		_, changed, err := actorOf(ctx).operator(c.Store).SetTenantStatus(ctx.UserContext(), id, status)
		if err != nil {
			return c.storeError(ctx, err, "status")
		}
		t, err := c.Store.TenantByID(ctx.UserContext(), id)
		if err != nil {
			return c.storeError(ctx, err, "")
		}
		return ok(ctx, tenantOut(t), map[string]any{"changed": changed})
	}
}

type channelJSON struct {
	ID               string    `json:"id"`
	TenantID         string    `json:"tenant_id"`
	Name             string    `json:"name"`
	Type             string    `json:"type"`
	Mode             string    `json:"mode"`
	Status           string    `json:"status"`
	RequireSignature bool      `json:"require_signature"`
	InsertedAt       time.Time `json:"inserted_at"`
	UpdatedAt        time.Time `json:"updated_at"`
}

func channelOut(ch store.ChannelInfo) channelJSON {
	return channelJSON{ID: ch.ID, TenantID: ch.TenantID, Name: ch.Name, Type: ch.Type, Mode: ch.Mode, Status: ch.Status,
		RequireSignature: ch.RequireSignature, InsertedAt: ch.InsertedAt.UTC(), UpdatedAt: ch.UpdatedAt.UTC()}
}

func (c *Console) listChannels(ctx *fiber.Ctx) error {
	id, good := tenantID(ctx)
	if !good {
		return fail(ctx, apierror.NotFound, nil)
	}
	limit, good := pageSize(ctx)
	if !good {
		return badParam(ctx, "limit", "must be a whole number from 1 to "+strconv.Itoa(maxPage))
	}
	cursor, err := store.ParseCursor(ctx.Query("cursor"))
	if err != nil {
		return badParam(ctx, "cursor", "is not one this API gave")
	}
	list, more, err := c.Store.TenantChannels(ctx.UserContext(), id, cursor, limit)
	if err != nil {
		return c.storeError(ctx, err, "")
	}
	out := make([]channelJSON, 0, len(list))
	for _, ch := range list {
		out = append(out, channelOut(ch))
	}
	meta := pageMeta{Limit: limit, HasMore: more}
	if more {
		last := list[len(list)-1]
		meta.NextCursor = store.Cursor{Name: last.Name, ID: last.ID}.String()
	}
	return ok(ctx, out, meta)
}

func (c *Console) getLimits(ctx *fiber.Ctx) error {
	id, good := tenantID(ctx)
	if !good {
		return fail(ctx, apierror.NotFound, nil)
	}
	v, err := c.tenantLimits(ctx.UserContext(), id)
	if err != nil {
		return c.storeError(ctx, err, "")
	}
	return ok(ctx, v, nil)
}

// jsonBody checks a write's body: at most maxBody bytes, not compressed, JSON by its
// content type, UTF-8, an object. It answers the error itself when it returns nil.
func jsonBody(ctx *fiber.Ctx) (map[string]json.RawMessage, error) {
	if enc := ctx.Get(fiber.HeaderContentEncoding); enc != "" && !strings.EqualFold(enc, "identity") {
		return nil, fail(ctx, errMediaType, nil)
	}
	if mt, _, err := mime.ParseMediaType(ctx.Get(fiber.HeaderContentType)); err != nil || (mt != fiber.MIMEApplicationJSON && !strings.HasSuffix(mt, "+json")) {
		return nil, fail(ctx, errMediaType, nil)
	}
	body := ctx.Body()
	if len(body) > maxBody {
		return nil, fail(ctx, errTooLarge, map[string]any{"max_bytes": maxBody})
	}
	if !utf8.Valid(body) {
		return nil, fail(ctx, apierror.BadRequest.WithMessage("The body is not valid UTF-8."), nil)
	}
	var doc map[string]json.RawMessage
	if err := json.Unmarshal(body, &doc); err != nil || doc == nil {
		return nil, fail(ctx, apierror.BadRequest.WithMessage("The body must be a JSON object."), nil)
	}
	return doc, nil
}

// patchLimits merges overrides into the tenant's, with the validation of `core limits
// set`: {"limits": {"inbound": {"limit": 2000, "scale_ms": 1000}, ...}}.
func (c *Console) patchLimits(ctx *fiber.Ctx) error {
	id, good := tenantID(ctx)
	if !good {
		return fail(ctx, apierror.NotFound, nil)
	}
	doc, err := jsonBody(ctx)
	if doc == nil {
		return err
	}
	fields := map[string][]string{}
	for k := range doc {
		if k != "limits" {
			fields[k] = append(fields[k], "unknown field (only limits)")
		}
	}
	set, errs := parseOverrides(doc["limits"])
	for k, v := range errs {
		fields[k] = v
	}
	if len(fields) > 0 {
		return fail(ctx, errValidation, map[string]any{"fields": fields})
	}
	ch, err := actorOf(ctx).operator(c.Store).SetLimits(ctx.UserContext(), id, set)
	if err != nil {
		return c.storeError(ctx, err, "limits")
	}
	return c.answerLimits(ctx, id, ch)
}

// parseOverrides reads the limits object of a PATCH: each key an overridable bucket,
// each value what tenants.limits stores, checked as `core limits set` checks it.
func parseOverrides(raw json.RawMessage) (buckets.Overrides, map[string][]string) {
	errs := map[string][]string{}
	var doc map[string]json.RawMessage
	if len(bytes.TrimSpace(raw)) == 0 {
		errs["limits"] = []string{"is required: an object of overrides by bucket"}
		return nil, errs
	}
	if err := json.Unmarshal(raw, &doc); err != nil || doc == nil {
		errs["limits"] = []string{`must be an object such as {"inbound": {"limit": 2000, "scale_ms": 1000}}`}
		return nil, errs
	}
	if len(doc) == 0 {
		errs["limits"] = []string{"names no bucket"}
		return nil, errs
	}
	set := buckets.Overrides{}
	for name, val := range doc {
		one, err := json.Marshal(map[string]json.RawMessage{name: val})
		if err == nil {
			var o buckets.Overrides
			if o, err = buckets.ParseOverrides(one); err == nil {
				err = store.CheckOverride(name, o[name])
				set[name] = o[name]
			}
		}
		if err != nil {
			field := "limits." + name
			if !utf8.ValidString(name) || len(name) > 64 {
				field = "limits"
			}
			errs[field] = append(errs[field], strings.TrimPrefix(err.Error(), "limits."+name+": "))
		}
	}
	return set, errs
}

// clearLimits drops a tenant's overrides: one bucket's, or all of them.
func (c *Console) clearLimits(ctx *fiber.Ctx) error {
	id, good := tenantID(ctx)
	if !good {
		return fail(ctx, apierror.NotFound, nil)
	}
	var names []string
	if b := ctx.Params("bucket"); b != "" {
		names = []string{strings.Clone(b)}
	}
	ch, err := actorOf(ctx).operator(c.Store).ClearLimits(ctx.UserContext(), id, names)
	if err != nil {
		return c.storeError(ctx, err, "bucket")
	}
	return c.answerLimits(ctx, id, ch)
}

func (c *Console) answerLimits(ctx *fiber.Ctx, id string, ch store.LimitsChange) error {
	v, err := c.tenantLimits(ctx.UserContext(), id)
	if err != nil {
		return c.storeError(ctx, err, "")
	}
	return ok(ctx, v, map[string]any{"changed": ch.Changed})
}

type auditJSON struct {
	ID         int64           `json:"id"`
	Actor      string          `json:"actor"`
	ActorEmail string          `json:"actor_email"`
	Action     string          `json:"action"`
	Resource   string          `json:"resource"`
	Changes    json.RawMessage `json:"changes"`
	InsertedAt time.Time       `json:"inserted_at"`
}

// auditQuery reads the audit log's filters; bad names the parameter that is not valid.
func auditQuery(ctx *fiber.Ctx) (q store.AuditQuery, bad string) {
	var good bool
	for _, f := range []struct {
		name string
		to   *string
	}{{"actor", &q.Actor}, {"action", &q.Action}, {"resource", &q.Resource}} {
		if *f.to, good = param(ctx, f.name); !good {
			return q, f.name
		}
	}
	if v := ctx.Query("before"); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < 1 {
			return q, "before"
		}
		q.Before = n
	}
	if q.Limit, good = pageSize(ctx); !good {
		return q, "limit"
	}
	return q, ""
}

func (c *Console) listAudit(ctx *fiber.Ctx) error {
	q, bad := auditQuery(ctx)
	switch bad {
	case "":
	case "before":
		return badParam(ctx, bad, "must be an entry id, a positive whole number")
	case "limit":
		return badParam(ctx, bad, "must be a whole number from 1 to "+strconv.Itoa(maxPage))
	default:
		return badParam(ctx, bad, "must be at most 256 bytes of UTF-8 text")
	}
	list, more, err := c.Store.SearchAuditLogs(ctx.UserContext(), q)
	if err != nil {
		return c.storeError(ctx, err, "")
	}
	out := make([]auditJSON, 0, len(list))
	for _, e := range list {
		out = append(out, auditJSON{ID: e.ID, Actor: e.Actor, ActorEmail: e.ActorEmail, Action: e.Action, Resource: e.Resource,
			Changes: e.Changes, InsertedAt: e.InsertedAt.UTC()})
	}
	meta := map[string]any{"limit": q.Limit, "has_more": more, "next_before": nil}
	if more {
		meta["next_before"] = list[len(list)-1].ID
	}
	return ok(ctx, out, meta)
}

func (c *Console) getLive(ctx *fiber.Ctx) error {
	top := defaultTop
	if v := ctx.Query("top"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > maxTop {
			return badParam(ctx, "top", "must be a whole number from 1 to "+strconv.Itoa(maxTop))
		}
		top = n
	}
	v, err := c.live(ctx.UserContext(), top)
	switch {
	case errors.Is(err, errNoLiveView):
		return fail(ctx, errNoSidecar, nil)
	case err != nil:
		c.Logger.Warn("console: the sidecar did not answer", "request_id", requestID(ctx), "error", err)
		return fail(ctx, errSidecar, nil)
	}
	return ok(ctx, v, nil)
}
