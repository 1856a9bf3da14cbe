// Package tlsconfig builds the TLS configurations of the programs' listening ports and of
// their clients from certificate files: TLS 1.2 or later, an optional CA for client
// certificates (required or optional), an allow list of client identities (SAN URIs or
// DNS names, as a mesh or cert-manager issues them), and certificates and CAs re-read when
// their files change (a Kubernetes Secret rotated in place, a symbolic link swapped), so
// that new connections get the new certificate, or are verified against the new CAs,
// without a restart while open ones carry on.
//
// The variables of a port share a prefix (SIDECAR_GRPC_TLS, CORE_TLS, ...):
//
//	<prefix>_CERT_FILE, <prefix>_KEY_FILE   the port's certificate (chain) and key, PEM
//	<prefix>_CLIENT_CA_FILE                 CAs that sign client certificates, PEM
//	<prefix>_CLIENT_AUTH                    require (default with a CA) or optional
//	<prefix>_ALLOWED_CLIENTS                identities allowed (comma- or space-separated)
//
// and those of a client (AUTHZ_TLS, LIMITER_TLS):
//
//	<prefix>_CA_FILE                        CAs that sign the server's certificate
//	<prefix>_CERT_FILE, <prefix>_KEY_FILE   the client's certificate for mutual TLS
//	<prefix>_SERVER_NAME                    the name to verify (default: the address's host)
package tlsconfig

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode"
)

// ClientAuth says whether a port asks its clients for a certificate.
type ClientAuth int

const (
	// NoClientCert: no client certificate is asked for (no CA).
	NoClientCert ClientAuth = iota
	// OptionalClientCert: a client may present a certificate; one presented must be
	// valid and, with an allow list, allowed.
	OptionalClientCert
	// RequireClientCert: every client presents a valid certificate.
	RequireClientCert
)

func (a ClientAuth) String() string {
	switch a {
	case OptionalClientCert:
		return "optional"
	case RequireClientCert:
		return "require"
	}
	return "none"
}

// ServerFiles are the files and rules of one TLS port.
type ServerFiles struct {
	Name           string // the variables' prefix, for messages (SIDECAR_GRPC_TLS)
	CertFile       string
	KeyFile        string
	ClientCAFile   string
	ClientAuth     ClientAuth
	AllowedClients []string // SAN URIs or DNS names; a trailing * matches any rest
}

// ClientFiles are the files of one TLS client.
type ClientFiles struct {
	Name       string // the variables' prefix (AUTHZ_TLS)
	CAFile     string
	CertFile   string
	KeyFile    string
	ServerName string
}

// LoadServer reads the variables <prefix>_* of a port through getenv and checks that
// their files can be used. It returns nil when <prefix>_CERT_FILE and _KEY_FILE are
// unset: the port speaks plain text.
func LoadServer(getenv func(string) string, prefix string) (*ServerFiles, error) {
	v := func(s string) string { return strings.TrimSpace(getenv(prefix + "_" + s)) }
	f := &ServerFiles{Name: prefix, CertFile: v("CERT_FILE"), KeyFile: v("KEY_FILE"), ClientCAFile: v("CLIENT_CA_FILE"),
		AllowedClients: splitList(v("ALLOWED_CLIENTS"))}
	mode, allowed := v("CLIENT_AUTH"), len(f.AllowedClients) > 0
	if f.CertFile == "" && f.KeyFile == "" {
		if f.ClientCAFile != "" || mode != "" || allowed {
			return nil, fmt.Errorf("%s_CLIENT_CA_FILE, _CLIENT_AUTH and _ALLOWED_CLIENTS need %s_CERT_FILE and %s_KEY_FILE", prefix, prefix, prefix)
		}
		return nil, nil
	}
	if f.CertFile == "" || f.KeyFile == "" {
		return nil, fmt.Errorf("%s_CERT_FILE and %s_KEY_FILE: set both, or neither", prefix, prefix)
	}
	switch strings.ToLower(mode) {
	case "":
		if f.ClientCAFile != "" {
			f.ClientAuth = RequireClientCert
		}
	case "require":
		f.ClientAuth = RequireClientCert
	case "optional":
		f.ClientAuth = OptionalClientCert
	default:
		return nil, fmt.Errorf("%s_CLIENT_AUTH=%q: must be require or optional", prefix, mode)
	}
	if f.ClientAuth != NoClientCert && f.ClientCAFile == "" {
		return nil, fmt.Errorf("%s_CLIENT_AUTH=%s needs %s_CLIENT_CA_FILE (the CAs that sign client certificates)", prefix, mode, prefix)
	}
	if allowed && f.ClientCAFile == "" {
		return nil, fmt.Errorf("%s_ALLOWED_CLIENTS needs %s_CLIENT_CA_FILE: identities are read from verified client certificates", prefix, prefix)
	}
	if _, err := f.load(); err != nil {
		return nil, err
	}
	return f, nil
}

// LoadClient reads the variables <prefix>_* of a client through getenv. It returns nil
// when none is set: the client speaks plain text.
func LoadClient(getenv func(string) string, prefix string) (*ClientFiles, error) {
	v := func(s string) string { return strings.TrimSpace(getenv(prefix + "_" + s)) }
	f := &ClientFiles{Name: prefix, CAFile: v("CA_FILE"), CertFile: v("CERT_FILE"), KeyFile: v("KEY_FILE"), ServerName: v("SERVER_NAME")}
	if f.CAFile == "" {
		if f.CertFile != "" || f.KeyFile != "" || f.ServerName != "" {
			return nil, fmt.Errorf("%s_CERT_FILE, _KEY_FILE and _SERVER_NAME need %s_CA_FILE (the CAs that sign the server's certificate)", prefix, prefix)
		}
		return nil, nil
	}
	if (f.CertFile == "") != (f.KeyFile == "") {
		return nil, fmt.Errorf("%s_CERT_FILE and %s_KEY_FILE: set both, or neither", prefix, prefix)
	}
	if _, err := f.load(); err != nil {
		return nil, err
	}
	return f, nil
}

func splitList(s string) []string {
	return strings.FieldsFunc(s, func(r rune) bool { return r == ',' || unicode.IsSpace(r) })
}

// material is what a set of files held when last read.
type material struct {
	cert  *tls.Certificate // nil for a client without a certificate
	pool  *x509.CertPool   // nil without a CA file
	stamp string           // the files' identities: a change of any one reloads them
}

func (f *ServerFiles) load() (*material, error) {
	return loadFiles(f.Name, f.CertFile, f.KeyFile, f.ClientCAFile, "CLIENT_CA_FILE")
}

func (f *ClientFiles) load() (*material, error) {
	return loadFiles(f.Name, f.CertFile, f.KeyFile, f.CAFile, "CA_FILE")
}

func loadFiles(prefix, certFile, keyFile, caFile, caVar string) (*material, error) {
	m := &material{stamp: stamp(certFile, keyFile, caFile)}
	if certFile != "" {
		cert, err := tls.LoadX509KeyPair(certFile, keyFile)
		if err != nil {
			return nil, fmt.Errorf("%s_CERT_FILE %s, %s_KEY_FILE %s: %w", prefix, certFile, prefix, keyFile, err)
		}
		m.cert = &cert
	}
	if caFile != "" {
		pem, err := os.ReadFile(caFile)
		if err != nil {
			return nil, fmt.Errorf("%s_%s: %w", prefix, caVar, err)
		}
		m.pool = x509.NewCertPool()
		if !m.pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("%s_%s %s: no PEM certificate in it", prefix, caVar, caFile)
		}
	}
	return m, nil
}

// stamp identifies the files' current contents without reading them: the path each
// link resolves to, its size and modification time. A Secret's update swaps the
// ..data link (a new target), an edit in place changes the time.
func stamp(paths ...string) string {
	var b strings.Builder
	for _, p := range paths {
		if p == "" {
			continue
		}
		real, err := filepath.EvalSymlinks(p)
		if err != nil {
			real = p
		}
		st, err := os.Stat(real)
		if err != nil {
			fmt.Fprintf(&b, "%s:missing;", real)
			continue
		}
		fmt.Fprintf(&b, "%s:%d:%d;", real, st.Size(), st.ModTime().UnixNano())
	}
	return b.String()
}

// DefaultCheckEvery is how often, at most, the files are looked at again: at the first
// handshake after it has passed since the last look.
const DefaultCheckEvery = time.Second

// reloader holds the current material of some files and re-reads them when they change.
type reloader struct {
	name       string
	load       func() (*material, error)
	paths      []string
	checkEvery time.Duration
	log        *slog.Logger
	onChange   func(*material)

	cur       atomic.Pointer[material]
	nextCheck atomic.Int64 // unix nanoseconds
	mu        sync.Mutex
	lastErr   string
}

func newReloader(name string, load func() (*material, error), paths []string, log *slog.Logger, onChange func(*material)) (*reloader, error) {
	if log == nil {
		log = slog.Default()
	}
	r := &reloader{name: name, load: load, paths: paths, checkEvery: DefaultCheckEvery, log: log, onChange: onChange}
	m, err := load()
	if err != nil {
		return nil, err
	}
	r.set(m)
	return r, nil
}

func (r *reloader) set(m *material) {
	r.cur.Store(m)
	if r.onChange != nil {
		r.onChange(m)
	}
	if m.cert != nil && m.cert.Leaf != nil && time.Now().After(m.cert.Leaf.NotAfter) {
		r.log.Warn("TLS certificate has expired: clients will refuse it", "tls", r.name, "not_after", m.cert.Leaf.NotAfter)
	}
}

// current returns the material, re-read first when the files have changed since (looked
// at no more often than checkEvery). Files that cannot be used (a rotation half done)
// keep the last good material; the problem is logged once and tried again.
func (r *reloader) current() *material {
	now := time.Now().UnixNano()
	if now < r.nextCheck.Load() || !r.mu.TryLock() {
		return r.cur.Load()
	}
	defer r.mu.Unlock()
	r.nextCheck.Store(now + int64(r.checkEvery))
	m := r.cur.Load()
	if stamp(r.paths...) == m.stamp {
		return m
	}
	next, err := r.load()
	if err != nil {
		if err.Error() != r.lastErr {
			r.lastErr = err.Error()
			r.log.Error("TLS files changed but cannot be used: keeping the previous ones", "tls", r.name, "error", err)
		}
		return m
	}
	r.lastErr = ""
	r.set(next)
	r.log.Info("TLS files reloaded", "tls", r.name)
	return next
}

// Server is the TLS of one port, from its files.
type Server struct {
	files ServerFiles
	r     *reloader
	log   *slog.Logger
	alpn  []string
	cfg   atomic.Pointer[tls.Config]

	lastRefusalLog atomic.Int64
}

// Options adjust a Server or a Client.
type Options struct {
	Logger *slog.Logger // slog.Default() when nil
	// CheckEvery is how often, at most, the files are looked at again
	// (DefaultCheckEvery when 0).
	CheckEvery time.Duration
}

// NewServer reads the files of f. alpn are the application protocols the port speaks
// ("h2" for gRPC, "http/1.1" for HTTP/1.1).
func NewServer(f *ServerFiles, o Options, alpn ...string) (*Server, error) {
	s := &Server{files: *f, log: o.Logger, alpn: alpn}
	if s.log == nil {
		s.log = slog.Default()
	}
	r, err := newReloader(f.Name, f.load, []string{f.CertFile, f.KeyFile, f.ClientCAFile}, s.log, s.build)
	if err != nil {
		return nil, err
	}
	if o.CheckEvery > 0 {
		r.checkEvery = o.CheckEvery
	}
	s.r = r
	return s, nil
}

// build makes the configuration of the handshakes that follow from m.
func (s *Server) build(m *material) {
	c := &tls.Config{
		MinVersion:       tls.VersionTLS12,
		Certificates:     []tls.Certificate{*m.cert},
		NextProtos:       s.alpn,
		ClientCAs:        m.pool,
		VerifyConnection: s.verifyClient,
	}
	switch s.files.ClientAuth {
	case RequireClientCert:
		c.ClientAuth = tls.RequireAndVerifyClientCert
	case OptionalClientCert:
		c.ClientAuth = tls.VerifyClientCertIfGiven
	}
	s.cfg.Store(c)
}

// Config is the configuration to listen with (tls.NewListener, gRPC's credentials):
// each handshake gets the certificate and CAs of the files as they are then.
func (s *Server) Config() *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		NextProtos: s.alpn,
		GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
			s.r.current()
			return s.cfg.Load(), nil
		},
	}
}

// ErrNotAllowed is the refusal of a verified client certificate whose identities are not
// in the allow list.
var ErrNotAllowed = errors.New("client certificate not in the allow list")

// verifyClient applies the allow list to a verified client certificate.
func (s *Server) verifyClient(cs tls.ConnectionState) error {
	if len(s.files.AllowedClients) == 0 || len(cs.PeerCertificates) == 0 {
		return nil
	}
	leaf := cs.PeerCertificates[0]
	ids := Identities(leaf)
	for _, id := range ids {
		if Allowed(s.files.AllowedClients, id) {
			return nil
		}
	}
	// At most one line a second: a client retrying must not flood the log.
	if now := time.Now().UnixNano(); now-s.lastRefusalLog.Load() > int64(time.Second) {
		s.lastRefusalLog.Store(now)
		s.log.Warn("TLS client refused: its certificate's identities are not in "+s.files.Name+"_ALLOWED_CLIENTS",
			"tls", s.files.Name, "identities", ids, "subject", leaf.Subject.String())
	}
	return fmt.Errorf("%w (%s_ALLOWED_CLIENTS): %v", ErrNotAllowed, s.files.Name, ids)
}

// Identities are a certificate's SAN URIs and DNS names, the identities a mesh issues
// (spiffe://cluster.local/ns/edge/sa/envoy).
func Identities(c *x509.Certificate) []string {
	ids := make([]string, 0, len(c.URIs)+len(c.DNSNames))
	for _, u := range c.URIs {
		ids = append(ids, u.String())
	}
	return append(ids, c.DNSNames...)
}

// Allowed reports whether id is in list: equal to an entry, or starting with an entry's
// text before its trailing "*" (spiffe://cluster.local/ns/edge/*). DNS names compare
// without regard to case.
func Allowed(list []string, id string) bool {
	for _, a := range list {
		if p, ok := strings.CutSuffix(a, "*"); ok {
			if strings.HasPrefix(id, p) || (!strings.Contains(id, "://") && strings.HasPrefix(strings.ToLower(id), strings.ToLower(p))) {
				return true
			}
			continue
		}
		if id == a || (!strings.Contains(id, "://") && strings.EqualFold(id, a)) {
			return true
		}
	}
	return false
}

// Client is the TLS of one client, from its files.
type Client struct {
	files ClientFiles
	name  string // the name the server's certificate must have
	r     *reloader
}

// NewClient reads the files of f for a client of the server at addr (host:port, or a
// gRPC target such as dns:///host:port): the server's certificate must name f.ServerName
// or, without it, addr's host.
func NewClient(f *ClientFiles, addr string, o Options) (*Client, error) {
	c := &Client{files: *f, name: f.ServerName}
	if c.name == "" {
		c.name = hostOf(addr)
	}
	if c.name == "" {
		return nil, fmt.Errorf("%s_SERVER_NAME: the server's address %q has no host to verify its certificate against: set the name", f.Name, addr)
	}
	r, err := newReloader(f.Name, f.load, []string{f.CertFile, f.KeyFile, f.CAFile}, o.Logger, nil)
	if err != nil {
		return nil, err
	}
	if o.CheckEvery > 0 {
		r.checkEvery = o.CheckEvery
	}
	c.r = r
	return c, nil
}

// hostOf is the host of a client's address: host:port, [::1]:port, a bare host, or a
// gRPC target (scheme://authority/host:port).
func hostOf(addr string) string {
	if i := strings.Index(addr, "://"); i >= 0 {
		addr = addr[i+3:]
		if j := strings.LastIndexByte(addr, '/'); j >= 0 {
			addr = addr[j+1:]
		}
	}
	if h, _, err := net.SplitHostPort(addr); err == nil {
		return h
	}
	return strings.TrimSuffix(strings.TrimPrefix(addr, "["), "]")
}

// Config is the configuration to dial with: the server's certificate verified, at each
// handshake, against the CA file as it is then (a rotated CA applies to the next
// connection; open ones carry on) for ServerName or the address's host, and the client
// certificate of the files as they are then.
func (c *Client) Config() *tls.Config {
	cfg := &tls.Config{
		MinVersion: tls.VersionTLS12,
		ServerName: c.name,
		// crypto/tls verifies against a fixed RootCAs; verifyServer does the same
		// verification against the CAs of the files as they are now.
		InsecureSkipVerify: true,
		VerifyConnection:   c.verifyServer,
	}
	if c.files.CertFile != "" {
		cfg.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			return c.r.current().cert, nil
		}
	}
	return cfg
}

// verifyServer verifies the server's chain against the current CAs and its name, as
// crypto/tls would with RootCAs.
func (c *Client) verifyServer(cs tls.ConnectionState) error {
	if len(cs.PeerCertificates) == 0 {
		return errors.New("tls: the server presented no certificate")
	}
	opts := x509.VerifyOptions{Roots: c.r.current().pool, DNSName: c.name, Intermediates: x509.NewCertPool()}
	for _, ic := range cs.PeerCertificates[1:] {
		opts.Intermediates.AddCert(ic)
	}
	if _, err := cs.PeerCertificates[0].Verify(opts); err != nil {
		return &tls.CertificateVerificationError{UnverifiedCertificates: cs.PeerCertificates, Err: err}
	}
	return nil
}

// Listener returns ln with TLS from f on its connections (alpn as for NewServer), or ln
// itself when f is nil. A server on it bounds each handshake by its read timeout.
func Listener(ln net.Listener, f *ServerFiles, o Options, alpn ...string) (net.Listener, error) {
	if f == nil {
		return ln, nil
	}
	s, err := NewServer(f, o, alpn...)
	if err != nil {
		return nil, err
	}
	return tls.NewListener(ln, s.Config()), nil
}

// ClientConfig is the configuration to dial the server at addr with from f (see
// NewClient), or nil (plain text) when f is nil.
func ClientConfig(f *ClientFiles, addr string, o Options) (*tls.Config, error) {
	if f == nil {
		return nil, nil
	}
	c, err := NewClient(f, addr, o)
	if err != nil {
		return nil, err
	}
	return c.Config(), nil
}
