package api_test

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"io"
	"mime/multipart"
	"net/http"
	"net/textproto"
	"net/url"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/converger/edge/core/api"
)

// uploadPart is one part of an upload: a file when filename is set, else a form value.
type uploadPart struct {
	field, filename, contentType string
	body                         []byte
}

func filePart(name, contentType string, body []byte) uploadPart {
	return uploadPart{field: "file", filename: name, contentType: contentType, body: body}
}

// activityPart is the activity as botframework-directlinejs sends it: a file part.
func activityPart(activity any) uploadPart {
	b, _ := json.Marshal(activity)
	return uploadPart{field: "activity", filename: "blob", contentType: "application/vnd.microsoft.activity", body: b}
}

// upload posts a multipart upload with a bearer token.
func (e *env) upload(conv, tok, query string, parts ...uploadPart) response {
	e.t.Helper()
	var buf bytes.Buffer
	w := multipart.NewWriter(&buf)
	for _, p := range parts {
		h := textproto.MIMEHeader{}
		// As browsers write them: UTF-8 as it is, quotes and backslashes escaped.
		quote := strings.NewReplacer(`\`, `\\`, `"`, `\"`).Replace
		if p.filename != "" {
			h.Set("Content-Disposition", `form-data; name="`+quote(p.field)+`"; filename="`+quote(p.filename)+`"`)
		} else {
			h.Set("Content-Disposition", `form-data; name="`+quote(p.field)+`"`)
		}
		if p.contentType != "" {
			h.Set("Content-Type", p.contentType)
		}
		pw, err := w.CreatePart(h)
		if err != nil {
			e.t.Fatal(err)
		}
		_, _ = pw.Write(p.body)
	}
	_ = w.Close()
	path := "/api/v1/converger/conversations/" + conv + "/upload"
	if query != "" {
		path += "?" + query
	}
	return e.do("POST", path, buf.Bytes(), map[string]string{"authorization": "Bearer " + tok, "content-type": w.FormDataContentType()})
}

func randomBytes(n int) []byte {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return b
}

// get fetches a URL without credentials.
func get(t *testing.T, u string) response {
	t.Helper()
	resp, err := http.Get(u)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return response{status: resp.StatusCode, header: resp.Header, body: b}
}

// uploadedActivity lists the conversation through the client API and returns the
// activity with this id.
func (e *env) uploadedActivity(s streamConv, id string) streamActivity {
	e.t.Helper()
	r := e.do("GET", "/api/v1/converger/conversations/"+s.conv+"/activities", nil, map[string]string{"authorization": "Bearer " + s.tok})
	var l struct {
		Activities []streamActivity `json:"activities"`
	}
	r.json(e.t, &l)
	for _, a := range l.Activities {
		if a.ID == id {
			return a
		}
	}
	e.t.Fatalf("activity %s not listed: %s", id, r.body)
	return streamActivity{}
}

func uploadID(t *testing.T, r response) string {
	t.Helper()
	var b struct {
		ID string `json:"id"`
	}
	r.json(t, &b)
	if r.status != 200 || b.ID == "" {
		t.Fatalf("upload: %d %s", r.status, r.body)
	}
	return b.ID
}

func TestUploadStoresFilesAndOneActivity(t *testing.T) {
	e := newEnv(t, envOptions{})
	b := e.streamInstance(nil)
	s := e.streamConv()
	w := dialStream(t, e.base, streamPath(s.conv, s.tok, ""), nil).start()
	png, pdf, txt := randomBytes(3000), randomBytes(5000), []byte("hello\n")
	r := e.upload(s.conv, s.tok, "userId=from-query",
		activityPart(map[string]any{
			"type": "message", "text": "look", "from": map[string]string{"id": "alice"},
			"channelData": map[string]any{"clientActivityID": "c-1"},
			"attachments": []map[string]string{{"contentType": "image/png", "name": "ignored.png"}},
			// Server fields are ignored.
			"id": "forged", "timestamp": "2000-01-01T00:00:00Z", "conversationId": "other",
		}),
		filePart("photo.png", "image/png", png),
		filePart("doc.pdf", "application/pdf", pdf),
		filePart(`..\..\evil"na`+"\u202e"+`me.txt`, "text/plain; charset=UTF-8", txt),
	)
	id := uploadID(t, r)
	got, _ := w.expect(5*time.Second, "look")
	for _, a := range []streamActivity{e.uploadedActivity(s, id), got[0]} {
		if a.ID != id || a.From.ID != "alice" || a.Type != "message" || a.ChannelData["clientActivityID"] != "c-1" ||
			a.ConversationID != s.conv || strings.HasPrefix(a.Timestamp, "2000") {
			t.Fatalf("activity: %+v", a)
		}
		if len(a.Attachments) != 3 {
			t.Fatalf("attachments: %+v", a.Attachments)
		}
		want := []struct {
			contentType, name, disposition string
			body                           []byte
		}{
			{"image/png", "photo.png", `inline; filename=photo.png`, png},
			{"application/pdf", "doc.pdf", `attachment; filename=doc.pdf`, pdf},
			{"text/plain; charset=utf-8", "evilname.txt", `attachment; filename=evilname.txt`, txt},
		}
		for i, att := range a.Attachments {
			u, _ := att["contentUrl"].(string)
			if att["contentType"] != want[i].contentType || att["name"] != want[i].name || !strings.HasPrefix(u, e.base+"/") || len(att) != 3 {
				t.Fatalf("attachment %d: %v", i, att)
			}
			// The URL is the credential: no header needed, and any instance accepts it.
			for _, base := range []string{e.base, b.base} {
				d := get(t, base+strings.TrimPrefix(u, e.base))
				if d.status != 200 || !bytes.Equal(d.body, want[i].body) {
					t.Fatalf("download %d via %s: %d (%d bytes)", i, base, d.status, len(d.body))
				}
				for h, v := range map[string]string{
					"content-type": want[i].contentType, "x-content-type-options": "nosniff",
					"content-disposition": want[i].disposition, "cache-control": "private",
				} {
					if got := d.header.Get(h); got != v {
						t.Fatalf("download %d: %s %q, want %q", i, h, got, v)
					}
				}
			}
		}
	}

	// Without an activity part: a message from userId, else "user".
	for _, c := range []struct{ query, sender string }{{"userId=bob", "bob"}, {"", "user"}} {
		id := uploadID(t, e.upload(s.conv, s.tok, c.query, filePart("a.bin", "", []byte{1, 2, 3})))
		a := e.uploadedActivity(s, id)
		if a.From.ID != c.sender || a.Type != "message" || len(a.Attachments) != 1 || a.Attachments[0]["contentType"] != "application/octet-stream" {
			t.Fatalf("upload %q: %+v", c.query, a)
		}
	}
	// The activity part as a plain form value.
	id = uploadID(t, e.upload(s.conv, s.tok, "",
		uploadPart{field: "activity", body: []byte(`{"type":"event","text":"as a value","channelData":{"k":1}}`)},
		filePart("a.gif", "image/gif", []byte("GIF89a"))))
	if a := e.uploadedActivity(s, id); a.Type != "event" || a.Text != "as a value" || a.From.ID != "user" || a.ChannelData["k"] != float64(1) {
		t.Fatalf("activity from a form value: %+v", a)
	}
}

// signAttachment signs an attachment URL as the core does (the secret derived from the
// token signing key), to reach ids the core never handed out.
func (e *env) signAttachment(id string, exp int64) string {
	m := hmac.New(sha256.New, e.signer.DeriveKey("attachment-url"))
	es := strconv.FormatInt(exp, 10)
	m.Write([]byte("attachment\x00" + id + "\x00" + es))
	return "/api/v1/converger/attachments/" + id + "?exp=" + es + "&sig=" + base64.RawURLEncoding.EncodeToString(m.Sum(nil))
}

func TestAttachmentDownloadNeedsAValidSignature(t *testing.T) {
	var offset atomic.Int64 // the core's clock runs ahead by this much
	e := newEnv(t, envOptions{deps: func(d *api.Deps, _ string) {
		d.Now = func() time.Time { return time.Now().Add(time.Duration(offset.Load())) }
	}})
	s := e.streamConv()
	id := uploadID(t, e.upload(s.conv, s.tok, "", filePart("a.png", "image/png", []byte("png"))))
	u, _ := e.uploadedActivity(s, id).Attachments[0]["contentUrl"].(string)
	if get(t, u).status != 200 {
		t.Fatal("the fresh URL does not work")
	}
	parsed, _ := url.Parse(u)
	q := parsed.Query()
	attID := strings.TrimPrefix(parsed.Path, "/api/v1/converger/attachments/")
	tamper := func(f func(q url.Values) string) response {
		c := url.Values{}
		for k, v := range q {
			c[k] = v
		}
		path := f(c)
		return get(t, e.base+path)
	}
	flip := func(s string) string {
		if s[0] == 'A' {
			return "B" + s[1:]
		}
		return "A" + s[1:]
	}
	for name, r := range map[string]response{
		"tampered signature": tamper(func(c url.Values) string {
			c.Set("sig", flip(c.Get("sig")))
			return parsed.Path + "?" + c.Encode()
		}),
		"extended expiry": tamper(func(c url.Values) string {
			exp, _ := strconv.ParseInt(c.Get("exp"), 10, 64)
			c.Set("exp", strconv.FormatInt(exp+3600, 10))
			return parsed.Path + "?" + c.Encode()
		}),
		"another id": tamper(func(c url.Values) string {
			return "/api/v1/converger/attachments/" + missingID + "?" + c.Encode()
		}),
		"no signature": get(t, e.base+parsed.Path),
		"garbage":      get(t, e.base+parsed.Path+"?exp=abc&sig=%00"),
		"another key": func() response {
			other := newEnv(t, envOptions{})
			m := other.signAttachment(attID, time.Now().Add(time.Hour).Unix())
			return get(t, e.base+m)
		}(),
	} {
		if r.status != 403 {
			t.Fatalf("%s: %d %s", name, r.status, r.body)
		}
		r.errorCode(t, 403, "forbidden")
	}
	// A valid signature of an unknown or malformed id: 404.
	get(t, e.base+e.signAttachment(missingID, time.Now().Add(time.Hour).Unix())).errorCode(t, 404, "not_found")
	get(t, e.base+e.signAttachment("nope", time.Now().Add(time.Hour).Unix())).errorCode(t, 404, "not_found")
	// Expired: the same URL two hours later.
	offset.Store(int64(2 * time.Hour))
	get(t, u).errorCode(t, 403, "forbidden")
	// A stream signs the URLs afresh, so an old activity still shows its files.
	w := dialStream(t, e.base, streamPath(s.conv, s.tok, ""), nil).start()
	got, _ := w.expect(5*time.Second, "")
	fresh, _ := got[0].Attachments[0]["contentUrl"].(string)
	if fresh == u {
		t.Fatal("the stream did not sign the URL afresh")
	}
	if d := get(t, fresh); d.status != 200 || string(d.body) != "png" {
		t.Fatalf("fresh URL: %d %s", d.status, d.body)
	}
}

func TestUploadRefusals(t *testing.T) {
	e := newEnv(t, envOptions{})
	s := e.streamConv()
	other := e.streamConv()
	one := filePart("a.png", "image/png", []byte("png"))
	countAttachments := func() int {
		var n int
		if err := e.pool.QueryRow(context.Background(), `SELECT count(*) FROM attachments`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}

	// Credentials and scope.
	e.upload(s.conv, "garbage", "", one).errorCode(t, 403, "forbidden")
	e.upload(other.conv, s.tok, "", one).errorCode(t, 403, "forbidden")
	e.upload(missingID, s.tok, "", one).errorCode(t, 403, "forbidden")
	// Size: the files of a request together (MaxUploadBytes is 1 MiB here).
	e.upload(s.conv, s.tok, "", filePart("big.bin", "application/octet-stream", make([]byte, 1<<20+1))).
		errorCode(t, 413, "payload_too_large")
	e.upload(s.conv, s.tok, "", filePart("a.bin", "", make([]byte, 600<<10)), filePart("b.bin", "", make([]byte, 600<<10))).
		errorCode(t, 413, "payload_too_large")
	// Types.
	for _, ct := range []string{"text/html", "image/svg+xml", "application/javascript", "text/xml", "nonsense"} {
		e.upload(s.conv, s.tok, "", one, filePart("x", ct, []byte("<script>alert(1)</script>"))).
			errorCode(t, 415, "unsupported_media_type")
	}
	e.do("POST", "/api/v1/converger/conversations/"+s.conv+"/upload", `{"text":"hi"}`,
		map[string]string{"authorization": "Bearer " + s.tok}).errorCode(t, 415, "unsupported_media_type")
	// Shape.
	e.upload(s.conv, s.tok, "", activityPart(map[string]string{"text": "no file"})).errorCode(t, 400, "bad_request")
	var eleven []uploadPart
	for i := 0; i < 11; i++ {
		eleven = append(eleven, one)
	}
	e.upload(s.conv, s.tok, "", eleven...).errorCode(t, 422, "validation_failed")
	d := e.upload(s.conv, s.tok, "", one, activityPart(map[string]any{"type": "bogus", "text": strings.Repeat("x", 70000)})).
		errorCode(t, 422, "validation_failed")
	if f, _ := d["fields"].(map[string]any); f["type"] == nil || f["text"] == nil {
		t.Fatalf("fields: %v", d)
	}
	e.upload(s.conv, s.tok, "", one, uploadPart{field: "activity", body: []byte("[1]")}).errorCode(t, 422, "validation_failed")
	if n := countAttachments(); n != 0 {
		t.Fatalf("%d attachments stored by refused uploads", n)
	}
	// A closed conversation.
	if _, _, err := e.store.SetConversationStatus(context.Background(), s.tenantID, s.conv, "closed"); err != nil {
		t.Fatal(err)
	}
	e.upload(s.conv, s.tok, "", one).errorCode(t, 409, "conversation_closed")
	if n := countAttachments(); n != 0 {
		t.Fatalf("%d attachments stored by refused uploads", n)
	}
}

// A deactivated tenant's or channel's attachment URLs stop working at once, though
// their signature is valid for an hour: 403, as its tokens; they work again when it is
// active again.
func TestAttachmentOfAnInactiveTenantIsRefused(t *testing.T) {
	e := newEnv(t, envOptions{})
	s := e.streamConv()
	id := uploadID(t, e.upload(s.conv, s.tok, "", filePart("a.png", "image/png", []byte("png"))))
	u, _ := e.uploadedActivity(s, id).Attachments[0]["contentUrl"].(string)
	if r := get(t, u); r.status != 200 || string(r.body) != "png" {
		t.Fatalf("before: %d %s", r.status, r.body)
	}
	for _, table := range []struct{ name, id string }{{"tenants", s.tenantID}, {"channels", s.channelID}} {
		e.exec(`UPDATE `+table.name+` SET status = 'inactive' WHERE id = $1`, table.id)
		get(t, u).errorCode(t, 403, "forbidden")
		e.exec(`UPDATE `+table.name+` SET status = 'active' WHERE id = $1`, table.id)
		if r := get(t, u); r.status != 200 {
			t.Fatalf("active %s again: %d %s", table.name, r.status, r.body)
		}
	}
}
