package main_test

// How `core serve` holds up against hostile clients, overload and a failing PostgreSQL:
// each test runs the built binary on loopback against a real PostgreSQL, and every loop
// is bounded in count and time.

import (
	"bufio"
	"bytes"
	"compress/flate"
	"compress/gzip"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/converger/edge/core/activity"
	"github.com/converger/edge/core/credentials"
	"github.com/converger/edge/core/migrations"
	"github.com/converger/edge/core/store"
	"github.com/converger/edge/shared/pgserver"
)

// fixture is a tenant with an echo-less channel and conversations, made through the
// store, and the environment of a core over its database.
type fixture struct {
	url, encKey         string
	apiKey, publishable string
	tenantID, channelID string
	convs               []string
	pool                *pgxpool.Pool
}

func newFixture(t *testing.T, url string, conversations int) *fixture {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if url == "" {
		url = pgserver.NewTestDatabase(t, migrations.Up)
	} else if err := migrations.Up(ctx, url); err != nil {
		t.Fatal(err)
	}
	f := &fixture{url: url, encKey: credentials.GenerateEncryptionKey()}
	sealer, err := credentials.ParseEncryptionKey(f.encKey)
	if err != nil {
		t.Fatal(err)
	}
	f.pool, err = pgxpool.New(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(f.pool.Close)
	st := store.New(f.pool, sealer, activity.DefaultLimits)
	tn, key, err := st.As("test").CreateTenant(ctx, "acme")
	if err != nil {
		t.Fatal(err)
	}
	ch, sec, err := st.As("test").CreateChannel(ctx, tn.ID, "web", "webhook", "duplex")
	if err != nil {
		t.Fatal(err)
	}
	f.apiKey, f.publishable, f.tenantID, f.channelID = key, sec.Publishable, tn.ID, ch.ID
	for range conversations {
		c, err := st.CreateConversation(ctx, tn.ID, ch.ID, nil)
		if err != nil {
			t.Fatal(err)
		}
		f.convs = append(f.convs, c.ID)
	}
	return f
}

// env is the environment of a core over the fixture's database, plus extra.
func (f *fixture) env(extra map[string]string) map[string]string {
	env := map[string]string{"DATABASE_URL": f.url, "ENCRYPTION_KEY": f.encKey}
	for k, v := range extra {
		env[k] = v
	}
	return env
}

// answer is an HTTP answer with its body and how long it took.
type answer struct {
	status int
	header http.Header
	body   []byte
	took   time.Duration
	err    error
}

// envelope decodes an error envelope.
func (a answer) envelope(t *testing.T) (code, message, requestID string) {
	t.Helper()
	var e struct {
		Error struct {
			Code, Message string
			RequestID     string `json:"request_id"`
		}
	}
	if err := json.Unmarshal(a.body, &e); err != nil || e.Error.Code == "" {
		t.Fatalf("%d is not an error envelope: %s", a.status, a.body)
	}
	return e.Error.Code, e.Error.Message, e.Error.RequestID
}

var client = &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}

func send(method, url string, body []byte, header map[string]string, timeout time.Duration) answer {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, url, bytes.NewReader(body))
	if err != nil {
		return answer{err: err}
	}
	for k, v := range header {
		req.Header.Set(k, v)
	}
	start := time.Now()
	resp, err := client.Do(req)
	if err != nil {
		return answer{err: err, took: time.Since(start)}
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return answer{status: resp.StatusCode, header: resp.Header, body: b, took: time.Since(start), err: err}
}

// metric reads one sample of the core's /metrics: the value of the first line that
// starts with name and contains every one of labels.
func metric(t *testing.T, ops, name string, labels ...string) float64 {
	t.Helper()
	a := send("GET", ops+"/metrics", nil, nil, 5*time.Second)
	if a.err != nil || a.status != 200 {
		t.Fatalf("/metrics: %v %d %.500s", a.err, a.status, a.body)
	}
	for line := range strings.SplitSeq(string(a.body), "\n") {
		if !strings.HasPrefix(line, name) || (len(line) > len(name) && line[len(name)] != '{' && line[len(name)] != ' ') {
			continue
		}
		ok := true
		for _, l := range labels {
			ok = ok && strings.Contains(line, l)
		}
		if ok {
			v, err := strconv.ParseFloat(line[strings.LastIndexByte(line, ' ')+1:], 64)
			if err != nil {
				t.Fatalf("%s: %v", line, err)
			}
			return v
		}
	}
	t.Fatalf("no %s%v in /metrics:\n%s", name, labels, regexp.MustCompile(`(?m)^`+name+`.*$`).FindAllString(string(a.body), -1))
	return 0
}

// memory reads a process's resident memory and its peak, in bytes.
func memory(t *testing.T, pid int) (rss, peak int64) {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		kb, _ := strconv.ParseInt(f[1], 10, 64)
		switch f[0] {
		case "VmRSS:":
			rss = kb << 10
		case "VmHWM:":
			peak = kb << 10
		}
	}
	return rss, peak
}

// floodEnv makes the test binary a helper of TestConnectionFlood: it opens
// connections to the address in it, from the loopback sources of CORE_TEST_FLOOD_FROM
// (comma-separated, round robin), CORE_TEST_FLOOD_N of them, prints how many it opened,
// and holds them until its stdin closes. Each helper has an open-files limit of its
// own, so that together they open more than one process may.
const floodEnv = "CORE_TEST_FLOOD"

func flood(addr string) int {
	n, _ := strconv.Atoi(os.Getenv("CORE_TEST_FLOOD_N"))
	sources := strings.Split(os.Getenv("CORE_TEST_FLOOD_FROM"), ",")
	var mu sync.Mutex
	var conns []net.Conn
	var wg sync.WaitGroup
	next := make(chan string)
	for range 16 {
		wg.Go(func() {
			for src := range next {
				d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}, Timeout: 3 * time.Second}
				if c, err := d.Dial("tcp", addr); err == nil {
					mu.Lock()
					conns = append(conns, c)
					mu.Unlock()
				}
			}
		})
	}
	for i := range n {
		next <- sources[i%len(sources)]
	}
	close(next)
	wg.Wait()
	fmt.Printf("opened %d\n", len(conns))
	_, _ = io.Copy(io.Discard, os.Stdin)
	return 0
}

// startFlood runs a flood helper and returns when its connections are open, with how
// many; closing the returned writer ends it (and the test's end does). It may run on
// any goroutine: it reports failures as errors.
func startFlood(t *testing.T, addr string, n int, sources []string) (int, io.Closer, error) {
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), floodEnv+"="+addr, "CORE_TEST_FLOOD_N="+strconv.Itoa(n),
		"CORE_TEST_FLOOD_FROM="+strings.Join(sources, ","))
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return 0, nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return 0, nil, err
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		return 0, nil, err
	}
	t.Cleanup(func() {
		stdin.Close()
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
	})
	line, err := bufio.NewReader(stdout).ReadString('\n')
	var opened int
	if _, scanErr := fmt.Sscanf(line, "opened %d", &opened); err != nil || scanErr != nil {
		return 0, stdin, fmt.Errorf("flood helper: %q %v", line, err)
	}
	return opened, stdin, nil
}

// probe sends one request on a connection of its own from a loopback source address,
// as a new client would: the tenant API without a key, which is answered 401 without
// the database.
func probe(base, source string, timeout time.Duration) answer {
	tr := &http.Transport{DialContext: (&net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(source)}}).DialContext,
		DisableKeepAlives: true}
	defer tr.CloseIdleConnections()
	c := &http.Client{Transport: tr, Timeout: timeout}
	start := time.Now()
	resp, err := c.Get(base + "/api/v1/conversations/00000000-0000-0000-0000-000000000000")
	if err != nil {
		return answer{err: err, took: time.Since(start)}
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return answer{status: resp.StatusCode, body: b, took: time.Since(start)}
}

// 20,000 idle connections, half from one address and half from 40 others, against a
// core that may open 4,096 files: it stays up (it used to exit on EMFILE), and a new
// client is answered within 2 s during and after the flood.
func TestConnectionFlood(t *testing.T) {
	prlimit, err := exec.LookPath("prlimit")
	if err != nil {
		t.Skip("needs prlimit (util-linux)")
	}
	f := newFixture(t, "", 0)
	core := newProc(t, f.env(nil)).start(t, prlimit, "--nofile=4096:4096", "--")
	addr := strings.TrimPrefix(core.base, "http://")

	var (
		mu        sync.Mutex
		probes    []answer
		stopProbe = make(chan struct{})
		probing   sync.WaitGroup
	)
	probing.Go(func() {
		for {
			select {
			case <-stopProbe:
				return
			case <-time.After(200 * time.Millisecond):
			}
			a := probe(core.base, "127.0.0.2", 2*time.Second)
			mu.Lock()
			probes = append(probes, a)
			mu.Unlock()
		}
	})
	var many []string
	for i := range 40 {
		many = append(many, fmt.Sprintf("127.0.1.%d", 10+i))
	}
	// Helpers of at most 10,000 connections each, fewer when a process may open fewer
	// files: half of the 20,000 from 127.0.0.1, half from the 40 others.
	var rl syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil {
		t.Fatal(err)
	}
	per := int(min(10_000, rl.Max-256))
	type helper struct {
		n       int
		sources []string
	}
	var helpers []helper
	for _, sources := range [][]string{{"127.0.0.1"}, many} {
		for left := 10_000; left > 0; left -= per {
			helpers = append(helpers, helper{min(per, left), sources})
		}
	}
	start := time.Now()
	opened := make([]int, len(helpers))
	floods := make([]io.Closer, len(helpers))
	errs := make([]error, len(helpers))
	var wg sync.WaitGroup
	for i, h := range helpers {
		wg.Go(func() { opened[i], floods[i], errs[i] = startFlood(t, addr, h.n, h.sources) })
	}
	wg.Wait()
	total := 0
	for i, n := range opened {
		if errs[i] != nil {
			t.Fatal(errs[i])
		}
		total += n
	}
	t.Logf("%d connections opened by %d helpers in %v", total, len(helpers), time.Since(start))
	if total < 15_000 {
		t.Fatalf("only %d connections could be opened", total)
	}
	time.Sleep(time.Second) // probes during the flood
	core.alive()
	refusedPerIP := metric(t, core.ops, "converger_core_connections_refused_per_ip_total")
	evicted := metric(t, core.ops, "converger_core_connections_evicted_total")
	for _, c := range floods {
		c.Close()
	}
	time.Sleep(time.Second) // and after
	close(stopProbe)
	probing.Wait()
	core.alive()
	if a := probe(core.base, "127.0.0.2", 2*time.Second); a.err != nil || a.status != 401 {
		t.Fatalf("after the flood: %v %d", a.err, a.status)
	}
	if len(probes) < 5 {
		t.Fatalf("only %d probes", len(probes))
	}
	for i, a := range probes {
		if a.err != nil || a.status != 401 || a.took > 2*time.Second {
			t.Errorf("probe %d: %v, status %d after %v; want 401 within 2 s", i, a.err, a.status, a.took)
		}
	}
	if refusedPerIP == 0 || evicted == 0 {
		t.Errorf("refused per IP %v, evicted %v: want both caps to have acted", refusedPerIP, evicted)
	}
}

// zeroBomb returns a body of the given encoding that inflates to mib MiB of zeros:
// gzip members of 1 MiB each, or one zlib stream of repeated deflate blocks.
func zeroBomb(t *testing.T, enc string, mib int) []byte {
	t.Helper()
	zeros := make([]byte, 1<<20)
	var out bytes.Buffer
	switch enc {
	case "gzip":
		var member bytes.Buffer
		w, _ := gzip.NewWriterLevel(&member, gzip.BestCompression)
		w.Write(zeros)
		w.Close()
		for range mib {
			out.Write(member.Bytes())
		}
	case "deflate":
		// A block that inflates to 1 MiB of zeros refers only to zeros before it, so it
		// can be repeated; then an empty final block and the Adler-32 of the zeros.
		var block bytes.Buffer
		w, _ := flate.NewWriter(&block, flate.BestCompression)
		w.Write(zeros)
		w.Flush()
		out.Write([]byte{0x78, 0xda})
		for range mib {
			out.Write(block.Bytes())
		}
		out.Write([]byte{0x03, 0x00})
		n := uint32((int64(mib) << 20) % 65521)
		sum := n<<16 | 1
		out.Write([]byte{byte(sum >> 24), byte(sum >> 16), byte(sum >> 8), byte(sum)})
	}
	return out.Bytes()
}

// Compressed bodies: refused on routes that do not take them before anything is
// inflated, capped at the route's limit on the tenant API, which takes them; memory
// stays bounded.
func TestCompressedBodies(t *testing.T) {
	f := newFixture(t, "", 1)
	core := newProc(t, f.env(nil)).start(t)
	pid := core.cmd.Process.Pid
	rssBefore, _ := memory(t, pid)
	publishable := map[string]string{"authorization": "Bearer " + f.publishable, "content-type": "application/json"}
	tenant := map[string]string{"x-api-key": f.apiKey, "content-type": "application/json"}
	activities := core.base + "/api/v1/conversations/" + f.convs[0] + "/activities"

	// The attack of the report: 4.4 MB of gzipped zeros with the public key.
	big := zeroBomb(t, "gzip", 4400)
	a := send("POST", core.base+"/api/v1/converger/tokens/publishable", big,
		map[string]string{"authorization": "Bearer " + f.publishable, "content-encoding": "gzip"}, 20*time.Second)
	if a.err != nil || (a.status != 413 && a.status != 415) || a.took > 5*time.Second {
		t.Fatalf("4.4 MB gzip bomb: %v, status %d after %v; want 413 or 415 at once", a.err, a.status, a.took)
	}
	for _, enc := range []string{"gzip", "deflate"} {
		bomb := zeroBomb(t, enc, 200) // under 256 KiB on the wire, 200 MiB inflated
		h := map[string]string{"content-encoding": enc}
		for k, v := range publishable {
			h[k] = v
		}
		a := send("POST", core.base+"/api/v1/converger/tokens/publishable", bomb, h, 20*time.Second)
		if a.err != nil || a.status != 415 {
			t.Fatalf("%s bomb on the publishable route: %v, status %d; want 415", enc, a.err, a.status)
		}
		if code, _, _ := a.envelope(t); code != "unsupported_media_type" {
			t.Fatalf("%s bomb on the publishable route: %s", enc, a.body)
		}
		h = map[string]string{"content-encoding": enc}
		for k, v := range tenant {
			h[k] = v
		}
		a = send("POST", activities, bomb, h, 20*time.Second)
		if a.err != nil || a.status != 413 || a.took > 5*time.Second {
			t.Fatalf("%s bomb on the tenant API: %v, status %d after %v; want 413 at once", enc, a.err, a.status, a.took)
		}
		if code, _, _ := a.envelope(t); code != "payload_too_large" {
			t.Fatalf("%s bomb on the tenant API: %s", enc, a.body)
		}
	}
	// A compressed activity within the limits is taken by the tenant API.
	var zipped bytes.Buffer
	zw := gzip.NewWriter(&zipped)
	zw.Write([]byte(`{"type":"message","text":"compressed"}`))
	zw.Close()
	h := map[string]string{"content-encoding": "gzip"}
	for k, v := range tenant {
		h[k] = v
	}
	if a := send("POST", activities, zipped.Bytes(), h, 5*time.Second); a.status != 201 || !strings.Contains(string(a.body), `"text":"compressed"`) {
		t.Fatalf("a compressed activity: %d %s", a.status, a.body)
	}
	// An unknown encoding is refused too.
	h["content-encoding"] = "br"
	if a := send("POST", activities, []byte("x"), h, 5*time.Second); a.status != 415 {
		t.Fatalf("br: %d %s", a.status, a.body)
	}
	core.alive()
	_, peak := memory(t, pid)
	if growth := peak - rssBefore; growth > 64<<20 {
		t.Fatalf("resident memory grew by %d MiB (from %d MiB to a peak of %d MiB): a body was inflated unbounded",
			growth>>20, rssBefore>>20, peak>>20)
	}
	t.Logf("memory: %d MiB before, peak %d MiB", rssBefore>>20, peak>>20)
}

// PostgreSQL stopped, and hung (every process stopped): requests are answered 503
// unavailable with retry-after within the bound, /readyz says so within a second or
// two, and the core recovers by itself when the database is back.
func TestDatabaseDownAndHung(t *testing.T) {
	srv := pgserver.StartForTest(t)
	f := newFixture(t, srv.URL(), 1)
	f.pool.Close() // the test's own connections would not survive the outages anyway
	core := newProc(t, f.env(map[string]string{"DATABASE_TIMEOUT": "1s"})).start(t)
	key := map[string]string{"x-api-key": f.apiKey, "content-type": "application/json"}
	conv := core.base + "/api/v1/conversations/" + f.convs[0]
	ready := func() answer { return send("GET", core.ops+"/readyz", nil, nil, 2*time.Second) }

	works := func(what string) {
		t.Helper()
		deadline := time.Now().Add(15 * time.Second)
		for {
			a := send("GET", conv, nil, key, 2*time.Second)
			r := ready()
			if a.status == 200 && r.status == 200 && strings.Contains(string(r.body), `"database":"up"`) {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: the core did not recover within 15 s: %d %s; readyz %d %s\n%s", what, a.status, a.body,
					r.status, r.body, tailOf(core.logs.String()))
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	// unavailable waits until requests are answered 503 quickly, then checks a few.
	unavailable := func(what string, within time.Duration) {
		t.Helper()
		start := time.Now()
		for {
			a := send("GET", conv, nil, key, 5*time.Second)
			if a.status == 503 && a.took < time.Second {
				break
			}
			if a.status != 503 && a.err == nil && a.status != 200 {
				t.Fatalf("%s: %d %s, want 503", what, a.status, a.body)
			}
			if time.Since(start) > within {
				t.Fatalf("%s: not answered 503 at once within %v (last: %v, %d after %v: %s)", what, within, a.err, a.status, a.took, a.body)
			}
		}
		t.Logf("%s: 503 at once after %v", what, time.Since(start))
		for range 5 {
			a := send("GET", conv, nil, key, 5*time.Second)
			if a.status != 503 || a.took > time.Second || a.header.Get("retry-after") == "" {
				t.Fatalf("%s: %v, %d after %v, retry-after %q; want 503 at once with retry-after", what, a.err, a.status, a.took, a.header.Get("retry-after"))
			}
			if code, _, id := a.envelope(t); code != "unavailable" || id == "" {
				t.Fatalf("%s: %s", what, a.body)
			}
			// A write too.
			w := send("POST", conv+"/activities", []byte(`{"text":"during"}`), key, 5*time.Second)
			if w.status != 503 || w.took > time.Second {
				t.Fatalf("%s: a write: %d after %v: %s", what, w.status, w.took, w.body)
			}
		}
		deadline := time.Now().Add(3 * time.Second)
		for {
			r := ready()
			if r.status == 503 && strings.Contains(string(r.body), `"database":"down"`) {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: /readyz %d %s", what, r.status, r.body)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}

	works("at the start")
	if a := send("POST", conv+"/activities", []byte(`{"text":"before"}`), key, 5*time.Second); a.status != 201 {
		t.Fatalf("a write: %d %s", a.status, a.body)
	}

	if err := srv.Shutdown(); err != nil {
		t.Fatal(err)
	}
	unavailable("PostgreSQL stopped", 5*time.Second)
	if err := srv.Restart(context.Background()); err != nil {
		t.Fatal(err)
	}
	works("after the restart")

	if err := srv.Pause(); err != nil {
		t.Fatal(err)
	}
	// A request sent right as the database hangs waits at most DATABASE_TIMEOUT.
	if a := send("GET", conv, nil, key, 10*time.Second); a.status != 503 || a.took > 4*time.Second {
		t.Fatalf("a request as the database hangs: %v, %d after %v; want 503 within the 1 s DATABASE_TIMEOUT (and a margin)", a.err, a.status, a.took)
	}
	unavailable("PostgreSQL hung", 5*time.Second)
	if err := srv.Resume(); err != nil {
		t.Fatal(err)
	}
	works("after the hang")
	if a := send("POST", conv+"/activities", []byte(`{"text":"after"}`), key, 5*time.Second); a.status != 201 || !strings.Contains(string(a.body), `"seq":2`) {
		t.Fatalf("a write after the outages: %d %s (want seq 2: the refused writes left nothing)", a.status, a.body)
	}
	core.alive()
}

// Errors raised by fasthttp itself (body over the limit, headers too large or too
// many, a malformed request, a read timeout) and a multipart body on a JSON route carry
// the request id (the client's when it sent one) and the envelope with a message for
// people, not a parser's.
func TestServerErrorsCarryTheRequestID(t *testing.T) {
	f := newFixture(t, "", 1)
	core := newProc(t, f.env(map[string]string{"CORE_READ_TIMEOUT": "1s"})).start(t)
	addr := strings.TrimPrefix(core.base, "http://")
	activities := core.base + "/api/v1/conversations/" + f.convs[0] + "/activities"
	parserText := regexp.MustCompile(`(?i)multipart|NextPart|EOF|error when|fasthttp|cannot|Content-Length`)

	check := func(what string, status int, code, sentID string, a answer) {
		t.Helper()
		if a.err != nil || a.status != status {
			t.Fatalf("%s: %v, status %d, want %d: %s", what, a.err, a.status, status, a.body)
		}
		gotCode, msg, id := a.envelope(t)
		header := a.header.Get("x-request-id")
		switch {
		case gotCode != code:
			t.Errorf("%s: code %q, want %q", what, gotCode, code)
		case id == "" || header != id:
			t.Errorf("%s: request id %q in the body, %q in the header", what, id, header)
		case sentID != "" && id != sentID:
			t.Errorf("%s: request id %q, want the one sent, %q", what, id, sentID)
		case parserText.MatchString(msg):
			t.Errorf("%s: the message is a parser's: %q", what, msg)
		}
	}
	check("a body over the limit", 413, "payload_too_large", "req-413",
		send("POST", activities, bytes.Repeat([]byte("a"), 2<<20), map[string]string{"x-api-key": f.apiKey, "x-request-id": "req-413"}, 10*time.Second))
	check("a multipart body on a JSON route", 422, "validation_failed", "req-mp",
		send("POST", activities, []byte("garbage"), map[string]string{"x-api-key": f.apiKey, "x-request-id": "req-mp",
			"content-type": "multipart/form-data; boundary=xyz"}, 5*time.Second))
	raw := func(request string, wait time.Duration) answer {
		t.Helper()
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(wait))
		if _, err := io.WriteString(c, request); err != nil {
			return answer{err: err}
		}
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			return answer{err: err}
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return answer{status: resp.StatusCode, header: resp.Header, body: b}
	}
	check("headers over 8 KiB", 431, "headers_too_large", "",
		raw("GET / HTTP/1.1\r\nHost: x\r\nX-Big: "+strings.Repeat("a", 10<<10)+"\r\n\r\n", 5*time.Second))
	var many strings.Builder
	for i := range 150 {
		fmt.Fprintf(&many, "X-H%d: v\r\n", i)
	}
	check("150 headers", 431, "headers_too_large", "req-many",
		raw("GET / HTTP/1.1\r\nHost: x\r\nX-Request-Id: req-many\r\n"+many.String()+"\r\n", 5*time.Second))
	check("a malformed request", 400, "bad_request", "",
		raw("POST / HTTP/1.1\r\nHost: x\r\nContent-Length: lots\r\n\r\n", 5*time.Second))
	check("headers not received in time", 408, "request_timeout", "",
		raw("GET / HTTP/1.1\r\nHost: x\r\nX-Request-Id: slow", 5*time.Second))
	core.alive()
}

// /healthz, /readyz and /metrics on CORE_OPS_ADDR, and one access log line per request
// that names the route pattern and never a credential or a token in the URL.
func TestOperationsEndpointsAndAccessLog(t *testing.T) {
	f := newFixture(t, "", 1)
	// AUTHZ_ADDR at a port nobody listens on: every Check fails, and the requests of
	// limited routes go through unchecked (fail open), counted; the others are not checked.
	dead := freeAddr(t)
	core := newProc(t, f.env(map[string]string{"AUTHZ_ADDR": dead, "LOG_LEVEL": "info", "LOG_FORMAT": "json"})).start(t)
	const secretToken, secretKey = "eyJhbGciOiJFZERTQSJ9.secret-token.sig", "cvg_live_not-a-real-key-but-secret"
	for range 3 {
		if a := send("GET", core.base+"/api/v1/conversations/"+f.convs[0], nil, map[string]string{"x-api-key": f.apiKey}, 5*time.Second); a.status != 200 {
			t.Fatalf("conversation: %d %s", a.status, a.body)
		}
	}
	// A limited route (activity_create): its Check fails and it goes through, counted.
	if a := send("POST", core.base+"/api/v1/conversations/"+f.convs[0]+"/activities", []byte(`{"type":"message","text":"hi"}`),
		map[string]string{"x-api-key": f.apiKey, "content-type": "application/json"}, 5*time.Second); a.status != 201 {
		t.Fatalf("activity: %d %s", a.status, a.body)
	}
	send("GET", core.base+"/api/v1/converger/conversations/"+f.convs[0]+"/stream?t="+secretToken, nil, nil, 5*time.Second)
	send("GET", core.base+"/api/v1/conversations/"+f.convs[0], nil, map[string]string{"x-api-key": secretKey}, 5*time.Second)
	send("GET", core.base+"/nowhere/"+secretToken, nil, nil, 5*time.Second)

	if a := send("GET", core.ops+"/healthz", nil, nil, 5*time.Second); a.status != 200 {
		t.Fatalf("/healthz: %d", a.status)
	}
	r := send("GET", core.ops+"/readyz", nil, nil, 5*time.Second)
	var rd map[string]any
	if err := json.Unmarshal(r.body, &rd); err != nil || r.status != 200 || rd["database"] != "up" || rd["authz"] != "failing open" {
		t.Fatalf("/readyz: %d %s", r.status, r.body)
	}
	if n := metric(t, core.ops, "converger_core_requests_total", `route="/api/v1/conversations/:id"`, `status="200"`, `method="GET"`); n != 3 {
		t.Errorf("requests of the conversation route: %v, want 3", n)
	}
	if n := metric(t, core.ops, "converger_core_requests_total", `route="none"`, `status="404"`); n != 1 {
		t.Errorf("unmatched requests: %v, want 1", n)
	}
	// Also the 401s: start's readiness poll and the unknown key.
	if n := metric(t, core.ops, "converger_core_requests_total", `route="/api/v1/conversations/:id"`, `status="401"`); n != 2 {
		t.Errorf("401s of the conversation route: %v, want 2", n)
	}
	if n := metric(t, core.ops, "converger_core_request_duration_seconds_count", `route="/api/v1/conversations/:id"`); n != 5 {
		t.Errorf("latency observations of the conversation route: %v, want 5", n)
	}
	if n := metric(t, core.ops, "converger_core_authz_fail_open_total"); n != 1 {
		t.Errorf("fail-open decisions: %v, want the limited request's alone (1)", n)
	}
	for _, name := range []string{"converger_core_requests_in_flight", "converger_core_requests_shed_total", "converger_core_database_up",
		"converger_core_db_pool_connections", "converger_core_db_pool_acquires_total", "converger_core_database_errors_total",
		"converger_core_connections", "converger_core_accept_errors_total", "go_goroutines", "process_open_fds"} {
		metric(t, core.ops, name)
	}
	if up := metric(t, core.ops, "converger_core_database_up"); up != 1 {
		t.Errorf("database_up %v", up)
	}

	logs := core.logs.String()
	for _, secret := range []string{secretToken, secretKey, f.apiKey, "secret-token"} {
		if strings.Contains(logs, secret) {
			t.Errorf("the log holds %q", secret)
		}
	}
	var lines int
	for line := range strings.SplitSeq(logs, "\n") {
		var l struct {
			Msg        string  `json:"msg"`
			RequestID  string  `json:"request_id"`
			Method     string  `json:"method"`
			Route      string  `json:"route"`
			Status     int     `json:"status"`
			DurationMS float64 `json:"duration_ms"`
		}
		if json.Unmarshal([]byte(line), &l) != nil || l.Msg != "request" {
			continue
		}
		lines++
		if l.RequestID == "" || (l.Method != "GET" && l.Method != "POST") || l.Route == "" || l.Status == 0 || l.DurationMS < 0 {
			t.Errorf("access log line without its fields: %s", line)
		}
		if strings.Contains(l.Route, "/nowhere") || strings.Contains(l.Route, f.convs[0]) {
			t.Errorf("the access log names a path, not a route pattern: %s", line)
		}
	}
	if lines != 8 {
		t.Errorf("%d access log lines, want one per request (8)\n%s", lines, tailOf(logs))
	}
}

// An open-loop flood of activity POSTs beyond what the core can do, from clients that
// give up after five seconds: the core sheds what it cannot do at once (503) instead of
// queueing it, so that a read is answered promptly when the flood stops, few writes
// complete after their client gave up, no acknowledged write is lost, and every
// conversation's seq stays gap-free. A write is done after its client gave up when
// PostgreSQL stored it (inserted_at, the same machine's clock) after the client's
// deadline: a client that timed out only because this loaded test process read its
// answer late is not one.
func TestOverloadRecovery(t *testing.T) {
	f := newFixture(t, "", 20)
	// Every write holds its connection 15 ms in the database: with the pool's 4
	// connections, the core can take at most 266 writes a second however fast the
	// machine, so that the flood below is an overload on any machine, while the
	// generator stays light enough for a loaded one.
	if _, err := f.pool.Exec(context.Background(), `
		CREATE FUNCTION slow_insert() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN PERFORM pg_sleep(0.015); RETURN NEW; END $$;
		CREATE TRIGGER slow_insert BEFORE INSERT ON activities FOR EACH ROW EXECUTE FUNCTION slow_insert()`); err != nil {
		t.Fatal(err)
	}
	// Every client is on loopback: no per-address cap here.
	core := newProc(t, f.env(map[string]string{"CORE_MAX_CONNS_PER_IP": "0"})).start(t)
	const (
		rate     = 600 // requests per second, over twice what the database lets the core do
		duration = 8 * time.Second
		timeout  = 5 * time.Second
	)
	tr := &http.Transport{MaxIdleConnsPerHost: 4096}
	defer tr.CloseIdleConnections()
	load := &http.Client{Transport: tr, Timeout: timeout}
	type outcome int
	const (
		acked outcome = iota
		shed
		gaveUp
		failed
	)
	var (
		mu       sync.Mutex
		outcomes = map[string]outcome{}
		deadline = map[string]time.Time{} // when each client gives up
		wg       sync.WaitGroup
		firstBad string
	)
	post := func(i int) {
		defer wg.Done()
		key := fmt.Sprintf("k-%d", i)
		req, _ := http.NewRequest("POST", core.base+"/api/v1/conversations/"+f.convs[i%len(f.convs)]+"/activities",
			strings.NewReader(`{"type":"message","text":"load"}`))
		req.Header.Set("x-api-key", f.apiKey)
		req.Header.Set("x-idempotency-key", key)
		patience := time.Now().Add(timeout)
		resp, err := load.Do(req)
		o := failed
		switch {
		case err != nil:
			o = gaveUp
		case resp.StatusCode == 201:
			o = acked
		case resp.StatusCode == 503:
			o = shed
		}
		if resp != nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
		mu.Lock()
		outcomes[key] = o
		deadline[key] = patience
		if o == failed && firstBad == "" {
			firstBad = resp.Status
		}
		mu.Unlock()
	}
	tick := time.NewTicker(10 * time.Millisecond)
	start := time.Now()
	sent := 0
	for time.Since(start) < duration {
		<-tick.C
		for due := int(time.Since(start).Seconds() * rate); sent < due; sent++ {
			wg.Add(1)
			go post(sent)
		}
	}
	tick.Stop()
	stopped := time.Now()
	// Recovery: a read answered within a second.
	// (The clients' patience is the bound the test can check on a loaded machine; the
	// core's own bound on a request's wait for the database is DATABASE_ACQUIRE_TIMEOUT.)
	var recovered time.Duration
	for {
		a := send("GET", core.base+"/api/v1/conversations/"+f.convs[0], nil, map[string]string{"x-api-key": f.apiKey}, timeout)
		if a.status == 200 {
			recovered = time.Since(stopped)
			break
		}
		if time.Since(stopped) > 30*time.Second {
			t.Fatalf("no read answered within 30 s of the end of the flood: %v %d", a.err, a.status)
		}
		time.Sleep(50 * time.Millisecond)
	}
	wg.Wait()
	core.alive()

	stored := map[string]time.Time{} // when
	rows, err := f.pool.Query(context.Background(), `SELECT idempotency_key, inserted_at FROM activities WHERE idempotency_key IS NOT NULL`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var k string
		var at time.Time
		if err := rows.Scan(&k, &at); err != nil {
			t.Fatal(err)
		}
		stored[k] = at
	}
	if rows.Err() != nil {
		t.Fatal(rows.Err())
	}
	counts := map[outcome]int{}
	abandoned, answeredLate := 0, 0
	for k, o := range outcomes {
		counts[o]++
		at, isStored := stored[k]
		switch {
		case o == acked && !isStored:
			t.Errorf("acknowledged write %s is not stored", k)
		case o == gaveUp && isStored && at.After(deadline[k]):
			abandoned++ // done after its client had given up
		case o == gaveUp && isStored:
			answeredLate++ // done in time, its answer read too late by this process
		case o == shed && isStored:
			t.Errorf("write %s was answered 503 but stored", k)
		}
	}
	t.Logf("%d sent in %v: %d acknowledged, %d shed (503), %d given up by their clients, %d failed; "+
		"%d stored, %d of them after their client gave up (%d more before it did); a read answered %v after the flood",
		sent, duration, counts[acked], counts[shed], counts[gaveUp], counts[failed], len(stored), abandoned, answeredLate, recovered)
	if counts[failed] > 0 {
		t.Errorf("%d requests failed otherwise (first: %s)", counts[failed], firstBad)
	}
	if recovered > 5*time.Second {
		t.Errorf("a read was answered %v after the flood, want within 5 s", recovered)
	}
	if limit := max(50, len(stored)/20); abandoned > limit {
		t.Errorf("%d writes completed after their client gave up, want at most %d (5%% of those stored)", abandoned, limit)
	}
	var gaps int
	if err := f.pool.QueryRow(context.Background(), `SELECT count(*) FROM (SELECT conversation_id FROM activities
		GROUP BY conversation_id HAVING count(*) <> max(seq) OR min(seq) <> 1) g`).Scan(&gaps); err != nil {
		t.Fatal(err)
	}
	if gaps > 0 {
		t.Errorf("%d conversations have gaps in seq", gaps)
	}
}
