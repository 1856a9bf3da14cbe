package limiter

import (
	"testing"
	"unsafe"
)

// A shard spans whole cache lines, so that no shard's lock shares a line with another's.
func TestShardSize(t *testing.T) {
	if s := unsafe.Sizeof(shard{}); s%64 != 0 {
		t.Fatalf("shard is %d bytes, not a multiple of 64", s)
	}
}
