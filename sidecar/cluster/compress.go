package cluster

import (
	"bytes"
	"compress/flate"
	"errors"
	"io"
	"sync"
)

// Version 3 of the sync message is a version 2 message compressed with DEFLATE, once per
// flush for every member that reads it. memberlist's own compression (which this node
// turns off) compressed every packet again for every member it went to, with a fresh
// 256 KiB LZW table each time: at 20 members that was most of a sidecar's sync CPU.
//
//	message3 := version(1 byte: 3) deflate(message of version 2)

// maxInflated bounds what a version 3 message may inflate to: a message is at most one
// packet of values, which compresses a few times at best; anything larger is hostile.
const maxInflated = 64 << 10

var (
	deflaters = sync.Pool{New: func() any {
		w, _ := flate.NewWriter(nil, flate.BestSpeed)
		return w
	}}
	inflaters = sync.Pool{New: func() any { return flate.NewReader(nil) }}
)

// compress3 returns the version 3 form of a version 2 message.
func compress3(msg []byte) []byte {
	var buf bytes.Buffer
	buf.Grow(len(msg)/2 + 16)
	buf.WriteByte(version3)
	w := deflaters.Get().(*flate.Writer)
	w.Reset(&buf)
	_, _ = w.Write(msg) // a bytes.Buffer does not fail
	_ = w.Close()
	deflaters.Put(w)
	return buf.Bytes()
}

var errTooLarge = errors.New("cluster message inflates beyond its bound")

// inflate3 returns the version 2 message inside a version 3 one (b without its version
// byte).
func inflate3(b []byte) ([]byte, error) {
	r := inflaters.Get().(io.ReadCloser)
	defer inflaters.Put(r)
	if err := r.(flate.Resetter).Reset(bytes.NewReader(b), nil); err != nil {
		return nil, errMalformed
	}
	out, err := io.ReadAll(io.LimitReader(r, maxInflated+1))
	switch {
	case err != nil:
		return nil, errMalformed
	case len(out) > maxInflated:
		return nil, errTooLarge
	case len(out) == 0 || out[0] != version2:
		return nil, errMalformed
	}
	return out, nil
}
