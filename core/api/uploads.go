package api

// Uploads (POST /conversations/:id/upload) and attachment downloads
// (GET /attachments/:id). An upload stores its files in the attachments table and
// creates one activity that carries them as {"contentType","contentUrl","name"}; the
// contentUrl is signed and expires, so that Web Chat can show it (an <img>, a link)
// without an Authorization header: the URL is the credential. The signing secret is
// derived from TOKEN_SIGNING_KEY, so every core instance accepts every other's URLs,
// and URLs are signed afresh each time a stream sends the activity.

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"io"
	"mime"
	"mime/multipart"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/gofiber/fiber/v2"
	"github.com/google/uuid"

	"github.com/converger/edge/core/activity"
	"github.com/converger/edge/core/store"
	"github.com/converger/edge/shared/apierror"
	"github.com/converger/edge/shared/ids"
)

const (
	// maxUploadFiles is how many files one upload may carry.
	maxUploadFiles = 10
	// maxActivityPart bounds the activity part of an upload (its text and channelData
	// have their own, smaller limits).
	maxActivityPart = 256 << 10
	// uploadOverhead is what an upload body may hold beyond its files: the activity
	// part and the multipart framing.
	uploadOverhead = maxActivityPart + 64<<10
	// attachmentURLLifetime is how long a signed contentUrl works.
	attachmentURLLifetime = time.Hour
	// maxAttachmentName bounds a stored file name, in bytes.
	maxAttachmentName = 200
	// attachmentsPath is where downloads are served, under the client API.
	attachmentsPath = "/api/v1/converger/attachments/"
	// activityPartType is how botframework-directlinejs labels the activity part.
	activityPartType = "application/vnd.microsoft.activity"
)

// uploadContentTypes are the media types an upload may carry. Types a browser would
// run (HTML, SVG, JavaScript, XML) are not among them.
var uploadContentTypes = map[string]bool{
	"image/png": true, "image/jpeg": true, "image/gif": true, "image/webp": true, "image/bmp": true,
	"application/pdf": true, "text/plain": true, "text/csv": true,
	"application/octet-stream": true, "application/zip": true,
	"audio/mpeg": true, "audio/ogg": true, "audio/wav": true, "audio/x-wav": true, "audio/webm": true, "audio/mp4": true,
	"video/mp4": true, "video/webm": true,
	"application/vnd.openxmlformats-officedocument.wordprocessingml.document":   true,
	"application/vnd.openxmlformats-officedocument.spreadsheetml.sheet":         true,
	"application/vnd.openxmlformats-officedocument.presentationml.presentation": true,
}

// inlineContentTypes are shown in the browser; everything else is downloaded.
var inlineContentTypes = map[string]bool{
	"image/png": true, "image/jpeg": true, "image/gif": true, "image/webp": true, "image/bmp": true,
}

var (
	errUnsupportedMediaType = apierror.Error{Status: 415, Code: "unsupported_media_type", Message: "This type of file is not accepted."}
	errNotMultipart         = apierror.Error{Status: 415, Code: "unsupported_media_type", Message: "An upload is a multipart/form-data body."}
	errNoFiles              = apierror.BadRequest.WithMessage("An upload carries at least one file part named \"file\".")
	errBadMultipart         = apierror.BadRequest.WithMessage("The multipart body is malformed.")
	errUploadTooLarge       = errPayloadTooLarge.WithMessage("The files are too large.")
	errAttachmentSignature  = apierror.Forbidden.WithMessage("The attachment link is invalid or expired.")
	errAttachmentInactive   = apierror.Forbidden.WithMessage("The attachment's channel or tenant is inactive.")
)

// uploadRoutes registers the upload and the download of attachments. The download
// takes no token: its signed URL is the credential.
func (s *server) uploadRoutes(r fiber.Router) {
	r.Post("/conversations/:id/upload", s.requireToken, s.clientUpload)
	r.Get("/attachments/:id", s.attachmentDownload)
}

// POST /conversations/:id/upload?userId=: multipart with one or more "file" parts and
// an optional "activity" part (JSON; botframework-directlinejs sends it as a file part
// of type application/vnd.microsoft.activity). The activity takes only type, text and
// channelData from that part (ADR-0005: the upload builds its activity explicitly);
// the sender is its from.id, else userId, else "user". 200 {"id"}.
func (s *server) clientUpload(c *fiber.Ctx) error {
	conv, ok, err := s.clientConversation(c)
	if !ok {
		return err
	}
	ctx := c.UserContext()
	if conv.Status != "active" {
		return fail(c, errConversationClosed, nil)
	}
	if mt, _, err := mime.ParseMediaType(c.Get(fiber.HeaderContentType)); err != nil || mt != fiber.MIMEMultipartForm {
		return fail(c, errNotMultipart, nil)
	}
	if len(c.Body()) > s.MaxUploadBytes+uploadOverhead {
		return fail(c, errUploadTooLarge, map[string]any{"max_bytes": s.MaxUploadBytes})
	}
	form, err := c.MultipartForm()
	if err != nil {
		return fail(c, errBadMultipart, nil)
	}
	defer func() { _ = form.RemoveAll() }()

	files := form.File["file"]
	switch {
	case len(files) == 0:
		return fail(c, errNoFiles, nil)
	case len(files) > maxUploadFiles:
		return failValidation(c, activity.FieldErrors{"file": {"at most " + strconv.Itoa(maxUploadFiles) + " files"}})
	}
	var total int64
	for _, fh := range files {
		total += fh.Size
	}
	if total > int64(s.MaxUploadBytes) {
		return fail(c, errUploadTooLarge, map[string]any{"max_bytes": s.MaxUploadBytes})
	}

	// The activity part.
	body, perr := activityPart(form)
	if perr != nil {
		return fail(c, *perr, nil)
	}
	var client activity.Client
	sender := "user"
	if userID := c.Query("userId"); userID != "" {
		if !validUserID(userID) {
			return failValidation(c, activity.FieldErrors{"userId": {"must be at most " + strconv.Itoa(maxUserID) + " bytes"}})
		}
		sender = userID
	}
	if body != nil {
		fields, errs := bodyObject(body)
		if errs != nil {
			return failValidation(c, activity.FieldErrors{"activity": {"must be a JSON object"}})
		}
		// The attachments are the files; whatever the part lists is not taken.
		delete(fields, "attachments")
		body, _ = json.Marshal(fields)
		if client, errs = activity.FromDirectLine(body); errs != nil {
			return failValidation(c, errs)
		}
		sender = activity.Sender(body, sender)
	}

	// The files.
	stored := make([]store.NewAttachment, 0, len(files))
	for i, fh := range files {
		ct, ok := uploadContentType(fh.Header.Get(fiber.HeaderContentType))
		if !ok {
			return fail(c, errUnsupportedMediaType, map[string]any{"file": i, "content_type": truncate(fh.Header.Get(fiber.HeaderContentType), 100)})
		}
		b, err := readPart(fh)
		if err != nil {
			return fail(c, errBadMultipart, nil)
		}
		stored = append(stored, store.NewAttachment{ID: uuid.NewString(), Name: safeFilename(fh.Filename), ContentType: ct, Bytes: b})
	}
	client.Attachments = make([]json.RawMessage, 0, len(stored))
	for _, f := range stored {
		a, _ := marshalJSON(attachmentJSON{ContentType: f.ContentType, ContentURL: s.attachmentURL(f.ID), Name: f.Name})
		client.Attachments = append(client.Attachments, a)
	}
	// Validated before the files are stored, so that a refused activity stores nothing
	// (CreateActivity validates again).
	check := client
	if errs := check.Validate(s.Limits); errs != nil {
		// Named as the client sent them (channelData rather than metadata).
		return activityError(c, channelDataErrors(body, errs), apierror.NotFound)
	}
	if err := s.Store.CreateAttachments(ctx, conv.TenantID, conv.ID, stored); err != nil {
		if errors.Is(err, store.ErrNotFound) {
			return fail(c, apierror.NotFound, nil)
		}
		return err
	}
	a, _, err := s.Store.CreateActivity(ctx, client, activity.System{TenantID: conv.TenantID, ConversationID: conv.ID, Sender: sender})
	if err != nil {
		ids := make([]string, len(stored))
		for i, f := range stored {
			ids[i] = f.ID
		}
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if derr := s.Store.DeleteAttachments(dctx, conv.TenantID, ids); derr != nil {
			s.Logger.Warn("upload: attachments of a refused activity not deleted", "request_id", requestID(c), "error", derr)
		}
		return activityError(c, err, apierror.NotFound)
	}
	s.echo(c, a)
	return c.JSON(fiber.Map{"id": a.ID})
}

// activityPart returns the activity part of an upload (nil when there is none): a form
// value, or a file part of any name-compatible type.
func activityPart(form *multipart.Form) ([]byte, *apierror.Error) {
	if v := form.Value["activity"]; len(v) > 0 {
		if len(v[0]) > maxActivityPart {
			e := errPayloadTooLarge.WithMessage("The activity part is too large.")
			return nil, &e
		}
		return []byte(v[0]), nil
	}
	f := form.File["activity"]
	if len(f) == 0 {
		return nil, nil
	}
	if f[0].Size > maxActivityPart {
		e := errPayloadTooLarge.WithMessage("The activity part is too large.")
		return nil, &e
	}
	if mt, _, err := mime.ParseMediaType(f[0].Header.Get(fiber.HeaderContentType)); err == nil &&
		mt != activityPartType && mt != fiber.MIMEApplicationJSON && mt != fiber.MIMEOctetStream && mt != fiber.MIMETextPlain {
		e := errUnsupportedMediaType.WithMessage("The activity part is JSON (" + activityPartType + ").")
		return nil, &e
	}
	b, err := readPart(f[0])
	if err != nil {
		return nil, &errBadMultipart
	}
	return b, nil
}

// readPart reads a file part (in memory: the body limit keeps them small).
func readPart(fh *multipart.FileHeader) ([]byte, error) {
	f, err := fh.Open()
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return io.ReadAll(io.LimitReader(f, fh.Size+1))
}

// uploadContentType normalises a part's Content-Type (none is
// application/octet-stream) and reports whether it is accepted. Parameters are dropped
// but a text type's charset.
func uploadContentType(header string) (string, bool) {
	if strings.TrimSpace(header) == "" {
		return fiber.MIMEOctetStream, true
	}
	mt, params, err := mime.ParseMediaType(header)
	if err != nil || !uploadContentTypes[mt] {
		return "", false
	}
	if cs := strings.ToLower(params["charset"]); strings.HasPrefix(mt, "text/") && cs != "" {
		if out := mime.FormatMediaType(mt, map[string]string{"charset": cs}); out != "" && len(out) < 100 {
			return out, true
		}
	}
	return mt, true
}

// safeFilename keeps the last path element of a client's file name, without control,
// format (bidirectional overrides) or quoting characters, cut to maxAttachmentName
// bytes; "attachment" when nothing is left.
func safeFilename(name string) string {
	if i := strings.LastIndexAny(name, `/\`); i >= 0 {
		name = name[i+1:]
	}
	var b strings.Builder
	for _, r := range name {
		if r == utf8.RuneError || unicode.IsControl(r) || unicode.Is(unicode.Cf, r) || r == '"' || r == '\'' || r == '`' ||
			r == ';' || r == '%' {
			continue
		}
		if b.Len()+utf8.RuneLen(r) > maxAttachmentName {
			break
		}
		b.WriteRune(r)
	}
	out := strings.Trim(b.String(), " .")
	if out == "" {
		return "attachment"
	}
	return out
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	s = s[:n]
	for len(s) > 0 && !utf8.ValidString(s) {
		s = s[:len(s)-1]
	}
	return s
}

// attachmentJSON is an attachment of an upload's activity.
type attachmentJSON struct {
	ContentType string `json:"contentType"`
	ContentURL  string `json:"contentUrl"`
	Name        string `json:"name"`
}

// processAttachmentKey signs URLs when there is no TOKEN_SIGNING_KEY to derive from
// (only this process accepts them).
var processAttachmentKey = sync.OnceValue(func() []byte {
	k := make([]byte, 32)
	_, _ = rand.Read(k)
	return k
})

// attachmentKey is the secret of signed attachment URLs: derived from the token
// signing key, so that every instance with the same key accepts them.
func (s *server) attachmentKey() []byte {
	if s.Signer == nil {
		return processAttachmentKey()
	}
	return s.Signer.DeriveKey("attachment-url")
}

// attachmentSignature is the base64url HMAC-SHA256 of an attachment id and an expiry.
func (s *server) attachmentSignature(id, exp string) string {
	m := hmac.New(sha256.New, s.attachmentKey())
	m.Write([]byte("attachment\x00" + id + "\x00" + exp))
	return base64.RawURLEncoding.EncodeToString(m.Sum(nil))
}

// attachmentURL is a signed contentUrl for an attachment, valid for
// attachmentURLLifetime.
func (s *server) attachmentURL(id string) string {
	exp := strconv.FormatInt(s.Now().Add(attachmentURLLifetime).Unix(), 10)
	return s.PublicURL + attachmentsPath + id + "?exp=" + exp + "&sig=" + s.attachmentSignature(id, exp)
}

// validAttachmentURL checks a download's signature (constant time) and expiry.
func (s *server) validAttachmentURL(id, exp, sig string) bool {
	if len(exp) == 0 || len(exp) > 12 || len(sig) > 64 {
		return false
	}
	t, err := strconv.ParseInt(exp, 10, 64)
	if err != nil || t < 0 {
		return false
	}
	want := s.attachmentSignature(id, exp)
	if !hmac.Equal([]byte(sig), []byte(want)) {
		return false
	}
	return s.Now().Unix() <= t
}

// freshAttachmentURLs signs afresh the contentUrls of this core's attachments in an
// activity's attachments, so that an activity read later than attachmentURLLifetime
// still shows its files. Other attachments are left as they are.
func (s *server) freshAttachmentURLs(raw json.RawMessage) json.RawMessage {
	prefix := s.PublicURL + attachmentsPath
	if !bytes.Contains(raw, []byte(prefix)) {
		return raw
	}
	var list []map[string]json.RawMessage
	if json.Unmarshal(raw, &list) != nil {
		return raw
	}
	changed := false
	for _, a := range list {
		var u string
		if a == nil || json.Unmarshal(a["contentUrl"], &u) != nil {
			continue
		}
		rest, ok := strings.CutPrefix(u, prefix)
		if !ok {
			continue
		}
		id, _, _ := strings.Cut(rest, "?")
		if !ids.IsUUID(id) {
			continue
		}
		a["contentUrl"], _ = marshalJSON(s.attachmentURL(id))
		changed = true
	}
	if !changed {
		return raw
	}
	out, err := marshalJSON(list)
	if err != nil {
		return raw
	}
	return out
}

// GET /attachments/:id?exp=&sig=: the bytes of an attachment, for whoever holds a
// valid signed URL. A bad or expired signature is 403 (checked first, so that ids
// cannot be probed); an unknown attachment 404; an attachment whose channel or tenant is
// inactive 403.
func (s *server) attachmentDownload(c *fiber.Ctx) error {
	id := c.Params("id")
	if !s.validAttachmentURL(id, c.Query("exp"), c.Query("sig")) {
		return fail(c, errAttachmentSignature, nil)
	}
	if !ids.IsUUID(id) {
		return fail(c, apierror.NotFound, nil)
	}
	a, err := s.Store.Attachment(c.UserContext(), "", strings.ToLower(id))
	if errors.Is(err, store.ErrNotFound) {
		return fail(c, apierror.NotFound, nil)
	}
	if err != nil {
		return err
	}
	if !a.Active {
		// As its tokens (403) and its API key (401): a deactivated tenant's or
		// channel's links stop working at once, not when they expire.
		return fail(c, errAttachmentInactive, nil)
	}
	if ok, err := s.checkTenantOrigin(c, a.TenantID); !ok {
		return err
	}
	mt, _, _ := mime.ParseMediaType(a.ContentType)
	disposition := "attachment"
	if inlineContentTypes[mt] {
		disposition = "inline"
	}
	cd := mime.FormatMediaType(disposition, map[string]string{"filename": safeFilename(a.Name)})
	if cd == "" {
		cd = disposition + `; filename="attachment"`
	}
	c.Set(fiber.HeaderContentType, a.ContentType)
	c.Set(fiber.HeaderXContentTypeOptions, "nosniff")
	c.Set(fiber.HeaderContentDisposition, cd)
	c.Set(fiber.HeaderCacheControl, "private")
	c.Set(fiber.HeaderContentSecurityPolicy, "default-src 'none'; sandbox")
	return c.Send(a.Bytes)
}
