package cluster

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"reflect"
	"strings"
	"testing"
)

// encode is the inverse of decode: one message holding all of m's values, in its
// version (1 when unset).
func encode(m message) []byte {
	p := newPacker(m.sentAt, m.origin, math.MaxInt)
	if m.version == version2 {
		p = newPacker2(m.sentAt, m.origin, math.MaxInt)
	}
	for _, v := range m.values {
		p.add(v)
	}
	msgs := p.messages()
	if len(msgs) == 0 {
		return p.header(0)
	}
	return msgs[0]
}

func sameMessage(a, b message) bool {
	if len(a.values) == 0 && len(b.values) == 0 {
		a.values, b.values = nil, nil
	}
	for _, m := range []*message{&a, &b} {
		if m.version == 0 {
			m.version = version1
		}
	}
	return reflect.DeepEqual(a, b)
}

var sampleValues = []value{
	{bucket: "login_ip", id: "203.0.113.7", sizeMS: 60_000, endMS: 1_700_000_100_000, count: 5},
	{bucket: "token_create", id: "2001:db8::1", sizeMS: 1, endMS: 1_700_000_000_001, count: 0},
	{bucket: "b", id: strings.Repeat("é", maxString/2), sizeMS: math.MaxUint32, endMS: 0, count: math.MaxUint32},
	// A window that ended before the message was sent: a negative offset on the wire.
	{bucket: "upload", id: "t", sizeMS: 1000, endMS: 1_699_999_999_000, count: 1},
}

func TestWireRoundTrip(t *testing.T) {
	p := newPacker(1_700_000_000_000, "node-1#0123456789abcdef", maxPacket)
	for _, v := range sampleValues {
		p.add(v)
	}
	msgs := p.messages()
	if len(msgs) != 1 {
		t.Fatalf("%d messages for %d small values", len(msgs), len(sampleValues))
	}
	m, err := decode(msgs[0])
	if err != nil {
		t.Fatal(err)
	}
	want := message{sentAt: 1_700_000_000_000, origin: "node-1#0123456789abcdef", values: sampleValues}
	if !sameMessage(m, want) {
		t.Fatalf("decoded %+v\nwant %+v", m, want)
	}
	// The decoded strings are copies: reusing the buffer changes nothing.
	clear(msgs[0])
	if !sameMessage(m, want) {
		t.Fatal("decoded strings share the message's buffer")
	}
	if p := newPacker(1, "x", maxPacket); p.messages() != nil {
		t.Fatal("an empty packer produced a message")
	}
}

// Version 2 carries what share mode needs of each value; version 1 still decodes, its
// values without it.
func TestWireVersion2RoundTrip(t *testing.T) {
	values := []value{
		{bucket: "login_ip", id: "203.0.113.7", sizeMS: 60_000, endMS: 1_700_000_100_000, count: 5,
			share: true, refused: 7, cap: 9, capped: true, limit: 10},
		{bucket: "token_create", id: "x", sizeMS: 1000, endMS: 1_700_000_001_000, count: 0,
			share: true, refused: math.MaxUint32, cap: math.MaxUint32, capped: true, limit: math.MaxUint32},
		{bucket: "b", id: "y", sizeMS: 1000, endMS: 1_700_000_001_000, count: 3, share: true},               // no bound, no limit
		{bucket: "b", id: "z", sizeMS: 1000, endMS: 1_700_000_001_000, count: 1, share: true, capped: true}, // a bound of 0
	}
	p := newPacker2(1_700_000_000_000, "node-1#0123456789abcdef", maxPacket)
	for _, v := range values {
		p.add(v)
	}
	msgs := p.messages()
	if len(msgs) != 1 || msgs[0][0] != version2 {
		t.Fatalf("%d messages, version %d", len(msgs), msgs[0][0])
	}
	m, err := decode(msgs[0])
	if err != nil {
		t.Fatal(err)
	}
	want := message{version: version2, sentAt: 1_700_000_000_000, origin: "node-1#0123456789abcdef", values: values}
	if !sameMessage(m, want) {
		t.Fatalf("decoded %+v\nwant %+v", m, want)
	}
	// The same values in version 1: counts only.
	v1 := encode(message{sentAt: 1, origin: "a#1", values: values})
	m, err = decode(v1)
	if err != nil {
		t.Fatal(err)
	}
	for i, v := range m.values {
		if v.share || v.refused != 0 || v.capped || v.limit != 0 || v.count != values[i].count {
			t.Fatalf("version 1 value %d: %+v", i, v)
		}
	}
	if len(v1) >= len(msgs[0]) {
		t.Fatalf("version 1 is %d bytes, version 2 %d: the share fields cost nothing?", len(v1), len(msgs[0]))
	}
}

func TestPackerRespectsTheSizeLimit(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	const sentAt = 1_700_000_000_000
	origin := strings.Repeat("n", 128) + "#0123456789abcdef" // the longest node name
	var values []value
	for i := range 3000 {
		values = append(values, value{
			bucket: fmt.Sprintf("bucket_%d", i%7),
			id:     fmt.Sprintf("%d-%s", i, strings.Repeat("k", rng.IntN(maxString-10))),
			sizeMS: int64(1 + rng.IntN(86_400_000)),
			endMS:  sentAt + rng.Int64N(86_400_000),
			count:  rng.Uint32(),
		})
	}
	for _, limit := range []int{maxPacket, 700} {
		p := newPacker(sentAt, origin, limit)
		for _, v := range values {
			p.add(v)
		}
		msgs := p.messages()
		var got []value
		for i, b := range msgs {
			if len(b) > limit {
				t.Fatalf("limit %d: message %d is %d bytes", limit, i, len(b))
			}
			m, err := decode(b)
			if err != nil {
				t.Fatalf("limit %d: message %d: %v", limit, i, err)
			}
			if m.origin != origin || m.sentAt != sentAt || len(m.values) == 0 {
				t.Fatalf("limit %d: message %d: origin %q sentAt %d, %d values", limit, i, m.origin, m.sentAt, len(m.values))
			}
			// A message is closed only when the next value would not fit.
			if i+1 < len(msgs) {
				next, _ := decode(msgs[i+1])
				if n := len(encode(message{sentAt: sentAt, origin: origin, values: append(m.values, next.values[0])})); n <= limit {
					t.Fatalf("limit %d: message %d closed at %d bytes though the next value fit (%d)", limit, i, len(b), n)
				}
			}
			got = append(got, m.values...)
		}
		if !reflect.DeepEqual(got, values) {
			t.Fatalf("limit %d: %d values in %d messages, want each of the %d once, in order", limit, len(got), len(msgs), len(values))
		}
		t.Logf("limit %d: %d values in %d messages", limit, len(values), len(msgs))
	}
}

func TestDecodeStateRoundTrip(t *testing.T) {
	var msgs [][]byte
	var want []message
	for i, origin := range []string{"a#1", "b#2", "c#3"} {
		m := message{sentAt: int64(1_700_000_000_000 + i), origin: origin, values: sampleValues[:i+1]}
		msgs = append(msgs, encode(m))
		want = append(want, m)
	}
	got, err := decodeState(appendState(nil, msgs...))
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(want) {
		t.Fatalf("%d messages, want %d", len(got), len(want))
	}
	for i := range got {
		if !sameMessage(got[i], want[i]) {
			t.Fatalf("message %d: %+v, want %+v", i, got[i], want[i])
		}
	}
	if got, err := decodeState(nil); err != nil || len(got) != 0 {
		t.Fatalf("empty state: %v, %v", got, err)
	}
}

// malformed lists inputs decode must reject, by what is wrong with them.
func malformed() map[string][]byte {
	valid := encode(message{sentAt: 1_700_000_000_000, origin: "a#1", values: sampleValues[:2]})
	hdr := func(n uint64) []byte {
		b := []byte{version1}
		b = binary.AppendVarint(b, 1_700_000_000_000)
		b = appendString(b, "a#1")
		return binary.AppendUvarint(b, n)
	}
	val := func(b []byte, bucket, id string, size, count uint64) []byte {
		b = appendString(b, bucket)
		b = appendString(b, id)
		b = binary.AppendUvarint(b, size)
		b = binary.AppendVarint(b, 1000)
		return binary.AppendUvarint(b, count)
	}
	hugeString := binary.AppendUvarint(hdr(1), 1<<40)
	// A version 2 message of one value whose share fields are given.
	v2 := func(refused, capWord, limit uint64, fields int) []byte {
		b := hdr(1)
		b[0] = version2
		b = val(b, "b", "x", 1, 1)
		for _, f := range []uint64{refused, capWord, limit}[:fields] {
			b = binary.AppendUvarint(b, f)
		}
		return b
	}
	out := map[string][]byte{
		"empty":                   {},
		"version 0":               append([]byte{0}, valid[1:]...),
		"version 3":               append([]byte{3}, valid[1:]...),
		"v2 refused over 32 bits": v2(1<<32, 0, 1, 3),
		"v2 bound over 32 bits":   v2(0, 1<<32+1, 1, 3),
		"v2 limit over 32 bits":   v2(0, 0, 1<<32, 3),
		"v2 without its fields":   v2(0, 0, 0, 0),
		"v2 with two of three":    v2(0, 0, 0, 2),
		"trailing byte":           append(bytes.Clone(valid), 0),
		"trailing value":          val(hdr(0), "b", "x", 1, 1),
		"no origin":               binary.AppendUvarint(binary.AppendUvarint(binary.AppendVarint([]byte{version1}, 1), 0), 0),
		"huge count of values":    hdr(1 << 60),
		"more values than bytes":  append(hdr(100), make([]byte, 99)...),
		"huge string length":      append(hugeString, make([]byte, 64)...),
		"string over the bound":   val(hdr(1), "b", strings.Repeat("x", maxString+1), 1, 1),
		"window of 0 ms":          val(hdr(1), "b", "x", 0, 1),
		"window over the longest": val(hdr(1), "b", "x", maxWindowMS+1, 1),
		"count over 32 bits":      val(hdr(1), "b", "x", 1, 1<<32),
		"overlong varint":         append([]byte{version1}, bytes.Repeat([]byte{0xff}, 11)...),
	}
	for i := 1; i < len(valid); i++ {
		out[fmt.Sprintf("truncated to %d bytes", i)] = valid[:i]
	}
	return out
}

func TestDecodeRejectsMalformedInput(t *testing.T) {
	for name, b := range malformed() {
		if m, err := decode(b); err == nil {
			t.Errorf("%s: decoded %+v", name, m)
		}
	}
	valid := encode(message{sentAt: 1, origin: "a#1", values: sampleValues[:1]})
	for name, b := range map[string][]byte{
		"length past the end":  appendState(nil, valid)[:len(valid)],
		"huge length":          binary.AppendUvarint(nil, 1<<62),
		"bad length varint":    bytes.Repeat([]byte{0x80}, 3),
		"malformed message":    appendState(appendState(nil, valid), valid[:len(valid)-1]),
		"a message then junk":  append(appendState(nil, valid), 0x05, 0x01),
		"empty message inside": appendState(nil, valid, nil),
	} {
		if ms, err := decodeState(b); err == nil {
			t.Errorf("state %s: decoded %+v", name, ms)
		}
	}
}

// FuzzDecode feeds decode and decodeState arbitrary bytes: they must never panic, and
// what they accept must encode back to the same messages. The seed corpus is in
// testdata/fuzz/FuzzDecode; run longer with go test -fuzz=FuzzDecode ./sidecar/cluster/.
func FuzzDecode(f *testing.F) {
	f.Add(encode(message{sentAt: 1_700_000_000_000, origin: "a#1", values: sampleValues}))
	f.Add(encode(message{version: version2, sentAt: 1_700_000_000_000, origin: "a#1", values: []value{
		{bucket: "b", id: "x", sizeMS: 1000, endMS: 1_700_000_001_000, count: 3, share: true, refused: 2, cap: 4, capped: true, limit: 5}}}))
	f.Add(appendState(nil, encode(message{sentAt: 5, origin: "b#2", values: sampleValues[1:2]}), encode(message{sentAt: -5, origin: "c"})))
	for _, b := range malformed() {
		f.Add(b)
	}
	v := pack3(1_700_000_000_000, "a#1", sampleValues)[0]
	f.Add(encodeBundle(syncBundleKind, [][]byte{v, v}))
	long := []byte{syncBundleKind, 0x82, 0x00} // a count of 2 not in its shortest form
	for range 2 {
		long = append(binary.AppendUvarint(long, uint64(len(v))), v...)
	}
	if _, err := decodeBundle(syncBundleKind, long); err != nil {
		f.Fatalf("the seed with a long count: %v", err)
	}
	f.Add(long)
	f.Fuzz(func(t *testing.T, b []byte) {
		// Bundles of either kind: never a panic, and what decodes encodes back to the
		// same messages.
		for _, kind := range []byte{bundleKind, syncBundleKind} {
			if msgs, err := decodeBundle(kind, b); err == nil {
				again, err := decodeBundle(kind, encodeBundle(kind, msgs))
				if err != nil || len(again) != len(msgs) {
					t.Fatalf("re-encoding a bundle of %d messages: %d, %v", len(msgs), len(again), err)
				}
				for i := range msgs {
					if !bytes.Equal(again[i], msgs[i]) {
						t.Fatalf("bundle round trip changed message %d", i)
					}
				}
			}
		}
		if m, err := decode(b); err == nil {
			again, err := decode(encode(m))
			if err != nil {
				t.Fatalf("re-encoding %+v: %v", m, err)
			}
			if !sameMessage(m, again) {
				t.Fatalf("round trip changed %+v into %+v", m, again)
			}
		}
		if ms, err := decodeState(b); err == nil {
			var msgs [][]byte
			for _, m := range ms {
				msgs = append(msgs, encode(m))
			}
			again, err := decodeState(appendState(nil, msgs...))
			if err != nil || len(again) != len(ms) {
				t.Fatalf("re-encoding state of %d messages: %d, %v", len(ms), len(again), err)
			}
			for i := range ms {
				if !sameMessage(ms[i], again[i]) {
					t.Fatalf("state round trip changed message %d: %+v into %+v", i, ms[i], again[i])
				}
			}
		}
	})
}

// A summary cut short anywhere, or with bytes after its last entry, is refused as
// malformed, never half applied; so is one whose compressed body is cut short.
func TestDecodeSummaryRefusesMalformed(t *testing.T) {
	entries := []summaryEntry{
		{bucket: "token_create", id: "192.0.2.1", sizeMS: 60_000, endMS: 1_700_000_040_000, others: 4, own: 1,
			planned: true, cur: 2, curCapped: true, next: 3, nextCapped: true, part: 1, answered: 7},
		{bucket: "login_ip", id: "192.0.2.2", sizeMS: 60_000, endMS: 1_700_000_040_000, others: 1},
	}
	msgs := packSummaries(1_700_000_000_000, "a#1", 200, entries)
	if len(msgs) != 1 {
		t.Fatalf("%d messages", len(msgs))
	}
	s, err := decodeSummary(msgs[0])
	if err != nil || len(s.entries) != 2 || s.answered != 0 || s.entries[0].cur != 2 {
		t.Fatalf("decoded %+v, %v", s, err)
	}
	raw, err := body(msgs[0], summaryKind)
	if err != nil {
		t.Fatal(err)
	}
	plain := append([]byte{summaryKind, 0}, raw...)
	if _, err := decodeSummary(plain); err != nil {
		t.Fatalf("uncompressed: %v", err)
	}
	for n := range len(plain) {
		if _, err := decodeSummary(plain[:n]); err == nil {
			t.Fatalf("cut at %d of %d bytes: decoded", n, len(plain))
		}
	}
	if _, err := decodeSummary(append(plain, 0)); err == nil {
		t.Fatal("a trailing byte: decoded")
	}
	for n := range len(msgs[0]) {
		if _, err := decodeSummary(msgs[0][:n]); err == nil {
			t.Fatalf("compressed, cut at %d of %d bytes: decoded", n, len(msgs[0]))
		}
	}
	if _, err := decodeSummary([]byte{summaryKind, 0x80, 1}); err == nil {
		t.Fatal("unknown flags: decoded")
	}
}
