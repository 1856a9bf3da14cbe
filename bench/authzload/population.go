package authzload

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"math"
	"math/rand/v2"
	"net/netip"
	"time"

	"github.com/converger/edge/shared/token"
)

// Kind is what a key of the mix is: a credential, an inbound channel id or a client IP.
type Kind uint8

// The kinds of keys.
const (
	KindIP          Kind = iota // a client address, counted on the IP routes
	KindAPIKey                  // a tenant API key (x-api-key)
	KindToken                   // a Converger token (Bearer)
	KindSecret                  // a channel secret (Bearer, tokens/generate)
	KindPublishable             // a publishable key (Bearer, tokens/publishable)
	KindPath                    // a channel id in an inbound webhook path
	numKinds
)

var kindNames = [numKinds]string{"client IP", "tenant API key", "Converger token", "channel secret", "publishable key", "inbound channel id"}

func (k Kind) String() string {
	if k < numKinds {
		return kindNames[k]
	}
	return fmt.Sprintf("kind(%d)", uint8(k))
}

// kindShares divides the keys among kinds; tokens take what rounding leaves.
var kindShares = [numKinds]float64{
	KindIP: 0.20, KindAPIKey: 0.10, KindToken: 0.40, KindSecret: 0.15, KindPublishable: 0.10, KindPath: 0.05,
}

// Key is one distinct key of the mix.
type Key struct {
	Kind Kind
	// Value is the address, the credential or the channel id, as sent.
	Value string
	// Hot keys only appear in bursts over their limit (and once in the prologue).
	Hot bool
	// Tenant and Channel are indexes into Population.Tenants and .Channels, -1 when
	// the key belongs to none.
	Tenant, Channel int
	// Src is the src claim of a token.
	Src string
}

// Tenant is a seeded tenant.
type Tenant struct {
	ID     [16]byte
	APIKey string
	Hot    bool
}

// Channel is a seeded channel.
type Channel struct {
	ID          [16]byte
	Tenant      int
	Secret      string
	Publishable string // "" when the channel has none
	Hot         bool
}

// Population is the tenants, channels and keys of a mix. Hot keys form a closed world:
// hot tenants own the hot channels, which own the hot tokens, publishable keys and inbound
// ids, so that bursts over a tenant's or channel's limit never deny a normal key.
type Population struct {
	Tenants  []Tenant
	Channels []Channel
	Keys     []Key
	// Normal and Hot list the indexes of the keys of each kind.
	Normal, Hot [numKinds][]int
	// TokenVerifyKey is the public key that verifies the tokens (TOKEN_VERIFY_KEYS).
	TokenVerifyKey string
}

// NewPopulation creates n keys, a share over of each kind hot, with the tenants and
// channels they belong to. Tokens are signed with a new key and valid from now on.
func NewPopulation(n int, over float64, seed uint64, now time.Time) (*Population, error) {
	if n < 100 {
		return nil, fmt.Errorf("at least 100 keys are needed, not %d", n)
	}
	if over < 0 || over > 0.5 {
		return nil, fmt.Errorf("the hot share must be from 0 to 0.5, not %g", over)
	}
	rng := rand.New(rand.NewPCG(seed, 0x5eed_0a07))
	var count, hot [numKinds]int
	rest := n
	for k := range numKinds {
		if k != KindToken {
			count[k] = int(float64(n) * kindShares[k])
			rest -= count[k]
		}
	}
	count[KindToken] = rest
	for k := range numKinds {
		if over > 0 {
			hot[k] = max(1, int(math.Round(over*float64(count[k]))))
		}
	}
	// Hot publishable keys and inbound ids live on hot channels.
	hot[KindSecret] = max(hot[KindSecret], hot[KindPublishable], hot[KindPath])
	nT, nC, hT, hC := count[KindAPIKey], count[KindSecret], hot[KindAPIKey], hot[KindSecret]
	if hT >= nT || hC >= nC || count[KindPublishable]-hot[KindPublishable] > nC-hC || count[KindPath]-hot[KindPath] > nC-hC {
		return nil, fmt.Errorf("cannot divide %d keys with a hot share of %g", n, over)
	}

	p := &Population{Tenants: make([]Tenant, nT), Channels: make([]Channel, nC), Keys: make([]Key, 0, n)}
	for i := range p.Tenants {
		p.Tenants[i] = Tenant{ID: uuid(rng), APIKey: "cvg_live_" + randomB64(rng, 32), Hot: i < hT}
	}
	for j := range p.Channels {
		c := Channel{ID: uuid(rng), Secret: randomB64(rng, 32), Hot: j < hC}
		if c.Hot {
			c.Tenant = j % hT
		} else {
			c.Tenant = hT + (j-hC)%(nT-hT)
		}
		p.Channels[j] = c
	}
	// channelFor places the i-th key of a kind with h hot keys on a hot or normal channel.
	channelFor := func(i, h int) int {
		if i < h {
			return i % hC
		}
		return hC + (i-h)%(nC-hC)
	}

	signer, err := newSigner()
	if err != nil {
		return nil, err
	}
	p.TokenVerifyKey = signer.PublicKey()
	add := func(k Key) {
		idx := len(p.Keys)
		p.Keys = append(p.Keys, k)
		if k.Hot {
			p.Hot[k.Kind] = append(p.Hot[k.Kind], idx)
		} else {
			p.Normal[k.Kind] = append(p.Normal[k.Kind], idx)
		}
	}
	for i := range count[KindIP] {
		add(Key{Kind: KindIP, Value: clientIP(i), Hot: i < hot[KindIP], Tenant: -1, Channel: -1})
	}
	for i, t := range p.Tenants {
		add(Key{Kind: KindAPIKey, Value: t.APIKey, Hot: t.Hot, Tenant: i, Channel: -1})
	}
	for j, c := range p.Channels {
		add(Key{Kind: KindSecret, Value: c.Secret, Hot: c.Hot, Tenant: c.Tenant, Channel: j})
	}
	for i := range count[KindPublishable] {
		h := i < hot[KindPublishable]
		j := channelFor(i, hot[KindPublishable])
		c := &p.Channels[j]
		c.Publishable = "cvg_pk_" + randomB64(rng, 24)
		add(Key{Kind: KindPublishable, Value: c.Publishable, Hot: h, Tenant: c.Tenant, Channel: j})
	}
	for i := range count[KindPath] {
		j := channelFor(i, hot[KindPath])
		c := p.Channels[j]
		add(Key{Kind: KindPath, Value: formatUUID(c.ID), Hot: i < hot[KindPath], Tenant: c.Tenant, Channel: j})
	}
	for i := range count[KindToken] {
		h := i < hot[KindToken]
		j := channelFor(i, hot[KindToken])
		c := p.Channels[j]
		src := token.SrcSecret
		// Hot tokens burst on activities (i%3 == 0), uploads or refreshes; a refresh
		// burst needs a secret token, whose bucket is token_generate.
		if h && i%3 == 0 || !h && rng.Float64() < 0.3 {
			src = token.SrcPublishable
		}
		id := uuid(rng)
		tok, err := signer.Issue(claimsWithID(token.Claims{
			TenantID:  formatUUID(p.Tenants[c.Tenant].ID),
			ChannelID: formatUUID(c.ID),
			UserID:    "user-" + hex.EncodeToString(id[:4]),
			Src:       src,
		}, base64.RawURLEncoding.EncodeToString(id[:])), now)
		if err != nil {
			return nil, fmt.Errorf("issuing a token: %w", err)
		}
		add(Key{Kind: KindToken, Value: tok, Hot: h, Tenant: c.Tenant, Channel: j, Src: src})
	}
	return p, nil
}

// newSigner returns a signer with a new key.
func newSigner() (*token.Signer, error) {
	k, err := token.GenerateKey()
	if err != nil {
		return nil, err
	}
	return token.ParseSigningKey(k)
}

// withID sets the token id, so that Issue draws none.
func claimsWithID(c token.Claims, id string) token.Claims {
	c.ID = id
	return c
}

// KindCount returns how many keys of kind k there are, and how many of them are hot.
func (p *Population) KindCount(k Kind) (total, hot int) {
	return len(p.Normal[k]) + len(p.Hot[k]), len(p.Hot[k])
}

// HotKeys returns the number of hot keys.
func (p *Population) HotKeys() int {
	n := 0
	for k := range numKinds {
		n += len(p.Hot[k])
	}
	return n
}

// clientIP returns the i-th client address: IPv4 from 198.18.0.0/15 (the benchmarking
// range), every tenth one IPv6 from the documentation range.
func clientIP(i int) string {
	if i%10 == 9 {
		return netip.AddrFrom16([16]byte{0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, byte(i >> 24), byte(i >> 16), byte(i >> 8), byte(i)}).String()
	}
	n := uint32(198)<<24 | uint32(18)<<16 + uint32(i) + 1
	return netip.AddrFrom4([4]byte{byte(n >> 24), byte(n >> 16), byte(n >> 8), byte(n)}).String()
}

func uuid(rng *rand.Rand) [16]byte {
	var b [16]byte
	for i := 0; i < 16; i += 8 {
		v := rng.Uint64()
		for j := range 8 {
			b[i+j] = byte(v >> (8 * j))
		}
	}
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return b
}

func formatUUID(b [16]byte) string {
	var s [36]byte
	hex.Encode(s[0:8], b[0:4])
	s[8] = '-'
	hex.Encode(s[9:13], b[4:6])
	s[13] = '-'
	hex.Encode(s[14:18], b[6:8])
	s[18] = '-'
	hex.Encode(s[19:23], b[8:10])
	s[23] = '-'
	hex.Encode(s[24:36], b[10:16])
	return string(s[:])
}

func randomB64(rng *rand.Rand, n int) string {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(rng.Uint32())
	}
	return base64.RawURLEncoding.EncodeToString(b)
}

// sha256Of is how the core stores credentials.
func sha256Of(s string) []byte {
	sum := sha256.Sum256([]byte(s))
	return sum[:]
}
